"""The analysis toolbox's plots (matplotlib's Agg backend, no display): heat map, regression,
box plot and roofline, each titled with whose corpus it shows."""

from __future__ import annotations

import math
from pathlib import Path

from dlas_predict.errors import ConfigError, DlasError, param
from dlas_predict.space.devices import Device
from dlas_predict.analysis.frames import (METRICS, BoxplotResult, Corpus, HeatmapResult,
                                          RegressionResult, check_parameter, compute_roof)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(name: str) -> str:
    if name in METRICS:
        desc, unit = METRICS[name]
        return f"{name} ({unit})"
    return name


def _save(fig, out: Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"{param('out')} {out}: use a .png, .svg or .pdf file name")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return out


def plot_subtitle(frame, extra: str = "", corpus: "Corpus | None" = None) -> str:
    devs = ", ".join(sorted(set(frame["device"].astype(str))))
    whose = f" ({corpus.whose})" if corpus is not None else ""
    return f"device {devs}{whose}; {len(frame)} rows{extra}"


def plot_heatmap(result: HeatmapResult, out: Path, subtitle: str = "") -> Path:
    import numpy as np

    plt = _plt()
    vals = np.array([[np.nan if v is None else v for v in row] for row in result.values])
    fig, ax = plt.subplots(figsize=(max(5.5, 0.75 * len(result.x_values) + 3),
                                    max(3.5, 0.5 * len(result.y_values) + 2)))
    im = ax.imshow(vals, aspect="auto", cmap="viridis", origin="lower")
    ax.set_xticks(range(len(result.x_values)), [str(v) for v in result.x_values],
                  rotation=30 if len(result.x_values) > 5 else 0, ha="right"
                  if len(result.x_values) > 5 else "center")
    ax.set_yticks(range(len(result.y_values)), [str(v) for v in result.y_values])
    ax.set_xlabel(result.x)
    ax.set_ylabel(result.y)
    finite = vals[np.isfinite(vals)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            if np.isfinite(vals[i, j]):
                ax.text(j, i, f"{vals[i, j]:.3g}", ha="center", va="center", fontsize=8,
                        color="black" if vals[i, j] > mid else "white")
    fig.colorbar(im, ax=ax, label=f"median {_label(result.metric)}")
    ax.set_title(f"{result.metric}: {result.y} × {result.x}\n{subtitle}", fontsize=10)
    return _save(fig, out)


def plot_regression(result: RegressionResult, out: Path, subtitle: str = "") -> Path:
    plt = _plt()
    order = sorted(range(len(result.terms)), key=lambda i: abs(result.coefficients[i]))
    terms = [result.terms[i] for i in order]
    coefs = [result.coefficients[i] for i in order]
    fig, ax = plt.subplots(figsize=(7, max(3, 0.35 * len(terms) + 1.5)))
    ax.barh(range(len(terms)), coefs, color=["tab:blue" if c >= 0 else "tab:red"
                                             for c in coefs])
    ax.set_yticks(range(len(terms)), terms)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"standardised coefficient (SDs of {result.metric} per SD of the term)")
    ax.set_title(f"linear regression of {_label(result.metric)}: R² = {result.r2:.3f}, "
                 f"n = {result.n}\n{subtitle}", fontsize=10)
    return _save(fig, out)


def plot_boxplot(result: BoxplotResult, samples: list, out: Path, subtitle: str = "",
                 log: bool | None = None) -> Path:
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.5, 0.9 * len(samples) + 2), 4.5))
    ax.boxplot(samples, showfliers=True, flierprops={"markersize": 2})
    labels = [f"{g}\n(n={s['n']})" for g, s in zip(result.groups, result.stats)]
    ax.set_xticks(range(1, len(labels) + 1), labels,
                  rotation=30 if len(labels) > 5 else 0)
    allv = np.concatenate([s for s in samples if len(s)]) if samples else np.array([])
    if log is None:
        pos = allv[allv > 0]
        log = bool(pos.size and pos.size == allv.size and pos.max() / pos.min() > 100)
    if log:
        ax.set_yscale("log")
    if result.metric == "speedup":
        ax.axhline(1.0, color="grey", ls="--", lw=0.8, label="no speedup")
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel(result.by)
    ax.set_ylabel(_label(result.metric))
    ax.set_title(f"{result.metric} by {result.by}\n{subtitle}", fontsize=10)
    return _save(fig, out)


def plot_roofline(frame, device: Device, out: Path, color: str = "algorithm",
                  subtitle: str = "") -> Path:
    """Every measurement at (intensity, useful GFLOP/s) under the device's roofs: compute
    per dtype, main memory, and each cache level whose bandwidth was measured (a kernel is
    bounded by the smallest level that holds its compulsory bytes)."""
    import numpy as np

    check_parameter(color, "kernel")
    plt = _plt()
    data = frame[["intensity", "useful_gflops", "dtype", color]].dropna()
    if data.empty:
        raise DlasError("no measurement to place on the roofline (after filters)")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = sorted(set(data[color].astype(str)))
    cmap = plt.get_cmap("tab10")
    for i, g in enumerate(groups):
        d = data[data[color].astype(str) == g]
        ax.scatter(d["intensity"], d["useful_gflops"], s=7, alpha=0.55, color=cmap(i % 10),
                   label=f"{color}={g} ({len(d)})")
    lo = max(min(data["intensity"].min() / 2, 0.05), 1e-3)
    hi = data["intensity"].max() * 2
    xs = np.logspace(math.log10(lo), math.log10(hi), 200)
    bw = device.mem_bandwidth_gbs
    styles = {"float32": "-", "float16": "--", "int8": ":"}
    src = device.source
    top = 0.0
    for dtype in ("float32", "float16", "int8"):
        peak = device.peak_gflops.get(dtype) and compute_roof(device, dtype)
        if not peak:
            continue
        top = max(top, peak)
        roof = np.minimum(peak, xs * bw) if bw else np.full_like(xs, peak)
        vnni = " VNNI" if dtype == "int8" and peak == device.int8_dot_gflops else ""
        ax.plot(xs, roof, color="black", ls=styles[dtype], lw=1.2,
                label=f"roof {dtype}{vnni}: {peak:.0f} GFLOP/s ({src})")
    if bw:
        ax.plot([], [], " ", label=f"DRAM bandwidth {bw:.1f} GB/s ({src})")
    for i, (level, lbw) in enumerate(device.cache_bandwidth_gbs.items()):
        ax.plot(xs, np.minimum(top, xs * lbw), color="grey", ls=(0, (1, 2 + i)), lw=0.9,
                label=f"{level} bandwidth {lbw:.0f} GB/s ({src}): kernels whose bytes fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (useful FLOP / compulsory byte)")
    ax.set_ylabel("achieved useful GFLOP/s")
    ax.set_title(f"roofline of {device.name}: {device.description}\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, out)
