"""Filter counts no vector divides: whole blocks of filters, the last padded, against blocks
of the largest divisor, same run. Spatial pack (the default): the largest divisor's blocks,
the block of fewest vector updates (a divisor where it ties with whole vectors: 31 of 124
filters on 16 lanes) and the default (whole vectors, the last padded, wherever the largest
divisor is no whole vector), the GEMM kernel (the per-layer choice's alternative) beside
them; ``--kernel direct`` or ``gemm``: the register tile's block of filters, on the layers
whose largest divisor is under four, with blocks of eight (the last padded) beside them.

The layers are those of channel-pruned networks with their zeroed filters removed
(``zoo:resnet18-cifar`` and ``zoo:resnet50`` at ratio 0.5): every ungrouped layer whose
filter count the CPU's vector width does not divide, the largest first. Each is built with
its bias and ReLU fused, checked against the other builds, and timed with TVM's
``time_evaluator`` (7 repeats of 20 calls, at least 20 ms each; the best repeat). Run it on
a quiet machine:

    .venv/bin/python benchmarks/bench_odd_filters.py [--kernel direct] [--threads 2] [--limit 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NETWORKS = ("zoo:resnet18-cifar", "zoo:resnet50")
RATIO = 0.5


def _pack_knobs(spec, simd_bits: int, block: str) -> dict[str, int]:
    """Spatial pack's knobs with the filter block ``block`` names: ``divisor``, the largest
    divisor of K up to two vectors; ``updates``, the block of fewest vector updates among
    that divisor and whole vectors (the last padded), ties to the divisor; the register
    tile sized as the default does (fewer than 8 filters: the default, which vectorises
    along the width)."""
    from dlas_predict.measure.knobs import (_divisor_at_most, _pack_width,
                                            pack_block_by_updates, registers, resolve_knobs)
    from dlas_predict.space.config import Variant

    if spec.K < 8:
        return resolve_knobs(spec, Variant("spatial_pack", "dense"), simd_bits)
    lanes, acc = registers(simd_bits)
    tile_k = (_divisor_at_most(spec.K, 2 * lanes, prefer=(2 * lanes, lanes, 8))
              if block == "divisor" else pack_block_by_updates(spec.K, lanes))
    return {"tile_k": tile_k, "tile_h": 1, "tile_w": _pack_width(spec, tile_k, lanes, acc)}


def _tile(knobs: dict[str, int]) -> str:
    return f"{knobs['tile_k']}×{knobs['tile_h']}×{knobs['tile_w']}"


def layers(keep, limit: int) -> list:
    """The layers of the removed networks ``keep(spec)`` selects, the most work first."""
    from dlas_predict.compression.compress import cached_channel_removed

    specs = set()
    for model in NETWORKS:
        layers_, _summary = cached_channel_removed(model, [RATIO])[RATIO]
        specs |= {s for s, _left in layers_ if s.groups == 1 and keep(s)}
    return sorted(specs, key=lambda s: -s.macs)[:limit]


def _register_tiles(timer, args, algorithm) -> int:
    """Direct or GEMM: the largest divisor's block of filters, the default (the block of at
    least four that pads K least) and blocks of eight, each layer's builds in one run."""
    import numpy as np
    from kerneltime import EPILOGUE, disagree, short, spread

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import _divisor_at_most, registers, resolve_knobs
    from dlas_predict.space.config import DType, Variant

    _lanes, acc = registers(timer.bits)
    rng = np.random.default_rng(0)
    variant = Variant(algorithm, "dense")

    def divisor(spec) -> int:
        return _divisor_at_most(spec.K, acc, prefer=(8, 16, 4))

    print(f"{'layer':44s} {'divisor ms':>10s} {'padded ms':>10s} {'speedup':>8s} "
          f"{'blocks of 8':>11s}  tile_k: divisor → padded")
    ratios, eights = [], []
    for spec in layers(lambda s: divisor(s) < 4 and s.K >= 4, args.limit):
        inputs = timer.inputs(spec, rng)
        new = resolve_knobs(spec, variant, timer.bits)
        builds = [{**new, "tile_k": divisor(spec)}, new, {**new, "tile_k": 8}]
        runs = [timer.time(KernelSpec(spec, variant.algorithm, False, DType.FLOAT32, knobs,
                                      None, EPILOGUE), build_kernel, inputs)
                for knobs in builds]
        times = [t for t, _ in runs]
        if disagree([out for _, out in runs]):
            print(f"Error: {spec.to_spec()}: the builds disagree", file=sys.stderr)
            return 1
        ratios.append(times[0] / times[1])
        eights.append(times[2] / times[1])
        print(f"{short(spec):44s} {times[0]:10.4f} {times[1]:10.4f} {ratios[-1]:7.2f}x "
              f"{times[2]:11.4f}  {builds[0]['tile_k']} → {new['tile_k']}", flush=True)
    if ratios:
        print(f"\n{len(ratios)} layers: padded over divisor blocks {spread(ratios)}; "
              f"blocks of 8 over the default: {spread(eights)}")
    return 0


def main() -> int:
    from kerneltime import EPILOGUE, Timer, disagree, short, spread, thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", choices=("spatial_pack", "direct", "gemm"),
                    default="spatial_pack")
    args = thread_args(ap, limit=12)
    if args is None:
        return 1
    import numpy as np

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import registers, resolve_knobs
    from dlas_predict.space.config import Algorithm, DType, Variant

    timer = Timer()
    if args.kernel != "spatial_pack":
        return _register_tiles(timer, args, args.kernel)
    rng = np.random.default_rng(0)
    lanes = registers(timer.bits)[0]
    print(f"{'layer':44s} {'divisor ms':>10s} {'updates ms':>10s} {'default ms':>10s} "
          f"{'speedup':>8s} {'gemm ms':>8s}  tile (k×h×w): divisor, updates → default")
    ratios, over_updates = [], []
    for spec in layers(lambda s: s.K % lanes, args.limit):
        inputs = timer.inputs(spec, rng)
        divisor = _pack_knobs(spec, timer.bits, "divisor")
        updates = _pack_knobs(spec, timer.bits, "updates")
        new = resolve_knobs(spec, Variant("spatial_pack", "dense"), timer.bits)
        gemm = resolve_knobs(spec, Variant("gemm", "dense"), timer.bits)
        runs = [timer.time(KernelSpec(spec, alg, False, DType.FLOAT32, knobs, None, EPILOGUE),
                           build_kernel, inputs)
                for alg, knobs in ((Algorithm.SPATIAL_PACK, divisor),
                                   (Algorithm.SPATIAL_PACK, updates),
                                   (Algorithm.SPATIAL_PACK, new), (Algorithm.GEMM, gemm))]
        times = [t for t, _ in runs]
        if disagree([out for _, out in runs]):
            print(f"Error: {spec.to_spec()}: the builds disagree", file=sys.stderr)
            return 1
        ratios.append(times[0] / times[2])
        if updates != new:
            over_updates.append(times[1] / times[2])
        print(f"{short(spec):44s} {times[0]:10.4f} {times[1]:10.4f} {times[2]:10.4f} "
              f"{ratios[-1]:7.2f}x {times[3]:8.4f}  {_tile(divisor)}, {_tile(updates)} → "
              f"{_tile(new)}", flush=True)
    if ratios:
        print(f"\n{len(ratios)} layers: the default over divisor blocks {spread(ratios)}")
    if over_updates:
        print(f"{len(over_updates)} layers whose fewest-updates block is no whole vector: "
              f"the default over it {spread(over_updates)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
