"""The study's convolution kernels in TVM 0.27: direct, gemm (im2col) and spatial pack, each
dense (TE compute + hand schedule) and CSR-sparse (TensorIR loops, data-dependent bounds).

NCHW, batch 1, any stride, padding, dilation and groups. Data types: float32; float16 inputs,
weights and outputs with float32 accumulation (as Relax's ToMixedPrecision; fp16 accumulation
over a 4608-long reduction loses too much to verify); int8 inputs and weights with int32
accumulation and requantisation to int8 (see
:func:`dlas_predict.measure.kernels.reference.requantize`).

Every kernel is built by :func:`build_kernel` from its knobs
(:mod:`dlas_predict.measure.kernels.knobs`); weights are packed offline by :func:`pack_weights` into
the layout the kernel reads, so packing is not part of the timed run. This module imports TVM and
runs inside the isolated worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.space.config import Algorithm, ConvSpec, DType
from dlas_predict.measure.kernels.knobs import (VNNI_LANES, depthwise_extents, direct_input_width,
                                                dp4a_capable, filters_computed, vnni_capable)
from dlas_predict.measure.kernels.reference import int8_scale
from dlas_predict.measure.kernels.sparse import to_csr

ACC_DTYPE = {DType.FLOAT32: "float32", DType.FLOAT16: "float32", DType.INT8: "int32"}


@dataclass(frozen=True)
class KernelSpec:
    """What to build: a workload, an algorithm, dense or CSR, a dtype, and schedule knobs."""

    conv: ConvSpec
    algorithm: Algorithm
    sparse: bool
    dtype: DType
    knobs: dict
    #: int8 only: the requantisation scale (accumulator -> int8 output). None: the scale of
    #: :func:`dlas_predict.measure.kernels.reference.int8_scale`, for random inputs; whole networks
    #: pass their calibrated ``s_in * s_w / s_out``. With an epilogue: the dequantisation scale
    #: ``s_in * s_w`` (accumulator -> float32).
    scale: float | None = None
    #: The fused epilogue, applied in float32 to each output element while it is in registers:
    #: steps ``("bias",)`` (per output channel, an extra float32 [K] argument),
    #: ``("residual",)`` (an extra [1, K, OH, OW] argument of the network's dtype, added),
    #: ``("relu",)``, ``("max", c)``, ``("min", c)`` (clamps: ReLU6 is max 0 then min 6) and
    #: ``("silu",)``, in order. Empty: the bare convolution. An int8 kernel with an epilogue
    #: returns float32 (dequantised, not requantised).
    epilogue: tuple = ()

    @property
    def requant_scale(self) -> float:
        return int8_scale(self.conv) if self.scale is None else float(self.scale)

    @property
    def out_dtype(self) -> str:
        if self.epilogue and self.dtype is DType.INT8:
            return "float32"
        return self.dtype.value

    @property
    def residual_dtype(self) -> str:
        return "float16" if self.dtype is DType.FLOAT16 else "float32"

    def extra_inputs(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of the epilogue's arguments, after the weights."""
        ops = {step[0] for step in self.epilogue}
        out = []
        if "bias" in ops:
            out.append(("bias", (self.conv.K,), "float32"))
        if "residual" in ops:
            out.append(("residual", self.conv.output_shape, self.residual_dtype))
        return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------
# Offline weight packing (numpy): the layout each kernel reads.
# ------------------------------------------------------------------------------------------
def pack_weights(ks: KernelSpec, w: np.ndarray) -> list[np.ndarray]:
    """Weights [K, C/g, R, S] -> the kernel's weight arguments (packed once, not timed)."""
    spec = ks.conv
    if ks.sparse:
        csr = to_csr(w)
        return [csr.data, csr.indices, csr.indptr]
    if ks.algorithm is Algorithm.DIRECT:
        return [np.ascontiguousarray(w)]
    if ks.algorithm is Algorithm.GEMM and uses_vnni(ks):
        # [filter blocks, ceil(CRS/4), tile_k, 4], zero filters and reduction padding; and
        # 128 times each filter's weight sum (the unsigned bytes' offset), per padded filter
        kb = ks.knobs["tile_k"]
        crs = w[0].size
        rows = np.zeros((_ceil_div(spec.K, kb) * kb, _ceil_div(crs, 4) * 4), np.int8)
        rows[:spec.K, :crs] = w.reshape(spec.K, -1)
        packed = rows.reshape(-1, kb, rows.shape[1] // 4, 4).transpose(0, 2, 1, 3)
        wsum = 128 * rows.astype(np.int32).sum(axis=1, dtype=np.int32)
        return [np.ascontiguousarray(packed), wsum]
    if ks.algorithm is Algorithm.GEMM:
        rows = np.ascontiguousarray(w.reshape(spec.K, -1))
        if uses_dp4a(ks):  # four int8 of a row in one int32 (byte i = element 4j+i)
            crs = rows.shape[1]
            rows = np.concatenate([rows, np.zeros((spec.K, _ceil_div(crs, 4) * 4 - crs),
                                                  rows.dtype)], axis=1)
            return [np.ascontiguousarray(rows).view("<i4")]
        return [rows]
    kb = ks.knobs["tile_k"]
    kt = _ceil_div(spec.K, kb)
    if kt * kb != spec.K:  # zero filters pad the last block (the output stage crops them)
        w = np.concatenate([w, np.zeros((kt * kb - spec.K, *w.shape[1:]), w.dtype)])
    packed = w.reshape(kt, kb, *w.shape[1:]).transpose(0, 2, 3, 4, 1)
    return [np.ascontiguousarray(packed)]


# ------------------------------------------------------------------------------------------
# Dense kernels: TE compute definitions and hand schedules.
# ------------------------------------------------------------------------------------------
def _epilogue(acc, scale: float, dtype: DType, vector_round: bool = False):
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


EPILOGUE_STEPS = ("bias", "residual", "relu", "max", "min", "silu")


#: exp(x) = 2**n * e**r with n = round(x / ln 2) and |r| <= ln 2 / 2, e**r by Cephes' expf
#: polynomial (relative error under 1e-6 in float32). LLVM calls libm's scalar ``expf`` for
#: ``exp`` lane by lane; this form vectorises.
_EXP_CLAMP = 88.3762626647949
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)
_LOG2E = 1.44269504088896341
#: ln 2 in two parts (Cephes), so ``n * ln 2`` is subtracted without losing ``r``'s bits
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4


def fast_exp(x):
    """``exp(x)`` of a float32 TIR expression, as FMAs and an exponent shift (no libm call)."""
    tir = tvm.tirx

    def const(v):
        return tir.const(v, "float32")

    x = tir.max(tir.min(x, const(_EXP_CLAMP)), const(-_EXP_CLAMP))
    n = tir.floor(x * const(_LOG2E) + const(0.5))
    r = x - n * const(_LN2_HI) - n * const(_LN2_LO)
    p = const(_EXP_POLY[0])
    for coef in _EXP_POLY[1:]:
        p = p * r + const(coef)
    pow2 = tir.reinterpret("float32", tir.shift_left(n.astype("int32") + tir.const(127, "int32"),
                                                     tir.const(23, "int32")))
    return pow2 * (p * r * r + r + const(1.0))


#: sigmoid(x) = 1/2 + x P(x^2) / Q(x^2), a rational least-squares fit on |x| <= 16 with
#: absolute error under 1e-6 evaluated in float32; the input is clamped to 15.75, where it
#: is 2.4e-7 from 0 or 1 (the true sigmoid 1.4e-7), so past it a SiLU is off by about two
#: float32 roundings of its input. Eleven FMAs and a division per lane against the sixteen
#: operations and one of ``1 / (1 + fast_exp(-x))``.
_SIGMOID_BOUND = 15.75
_SIGMOID_P = (0.24999752485375207, -0.019594305082563056, 0.0018489075831897208,
              7.587417263793711e-05, 3.410463103551773e-07, 1.2911197971598988e-10)
_SIGMOID_Q = (1.0, 0.004942097699361777, -0.0005199109020404272, 0.0010609990128949802,
              1.3022516934214862e-05, 2.0168176715079546e-08)


def _sigmoid(x, const, clamp):
    """The formula of :func:`fast_sigmoid` over the operations it is given: TIR expressions
    for the TE kernels, TVMScript text (:class:`_Script`) for the CSR ones."""
    x = clamp(x, const(-_SIGMOID_BOUND), const(_SIGMOID_BOUND))
    t = x * x
    p, q = const(_SIGMOID_P[-1]), const(_SIGMOID_Q[-1])
    for coef in _SIGMOID_P[-2::-1]:
        p = p * t + const(coef)
    for coef in _SIGMOID_Q[-2::-1]:
        q = q * t + const(coef)
    return x * p / q + const(0.5)


def fast_sigmoid(x):
    """``1 / (1 + exp(-x))`` of a float32 TIR expression as a rational function: FMAs and
    one division per lane, no libm call (LLVM lowers ``exp`` to a scalar ``expf`` per lane)."""
    tir = tvm.tirx
    return _sigmoid(x, lambda v: tir.const(v, "float32"),
                    lambda v, lo, hi: tir.max(tir.min(v, hi), lo))


class _Script(str):
    """TVMScript text of a float32 expression, combined by ``+``, ``-`` and ``*``."""

    def __add__(self, other):
        return _Script(f"({self} + {other})")

    def __sub__(self, other):
        return _Script(f"({self} - {other})")

    def __mul__(self, other):
        return _Script(f"({self} * {other})")

    def __truediv__(self, other):
        return _Script(f"({self} / {other})")


def fast_sigmoid_script(x: str) -> str:
    """:func:`fast_sigmoid` as a TVMScript expression of the float32 expression ``x``."""
    return _sigmoid(_Script(f"({x})"), lambda v: _Script(f"T.float32({v!r})"),
                    lambda v, lo, hi: _Script(f"T.max(T.min({v}, {hi}), {lo})"))


def _extras(ks: KernelSpec) -> dict:
    return {name: te.placeholder(shape, dt, name=name) for name, shape, dt in ks.extra_inputs()}


def _finish(acc, ks: KernelSpec, extras: dict, k, nchw: tuple):
    """Accumulator -> output element at output channel ``k`` (NCHW index ``nchw``): the plain
    epilogue (:func:`_epilogue`), or the fused one of ``ks.epilogue`` computed in float32."""
    if not ks.epilogue:
        return _epilogue(acc, ks.requant_scale, ks.dtype)
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


def _padded(data, spec: ConvSpec, height: int, width: int, name: str = "pad"):
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
    owp = _padded_extent(spec.OW, ks.knobs.get("tile_w")) if tiles else spec.OW
    kp = _filters_padded(ks) if tiles else spec.K
    hp = spec.H + spec.pad_t + spec.pad_b
    pad = _padded(data, spec, hp, direct_input_width(spec, owp))
    rc, rr, rs = _reduce_axes(spec)
    conv = te.compute(
        (1, kp, spec.OH, owp),
        lambda n, k, h, w: te.sum(_mul(
            pad[n, _in_channel(spec, k, rc), h * spec.stride_h + rr * spec.dilation_h,
                w * spec.stride_w + rs * spec.dilation_w],
            weight[_filter(spec, k, kp), rc, rr, rs], dt, acc_dtype(ks)),
            axis=[rc, rr, rs]),
        name="conv")
    extras = _extras(ks)
    if owp != spec.OW or kp != spec.K:
        out = te.compute(spec.output_shape, lambda n, k, h, w: _finish(
            conv[n, k, h, w], ks, extras, k, (n, k, h, w)), name="out")
        return [data, weight, *extras.values(), out]
    return [data, weight, *extras.values(),
            _maybe_epilogue(conv, ks, extras, lambda n, k, h, w: (k, (n, k, h, w)))]


def _padded_extent(extent: int, tile: int | None) -> int:
    """``extent`` rounded up to whole ``tile``s (no tile: unchanged)."""
    return _ceil_div(extent, tile) * tile if tile else extent


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
    extras = _extras(ks)
    out = te.compute(spec.output_shape,
                     lambda n, k, h, w: _finish(conv[n, k, h, w], ks, extras, k, (n, k, h, w)),
                     name="out")
    return [data, weight, *extras.values(), out]


def _vectorize(sch: Schedule, loop) -> None:
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
    _vectorize(sch, wi)
    sch.decompose_reduction(block, r_r)
    _vectorize(sch, sch.get_loops(wb)[-1])
    _vectorize(sch, sch.get_loops(sch.get_sblock("out"))[-1])


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
    _vectorize(sch, wi)
    sch.decompose_reduction(block, r_c)
    cropped = bool(ks.conv.OW % ks.knobs["tile_w"]) or _filters_padded(ks) != ks.conv.K
    _finish_writeback(sch, wb, ks, cropped)
    if cropped:  # computed over whole tiles: crop each task's row while it is in cache
        sch.reverse_compute_at(sch.get_sblock("out"), task)
    widened = direct_input_width(ks.conv, _padded_extent(ks.conv.OW, ks.knobs["tile_w"]))
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


def _im2col(pad, spec: ConvSpec, channel, j, q):
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
    red = _ceil_div(crs, 4) if packed else crs  # the reduction's extent (words if packed)
    col_dtype = "int32" if packed else dt.value
    rs_ = spec.R * spec.S
    p = spec.OH * spec.OW
    pp = _padded_extent(p, ks.knobs.get("tile_p")) if tiles else p
    kp = _filters_padded(ks) if tiles else spec.K
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder((spec.K, red), col_dtype, name="weight")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = _padded(data, spec, hp, wp)

    def im2col(g, j, q):
        return _im2col(pad, spec, g * cg + j // rs_, j, q)

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
    extras = _extras(ks)
    ow = spec.OW
    if pp != p or kp != spec.K:
        if ks.epilogue:
            out = te.compute(spec.output_shape, lambda n, k, h, w: _finish(
                conv[n, k, h * ow + w], ks, extras, k, (n, k, h, w)), name="out")
        else:
            out = te.compute((1, spec.K, p), lambda n, k, q: _finish(
                conv[n, k, q], ks, extras, k, (n, k, q // ow, q % ow)), name="out")
        return [data, weight, *extras.values(), out]
    if ks.epilogue:  # written NCHW: the reshape after the GEMM folds into the epilogue
        out = te.compute(spec.output_shape, lambda n, k, h, w: _finish(
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
    _vectorize(sch, qi)
    sch.decompose_reduction(block, r_j)
    _finish_writeback(sch, wb, ks, cropped)
    if (not cropped and _unpadded(spec)
            and (spec.R, spec.S, spec.stride_h, spec.stride_w) == (1, 1, 1, 1)):
        # pointwise: the im2col matrix is the input itself, read in place
        sch.compute_inline(sch.get_sblock("col"))
    else:
        _schedule_copy(sch, "col")


# ------------------------------------------------------------------------------------------
# int8 GEMM on AVX-512 VNNI: four int8 products summed per int32 lane by one instruction.
# ------------------------------------------------------------------------------------------
def uses_vnni(ks: KernelSpec) -> bool:
    """An int8 GEMM kernel whose ``vnni`` knob is set (:func:`~dlas_predict.measure.kernels.knobs.
    vnni_capable`): AVX-512 VNNI's ``vpdpbusd`` sums four products per int32 lane."""
    return vnni_capable(ks) and bool(ks.knobs.get("vnni"))


def vnni_intrin(lanes: int) -> str:
    """The name of the tensor intrinsic (registered on first use) that adds to ``lanes``
    int32 accumulators (one per output position) the four products of each position's word
    of four unsigned bytes by one filter's four int8 weights, broadcast: ``vpdpbusd`` on 8
    or 16 lanes, its weights a broadcast memory operand.

    The unsigned bytes are a position's four reduction elements, each its int8 value plus
    128 (:func:`_gemm_vnni_compute` subtracts 128 times the filter's weight sum). TVM's own
    VNNI intrinsic broadcasts the unsigned operand and passes int32 vectors, which this
    LLVM's ``vpdpbusd`` declaration (byte vectors) rejects."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    name = f"dlas_vnni_u8s8i32_{lanes}x4"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    if lanes not in VNNI_LANES:
        raise ValueError(f"VNNI runs on 8 or 16 int32 lanes, not {lanes}")
    vec, acc = f"int8x{4 * lanes}", f"int32x{lanes}"
    llvm_name = f"llvm.x86.avx512.vpdpbusd.{32 * lanes}"

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((lanes,), "int32", offset_factor=1),
             b: T.Buffer((4,), "int8", offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:lanes], b[0:4])
            T.writes(c[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.bitwise_and(T.shift_right(a[vi], vk * 8), 255) \
                        * T.Cast("int32", b[vk])

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((lanes,), "int32", offset_factor=1),
             b: T.Buffer((4,), "int8", offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:lanes], b[0:4])
            T.writes(c[0:lanes])
            c[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name), c.vload([0], dtype=acc),
                T.reinterpret(a.vload([0], dtype=acc), dtype=vec),
                T.reinterpret(T.broadcast(T.reinterpret(b.vload([0], dtype="int8x4"),
                                                        dtype="int32"), lanes), dtype=vec),
                dtype=acc)

    TensorIntrin.register(name, desc, impl)
    return name


def _gemm_vnni_compute(ks: KernelSpec) -> list:
    """im2col into words of four reduction elements per position, each byte the int8 input
    plus 128 (``col`` [ceil(CRS/4), positions]), then a GEMM [filters, positions] whose
    every lane (a position) sums the unsigned bytes times a filter's int8 weights (packed
    [filter blocks, ceil(CRS/4), tile_k, 4]), and an output stage that subtracts 128 times
    each filter's weight sum (a third weight argument, packed offline) before the epilogue.
    Positions are padded to whole vectors of ``tile_p`` lanes and filters to whole blocks of
    ``tile_k`` (zero weights), both cropped."""
    spec = ks.conv
    kb, lanes = ks.knobs["tile_k"], ks.knobs["tile_p"]
    crs = spec.C * spec.R * spec.S
    red, kt = _ceil_div(crs, 4), _ceil_div(spec.K, kb)
    p = spec.OH * spec.OW
    pp = _padded_extent(p, lanes)
    data = te.placeholder(spec.input_shape, "int8", name="data")
    weight = te.placeholder((kt, red, kb, 4), "int8", name="weight")
    wsum = te.placeholder((kt * kb,), "int32", name="weight_sum")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = _padded(data, spec, hp, wp)
    rs_ = spec.R * spec.S
    i32 = "int32"

    def byte(j, q):  # reduction element j at position q, plus 128 (128: zero, or padding)
        jc, qc = tvm.tirx.min(j, crs - 1), tvm.tirx.min(q, p - 1)
        v = _im2col(pad, spec, jc // rs_, jc, qc).astype(i32) + tvm.tirx.const(128, i32)
        if crs % 4 == 0 and pp == p:
            return v
        return tvm.tirx.if_then_else(tvm.tirx.all(j < crs, q < p), v,
                                     tvm.tirx.const(128, i32))

    def word(j, q):
        w = byte(j * 4, q)
        for i in range(1, 4):
            w = w | (byte(j * 4 + i, q) << tvm.tirx.const(8 * i, i32))
        return w

    # [vectors of positions, words, lanes]: a register tile reads its words contiguously
    col = te.compute((pp // lanes, red, lanes),
                     lambda qo, j, qi: word(j, qo * lanes + qi), name="col")
    rj, ri = te.reduce_axis((0, red), "rj"), te.reduce_axis((0, 4), "ri")
    conv = te.compute(
        (kt * kb, pp),
        lambda k, q: te.sum(
            tvm.tirx.bitwise_and(tvm.tirx.shift_right(col[q // lanes, rj, q % lanes], ri * 8),
                                 255)
            * weight[k // kb, rj, k % kb, ri].astype(i32), axis=[rj, ri]),
        name="conv")
    extras = _extras(ks)
    ow = spec.OW
    # [1, K, OH*OW]: the schedule writes each register tile's block of it, then (with an
    # epilogue) declares it NCHW, the same memory
    def finish(n, k, q):
        acc = conv(k, q) - wsum(k)
        if not ks.epilogue:  # requantised, rounding in vectors
            return _epilogue(acc, ks.requant_scale, ks.dtype, vector_round=True)
        return _finish(acc, ks, extras, k, (n, k, q // ow, q % ow))

    out = te.compute((1, spec.K, p), finish, name="out")
    return [data, weight, wsum, *extras.values(), out]


def _gemm_vnni_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """The words of ``col`` parallel over vectors of positions; the GEMM parallel over
    vectors of ``tile_p`` positions by blocks of ``tile_k`` filters (in that order, so each
    core reads the words it wrote), a register tile of one accumulator vector per filter
    updated by :func:`vnni_intrin` per word, then written through the epilogue while in
    cache."""
    kb, lanes = ks.knobs["tile_k"], ks.knobs["tile_p"]
    spec = ks.conv
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    k, q, rj, ri = sch.get_loops(block)
    ko, ki = sch.split(k, [None, kb])
    qo, qi = sch.split(q, [None, lanes])
    # vectors of positions outer: a core's tasks read the words its share of ``col`` wrote
    sch.reorder(qo, ko, rj, ki, qi, ri)
    task = sch.fuse(qo, ko)
    sch.parallel(task)
    # each tile's accumulators written back through the output stage (or, where the tiles
    # are cropped, written back and then through it), while in cache
    sch.reverse_compute_at(wb, task)
    out = sch.get_sblock("out")
    cropped = spec.K % kb or (spec.OH * spec.OW) % lanes
    if cropped:
        sch.reverse_compute_at(out, task)
        _vectorize(sch, sch.get_loops(out)[-1])
    else:
        sch.reverse_compute_inline(out)
    init = sch.decompose_reduction(block, rj)
    sch.tensorize(qi, vnni_intrin(lanes))
    sch.unroll(ki)
    _vectorize(sch, sch.get_loops(init)[-1])
    _vectorize(sch, sch.get_loops(wb)[-1])
    qo, _j, qi = sch.get_loops(sch.get_sblock("col"))
    sch.parallel(qo)
    _vectorize(sch, qi)
    if ks.epilogue:  # the kernel's output is NCHW (written by the write-back if inlined)
        ow = spec.OW
        sch.transform_layout(out if cropped else wb, ("write", 0),
                             lambda n, k, q: (n, k, q // ow, q % ow))


def _spatial_pack_compute(ks: KernelSpec, tile_epilogue: bool = False) -> list:
    spec, dt = ks.conv, ks.dtype
    kb, vh_, vw_ = ks.knobs["tile_k"], ks.knobs["tile_h"], ks.knobs["tile_w"]
    cg = spec.C // spec.groups
    kg = spec.K // spec.groups
    oht, owt = _ceil_div(spec.OH, vh_), _ceil_div(spec.OW, vw_)
    # output channels in blocks of tile_k, the last padded with zero filters where tile_k
    # does not divide K (ungrouped convs only), cropped by the output stage like the tiles
    kt = _ceil_div(spec.K, kb)
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
    pad = _padded(data, spec, hp, wp)
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
    extras = _extras(ks)
    if tile_epilogue:
        return [data, kvec, *extras.values(), _tile_epilogue(conv, ks, extras)]
    out = te.compute(
        spec.output_shape,
        lambda n, k, h, w: _finish(conv[k // kb, h // vh_, w // vw_, h % vh_, w % vw_, k % kb],
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
            return _finish(acc, ks, extras, k, None)
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
        _vectorize(sch, ki)
    else:        # depthwise: vectorise along the output width
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, ki, vh, vw)
        sch.unroll(vh)
        _vectorize(sch, vw)
    sch.reverse_compute_at(wb, wo)
    if _has_epilogue_block(ks):
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))
    out = sch.get_sblock("out")
    sch.reverse_compute_at(out, wo)
    sch.parallel(sch.fuse(ko, ho))
    sch.decompose_reduction(block, r_c)
    _vectorize(sch, sch.get_loops(wb)[-1])
    if ks.out_dtype == "float32":  # narrower lanes gather slower than scalar copies
        _vectorize(sch, sch.get_loops(out)[-1])
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
        return _finish(conv[i], ks, extras, k, nchw)

    return te.compute(conv.shape, body, name="epilogue")


def _finish_writeback(sch: Schedule, wb, ks: KernelSpec, cropped: bool = False) -> None:
    """Vectorise the accumulator write-back; fold the epilogue (cast, requantisation, fused
    bias, activation and residual add) into it, so it runs on the register tile (unless the
    tiles are ``cropped`` by an ``out`` stage, which runs the epilogue)."""
    if _has_epilogue_block(ks) and not cropped:
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))
    _vectorize(sch, sch.get_loops(wb)[-1])


def _unpadded(spec: ConvSpec) -> bool:
    return not (spec.pad_t or spec.pad_l or spec.pad_b or spec.pad_r)


def _schedule_copy(sch: Schedule, name: str) -> None:
    """Layout/padding stages: parallel over the two outer axes."""
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(loops[0], loops[1]) if len(loops) > 1 else loops[0])


# ------------------------------------------------------------------------------------------
# CSR-sparse kernels: TVMScript loops (a TE reduction cannot depend on data).
# ------------------------------------------------------------------------------------------
SPARSE_HEADER = '''
# from tvm.script import tirx as T
@T.prim_func
def main(data: T.Buffer(({C_}, {C}, {H}, {W}), "{dt}"), w_data_h: T.handle,
         w_indices_h: T.handle, w_indptr: T.Buffer(({K1},), "int32"),{extra}
         out: T.Buffer((1, {K}, {OH}, {OW}), "{odt}")):
    T.func_attr({{"tirx.noalias": True}})
    nnz = T.int32()
    w_data = T.match_buffer(w_data_h, (nnz,), "{dt}")
    w_indices = T.match_buffer(w_indices_h, (nnz,), "int32")
'''


def _sparse_epilogue(ks: KernelSpec, scale: float) -> str:
    """The output expression of a CSR kernel, a template of ``{x}`` (the accumulator) and
    ``{k}``, ``{h}``, ``{w}`` (the output element): as :func:`_finish`, in TVMScript."""
    dt = ks.dtype
    if not ks.epilogue:
        if dt is DType.INT8:
            return ('T.Cast("int8", T.max(T.min(T.nearbyint(T.Cast("float32", {x}) * '
                    f'T.float32({scale!r})), T.float32(127.0)), T.float32(-128.0)))')
        return 'T.Cast("float16", {x})' if dt is DType.FLOAT16 else "{x}"
    y = "{x}" if dt is DType.FLOAT32 else 'T.Cast("float32", {x})'
    if dt is DType.INT8:
        y = f"({y} * T.float32({scale!r}))"
    for step in ks.epilogue:
        op = step[0]
        if op == "bias":
            y = f"({y} + bias[{{k}}])"
        elif op == "residual":
            y = f'({y} + T.Cast("float32", residual[0, {{k}}, {{h}}, {{w}}]))'
        elif op == "relu":
            y = f"T.max({y}, T.float32(0.0))"
        elif op in ("max", "min"):
            y = f"T.{op}({y}, T.float32({float(step[1])!r}))"
        elif op == "silu":
            y = f"({y} * {fast_sigmoid_script(y)})"
        else:
            raise ValueError(f"unknown epilogue step {step!r}")
    return f'T.Cast("float16", {y})' if ks.out_dtype == "float16" else y


def _sparse_terms(ks: KernelSpec) -> dict:
    spec, dt = ks.conv, ks.dtype
    acc = ACC_DTYPE[dt]
    load = 'T.Cast("int32", {x})' if dt is DType.INT8 else (
        'T.Cast("float32", {x})' if dt is DType.FLOAT16 else "{x}")
    extra = "".join(f'\n         {name}: T.Buffer({shape!r}, "{dtype}"),'
                    for name, shape, dtype in ks.extra_inputs())
    return {
        "C_": 1, "C": spec.C, "H": spec.H, "W": spec.W, "K": spec.K, "K1": spec.K + 1,
        "OH": spec.OH, "OW": spec.OW, "dt": dt.value, "acc": acc, "zero": f'T.{acc}(0)',
        "RS": spec.R * spec.S, "S": spec.S, "R": spec.R, "sh": spec.stride_h,
        "sw": spec.stride_w, "dh": spec.dilation_h, "dw": spec.dilation_w,
        "pt": spec.pad_t, "pl": spec.pad_l, "Cg": spec.C // spec.groups,
        "Kg": spec.K // spec.groups, "epi": _sparse_epilogue(ks, ks.requant_scale),
        "load": load, "odt": ks.out_dtype, "extra": extra,
    }


def csr_decode(t: dict, indent: str) -> str:
    """Statements decoding nonzero ``jj`` of row ``k`` into (c, r, s) and its value."""
    return (f"{indent}jj = w_indptr[k] + j\n"
            f"{indent}col = w_indices[jj]\n"
            f"{indent}c = (k // {t['Kg']}) * {t['Cg']} + col // {t['RS']}\n"
            f"{indent}r = col % {t['RS']} // {t['S']}\n"
            f"{indent}s = col % {t['S']}\n"
            f"{indent}val = {t['load'].format(x='w_data[jj]')}\n")


def _pad_loop(t: dict, hp: int, wp: int) -> str:
    """Zero-padded copy of the input, parallel over channels."""
    return f'''
    pad = T.alloc_buffer(({t["C"]}, {hp}, {wp}), "{t["dt"]}")
    for c in T.parallel({t["C"]}):
        for h, w in T.grid({hp}, {wp}):
            pad[c, h, w] = T.if_then_else({t["pt"]} <= h and h < {t["pt"] + t["H"]} and
                                          {t["pl"]} <= w and w < {t["pl"] + t["W"]},
                                          data[0, c, h - {t["pt"]}, w - {t["pl"]}],
                                          T.{t["dt"]}(0))
'''


def _direct_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    vl = ks.knobs["tile_w"]
    owp = _ceil_div(spec.OW, vl) * vl
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = max(spec.W + spec.pad_l + spec.pad_r,
             (owp - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1)
    x = (f"pad[c, h * {t['sh']} + r * {t['dh']}, "
         f"(wc * {vl} + v) * {t['sw']} + s * {t['dw']}]")
    return SPARSE_HEADER.format(**t) + _pad_loop(t, hp, wp) + f'''
    for kh in T.parallel({spec.K * spec.OH}):
        acc = T.alloc_buffer(({owp},), "{t["acc"]}", scope="local")
        k = kh // {spec.OH}
        h = kh % {spec.OH}
        for wc in range({owp // vl}):
            for v in T.vectorized({vl}):
                acc[wc * {vl} + v] = {t["zero"]}
        for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 12)}            for wc in range({owp // vl}):
                for v in T.vectorized({vl}):
                    acc[wc * {vl} + v] = acc[wc * {vl} + v] + val * {t["load"].format(x=x)}
        for w in range({spec.OW}):
            out[0, k, h, w] = {t["epi"].format(x="acc[w]", k="k", h="h", w="w")}
'''


def _gemm_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    tp = ks.knobs["tile_p"]
    p = spec.OH * spec.OW
    pp = _ceil_div(p, tp) * tp
    crs = (spec.C // spec.groups) * spec.R * spec.S
    rows = spec.groups * crs
    x = f"col[(k // {t['Kg']}) * {crs} + w_indices[jj], pb * {tp} + v]"
    return SPARSE_HEADER.format(**t) + f'''
    col = T.alloc_buffer(({rows}, {pp}), "{t["dt"]}")
    for gj in T.parallel({rows}):
        for q in range({pp}):
            g = gj // {crs}
            jcol = gj % {crs}
            ci = g * {t["Cg"]} + jcol // {t["RS"]}
            hh = q // {spec.OW} * {t["sh"]} + jcol % {t["RS"]} // {t["S"]} * {t["dh"]} - {t["pt"]}
            ww = q % {spec.OW} * {t["sw"]} + jcol % {t["S"]} * {t["dw"]} - {t["pl"]}
            col[gj, q] = T.if_then_else(q < {p} and 0 <= hh and hh < {spec.H} and
                                        0 <= ww and ww < {spec.W},
                                        data[0, ci, T.max(T.min(hh, {spec.H - 1}), 0),
                                             T.max(T.min(ww, {spec.W - 1}), 0)],
                                        T.{t["dt"]}(0))
    for kp in T.parallel({spec.K * (pp // tp)}):
        acc = T.alloc_buffer(({tp},), "{t["acc"]}", scope="local")
        k = kp // {pp // tp}
        pb = kp % {pp // tp}
        for v in T.vectorized({tp}):
            acc[v] = {t["zero"]}
        for j in range(w_indptr[k + 1] - w_indptr[k]):
            jj = w_indptr[k] + j
            val = {t["load"].format(x="w_data[jj]")}
            for v in T.vectorized({tp}):
                acc[v] = acc[v] + val * {t["load"].format(x=x)}
        for v in range({tp}):
            if pb * {tp} + v < {p}:
                out[0, k, (pb * {tp} + v) // {spec.OW}, (pb * {tp} + v) % {spec.OW}] = {
                    t["epi"].format(x="acc[v]", k="k", h=f"(pb * {tp} + v) // {spec.OW}",
                                    w=f"(pb * {tp} + v) % {spec.OW}")}
'''


def _spatial_pack_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    vh_, vw_ = ks.knobs["tile_h"], ks.knobs["tile_w"]
    oht, owt = _ceil_div(spec.OH, vh_), _ceil_div(spec.OW, vw_)
    vh_in = (vh_ - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1
    vw_in = (vw_ - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1
    x = (f"data_vec[ho, wo, c, vh * {t['sh']} + r * {t['dh']}, "
         f"vw * {t['sw']} + s * {t['dw']}]")
    return SPARSE_HEADER.format(**t) + f'''
    data_vec = T.alloc_buffer(({oht}, {owt}, {spec.C}, {vh_in}, {vw_in}), "{t["dt"]}")
    for ho in T.parallel({oht}):
        for wo, c, ih, iw in T.grid({owt}, {spec.C}, {vh_in}, {vw_in}):
            hh = ho * {vh_ * spec.stride_h} + ih - {t["pt"]}
            ww = wo * {vw_ * spec.stride_w} + iw - {t["pl"]}
            data_vec[ho, wo, c, ih, iw] = T.if_then_else(
                0 <= hh and hh < {spec.H} and 0 <= ww and ww < {spec.W},
                data[0, c, T.max(T.min(hh, {spec.H - 1}), 0), T.max(T.min(ww, {spec.W - 1}), 0)],
                T.{t["dt"]}(0))
    for kt in T.parallel({spec.K * oht}):
        acc = T.alloc_buffer(({vh_}, {vw_}), "{t["acc"]}", scope="local")
        k = kt // {oht}
        ho = kt % {oht}
        for wo in range({owt}):
            for vh in T.unroll({vh_}):
                for vw in T.vectorized({vw_}):
                    acc[vh, vw] = {t["zero"]}
            for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 16)}                for vh in T.unroll({vh_}):
                    for vw in T.vectorized({vw_}):
                        acc[vh, vw] = acc[vh, vw] + val * {t["load"].format(x=x)}
            for vh, vw in T.grid({vh_}, {vw_}):
                if ho * {vh_} + vh < {spec.OH} and wo * {vw_} + vw < {spec.OW}:
                    out[0, k, ho * {vh_} + vh, wo * {vw_} + vw] = {
                        t["epi"].format(x="acc[vh, vw]", k="k", h=f"ho * {vh_} + vh",
                                        w=f"wo * {vw_} + vw")}
'''


#: Dense kernels: (TE compute definition, hand schedule) per algorithm.
DENSE_KERNELS = {Algorithm.DIRECT: (_direct_compute, _direct_schedule),
          Algorithm.GEMM: (_gemm_compute, _gemm_schedule),
          Algorithm.SPATIAL_PACK: (_spatial_pack_compute, _spatial_pack_schedule)}
_SPARSE = {Algorithm.DIRECT: _direct_sparse, Algorithm.GEMM: _gemm_sparse,
           Algorithm.SPATIAL_PACK: _spatial_pack_sparse}


def _dense(ks: KernelSpec) -> tuple:
    """A dense kernel's (TE compute definition, hand schedule)."""
    if uses_vnni(ks):
        return _gemm_vnni_compute, _gemm_vnni_schedule
    return DENSE_KERNELS[ks.algorithm]


def output_shape(ks: KernelSpec) -> tuple[int, ...]:
    """Shape of the kernel's output buffer; always the same memory layout as NCHW (a dense
    GEMM without a fused epilogue writes its natural [1, K, OH*OW])."""
    spec = ks.conv
    if ks.algorithm is Algorithm.GEMM and not ks.sparse and not ks.epilogue:
        return (1, spec.K, spec.OH * spec.OW)
    return spec.output_shape


def device_args(ks: KernelSpec, x: np.ndarray, w: np.ndarray, dev,
                extras: dict[str, np.ndarray] | None = None) -> list:
    """The kernel's call arguments on ``dev``: the input, the packed weights of ``w``, the
    epilogue's arguments (``extras`` by name: ``bias``, ``residual``), and a zeroed output
    buffer (last)."""
    extras = extras or {}
    missing = [n for n, _, _ in ks.extra_inputs() if n not in extras]
    if missing:
        raise ValueError(f"the epilogue needs {', '.join(missing)}")
    args = [x, *pack_weights(ks, w),
            *(np.asarray(extras[n], dtype=dt).reshape(shape)
              for n, shape, dt in ks.extra_inputs())]
    return [tvm.runtime.tensor(a, dev) for a in args] + [
        tvm.runtime.tensor(np.zeros(output_shape(ks), dtype=ks.out_dtype), dev)]


def dense_prim_func(ks: KernelSpec) -> "tvm.tirx.PrimFunc":
    """The unscheduled TensorIR function of a dense kernel: what MetaSchedule tunes.

    Only spatial pack's data layout depends on knobs (``tile_k``, ``tile_h``, ``tile_w`` shape
    the packed tensors); the loop schedule is left to the tuner.
    """
    if ks.sparse:
        raise ValueError("CSR kernels have data-dependent loops; they are not TE computes")
    compute, _ = _dense(ks)
    return te.create_prim_func(compute(ks))


def kernel_module(ks: KernelSpec) -> tvm.IRModule:
    """The hand-scheduled TensorIR module of a kernel (not yet compiled)."""
    if ks.sparse:
        from tvm.script import from_source

        func = from_source(_SPARSE[ks.algorithm](ks))
        return tvm.IRModule({"main": func})
    compute, schedule = _dense(ks)
    if ks.algorithm is Algorithm.SPATIAL_PACK:  # the output stage the hand schedule tiles
        compute = partial(_spatial_pack_compute, tile_epilogue=True)
    elif not uses_vnni(ks):  # extents the vector tiles do not divide, over whole tiles
        compute = partial(compute, tiles=True)
    sch = Schedule(te.create_prim_func(compute(ks)))
    schedule(sch, ks)
    return sch.mod


def build_kernel(ks: KernelSpec, target: "tvm.target.Target"):
    """Compile a kernel for ``target``; returns the executable (call ``ex["main"](...)``)."""
    return tvm.compile(kernel_module(ks), target=target)


def tvm_target(target_json: dict):
    """The TVM target of a target's JSON form (a registry entry's ``target``)."""
    import tvm

    return tvm.target.Target(target_json)
