"""Measure a bundle on this machine's GPU:
``python -m dlas_predict.measure.gpu.run BUNDLE --out R``.

Needs only TVM's runtime (``TVM_USE_RUNTIME_LIB=1``), numpy and an NVIDIA driver: the bundle's
modules carry CUDA C that the driver's NVRTC compiles when a module is loaded.

Loading (NVRTC) runs in ``--workers`` processes at once; the GPU work of a kernel (warm-up,
verification run, timing) runs under one lock, so the GPU times one kernel at a time. Every
kernel is verified against the numpy reference (:mod:`dlas_predict.measure.kernels.reference`) on
the output of its warm-up run, then timed with TVM's ``time_evaluator``: ``number`` calls back to
back between two CUDA events (TVM's CUDA timer), per timed run. A whole network
(:mod:`dlas_predict.measure.gpu.networks`) is checked against onnxruntime's outputs and timed
the same way. A kernel that raises, crashes its process or hangs past ``--timeout`` is a
recorded failure; its worker is replaced and the run goes on. Each result is appended to the
results file as soon as it is known (fsync'd), and a re-run skips what is there, so a run
killed at any moment resumes where it stopped.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_LOCK_NAME = ".gpu.lock"


def load_cuda_runtime() -> None:
    """Load TVM's CUDA runtime plugin (``libtvm_runtime_cuda.so``): with the compiler it
    comes along; with the runtime alone it must be loaded by hand."""
    import ctypes

    import tvm

    global _LOADED
    if _LOADED:
        return
    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise SystemExit(f"Error: no CUDA GPU usable here: cannot load TVM's CUDA "
                         f"runtime ({lib}): {exc}") from None
    dev = tvm.cuda(0)
    if dev.exist:
        # TVM's own callback asks the compiler library for the current target; name the
        # GPU's architecture instead, and let NVRTC build the module's CUDA C into a cubin.
        import tvm_ffi
        from tvm.support import nvcc

        arch = "sm_" + str(dev.compute_version).replace(".", "")
        cache = os.environ.get("DLAS_CUBIN_CACHE")

        @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
        def _compile(code):  # noqa: ANN001 - called by TVM with the module's CUDA C
            if not cache:
                return nvcc.compile_cuda(code, target_format="cubin", arch=arch,
                                         compiler="nvrtc")
            return _cached_cubin(Path(cache), code, arch, nvcc.compile_cuda)
    _LOADED = True


_LOADED = False


def _cached_cubin(cache: Path, code: str, arch: str, compile_cuda) -> bytearray:
    """The cubin of CUDA C ``code`` for ``arch``, compiled once and kept in ``cache``
    (``DLAS_CUBIN_CACHE``): another process that loads the same module (the runner's next
    try, ``benchmarks/bench_gpu.py``) reads it instead of compiling again."""
    import hashlib

    digest = hashlib.sha256((arch + "\0" + code).encode()).hexdigest()
    path = cache / f"{digest}.cubin"
    if path.is_file():
        return bytearray(path.read_bytes())
    cubin = compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(bytes(cubin))
    os.replace(tmp, path)  # whole or absent: a process killed mid-write leaves no cubin
    return bytearray(cubin)


def gpu_identity() -> dict[str, Any]:
    """The GPU's name, SM count, compute capability and driver (its fingerprint's fields)."""
    import tvm

    load_cuda_runtime()
    dev = tvm.cuda(0)
    if not dev.exist:
        raise SystemExit("Error: no CUDA GPU visible to TVM's runtime on this machine")
    driver = ""
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    return {"name": dev.device_name, "sm_count": int(dev.multi_processor_count),
            "compute": str(dev.compute_version), "driver": driver,
            "memory_gb": round(dev.total_global_memory / 2 ** 30, 1)}


def _measure_chunk(bundle: Path, chunk: str, lines: list[dict], proto: dict, queue) -> bool:
    """Worker: load one chunk, then verify and time its kernels one at a time under the
    GPU lock; every outcome goes to ``queue``. Exits on the first error (a CUDA error can
    poison the context), after reporting it."""
    import numpy as np
    import tvm

    from dlas_predict.space.config import SparsityPattern
    from dlas_predict.measure.gpu.bundle import kernel_spec
    from dlas_predict.measure.kernels.build import device_args
    from dlas_predict.measure.kernels.reference import check_output, conv2d_reference, make_inputs
    from dlas_predict.measure.kernels.sparse import prune, sparsity
    from dlas_predict.measure.execution.tasks import Protocol, plan_timing

    load_cuda_runtime()
    dev = tvm.cuda(0)
    t0 = time.perf_counter()
    mod = tvm.runtime.load_module(str(bundle / chunk))
    load_s = time.perf_counter() - t0
    lock = open(bundle / _LOCK_NAME, "a")
    for line in lines:
        queue.put(("start", line["key"], os.getpid()))
        if line.get("kind") == "network":
            if not _measure_one_network(mod, line, bundle, dev, proto, lock, load_s, queue):
                return False
            continue
        ks = kernel_spec(line)
        spec, dtype = ks.conv, ks.dtype
        x, w = make_inputs(spec, dtype, seed=int(line.get("seed", 0)))
        if ks.sparse:
            w = prune(w, float(line["ratio"]), SparsityPattern.parse(line["pattern"]))
        ref = conv2d_reference(x, w, spec, dtype)
        result: dict[str, Any] = {"key": line["key"], "sparsity": sparsity(w),
                                  "compile_s": round(load_s / len(lines), 4)
                                  + float(line.get("build_s", 0.0))}
        if ks.sparse:
            result["nnz"] = int(np.count_nonzero(w))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            t_gpu = time.perf_counter()
            try:
                *args, out = device_args(ks, x, w, dev)
                func = mod[line["func"]]
                func(*args, out)  # warm-up, discarded; its output is verified
                dev.sync()
                t1 = time.perf_counter()
                func(*args, out)
                dev.sync()
                single = time.perf_counter() - t1
                number, repeats = plan_timing(single, Protocol(**proto))
                timer = mod.time_evaluator(line["func"], dev, number=number, repeat=repeats)
                runs = list(timer(*args, out).results)
                got = out.numpy().reshape(spec.output_shape)
            finally:
                result["measure_s"] = round(time.perf_counter() - t_gpu, 4)
                fcntl.flock(lock, fcntl.LOCK_UN)
            verified, err = check_output(got, ref, dtype)
            result.update(run_secs=runs, number=number, verified=verified, max_error=err,
                          error=None, timestamp=time.time(), tvm_version=tvm.__version__)
            if not verified:
                result["error"] = f"verification failed: max error {err:.3g}"
            queue.put(("done", line["key"], {**_payload(line), **result}))
        except Exception as exc:  # noqa: BLE001 - the kernel's failure is data
            text = error_text(exc)
            queue.put(("done", line["key"], {**_payload(line), **result, "error": text,
                                             "timestamp": time.time()}))
            return False
    return True


def _measure_one_network(mod, line: dict, bundle: Path, dev, proto: dict, lock, load_s: float,
                         queue) -> bool:
    """Worker: check and time one whole network under the GPU lock; False after an error
    (the CUDA context may be poisoned)."""
    import tvm

    from dlas_predict.measure.gpu.networks import measure_network

    result: dict[str, Any] = {"compile_s": round(load_s, 4) + float(line.get("build_s", 0))}
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t_gpu = time.perf_counter()
        try:
            result.update(measure_network(mod, line, bundle, dev, proto))
        finally:
            result["measure_s"] = round(time.perf_counter() - t_gpu, 4)
            fcntl.flock(lock, fcntl.LOCK_UN)
        queue.put(("done", line["key"], {**_payload(line), **result, "timestamp": time.time(),
                                         "tvm_version": tvm.__version__}))
        return True
    except Exception as exc:  # noqa: BLE001 - the network's failure is data
        queue.put(("done", line["key"], {**_payload(line), **result, "error": error_text(exc),
                                         "timestamp": time.time()}))
        return False


def _payload(line: dict) -> dict:
    if line.get("kind") == "network":
        return {k: v for k, v in line.items() if k not in ("chunk", "check")}
    return {k: line[k] for k in ("key", "conv", "algorithm", "sparse", "dtype", "knobs",
                                 "ratio", "pattern", "compression", "tuning", "seed",
                                 "search", "search_trials", "tuner", "schedule", "search_s",
                                 "search_round", "build_s") if k in line}


def error_text(exc: BaseException, limit: int = 500) -> str:
    """One readable line of an exception: its lines that say "error" (NVRTC's and ptxas's
    logs end in blank lines and notes), else its last non-empty line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    said = [ln for ln in lines if "error" in ln.lower()]
    text = " | ".join(said[-3:]) if said else (lines[-1] if lines else "(no message)")
    return f"{type(exc).__name__}: {text[:limit]}"


def _worker(bundle: str, jobs: list[tuple[str, list[dict]]], proto: dict, queue) -> None:
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    for chunk, lines in jobs:
        try:
            if not _measure_chunk(Path(bundle), chunk, lines, proto, queue):
                return  # a CUDA error may poison this process's context: start afresh
        except Exception as exc:  # noqa: BLE001 - e.g. the chunk failed to load
            text = error_text(exc)
            queue.put(("chunk-failed", chunk, text))


def run_bundle(bundle: Path, results: Path, workers: int = 4, timeout_s: float = 120.0,
               time_limit_s: float | None = None, allow_other_gpu: bool = False,
               log=print) -> dict[str, int]:
    """Measure every kernel of ``bundle`` not yet in ``results``. Returns counts."""
    from dlas_predict.measure.gpu.bundle import done_keys

    header = json.loads((bundle / "bundle.json").read_text())
    gpu = gpu_identity()
    from dlas_predict.space.devices import gpu_fingerprint

    fp = gpu_fingerprint(gpu)
    (results.parent / "gpu.json").write_text(json.dumps({**gpu, "fingerprint": fp}) + "\n")
    if fp != header["fingerprint"] and not allow_other_gpu:
        raise SystemExit(f"Error: this GPU ({gpu}) has fingerprint {fp}, the bundle was built "
                         f"for {header['device']} with {header['fingerprint']}; its records "
                         "would be filed under the wrong device (--allow-other-gpu to run "
                         "anyway)")
    done = done_keys(results)
    lines = [json.loads(t) for t in (bundle / "manifest.jsonl").read_text().splitlines()]
    todo = [ln for ln in lines if ln["key"] not in done]
    by_chunk: dict[str, list[dict]] = {}
    for ln in todo:
        by_chunk.setdefault(ln["chunk"], []).append(ln)
    pending = list(by_chunk.items())
    log(f"{len(lines)} kernels in the bundle, {len(done)} already measured, {len(todo)} to "
        f"go in {len(pending)} chunks on {gpu['name']} ({workers} loaders)")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    out = open(results, "a")
    counts = {"measured": 0, "failed": 0, "remaining": len(todo)}
    started: dict[str, tuple[float, int]] = {}  # key -> (start time, worker pid)
    t_start = time.time()

    def write(row: dict) -> None:
        out.write(json.dumps(row) + "\n")
        out.flush()
        os.fsync(out.fileno())
        counts["measured" if row.get("error") is None else "failed"] += 1
        counts["remaining"] -= 1

    procs: list[Any] = []
    assigned: dict[int, list[tuple[str, list[dict]]]] = {}

    def spawn(jobs: list[tuple[str, list[dict]]]) -> None:
        p = ctx.Process(target=_worker, args=(str(bundle), jobs, header["protocol"], queue),
                        daemon=True)
        p.start()
        procs.append(p)
        assigned[p.pid] = jobs

    # one chunk a job, handed out as workers free up
    def next_job():
        if time_limit_s is not None and time.time() - t_start > time_limit_s:
            return None
        return pending.pop(0) if pending else None

    live = 0
    for _ in range(min(workers, len(pending))):
        job = next_job()
        if job:
            spawn([job])
            live += 1
    written: set[str] = set()
    last_log = time.time()
    while live:
        try:
            kind, key, payload = queue.get(timeout=2.0)
        except Exception:  # queue.Empty
            kind = None
        now = time.time()
        if kind == "start":
            started[key] = (now, payload)
        elif kind == "done":
            started.pop(key, None)
            if key not in written:
                write(payload)
                written.add(key)
        elif kind == "chunk-failed":
            for ln in by_chunk.get(key, []):
                if ln["key"] not in written:
                    write({**_payload(ln), "error": f"load: {payload}",
                           "timestamp": now})
                    written.add(ln["key"])
        # a dead worker or a hung kernel: fail the kernel in progress, replace the worker
        for p in list(procs):
            hung = [k for k, (t0, pid) in started.items()
                    if pid == p.pid and now - t0 > timeout_s]
            if p.is_alive() and not hung:
                continue
            if p.is_alive() and hung:
                p.kill()
            p.join(timeout=5)
            if p.exitcode is None:
                continue
            procs.remove(p)
            jobs = assigned.pop(p.pid, [])
            rest = []
            for chunk, lns in jobs:
                left = [ln for ln in lns if ln["key"] not in written]
                for ln in left:
                    if ln["key"] in started and started[ln["key"]][1] == p.pid:
                        why = (f"timeout: no result within {timeout_s:g} s; worker killed"
                               if hung else f"worker died (exit {p.exitcode})")
                        write({**_payload(ln), "error": why, "timestamp": now})
                        written.add(ln["key"])
                        started.pop(ln["key"], None)
                left = [ln for ln in left if ln["key"] not in written]
                if left:
                    rest.append((chunk, left))
            live -= 1
            if rest:
                spawn(rest)
                live += 1
            else:
                job = next_job()
                if job:
                    spawn([job])
                    live += 1
        if now - last_log > 15:
            last_log = now
            log(f"  {counts['measured']} measured, {counts['failed']} failed, "
                f"{counts['remaining']} to go, {now - t_start:.0f} s")
    out.close()
    counts["seconds"] = round(time.time() - t_start, 1)
    counts["unstarted_chunks"] = len(pending)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="results file (JSON lines)")
    ap.add_argument("--workers", type=int, default=4, help="processes loading modules")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a kernel may take")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="start no new chunk after this many seconds")
    ap.add_argument("--allow-other-gpu", action="store_true")
    ap.add_argument("--peaks", type=Path, default=None,
                    help="also time the roof kernels of this bundle's peaks.so first "
                         "(dlas_predict.measure.gpu.peaks); writes peaks.json beside --out")
    args = ap.parse_args(argv)
    if not (args.bundle / "manifest.jsonl").is_file():
        print(f"Error: {args.bundle} is not a kernel bundle (no manifest.jsonl)",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    if args.peaks is not None:
        from dlas_predict.measure.gpu.peaks import peak_specs, time_peaks

        gpu = gpu_identity()
        roofs = time_peaks(str(args.peaks), peak_specs(gpu["sm_count"]))
        (args.out.parent / "peaks.json").write_text(json.dumps({"gpu": gpu, **roofs}) + "\n")
        print(json.dumps(roofs), flush=True)
    counts = run_bundle(args.bundle, args.out, args.workers, args.timeout, args.time_limit,
                        args.allow_other_gpu, log=lambda s: print(s, flush=True))
    print(json.dumps(counts), flush=True)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
