"""Network-level cost models: whole-network latency from the layer model plus what the layer
sum misses (non-conv ops, traffic between layers, the int8 quantise/dequantise glue).

- :class:`NetworkCostModel`: predicted whole latency from the sum of the layer model's kernel
  predictions plus what it misses, a non-negative linear model over :data:`NET_TERMS` (the
  conv sum scaled per dtype/algorithm/format, bytes moved by non-conv ops, cast and
  quantise passes, per-layer overhead), fitted on measured whole networks, times a
  correction: LightGBM trees on the log of the measured latency over the linear model's,
  from the network's features and each term's share (:data:`CORRECTION_FEATURES`).
- :class:`ConfigRanker`: LightGBM ``LGBMRanker`` (lambdarank) over whole configurations, one
  group per network × device; it orders candidates but gives no milliseconds.

Features of a configuration for the ranker: :data:`NET_FEATURE_NAMES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.space.config import (COMPRESSION_KERNEL, GRID_ALGORITHMS, Algorithm,
                                       Compression, DType)
from dlas_predict.models.base import (FITTED_COVERAGE, CostModel, at_coverage,
                                      group_folds)
from dlas_predict.models.costmodel import ModelError, package_versions, read_sidecar, write_sidecar
from dlas_predict.space.devices import Device
from dlas_predict.networks.summary import NetworkSummary

NET_MODEL_FORMAT = "dlas-network-cost-8"

NET_FEATURE_NAMES = (
    "log_conv_pred", "conv_layers", "layers", "log_nonconv_macs",
    "log_nonconv_bytes", "log_nonconv_bytes_per_conv_s", "activation_ops", "elementwise_ops",
    "log_input_elems", "mean_sparsity", "is_float16", "is_int8", "sparse_share",
    "channel_pattern",
    "share_direct", "share_gemm", "share_spatial_pack", "mixed", "dev_peak_gflops",
    "dev_bandwidth_gbs", "dev_cores",
)


def net_features(summary: NetworkSummary, conv_s: float, compression: Compression,
                 layers: list[tuple[str, bool]], layer_ratios: list[float],
                 device: Device) -> list[float]:
    """One configuration's feature row (order: :data:`NET_FEATURE_NAMES`). ``conv_s``: the
    sum of its conv kernels, measured when training, predicted when predicting; ``layers``:
    each conv's (algorithm, sparse), so that a per-layer choice is described by the shares of
    its layers on each algorithm and on CSR."""
    _, dtype, pattern = COMPRESSION_KERNEL[compression]
    n = max(len(layers), 1)
    share = {a.value: sum(1 for alg, _ in layers if IN_NETWORK_AS.get(alg, alg) == a.value) / n
             for a in GRID_ALGORITHMS}
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


#: Kernel families of the network model's conv terms: each layer's kernel time is scaled by
#: the factor of its family × algorithm (in-network effects differ: a CSR kernel's sparse
#: weights stay cached between calls, float16 and int8 kernels sit between casts).
CONV_FAMILIES = ("float32", "csr", "float16", "int8")
CONV_TERMS = tuple(f"conv_s_{f}_{a.value}" for f in CONV_FAMILIES
                   for a in GRID_ALGORITHMS)
#: A per-layer plan's Winograd layers take spatial pack's in-network scale: both read and
#: write NCHW through a packed layout of their own (no whole network timed with Winograd
#: layers has given it one of its own yet).
IN_NETWORK_AS = {Algorithm.WINOGRAD.value: Algorithm.SPATIAL_PACK.value}

#: Terms of the network model: whole ≈ Σ coef·term, coefficients ≥ 0 (so it extrapolates in
#: scale, unlike trees). The conv terms are the layers' kernel times summed per family ×
#: algorithm, so that each gets its own in-network scale, plus the kernel time of a mixed
#: (per-layer) plan, which pays for the choice of each layer's fastest measurement and for
#: changes of kernel between layers. The others price the non-conv work: bytes moved by
#: non-conv ops, the casts (float16) and quantise/dequantise passes (int8) over every conv's
#: activations, and per-layer overhead; the exponentials of SiLU-like activations (float16
#: apart); the bytes of broadcasting elementwise ops (squeeze-excitation's per-channel scale,
#: measured at about 5× an ordinary non-conv byte's cost), and the conv weights that do not
#: fit in the last-level cache, which a kernel timed alone finds cached but a whole network
#: streams from memory at every inference; the window reads of windowed pools; and two of
#: a transformer's attention (float16 apart): the elements through softmax and GELU's erf
#: (the engine's polynomials, apart from the other exponentials) and the multiply-adds of
#: the products of two activations (QKᵀ and its product with V; a CNN's classifier) that no
#: kernel of the grid times, the elements those products write (a head's short inner
#: dimension makes a product cost by what it writes more than by its multiply-adds), and
#: their multiply-adds beyond full vectors (the generic schedule runs a product whose rows
#: no whole vector divides on half or quarter vectors). Leaving one network out on the
#: Zen 4's and the Zen 5's corpora (measured kernels), the attention terms put a
#: transformer's configurations 55 → 69 % and 56 → 67 % within ±10 %, and the products'
#: two terms 61 → 70 % and 61 → 92 %; a recurrent network's 78 → 85 % and 89 → 90 %, an
#: MLP's 61 → 65 % and 84 → 81 %, the CNNs' unchanged.
NET_TERMS = (
    *CONV_TERMS, "conv_s_mixed",
    "nonconv_gb", "nonconv_gb_float16", "nonconv_gb_int8", "broadcast_gb",
    "conv_io_gb_float16", "conv_io_gb_int8", "layers_k", "layers_k_float16",
    "exp_gelems", "exp_gelems_float16", "weight_gb_beyond_cache", "pool_window_gelems",
    "erf_softmax_gelems", "erf_softmax_gelems_float16", "nonconv_gmacs",
    "nonconv_gmacs_float16", "product_gelems", "product_gmacs_narrow",
)


def last_level_cache_bytes(device: Device) -> int:
    """The largest cache of ``device`` (0 when its caches are unknown)."""
    return 1024 * max(device.caches.values(), default=0)


def net_terms(summary: NetworkSummary, layer_s, compression: Compression,
              layers: list[tuple[str, bool]], weight_bytes, cache_bytes: int) -> list[float]:
    """The :data:`NET_TERMS` of one configuration; ``layer_s``: each conv layer's kernel
    seconds (measured when training, predicted when predicting), ``layers``: each layer's
    (algorithm, sparse), ``weight_bytes``: each layer's kernel weights as stored
    (:func:`~dlas_predict.models.features.weight_bytes`), ``cache_bytes``: the device's last-level
    cache."""
    _, dtype, _ = COMPRESSION_KERNEL[compression]
    conv = dict.fromkeys(CONV_TERMS, 0.0)
    for s, (alg, sparse) in zip(layer_s, layers):
        family = "csr" if sparse else dtype.value
        conv[f"conv_s_{family}_{IN_NETWORK_AS.get(alg, alg)}"] += float(s)
    total = float(sum(layer_s))
    mixed = len({alg for alg, _ in layers}) > 1 or len({s for _, s in layers}) > 1
    f16, i8 = float(dtype is DType.FLOAT16), float(dtype is DType.INT8)
    gb, io, lk = summary.nonconv_bytes / 1e9, summary.conv_io_bytes / 1e9, summary.layers / 1e3
    exp, bc = summary.exp_elems / 1e9, summary.broadcast_bytes / 1e9
    beyond = max(float(sum(weight_bytes)) - cache_bytes, 0.0) / 1e9
    sm, mm = summary.erf_softmax_elems / 1e9, summary.nonconv_macs / 1e9
    return [*conv.values(), total * mixed,
            gb, gb * f16, gb * i8, bc, io * f16, io * i8, lk, lk * f16, exp, exp * f16, beyond,
            summary.pool_window_elems / 1e9, sm, sm * f16, mm, mm * f16,
            summary.product_out_elems / 1e9, summary.product_narrow_macs / 1e9]


#: The correction's columns: the network features of :data:`NET_FEATURE_NAMES` but the
#: device's (a network model is one device's), then each term's share of the linear model's
#: latency.
_DEVICE_FEATURES = ("dev_peak_gflops", "dev_bandwidth_gbs", "dev_cores")
_CORRECTION_FROM = [i for i, n in enumerate(NET_FEATURE_NAMES) if n not in _DEVICE_FEATURES]
CORRECTION_FEATURES = (*(NET_FEATURE_NAMES[i] for i in _CORRECTION_FROM),
                       *(f"share_{t}" for t in NET_TERMS))
#: Fewest whole-network measurements, and fewest networks, a correction is fitted on; below
#: them the linear model answers alone. Leaving one network out of the shipped corpora of
#: 15 to 18 networks, a correction learned from the other 14 to 17 was no clear gain (within
#: ±10 %: the five CPU profiles 63-79 % without it, 65-78 % with it; h100 40 → 37 %, h200
#: 48 → 47 %); from the Intel Xeon's 50 it helped (67 → 72 %, MAPE 9.0 → 7.9 %, the bound
#: 78 → 86 %), and from `local`'s 139 (82.6 → 87.0 %).
MIN_CORRECTION_ROWS, MIN_CORRECTION_NETWORKS = 100, 20


def fits_correction(rows: int, networks: int | None) -> bool:
    """Whether a network model fitted on ``rows`` whole-network measurements of ``networks``
    networks (None: not known) learns a correction."""
    return rows >= MIN_CORRECTION_ROWS and (networks is None
                                            or networks >= MIN_CORRECTION_NETWORKS)

#: Shallow trees, few of them: the correction learns what the terms' scales miss from
#: about a hundred networks. On the shipped `local` snapshot, leave one network out, 15
#: leaves and 200 trees put as many within ±10 % as 31 leaves or 400 trees.
_CORRECTION_PARAMS = dict(n_estimators=200, learning_rate=0.05, num_leaves=15,
                          min_child_samples=20, verbose=-1, n_jobs=2)
#: Folds (by network) of the out-of-fold errors an interval is widened by.
_FOLDS = 5


@dataclass(frozen=True)
class NetworkInputs:
    """What a whole-network model predicts from: each configuration's :func:`net_terms` row,
    the layer model's conv-kernel sum with its interval (low, high), and the configuration's
    :func:`net_features` row, which the correction reads with ``correction_terms``: both
    computed from the model's own device's kernel times (where the kernels are mapped to
    another device, the reference's unmapped predictions, so that the trees see times of the
    device they learned; default: ``terms``, the features with the same conv sums)."""

    terms: np.ndarray
    conv: np.ndarray
    conv_low: np.ndarray
    conv_high: np.ndarray
    features: np.ndarray | None = None
    correction_terms: np.ndarray | None = None

    @classmethod
    def point(cls, terms: np.ndarray, conv: np.ndarray,
              features: np.ndarray | None = None) -> "NetworkInputs":
        """Inputs of conv sums without an interval (measured, or a point prediction)."""
        conv = np.asarray(conv, dtype=np.float64)
        return cls(np.asarray(terms, dtype=np.float64), conv, conv, conv, features)


#: The name (file stem) of the network model that prices matrix networks (trained on every
#: network), and the fewest matrix networks it needs.
MATRIX_NETWORK = "network_matrix"
MIN_MATRIX_NETWORKS = 3


@dataclass
class NetworkCostModel(CostModel):
    """Whole-network latency = non-negative linear model over :data:`NET_TERMS`, fitted on
    measured whole networks (with their measured conv sums) to minimise relative error,
    times the correction's factor where it has enough networks to learn from
    (:data:`MIN_CORRECTION_ROWS`). Its interval: the layer model's conv interval, widened by
    the 10 %/90 % quantiles of the model's relative error, out of fold by network where the
    networks are known (in sample otherwise).

    ``cache_bytes``: the device's last-level cache, which the :func:`net_terms` rows of
    fitting and of predictions are built with; ``about``: what the caller records in the
    saved sidecar."""

    cache_bytes: int = 0
    seed: int = 0
    name: str = "network"
    about: dict = field(default_factory=dict)
    coef_: np.ndarray | None = field(default=None, init=False)
    correction_: object = field(default=None, init=False)  # trees; None: the linear model
    meta_: dict = field(default_factory=dict, init=False)

    def fit(self, X: NetworkInputs, whole_s: np.ndarray,
            groups: list[str] | None = None) -> "NetworkCostModel":
        """``X``: measured networks' :func:`net_terms` rows with their measured conv sums,
        and their :func:`net_features` rows (without them, no correction); ``groups``: each
        row's network, for out-of-fold interval errors."""
        T, whole_s = np.asarray(X.terms, dtype=np.float64), np.asarray(whole_s, np.float64)
        features, seed = X.features, self.seed
        if len(T) < 8:
            raise ModelError(f"too few whole-network measurements to learn the residual "
                             f"({len(T)}); collect some with `dlas-predict collect "
                             "--whole-network`")
        self.coef_ = _nnls_relative(T, whole_s)
        self.correction_ = None
        if features is not None and fits_correction(
                len(T), None if groups is None else len(set(groups))):
            self.correction_ = self._fit_correction(self.coef_, T, whole_s, features, seed)
        if groups is not None and self.correction_ is not None:
            ratio = self._out_of_fold(T, whole_s, features, np.asarray(groups), seed)
        else:
            ratio = whole_s / np.maximum(self._predict(T, features), 1e-12)
        self.meta_ = {"format": NET_MODEL_FORMAT, "terms": list(NET_TERMS),
                      "cache_bytes": int(self.cache_bytes),
                      "coef": [float(c) for c in self.coef_],
                      "correction": None if self.correction_ is None
                      else list(CORRECTION_FEATURES),
                      "error_q10": float(np.quantile(ratio, 0.1)),
                      "error_q90": float(np.quantile(ratio, 0.9)),
                      "versions": package_versions(), "n_train": int(len(T)), **self.about}
        return self

    @staticmethod
    def _fit_correction(coef: np.ndarray, T: np.ndarray, whole_s: np.ndarray,
                        features: np.ndarray, seed: int):
        import lightgbm as lgb

        base = np.maximum(T @ coef, 1e-12)
        return lgb.LGBMRegressor(objective="regression", random_state=seed,
                                 **_CORRECTION_PARAMS).fit(
            correction_rows(features, T, coef, base), np.log(whole_s / base)).booster_

    def _out_of_fold(self, T, whole_s, features, groups: np.ndarray, seed: int) -> np.ndarray:
        """Measured over predicted latency of every row, each predicted by a model (linear
        part and correction) fitted without its network's fold."""
        fold = group_folds(groups, _FOLDS, seed)
        ratio = np.empty(len(T))
        for f in range(_FOLDS):
            te, tr = fold == f, fold != f
            part = NetworkCostModel()
            part.coef_ = _nnls_relative(T[tr], whole_s[tr])
            part.correction_ = self._fit_correction(part.coef_, T[tr], whole_s[tr],
                                                    features[tr], seed)
            ratio[te] = whole_s[te] / np.maximum(part._predict(T[te], features[te]), 1e-12)
        return ratio

    @property
    def corrected(self) -> bool:
        """Whether predictions read :attr:`NetworkInputs.features` (the model has a
        correction)."""
        return self.correction_ is not None

    def predict(self, X: NetworkInputs) -> np.ndarray:
        """Whole-network seconds; ``X.terms`` and ``X.features`` built with the predicted
        conv sums ``X.conv``."""
        if self.coef_ is None:
            raise ModelError("the network model is not trained")
        return self._predict(np.asarray(X.terms, dtype=np.float64), X.features,
                             X.correction_terms)

    def _predict(self, T: np.ndarray, features: np.ndarray | None,
                 correction_terms: np.ndarray | None = None) -> np.ndarray:
        base = T @ self.coef_
        if self.correction_ is None:
            return base
        if features is None:
            raise ModelError("the network model's correction needs each configuration's "
                             "network features (NetworkInputs.features)")
        Tc, base_c = T, base
        if correction_terms is not None:
            Tc = np.asarray(correction_terms, dtype=np.float64)
            base_c = Tc @ self.coef_
        rows = correction_rows(features, Tc, self.coef_, np.maximum(base_c, 1e-12))
        return base * np.exp(self.correction_.predict(rows))

    def predict_interval(self, X: NetworkInputs, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        """The interval (low, high) seconds: the conv sums' interval, widened by the model's
        own 10 %/90 % error (``q`` = 0.8; rescaled for another coverage)."""
        mid = self.predict(X)
        lo = mid * np.minimum(X.conv_low / X.conv, 1.0) * min(self.meta_["error_q10"], 1.0)
        hi = mid * np.maximum(X.conv_high / X.conv, 1.0) * max(self.meta_["error_q90"], 1.0)
        return at_coverage(mid, lo, hi, q)

    def save(self, directory: Path) -> Path:
        from dlas_predict.models.trees import MODEL_SUFFIX, save_trees

        name = self.name
        sidecar = write_sidecar(directory, name, self.meta_)
        path = Path(directory) / f"{name}.correction{MODEL_SUFFIX}"
        if self.correction_ is not None:
            save_trees(self.correction_, path)
        else:  # a correction of an earlier fit must not be read with this one
            path.unlink(missing_ok=True)
            (Path(directory) / f"{name}.correction.txt").unlink(missing_ok=True)
        return sidecar

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "NetworkCostModel":
        from dlas_predict.models.costmodel import load_trees

        name = name or cls.name

        sidecar, meta = read_sidecar(directory, name, "network model",
                                     "train one with `dlas-predict train` on a store with "
                                     "whole-network measurements")
        if meta.get("format") != NET_MODEL_FORMAT or meta.get("terms") != list(NET_TERMS):
            raise ModelError(f"{sidecar}: another format or term set than this version "
                             "computes; retrain with `dlas-predict train`")
        coef = np.asarray(meta.get("coef", []), dtype=np.float64)
        if coef.shape != (len(NET_TERMS),) or not np.all(np.isfinite(coef)) or \
                np.any(coef < 0):
            raise ModelError(f"{sidecar}: its coefficients are missing or invalid; retrain")
        if not isinstance(meta.get("cache_bytes"), int) or meta["cache_bytes"] < 0:
            raise ModelError(f"{sidecar}: its cache size is missing or invalid; retrain")
        correction = None
        if meta.get("correction") is not None:
            if meta["correction"] != list(CORRECTION_FEATURES):
                raise ModelError(f"{sidecar}: its correction reads other features than this "
                                 "version computes; retrain with `dlas-predict train`")
            from dlas_predict.models.trees import model_file

            path = model_file(directory, f"{name}.correction")
            if not path.is_file():
                raise ModelError(f"{sidecar} names a correction, but {path} is missing; "
                                 "retrain with `dlas-predict train`")
            correction = load_trees(path, len(CORRECTION_FEATURES), "; retrain")
        model = cls(cache_bytes=meta["cache_bytes"], name=name)
        model.coef_, model.correction_, model.meta_ = coef, correction, meta
        return model


def _nnls_relative(T: np.ndarray, whole_s: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative error of ``T @ coef``."""
    from scipy.optimize import nnls

    scale = np.maximum(np.abs(T).max(axis=0), 1e-12)  # conditioning only
    coef, _ = nnls(T / scale / whole_s[:, None], np.ones(len(T)))
    return coef / scale


def correction_rows(features: np.ndarray, T: np.ndarray, coef: np.ndarray,
                    base: np.ndarray) -> np.ndarray:
    """The correction's rows (:data:`CORRECTION_FEATURES`): the network features without the
    device's, and each term's share of the linear latency ``base``."""
    F = np.asarray(features, dtype=np.float64)[:, _CORRECTION_FROM]
    return np.column_stack([F, T * coef / base[:, None]])


@dataclass
class ConfigRanker:
    """LGBMRanker over whole configurations; a group is one network on one device."""

    seed: int = 0
    booster_: object = field(default=None, init=False)

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
        self.booster_ = lgb.LGBMRanker(
            objective="lambdarank", n_estimators=200, learning_rate=0.05, num_leaves=7,
            min_child_samples=5, verbose=-1, n_jobs=2, random_state=self.seed,
            label_gain=list(range(64))).fit(X, labels, group=sizes).booster_
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """A score per row of ``X``: higher is faster (a ranking, not a latency)."""
        return self.booster_.predict(np.asarray(X, dtype=np.float64))


class ConvSumModel:
    """The stand-in for a device with no whole-network measurements: a network's latency is
    the sum of its predicted conv kernels, with their interval. It leaves out the other
    operators and the launch gaps, so it is a lower bound of the whole network, and says
    so (``meta_["scope"]``). Nothing is learned: it is never fitted nor saved."""

    cache_bytes = 0
    corrected = False

    def __init__(self) -> None:
        self.meta_ = {"n_train": 0, "scope": "conv sum"}

    def predict(self, X: NetworkInputs) -> np.ndarray:
        return np.asarray(X.conv)

    def predict_interval(self, X: NetworkInputs, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        return at_coverage(X.conv, X.conv_low, X.conv_high, q)
