"""A device-aware latency model: targets share a latent embedding, devices a loading vector.

The log latency of target t on device d is modelled as

    y[t, d] = θ_d · z_t,    z_t = (1, m_t, u_t1 .. u_tk)

where ``m_t`` is the target's mean log latency over the training devices and ``u_t`` its
first ``k`` principal components across them (the "hardware-independent" shape of the
target), and θ_d is the device's loading. The training devices' loadings give a Gaussian
prior over θ (HELP's meta-learned initialisation, in closed form). A new device is then:

- **zero-shot**: θ from its spec (a ridge regression of the training devices' loadings on
  their specs) or, with no spec, the prior mean;
- **few-shot**: the posterior mean of θ given its measured targets (Bayesian linear
  regression with that prior), which needs only as many measurements as it has shots.

Targets no training device measured get z from their features (a ridge regression per
component), so unseen kernels are predicted too. ``k`` and the observation noise are chosen
by leave-one-device-out among the training devices alone (never on a held-out device).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dlas_predict.crossdev.sources import LatencyMatrix
from dlas_predict.errors import DlasError
from dlas_predict.models.base import Z80

#: Candidate latent dimensions and observation-noise multipliers for the inner selection.
K_CHOICES = (1, 2, 3, 4, 5, 6)
NOISE_CHOICES = (1.0, 4.0, 16.0)
#: Targets the inner selection scores on (a seeded sample of larger matrices).
SELECT_ROWS = 2000
#: The fewest shots whose leave-one-out errors say how far a device's own spread runs, and
#: the weight, in shots, of the model's spread that they are shrunk towards.
SPREAD_MIN_SHOTS = 5
SPREAD_PRIOR = 5.0
#: The median of a standard normal's absolute value.
Z50 = 0.6745


def _complete(Y: np.ndarray, rank: int, iters: int = 100) -> np.ndarray:
    """Fill the NaNs of Y by iterated rank-``rank`` SVD (soft-impute style)."""
    miss = ~np.isfinite(Y)
    if not miss.any():
        return Y.copy()
    col = np.nanmean(Y, axis=0)
    row = np.nanmean(Y - col, axis=1)
    row = np.where(np.isfinite(row), row, 0.0)
    X = np.where(miss, row[:, None] + col[None, :], Y)
    r = max(1, min(rank, min(X.shape) - 1))
    for _ in range(iters):
        mu = X.mean(axis=0)
        U, S, Vt = np.linalg.svd(X - mu, full_matrices=False)
        low = (U[:, :r] * S[:r]) @ Vt[:r] + mu
        X = np.where(miss, low, Y)
    return X


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).correlation)


@dataclass
class DevicePosterior:
    """A device's loading: mean, covariance, and how it was obtained."""

    mean: np.ndarray
    cov: np.ndarray
    source: str  # "zero-shot" | "adapted" | "trained"
    shots: int = 0
    #: How much wider than the model's own this device's errors run, from its shots' leave-
    #: one-out errors (:meth:`LatentModel.adapt`); multiplies its predicted spread.
    spread: float = 1.0


@dataclass
class LatentModel:
    """The cross-device model of one latency matrix (see the module doc).
    ``LatentModel(k, noise, seed).fit(mat)``: ``k`` latent dimensions and the observation
    noise multiplier ``noise``, each chosen by leave-one-device-out where None. Its
    prediction is per device: ``predict(posterior, rows)`` with the device's loading from
    :meth:`zero_shot`, :meth:`adapt` or a training device's own."""

    k: int | None = None
    noise: float | None = None
    seed: int = 0
    #: ``zero_shot_of(model, device) -> DevicePosterior``: how a device without shots is
    #: placed, which :func:`zero_shot_scale` replays on each training device (default: the
    #: prior, :meth:`zero_shot`).
    zero_shot_of: Callable[["LatentModel", str], "DevicePosterior"] | None = None
    source_: str = field(default="", init=False)
    level_: str = field(default="", init=False)
    devices_: list[str] = field(default_factory=list, init=False)
    k_: int = field(default=0, init=False)
    noise_var_: float = field(default=0.0, init=False)
    #: What an adapted or trained device's predicted standard deviation is multiplied by,
    #: so that 80 % intervals hold 80 % of held-out truths (:func:`interval_scale`; 1 where
    #: the model was fitted at a given ``k`` and noise).
    interval_scale_: float = field(default=1.0, init=False)
    #: The same for a zero-shot device (:func:`zero_shot_scale`): the prior's spread is
    #: that of the training devices' loadings, far wider than a zero-shot error.
    zero_shot_scale_: float = field(default=1.0, init=False)
    targets_: list[str] = field(default_factory=list, init=False)
    Z_: np.ndarray | None = field(default=None, init=False)         # targets × (k + 2)
    loadings_: np.ndarray | None = field(default=None, init=False)  # devices × (k + 2)
    prior_mean_: np.ndarray | None = field(default=None, init=False)
    prior_cov_: np.ndarray | None = field(default=None, init=False)
    #: Ridge maps features → z for unseen targets (None where the source has no features).
    feat_mu_: np.ndarray | None = field(default=None, init=False)
    feat_sd_: np.ndarray | None = field(default=None, init=False)
    feat_W_: np.ndarray | None = field(default=None, init=False)
    index_: dict[str, int] = field(default_factory=dict, init=False)
    #: Categories with their own per-device offset (the first category is the baseline).
    group_names_: list[str] = field(default_factory=list, init=False)
    G_: np.ndarray | None = field(default=None, init=False)  # targets × (groups - 1)

    # ---- fitting ------------------------------------------------------------------------
    def fit(self, mat: LatencyMatrix) -> "LatentModel":
        if len(mat.devices) < 2:
            raise DlasError(f"a cross-device model needs at least two devices with data "
                            f"({mat.source} has {len(mat.devices)})")
        k, noise = self.k, self.noise
        if k is None or noise is None:
            k, noise = select(mat, seed=self.seed)
        self.fit_at(mat, k, noise)
        self.interval_scale_ = interval_scale(mat, k, noise, seed=self.seed)
        self.zero_shot_scale_ = zero_shot_scale(mat, k, noise, self.zero_shot_of,
                                                seed=self.seed)
        return self

    def fit_at(self, mat: LatencyMatrix, k: int, noise: float) -> "LatentModel":
        """Fit with ``k`` and ``noise`` as given (no selection)."""
        Y = mat.log_ms
        seen = np.isfinite(Y).any(axis=1)
        k = max(0, min(k, len(mat.devices) - 2))
        X = _complete(Y[seen], rank=max(k, 1))
        m = X.mean(axis=1)
        R = X - m[:, None]
        R = R - R.mean(axis=0)
        U = np.linalg.svd(R, full_matrices=False)[0][:, :k] if k else np.zeros((len(X), 0))
        names = sorted(set(mat.groups))
        G = np.array([[float(g == n) for n in names[1:]] for g in mat.groups]) \
            if len(names) > 1 else np.zeros((len(Y), 0))
        Zs = np.c_[np.ones(len(X)), m, U * np.sqrt(len(X))]
        Z = np.full((len(Y), k + 2 + G.shape[1]), np.nan)
        Z[seen] = np.c_[Zs, G[seen]]
        # each training device's loading, from the targets it measured
        P = Z.shape[1]
        L = np.zeros((len(mat.devices), P))
        resid = []
        for j in range(len(mat.devices)):
            rows = np.flatnonzero(np.isfinite(Y[:, j]))
            A, y = Z[rows], Y[rows, j]
            L[j] = np.linalg.solve(A.T @ A + 1e-6 * np.eye(P), A.T @ y)
            resid.append(np.mean((A @ L[j] - y) ** 2))
        C = np.cov(L.T) if len(L) > 1 else np.zeros((P, P))
        self.source_, self.level_, self.devices_ = mat.source, mat.level, list(mat.devices)
        self.k_, self.targets_, self.Z_, self.loadings_ = k, list(mat.targets), Z, L
        self.noise_var_ = float(np.median(resid) * noise + 1e-4)
        self.prior_mean_ = L.mean(axis=0)
        self.prior_cov_ = np.atleast_2d(C) + np.diag(np.maximum(np.diag(np.atleast_2d(C)),
                                                                1e-2) * 0.1 + 1e-4)
        self.index_ = {t: i for i, t in enumerate(mat.targets)}
        self.group_names_, self.G_ = names, G
        self.feat_mu_ = self.feat_sd_ = self.feat_W_ = None
        if mat.features.size:
            self._fit_features(mat.features[seen], Zs)
        return self

    def _fit_features(self, F: np.ndarray, Zs: np.ndarray, lam: float = 1.0) -> None:
        mu, sd = F.mean(axis=0), F.std(axis=0) + 1e-9
        Fs = np.c_[np.ones(len(F)), (F - mu) / sd]
        Fs = np.c_[Fs, Fs[:, 1:] ** 2]
        reg = lam * np.eye(Fs.shape[1])
        reg[0, 0] = 0
        self.feat_mu_, self.feat_sd_ = mu, sd
        self.feat_W_ = np.linalg.solve(Fs.T @ Fs + reg, Fs.T @ Zs[:, 1:])

    def z_from_features(self, F: np.ndarray) -> np.ndarray:
        if self.feat_W_ is None:
            raise DlasError(f"{self.source_} targets outside the data cannot be predicted "
                            "(no target features)")
        Fs = np.c_[np.ones(len(F)), (F - self.feat_mu_) / self.feat_sd_]
        Fs = np.c_[Fs, Fs[:, 1:] ** 2]
        return np.c_[np.ones(len(F)), Fs @ self.feat_W_]

    def z_rows(self, rows: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """z of the matrix's rows: learned where a training device measured the row, else
        from the row's features."""
        Z = self.Z_[rows].copy()
        unseen = ~np.isfinite(Z).all(axis=1)
        if unseen.any():
            if features is None or not features.size:
                raise DlasError(f"{int(unseen.sum())} {self.source_} targets were measured by "
                                "no training device and have no features")
            z = self.z_from_features(features[rows][unseen])
            Z[unseen] = np.c_[z, self.G_[rows][unseen]] if self.G_ is not None else z
        return Z

    # ---- a device -----------------------------------------------------------------------
    def zero_shot(self, spec: np.ndarray | None = None,
                  train_specs: np.ndarray | None = None) -> DevicePosterior:
        """The prior; with specs for the new and the training devices, the prior mean
        moved by a ridge regression of the loadings on the specs."""
        mean, spread = self.prior_mean_.copy(), 1.0
        if spec is not None and train_specs is not None and len(train_specs) >= 2:
            S = np.asarray(train_specs, dtype=float)
            mu, sd = S.mean(axis=0), S.std(axis=0) + 1e-9
            A = np.c_[np.ones(len(S)), (S - mu) / sd]
            reg = np.eye(A.shape[1])
            reg[0, 0] = 0
            M = np.linalg.inv(A.T @ A + reg)
            x = np.r_[1.0, (np.asarray(spec, dtype=float) - mu) / sd]
            mean = x @ M @ A.T @ self.loadings_
            # a spec beyond the training devices' is an extrapolation: its interval widens
            # with its leverage, over the training devices' own (never narrows: a spec
            # among theirs is no promise, a twin's may be timed otherwise)
            spread = float(np.sqrt(max(1.0, (1 + x @ M @ x)
                                       / (1 + np.einsum("ij,jk,ik->i", A, M, A).mean()))))
        return DevicePosterior(mean, self.prior_cov_.copy(), "zero-shot", 0, spread)

    def adapt(self, rows: np.ndarray, log_ms: np.ndarray,
              prior: DevicePosterior | None = None, spread: bool = True) -> DevicePosterior:
        """The posterior loading given measured targets (rows of Z, or z vectors), with the
        device's own spread: where its shots, each predicted from the others, miss by more
        than the model's intervals allow (a device unlike the training ones), its intervals
        widen to match, and where they miss by less, narrow (:data:`SPREAD_MIN_SHOTS`,
        :data:`SPREAD_PRIOR`). ``spread=False``: the loading alone (for its mean)."""
        A = self.Z_[rows] if rows.ndim == 1 else rows
        log_ms = np.asarray(log_ms, dtype=float)
        prior = prior or self.zero_shot()
        Pi = np.linalg.inv(prior.cov)
        cov = np.linalg.inv(A.T @ A / self.noise_var_ + Pi)
        mean = cov @ (A.T @ log_ms / self.noise_var_ + Pi @ prior.mean)
        n, own_spread = len(log_ms), 1.0
        if spread and n >= SPREAD_MIN_SHOTS:
            # each shot predicted from the others, in closed form (Sherman-Morrison): its
            # residual over 1 - leverage, its variance from the covariance without it
            v = np.einsum("ij,jk,ik->i", A, cov, A)
            free = np.maximum(1.0 - v / self.noise_var_, 1e-9)  # under 1 by the prior
            loo_err = (log_ms - A @ mean) / free
            loo_sd = np.sqrt(v / free + self.noise_var_) * self.interval_scale_
            own = (np.median(np.abs(loo_err) / loo_sd) / Z50) ** 2  # over the model's
            own_spread = float(np.sqrt((n * own + SPREAD_PRIOR) / (n + SPREAD_PRIOR)))
        return DevicePosterior(mean, cov, "adapted", n, own_spread)

    def predict(self, post: DevicePosterior, rows: np.ndarray | None = None,
                Z: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean log ms and its standard deviation (loading uncertainty + noise, scaled by
        :attr:`zero_shot_scale_` for a zero-shot device, else :attr:`interval_scale_`, and
        by the device's own spread)."""
        Zq = Z if Z is not None else (self.Z_ if rows is None else self.Z_[rows])
        mean = Zq @ post.mean
        var = np.einsum("ij,jk,ik->i", Zq, post.cov, Zq) + self.noise_var_
        scale = self.zero_shot_scale_ if post.source == "zero-shot" else self.interval_scale_
        return mean, np.sqrt(var) * scale * post.spread


def _sampled(mat: LatencyMatrix, rng) -> LatencyMatrix:
    """At most :data:`SELECT_ROWS` targets of ``mat`` (a seeded sample): what the inner
    leave-one-device-out loops score on."""
    if len(mat.targets) <= SELECT_ROWS:
        return mat
    keep = np.sort(rng.choice(len(mat.targets), SELECT_ROWS, replace=False))
    return LatencyMatrix(mat.source, mat.level, [mat.targets[i] for i in keep],
                         mat.devices, mat.log_ms[keep], mat.macs[keep],
                         mat.features[keep] if mat.features.size else mat.features,
                         [mat.groups[i] for i in keep] if mat.groups else [])


def _left_out(mat: LatencyMatrix, min_rows: int):
    """Each training device in turn: (its name, the matrix without it, its column, its
    targets some other device measured), where it has at least ``min_rows`` of them."""
    for d in mat.devices:
        rest = mat.without(d)
        y = mat.column(d)
        rows = np.flatnonzero(np.isfinite(y) & np.isfinite(rest.log_ms).any(axis=1))
        if len(rows) >= min_rows:
            yield d, rest, y, rows


def select(mat: LatencyMatrix, shots: int = 10, draws: int = 3, seed: int = 0
           ) -> tuple[int, float]:
    """(k, noise multiplier) with the best mean Spearman when each training device in turn
    is left out and adapted from ``shots`` random measured targets."""
    rng = np.random.default_rng(seed)
    mat = _sampled(mat, rng)  # the choice needs the shape, not every target
    best, best_score = (1, 4.0), -np.inf
    ks = [k for k in K_CHOICES if k <= len(mat.devices) - 3] or [0]
    for k in ks:
        scores: dict[float, list[float]] = {n: [] for n in NOISE_CHOICES}
        for _, rest, y, rows in _left_out(mat, shots + 5):
            base = LatentModel().fit_at(rest, k, 1.0)
            base_noise = base.noise_var_
            picks = [rng.choice(rows, shots, replace=False) for _ in range(draws)]
            for n in NOISE_CHOICES:
                base.noise_var_ = (base_noise - 1e-4) * n + 1e-4
                for p in picks:
                    post = base.adapt(p, y[p], spread=False)
                    q = np.setdiff1d(rows, p)
                    scores[n].append(spearman(base.predict(post, q)[0], y[q]))
        for n, s in scores.items():
            if s and np.mean(s) > best_score:
                best, best_score = (k, n), float(np.mean(s))
    return best


#: The scales' bounds: a handful of training devices cannot say more than this.
_SCALE_RANGE = (0.25, 4.0)


def interval_scale(mat: LatencyMatrix, k: int, noise: float, shots: int = 10,
                   draws: int = 3, seed: int = 0) -> float:
    """The multiplier of an adapted device's predicted standard deviation that makes 80 %
    intervals hold 80 % of held-out truths: each training device left out in turn, its
    other targets predicted from ``shots`` random ones, and the 80th percentile of the
    standardised errors taken over 1.28 (the training devices alone, never a held-out
    one). The observation noise that ``select`` picks for ranking alone left intervals
    holding 93-100 % (TopHub's devices)."""
    rng = np.random.default_rng(seed)
    mat = _sampled(mat, rng)
    adapted = []
    if len(mat.devices) >= 3:
        for _, rest, y, rows in _left_out(mat, shots + 5):
            base = LatentModel().fit_at(rest, k, noise)
            for _ in range(draws):
                p = rng.choice(rows, shots, replace=False)
                q = np.setdiff1d(rows, p)
                mean, sd = base.predict(base.adapt(p, y[p]), q)
                adapted.append(np.abs(mean - y[q]) / sd)
    return _scale_of(adapted)


def zero_shot_scale(mat: LatencyMatrix, k: int, noise: float,
                    zero_shot_of: Callable[["LatentModel", str], DevicePosterior] | None = None,
                    seed: int = 0) -> float:
    """The multiplier of a zero-shot device's predicted standard deviation that makes its
    80 % intervals hold 80 % of held-out truths, learned as :func:`interval_scale` learns
    the adapted one: each training device left out in turn and placed as
    ``zero_shot_of(model, device)`` places it (default: the prior), every target of it
    predicted. A zero-shot error is mostly one offset per device, so the share holds over
    devices, not within one: TopHub's eight left out in turn, from 100 % (intervals
    ×14-×37 each way) to 81 % (six devices at 97-100 %, two at 45 % and 6 %); HELP's 21
    at 79-80 % either way."""
    rng = np.random.default_rng(seed)
    mat = _sampled(mat, rng)
    errs = []
    if len(mat.devices) >= 3:
        for d, rest, y, rows in _left_out(mat, 5):
            base = LatentModel().fit_at(rest, k, noise)
            prior = zero_shot_of(base, d) if zero_shot_of else base.zero_shot()
            mean, sd = base.predict(prior, rows)
            errs.append(np.abs(mean - y[rows]) / sd)
    return _scale_of(errs)


def _scale_of(standardised: list[np.ndarray]) -> float:
    """The 80th percentile of standardised errors over 1.28, within :data:`_SCALE_RANGE`;
    1 without any."""
    if not standardised:
        return 1.0
    return float(np.clip(np.quantile(np.concatenate(standardised), 0.8) / Z80, *_SCALE_RANGE))
