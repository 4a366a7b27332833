"""A fused SiLU's cost: the sigmoid as libm's ``expf`` (what LLVM emits for TVM's ``exp``,
one scalar call per lane), as a vectorising polynomial exp (``exp_sigmoid``), and as the
rational function the kernels use (``fast_sigmoid``), with the bias-only epilogue as the
floor, same run.

The layers are the convolutions of ``zoo:efficientnet-b0`` (each but the squeeze-excitation
convs on 1×1 maps), the most output elements first: depthwise ones on the direct kernel,
the others on spatial pack, default knobs. Each is built four ways, its outputs checked
against each other, and timed with TVM's ``time_evaluator`` (7 repeats of 20 calls, at
least 20 ms each; the best repeat). Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_silu.py [--threads 2] [--limit 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NETWORK = "zoo:efficientnet-b0"


def layers(limit: int) -> list:
    """The network's distinct conv shapes on maps larger than 1×1, most outputs first."""
    from dlas_predict.networks.graph import conv_layers, unique_specs
    from dlas_predict.networks.zoo import resolve

    specs = [s for s in unique_specs(conv_layers(resolve(NETWORK))) if s.H * s.W > 1]
    return sorted(specs, key=lambda s: -s.K * s.OH * s.OW)[:limit]


def main() -> int:
    from kerneltime import Timer, disagree, short, spread, thread_args

    args = thread_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]), limit=12)
    if args is None:
        return 1
    import numpy as np
    import tvm

    from dlas_predict.measure import kernels
    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import resolve_knobs
    from dlas_predict.space.config import Algorithm, DType, Variant

    rational = kernels.fast_sigmoid

    def libm(y):
        return tvm.tirx.sigmoid(y)

    timer = Timer()
    rng = np.random.default_rng(0)
    print(f"{'layer':54s} {'alg':>12s} {'bias ms':>8s} {'libm ms':>8s} {'exp ms':>8s} "
          f"{'rational':>8s} {'speedup':>8s}  SiLU's share (libm → exp → rational)")
    totals = np.zeros(4)
    ratios = []
    for spec in layers(args.limit):
        alg = Algorithm.DIRECT if spec.depthwise else Algorithm.SPATIAL_PACK
        knobs = resolve_knobs(spec, Variant(alg, "dense"), timer.bits)
        inputs = timer.inputs(spec, rng)
        runs = []
        bias, silu = (("bias",),), (("bias",), ("silu",))
        for steps, sigmoid in ((bias, rational), (silu, libm), (silu, kernels.exp_sigmoid),
                               (silu, rational)):
            kernels.fast_sigmoid = sigmoid  # read by the epilogue when the kernel is built
            try:
                runs.append(timer.time(KernelSpec(spec, alg, False, DType.FLOAT32, knobs, None,
                                                  steps), build_kernel, inputs))
            finally:
                kernels.fast_sigmoid = rational
        times = np.array([t for t, _ in runs])
        if disagree([out for _, out in runs[1:]]):
            print(f"Error: {spec.to_spec()}: the SiLU builds disagree", file=sys.stderr)
            return 1
        totals += times
        ratios.append(times[2] / times[3])
        share = [max(0.0, (t - times[0]) / t) for t in times[1:]]
        print(f"{short(spec):54s} {alg.value:>12s} {times[0]:8.4f} {times[1]:8.4f} "
              f"{times[2]:8.4f} {times[3]:8.4f} {ratios[-1]:7.2f}x  "
              f"{share[0]:.0%} → {share[1]:.0%} → {share[2]:.0%}", flush=True)
    if ratios:
        print(f"\n{len(ratios)} layers: rational over polynomial-exp SiLU {spread(ratios)}; "
              f"summed libm {totals[1]:.3f}, exp {totals[2]:.3f}, rational {totals[3]:.3f} ms "
              f"(bias only {totals[0]:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
