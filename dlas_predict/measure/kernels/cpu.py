"""The study's dense convolution kernels in TVM 0.27: direct, gemm (im2col) and spatial pack,
each a TE compute and a hand schedule (the CSR-sparse ones are ``csr``'s, the VNNI int8 GEMM
``vnni``'s).

NCHW, batch 1, any stride, padding, dilation and groups. Data types: float32; float16 inputs,
weights and outputs with float32 accumulation (as Relax's ToMixedPrecision; fp16 accumulation
over a 4608-long reduction loses too much to verify); int8 inputs and weights with int32
accumulation and requantisation to int8 (see
:func:`dlas_predict.measure.kernels.reference.requantize`).

Every kernel is built by :func:`dlas_predict.measure.kernels.build.build_kernel` from its
knobs (:mod:`dlas_predict.measure.kernels.knobs`); weights are packed offline by
:func:`pack_weights` into the layout the kernel reads, so packing is not part of the timed run.
This module imports TVM and runs inside the isolated worker.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.space.config import Algorithm, ConvSpec, DType
from dlas_predict.measure.kernels.knobs import (depthwise_extents, direct_input_width, dp4a_capable,
                                                filters_computed)
from dlas_predict.measure.kernels.sparse import to_csr
from dlas_predict.measure.kernels.spec import (ACC_DTYPE, KernelSpec, ceil_div, fast_sigmoid,
                                               uses_pmaddwd, uses_vnni)


# ------------------------------------------------------------------------------------------
# Offline weight packing (numpy): the layout each kernel reads.
# ------------------------------------------------------------------------------------------
def _packed_words(ks: KernelSpec, w: np.ndarray, per_word: int,
                  dtype) -> tuple[np.ndarray, np.ndarray]:
    """A dot-product GEMM's weights [filter blocks, words, tile_k, ``per_word``] of
    ``dtype``, filters padded to whole blocks and each row to whole words with zeros; and
    those padded rows [filters, words × ``per_word``]."""
    spec, kb = ks.conv, ks.knobs["tile_k"]
    crs = w[0].size
    rows = np.zeros((ceil_div(spec.K, kb) * kb, ceil_div(crs, per_word) * per_word), dtype)
    rows[:spec.K, :crs] = w.reshape(spec.K, -1)
    packed = rows.reshape(-1, kb, rows.shape[1] // per_word, per_word).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(packed), rows


def pack_weights(ks: KernelSpec, w: np.ndarray) -> list[np.ndarray]:
    """Weights [K, C/g, R, S] -> the kernel's weight arguments (packed once, not timed)."""
    spec = ks.conv
    if ks.sparse:
        csr = to_csr(w)
        return [csr.data, csr.indices, csr.indptr]
    if ks.algorithm is Algorithm.DIRECT:
        return [np.ascontiguousarray(w)]
    if ks.algorithm is Algorithm.GEMM and uses_pmaddwd(ks):
        # [filter blocks, ceil(CRS/2), tile_k, 2] int16, zero filters and reduction padding
        return [_packed_words(ks, w, 2, np.int16)[0]]
    if ks.algorithm is Algorithm.GEMM and uses_vnni(ks):
        # [filter blocks, ceil(CRS/4), tile_k, 4], zero filters and reduction padding; and
        # 128 times each filter's weight sum (the unsigned bytes' offset), per padded filter
        packed, rows = _packed_words(ks, w, 4, np.int8)
        wsum = 128 * rows.astype(np.int32).sum(axis=1, dtype=np.int32)
        return [packed, wsum]
    if ks.algorithm is Algorithm.GEMM:
        rows = np.ascontiguousarray(w.reshape(spec.K, -1))
        if uses_dp4a(ks):  # four int8 of a row in one int32 (byte i = element 4j+i)
            crs = rows.shape[1]
            rows = np.concatenate([rows, np.zeros((spec.K, ceil_div(crs, 4) * 4 - crs),
                                                  rows.dtype)], axis=1)
            return [np.ascontiguousarray(rows).view("<i4")]
        return [rows]
    kb = ks.knobs["tile_k"]
    kt = ceil_div(spec.K, kb)
    if kt * kb != spec.K:  # zero filters pad the last block (the output stage crops them)
        w = np.concatenate([w, np.zeros((kt * kb - spec.K, *w.shape[1:]), w.dtype)])
    packed = w.reshape(kt, kb, *w.shape[1:]).transpose(0, 2, 3, 4, 1)
    return [np.ascontiguousarray(packed)]


# ------------------------------------------------------------------------------------------
# Dense kernels: TE compute definitions and hand schedules.
# ------------------------------------------------------------------------------------------
def epilogue(acc, scale: float, dtype: DType, vector_round: bool = False):
    """Accumulator -> output element: identity (float32), rounding to float16, or int8
    requantisation (rounding half to even). ``vector_round``: round with ``round``, which
    TVM vectorises, instead of ``nearbyint``, which it leaves scalar (the same results; the
    kernels measured before keep ``nearbyint``)."""
    if dtype is DType.FLOAT32:
        return acc
    if dtype is DType.FLOAT16:
        return acc.astype("float16")
    rnd = tvm.tirx.round if vector_round else tvm.tirx.nearbyint
    scaled = rnd(acc.astype("float32") * tvm.tirx.const(scale, "float32"))
    clipped = tvm.tirx.max(tvm.tirx.min(scaled, tvm.tirx.const(127.0, "float32")),
                           tvm.tirx.const(-128.0, "float32"))
    return clipped.astype("int8")


def epilogue_inputs(ks: KernelSpec) -> dict:
    return {name: te.placeholder(shape, dt, name=name) for name, shape, dt in ks.extra_inputs()}


def finish_output(acc, ks: KernelSpec, extras: dict, k, nchw: tuple):
    """Accumulator -> output element at output channel ``k`` (NCHW index ``nchw``): the plain
    epilogue (:func:`epilogue`), or the fused one of ``ks.epilogue`` computed in float32."""
    if not ks.epilogue:
        return epilogue(acc, ks.requant_scale, ks.dtype)
    return _to_output(_steps(_to_float32(acc, ks), ks.epilogue, extras, k, nchw), ks)


def _to_float32(acc, ks: KernelSpec):
    """An accumulator in float32, dequantised (int8): where a fused epilogue starts."""
    f32 = "float32"
    # (a tensor element has a dtype; an arithmetic expression of them only its type)
    y = acc if str(getattr(acc, "dtype", None) or acc.ty) == f32 else acc.astype(f32)
    if ks.dtype is DType.INT8:
        y = y * tvm.tirx.const(ks.requant_scale, f32)
    return y


def _to_output(y, ks: KernelSpec):
    """A fused epilogue's float32 result in the kernel's output type."""
    return y.astype(ks.out_dtype) if ks.out_dtype != "float32" else y


def _steps(y, steps: tuple, extras: dict, k, nchw: tuple | None):
    """The fused epilogue ``steps`` applied to the float32 value ``y`` of output channel ``k``
    (a residual step reads its operand at the NCHW index ``nchw``)."""
    f32 = "float32"
    for step in steps:
        op = step[0]
        if op == "bias":
            y = y + extras["bias"][k]
        elif op == "residual":
            r = extras["residual"][nchw]
            y = y + (r.astype(f32) if r.dtype != f32 else r)
        elif op == "relu":
            y = tvm.tirx.max(y, tvm.tirx.const(0.0, f32))
        elif op == "max":
            y = tvm.tirx.max(y, tvm.tirx.const(float(step[1]), f32))
        elif op == "min":
            y = tvm.tirx.min(y, tvm.tirx.const(float(step[1]), f32))
        elif op == "silu":
            y = y * fast_sigmoid(y)
        else:
            raise ValueError(f"unknown epilogue step {step!r}")
    return y


def acc_dtype(ks: "KernelSpec") -> str:
    """The accumulator type: float32 for float32 and float16 (the CPU kernels and the GPU's
    default), float16 when a GPU kernel's ``acc_bits`` knob is 16, int32 for int8."""
    if ks.dtype is DType.FLOAT16 and ks.knobs.get("acc_bits") == 16:
        return "float16"
    return ACC_DTYPE[ks.dtype]


def _mul(a, b, dtype: DType, acc: str | None = None):
    acc = acc or ACC_DTYPE[dtype]
    if dtype is DType.FLOAT32 or acc == dtype.value:
        return a * b
    return a.astype(acc) * b.astype(acc)


def padded_input(data, spec: ConvSpec, height: int, width: int, name: str = "pad"):
    """Zero-padded input [1, C, height, width] (top/left padding applied, rest zeros)."""
    zero = tvm.tirx.const(0, data.dtype)
    pt, pl = spec.pad_t, spec.pad_l

    def body(n, c, h, w):
        inside = tvm.tirx.all(h >= pt, h < pt + spec.H, w >= pl, w < pl + spec.W)
        return tvm.tirx.if_then_else(inside, data[n, c, h - pt, w - pl], zero)

    return te.compute((1, spec.C, height, width), body, name=name)


def _reduce_axes(spec: ConvSpec):
    cg = spec.C // spec.groups
    return (te.reduce_axis((0, cg), "rc"), te.reduce_axis((0, spec.R), "rr"),
            te.reduce_axis((0, spec.S), "rs"))


def _in_channel(spec: ConvSpec, k, rc):
    """Input channel read by output channel ``k`` at reduction index ``rc``."""
    if spec.groups == 1:
        return rc
    return (k // (spec.K // spec.groups)) * (spec.C // spec.groups) + rc


def direct_nchw_compute(ks: KernelSpec, tiles: bool = False) -> list:
    """Direct convolution over the zero-padded NCHW input (also the GPU's compute). With
    ``tiles`` (the CPU's hand schedule), an output width its ``tile_w`` does not divide is
    computed over whole vector tiles (the padded input wide enough, zeros beyond it) and
    cropped by an ``out`` stage, so no tail predicate keeps the tile from vectorising."""
    spec, dt = ks.conv, ks.dtype
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder(spec.weight_shape, dt.value, name="weight")
    owp = padded_extent(spec.OW, ks.knobs.get("tile_w")) if tiles else spec.OW
    kp = _filters_padded(ks) if tiles else spec.K
    hp = spec.H + spec.pad_t + spec.pad_b
    pad = padded_input(data, spec, hp, direct_input_width(spec, owp))
    rc, rr, rs = _reduce_axes(spec)
    conv = te.compute(
        (1, kp, spec.OH, owp),
        lambda n, k, h, w: te.sum(_mul(
            pad[n, _in_channel(spec, k, rc), h * spec.stride_h + rr * spec.dilation_h,
                w * spec.stride_w + rs * spec.dilation_w],
            weight[_filter(spec, k, kp), rc, rr, rs], dt, acc_dtype(ks)),
            axis=[rc, rr, rs]),
        name="conv")
    extras = epilogue_inputs(ks)
    if owp != spec.OW or kp != spec.K:
        out = te.compute(spec.output_shape, lambda n, k, h, w: finish_output(
            conv[n, k, h, w], ks, extras, k, (n, k, h, w)), name="out")
        return [data, weight, *extras.values(), out]
    return [data, weight, *extras.values(),
            _maybe_epilogue(conv, ks, extras, lambda n, k, h, w: (k, (n, k, h, w)))]


def padded_extent(extent: int, tile: int | None) -> int:
    """``extent`` rounded up to whole ``tile``s (no tile: unchanged)."""
    return ceil_div(extent, tile) * tile if tile else extent


def _filters_padded(ks: KernelSpec) -> int:
    """The filters a dense direct or GEMM kernel computes (:func:`~dlas_predict.measure.
    knobs.filters_computed`: more than K where no block of at least four filters divides an
    ungrouped conv's K); the padded filters repeat the last one and an ``out`` stage crops
    them."""
    return filters_computed(ks.conv, ks.knobs.get("tile_k"))


def _filter(spec: ConvSpec, k, kp: int):
    """The weights' filter index of computed filter ``k`` of ``kp``: the last real filter
    for a padded one (its output is cropped)."""
    return k if kp == spec.K else tvm.tirx.min(k, spec.K - 1)


def _direct_compute(ks: KernelSpec, tiles: bool = False) -> list:
    # one input channel per output channel (a channel multiplier too): no input reuse
    # across output channels, so the tile runs along the output plane
    if ks.conv.depthwise:
        return _depthwise_compute(ks)
    return direct_nchw_compute(ks, tiles)


def _depthwise_compute(ks: KernelSpec) -> list:
    """Direct depthwise convolution on a register tile of ``tile_h`` rows by ``tile_w``
    columns. The output is computed over whole tiles (the padded input is wide and tall
    enough) and cropped by the output stage, so no extent needs to divide by a tile. The
    padded input is split into ``stride_w`` column phases, so each tap reads a contiguous
    vector at any stride."""
    spec, dt = ks.conv, ks.dtype
    ohp, owp, hp, wq = depthwise_extents(spec, ks.knobs["tile_h"], ks.knobs["tile_w"])
    sh, sw, dh, dw = spec.stride_h, spec.stride_w, spec.dilation_h, spec.dilation_w
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder(spec.weight_shape, dt.value, name="weight")
    zero = tvm.tirx.const(0, dt.value)

    def padded(n, c, h, ph, q):
        hi, wi = h - spec.pad_t, q * sw + ph - spec.pad_l
        inside = tvm.tirx.all(hi >= 0, hi < spec.H, wi >= 0, wi < spec.W)
        return tvm.tirx.if_then_else(inside, data[n, c, hi, wi], zero)

    pad = te.compute((1, spec.C, hp, sw, wq), padded, name="pad")
    rr, rs = te.reduce_axis((0, spec.R), "rr"), te.reduce_axis((0, spec.S), "rs")
    kg = spec.K // spec.groups
    conv = te.compute(
        (1, spec.K, ohp, owp),
        lambda n, k, h, w: te.sum(_mul(
            pad[n, k // kg, h * sh + rr * dh, (rs * dw) % sw, w + (rs * dw) // sw],
            weight[k, 0, rr, rs], dt, acc_dtype(ks)), axis=[rr, rs]),
        name="conv")
    extras = epilogue_inputs(ks)
    out = te.compute(spec.output_shape,
                     lambda n, k, h, w: finish_output(conv[n, k, h, w], ks, extras, k, (n, k, h, w)),
                     name="out")
    return [data, weight, *extras.values(), out]


def vectorize(sch: Schedule, loop) -> None:
    """Vectorise ``loop``, unless there is nothing to vectorise: a loop of one iteration (a
    tile of one lane, as on SSE's four lanes for a width of 7), or an outer loop, which is
    what a block's last loop is when its tile loops had one iteration each and were not
    created (a layer of one filter). TVM refuses both."""
    node = sch.get(loop)
    if isinstance(node.extent, tvm.tirx.IntImm) and int(node.extent) == 1:
        return
    if isinstance(node.body, (tvm.tirx.For, tvm.tirx.SeqStmt)):
        return
    sch.vectorize(loop)


def _depthwise_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """Parallel over blocks of ``tile_k`` channels; each pads its input planes into a
    thread-local buffer, runs the register tiles (taps unrolled, the width vectorised) and
    crops its output planes through the epilogue."""
    block = sch.get_sblock("conv")
    n, k, h, w, r_r, r_s = sch.get_loops(block)
    ko, ki = sch.split(k, [None, ks.knobs["tile_k"]])
    ho, hi = sch.split(h, [None, ks.knobs["tile_h"]])
    wo, wi = sch.split(w, [None, ks.knobs["tile_w"]])
    sch.reorder(n, ko, ho, wo, r_r, r_s, ki, hi, wi)
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, wo)
    outer = sch.fuse(n, ko)
    sch.parallel(outer)
    sch.reverse_compute_at(sch.get_sblock("out"), outer)
    sch.compute_at(sch.get_sblock("pad"), outer)
    if ks.conv.stride_w > 1:  # read the input rows contiguously, deal columns to phases
        *_, ph, q = sch.get_loops(sch.get_sblock("pad"))
        sch.reorder(q, ph)
        sch.unroll(ph)
    for loop in (ki, hi, r_r, r_s):
        sch.unroll(loop)
    vectorize(sch, wi)
    sch.decompose_reduction(block, r_r)
    vectorize(sch, sch.get_loops(wb)[-1])
    vectorize(sch, sch.get_loops(sch.get_sblock("out"))[-1])


def _direct_schedule(sch: Schedule, ks: KernelSpec) -> None:
    if ks.conv.depthwise:
        _depthwise_schedule(sch, ks)
    else:
        _direct_nchw_schedule(sch, ks)


def _direct_nchw_schedule(sch: Schedule, ks: KernelSpec) -> None:
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    n, k, h, w, r_c, r_r, r_s = sch.get_loops(block)
    ko, ki = sch.split(k, [None, ks.knobs["tile_k"]])
    wo, wi = sch.split(w, [None, ks.knobs["tile_w"]])
    sch.reorder(n, ko, h, wo, r_c, r_r, r_s, ki, wi)
    sch.reverse_compute_at(wb, wo)
    task = sch.fuse(n, ko, h)
    sch.parallel(task)
    sch.unroll(ki)
    vectorize(sch, wi)
    sch.decompose_reduction(block, r_c)
    cropped = bool(ks.conv.OW % ks.knobs["tile_w"]) or _filters_padded(ks) != ks.conv.K
    _finish_writeback(sch, wb, ks, cropped)
    if cropped:  # computed over whole tiles: crop each task's row while it is in cache
        sch.reverse_compute_at(sch.get_sblock("out"), task)
    widened = direct_input_width(ks.conv, padded_extent(ks.conv.OW, ks.knobs["tile_w"]))
    if _unpadded(ks.conv) and widened == ks.conv.W:
        # the copy would be the input itself: read it in place (a widened input is copied,
        # so the vector loop reads no bounds check)
        sch.compute_inline(sch.get_sblock("pad"))
    else:
        _schedule_copy(sch, "pad")


def uses_dp4a(ks: KernelSpec) -> bool:
    """An int8 GEMM kernel whose ``dp4a`` knob is set: four int8 products summed by one
    instruction (CUDA's ``__dp4a``, compute capability 6.1 and later)."""
    return dp4a_capable(ks) and bool(ks.knobs.get("dp4a"))


def dp4a(a, b, native: bool = True):
    """The sum of the four int8 products of two int32 words, each holding four int8 (byte 0
    lowest): CUDA's ``__dp4a`` (``native``), or the same sum in shifts and multiplies
    (any target: what the tests run on a CPU)."""
    if native:
        return tvm.tirx.call_pure_extern("int32", "__dp4a", a, b,
                                         tvm.tirx.const(0, "int32"))
    total = None
    for i in range(4):
        up = tvm.tirx.const(24 - 8 * i, "int32")
        down = tvm.tirx.const(24, "int32")
        term = ((a << up) >> down) * ((b << up) >> down)  # sign-extended byte i
        total = term if total is None else total + term
    return total


def _pack4(values) -> "tvm.tirx.PrimExpr":
    """Four int8 as one int32 word, the first in the lowest byte."""
    word = None
    for i, v in enumerate(values):
        b = v.astype("int32")
        b = (b << tvm.tirx.const(24, "int32")) if i == 3 else \
            ((b & tvm.tirx.const(0xFF, "int32")) << tvm.tirx.const(8 * i, "int32"))
        word = b if word is None else word | b
    return word


def im2col_element(pad, spec: ConvSpec, channel, j, q):
    """Element ``j`` of the im2col column of output position ``q`` (``j`` runs over a
    group's channels, then the filter's rows and columns) in the zero-padded input ``pad``,
    ``channel`` its input channel."""
    return pad[0, channel,
               (q // spec.OW) * spec.stride_h + (j // spec.S) % spec.R * spec.dilation_h,
               (q % spec.OW) * spec.stride_w + (j % spec.S) * spec.dilation_w]


def _gemm_compute(ks: KernelSpec, tiles: bool = False, native_dp4a: bool = True) -> list:
    """im2col then a GEMM [K, CRS] x [CRS, OH*OW]. With ``tiles`` (the CPU's hand
    schedule), output positions its ``tile_p`` does not divide are computed over whole
    vector tiles (the im2col matrix padded with zero columns) and cropped by an ``out``
    stage. An int8 kernel with the ``dp4a`` knob (:func:`uses_dp4a`) packs the reduction
    four int8 to an int32 word (the im2col matrix as it is written, zero past the
    reduction's end; the weights offline) and sums each word pair's products with
    :func:`dp4a`."""
    spec, dt = ks.conv, ks.dtype
    packed = uses_dp4a(ks)
    cg = spec.C // spec.groups
    crs = cg * spec.R * spec.S
    red = ceil_div(crs, 4) if packed else crs  # the reduction's extent (words if packed)
    col_dtype = "int32" if packed else dt.value
    rs_ = spec.R * spec.S
    p = spec.OH * spec.OW
    pp = padded_extent(p, ks.knobs.get("tile_p")) if tiles else p
    kp = _filters_padded(ks) if tiles else spec.K
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder((spec.K, red), col_dtype, name="weight")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = padded_input(data, spec, hp, wp)

    def im2col(g, j, q):
        return im2col_element(pad, spec, g * cg + j // rs_, j, q)

    def column(g, j, q):  # the GEMM's [g, j, q]: four rows of im2col in a word if packed
        if not packed:
            return im2col(g, j, q)
        zero = tvm.tirx.const(0, dt.value)
        return _pack4([tvm.tirx.if_then_else(j * 4 + i < crs, im2col(
            g, tvm.tirx.min(j * 4 + i, crs - 1), q), zero) for i in range(4)])

    if pp == p:
        col = te.compute((spec.groups, red, p), column, name="col")
    else:
        zero = tvm.tirx.const(0, col_dtype)
        col = te.compute((spec.groups, red, pp), lambda g, j, q: tvm.tirx.if_then_else(
            q < p, column(g, j, tvm.tirx.min(q, p - 1)), zero), name="col")
    rj = te.reduce_axis((0, red), "rj")
    kg = spec.K // spec.groups

    def product(k, q):
        f = _filter(spec, k, kp)
        if packed:
            return dp4a(weight[f, rj], col[f // kg, rj, q], native_dp4a)
        return _mul(weight[f, rj], col[f // kg, rj, q], dt, acc_dtype(ks))

    # Output [1, K, OH*OW]: the same memory as NCHW, the GEMM's natural shape.
    conv = te.compute((1, kp, pp), lambda n, k, q: te.sum(product(k, q), axis=[rj]),
                      name="conv")
    extras = epilogue_inputs(ks)
    ow = spec.OW
    if pp != p or kp != spec.K:
        if ks.epilogue:
            out = te.compute(spec.output_shape, lambda n, k, h, w: finish_output(
                conv[n, k, h * ow + w], ks, extras, k, (n, k, h, w)), name="out")
        else:
            out = te.compute((1, spec.K, p), lambda n, k, q: finish_output(
                conv[n, k, q], ks, extras, k, (n, k, q // ow, q % ow)), name="out")
        return [data, weight, *extras.values(), out]
    if ks.epilogue:  # written NCHW: the reshape after the GEMM folds into the epilogue
        out = te.compute(spec.output_shape, lambda n, k, h, w: finish_output(
            conv[n, k, h * ow + w], ks, extras, k, (n, k, h, w)), name="epilogue")
        return [data, weight, *extras.values(), out]
    return [data, weight, *extras.values(),
            _maybe_epilogue(conv, ks, extras, lambda n, k, q: (k, (n, k, q // ow, q % ow)))]


def _gemm_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """Parallel over blocks of filters by blocks of output positions, each a register tile
    accumulated over the reduction. Output positions padded to whole tiles (``out``
    stage): parallel over blocks of filters, each cropping its rows while in cache."""
    spec = ks.conv
    cropped = bool((spec.OH * spec.OW) % ks.knobs["tile_p"]) or _filters_padded(ks) != spec.K
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    n, k, q, r_j = sch.get_loops(block)
    qo, qi = sch.split(q, [None, ks.knobs["tile_p"]])
    ko, ki = sch.split(k, [None, ks.knobs["tile_k"]])
    sch.reorder(n, ko, qo, r_j, ki, qi)
    sch.reverse_compute_at(wb, qo)
    if cropped:
        task = sch.fuse(n, ko)
        out = sch.get_sblock("out")
        if len(sch.get_loops(out)) == 3:  # [1, K, OH*OW]: crop each task's filters
            sch.reverse_compute_at(out, task)
        else:  # NCHW (a fused epilogue): TVM cannot bound h * OW + w, crop in a pass
            _schedule_copy(sch, "out")
    else:
        task = sch.fuse(n, ko, qo)
    sch.parallel(task)
    sch.unroll(ki)
    vectorize(sch, qi)
    sch.decompose_reduction(block, r_j)
    _finish_writeback(sch, wb, ks, cropped)
    if (not cropped and _unpadded(spec)
            and (spec.R, spec.S, spec.stride_h, spec.stride_w) == (1, 1, 1, 1)):
        # pointwise: the im2col matrix is the input itself, read in place
        sch.compute_inline(sch.get_sblock("col"))
    else:
        _schedule_copy(sch, "col")


def spatial_pack_compute(ks: KernelSpec, tile_epilogue: bool = False) -> list:
    spec, dt = ks.conv, ks.dtype
    kb, vh_, vw_ = ks.knobs["tile_k"], ks.knobs["tile_h"], ks.knobs["tile_w"]
    cg = spec.C // spec.groups
    kg = spec.K // spec.groups
    oht, owt = ceil_div(spec.OH, vh_), ceil_div(spec.OW, vw_)
    # output channels in blocks of tile_k, the last padded with zero filters where tile_k
    # does not divide K (ungrouped convs only), cropped by the output stage like the tiles
    kt = ceil_div(spec.K, kb)
    vh_in = (vh_ - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    kvec = te.placeholder((kt, cg, spec.R, spec.S, kb), dt.value, name="weight")
    sw = spec.stride_w
    # Width phase-split by the stride: column vw*sw + s*dw of a tile is stored at
    # [phase (s*dw) % sw, vw + (s*dw) // sw], so width vectors load contiguously.
    vw_q = vw_ + ((spec.S - 1) * spec.dilation_w) // sw
    hp = max(spec.H + spec.pad_t + spec.pad_b, (oht * vh_ - 1) * spec.stride_h
             + (spec.R - 1) * spec.dilation_h + 1)
    wp = max(spec.W + spec.pad_l + spec.pad_r, ((owt - 1) * vw_ + vw_q) * sw)
    pad = padded_input(data, spec, hp, wp)
    # Data packed into tiles: each output tile's receptive field contiguous.
    data_vec = te.compute(
        (oht, owt, spec.C, vh_in, sw, vw_q),
        lambda ho, wo, c, vh, ph, vq: pad[0, c, ho * vh_ * spec.stride_h + vh,
                                          (wo * vw_ + vq) * sw + ph],
        name="data_vec")
    rc, rr, rs = _reduce_axes(spec)

    def in_c(ko):
        if spec.groups == 1:
            return rc
        return ((ko * kb) // kg) * cg + rc

    conv = te.compute(
        (kt, oht, owt, vh_, vw_, kb),
        lambda ko, ho, wo, vh, vw, ki: te.sum(_mul(
            data_vec[ho, wo, in_c(ko), vh * spec.stride_h + rr * spec.dilation_h,
                     (rs * spec.dilation_w) % sw, vw + (rs * spec.dilation_w) // sw],
            kvec[ko, rc, rr, rs, ki], dt, acc_dtype(ks)), axis=[rc, rr, rs]),
        name="conv")
    extras = epilogue_inputs(ks)
    if tile_epilogue:
        return [data, kvec, *extras.values(), _tile_epilogue(conv, ks, extras)]
    out = te.compute(
        spec.output_shape,
        lambda n, k, h, w: finish_output(conv[k // kb, h // vh_, w // vw_, h % vh_, w % vw_, k % kb],
                                   ks, extras, k, (n, k, h, w)),
        name="out")
    return [data, kvec, *extras.values(), out]


def _tile_epilogue(conv, ks: KernelSpec, extras: dict):
    """Spatial pack's output stage for the hand schedule: the epilogue's steps before a
    residual add (and the output cast) on the packed tile, an ``epilogue`` block the
    schedule folds into the accumulator write-back, vectorised over the filter block; the
    residual add and what follows it while the tile is unpacked to NCHW (``out``)."""
    spec = ks.conv
    kb, vh_, vw_ = ks.knobs["tile_k"], ks.knobs["tile_h"], ks.knobs["tile_w"]
    steps = ks.epilogue
    cut = next((i for i, step in enumerate(steps) if step[0] == "residual"), len(steps))
    head, tail = steps[:cut], steps[cut:]
    last = tvm.tirx.const(spec.K - 1, "int32")

    def packed(ko, ho, wo, vh, vw, ki):
        acc = conv[ko, ho, wo, vh, vw, ki]
        # the filters padding the last block read the last real filter's bias
        k = tvm.tirx.min(ko * kb + ki, last)
        if not tail:  # the whole epilogue, or the plain one, on the tile
            return finish_output(acc, ks, extras, k, None)
        return _steps(_to_float32(acc, ks), head, extras, k, None)

    tile = conv
    if _has_epilogue_block(ks):
        tile = te.compute(conv.shape, packed, name="epilogue")

    def unpacked(n, k, h, w):
        y = tile[k // kb, h // vh_, w // vw_, h % vh_, w % vw_, k % kb]
        return _to_output(_steps(y, tail, extras, k, (n, k, h, w)), ks) if tail else y

    return te.compute(spec.output_shape, unpacked, name="out")


def _spatial_pack_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """Parallel over blocks of filters by rows of tiles; each register tile accumulates over
    the reduction, is written back through the epilogue's steps before a residual add
    (:func:`_tile_epilogue`), and unpacked to NCHW while it is in cache."""
    kb = ks.knobs["tile_k"]
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    ko, ho, wo, vh, vw, ki, r_c, r_r, r_s = sch.get_loops(block)
    if kb >= 4:  # vectorise over the output-channel block (weights packed contiguous)
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, vh, vw, ki)
        sch.unroll(vh)
        sch.unroll(vw)
        vectorize(sch, ki)
    else:        # depthwise: vectorise along the output width
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, ki, vh, vw)
        sch.unroll(vh)
        vectorize(sch, vw)
    sch.reverse_compute_at(wb, wo)
    if _has_epilogue_block(ks):
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))
    out = sch.get_sblock("out")
    sch.reverse_compute_at(out, wo)
    sch.parallel(sch.fuse(ko, ho))
    sch.decompose_reduction(block, r_c)
    vectorize(sch, sch.get_loops(wb)[-1])
    if ks.out_dtype == "float32":  # narrower lanes gather slower than scalar copies
        vectorize(sch, sch.get_loops(out)[-1])
    _schedule_copy(sch, "data_vec")


def _has_epilogue_block(ks: KernelSpec) -> bool:
    return ks.dtype is not DType.FLOAT32 or bool(ks.epilogue)


def _maybe_epilogue(conv, ks: KernelSpec, extras: dict, where):
    """The output stage: ``conv`` itself (float32, nothing fused), or an elementwise
    ``epilogue`` block (cast, requantisation, the fused steps); ``where(*index)`` gives the
    output channel and the NCHW index of an element."""
    if not _has_epilogue_block(ks):
        return conv

    def body(*i):
        k, nchw = where(*i)
        return finish_output(conv[i], ks, extras, k, nchw)

    return te.compute(conv.shape, body, name="epilogue")


def _finish_writeback(sch: Schedule, wb, ks: KernelSpec, cropped: bool = False) -> None:
    """Vectorise the accumulator write-back; fold the epilogue (cast, requantisation, fused
    bias, activation and residual add) into it, so it runs on the register tile (unless the
    tiles are ``cropped`` by an ``out`` stage, which runs the epilogue)."""
    if _has_epilogue_block(ks) and not cropped:
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))
    vectorize(sch, sch.get_loops(wb)[-1])


def _unpadded(spec: ConvSpec) -> bool:
    return not (spec.pad_t or spec.pad_l or spec.pad_b or spec.pad_r)


def _schedule_copy(sch: Schedule, name: str) -> None:
    """Layout/padding stages: parallel over the two outer axes."""
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(loops[0], loops[1]) if len(loops) > 1 else loops[0])


#: Dense kernels: (TE compute definition, hand schedule) per algorithm.
DENSE_KERNELS = {Algorithm.DIRECT: (_direct_compute, _direct_schedule),
                 Algorithm.GEMM: (_gemm_compute, _gemm_schedule),
                 Algorithm.SPATIAL_PACK: (spatial_pack_compute, _spatial_pack_schedule)}


