"""Leave-one-device-out: each device held out in turn, predicted from the others plus N of
its own measurements (N = 0: zero-shot), against the MACs and roofline baselines and the
ceiling (a model trained on the held-out device's own data).

For every held-out device the cross-device model is refitted on the other devices alone,
including its choice of latent dimension and noise, so nothing of the held-out device
reaches the model except the shots. Shots are drawn at random (``draws`` times, seeded) from
the device's measured targets; the scores are over the targets that were not shots.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dlas_predict.crossdev.latent import DevicePosterior, LatentModel, spearman
from dlas_predict.models.base import Z80
from dlas_predict.models.costmodel import kendall_tau
from dlas_predict.crossdev.sources import LatencyMatrix
from dlas_predict.errors import DlasError, param

DEFAULT_SHOTS = (0, 5, 10, 20, 50)


@dataclass
class Scores:
    """Prediction quality over the evaluated targets (means over the draws)."""

    spearman: float
    kendall: float
    mape: float | None
    within_10pct: float | None
    within_25pct: float | None
    #: Share of the truths inside the predictions' 80 % intervals (where they have one).
    coverage: float | None = None


@dataclass
class HeldOutDevice:
    device: str
    measured: int
    #: how the zero-shot answer was made: ``sibling`` (a training device of the same processor
    #: and code, its measurements mapped), ``spec`` (the loading regressed on the spec) or
    #: ``prior`` (the training devices' mean loading)
    zero_shot_from: str
    k: int
    by_shots: dict[int, Scores] = field(default_factory=dict)
    macs: dict[int, Scores] = field(default_factory=dict)
    roofline: Scores | None = None
    ceiling: Scores | None = None


@dataclass
class DeviceReport:
    source: str
    level: str
    shots: list[int]
    draws: int
    devices: list[HeldOutDevice]

    def mean(self, what: str, shots: int | None = None, metric: str = "spearman") -> float:
        vals = []
        for h in self.devices:
            s = (h.by_shots.get(shots) if what == "model" else h.macs.get(shots)
                 if what == "macs" else getattr(h, what))
            v = getattr(s, metric) if s is not None else None
            if v is not None and np.isfinite(v):
                vals.append(v)
        return float(np.mean(vals)) if vals else float("nan")

    def to_dict(self) -> dict:
        return asdict(self)


def score(pred_log: np.ndarray, true_log: np.ndarray, absolute: bool = True,
          sd: np.ndarray | None = None) -> Scores:
    """Rank and (``absolute``) error scores of log-ms predictions; with their standard
    deviations ``sd``, how often the truth lies in the 80 % interval."""
    if not absolute:
        return Scores(spearman(pred_log, true_log), kendall_tau(pred_log, true_log), None, None,
                      None)
    err = np.abs(np.exp(pred_log - true_log) - 1)
    cover = None if sd is None else float(np.mean(np.abs(pred_log - true_log) <= Z80 * sd))
    return Scores(spearman(pred_log, true_log), kendall_tau(pred_log, true_log),
                  float(np.mean(err)), float(np.mean(err <= 0.10)), float(np.mean(err <= 0.25)),
                  cover)


def _mean_scores(items: list[Scores]) -> Scores:
    def m(name):
        v = [getattr(s, name) for s in items if getattr(s, name) is not None]
        v = [x for x in v if np.isfinite(x)]
        return float(np.mean(v)) if v else None
    return Scores(m("spearman") or float("nan"), m("kendall") or float("nan"), m("mape"),
                  m("within_10pct"), m("within_25pct"), m("coverage"))


def device_spec(name: str) -> np.ndarray | None:
    """A device's spec vector (log peaks per dtype, bandwidth, cores, SIMD width, GPU), or
    None for a device outside the registry (HELP's devices are names only)."""
    from dlas_predict.crossdev.transfer import data_spec
    from dlas_predict.space.devices import device_names

    if name not in device_names():
        return None
    d = data_spec(name)  # as its data was measured
    p = d.peak_gflops
    bw = d.mem_bandwidth_gbs
    return np.array([np.log(p.get("float32", np.nan)), np.log(p.get("int8", np.nan)),
                     np.log(p.get("float16", np.nan)), np.log(bw) if bw else np.nan,
                     np.log(d.cores), np.log(d.simd_bits or 32), float(d.kind == "gpu")])


def sibling(device: str, candidates: list[str]) -> str | None:
    """The candidate that is ``device``'s processor with the same code
    (:func:`~dlas_predict.crossdev.transfer.same_code`), nearest in spec as
    :func:`~dlas_predict.crossdev.transfer.reference_for` ranks them; None where no
    candidate is."""
    from dlas_predict.crossdev.transfer import data_spec, reference_for, same_code
    from dlas_predict.space.devices import device_names

    names = set(device_names())
    if device not in names:
        return None
    own = data_spec(device)
    if not own.peak_gflops:
        return None
    same = [c for c in candidates if c != device and c in names
            and same_code(ref := data_spec(c), own) and ref.peak_gflops]
    return reference_for(own, same) if same else None


def sibling_map(model: LatentModel, device: str) -> tuple[str, float] | None:
    """(the training device that is ``device``'s :func:`sibling`, the log scale from it to
    ``device``: the CPU zero-shot map's spec term, α and β fitted without ``device``), or
    None."""
    sib = sibling(device, model.devices_)
    if sib is None:
        return None
    from dlas_predict.crossdev.transfer import DeviceMap, data_spec, fit_transfer

    fit = fit_transfer("cpu", exclude=device)
    shift = DeviceMap(device, sib, "zero-shot", fit.alpha, fit.beta, fit.q10, fit.q90) \
        .log_scale(data_spec(sib), data_spec(device), "dense")
    return sib, shift


#: :func:`zero_shot_prior` looks the sibling up itself
_LOOK_UP = object()


def zero_shot_prior(model: LatentModel, device: str, sibling_of=_LOOK_UP):
    """The zero-shot loading of ``device`` and how it was obtained (``sibling_of``: its
    :func:`sibling_map`, where the caller has it):

    - ``sibling``: where a training device is the same processor with the same code (see
      :func:`sibling`), its loading shifted by :func:`sibling_map`'s log scale;
    - ``spec``: else from its spec, when it and every training device have one (missing
      spec entries take the mean of the others);
    - ``prior``: else the prior mean.
    """
    sm = sibling_map(model, device) if sibling_of is _LOOK_UP else sibling_of
    if sm is not None:
        mean = model.loadings_[model.devices_.index(sm[0])].copy()
        mean[0] += sm[1]
        return DevicePosterior(mean, model.prior_cov_.copy(), "zero-shot", 0), "sibling"
    specs = [device_spec(d) for d in model.devices_]
    own = device_spec(device)
    if own is None or any(s is None for s in specs):
        return model.zero_shot(), "prior"
    S = np.vstack(specs + [own])
    fill = np.nanmean(S, axis=0)
    S = np.where(np.isnan(S), np.where(np.isnan(fill), 0.0, fill), S)
    return model.zero_shot(S[-1], S[:-1]), "spec"


def placed_zero_shot(model: LatentModel, device: str) -> DevicePosterior:
    """:func:`zero_shot_prior`'s loading alone: how ``predict`` places a device it has no
    measurement of (what :func:`~dlas_predict.crossdev.latent.zero_shot_scale` replays)."""
    return zero_shot_prior(model, device)[0]


def _roofline(mat: LatencyMatrix, rows: np.ndarray, device: str) -> np.ndarray | None:
    """Roofline time (log ms) of kernel targets on the device's spec, uncalibrated."""
    from dlas_predict.crossdev.transfer import data_spec
    from dlas_predict.space.devices import device_names

    if mat.level != "kernel" or not mat.features.size or device not in device_names():
        return None
    d = data_spec(device)
    if not d.mem_bandwidth_gbs:
        return None
    F = mat.features[rows]
    flops = 2 * np.exp(F[:, 0])
    bytes_ = 4 * (np.exp(F[:, 1]) + np.exp(F[:, 2]))
    t = np.maximum(flops / (d.peak_gflops["float32"] * 1e9), bytes_ / (d.mem_bandwidth_gbs * 1e9))
    return np.log(t * 1e3)


def _ceiling(model: LatentModel, F: np.ndarray, Z: np.ndarray, y: np.ndarray,
             seed: int) -> Scores:
    """5-fold cross-validation of a model of the device's own data: LightGBM on the
    target features and z where the source has features, else the latent model adapted to
    every training fold's measurement."""
    from sklearn.model_selection import KFold

    pred = np.zeros(len(y))
    folds = KFold(5, shuffle=True, random_state=seed).split(Z)
    for tr, te in folds:
        if F.size:
            import lightgbm as lgb
            X = np.c_[Z, F]
            g = lgb.LGBMRegressor(n_estimators=300, learning_rate=0.05, min_child_samples=5,
                                  verbose=-1, random_state=seed).fit(X[tr], y[tr])
            pred[te] = g.predict(X[te])
        else:
            post = model.adapt(Z[tr], y[tr])
            pred[te] = Z[te] @ post.mean
    return score(pred, y)


def leave_one_device_out(mat: LatencyMatrix, shots: tuple[int, ...] = DEFAULT_SHOTS,
                         draws: int = 5, seed: int = 0, devices: list[str] | None = None,
                         min_targets: int = 12, log=None) -> DeviceReport:
    """Hold out each device (or those named) in turn; see the module doc."""
    shots = tuple(sorted(set(int(s) for s in shots)))
    if any(s < 0 for s in shots):
        raise DlasError(f"{param('shots')} must be 0 or more")
    names = devices or list(mat.devices)
    unknown = [d for d in names if d not in mat.devices]
    if unknown:
        raise DlasError(f"no data of device {unknown[0]!r} in {mat.source}; devices: "
                        + ", ".join(mat.devices))
    rng = np.random.default_rng(seed)
    out = []
    for d in names:
        y_all = mat.column(d)
        rest = mat.without(d)
        if len(rest.devices) < 2:
            raise DlasError(f"leave-one-device-out needs at least three devices in "
                            f"{mat.source} ({len(mat.devices)} have data)")
        model = LatentModel(seed=seed, zero_shot_of=placed_zero_shot).fit(rest)
        rows = mat.measured(d)
        if not mat.features.size:
            rows = rows[np.isfinite(model.Z_[rows]).all(axis=1)]
        if len(rows) < min_targets:
            if log:
                log(f"{d}: {len(rows)} targets shared with the other devices, too few; skipped")
            continue
        too_many = [s for s in shots if s > len(rows) - 3]
        if too_many and (devices or too_many[0] == shots[0]):
            raise DlasError(f"{param('shots')} {too_many[0]} is larger than device {d}'s data "
                            f"({len(rows)} targets; at most {len(rows) - 3} shots leave three "
                            "to score)")
        Z = model.z_rows(rows, mat.features)
        y = y_all[rows]
        sm = sibling_map(model, d)
        prior, how = zero_shot_prior(model, d, sm)
        h = HeldOutDevice(d, len(rows), how, model.k_)
        anchor = None
        if sm is not None:  # the sibling's own measurements, mapped, where it has them
            sib, shift = sm
            ys = mat.column(sib)[rows]
            anchor = np.where(np.isfinite(ys), ys + shift, Z @ prior.mean)
        logmacs = np.log(np.maximum(mat.macs[rows], 1))
        if too_many and log:
            log(f"{d}: {len(rows)} targets, too few for " + ", ".join(map(str, too_many))
                + " shots")
        for s in shots:
            if s in too_many:
                continue
            got, base = [], []
            for _ in range(draws if s else 1):
                pick = rng.choice(len(rows), s, replace=False) if s else np.zeros(0, int)
                rest_i = np.setdiff1d(np.arange(len(rows)), pick)
                sd = None
                if anchor is not None:  # one offset: the shots' median residual, shrunk
                    res = y[pick] - anchor[pick]
                    pred = anchor + (np.median(res) * s / (s + 1) if s else 0.0)
                else:
                    pred, sd = model.predict(model.adapt(Z[pick], y[pick], prior) if s
                                             else prior, Z=Z)
                got.append(score(pred[rest_i], y[rest_i],
                                 sd=None if sd is None else sd[rest_i]))
                if s >= 2:
                    A = np.c_[np.ones(s), logmacs[pick]]
                    coef = np.linalg.lstsq(A, y[pick], rcond=None)[0]
                    base.append(score(np.c_[np.ones(len(rest_i)), logmacs[rest_i]] @ coef,
                                      y[rest_i]))
                else:
                    base.append(score(logmacs[rest_i], y[rest_i], absolute=False))
            h.by_shots[s] = _mean_scores(got)
            h.macs[s] = _mean_scores(base)
        roof = _roofline(mat, rows, d)
        if roof is not None:
            h.roofline = score(roof, y)
        F = mat.features[rows] if mat.features.size else np.zeros((len(rows), 0))
        h.ceiling = _ceiling(model, F, Z, y, seed)
        if log:
            top = max(h.by_shots)
            log(f"{d}: {len(rows)} targets, {top} shots: Spearman "
                f"{h.by_shots[top].spearman:.3f}")
        out.append(h)
    if not out:
        raise DlasError(f"no device of {mat.source} has enough targets shared with the others")
    return DeviceReport(mat.source, mat.level, list(shots), draws, out)


def evaluate_devices(source: str | None = None, level: str = "kernel", shots: str | None = None,
                     draws: int = 5, data=None, device: str | None = None, seed: int = 0,
                     log=None) -> DeviceReport:
    """``evaluate --leave-one-device-out``: the options read (``source`` defaults to HELP at
    network level and the profiles at kernel level; ``shots`` is a comma list), the data
    loaded, and :func:`leave_one_device_out` run over every device or ``device``."""
    from dlas_predict.crossdev import sources

    if level not in sources.LEVELS:
        raise DlasError(f"unknown {param('level')} {level!r}; allowed: "
                        + ", ".join(sources.LEVELS))
    source = source or ("help" if level == "network" else "profiles")
    only = {"help": "network", "tophub": "kernel"}.get(source)
    if only and level != only:
        raise DlasError(f"{source} has {only}s only; use {param('level')} {only}")
    try:
        counts = (tuple(int(x) for x in shots.split(",") if x.strip()) if shots
                  else DEFAULT_SHOTS)
    except ValueError:
        raise DlasError(f"{param('shots')} takes comma-separated counts, e.g. 0,5,10 "
                        f"(got {shots!r})") from None
    if not counts:
        raise DlasError(f"{param('shots')} is empty")
    if draws < 1:
        raise DlasError(f"{param('draws')} must be at least 1")
    mat = sources.load(source, level, data)
    return leave_one_device_out(mat, counts, draws, seed, [device] if device else None, log=log)
