"""The isolated measurement worker: ``python -m dlas_predict.measure.execution.worker``.

Reads one JSON task per line on stdin and answers one JSON result per line on the protocol
channel (the original stdout; anything TVM or LLVM prints goes to stderr). For each task it
builds the kernel, runs it once on random inputs (the discarded warm-up), checks the output
against the numpy reference, then times it with the study's protocol. A Python exception in
one task is answered as that task's error; a crash or a hang is caught by the parent
(:mod:`dlas_predict.measure.execution.runner`), which restarts the worker.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

from dlas_predict.space.config import SparsityPattern
from dlas_predict.measure import hide_torch_from_children, import_tvm
from dlas_predict.measure.execution.contention import timed_fields
from dlas_predict.measure.execution.remote import BoardError, RemoteExecution, execution, use
from dlas_predict.measure.kernels.reference import check_output, conv2d_reference, make_inputs
from dlas_predict.measure.kernels.sparse import prune, sparsity
from dlas_predict.measure.execution.tasks import (KernelTask, NetworkTask, OrtTask, PeaksTask,
                                                  Task, WorkerReply, from_wire, plan_timing)


def run_task(task: Task) -> WorkerReply:
    """Build, verify and time one kernel (a :class:`KernelTask`), one whole network (a
    :class:`NetworkTask`: :func:`dlas_predict.measure.networks.build.run_network_task`; an
    :class:`OrtTask`: :func:`dlas_predict.measure.networks.ortrun.run_ort_task`) or the
    machine's roofs (a :class:`PeaksTask`: :func:`dlas_predict.measure.peaks.measure_peaks`).
    A Python exception propagates; :func:`main` answers it as the task's error."""
    fault = _fault(task)
    if fault and fault not in _KERNEL_FAULTS:
        _inject(fault)
    if isinstance(task, NetworkTask):
        from dlas_predict.measure.networks.build import run_network_task

        return WorkerReply(ok=True, **run_network_task(task))
    if isinstance(task, OrtTask):
        from dlas_predict.measure.networks.ortrun import run_ort_task

        return WorkerReply(ok=True, **run_ort_task(task))
    if isinstance(task, PeaksTask):
        from dlas_predict.measure.peaks import measure_peaks

        return WorkerReply(ok=True, **measure_peaks(task.target, task.cores, task.simd_bits,
                                                    task.stream_mib, task.vnni, task.caches))
    return WorkerReply(ok=True, **_run_kernel(task))


def _run_kernel(task: KernelTask) -> dict[str, Any]:
    from dlas_predict.measure.kernels.build import build_kernel, device_args, tvm_target
    from dlas_predict.measure.kernels.spec import KernelSpec

    spec, dtype, pattern, proto = task.conv, task.dtype, task.pattern, task.protocol
    ks = KernelSpec(conv=spec, algorithm=task.algorithm, sparse=task.sparse, dtype=dtype,
                    knobs=dict(task.knobs))
    x, w = make_inputs(spec, dtype, seed=task.seed)
    if ks.sparse:
        w = prune(w, float(task.ratio), pattern)
    result: dict[str, Any] = {"sparsity": sparsity(w)}
    if ks.sparse:
        result["nnz"] = int(np.count_nonzero(w))

    ex = execution()

    def make_args(k: KernelSpec) -> list:
        return device_args(k, x, w, ex.dev)

    if task.tuning is not None:
        executable, ks = _tuned_build(ks, task, pattern, make_args, result)
    else:
        t0 = time.perf_counter()
        executable = build_kernel(ks, tvm_target(task.target))
        result["compile_s"] = time.perf_counter() - t0
    dev = ex.dev  # after a search on boards: the session the worker holds again
    if ex.remote and _fault(task) == "truncate":
        module = ex.load(executable, task.target, truncate=True)  # test hook: a bad upload
    else:
        module = ex.load(executable, task.target)

    *args, out = make_args(ks)
    func = module["main"]
    t0 = time.perf_counter()
    func(*args, out)  # warm-up run, discarded; its output is verified
    if _fault(task) == "wrong":
        out.copyfrom(np.zeros(out.shape, out.dtype))  # test hook: a board that computes wrong
    single_s = time.perf_counter() - t0
    ref = conv2d_reference(x, w, spec, dtype)
    result["verified"], result["max_error"] = check_output(
        out.numpy().reshape(spec.output_shape), ref, dtype)
    if ex.remote and not result["verified"]:
        raise RuntimeError(f"wrong results on the board at {ex.board.address}: max error "
                           f"{result['max_error']:.3g} against the numpy reference (not timed)")

    number, repeats = plan_timing(single_s, proto)
    timer = module.time_evaluator("main", dev, number=number, repeat=repeats)
    result.update(number=number, repeats=repeats,
                  **timed_fields(lambda: timer(*args, out).results, task.target, proto,
                                 task.fingerprint, task.simd_bits))
    return result


def _tuned_build(ks, task: KernelTask, pattern: SparsityPattern, make_args,
                 result: dict[str, Any]):
    """Tune (or reuse the database's search), then compile the winner; fills the tuning
    fields of ``result``. Returns the executable and the kernel spec it was built from."""
    import tvm

    from dlas_predict.measure.kernels import tuning as tn
    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.knobs import search_space

    opts = task.tuning
    budget, patience = opts.budget, opts.patience
    target = tn.tuning_target(task.target, opts.cores)
    db = tn.TuningDB(opts.db)
    sparsity = (float(task.ratio), pattern.value) if ks.sparse else None
    key = tn.tuning_key(task.fingerprint, ks, budget, task.target, sparsity)
    if ks.sparse:
        from dlas_predict.space.config import Variant

        variant = Variant(ks.algorithm, task.compression, float(task.ratio))
        ks, outcome = tn.search_sparse(ks, target, db, key, budget, patience,
                                       search_space(ks.conv, variant, task.simd_bits),
                                       make_args)
        t0 = time.perf_counter()
        executable = build_kernel(ks, target)
    else:
        from dataclasses import replace

        hand = replace(ks, knobs=dict(opts.hand_knobs)) if opts.hand_knobs else None
        mod, outcome = tn.tune_dense(ks, target, db, key, budget, patience, hand=hand,
                                     make_args=make_args)
        t0 = time.perf_counter()
        if mod is None:  # the hand schedule beat the search's best: it is the tuned build
            ks = replace(hand, knobs={**hand.knobs, "budget": budget})
            executable = build_kernel(hand, target)
        else:
            executable = tvm.compile(mod, target=target)
    result["compile_s"] = time.perf_counter() - t0
    result.update(tuning_seconds=outcome.seconds, trials=outcome.trials, tuner=outcome.tuner,
                  tuning_reused=outcome.reused, stopped_early=outcome.stopped_early,
                  tuner_best_s=outcome.best_s, tuning_kept=outcome.kept,
                  knobs=dict(ks.knobs))
    return executable, ks


#: Test faults the kernel run itself reproduces: a board that computes wrong results, and an
#: upload the board cannot load.
_KERNEL_FAULTS = ("wrong", "truncate")


def _fault(task: Task) -> str | None:
    """The task's test fault, honoured only with DLAS_FAULT_INJECTION=1."""
    return task.fault if os.environ.get("DLAS_FAULT_INJECTION") == "1" else None


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


def _execution_from_argv(argv: list[str]):
    """``--tracker HOST:PORT --key K [--request-timeout S] [--session-timeout S]``: measure
    on a board of that tracker; no arguments: on this machine."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dlas_predict.measure.execution.worker")
    parser.add_argument("--tracker")
    parser.add_argument("--key")
    parser.add_argument("--request-timeout", type=float, default=60.0)
    parser.add_argument("--session-timeout", type=float, default=0.0)
    parser.add_argument("--emulated", action="store_true")
    args = parser.parse_args(argv)
    if not args.tracker:
        return None
    host, _, port = args.tracker.rpartition(":")
    return RemoteExecution((host, int(port)), args.key, args.request_timeout,
                           args.session_timeout, args.emulated)


def _exit_with_parent(every_s: float = 1.0) -> None:
    """Exit as soon as the parent is gone (a collector killed mid-task): the worker runs in
    its own session, so nothing else stops a task it is timing on this machine."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    proto_fd = os.dup(1)          # the protocol channel
    os.dup2(2, 1)                 # everything else printed goes to stderr
    sys.stdout = sys.stderr
    channel = os.fdopen(proto_fd, "w", buffering=1)
    # the slow import happens before the handshake, outside any task's timeout
    tvm = import_tvm()
    from dlas_predict.paths import cache_dir

    # TVM's helper processes (MetaSchedule's builders and runners) start without torch
    os.environ.update(hide_torch_from_children(cache_dir("without-torch")))

    import dlas_predict.measure.kernels.cpu  # noqa: F401

    def send(obj: dict) -> None:
        channel.write(json.dumps(obj) + "\n")
        channel.flush()

    try:
        remote = _execution_from_argv(sys.argv[1:] if argv is None else argv)
    except BoardError as exc:
        send({"ready": False, "error": str(exc), "code": exc.code})
        return 1
    if remote is not None:
        use(remote)
    ex = execution()
    send({"ready": True, "tvm_version": tvm.__version__, "threads": ex.threads(),
          "board": ex.board.to_dict() if ex.board else None})
    if remote is None:  # a board's session is left to end cleanly: its task finishes, then
        _exit_with_parent()  # stdin's end stops the worker and the board is free again
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            reply = run_task(from_wire(json.loads(line)))
        except Exception as exc:  # one task's failure is data, the worker goes on
            tail = traceback.format_exc(limit=3).strip().splitlines()[-1]
            reply = WorkerReply.failure(f"{type(exc).__name__}: {exc}"[:2000], tail[:500])
            if ex.remote and not ex.alive():
                # the board dropped off: the task is not at fault, another board may run it
                reply.error = f"board lost ({ex.board.address}): {reply.error}"[:2000]
                reply.board_lost = True
                send(reply.to_dict())
                return 2
        send(reply.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
