"""The one interface every learned model of the tool follows, as scikit-learn's estimators do:

- ``Model(hyperparameters...)``: what is not learned goes to the constructor (a seed, a
  file name, the cache size the model's terms were computed with, provenance to record);
- ``fit(X, y, **fit_params) -> self``: learned state is kept in attributes ending in ``_``;
- ``predict(X)``: the point prediction of each row;
- ``predict_interval(X, q=0.8) -> (low, high)``: the central ``q`` interval of each row;
- ``save(directory) -> Path`` and ``Model.load(directory)``.

``X`` is an array, or an inputs record where a model reads more than one array per row
(:class:`~dlas_predict.models.netmodel.NetworkInputs`, :class:`~dlas_predict.models.ortmodel.OrtInputs`,
:class:`~dlas_predict.models.costmodel.TuningInputs`).
"""

from __future__ import annotations

import abc
from pathlib import Path
from statistics import NormalDist

import numpy as np

#: The coverage the models' own intervals are fitted at (their 10 % and 90 % quantiles).
FITTED_COVERAGE = 0.8
#: The normal quantile of such an interval's ends: a Gaussian's 80 % interval in log space
#: is the mean ± Z80 standard deviations.
Z80 = 1.2816


def check_coverage(q: float) -> float:
    """``q`` if it is a coverage (strictly between 0 and 1), else a ValueError."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"an interval's coverage must lie strictly between 0 and 1, not {q}")
    return q


def group_folds(groups, k: int, seed: int) -> np.ndarray:
    """Each row's fold (0 to ``k`` - 1), whole groups (networks) at a time: the sorted group
    names dealt by a seeded permutation."""
    names = np.array(sorted(set(groups)))
    fold_of = dict(zip(names, np.random.default_rng(seed).permutation(len(names)) % k))
    return np.array([fold_of[g] for g in groups])


def _z(q: float) -> float:
    return NormalDist().inv_cdf(0.5 + q / 2)


def at_coverage(mid: np.ndarray, low: np.ndarray, high: np.ndarray, q: float,
                fitted: float = FITTED_COVERAGE, log: bool = True
                ) -> tuple[np.ndarray, np.ndarray]:
    """An interval fitted at coverage ``fitted`` rescaled to coverage ``q``: each side's
    distance from ``mid`` (in log space where ``log``, as latencies' errors are relative)
    times z(q) / z(fitted), as a normal error would scale. ``q == fitted`` returns the
    interval unchanged."""
    check_coverage(q)
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    if q == fitted:
        return low, high
    k = _z(q) / _z(fitted)
    mid = np.asarray(mid, dtype=np.float64)
    if log:
        m = np.log(np.maximum(mid, 1e-300))
        return (np.exp(m - k * (m - np.log(np.maximum(low, 1e-300)))),
                np.exp(m + k * (np.log(np.maximum(high, 1e-300)) - m)))
    return mid - k * (mid - low), mid + k * (high - mid)


class CostModel(abc.ABC):
    """The interface of the module's docstring. A model without an interval of its own
    gives its point prediction as both ends."""

    @abc.abstractmethod
    def fit(self, X, y, **fit_params) -> "CostModel":
        ...

    @abc.abstractmethod
    def predict(self, X) -> np.ndarray:
        ...

    def predict_interval(self, X, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        check_coverage(q)
        pred = self.predict(X)
        return pred, pred

    @abc.abstractmethod
    def save(self, directory: Path) -> Path:
        ...

    @classmethod
    @abc.abstractmethod
    def load(cls, directory: Path) -> "CostModel":
        ...
