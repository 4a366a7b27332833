"""The isolated measurement worker: ``python -m measure.worker``.

Reads one JSON task per line on stdin and answers one JSON result per line on the protocol
channel (the original stdout; anything TVM or LLVM prints goes to stderr). For each task it
builds the kernel, runs it once on random inputs (the discarded warm-up), checks the output
against the numpy reference, then times it with the study's protocol. A Python exception in
one task is answered as that task's error; a crash or a hang is caught by the parent
(:mod:`measure.runner`), which restarts the worker.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlas_predict.space.config import Algorithm, ConvSpec, DType, SparsityPattern
from .reference import check_output, conv2d_reference, make_inputs
from .sparse import prune, sparsity


@dataclass(frozen=True)
class Protocol:
    """Timing protocol: warm-up discarded, then up to ``max_repeats`` timed runs, each of
    ``number`` back-to-back calls lasting at least ``min_repeat_ms``; a measurement stops
    adding runs after ``time_budget_s`` seconds but keeps at least ``min_repeats``.

    Before timing, wait up to ``quiet_wait_s`` for the machine to run at its usual speed:
    no other process holding a core (the chain probe's parallel/serial ratio at most
    ``contention_limit``) and the canary kernel at most ``slowdown_limit`` times its fastest
    (:mod:`measure.contention`); time once more if it slowed during the timing."""

    max_repeats: int = 150
    min_repeats: int = 10
    min_repeat_ms: float = 1.0
    time_budget_s: float = 3.0
    quiet_wait_s: float = 30.0
    contention_limit: float = 1.25
    slowdown_limit: float = 1.05

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def plan_timing(single_s: float, proto: Protocol) -> tuple[int, int]:
    """(number, repeats) for a kernel whose one call takes ``single_s`` seconds."""
    single_s = max(single_s, 1e-7)
    number = max(1, math.ceil(proto.min_repeat_ms / 1e3 / single_s))
    per_repeat = number * single_s
    repeats = int(proto.time_budget_s / per_repeat)
    repeats = max(proto.min_repeats, min(proto.max_repeats, repeats))
    return number, repeats


def _target(target_json: dict):
    import tvm

    return tvm.target.Target(target_json)


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Build, verify and time one kernel (or, with ``kind: network``, one whole network:
    :func:`measure.netbuild.run_network_task`; with ``kind: peaks``, the device's roofs:
    :func:`measure.peaks.measure_peaks`). Returns the result fields."""
    fault = task.get("fault")
    if fault and os.environ.get("DLAS_FAULT_INJECTION") == "1":
        _inject(fault)
    if task.get("kind") == "network":
        from .netbuild import run_network_task

        return run_network_task(task)
    if task.get("kind") == "peaks":
        from .peaks import measure_peaks

        return measure_peaks(task["target"], int(task["cores"]), int(task["simd_bits"]),
                             int(task.get("stream_mib", 256)))
    import tvm

    from .kernels import KernelSpec, build_kernel, device_args

    spec = ConvSpec.from_dict(task["conv"])
    dtype = DType.parse(task["dtype"])
    ks = KernelSpec(conv=spec, algorithm=Algorithm.parse(task["algorithm"]),
                    sparse=bool(task["sparse"]), dtype=dtype, knobs=dict(task["knobs"]))
    proto = Protocol(**task.get("protocol", {}))
    x, w = make_inputs(spec, dtype, seed=int(task.get("seed", 0)))
    pattern = SparsityPattern.parse(task.get("pattern", "none"))
    if ks.sparse:
        w = prune(w, float(task["ratio"]), pattern)
    result: dict[str, Any] = {"sparsity": sparsity(w)}
    if ks.sparse:
        result["nnz"] = int(np.count_nonzero(w))

    dev = tvm.cpu(0)

    def make_args(k: KernelSpec) -> list:
        return device_args(k, x, w, dev)

    if task.get("tuning"):
        executable, ks = _tuned_build(ks, task, pattern, make_args, result)
    else:
        t0 = time.perf_counter()
        executable = build_kernel(ks, _target(task["target"]))
        result["compile_s"] = time.perf_counter() - t0

    *args, out = make_args(ks)
    func = executable["main"]
    t0 = time.perf_counter()
    func(*args, out)  # warm-up run, discarded; its output is verified
    single_s = time.perf_counter() - t0
    ref = conv2d_reference(x, w, spec, dtype)
    result["verified"], result["max_error"] = check_output(out.numpy().reshape(spec.output_shape), ref,
                                                                 dtype)

    number, repeats = plan_timing(single_s, proto)
    timer = executable.mod.time_evaluator("main", dev, number=number, repeat=repeats)
    result.update(number=number, repeats=repeats,
                  **timed_fields(lambda: timer(*args, out).results, task["target"], proto,
                                 task.get("fingerprint", "")))
    return result


def timed_fields(run, target_json: dict, proto: Protocol,
                 fingerprint: str = "") -> dict[str, Any]:
    """Time ``run`` on a quiet machine where possible (:func:`measure.contention.timed`);
    the reply's timing fields."""
    from .contention import pool_threads, probe_for, timed

    t = timed(run, probe_for(_target(target_json), pool_threads(), fingerprint), proto)
    return {"run_secs": t.runs, "contention": t.contention, "slowdown": t.slowdown,
            "quiet_wait_s": t.waited_s, "timing_attempts": t.attempts}


def _tuned_build(ks, task: dict[str, Any], pattern: SparsityPattern, make_args,
                 result: dict[str, Any]):
    """Tune (or reuse the database's search), then compile the winner; fills the tuning
    fields of ``result``. Returns the executable and the kernel spec it was built from."""
    import tvm

    from . import tuning as tn
    from .kernels import build_kernel
    from .knobs import search_space

    opts = task["tuning"]
    budget, patience = int(opts["budget"]), int(opts.get("patience") or 0)
    target = tn.tuning_target(task["target"], int(opts["cores"]))
    db = tn.TuningDB(opts["db"])
    sparsity = (float(task["ratio"]), pattern.value) if ks.sparse else None
    key = tn.tuning_key(task.get("fingerprint", ""), ks, budget, task["target"], sparsity)
    if ks.sparse:
        from dlas_predict.space.config import Variant

        variant = Variant(ks.algorithm, task["compression"], float(task["ratio"]))
        ks, outcome = tn.search_sparse(ks, target, db, key, budget, patience,
                                       search_space(ks.conv, variant), make_args)
        t0 = time.perf_counter()
        executable = build_kernel(ks, target)
    else:
        mod, outcome = tn.tune_dense(ks, target, db, key, budget, patience)
        t0 = time.perf_counter()
        executable = tvm.compile(mod, target=target)
    result["compile_s"] = time.perf_counter() - t0
    result.update(tuning_seconds=outcome.seconds, trials=outcome.trials, tuner=outcome.tuner,
                  tuning_reused=outcome.reused, stopped_early=outcome.stopped_early,
                  tuner_best_s=outcome.best_s,
                  knobs=dict(ks.knobs))
    return executable, ks


def _inject(fault: str) -> None:
    """Test hook (only with DLAS_FAULT_INJECTION=1): reproduce a crashing or hanging kernel."""
    if fault == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "exit":
        os._exit(3)
    elif fault == "raise":
        raise RuntimeError("injected failure")


def main() -> int:
    proto_fd = os.dup(1)          # the protocol channel
    os.dup2(2, 1)                 # everything else printed goes to stderr
    sys.stdout = sys.stderr
    channel = os.fdopen(proto_fd, "w", buffering=1)
    import tvm  # the slow import happens before the handshake, outside any task's timeout

    import dlas_predict.measure.kernels  # noqa: F401

    channel.write(json.dumps({"ready": True, "tvm_version": tvm.__version__,
                              "threads": int(os.environ.get("TVM_NUM_THREADS", "0"))}) + "\n")
    channel.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        task = json.loads(line)
        try:
            reply = {"ok": True, **run_task(task)}
        except Exception as exc:  # one task's failure is data, the worker goes on
            tail = traceback.format_exc(limit=3).strip().splitlines()[-1]
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                     "error_detail": tail[:500]}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
