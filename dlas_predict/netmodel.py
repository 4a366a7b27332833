"""Network-level cost models: whole-network latency from the layer model plus what the layer
sum misses (non-conv ops, traffic between layers, the int8 quantise/dequantise glue).

- :class:`NetworkCostModel`: predicted whole latency = (sum of the layer model's kernel
  predictions) × exp(residual), the residual learned by LightGBM on measured whole networks
  (target: log(measured whole / measured conv sum)). The interval is the sum of the layer
  model's 10 % and 90 % predictions, times the same residual, widened by the residual's own
  10 %/90 % quantiles.
- :class:`ConfigRanker`: LightGBM ``LGBMRanker`` (lambdarank) over whole configurations, one
  group per network × device; it orders candidates but gives no milliseconds.

Features of a configuration: :data:`NET_FEATURE_NAMES`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import COMPRESSION_KERNEL, Algorithm, Compression, DType
from .costmodel import ModelError, _versions
from .devices import Device
from .network import Network

NET_MODEL_FORMAT = "dlas-network-cost-1"

NET_FEATURE_NAMES = (
    "log_conv_pred", "conv_layers", "layers", "log_nonconv_macs",
    "log_nonconv_bytes", "log_nonconv_bytes_per_conv_s", "activation_ops", "elementwise_ops",
    "log_input_elems", "mean_sparsity", "is_float16", "is_int8", "sparse_share",
    "channel_pattern",
    "share_direct", "share_gemm", "share_spatial_pack", "mixed", "dev_peak_gflops",
    "dev_bandwidth_gbs", "dev_cores",
)
_RESIDUAL_PARAMS = dict(n_estimators=300, learning_rate=0.05, num_leaves=7,
                        min_child_samples=8, subsample=0.9, subsample_freq=1, verbose=-1,
                        n_jobs=2)


@dataclass(frozen=True)
class NetworkSummary:
    """What a network does besides its convolutions."""

    conv_layers: int
    layers: int
    nonconv_macs: int
    nonconv_bytes: int
    activation_ops: int
    elementwise_ops: int
    input_elems: int

    @classmethod
    def of(cls, net: Network) -> "NetworkSummary":
        other = [layer for layer in net.layers if layer.conv is None]
        return cls(conv_layers=len(net.layers) - len(other), layers=len(net.layers),
                   nonconv_macs=sum(layer.macs for layer in other),
                   nonconv_bytes=sum(layer.bytes_moved for layer in other),
                   activation_ops=sum(layer.kind == "activation" for layer in other),
                   elementwise_ops=sum(layer.kind == "elementwise" for layer in other),
                   input_elems=int(np.prod(net.input_shape)))


def net_features(summary: NetworkSummary, conv_s: float, compression: Compression,
                 layers: list[tuple[str, bool]], layer_ratios: list[float],
                 device: Device) -> list[float]:
    """One configuration's feature row (order: :data:`NET_FEATURE_NAMES`). ``conv_s``: the
    sum of its conv kernels, measured when training, predicted when predicting; ``layers``:
    each conv's (algorithm, sparse), so that a per-layer choice is described by the shares of
    its layers on each algorithm and on CSR."""
    _, dtype, pattern = COMPRESSION_KERNEL[compression]
    n = max(len(layers), 1)
    share = {a.value: sum(1 for alg, _ in layers if alg == a.value) / n for a in Algorithm}
    sparse = sum(1 for _, s in layers if s) / n
    mixed = float(len({alg for alg, _ in layers}) > 1 or 0 < sparse < 1)
    sp = [r for (_, s), r in zip(layers, layer_ratios) if s]
    return [
        math.log(conv_s), summary.conv_layers, summary.layers, math.log1p(summary.nonconv_macs),
        math.log1p(summary.nonconv_bytes), math.log1p(summary.nonconv_bytes / conv_s / 1e9),
        summary.activation_ops, summary.elementwise_ops, math.log(summary.input_elems),
        float(np.mean(sp)) if sp else 0.0, float(dtype is DType.FLOAT16),
        float(dtype is DType.INT8), sparse, float(pattern.value == "channel"),
        share[Algorithm.DIRECT.value], share[Algorithm.GEMM.value],
        share[Algorithm.SPATIAL_PACK.value], mixed,
        device.peak_gflops.get("float32") or 0.0, device.mem_bandwidth_gbs or 0.0,
        device.cores,
    ]


@dataclass
class NetworkCostModel:
    """log(whole / conv sum) learned from measured whole networks, with quantiles."""

    seed: int = 0
    models: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def fit(self, X: np.ndarray, whole_s: np.ndarray, conv_sum_s: np.ndarray,
            meta: dict | None = None) -> "NetworkCostModel":
        """``X`` rows built with the *measured* conv sum; the target is the measured ratio."""
        import lightgbm as lgb

        if len(X) < 8:
            raise ModelError(f"too few whole-network measurements to learn the residual "
                             f"({len(X)}); collect some with `dlas-predict collect "
                             "--whole-network`")
        y = np.log(np.asarray(whole_s) / np.asarray(conv_sum_s))
        common = dict(_RESIDUAL_PARAMS, random_state=self.seed)
        self.models = {"median": lgb.LGBMRegressor(objective="regression", **common)
                       .fit(X, y).booster_}
        for q in (0.1, 0.9):
            self.models[f"q{int(q * 100)}"] = lgb.LGBMRegressor(
                objective="quantile", alpha=q, **common).fit(X, y).booster_
        self.meta = {"format": NET_MODEL_FORMAT, "features": list(NET_FEATURE_NAMES),
                     "versions": _versions(), "n_train": int(len(X)), **(meta or {})}
        return self

    def residual(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(median, low, high) multiplicative residuals for each row."""
        if not self.models:
            raise ModelError("the network model is not trained")
        X = np.asarray(X, dtype=np.float64)
        mid = np.exp(self.models["median"].predict(X))
        lo = np.exp(self.models["q10"].predict(X))
        hi = np.exp(self.models["q90"].predict(X))
        return mid, np.minimum(lo, mid), np.maximum(hi, mid)

    def predict(self, X: np.ndarray, conv: np.ndarray, conv_low: np.ndarray,
                conv_high: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Whole-network (median, low, high) seconds from the layer sums and their interval."""
        mid, lo, hi = self.residual(X)
        return conv * mid, np.minimum(conv_low * lo, conv * mid), \
            np.maximum(conv_high * hi, conv * mid)

    def save(self, directory: Path, name: str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for key, booster in self.models.items():
            booster.save_model(str(directory / f"{name}.{key}.txt"))
        sidecar = directory / f"{name}.json"
        sidecar.write_text(json.dumps(self.meta, indent=2, sort_keys=True) + "\n")
        return sidecar

    @classmethod
    def load(cls, directory: Path, name: str) -> "NetworkCostModel":
        import lightgbm as lgb

        sidecar = Path(directory) / f"{name}.json"
        if not sidecar.is_file():
            raise ModelError(f"no network model {name!r} in {directory} (train one with "
                             "`dlas-predict train` on a store with whole-network "
                             "measurements)")
        try:
            meta = json.loads(sidecar.read_text())
        except json.JSONDecodeError as exc:
            raise ModelError(f"{sidecar} is not valid JSON ({exc})") from None
        if meta.get("format") != NET_MODEL_FORMAT or meta.get("features") != list(
                NET_FEATURE_NAMES):
            raise ModelError(f"{sidecar}: another format or feature set than this version "
                             "computes; retrain with `dlas-predict train`")
        models = {}
        for key in ("median", "q10", "q90"):
            path = Path(directory) / f"{name}.{key}.txt"
            try:
                models[key] = lgb.Booster(model_file=str(path))
            except Exception as exc:  # LightGBM's own error type
                raise ModelError(f"cannot load {path}: {str(exc)[:200]}") from None
            if models[key].num_feature() != len(NET_FEATURE_NAMES):
                raise ModelError(f"{path} expects {models[key].num_feature()} features, not "
                                 f"{len(NET_FEATURE_NAMES)}")
        return cls(models=models, meta=meta)


@dataclass
class ConfigRanker:
    """LGBMRanker over whole configurations; a group is one network on one device."""

    seed: int = 0
    booster: object = None

    def fit(self, X: np.ndarray, seconds: np.ndarray, groups: list[str]) -> "ConfigRanker":
        import lightgbm as lgb

        order = np.argsort(np.array(groups), kind="stable")
        X, seconds = np.asarray(X)[order], np.asarray(seconds)[order]
        g = np.array(groups)[order]
        sizes, labels = [], np.zeros(len(g), dtype=int)
        for name in dict.fromkeys(g):
            sel = np.where(g == name)[0]
            sizes.append(len(sel))
            # relevance: 0..max by speed within the network (fastest = highest)
            ranks = np.argsort(np.argsort(seconds[sel]))
            labels[sel] = np.clip(len(sel) - 1 - ranks, 0, 30)
        self.booster = lgb.LGBMRanker(
            objective="lambdarank", n_estimators=200, learning_rate=0.05, num_leaves=7,
            min_child_samples=5, verbose=-1, n_jobs=2, random_state=self.seed,
            label_gain=list(range(64))).fit(X, labels, group=sizes).booster_
        return self

    def scores(self, X: np.ndarray) -> np.ndarray:
        """Higher is faster."""
        return self.booster.predict(np.asarray(X, dtype=np.float64))
