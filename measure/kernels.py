"""The study's convolution kernels in TVM 0.27: direct, gemm (im2col) and spatial pack, each
dense (TE compute + hand schedule) and CSR-sparse (TensorIR loops, data-dependent bounds).

NCHW, batch 1, any stride, padding, dilation and groups. Data types: float32; float16 inputs,
weights and outputs with float32 accumulation (as Relax's ToMixedPrecision; fp16 accumulation
over a 4608-long reduction loses too much to verify); int8 inputs and weights with int32
accumulation and requantisation to int8 (see :func:`dlas_predict.measure.reference.requantize`).

Every kernel is built by :func:`build_kernel` from its knobs (:mod:`dlas_predict.measure.knobs`);
weights are packed offline by :func:`pack_weights` into the layout the kernel reads, so packing is
not part of the timed run. This module imports TVM and runs inside the isolated worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.space.config import Algorithm, ConvSpec, DType
from .reference import int8_scale
from .sparse import to_csr

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
    #: :func:`dlas_predict.measure.reference.int8_scale`, for random inputs; whole networks pass
    #: their calibrated ``s_in * s_w / s_out``.
    scale: float | None = None

    @property
    def requant_scale(self) -> float:
        return int8_scale(self.conv) if self.scale is None else float(self.scale)


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
    if ks.algorithm is Algorithm.GEMM:
        return [np.ascontiguousarray(w.reshape(spec.K, -1))]
    kb = ks.knobs["tile_k"]
    packed = w.reshape(spec.K // kb, kb, *w.shape[1:]).transpose(0, 2, 3, 4, 1)
    return [np.ascontiguousarray(packed)]


# ------------------------------------------------------------------------------------------
# Dense kernels: TE compute definitions and hand schedules.
# ------------------------------------------------------------------------------------------
def _epilogue(acc, scale: float, dtype: DType):
    """Accumulator -> output element: identity (float32), rounding to float16, or int8
    requantisation."""
    if dtype is DType.FLOAT32:
        return acc
    if dtype is DType.FLOAT16:
        return acc.astype("float16")
    scaled = tvm.tirx.nearbyint(acc.astype("float32") * tvm.tirx.const(scale, "float32"))
    clipped = tvm.tirx.max(tvm.tirx.min(scaled, tvm.tirx.const(127.0, "float32")),
                           tvm.tirx.const(-128.0, "float32"))
    return clipped.astype("int8")


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


def _direct_compute(ks: KernelSpec) -> list:
    spec, dt = ks.conv, ks.dtype
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder(spec.weight_shape, dt.value, name="weight")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = _padded(data, spec, hp, wp)
    rc, rr, rs = _reduce_axes(spec)
    conv = te.compute(
        spec.output_shape,
        lambda n, k, h, w: te.sum(_mul(
            pad[n, _in_channel(spec, k, rc), h * spec.stride_h + rr * spec.dilation_h,
                w * spec.stride_w + rs * spec.dilation_w],
            weight[k, rc, rr, rs], dt, acc_dtype(ks)), axis=[rc, rr, rs]),
        name="conv")
    return [data, weight, _maybe_epilogue(conv, ks.requant_scale, dt)]


def _direct_schedule(sch: Schedule, ks: KernelSpec) -> None:
    dt = ks.dtype
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    n, k, h, w, r_c, r_r, r_s = sch.get_loops(block)
    ko, ki = sch.split(k, [None, ks.knobs["tile_k"]])
    wo, wi = sch.split(w, [None, ks.knobs["tile_w"]])
    sch.reorder(n, ko, h, wo, r_c, r_r, r_s, ki, wi)
    sch.reverse_compute_at(wb, wo)
    sch.parallel(sch.fuse(n, ko, h))
    sch.unroll(ki)
    sch.vectorize(wi)
    sch.decompose_reduction(block, r_c)
    _finish_writeback(sch, wb, dt)
    _schedule_copy(sch, "pad")


def _gemm_compute(ks: KernelSpec) -> list:
    spec, dt = ks.conv, ks.dtype
    cg = spec.C // spec.groups
    crs = cg * spec.R * spec.S
    rs_ = spec.R * spec.S
    p = spec.OH * spec.OW
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    weight = te.placeholder((spec.K, crs), dt.value, name="weight")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = _padded(data, spec, hp, wp)
    col = te.compute(
        (spec.groups, crs, p),
        lambda g, j, q: pad[0, g * cg + j // rs_,
                            (q // spec.OW) * spec.stride_h + (j // spec.S) % spec.R
                            * spec.dilation_h,
                            (q % spec.OW) * spec.stride_w + (j % spec.S) * spec.dilation_w],
        name="col")
    rj = te.reduce_axis((0, crs), "rj")
    kg = spec.K // spec.groups
    # Output [1, K, OH*OW]: the same memory as NCHW, the GEMM's natural shape.
    conv = te.compute(
        (1, spec.K, p),
        lambda n, k, q: te.sum(_mul(weight[k, rj], col[k // kg, rj, q], dt, acc_dtype(ks)),
                               axis=[rj]),
        name="conv")
    return [data, weight, _maybe_epilogue(conv, ks.requant_scale, dt)]


def _gemm_schedule(sch: Schedule, ks: KernelSpec) -> None:
    dt = ks.dtype
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    n, k, q, r_j = sch.get_loops(block)
    qo, qi = sch.split(q, [None, ks.knobs["tile_p"]])
    ko, ki = sch.split(k, [None, ks.knobs["tile_k"]])
    sch.reorder(n, ko, qo, r_j, ki, qi)
    sch.reverse_compute_at(wb, qo)
    sch.parallel(sch.fuse(n, ko, qo))
    sch.unroll(ki)
    sch.vectorize(qi)
    sch.decompose_reduction(block, r_j)
    _finish_writeback(sch, wb, dt)
    _schedule_copy(sch, "col")


def _spatial_pack_compute(ks: KernelSpec) -> list:
    spec, dt = ks.conv, ks.dtype
    kb, vh_, vw_ = ks.knobs["tile_k"], ks.knobs["tile_h"], ks.knobs["tile_w"]
    cg = spec.C // spec.groups
    kg = spec.K // spec.groups
    oht, owt = _ceil_div(spec.OH, vh_), _ceil_div(spec.OW, vw_)
    vh_in = (vh_ - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1
    data = te.placeholder(spec.input_shape, dt.value, name="data")
    kvec = te.placeholder((spec.K // kb, cg, spec.R, spec.S, kb), dt.value, name="weight")
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
        (spec.K // kb, oht, owt, vh_, vw_, kb),
        lambda ko, ho, wo, vh, vw, ki: te.sum(_mul(
            data_vec[ho, wo, in_c(ko), vh * spec.stride_h + rr * spec.dilation_h,
                     (rs * spec.dilation_w) % sw, vw + (rs * spec.dilation_w) // sw],
            kvec[ko, rc, rr, rs, ki], dt, acc_dtype(ks)), axis=[rc, rr, rs]),
        name="conv")
    out = te.compute(
        spec.output_shape,
        lambda n, k, h, w: _epilogue(conv[k // kb, h // vh_, w // vw_, h % vh_, w % vw_,
                                          k % kb], ks.requant_scale, dt),
        name="out")
    return [data, kvec, out]


def _spatial_pack_schedule(sch: Schedule, ks: KernelSpec) -> None:
    kb = ks.knobs["tile_k"]
    sch.compute_inline(sch.get_sblock("pad"))
    block = sch.get_sblock("conv")
    wb = sch.cache_write(block, 0, "local")
    ko, ho, wo, vh, vw, ki, r_c, r_r, r_s = sch.get_loops(block)
    if kb >= 4:  # vectorise over the output-channel block (weights packed contiguous)
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, vh, vw, ki)
        sch.unroll(vh)
        sch.unroll(vw)
        sch.vectorize(ki)
    else:        # depthwise: vectorise along the output width
        sch.reorder(ko, ho, wo, r_c, r_r, r_s, ki, vh, vw)
        sch.unroll(vh)
        sch.vectorize(vw)
    sch.reverse_compute_at(wb, wo)
    sch.parallel(sch.fuse(ko, ho))
    sch.decompose_reduction(block, r_c)
    sch.vectorize(sch.get_loops(wb)[-1])
    _schedule_copy(sch, "data_vec")
    _schedule_copy(sch, "out")


def _maybe_epilogue(conv, scale: float, dt: DType):
    if dt is DType.FLOAT32:
        return conv
    return te.compute(conv.shape, lambda *i: _epilogue(conv(*i), scale, dt), name="epilogue")


def _finish_writeback(sch: Schedule, wb, dt: DType) -> None:
    """Vectorise the accumulator write-back; fold the epilogue (cast, requantise) into it."""
    if dt is not DType.FLOAT32:
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))
    sch.vectorize(sch.get_loops(wb)[-1])


def _schedule_copy(sch: Schedule, name: str) -> None:
    """Layout/padding stages: parallel over the two outer axes."""
    loops = sch.get_loops(sch.get_sblock(name))
    sch.parallel(sch.fuse(loops[0], loops[1]) if len(loops) > 1 else loops[0])


# ------------------------------------------------------------------------------------------
# CSR-sparse kernels: TVMScript loops (a TE reduction cannot depend on data).
# ------------------------------------------------------------------------------------------
_SPARSE_HEADER = '''
# from tvm.script import tirx as T
@T.prim_func
def main(data: T.Buffer(({C_}, {C}, {H}, {W}), "{dt}"), w_data_h: T.handle,
         w_indices_h: T.handle, w_indptr: T.Buffer(({K1},), "int32"),
         out: T.Buffer((1, {K}, {OH}, {OW}), "{dt}")):
    T.func_attr({{"tirx.noalias": True}})
    nnz = T.int32()
    w_data = T.match_buffer(w_data_h, (nnz,), "{dt}")
    w_indices = T.match_buffer(w_indices_h, (nnz,), "int32")
'''


def _sparse_terms(spec: ConvSpec, dt: DType, scale: float) -> dict:
    acc = ACC_DTYPE[dt]
    if dt is DType.INT8:
        epi = ('T.Cast("int8", T.max(T.min(T.nearbyint(T.Cast("float32", {x}) * '
               f'T.float32({scale!r})), T.float32(127.0)), T.float32(-128.0)))')
        load = 'T.Cast("int32", {x})'
    elif dt is DType.FLOAT16:
        epi, load = 'T.Cast("float16", {x})', 'T.Cast("float32", {x})'
    else:
        epi, load = "{x}", "{x}"
    return {
        "C_": 1, "C": spec.C, "H": spec.H, "W": spec.W, "K": spec.K, "K1": spec.K + 1,
        "OH": spec.OH, "OW": spec.OW, "dt": dt.value, "acc": acc, "zero": f'T.{acc}(0)',
        "RS": spec.R * spec.S, "S": spec.S, "R": spec.R, "sh": spec.stride_h,
        "sw": spec.stride_w, "dh": spec.dilation_h, "dw": spec.dilation_w,
        "pt": spec.pad_t, "pl": spec.pad_l, "Cg": spec.C // spec.groups,
        "Kg": spec.K // spec.groups, "epi": epi, "load": load,
    }


def _decode(t: dict, indent: str) -> str:
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
    spec, t = ks.conv, _sparse_terms(ks.conv, ks.dtype, ks.requant_scale)
    vl = ks.knobs["tile_w"]
    owp = _ceil_div(spec.OW, vl) * vl
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = max(spec.W + spec.pad_l + spec.pad_r,
             (owp - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1)
    x = (f"pad[c, h * {t['sh']} + r * {t['dh']}, "
         f"(wc * {vl} + v) * {t['sw']} + s * {t['dw']}]")
    return _SPARSE_HEADER.format(**t) + _pad_loop(t, hp, wp) + f'''
    for kh in T.parallel({spec.K * spec.OH}):
        acc = T.alloc_buffer(({owp},), "{t["acc"]}", scope="local")
        k = kh // {spec.OH}
        h = kh % {spec.OH}
        for wc in range({owp // vl}):
            for v in T.vectorized({vl}):
                acc[wc * {vl} + v] = {t["zero"]}
        for j in range(w_indptr[k + 1] - w_indptr[k]):
{_decode(t, " " * 12)}            for wc in range({owp // vl}):
                for v in T.vectorized({vl}):
                    acc[wc * {vl} + v] = acc[wc * {vl} + v] + val * {t["load"].format(x=x)}
        for w in range({spec.OW}):
            out[0, k, h, w] = {t["epi"].format(x="acc[w]")}
'''


def _gemm_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks.conv, ks.dtype, ks.requant_scale)
    tp = ks.knobs["tile_p"]
    p = spec.OH * spec.OW
    pp = _ceil_div(p, tp) * tp
    crs = (spec.C // spec.groups) * spec.R * spec.S
    rows = spec.groups * crs
    x = f"col[(k // {t['Kg']}) * {crs} + w_indices[jj], pb * {tp} + v]"
    return _SPARSE_HEADER.format(**t) + f'''
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
                    t["epi"].format(x="acc[v]")}
'''


def _spatial_pack_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks.conv, ks.dtype, ks.requant_scale)
    vh_, vw_ = ks.knobs["tile_h"], ks.knobs["tile_w"]
    oht, owt = _ceil_div(spec.OH, vh_), _ceil_div(spec.OW, vw_)
    vh_in = (vh_ - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1
    vw_in = (vw_ - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1
    x = (f"data_vec[ho, wo, c, vh * {t['sh']} + r * {t['dh']}, "
         f"vw * {t['sw']} + s * {t['dw']}]")
    return _SPARSE_HEADER.format(**t) + f'''
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
{_decode(t, " " * 16)}                for vh in T.unroll({vh_}):
                    for vw in T.vectorized({vw_}):
                        acc[vh, vw] = acc[vh, vw] + val * {t["load"].format(x=x)}
            for vh, vw in T.grid({vh_}, {vw_}):
                if ho * {vh_} + vh < {spec.OH} and wo * {vw_} + vw < {spec.OW}:
                    out[0, k, ho * {vh_} + vh, wo * {vw_} + vw] = {
                        t["epi"].format(x="acc[vh, vw]")}
'''


#: Dense kernels: (TE compute definition, hand schedule) per algorithm.
_DENSE = {Algorithm.DIRECT: (_direct_compute, _direct_schedule),
          Algorithm.GEMM: (_gemm_compute, _gemm_schedule),
          Algorithm.SPATIAL_PACK: (_spatial_pack_compute, _spatial_pack_schedule)}
_SPARSE = {Algorithm.DIRECT: _direct_sparse, Algorithm.GEMM: _gemm_sparse,
           Algorithm.SPATIAL_PACK: _spatial_pack_sparse}


def output_shape(ks: KernelSpec) -> tuple[int, ...]:
    """Shape of the kernel's output buffer; always the same memory layout as NCHW."""
    spec = ks.conv
    if ks.algorithm is Algorithm.GEMM and not ks.sparse:
        return (1, spec.K, spec.OH * spec.OW)
    return spec.output_shape


def device_args(ks: KernelSpec, x: np.ndarray, w: np.ndarray, dev) -> list:
    """The kernel's call arguments on ``dev``: the input, the packed weights of ``w``, and a
    zeroed output buffer (last)."""
    return [tvm.runtime.tensor(a, dev) for a in [x, *pack_weights(ks, w)]] + [
        tvm.runtime.tensor(np.zeros(output_shape(ks), dtype=ks.dtype.value), dev)]


def dense_prim_func(ks: KernelSpec) -> "tvm.tirx.PrimFunc":
    """The unscheduled TensorIR function of a dense kernel: what MetaSchedule tunes.

    Only spatial pack's data layout depends on knobs (``tile_k``, ``tile_h``, ``tile_w`` shape
    the packed tensors); the loop schedule is left to the tuner.
    """
    if ks.sparse:
        raise ValueError("CSR kernels have data-dependent loops; they are not TE computes")
    compute, _ = _DENSE[ks.algorithm]
    return te.create_prim_func(compute(ks))


def kernel_module(ks: KernelSpec) -> tvm.IRModule:
    """The hand-scheduled TensorIR module of a kernel (not yet compiled)."""
    if ks.sparse:
        from tvm.script import from_source

        func = from_source(_SPARSE[ks.algorithm](ks))
        return tvm.IRModule({"main": func})
    _, schedule = _DENSE[ks.algorithm]
    sch = Schedule(dense_prim_func(ks))
    schedule(sch, ks)
    return sch.mod


def build_kernel(ks: KernelSpec, target: "tvm.target.Target"):
    """Compile a kernel for ``target``; returns the executable (call ``ex["main"](...)``)."""
    return tvm.compile(kernel_module(ks), target=target)
