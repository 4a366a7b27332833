"""Spatial pack's output stage: the epilogue on the packed register tile and each tile
unpacked to NCHW while it is in cache (the kernels' schedule), against one pass over the
whole packed output after the convolution that unpacks it and runs the epilogue there, same
run.

The layers are the convolutions of ``zoo:efficientnet-b0`` that are not depthwise (its
pointwise layers and its stem; the squeeze-excitation convs on 1×1 maps left out), the
most output elements first, each with the two epilogues the network's convs run: bias and
SiLU (the expand convs, on the tile), and bias and a residual add (the project convs: the
bias on the tile, the add while unpacking). Both schedules are built from the same knobs,
their outputs checked against each other, and timed with TVM's ``time_evaluator`` (7
repeats of 20 calls, at least 20 ms each; the best repeat). Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_unpack.py [--threads 2] [--limit 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NETWORK = "zoo:efficientnet-b0"


def layers(limit: int) -> list:
    """The network's distinct non-depthwise convs on maps larger than 1×1, most outputs
    first."""
    from dlas_predict.networks.graph import conv_layers, unique_specs
    from dlas_predict.networks.zoo import resolve

    specs = [s for s in unique_specs(conv_layers(resolve(NETWORK)))
             if not s.depthwise and s.H * s.W > 1]
    return sorted(specs, key=lambda s: -s.K * s.OH * s.OW)[:limit]


#: the epilogues timed on every layer
EPILOGUES = ((("bias",), ("silu",)), (("bias",), ("residual",)))


def whole_output_unpack(sch, ks) -> None:
    """The alternative: register tiles written back packed, then one parallel pass over the
    whole output that unpacks it to NCHW through the epilogue."""
    from dlas_predict.measure.kernels import _schedule_copy, _vectorize

    kb = ks.knobs["tile_k"]
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    ko, ho, wo, vh, vw, ki, r_c, r_r, r_s = sch.get_loops(block)
    if kb >= 4:
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, vh, vw, ki)
        sch.unroll(vh)
        sch.unroll(vw)
        _vectorize(sch, ki)
    else:
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, ki, vh, vw)
        sch.unroll(vh)
        _vectorize(sch, vw)
    sch.reverse_compute_at(wb, wo)
    sch.parallel(sch.fuse(ko, ho))
    sch.decompose_reduction(block, r_c)
    _vectorize(sch, sch.get_loops(wb)[-1])
    _schedule_copy(sch, "data_vec")
    _schedule_copy(sch, "out")


def build_whole_output_unpack(ks, target):
    """Spatial pack with :func:`whole_output_unpack`'s schedule (the epilogue in the
    unpacking pass)."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    from dlas_predict.measure.kernels import _spatial_pack_compute

    sch = Schedule(te.create_prim_func(_spatial_pack_compute(ks)))
    whole_output_unpack(sch, ks)
    return tvm.compile(sch.mod, target=target)


def main() -> int:
    from kerneltime import Timer, disagree, short, spread, thread_args

    args = thread_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]), limit=10)
    if args is None:
        return 1
    import numpy as np

    from dlas_predict.measure.kernels import KernelSpec, build_kernel
    from dlas_predict.measure.knobs import resolve_knobs
    from dlas_predict.space.config import Algorithm, DType, Variant

    timer = Timer()
    rng = np.random.default_rng(0)
    alg = Algorithm.SPATIAL_PACK
    print(f"{'layer':44s} {'epilogue':>16s} {'knobs':>10s} {'whole ms':>9s} {'tile ms':>8s} "
          f"{'speedup':>8s}")
    ratios, totals = [], np.zeros(2)
    for spec, steps in ((s, e) for s in layers(args.limit) for e in EPILOGUES):
        knobs = resolve_knobs(spec, Variant(alg, "dense"), timer.bits)
        x, w, extras = timer.inputs(spec, rng)
        extras = {**extras, "residual": rng.random(spec.output_shape, dtype=np.float32)}
        ks = KernelSpec(spec, alg, False, DType.FLOAT32, knobs, None, steps)
        runs = [timer.time(ks, build, (x, w, extras))
                for build in (build_whole_output_unpack, build_kernel)]
        if disagree([out for _, out in runs]):
            print(f"Error: {spec.to_spec()}: the two schedules disagree", file=sys.stderr)
            return 1
        times = np.array([t for t, _ in runs])
        totals += times
        ratios.append(times[0] / times[1])
        label = "+".join(s[0] for s in steps)
        tile = "×".join(str(knobs[k]) for k in ("tile_k", "tile_h", "tile_w"))
        print(f"{short(spec):44s} {label:>16s} {tile:>10s} {times[0]:9.4f} {times[1]:8.4f} "
              f"{ratios[-1]:7.2f}x", flush=True)
    if ratios:
        print(f"\n{len(ratios)} layers: the output stage per tile over one whole-output pass "
              f"{spread(ratios)}; summed {totals[0]:.3f} → {totals[1]:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
