"""Kernel bundles: CUDA kernels built here, measured on a GPU machine, imported back.

A GPU that no tracker reaches (a lent machine with no network, a board behind a firewall) is
measured in three steps, each resumable:

1. :func:`write_bundle` (here, with TVM's compiler): every task's kernel is built for the
   device's CUDA target, many kernels a module, and exported as ``chunk-NNNN.so`` beside
   ``manifest.jsonl`` (one task a line: workload, variant, knobs, seed, key) and
   ``bundle.json`` (device, expected fingerprint, target, protocol). A kernel that fails to
   build is a recorded failure in ``build_failures.jsonl``.
2. ``python -m dlas_predict.measure.gpu.run BUNDLE --out RESULTS.jsonl`` (on the GPU machine, with
only TVM's runtime): each kernel is loaded, verified against the numpy reference and timed.
3. :func:`import_results` (here): results and build failures become corpus records.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import Device
from dlas_predict.errors import DlasError
from dlas_predict.measure.records import KNOB_SEARCH, METASCHEDULE, measurement_key
from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

#: Bump when a CUDA kernel's code changes, so stored measurements of the old code are not
#: reused.
GPU_KERNELS_VERSION = "g1"

#: Timing protocol of GPU kernels: the study's 150 timed runs after a discarded warm-up,
#: each run at least 0.2 ms of back-to-back launches (TVM times CUDA with device events, to
#: the microsecond), at most ``time_budget_s`` a kernel (but at least 10 runs).
GPU_PROTOCOL = {"max_repeats": 150, "min_repeats": 10, "min_repeat_ms": 0.2,
                "time_budget_s": 0.2}

#: A bundle's MetaSchedule candidates' traces (key, trace), which the import files in the
#: tuning database; the GPU machine does not need this file.
TRACES = "traces.jsonl"


def require_cuda(device: Device, what: str) -> None:
    """Refuse a device that is not a CUDA GPU, saying that ``what`` needs one."""
    if device.kind != "gpu" or device.target.get("kind") != "cuda":
        raise DlasError(f"device {device.name!r} is not a CUDA GPU (kind {device.kind}, "
                        f"target {device.target.get('kind')}); {what} need one")


@dataclass(frozen=True)
class GpuTask:
    """One CUDA kernel to measure: a workload, a variant, its resolved knobs, its key."""

    spec: ConvSpec
    variant: Variant
    knobs: dict[str, int]
    key: str
    seed: int = 0
    #: The key of the tuned record this kernel is a candidate of (a search), or None, the
    #: trials that search was planned with, and its tuner.
    search: str | None = None
    search_trials: int = 0
    tuner: str = KNOB_SEARCH
    #: A MetaSchedule candidate's schedule trace (TVM JSON), replayed on the unscheduled
    #: kernel; None: the hand schedule with ``knobs``.
    trace: str | None = field(default=None, compare=False, repr=False)
    #: Seconds a MetaSchedule search spent proposing, per candidate (part of its cost), and
    #: the search's round (0: a knob search).
    search_s: float = 0.0
    search_round: int = 0

    @classmethod
    def make(cls, spec: ConvSpec, variant: Variant, device: Device,
             seed: int = 0, search: str | None = None,
             search_trials: int = 0, tuner: str = KNOB_SEARCH) -> "GpuTask":
        require_cuda(device, "CUDA kernels")
        knobs = resolve_gpu_knobs(spec, variant)
        key = measurement_key(device.name, device.fingerprint, spec, variant, knobs,
                              GPU_KERNELS_VERSION)
        return cls(spec, variant, knobs, key, seed, search, search_trials, tuner)

    def payload(self) -> dict[str, Any]:
        v = self.variant
        out = {"key": self.key, "conv": self.spec.to_dict(), "algorithm": v.algorithm.value,
               "sparse": v.sparse, "dtype": v.dtype.value, "knobs": self.knobs,
               "ratio": v.ratio, "pattern": v.pattern.value,
               "compression": v.compression.value, "tuning": v.tuning.value,
               "seed": self.seed}
        if self.search is not None:
            out.update(search=self.search, search_trials=self.search_trials,
                       tuner=self.tuner)
        if self.trace is not None:
            out["schedule"] = METASCHEDULE
        if self.search_s:
            out["search_s"] = self.search_s
        if self.search_round:
            out["search_round"] = self.search_round
        return out


def search_tasks(spec: ConvSpec, variant: Variant, device: Device,
                 trials: int) -> list[GpuTask]:
    """The candidates of a tuned kernel: up to ``trials`` knob settings of its hand schedule
    (:func:`dlas_predict.measure.kernels.knobs.gpu_search_space`), each a task of the search whose
    key is the tuned record's. The fastest verified candidate becomes the tuned record."""
    from dlas_predict.space.config import Tuning

    from dlas_predict.measure.kernels.knobs import gpu_search_space

    base = Variant(variant.algorithm, variant.compression, variant.ratio, Tuning.TUNED,
                   variant.knobs)
    search = measurement_key(device.name, device.fingerprint, spec, base,
                             {"trials": trials}, GPU_KERNELS_VERSION)
    out = []
    for knobs in gpu_search_space(spec, base, trials):
        v = Variant(base.algorithm, base.compression, base.ratio, Tuning.TUNED, knobs)
        out.append(GpuTask.make(spec, v, device, search=search, search_trials=trials))
    return out


def metaschedule_tasks(spec: ConvSpec, variant: Variant, device: Device, trials: int,
                       db=None, round_no: int = 1) -> tuple[list[GpuTask], float]:
    """The candidates of a dense kernel's MetaSchedule search
    (:mod:`dlas_predict.measure.gpu.metaschedule`): its hand schedule first, then up to
    ``trials - 1`` candidates of one round of the evolutionary search (``db``: MetaSchedule's
    database of earlier rounds). Returns the tasks and the seconds the search took here."""
    from dlas_predict.measure.gpu import metaschedule as gm

    base, search = _metaschedule_search(spec, variant, device, trials, round_no)
    hand = replace(GpuTask.make(spec, base, device, search=search, search_trials=trials,
                                tuner=METASCHEDULE), search_round=round_no)
    traces, seconds = gm.propose(kernel_spec(hand.payload()),
                                 gm.ms_target(device.target.get("arch", "sm_90")),
                                 trials - 1, db, seed=round_no)
    hand = replace(hand, search_s=round(seconds / (len(traces) + 1), 4))
    out = [hand]
    for trace in traces:
        knobs = {**hand.knobs, "metaschedule": _trace_id(trace)}
        key = measurement_key(device.name, device.fingerprint, spec, base, knobs,
                              GPU_KERNELS_VERSION)
        out.append(replace(hand, key=key, trace=trace))
    return out, seconds


def _metaschedule_search(spec: ConvSpec, variant: Variant, device: Device, trials: int,
                         round_no: int) -> tuple[Variant, str]:
    """A MetaSchedule search's tuned variant and key (its trials and round in the key)."""
    from dlas_predict.space.config import Tuning

    base = Variant(variant.algorithm, variant.compression, variant.ratio, Tuning.TUNED,
                   variant.knobs)
    return base, measurement_key(device.name, device.fingerprint, spec, base,
                                 {"trials": trials, "metaschedule": round_no},
                                 GPU_KERNELS_VERSION)


def _trace_id(trace: str) -> int:
    """A number that tells a MetaSchedule candidate's key from its search's others."""
    import hashlib

    return int(hashlib.sha256(trace.encode()).hexdigest()[:12], 16)


def kernel_spec(payload: dict[str, Any]):
    """The :class:`dlas_predict.measure.kernels.spec.KernelSpec` of a manifest line."""
    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.measure.kernels.spec import KernelSpec

    return KernelSpec(conv=ConvSpec.from_dict(payload["conv"]),
                      algorithm=Algorithm.parse(payload["algorithm"]),
                      sparse=bool(payload["sparse"]), dtype=DType.parse(payload["dtype"]),
                      knobs=dict(payload["knobs"]))


def read_lines(path: Path | None) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (manifest, failures, results, traces), none if it is
    missing; a line cut short by a kill is ignored, so its task is done again."""
    rows: list[dict[str, Any]] = []
    if path is not None and Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def ran_ok(row: dict[str, Any]) -> bool:
    """Whether a result row ran without error and was not found wrong."""
    return row.get("error") is None and row.get("verified") is not False


def _build_error(exc: BaseException) -> str:
    """A build failure's record text: its exception's last line."""
    text = str(exc).strip()
    return (f"build: {type(exc).__name__}: "
            f"{(text.splitlines()[-1] if text else '(no message)')[:500]}")


def done_keys(path: Path) -> set[str]:
    """Keys of a JSON-lines file (manifest, failures or results)."""
    return {row["key"] for row in read_lines(path) if "key" in row}


def append_lines(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def write_bundle(tasks: list[GpuTask], device: Device, out: Path, chunk_size: int = 32,
                 skip: set[str] | None = None,
                 log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Build ``tasks`` for ``device`` into the bundle directory ``out`` (resumable: tasks
    already in its manifest or failures are not built again). Returns counts."""
    import tvm

    from dlas_predict.measure.kernels import cuda
    from dlas_predict.measure.gpu import metaschedule as gm

    out.mkdir(parents=True, exist_ok=True)
    manifest, failures = out / "manifest.jsonl", out / "build_failures.jsonl"
    header = {"device": device.name, "fingerprint": device.fingerprint,
              "target": device.target, "gpu": device.gpu, "protocol": GPU_PROTOCOL,
              "kernels_version": GPU_KERNELS_VERSION, "tvm_version": tvm.__version__}
    (out / "bundle.json").write_text(json.dumps(header, indent=1) + "\n")
    done = done_keys(manifest) | done_keys(failures) | (skip or set())
    todo = [t for t in tasks if t.key not in done]
    target = cuda.cuda_target(device.target.get("arch", "sm_90"))
    chunk_no = len(list(out.glob("chunk-*.so")))
    built = failed = 0
    t_start = time.time()
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start:start + chunk_size]
        name = f"chunk-{chunk_no:04d}.so"
        funcs, lines, bad = {}, [], []
        for i, task in enumerate(chunk):
            fname = f"k{chunk_no:04d}_{i:03d}"
            ks = kernel_spec(task.payload())
            try:  # schedule errors are this task's, not the chunk's
                funcs[fname] = (cuda.gpu_prim_func(ks) if task.trace is None
                                else gm.candidate_func(ks, task.trace))
            except Exception as exc:  # noqa: BLE001 - a failed build is a recorded failure
                bad.append({**task.payload(), "error": _build_error(exc)})
                continue
            lines.append({**task.payload(), "chunk": name, "func": fname})
        if funcs:
            t0 = time.time()
            module, funcs, refused = _build_chunk(funcs, target)
            for line in [ln for ln in lines if ln["func"] in refused]:
                bad.append({k: v for k, v in line.items() if k not in ("chunk", "func")}
                           | {"error": refused[line["func"]]})
            lines = [ln for ln in lines if ln["func"] not in refused]
        if funcs:
            module.export_library(str(out / name))
            per = (time.time() - t0) / len(funcs)
            for line in lines:
                line["build_s"] = round(per, 4)
            kept = {ln["key"] for ln in lines}
            append_lines(out / TRACES, [{"key": t.key, "trace": t.trace} for t in chunk
                                   if t.trace is not None and t.key in kept])
            append_lines(manifest, lines)  # after the library exists: a killed build is redone
            chunk_no += 1
        append_lines(failures, bad)
        built += len(lines)
        failed += len(bad)
        if log:
            log(f"built {built + failed}/{len(todo)} kernels ({failed} failed) in "
                f"{time.time() - t_start:.0f} s")
    return {"planned": len(tasks), "skipped": len(tasks) - len(todo), "built": built,
            "failed": failed}


def _build_chunk(funcs: dict[str, Any], target) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """Compile a chunk's kernels into one module. A kernel TVM cannot compile, or one NVRTC
    would refuse the whole module for (over the static shared memory), fails alone, and the
    module is built without it: returns (the module, None if no kernel is left; the kernels
    in it; the failing kernels' errors)."""
    from dlas_predict.measure.kernels import cuda

    try:
        module, refused = cuda.build(funcs, target), {}
    except Exception as exc:  # noqa: BLE001 - one kernel's lowering error, found below
        module, refused = None, _compile_alone(funcs, target, exc)
    kept = {n: f for n, f in funcs.items() if n not in refused}
    if module is None and kept:
        module = cuda.build(kept, target)
    over = cuda.over_shared(cuda.cuda_source(module), list(kept)) if kept else {}
    if over:
        kept = {n: f for n, f in kept.items() if n not in over}
        module = cuda.build(kept, target) if kept else None
    return module, kept, {**refused, **over}


def _compile_alone(funcs: dict[str, Any], target, error: Exception) -> dict[str, str]:
    """The errors of the kernels that fail to compile alone, after ``error`` failed their
    module (raised again where none fails alone: the module's own error)."""
    from dlas_predict.measure.kernels import cuda

    refused = {}
    for name, func in funcs.items():
        try:
            cuda.build({name: func}, target)
        except Exception as exc:  # noqa: BLE001 - a failed build is a recorded failure
            refused[name] = _build_error(exc)
    if not refused:
        raise error
    return refused


def file_metaschedule(bundle: Path, results: Path, tuning_db: Path | None = None,
                      device: Device | None = None) -> tuple[int, Path]:
    """File a bundle's measured MetaSchedule candidates in the tuning database
    ``tuning_db`` (MetaSchedule's JSON database: each trace with its run times; a candidate
    that failed or did not verify with none), which the next round's search reads. Default:
    the tuning database of ``device``, else of the bundle's device. Returns how many were
    filed (a candidate already there is not filed again) and the database's folder."""
    from dlas_predict.paths import tuning_db_dir

    from dlas_predict.measure.gpu import metaschedule as gm
    from dlas_predict.measure.kernels.tuning import TuningDB

    traces = {row["key"]: row["trace"] for row in read_lines(bundle / TRACES)}
    header = json.loads((bundle / "bundle.json").read_text())
    if tuning_db is None:
        if device is None:
            from dlas_predict.space.devices import get_device

            device = get_device(header["device"], with_target=False)
        tuning_db = tuning_db_dir(device.name, device.fingerprint)
    target = gm.ms_target(header["target"].get("arch", "sm_90"))
    index = Path(tuning_db) / "filed.jsonl"
    filed = done_keys(index)
    groups: dict[str, list[tuple[str, list[float] | None]]] = {}
    specs: dict[str, Any] = {}
    keys: list[str] = []
    for row in read_lines(results):
        if row.get("schedule") != METASCHEDULE or row["key"] in filed \
                or row["key"] not in traces:
            continue
        groups.setdefault(row["search"], []).append(
            (traces[row["key"]], row.get("run_secs") if ran_ok(row) else None))
        specs[row["search"]] = kernel_spec(row)
        filed.add(row["key"])
        keys.append(row["key"])
    db = TuningDB(tuning_db).metaschedule()
    n = sum(gm.record_round(db, specs[s], target, measured) for s, measured in groups.items())
    append_lines(index, [{"key": k} for k in keys])
    return n, Path(tuning_db)


def save_plans(out: Path, plans: dict[str, Any]) -> None:
    """Merge the networks' layers and configurations into the bundle's ``networks.json``."""
    path = out / "networks.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    old.update(plans)
    path.write_text(json.dumps(old) + "\n")


def write_metaschedule_bundle(kernels: list[tuple[ConvSpec, Variant]], device: Device,
                              out: Path, trials: int, tuning_db: Path | None = None,
                              round_no: int = 1,
                              log: Callable[[str], None] | None = None) -> dict[str, int]:
    """A bundle of MetaSchedule searches, one module each: every kernel's hand schedule and
    ``trials - 1`` candidates of one round of the evolutionary search, seeded by the tuning
    database's earlier rounds (``tuning_db``). Resumable by search: a search already in the
    bundle is not proposed again. Returns counts."""
    from dlas_predict.measure.kernels.tuning import TuningDB

    require_cuda(device, "MetaSchedule's CUDA candidates")
    db = TuningDB(tuning_db).metaschedule() if tuning_db is not None else None
    out.mkdir(parents=True, exist_ok=True)
    planned = {row.get("search") for row in read_lines(out / "manifest.jsonl")
               + read_lines(out / "build_failures.jsonl")}
    counts = {"searches": 0, "skipped": 0, "built": 0, "failed": 0}
    t_start = time.time()
    for i, (spec, variant) in enumerate(kernels):
        if _metaschedule_search(spec, variant, device, trials, round_no)[1] in planned:
            counts["skipped"] += 1
            continue
        tasks, seconds = metaschedule_tasks(spec, variant, device, trials, db, round_no)
        got = write_bundle(tasks, device, out, chunk_size=len(tasks))
        counts["searches"] += 1
        counts["built"] += got["built"]
        counts["failed"] += got["failed"]
        if log:
            log(f"search {i + 1}/{len(kernels)}: {got['built']} candidates built "
                f"({got['failed']} failed), proposed in {seconds:.1f} s; "
                f"{time.time() - t_start:.0f} s in all")
    return counts


