"""Whole networks priced from their layers, on any device with a few latencies.

A network is described by what its layers do, by kind (:data:`TERMS`): the multiply-adds of
its k×k, pointwise, depthwise and fully connected layers, the bytes its convs, pools,
elementwise ops and other layers move, how many layers of each kind it runs, and a constant;
and by the terms of the onnxruntime model (:mod:`~dlas_predict.models.ortmodel`) for the
network run dense in float32. A device prices those terms: its latency is ``terms · costs``,
the costs non-negative. The layer-kind costs are fitted (:func:`fit_costs`, relative error)
wherever a device timed enough networks: HELP's 21 devices on NAS-Bench-201 cells, and the
whole networks of the shipped corpora (each CPU profile and GPU, each backend its own
basis). Each shipped onnxruntime model is a basis device of its own, its costs the model's
(:func:`onnxruntime_basis`).

A new device known by a few latencies (``adapt``: a network and its time, in whatever runtime
timed it) is priced through the basis device whose costs explain those latencies best once
scaled: its price split into compute (multiply-adds) and the rest, both parts scaled alike
or each its own (shrunk towards one scale), or through a blend of the two basis devices
that explain them best (each one's compute and rest scaled, shrunk towards the first
alone); the parametrisation with the lowest leave-one-out error on the shots answers
(:func:`fit_few_shot`), with an offset per network family where the shots mix families
(:func:`network_family`). Its 80 % interval comes from the leave-one-out residuals of the
whole procedure (the basis devices chosen again without each shot), so what ``adapt``
reports is what ``predict`` then does.

HELP's latencies are read from the public data folder at run time and never shipped; the
NAS-Bench-201 cells are built here and their terms cached under DLAS_HOME.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlas_predict.errors import DlasError
from dlas_predict.models.base import FITTED_COVERAGE, Z80, at_coverage
from dlas_predict.models.ortmodel import MATRIX_PREFIX, RECURRENT_PREFIX
from dlas_predict.models.ortmodel import TERMS as ORT_TERMS

#: The layer-kind terms, fitted per device, and their units (multiply-adds in G, bytes in
#: MB, layers in hundreds). A k×k conv is one of at most 3×3; a larger window is apart, as
#: runtimes run the two with other algorithms.
LAYER_TERMS = ("kxk_gmacs", "pointwise_gmacs", "depthwise_gmacs", "fc_gmacs",
               "large_kernel_gmacs", "conv_mb", "pool_mb", "elementwise_mb", "other_mb",
               "kxk_layers", "pointwise_layers", "depthwise_layers", "pool_layers",
               "elementwise_layers", "other_layers", "constant")
_UNITS = np.array([1e-9] * 5 + [1e-6] * 4 + [1e-2] * 6 + [1.0])
#: The network's families as the onnxruntime model fits them apart (CNNs, matrix networks,
#: recurrent networks): the prefixes of their blocks of :data:`ORT_TERMS`.
ORT_FAMILIES = ("", MATRIX_PREFIX, RECURRENT_PREFIX)
#: Every term a network is described by: the layer kinds, then the onnxruntime model's
#: terms of the network run dense in float32 (its units; NCHWc block :data:`ORT_BLOCK`),
#: in its family's block and zero in the others. A device fitted on latencies prices the
#: layer kinds; a shipped onnxruntime model (:func:`onnxruntime_basis`) prices its blocks.
TERMS = LAYER_TERMS + tuple(f"onnxruntime {fam}{t}" for fam in ORT_FAMILIES
                            for t in ORT_TERMS)
#: The NCHWc block the onnxruntime terms are counted with: the shipped onnxruntime models'
#: (their machines have AVX-512).
ORT_BLOCK = 16
_LAYER = np.arange(len(TERMS)) < len(LAYER_TERMS)
#: Layer kinds of the graph reader counted as elementwise work (per element, no reduction).
_ELEMENTWISE = ("elementwise", "activation", "batchnorm")
#: The version of :data:`TERMS`' definition, in every cache and saved fit: a number bumped
#: when a term's meaning changes, and a digest of the terms' names, so that a term added or
#: removed (the onnxruntime model's) cannot leave a cache or a saved fit of another length.
TERMS_VERSION = "5-" + hashlib.sha1(" ".join(TERMS).encode()).hexdigest()[:8]
#: NAS-Bench-201 cells sampled for HELP's basis (seeded), and the seed.
HELP_SAMPLE = 800
_HELP_SEED = 0
#: Networks a basis device needs before its costs are fitted.
MIN_BASIS_NETWORKS = 8


def layer_terms(net) -> np.ndarray:
    """The :data:`TERMS` of a :class:`~dlas_predict.networks.graph.Network`."""
    return np.r_[_layer_kind_terms(net), _onnxruntime_terms(net)]


def _onnxruntime_terms(net) -> np.ndarray:
    """The onnxruntime model's terms of ``net`` run dense in float32, in its family's block."""
    from dlas_predict.models.ortmodel import fitted_modes, ort_terms
    from dlas_predict.networks.matrix import is_matrix_layer
    from dlas_predict.networks.recurrent import is_step_product
    from dlas_predict.networks.summary import NetworkSummary

    convs = net.convs()
    specs = [c.spec for c in convs]
    steps = [is_step_product(c.name) for c in convs]
    x = ort_terms(specs, [0.0] * len(specs), NetworkSummary.of(net), "fp32", False, ORT_BLOCK,
                  [is_matrix_layer(c.name) for c in convs], steps)
    mode = fitted_modes(x[None], ["fp32"], (any(steps),))[0]
    family = next(f for f in reversed(ORT_FAMILIES) if mode.startswith(f))
    out = np.zeros(len(ORT_FAMILIES) * len(ORT_TERMS))
    at = ORT_FAMILIES.index(family) * len(ORT_TERMS)
    out[at:at + len(ORT_TERMS)] = x
    return out


def _layer_kind_terms(net) -> np.ndarray:
    """The :data:`LAYER_TERMS` of ``net``."""
    f = np.zeros(len(LAYER_TERMS))
    for layer in net.layers:
        spec = layer.conv
        if spec is not None:
            if spec.groups > 1 and spec.groups == spec.C:
                f[2] += layer.macs
                f[11] += 1
            elif spec.R * spec.S == 1:
                f[1] += layer.macs
                f[10] += 1
            else:  # k×k up to 3×3, and larger windows (5×5, 7×7) apart
                f[0 if spec.R * spec.S <= 9 else 4] += layer.macs
                f[9] += 1
            f[5] += layer.bytes_moved
        elif layer.op in ("Gemm", "MatMul"):
            f[3] += layer.macs
            f[8] += layer.bytes_moved
            f[14] += 1
        elif layer.kind == "pool":
            f[6] += layer.bytes_moved
            f[12] += 1
        elif layer.kind in _ELEMENTWISE:
            f[7] += layer.bytes_moved
            f[13] += 1
        else:
            f[8] += layer.bytes_moved
            f[14] += 1
    f[15] = 1.0
    return f * _UNITS


def macs_of(terms: np.ndarray) -> np.ndarray:
    """The multiply-adds (in G) of rows of terms: the MACs baseline's input."""
    return np.atleast_2d(terms)[:, :5].sum(axis=1)


#: A robust fit (:func:`fit_costs`) leaves out rows beyond this many median absolute
#: deviations of the log residual, and refits at most this many times.
OUTLIER_MADS = 3.0
OUTLIER_ROUNDS = 3


def fit_costs(X: np.ndarray, ms: np.ndarray, robust: bool = False) -> np.ndarray:
    """A device's non-negative costs per layer-kind term (the others zero), fitted on
    networks' terms ``X`` and their latencies ``ms`` by relative error (a latency below a
    fifth of the median weighs as that fifth: tables that round to whole milliseconds hold
    near-zero times). ``robust``: fitted again without the rows the fit misses by more than
    :data:`OUTLIER_MADS` median absolute deviations of the log residual (and by more than
    25 %), until none is left out anew: a public table's rows that were timed otherwise."""
    from scipy.optimize import nnls

    X, ms = np.atleast_2d(np.asarray(X, float)), np.asarray(ms, float)

    def fit(rows: np.ndarray) -> np.ndarray:
        w = 1.0 / np.maximum(ms[rows], 0.2 * np.median(ms[rows]))
        costs = np.zeros(len(TERMS))
        costs[_LAYER] = nnls(X[rows][:, _LAYER] * w[:, None], ms[rows] * w)[0]
        return costs

    keep = np.ones(len(ms), bool)
    costs = fit(keep)
    for _ in range(OUTLIER_ROUNDS if robust else 0):
        r = np.log(np.maximum(X @ costs, 1e-9) / ms)
        med = np.median(r[keep])
        mad = 1.4826 * np.median(np.abs(r[keep] - med))
        new = np.abs(r - med) <= max(OUTLIER_MADS * mad, math.log(1.25))
        if np.array_equal(new, keep) or new.sum() < MIN_BASIS_NETWORKS:
            break
        keep = new
        costs = fit(keep)
    return costs


@dataclass
class Basis:
    """Devices whose costs are known: one row of :data:`TERMS` costs each, with where the
    latencies they were fitted on came from and how far the fit is from them (the RMS of
    log(fitted / measured))."""

    devices: list[str]
    costs: np.ndarray            # devices × terms
    sources: list[str]
    spreads: list[float] = field(default_factory=list)
    #: Per device, the largest value of each term among the networks its costs were fitted
    #: on: a network beyond it is priced by extrapolation.
    supports: np.ndarray | None = None

    def predict_ms(self, X: np.ndarray) -> np.ndarray:
        """Networks × devices of predicted milliseconds."""
        return np.maximum(np.atleast_2d(X) @ self.costs.T, 1e-6)

    def without(self, drop) -> "Basis":
        keep = [i for i, d in enumerate(self.devices) if not drop(d)]
        return Basis([self.devices[i] for i in keep], self.costs[keep],
                     [self.sources[i] for i in keep], [self.spreads[i] for i in keep],
                     self.supports[keep] if self.supports is not None else None)

    def __add__(self, other: "Basis") -> "Basis":
        sup = None
        if self.supports is not None and other.supports is not None:
            sup = np.vstack([self.supports, other.supports])
        return Basis(self.devices + other.devices, np.vstack([self.costs, other.costs]),
                     self.sources + other.sources, self.spreads + other.spreads, sup)

    def own_fit(self, device: str) -> "FewShotFit":
        """A basis device priced by its own costs (trained on its data), its interval from
        its fit's spread."""
        if device not in self.devices:
            raise DlasError(f"no whole-network costs of {device!r}")
        j = self.devices.index(device)
        support = self.supports[j].tolist() if self.supports is not None else []
        return FewShotFit(device, self.sources[j], self.costs[j].tolist(), [1.0, 1.0],
                          Z80 * self.spreads[j], 0, [], support=support)


def basis_of(columns: dict[str, tuple[np.ndarray, np.ndarray]], source: str,
             robust: bool = False) -> Basis:
    """A basis from ``{device: (terms, ms)}``; a device with too few networks is left out.
    ``robust``: each device's costs fitted without its table's outlying rows
    (:func:`fit_costs`), and its spread read from the quantiles of its residuals (the
    80 % interval holds 80 % of the rows it was fitted on, outliers included), not their
    RMS."""
    names, rows, spreads, supports = [], [], [], []
    for name, (X, ms) in columns.items():
        if len(ms) >= MIN_BASIS_NETWORKS:
            names.append(name)
            rows.append(fit_costs(X, ms, robust))
            fitted = np.maximum(np.asarray(X) @ rows[-1], 1e-6)
            r = np.log(fitted / np.asarray(ms))
            if robust:
                lo, hi = np.quantile(r, [0.1, 0.9])
                spreads.append(float(max(abs(lo), abs(hi)) / Z80))
            else:
                spreads.append(float(np.sqrt(np.mean(r ** 2))))
            supports.append(np.asarray(X).max(axis=0))
    shape = (len(rows), len(TERMS))
    return Basis(names, np.array(rows).reshape(shape), [source] * len(names), spreads,
                 np.array(supports).reshape(shape))


# ---- few shots -----------------------------------------------------------------------------
#: The terms of multiply-adds: a basis device's price of a network splits into its compute
#: (these) and the rest (bytes, layers, the constant).
_COMPUTE = np.array([1.0 if i < 5 or (not _LAYER[i] and t.endswith("macs")) else 0.0
                     for i, t in enumerate(TERMS)])
#: Basis devices whose one-offset fit is best are the candidates of the two fits.
_CANDIDATES = 8
#: The two-scale fit's pull towards one scale for both parts, as many rows as it weighs.
_SPLIT_PRIOR = 1.0


def _split_fit(c: np.ndarray, o: np.ndarray, ms: np.ndarray) -> tuple[float, float]:
    """Scales (compute, rest) of a basis device's two parts fitted to ``ms`` by relative
    error, shrunk towards the one scale that fits both (each scale's ratio to it: the pull
    is the same whatever the basis device's speed)."""
    from scipy.optimize import nnls

    one = math.exp(float(np.mean(np.log(ms) - np.log(np.maximum(c + o, 1e-12)))))
    w = one / ms
    A = np.r_[np.c_[c, o] * w[:, None], math.sqrt(_SPLIT_PRIOR) * np.eye(2)]
    t = np.r_[np.ones(len(ms)), math.sqrt(_SPLIT_PRIOR) * np.ones(2)]
    a, b = nnls(A, t)[0]
    return float(one * a), float(one * b)


def _apply(c, o, scales: tuple[float, float]):
    return np.maximum(scales[0] * c + scales[1] * o, 1e-9)


#: The network families the few-shot fit offsets apart (:func:`network_family`): CNNs,
#: matrix networks (MLPs, transformers) and recurrent networks.
FAMILIES = ("cnn", "matrix", "recurrent")
#: The pull of a family's offset towards none, in shots: a family of ``n`` shots keeps
#: ``n / (n + FAMILY_PRIOR)`` of its shots' median residual.
FAMILY_PRIOR = 2.0


def network_family(X: np.ndarray) -> list[str]:
    """Each row's network family (:data:`FAMILIES`), read from its terms: the block of
    onnxruntime terms its work is counted in (a network with none: a CNN)."""
    X = np.atleast_2d(X)
    n, k = len(LAYER_TERMS), len(ORT_TERMS)
    out = []
    for row in X:
        nonzero = [i for i in range(len(ORT_FAMILIES)) if np.any(row[n + i * k:n + (i + 1) * k])]
        out.append(FAMILIES[nonzero[-1]] if nonzero else FAMILIES[0])
    return out


def _family_offsets(residuals: np.ndarray, families: list[str]) -> dict[str, float]:
    """Log offsets by network family of the shots' residuals (log measured over predicted),
    each its median shrunk towards none by :data:`FAMILY_PRIOR`; none where the shots are of
    one family (their scale already fits it)."""
    if len(set(families)) < 2:
        return {}
    fam = np.array(families)
    return {f: float(np.median(residuals[fam == f]) * np.sum(fam == f)
                     / (np.sum(fam == f) + FAMILY_PRIOR)) for f in sorted(set(families))}


#: The parametrisations of the few-shot fit (:func:`fit_few_shot`): one scale for a basis
#: device's whole price, one for its compute and one for the rest, or a blend of two basis
#: devices (each one's compute and rest scaled, :func:`_blend`).
PARAMETRISATIONS = ("one scale", "two scales", "two basis devices")
#: A blend's pull towards its first basis device alone, scaled, in shots per scale.
_BLEND_PRIOR = 0.1


def _one_scale(C: np.ndarray, O: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per basis device (column of compute ``C`` and rest ``O``, shots × devices): the
    leave-one-out RMS log error of its price scaled by one factor, and the shots' log
    residuals (log measured over its price)."""
    n = len(ms)
    r = np.log(ms)[:, None] - np.log(np.maximum(C + O, 1e-12))
    loo0 = (r - (r.sum(axis=0) - r) / (n - 1)) if n >= 2 else np.zeros_like(r)
    return np.sqrt(np.mean(loo0 ** 2, axis=0)), r


def _blend(C: np.ndarray, O: np.ndarray, ms: np.ndarray) -> tuple[tuple[int, int], np.ndarray]:
    """The two basis devices whose prices scaled by one factor predict ``ms`` best (by
    leave-one-out), and the non-negative scales of the first's compute and rest and the
    second's (four) that fit ``ms`` by relative error, each pulled towards the first device
    alone at its one scale by :data:`_BLEND_PRIOR` shots (in units of the scale's column,
    so the pull is the same whatever the devices' speeds)."""
    from scipy.optimize import nnls

    score, r = _one_scale(C, O, ms)
    j1, j2 = (int(j) for j in np.argsort(score, kind="stable")[:2])
    A = np.c_[C[:, j1], O[:, j1], C[:, j2], O[:, j2]] / ms[:, None]
    one = math.exp(float(np.mean(r[:, j1])))
    size = np.maximum(np.abs(A).mean(axis=0), 1e-12)
    pull = math.sqrt(_BLEND_PRIOR) * size
    coef = nnls(np.r_[A, np.diag(pull)],
                np.r_[np.ones(len(ms)), pull * np.array([one, one, 0.0, 0.0])])[0]
    return (j1, j2), coef


def _select(C: np.ndarray, O: np.ndarray, ms: np.ndarray, variants=(0, 1)
            ) -> tuple[int, tuple[float, float]]:
    """The basis device (column of compute ``C`` and rest ``O``, shots × devices) and the
    scales of its parts that predict ``ms`` with the lowest leave-one-out error: one scale
    for both, or a scale each (chosen by the same error, among ``variants``: indices of
    :data:`PARAMETRISATIONS`)."""
    n = len(ms)
    score0, r = _one_scale(C, O, ms)
    variants = variants if n >= 3 else (0,)  # two scales need three rows
    best = None
    for j in np.argsort(score0, kind="stable")[:_CANDIDATES]:
        fits = [(float(score0[j]), 0)] if 0 in variants else []
        if 1 in variants:
            errs = []
            for k in range(n):
                keep = np.arange(n) != k
                sc = _split_fit(C[keep, j], O[keep, j], ms[keep])
                errs.append(math.log(_apply(C[k, j], O[k, j], sc) / ms[k]))
            fits.append((float(np.sqrt(np.mean(np.square(errs)))), 1))
        for score, variant in fits:
            if best is None or score < best[0]:
                best = (score, int(j), variant)
    _, j, variant = best
    if variant == 0:
        one = math.exp(float(np.mean(r[:, j])))
        return j, (one, one)
    return j, _split_fit(C[:, j], O[:, j], ms)


@dataclass
class FewShotFit:
    """A device priced through one basis device's costs, its compute and the rest each
    scaled (``scales``; one scale for both where that predicts the shots better), or
    through a blend of two (``blend``: their names; ``costs`` the blend, ``scales`` one),
    with an 80 % interval of ``exp(±half_width)``."""

    basis_device: str
    basis_source: str
    costs: list[float]
    scales: list[float]
    half_width: float
    shots: int
    #: Leave-one-out over the shots, the whole choice made again each time: log(pred/ms).
    loo_log_errors: list[float] = field(default_factory=list)
    #: The basis device's :attr:`Basis.supports` row, and the shots' own largest terms.
    support: list[float] = field(default_factory=list)
    terms_version: str = TERMS_VERSION
    #: Log offsets by network family (:func:`network_family`), where the shots hold more
    #: than one: a family the shots lack takes none.
    family_offsets: dict[str, float] = field(default_factory=dict)
    #: The two basis devices blended (:func:`_blend`), or none, and the blend's scales
    #: (the first's compute and rest, the second's).
    blend: list[str] = field(default_factory=list)
    blend_scales: list[float] = field(default_factory=list)

    @property
    def offset(self) -> float:
        """The log scale of a network's whole price where both parts scale alike."""
        return math.log(self.scales[0]) if self.scales[0] == self.scales[1] else float("nan")

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.atleast_2d(X)
        costs = np.asarray(self.costs)
        mid = _apply((X * _COMPUTE) @ costs, (X * (1 - _COMPUTE)) @ costs, self.scales)
        if self.family_offsets:
            mid = mid * np.exp([self.family_offsets.get(f, 0.0) for f in network_family(X)])
        return mid

    def extrapolation(self, X: np.ndarray) -> np.ndarray:
        """How far beyond the networks the costs were fitted on each row of ``X`` lies: the
        largest ratio of a term to the largest value seen (10 for work of a kind never
        seen), at least 1."""
        X = np.atleast_2d(X)
        if not self.support:
            return np.ones(len(X))
        sup = np.asarray(self.support)
        ratio = np.where(sup > 0, X / np.where(sup > 0, sup, 1.0), np.where(X > 0, 10.0, 0.0))
        # the block of terms the costs price: the layer kinds, or an onnxruntime model's
        block = _LAYER if np.any(np.asarray(self.costs)[_LAYER] > 0) else ~_LAYER
        ratio[:, ~block] = 1.0
        ratio[:, TERMS.index("constant")] = 1.0
        return np.maximum(ratio.max(axis=1), 1.0)

    def predict_interval(self, X: np.ndarray, q: float = FITTED_COVERAGE
                         ) -> tuple[np.ndarray, np.ndarray]:
        """The 80 % interval (``q`` = 0.8; rescaled for another coverage): the shots' (or the
        fit's) spread, widened by half the log of :meth:`extrapolation` where a network lies
        beyond the data."""
        mid = self.predict(X)
        half = np.sqrt(self.half_width ** 2 + (0.5 * np.log(self.extrapolation(X))) ** 2)
        return at_coverage(mid, mid * np.exp(-half), mid * np.exp(half), q)

    def describe(self) -> str:
        a, b = self.scales
        what = "costs" if self.basis_source == ORT_SOURCE else "layer-kind costs"
        families = "".join(f", {f} networks ×{math.exp(o):.2f}"
                           for f, o in self.family_offsets.items())
        if self.blend:
            a1, b1, a2, b2 = self.blend_scales
            return (f"a blend of {self.blend[0]}'s {what} (compute ×{a1:.3g}, the rest "
                    f"×{b1:.3g}) and {self.blend[1]}'s (×{a2:.3g}, ×{b2:.3g}){families}")
        if a == b:
            return f"{self.basis_device}'s {what} scaled by {a:.3g}{families}"
        return (f"{self.basis_device}'s {what}, its compute scaled by {a:.3g} and the rest by "
                f"{b:.3g}{families}")

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FewShotFit":
        if d.get("terms_version") != TERMS_VERSION or "scales" not in d:
            raise DlasError("an adapted model of another version of the layer terms: run "
                            "`adapt` again")
        return cls(**d)


def fit_few_shot(basis: Basis, X: np.ndarray, ms: np.ndarray,
                 parametrisation: str | None = None) -> FewShotFit:
    """Fit a device on ``X`` (terms of its timed networks) and ``ms`` (their latencies);
    ``parametrisation`` (one of :data:`PARAMETRISATIONS`) fixes how, chosen by
    leave-one-out error otherwise (the whole choice made again without each shot)."""
    X, ms = np.atleast_2d(np.asarray(X, float)), np.asarray(ms, float)
    kind = None if parametrisation is None else PARAMETRISATIONS.index(parametrisation)
    if not len(basis.devices):
        raise DlasError("no basis device to price networks from (no public data and no "
                        "shipped whole-network corpus)")
    if len(ms) < 2:
        raise DlasError(f"{len(ms)} latency given; a device needs at least 2")
    n = len(ms)
    can_blend = n >= 3 and len(basis.devices) >= 2
    if kind == 2 and not can_blend:
        raise DlasError("a blend of two basis devices needs three latencies and two basis "
                        f"devices ({n} and {len(basis.devices)} here)")
    C = (X * _COMPUTE) @ basis.costs.T
    O = (X * (1 - _COMPUTE)) @ basis.costs.T
    fams = network_family(X)

    # each fit of some rows: (costs, scales of its compute and rest, basis devices' indices,
    # the blend's scales or none)
    def single(rows: np.ndarray):
        j, scales = _select(C[rows], O[rows], ms[rows], (0, 1) if kind is None else (kind,))
        return basis.costs[j], scales, [j], []

    def blended(rows: np.ndarray):
        (j1, j2), a = _blend(C[rows], O[rows], ms[rows])
        c1, c2 = basis.costs[j1], basis.costs[j2]
        costs = _COMPUTE * (a[0] * c1 + a[2] * c2) + (1 - _COMPUTE) * (a[1] * c1 + a[3] * c2)
        return costs, (1.0, 1.0), [j1, j2], a.tolist()

    def priced(costs, scales, rows) -> np.ndarray:
        return _apply((X[rows] * _COMPUTE) @ costs, (X[rows] * (1 - _COMPUTE)) @ costs, scales)

    def with_loo(fit):
        """The fit on every shot, its family offsets, and its leave-one-out log errors."""
        everything = np.arange(n)
        costs, scales, js, blend_scales = fit(everything)
        offsets = _family_offsets(np.log(ms / priced(costs, scales, everything)), fams)
        loo = np.empty(n)
        for i in range(n):
            rows = np.flatnonzero(everything != i)
            ci, si, _, _ = fit(rows)
            oi = _family_offsets(np.log(ms[rows] / priced(ci, si, rows)),
                                 [fams[k] for k in rows])
            loo[i] = math.log(priced(ci, si, np.array([i]))[0] / ms[i]) + oi.get(fams[i], 0.0)
        return costs, scales, js, blend_scales, offsets, loo

    fits = []
    if kind != 2:
        fits.append(with_loo(single))
    if kind == 2 or (kind is None and can_blend):
        fits.append(with_loo(blended))
    costs, scales, js, blend_scales, offsets, loo = min(
        fits, key=lambda f: float(np.mean(f[-1] ** 2)))
    spread = float(np.sqrt(np.mean(loo ** 2)))
    half = Z80 * spread * math.sqrt(1 + 1 / n)
    support = X.max(axis=0)
    if basis.supports is not None:
        support = np.maximum(basis.supports[js].max(axis=0), support)
    names = [basis.devices[j] for j in js]
    return FewShotFit(" + ".join(names), basis.sources[js[0]], costs.tolist(), list(scales),
                      half, n, loo.tolist(), support.tolist(), family_offsets=offsets,
                      blend=names if len(js) == 2 else [], blend_scales=blend_scales)


def macs_fit(X: np.ndarray, ms: np.ndarray):
    """The baseline: log latency linear in log MACs, fitted on the same shots; returns the
    function that predicts milliseconds from terms."""
    lx, ly = np.log(np.maximum(macs_of(X), 1e-12)), np.log(np.asarray(ms, float))
    xc = lx - lx.mean()
    slope = float(xc @ (ly - ly.mean()) / (xc @ xc)) if xc @ xc > 0 else 0.0
    icept = float(ly.mean() - slope * lx.mean())
    return lambda Xq: np.exp(icept + slope * np.log(np.maximum(macs_of(Xq), 1e-12)))


def network_terms(model: str) -> np.ndarray:
    """The terms of an ONNX file or zoo network (``zoo:NAME``)."""
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network

    return layer_terms(read_network(zoo.resolve(model)))


def cell_terms(arch: str) -> np.ndarray:
    """The terms of a NAS-Bench-201 cell (its architecture string), built here."""
    return help_terms([arch])[0]


# ---- the bases ------------------------------------------------------------------------------
def _cached_terms(name: str, keys: list[str], compute, shipped: Path | None = None
                  ) -> dict[str, list[float] | None]:
    """Terms by key, from the cache file ``name`` under DLAS_HOME (a new cache starts from
    the ``shipped`` ones, where they are of today's terms), the missing ones computed
    (``compute(key)``: the terms, or None where the network cannot be built) and kept."""
    import json
    import lzma

    from dlas_predict.paths import cache_dir

    path = cache_dir("layerwise") / f"{name}-terms-v{TERMS_VERSION}.json"
    cached: dict[str, list[float] | None] = {}
    try:
        if path.is_file():
            cached = json.loads(path.read_text())
        elif shipped is not None and shipped.is_file():
            cached = json.loads(lzma.decompress(shipped.read_bytes()))
    except (ValueError, lzma.LZMAError):
        cached = {}
    missing = [k for k in dict.fromkeys(keys) if k not in cached]
    for k in missing:
        cached[k] = compute(k)
    if missing:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached))
        tmp.replace(path)
    return cached


def help_terms(archs: list[str]) -> np.ndarray:
    """The terms of NAS-Bench-201 cells (architecture strings), built here, cached under
    DLAS_HOME by architecture."""
    from dlas_predict.networks import nasbench201 as nb
    from dlas_predict.networks.graph import network_of_proto

    def compute(a: str) -> list[float]:
        arch = nb.parse_arch(a)
        return layer_terms(network_of_proto(nb.build(arch),
                                            arch.file_name.removesuffix(".onnx"))).tolist()

    cached = _cached_terms("nasbench201", archs, compute)
    return np.array([cached[a] for a in archs])


def help_sample(n_archs: int, seed: int = _HELP_SEED) -> list[int]:
    """The benchmark indices of HELP's basis cells (a seeded sample)."""
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(15625, size=min(n_archs, 15625), replace=False).tolist())


def help_basis(data: Path | None = None, indices: list[int] | None = None) -> Basis:
    """HELP's 21 devices, their costs fitted on a sample of NAS-Bench-201 cells."""
    from dlas_predict.crossdev.sources import help_matrix

    mat = help_matrix(data)
    idx = indices if indices is not None else help_sample(HELP_SAMPLE)
    X = help_terms([mat.targets[i] for i in idx])
    cols = {}
    for j, d in enumerate(mat.devices):
        y = mat.log_ms[idx, j]
        ok = np.isfinite(y)
        cols[f"help:{d}"] = (X[ok], np.exp(y[ok]))
    # a public table: the rows of a device timed otherwise than the rest are left out
    return basis_of(cols, "help", robust=True)


def corpus_columns(dtype_config: str = "dense") -> dict[str, tuple[list[str], np.ndarray]]:
    """The shipped corpora's whole networks of ``dtype_config``: per (machine, device,
    backend or algorithm), the networks and their fastest timed runs (ms)."""
    import pandas as pd

    from dlas_predict.corpus.kernels import modelled_seconds
    from dlas_predict.paths import CORPUS_SNAPSHOTS

    out: dict[str, tuple[list[str], np.ndarray]] = {}
    files = sorted(CORPUS_SNAPSHOTS.glob("*.wholenet.parquet")) + sorted(
        CORPUS_SNAPSHOTS.glob("machines/*/*.wholenet.parquet"))
    for f in files:
        machine = f.parent.name if f.parent.parent.name == "machines" else "shipped"
        df = pd.read_parquet(f, columns=["device", "network", "config", "algorithm",
                                         "run_secs", "median_s", "error"])
        df = df[df.error.isna() & (df.config == dtype_config)]
        for (dev, alg), g in df.groupby(["device", "algorithm"]):
            best: dict[str, float] = {}
            for row in g.to_dict("records"):
                s = modelled_seconds(row)
                best[row["network"]] = min(best.get(row["network"], s), s)
            key = f"{machine}:{dev}:{alg}"
            out[key] = (list(best), np.array(list(best.values())) * 1e3)
    return out


def named_network_terms(name: str) -> list[float] | None:
    """The terms of a network the corpora name, built again by name (None: it cannot be)."""
    from dlas_predict.networks.zoo import named_network

    net = named_network(name)
    return None if net is None else layer_terms(net).tolist()


def shipped_terms_path() -> Path:
    """The shipped terms of the networks the shipped corpora name, of today's terms (they
    take about half a minute to build again): ``models_store/layerwise/``."""
    from dlas_predict.paths import MODELS_STORE

    return MODELS_STORE / "layerwise" / f"corpus-terms-v{TERMS_VERSION}.json.xz"


def corpus_network_names() -> list[str]:
    """Every network the shipped corpora time whole (any configuration)."""
    return sorted({n for names, _ in corpus_columns().values() for n in names})


def write_shipped_terms() -> tuple[Path, bool]:
    """Build the terms of :func:`corpus_network_names` and ship them
    (:func:`shipped_terms_path`; the files of other terms' versions go); returns the path
    and whether it changed (the same terms give the same bytes)."""
    import json
    import lzma

    from dlas_predict.files import replace_if_changed, scratch_path

    path = shipped_terms_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    terms = {n: named_network_terms(n) for n in corpus_network_names()}
    tmp = scratch_path(path)
    tmp.write_bytes(lzma.compress(json.dumps(terms, sort_keys=True).encode(), preset=9))
    changed = replace_if_changed(tmp, path)
    for old in path.parent.glob("corpus-terms-v*.json.xz"):
        if old != path:
            old.unlink()
    return path, changed


def network_terms_by_name(names: list[str]) -> dict[str, np.ndarray]:
    """The terms of networks the corpora name (zoo networks and generated ones, built again
    by name), cached under DLAS_HOME from the shipped ones; a name that cannot be built is
    left out."""
    cached = _cached_terms("corpus", names, named_network_terms, shipped_terms_path())
    return {n: np.array(cached[n]) for n in names if cached.get(n) is not None}


def corpus_basis(drop=lambda name: False, columns=None) -> Basis:
    """The shipped corpora's devices and backends (dense whole networks), each its own basis
    device; ``drop(name)`` leaves some out; ``columns``: :func:`corpus_columns`, where the
    caller has read them."""
    cols = {k: v for k, v in (columns or corpus_columns()).items() if not drop(k)}
    terms = network_terms_by_name(sorted({n for names, _ in cols.values() for n in names}))
    fitted = {}
    for key, (names, ms) in cols.items():
        keep = [i for i, n in enumerate(names) if n in terms]
        if keep:
            fitted[key] = (np.array([terms[names[i]] for i in keep]), ms[keep])
    return basis_of(fitted, "corpus")


#: The source of a basis device that is a shipped onnxruntime model.
ORT_SOURCE = "onnxruntime model"


def onnxruntime_basis(drop=lambda name: False, columns=None) -> Basis:
    """The shipped onnxruntime models (each CPU's, each profile's), each a basis device that
    prices the onnxruntime terms of a network run dense in float32 (its family's fit), named
    as :func:`corpus_columns` names the corpus it was fitted on, with ``model``;
    ``drop(name)`` leaves some out; ``columns`` as :func:`corpus_basis`. Its support: that
    corpus's onnxruntime networks (none where the corpus is not shipped)."""
    from dlas_predict.models.costmodel import ModelError
    from dlas_predict.models.ortmodel import FILE, OrtLatencyModel
    from dlas_predict.paths import MACHINES, MODELS_STORE

    files = sorted(MODELS_STORE.glob(f"*/{FILE}")) + sorted(
        MODELS_STORE.glob(f"{MACHINES}/*/*/{FILE}"))
    columns = columns or corpus_columns()
    terms = network_terms_by_name(sorted({n for k, (ns, _) in columns.items()
                                          if k.endswith(":onnxruntime") for n in ns}))
    names, rows, spreads, supports = [], [], [], []
    for f in files:
        machine = f.parent.parent.name if f.parent.parent.parent.name == MACHINES else "shipped"
        name = f"{machine}:{f.parent.name}:onnxruntime model"
        if drop(name):
            continue
        try:
            model = OrtLatencyModel.load(f.parent)
        except ModelError:
            continue
        costs = np.zeros(len(TERMS))
        for k, family in enumerate(ORT_FAMILIES):
            at = len(LAYER_TERMS) + k * len(ORT_TERMS)
            costs[at:at + len(ORT_TERMS)] = 1e3 * np.asarray(
                model.coef_[model.priced_by(family + "fp32")])  # s to ms
        run = [terms[n] for n in columns.get(f"{machine}:{f.parent.name}:onnxruntime",
                                             ([], None))[0] if n in terms]
        # no corpus of its networks here: nothing is within its support (a wider interval)
        support = np.max(run, axis=0) if run else np.zeros(len(TERMS))
        names.append(name)
        rows.append(costs)
        spreads.append(float(model.q90_["fp32"] - model.q10_["fp32"]) / (2 * Z80))
        supports.append(support)
    shape = (len(rows), len(TERMS))
    return Basis(names, np.array(rows).reshape(shape), [ORT_SOURCE] * len(names), spreads,
                 np.array(supports).reshape(shape))


def default_basis(data: Path | None = None) -> tuple[Basis, list[str]]:
    """Every basis device there is: the shipped corpora's, the shipped onnxruntime models,
    and HELP's where the public data is found; with a note per source left out."""
    notes = []
    columns = corpus_columns()
    basis = corpus_basis(columns=columns) + onnxruntime_basis(columns=columns)
    try:
        basis = basis + help_basis(data)
    except DlasError as exc:
        notes.append(f"HELP's devices are not in the basis: {exc}")
    return basis, notes
