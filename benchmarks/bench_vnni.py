"""int8 GEMM on AVX-512 VNNI against the int8 GEMM without it and the float32 GEMM, same
run, on the ungrouped conv layers of ``--network`` (default ``zoo:resnet18-cifar``), one
per workload, the most work first.

The VNNI kernel (the ``vnni`` knob, the default on a CPU with AVX-512 VNNI) sums four int8
products per int32 lane with one ``vpdpbusd``; the plain int8 GEMM widens each product to
int32 (the default elsewhere). Each int8 build is checked against the numpy reference
(int32 accumulation, requantised) and the float32 one against the float64 reference; each
is timed with TVM's ``time_evaluator`` (7 repeats of 20 calls, at least 20 ms each; the
best repeat). Run it on a quiet machine whose CPU has AVX-512 VNNI:

    .venv/bin/python benchmarks/bench_vnni.py [--network zoo:resnet18-cifar] \\
        [--threads 2] [--limit 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from kerneltime import Timer, network_layers, short, spread, thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="zoo:resnet18-cifar")
    args = thread_args(ap, limit=20)
    if args is None:
        return 1
    from dlas_predict.measure.kernels import KernelSpec, build_kernel, device_args
    from dlas_predict.measure.knobs import resolve_knobs
    from dlas_predict.measure.reference import check_output, conv2d_reference, make_inputs
    from dlas_predict.space.config import Algorithm, DType, Variant
    from dlas_predict.space.devices import get_device

    if not get_device("local").vnni:
        print("Error: this CPU has no AVX-512 VNNI", file=sys.stderr)
        return 1
    specs = network_layers(args.network, lambda s: s.groups == 1, "ungrouped conv layer")
    if specs is None:
        return 1
    timer = Timer()
    print(f"{args.network}: {len(specs)} ungrouped conv workloads, {args.threads} thread(s)")
    print(f"{'layer':44s} {'vnni ms':>8s} {'int8 ms':>8s} {'fp32 ms':>8s} "
          f"{'int8/vnni':>9s} {'fp32/vnni':>9s}")
    over_int8, over_fp32 = [], []
    for spec in specs[:args.limit]:
        times = []
        for dtype, comp, vnni in ((DType.INT8, "int8", True), (DType.INT8, "int8", False),
                                  (DType.FLOAT32, "dense", False)):
            knobs = resolve_knobs(spec, Variant(Algorithm.GEMM, comp), timer.bits, vnni)
            ks = KernelSpec(spec, Algorithm.GEMM, False, dtype, knobs)
            x, w = make_inputs(spec, dtype, 0)
            mod = build_kernel(ks, timer.target).mod
            call = device_args(ks, x, w, timer.dev)
            mod["main"](*call)
            ok, err = check_output(call[-1].numpy().reshape(spec.output_shape),
                                   conv2d_reference(x, w, spec, dtype), dtype)
            if not ok:
                print(f"Error: {spec.to_spec()}: the {comp}{' VNNI' if vnni else ''} GEMM "
                      f"is off the reference by {err}", file=sys.stderr)
                return 1
            timer_fn = mod.time_evaluator("main", timer.dev, number=20, repeat=7,
                                          min_repeat_ms=20)
            times.append(min(timer_fn(*call).results) * 1e3)
        over_int8.append(times[1] / times[0])
        over_fp32.append(times[2] / times[0])
        print(f"{short(spec):44s} {times[0]:8.4f} {times[1]:8.4f} {times[2]:8.4f} "
              f"{over_int8[-1]:8.2f}x {over_fp32[-1]:8.2f}x", flush=True)
    print(f"\n{len(over_int8)} layers: the VNNI GEMM over the plain int8 GEMM "
          f"{spread(over_int8)}; over the float32 GEMM {spread(over_fp32)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
