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

import numpy as np

from dlas_predict.crossdev.sources import LatencyMatrix
from dlas_predict.errors import DlasError

#: Candidate latent dimensions and observation-noise multipliers for the inner selection.
K_CHOICES = (1, 2, 3, 4, 5, 6)
NOISE_CHOICES = (1.0, 4.0, 16.0)
#: Targets the inner selection scores on (a seeded sample of larger matrices).
SELECT_ROWS = 2000


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


@dataclass
class LatentModel:
    """The fitted cross-device model of one latency matrix (see the module doc)."""

    source: str
    level: str
    devices: list[str]
    k: int
    noise_var: float
    targets: list[str]
    Z: np.ndarray                  # targets × (k + 2)
    loadings: np.ndarray           # devices × (k + 2)
    prior_mean: np.ndarray
    prior_cov: np.ndarray
    #: Ridge maps features → z for unseen targets (None where the source has no features).
    feat_mu: np.ndarray | None = None
    feat_sd: np.ndarray | None = None
    feat_W: np.ndarray | None = None
    index: dict[str, int] = field(default_factory=dict)
    #: Categories with their own per-device offset (the first category is the baseline).
    group_names: list[str] = field(default_factory=list)
    G: np.ndarray | None = None    # targets × (len(group_names) - 1)

    # ---- fitting ------------------------------------------------------------------------
    @classmethod
    def fit(cls, mat: LatencyMatrix, k: int | None = None, noise: float | None = None,
            seed: int = 0) -> "LatentModel":
        if len(mat.devices) < 2:
            raise DlasError(f"a cross-device model needs at least two devices with data "
                            f"({mat.source} has {len(mat.devices)})")
        if k is None or noise is None:
            k, noise = select(mat, seed=seed)
        return cls._fit(mat, k, noise)

    @classmethod
    def _fit(cls, mat: LatencyMatrix, k: int, noise: float) -> "LatentModel":
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
        prior_mean = L.mean(axis=0)
        C = np.cov(L.T) if len(L) > 1 else np.zeros((P, P))
        prior_cov = np.atleast_2d(C) + np.diag(np.maximum(np.diag(np.atleast_2d(C)), 1e-2)
                                              * 0.1 + 1e-4)
        noise_var = float(np.median(resid) * noise + 1e-4)
        model = cls(mat.source, mat.level, list(mat.devices), k, noise_var, list(mat.targets),
                    Z, L, prior_mean, prior_cov)
        model.index = {t: i for i, t in enumerate(mat.targets)}
        model.group_names, model.G = names, G
        if mat.features.size:
            model._fit_features(mat.features[seen], Zs)
        return model

    def _fit_features(self, F: np.ndarray, Zs: np.ndarray, lam: float = 1.0) -> None:
        mu, sd = F.mean(axis=0), F.std(axis=0) + 1e-9
        Fs = np.c_[np.ones(len(F)), (F - mu) / sd]
        Fs = np.c_[Fs, Fs[:, 1:] ** 2]
        reg = lam * np.eye(Fs.shape[1])
        reg[0, 0] = 0
        self.feat_mu, self.feat_sd = mu, sd
        self.feat_W = np.linalg.solve(Fs.T @ Fs + reg, Fs.T @ Zs[:, 1:])

    def z_from_features(self, F: np.ndarray) -> np.ndarray:
        if self.feat_W is None:
            raise DlasError(f"{self.source} targets outside the data cannot be predicted "
                            "(no target features)")
        Fs = np.c_[np.ones(len(F)), (F - self.feat_mu) / self.feat_sd]
        Fs = np.c_[Fs, Fs[:, 1:] ** 2]
        return np.c_[np.ones(len(F)), Fs @ self.feat_W]

    def z_rows(self, rows: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        """z of the matrix's rows: learned where a training device measured the row, else
        from the row's features."""
        Z = self.Z[rows].copy()
        unseen = ~np.isfinite(Z).all(axis=1)
        if unseen.any():
            if features is None or not features.size:
                raise DlasError(f"{int(unseen.sum())} {self.source} targets were measured by "
                                "no training device and have no features")
            z = self.z_from_features(features[rows][unseen])
            Z[unseen] = np.c_[z, self.G[rows][unseen]] if self.G is not None else z
        return Z

    # ---- a device -----------------------------------------------------------------------
    def zero_shot(self, spec: np.ndarray | None = None,
                  train_specs: np.ndarray | None = None) -> DevicePosterior:
        """The prior; with specs for the new and the training devices, the prior mean
        moved by a ridge regression of the loadings on the specs."""
        mean = self.prior_mean.copy()
        if spec is not None and train_specs is not None and len(train_specs) >= 2:
            S = np.asarray(train_specs, dtype=float)
            mu, sd = S.mean(axis=0), S.std(axis=0) + 1e-9
            A = np.c_[np.ones(len(S)), (S - mu) / sd]
            reg = np.eye(A.shape[1])
            reg[0, 0] = 0
            W = np.linalg.solve(A.T @ A + reg, A.T @ self.loadings)
            mean = np.r_[1.0, (np.asarray(spec, dtype=float) - mu) / sd] @ W
        return DevicePosterior(mean, self.prior_cov.copy(), "zero-shot", 0)

    def adapt(self, rows: np.ndarray, log_ms: np.ndarray,
              prior: DevicePosterior | None = None) -> DevicePosterior:
        """The posterior loading given measured targets (rows of Z, or z vectors)."""
        A = self.Z[rows] if rows.ndim == 1 else rows
        prior = prior or self.zero_shot()
        Pi = np.linalg.inv(prior.cov)
        prec = A.T @ A / self.noise_var + Pi
        cov = np.linalg.inv(prec)
        mean = cov @ (A.T @ log_ms / self.noise_var + Pi @ prior.mean)
        return DevicePosterior(mean, cov, "adapted", len(log_ms))

    def predict(self, post: DevicePosterior, rows: np.ndarray | None = None,
                Z: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean log ms and its standard deviation (loading uncertainty + noise)."""
        Zq = Z if Z is not None else (self.Z if rows is None else self.Z[rows])
        mean = Zq @ post.mean
        var = np.einsum("ij,jk,ik->i", Zq, post.cov, Zq) + self.noise_var
        return mean, np.sqrt(var)


def select(mat: LatencyMatrix, shots: int = 10, draws: int = 3, seed: int = 0
           ) -> tuple[int, float]:
    """(k, noise multiplier) with the best mean Spearman when each training device in turn
    is left out and adapted from ``shots`` random measured targets."""
    rng = np.random.default_rng(seed)
    if len(mat.targets) > SELECT_ROWS:  # the choice needs the shape, not every target
        keep = np.sort(rng.choice(len(mat.targets), SELECT_ROWS, replace=False))
        mat = LatencyMatrix(mat.source, mat.level, [mat.targets[i] for i in keep],
                            mat.devices, mat.log_ms[keep], mat.macs[keep],
                            mat.features[keep] if mat.features.size else mat.features,
                            [mat.groups[i] for i in keep] if mat.groups else [])
    best, best_score = (1, 4.0), -np.inf
    ks = [k for k in K_CHOICES if k <= len(mat.devices) - 3] or [0]
    for k in ks:
        scores: dict[float, list[float]] = {n: [] for n in NOISE_CHOICES}
        for d in mat.devices:
            rest = mat.without(d)
            y = mat.column(d)
            rows = np.flatnonzero(np.isfinite(y) & np.isfinite(rest.log_ms).any(axis=1))
            if len(rows) < shots + 5:
                continue
            base = LatentModel._fit(rest, k, 1.0)
            base_noise = base.noise_var
            picks = [rng.choice(rows, shots, replace=False) for _ in range(draws)]
            for n in NOISE_CHOICES:
                base.noise_var = (base_noise - 1e-4) * n + 1e-4
                for p in picks:
                    post = base.adapt(p, y[p])
                    q = np.setdiff1d(rows, p)
                    scores[n].append(spearman(base.predict(post, q)[0], y[q]))
        for n, s in scores.items():
            if s and np.mean(s) > best_score:
                best, best_score = (k, n), float(np.mean(s))
    return best
