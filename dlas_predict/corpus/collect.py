"""Collection: plan the kernels and whole networks of a set of networks, hand them to a
runner, and keep what comes back in the store. Resumable: a key already stored is skipped.

Runners are the TVM backend's (:mod:`dlas_predict.measure`); this module only needs their
batch interface: ``runner.run(tasks)`` yields one record per task, a failure being a record
with ``error``, and ``runner.protocol`` says how the records were timed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol as _Protocol

from dlas_predict.compression.netplan import LayerConfig
from dlas_predict.measure.networks.plans import NetworkMeasurement, NetworkPlan
from dlas_predict.measure.records import MeasureResult
from dlas_predict.corpus.store import CorpusStore, kernel_config
from dlas_predict.errors import DlasError, param
from dlas_predict.space.config import Algorithm, Compression, Tuning
from dlas_predict.space.devices import Device

if TYPE_CHECKING:
    from dlas_predict.measure.execution.runner import MeasureTask, TuningOptions
    from dlas_predict.networks.graph import Network


class Runner(_Protocol):
    """What collection needs of a runner: a batch call and the timing protocol it used."""

    protocol: Any

    def run(self, tasks: Iterable[Any]) -> Iterator[Any]:
        ...


@dataclass
class CollectSummary:
    """What a kernel collection did."""

    planned: int = 0
    skipped: int = 0
    measured: int = 0
    failed: int = 0
    #: timed on a slow machine, even after waiting (chain probe or canary; see
    #: :mod:`dlas_predict.measure.execution.contention`)
    contended: int = 0
    #: ``retime_slow``: records timed again that replaced a slower-machine timing, and those
    #: whose new timing was no quieter (the stored one is kept; it stays counted contended)
    retimed: int = 0
    kept: int = 0
    seconds: float = 0.0
    results: list[MeasureResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"planned": self.planned, "skipped": self.skipped, "measured": self.measured,
                "failed": self.failed, "contended": self.contended,
                "retimed": self.retimed, "kept": self.kept,
                "seconds": round(self.seconds, 2)}


@dataclass
class NetworkCollectSummary:
    """What a whole-network collection did: the records committed, and (retiming) the slow
    records timed again that replaced the stored one (``retimed``) or kept it (``kept``)."""

    records: list[NetworkMeasurement] = field(default_factory=list)
    retimed: int = 0
    kept: int = 0

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if r.error is not None)


def collect_kernels(tasks: list["MeasureTask"], store: CorpusStore | None, runner: Runner,
                    retry_failures: bool = False,
                    on_result: Callable[[MeasureResult], None] | None = None,
                    progress: bool = True, desc: str = "measuring",
                    retime_slow: bool = False, retime_unprobed: bool = False,
                    log: Callable[[str], None] | None = None) -> CollectSummary:
    """Measure the tasks not yet in ``store``; commit each record as it arrives.

    With ``retime_slow`` the tasks whose stored record was timed on a slow machine (see
    :meth:`CorpusStore.slow_keys`) are timed again; the new record replaces the stored one
    when it was timed on a quieter machine (lower slowness), else the stored one is kept.
    ``retime_unprobed`` does the same for records timed before the probes were recorded, too
    (replaced only by a timing on a quiet machine).
    Without a store every task is measured and nothing is recorded (``measure``). The
    progress shows as a bar on a terminal (``progress``), else as one ``log`` line per kernel.
    """
    t0 = time.perf_counter()
    done = store.keys(include_failures=not retry_failures) if store is not None else set()
    slow = (store.slow_keys(runner.protocol, unprobed=retime_unprobed)
            if store is not None and (retime_slow or retime_unprobed) else {})
    todo = [t for t in tasks if t.key not in done or t.key in slow]
    summary = CollectSummary(planned=len(tasks), skipped=len(tasks) - len(todo))
    from dlas_predict.render import progress_bar

    bar = progress_bar(len(todo), desc, "kernel", progress)
    try:
        for result in runner.run(todo):
            summary.measured += 1
            if result.key in slow:
                if result.quieter_than(slow[result.key], runner.protocol):
                    store.add(result, replace=True)
                    summary.retimed += 1
                    summary.contended += int(result.contended(runner.protocol))
                else:
                    summary.kept += 1
                    summary.contended += 1
            else:
                if store is not None:
                    store.add(result, replace_failure=True)
                summary.failed += int(not result.ok)
                summary.contended += int(result.contended(runner.protocol))
            summary.results.append(result)
            if on_result is not None:
                on_result(result)
            ms = "FAIL" if not result.ok else "%.3f ms" % (result.median_s * 1e3)
            what = f"{result.variant.algorithm.value}/{result.variant.compression.value} {ms}"
            if bar is not None:
                bar.set_postfix_str(what)
                bar.update(1)
            elif log is not None and progress:
                log(f"{desc} [{summary.measured}/{len(todo)}] "
                    f"{time.perf_counter() - t0:5.0f} s {result.conv.to_spec()} {what}")
    finally:
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - t0
    return summary


def collect_networks(plans: list[NetworkPlan], store: CorpusStore | None, runner: Runner,
                     device: Device, skip_stored: bool = True, retime_slow: bool = False,
                     retime_unprobed: bool = False,
                     log: Callable[[str], None] | None = None) -> NetworkCollectSummary:
    """Measure each whole-network plan (skipping keys already stored), committing each record.

    With ``retime_slow`` a stored record timed on a slow machine is timed again and replaced
    when the new timing was quieter (counted in ``retimed``); otherwise the stored one is kept
    (counted in ``kept``, and not returned). ``retime_unprobed`` also times again the records
    timed before the probes were recorded."""
    done: set[str] = set()
    slow: dict[str, float] = {}
    if store is not None and skip_stored:
        done = {r["key"] for r in store.network_measurements("error IS NULL")}
    if store is not None and (retime_slow or retime_unprobed):
        slow = store.slow_keys(runner.protocol, "network_measurements",
                               unprobed=retime_unprobed)
    # by key: a farm answers as its boards finish, not in plan order
    todo = {k: (i, p) for i, p in enumerate(plans, 1)
            if (k := p.key(device)) not in done or k in slow}
    out = NetworkCollectSummary()
    for rec in runner.run([p for _, p in todo.values()]):
        key = rec.key
        i, plan = todo[key]
        where = f"[{i}/{len(plans)}] {plan.network} {plan.config} {plan.algorithm}"
        if key in slow and not rec.quieter_than(slow[key], runner.protocol):
            out.kept += 1
            if log:
                log(f"{where}: timed again, no quieter; the stored record is kept")
            continue
        out.retimed += int(key in slow)
        if store is not None:
            store.add_network(rec, replace=key in slow)
        if log:
            what = (f"{rec.median_s * 1e3:.2f} ms (compile {rec.compile_s:.1f} s, "
                    f"verified={rec.verified})" if rec.error is None
                    else f"FAILED: {rec.error[:200]}")
            log(f"{where}: {what}")
        out.records.append(rec)
    return out


# ---- planning a collection --------------------------------------------------------------
@dataclass
class NetworkToCollect:
    """A network of a collection: where it comes from, its graph, and its conv layers under
    each compression (keyed by configuration label)."""

    model: str
    name: str
    net: "Network"
    configs: dict[str, list[LayerConfig]]


#: The calibration networks, shared by `calibrate` and `collect --calibration-set`: plain
#: 3×3 convs, residual blocks, pointwise and depthwise layers (the demo CNN, a ResNet and a
#: MobileNet of the zoo).
CALIBRATION_NETWORKS = ("demo", "zoo:resnet18-cifar", "zoo:mobilenetv2-cifar")
#: `collect --calibration-set`'s networks: the calibration networks and two more of the
#: zoo (pointwise and depthwise stacks, plain 3×3 stacks), five, as many as an onnxruntime
#: model needs to be fitted.
CALIBRATION_SET = CALIBRATION_NETWORKS + ("zoo:mobilenetv1-cifar", "zoo:vgg16-cifar")
#: `collect --calibration-set`'s timing protocol: fewer runs than a corpus's default (150
#: runs, 3 s a kernel), so that a new machine's kernels and whole networks take minutes.
CALIBRATION_REPEATS, CALIBRATION_BUDGET_S = 30, 0.5


def calibration_networks(networks: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """The named networks, or :data:`CALIBRATION_NETWORKS` (``demo``: the shipped demo
    CNN's file)."""
    from dlas_predict.paths import DEMO_NETWORK

    return [str(DEMO_NETWORK) if n == "demo" else n
            for n in (networks or CALIBRATION_NETWORKS)]


def plan_networks(models: list[str], compressions: list[Compression], ratio: float,
                  per_layer: bool = True) -> list[NetworkToCollect]:
    """Read each network and plan its compressed configurations; bad networks raise."""
    from dlas_predict.compression.netplan import network_configs
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network

    out = []
    for model in models:
        net = read_network(zoo.resolve(model))
        if not net.convs():
            raise DlasError(f"{model} has no Conv layer to measure")
        net.one_input(str(model))
        if net.batch != 1:
            raise DlasError(f"{model} has batch {net.batch}; kernels are measured at batch 1 "
                            "(the study's protocol): generate the network with batch=1")
        name = (str(model).removeprefix(zoo.ZOO_PREFIX) if str(model).startswith(zoo.ZOO_PREFIX)
                else Path(model).stem)
        out.append(NetworkToCollect(str(model), name, net, network_configs(
            str(model), compressions, ratio, per_layer, net=net)))
    return out


def kernel_tasks(networks: list[NetworkToCollect], algorithms: list[Algorithm],
                 tunings: list[Tuning], device: Device,
                 tuning: "TuningOptions | None" = None) -> list["MeasureTask"]:
    """One task per unique (layer workload, variant) of the networks, in network order;
    Winograd's where it applies (:func:`~dlas_predict.space.config.winograd_skip`), untuned."""
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.config import Variant, winograd_skip

    from dlas_predict.compression.netplan import layer_kernel

    tasks: dict[str, MeasureTask] = {}
    for n in networks:
        for layers in n.configs.values():
            for lc in layers:
                comp, r = layer_kernel(lc.compression, lc.ratio)
                for tn in tunings:
                    for alg in algorithms:
                        if alg is Algorithm.WINOGRAD and \
                                winograd_skip(lc.spec, comp, device.kind, tn) is not None:
                            continue
                        t = MeasureTask.make(lc.spec, Variant(alg, comp, r, tn),
                                             device, tuning=tuning)
                        tasks.setdefault(t.key, t)
    return list(tasks.values())


def winograd_skips(networks: list[NetworkToCollect], tunings: list[Tuning],
                   device: Device) -> dict[str, int]:
    """Why Winograd is not measured on the networks' other layer kernels: each reason
    (:func:`~dlas_predict.space.config.winograd_skip`) and how many (layer workload,
    compression, tuning) kernels it leaves out."""
    from dlas_predict.compression.netplan import layer_kernel
    from dlas_predict.space.config import winograd_skip

    kernels = {(lc.spec, layer_kernel(lc.compression, lc.ratio)[0], tn)
               for n in networks for layers in n.configs.values() for lc in layers
               for tn in tunings}
    out: dict[str, int] = {}
    for spec, comp, tn in kernels:
        why = winograd_skip(spec, comp, device.kind, tn)
        if why is not None:
            out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def unmeasured_kernels(tasks: list["MeasureTask"], store: CorpusStore,
                       device: Device) -> list["MeasureTask"]:
    """The tasks whose kernel configuration (:func:`~dlas_predict.corpus.store.kernel_config`)
    the store holds no successful record of on ``device`` (this machine), at any kernels
    version."""
    held = {kernel_config(r) for r in store.rows("error IS NULL")}
    return [t for t in tasks
            if kernel_config({"device": device.name, "fingerprint": device.fingerprint,
                              "conv": t.spec.to_spec(), "algorithm": t.variant.algorithm.value,
                              "compression": t.variant.compression.value,
                              "ratio": t.variant.ratio, "tuning": t.variant.tuning.value})
            not in held]


def register_networks(store: CorpusStore, networks: list[NetworkToCollect]) -> None:
    """Write each network's conv layers and its configurations' layer ratios to the store."""
    for n in networks:
        store.add_network_layers(n.name, [(c.index, c.name, c.spec.to_spec())
                                          for c in n.net.convs()])
        for label, layers in n.configs.items():
            store.add_network_config(n.name, label, [(l.index, l.name, l.spec.to_spec(),
                                                      l.compression.value, l.ratio)
                                                     for l in layers])


def whole_network_plans(networks: list[NetworkToCollect], algorithms: list[Algorithm],
                        ratio: float, store: CorpusStore, device: Device,
                        backends: tuple[str, ...] = ("tvm",)) -> list[NetworkPlan]:
    """Every (configuration, algorithm) of each network, plus the measured per-layer oracle:
    each layer on its fastest measured kernel (any algorithm; for a pruned layer, CSR or
    dense), when the store holds every layer's kernels and they do not all agree: the
    ``tvm`` backend's plans. The ``onnxruntime`` backend's: each configuration run by it."""
    from dlas_predict.corpus.kernels import kernel_key, modelled_seconds, preferred_records
    from dlas_predict.compression.netplan import layer_kernel, layer_sparse
    from dlas_predict.measure.networks.plans import PER_LAYER, onnxruntime_plan, uniform_plan

    latency = {k: modelled_seconds(r) for k, r in preferred_records(
        store.current_rows("error IS NULL AND device = ?", (device.name,)), device).items()}
    todo = []
    for n in networks:
        for label, layers in n.configs.items():
            comp = layers[0].compression
            r = ratio if label.endswith(f"@{ratio:g}") else None
            if "onnxruntime" in backends:
                todo.append(onnxruntime_plan(n.model, n.name, comp, r))
            if "tvm" not in backends:
                continue
            ratios = [lc.ratio for lc in layers]
            for alg in algorithms:  # (Winograd: in per-layer plans only, where it applies)
                if alg is not Algorithm.WINOGRAD:
                    todo.append(uniform_plan(n.model, n.name, comp, r, alg.value, len(layers),
                                             ratios))
            plan = []
            for lc in layers:
                sparse = layer_sparse(comp, lc.ratio)
                kcomp, kratio = layer_kernel(comp, lc.ratio)
                opts = [(a.value, sparse, latency.get(kernel_key(
                    lc.spec.to_spec(), a.value, kcomp.value, kratio))) for a in algorithms]
                if sparse:
                    opts += [(a.value, False, latency.get(kernel_key(
                        lc.spec.to_spec(), a.value, "dense", 0.0))) for a in algorithms]
                opts = [o for o in opts if o[2] is not None]
                if not opts:
                    break
                best = min(opts, key=lambda o: o[2])
                plan.append((best[0], best[1]))
            if len(plan) == len(layers) and len(set(plan)) > 1:
                todo.append(NetworkPlan(n.model, n.name, comp, r, PER_LAYER, tuple(plan)))
    return todo


def uncarried(plans: list[NetworkPlan], networks: list[NetworkToCollect], store: CorpusStore,
              device: Device) -> list[NetworkPlan]:
    """The plans less those whose build the store holds a record of from a carried engine
    (:data:`~dlas_predict.measure.networks.plans.CARRIED_VERSIONS`) that today's engine builds the
    same way (:func:`~dlas_predict.measure.networks.plans.rebuilt_since`): after an engine change,
    a collection times only the builds the change altered."""
    from dlas_predict.measure.networks.plans import ONNXRUNTIME, CARRIED_VERSIONS, rebuilt_since
    from dlas_predict.corpus.kernels import untuned_simd
    from dlas_predict.networks.summary import NetworkSummary

    held = {r["key"] for r in store.network_measurements("error IS NULL")}
    convs = {(n.name, label): [lc.spec for lc in layers]
             for n in networks for label, layers in n.configs.items()}
    summaries = {n.name: asdict(NetworkSummary.of(n.net)) for n in networks}
    simd = untuned_simd(device)

    def carried(p: NetworkPlan) -> bool:
        if p.algorithm == ONNXRUNTIME or p.key(device) in held:
            return False
        return any(p.key(device, v) in held
                   and not rebuilt_since(v, p.layers, convs[(p.network, p.config)], simd,
                                         summaries[p.network], p.dtype, device.vnni)
                   for v in CARRIED_VERSIONS)

    return [p for p in plans if not carried(p)]


@dataclass
class CollectReport:
    """The outcome of :func:`collect`: the kernel summary and the whole-network counts."""

    store: str
    kernels: CollectSummary
    networks: int
    unique_workloads: int
    records: int
    failures_in_store: int
    network_measurements: int
    network_failures: int = 0
    network_contended: int = 0
    network_retimed: int = 0
    network_kept: int = 0
    #: why Winograd was not built on the other layer kernels, and how many each reason
    winograd_skipped: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.kernels.failed or self.network_failures)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("kernels")
        d.pop("networks")
        d.pop("unique_workloads")
        return {**self.kernels.to_dict(), **d}


def collect(models: list[str], store_path: Path, device: Device, kernel_runner: Runner,
            algorithms: list[Algorithm], compressions: list[Compression], ratio: float,
            tunings: list[Tuning], tuning: "TuningOptions | None" = None,
            per_layer: bool = True, retry_failures: bool = False, retime_slow: bool = False,
            retime_unprobed: bool = False,
            network_runner: Callable[[], Any] | None = None,
            backends: tuple[str, ...] = ("tvm",), kernels: bool = True,
            progress: bool = True, log: Callable[[str], None] | None = None) -> CollectReport:
    """Measure the grid over every unique conv layer of ``models`` into ``store_path``, and,
    given a ``network_runner`` factory, every whole-network configuration too, built by
    each of ``backends`` (``tvm``: our kernels; ``onnxruntime``; without ``tvm`` no kernel
    is measured). ``kernels=False`` measures the whole networks, and only the kernels the
    store holds under no kernels version (so every layer of a build has a kernel timing):
    each per-layer plan then reads the kernels the store holds, whatever engine timed them."""
    if not kernels and network_runner is None:
        raise DlasError(f"measuring no kernel needs the whole networks "
                        f"({param('whole_network')})")
    networks = plan_networks(models, compressions, ratio, per_layer)
    tasks = (kernel_tasks(networks, algorithms, tunings, device, tuning)
             if "tvm" in backends else [])
    n_specs = len({t.spec for t in tasks})
    skips = (winograd_skips(networks, tunings, device)
             if Algorithm.WINOGRAD in algorithms and "tvm" in backends else {})
    if log:
        log(f"{len(networks)} network(s), {n_specs} unique conv workloads, {len(tasks)} "
            f"kernels (algorithm × compression × layer sparsity) on {device.name}"
            + ("" if kernels else "; builds only: only kernels with no timing of any "
               "engine are measured"))
        for why, count in skips.items():
            log(f"winograd: not built on {count} layer kernels: {why}")
    with CorpusStore(store_path) as db:
        if not kernels:
            tasks = unmeasured_kernels(tasks, db, device)
        register_networks(db, networks)
        summary = collect_kernels(tasks, db, kernel_runner, retry_failures=retry_failures,
                                  progress=progress, retime_slow=retime_slow,
                                  retime_unprobed=retime_unprobed, log=log)
        whole = NetworkCollectSummary()
        contended = 0
        if network_runner is not None:
            plans = uncarried(whole_network_plans(networks, algorithms, ratio, db, device,
                                                  backends), networks, db, device)
            with network_runner() as nr:
                whole = collect_networks(plans, db, nr, device, retime_slow=retime_slow,
                                         retime_unprobed=retime_unprobed, log=log)
                contended = sum(1 for r in whole.records if r.contended(nr.protocol))
            contended += whole.kept
        stats = db.stats()
    return CollectReport(
        store=str(store_path), kernels=summary, networks=len(networks),
        unique_workloads=n_specs, records=stats.records,
        failures_in_store=stats.failures, network_measurements=stats.network_measurements,
        network_failures=whole.failed, network_contended=contended,
        network_retimed=whole.retimed, network_kept=whole.kept, winograd_skipped=skips)
