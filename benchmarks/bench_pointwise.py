"""Pointwise (1×1) layers on the GEMM kernel: its default register tile against a tile of
two vectors of output pixels by 6 filters, same run, with direct and spatial pack beside.

The default GEMM tile is one vector of output pixels (a divisor of OH·OW) by up to 8
filters: 8 accumulators. Two vectors by 6 filters is 12 accumulators, which still leave
AVX2's 16 registers room for the loads (the register block of the classic Haswell GEMM
micro-kernel). The layers are the ungrouped 1×1 convolutions of ``--network`` (default
``zoo:efficientnet-b0``), one per workload, the most work first. The wider tile needs
OH·OW divisible by two vectors: layers where it is not get no such column. Each build has
its bias and ReLU fused, is checked against the others, and is timed with TVM's
``time_evaluator`` (7 repeats of 20 calls, at least 20 ms each; the best repeat). Run it
on a quiet machine:

    .venv/bin/python benchmarks/bench_pointwise.py [--network zoo:efficientnet-b0] \\
        [--threads 2] [--limit 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FILTERS = 6


def main() -> int:
    from kerneltime import EPILOGUE, Timer, disagree, network_layers, pointwise, spread, \
        thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="zoo:efficientnet-b0")
    args = thread_args(ap, limit=12)
    if args is None:
        return 1
    import numpy as np

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import registers, resolve_knobs
    from dlas_predict.space.config import Algorithm, DType, Variant

    specs = network_layers(args.network, lambda s: pointwise(s) and s.OH * s.OW > 1,
                           "pointwise layer")
    if specs is None:
        return 1
    timer = Timer()
    lanes = registers(timer.bits)[0]
    rng = np.random.default_rng(0)
    print(f"{args.network}: {len(specs)} pointwise workloads, {args.threads} thread(s), "
          f"{lanes}-lane vectors")
    print(f"{'layer':34s} {'gemm ms':>8s} {'tile':>6s} {'wide ms':>8s} {'speedup':>8s} "
          f"{'direct ms':>9s} {'sp.pack ms':>10s}")
    ratios = []
    for spec in specs[:args.limit]:
        inputs = timer.inputs(spec, rng)
        knobs = {alg: resolve_knobs(spec, Variant(alg, "dense"), timer.bits)
                 for alg in ("gemm", "direct", "spatial_pack")}
        builds = [(Algorithm.GEMM, knobs["gemm"]), (Algorithm.DIRECT, knobs["direct"]),
                  (Algorithm.SPATIAL_PACK, knobs["spatial_pack"])]
        wide = (spec.OH * spec.OW) % (2 * lanes) == 0 and spec.K % FILTERS == 0
        if wide:
            builds.append((Algorithm.GEMM, {"tile_k": FILTERS, "tile_p": 2 * lanes}))
        runs = [timer.time(KernelSpec(spec, alg, False, DType.FLOAT32, k, None, EPILOGUE),
                           build_kernel, inputs) for alg, k in builds]
        if disagree([out for _, out in runs]):
            print(f"Error: {spec.to_spec()}: the builds disagree", file=sys.stderr)
            return 1
        t = [ms for ms, _ in runs]
        tile = f"{knobs['gemm']['tile_k']}×{knobs['gemm']['tile_p']}"
        short = spec.to_spec().replace(",R=1,S=1", "").replace(",stride=1", "")
        if wide:
            ratios.append(t[0] / t[3])
            cols = f"{t[3]:8.4f} {ratios[-1]:7.2f}x"
        else:
            cols = f"{'-':>8s} {'-':>8s}"
        print(f"{short:34s} {t[0]:8.4f} {tile:>6s} {cols} {t[1]:9.4f} {t[2]:10.4f}",
              flush=True)
    if ratios:
        print(f"\n{len(ratios)} layers with a wide tile: {FILTERS}×{2 * lanes} over the "
              f"default GEMM tile {spread(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
