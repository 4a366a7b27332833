"""The accuracy-cost model judged leave-one-network-out on the measured curves.

    .venv/bin/python benchmarks/bench_accuracy.py [--table datasets/accuracy/features.parquet]

Each network's points are predicted by a model (trees and interval) fitted on the other
networks only. Printed per compression (CNNs), overall, and for the matrix networks (MLPs,
encoders, ViTs, LSTMs, GRUs: most of their weights in matrix layers) per compression and
family: the share of predicted drops within
±2 points where the measured drop is at most 10 points, the mean absolute error in points,
and how often the measured drop lies in the 80 % interval; beside them the simplest
baseline, the other networks' mean normalised drop at the same compression and ratio (the
average curve). Then the budget check the tool makes without data: a point is kept when the
upper end of its interval is within the budget; how many kept points truly break it, and
how many of the points that truly keep it are kept. Last, for each trained zoo network in the
table, `recommend`'s ranking on `local` with the accuracy predicted by the model fitted
without that network (as for a user's ONNX file that matches no curve): the top 3 kept, each
checked against the network's measured curve.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def average_curve(table, groups: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Leave one network out: the other networks' mean normalised drop at the same
    compression and ratio."""
    key = table["compression"].astype(str) + "@" + table["ratio"].fillna(0).round(3).astype(str)
    key = key.to_numpy()
    out = np.full(len(y), np.nan)
    for name in np.unique(groups):
        test = groups == name
        for k in np.unique(key[test]):
            train = (~test) & (key == k)
            out[test & (key == k)] = y[train].mean() if train.any() else 0.0
    return np.clip(out, 0, 1)


def main() -> int:
    from dlas_predict.models.accuracy import held_out, read_training_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--table", type=Path,
                   default=ROOT / "datasets" / "accuracy" / "features.parquet")
    p.add_argument("--budget", type=float, default=1.0, help="accuracy budget in points")
    args = p.parse_args()
    t0 = time.time()
    table, X, y, groups = read_training_table(args.table)
    mid, low, high = held_out(X, y, groups)
    base = average_curve(table, groups, y)
    scale = (table["dense"] - table["chance"]).clip(lower=0).to_numpy() * 100
    true_pp, pred_pp, base_pp = y * scale, mid * scale, base * scale
    low_pp, high_pp = low * scale, high * scale
    comp = table["compression"].to_numpy()
    print(f"{len(np.unique(groups))} networks, {len(y)} measured points "
          f"({time.time() - t0:.0f} s)\n")
    print("| compression | points with drop ≤ 10 | within ±2 points | average curve | "
          "MAE (points) | average curve | in 80 % interval (all points) |")
    print("|---|---|---|---|---|---|---|")
    from dlas_predict.networks import zoo

    is_zoo = np.isin(groups, list(zoo.ZOO))
    matrix = table["matrix_share"].to_numpy() > 0.5
    cnn = ~matrix
    subsets = {"all": np.ones(len(y), bool), "all, zoo networks only": is_zoo,
               "CNNs": cnn, "matrix networks": matrix}
    for kind in sorted(set(comp)):
        subsets[f"matrix networks, {kind}"] = matrix & (comp == kind)
    family = table["family"].to_numpy()
    for fam in sorted(set(family[matrix])):
        subsets[f"matrix networks, {fam}"] = matrix & (family == fam)
    for name in [*sorted(set(comp)), *subsets]:
        sel = subsets[name] if name in subsets else (comp == name) & cnn
        if not sel.any():
            continue
        small = sel & (true_pp <= 10)
        within = np.abs(pred_pp - true_pp)[small] <= 2
        bwithin = np.abs(base_pp - true_pp)[small] <= 2
        cover = ((true_pp >= low_pp - 1e-9) & (true_pp <= high_pp + 1e-9))[sel]
        label = name if name in subsets else f"CNNs, {name}"
        print(f"| {label} | {small.sum()} | **{within.mean():.0%}** | {bwithin.mean():.0%} | "
              f"{np.abs(pred_pp - true_pp)[sel].mean():.1f} | "
              f"{np.abs(base_pp - true_pp)[sel].mean():.1f} | {cover.mean():.0%} |")
    kept = high_pp <= args.budget
    truly = true_pp <= args.budget
    print(f"\nbudget {args.budget:g} point(s), checked against the interval's upper end: "
          f"{kept.sum()} of {len(y)} points kept; {int((kept & ~truly).sum())} of them "
          f"break the budget ({(kept & ~truly).sum() / max(kept.sum(), 1):.0%}); "
          f"{(kept & truly).sum() / max(truly.sum(), 1):.0%} of the {truly.sum()} points "
          "that keep it are kept")
    worst = np.argsort(-(true_pp - high_pp) * kept)[:3]
    for i in worst:
        if kept[i] and true_pp[i] > args.budget:
            print(f"  broke: {groups[i]} {comp[i]}@{table['ratio'].iloc[i]}: measured "
                  f"{true_pp[i]:.1f}, interval up to {high_pp[i]:.1f}")
    zoo_top3(table, X, y, groups, args.budget)
    return 0


def zoo_top3(table, X, y, groups, budget: float) -> None:
    """Each trained zoo network's top 3 under the predicted budget check, against its
    measured curve."""
    from dlas_predict.models.accuracy import AccuracyCostModel, AccuracyPredictor
    from dlas_predict.networks import zoo
    from dlas_predict.recommend.search import recommend
    from dlas_predict.space.config import Compression

    names = [n for n in np.unique(groups) if n in zoo.ZOO]
    if not names:
        return
    print(f"\nzoo networks, accuracy predicted by a model fitted without them (budget "
          f"{budget:g} point), recommend's top 3 on local against the measured curve:\n")
    print("| network | top 3 (predicted drop up to) | measured drops | over the budget |")
    print("|---|---|---|---|")
    for name in names:
        model = AccuracyCostModel().fit(X[groups != name], y[groups != name],
                                        groups[groups != name])
        predictor = AccuracyPredictor(zoo.export(f"zoo:{name}"), model=model)
        highs: dict[tuple, float] = {}
        rows = table[table["network"] == name]
        measured = {(r.compression, round(r.ratio, 2) if r.ratio == r.ratio and r.ratio
                     else None):
                    (r.dense - r.value) * 100 for r in rows.itertuples()}
        rec = recommend(f"zoo:{name}", max_accuracy_drop=float("inf"), tuning="untuned")
        top = []
        for c in rec.candidates:
            key = (c.compression.value, None if c.ratio is None else round(c.ratio, 2))
            if c.compression is Compression.DENSE:
                high = 0.0
            else:  # as recommend checks it, once per compression and ratio
                if key not in highs:
                    highs[key] = predictor.drops([(c.compression, c.ratio)])[0].high_pp
                high = highs[key]
            if high <= budget and key in measured or c.compression is Compression.DENSE:
                top.append((c, high, measured.get(key, 0.0)))
            if len(top) == 3:
                break
        over = sum(1 for _, _, m in top if m > budget)
        print(f"| {name} | " + "; ".join(f"{c.label} ({h:.1f})" for c, h, _ in top)
              + " | " + ", ".join(f"{m:.1f}" for _, _, m in top) + f" | {over} |")


if __name__ == "__main__":
    raise SystemExit(main())
