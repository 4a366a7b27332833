"""The int8 GEMMs on dot-product instructions, tensorized into the GEMM kernel's inner loop:
AVX-512 VNNI's ``vpdpbusd`` sums four int8 products per int32 lane (the ``vnni`` knob), and
AVX2's ``vpmaddwd`` two int16 products (the ``pmaddwd`` knob: int8 values widened to int16,
exact, on any CPU with AVX2)."""

from __future__ import annotations

import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.measure.kernels.knobs import VNNI_LANES
from dlas_predict.measure.kernels.spec import KernelSpec, ceil_div
from dlas_predict.measure.kernels.cpu import (epilogue, epilogue_inputs, im2col_element,
                                              finish_output, padded_extent, padded_input, vectorize)


def vnni_intrin(lanes: int) -> str:
    """The name of the tensor intrinsic (registered on first use) that adds to ``lanes``
    int32 accumulators (one per output position) the four products of each position's word
    of four unsigned bytes by one filter's four int8 weights, broadcast: ``vpdpbusd`` on 8
    or 16 lanes, its weights a broadcast memory operand.

    The unsigned bytes are a position's four reduction elements, each its int8 value plus
    128 (:func:`gemm_vnni_compute` subtracts 128 times the filter's weight sum). TVM's own
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


def pmaddwd_intrin() -> str:
    """The name of the tensor intrinsic (registered on first use) that adds to 8 int32
    accumulators (one per output position) the two products of each position's word of two
    int16 reduction elements by one filter's two int16 weights, broadcast: ``vpmaddwd``,
    then an add (it does not accumulate)."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    name = "dlas_pmaddwd_s16s16i32_8x2"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((8,), "int32", offset_factor=1),
             b: T.Buffer((2,), "int16", offset_factor=1),
             c: T.Buffer((8,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:8], a[0:8], b[0:2])
            T.writes(c[0:8])
            for i, k in T.grid(8, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    c[vi] = c[vi] + T.shift_right(T.shift_left(a[vi], 16 - vk * 16), 16) \
                        * T.Cast("int32", b[vk])

    @T.prim_func(s_tir=True)
    def impl(a: T.Buffer((8,), "int32", offset_factor=1),
             b: T.Buffer((2,), "int16", offset_factor=1),
             c: T.Buffer((8,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:8], a[0:8], b[0:2])
            T.writes(c[0:8])
            c[T.ramp(T.int32(0), 1, 8)] = c.vload([0], dtype="int32x8") + \
                T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                    T.reinterpret(a.vload([0], dtype="int32x8"), dtype="int16x16"),
                    T.reinterpret(T.broadcast(T.reinterpret(b.vload([0], dtype="int16x2"),
                                                            dtype="int32"), 8),
                                  dtype="int16x16"), dtype="int32x8")

    TensorIntrin.register(name, desc, impl)
    return name


def gemm_pmaddwd_compute(ks: KernelSpec) -> list:
    """im2col into words of two int16 reduction elements per position (``col`` [vectors of
    positions, ceil(CRS/2), 8], the low half the even element), then a GEMM [filters,
    positions] whose every lane sums a word's two elements times a filter's int16 weights
    (packed [filter blocks, ceil(CRS/2), tile_k, 2]), and the output stage. Signed times
    signed, so no offset; padded positions and filters are zeros, cropped."""
    spec = ks.conv
    kb, lanes = ks.knobs["tile_k"], ks.knobs["tile_p"]
    crs = spec.C * spec.R * spec.S
    red, kt = ceil_div(crs, 2), ceil_div(spec.K, kb)
    p = spec.OH * spec.OW
    pp = padded_extent(p, lanes)
    data = te.placeholder(spec.input_shape, "int8", name="data")
    weight = te.placeholder((kt, red, kb, 2), "int16", name="weight")
    pad = padded_input(data, spec, spec.H + spec.pad_t + spec.pad_b,
                       spec.W + spec.pad_l + spec.pad_r)
    rs_ = spec.R * spec.S
    i32 = "int32"

    def element(j, q):  # reduction element j at position q (0 past the extents)
        jc, qc = tvm.tirx.min(j, crs - 1), tvm.tirx.min(q, p - 1)
        v = im2col_element(pad, spec, jc // rs_, jc, qc).astype(i32)
        if crs % 2 == 0 and pp == p:
            return v
        return tvm.tirx.if_then_else(tvm.tirx.all(j < crs, q < p), v, tvm.tirx.const(0, i32))

    col = te.compute((pp // lanes, red, lanes), lambda qo, j, qi: tvm.tirx.bitwise_and(
        element(j * 2, qo * lanes + qi), 0xFFFF) | (element(j * 2 + 1, qo * lanes + qi) << 16),
        name="col")
    rj, ri = te.reduce_axis((0, red), "rj"), te.reduce_axis((0, 2), "ri")
    conv = te.compute(
        (kt * kb, pp),
        lambda k, q: te.sum(
            tvm.tirx.shift_right(tvm.tirx.shift_left(col[q // lanes, rj, q % lanes],
                                                     16 - ri * 16), 16)
            * weight[k // kb, rj, k % kb, ri].astype(i32), axis=[rj, ri]),
        name="conv")
    extras = epilogue_inputs(ks)
    ow = spec.OW

    def finish(n, k, q):
        if not ks.epilogue:
            return epilogue(conv(k, q), ks.requant_scale, ks.dtype, vector_round=True)
        return finish_output(conv(k, q), ks, extras, k, (n, k, q // ow, q % ow))

    out = te.compute((1, spec.K, p), finish, name="out")
    return [data, weight, *extras.values(), out]


def gemm_vnni_compute(ks: KernelSpec) -> list:
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
    red, kt = ceil_div(crs, 4), ceil_div(spec.K, kb)
    p = spec.OH * spec.OW
    pp = padded_extent(p, lanes)
    data = te.placeholder(spec.input_shape, "int8", name="data")
    weight = te.placeholder((kt, red, kb, 4), "int8", name="weight")
    wsum = te.placeholder((kt * kb,), "int32", name="weight_sum")
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = padded_input(data, spec, hp, wp)
    rs_ = spec.R * spec.S
    i32 = "int32"

    def byte(j, q):  # reduction element j at position q, plus 128 (128: zero, or padding)
        jc, qc = tvm.tirx.min(j, crs - 1), tvm.tirx.min(q, p - 1)
        v = im2col_element(pad, spec, jc // rs_, jc, qc).astype(i32) + tvm.tirx.const(128, i32)
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
    extras = epilogue_inputs(ks)
    ow = spec.OW
    # [1, K, OH*OW]: the schedule writes each register tile's block of it, then (with an
    # epilogue) declares it NCHW, the same memory
    def finish(n, k, q):
        acc = conv(k, q) - wsum(k)
        if not ks.epilogue:  # requantised, rounding in vectors
            return epilogue(acc, ks.requant_scale, ks.dtype, vector_round=True)
        return finish_output(acc, ks, extras, k, (n, k, q // ow, q % ow))

    out = te.compute((1, spec.K, p), finish, name="out")
    return [data, weight, wsum, *extras.values(), out]


def gemm_vnni_schedule(sch: Schedule, ks: KernelSpec) -> None:
    """The words of ``col`` parallel over vectors of positions; the GEMM parallel over
    vectors of ``tile_p`` positions by blocks of ``tile_k`` filters (in that order, so each
    core reads the words it wrote), a register tile of one accumulator vector per filter
    updated by :func:`vnni_intrin` (or, with the ``pmaddwd`` knob, :func:`pmaddwd_intrin`)
    per word, then written through the epilogue while in cache."""
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
        vectorize(sch, sch.get_loops(out)[-1])
    else:
        sch.reverse_compute_inline(out)
    init = sch.decompose_reduction(block, rj)
    sch.tensorize(qi, pmaddwd_intrin() if ks.knobs.get("pmaddwd") else vnni_intrin(lanes))
    sch.unroll(ki)
    vectorize(sch, sch.get_loops(init)[-1])
    vectorize(sch, sch.get_loops(wb)[-1])
    qo, _j, qi = sch.get_loops(sch.get_sblock("col"))
    sch.parallel(qo)
    vectorize(sch, qi)
    if ks.epilogue:  # the kernel's output is NCHW (written by the write-back if inlined)
        ow = spec.OW
        sch.transform_layout(out if cropped else wb, ("write", 0),
                             lambda n, k, q: (n, k, q // ow, q % ow))
