"""Direct and GEMM kernels on output widths no vector tile divides: the output padded to
whole vector tiles and cropped, against a tile of the largest divisor of the width (the
positions, for the GEMM), same run.

The layers are a grid, not a network's: every output width from 5 to 40 whose largest
divisor up to the CPU's vector width is under half a vector (9, 11, 13, ... on AVX2's
eight lanes), each as a 3×3 conv of 64 to 64 channels and a 1×1 conv of 64 to 128. Each is
built with its bias and ReLU fused, checked against the other build, and timed with TVM's
``time_evaluator`` (7 repeats of 20 calls, at least 20 ms each; the best repeat). Run it on
a quiet machine:

    .venv/bin/python benchmarks/bench_widths.py [--threads 2] [--limit 24]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _divisor_knobs(spec, algorithm: str, bits: int) -> dict[str, int]:
    """The default knobs with the vector tile a divisor of its extent (the largest up to a
    vector, a whole vector or a half one preferred): a tile that pads nothing."""
    from dlas_predict.measure.knobs import _divisor_at_most, registers, resolve_knobs
    from dlas_predict.space.config import Variant

    lanes = registers(bits)[0]
    knobs = resolve_knobs(spec, Variant(algorithm, "dense"), bits)
    name, extent = ("tile_w", spec.OW) if algorithm == "direct" else \
        ("tile_p", spec.OH * spec.OW)
    return {**knobs, name: _divisor_at_most(extent, lanes, prefer=(lanes, lanes // 2))}


def layers(lanes: int, limit: int) -> list:
    """3×3 and 1×1 convs on every width from 5 to 40 no divisor of half a vector divides."""
    from dlas_predict.measure.knobs import _divisor_at_most
    from dlas_predict.space.config import ConvSpec

    widths = [w for w in range(5, 41)
              if w > lanes and _divisor_at_most(w, lanes) < lanes // 2]
    out = []
    for w in widths:
        out.append(ConvSpec.parse(f"C=64,H={w},W={w},K=64,R=3,S=3,stride=1,pad=1"))
        out.append(ConvSpec.parse(f"C=64,H={w},W={w},K=128,R=1,S=1,stride=1,pad=0"))
    return out[:limit]


def main() -> int:
    from kerneltime import EPILOGUE, Timer, disagree, short, spread, thread_args

    args = thread_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]), limit=24)
    if args is None:
        return 1
    import numpy as np

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import registers, resolve_knobs
    from dlas_predict.space.config import Algorithm, DType, Variant

    timer = Timer()
    rng = np.random.default_rng(0)
    print(f"{'layer':34s} {'algorithm':9s} {'divisor ms':>10s} {'padded ms':>10s} "
          f"{'speedup':>8s}  tile: divisor → padded")
    ratios: dict[str, list[float]] = {"direct": [], "gemm": []}
    for spec in layers(registers(timer.bits)[0], args.limit):
        inputs = timer.inputs(spec, rng)
        for algorithm, name in (("direct", "tile_w"), ("gemm", "tile_p")):
            old = _divisor_knobs(spec, algorithm, timer.bits)
            new = resolve_knobs(spec, Variant(algorithm, "dense"), timer.bits)
            if old == new:  # a divisor of the positions is wide enough: nothing padded
                continue
            runs = [timer.time(KernelSpec(spec, Algorithm(algorithm), False, DType.FLOAT32,
                                          knobs, None, EPILOGUE), build_kernel, inputs)
                    for knobs in (old, new)]
            if disagree([out for _, out in runs]):
                print(f"Error: {spec.to_spec()} {algorithm}: the builds disagree",
                      file=sys.stderr)
                return 1
            (t_old, _), (t_new, _) = runs
            ratios[algorithm].append(t_old / t_new)
            print(f"{short(spec).replace(',pad=1', ''):34s} {algorithm:9s} {t_old:10.4f} "
                  f"{t_new:10.4f} {t_old / t_new:7.2f}x  {old[name]} → {new[name]}",
                  flush=True)
    print()
    for algorithm, r in ratios.items():
        if r:
            print(f"{algorithm}: {len(r)} layers, padded over divisor tiles {spread(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
