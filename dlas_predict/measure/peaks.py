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

- **Cache bandwidth**: ``a = 0.5 a + b`` over working sets of half of each cache level (L1d
  and L2 per core, times the cores; L3 shared), each core sweeping its share many times,
  warm, as a kernel's repeated runs find their operands: the memory roof of a kernel whose
  compulsory bytes fit that level (12 bytes per element, as the triad).

Each is timed like a kernel (warm-up discarded, median of repeated runs); the best of the
runs is reported as the roof.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dlas_predict.space.devices import Device, MeasuredPeaks

#: Independent accumulator vectors per core (hides an FMA latency of 4 with 2 FMA ports).
ACCS = 12
ITERS = 4096
#: Rows of the streamed operand (loaded from L1 and converted every step, as in a conv).
BROWS = 16
#: Accumulator and output types: as the conv kernels (float16 widens to float32, int8 to
#: int32; measure/kernels/spec.py ACC_DTYPE).
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


_DOT = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({P}, {L4}), "int8"), b: T.Buffer(({B}, {L4}), "int8"),
         out: T.Buffer(({P}, {L}), "int32")):
    T.func_attr({{"tirx.noalias": True}})
    for p in T.parallel({P}):
        acc = T.alloc_buffer(({A}, {L}), "int32", scope="local")
        for j in T.unroll({A}):
            for l in T.vectorized({L}):
                acc[j, l] = T.Cast("int32", a[p, l]) + j
        for it in range({N}):
            for j in T.unroll({A}):
                acc[j, T.ramp(0, 1, {L})] = T.call_llvm_pure_intrin(
                    "int32x{L}", "{intrin}", acc[j, T.ramp(0, 1, {L})],
                    a[p, T.ramp(0, 1, {L4})], b[it % {B}, T.ramp(0, 1, {L4})])
        for l in T.vectorized({L}):
            out[p, l] = {total}
'''


def dot_source(lanes: int, parallel: int) -> str:
    """The dot-product-bound int8 kernel: ``vpdpbusd`` on ``lanes`` int32 lanes (8 or 16)."""
    total = " + ".join(f"acc[{j}, l]" for j in range(ACCS))
    return _DOT.format(P=parallel, L=lanes, L4=4 * lanes, A=ACCS, N=ITERS, B=BROWS,
                       intrin=f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", total=total)


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


def _rate(run, target, target_json, source: str, arrays: list[np.ndarray], work: float,
          min_ms: float = 50.0, repeats: int = 15) -> tuple[float, float]:
    """The kernel ``source`` compiled for ``target``, run on ``arrays`` where ``run``
    executes: ``work`` (FLOPs, operations or bytes per call) per nanosecond, of its fastest
    run and of its median one."""
    import tvm
    from tvm.script import from_source

    ex = run.load(tvm.compile(tvm.IRModule({"main": from_source(source)}), target=target),
                  target_json)
    runs = _time(ex, run.dev, [tvm.runtime.tensor(a, run.dev) for a in arrays], min_ms,
                 repeats)
    return round(work / min(runs) / 1e9, 1), round(work / statistics.median(runs) / 1e9, 1)


_WARM = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({N},), "float32"), b: T.Buffer(({N},), "float32")):
    T.func_attr({{"tirx.noalias": True}})
    for o in T.parallel({O}):
        for r in range({R}):
            for i in range({I}):
                for v in T.vectorized({V}):
                    a[(o * {I} + i) * {V} + v] = a[(o * {I} + i) * {V} + v] * \\
                        T.float32(0.5) + b[(o * {I} + i) * {V} + v]
'''


def _warm_gbs(run, target, target_json, nbytes: int, cores: int, v: int, rng
              ) -> tuple[float, float]:
    """The best and median GB/s of ``a = 0.5 a + b`` (read a and b, write a: 12 bytes per
    element) over arrays of ``nbytes`` together, each core sweeping its own share many
    times in one call (the sweeps depend on each other: none can be dropped)."""
    i = max(nbytes // (8 * cores * v), 1)
    n = cores * i * v
    sweeps = max(1, (64 << 20) // (12 * n))
    return _rate(run, target, target_json, _WARM.format(N=n, O=cores, R=sweeps, I=i, V=v),
                 [rng.standard_normal(n).astype("float32") for _ in range(2)],
                 12.0 * n * sweeps, repeats=10)


def _triad_gbs(run, target, target_json, n: int, cores: int, v: int, rng
               ) -> tuple[float, float]:
    """The best and median GB/s of the triad over three arrays of about ``n`` floats."""
    o = cores * 16
    i = max(n // (o * v), 1)
    n = o * i * v
    return _rate(run, target, target_json, _TRIAD.format(N=n, O=o, I=i, V=v),
                 [rng.standard_normal(n).astype("float32") for _ in range(3)], 3.0 * 4 * n,
                 min_ms=100.0, repeats=10)


def cache_working_sets(caches: dict[str, int], cores: int) -> dict[str, int]:
    """Bytes of the arrays that measure each cache level: half of its capacity (L1d and L2
    per core, times the cores; L3 shared); a level no larger than the one below it is left
    out."""
    from dlas_predict.space.devices import cache_capacities

    out: dict[str, int] = {}
    below = 0
    for level, capacity in cache_capacities(caches, cores).items():
        if capacity // 2 > below:
            out[level] = below = capacity // 2
    return out


def measure_peaks(target_json: dict[str, Any], cores: int, simd_bits: int,
                  stream_mib: int = 256, vnni: bool = False,
                  caches: dict[str, int] | None = None) -> dict[str, Any]:
    """Measure and return ``{"peak_gflops": {dtype: ...}, "mem_bandwidth_gbs": ...,
    "int8_dot_gflops": ... (with ``vnni``), "cache_bandwidth_gbs": {level: ...},
    "details": {...}}`` on this machine."""
    import tvm

    from dlas_predict.measure.execution.remote import execution

    target = tvm.target.Target(target_json)
    run = execution()
    rng = np.random.default_rng(0)
    peaks, details = {}, {}
    parallel = cores * 8  # enough chunks to keep every core busy
    for dtype in ("float32", "float16", "int8"):
        lanes = max(simd_bits // 32, 4)  # lanes of the 32-bit accumulators
        if dtype == "int8":
            a = rng.integers(-3, 3, (parallel, lanes), dtype=np.int8)
            b = np.ones((BROWS, lanes), dtype=np.int8)
        else:
            a = (rng.standard_normal((parallel, lanes)) * 1e-3).astype(dtype)
            b = np.full((BROWS, lanes), 0.999, dtype=dtype)
        out = np.zeros((parallel, lanes), dtype=OUT[dtype])
        flops = 2.0 * parallel * ITERS * ACCS * lanes
        peaks[dtype], median = _rate(run, target, target_json,
                                     fma_source(dtype, lanes, parallel), [a, b, out], flops)
        details[dtype] = {"lanes": lanes, "flops_per_call": flops, "median_gflops": median}
    dot = None
    if vnni:
        lanes = 16 if simd_bits >= 512 else 8
        a = rng.integers(0, 3, (parallel, 4 * lanes), dtype=np.int8)
        b = np.ones((BROWS, 4 * lanes), dtype=np.int8)
        out = np.zeros((parallel, lanes), dtype="int32")
        ops = 2.0 * parallel * ITERS * ACCS * lanes * 4
        dot, median = _rate(run, target, target_json, dot_source(lanes, parallel),
                            [a, b, out], ops)
        details["int8_dot"] = {"lanes": lanes, "instruction": "vpdpbusd",
                               "ops_per_call": ops, "median_gops": median}
    v = max(simd_bits // 32, 4)
    # streaming triad, far beyond the caches
    bandwidth, median = _triad_gbs(run, target, target_json, stream_mib * 1024 * 1024 // 4,
                                   cores, v, rng)
    details["stream"] = {"bytes": 3 * stream_mib * 1024 * 1024, "median_gbs": median}
    # each cache level, warm
    cache_bw: dict[str, float] = {}
    for level, nbytes in cache_working_sets(caches or {}, cores).items():
        cache_bw[level], median = _warm_gbs(run, target, target_json, nbytes, cores, v, rng)
        details[f"warm_{level}"] = {"bytes": nbytes, "median_gbs": median}
    return {"peak_gflops": peaks, "mem_bandwidth_gbs": bandwidth, "int8_dot_gflops": dot,
            "cache_bandwidth_gbs": cache_bw, "details": details,
            "tvm_version": tvm.__version__}


def measure_device_peaks(device: Device, runner: Any, save_to: Path | None = None
                         ) -> tuple[MeasuredPeaks, str]:
    """Measure ``device``'s roofs with the runner that ``runner()`` opens (this machine's
    worker, or a board of a tracker), and store them with its registry entry (and in the
    JSON file ``save_to``): the measurement and the cache path. A failed measurement raises
    :class:`~dlas_predict.space.devices.DeviceError` with the board's error."""
    import time

    from dlas_predict.measure.execution.tasks import PeaksTask
    from dlas_predict.space.devices import DeviceError, MeasuredPeaks, save_measured_peaks

    with runner() as r:
        reply = r.call(PeaksTask(target=device.target, cores=device.cores,
                                 simd_bits=device.simd_bits or 128, vnni=device.vnni,
                                 caches=dict(device.caches)))
        board = r.board
    if not reply.ok:
        raise DeviceError(f"measuring the roofs failed: {reply.error}")
    peaks = MeasuredPeaks(device.fingerprint, device.name, device.cpu_model, device.cores,
                          device.simd_bits, device.caches, reply.peak_gflops,
                          reply.mem_bandwidth_gbs, reply.details, reply.tvm_version,
                          time.time(), board.to_dict() if board else None,
                          int8_dot_gflops=reply.int8_dot_gflops,
                          cache_bandwidth_gbs=dict(reply.cache_bandwidth_gbs or {}))
    path = save_measured_peaks(peaks.to_dict(), str(save_to) if save_to else None)
    return peaks, path
