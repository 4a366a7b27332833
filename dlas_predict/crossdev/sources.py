"""Latency matrices across devices: one row per target (a kernel or a network run one way),
one column per device, log milliseconds, NaN where the device did not measure the target.

Three sources:

- ``help``: HELP's NAS-Bench-201 latencies on 21 devices (whole networks), read from the
  shared data folder at run time and never shipped;
- ``tophub``: TopHub's tuned conv kernels of eight devices, read the same way;
- ``profiles``: this project's corpora of the local CPU and its profiles
  (``datasets/corpus``), kernels or whole networks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.errors import DlasError
from dlas_predict.paths import CORPUS_SNAPSHOTS
from dlas_predict.space.choices import Level

SOURCES = ("help", "tophub", "profiles")
LEVELS = Level.words()


@dataclass
class LatencyMatrix:
    """Targets × devices of log milliseconds (NaN: not measured)."""

    source: str
    level: str
    targets: list[str]
    devices: list[str]
    log_ms: np.ndarray
    #: Multiply-accumulates of each target (the MACs baseline).
    macs: np.ndarray
    #: Per-target features for targets no device measured (kernel level; may be empty).
    features: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    #: Per-target category (e.g. ``int8/spatial_pack``): each device learns an offset per
    #: category, so a device where one compression or algorithm is slow says so.
    groups: list[str] = field(default_factory=list)

    def column(self, device: str) -> np.ndarray:
        if device not in self.devices:
            raise DlasError(f"no data of device {device!r} in {self.source}; devices: "
                            + ", ".join(self.devices))
        return self.log_ms[:, self.devices.index(device)]

    def without(self, device: str) -> "LatencyMatrix":
        keep = [i for i, d in enumerate(self.devices) if d != device]
        return LatencyMatrix(self.source, self.level, self.targets,
                             [self.devices[i] for i in keep], self.log_ms[:, keep], self.macs,
                             self.features, self.groups)

    def measured(self, device: str) -> np.ndarray:
        """Row indices the device measured."""
        return np.flatnonzero(np.isfinite(self.column(device)))


def shared_folder(folder: str, data: Path | None) -> Path:
    """The public data folder ``folder``: under ``data``, else ``DLAS_SHARED_DATA`` (or
    beside the checkout), else fetched into DLAS_HOME (:func:`~dlas_predict.publicdata.
    data_folder`)."""
    from dlas_predict.publicdata import data_folder

    return data_folder(folder, data)


@functools.lru_cache(maxsize=4)
def _help_frame(path: str):
    import pandas as pd

    try:
        return pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise DlasError(f"cannot read HELP's latency table {path}: {exc}") from None


def help_table(data: Path | None):
    path = shared_folder("help_nb201", data) / "latency.csv.gz"
    if not path.is_file():
        raise DlasError(f"HELP's latency table not found: {path}")
    return _help_frame(str(path))


def help_arch_strings(data: Path | None = None) -> dict[int, str]:
    """NAS-Bench-201 index → architecture string (HELP's table names both)."""
    df = help_table(data)
    first = df.drop_duplicates("arch_index")
    return dict(zip(first.arch_index.astype(int), first.arch_str))


def help_matrix(data: Path | None = None) -> LatencyMatrix:
    """HELP's 15,625 NAS-Bench-201 architectures × 21 devices. Targets are architecture
    strings, in benchmark index order."""
    from dlas_predict.networks.nasbench201 import arch_macs, parse_arch

    df = help_table(data)
    wide = df.pivot(index="arch_index", columns="device", values="latency").sort_index()
    names = df.drop_duplicates("arch_index").set_index("arch_index").arch_str
    archs = [str(names[i]) for i in wide.index]
    lat = wide.to_numpy(dtype=float)
    # the phones' tables hold whole milliseconds (0 for the near-empty cells): floor at 0.1 ms
    log_ms = np.log(np.clip(lat, 0.1, None))
    macs = np.array([arch_macs(parse_arch(a)) for a in archs], dtype=float)
    return LatencyMatrix("help", "network", archs, list(wide.columns), log_ms, macs)


def _kernel_target(conv: str, algorithm: str, compression: str, ratio: float,
                   tuning: str) -> str:
    tag = f"{compression}@{ratio:g}" if ratio else compression
    return f"{conv}|{algorithm}|{tag}|{tuning}"


def kernel_features(convs: list, algorithms: list[str], compressions: list[str],
                     ratios: list[float]) -> np.ndarray:
    """Device-free kernel features: log sizes, shape, algorithm and compression one-hots."""
    from dlas_predict.space.config import LAYER_ALGORITHMS, Compression
    ALGORITHMS = [a.value for a in LAYER_ALGORITHMS]
    COMPRESSIONS = [c.value for c in Compression]

    rows = []
    for spec, alg, comp, ratio in zip(convs, algorithms, compressions, ratios):
        macs = spec.macs * (1 - ratio if comp in ("weight_pruning",) else 1)
        io = spec.C * spec.H * spec.W + spec.K * spec.OH * spec.OW
        wts = spec.K * spec.C // spec.groups * spec.R * spec.S
        rows.append([np.log(max(macs, 1)), np.log(io), np.log(wts), np.log(spec.C),
                     np.log(spec.K), np.log(spec.OH * spec.OW), spec.R, spec.stride_h,
                     float(spec.groups > 1), ratio]
                    + [float(alg == a) for a in ALGORITHMS]
                    + [float(comp == c) for c in COMPRESSIONS])
    return np.asarray(rows, dtype=float)


def tophub_matrix(data: Path | None = None) -> LatencyMatrix:
    """TopHub's tuned conv workloads × its devices (best time of each workload)."""
    from dlas_predict.corpus.tophub import devices_by_model, parse_line

    folder = shared_folder("tophub", data)
    devices = devices_by_model()
    best: dict[str, dict[str, float]] = {}
    info: dict[str, tuple] = {}
    for path in sorted(folder.glob("*.jsonl")):
        with open(path) as fh:
            for line in fh:
                got = parse_line(line, path.name, devices) if line.strip() else "blank"
                if isinstance(got, str):
                    continue
                v = got.variant
                # the target is the workload in its data type; the template is the device's
                t = _kernel_target(got.conv.to_spec(), "tuned", v.compression, 0.0, "tuned")
                ms = min(got.run_secs) * 1e3
                cell = best.setdefault(t, {})
                cell[got.device] = min(ms, cell.get(got.device, np.inf))
                info[t] = (got.conv, v.algorithm, v.compression)
    if not best:
        raise DlasError(f"no usable TopHub record in {folder}")
    targets = sorted(best)
    devs = sorted({d for cell in best.values() for d in cell})
    M = np.full((len(targets), len(devs)), np.nan)
    for i, t in enumerate(targets):
        for d, ms in best[t].items():
            M[i, devs.index(d)] = np.log(ms)
    convs = [info[t][0] for t in targets]
    feats = kernel_features(convs, ["direct"] * len(targets),
                             [info[t][2] for t in targets], [0.0] * len(targets))
    return LatencyMatrix("tophub", "kernel", targets, devs, M,
                         np.array([c.macs for c in convs], dtype=float), feats,
                         [info[t][2] for t in targets])


def profile_devices() -> list[str]:
    """Devices with a shipped corpus of this project (the local CPU and its profiles)."""
    return sorted(p.name.removesuffix(".parquet") for p in CORPUS_SNAPSHOTS.glob("*.parquet")
                  if p.name.count(".") == 1 and p.name.startswith("local"))


def gpu_corpus_devices() -> list[str]:
    """GPUs with a shipped kernel corpus (measured through bundles)."""
    return sorted(p.name.removesuffix(".parquet") for p in CORPUS_SNAPSHOTS.glob("*.parquet")
                  if p.name.count(".") == 1 and not p.name.startswith("local"))


def _read(path: Path, columns: list[str]):
    import pandas as pd

    return pd.read_parquet(path, columns=columns)


def profiles_matrix(level: str = "kernel", devices: list[str] | None = None) -> LatencyMatrix:
    """The shipped corpora of the local CPU and its profiles: untuned kernels (conv ×
    algorithm × compression), or whole networks (network × configuration × algorithm)."""
    from dlas_predict.space.config import ConvSpec

    if level not in LEVELS:
        raise DlasError(f"unknown level {level!r}; allowed: " + ", ".join(LEVELS))
    devices = devices or profile_devices()
    cols: dict[str, dict[str, float]] = {}
    meta: dict[str, tuple] = {}
    for dev in devices:
        if level == "kernel":
            df = _read(CORPUS_SNAPSHOTS / f"{dev}.parquet",
                       ["conv", "algorithm", "compression", "ratio", "tuning", "median_s",
                        "verified", "error", "macs"])
            df = df[df.error.isna() & (df.verified != 0) & (df.tuning == "untuned")]
            keys = [_kernel_target(c, a, p, float(r), t) for c, a, p, r, t in
                    zip(df.conv, df.algorithm, df.compression, df.ratio, df.tuning)]
            for k, c, a, p, r, m in zip(keys, df.conv, df.algorithm, df.compression,
                                        df.ratio, df.macs):
                meta.setdefault(k, (c, a, p, float(r), float(m)))
        else:
            df = _read(CORPUS_SNAPSHOTS / f"{dev}.wholenet.parquet",
                       ["network", "config", "algorithm", "median_s", "error"])
            # our builds: onnxruntime's runs are another backend, not a configuration of them
            df = df[df.error.isna() & df.median_s.notna() & (df.algorithm != "onnxruntime")]
            keys = [f"{n}|{c}|{a}" for n, c, a in zip(df.network, df.config, df.algorithm)]
            macs = _network_macs(dev)
            for k, n, c in zip(keys, df.network, df.config):
                meta.setdefault(k, (macs.get((n, c), np.nan),))
        col: dict[str, float] = {}
        for k, s in zip(keys, df.median_s):
            col[k] = min(col.get(k, np.inf), float(s) * 1e3)
        cols[dev] = col
    devices = [d for d in devices if cols[d]]
    targets = sorted(set().union(*cols.values()))
    M = np.full((len(targets), len(devices)), np.nan)
    index = {t: i for i, t in enumerate(targets)}
    for j, dev in enumerate(devices):
        for k, ms in cols[dev].items():
            M[index[k], j] = np.log(ms)
    if level == "kernel":
        convs = [ConvSpec.parse(meta[t][0]) for t in targets]
        feats = kernel_features(convs, [meta[t][1] for t in targets],
                                 [meta[t][2] for t in targets], [meta[t][3] for t in targets])
        macs = np.array([meta[t][4] for t in targets])
    else:
        feats = np.zeros((len(targets), 0))
        macs = np.array([meta[t][0] for t in targets], dtype=float)
    groups = [f"{t.split('|')[2].split('@')[0]}/{t.split('|')[1 if level == 'kernel' else 2]}"
              for t in targets]
    return LatencyMatrix("profiles", level, targets, list(devices), M, macs, feats, groups)


def _network_macs(device: str) -> dict[tuple[str, str], float]:
    """(network, configuration) → MACs of its conv layers (a pruned layer's share of
    nonzero weights), from the snapshot's network table."""
    from dlas_predict.space.config import ConvSpec

    path = CORPUS_SNAPSHOTS / f"{device}.networks.parquet"
    if not path.is_file():
        return {}
    df = _read(path, ["network", "config", "conv", "compression", "ratio"])
    specs: dict[str, int] = {}
    out: dict[tuple[str, str], float] = {}
    for n, c, conv, comp, r in zip(df.network, df.config, df.conv, df.compression, df.ratio):
        if conv not in specs:
            specs[conv] = ConvSpec.parse(conv).macs
        keep = 1 - float(r) if comp.endswith("_pruning") else 1.0
        out[(n, c)] = out.get((n, c), 0.0) + specs[conv] * keep
    return out


def load(source: str, level: str | None = None, data: Path | None = None) -> LatencyMatrix:
    """One source's matrix; ``level`` applies to ``profiles`` only."""
    if source == "help":
        return help_matrix(data)
    if source == "tophub":
        return tophub_matrix(data)
    if source == "profiles":
        return profiles_matrix(level or "kernel")
    raise DlasError(f"unknown data source {source!r}; allowed: " + ", ".join(SOURCES))
