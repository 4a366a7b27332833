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
    return _word_gemm_compute(ks, per_word=2, weight_dtype="int16", offset=0)


def gemm_vnni_compute(ks: KernelSpec) -> list:
    """im2col into words of four reduction elements per position, each byte the int8 input
    plus 128 (``col`` [ceil(CRS/4), positions]), then a GEMM [filters, positions] whose
    every lane (a position) sums the unsigned bytes times a filter's int8 weights (packed
    [filter blocks, ceil(CRS/4), tile_k, 4]), and an output stage that subtracts 128 times
    each filter's weight sum (a third weight argument, packed offline) before the epilogue.
    Positions are padded to whole vectors of ``tile_p`` lanes and filters to whole blocks of
    ``tile_k`` (zero weights), both cropped."""
    return _word_gemm_compute(ks, per_word=4, weight_dtype="int8", offset=128)


def _word_gemm_compute(ks: KernelSpec, per_word: int, weight_dtype: str,
                       offset: int) -> list:
    """The GEMM of both dot-product kernels: ``per_word`` reduction elements of a position
    packed into one int32 word (each ``32 / per_word`` bits: the int8 input plus
    ``offset``, unsigned, where ``offset``; else signed, the lower ones masked), the words
    of ``tile_p`` positions a vector, the GEMM summing each word's elements times a
    filter's weights of ``weight_dtype``, and the output stage (less ``offset`` times each
    filter's weight sum, a weight argument, where ``offset``). Padded reduction elements
    and positions hold ``offset`` (a zero)."""
    spec = ks.conv
    kb, lanes = ks.knobs["tile_k"], ks.knobs["tile_p"]
    bits = 32 // per_word
    crs = spec.C * spec.R * spec.S
    red, kt = ceil_div(crs, per_word), ceil_div(spec.K, kb)
    p = spec.OH * spec.OW
    pp = padded_extent(p, lanes)
    data = te.placeholder(spec.input_shape, "int8", name="data")
    weight = te.placeholder((kt, red, kb, per_word), weight_dtype, name="weight")
    wsum = te.placeholder((kt * kb,), "int32", name="weight_sum") if offset else None
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = spec.W + spec.pad_l + spec.pad_r
    pad = padded_input(data, spec, hp, wp)
    rs_ = spec.R * spec.S
    i32 = "int32"

    def element(j, q):  # reduction element j at position q plus the offset; past the
        # extents, the offset alone (a zero)
        jc, qc = tvm.tirx.min(j, crs - 1), tvm.tirx.min(q, p - 1)
        v = im2col_element(pad, spec, jc // rs_, jc, qc).astype(i32)
        if offset:
            v = v + tvm.tirx.const(offset, i32)
        if crs % per_word == 0 and pp == p:
            return v
        return tvm.tirx.if_then_else(tvm.tirx.all(j < crs, q < p), v,
                                     tvm.tirx.const(offset, i32))

    def word(j, q):
        w = None
        for i in range(per_word):
            e = element(j * per_word + i, q)
            if not offset and i < per_word - 1:  # a signed element's sign bits cleared
                e = tvm.tirx.bitwise_and(e, (1 << bits) - 1)
            w = e if i == 0 else w | (e << tvm.tirx.const(bits * i, i32))
        return w

    def unpack(w, ri):  # element ``ri`` of word ``w``, unsigned (offset) or sign-extended
        if offset:
            return tvm.tirx.bitwise_and(tvm.tirx.shift_right(w, ri * bits), (1 << bits) - 1)
        return tvm.tirx.shift_right(tvm.tirx.shift_left(w, 32 - bits - ri * bits), 32 - bits)

    # [vectors of positions, words, lanes]: a register tile reads its words contiguously
    col = te.compute((pp // lanes, red, lanes),
                     lambda qo, j, qi: word(j, qo * lanes + qi), name="col")
    rj, ri = te.reduce_axis((0, red), "rj"), te.reduce_axis((0, per_word), "ri")
    conv = te.compute(
        (kt * kb, pp),
        lambda k, q: te.sum(unpack(col[q // lanes, rj, q % lanes], ri)
                            * weight[k // kb, rj, k % kb, ri].astype(i32), axis=[rj, ri]),
        name="conv")
    extras = epilogue_inputs(ks)
    ow = spec.OW
    # [1, K, OH*OW]: the schedule writes each register tile's block of it, then (with an
    # epilogue) declares it NCHW, the same memory
    def finish(n, k, q):
        acc = conv(k, q) - wsum(k) if offset else conv(k, q)
        if not ks.epilogue:  # requantised, rounding in vectors
            return epilogue(acc, ks.requant_scale, ks.dtype, vector_round=True)
        return finish_output(acc, ks, extras, k, (n, k, q // ow, q % ow))

    out = te.compute((1, spec.K, p), finish, name="out")
    return [data, weight, *([wsum] if offset else []), *extras.values(), out]


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
