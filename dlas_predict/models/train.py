"""Training: the cost models of one device from a corpus store.

The layer model (LightGBM with an 80 % interval) from the kernel measurements; the network
residual model from the whole-network measurements, when the store has them; the tuning-time
model from the tuned records, when there are at least three. Each is saved beside the others
in the device's model directory with its metadata (device, roofs, corpus fingerprint, metrics).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dlas_predict.corpus.store import CorpusStore
from dlas_predict.space.devices import Device

#: Fewest tuned records a tuning-time model is fitted on.
MIN_TUNED_RECORDS = 3


@dataclass
class TrainReport:
    """What :func:`train` fitted and where it saved it. The metrics are fits on the training
    data, not held-out figures (those are :mod:`dlas_predict.models.evaluation`'s)."""

    device: str
    model: str
    kernels: int
    mape: float
    within_10pct: float
    interval_coverage: float
    train_seconds: float
    whole_networks: int = 0
    networks: int = 0
    network_model: str | None = None
    tuning_model: str | None = None
    tuned_records: int | None = None
    tuning_hours: float | None = None
    tuning_mape: float | None = None
    onnxruntime_model: str | None = None
    onnxruntime_records: int | None = None
    #: leave-one-network-out figures of the onnxruntime model, by mode
    onnxruntime_lono: dict | None = None
    #: why the store's onnxruntime runs fitted no onnxruntime model (too few networks)
    onnxruntime_skipped: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("device")
        d.pop("networks")
        d.pop("tuning_hours")
        d.pop("tuning_mape")
        return {k: v for k, v in d.items() if v is not None}


def default_model_dir(name: str, fingerprint: str | None) -> Path:
    """Where ``train`` saves the models of ``name`` measured on the machine ``fingerprint``
    by default: that machine's folder (:func:`~dlas_predict.paths.machine_model_dir`), or,
    where ``models_store/NAME`` holds another machine's models, a folder of its own under
    ``models_store/machines/`` (a new CPU never overwrites them)."""
    from dlas_predict.models.costmodel import ModelError, read_sidecar
    from dlas_predict.paths import MACHINES, MODELS_STORE, machine_model_dir

    directory = machine_model_dir(name, fingerprint)
    if not fingerprint or directory != MODELS_STORE / name:
        return directory
    try:
        trained_on = read_sidecar(directory, "layer", "cost model", "")[1].get(
            "device_fingerprint")
    except (ModelError, OSError, AttributeError):
        trained_on = None
    if trained_on and trained_on != fingerprint:
        return MODELS_STORE / MACHINES / fingerprint / name
    return directory


def train(store: Path, device: str = "local", out: Path | None = None,
          seed: int = 0, only_onnxruntime: bool = False) -> TrainReport:
    """Fit and save the device's cost models from ``store`` into ``out`` (default: the shipped
    model directory of the device). A store of onnxruntime measurements alone, or
    ``only_onnxruntime``, trains the onnxruntime model alone."""
    import numpy as np

    with CorpusStore(store, must_exist=True) as db:
        has_kernels = next(db.rows("device = ? AND error IS NULL", (device,)), None) is not None
    if only_onnxruntime or not has_kernels:
        from dlas_predict.space.devices import corpus_device, get_device

        # the machine that ran onnxruntime, which need not be this one: its folder, its block
        prints = onnxruntime_fingerprints(store, device)
        dev = (corpus_device(device, prints[0]) if prints
               else get_device(device, with_target=False))
        directory = out or default_model_dir(dev.name, dev.fingerprint)
        ort = train_onnxruntime(store, dev, directory, {"device": dev.name})
        if ort is None and only_onnxruntime:
            from dlas_predict.errors import DlasError

            raise DlasError(f"{store} holds no onnxruntime measurement of {device}: collect "
                            "some with `dlas-predict collect --whole-network --backends "
                            "onnxruntime`")
        if ort is not None:  # (a store with neither gets the kernel corpus's error below)
            empty = TrainReport(device=dev.name, model="", kernels=0, mape=0.0,
                                within_10pct=0.0, interval_coverage=0.0, train_seconds=0.0)
            return _with_onnxruntime(empty, ort, directory)

    from dlas_predict.models.costmodel import LayerCostModel, mape, within
    from dlas_predict.models.evaluation import (load_corpus, measured_layer_seconds,
                                                whole_features, whole_rows, whole_terms)
    from dlas_predict.models.netmodel import (MATRIX_NETWORK, MIN_MATRIX_NETWORKS,
                                              NetworkCostModel, NetworkInputs,
                                              last_level_cache_bytes)

    corpus = load_corpus(store, device)
    t0 = time.time()
    meta = {"device": corpus.device.name, "device_fingerprint": corpus.device.fingerprint,
            "device_roofs": {"peak_gflops": corpus.device.peak_gflops,
                             "mem_bandwidth_gbs": corpus.device.mem_bandwidth_gbs,
                             "source": corpus.device.source},
            "corpus": str(store), "corpus_fingerprint": corpus.fingerprint,
            "tuned_kernels": sum(1 for k in corpus.keys if k.tuning == "tuned")}
    learned = corpus.learned()
    meta["other_schedule_kernels"] = int(len(corpus.keys) - len(learned))
    X, seconds = corpus.X[learned], corpus.seconds[learned]
    # what a per-layer plan may choose from the layer model: Winograd once it learned some
    algorithms = sorted({corpus.keys[i].algorithm for i in learned})
    model = LayerCostModel(seed=seed, about={**meta, "algorithms": algorithms}).fit(X, seconds)
    pred = model.predict(X)
    low, high = model.predict_interval(X)
    model.meta_["train_metrics"] = {
        "mape": mape(pred, seconds), "within_10pct": within(pred, seconds),
        "interval_coverage": float(np.mean((seconds >= low) & (seconds <= high)))}
    model.meta_["train_seconds"] = round(time.time() - t0, 2)
    directory = out or default_model_dir(corpus.device.name, corpus.device.fingerprint)
    sidecar = model.save(directory)
    report = TrainReport(device=corpus.device.name, model=str(sidecar),
                         kernels=len(corpus.keys), **model.meta_["train_metrics"],
                         train_seconds=model.meta_["train_seconds"])
    rows = whole_rows(corpus, store)
    # matrix networks (MLPs, transformers) have a network model of their own, learned from
    # every network (the ops between their layers, attention, LayerNorm and transposes, are
    # not a CNN's; what the rest shares with CNNs it learns from them too); the CNNs' model
    # learns from CNNs alone
    matrix_nets = {r.network for r in rows if r.matrix}
    for name, family in (("network", [r for r in rows if not r.matrix]),
                         (MATRIX_NETWORK, rows)):
        if not family or name == MATRIX_NETWORK and len(matrix_nets) < MIN_MATRIX_NETWORKS:
            if name == MATRIX_NETWORK:
                for stale in Path(directory).glob(f"{MATRIX_NETWORK}.*"):
                    stale.unlink()
            continue
        truth = np.array([r.seconds for r in family])
        layer_s = measured_layer_seconds(corpus, family)
        T = whole_terms(corpus, family, layer_s)
        F = whole_features(family, np.array([s.sum() for s in layer_s]), corpus.device)
        conv = np.array([s.sum() for s in layer_s])
        net = NetworkCostModel(
            name=name, cache_bytes=last_level_cache_bytes(corpus.device), seed=seed,
            about={**meta, "networks": sorted({r.network for r in family})}).fit(
            NetworkInputs.point(T, conv, F), truth, groups=[r.network for r in family])
        net.save(directory)
        if name == "network":
            report.network_model = str(directory / "network.json")
    if rows:
        report.whole_networks = len(rows)
        report.networks = len({r.network for r in rows})
    tuning = train_tuning_time(store, corpus.device, directory, meta)
    if tuning is not None:
        report.tuning_model = str(directory / "tuning.json")
        report.tuned_records = tuning.meta_["n_train"]
        report.tuning_hours = tuning.meta_["total_tuning_hours"]
        report.tuning_mape = tuning.meta_["train_mape"]
    from dlas_predict.models.costmodel import ModelError

    try:
        ort = train_onnxruntime(store, corpus.device, directory, meta)
    except ModelError as exc:  # the kernels' models stand; onnxruntime's says why not
        report.onnxruntime_skipped = str(exc)
        return report
    return _with_onnxruntime(report, ort, directory) if ort is not None else report


def _with_onnxruntime(report: TrainReport, ort, directory: Path) -> TrainReport:
    from dlas_predict.models.ortmodel import FILE

    report.onnxruntime_model = str(Path(directory) / FILE)
    report.onnxruntime_records = ort.meta_["n_train"]
    report.onnxruntime_lono = ort.meta_["lono"]
    return report


def onnxruntime_fingerprints(store: Path, device: str) -> list[str]:
    """The machine fingerprints ``device``'s onnxruntime records in ``store`` carry, the most
    common first."""
    from collections import Counter

    with CorpusStore(store, must_exist=True) as db:
        prints = Counter(r["fingerprint"] for r in db.network_measurements(
            "algorithm = 'onnxruntime' AND device = ?", (device,)))
    return [fp for fp, _ in prints.most_common()]


def train_onnxruntime(store: Path, dev: Device, directory: Path, meta: dict):
    """Fit and save the onnxruntime latency model when the store has onnxruntime records of
    ``dev`` (else None; a model already in ``directory`` is kept: it may come from another
    store, as the kernels' models do not time onnxruntime)."""
    from dlas_predict.models.ortmodel import (OrtLatencyModel, l2_capacity, nchwc_block,
                                              training_rows)

    prints = onnxruntime_fingerprints(store, dev.name)
    l2 = l2_capacity(prints[0] if prints else None, dev)
    inputs, y, nets = training_rows(store, dev.name, nchwc_block(dev), l2)
    if not len(y):
        return None
    model = OrtLatencyModel(about={
        **meta, "corpus": str(store), "onnxruntime_fingerprints": sorted(prints),
        "l2_bytes": l2, "cpu_model": dev.cpu_model}).fit(inputs, y, groups=nets)
    model.save(directory)
    return model


def train_tuning_time(store: Path, dev: Device, directory: Path, meta: dict):
    """Fit and save the tuning-time model when the store has tuned records (else None, and a
    stale model in ``directory`` is removed)."""
    import numpy as np

    from dlas_predict.models.costmodel import TuningInputs, TuningTimeModel
    from dlas_predict.models.features import features
    from dlas_predict.corpus.kernels import config_from_row

    with CorpusStore(store, must_exist=True) as db:
        rows = list(db.tuned_rows(dev.name))
    if len(rows) < MIN_TUNED_RECORDS:
        stale = directory / "tuning.json"
        if stale.is_file():
            stale.unlink()
        return None
    X = np.array([features(config_from_row(r), dev) for r in rows])
    budgets = [int(json.loads(r["knobs"]).get("budget") or r["trials"]) for r in rows]
    runs = TuningInputs(X, np.array(budgets), trials=np.array([r["trials"] for r in rows]),
                        tuners=[r["tuner"] for r in rows])
    model = TuningTimeModel(about=meta).fit(runs, np.array([r["tuning_seconds"] for r in rows]))
    model.save(directory)
    return model
