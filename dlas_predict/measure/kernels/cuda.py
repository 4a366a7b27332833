"""The study's convolution kernels for NVIDIA GPUs (CUDA), beside the CPU ones.

Dense kernels reuse the CPU kernels' TE compute definitions
(:mod:`dlas_predict.measure.kernels.cpu`) with hand-written GPU schedules: a thread block computes a
tile of output channels × output pixels, each thread a register tile of it; the inputs of
``tile_rc`` reduction channels are staged in shared memory, fetched cooperatively by the block's
threads. Layout stages (im2col's column buffer, spatial pack's tiled input and its unpacking) are
elementwise kernels, one thread an element. CSR kernels are TensorIR loops, row-parallel: a thread
block per output row of one output channel (one CSR row), a thread per output pixel, each thread
walking the row's nonzeros.

float16 kernels accumulate in float32 by default and in float16 with the knob
``acc_bits=16``; int8 kernels accumulate in int32 and requantise, as on the CPU. The module a
build returns carries CUDA C, compiled by the driver's NVRTC when it is loaded on the GPU.
"""

from __future__ import annotations

import re
from typing import Any

import tvm
from tvm.s_tir import Schedule

from dlas_predict.space.config import Algorithm, ConvSpec, DType
from dlas_predict.errors import ConfigError
from dlas_predict.measure.kernels.cpu import DENSE_KERNELS, direct_nchw_compute, acc_dtype
from dlas_predict.measure.kernels.csr import SPARSE_HEADER, csr_decode
from dlas_predict.measure.kernels.spec import KernelSpec

#: The lowest compute capability the kernels are built for (float16 arithmetic, dp4a).
MIN_ARCH = 61
#: Threads of the elementwise (layout) kernels' blocks.
ELEMENTWISE_THREADS = 256
#: Static shared memory a thread block may declare: 48 KiB on every NVIDIA GPU (more needs a
#: dynamic allocation and an opt-in, which the kernels do not make).
MAX_STATIC_SHARED = 48 * 1024
_CTYPE_BYTES = {"float": 4, "half": 2, "signed char": 1, "unsigned char": 1, "char": 1,
                "int8_t": 1, "uint8_t": 1, "int": 4, "int32_t": 4, "short": 2,
                "double": 8, "int64_t": 8, "__nv_bfloat16": 2}
_GLOBAL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(')
_SHARED = re.compile(r"__shared__ (?:alignas\(\d+\) |__align__\(\d+\) )?([\w ]+?) \w+\[(\d+)\]")


def cuda_target(arch: str = "sm_90", host: dict[str, Any] | None = None) -> tvm.target.Target:
    """A CUDA target for compute capability ``arch`` (``sm_XY``); rejects what the kernels
    cannot run on."""
    check_arch(arch)
    return tvm.target.Target({"kind": "cuda", "arch": arch,
                              "host": host or {"kind": "llvm"}})


def check_arch(arch: str) -> int:
    """``sm_XY`` -> XY; a clear error for a malformed or unsupported compute capability."""
    text = str(arch).strip().lower()
    if not text.startswith("sm_") or not text[3:].rstrip("a").isdigit():
        raise ConfigError(f"CUDA arch must look like sm_90, got {arch!r}")
    cc = int(text[3:].rstrip("a"))
    if cc < MIN_ARCH:
        raise ConfigError(f"compute capability {cc // 10}.{cc % 10} ({arch}) is not "
                          f"supported: the CUDA kernels need sm_{MIN_ARCH} or newer "
                          "(float16 arithmetic and dp4a)")
    return cc


# ------------------------------------------------------------------------------------------
# Schedule helpers
# ------------------------------------------------------------------------------------------
def _elementwise(sch: Schedule, name: str, threads: int = ELEMENTWISE_THREADS) -> None:
    """One thread an element: fuse every loop of block ``name``, split by ``threads``."""
    block = sch.get_sblock(name)
    fused = sch.fuse(*sch.get_loops(block))
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _read_index(sch: Schedule, block, buffer_name: str) -> int:
    for i, region in enumerate(sch.get(block).reads):
        if region.source.name == buffer_name:
            return i
    raise ValueError(f"block reads no buffer {buffer_name!r}")


def _cooperative_fetch(sch: Schedule, block, threads: int, at) -> None:
    """Spread the shared-memory copy ``block`` (computed at loop ``at``) over the thread
    block's ``threads`` threads: its own loops, below ``at``, fused and split."""
    loops = sch.get_loops(block)
    pos = [sch.get(lp) for lp in loops].index(sch.get(at))
    own = loops[pos + 1:]
    if not own:
        return
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def _finish(sch: Schedule, block, thread_loop, dt: DType) -> None:
    """Accumulators in registers, written back by each thread; the epilogue (float16
    rounding, int8 requantisation) folded into the write-back."""
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, thread_loop)
    if dt is not DType.FLOAT32:
        sch.reverse_compute_inline(sch.get_sblock("epilogue"))


# ------------------------------------------------------------------------------------------
# Dense kernels
# ------------------------------------------------------------------------------------------
def _direct_gpu(sch: Schedule, ks: KernelSpec) -> None:
    kn = ks.knobs
    block = sch.get_sblock("conv")
    n, k, h, w, rc, rr, rs = sch.get_loops(block)
    kb, kt, kr = sch.split(k, [None, kn["thr_k"], kn["reg_k"]])
    wb, wt, wr = sch.split(w, [None, kn["thr_w"], kn["reg_w"]])
    rco, rci = sch.split(rc, [None, kn["tile_rc"]])
    sch.reorder(n, kb, h, wb, kt, wt, rco, rci, rr, rs, kr, wr)
    sch.bind(sch.fuse(n, kb, h, wb), "blockIdx.x")
    tx = sch.fuse(kt, wt)
    sch.bind(tx, "threadIdx.x")
    threads = kn["thr_k"] * kn["thr_w"]
    w_shared = sch.cache_read(block, _read_index(sch, block, "weight"), "shared")
    sch.compute_at(w_shared, rco)
    _cooperative_fetch(sch, w_shared, threads, rco)
    pad = sch.get_sblock("pad")
    sch.set_scope(pad, 0, "shared")  # before compute_at: shared regions span the block
    sch.compute_at(pad, rco)
    _cooperative_fetch(sch, pad, threads, rco)
    _finish(sch, block, tx, ks.dtype)
    sch.decompose_reduction(block, rco)


def _gemm_gpu(sch: Schedule, ks: KernelSpec) -> None:
    kn = ks.knobs
    sch.compute_inline(sch.get_sblock("pad"))
    _elementwise(sch, "col")
    block = sch.get_sblock("conv")
    n, k, q, rj = sch.get_loops(block)
    kb, kt, kr = sch.split(k, [None, kn["thr_k"], kn["reg_k"]])
    qb, qt, qr = sch.split(q, [None, kn["thr_p"], kn["reg_p"]])
    rjo, rji = sch.split(rj, [None, kn["tile_rc"]])
    sch.reorder(n, kb, qb, kt, qt, rjo, rji, kr, qr)
    sch.bind(sch.fuse(n, kb, qb), "blockIdx.x")
    tx = sch.fuse(kt, qt)
    sch.bind(tx, "threadIdx.x")
    threads = kn["thr_k"] * kn["thr_p"]
    for name in ("weight", "col"):
        shared = sch.cache_read(block, _read_index(sch, block, name), "shared")
        sch.compute_at(shared, rjo)
        _cooperative_fetch(sch, shared, threads, rjo)
    _finish(sch, block, tx, ks.dtype)
    sch.decompose_reduction(block, rjo)


def _spatial_pack_gpu(sch: Schedule, ks: KernelSpec) -> None:
    kn = ks.knobs
    sch.compute_inline(sch.get_sblock("pad"))
    _elementwise(sch, "data_vec")
    block = sch.get_sblock("conv")
    ko, ho, wo, vh, vw, ki, rc, rr, rs = sch.get_loops(block)
    rco, rci = sch.split(rc, [None, kn["tile_rc"]])
    sch.reorder(ko, ho, wo, vh, vw, ki, rco, rci, rr, rs)
    sch.bind(sch.fuse(ko, ho, wo), "blockIdx.x")
    tx = sch.fuse(vh, vw, ki)
    sch.bind(tx, "threadIdx.x")
    threads = kn["tile_h"] * kn["tile_w"] * kn["tile_k"]
    for name in ("weight", "data_vec"):
        shared = sch.cache_read(block, _read_index(sch, block, name), "shared")
        sch.compute_at(shared, rco)
        _cooperative_fetch(sch, shared, threads, rco)
    wb = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(wb, tx)
    sch.decompose_reduction(block, rco)
    _elementwise(sch, "out")


_DENSE_GPU = {Algorithm.DIRECT: _direct_gpu, Algorithm.GEMM: _gemm_gpu,
              Algorithm.SPATIAL_PACK: _spatial_pack_gpu}


# ------------------------------------------------------------------------------------------
# CSR kernels (TVMScript; a TE reduction cannot depend on data), with the CPU kernels' header
# ------------------------------------------------------------------------------------------
def _terms(ks: KernelSpec) -> dict[str, Any]:
    spec, dt = ks.conv, ks.dtype
    acc = acc_dtype(ks)
    if dt is DType.INT8:
        epi = ('T.Cast("int8", T.max(T.min(T.nearbyint(T.Cast("float32", {x}) * '
               f'T.float32({ks.requant_scale!r})), T.float32(127.0)), T.float32(-128.0)))')
    elif acc != dt.value:
        epi = f'T.Cast("{dt.value}", {{x}})'
    else:
        epi = "{x}"
    load = "{x}" if acc == dt.value else f'T.Cast("{acc}", {{x}})'
    return {"C_": 1, "C": spec.C, "H": spec.H, "W": spec.W, "K": spec.K, "K1": spec.K + 1,
            "OH": spec.OH, "OW": spec.OW, "dt": dt.value, "acc": acc,
            "zero": f"T.{acc}(0)", "RS": spec.R * spec.S, "S": spec.S,
            "Cg": spec.C // spec.groups, "Kg": spec.K // spec.groups, "epi": epi,
            "load": load, "odt": dt.value, "extra": ""}


def _pixel(spec: ConvSpec, t: dict, h: str, w: str) -> str:
    """The input element read for output pixel (h, w) by nonzero (c, r, s); zero outside."""
    hh = f"({h}) * {spec.stride_h} + r * {spec.dilation_h} - {spec.pad_t}"
    ww = f"({w}) * {spec.stride_w} + s * {spec.dilation_w} - {spec.pad_l}"
    inside = f"0 <= {hh} and {hh} < {spec.H} and 0 <= {ww} and {ww} < {spec.W}"
    clamp = (f"data[0, c, T.max(T.min({hh}, {spec.H - 1}), 0), "
             f"T.max(T.min({ww}, {spec.W - 1}), 0)]")
    return f"T.if_then_else({inside}, {t['load'].format(x=clamp)}, {t['zero']})"


def _direct_csr(ks: KernelSpec) -> str:
    spec, t = ks.conv, _terms(ks)
    tw = ks.knobs["thr_w"]
    nw = -(-spec.OW // tw)
    return SPARSE_HEADER.format(**t) + f'''
    for kh in T.thread_binding({spec.K * spec.OH}, thread="blockIdx.x"):
        for tx in T.thread_binding({tw}, thread="threadIdx.x"):
            acc = T.alloc_buffer(({nw},), "{t["acc"]}", scope="local")
            k = kh // {spec.OH}
            h = kh % {spec.OH}
            for i in range({nw}):
                acc[i] = {t["zero"]}
            for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 16)}                for i in range({nw}):
                    acc[i] = acc[i] + val * {_pixel(spec, t, "h", f"i * {tw} + tx")}
            for i in range({nw}):
                if i * {tw} + tx < {spec.OW}:
                    out[0, k, h, i * {tw} + tx] = {t["epi"].format(x="acc[i]")}
'''


def _gemm_csr(ks: KernelSpec) -> str:
    spec, t = ks.conv, _terms(ks)
    tp = ks.knobs["tile_p"]
    p = spec.OH * spec.OW
    nb = -(-p // tp)
    crs = t["Cg"] * spec.R * spec.S
    rows = spec.groups * crs
    col_fill = ELEMENTWISE_THREADS
    n_col = rows * p
    return SPARSE_HEADER.format(**t) + f'''
    colbuf = T.alloc_buffer(({rows}, {p}), "{t["dt"]}")
    for bx in T.thread_binding({-(-n_col // col_fill)}, thread="blockIdx.x"):
        for tx in T.thread_binding({col_fill}, thread="threadIdx.x"):
            if bx * {col_fill} + tx < {n_col}:
                gj = (bx * {col_fill} + tx) // {p}
                q = (bx * {col_fill} + tx) % {p}
                jcol = gj % {crs}
                c = gj // {crs} * {t["Cg"]} + jcol // {t["RS"]}
                r = jcol % {t["RS"]} // {t["S"]}
                s = jcol % {t["S"]}
                colbuf[gj, q] = T.if_then_else(
                    0 <= q // {spec.OW} * {spec.stride_h} + r * {spec.dilation_h} - {spec.pad_t}
                    and q // {spec.OW} * {spec.stride_h} + r * {spec.dilation_h} - {spec.pad_t}
                    < {spec.H}
                    and 0 <= q % {spec.OW} * {spec.stride_w} + s * {spec.dilation_w} - {spec.pad_l}
                    and q % {spec.OW} * {spec.stride_w} + s * {spec.dilation_w} - {spec.pad_l}
                    < {spec.W},
                    data[0, c, T.max(T.min(q // {spec.OW} * {spec.stride_h} + r *
                                           {spec.dilation_h} - {spec.pad_t}, {spec.H - 1}), 0),
                         T.max(T.min(q % {spec.OW} * {spec.stride_w} + s * {spec.dilation_w}
                                     - {spec.pad_l}, {spec.W - 1}), 0)],
                    T.{t["dt"]}(0))
    for kb in T.thread_binding({spec.K * nb}, thread="blockIdx.x"):
        for tx in T.thread_binding({tp}, thread="threadIdx.x"):
            acc = T.alloc_buffer((1,), "{t["acc"]}", scope="local")
            k = kb // {nb}
            q = kb % {nb} * {tp} + tx
            acc[0] = {t["zero"]}
            if q < {p}:
                for j in range(w_indptr[k + 1] - w_indptr[k]):
                    jj = w_indptr[k] + j
                    acc[0] = acc[0] + {t["load"].format(x="w_data[jj]")} * {
                        t["load"].format(x=f"colbuf[(k // {t['Kg']}) * {crs} + w_indices[jj], q]")}
                out[0, k, q // {spec.OW}, q % {spec.OW}] = {t["epi"].format(x="acc[0]")}
'''


def _spatial_pack_csr(ks: KernelSpec) -> str:
    spec, t = ks.conv, _terms(ks)
    vh_, vw_ = ks.knobs["tile_h"], ks.knobs["tile_w"]
    oht, owt = -(-spec.OH // vh_), -(-spec.OW // vw_)
    return SPARSE_HEADER.format(**t) + f'''
    for kt in T.thread_binding({spec.K * oht * owt}, thread="blockIdx.x"):
        for tx in T.thread_binding({vh_ * vw_}, thread="threadIdx.x"):
            acc = T.alloc_buffer((1,), "{t["acc"]}", scope="local")
            k = kt // {oht * owt}
            h = kt % {oht * owt} // {owt} * {vh_} + tx // {vw_}
            w = kt % {owt} * {vw_} + tx % {vw_}
            acc[0] = {t["zero"]}
            if h < {spec.OH} and w < {spec.OW}:
                for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 20)}                    acc[0] = acc[0] + val * {_pixel(spec, t, "h", "w")}
                out[0, k, h, w] = {t["epi"].format(x="acc[0]")}
'''


_CSR_GPU = {Algorithm.DIRECT: _direct_csr, Algorithm.GEMM: _gemm_csr,
            Algorithm.SPATIAL_PACK: _spatial_pack_csr}


# ------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------
def csr_source(ks: KernelSpec) -> str:
    """The TVMScript of a CSR kernel's CUDA version."""
    return _CSR_GPU[ks.algorithm](ks)


def unscheduled(ks: KernelSpec) -> "tvm.tirx.PrimFunc":
    """A dense kernel's unscheduled TensorIR for the GPU: what its hand schedule and
    MetaSchedule's candidates start from (the same arguments)."""
    from tvm import te

    compute = (direct_nchw_compute if ks.algorithm is Algorithm.DIRECT
               else DENSE_KERNELS[ks.algorithm][0])
    return te.create_prim_func(compute(ks))


def gpu_prim_func(ks: KernelSpec) -> "tvm.tirx.PrimFunc":
    """The hand-scheduled CUDA TensorIR function of a kernel (not yet compiled)."""
    if ks.sparse:
        from tvm.script import from_source

        return from_source(csr_source(ks))
    sch = Schedule(unscheduled(ks))
    _DENSE_GPU[ks.algorithm](sch, ks)
    return sch.mod["main"]


def kernels_module(kernels: dict[str, "KernelSpec | tvm.tirx.PrimFunc"]) -> tvm.IRModule:
    """One module holding each kernel under its own name (one CUDA source, one load): a
    kernel spec gets its hand schedule; a scheduled function (a MetaSchedule candidate) is
    taken as it is."""
    funcs = {}
    for name, ks in kernels.items():
        func = gpu_prim_func(ks) if isinstance(ks, KernelSpec) else ks
        funcs[name] = func.with_attr("global_symbol", name)
    return tvm.IRModule(funcs)


def verify(mod: tvm.IRModule, max_threads: int = 1024,
           max_shared_bytes: int = 48 * 1024) -> list[str]:
    """Problems the GPU would reject: loops not bound to threads, more threads or shared
    memory a block than ``max_threads`` / ``max_shared_bytes``. Empty: none."""
    problems = []
    for gv, func in mod.functions.items():
        ok = tvm.s_tir.analysis.verify_gpu_code(func, {
            "max_threads_per_block": max_threads, "max_shared_memory_per_block":
            max_shared_bytes, "max_local_memory_per_block": 2 ** 31 - 1,
            "max_thread_x": max_threads, "max_thread_y": max_threads, "max_thread_z": 64})
        if not ok:
            problems.append(f"{gv.name_hint}: over the GPU's per-block limits")
    return problems


def shared_bytes(source: str) -> dict[str, int]:
    """Static shared memory (bytes) each kernel function of CUDA C ``source`` declares."""
    out: dict[str, int] = {}
    name = None
    for line in source.splitlines():
        head = _GLOBAL.match(line)
        if head:
            name = head.group(1) if line.rstrip().endswith("{") else None
            if name:
                out[name] = 0
            continue
        shared = _SHARED.search(line) if name else None
        if shared:
            ctype = shared.group(1).strip()
            out[name] += _CTYPE_BYTES.get(ctype, 8) * int(shared.group(2))
    return out


def cuda_source(built) -> str:
    """The CUDA C of what :func:`build` or ``tvm.compile`` returned (a kernel module, or a
    Relax executable whose host module imports the CUDA one)."""
    todo = [built.mod if isinstance(built, tvm.runtime.Executable) else built]
    out = []
    while todo:
        m = todo.pop()
        if m.kind == "cuda":
            out.append(m.inspect_source())
        todo.extend(m.imports)
    return "".join(out)


def over_shared(source: str, names: list[str]) -> dict[str, str]:
    """Of the kernels ``names`` (each lowered to ``NAME_kernel``, ``NAME_kernel_1``, ...),
    those whose GPU functions declare more static shared memory than a block may have, with
    the reason; NVRTC would refuse the whole module they are in."""
    used = shared_bytes(source)
    bad: dict[str, str] = {}
    for name in names:
        for fn, n in used.items():
            if (fn == f"{name}_kernel" or fn.startswith(f"{name}_kernel_")) \
                    and n > MAX_STATIC_SHARED:
                bad[name] = (f"build: {n} bytes of static shared memory in a thread block, "
                             f"over the GPU's {MAX_STATIC_SHARED}")
    return bad


def build(kernels: dict[str, "KernelSpec | tvm.tirx.PrimFunc"], target: "tvm.target.Target"):
    """Compile the kernels into one module for ``target`` (CUDA C inside, compiled by the
    driver when the module is loaded)."""
    return tvm.compile(kernels_module(kernels), target=target)
