"""Depthwise direct kernels: the register-tiled depthwise schedule against the NCHW direct
schedule with a width tile dividing the row, same run; and on strided layers whose row the
tiled kernel covers with half a vector (it pads the row less), against a whole vector.

Each layer is built both ways with its bias and ReLU fused, checked against the other, and
timed with TVM's ``time_evaluator`` (7 repeats of 20 calls, at least 20 ms each; the best
repeat). Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_depthwise.py [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: depthwise layers of MobileNet-v2, EfficientNet-B0 and the generated inverted-residual CNNs
LAYERS = [
    "C=32,H=112,W=112,K=32,R=3,S=3,stride=1,pad=1,groups=32",
    "C=96,H=112,W=112,K=96,R=3,S=3,stride=2,pad=1,groups=96",
    "C=144,H=56,W=56,K=144,R=3,S=3,stride=1,pad=1,groups=144",
    "C=240,H=28,W=28,K=240,R=5,S=5,stride=1,pad=2,groups=240",
    "C=480,H=14,W=14,K=480,R=3,S=3,stride=1,pad=1,groups=480",
    "C=672,H=14,W=14,K=672,R=5,S=5,stride=2,pad=2,groups=672",
    "C=960,H=7,W=7,K=960,R=3,S=3,stride=1,pad=1,groups=960",
    "C=240,H=26,W=26,K=240,R=3,S=3,stride=1,pad=1,groups=240",
    "C=120,H=52,W=52,K=120,R=3,S=3,stride=2,pad=1,groups=120",
    "C=64,H=16,W=16,K=64,R=3,S=3,stride=1,pad=1,groups=64",
    "C=144,H=56,W=56,K=144,R=3,S=3,stride=2,pad=1,groups=144",
    "C=336,H=36,W=36,K=336,R=3,S=3,stride=2,pad=1,groups=336",
]


def _nchw_knobs(spec, simd_bits: int) -> dict[str, int]:
    """The direct kernel's knobs for a dense conv of this shape: a width tile dividing the
    row, a channel block of accumulators."""
    from dlas_predict.measure.knobs import _divisor_at_most, registers

    lanes, acc = registers(simd_bits)
    tw = _divisor_at_most(spec.OW, lanes, prefer=(lanes, lanes // 2))
    tk = _divisor_at_most(spec.K, acc, prefer=(8, 16, 4) if tw >= 8 else (16, 8, 4))
    return {"tile_k": tk, "tile_w": tw}


def _build_nchw(ks, target):
    """The NCHW direct kernel (the schedule of dense direct convs) for a depthwise ``ks``."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    from dlas_predict.measure import kernels

    sch = Schedule(te.create_prim_func(kernels._direct_nchw_compute(ks)))
    kernels._direct_nchw_schedule(sch, ks)
    return tvm.compile(sch.mod, target=target)


def main() -> int:
    from kerneltime import EPILOGUE, Timer, disagree, thread_args

    args = thread_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    if args is None:
        return 1
    import numpy as np

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import resolve_knobs
    from dlas_predict.space.config import Algorithm, ConvSpec, DType, Variant

    from dlas_predict.measure.knobs import registers

    timer = Timer()
    lanes = registers(timer.bits)[0]
    rng = np.random.default_rng(0)
    print(f"{'layer':58s} {'nchw ms':>8s} {'tiled ms':>9s} {'speedup':>8s} {'vector ms':>10s} "
          f"{'speedup':>8s}  tiled knobs")
    for text in LAYERS:
        spec = ConvSpec.parse(text)
        inputs = timer.inputs(spec, rng)
        tiled = resolve_knobs(spec, Variant("direct", "dense"), timer.bits)
        builds = [(_nchw_knobs(spec, timer.bits), _build_nchw), (tiled, build_kernel)]
        if tiled["tile_w"] < lanes:  # half a vector: against a whole one
            builds.append(({**tiled, "tile_w": lanes}, build_kernel))
        runs = [timer.time(KernelSpec(spec, Algorithm.DIRECT, False, DType.FLOAT32, knobs,
                                      None, EPILOGUE), build, inputs)
                for knobs, build in builds]
        times = [t for t, _ in runs]
        if disagree([out for _, out in runs]):
            print(f"Error: {text}: the kernels disagree", file=sys.stderr)
            return 1
        vector = (f"{times[2]:10.4f} {times[2] / times[1]:7.2f}x" if len(times) > 2
                  else f"{'—':>10s} {'':8s}")
        print(f"{text:58s} {times[0]:8.4f} {times[1]:9.4f} {times[0] / times[1]:7.2f}x "
              f"{vector}  {tiled}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
