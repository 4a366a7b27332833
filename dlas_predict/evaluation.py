"""Training data from a corpus, and leave-one-network-out evaluation of the cost models.

A *configuration* of a network is one compression (pruned at one global ratio) with one
convolution algorithm for every layer, the study's unit. Its latency here is the sum of its
conv kernels' measured medians — **conv layers only**: whole-network latencies (non-conv
ops, traffic between layers) come with the whole-network build, and are not in this sum.

Leave-one-network-out: for each network, the models are trained on every kernel that the
network does not use (a workload shared with another network is held out too), and predict
the held-out network's kernels and configurations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Algorithm
from .costmodel import (LayerCostModel, MacsLinearBaseline, RooflineBaseline, kendall_tau,
                        mape, regret, top1_hit, within)
from .devices import Device, get_device
from .errors import DlasError
from .features import config_from_row, features

MODELS = ("lightgbm", "roofline", "macs_linear")


def kernel_key(conv: str, algorithm: str, compression: str, ratio: float,
               tuning: str = "untuned") -> tuple:
    return (conv, algorithm, compression, round(float(ratio or 0.0), 2), tuning)


@dataclass
class Corpus:
    """The successful measurements of one device, as features and targets."""

    device: Device
    keys: list[tuple]
    X: np.ndarray
    seconds: np.ndarray
    configs: list[dict] = field(default_factory=list)  # network_configs rows
    fingerprint: str = ""

    def index(self) -> dict[tuple, int]:
        return {k: i for i, k in enumerate(self.keys)}


def load_corpus(store: Path, device: str = "local") -> Corpus:
    """Read every verified, successful measurement of ``device`` from a corpus store."""
    import hashlib

    from .store import CorpusStore

    dev = get_device(device)
    keys, rows_x, secs = [], [], []
    with CorpusStore(store, must_exist=True) as db:
        rows = [r for r in db.rows("error IS NULL AND device = ?", (dev.name,))
                if r["verified"] in (1, True, None)]
        configs = db.network_configs()
    seen: dict[tuple, int] = {}
    for r in rows:
        k = kernel_key(r["conv"], r["algorithm"], r["compression"], r["ratio"], r["tuning"])
        if k in seen:  # a repeat measurement (another fingerprint): keep the newest
            secs[seen[k]] = r["median_s"]
            continue
        seen[k] = len(keys)
        keys.append(k)
        rows_x.append(features(config_from_row(r), dev))
        secs.append(r["median_s"])
    if not keys:
        raise DlasError(f"{store} holds no successful measurement for device {dev.name!r}; "
                        f"collect some with `dlas-predict collect --device {dev.name} "
                        f"--network zoo:resnet18-cifar --store {store}`")
    fp = hashlib.sha256(repr(sorted(zip(keys, secs))).encode()).hexdigest()[:16]
    return Corpus(dev, keys, np.array(rows_x, dtype=np.float64), np.array(secs), configs, fp)


@dataclass(frozen=True)
class NetworkConfig:
    """One configuration of one network and the corpus rows of its conv layers."""

    network: str
    config: str  # e.g. "weight_pruning@0.9"
    algorithm: str
    rows: tuple[int, ...]


def network_configurations(corpus: Corpus, network: str,
                           algorithms=tuple(a.value for a in Algorithm)) -> list[NetworkConfig]:
    """Every configuration of ``network`` whose conv kernels are all measured."""
    index = corpus.index()
    by_config: dict[str, list[dict]] = {}
    for r in corpus.configs:
        if r["network"] == network:
            by_config.setdefault(r["config"], []).append(r)
    out = []
    for label, layers in sorted(by_config.items()):
        for alg in algorithms:
            idx = [index.get(kernel_key(l["conv"], alg, l["compression"], l["ratio"]))
                   for l in layers]
            if all(i is not None for i in idx):
                out.append(NetworkConfig(network, label, alg, tuple(idx)))
    return out


def _fit_all(X: np.ndarray, y: np.ndarray, seed: int = 0) -> dict:
    return {"lightgbm": LayerCostModel(seed=seed).fit(X, y),
            "roofline": RooflineBaseline().fit(X, y),
            "macs_linear": MacsLinearBaseline().fit(X, y)}


def _predict(model, X: np.ndarray) -> np.ndarray:
    out = model.predict(X)
    return out[0] if isinstance(out, tuple) else out


def leave_one_network_out(corpus: Corpus, seed: int = 0) -> dict:
    """Per held-out network and overall, for each model: layer MAPE, and over the network's
    configurations (conv-layer sums) MAPE, share within ±10 %, Kendall τ, top-1 hit and
    regret."""
    networks = sorted({r["network"] for r in corpus.configs})
    if len(networks) < 2:
        raise DlasError("leave-one-network-out needs configurations of at least two networks "
                        "in the corpus (collect more networks)")
    per_net: dict[str, dict] = {}
    pooled = {m: {"cfg_pred": [], "cfg_true": [], "layer_pred": [], "layer_true": []}
              for m in MODELS}
    for net in networks:
        cfgs = network_configurations(corpus, net)
        if len(cfgs) < 2:
            continue
        used = sorted({i for c in cfgs for i in c.rows})
        train = np.setdiff1d(np.arange(len(corpus.keys)), used)
        if len(train) < 10:
            continue
        models = _fit_all(corpus.X[train], corpus.seconds[train], seed)
        per_net[net] = {"configurations": len(cfgs), "kernels_held_out": len(used),
                        "kernels_trained": int(len(train))}
        for name, model in models.items():
            pred = _predict(model, corpus.X[used])
            lookup = dict(zip(used, pred))
            p = np.array([sum(lookup[i] for i in c.rows) for c in cfgs])
            t = np.array([sum(corpus.seconds[i] for i in c.rows) for c in cfgs])
            per_net[net][name] = {
                "layer_mape": mape(pred, corpus.seconds[used]), "mape": mape(p, t),
                "within_10pct": within(p, t), "kendall_tau": kendall_tau(p, t),
                "top1_hit": top1_hit(p, t), "regret": regret(p, t)}
            pooled[name]["cfg_pred"] += list(p)
            pooled[name]["cfg_true"] += list(t)
            pooled[name]["layer_pred"] += list(pred)
            pooled[name]["layer_true"] += list(corpus.seconds[used])
    if not per_net:
        raise DlasError("no network has two fully measured configurations to evaluate")
    overall = {}
    for name in MODELS:
        p, t = np.array(pooled[name]["cfg_pred"]), np.array(pooled[name]["cfg_true"])
        lp, lt = np.array(pooled[name]["layer_pred"]), np.array(pooled[name]["layer_true"])
        nets = [v[name] for v in per_net.values()]
        overall[name] = {
            "layer_mape": mape(lp, lt), "mape": mape(p, t), "within_10pct": within(p, t),
            "kendall_tau": float(np.nanmean([n["kendall_tau"] for n in nets])),
            "top1_hit": float(np.mean([n["top1_hit"] for n in nets])),
            "regret": float(np.mean([n["regret"] for n in nets]))}
    return {"device": corpus.device.name, "scope": "conv layers only (sum of kernels)",
            "networks": per_net, "overall": overall}
