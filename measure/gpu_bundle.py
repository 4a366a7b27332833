"""Kernel bundles: CUDA kernels built here, measured on a GPU machine, imported back.

A GPU that no tracker reaches (a lent machine with no network, a board behind a firewall) is
measured in three steps, each resumable:

1. :func:`write_bundle` (here, with TVM's compiler): every task's kernel is built for the
   device's CUDA target, many kernels a module, and exported as ``chunk-NNNN.so`` beside
   ``manifest.jsonl`` (one task a line: workload, variant, knobs, seed, key) and
   ``bundle.json`` (device, expected fingerprint, target, protocol). A kernel that fails to
   build is a recorded failure in ``build_failures.jsonl``.
2. ``python -m measure.gpu_run BUNDLE --out RESULTS.jsonl`` (on the GPU machine, with only
   TVM's runtime): each kernel is loaded, verified against the numpy reference and timed.
3. :func:`import_results` (here): results and build failures become corpus records.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import Device
from dlas_predict.errors import DlasError
from dlas_predict.corpus.records import MeasureResult, measurement_key
from .knobs import resolve_gpu_knobs

#: Bump when a CUDA kernel's code changes, so stored measurements of the old code are not
#: reused.
GPU_KERNELS_VERSION = "g1"

#: Timing protocol of GPU kernels: the study's 150 timed runs after a discarded warm-up,
#: each run at least 0.2 ms of back-to-back launches (TVM times CUDA with device events, to
#: the microsecond), at most ``time_budget_s`` a kernel (but at least 10 runs).
GPU_PROTOCOL = {"max_repeats": 150, "min_repeats": 10, "min_repeat_ms": 0.2,
                "time_budget_s": 0.2}


@dataclass(frozen=True)
class GpuTask:
    """One CUDA kernel to measure: a workload, a variant, its resolved knobs, its key."""

    spec: ConvSpec
    variant: Variant
    knobs: dict[str, int]
    key: str
    seed: int = 0

    @classmethod
    def make(cls, spec: ConvSpec, variant: Variant, device: Device,
             seed: int = 0) -> "GpuTask":
        if device.kind != "gpu" or device.target.get("kind") != "cuda":
            raise DlasError(f"device {device.name!r} is not a CUDA GPU (kind {device.kind}, "
                            f"target {device.target.get('kind')}); CUDA kernels need one")
        knobs = resolve_gpu_knobs(spec, variant)
        key = measurement_key(device.name, device.fingerprint, spec, variant, knobs,
                              GPU_KERNELS_VERSION)
        return cls(spec, variant, knobs, key, seed)

    def payload(self) -> dict[str, Any]:
        v = self.variant
        return {"key": self.key, "conv": self.spec.to_dict(), "algorithm": v.algorithm.value,
                "sparse": v.sparse, "dtype": v.dtype.value, "knobs": self.knobs,
                "ratio": v.ratio, "pattern": v.pattern.value,
                "compression": v.compression.value, "tuning": v.tuning.value,
                "seed": self.seed}


def kernel_spec(payload: dict[str, Any]):
    """The :class:`dlas_predict.measure.kernels.KernelSpec` of a manifest line."""
    from dlas_predict.space.config import Algorithm, DType
    from .kernels import KernelSpec

    return KernelSpec(conv=ConvSpec.from_dict(payload["conv"]),
                      algorithm=Algorithm.parse(payload["algorithm"]),
                      sparse=bool(payload["sparse"]), dtype=DType.parse(payload["dtype"]),
                      knobs=dict(payload["knobs"]))


def done_keys(path: Path) -> set[str]:
    """Keys of a JSON-lines file (manifest, failures or results); a line cut short by a kill
    is ignored, so its task is done again."""
    keys: set[str] = set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                keys.add(json.loads(line)["key"])
            except (ValueError, KeyError):
                continue
    return keys


def _append(path: Path, rows: Iterable[dict[str, Any]]) -> None:
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

    from . import cuda

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
            try:
                cuda.gpu_prim_func(ks)  # schedule errors are this task's, not the chunk's
            except Exception as exc:  # noqa: BLE001 - a failed build is a recorded failure
                bad.append({**task.payload(), "error": f"build: {type(exc).__name__}: "
                            f"{str(exc).strip().splitlines()[-1][:500]}"})
                continue
            funcs[fname] = ks
            lines.append({**task.payload(), "chunk": name, "func": fname})
        if funcs:
            t0 = time.time()
            cuda.build(funcs, target).export_library(str(out / name))
            per = (time.time() - t0) / len(funcs)
            for line in lines:
                line["build_s"] = round(per, 4)
            _append(manifest, lines)  # after the library exists: a killed build is redone
            chunk_no += 1
        _append(failures, bad)
        built += len(lines)
        failed += len(bad)
        if log:
            log(f"built {built + failed}/{len(todo)} kernels ({failed} failed) in "
                f"{time.time() - t_start:.0f} s")
    return {"planned": len(tasks), "skipped": len(tasks) - len(todo), "built": built,
            "failed": failed}


def import_results(bundle: Path, results: Path | None, store) -> dict[str, int]:
    """Turn a bundle's build failures and a GPU run's results into corpus records of
    ``store`` (a :class:`dlas_predict.corpus.store.CorpusStore`); records already there are
    skipped. Returns counts."""
    header = json.loads((bundle / "bundle.json").read_text())
    rows: list[dict[str, Any]] = []
    for path in [bundle / "build_failures.jsonl", results]:
        if path is not None and Path(path).is_file():
            for line in Path(path).read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short when the run was killed
    have = store.keys()
    added = failed = skipped = 0
    for row in rows:
        if row["key"] in have:
            skipped += 1
            continue
        rec = _record(row, header)
        store.add(rec)
        have.add(rec.key)
        added += 1
        failed += rec.error is not None
    return {"records": added, "failed": failed, "skipped": skipped}


def _record(row: dict[str, Any], header: dict[str, Any]) -> MeasureResult:
    variant = Variant(row["algorithm"], row["compression"], float(row["ratio"]),
                      row.get("tuning", "untuned"))
    ok = row.get("error") is None and row.get("verified") is not False
    error = row.get("error")
    if error is None and row.get("verified") is False:
        error = f"verification failed: max error {row.get('max_error')}"
    return MeasureResult(
        key=row["key"], device=header["device"], fingerprint=header["fingerprint"],
        conv=ConvSpec.from_dict(row["conv"]), variant=variant, knobs=dict(row["knobs"]),
        sparsity=float(row.get("sparsity") or 0.0), nnz=row.get("nnz"),
        run_secs=list(row.get("run_secs") or []) if ok else [], number=row.get("number"),
        compile_s=row.get("compile_s"), verified=row.get("verified"),
        max_error=row.get("max_error"), error=error, threads=row.get("threads"),
        tvm_version=row.get("tvm_version") or header.get("tvm_version", ""),
        kernels_version=header["kernels_version"], timestamp=row.get("timestamp") or time.time(),
        tuning_seconds=row.get("tuning_seconds"), trials=row.get("trials"),
        tuner=row.get("tuner"))


def plan_networks(networks: list[str], algorithms, compressions, ratio: float,
                  device: Device, acc16: bool = True,
                  tuning=None) -> tuple[list[GpuTask], dict[str, Any]]:
    """GPU tasks for every conv layer of ``networks`` × algorithm × compression (each pruned
    layer at its own sparsity after global pruning at ``ratio``), and the networks' layers
    and configurations (what :func:`import_results` files in the store). float16 layers are
    measured twice with ``acc16``: accumulating in float32 and in float16."""
    from pathlib import Path as _Path

    from dlas_predict.networks import zoo
    from dlas_predict.space.config import Compression, Tuning
    from dlas_predict.compression.netplan import network_configs
    from dlas_predict.networks.graph import read_network

    tasks: dict[str, GpuTask] = {}
    plans: dict[str, Any] = {}
    for model in networks:
        net = read_network(zoo.resolve(model))
        if not net.convs():
            raise DlasError(f"{model} has no Conv layer to measure")
        name = model.removeprefix(zoo.ZOO_PREFIX) if model.startswith(zoo.ZOO_PREFIX) \
            else _Path(model).stem
        configs = network_configs(model, list(compressions), ratio, True, net=net)
        plans[name] = {
            "layers": [(c.index, c.name, c.spec.to_spec()) for c in net.convs()],
            "configs": {label: [(lc.index, lc.name, lc.spec.to_spec(), lc.compression.value,
                                 lc.ratio) for lc in layers]
                        for label, layers in configs.items()}}
        for layers in configs.values():
            for lc in layers:
                for alg in algorithms:
                    knob_sets: list[tuple] = [()]
                    if acc16 and lc.compression is Compression.FLOAT16:
                        knob_sets.append((("acc_bits", 16),))
                    for knobs in knob_sets:
                        v = Variant(alg, lc.compression, lc.ratio, tuning or Tuning.UNTUNED,
                                    knobs)
                        t = GpuTask.make(lc.spec, v, device)
                        tasks.setdefault(t.key, t)
    return list(tasks.values()), plans


def save_plans(out: Path, plans: dict[str, Any]) -> None:
    """Merge the networks' layers and configurations into the bundle's ``networks.json``."""
    path = out / "networks.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    old.update(plans)
    path.write_text(json.dumps(old) + "\n")


def import_plans(bundle: Path, store) -> int:
    """File the bundle's networks' layers and configurations in ``store``; returns how
    many networks."""
    path = bundle / "networks.json"
    if not path.is_file():
        return 0
    plans = json.loads(path.read_text())
    for name, plan in plans.items():
        store.add_network_layers(name, [tuple(x) for x in plan["layers"]])
        for label, layers in plan["configs"].items():
            store.add_network_config(name, label, [tuple(x) for x in layers])
    return len(plans)
