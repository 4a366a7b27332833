"""Measured roofs of the local CPU: peak arithmetic per dtype and streaming memory bandwidth.

Two TVMScript kernels, compiled for the device's own target like every measured kernel:

- **FMA-bound**: every core runs ``ACCS`` independent vector multiply-add chains on registers,
  ``acc = acc * b[it] + a``, for ``ITERS`` iterations (2 FLOPs per lane per step).
  Independent chains hide the FMA latency; ``b[it]`` is a row of a 16-row operand that stays
  in L1 and is loaded every step, as a conv streams its weights. Each dtype computes as our
  conv kernels do: float32 in float32; float16 operands widened to float32 accumulators;
  int8 operands widened to int32 accumulators. So the roofs are those of the code we
  generate, not of the ISA's best instruction (no VNNI, no native float16 arithmetic).
- **Streaming**: the STREAM triad ``a[i] = b[i] + s * c[i]`` over arrays far larger than the
  last-level cache, parallel and vectorised; bandwidth counts 3 x 4 bytes per element
  (STREAM's convention: the write-allocate read is not counted).

Each is timed like a kernel (warm-up discarded, median of repeated runs); the best of the
runs is reported as the roof.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

#: Independent accumulator vectors per core (hides an FMA latency of 4 with 2 FMA ports).
ACCS = 12
ITERS = 4096
#: Rows of the streamed operand (loaded from L1 and converted every step, as in a conv).
BROWS = 16
#: Accumulator and output types: as the conv kernels (float16 widens to float32, int8 to
#: int32; measure/kernels.py ACC_DTYPE).
ACC = {"float32": "float32", "float16": "float32", "int8": "int32"}
OUT = {"float32": "float32", "float16": "float16", "int8": "int32"}

_FMA = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({P}, {L}), "{dt}"), b: T.Buffer(({B}, {L}), "{dt}"),
         out: T.Buffer(({P}, {L}), "{out_dt}")):
    T.func_attr({{"tirx.noalias": True}})
    for p in T.parallel({P}):
        acc = T.alloc_buffer(({A}, {L}), "{acc}", scope="local")
        for j in T.unroll({A}):
            for l in T.vectorized({L}):
                acc[j, l] = {init}
        for it in range({N}):
            for j in T.unroll({A}):
                for l in T.vectorized({L}):
                    acc[j, l] = acc[j, l] * {bl} + {al}
        for l in T.vectorized({L}):
            out[p, l] = {total}
'''

_TRIAD = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({N},), "float32"), b: T.Buffer(({N},), "float32"),
         c: T.Buffer(({N},), "float32")):
    T.func_attr({{"tirx.noalias": True}})
    for o in T.parallel({O}):
        for i in range({I}):
            for v in T.vectorized({V}):
                a[(o * {I} + i) * {V} + v] = b[(o * {I} + i) * {V} + v] + \\
                    T.float32(1.5) * c[(o * {I} + i) * {V} + v]
'''


def fma_source(dtype: str, lanes: int, parallel: int) -> str:
    """The FMA-bound kernel for ``dtype`` (float32, float16 or int8)."""
    acc = ACC[dtype]
    b = f"b[it % {BROWS}, l]"
    if dtype == "float32":
        bl, al = b, "a[p, l]"
    else:
        bl, al = f'T.Cast("{acc}", {b})', f'T.Cast("{acc}", a[p, l])'
    init = f'T.Cast("{acc}", a[p, l]) + T.Cast("{acc}", j)'
    total = " + ".join(f"acc[{j}, l]" for j in range(ACCS))
    out = total if acc == dtype else f'T.Cast("{dtype}", {total})'
    if dtype == "int8":
        out = total  # the int32 sum is the output
    return _FMA.format(P=parallel, L=lanes, dt=dtype, acc=acc, A=ACCS, N=ITERS, B=BROWS,
                       init=init, bl=bl, al=al, total=out, out_dt=OUT[dtype])


def _time(module, dev, args, min_ms: float = 50.0, repeats: int = 15) -> list[float]:
    """Seconds per call of ``module``'s main: runs of at least ``min_ms``, timed by
    ``time_evaluator`` where the module runs (this CPU or a board)."""
    func = module["main"]
    func(*args)  # warm-up, discarded
    t0 = time.perf_counter()
    func(*args)
    single = max(time.perf_counter() - t0, 1e-6)
    number = max(1, int(min_ms / 1e3 / single))
    timer = module.time_evaluator("main", dev, number=number, repeat=repeats)
    return list(timer(*args).results)


def measure_peaks(target_json: dict[str, Any], cores: int, simd_bits: int,
                  stream_mib: int = 256) -> dict[str, Any]:
    """Measure and return ``{"peak_gflops": {dtype: ...}, "mem_bandwidth_gbs": ...,
    "details": {...}}`` on this machine."""
    import tvm
    from tvm.script import from_source

    from .remote import execution

    target = tvm.target.Target(target_json)
    run = execution()
    dev = run.dev
    rng = np.random.default_rng(0)
    peaks, details = {}, {}
    parallel = cores * 8  # enough chunks to keep every core busy
    for dtype in ("float32", "float16", "int8"):
        lanes = max(simd_bits // 32, 4)  # lanes of the 32-bit accumulators
        mod = tvm.IRModule({"main": from_source(fma_source(dtype, lanes, parallel))})
        ex = run.load(tvm.compile(mod, target=target), target_json)
        if dtype == "int8":
            a = rng.integers(-3, 3, (parallel, lanes), dtype=np.int8)
            b = np.ones((BROWS, lanes), dtype=np.int8)
        else:
            a = (rng.standard_normal((parallel, lanes)) * 1e-3).astype(dtype)
            b = np.full((BROWS, lanes), 0.999, dtype=dtype)
        out = np.zeros((parallel, lanes), dtype=OUT[dtype])
        args = [tvm.runtime.tensor(x, dev) for x in (a, b, out)]
        runs = _time(ex, dev, args)
        flops = 2.0 * parallel * ITERS * ACCS * lanes
        peaks[dtype] = round(flops / min(runs) / 1e9, 1)
        details[dtype] = {"lanes": lanes, "flops_per_call": flops,
                          "median_gflops": round(flops / statistics.median(runs) / 1e9, 1)}
    # streaming triad
    v = max(simd_bits // 32, 4)
    n = stream_mib * 1024 * 1024 // 4
    o = cores * 16
    i = n // (o * v)
    n = o * i * v
    mod = tvm.IRModule({"main": from_source(_TRIAD.format(N=n, O=o, I=i, V=v))})
    ex = run.load(tvm.compile(mod, target=target), target_json)
    arrays = [tvm.runtime.tensor(rng.standard_normal(n).astype("float32"), dev)
              for _ in range(3)]
    runs = _time(ex, dev, arrays, min_ms=100.0, repeats=10)
    nbytes = 3.0 * 4 * n
    bandwidth = round(nbytes / min(runs) / 1e9, 1)
    details["stream"] = {"elements": n, "bytes_per_call": nbytes,
                         "median_gbs": round(nbytes / statistics.median(runs) / 1e9, 1)}
    return {"peak_gflops": peaks, "mem_bandwidth_gbs": bandwidth, "details": details,
            "tvm_version": tvm.__version__}
