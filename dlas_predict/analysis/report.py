"""The DLAS report of one device's corpus: the study's summary tables, the share of the ideal
speedup, its 13 observations with a verdict each, and the analysis plots (the page they make:
:mod:`~dlas_predict.analysis.page`).

Every number comes from the corpus (measurements) or from the shipped accuracy curves
(measured on digits); each table says which latency it uses: a whole-network build timed
end to end where one was measured, else the sum of the network's measured conv kernels
(marked †). Verdicts are computed by the rules written next to each observation; an
observation whose data the corpus lacks says "no data" and names what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dlas_predict.analysis import frames as A
from dlas_predict.analysis import plots as P
from dlas_predict.space.devices import Device

HOLDS, FAILS, NO_DATA = "holds", "does not hold", "no data"
ALGORITHMS = ("direct", "gemm", "spatial_pack")


@dataclass
class Observation:
    """One of the study's observations, checked on this corpus."""

    number: str           # "I" .. "XIII"
    claim: str            # the observation, as a testable statement
    rule: str             # how the verdict is decided
    verdict: str = NO_DATA
    evidence: str = ""    # the numbers behind the verdict, in words
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "claim": self.claim, "rule": self.rule,
                "verdict": self.verdict, "evidence": self.evidence, "numbers": self.numbers}


@dataclass
class Report:
    device: Device
    store: Path
    counts: dict[str, Any]
    table3: list[dict[str, Any]]
    table4: list[dict[str, Any]]
    table6: list[dict[str, Any]]
    ideal: list[dict[str, Any]]
    observations: list[Observation]
    plots: list[tuple[str, str, Path]]  # (title, caption, file)
    #: per network and compression, our fastest whole-network build against onnxruntime
    backends: list[dict[str, Any]] = field(default_factory=list)
    #: whose measurements these are, in one line (:meth:`Corpus.describe`)
    whose: str = ""
    #: ``local`` and its profiles: whether the corpus is this machine's (None: another device)
    this_machine: bool | None = None
    #: the observations that a family's networks can test, rechecked on each family of the
    #: corpus (:func:`family_observations`); empty for a corpus of one family
    families: dict[str, list[Observation]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device.name, "store": str(self.store), "whose": self.whose,
                "this_machine": self.this_machine, "counts": self.counts,
                "table3": self.table3, "table4": self.table4, "table6": self.table6,
                "ideal_speedup": self.ideal,
                "observations": [o.to_dict() for o in self.observations],
                "backends": self.backends,
                "families": {f: [o.to_dict() for o in obs] for f, obs in self.families.items()},
                "plots": [{"title": t, "caption": c, "file": str(p)} for t, c, p in self.plots]}


# ---- network-level summaries ---------------------------------------------------------------
def backend_table(net, store: Path, device: Device) -> list[dict[str, Any]]:
    """Per network and compression (untuned): our fastest whole-network build, onnxruntime's
    run of the same compressed model (median latencies, both measured on the device), and
    the fastest backend. Only configurations both backends timed are compared."""
    from dlas_predict.measure.networks.plans import ONNXRUNTIME, onnxruntime_mode
    from dlas_predict.corpus.store import CorpusStore

    if net is None or net.empty:
        return []
    with CorpusStore(store, must_exist=True) as db:
        ort = {(r.network, r.config): r for r in db.network_records(
            "error IS NULL AND device = ? AND algorithm = ?", (device.name, ONNXRUNTIME))
            if r.median_s is not None and (r.verified or r.dtype != "float32")}
    if not ort:
        return []
    ours = net[(net["tuning"] == "untuned") & (net["latency_source"] == "whole network")]
    rows = []
    for (network, config), g in sorted(ours.groupby(["network", "config"]),
                                       key=lambda kv: (_family_rank(kv[0][0]), kv[0])):
        o = ort.get((network, config))
        if o is None:
            continue
        best = g.loc[g["latency_ms"].idxmin()]
        ort_ms = o.median_s * 1e3
        rows.append({"network": A.short_name(network), "config": config,
                     "tvm": f"{best['algorithm']} {best['latency_ms']:.3g}",
                     "onnxruntime": f"{onnxruntime_mode(config)} {ort_ms:.3g}",
                     "fastest": "tvm" if best["latency_ms"] < ort_ms else "onnxruntime",
                     "tvm / onnxruntime": f"{best['latency_ms'] / ort_ms:.2f}"})
    return rows


def _best(frame, keys: list[str]):
    """The fastest row of every group of ``keys``."""
    idx = frame.groupby(keys, observed=True)["latency_ms"].idxmin()
    return frame.loc[idx.dropna()]


def _cell(row) -> str:
    mark = "" if row["latency_source"] == "whole network" else "†"
    return f"{row['algorithm']} {row['latency_ms']:.3g}{mark}"


def summary_tables(net) -> tuple[list, list, list]:
    """Tables 3 (fastest algorithm per compression), 4 (fastest compression per algorithm)
    and 6 (fastest overall), per network and tuning."""
    if net is None or net.empty:
        return [], [], []
    fixed = net[net["algorithm"].isin(ALGORITHMS)]
    t3, t4, t6 = [], [], []
    for (network, tuning), g in sorted(fixed.groupby(["network", "tuning"]),
                                       key=lambda kv: (_family_rank(kv[0][0]), kv[0])):
        best = _best(g, ["config"])
        row = {"network": A.short_name(network), "tuning": tuning}
        for _, b in best.sort_values("config").iterrows():
            row[b["config"]] = _cell(b)
        t3.append(row)
        best = _best(g, ["algorithm"])
        row = {"network": A.short_name(network), "tuning": tuning}
        for _, b in best.iterrows():
            mark = "" if b["latency_source"] == "whole network" else "†"
            row[b["algorithm"]] = f"{b['config']} {b['latency_ms']:.3g}{mark}"
        t4.append(row)
        whole = net[(net["network"] == network) & (net["tuning"] == tuning)]
        top = whole.loc[whole["latency_ms"].idxmin()]
        dense = g[g["config"] == "dense"]
        base = dense["latency_ms"].min() if not dense.empty else float("nan")
        mark = "" if top["latency_source"] == "whole network" else "†"
        t6.append({"network": A.short_name(network), "tuning": tuning, "config": top["config"],
                   "algorithm": top["algorithm"], "latency_ms": f"{top['latency_ms']:.3g}{mark}",
                   "dense best ms": f"{base:.3g}",
                   "speedup": f"{base / top['latency_ms']:.2f}x" if base == base else "-"})
    return t3, t4, t6


def _family_rank(network: str) -> int:
    """Zoo networks before generated ones."""
    return 1 if A.generated_params(network) else 0


def ideal_shares(net) -> list[dict[str, Any]]:
    """Per network and pruning configuration: achieved speedup (fastest dense over fastest
    pruned, each on its best algorithm) against the ideal one (dense MACs over the MACs
    left after pruning); share = achieved / ideal."""
    if net is None or net.empty:
        return []
    fixed = net[net["algorithm"].isin(ALGORITHMS)]
    out = []
    for (network, tuning), g in sorted(fixed.groupby(["network", "tuning"]),
                                       key=lambda kv: (_family_rank(kv[0][0]), kv[0])):
        dense = g[g["config"] == "dense"]
        if dense.empty:
            continue
        base = dense["latency_ms"].min()
        for config, p in g[g["compression"].isin(["weight_pruning", "channel_pruning"])
                           ].groupby("config"):
            b = p.loc[p["latency_ms"].idxmin()]
            ideal = b["net_macs"] / max(b["effective_macs"], 1.0)
            achieved = base / b["latency_ms"]
            out.append({"network": network, "tuning": tuning, "config": config,
                        "compression": b["compression"], "ratio": float(b["ratio"]),
                        "algorithm": b["algorithm"], "achieved": achieved, "ideal": ideal,
                        "share": achieved / ideal,
                        "source": b["latency_source"]})
    return out


# ---- observations ---------------------------------------------------------------------------
def _spearman(a, b) -> float:
    import pandas as pd

    return float(pd.Series(list(a)).rank().corr(pd.Series(list(b)).rank()))


def median(values) -> float:
    import statistics

    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def _best_by(net, network: str, config: str, tuning: str = "untuned"):
    g = net[(net["network"] == network) & (net["config"] == config) & (net["tuning"] == tuning)
            & net["algorithm"].isin(ALGORITHMS)]
    return None if g.empty else g.loc[g["latency_ms"].idxmin()]


def _config_speedups(net, config_prefix: str) -> dict[str, float]:
    """Per network: fastest dense over fastest configuration starting with ``config_prefix``
    (the highest ratio measured, for pruning), untuned, best algorithm each."""
    mine = net[(net["tuning"] == "untuned") & net["algorithm"].isin(ALGORITHMS)]
    best = mine.groupby(["network", "config"], observed=True)["latency_ms"].min().to_dict()
    configs_of = {n: set(g) for n, g in net.groupby("network", observed=True)["config"]}
    out = {}
    for network in sorted(configs_of):
        configs = sorted(c for c in configs_of[network]
                         if c == config_prefix or c.startswith(config_prefix + "@"))
        dense = best.get((network, "dense"))
        if dense is None or not configs:
            continue
        comp = best.get((network, configs[-1]))
        if comp is not None:
            out[network] = dense / comp
    return out


@dataclass
class Evidence:
    """What the observations are judged on: the network frame, the kernel frame, the shipped
    accuracy curves and the device."""

    net: Any
    kernels: Any
    curves: dict | None
    device: Device

    @property
    def has_net(self) -> bool:
        return self.net is not None and not self.net.empty

    @property
    def untuned(self):
        return self.net[self.net["tuning"] == "untuned"] if self.has_net else None

    @cached_property
    def ideal_shares(self) -> list[dict[str, Any]]:
        """:func:`ideal_shares` of the network frame, computed once for VII and VIII."""
        return ideal_shares(self.net) if self.has_net else []


def _i(ev: Evidence) -> Observation:
    """Observation I."""
    kernels, curves, has_net, untuned = ev.kernels, ev.curves, ev.has_net, ev.untuned
    o = Observation("I", "Model size, MACs and accuracy are not strongly correlated with "
                    "inference time.",
                    "holds when the Spearman ρ of dense latency (best algorithm) with conv "
                    "weights or with MACs, across networks, is below 0.8; accuracy is "
                    "checked the same way over the configurations with a shipped accuracy.")
    if has_net:
        rows = []
        for network in sorted(set(untuned["network"])):
            b = _best_by(untuned, network, "dense")
            if b is not None:
                rows.append((network, b["net_macs"], b["latency_ms"]))
        params = _conv_params(kernels)
        rows = [(n, m, l, params.get(n)) for n, m, l in rows]
        if len(rows) >= 4:
            rho_macs = _spearman([r[1] for r in rows], [r[2] for r in rows])
            with_p = [r for r in rows if r[3]]
            rho_params = _spearman([r[3] for r in with_p], [r[2] for r in with_p]) \
                if len(with_p) >= 4 else float("nan")
            inversions = sum(1 for a in rows for b in rows if a[1] > b[1] and a[2] < b[2])
            pairs = len(rows) * (len(rows) - 1) // 2
            acc = _accuracy_latency(untuned, curves)
            o.numbers = {"networks": len(rows), "rho_macs_latency": rho_macs,
                         "rho_params_latency": rho_params, "inverted_pairs": inversions,
                         "pairs": pairs, **acc}
            rhos = [abs(x) for x in (rho_macs, rho_params,
                                     acc.get("rho_accuracy_latency", float("nan"))) if x == x]
            if rhos:
                o.verdict = HOLDS if min(rhos) < 0.8 else FAILS
            o.evidence = (f"over {len(rows)} networks (dense, fastest algorithm): ρ(MACs, "
                          f"latency) = {rho_macs:.2f}, ρ(conv weights, latency) = "
                          f"{rho_params:.2f}; {inversions} of {pairs} network pairs have the "
                          "network with more MACs running faster")
            if "rho_accuracy_latency" in acc:
                o.evidence += (f"; ρ(top-1, latency) = {acc['rho_accuracy_latency']:.2f} over "
                               f"{acc['configs_with_accuracy']} configurations with a shipped "
                               "accuracy")
    _no_data(o, "no network with a dense configuration in this corpus")
    return o


def _ii(ev: Evidence) -> Observation:
    """Observation II."""
    curves = ev.curves
    o = Observation("II", "Weight pruning keeps accuracy to higher ratios than channel "
                    "pruning.",
                    "holds when, on every network with both shipped curves, the weight-"
                    "pruning elbow (highest ratio within 1 point of dense top-1) is at or "
                    "above the channel-pruning elbow (none counts as 0).")
    if curves:
        rows = {n: (c.pruning["weight_pruning"].elbow or 0.0,
                    c.pruning["channel_pruning"].elbow or 0.0)
                for n, c in curves.items()
                if {"weight_pruning", "channel_pruning"} <= set(c.pruning)}
        if rows:
            o.numbers = {n: {"weight_elbow": w, "channel_elbow": c} for n, (w, c) in
                         rows.items()}
            o.verdict = HOLDS if all(w >= c for w, c in rows.values()) else FAILS
            o.evidence = "elbows (weight / channel): " + "; ".join(
                f"{n} {w:g} / {c:g}" for n, (w, c) in rows.items()) + \
                " (shipped curves: top-1 on 360 held-out digits; accuracy does not depend " \
                "on the device)"
    _no_data(o, "no shipped accuracy curves")
    return o


def _iii(ev: Evidence) -> Observation:
    """Observation III."""
    untuned = ev.untuned
    o = Observation("III", "Quantisation speedups depend on the hardware: int8 is not a "
                    "reliable speedup on this device.",
                    "holds when int8 (fastest algorithm) is slower than float32 dense on at "
                    "least one network, or its median speedup is below 2x.")
    _speedup_obs(o, untuned, "int8", lambda med, slower: slower > 0 or med < 2.0)
    return o


def _iv(ev: Evidence) -> Observation:
    """Observation IV."""
    has_net, untuned = ev.has_net, ev.untuned
    o = Observation("IV", "Channel pruning gives a more reliable speedup than weight "
                    "pruning.",
                    "holds when the median speedup over dense of channel pruning (highest "
                    "measured ratio, fastest algorithm) is above 1 and above weight "
                    "pruning's at the same ratio.")
    if has_net:
        ch = _config_speedups(untuned, "channel_pruning")
        wp = _config_speedups(untuned, "weight_pruning")
        common = sorted(set(ch) & set(wp))
        if common:
            mc, mw = median(ch[n] for n in common), median(wp[n] for n in common)
            o.numbers = {"networks": len(common), "median_channel": mc, "median_weight": mw}
            o.verdict = HOLDS if mc > 1 and mc > mw else FAILS
            o.evidence = (f"median speedup over dense on {len(common)} networks: channel "
                          f"pruning {mc:.2f}x, weight pruning {mw:.2f}x"
                          f"{_channel_build_note(untuned, common)}")
    _no_data(o, "no network with both prunings and dense measured")
    return o


def _channel_build_note(untuned, networks: list[str]) -> str:
    """How the channel-pruned builds compared in IV were made: engines from
    :data:`CHANNEL_REMOVAL_VERSION` on remove the zeroed filters, older ones ran CSR kernels
    over them; a conv kernel sum says nothing about the build."""
    from dlas_predict.measure.networks.plans import removes_channels

    removed = kept = 0
    for network in networks:
        configs = sorted(c for c in set(untuned[untuned["network"] == network]["config"])
                         if c.startswith("channel_pruning"))
        row = _best_by(untuned, network, configs[-1]) if configs else None
        engine = str(row.get("engine", "") or "") if row is not None else ""
        if not engine:
            continue
        if removes_channels(engine):
            removed += 1
        else:
            kept += 1
    if removed and not kept:
        return " (channel-pruned networks built with their zeroed filters removed)"
    if kept and not removed:
        return " (channel-pruned networks built with CSR kernels over their zeroed filters)"
    if removed and kept:
        return (f" (channel-pruned networks: {removed} built with their zeroed filters "
                f"removed, {kept} with CSR kernels over them)")
    return ""


def _v(ev: Evidence) -> Observation:
    """Observation V."""
    device, untuned = ev.device, ev.untuned
    o = Observation("V", "float16 slows CPUs that lack native float16 arithmetic.",
                    "on a CPU without native float16 (no avx512_fp16 / fphp): holds when "
                    "float16 (fastest algorithm) is slower than float32 dense on most networks.")
    native = bool(set(device.isa_flags) & {"avx512_fp16", "fphp", "asimdhp"})
    if device.kind != "cpu":
        o.evidence = f"{device.name} is a {device.kind}, not a CPU"
        o.verdict = NO_DATA
    else:
        _speedup_obs(o, untuned, "float16", None, majority=True)
        if native and o.verdict != NO_DATA:
            o.evidence += " (this CPU has native float16 arithmetic)"
    return o


def _vi(ev: Evidence) -> Observation:
    """Observation VI."""
    has_net, untuned = ev.has_net, ev.untuned
    o = Observation("VI", "Untuned, the fastest algorithm for a dense model is GEMM or "
                    "direct, not spatial pack.",
                    "holds when GEMM or direct is the fastest untuned dense algorithm on most "
                    "networks.")
    if has_net:
        wins = {}
        for network in sorted(set(untuned["network"])):
            b = _best_by(untuned, network, "dense")
            if b is not None:
                wins[network] = b["algorithm"]
        if wins:
            counts = {a: sum(1 for v in wins.values() if v == a) for a in ALGORITHMS}
            o.numbers = {"winners": counts}
            o.verdict = HOLDS if counts["gemm"] + counts["direct"] > len(wins) / 2 else FAILS
            o.evidence = "fastest untuned dense algorithm: " + ", ".join(
                f"{a} on {n}" for a, n in counts.items()) + f" of {len(wins)} networks"
    _no_data(o, "no untuned dense network configuration")
    return o


def _ideal_share(ev: Evidence, number: str, comp: str, claim: str, rule: str,
                 test) -> Observation:
    """VII and VIII: the median share of the ideal speedup one pruning reaches, judged by
    ``test(share, other pruning's share)``."""
    o = Observation(number, claim, rule)
    shares = ev.ideal_shares
    mine = [s["share"] for s in shares if s["compression"] == comp
            and s["tuning"] == "untuned"]
    other_comp = "channel_pruning" if comp == "weight_pruning" else "weight_pruning"
    other = median(s["share"] for s in shares if s["compression"] == other_comp
                    and s["tuning"] == "untuned")
    if mine:
        med = median(mine)
        o.numbers = {"configurations": len(mine), "median_share": med,
                     "median_share_other": other}
        o.verdict = HOLDS if test(med, other) else FAILS
        o.evidence = (f"median share of the ideal speedup over {len(mine)} "
                      f"{comp} configurations: {med:.1%} (the other pruning: "
                      f"{other:.1%})")
    _no_data(o, f"no {comp} network configuration with its dense baseline")
    return o


def _vii(ev: Evidence) -> Observation:
    return _ideal_share(
        ev, "VII", "weight_pruning", "Weight-pruned models reach only a small fraction of "
        "their ideal speedup (the study: 11.5 % on the HiKey, 21.8 % on the i7, untuned).",
        "holds when the median share of the ideal speedup (achieved / (dense MACs / MACs "
        "left)) is below 50 %.", lambda s, other: s < 0.5)


#: How much larger one median share must be than the other to count as larger (relative):
#: two medians a hair apart say the prunings reach the same share.
SHARE_MARGIN = 0.10


def _viii(ev: Evidence) -> Observation:
    return _ideal_share(
        ev, "VIII", "channel_pruning", "Channel-pruned models reach a larger share of their "
        "ideal speedup than weight-pruned ones (the study: 77.9 % and 83.9 %).",
        f"holds when channel pruning's median share of its ideal speedup is above weight "
        f"pruning's by more than {SHARE_MARGIN:.0%} of it.",
        lambda s, other: other == other and s > other * (1 + SHARE_MARGIN))


def _ix(ev: Evidence) -> Observation:
    """Observation IX."""
    kernels = ev.kernels
    o = Observation("IX", "Sparse (CSR) kernels beat dense ones only at high sparsity.",
                    "over weight-pruned layers, holds when CSR kernels win (faster than the "
                    "same algorithm's dense kernel) on under half the layers below 70 % "
                    "sparsity.")
    if kernels is not None and not kernels.empty:
        k = A.unique_kernels(kernels)
        k = k[(k["compression"] == "weight_pruning") & k["speedup"].notna()]
        if len(k):
            bins = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.01)]
            table = {}
            for lo, hi in bins:
                part = k[(k["sparsity"] >= lo) & (k["sparsity"] < hi)]
                if len(part):
                    table[f"{lo:.1f}-{min(hi, 1.0):.1f}"] = {
                        "layers": int(len(part)), "csr_wins": float((part["speedup"] > 1).mean())}
            low = k[k["sparsity"] < 0.7]
            o.numbers = {"by_sparsity": table}
            if len(low):
                o.verdict = HOLDS if (low["speedup"] > 1).mean() < 0.5 else FAILS
            o.evidence = "share of layers where CSR beats dense, by layer sparsity: " + \
                "; ".join(f"{b}: {v['csr_wins']:.0%} of {v['layers']}" for b, v in
                          table.items())
    _no_data(o, "no weight-pruned kernel with its dense counterpart")
    return o


def _x(ev: Evidence) -> Observation:
    """Observation X."""
    has_net, untuned = ev.has_net, ev.untuned
    o = Observation("X", "No single algorithm is fastest everywhere: the best one depends "
                    "on the network and the compression.",
                    "holds when Table 3's winners include at least two algorithms.")
    if has_net:
        fixed = untuned[untuned["algorithm"].isin(ALGORITHMS)]
        winners = _best(fixed, ["network", "config"])["algorithm"]
        if len(winners):
            counts = winners.value_counts().to_dict()
            o.numbers = {"winners": counts, "cells": int(len(winners))}
            o.verdict = HOLDS if len(counts) >= 2 else FAILS
            o.evidence = f"over {len(winners)} (network, configuration) cells the fastest " \
                         "algorithm is " + ", ".join(f"{a} {n}" for a, n in counts.items())
    _no_data(o, "no network configuration")
    return o


def _xi(ev: Evidence) -> Observation:
    """Observation XI."""
    kernels = ev.kernels
    o = Observation("XI", "Auto-tuning changes which algorithm is fastest (the study: "
                    "untuned GEMM or direct; tuned CPU: spatial pack for dense, direct for "
                    "sparse).",
                    "holds when, on some layer measured tuned and untuned with every "
                    "algorithm, the fastest algorithm differs between the two.")
    changed, compared = _tuning_changes(kernels)
    if compared:
        o.numbers = {"layers_compared": compared, "winner_changed": changed}
        o.verdict = HOLDS if changed else FAILS
        o.evidence = f"the fastest algorithm changes with tuning on {changed} of {compared} " \
                     "layer configurations"
    _no_data(o, "no layer measured both tuned and untuned with every algorithm (tuned "
                "records come from MetaSchedule: dlas-predict tune; TopHub logs hold one tuned "
                "algorithm per workload)")
    return o


def _xii(ev: Evidence) -> Observation:
    """Observation XII."""
    kernels = ev.kernels
    o = Observation("XII", "Sparse kernels gain less from tuning than dense ones.",
                    "holds when the median tuned-over-untuned speedup of CSR kernels is below "
                    "that of dense kernels.")
    gains = _tuning_gains(kernels)
    if gains.get("sparse") and gains.get("dense"):
        o.numbers = gains
        o.verdict = HOLDS if gains["sparse"] < gains["dense"] else FAILS
        o.evidence = f"median tuning speedup: CSR {gains['sparse']:.2f}x, dense " \
                     f"{gains['dense']:.2f}x"
    _no_data(o, "no kernel measured both tuned and untuned, sparse and dense")
    return o


def _xiii(ev: Evidence) -> Observation:
    """Observation XIII."""
    kernels = ev.kernels
    o = Observation("XIII", "Auto-tuning is expensive: hours per network (the study: over "
                    "140 hours per ImageNet model on the HiKey).",
                    "holds when the recorded tuning time of a network's layers sums to over "
                    "an hour.")
    secs = _tuning_seconds(kernels)
    if secs:
        o.numbers = {"tuning_hours": secs}
        worst = max(secs.values())
        o.verdict = HOLDS if worst > 1.0 else FAILS
        o.evidence = "recorded tuning time per network: " + ", ".join(
            f"{n} {h:.2f} h" for n, h in sorted(secs.items()))
    _no_data(o, "no tuned record with its tuning_seconds (MetaSchedule tuning: dlas-predict tune)")
    return o


#: The study's 13 observations, in its order: each rule reads the evidence and returns its
#: observation, with a verdict, its numbers and the rule it was judged by.
OBSERVATION_RULES = (_i, _ii, _iii, _iv, _v, _vi, _vii, _viii, _ix, _x, _xi, _xii, _xiii)


def observations(net, kernels, curves: dict | None, device: Device) -> list[Observation]:
    """Every observation of the study with its verdict on ``device``."""
    ev = Evidence(net, kernels, curves, device)
    return [rule(ev) for rule in OBSERVATION_RULES]


#: The observations whose data each family's networks hold (whole networks of every
#: compression, their layers' kernels), rechecked family by family.
FAMILY_RULES = (_i, _iii, _iv, _v, _vi, _ix, _x)
#: The families, in the order the report gives them.
FAMILIES = ("CNNs", "MLPs", "transformers", "recurrent networks")


def network_family(name: str) -> str:
    """The family of a corpus network: a zoo network's, a generated MLP (``fc``),
    transformer or recurrent network (``rnn``) by its name; every other network
    (NAS-Bench-201 cells, generated CNNs) a CNN."""
    from dlas_predict.networks.generate import parse_name
    from dlas_predict.networks.zoo import ZOO

    spec = parse_name(name)
    family = ZOO[name].family if name in ZOO else spec[0] if spec is not None else "cnn"
    return {"fc": "MLPs", "mlp": "MLPs", "transformer": "transformers",
            "rnn": "recurrent networks", "recurrent": "recurrent networks"}.get(family, "CNNs")


def family_observations(net, kernels, device: Device) -> dict[str, list[Observation]]:
    """:data:`FAMILY_RULES` on each family's networks alone (their builds and kernels), for
    a corpus of more than one family; accuracy curves are the CNN zoo's, so left out."""
    if net is None or net.empty:
        return {}
    of = {name: network_family(name) for name in set(net["network"])}
    present = [f for f in FAMILIES if f in set(of.values())]
    if len(present) < 2:
        return {}
    out = {}
    for family in present:
        names = {n for n, f in of.items() if f == family}
        k = kernels[kernels["network"].isin(names)] if kernels is not None else None
        ev = Evidence(net[net["network"].isin(names)], k, None, device)
        out[family] = [rule(ev) for rule in FAMILY_RULES]
    return out


def _family_sizes(net) -> dict[str, int]:
    if net is None or net.empty:
        return {}
    families = [network_family(n) for n in set(net["network"])]
    return {f: families.count(f) for f in FAMILIES if f in families}


def _no_data(o: Observation, why: str) -> None:
    if o.verdict == NO_DATA and not o.evidence:
        o.evidence = why


def _speedup_obs(o: Observation, untuned, config: str, test, majority: bool = False) -> None:
    if untuned is None or untuned.empty:
        return
    sp = _config_speedups(untuned, config)
    if not sp:
        return
    med = median(sp.values())
    slower = sum(1 for v in sp.values() if v < 1)
    o.numbers = {"networks": len(sp), "median_speedup": med, "slower_on": slower,
                 "per_network": sp}
    if majority:
        o.verdict = HOLDS if slower > len(sp) / 2 else FAILS
    else:
        o.verdict = HOLDS if test(med, slower) else FAILS
    o.evidence = (f"{config} over float32 dense (fastest algorithm each): median "
                  f"{med:.2f}x over {len(sp)} networks; slower on {slower}")


def _conv_params(kernels) -> dict[str, int]:
    if kernels is None or kernels.empty:
        return {}
    dense = kernels[(kernels["compression"] == "dense") & (kernels["network"] != "-")]
    dense = dense.drop_duplicates(subset=["network", "C", "K", "H", "W", "R", "S", "stride",
                                          "groups"])
    return dense.groupby("network")["params"].sum().to_dict()


def _accuracy_latency(untuned, curves: dict | None) -> dict[str, Any]:
    if not curves:
        return {}
    pairs = []
    for network, c in curves.items():
        for config in set(untuned[untuned["network"] == network]["config"]):
            comp, _, ratio = config.partition("@")
            acc = c.accuracy(comp, float(ratio) if ratio else None, digits=2)
            b = _best_by(untuned, network, config)
            if acc is not None and b is not None:
                pairs.append((acc, b["latency_ms"]))
    if len(pairs) < 4:
        return {}
    return {"rho_accuracy_latency": _spearman([p[0] for p in pairs], [p[1] for p in pairs]),
            "configs_with_accuracy": len(pairs)}


def _tuning_pairs(kernels):
    if kernels is None or kernels.empty or set(kernels["tuning"]) != {"tuned", "untuned"}:
        return None
    k = A.unique_kernels(kernels)
    keys = ["device", "C", "K", "H", "W", "R", "S", "stride", "groups", "compression",
            "ratio", "algorithm"]
    return k.pivot_table(index=keys, columns="tuning", values="latency_ms",
                         aggfunc="min").dropna()


def _tuning_changes(kernels) -> tuple[int, int]:
    pairs = _tuning_pairs(kernels)
    if pairs is None or pairs.empty:
        return 0, 0
    flat = pairs.reset_index()
    keys = ["device", "C", "K", "H", "W", "R", "S", "stride", "groups", "compression", "ratio"]
    changed = compared = 0
    for _, g in flat.groupby(keys):
        if set(g["algorithm"]) != set(ALGORITHMS):
            continue
        compared += 1
        changed += g.loc[g["tuned"].idxmin(), "algorithm"] != \
            g.loc[g["untuned"].idxmin(), "algorithm"]
    return int(changed), compared


def _tuning_gains(kernels) -> dict[str, float]:
    pairs = _tuning_pairs(kernels)
    if pairs is None or pairs.empty:
        return {}
    flat = pairs.reset_index()
    flat["gain"] = flat["untuned"] / flat["tuned"]
    sparse = flat["compression"].isin(["weight_pruning", "channel_pruning"])
    out = {}
    if sparse.any():
        out["sparse"] = float(flat.loc[sparse, "gain"].median())
    if (~sparse).any():
        out["dense"] = float(flat.loc[~sparse, "gain"].median())
    return out


def _tuning_seconds(kernels) -> dict[str, float]:
    """Hours of recorded search per network (tuned kernels with ``tuning_seconds``)."""
    if kernels is None or kernels.empty:
        return {}
    t = kernels[(kernels["tuning"] == "tuned") & kernels["tuning_seconds"].notna()
                & (kernels["network"] != "-")]
    return {n: float(v) / 3600 for n, v in t.groupby("network")["tuning_seconds"].sum().items()}


# ---- building the report -------------------------------------------------------------------
def build_report(device: str, store: Path | None, out_dir: Path) -> Report:
    """Compute everything and write the plots into ``out_dir``."""
    from dlas_predict.space.devices import get_device
    from dlas_predict.errors import DlasError

    get_device(device, with_target=False)
    corpus = A.open_corpus(device, store)
    path, dev = corpus.path, corpus.device
    kernels = A.kernel_frame(path, dev)
    try:
        net = A.network_frame(path, dev)
    except DlasError:
        net = None
    from dlas_predict.recommend.accuracy import shipped_curves

    curves = shipped_curves() or None  # accuracy does not depend on the device
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: list[tuple[str, str, Path]] = []
    unique = A.unique_kernels(kernels)
    sub = P.plot_subtitle(unique, " (unique kernels)", corpus)
    P.plot_roofline(unique, dev, out_dir / "roofline.png", "compression", sub)
    plots.append(("Roofline", f"Every kernel measurement of {dev.name} at its arithmetic "
                  f"intensity and achieved GFLOP/s, under the device's roofs ({dev.source}).",
                  out_dir / "roofline.png"))
    if net is not None and len(net):
        b, s = A.boxplot_stats(net, "speedup", "compression", "network")
        P.plot_boxplot(b, s, out_dir / "speedup_by_compression.png",
                       P.plot_subtitle(net, corpus=corpus))
        plots.append(("Speedup of each compression", "Whole-network speedup over the dense "
                      "float32 configuration with the same algorithm, across networks, "
                      "algorithms and ratios.", out_dir / "speedup_by_compression.png"))
        h = A.heatmap(net, "algorithm", "compression", "speedup", "network")
        P.plot_heatmap(h, out_dir / "heatmap_algorithm_compression.png",
                       P.plot_subtitle(net, corpus=corpus))
        plots.append(("Algorithm × compression", "Median whole-network speedup over dense "
                      "for each algorithm and compression.",
                      out_dir / "heatmap_algorithm_compression.png"))
    gen = kernels[kernels["family"] == "generated"]
    if len(gen) and gen["net_kernels"].nunique() > 1 and gen["net_input"].nunique() > 1:
        h = A.heatmap(gen, "net_kernels", "net_input", "gflops")
        P.plot_heatmap(h, out_dir / "heatmap_generated.png", P.plot_subtitle(gen, corpus=corpus))
        plots.append(("Generated sweep (ParaDnn-style)", "Median achieved GFLOP/s of the "
                      "generated networks' conv kernels by filters (width) and input size.",
                      out_dir / "heatmap_generated.png"))
    params = [p for p in ("C", "K", "H", "R", "stride", "depthwise", "algorithm",
                          "compression", "sparsity") if unique[p].nunique() > 1]
    if params:
        r = A.regression(unique, "log_latency", params)
        P.plot_regression(r, out_dir / "regression.png", sub)
        plots.append(("Regression", f"Standardised coefficients of an OLS fit of log latency "
                      f"on the layer shape and configuration (R² = {r.r2:.2f}).",
                      out_dir / "regression.png"))
    b, s = A.boxplot_stats(unique, "spread", "algorithm")
    P.plot_boxplot(b, s, out_dir / "spread_by_algorithm.png", sub)
    plots.append(("Run-to-run spread", "Inter-quartile range over the median of each "
                  "kernel's timed runs, by algorithm.", out_dir / "spread_by_algorithm.png"))
    t3, t4, t6 = summary_tables(net)
    counts = {"kernel_measurements": int(len(unique)),
              "networks": int(net["network"].nunique()) if net is not None else 0,
              "network_configurations": int(len(net)) if net is not None else 0,
              "whole_network_latencies": int((net["latency_source"] == "whole network").sum())
              if net is not None else 0,
              "networks_by_family": _family_sizes(net),
              "sources": unique["source"].value_counts().to_dict(),
              "tunings": unique["tuning"].value_counts().to_dict()}
    return Report(dev, path, counts, t3, t4, t6, ideal_shares(net),
                  observations(net, kernels, curves, dev), plots,
                  backend_table(net, path, dev), corpus.describe(), corpus.this_machine,
                  family_observations(net, kernels, dev))


