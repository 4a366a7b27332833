"""The accuracy-cost model: a compression's top-1 drop predicted from the network's weights.

Trained on measured curves (``datasets/accuracy/generated.json``: small CNNs of four
families and matrix networks of five (MLP, encoder, ViT, LSTM, GRU) trained here on digits,
and the trained zoo networks, each measured as a user's ONNX file), it predicts the *share
of the network's above-chance accuracy* that a compression loses, ``(dense - compressed) / (dense - chance)``, from what the compression
does to the weights (:mod:`dlas_predict.compression.sensitivity`). The share carries across
tasks of other accuracies; in points it is ``share × (dense - chance) × 100``, and where the
uncompressed accuracy is unknown (no data) the tool takes it as 100 %: the largest drop the
share can mean.

The 80 % interval is conformal: the trees' errors on networks held out of the fit (grouped
folds), split by the size of the prediction (a flat region's errors are small, a cliff's
large) and for the quantised rows by kind (float16's, int8's) and by network (a CNN's, a
matrix network's), give each bin its 10th and 90th percentile of error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.compression.sensitivity import FEATURE_NAMES, KINDS, ConvWeights, features
from dlas_predict.models.base import FITTED_COVERAGE, CostModel, at_coverage
from dlas_predict.models.costmodel import ModelError, package_versions, read_sidecar, write_sidecar
from dlas_predict.space.config import Compression

MODEL_FORMAT = "accuracy-cost-4"
NAME = "accuracy"
#: Upper edges of the prediction bins the interval's errors are taken from.
BIN_EDGES = (0.01, 0.05, 0.2, 0.5)
#: The interval's percentiles (an 80 % interval).
QUANTILES = (0.1, 0.9)
FOLDS = 5
#: The interval's highest normalised drop: a collapsed network falls to chance, or a little
#: under it.
HIGH_MAX = 1.1


def normalised_drop(dense: float, value: float, chance: float) -> float:
    """The share of above-chance accuracy lost (0: none, 1: down to chance)."""
    return (dense - value) / np.maximum(dense - chance, 1e-6)


# ---- the training table -------------------------------------------------------------------
@dataclass(frozen=True)
class CurvePoint:
    """One measured compression of one network: the training row's label and key."""

    network: str
    family: str
    compression: Compression
    ratio: float | None
    dense: float
    value: float
    chance: float


def curve_points(name: str, entry: dict, classes: int = 10) -> list[CurvePoint]:
    """Every measured point of one network's curves entry (the format of ``curves.json``)."""
    family = (entry.get("network") or {}).get("family", "zoo")
    chance, dense = 1.0 / classes, float(entry["dense"])
    out = []
    for comp in KINDS:
        if comp.value in ("float16", "int8"):
            if entry.get(comp.value) is not None:
                out.append(CurvePoint(name, family, comp, None, dense, float(entry[comp.value]),
                                      chance))
            continue
        for r, v in (entry.get(comp.value) or {}).get("points", []):
            out.append(CurvePoint(name, family, comp, float(r), dense, float(v), chance))
    return out


#: The features that are 0 on every network without matrix layers (a CNN's grid form).
MATRIX_FEATURES = ("matrix_share", "shared_layers_share", "products_per_layer")


#: The generated convolutional families of ``datasets/make_accuracy_corpus.py``.
CNN_FAMILIES = ("plain", "residual", "separable", "inverted")


def _convolutional(name: str, entry: dict) -> bool:
    from dlas_predict.networks import zoo

    family = (entry.get("network") or {}).get("family")
    return family in CNN_FAMILIES or (name in zoo.ZOO and zoo.ZOO[name].family == "cnn")


def write_training_table(curves: dict, onnx_dir: Path, out: Path) -> Path:
    """The model's training table: one row per measured point, its features read from the
    network's ONNX file in ``onnx_dir`` (``NAME.onnx``), in the form the grid reads (a
    matrix network's matrix layers as 1×1 convolutions, as :mod:`compress` prunes it).

    A network whose file is gone keeps its rows of the table already at ``out``; a
    convolutional network's rows there that lack the matrix features get them as 0, their
    value on any network without matrix layers. Any other missing file is an error."""
    import pandas as pd

    from dlas_predict.networks import zoo

    kept = pd.read_parquet(out) if Path(out).is_file() else None
    rows, old = [], []
    for name, entry in sorted(curves.items()):
        path = Path(onnx_dir) / f"{name}.onnx"
        if not path.is_file():
            mine = None if kept is None else kept[kept["network"] == name]
            if mine is None or mine.empty:
                raise ModelError(f"{path} is gone and {out} has no rows of {name}")
            mine = mine.copy()
            for col in MATRIX_FEATURES:
                if col not in mine.columns:
                    if not _convolutional(name, entry):
                        raise ModelError(f"{path} is gone: the matrix features of {name} "
                                         "cannot be read")
                    mine[col] = 0.0
            old.append(mine)
            continue
        cw = ConvWeights.of(zoo.resolve(path))
        for p in curve_points(name, entry, cw.classes or 10):
            f = features(cw, p.compression, p.ratio)
            rows.append({"network": p.network, "family": p.family,
                         "compression": p.compression.value, "ratio": p.ratio,
                         "dense": p.dense, "value": p.value, "chance": p.chance,
                         **dict(zip(FEATURE_NAMES, f))})
    table = pd.DataFrame(rows)
    if old:
        cols = list(table.columns) if rows else list(old[0].columns)
        table = pd.concat([table, *[o[cols] for o in old]], ignore_index=True)
        table = table.sort_values(["network"], kind="stable").reset_index(drop=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_parquet(out, index=False)
    return out


def read_training_table(path: Path):
    """The table and its arrays: (table, X, normalised drop, network of each row)."""
    import pandas as pd

    table = pd.read_parquet(path)
    missing = [n for n in FEATURE_NAMES if n not in table.columns]
    if missing:
        raise ModelError(f"{path} lacks the features {', '.join(missing)}; rebuild it with "
                         "datasets/make_accuracy_corpus.py --features")
    X = table[list(FEATURE_NAMES)].to_numpy(np.float64)
    y = normalised_drop(table["dense"].to_numpy(), table["value"].to_numpy(),
                        table["chance"].to_numpy())
    return table, X, y, table["network"].to_numpy()


# ---- the model ----------------------------------------------------------------------------
#: The model's parts, each with trees of its own: a part's rows are those of its one-hot
#: feature(s). Quantised rows (one per network and kind) get small trees.
PARTS = {"weight_pruning": ("is_weight_pruning",), "channel_pruning": ("is_channel_pruning",),
         "quantised": ("is_int8", "is_float16")}
#: Pruning trees: few leaves, rising in the damage features (a network pruned more never
#: loses less), so that a family seen in few networks is not fitted to their noise.
_RISING = ("ratio", "removed_max", "removed_mean", "energy_max", "energy_mean",
           "energy_depth_sum", "energy_depth_mean", "heavy_layers")
_PRUNING = {"n_estimators": 200, "learning_rate": 0.03, "num_leaves": 7,
            "min_child_samples": 20, "verbose": -1, "n_jobs": 1,
            "monotone_constraints": [1 if n in _RISING else
                                     -1 if n == "kept_channels_min_log2" else 0
                                     for n in FEATURE_NAMES]}
_QUANTISED = {"n_estimators": 50, "learning_rate": 0.05, "num_leaves": 3,
              "min_child_samples": 8, "verbose": -1, "n_jobs": 1}
#: Error bins per part: the pruning parts' by predicted drop, the quantised part's by kind and
#: network (4 of them).
N_BINS = len(BIN_EDGES) + 1


def _part_rows(X: np.ndarray) -> dict[str, np.ndarray]:
    return {part: X[:, [FEATURE_NAMES.index(c) for c in cols]].sum(axis=1) > 0
            for part, cols in PARTS.items()}


def _bin(part: str, pred: np.ndarray, X: np.ndarray) -> np.ndarray:
    if part == "quantised":  # float16's errors apart from int8's, a CNN's from a matrix's
        return ((X[:, FEATURE_NAMES.index("is_int8")] > 0).astype(int)
                + 2 * (X[:, FEATURE_NAMES.index("matrix_share")] > 0.5))
    return np.searchsorted(np.array(BIN_EDGES), pred)


#: The trees learn the drop's log-odds, clipped to this and 1 - this: on that scale a
#: drop of 0.2 % and one of 2 % are as far apart as 50 % and 90 %, which a cliff's
#: neighbourhood needs (on the plain scale the trees average the flat side with the cliff).
LOGIT_EPS = 0.002


def _logit(v: np.ndarray) -> np.ndarray:
    v = np.clip(v, LOGIT_EPS, 1 - LOGIT_EPS)
    return np.log(v / (1 - v))


def _fit_trees(part: str, X: np.ndarray, y: np.ndarray, seed: int, scale: float):
    import lightgbm as lgb

    params = dict(_QUANTISED if part == "quantised" else _PRUNING)
    params["n_estimators"] = max(1, int(round(params["n_estimators"] * scale)))
    return lgb.LGBMRegressor(objective="regression", random_state=seed, **params).fit(
        X, _logit(y)).booster_


def _drop(booster, X: np.ndarray) -> np.ndarray:
    """A part's predicted drop: its trees' log-odds, back on the 0-1 scale."""
    return 1 / (1 + np.exp(-booster.predict(X)))


def _folds(groups: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    names = np.unique(groups)
    order = np.random.default_rng(seed).permutation(len(names))
    return [np.isin(groups, names[order[i::k]]) for i in range(min(k, len(names)))]


@dataclass
class AccuracyCostModel(CostModel):
    """Predicts the normalised top-1 drop of a compression (0: none, 1: to chance) with an
    80 % interval. ``fit(X, drop, groups)``, ``predict(X)``, ``predict_interval(X, q)``
    (both at once: ``predict_all``), ``save(directory)``, ``load(directory)``, as the
    latency models. ``tree_scale`` scales every part's number of trees (tests fit small
    models)."""

    seed: int = 0
    tree_scale: float = 1.0
    name: str = NAME
    trees_: dict = field(default_factory=dict, init=False)   # part → booster
    errors_: dict = field(default_factory=dict, init=False)  # part → per bin [q10, q90]
    meta_: dict = field(default_factory=dict, init=False)

    def fit(self, X: np.ndarray, drop: np.ndarray, groups: np.ndarray) -> "AccuracyCostModel":
        X, drop, groups = np.asarray(X, np.float64), np.asarray(drop, np.float64), \
            np.asarray(groups)
        if len(np.unique(groups)) < 3:
            raise ModelError("the accuracy-cost model needs the curves of 3 networks or more")
        self.trees_, self.errors_ = {}, {}
        for part, rows in _part_rows(X).items():
            if not rows.any():
                continue
            Xp, yp, gp = X[rows], drop[rows], groups[rows]
            held = np.full(len(yp), np.nan)
            for test in _folds(gp, FOLDS, self.seed):
                if test.all():
                    continue
                held[test] = _drop(_fit_trees(part, Xp[~test], yp[~test], self.seed,
                                              self.tree_scale), Xp[test])
            ok = np.isfinite(held)
            residual, bins = (yp - held)[ok], _bin(part, held[ok], Xp[ok])
            self.errors_[part] = []
            for b in range(N_BINS):
                r = residual[bins == b]
                r = r if len(r) >= 10 else residual  # a bin too thin (or unused) borrows all
                self.errors_[part].append([float(np.quantile(r, q)) if len(r) else 0.0
                                          for q in QUANTILES])
            self.trees_[part] = _fit_trees(part, Xp, yp, self.seed, self.tree_scale)
        self.meta_ = {"format": MODEL_FORMAT, "features": list(FEATURE_NAMES),
                     "versions": package_versions(), "n_train": int(len(X)),
                     "networks": int(len(np.unique(groups))), "bin_edges": list(BIN_EDGES),
                     "errors": self.errors_, "quantiles": list(QUANTILES), "folds": FOLDS,
                     "parts": sorted(self.trees_), "tree_scale": self.tree_scale,
                     "target": f"log-odds of the normalised drop, clipped to {LOGIT_EPS}"}
        return self

    def predict_all(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The normalised drop (in [0, 1]) and its 80 % interval (low, high), the trees
        walked once."""
        if not self.trees_:
            raise ModelError("the accuracy-cost model is not trained")
        X = np.asarray(X, np.float64)
        mid, low, high = (np.full(len(X), np.nan) for _ in range(3))
        for part, rows in _part_rows(X).items():
            if not rows.any():
                continue
            if part not in self.trees_:
                raise ModelError(f"the accuracy-cost model has no {part} part")
            m = _drop(self.trees_[part], X[rows])
            err = np.array(self.errors_[part])[_bin(part, m, X[rows])]
            mid[rows] = m
            # a drop below zero is real (a compression can regularise) and measured often
            low[rows] = np.clip(np.minimum(m + err[:, 0], m), -1, 1)
            # and below chance (a collapsed network's top-1 is chance, give or take)
            high[rows] = np.clip(np.maximum(m + err[:, 1], m), 0, HIGH_MAX)
        return mid, low, high

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The normalised drop, in [0, 1]."""
        return self.predict_all(X)[0]

    def predict_interval(self, X: np.ndarray, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        """The central ``q`` interval (low, high) of the normalised drop, low ≤ predict ≤
        high: the binned 10th and 90th percentiles of the held-out errors (``q`` = 0.8),
        rescaled for another coverage (on the drop's own scale)."""
        mid, low, high = self.predict_all(X)
        return at_coverage(mid, low, high, q, log=False)

    def save(self, directory: Path) -> Path:
        from dlas_predict.models.trees import MODEL_SUFFIX, save_trees

        sidecar = write_sidecar(directory, self.name, self.meta_)
        for part, booster in self.trees_.items():
            save_trees(booster, Path(directory) / f"{self.name}.{part}{MODEL_SUFFIX}")
        return sidecar

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "AccuracyCostModel":
        from dlas_predict.models.costmodel import load_trees
        from dlas_predict.models.trees import model_file

        name = name or cls.name
        sidecar, meta = read_sidecar(directory, name, "accuracy-cost model",
                                     "train one with datasets/make_accuracy_corpus.py --fit")
        if meta.get("format") != MODEL_FORMAT or meta.get("features") != list(FEATURE_NAMES):
            raise ModelError(f"{sidecar}: trained on other features than this version "
                             "computes; retrain with datasets/make_accuracy_corpus.py --fit")
        errors, parts = meta.get("errors"), meta.get("parts")
        if (not isinstance(errors, dict) or not isinstance(parts, list)
                or any(len(errors.get(p) or ()) != N_BINS for p in parts)):
            raise ModelError(f"{sidecar}: no interval errors; retrain it")
        model = cls(name=name)
        model.trees_ = {p: load_trees(model_file(directory, f"{name}.{p}"),
                                      len(FEATURE_NAMES)) for p in parts}
        model.errors_, model.meta_ = errors, meta
        return model


def held_out(X: np.ndarray, drop: np.ndarray, groups: np.ndarray, seed: int = 0,
             tree_scale: float = 1.0):
    """Leave one network out: each network's rows predicted by a model (trees and interval)
    fitted on the other networks only. Returns (middle, low, high) normalised drops."""
    mid, low, high = (np.full(len(drop), np.nan) for _ in range(3))
    for name in np.unique(groups):
        test = groups == name
        m = AccuracyCostModel(seed=seed, tree_scale=tree_scale).fit(
            X[~test], drop[~test], groups[~test])
        mid[test], low[test], high[test] = m.predict_all(X[test])
    return mid, low, high


# ---- what the tool asks ---------------------------------------------------------------------
@dataclass(frozen=True)
class PredictedDrop:
    """A compression's predicted top-1 drop, in points of a network whose uncompressed
    accuracy is ``dense`` (1.0 when unknown: the largest drop the share can mean)."""

    drop_pp: float
    low_pp: float
    high_pp: float
    dense: float
    chance: float

    @property
    def source(self) -> str:
        return (f"predicted: accuracy-cost model, drop {self.drop_pp:.1f} points (80 % "
                f"interval {self.low_pp:.1f}-{self.high_pp:.1f})")


class AccuracyPredictor:
    """The shipped accuracy-cost model (or ``model``, one fitted here) applied to one
    network's weights."""

    def __init__(self, model_path, directory: Path | None = None,
                 model: AccuracyCostModel | None = None):
        from dlas_predict.paths import ACCURACY_MODEL

        self.model = model or AccuracyCostModel.load(Path(directory or ACCURACY_MODEL))
        self.weights = ConvWeights.of(model_path)
        self.chance = 1.0 / (self.weights.classes or 1000)

    def drops(self, points: list[tuple[Compression, float | None]],
              dense: float | None = None) -> list[PredictedDrop]:
        X = np.array([features(self.weights, c, r) for c, r in points])
        mid, low, high = self.model.predict_all(X)
        d = 1.0 if dense is None else dense
        scale = max(d - self.chance, 0.0) * 100
        # no drop exceeds the whole accuracy (below chance, down to none right)
        return [PredictedDrop(float(m * scale), float(lo * scale),
                              float(min(hi * scale, d * 100)), d, self.chance)
                for m, lo, hi in zip(mid, low, high)]


def fit_shipped(table_path: Path, directory: Path, seed: int = 0) -> AccuracyCostModel:
    """Fit on the training table and save (the shipped model)."""
    _table, X, y, groups = read_training_table(table_path)
    model = AccuracyCostModel(seed=seed).fit(X, y, groups)
    model.save(directory)
    return model
