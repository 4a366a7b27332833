"""Tuned against untuned: what auto-scheduling buys on this corpus, and what it costs.

For every kernel measured both untuned (hand schedule, default knobs) and tuned (MetaSchedule
for dense kernels, the knob search for CSR kernels) on the same layer and configuration, it
prints the tuned-vs-untuned speedup per algorithm and compression, the search time, and
whether tuning changes the fastest algorithm (the study's observation XI) per layer and per
network (conv-kernel sums over the layers that have both).

    .venv/bin/python benchmarks/bench_tuning.py --store scratch/local-cifar.sqlite [--json]

Every figure is a measurement from the store; nothing is predicted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dlas_predict.corpus.store import CorpusStore  # noqa: E402
from dlas_predict.render import format_table  # noqa: E402


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def pairs(store: Path, device: str = "local") -> list[dict]:
    """One row per kernel measured both ways: untuned and tuned medians, search cost."""
    with CorpusStore(store, must_exist=True) as db:
        rows = list(db.rows("error IS NULL AND device = ?", (device,)))
    untuned, tuned = {}, {}
    for r in rows:
        if r["verified"] not in (1, True, None):
            continue
        key = (r["conv"], r["algorithm"], r["compression"], round(r["ratio"] or 0.0, 3))
        if r["tuning"] == "tuned" and r["tuner"]:
            tuned[key] = r
        elif r["tuning"] == "untuned":
            untuned[key] = r
    out = []
    for key, t in tuned.items():
        u = untuned.get(key)
        if u is None or u["noisy"] or t["noisy"]:  # a spread run compares nothing
            continue
        out.append({"conv": key[0], "algorithm": key[1], "compression": key[2],
                    "ratio": key[3], "untuned_s": u["median_s"], "tuned_s": t["median_s"],
                    "speedup": u["median_s"] / t["median_s"], "tuner": t["tuner"],
                    "trials": t["trials"], "budget": json.loads(t["knobs"]).get("budget"),
                    "tuning_s": t["tuning_seconds"]})
    return out


def by_group(ps: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for p in ps:
        groups[(p["algorithm"], p["compression"], p["tuner"])].append(p)
    table = []
    for (alg, comp, tuner), g in sorted(groups.items()):
        sp = [p["speedup"] for p in g]
        table.append({"algorithm": alg, "compression": comp, "tuner": tuner, "kernels": len(g),
                      "speedup geomean": round(_geomean(sp), 3),
                      "median": round(statistics.median(sp), 3),
                      "min": round(min(sp), 3), "max": round(max(sp), 3),
                      "faster when tuned": f"{sum(s > 1 for s in sp)}/{len(sp)}",
                      "mean trials": round(statistics.mean(p["trials"] for p in g), 1),
                      "search s/kernel": round(statistics.mean(p["tuning_s"] for p in g), 1)})
    return table


def winner_changes(ps: list[dict]) -> dict:
    """Observation XI: per (layer, compression) with all algorithms measured both ways,
    is the fastest algorithm the same untuned and tuned?"""
    cells = defaultdict(dict)
    for p in ps:
        cells[(p["conv"], p["compression"], p["ratio"])][p["algorithm"]] = p
    changed, total, examples = 0, 0, []
    for (conv, comp, ratio), algs in sorted(cells.items()):
        if len(algs) < 3:
            continue
        total += 1
        before = min(algs, key=lambda a: algs[a]["untuned_s"])
        after = min(algs, key=lambda a: algs[a]["tuned_s"])
        if before != after:
            changed += 1
            examples.append(f"{conv} {comp}: {before} → {after}")
    return {"layers": total, "changed": changed, "examples": examples[:8]}


def network_winners(store: Path, ps: list[dict]) -> list[dict]:
    """Per network and compression, the conv-kernel sum of each algorithm untuned and tuned
    over the layers measured both ways; which algorithm is fastest in each."""
    index = {(p["conv"], p["algorithm"], p["compression"], p["ratio"]): p for p in ps}
    with CorpusStore(store, must_exist=True) as db:
        configs = db.network_configs()
    nets = defaultdict(list)
    for c in configs:
        nets[(c["network"], c["config"], c["compression"])].append(
            (c["conv"], round(c["ratio"] or 0.0, 3)))
    out = []
    for (net, config, comp), convs in sorted(nets.items()):
        sums = {}
        for alg in ("direct", "gemm", "spatial_pack"):
            got = [index.get((conv, alg, comp, ratio)) for conv, ratio in convs]
            if all(got):
                sums[alg] = (sum(g["untuned_s"] for g in got), sum(g["tuned_s"] for g in got),
                             sum(g["tuning_s"] for g in {id(g): g for g in got}.values()))
        if len(sums) < 3:
            continue
        bu = min(sums, key=lambda a: sums[a][0])
        bt = min(sums, key=lambda a: sums[a][1])
        out.append({"network": net, "config": config, "untuned best": bu,
                    "untuned ms": round(sums[bu][0] * 1e3, 3), "tuned best": bt,
                    "tuned ms": round(sums[bt][1] * 1e3, 3),
                    "best-vs-best speedup": round(sums[bu][0] / sums[bt][1], 3),
                    "search min": round(sum(s[2] for s in sums.values()) / 60, 1),
                    "winner changes": bu != bt})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, type=Path)
    ap.add_argument("--device", default="local")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ps = pairs(args.store, args.device)
    if not ps:
        print(f"no kernel of {args.device} is measured both untuned and tuned in {args.store}; "
              "collect tuned records with `dlas-predict tune --network zoo:resnet18-cifar "
              f"--store {args.store}`", file=sys.stderr)
        return 1
    result = {"pairs": len(ps), "groups": by_group(ps), "observation_XI": winner_changes(ps),
              "networks": network_winners(args.store, ps),
              "total_search_hours": sum(p["tuning_s"] for p in ps) / 3600,
              "overall_geomean_speedup": _geomean([p["speedup"] for p in ps])}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(ps)} kernels measured untuned and tuned; {result['total_search_hours']:.2f} h "
          f"of search; tuned over untuned speedup, geometric mean "
          f"{result['overall_geomean_speedup']:.3f}× (measured)")
    print(format_table(result["groups"]))
    xi = result["observation_XI"]
    print(f"\nobservation XI (tuning changes the fastest algorithm): {xi['changed']} of "
          f"{xi['layers']} layer × compression cells")
    for e in xi["examples"]:
        print(f"  {e}")
    if result["networks"]:
        print("\nper network (conv-kernel sums over the layers measured both ways):")
        print(format_table(result["networks"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
