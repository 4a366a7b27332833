"""This machine's CPU calibrated in minutes: ``dlas-predict calibrate``.

A CPU whose ``local`` model was trained elsewhere is answered from a reference device's
models, mapped by its spec (zero-shot). Calibration measures it:

0. **Roofs**: where this machine's roofs are not measured yet, they are first (as
   ``devices --measure-peaks``, about 15 s): the map scales the reference's latencies by
   them, and ``/proc/cpuinfo``'s base clock can be far below the clock the cores sustain.
1. **Kernels**: active learning (:func:`dlas_predict.recommend.active.run`) over the conv
   kernels of the calibration networks and the narrower layers of their channel-pruned
   plans (:data:`CHANNEL_RATIOS`), until the kernel share of the time budget is spent; the
   adapted kernel map (offset, slope, group and shape offsets) is fitted.
2. **Whole networks**: with that map in place, networks are priced (by default the
   calibration networks, the rest of the calibration set, then :data:`GENERATED`: CNNs of
   each block style, a transformer, recurrent networks and an MLP) and a few of their
   candidates are built and timed here, onnxruntime's (fp32, float16, int8,
   channel-pruned) and our builds (one algorithm's, and a per-layer plan of mixed
   kernels), round by round (:data:`ROUNDS`: each network's dense runs, then each one's
   channel-pruned runs, ...) until the time is up. Each backend's residuals give log
   offsets by network family (conv, transformer, MLP, recurrent) and by compression
   (ours, mixed plans apart) or run mode (onnxruntime's), each shrunk to the level above
   it, with their leave-one-out error as the interval.

The map is saved under ``DLAS_HOME/adapted/DEVICE.json`` with this machine's fingerprint
(a map of another machine is not used). Every measurement is committed to
``DLAS_HOME/calibrate/FINGERPRINT.sqlite`` as it is taken: an interrupted calibration
resumes where it stopped, nothing measured twice. A timing the canary found noisy is
recorded as such and left out of the fit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dlas_predict.errors import DlasError, param
from dlas_predict.corpus.collect import CALIBRATION_SET, calibration_networks

#: The share of the time budget the kernels get; whole networks take the rest.
KERNEL_SHARE = 0.55
#: The runs timed per network, round by round: every network's first round, then every
#: network's second, and so on, so that a short calibration measures many networks in a
#: few runs each rather than a few networks in every run (a new network's error is mostly
#: its own: the offsets learn more from another network than from another mode of the
#: same one). Each run is (backend, compression, ratio, mixed). ``mixed``: our per-layer
#: plan whose layers run more than one kernel (its own offset group), else one algorithm's
#: fastest.
ROUNDS = ((("onnxruntime", "dense", None, False), ("tvm", "dense", None, False)),
          (("onnxruntime", "channel_pruning", 0.9, False),
           ("tvm", "channel_pruning", 0.9, False), ("tvm", "channel_pruning", 0.9, True)),
          (("onnxruntime", "int8", None, False), ("tvm", "int8", None, False)),
          (("tvm", "dense", None, True), ("onnxruntime", "float16", None, False),
           ("onnxruntime", "channel_pruning", 0.5, False)))
#: Generated networks timed after the calibration set (``generate`` families and
#: parameters): a CNN of each block style (plain, residual, separable, inverted with SiLU
#: and squeeze-excitation), a transformer, a GRU and an LSTM network (onnxruntime runs each
#: cell as an op of its own) and an MLP, so that each family the grid answers for has
#: offsets measured on this machine.
GENERATED = (
    ("cnn", "layers=4,kernels=32,input=32,block=plain,downsample=2"),
    ("transformer", "layers=2,d_model=128,heads=4,ffn=4,seq=48"),
    ("cnn", "layers=3,kernels=64,input=24,block=residual,downsample=1"),
    ("rnn", "layers=1,hidden=128,embedding=64,vocab=1000,seq=16,cell=gru"),
    ("cnn", "layers=4,kernels=48,input=32,kernel_size=5,block=separable,downsample=2"),
    ("fc", "layers=3,nodes=1024"),
    ("cnn", "layers=4,kernels=24,input=40,block=inverted,downsample=2,activation=silu,se=1"),
    ("rnn", "layers=1,hidden=128,embedding=64,vocab=1000,seq=20,cell=lstm"),
)
#: Fewest onnxruntime runs, of at least this many networks, that its two scales are
#: fitted on (fewer: the offsets alone).
MIN_SCALE_ROWS, MIN_SCALE_NETWORKS = 6, 3
#: The weight of the prior that the two onnxruntime scales are equal, in relative-error
#: rows.
SCALE_PRIOR = 0.5
#: The channel-pruning ratios whose smaller layers join the kernels' pool: the narrow
#: shapes a channel-pruned plan runs, which the reference's map prices worst.
CHANNEL_RATIOS = (0.5, 0.9)
#: Kernel measurements at most: whole networks say more per minute once the kernel map
#: has settled (on a 2-core Zen 4, 150 kernels took about a minute).
MAX_KERNELS = 150


@dataclass
class Measured:
    """One calibration measurement: a kernel or a whole network, its time or why none."""

    key: str
    kind: str                  # kernel | network
    ms: float | None
    note: str = ""             # failed: ... | noisy: ...


class Memo:
    """Every calibration measurement of one machine, committed as it is taken (SQLite)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(str(path))
        self.db.execute("CREATE TABLE IF NOT EXISTS calibration (key TEXT PRIMARY KEY, "
                        "kind TEXT NOT NULL, ms REAL, note TEXT, at REAL NOT NULL)")
        self.db.commit()

    def get(self, key: str) -> Measured | None:
        row = self.db.execute("SELECT key, kind, ms, note FROM calibration WHERE key = ?",
                              (key,)).fetchone()
        return Measured(*row) if row else None

    def put(self, m: Measured) -> None:
        self.db.execute("INSERT OR REPLACE INTO calibration VALUES (?, ?, ?, ?, ?)",
                        (m.key, m.kind, m.ms, m.note, time.time()))
        self.db.commit()

    def count(self, kind: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM calibration WHERE kind = ?",
                               (kind,)).fetchone()[0]

    def close(self) -> None:
        self.db.close()


@dataclass
class NetworkRow:
    """A whole network's candidate as priced before its offsets, and as timed."""

    network: str
    config: str                # e.g. int8/gemm, dense/onnxruntime
    backend: str
    group: str                 # ours: the compression, or mixed; onnxruntime: its run mode
    predicted_ms: float
    measured_ms: float
    family: str = ""           # transformer, mlp, recurrent or "" (a conv network)
    fixed_ms: float = 0.0      # onnxruntime: the per-op costs' part of predicted_ms

    def calibrated_ms(self, scales: tuple[float, float], offsets: dict[str, float],
                      family: str | None = None) -> float:
        """The prediction with its two parts scaled and its group's offset (of ``family``,
        by default its own; an onnxruntime run's as :func:`onnxruntime_groups` reads it)
        applied."""
        from dlas_predict.crossdev.offsets import (offset_of, onnxruntime_groups,
                                                   scaled_by_parts)

        groups = onnxruntime_groups(self.group) if self.backend == "onnxruntime" \
            else [self.group]
        return scaled_by_parts(self.predicted_ms, self.fixed_ms, scales) * float(np.exp(
            offset_of(offsets, groups, self.family if family is None else family)))


@dataclass
class CalibrationReport:
    device: str
    fingerprint: str
    cpu_model: str
    reference: str
    networks: list[str]
    kernels: int
    kernels_failed: int
    network_rows: list[NetworkRow]
    seconds: float
    saved: str
    memo: str
    kernel_error: dict = field(default_factory=dict)   # leave-one-out, kernels
    network_offsets: dict = field(default_factory=dict)
    onnxruntime_offsets: dict = field(default_factory=dict)
    network_loo: list[float] = field(default_factory=list)
    onnxruntime_loo: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    onnxruntime_scales: tuple[float, float] = (1.0, 1.0)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(device) -> None:
    if device.kind != "cpu" or not device.measured_here:
        raise DlasError(f"calibrate measures this machine's CPU (local or one of its "
                        f"profiles); {device.name} is not measured here (for a board: "
                        "`active-learn --device NAME --tracker HOST:PORT`, or `adapt`)")


def run(device: str, minutes: float, networks: list[str] | None,
        kernel_oracle: Callable | None = None, network_oracle: Callable | None = None,
        log: Callable[[str], None] | None = None, memo_path: Path | None = None,
        fingerprint: str | None = None, clock: Callable[[], float] = time.monotonic
        ) -> CalibrationReport:
    """Calibrate ``device`` in about ``minutes``: kernels by active learning, then whole
    networks (module doc). ``kernel_oracle(PoolKernel) -> (ms, note)`` and
    ``network_oracle(model, network, [Candidate]) -> [(ms, note)]`` measure (default: this
    machine); ``fingerprint`` names the machine the measurements are of (default: the
    device's)."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.crossdev.offsets import shrunk_offsets
    from dlas_predict.recommend import active
    from dlas_predict.crossdev.adapted import adapted_path
    from dlas_predict.paths import dlas_home
    from dlas_predict.space.devices import get_device, peaks_measured_here

    t0 = clock()
    say = log or (lambda s: None)
    if not minutes > 0:
        raise DlasError(f"{param('minutes')} must be above 0, got {minutes:g}")
    live = kernel_oracle is None or network_oracle is None
    dev = get_device(device, with_target=live)
    if live:
        _check(dev)
    fp = fingerprint or dev.fingerprint
    if not fp:
        raise DlasError(f"{device} has no fingerprint to calibrate under")
    if live and (dev.source != "measured" or not peaks_measured_here(dev.fingerprint)):
        dev = _measure_roofs(dev, say)
    if transfer.own_model(device) and fingerprint is None:
        drift = transfer.roof_drift(device)
        if drift is None:
            raise DlasError(f"{device}'s model was trained on this very CPU (fingerprint "
                            f"{fp}) and this host's roofs match it: there is nothing to "
                            "calibrate; `collect` and `train` refresh it")
        say(f"{drift}: its latencies would be of that host; calibrating this one")
    nets = calibration_networks(networks)
    pool = active.pool_from_networks(nets, CHANNEL_RATIOS)
    # whole networks: the kernels' networks, then (by default) the calibration set's
    # others and the generated networks of every family
    home = memo_path.parent if memo_path else dlas_home() / "calibrate"
    timed = nets + [n for n in calibration_networks(CALIBRATION_SET) if n not in nets] \
        + generated_networks(home / "networks") if networks is None else nets
    memo = Memo(memo_path or home / f"{fp}.sqlite")
    kernel_oracle = kernel_oracle or LiveKernels(dev)
    network_oracle = network_oracle or LiveNetworks(dev)
    path = adapted_path(device)
    try:
        deadline = t0 + KERNEL_SHARE * minutes * 60.0
        say(f"calibrating {device} ({dev.description}, fingerprint {fp}) in about "
            f"{minutes:g} min: kernels of {len(nets)} networks ({len(pool.kernels)} "
            "candidates), then whole networks")
        failed = 0

        def oracle(k) -> float:
            nonlocal failed
            got = memo.get(k.key)
            if got is None:
                ms, note = kernel_oracle(k)
                got = Measured(k.key, "kernel", ms, note)
                memo.put(got)
            if got.ms is None or got.note:
                failed += 1
                say(f"kernel {k.key}: {got.note or 'failed'}; left out")
                return float("nan")
            return float(got.ms)

        curve = active.run(device, pool, oracle, min(MAX_KERNELS, len(pool.kernels)),
                           "variance", exclude_reference=False, deadline=deadline,
                           clock=clock, log=lambda s: say(f"kernels {_elapsed(clock, t0)}: "
                                                          + s))
        kmap = curve.map  # type: ignore[attr-defined]
        kmap.fingerprint = fp
        kmap.network_offsets, kmap.onnxruntime_offsets = {}, {}
        _save(path, device, kmap, curve, fp)
        n_kernels = len([s for s in curve.steps if s.picked])
        say(f"kernels {_elapsed(clock, t0)}: {n_kernels} measured, reference "
            f"{kmap.reference}; now whole networks")

        rows = _networks_phase(device, timed, memo, network_oracle, t0 + minutes * 60.0,
                               clock, lambda s: say(f"networks {_elapsed(clock, t0)}: " + s))
        notes = []
        tvm = [r for r in rows if r.backend == "tvm"]
        ort = [r for r in rows if r.backend == "onnxruntime"]
        net_loo = ort_loo = np.array([])
        if tvm:
            res = np.log([r.measured_ms / r.predicted_ms for r in tvm])
            kmap.network_offsets, net_loo = shrunk_offsets(
                res, [r.group for r in tvm], families=[r.family for r in tvm],
                networks=[r.network for r in tvm])
            # a new network's error: its offset's and its unseen kernels' map error
            kmap.network_q = _combined(_quantiles(net_loo, res), (kmap.q10, kmap.q90))
        else:
            notes.append("no whole network of ours was timed: our builds keep the kernel map "
                         "alone (give more --minutes)")
        if ort:
            kmap.onnxruntime_scales, kmap.onnxruntime_offsets, ort_loo = \
                onnxruntime_calibration(ort)
            res = np.log([r.measured_ms / r.predicted_ms for r in ort])
            kmap.onnxruntime_q = _quantiles(ort_loo, res)
        else:
            notes.append("no onnxruntime run was timed: its rows keep the kernel map's ratio")
        _save(path, device, kmap, curve, fp, rows)
        return CalibrationReport(
            device, fp, dev.description, kmap.reference, nets, n_kernels, failed, rows,
            clock() - t0, str(path), str(memo.path), {"q10": kmap.q10, "q90": kmap.q90},
            kmap.network_offsets, kmap.onnxruntime_offsets, net_loo.tolist(),
            ort_loo.tolist(), notes, kmap.onnxruntime_scales)
    finally:
        memo.close()
        for o in (kernel_oracle, network_oracle):
            if hasattr(o, "close"):
                o.close()


def _measure_roofs(dev, say):
    """This machine's roofs measured and stored with its entry; the entry again, with
    them (a measurement that fails keeps the estimate, and says so)."""
    from dlas_predict.measure.execution.runner import LocalRunner
    from dlas_predict.measure.peaks import measure_device_peaks
    from dlas_predict.space.devices import get_device

    f32 = dev.peak_gflops.get('float32', 0)
    say(f"measuring the roofs of {dev.name} first (about 15 s): " + (
        f"its spec is an estimate ({f32:.0f} GFLOP/s float32 at /proc/cpuinfo's clock)"
        if dev.source != "measured" else f"the roofs it has ({f32:.1f} GFLOP/s float32) "
        "are those shipped for its CPU id, measured on the host its data came from"))
    try:
        peaks, _ = measure_device_peaks(dev, lambda: LocalRunner(dev, timeout_s=600))
    except DlasError as exc:
        say(f"the roofs could not be measured ({exc}); the estimate is kept")
        return dev
    say(f"roofs: {peaks.peak_gflops.get('float32', 0):.1f} GFLOP/s float32, "
        f"{peaks.mem_bandwidth_gbs:.1f} GB/s (measured)")
    return get_device(dev.name, with_target=True)


#: Set to ``0``, ``recommend`` keeps an uncalibrated CPU's estimated roofs instead of
#: measuring them first (:func:`roofs_first`).
MEASURE_ROOFS_ENV = "DLAS_MEASURE_ROOFS"


def roofs_first(device: str, say) -> bool:
    """Measure this machine's roofs before a zero-shot answer for ``device`` (this machine
    or a profile of it, with no model of its own and no calibration here, and its roofs an
    estimate from the ISA and /proc/cpuinfo's clock): once, kept under DLAS_HOME by the
    CPU's fingerprint, unless :data:`MEASURE_ROOFS_ENV` is ``0``. The zero-shot map scales
    the reference's latencies by the two CPUs' roofs: on a Zen 5 forced to AVX2, the
    zero-shot MAPE of new networks' candidates is 63 % with the estimate, 19 % with them
    measured (``benchmarks/bench_calibrate.py``). Returns whether it measured."""
    from dlas_predict.space.devices import device_names, get_device

    if not _may_measure_roofs() or device not in device_names():
        return False
    dev = get_device(device, with_target=False)
    if not dev.measured_here or dev.source == "measured" or not needed(device):
        return False
    _measure_roofs(get_device(device, with_target=True), say)
    return True


def _may_measure_roofs() -> bool:
    """Roofs may be measured before an answer (:data:`MEASURE_ROOFS_ENV` is not ``0``)."""
    import os

    return os.environ.get(MEASURE_ROOFS_ENV, "1").strip() != "0"


def host_drift(device: str, say) -> str | None:
    """Where ``device`` (this machine or a profile of it) has a model of its own, trained
    on a host of this CPU id: this host's roofs measured once (unless
    :data:`MEASURE_ROOFS_ENV` is ``0``), and the sentence
    :func:`~dlas_predict.crossdev.transfer.roof_drift` gives where they lie off the
    model's (None where they do not, or where ``device`` has no such model)."""
    from dlas_predict.crossdev.transfer import of_this_machine, own_model, roof_drift
    from dlas_predict.space.devices import get_device, peaks_measured_here

    if not of_this_machine(device) or not own_model(device):
        return None
    dev = get_device(device, with_target=False)
    if not peaks_measured_here(dev.fingerprint) and _may_measure_roofs():
        _measure_roofs(get_device(device, with_target=True), say)
    return roof_drift(device)


def needed(device: str) -> bool:
    """``device`` has no model of its own here and no calibration of this machine."""
    from dlas_predict.crossdev.transfer import device_map, own_model

    return not own_model(device) and device_map(device)[0].source == "zero-shot"


def onnxruntime_scales(rows: list[NetworkRow]) -> tuple[float, float]:
    """The scales of the reference onnxruntime model's per-op costs and of the rest that
    fit ``rows`` best in relative error (non-negative least squares): another CPU's per-op
    overhead is not its throughput (a Zen 4's model on a Zen 5's runs, ``calibrate
    --minutes 5``: ×0.82 and ×0.48). (1, 1), the offsets alone, with fewer than
    :data:`MIN_SCALE_ROWS` rows of :data:`MIN_SCALE_NETWORKS` networks, or where either
    scale would vanish."""
    from scipy.optimize import nnls

    if len(rows) < MIN_SCALE_ROWS or len({r.network for r in rows}) < MIN_SCALE_NETWORKS:
        return 1.0, 1.0
    A = np.array([[r.fixed_ms, r.predicted_ms - r.fixed_ms] for r in rows])
    y = np.array([r.measured_ms for r in rows])
    # a prior row pulls the two together: few runs, or runs with little per-op cost, leave
    # the per-op scale loose, and it then stays near the other
    prior = SCALE_PRIOR * np.array([[1.0, -1.0]])
    a, b = nnls(np.r_[A / y[:, None], prior], np.r_[np.ones(len(y)), 0.0])[0]
    return (float(a), float(b)) if a > 0 and b > 0 else (1.0, 1.0)


def fit_onnxruntime(rows: list[NetworkRow]) -> tuple[tuple[float, float], dict[str, float]]:
    """onnxruntime's two scales (:func:`onnxruntime_scales`) and the offsets by family and
    mode of what they leave (:func:`~dlas_predict.crossdev.offsets.shrunk_offsets`)."""
    from dlas_predict.crossdev.offsets import scaled_by_parts, shrunk_offsets

    scales = onnxruntime_scales(rows)
    res = np.log([r.measured_ms / scaled_by_parts(r.predicted_ms, r.fixed_ms, scales)
                  for r in rows])
    off, _ = shrunk_offsets(res, [r.group for r in rows], families=[r.family for r in rows],
                            networks=[r.network for r in rows], with_loo=False)
    return scales, off


def onnxruntime_calibration(rows: list[NetworkRow]
                            ) -> tuple[tuple[float, float], dict[str, float], np.ndarray]:
    """onnxruntime's calibration from its runs here (:func:`fit_onnxruntime`), and each
    run's leave-one-out log residual (scales and offsets fitted without it)."""
    scales, off = fit_onnxruntime(rows)
    loo = np.array([np.log(r.measured_ms / r.calibrated_ms(*fit_onnxruntime(
        rows[:i] + rows[i + 1:]))) for i, r in enumerate(rows)])
    return scales, off, loo


def _quantiles(loo: np.ndarray, res: np.ndarray) -> tuple[float, float]:
    """The 10-90 % leave-one-out error, at least ±5 % (and the residuals' own spread where
    there are fewer than five rows)."""
    src = loo if len(loo) >= 5 else np.r_[loo, res - res.mean()] if len(res) else np.zeros(1)
    q10, q90 = np.quantile(src, [0.1, 0.9])
    return float(min(q10, -0.05)), float(max(q90, 0.05))


def _combined(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The 10-90 % log error of two independent errors: each end in quadrature."""
    return -float(np.hypot(a[0], b[0])), float(np.hypot(a[1], b[1]))


def _elapsed(clock, t0) -> str:
    s = int(clock() - t0)
    return f"{s // 60}:{s % 60:02d}"


def _save(path: Path, device: str, kmap, curve, fp: str, rows: list[NetworkRow] | None = None
          ) -> None:
    from dlas_predict.files import write_if_changed

    saved = {"device": device, "source": "calibrate", "level": "kernel", "targets": [],
             "log_ms": [], "fingerprint": fp, "recommend_map": kmap.to_dict(),
             "active_learning": {"measured": [s.picked for s in curve.steps if s.picked],
                                 "criterion": curve.criterion},
             "networks": [asdict(r) for r in rows or []]}
    write_if_changed(path, json.dumps(saved, indent=1).encode())


def generated_networks(directory: Path) -> list[str]:
    """The :data:`GENERATED` networks' files in ``directory``, written where missing."""
    from dlas_predict.networks.generate import file_name, generate, parse_grid

    out = []
    for family, params in GENERATED:
        items = params.split(",")
        path = directory / file_name(family, parse_grid(family, items)[0])
        if not path.is_file():
            generate(family, items, directory)
        out.append(str(path))
    return out


def _networks_phase(device: str, nets: list[str], memo: Memo, oracle: Callable,
                    deadline: float, clock, say) -> list[NetworkRow]:
    """Round by round (:data:`ROUNDS`), network by network, time each network's
    calibration candidates of the round until the deadline; each network is priced with
    the kernel map when first reached."""
    from dlas_predict.crossdev.transfer import MIXED
    from dlas_predict.models.ortmodel import model_mode
    from dlas_predict.recommend.search import recommend

    rows: list[NetworkRow] = []
    priced: dict[str, tuple] = {}

    def price(net: str) -> tuple:
        if net not in priced:
            rec = recommend(net, device, max_accuracy_drop=float("inf"), top=0,
                            ratios=(0.5, 0.9), tuning="untuned")
            best = {}
            for c in rec.candidates:
                if c.algorithm == "per_layer" and not c.mixed:
                    continue  # one algorithm's plan: that algorithm's candidate
                k = (c.backend, c.compression.value, c.ratio, c.mixed)
                if k not in best or c.predicted_s < best[k].predicted_s:
                    best[k] = c
            priced[net] = (rec, best)
        return priced[net]

    for r, runs in enumerate(ROUNDS, 1):
        for j, net in enumerate(nets):
            if clock() >= deadline:
                say(f"time is up in round {r} of {len(ROUNDS)}: {len(nets) - j} network(s) "
                    "left for it")
                return rows
            rec, best = price(net)
            for w in runs:
                c = best.get(w)
                if c is None:
                    continue
                key = f"{rec.network}|{c.label}|{c.backend}"
                got = memo.get(key)
                if got is None:
                    if clock() >= deadline:
                        say(f"time is up in round {r} of {len(ROUNDS)}: {rec.network}'s "
                            f"other runs and {len(nets) - j - 1} network(s) left for it")
                        return rows
                    ms, note = oracle(net, rec.network, [c])[0]
                    got = Measured(key, "network", ms, note)
                    memo.put(got)
                basis = c.basis_s if c.basis_s is not None else c.predicted_s
                if got.ms is None or got.note:
                    say(f"{rec.network} {c.label}: {got.note or 'failed'}; left out")
                    continue
                group = (c.ort_mode or model_mode(c.compression)) \
                    if c.backend == "onnxruntime" else \
                    MIXED if c.mixed else c.compression.value
                rows.append(NetworkRow(rec.network, c.label, c.backend, group, basis * 1e3,
                                       got.ms, rec.family, basis * 1e3 * (c.fixed_share or 0.0)))
                say(f"{rec.network} {c.label} ({c.backend}): {got.ms:.3f} ms measured, "
                    f"{basis * 1e3:.3f} ms predicted before calibration")
    return rows


class LiveKernels:
    """Kernels timed on this machine (active learning's :class:`~dlas_predict.crossdev.
    active.Live`), one worker for the whole calibration; a timing on a busy machine is
    noisy. Each record also goes to ``store`` (DLAS_HOME's corpus by default), where the
    analysis and the report of ``local`` find this machine's measurements."""

    def __init__(self, dev, protocol=None, store: Path | None = None) -> None:
        from dlas_predict.measure.execution.tasks import Protocol

        self.dev = dev
        self.protocol = protocol or Protocol(time_budget_s=1.0)
        self.store_path = store
        self._live = None
        self._store = None

    def __call__(self, k) -> tuple[float | None, str]:
        from dlas_predict.corpus.store import CorpusStore
        from dlas_predict.recommend.active import Live
        from dlas_predict.measure.execution.runner import LocalRunner
        from dlas_predict.measure.records import noisy_note
        from dlas_predict.paths import default_store_path

        if self._live is None:
            self._store = CorpusStore(self.store_path or default_store_path())
            self._live = Live(LocalRunner(self.dev, self.protocol, timeout_s=120), self.dev,
                              self._store)
        r = self._live.result(k)
        if r is None:
            return None, "failed: " + self._live.failed[k.key][:200]
        noisy = noisy_note(r.contention, r.slowdown, self.protocol)
        return float(r.median_s * 1e3), f"{noisy}; not fitted" if noisy else ""

    def close(self) -> None:
        if self._live is not None:
            self._live.runner.close()
        if self._store is not None:
            self._store.close()


class LiveNetworks:
    """Whole networks built and timed on this machine (``recommend --validate``'s runner),
    one worker for the whole calibration."""

    def __init__(self, dev) -> None:
        self.dev = dev
        self._runner = None

    def __call__(self, model: str, network: str, cands) -> list[tuple[float | None, str]]:
        from contextlib import nullcontext

        from dlas_predict.measure.networks.runner import NetworkRunner
        from dlas_predict.recommend.validate import measure_candidates

        if self._runner is None:
            self._runner = NetworkRunner(self.dev)
        measure_candidates(model, network, self.dev, cands,
                           network_runner=lambda: nullcontext(self._runner))
        out = []
        for c in cands:
            if c.measured_s is None:
                out.append((None, c.measured_note or "failed"))
            elif c.measured_note and c.measured_note.startswith("output check"):
                out.append((None, "failed: " + c.measured_note))
            elif c.measured_note and c.measured_note.startswith("noisy"):
                out.append((c.measured_s * 1e3, c.measured_note + "; not fitted"))
            else:
                out.append((c.measured_s * 1e3, ""))
        return out

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
