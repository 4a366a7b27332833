"""Winograd convolution F(m×m, 3×3) on CPUs: a TE compute and a hand schedule.

A 3×3 conv at stride 1 computes each m×m tile of its output from an (m+2)×(m+2) tile of its
input with (m+2)² multiplications per input and output channel instead of 9m² (Lavin and
Gray, 2016): the input tile is transformed (``Bᵀ d B``), multiplied elementwise with the
transformed filter (``G g Gᵀ``, computed once when the weights are packed, not timed), summed
over input channels (one GEMM per element of the tile: filters × channels × tiles) and
transformed back (``Aᵀ M A``). m = 4 multiplies 4x fewer times than the direct conv, m = 2
2.25x fewer; both are exact in real arithmetic, with rounding errors that grow with m.

Stages and schedule (knobs ``tile`` = m, ``tile_k`` filters per vector, ``tile_p`` tiles per
register block):

- ``pad``: the zero-padded input, as wide and tall as whole tiles need;
- ``V`` [(m+2)², C, tiles]: each tile's input transform, in two passes of the separable
  transform (rows into a register buffer, then columns), parallel over channels;
- ``M`` [(m+2)², K/tile_k, tiles, tile_k]: the GEMMs, a register tile of ``tile_p`` tiles by
  one vector of filters accumulating over the channels, parallel over (element, filter block);
- ``Y``: the output transform of each tile and vector of filters, separable again, then the
  fused epilogue (bias, residual, activation) and the crop to the output's NCHW layout.

Inputs and outputs are float32 or float16; the transforms and sums run in float32, as the
other kernels accumulate, and the transformed filters are kept in float32 for both (stored
in float16, F(4×4)'s rounding fails float16's verification: an error of 0.0095 against the
0.005 allowed, on a 64-channel 56×56 layer). Filters pad up to whole vectors with zeros.
Verified against :func:`~dlas_predict.measure.kernels.reference.conv2d_reference` like every
kernel.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.measure.kernels.cpu import epilogue_inputs, finish_output, vectorize
from dlas_predict.measure.kernels.knobs import winograd_extents
from dlas_predict.measure.kernels.spec import KernelSpec, ceil_div

#: (Bᵀ, G, Aᵀ) of F(m×m, 3×3) by m, on the interpolation points 0, ±1 (m = 2) and 0, ±1,
#: ±2 (m = 4): the input, filter and output transforms.
MATRICES = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], float),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], float),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], float)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], float),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], float)),
}


def _tiles(ks: KernelSpec) -> tuple[int, int, int, int]:
    """(m, tiles down, tiles across, tiles padded to whole register blocks)."""
    spec, m = ks.conv, ks.knobs["tile"]
    *_, padded = winograd_extents(spec, ks.knobs)
    return m, ceil_div(spec.OH, m), ceil_div(spec.OW, m), padded


def pack_winograd_weights(ks: KernelSpec, w: np.ndarray) -> list[np.ndarray]:
    """Weights [K, C, 3, 3] -> the transformed filters ``G g Gᵀ`` as
    [(m+2)², K/tile_k, C, tile_k] float32 (zero filters pad the last block)."""
    m, kb = ks.knobs["tile"], ks.knobs["tile_k"]
    _, g, _ = MATRICES[m]
    a = m + 2
    spec = ks.conv
    kp = ceil_div(spec.K, kb) * kb
    u = np.einsum("ar,kcrs,bs->abkc", g, w.astype(np.float64), g).reshape(a * a, spec.K, spec.C)
    if kp != spec.K:
        u = np.concatenate([u, np.zeros((a * a, kp - spec.K, spec.C))], axis=1)
    u = u.reshape(a * a, kp // kb, kb, spec.C).transpose(0, 1, 3, 2)
    return [np.ascontiguousarray(u.astype("float32"))]


def _const(matrix: np.ndarray, i, j):
    """``matrix[i, j]`` of index expressions ``i``, ``j``: a chain of selects over its
    non-zero entries, which folds to a constant (or drops its term) once the loops over
    ``i`` and ``j`` are unrolled."""
    f32 = "float32"
    out = tvm.tirx.const(0.0, f32)
    for ii, row in enumerate(matrix):
        for jj, v in enumerate(row):
            if v:
                out = tvm.tirx.Select(tvm.tirx.all(i == ii, j == jj),
                                      tvm.tirx.const(float(v), f32), out)
    return out


def winograd_compute(ks: KernelSpec) -> list:
    """[data, transformed weights, epilogue arguments..., out] of F(m×m, 3×3)."""
    spec, dt = ks.conv, ks.dtype
    m, nh, nw, pp = _tiles(ks)
    a, kb = m + 2, ks.knobs["tile_k"]
    kt = ceil_div(spec.K, kb)
    bt, _, at = MATRICES[m]
    f32 = "float32"
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder((a * a, kt, spec.C, kb), "float32", name="weight")

    def padded(c, h, w):
        hi, wi = h - spec.pad_t, w - spec.pad_l
        inside = tvm.tirx.all(hi >= 0, hi < spec.H, wi >= 0, wi < spec.W)
        return tvm.tirx.if_then_else(inside, data[0, c, hi, wi].astype(f32),
                                     tvm.tirx.const(0.0, f32))

    pad = te.compute((spec.C, nh * m + 2, nw * m + 2), padded, name="pad")

    def tile_origin(p):  # a padded block's extra tiles repeat the last row of tiles
        return tvm.tirx.min(p // nw, nh - 1) * m, (p % nw) * m

    r1, r2 = te.reduce_axis((0, a), "r1"), te.reduce_axis((0, a), "r2")

    def rows(c, p, e1, col):
        h0, w0 = tile_origin(p)
        return te.sum(_const(bt, e1, r1) * pad[c, h0 + r1, w0 + col], axis=r1)

    bd = te.compute((spec.C, pp, a, a), rows, name="bd")
    v = te.compute((a * a, spec.C, pp), lambda e, c, p: te.sum(
        bd[c, p, e // a, r2] * _const(bt, e % a, r2), axis=r2), name="V")
    rc = te.reduce_axis((0, spec.C), "rc")
    mm = te.compute((a * a, kt, pp, kb), lambda e, ko, p, ki: te.sum(
        v[e, rc, p] * weight[e, ko, rc, ki].astype(f32), axis=rc), name="M")
    q1, q2 = te.reduce_axis((0, a), "q1"), te.reduce_axis((0, a), "q2")
    am = te.compute((kt, nh * nw, m, a, kb), lambda ko, p, i, col, ki: te.sum(
        _const(at, i, q1) * mm[q1 * a + col, ko, p, ki], axis=q1), name="AM")
    y = te.compute((kt, nh * nw, m, m, kb), lambda ko, p, i, j, ki: te.sum(
        am[ko, p, i, q2, ki] * _const(at, j, q2), axis=q2), name="Y")
    extras = epilogue_inputs(ks)
    out = te.compute(spec.output_shape, lambda n, k, h, w: finish_output(
        y[k // kb, (h // m) * nw + w // m, h % m, w % m, k % kb], ks, extras, k, (n, k, h, w)),
        name="out")
    return [data, weight, *extras.values(), out]


def winograd_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """The stages' loops: see the module's docstring."""
    tp = ks.knobs["tile_p"]
    sch.parallel(sch.get_loops(sch.get_sblock("pad"))[0])
    # input transform: per channel and tile, the rows pass into a local buffer, then columns
    v = sch.get_sblock("V")
    e, c, p, r2 = sch.get_loops(v)
    sch.reorder(c, p, e, r2)
    sch.parallel(c)
    bd = sch.get_sblock("bd")
    sch.compute_at(bd, p)
    sch.set_scope(bd, 0, "local")
    for loop in sch.get_loops(bd)[2:]:
        sch.unroll(loop)
    sch.unroll(e)
    sch.unroll(r2)
    # the GEMMs: tile_p tiles by one vector of filters in registers, over the channels
    mm = sch.get_sblock("M")
    acc = sch.cache_write(mm, 0, "local")
    e, ko, p, ki, rc = sch.get_loops(mm)
    po, pi = sch.split(p, [None, tp])
    sch.reorder(e, ko, po, rc, pi, ki)
    sch.reverse_compute_at(acc, po)
    sch.parallel(sch.fuse(e, ko))
    sch.unroll(pi)
    vectorize(sch, ki)
    sch.decompose_reduction(mm, rc)
    vectorize(sch, sch.get_loops(acc)[-1])
    # output transform: per block of filters and tile, rows then columns, a vector of filters
    y = sch.get_sblock("Y")
    ko, p, i, j, ki, q2 = sch.get_loops(y)
    sch.reorder(ko, p, i, j, q2, ki)
    task = sch.fuse(ko, p)
    sch.parallel(task)
    am = sch.get_sblock("AM")
    sch.compute_at(am, task)
    sch.set_scope(am, 0, "local")
    _, a0, a1, a2, a3 = sch.get_loops(am)
    sch.reorder(a0, a1, a3, a2)
    for loop in (a0, a1, a3):
        sch.unroll(loop)
    vectorize(sch, a2)
    for loop in (i, j, q2):
        sch.unroll(loop)
    vectorize(sch, ki)
    # the epilogue and the crop to NCHW, parallel over filters
    n, k, h, w = sch.get_loops(sch.get_sblock("out"))
    sch.parallel(sch.fuse(n, k))

