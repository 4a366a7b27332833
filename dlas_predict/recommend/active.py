"""Active learning of a device: measure the kernels that matter most to the user's networks.

The pool is every kernel the user's networks run: each conv layer × algorithm ×
configuration. A *plan* is one network under one configuration and one algorithm; its
latency here is the sum of its conv kernels (the part of a network the kernels decide).

Each step:

1. every unmeasured kernel is priced on the device by the map of a reference device's
   trained model (:mod:`dlas_predict.crossdev.transfer`; zero-shot before three
   measurements, adapted after);
2. the **criterion** picks the next kernel:

   - ``variance`` (the default): the largest expected drop of the plans' relative variance.
     The adapted map is linear in its parameters (offset, slope, an offset per kernel group
     and per conv shape), so measuring kernel k shrinks their covariance by a rank-one
     update; a plan's variance is its parameters' part (its latency's gradient through that
     covariance) plus each unmeasured kernel's own noise. A kernel is worth what it tells
     about every plan, through the group and the shape it shares with others;
   - ``uncertainty``: the width of its log interval times its predicted share of each plan
     it belongs to, summed over those plans;
   - ``random``: uniform, the baseline;
3. the kernel is measured (``--replay``: looked up in recorded measurements; otherwise timed
   on the device), and the map is refitted.

A plan's prediction uses the measured time of each kernel measured so far and the map for
the rest, so measuring the kernels that dominate a plan pins it down. The loop stops when
the budget is spent or every plan's 80 % interval is within the target width.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dlas_predict.crossdev import transfer
from dlas_predict.errors import DlasError, param
from dlas_predict.space.choices import Criterion

CRITERIA = Criterion.words()


@dataclass(frozen=True)
class PoolKernel:
    conv: str
    algorithm: str
    compression: str
    ratio: float

    @property
    def key(self) -> str:
        return f"{self.conv}|{self.algorithm}|{self.compression}@{self.ratio:g}"


@dataclass
class Pool:
    """The user's kernels and plans (rows of kernel indices)."""

    kernels: list[PoolKernel]
    plans: list[tuple[str, str, str]]      # (network, config, algorithm)
    members: list[np.ndarray]              # kernel indices of each plan (layers in order)
    layers: object = None                  # the (network, config, layer) table it came from

    def to_frame(self):
        return self.layers


@dataclass
class Step:
    measured: int
    picked: str | None
    within_10pct: float
    within_25pct: float
    median_error: float
    mean_interval: float                   # mean high/low of the plans


@dataclass
class Curve:
    device: str
    criterion: str
    reference: str
    steps: list[Step] = field(default_factory=list)

    def first_reaching(self, share: float = 0.9) -> int | None:
        return next((s.measured for s in self.steps if s.within_10pct >= share), None)


def pool_from_snapshot(path: Path, networks: list[str] | None) -> tuple[Pool, dict[str, float]]:
    """The pool of ``networks`` (default: every network of the snapshot) from a corpus
    snapshot's network table, and the snapshot's measured kernel times (ms) by key."""
    import pandas as pd

    from dlas_predict.corpus.store import networks_path

    path = Path(path)
    try:
        layers = pd.read_parquet(networks_path(path))
        kern = pd.read_parquet(path, columns=["conv", "algorithm", "compression", "ratio",
                                              "tuning", "median_s", "error"])
    except (OSError, ValueError) as exc:
        raise DlasError(f"cannot read the snapshot {path}: {exc}") from None
    kern = kern[kern.error.isna() & (kern.tuning == "untuned") & kern.median_s.notna()]
    measured: dict[str, float] = {}
    for c, a, p, r, s in zip(kern.conv, kern.algorithm, kern.compression, kern.ratio,
                             kern.median_s):
        k = PoolKernel(c, a, p, float(r)).key
        measured[k] = min(measured.get(k, np.inf), float(s) * 1e3)
    have = sorted(set(layers.network))
    chosen = networks or have
    missing = [n.removeprefix("zoo:") for n in chosen if n.removeprefix("zoo:") not in have]
    if missing:
        raise DlasError(f"{missing[0]!r} is not in the recorded measurements; they have: "
                        + ", ".join(have))
    return _pool(layers[layers.network.isin([n.removeprefix("zoo:") for n in chosen])],
                 measured), measured


def _pool(layers, measured: dict[str, float]) -> Pool:
    from dlas_predict.compression.netplan import layer_kernel
    from dlas_predict.space.config import GRID_ALGORITHMS, Compression

    kernels: list[PoolKernel] = []
    index: dict[str, int] = {}
    plans, members = [], []
    for (net, cfg), g in layers.sort_values("layer_index").groupby(["network", "config"]):
        # the kernel each layer runs: a channel-pruned layer with no zeroed filter left
        # after removal runs the dense one
        runs = [layer_kernel(Compression(p), float(r)) for p, r in zip(g.compression, g.ratio)]
        for alg in (a.value for a in GRID_ALGORITHMS):
            ks = [PoolKernel(c, alg, p.value, r) for c, (p, r) in zip(g.conv, runs)]
            if measured and any(k.key not in measured for k in ks):
                continue  # a plan the recordings cannot score
            rows = []
            for k in ks:
                if k.key not in index:
                    index[k.key] = len(kernels)
                    kernels.append(k)
                rows.append(index[k.key])
            plans.append((net, cfg, alg))
            members.append(np.array(rows))
    if not plans:
        raise DlasError("no plan of these networks has every kernel recorded")
    return Pool(kernels, plans, members, layers)


def _reference_pred(reference: str, pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """log ms of every pool kernel on the reference, and its own log interval width."""
    from dlas_predict.space.config import ConvSpec

    rows = [(ConvSpec.parse(k.conv), k.algorithm, k.compression, k.ratio, "untuned")
            for k in pool.kernels]
    mid, low, high = transfer.reference_predictions(reference, rows)
    return np.log(mid * 1e3), np.log(high / low)


def run(device: str, pool: Pool, oracle: Callable[[PoolKernel], float], budget: int,
        criterion: str = "variance", seed: int = 0, target_width: float | None = None,
        exclude_reference: bool = True, log=None, on_measure=None,
        deadline: float | None = None, clock=None) -> Curve:
    """One active-learning loop (see the module doc); ``oracle`` measures a kernel (ms).
    With ``deadline`` (a time of ``clock``, default :func:`time.monotonic`), no kernel is
    measured after it."""
    import time
    from dlas_predict.space.devices import device_names, get_device

    _check_options(budget, criterion, target_width)
    dev = (None if device not in device_names() else
           # a replay is of recorded data: the device as that data was measured
           transfer.data_spec(device) if isinstance(oracle, Replay) else
           get_device(device, with_target=False))
    kind = dev.kind if dev else "cpu"
    # the device's own data must not answer for it: a replay's (its recorded measurements),
    # and a live device's shipped model where it was trained on this very machine (the
    # local CPU's model on another machine is a reference like any other device's)
    exclude_reference = exclude_reference and (isinstance(oracle, Replay)
                                               or transfer.own_model(device))
    refs = [r for r in transfer.trained_devices()
            if not (exclude_reference and r == device)
            and transfer.data_spec(r).kind == kind]
    if not refs:
        raise DlasError(f"no trained {kind} model to start from")
    if dev is not None and dev.peak_gflops:
        reference = transfer.reference_for(dev, refs)
    else:
        reference = "local" if "local" in refs else refs[0]
    ref_dev = transfer.data_spec(reference)
    log_ref, ref_width = _reference_pred(reference, pool)
    comps = [k.compression for k in pool.kernels]
    bits = dev.simd_bits if dev is not None else None
    groups = [transfer.group_of(k.compression, k.algorithm, k.conv, bits) for k in pool.kernels]
    convs = [k.conv for k in pool.kernels]
    if dev is not None and dev.peak_gflops:
        fit = transfer.fit_transfer(dev.kind, exclude=device if exclude_reference else None)
        zmap = transfer.DeviceMap(device, reference, "zero-shot", fit.alpha, fit.beta,
                                  fit.q10, fit.q90)
        log_scale = np.array([zmap.log_scale(ref_dev, dev, c, conv)
                              for c, conv in zip(comps, convs)])
    else:
        zmap = transfer.DeviceMap(device, reference, "zero-shot", 0.0, 0.0, -1.0, 1.0)
        log_scale = np.zeros(len(comps))
    rng = np.random.default_rng(seed)
    measured: dict[int, float] = {}
    failed: set[int] = set()
    design, prior = _design(log_ref, groups, convs)
    curve = Curve(device, criterion, reference)
    m = zmap
    truth = None
    if hasattr(oracle, "truth"):
        truth = oracle.truth(pool)
    for step in range(budget + 1 + 2 * budget):  # failures do not spend the budget
        if len(curve.steps) > budget:
            break
        pred = m.apply(log_ref, log_scale, groups, convs)
        width = ref_width + (m.q90 - m.q10)
        ms = np.exp(pred)
        lo, hi = np.exp(pred + m.q10), np.exp(pred + m.q90)
        known = np.array(sorted(measured), dtype=int)
        for arr in (ms, lo, hi):
            if len(known):
                arr[known] = [measured[i] for i in known]
        totals = np.array([ms[r].sum() for r in pool.members])
        spans = np.array([hi[r].sum() / lo[r].sum() for r in pool.members])
        if not curve.steps or curve.steps[-1].measured != len(measured):
            curve.steps.append(_score(len(measured), totals, spans, truth, curve.steps,
                                      picked=None))
        if len(measured) == budget or (target_width and spans.max() <= target_width):
            break
        if deadline is not None and (clock or time.monotonic)() >= deadline:
            break
        free = np.array([i for i in range(len(pool.kernels))
                         if i not in measured and i not in failed])
        if not len(free):
            break
        if criterion == "random":
            pick = int(rng.choice(free))
        elif criterion == "variance":
            pick = int(free[np.argmax(_variance_gain(design, prior, measured, ms, pool,
                                                     totals, free))])
        else:
            score = np.zeros(len(pool.kernels))
            for r, total in zip(pool.members, totals):
                np.add.at(score, r, ms[r] / total)
            score *= width
            pick = int(free[np.argmax(score[free])])
        value = oracle(pool.kernels[pick])
        if not (np.isfinite(value) and value > 0):  # a recorded failure: never picked again
            failed.add(pick)
            if log:
                log(f"{pool.kernels[pick].key}: measurement failed; skipped")
            continue
        measured[pick] = float(value)
        curve.steps[-1].picked = pool.kernels[pick].key
        if on_measure:
            on_measure(pool.kernels[pick], value)
        if len(measured) >= 3:
            idx = np.array(sorted(measured))
            m = transfer.adapted_map(dev or transfer.measured_only(device, ref_dev),
                                     reference, log_ref[idx],
                                     log_scale[idx], np.log([measured[i] for i in idx]),
                                     [groups[i] for i in idx], base=zmap,
                                     convs=[convs[i] for i in idx], x_var=float(np.var(log_ref)))
        if log:
            s = curve.steps[-1]
            log(f"{criterion}: {len(measured)}/{budget} measured; plans within ±10%: "
                + ("?" if truth is None else f"{s.within_10pct:.0%}")
                + f"; mean interval ×{s.mean_interval:.2f}")
    curve.map = m  # type: ignore[attr-defined]
    return curve


def _design(log_ref: np.ndarray, groups: list[str], convs: list[str]):
    """The adapted map's parameters as a design over the whole pool, and their prior
    precision (:func:`dlas_predict.crossdev.transfer.adapted_map`, in units of one row)."""
    gs, cs = sorted(set(groups)), sorted(set(convs))
    gi = {g: i for i, g in enumerate(gs)}
    ci = {c: i for i, c in enumerate(cs)}
    Z = np.zeros((len(log_ref), 2 + len(gs) + len(cs)))
    Z[:, 0] = 1.0
    Z[:, 1] = log_ref - log_ref.mean()
    Z[np.arange(len(groups)), 2 + np.array([gi[g] for g in groups])] = 1.0
    Z[np.arange(len(convs)), 2 + len(gs) + np.array([ci[c] for c in convs])] = 1.0
    prior = np.diag([5.0, 5.0 * max(np.var(log_ref), 1e-3)] + [2.0] * len(gs)
                    + [0.5] * len(cs))
    return Z, prior


def _variance_gain(Z, prior, measured: dict, ms: np.ndarray, pool: Pool, totals: np.ndarray,
                   free: np.ndarray) -> np.ndarray:
    """Expected drop of Σ_plans Var(plan)/plan² from measuring each free kernel (in units
    of the per-kernel log noise, which is common to all and drops out of the choice)."""
    idx = np.array(sorted(measured), dtype=int)
    A = Z[idx]
    S = np.linalg.inv(A.T @ A + prior)
    unmeasured = np.ones(len(Z), bool)
    unmeasured[idx] = False
    # each plan's latency gradient through the parameters (its unmeasured kernels)
    G = np.vstack([(ms[r] * unmeasured[r]) @ Z[r] for r in pool.members])
    SZ = S @ Z[free].T
    den = 1.0 + np.einsum("ij,ji->i", Z[free], SZ)
    inv_t2 = 1.0 / totals ** 2
    gain = (((G @ SZ) ** 2) * inv_t2[:, None]).sum(axis=0) / den
    own = np.zeros(len(Z))
    for r, w in zip(pool.members, inv_t2):
        np.add.at(own, r, ms[r] ** 2 * w)
    return gain + own[free]


def _score(step, totals, spans, truth, steps, picked) -> Step:
    if truth is None:
        return Step(step, picked, float("nan"), float("nan"), float("nan"),
                    float(np.mean(spans)))
    err = np.abs(totals / truth - 1)
    return Step(step, picked, float(np.mean(err <= 0.10)), float(np.mean(err <= 0.25)),
                float(np.median(err)), float(np.mean(spans)))


class Replay:
    """Recorded measurements as the device: a kernel's time is looked up."""

    def __init__(self, measured: dict[str, float]):
        self.measured = measured

    def __call__(self, k: PoolKernel) -> float:
        if k.key not in self.measured:
            raise DlasError(f"{k.key} is not in the recorded measurements")
        return self.measured[k.key]

    def truth(self, pool: Pool) -> np.ndarray:
        return np.array([sum(self.measured[pool.kernels[i].key] for i in r)
                         for r in pool.members])


def plot(curves: dict[str, list[Curve]], out: Path, title: str) -> Path:
    """Plans within ±10 % against measurements, each criterion's mean over its runs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for crit, runs in curves.items():
        n = min(len(c.steps) for c in runs)
        y = np.mean([[s.within_10pct for s in c.steps[:n]] for c in runs], axis=0)
        label = crit if len(runs) == 1 else f"{crit} (mean of {len(runs)} runs)"
        ax.plot(range(n), 100 * y, label=label, marker="." if n < 60 else None)
    ax.axhline(90, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("kernel measurements")
    ax.set_ylabel("plans within ±10 % of measured (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def save_adapted(device: str, curve: Curve, pool: Pool, measured: list[str]) -> Path:
    """The loop's map and the keys of the kernels it measured, in order, under DLAS_HOME
    (what `recommend` then uses)."""
    from dlas_predict.crossdev.adapted import adapted_path

    path = adapted_path(device)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {"device": device, "source": "profiles", "level": "kernel", "targets": [],
                 "log_ms": []}
    saved["recommend_map"] = curve.map.to_dict()  # type: ignore[attr-defined]
    saved["active_learning"] = {"measured": measured, "criterion": curve.criterion,
                                "steps": [asdict(s) for s in curve.steps]}
    path.write_text(json.dumps(saved, indent=1))
    return path


def pool_from_networks(networks: list[str], channel_ratios: tuple[float, ...] = ()) -> Pool:
    """The pool of networks measured live: each conv layer × algorithm, dense, float16 and
    int8; with ``channel_ratios``, each network channel-pruned at those ratios too, its
    layers at the shapes that removing its zeroed filters leaves (the kernels its
    channel-pruned plans run; a network whose weights cannot be pruned has none). Weight
    pruning's kernels need recorded sparsities: replay them from a snapshot."""
    import pandas as pd

    from dlas_predict.compression.compress import cached_channel_removed
    from dlas_predict.compression.netplan import config_label, kernel_ratio
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.space.config import Compression

    rows = []
    for net in networks:
        n = read_network(zoo.resolve(net), net.removeprefix("zoo:"))
        for i, c in enumerate(n.convs()):
            for comp in ("dense", "float16", "int8"):
                rows.append({"network": n.name, "config": comp, "layer_index": i,
                             "conv": c.spec.to_spec(), "compression": comp, "ratio": 0.0})
        try:
            removed = cached_channel_removed(net, channel_ratios) if channel_ratios else {}
        except DlasError:
            removed = {}
        for r, (layers, _) in sorted(removed.items()):
            cfg = config_label(Compression.CHANNEL_PRUNING, r)
            rows.extend({"network": n.name, "config": cfg, "layer_index": i,
                         "conv": spec.to_spec(), "compression": "channel_pruning",
                         "ratio": kernel_ratio(sp)} for i, (spec, sp) in enumerate(layers))
    if not rows:
        raise DlasError("these networks have no conv layer")
    return _pool(pd.DataFrame(rows), {})


class Live:
    """A device measured now, kernel by kernel, through the project's runner (this machine,
    its profiles, or boards of a tracker). A kernel that fails is recorded and skipped."""

    def __init__(self, runner, device, store=None):
        self.runner, self.device, self.store = runner, device, store
        self.failed: dict[str, str] = {}

    def __call__(self, k: PoolKernel) -> float:
        r = self.result(k)
        return float("nan") if r is None else float(r.median_s * 1e3)

    def result(self, k: PoolKernel):
        """The kernel's measurement (recorded in the store, where there is one); None where
        it failed or its output was wrong, and ``failed[key]`` says why."""
        from dlas_predict.corpus.collect import collect_kernels
        from dlas_predict.measure.execution.runner import MeasureTask
        from dlas_predict.space.config import ConvSpec, Variant

        task = MeasureTask.make(ConvSpec.parse(k.conv),
                                Variant(k.algorithm, k.compression, k.ratio, "untuned"),
                                self.device)
        res = collect_kernels([task], None, self.runner, progress=False,
                              on_result=self.store.add if self.store is not None else None
                              ).results
        r = res[0] if res else None
        if r is None or not r.ok or r.verified is False:
            self.failed[k.key] = (r.error if r is not None else "no result") or "not verified"
            return None
        return r


def replay_source(path: Path, networks: list[str] | None, device: str) -> tuple[Pool, Replay]:
    """The pool and the recorded device of ``--replay``: a corpus snapshot (.parquet), a
    corpus store (.sqlite: its records of ``device``) or a CSV of
    ``target,config,latency_ms`` rows (conv targets, with ``--network``)."""
    import tempfile

    path = Path(path)
    if not path.is_file():
        raise DlasError(f"{param('replay')}: {path} not found")
    if path.suffix == ".csv":
        from dlas_predict.recommend.adapt import read_measurements

        if not networks:
            raise DlasError(f"{param('replay')} FILE.csv needs {param('network')}: the CSV "
                            "names kernels, not the networks they belong to")
        measured = {}
        for t, c, v, n in read_measurements(path):
            if t.kind != "conv" or c.algorithm is None:
                raise DlasError(f"{path}:{n}: replay rows are convs with their algorithm "
                                "(e.g. dense/gemm)")
            measured[PoolKernel(t.key, c.algorithm, c.compression, c.ratio or 0.0).key] = v
        pool = _pool(pool_from_networks(networks).to_frame(), measured)
        return pool, Replay(measured)
    if path.suffix in (".sqlite", ".db"):
        from dlas_predict.corpus.store import CorpusStore

        tmp = Path(tempfile.mkdtemp()) / f"{device}.parquet"
        with CorpusStore(path, must_exist=True) as db:
            db.export(tmp, "parquet")
        path = tmp
    pool, measured = pool_from_snapshot(path, networks)
    return pool, Replay(measured)


@dataclass
class LearnReport:
    """One ``active-learn`` run: the criterion's curve (and random choice's, over
    ``random_runs`` seeds, when replayed), the pool it learned for, where the learning curve
    was drawn and where the adapted map was saved."""

    device: str
    criterion: str
    pool: Pool
    curves: dict[str, list[Curve]]
    plot: Path
    saved: Path
    replayed: bool
    failed: dict[str, str] = field(default_factory=dict)   # kernel key -> error (live)

    @property
    def main(self) -> Curve:
        return self.curves[self.criterion][0]

    def to_dict(self) -> dict:
        return {"device": self.device, "reference": self.main.reference,
                "plans": len(self.pool.plans), "kernels": len(self.pool.kernels),
                "curves": {k: [[asdict(s) for s in c.steps] for c in v]
                           for k, v in self.curves.items()},
                "failed": self.failed, "plot": str(self.plot), "saved": str(self.saved)}


def _check_options(budget: int, criterion: str, target_interval: float | None) -> None:
    if budget < 1:
        raise DlasError(f"{param('budget')} must be at least 1")
    if criterion not in CRITERIA:
        raise DlasError(f"unknown {param('criterion')} {criterion!r}; allowed: "
                        + ", ".join(CRITERIA))
    if target_interval is not None and target_interval <= 1:
        raise DlasError(f"{param('target_interval')} is a high/low ratio above 1 (e.g. 1.2)")


def learn_replay(device: str, replay: Path, networks: list[str] | None, budget: int,
                 criterion: str = "variance", seed: int = 0,
                 target_interval: float | None = None, random_runs: int = 3,
                 plot_to: Path | None = None, log=None) -> LearnReport:
    """The loop against recorded measurements (:func:`replay_source`), beside random choice
    over ``random_runs`` seeds; the learning curve drawn and the map saved."""
    _check_options(budget, criterion, target_interval)
    pool, oracle = replay_source(replay, networks or None, device)
    if budget > len(pool.kernels):
        raise DlasError(f"{param('budget')} {budget} is more than the {len(pool.kernels)} "
                        "kernels of these networks")
    curves = {criterion: [run(device, pool, oracle, budget, criterion, seed, target_interval,
                              log=log)]}
    if criterion != "random":
        curves["random"] = [run(device, pool, oracle, budget, "random", s, target_interval)
                            for s in range(random_runs)]
    return _finish(device, criterion, pool, curves, plot_to, replayed=True)


def learn_live(device: str, networks: list[str], runner: Callable, budget: int,
               criterion: str = "variance", seed: int = 0,
               target_interval: float | None = None, store: Path | None = None,
               plot_to: Path | None = None, log=None) -> LearnReport:
    """The loop on the device itself: each picked kernel timed by the runner that
    ``runner()`` opens (a context manager: this machine's worker, or a farm's boards; opened
    once the options and networks are read) and, with ``store``, recorded there too."""
    from dlas_predict.space.devices import get_device

    _check_options(budget, criterion, target_interval)
    if not networks:
        raise DlasError(f"{param('network')} is needed (the networks whose kernels to measure)")
    pool = pool_from_networks(list(networks))
    db = None
    if store is not None:
        from dlas_predict.corpus.store import CorpusStore

        db = CorpusStore(store)
    try:
        with runner() as timer:
            oracle = Live(timer, get_device(device), db)
            curve = run(device, pool, oracle, min(budget, len(pool.kernels)), criterion,
                        seed, target_interval, log=log)
    finally:
        if db is not None:
            db.close()
    return _finish(device, criterion, pool, {criterion: [curve]}, plot_to, replayed=False,
                   failed=oracle.failed)


def _finish(device: str, criterion: str, pool: Pool, curves: dict[str, list[Curve]],
            plot_to: Path | None, replayed: bool,
            failed: dict[str, str] | None = None) -> LearnReport:
    """Save the criterion's map and measurements, draw the curves, and report."""
    from dlas_predict.paths import dlas_home

    main = curves[criterion][0]
    picked = [s.picked for s in main.steps if s.picked]
    saved = save_adapted(device, main, pool, list(dict.fromkeys(picked)))
    out = plot(curves, plot_to or dlas_home() / "active-learn" / f"{device}.png",
               f"{device}: {len(pool.plans)} plans of {len({p[0] for p in pool.plans})} "
               f"network(s), reference {main.reference}")
    return LearnReport(device, criterion, pool, curves, out, saved, replayed, failed or {})
