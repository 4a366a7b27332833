"""A GPU's roofs, measured: an FMA-bound kernel per dtype and a streaming kernel.

Built here (:func:`build_peaks`), timed on the GPU by ``dlas_predict.measure.gpu.run --peaks``.
None of the kernels uses tensor cores: they are the roofs of the CUDA cores, where the study's
kernels run. float32: chains of scalar FMAs; float16: ``half2`` FMAs (two a lane); int8: ``dp4a``
(four multiply-adds an instruction). Each thread keeps 8 independent chains in registers;
``BLOCKS_PER_SM`` blocks of 256 threads an SM fill the GPU. The stream kernel reads and
writes ``STREAM_MIB`` MiB each, 16 bytes a thread an access.
"""

from __future__ import annotations

from typing import Any

CHAINS = 8
ITERS = 2048
THREADS = 256
BLOCKS_PER_SM = 8
STREAM_MIB = 1024

#: Operations one chain step counts: an FMA is 2; half2 is two FMAs; dp4a is 4 MACs.
OPS_PER_STEP = {"float32": 2, "float16": 4, "int8": 8}


def _fma_source(dtype: str, blocks: int) -> str:
    n = blocks * THREADS
    if dtype == "float32":
        decl, init = "float32", "T.Cast(\"float32\", a[i_thr]) + T.float32(j)"
        step = "acc[j] = acc[j] * T.float32(0.9999) + T.float32(0.0001)"
        fold = "T.Cast(\"float32\", acc[j])"
        buf = f'acc = T.alloc_buffer(({CHAINS},), "float32", scope="local")'
    elif dtype == "float16":
        decl, init = "float16x2", "T.Broadcast(T.Cast(\"float16\", a[i_thr]), 2)"
        step = ("acc[j] = acc[j] * T.Broadcast(T.float16(0.999), 2) + "
                "T.Broadcast(T.float16(0.001), 2)")
        fold = "T.Cast(\"float32\", T.Shuffle([acc[j]], [0]))"
        buf = f'acc = T.alloc_buffer(({CHAINS},), "float16x2", scope="local")'
    else:
        decl, init = "int32", "T.Cast(\"int32\", a[i_thr]) + j"
        step = 'acc[j] = T.call_pure_extern("int32", "__dp4a", acc[j], T.int32(16843009), acc[j])'
        fold = "T.Cast(\"float32\", acc[j])"
        buf = f'acc = T.alloc_buffer(({CHAINS},), "int32", scope="local")'
    del decl
    return f'''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({n},), "float32"), out: T.Buffer(({n},), "float32")):
    T.func_attr({{"tirx.noalias": True}})
    for bx in T.thread_binding({blocks}, thread="blockIdx.x"):
        for tx in T.thread_binding({THREADS}, thread="threadIdx.x"):
            {buf}
            i_thr = bx * {THREADS} + tx
            for j in T.unroll({CHAINS}):
                acc[j] = {init}
            for it in range({ITERS}):
                for j in T.unroll({CHAINS}):
                    {step}
            out[i_thr] = T.float32(0)
            for j in T.unroll({CHAINS}):
                out[i_thr] = out[i_thr] + {fold}
'''


def _stream_source() -> str:
    n = STREAM_MIB * 2 ** 20 // 4
    vec = 4
    blocks = n // vec // THREADS
    return f'''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({n},), "float32"), b: T.Buffer(({n},), "float32")):
    T.func_attr({{"tirx.noalias": True}})
    for bx in T.thread_binding({blocks}, thread="blockIdx.x"):
        for tx in T.thread_binding({THREADS}, thread="threadIdx.x"):
            for v in T.vectorized({vec}):
                b[(bx * {THREADS} + tx) * {vec} + v] = a[(bx * {THREADS} + tx) * {vec} + v] \\
                    * T.float32(2)
'''


def peak_specs(sm_count: int) -> dict[str, dict[str, Any]]:
    """What each roof kernel does: elements, and operations or bytes a call."""
    blocks = sm_count * BLOCKS_PER_SM
    out: dict[str, dict[str, Any]] = {}
    for dt in ("float32", "float16", "int8"):
        out[f"fma_{dt}"] = {"n": blocks * THREADS, "blocks": blocks,
                            "ops": blocks * THREADS * CHAINS * ITERS * OPS_PER_STEP[dt]}
    n = STREAM_MIB * 2 ** 20 // 4
    out["stream"] = {"n": n, "bytes": 2 * n * 4}
    return out


def build_peaks(sm_count: int, arch: str, path: str) -> dict[str, dict[str, Any]]:
    """Build the roof kernels for a GPU of ``sm_count`` SMs into the library ``path``."""
    import tvm
    from tvm.script import from_source

    from dlas_predict.measure.kernels.cuda import cuda_target

    specs = peak_specs(sm_count)
    funcs = {}
    for name, spec in specs.items():
        src = _stream_source() if name == "stream" else \
            _fma_source(name.removeprefix("fma_"), spec["blocks"])
        funcs[name] = from_source(src).with_attr("global_symbol", name)
    tvm.compile(tvm.IRModule(funcs), target=cuda_target(arch)).export_library(path)
    return specs


def time_peaks(path: str, specs: dict[str, dict[str, Any]], repeats: int = 15) -> dict:
    """Time the roof kernels (best of ``repeats``) on GPU 0; GFLOP/s (GOP/s for int8) and
    GB/s (bytes read + written)."""
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    mod = tvm.runtime.load_module(path)
    out: dict[str, Any] = {}
    for name, spec in specs.items():
        a = tvm.runtime.tensor(np.random.default_rng(0).uniform(
            0.1, 1.0, spec["n"]).astype("float32"), dev)
        b = tvm.runtime.tensor(np.zeros(spec["n"], "float32"), dev)
        mod[name](a, b)
        dev.sync()
        runs = mod.time_evaluator(name, dev, number=5, repeat=repeats)(a, b).results
        best = min(runs)
        if name == "stream":
            out[name] = {"best_s": best, "gbs": round(spec["bytes"] / best / 1e9, 1)}
        else:
            out[name] = {"best_s": best, "gflops": round(spec["ops"] / best / 1e9, 1)}
    return out
