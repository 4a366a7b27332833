"""Auto-scheduling: the tuned half of the grid.

Dense kernels are tuned by MetaSchedule (TVM 0.27's successor of the Ansor auto-scheduler
the study used) from their unscheduled TensorIR
(:func:`dlas_predict.measure.kernels.build.dense_prim_func`). CSR kernels have data-dependent loops
that MetaSchedule cannot sample, so their tuned variant is a measured search over the hand
schedule's knobs (:func:`dlas_predict.measure.kernels.knobs.search_space`), the counterpart of the
study's "sparse sketch rules".

Every search is written to a :class:`TuningDB` (a directory: MetaSchedule's JSON database of
tuning records, plus an index of what was tuned with which budget and what it cost), so the
same workload is never tuned twice for the same device and budget, and the directory can
travel with a corpus. This module imports TVM and runs inside the isolated worker.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tvm

from dlas_predict.files import append_row, read_rows
from dlas_predict.space.config import stable_hash
from dlas_predict.measure.kernels.build import build_kernel, dense_prim_func
from dlas_predict.measure.kernels.spec import KernelSpec

from dlas_predict.measure.records import KNOB_SEARCH, METASCHEDULE  # noqa: F401 - the tuners

#: A trial improves on the best so far when it is at least this much faster.
MIN_GAIN = 0.01
#: Seconds MetaSchedule may spend building one candidate.
BUILD_TIMEOUT_S = 180.0


#: The tensor intrinsics a CPU target's schedule rules can use (x86 and Arm dot products).
CPU_INTRINSICS = ("x86", "arm_cpu", "riscv_cpu")


def import_tensor_intrinsics(families: tuple[str, ...] = CPU_INTRINSICS) -> None:
    """Import ``families`` of ``tvm.s_tir.tensor_intrin`` (default: the CPU half,
    :data:`CPU_INTRINSICS`) in a second or two instead of 20-100 s: MetaSchedule imports the
    package in the tuning process and in each builder worker (this function is also their
    initializer, :func:`_board_tuning`); the CUDA search asks for ``cuda`` too.

    - The package imports every architecture's intrinsics; a CPU target's schedule rules
      never use the CUDA ones, nor ROCm's or Hexagon's. The package is registered with only
      the families asked for imported; any other submodule still imports on demand (``import
      tvm.s_tir.tensor_intrin.cuda``), or through a later call with it.
    - Each TVMScript function parsed calls :func:`inspect.stack`, which reads the source of
      every frame on the stack and, for the import machinery's frozen frames, searches all of
      ``sys.modules`` (the more modules a process holds, the slower: torch's make it twice
      as slow). TVMScript reads the code context of the first three frames only
      (``tvm.script.parser.core.utils.is_defined_in_class``) and the locals of the others,
      so during this import the stack carries context for those three. The intrinsics
      registered are the same either way (their TVMScript, compared for all 124)."""
    import importlib
    import importlib.util
    import inspect
    import sys

    name = "tvm.s_tir.tensor_intrin"
    missing = [f for f in families if f"{name}.{f}" not in sys.modules]
    if name in sys.modules and not missing:
        return
    original = inspect.stack

    def stack(context: int = 1) -> list:
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            if len(frames) < 3:
                info = inspect.getframeinfo(frame, context)
                frames.append(inspect.FrameInfo(frame, *info, positions=info.positions))
            else:
                frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename,
                                                frame.f_lineno, frame.f_code.co_name, None,
                                                None, positions=None))
            frame = frame.f_back
        return frames

    import tvm.s_tir

    registered = name not in sys.modules
    if registered:
        spec = importlib.util.find_spec(name)
        package = importlib.util.module_from_spec(spec)  # its __init__ is not run
        sys.modules[name] = package
        tvm.s_tir.tensor_intrin = package
    inspect.stack = stack
    try:
        for sub in missing:
            importlib.import_module(f"{name}.{sub}")
    except BaseException:
        if registered:
            sys.modules.pop(name, None)
        raise
    finally:
        inspect.stack = original


@dataclass(frozen=True)
class TuneOutcome:
    """What one search found and what it cost (also what the index stores)."""

    tuner: str
    budget: int
    trials: int               # trials actually run (early stopping may end before budget)
    seconds: float            # wall-clock cost of the search
    best_s: float | None      # the tuner's own best measurement of one call
    stopped_early: bool
    knobs: dict[str, int] = field(default_factory=dict)  # knob search: the winner
    reused: bool = False      # found in the database: nothing was searched this time
    #: MetaSchedule: the schedule kept, ``search`` (its best) or ``hand`` (the hand
    #: schedule, timed faster than the search's best in the same run: tuning never loses
    #: to no tuning), and the two times of that comparison (seconds per call).
    kept: str = "search"
    search_s: float | None = None
    hand_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TuningDB:
    """A tuning database directory.

    ``workloads.json`` and ``records.json`` are MetaSchedule's JSON database (every measured
    schedule, so a later search with a larger budget starts from them); ``index.jsonl`` holds
    one line per finished search: its key, tuner, budget, trials, seconds and result.
    Lines are appended and flushed, so a killed search loses only itself.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.index_path = self.path / "index.jsonl"
        self._ms = None
        self._entries: dict[str, dict[str, Any]] | None = None

    def entries(self) -> dict[str, dict[str, Any]]:
        """The index, read once per instance (one worker task) and kept up to date by
        :meth:`record`."""
        if self._entries is None:  # a line cut by a kill: that search is simply redone
            self._entries = read_rows(self.index_path, by="key")
        return self._entries

    def lookup(self, key: str) -> TuneOutcome | None:
        entry = self.entries().get(key)
        if entry is None:
            return None
        fields = TuneOutcome.__dataclass_fields__
        return TuneOutcome(**{k: v for k, v in entry.items() if k in fields and k != "reused"},
                           reused=True)

    def record(self, key: str, outcome: TuneOutcome, **extra: Any) -> None:
        entry = {"key": key, **outcome.to_dict(), **extra, "recorded_at": time.time()}
        append_row(self.index_path, entry)
        self.entries()[key] = entry

    def metaschedule(self):
        """MetaSchedule's JSON database in this directory."""
        if self._ms is None:
            from tvm.s_tir import meta_schedule as ms

            self._ms = ms.database.JSONDatabase(
                path_workload=str(self.path / "workloads.json"),
                path_tuning_record=str(self.path / "records.json"), allow_missing=True)
        return self._ms


def tuning_key(fingerprint: str, ks: KernelSpec, budget: int, target: dict,
               sparsity: tuple[float, str] | None = None) -> str:
    """A search's identity: device, workload, kernel, layout knobs, budget (and, for CSR
    kernels, the pruning the knobs were searched on)."""
    layout = {} if ks.sparse else {k: v for k, v in ks.knobs.items() if k != "budget"}
    return stable_hash({"fingerprint": fingerprint, "target": target,
                        "conv": ks.conv.to_dict(), "algorithm": ks.algorithm.value,
                        "sparse": ks.sparse, "dtype": ks.dtype.value, "layout": layout,
                        "scale": ks.requant_scale, "budget": int(budget),
                        "sparsity": list(sparsity) if sparsity else None})


def tuning_target(target: dict, cores: int) -> "tvm.target.Target":
    """The host target with ``num-cores``, which MetaSchedule requires."""
    return tvm.target.Target({**target, "num-cores": int(cores)})


# ------------------------------------------------------------------------------------------
# Dense kernels: MetaSchedule
# ------------------------------------------------------------------------------------------
def _early_stop_callback(patience: int, budget: int, counter: dict):
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class EarlyStop(PyMeasureCallback):
        """Ends the search after ``patience`` trials without a gain of MIN_GAIN."""

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results) -> None:
            for built, res in zip(builder_results, runner_results):
                counter["trials"] += 1
                error = built.error_msg or res.error_msg
                if error and not counter["error"]:
                    counter["error"] = str(error).strip().splitlines()[-1][:300]
                secs = [float(x) for x in (res.run_secs or [])]
                if res.error_msg is None and secs:
                    t = sum(secs) / len(secs)
                    if t < counter["best"] * (1 - MIN_GAIN):
                        counter["best"], counter["since"] = t, 0
                        continue
                counter["since"] += 1
            if patience and counter["since"] >= patience and counter["trials"] < budget:
                counter["stopped"] = True
                try:
                    task_scheduler.terminate_task(task_id)
                except Exception:  # the scheduler finished the task first: nothing to stop
                    pass

    return EarlyStop()


#: MetaSchedule's evolutionary search evolves a population of this many candidates by
#: default; a search of fewer than POPULATION_TRIALS trials evolves proportionally fewer.
POPULATION = 512
POPULATION_TRIALS = 64


def search_strategy(budget: int):
    """MetaSchedule's evolutionary search for a budget of ``budget`` trials: its defaults
    from :data:`POPULATION_TRIALS` trials up (the corpus's searches), a population of 8
    candidates per trial (at least 16) below. Sampling and evolving 512 candidates on two
    cores takes about 20 s, which a search of a few trials would otherwise spend
    for nothing."""
    from tvm.s_tir import meta_schedule as ms

    population = POPULATION if budget >= POPULATION_TRIALS else max(16, 8 * budget)
    return ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=min(50, population))


#: Rounds of the search's best against the hand schedule, each timed in turn.
COMPARE_ROUNDS = 3


def tune_dense(ks: KernelSpec, target: "tvm.target.Target", db: TuningDB, key: str,
               budget: int, patience: int, per_iter: int = 16,
               hand: KernelSpec | None = None,
               make_args: Callable[[KernelSpec], list] | None = None
               ) -> tuple[tvm.IRModule | None, TuneOutcome]:
    """Tune ``ks`` with MetaSchedule unless ``db`` already holds this search; returns the
    best schedule's module and the search's outcome. With ``hand`` (the same kernel as the
    untuned grid builds it) and ``make_args``, a new search's best is timed against the hand
    schedule in turn (:data:`COMPARE_ROUNDS` rounds, the fastest of each) and the faster is
    kept: where the hand schedule wins, the module is None, the outcome says
    ``kept="hand"``, and the caller builds ``hand``."""
    from tvm.s_tir import meta_schedule as ms

    func = dense_prim_func(ks)
    outcome = db.lookup(key)
    if outcome is not None and outcome.kept == "hand":
        return None, outcome
    searched = outcome is None
    if searched:
        counter = {"trials": 0, "best": float("inf"), "since": 0, "stopped": False,
                   "error": None}
        work = tempfile.mkdtemp(prefix="dlas-ms-")
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        t0 = time.perf_counter()
        builder, runner, board = _board_tuning(target)
        try:
            ms.tune_tir(func, target, work, max_trials_global=budget,
                        num_trials_per_iter=min(per_iter, budget),
                        strategy=search_strategy(budget),
                        database=db.metaschedule(),
                        # LLVM builds of unrolled candidates take seconds; on a loaded
                        # two-core machine the default 30 s limit fails good candidates
                        builder=builder, runner=runner,
                        measure_callbacks=[*ms.measure_callback.MeasureCallback.create(
                            "default"), _early_stop_callback(patience, budget, counter)])
        finally:
            shutil.rmtree(work, ignore_errors=True)
            if board is not None:
                board.connect()  # the worker's own session again, for the final timing
        best = counter["best"] if counter["best"] != float("inf") else None
        outcome = TuneOutcome(METASCHEDULE, budget, counter["trials"],
                              time.perf_counter() - t0, best, counter["stopped"])
        if best is None:
            raise RuntimeError(f"MetaSchedule found no valid schedule in {outcome.trials} "
                               f"trials (first error: {counter['error']})")
    sch = ms.tir_integration.compile_tir(db.metaschedule(), func, target)
    if searched:
        if sch is not None and hand is not None and make_args is not None:
            outcome = _against_hand(outcome, sch.mod, ks, hand, target, make_args)
        db.record(key, outcome)
        if outcome.kept == "hand":
            return None, outcome
    if sch is None:
        raise RuntimeError(f"the tuning database has no schedule for this kernel although "
                           f"its index lists a search ({outcome.trials} trials)")
    return sch.mod, outcome


def _against_hand(outcome: TuneOutcome, searched: tvm.IRModule, ks: KernelSpec,
                  hand: KernelSpec, target: "tvm.target.Target",
                  make_args: Callable[[KernelSpec], list]) -> TuneOutcome:
    """``outcome`` with the search's best and the hand schedule timed in turn on the
    execution device, and the faster kept. A hand schedule that does not build or run
    leaves the search's best."""
    from dataclasses import replace

    from dlas_predict.measure.execution.remote import execution

    run = execution()
    target_json = dict(target.export())
    try:
        mods = {"search": run.load(tvm.compile(searched, target=target), target_json),
                "hand": run.load(build_kernel(hand, target), target_json)}
        args = {"search": make_args(ks), "hand": make_args(hand)}
        times = {k: float("inf") for k in mods}
        for _ in range(COMPARE_ROUNDS):
            for k, mod in mods.items():
                times[k] = min(times[k], quick_time(mod["main"], args[k], mod, run.dev))
    except Exception as exc:  # the hand schedule did not build or run: the search stands
        logging.getLogger(__name__).warning("hand schedule not compared: %s", exc)
        return outcome
    kept = "hand" if times["hand"] < times["search"] else "search"
    return replace(outcome, kept=kept, search_s=times["search"], hand_s=times["hand"])


def _board_tuning(target: "tvm.target.Target"):
    """MetaSchedule's builder and runner, and the board execution to reconnect afterwards.

    Here: TVM's local runner. Through a tracker: candidates are linked into shared
    libraries for the board's architecture and timed by MetaSchedule's RPC runner on boards
    of the same key; the worker gives its own board back for the search (on a one-board
    farm the runner would otherwise wait for it forever) and takes one again after."""
    import functools

    from tvm.s_tir import meta_schedule as ms

    from dlas_predict.measure.execution.remote import execution

    import_tensor_intrinsics()
    builder_kw: dict[str, Any] = {"timeout_sec": BUILD_TIMEOUT_S,
                                  "initializer": import_tensor_intrinsics}
    ex = execution()
    if not ex.remote:
        return ms.builder.LocalBuilder(**builder_kw), "local", None
    target_json = {k: v for k, v in target.export().items() if k in ("kind", "mtriple")}
    builder = ms.builder.LocalBuilder(f_export=functools.partial(_export_board, target_json),
                                      **builder_kw)
    runner = ms.runner.RPCRunner(
        ms.runner.RPCConfig(tracker_host=ex.tracker[0], tracker_port=ex.tracker[1],
                            tracker_key=ex.key, session_timeout_sec=600),
        ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100),
        max_workers=1)
    ex.release()
    return builder, runner, ex


def _export_board(target_json: dict, mod) -> str:
    """MetaSchedule's export of a candidate for a board: a shared library linked for the
    board's architecture (the board has no compiler to link a tar)."""
    from dlas_predict.measure.execution.remote import export_shared

    path = Path(tempfile.mkdtemp(prefix="dlas-ms-")) / "candidate.so"
    return export_shared(mod, str(path), target_json)


# ------------------------------------------------------------------------------------------
# CSR kernels: a measured search over the hand schedule's knobs
# ------------------------------------------------------------------------------------------
def quick_time(func: Callable, args: list, module, dev, repeats: int = 5) -> float:
    """Median seconds per call: one warm-up, then ``repeats`` runs of at least 1 ms each."""
    from dlas_predict.measure.execution.tasks import Protocol, plan_timing

    t0 = time.perf_counter()
    func(*args)
    number, _ = plan_timing(time.perf_counter() - t0, Protocol(min_repeat_ms=1.0))
    timer = module.time_evaluator("main", dev, number=number, repeat=repeats)
    return float(np.median(list(timer(*args).results)))


def search_sparse(ks: KernelSpec, target: "tvm.target.Target", db: TuningDB, key: str,
                  budget: int, patience: int, candidates: list[dict[str, int]],
                  make_args: Callable[[KernelSpec], list]) -> tuple[KernelSpec, TuneOutcome]:
    """Time each knob candidate (at most ``budget``; stop after ``patience`` without a gain)
    and keep the fastest; ``make_args(ks)`` gives a candidate's arguments (packed weights,
    output). Reuses the database's winner when this search was done before."""
    from dataclasses import replace

    outcome = db.lookup(key)
    if outcome is None:
        from dlas_predict.measure.execution.remote import execution

        run = execution()
        dev = run.dev
        t0 = time.perf_counter()
        best_s, best_knobs, since, trials, stopped = float("inf"), None, 0, 0, False
        for knobs in candidates[:budget]:
            trials += 1
            cand = replace(ks, knobs={**ks.knobs, **knobs})
            try:
                mod = run.load(build_kernel(cand, target), dict(target.export()))
                secs = quick_time(mod["main"], make_args(cand), mod, dev)
            except Exception:  # a candidate that does not build or run is a failed trial
                secs = float("inf")
            if secs < best_s * (1 - MIN_GAIN):
                best_s, best_knobs, since = secs, knobs, 0
            else:
                since += 1
            if patience and since >= patience and trials < min(budget, len(candidates)):
                stopped = True
                break
        if best_knobs is None:
            raise RuntimeError(f"no knob candidate of the {trials} tried built and ran")
        outcome = TuneOutcome(KNOB_SEARCH, budget, trials, time.perf_counter() - t0, best_s,
                              stopped, dict(best_knobs))
        db.record(key, outcome)
    return replace(ks, knobs={**ks.knobs, **outcome.knobs}), outcome
