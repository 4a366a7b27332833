"""Cost models learned from the corpus, and the baselines they must beat.

- :class:`StageCostModel`: a kernel's time as a non-negative sum of what its loops execute
  (:data:`~dlas_predict.models.features.STAGE_TERMS`), one set of costs per kernel family.
- :class:`LayerCostModel`: LightGBM regression of the log ratio of a kernel's latency to the
  stage-cost model's, with a 10 % and a 90 % quantile model for an interval around every
  prediction.
- :class:`RooflineBaseline`: max(work / peak, bytes / bandwidth), scaled by one efficiency
  factor per algorithm × compression fitted on the training rows.
- :class:`MacsLinearBaseline`: latency = a·MACs + b per algorithm × compression.

A saved model is LightGBM text files plus a JSON sidecar (feature names, package versions,
corpus fingerprint, metrics); loading checks them. LightGBM is imported only here, to
train: saved models are evaluated with numpy (:mod:`dlas_predict.models.trees`).
"""

from __future__ import annotations

import abc
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.errors import DlasError
from dlas_predict.models.base import FITTED_COVERAGE, CostModel, at_coverage
from dlas_predict.models.features import FEATURE_NAMES, STAGE_TERMS, TREE_FEATURES
from dlas_predict.space.config import GRID_ALGORITHMS

MODEL_FORMAT = "dlas-layer-cost-3"
QUANTILES = (0.1, 0.9)
#: The interval's quantile models: 63 leaves, 400 trees.
_LGB_PARAMS = dict(n_estimators=400, learning_rate=0.05, num_leaves=63, min_child_samples=5,
                   subsample=0.9, subsample_freq=1, colsample_bytree=0.9, verbose=-1,
                   n_jobs=2)
#: The median model: 127 leaves, 600 trees. On the shipped `local` snapshot, ten folds of
#: held-out networks put 84.4 % of whole networks within ±10 % with it, 83.0 % (three seeds:
#: 82.7-83.5 %) with the quantiles' 63 × 400; 31 leaves put 80.9 %.
_MEDIAN_PARAMS = dict(_LGB_PARAMS, num_leaves=127, n_estimators=600)


class ModelError(DlasError):
    """A missing, unreadable or incompatible saved cost model."""


def package_versions() -> dict[str, str]:
    import lightgbm
    import sklearn

    return {"lightgbm": lightgbm.__version__, "scikit-learn": sklearn.__version__,
            "numpy": np.__version__}


#: Sidecar fields a retrain changes although the model does not (how long it took).
VOLATILE_META = ("train_seconds",)


def same_meta(a, b, rel: float = 1e-9) -> bool:
    """Whether two sidecars' parsed JSON say the same: equal structure and values, floats
    equal to ``rel`` (a fit repeated on another CPU's BLAS differs in the last bits)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_meta(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_meta(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (not isinstance(a, bool) and not isinstance(b, bool)
                and isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=rel, abs_tol=1e-15))
    return a == b


def write_sidecar(directory: Path, name: str, meta: dict) -> Path:
    """Write a model's JSON sidecar ``DIRECTORY/NAME.json`` (creating the directory). A
    sidecar that already says the same (apart from :data:`VOLATILE_META`, floats to
    :func:`same_meta`'s precision) is left as it is, so a retrain that changes nothing
    rewrites nothing."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sidecar = directory / f"{name}.json"

    def steady(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in VOLATILE_META}

    from dlas_predict.files import write_if_changed

    text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    try:
        if same_meta(steady(json.loads(sidecar.read_text())), steady(json.loads(text))):
            return sidecar
    except (OSError, ValueError, AttributeError):
        pass
    write_if_changed(sidecar, text.encode())
    return sidecar


def read_sidecar(directory: Path, name: str, what: str, hint: str) -> tuple[Path, dict]:
    """Read ``DIRECTORY/NAME.json``; a missing or unparsable file is a :class:`ModelError`
    (a missing one says it has no ``what`` and how to make one: ``hint``)."""
    sidecar = Path(directory) / f"{name}.json"
    if not sidecar.is_file():
        raise ModelError(f"no {what} {name!r} in {directory} ({hint})")
    try:
        return sidecar, json.loads(sidecar.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{sidecar} is not valid JSON ({exc})") from None


_TREES = len(TREE_FEATURES)
_STAGE = slice(_TREES, _TREES + len(STAGE_TERMS))
#: Columns that name a kernel family: algorithm, dtype, CSR, pruning pattern, tuning (the
#: baselines' groups: one per algorithm × compression).
_FAMILY = ("algo_direct", "algo_gemm", "algo_spatial_pack", "algo_winograd", "dtype_bytes",
           "sparse", "channel_pattern", "tuned")
#: The stage-cost model's families: the same without the pruning pattern, since a CSR kernel
#: runs the same loops whichever pattern its zeros follow (the stage terms count the
#: nonzeros). Split by pattern, channel pruning's family held mostly filters pruned to one
#: channel, whose costs scaled badly to the others.
#: An int8 GEMM on AVX-512 VNNI is a family of its own: one instruction per word of four
#: reduction elements, whose cost is not the plain int8 GEMM's per vector op.
STAGE_FAMILY = tuple(n for n in _FAMILY if n != "channel_pattern") + ("vnni",)
#: Rows of a family with at least this many measurements of one loop structure (depthwise,
#: strided, 1×1) get costs of their own; the others share their family's.
MIN_STRUCTURE_ROWS = 15


#: The columns of a loop structure's key across element types: the family's without the
#: element type and VNNI (an int8 GEMM's 3×3 convs, too few in its own family, are priced
#: like the other GEMMs' 3×3 convs, not like its depthwise and 1×1 ones).
STRUCTURE_FAMILY = ("algo_direct", "algo_gemm", "algo_spatial_pack", "algo_winograd", "sparse",
                    "tuned")


def _family_keys(X: np.ndarray, family: tuple[str, ...]
                 ) -> tuple[list[str], list[str], list[str]]:
    """Each row's family key (over the ``family`` columns), its family × loop-structure key,
    and its loop-structure key across element types (:data:`STRUCTURE_FAMILY`)."""
    col = FEATURE_NAMES.index
    pointwise = (X[:, col("R")] * X[:, col("S")] == 1)
    strided = X[:, col("stage_vector_ops_strided")] > 0
    structure = np.column_stack([X[:, col("depthwise")], strided, pointwise])
    n_fam = len(family)
    across = [family.index(n) for n in STRUCTURE_FAMILY if n in family]
    both = np.column_stack([X[:, [col(n) for n in family]], structure])
    uniq, inverse = np.unique(both, axis=0, return_inverse=True)  # few distinct keys
    coarse_u = [",".join(f"{v:g}" for v in k[:n_fam]) for k in uniq]
    shape_u = [",".join(str(int(v)) for v in k[n_fam:]) for k in uniq]
    fine_u = [f"{c}|{sh}" for c, sh in zip(coarse_u, shape_u)]
    mid_u = [f"any:{','.join(f'{k[i]:g}' for i in across)}|{sh}"
             for k, sh in zip(uniq, shape_u)]
    inverse = inverse.reshape(-1)
    return ([coarse_u[i] for i in inverse], [fine_u[i] for i in inverse],
            [mid_u[i] for i in inverse])


class KernelCostModel(CostModel):
    """A kernel-latency model, baselines included (:class:`~dlas_predict.models.base.CostModel`):
    ``fit`` on features and measured seconds, ``predict`` seconds, ``predict_interval``
    (low, high) seconds, ``save`` to a directory as ``NAME.json`` (``name``, a constructor
    argument), ``load(directory, name)`` it back."""

    name: str

    @abc.abstractmethod
    def fit(self, X: np.ndarray, seconds: np.ndarray) -> "KernelCostModel":
        ...

    @classmethod
    @abc.abstractmethod
    def load(cls, directory: Path, name: str | None = None) -> "KernelCostModel":
        ...


class _JsonStateModel(KernelCostModel):
    """A kernel cost model whose fitted state is small JSON (``to_dict``/``from_dict``),
    saved as one sidecar."""

    @abc.abstractmethod
    def to_dict(self) -> dict:
        ...

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, d: dict, name: str | None = None) -> "_JsonStateModel":
        ...

    def save(self, directory: Path) -> Path:
        """A JSON sidecar holding the fitted state (``to_dict``)."""
        return write_sidecar(directory, self.name, {"format": type(self).__name__,
                                                    "state": self.to_dict(),
                                                    "versions": package_versions()})

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "_JsonStateModel":
        name = name or cls.name
        sidecar, meta = read_sidecar(directory, name, cls.__name__,
                                     "fit one and save it first")
        if meta.get("format") != cls.__name__:
            raise ModelError(f"{sidecar}: a {meta.get('format')!r}, not a {cls.__name__}")
        try:
            return cls.from_dict(meta["state"], name)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{sidecar}: unusable state ({exc})") from None


@dataclass
class StageCostModel(_JsonStateModel):
    """A kernel's time as Σ cost·term over
    :data:`~dlas_predict.models.features.STAGE_TERMS`, costs ≥ 0, fitted per kernel family (and per
    loop structure where it has enough rows, else per loop structure across element types
    where that has) by non-negative least squares on relative error.
    Additive in what the loops execute, so it extrapolates in scale, which trees cannot;
    :class:`LayerCostModel`'s trees learn what it misses."""

    family: tuple = STAGE_FAMILY                # the columns a family key is made of
    name: str = "stage"
    scale_: list = field(default_factory=list, init=False)  # each term's largest training value
    costs_: dict = field(default_factory=dict, init=False)  # family (|structure) key → costs
    default_: list = field(default_factory=list, init=False)  # fitted on every row

    def fit(self, X: np.ndarray, seconds: np.ndarray) -> "StageCostModel":
        from scipy.optimize import nnls

        X = np.asarray(X, dtype=np.float64)
        T = X[:, _STAGE]
        scale = np.maximum(T.max(axis=0), 1e-30)
        A = T / scale / np.asarray(seconds)[:, None]  # relative error: each row's target 1

        def fit(sel: np.ndarray) -> list[float]:
            return [float(c) for c in nnls(A[sel], np.ones(int(sel.sum())))[0]]

        coarse, fine, mid = _family_keys(X, self.family)
        self.scale_, self.costs_ = [float(v) for v in scale], {}
        for keys, least in ((coarse, 1), (fine, MIN_STRUCTURE_ROWS),
                            (mid, MIN_STRUCTURE_ROWS)):
            arr = np.array(keys)
            for k in sorted(set(keys)):
                sel = arr == k
                if sel.sum() >= least:
                    self.costs_[k] = fit(sel)
        self.default_ = fit(np.ones(len(X), dtype=bool))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        if not self.scale_:
            raise ModelError("the stage-cost model is not trained")
        X = np.asarray(X, dtype=np.float64)
        T = X[:, _STAGE] / np.array(self.scale_)
        coarse, fine, mid = _family_keys(X, self.family)
        # its family's costs for its loop structure; where the family has too few rows of
        # that structure, the structure's across element types; else its family's
        costs = np.array([self.costs_.get(f) or self.costs_.get(m)
                          or self.costs_.get(c, self.default_)
                          for c, f, m in zip(coarse, fine, mid)])
        # a family whose costs all came out 0 would predict 0: floor at 1 ns
        return np.maximum(np.sum(T * costs, axis=1), 1e-9)

    def to_dict(self) -> dict:
        return {"scale": self.scale_, "costs": self.costs_, "default": self.default_,
                "family": list(self.family)}

    @classmethod
    def from_dict(cls, d: dict, name: str | None = None) -> "StageCostModel":
        if len(d.get("scale", ())) != len(STAGE_TERMS):
            raise ModelError("the stage-cost model has other terms than this version computes")
        # a model saved without its family columns was keyed by the baselines' families
        family = tuple(d.get("family", _FAMILY))
        if not set(family) <= set(FEATURE_NAMES):
            raise ModelError(f"the stage-cost model's families use unknown columns {family}")
        model = cls(family=family, name=name or cls.name)
        model.scale_, model.costs_, model.default_ = d["scale"], d["costs"], d["default"]
        return model


def learned_algorithms(meta: dict) -> list[str]:
    """The algorithms whose kernels a layer model learned, from its sidecar ``meta`` (one
    saved without the list learned the grid's three)."""
    return meta.get("algorithms") or [a.value for a in GRID_ALGORITHMS]


@dataclass
class LayerCostModel(KernelCostModel):
    """Predicts a kernel's median latency (seconds) with an 80 % interval: the stage-cost
    model's time, corrected by trees trained on the log of the ratio (a tree's leaves are
    constants, so learning log latency itself could not extrapolate in scale). ``about``:
    what the caller records in the saved sidecar (device, fingerprints)."""

    seed: int = 0
    name: str = "layer"
    about: dict = field(default_factory=dict)
    models_: dict = field(default_factory=dict, init=False)  # "median", "q10", "q90" → trees
    stage_: StageCostModel = field(default_factory=StageCostModel, init=False)
    meta_: dict = field(default_factory=dict, init=False)

    def fit(self, X: np.ndarray, seconds: np.ndarray) -> "LayerCostModel":
        import lightgbm as lgb

        if len(X) < 10:
            raise ModelError(f"too few measurements to train on ({len(X)}); collect more")
        X = np.asarray(X, dtype=np.float64)
        self.stage_ = StageCostModel().fit(X, seconds)
        y = np.log(seconds) - np.log(self.stage_.predict(X))
        trees = X[:, :_TREES]
        median = dict(_MEDIAN_PARAMS, random_state=self.seed)
        quantile = dict(_LGB_PARAMS, random_state=self.seed)
        self.models_ = {"median": lgb.LGBMRegressor(objective="regression", **median)
                        .fit(trees, y).booster_}
        for q in QUANTILES:
            self.models_[f"q{int(q * 100)}"] = lgb.LGBMRegressor(
                objective="quantile", alpha=q, **quantile).fit(trees, y).booster_
        self.meta_ = {"format": MODEL_FORMAT, "features": list(FEATURE_NAMES),
                     "versions": package_versions(), "n_train": int(len(X)),
                     "trees": {key: {"num_leaves": p["num_leaves"],
                                     "n_estimators": p["n_estimators"]}
                               for key, p in (("median", _MEDIAN_PARAMS),
                                              ("quantiles", _LGB_PARAMS))},
                     **self.about}
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Median seconds."""
        return self._predict(X, ("median",))[0]

    def predict_interval(self, X: np.ndarray, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        """The central ``q`` interval (low, high) seconds, low ≤ median ≤ high: the 10 % and
        90 % quantile models' (``q`` = 0.8), rescaled for another coverage
        (:func:`~dlas_predict.models.base.at_coverage`)."""
        mid, low, high = self._predict(X, ("median", "q10", "q90"))
        return at_coverage(mid, np.minimum(low, mid), np.maximum(high, mid), q)

    def _predict(self, X: np.ndarray, keys: tuple[str, ...]) -> list[np.ndarray]:
        if not self.models_:
            raise ModelError("the cost model is not trained")
        X = np.asarray(X, dtype=np.float64)
        base, trees = np.log(self.stage_.predict(X)), X[:, self.tree_columns()]
        return [np.exp(self._raw(k, trees) + base) for k in keys]

    def knows(self, algorithm: str) -> bool:
        """Whether the model learned kernels of ``algorithm`` (:func:`learned_algorithms`)."""
        return algorithm in learned_algorithms(self.meta_)

    def tree_columns(self) -> list[int]:
        """The columns of a :data:`FEATURE_NAMES` row the trees were trained on: every tree
        feature, or, for a model saved before a feature was added, those it knew."""
        names = self.meta_.get("features", FEATURE_NAMES)[:-len(STAGE_TERMS)]
        return [TREE_FEATURES.index(n) for n in names]

    def _raw(self, key: str, trees: np.ndarray) -> np.ndarray:
        """One booster's output; the last input's outputs are remembered, so a median and
        then its interval walk the trees once."""
        digest = (trees.shape, hash(trees.tobytes()))
        memo = self.__dict__.setdefault("_memo", {})
        if memo.get("digest") != digest:
            memo.clear()
            memo["digest"] = digest
        if key not in memo:
            memo[key] = self.models_[key].predict(trees)
        return memo[key]

    def save(self, directory: Path) -> Path:
        sidecar = write_sidecar(directory, self.name,
                                {**self.meta_, "stage": self.stage_.to_dict()})
        from dlas_predict.models.trees import MODEL_SUFFIX, save_trees

        for key, booster in self.models_.items():
            save_trees(booster, Path(directory) / f"{self.name}.{key}{MODEL_SUFFIX}")
        return sidecar

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "LayerCostModel":
        name = name or cls.name
        sidecar, meta = read_sidecar(directory, name, "cost model",
                                     "train one with `dlas-predict train`")
        if meta.get("format") != MODEL_FORMAT:
            raise ModelError(f"{sidecar}: format {meta.get('format')!r}, expected "
                             f"{MODEL_FORMAT!r}; retrain with `dlas-predict train`")
        known = meta.get("features")
        if (not isinstance(known, list) or known[-len(STAGE_TERMS):] != list(STAGE_TERMS)
                or not set(known[:-len(STAGE_TERMS)]) <= set(TREE_FEATURES)):
            raise ModelError(f"{sidecar}: trained on other features than this version "
                             "computes; retrain with `dlas-predict train`")
        try:
            stage = StageCostModel.from_dict(meta.pop("stage"))
        except (KeyError, TypeError, ModelError) as exc:
            raise ModelError(f"{sidecar}: no usable stage-cost model ({exc}); retrain with "
                             "`dlas-predict train`") from None
        from dlas_predict.models.trees import model_file

        models = {key: load_trees(model_file(directory, f"{name}.{key}"),
                                  len(known) - len(STAGE_TERMS))
                  for key in ("median", *(f"q{int(q * 100)}" for q in QUANTILES))}
        model = cls(name=name)
        model.models_, model.stage_, model.meta_ = models, stage, meta
        return model


def load_trees(path: Path, n_features: int, advice: str = ""):
    """A saved LightGBM model of ``n_features`` features, walked by numpy
    (:class:`dlas_predict.models.trees.TreeModel`: predicting never imports LightGBM), or
    read by LightGBM where that reader does not handle it. ``advice`` ends the error of a
    model of another feature count."""
    from dlas_predict.models.trees import TreeFormatError, TreeModel

    try:
        model = TreeModel.load(path)
    except TreeFormatError:
        model = _lightgbm_booster(path)
    if model.num_feature() != n_features:
        raise ModelError(f"{path} expects {model.num_feature()} features, not "
                         f"{n_features}{advice}")
    return model


def _lightgbm_booster(path: Path):
    """LightGBM's own reader, for a model :class:`TreeModel` does not handle."""
    import lightgbm as lgb

    from dlas_predict.models.trees import read_model_text

    try:
        return lgb.Booster(model_str=read_model_text(path))
    except Exception as exc:  # LightGBM raises its own error type for bad files
        raise ModelError(f"cannot load {path}: {str(exc)[:200]}") from None


def _group_keys(X: np.ndarray) -> list[tuple]:
    """Each row's kernel family (:data:`_FAMILY`), as a tuple of its column values."""
    return [tuple(row) for row in X[:, [FEATURE_NAMES.index(n) for n in _FAMILY]]]


@dataclass
class RooflineBaseline(_JsonStateModel):
    """Roofline time × one efficiency factor per algorithm × compression (geometric mean)."""

    name: str = "roofline"
    factors_: dict = field(default_factory=dict, init=False)
    default_: float = field(default=1.0, init=False)

    def fit(self, X: np.ndarray, seconds: np.ndarray) -> "RooflineBaseline":
        roof = np.exp(X[:, FEATURE_NAMES.index("log_roofline_s")])
        ratio = np.log(seconds / roof)
        keys = _group_keys(X)
        self.default_, self.factors_ = float(np.exp(ratio.mean())), {}
        for k in set(keys):
            sel = np.array([kk == k for kk in keys])
            self.factors_[k] = float(np.exp(ratio[sel].mean()))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        roof = np.exp(X[:, FEATURE_NAMES.index("log_roofline_s")])
        return roof * np.array([self.factors_.get(k, self.default_) for k in _group_keys(X)])

    def to_dict(self) -> dict:
        return {"default": self.default_,
                "factors": [[list(k), v] for k, v in self.factors_.items()]}

    @classmethod
    def from_dict(cls, d: dict, name: str | None = None) -> "RooflineBaseline":
        model = cls(name=name or cls.name)
        model.factors_ = {tuple(k): float(v) for k, v in d["factors"]}
        model.default_ = float(d["default"])
        return model


@dataclass
class MacsLinearBaseline(_JsonStateModel):
    """latency = a·MACs + b, least squares per algorithm × compression."""

    name: str = "macs_linear"
    coefs_: dict = field(default_factory=dict, init=False)
    default_: tuple = field(default=(0.0, 0.0), init=False)

    @staticmethod
    def _fit(macs: np.ndarray, s: np.ndarray) -> tuple[float, float]:
        if len(macs) < 2 or np.ptp(macs) == 0:
            return float(s.mean() / max(macs.mean(), 1.0)), 0.0
        a, b = np.polyfit(macs, s, 1)
        return float(a), float(b)

    def fit(self, X: np.ndarray, seconds: np.ndarray) -> "MacsLinearBaseline":
        macs = np.exp(X[:, FEATURE_NAMES.index("log_macs")])
        keys = _group_keys(X)
        self.default_, self.coefs_ = self._fit(macs, seconds), {}
        for k in set(keys):
            sel = np.array([kk == k for kk in keys])
            self.coefs_[k] = self._fit(macs[sel], seconds[sel])
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        macs = np.exp(X[:, FEATURE_NAMES.index("log_macs")])
        out = np.array([a * m + b for m, (a, b) in
                        zip(macs, (self.coefs_.get(k, self.default_)
                                   for k in _group_keys(X)))])
        return np.maximum(out, 1e-9)  # a line can go negative on small layers

    def to_dict(self) -> dict:
        return {"default": list(self.default_),
                "coefs": [[list(k), list(v)] for k, v in self.coefs_.items()]}

    @classmethod
    def from_dict(cls, d: dict, name: str | None = None) -> "MacsLinearBaseline":
        model = cls(name=name or cls.name)
        model.coefs_ = {tuple(k): (float(v[0]), float(v[1])) for k, v in d["coefs"]}
        model.default_ = (float(d["default"][0]), float(d["default"][1]))
        return model


# ---- metrics -----------------------------------------------------------------------------
def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true))


def within(pred: np.ndarray, true: np.ndarray, tol: float = 0.10) -> float:
    return float(np.mean(np.abs(pred - true) / true <= tol))


def kendall_tau(pred: np.ndarray, true: np.ndarray) -> float:
    from scipy.stats import kendalltau

    if len(pred) < 2:
        return float("nan")
    tau = kendalltau(pred, true).statistic
    return float(tau) if not math.isnan(tau) else float("nan")


def top1_hit(pred: np.ndarray, true: np.ndarray) -> float:
    return float(int(np.argmin(pred)) == int(np.argmin(true)))


def regret(pred: np.ndarray, true: np.ndarray) -> float:
    """True latency of the predicted best over the true best (1.0 = no regret)."""
    return float(true[int(np.argmin(pred))] / true.min())


# ---- the cost of tuning ------------------------------------------------------------------
TUNING_FORMAT = "dlas-tuning-time-1"


def _tuning_terms(X: np.ndarray) -> np.ndarray:
    """Per-trial cost terms: intercept, log MACs, algorithm, sparse (knob search), dtype."""
    col = FEATURE_NAMES.index
    X = np.asarray(X, dtype=np.float64)
    return np.column_stack([
        np.ones(len(X)), X[:, col("log_macs")], X[:, col("algo_gemm")],
        X[:, col("algo_spatial_pack")], X[:, col("sparse")], X[:, col("is_float16")],
        X[:, col("is_int8")]])


@dataclass(frozen=True)
class TuningInputs:
    """What the tuning-time model reads per kernel: its :data:`FEATURE_NAMES` row, the
    trials its search is given (``budgets``) and, for a CSR kernel, its number of knob
    candidates (``search_sizes``; 0 for a dense one). To fit, also the trials each search
    ran before it stopped and its tuner."""

    features: np.ndarray
    budgets: np.ndarray
    search_sizes: np.ndarray | None = None
    trials: np.ndarray | None = None
    tuners: list[str] | None = None


@dataclass
class TuningTimeModel(CostModel):
    """Seconds a tuner spends per trial on a kernel (least squares on log seconds per trial
    over the corpus's tuned records), and the share of its budget a search runs before early
    stopping ends it (the median over the corpus, per tuner). ``about``: what the caller
    records in the saved sidecar."""

    name: str = "tuning"
    about: dict = field(default_factory=dict)
    coef_: list = field(default_factory=list, init=False)
    trial_share_: dict = field(default_factory=dict, init=False)  # tuner → trials / budget
    meta_: dict = field(default_factory=dict, init=False)

    def fit(self, X: TuningInputs, seconds: np.ndarray) -> "TuningTimeModel":
        if len(seconds) < 3:
            raise ModelError(f"{len(seconds)} tuned records: too few to learn what tuning "
                             "costs (collect with `dlas-predict tune --network ...`)")
        if X.trials is None or X.tuners is None:
            raise ValueError("fitting needs each search's trials and tuner")
        trials, budgets, tuners = np.asarray(X.trials), np.asarray(X.budgets), X.tuners
        A = _tuning_terms(X.features)
        y = np.log(np.asarray(seconds) / np.maximum(trials, 1))
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        self.coef_, self.trial_share_ = [float(c) for c in coef], {}
        for tuner in sorted(set(tuners)):
            sel = np.array([t == tuner for t in tuners])
            self.trial_share_[tuner] = float(np.median(trials[sel] / budgets[sel]))
        pred = np.exp(A @ coef) * trials
        medians = {t: float(np.median(budgets[[u == t for u in tuners]]))
                   for t in sorted(set(tuners))}
        self.meta_ = {**self.about, "format": TUNING_FORMAT, "n_train": int(len(seconds)),
                      "median_trials": medians,
                      "train_mape": mape(pred, np.asarray(seconds)),
                      "total_tuning_hours": float(np.sum(seconds) / 3600)}
        return self

    def per_trial(self, features: np.ndarray) -> np.ndarray:
        """Seconds per trial of each kernel row."""
        if not self.coef_:
            raise ModelError("the tuning-time model is not trained")
        return np.exp(_tuning_terms(features) @ np.array(self.coef_))

    def predict(self, X: TuningInputs) -> np.ndarray:
        """Seconds to tune each kernel with its budget: a CSR kernel's search ends with its
        knob candidates, a dense one's after the share of the budget MetaSchedule runs."""
        sparse = np.asarray(X.features)[:, FEATURE_NAMES.index("sparse")] > 0
        from dlas_predict.measure.records import METASCHEDULE

        ms_share = self.trial_share_.get(METASCHEDULE, 1.0)
        budgets = np.asarray(X.budgets, dtype=np.float64)
        sizes = np.zeros(len(budgets)) if X.search_sizes is None else np.asarray(X.search_sizes)
        trials = np.where(sparse, np.minimum(budgets, sizes),
                          np.maximum(1.0, budgets * ms_share))
        return self.per_trial(X.features) * trials

    def save(self, directory: Path) -> Path:
        return write_sidecar(directory, self.name, {**self.meta_, "coef": self.coef_,
                                                    "trial_share": self.trial_share_})

    @classmethod
    def load(cls, directory: Path, name: str | None = None) -> "TuningTimeModel":
        name = name or cls.name
        sidecar, meta = read_sidecar(directory, name, "tuning-time model",
                                     "train on a corpus with tuned records")
        if meta.get("format") != TUNING_FORMAT:
            raise ModelError(f"{sidecar}: format {meta.get('format')!r}, expected "
                             f"{TUNING_FORMAT!r}; retrain with `dlas-predict train`")
        model = cls(name=name)
        model.coef_, model.trial_share_ = meta.pop("coef"), meta.pop("trial_share")
        model.meta_ = meta
        return model
