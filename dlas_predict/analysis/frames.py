"""ParaDnn's analysis toolbox over a corpus: heat map, regression, roofline, box plot.

Every analysis reads a :class:`pandas.DataFrame` built by :func:`kernel_frame` (one row per
successful kernel measurement and network it belongs to) or :func:`network_frame` (one row
per whole-network configuration). Columns are either *parameters* (what was varied) or
*metrics* (what was measured or derived from a measurement); both are listed with units in
:data:`KERNEL_PARAMETERS`, :data:`NETWORK_PARAMETERS` and :data:`METRICS`, and an unknown
name is one error that lists the available ones.

pandas is imported here only; the plots are :mod:`~dlas_predict.analysis.plots`'.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dlas_predict.space.config import COMPRESSION_KERNEL, Compression
from dlas_predict.space.devices import Device, fingerprint_here, rows_device
from dlas_predict.corpus.store import store_device
from dlas_predict.errors import ConfigError, DlasError, param
from dlas_predict.networks.generate import UNNAMED_DEFAULTS, name_value
from dlas_predict.compression.netplan import ratio_key
from dlas_predict.paths import CORPUS_SNAPSHOTS as SHIPPED
from dlas_predict.space.choices import Level

# ---- what can be asked for -----------------------------------------------------------------
#: Kernel-level parameters: name → description.
KERNEL_PARAMETERS: dict[str, str] = {
    "device": "device name",
    "network": "network the layer belongs to ('-' for standalone measurements)",
    "family": "zoo | generated | - (where the network comes from)",
    "C": "input channels", "K": "output channels", "H": "input height", "W": "input width",
    "R": "kernel height", "S": "kernel width", "stride": "stride (height)",
    "groups": "conv groups", "depthwise": "depthwise conv (0/1)",
    "OH": "output height", "OW": "output width",
    "macs": "dense multiply-accumulates", "params": "weights of the layer",
    "algorithm": "direct | gemm | spatial_pack",
    "compression": "dense | weight_pruning | channel_pruning | float16 | int8",
    "ratio": "pruning ratio of the configuration (0 unpruned)",
    "sparsity": "the layer's own share of zero weights",
    "dtype": "float32 | float16 | int8", "sparse": "CSR kernel (0/1)",
    "tuning": "untuned | tuned", "source": "measured (our TVM backend) | tophub (imported)",
    "memory_level": "L1 | L2 | L3 | DRAM: the level whose measured bandwidth bounds the "
                    "kernel (the smallest that holds its compulsory bytes)",
    # generated (ParaDnn-style) networks: parsed from the network name
    "net_layers": "generated: blocks", "net_kernels": "generated: filters (width)",
    "net_kernel_size": "generated: kernel size", "net_input": "generated: input size",
    "net_batch": "generated: batch",
    "net_block": "generated: plain | residual | separable | inverted",
    "net_downsample": "generated: downsampling blocks",
    "net_activation": "generated: relu | silu", "net_se": "generated: squeeze-excitation (0/1)",
}

#: Network-level parameters (``--level network``).
NETWORK_PARAMETERS: dict[str, str] = {
    "device": "device name", "network": "network", "family": "zoo | generated",
    "config": "configuration label, e.g. weight_pruning@0.9",
    "algorithm": "direct | gemm | spatial_pack | per_layer",
    "compression": KERNEL_PARAMETERS["compression"], "ratio": KERNEL_PARAMETERS["ratio"],
    "dtype": KERNEL_PARAMETERS["dtype"], "tuning": KERNEL_PARAMETERS["tuning"],
    "conv_layers": "conv layers in the network", "net_macs": "dense conv MACs of the network",
    "engine": "engine version of the whole-network build timed (empty: a conv kernel sum)",
    **{k: v for k, v in KERNEL_PARAMETERS.items() if k.startswith("net_")},
}

#: Metrics: name → (description, unit).
METRICS: dict[str, tuple[str, str]] = {
    "latency_ms": ("median latency (measured)", "ms"),
    "log_latency": ("log10 of the median latency in ms", "log10 ms"),
    "gflops": ("achieved dense-equivalent GFLOP/s: 2 x dense MACs / latency", "GFLOP/s"),
    "useful_gflops": ("achieved GFLOP/s on the work actually done (nonzero weights; "
                      "Winograd's GEMMs)", "GFLOP/s"),
    "intensity": ("arithmetic intensity: useful FLOPs / compulsory bytes", "FLOP/byte"),
    "spread": ("run-to-run spread: inter-quartile range / median", "fraction"),
    "speedup": ("speedup over the dense float32 configuration with the same algorithm "
                "(same layer, or same network)", "x"),
    "roofline_fraction": ("achieved useful GFLOP/s / the device's attainable roof at this "
                          "intensity and memory level", "fraction"),
}
#: Metrics that exist at the network level.
NETWORK_METRICS = ("latency_ms", "log_latency", "gflops", "spread", "speedup")

LEVELS = Level.words()


def _unknown(kind: str, name: str, allowed: Iterable[str]) -> ConfigError:
    return ConfigError(f"unknown {kind} {name!r}; available: {', '.join(allowed)}")


def check_parameter(name: str, level: str = "kernel") -> str:
    check_level(level)
    params = KERNEL_PARAMETERS if level == "kernel" else NETWORK_PARAMETERS
    if name not in params:
        raise _unknown(f"{level}-level parameter", name, params)
    return name


def check_metric(name: str, level: str = "kernel") -> str:
    check_level(level)
    allowed = list(METRICS) if level == "kernel" else list(NETWORK_METRICS)
    if name not in allowed:
        raise _unknown(f"{level}-level metric", name, allowed)
    return name


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise _unknown("level", level, LEVELS)
    return level


@dataclass(frozen=True)
class Filters:
    """Row filters shared by every analysis; ``None`` keeps everything."""

    network: str | None = None
    tuning: str | None = None
    dtype: str | None = None
    algorithm: str | None = None
    compression: str | None = None

    def apply(self, frame):
        for col in ("network", "tuning", "dtype", "algorithm", "compression"):
            want = getattr(self, col)
            if want is None or col not in frame:
                continue
            values = {v.strip() for v in want.split(",") if v.strip()}
            have = sorted(set(frame[col].astype(str)))
            unknown = values - set(have)
            if unknown:
                raise ConfigError(f"{param(col)} {','.join(sorted(unknown))} is not in this "
                                  f"corpus; available: {', '.join(have) or '(none)'}")
            frame = frame[frame[col].astype(str).isin(values)]
        return frame


# ---- generated network names ------------------------------------------------------------------
_NET_KEYS = ("layers", "kernels", "kernel_size", "input", "batch", "block", "downsample",
             "activation", "se")
#: Generated-network columns that hold words, not whole numbers.
_NET_WORDS = ("net_block", "net_activation")


def generated_params(network: str) -> dict[str, Any]:
    """``cnn_layers=2_kernels=32_..._block=residual_downsample=0`` → {"net_layers": 2, ...};
    empty for a name that is not a generated network's."""
    if not re.match(r"^(cnn|fc)_", network):
        return {}
    out: dict[str, Any] = {}
    for key in _NET_KEYS:
        value = name_value(network, key)
        if value is not None:
            out[f"net_{key}"] = int(value) if value.isdigit() else value
    if network.startswith("cnn_"):  # parameters a name leaves out at their defaults
        for key, value in UNNAMED_DEFAULTS.items():
            out.setdefault(f"net_{key}", value)
    return out


def short_name(network: str) -> str:
    """A generated network's name in a table cell: ``cnn L2 K128 k3 in20 residual ds0``."""
    p = generated_params(network)
    if not p:
        return network
    fam = network.split("_", 1)[0]
    keys = (("net_layers", "L"), ("net_kernels", "K"), ("net_kernel_size", "k"),
            ("net_input", "in"), ("net_block", ""), ("net_downsample", "ds"))
    extra = [p["net_activation"]] if p.get("net_activation", "relu") != "relu" else []
    extra += ["se"] if p.get("net_se") else []
    return " ".join([fam] + [f"{t}{p[k]}" for k, t in keys if k in p] + extra)


def _family(network: str) -> str:
    if network == "-":
        return "-"
    return "generated" if generated_params(network) else "zoo"


# ---- frames ---------------------------------------------------------------------------------
def _bytes(row: dict, density: float, nbytes: int) -> float:
    """Compulsory traffic: input and output once, weights once (CSR: values + column indices
    + row pointers; Winograd: its transformed filters, float32)."""
    n_in = row["C"] * row["H"] * row["W"]
    n_out = row["K"] * row["OH"] * row["OW"]
    params = row["K"] * (row["C"] // row["groups"]) * row["R"] * row["S"]
    weights = params * nbytes
    if row["sparse"]:
        weights = params * density * (nbytes + 4) + (row["K"] + 1) * 4
    elif row["algorithm"] == "winograd":
        from dlas_predict.measure.kernels.knobs import winograd_weight_bytes

        weights = winograd_weight_bytes(*_winograd(row))
    return (n_in + n_out) * nbytes + weights


def _winograd(row: dict) -> tuple:
    """A Winograd record's workload and the knobs it ran with."""
    from dlas_predict.space.config import ConvSpec

    return ConvSpec.parse(row["conv"]), json.loads(row["knobs"])


def _work_macs(row: dict, density: float) -> float:
    """The multiply-adds a kernel does: the conv's (its nonzeros for CSR); Winograd's GEMMs
    ((m+2)² per tile, channel and filter), which replace the conv's."""
    if row["algorithm"] == "winograd":
        from dlas_predict.measure.kernels.knobs import winograd_extents

        a, _, tiles, _ = winograd_extents(*_winograd(row))
        return a * a * row["K"] * row["C"] * tiles
    return row["macs"] * density


def memory_level(device: Device, nbytes: float | None) -> tuple[str, float | None]:
    """The memory level whose measured bandwidth bounds a kernel moving ``nbytes``
    compulsory bytes, timed warm as every kernel is: the smallest cache level that holds
    them (L1d and L2 per core, times the cores; L3 shared) where its bandwidth was measured,
    else main memory."""
    from dlas_predict.space.devices import cache_capacities

    if nbytes is not None and device.cache_bandwidth_gbs:
        for level, capacity in cache_capacities(device.caches, device.cores).items():
            bw = device.cache_bandwidth_gbs.get(level)
            if bw and nbytes <= capacity:
                return level, bw
    return "DRAM", device.mem_bandwidth_gbs


def compute_roof(device: Device, dtype: str) -> float | None:
    """The arithmetic roof of ``dtype``: int8 takes AVX-512 VNNI's dot product where it was
    measured (the int8 GEMM kernels use it)."""
    peak = device.peak_gflops.get(dtype) or device.peak_gflops.get("float32")
    if dtype == "int8" and device.int8_dot_gflops:
        return max(peak or 0.0, device.int8_dot_gflops)
    return peak


def attainable_gflops(device: Device, dtype: str, intensity: float,
                      nbytes: float | None = None) -> float | None:
    """The roof at ``intensity``: min(compute roof of the dtype, intensity x the bandwidth
    of the memory level that holds the kernel's ``nbytes``)."""
    peak = compute_roof(device, dtype)
    if not peak:
        return None
    _, bw = memory_level(device, nbytes)
    return min(peak, intensity * bw) if bw else peak


def _read(store: Path, device: Device | None) -> tuple[list[dict], list[dict], list[dict]]:
    """The successful, verified (or unchecked) kernel rows, the network configurations and
    the successful whole-network rows of ``device`` (every device when None)."""
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store, must_exist=True) as db:
        where, params = "error IS NULL AND median_s IS NOT NULL", ()
        if device is not None:
            where += " AND device = ?"
            params = (device.name,)
        rows = [r for r in db.current_rows(where, params) if r["verified"] in (1, True, None)]
        return rows, db.network_configs(), db.network_measurements(where, params)


def unique_kernels(frame):
    """One row per kernel measurement: a kernel frame without its per-network copies."""
    return frame.drop_duplicates(subset=[c for c in frame.columns
                                         if c not in ("network", "family")
                                         and not c.startswith("net_")])


def kernel_frame(store: Path, device: Device | None = None, filters: Filters = Filters()):
    """One row per successful kernel measurement × network it belongs to (a workload shared
    by two networks appears once for each; one measured standalone has network '-')."""
    import pandas as pd

    rows, configs, _ = _read(store, device)
    if not rows:
        what = f" for device {device.name!r}" if device else ""
        raise DlasError(f"{store} holds no successful kernel measurement{what}")
    members: dict[tuple, set[str]] = {}
    for c in configs:
        members.setdefault((c["conv"], c["compression"], ratio_key(c["ratio"])),
                           set()).add(c["network"])
    dense: dict[tuple, float] = {}
    for r in rows:
        if r["compression"] == "dense":
            dense[(r["device"], r["conv"], r["algorithm"], r["tuning"])] = r["median_s"]
    devices: dict[str, Device] = {}
    out = []
    for r in rows:
        comp = Compression.parse(r["compression"])
        sparse, dtype, _ = COMPRESSION_KERNEL[comp]
        density = 1.0 - float(r["sparsity"] or 0.0) if sparse else 1.0
        nbytes = {"float32": 4, "float16": 2, "int8": 1}[dtype.value]
        sec = float(r["median_s"])
        useful = 2.0 * _work_macs(r, density)
        moved = _bytes(r, density, nbytes)
        intensity = useful / moved
        dkey = (r["device"], r["fingerprint"])
        if dkey not in devices:
            devices[dkey] = rows_device(*dkey)
        roof = attainable_gflops(devices[dkey], dtype.value, intensity, moved)
        base = dense.get((r["device"], r["conv"], r["algorithm"], r["tuning"]))
        source = "tophub" if str(r["kernels_version"] or "").startswith("tophub") else "measured"
        common = {
            "device": r["device"], "C": r["C"], "K": r["K"], "H": r["H"], "W": r["W"],
            "R": r["R"], "S": r["S"], "stride": r["stride_h"], "groups": r["groups"],
            "depthwise": int(r["groups"] > 1 and r["groups"] == r["C"]),
            "OH": r["OH"], "OW": r["OW"], "macs": r["macs"],
            "params": r["K"] * (r["C"] // r["groups"]) * r["R"] * r["S"],
            "algorithm": r["algorithm"], "compression": r["compression"],
            "ratio": float(r["ratio"] or 0.0), "sparsity": float(r["sparsity"] or 0.0),
            "dtype": dtype.value, "sparse": int(sparse), "tuning": r["tuning"],
            "source": source,
            "latency_ms": sec * 1e3, "log_latency": math.log10(sec * 1e3),
            "gflops": 2.0 * r["macs"] / sec / 1e9, "useful_gflops": useful / sec / 1e9,
            "intensity": intensity, "compulsory_bytes": moved,
            "memory_level": memory_level(devices[dkey], moved)[0], "spread": r["spread"],
            "speedup": base / sec if base else float("nan"),
            "roofline_fraction": (useful / sec / 1e9) / roof if roof else float("nan"),
            "tuning_seconds": r["tuning_seconds"],
        }
        nets = members.get((r["conv"], r["compression"], ratio_key(r["ratio"])),
                           {"-"})
        for net in sorted(nets):
            out.append({"network": net, "family": _family(net), **common,
                        **generated_params(net)})
    return filters.apply(_net_columns(pd.DataFrame(out)))


def _net_columns(frame):
    """Generated-network columns present in every frame; whole numbers stay integers."""
    for col in (k for k in KERNEL_PARAMETERS if k.startswith("net_")):
        if col not in frame:
            frame[col] = None
        elif col not in _NET_WORDS:
            frame[col] = frame[col].astype("Int64")
    return frame


@dataclass(frozen=True)
class Corpus:
    """The corpus an analysis of one device reads, and whose machine measured it."""

    path: Path
    #: "given" (--store), "measured here" (DLAS_HOME's corpus: ``collect``, ``calibrate``)
    #: or "shipped"
    origin: str
    #: the device whose roofs describe the rows (the machine that measured them)
    device: Device
    #: ``local`` and its profiles: the fingerprint the device has on this machine; None for
    #: devices that are never this machine
    here: str | None

    @property
    def this_machine(self) -> bool | None:
        """Whether the rows are this machine's (None: a device that never is)."""
        return None if self.here is None else self.device.fingerprint == self.here

    @property
    def whose(self) -> str:
        """Whose measurements, in a few words (plot titles)."""
        if self.this_machine is None:
            return f"{self.origin} corpus"
        if self.this_machine:
            return f"this machine's measurements ({self.origin})"
        return f"{self.origin} corpus of another machine, not this one"

    def describe(self) -> str:
        """One line for the console and the report's header."""
        dev = self.device
        line = f"corpus: {self.path} ({self.origin}); rows measured on {dev.description}"
        if self.this_machine is False:
            line += (f". This machine (fingerprint {self.here}) has no "
                     f"measurement of {dev.name} of its own: `dlas-predict calibrate` or "
                     "`collect` makes them, and the analysis then reads them")
        return line


def open_corpus(device: str, store: Path | None) -> Corpus:
    """The corpus of ``device``: ``store`` when given; for ``local`` and its profiles,
    this machine's own measurements where ``collect`` or ``calibrate`` made them
    (DLAS_HOME's corpus), else the shipped snapshot of this machine where there is one,
    else the shipped reference snapshot (another machine's, and said so); for any other
    device, its shipped snapshot."""
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.paths import default_store_path

    here = fingerprint_here(device)
    if store is not None:
        path, origin = resolve_store(device, store), "given"
    else:
        path, origin = None, "shipped"
        mine = default_store_path()
        if here is not None and mine.is_file():
            with CorpusStore(mine, must_exist=True) as db:
                if here in {fp for fp, _ in db.fingerprints(device)}:
                    path, origin = mine, "measured here"
        if path is None:
            path = _snapshot_store(_machine_snapshot(device, here) or resolve_store_snapshot(
                device))
    return Corpus(path, origin, store_device(path, device, here), here)


def _machine_snapshot(device: str, fingerprint: str | None) -> Path | None:
    """The shipped snapshot of ``device`` measured on the machine ``fingerprint``."""
    from dlas_predict.paths import MACHINES

    if fingerprint is None:
        return None
    snap = SHIPPED / MACHINES / fingerprint / f"{device}.parquet"
    return snap if snap.is_file() else None


def network_frame(store: Path, device: Device | None = None, filters: Filters = Filters()):
    """One row per whole-network configuration of ``device``: its measured whole-network
    latency where one was built and timed (``latency_source`` "whole network"), else the
    sum of its measured conv kernels ("conv kernel sum")."""
    import pandas as pd

    rows = network_latencies(store, device)
    if not rows:
        raise DlasError(f"{store} holds no network configuration whose kernels are all "
                        "measured; collect a network with `dlas-predict collect --network "
                        "zoo:NAME`")
    frame = _net_columns(pd.DataFrame([r.as_row() for r in rows]))
    base = {(r.device, r.network, r.algorithm, r.tuning): r.latency_ms
            for r in rows if r.config == "dense"}
    frame["speedup"] = [base.get((d, n, a, t), float("nan")) / lat for d, n, a, t, lat in zip(
        frame.device, frame.network, frame.algorithm, frame.tuning, frame.latency_ms)]
    return filters.apply(frame)


@dataclass(frozen=True)
class NetworkLatency:
    """One network under one configuration and algorithm, and where its latency comes from."""

    device: str
    network: str
    config: str
    compression: str
    ratio: float
    algorithm: str
    tuning: str
    latency_ms: float
    source: str  # "whole network" | "conv kernel sum"
    conv_sum_ms: float | None
    conv_layers: int
    net_macs: int
    effective_macs: float
    spread: float | None = None
    #: the engine version of the whole-network record (``kernels_version``); "" for a sum
    engine: str = ""

    def as_row(self) -> dict[str, Any]:
        dtype = COMPRESSION_KERNEL[Compression.parse(self.compression)][1].value
        sec = self.latency_ms / 1e3
        return {
            "device": self.device, "network": self.network, "family": _family(self.network),
            "config": self.config, "algorithm": self.algorithm,
            "compression": self.compression, "ratio": self.ratio, "dtype": dtype,
            "tuning": self.tuning, "conv_layers": self.conv_layers, "net_macs": self.net_macs,
            "latency_ms": self.latency_ms, "log_latency": math.log10(self.latency_ms),
            "gflops": 2.0 * self.net_macs / sec / 1e9, "spread": self.spread,
            "latency_source": self.source, "conv_sum_ms": self.conv_sum_ms,
            "effective_macs": self.effective_macs, "engine": self.engine,
            **generated_params(self.network),
        }


def network_latencies(store: Path, device: Device | None = None) -> list[NetworkLatency]:
    """Every (network, configuration, algorithm, tuning) whose conv kernels are all measured,
    with its whole-network latency where measured (per-layer plans included)."""
    from dlas_predict.space.config import ConvSpec

    rows, configs, whole = _read(store, device)
    kernels: dict[tuple, tuple[float, float]] = {}
    for r in rows:
        k = (r["device"], r["conv"], r["algorithm"], r["compression"],
             ratio_key(r["ratio"]), r["tuning"])
        kernels[k] = (float(r["median_s"]), float(r["sparsity"] or 0.0))
    layers: dict[tuple, list[dict]] = {}
    for c in configs:
        layers.setdefault((c["network"], c["config"]), []).append(c)
    measured: dict[tuple, dict] = {}
    for m in whole:
        if m["verified"] == 0 and m["dtype"] == "float32":
            continue
        measured[(m["device"], m["network"], m["config"], m["algorithm"])] = m
    devices = sorted({r["device"] for r in rows})
    tunings = sorted({r["tuning"] for r in rows})
    out: list[NetworkLatency] = []
    for (network, config), ls in sorted(layers.items()):
        comp = ls[0]["compression"]
        ratio = float(config.split("@")[1]) if "@" in config else 0.0
        specs = [ConvSpec.parse(l["conv"]) for l in ls]
        net_macs = sum(s.macs for s in specs)
        for dev in devices:
            for tuning in tunings:
                for alg in ("direct", "gemm", "spatial_pack"):
                    got = [kernels.get((dev, l["conv"], alg, comp, ratio_key(l["ratio"]),
                                        tuning)) for l in ls]
                    if any(g is None for g in got):
                        continue
                    conv_sum = sum(g[0] for g in got) * 1e3
                    sparse = COMPRESSION_KERNEL[Compression.parse(comp)][0]
                    eff = sum(s.macs * ((1 - g[1]) if sparse else 1.0)
                              for s, g in zip(specs, got))
                    m = measured.get((dev, network, config, alg)) if tuning == "untuned" \
                        else None
                    lat, source, spread, engine = conv_sum, "conv kernel sum", None, ""
                    if m is not None:
                        lat, source, spread = m["median_s"] * 1e3, "whole network", m["spread"]
                        engine = m["kernels_version"] or ""
                    out.append(NetworkLatency(dev, network, config, comp, ratio, alg, tuning,
                                              lat, source, conv_sum, len(ls), net_macs, eff,
                                              spread, engine))
                m = measured.get((dev, network, config, "per_layer"))
                if m is not None and tuning == "untuned":
                    plan = json.loads(m["plan"])
                    eff = sum(s.macs * (1.0 - (float(l["ratio"]) if sp else 0.0))
                              for s, l, (_, sp) in zip(specs, ls, plan))
                    out.append(NetworkLatency(dev, network, config, comp, ratio, "per_layer",
                                              tuning, m["median_s"] * 1e3, "whole network",
                                              None, len(ls), net_macs, eff, m["spread"],
                                              m["kernels_version"] or ""))
    return out


# ---- the four analyses ------------------------------------------------------------------------
@dataclass(frozen=True)
class HeatmapResult:
    x: str
    y: str
    metric: str
    x_values: list
    y_values: list
    values: list[list[float | None]]  # [y][x], median of the metric
    counts: list[list[int]]
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"x": self.x, "y": self.y, "metric": self.metric, "x_values": self.x_values,
                "y_values": self.y_values, "median": self.values, "counts": self.counts,
                "n": self.n}


def _axis(series, max_levels: int = 12):
    """Categories of an axis: its values, or quantile bins when numeric with many values."""
    import pandas as pd

    values = series.dropna().unique()
    numeric = pd.api.types.is_numeric_dtype(series)
    if numeric and len(values) > max_levels:
        binned = pd.qcut(series, q=max_levels // 2, duplicates="drop")
        return binned.astype(str), [str(c) for c in binned.cat.categories]
    order = sorted(values, key=lambda v: (isinstance(v, str), v))
    return series, order


def heatmap(frame, x: str, y: str, metric: str, level: str = "kernel") -> HeatmapResult:
    """Median of ``metric`` over every (x, y) cell."""
    for p in (x, y):
        check_parameter(p, level)
    check_metric(metric, level)
    data = frame[[x, y, metric]].dropna()
    if data.empty:
        raise DlasError(f"no rows have {x}, {y} and {metric} (after filters)")
    xs, x_order = _axis(data[x])
    ys, y_order = _axis(data[y])
    grouped = data.assign(_x=xs, _y=ys).groupby(["_y", "_x"], observed=True)[metric]
    med, cnt = grouped.median(), grouped.size()
    values = [[_num(med.get((yv, xv))) for xv in x_order] for yv in y_order]
    counts = [[int(cnt.get((yv, xv), 0)) for xv in x_order] for yv in y_order]
    return HeatmapResult(x, y, metric, [_plain(v) for v in x_order],
                         [_plain(v) for v in y_order], values, counts, len(data))


def _num(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _plain(v):
    return v.item() if hasattr(v, "item") else v


@dataclass(frozen=True)
class RegressionResult:
    metric: str
    terms: list[str]               # parameter, or parameter=value for a category
    coefficients: list[float]      # standardised (beta): change of the metric in its SDs
    importance: dict[str, float]   # per parameter: sum of |beta| of its terms
    r2: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "r2": self.r2, "n": self.n,
                "coefficients": dict(zip(self.terms, self.coefficients)),
                "importance": self.importance}


def regression(frame, metric: str, params: list[str], level: str = "kernel"
               ) -> RegressionResult:
    """Ordinary least squares of the standardised metric on standardised parameters
    (categorical ones one-hot, first level dropped). R² is in-sample."""
    import numpy as np
    import pandas as pd

    check_metric(metric, level)
    if not params:
        raise ConfigError("give at least one parameter to regress on")
    for p in params:
        check_parameter(p, level)
    data = frame[[*params, metric]].replace([np.inf, -np.inf], np.nan).dropna()
    if len(data) < len(params) + 2:
        raise DlasError(f"only {len(data)} rows have {metric} and {', '.join(params)}; "
                        "too few to fit a regression")
    cols, owner = [], []
    for p in params:
        s = data[p]
        if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
            cols.append(s.astype(float).rename(p))
            owner.append(p)
        else:
            dummies = pd.get_dummies(s.astype(str), prefix=p, prefix_sep="=", drop_first=True,
                                     dtype=float)
            for c in dummies:
                cols.append(dummies[c])
                owner.append(p)
    X = pd.concat(cols, axis=1) if cols else pd.DataFrame(index=data.index)
    keep = [i for i, c in enumerate(X.columns) if X[c].std() > 0]
    X = X.iloc[:, keep]
    owner = [owner[i] for i in keep]
    if X.shape[1] == 0:
        raise DlasError(f"{', '.join(params)} take a single value in these rows; nothing "
                        "to regress on")
    y = data[metric].astype(float)
    Xz = ((X - X.mean()) / X.std()).to_numpy()
    yz = ((y - y.mean()) / (y.std() or 1.0)).to_numpy()
    beta, *_ = np.linalg.lstsq(Xz, yz, rcond=None)
    resid = yz - Xz @ beta
    r2 = 1.0 - float(resid @ resid) / float(yz @ yz) if float(yz @ yz) > 0 else 0.0
    importance: dict[str, float] = {}
    for o, b in zip(owner, beta):
        importance[o] = importance.get(o, 0.0) + abs(float(b))
    return RegressionResult(metric, [str(c) for c in X.columns], [float(b) for b in beta],
                            dict(sorted(importance.items(), key=lambda kv: -kv[1])), r2,
                            len(data))


@dataclass(frozen=True)
class BoxplotResult:
    metric: str
    by: str
    groups: list
    stats: list[dict[str, float]]  # n, min, q1, median, q3, max per group

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "by": self.by,
                "groups": {str(g): s for g, s in zip(self.groups, self.stats)}}


def boxplot_stats(frame, metric: str, by: str, level: str = "kernel") -> tuple[
        BoxplotResult, list]:
    check_parameter(by, level)
    check_metric(metric, level)
    data = frame[[by, metric]].dropna()
    if data.empty:
        raise DlasError(f"no rows have {by} and {metric} (after filters)")
    keys, order = _axis(data[by])
    data = data.assign(_g=keys)
    samples, stats = [], []
    for g in order:
        v = data.loc[data["_g"] == g, metric].astype(float)
        samples.append(v.to_numpy())
        q = v.quantile([0.0, 0.25, 0.5, 0.75, 1.0]).tolist()
        stats.append({"n": int(len(v)), "min": q[0], "q1": q[1], "median": q[2], "q3": q[3],
                      "max": q[4]})
    return BoxplotResult(metric, by, [_plain(g) for g in order], stats), samples


# ---- which corpus ------------------------------------------------------------------------------


def shipped_snapshots() -> dict[str, Path]:
    """Shipped corpus snapshots by device: ``datasets/corpus/DEVICE.parquet``. Public data of
    other projects (TopHub) is not shipped: import it into a store and pass the store."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.parquet")) if "." not in p.stem}


def resolve_store(device: str, store: Path | None) -> Path:
    """``store`` when given; else the shipped snapshot of ``device``, imported once into a
    cache store under DLAS_HOME (keyed by the snapshot's content)."""
    if store is not None:
        if not Path(store).is_file():
            raise DlasError(f"corpus store not found: {store}")
        return Path(store)
    return _snapshot_store(resolve_store_snapshot(device))


def resolve_store_snapshot(device: str) -> Path:
    """The shipped reference snapshot of ``device``."""
    snaps = shipped_snapshots()
    if device not in snaps:
        raise DlasError(f"no shipped corpus for device {device!r} (shipped: "
                        f"{', '.join(snaps) or 'none'}); give {param('store')} PATH (TopHub's "
                        "devices: dlas-predict corpus import-tophub $DLAS_SHARED_DATA/tophub "
                        "--store PATH)")
    return snaps[device]


def _snapshot_store(snap: Path) -> Path:
    """A shipped snapshot (with its networks and whole-network parts) imported once into a
    cache store under DLAS_HOME, keyed by its content."""
    import hashlib

    from dlas_predict.paths import cache_dir
    from dlas_predict.corpus.store import CorpusStore

    digest = hashlib.sha256()
    for part in (snap, *(snap.with_name(f"{snap.stem}.{p}{snap.suffix}")
                         for p in ("networks", "wholenet"))):
        if part.is_file():
            digest.update(part.read_bytes())
    path = cache_dir("corpus") / f"{snap.stem}-{digest.hexdigest()[:16]}.sqlite"
    if not path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        with CorpusStore(tmp, scratch=True) as db:
            db.import_snapshot(snap)
        tmp.rename(path)
    return path
