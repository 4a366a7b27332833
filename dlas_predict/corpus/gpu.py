"""GPU bundles in the corpus: the networks a bundle carries, planned from the corpus's
collection (:func:`plan_networks`), and a measured bundle imported back as corpus records
(:func:`import_bundle`: its networks' layers and configurations, its kernels' and networks'
measurements, and its MetaSchedule candidates filed in the tuning database).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import Device
from dlas_predict.errors import DlasError, param
from dlas_predict.measure.records import KNOB_SEARCH, METASCHEDULE, MeasureResult, measurement_key
from dlas_predict.measure.gpu.bundle import (TRACES, GpuTask, file_metaschedule, ran_ok, read_lines,
                                             search_tasks)


def import_results(bundle: Path, results: Path | None, store,
                   device: Device | None = None) -> dict[str, int]:
    """Turn a bundle's build failures and a GPU run's results into corpus records of
    ``store`` (a :class:`dlas_predict.corpus.store.CorpusStore`); records already there are
    skipped, but a stored failure is replaced by a measurement of its key. Returns counts.

    The records are filed under the GPU that measured them: the ``gpu.json`` that
    ``dlas_predict.measure.gpu.run`` writes beside its results names it. A bundle measured on
    another GPU than the one it was built for (``--allow-other-gpu``, same CUDA architecture) is
    filed under ``device``, which must be that GPU's registry entry; every key is made again for
    it."""
    header = json.loads((bundle / "bundle.json").read_text())
    header = {**header, **_measured_on(header, results, device)}
    rows = read_lines(bundle / "build_failures.jsonl") + read_lines(results)
    networks = [r for r in rows if r.get("kind") == "network"]
    rows = [r for r in rows if r.get("kind") != "network"]
    nets_added, nets_failed = _import_networks(networks, header, store)
    rows, incomplete = _searches(bundle, rows, header)
    have, ok = store.keys(), store.keys(include_failures=False)
    added = failed = skipped = 0
    for row in rows:
        rec = _record(row, header)
        # a stored failure gives way to a measurement of its kernel (one whose module
        # NVRTC refused, measured in another bundle); a stored success, or a failure met
        # again, is left
        if rec.key in ok or (rec.error is not None and rec.key in have):
            skipped += 1
            continue
        store.add(rec)
        have.add(rec.key)
        if rec.error is None:
            ok.add(rec.key)
        added += 1
        failed += rec.error is not None
    return {"records": added, "failed": failed, "skipped": skipped,
            "incomplete_searches": incomplete, "networks": nets_added,
            "network_failures": nets_failed}


def _import_networks(rows: list[dict[str, Any]], header: dict[str, Any],
                     store) -> tuple[int, int]:
    """File whole-network rows as network measurements (keys made for the header's device);
    a key already stored as a success is left. Returns (added, failures among them)."""
    from dlas_predict.measure.gpu.networks import network_key, network_record

    added = failed = 0
    refile = header["fingerprint"] != header["built_for"]
    for row in rows:
        if refile:
            row = {**row, "key": network_key(row, header)}
        rec = network_record(row, header)
        if store.add_network(rec):
            added += 1
            failed += rec.error is not None
    return added, failed


def _measured_on(header: dict[str, Any], results: Path | None,
                 device: Device | None) -> dict[str, Any]:
    """The device and fingerprint the results are filed under (see :func:`import_results`),
    and the bundle's own fingerprint as ``built_for``."""
    from dlas_predict.space.devices import gpu_fingerprint

    gpu_file = Path(results).parent / "gpu.json" if results is not None else None
    measured = None
    if gpu_file is not None and gpu_file.is_file():
        gpu = json.loads(gpu_file.read_text())
        measured = gpu.get("fingerprint") or gpu_fingerprint(gpu)
    out = {"built_for": header["fingerprint"], "built_for_device": header["device"]}
    if device is None or device.name == header["device"]:
        if measured is not None and measured != header["fingerprint"]:
            raise DlasError(
                f"the results beside {gpu_file} were measured on {gpu.get('name')} "
                f"(fingerprint {measured}), not on the bundle's {header['device']}: pass "
                f"{param('device')} with the registry device of that GPU")
        return out
    if measured is None:
        raise DlasError(f"no gpu.json beside {results}: which GPU measured them is unknown, so "
                        f"they cannot be filed under {device.name}")
    if measured != device.fingerprint:
        raise DlasError(f"the results were measured on {gpu.get('name')} (fingerprint "
                        f"{measured}); {device.name}'s fingerprint is {device.fingerprint}")
    return {**out, "device": device.name, "fingerprint": device.fingerprint}


def _key(row: dict[str, Any], header: dict[str, Any], tuning: str | None = None,
         knobs: dict[str, int] | None = None, fingerprint: str | None = None,
         device: str | None = None) -> str:
    """A row's measurement key for the header's device (or the device given)."""
    v = Variant(row["algorithm"], row["compression"], float(row["ratio"]),
                tuning or row.get("tuning", "untuned"))
    return measurement_key(device or header["device"], fingerprint or header["fingerprint"],
                           ConvSpec.from_dict(row["conv"]), v,
                           row["knobs"] if knobs is None else knobs,
                           header["kernels_version"])


def _search_key(row: dict[str, Any], header: dict[str, Any]) -> str:
    """The key of the tuned record a candidate belongs to, for the header's device. A row
    without its search's trials has them found from its search key under the bundle's own
    device."""
    from dlas_predict.space.config import Tuning

    if header["fingerprint"] == header["built_for"]:
        return row["search"]
    if row.get("tuner") == METASCHEDULE:
        return _key(row, header, Tuning.TUNED.value, {"trials": row["search_trials"],
                                                      "metaschedule": row["search_round"]})
    if row.get("search_trials"):
        return _key(row, header, Tuning.TUNED.value, {"trials": row["search_trials"]})
    for t in range(2, 257):
        if _key(row, header, Tuning.TUNED.value, {"trials": t}, header["built_for"],
                header["built_for_device"]) == row["search"]:
            return _key(row, header, Tuning.TUNED.value, {"trials": t})
    raise DlasError(f"cannot re-file the knob search {row['search']}: its trials are unknown")


def _untuned_row(cand: dict[str, Any], header: dict[str, Any]) -> dict[str, Any] | None:
    """A knob search's candidate whose knobs are the untuned schedule's (its first one) is
    that untuned kernel, measured: the row of it, or None."""
    from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

    if cand.get("schedule") == METASCHEDULE:
        return None
    knobs = dict(cand["knobs"])
    own = {"acc_bits": knobs["acc_bits"]} if "acc_bits" in knobs else {}
    spec = ConvSpec.from_dict(cand["conv"])
    if knobs != resolve_gpu_knobs(spec, Variant(cand["algorithm"], cand["compression"],
                                                float(cand["ratio"]), knobs=own)):
        return None
    row = {k: v for k, v in cand.items() if k not in ("search", "search_trials")}
    row.update(tuning="untuned", key=_key(cand, header, "untuned"))
    return row


def _searches(bundle: Path, rows: list[dict[str, Any]],
              header: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Rows with the candidates of each finished knob search replaced by one tuned row: the
    fastest verified candidate, with the search's trials and cost (every candidate's build,
    load and GPU time); its untuned candidate also gives the untuned row. A search with a
    candidate not yet measured is left out (counted). Keys are the header device's."""
    planned: dict[str, set[str]] = {}
    for row in read_lines(bundle / "manifest.jsonl") + read_lines(
            bundle / "build_failures.jsonl"):
        if row.get("search"):
            planned.setdefault(row["search"], set()).add(row["key"])
    refile = header["fingerprint"] != header["built_for"]
    plain = [({**r, "key": _key(r, header)} if refile else r)
             for r in rows if not r.get("search")]
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("search"):
            found.setdefault(r["search"], {})[r["key"]] = r
    incomplete = 0
    for search, keys in planned.items():
        got = found.get(search, {})
        if not keys <= set(got):
            incomplete += 1
            continue
        cands = [got[k] for k in sorted(keys)]
        cost = sum(float(c.get("compile_s") or c.get("build_s") or 0.0)
                   + float(c.get("measure_s") or 0.0) + float(c.get("search_s") or 0.0)
                   for c in cands)
        tuner = cands[0].get("tuner", KNOB_SEARCH)
        ok = [c for c in cands if ran_ok(c) and c.get("run_secs")]
        if ok:
            best = min(ok, key=lambda c: statistics.median(c["run_secs"]))
            tuned = dict(best)
        else:
            errors = sorted({str(c.get("error") or "verification failed") for c in cands})
            tuned = {**cands[0], "run_secs": [], "error": f"no candidate of the {tuner} "
                     f"search ran and verified ({len(cands)} tried): {errors[0]}"}
        tuned.update(key=_search_key(cands[0], header), trials=len(cands),
                     tuning_seconds=round(cost, 3), tuner=tuner)
        for name in ("search", "search_trials", "schedule", "search_s", "search_round"):
            tuned.pop(name, None)
        plain.append(tuned)
        plain.extend(u for u in (_untuned_row(c, header) for c in cands) if u is not None)
    return plain, incomplete


def _record(row: dict[str, Any], header: dict[str, Any]) -> MeasureResult:
    variant = Variant(row["algorithm"], row["compression"], float(row["ratio"]),
                      row.get("tuning", "untuned"))
    ok = ran_ok(row)
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
                  device: Device, acc16: bool = True, trials: int = 0,
                  kernel_sizes: tuple[int, ...] = ()) -> tuple[list[GpuTask], dict[str, Any]]:
    """GPU tasks for every conv layer of ``networks`` × algorithm × compression (each pruned
    layer at its own sparsity after global pruning at ``ratio``), and the networks' layers
    and configurations (what :func:`import_results` files in the store). float16 layers are
    measured twice with ``acc16``: accumulating in float32 and in float16; int8 GEMM layers
    twice: plain and packed for ``dp4a`` (every GPU the CUDA kernels support has it).
    With ``trials``, each kernel is a knob search of that many candidates
    (:func:`search_tasks`), tuned. With ``kernel_sizes``, only layers whose R is one."""
    from dlas_predict.corpus.collect import plan_networks as read_networks
    from dlas_predict.space.config import Compression, Tuning

    from dlas_predict.measure.kernels.knobs import dp4a_capable

    nets = read_networks(networks, list(compressions), ratio, True)
    tasks: dict[str, GpuTask] = {}
    for lc in _layers(nets, kernel_sizes):
        for alg in algorithms:
            knob_sets: list[tuple] = [()]
            plain = Variant(alg, lc.compression, lc.ratio)
            if acc16 and lc.compression is Compression.FLOAT16 and not trials:
                knob_sets.append((("acc_bits", 16),))
            if not trials and dp4a_capable(plain):
                knob_sets.append((("dp4a", 1),))
            for knobs in knob_sets:
                v = Variant(alg, lc.compression, lc.ratio, Tuning.UNTUNED, knobs)
                found = (search_tasks(lc.spec, v, device, trials) if trials
                         else [GpuTask.make(lc.spec, v, device)])
                for t in found:
                    tasks.setdefault(t.key, t)
    return list(tasks.values()), network_entries(nets)


def _layers(nets, kernel_sizes: tuple[int, ...] = ()):
    """Every layer of every configuration of planned networks; with ``kernel_sizes``, only
    those whose R is one."""
    for n in nets:
        for layers in n.configs.values():
            for lc in layers:
                if not kernel_sizes or lc.spec.R in kernel_sizes:
                    yield lc


def network_entries(nets) -> dict[str, Any]:
    """The ``networks.json`` entries of planned networks
    (:func:`dlas_predict.corpus.collect.plan_networks`): each one's conv layers and its
    configurations' layers (what :func:`import_plans` files in the store)."""
    return {n.name: {
        "layers": [(c.index, c.name, c.spec.to_spec()) for c in n.net.convs()],
        "configs": {label: [(lc.index, lc.name, lc.spec.to_spec(), lc.compression.value,
                             lc.ratio) for lc in layers]
                    for label, layers in n.configs.items()}} for n in nets}


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


def dense_kernels(networks: list[str], algorithms, compressions, ratio: float,
                  kernel_sizes: tuple[int, ...] = ()) -> list[tuple[ConvSpec, Variant]]:
    """The distinct dense kernels (workload, untuned variant) of ``networks`` × algorithm ×
    compression, CSR kernels left out; with ``kernel_sizes``, only layers whose R is one."""
    from dlas_predict.corpus.collect import plan_networks as read_networks

    out: dict[tuple, tuple[ConvSpec, Variant]] = {}
    for lc in _layers(read_networks(networks, list(compressions), ratio, True), kernel_sizes):
        for alg in algorithms:
            v = Variant(alg, lc.compression, lc.ratio)
            if not v.sparse:
                out.setdefault((lc.spec, alg, lc.compression, lc.ratio), (lc.spec, v))
    return list(out.values())


@dataclass(frozen=True)
class BundleImport:
    """What :func:`import_bundle` filed: the bundle's networks, its records (counts of
    :func:`import_results`), and the MetaSchedule candidates filed in a tuning database."""

    networks: int
    counts: dict[str, int]
    filed: int = 0
    tuning_db: Path | None = None


def import_bundle(bundle: Path, results: Path | None, store: Path,
                  device: Device | None = None, tuning_db: Path | None = None) -> BundleImport:
    """Import a bundle into the corpus store at ``store``: its networks' layers and
    configurations, its build failures and the GPU run's ``results`` (filed under
    ``device`` where given), and, for a MetaSchedule bundle, its measured candidates into
    ``tuning_db`` (:func:`file_metaschedule`)."""
    from dlas_predict.corpus.store import CorpusStore

    if not (bundle / "bundle.json").is_file():
        raise DlasError(f"{bundle} is not a kernel bundle (no bundle.json)")
    if results is not None and not results.is_file():
        raise DlasError(f"no results file {results}")
    if tuning_db is not None and results is None:
        raise DlasError(f"{param('tuning_db')} files measured candidates: give the "
                        f"{param('results')} file")
    with CorpusStore(store) as db:
        nets = import_plans(bundle, db)
        counts = import_results(bundle, results, db, device)
    if results is not None and (bundle / TRACES).is_file():
        filed, tuning_db = file_metaschedule(bundle, results, tuning_db, device)
        return BundleImport(nets, counts, filed, tuning_db)
    return BundleImport(nets, counts)
