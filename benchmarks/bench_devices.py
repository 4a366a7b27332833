"""Cross-device prediction: HELP's protocol, TopHub and the profiles left out, and speed.

1. **HELP's protocol** on its meta-validation devices (titanx_1, titanx_32, titanx_256,
   gold_6240): the four are left out of the model together (HELP meta-trained without
   them); each is adapted from the latencies of HELP's ten hardware-embedding
   architectures, then scored by Spearman over architectures 900-1899 with the slowest
   and fastest 10 % dropped. Printed beside: MACs.
2. **Kernel level, TopHub's devices left out one at a time**: 10 random measured
   workloads (5 draws), Spearman over the rest.
3. **The profiles of this CPU left out one at a time**: zero-shot (from the spec) and
   10-shot, whole networks and kernels: share within ±25 % and ±10 %.
4. **Speed**: ``predict`` of 1,000 NAS-Bench-201 networks (one call, the cached model),
   and its cold start.

The public data is read from ``$DLAS_SHARED_DATA`` (default ``../shared/data``).

    .venv/bin/python benchmarks/bench_devices.py [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlas_predict.crossdev import sources  # noqa: E402
from dlas_predict.crossdev.evaluate import leave_one_device_out  # noqa: E402
from dlas_predict.crossdev.latent import LatentModel, spearman  # noqa: E402

HELP_VAL = ("titanx_1", "titanx_32", "titanx_256", "gold_6240")
HELP_SHOTS = (11982, 431, 55, 9, 14451, 8636, 9881, 13479, 6196, 1462)


def help_protocol() -> dict:
    mat = sources.help_matrix()
    train = mat
    for d in HELP_VAL:
        train = train.without(d)
    model = LatentModel.fit(train)
    ev = np.arange(900, 1900)
    out = {}
    for d in HELP_VAL:
        y = mat.column(d)
        post = model.adapt(np.array(HELP_SHOTS), y[list(HELP_SHOTS)])
        pred = model.predict(post, ev)[0]
        yy = y[ev]
        lo, hi = np.quantile(yy, [0.1, 0.9])
        keep = (yy >= lo) & (yy <= hi)
        out[d] = {"spearman": spearman(pred[keep], yy[keep]),
                  "macs_spearman": spearman(mat.macs[ev][keep], yy[keep])}
    out["mean"] = {k: float(np.mean([out[d][k] for d in HELP_VAL]))
                   for k in ("spearman", "macs_spearman")}
    out["k"], out["noise"] = model.k, model.noise_var
    return out


def tophub_lodo() -> dict:
    rep = leave_one_device_out(sources.tophub_matrix(), shots=(0, 10), draws=5)
    rows = {h.device: {"targets": h.measured, "zero_shot": h.by_shots[0].spearman,
                       "ten_shot": h.by_shots[10].spearman, "macs": h.macs[10].spearman,
                       "ceiling": h.ceiling.spearman} for h in rep.devices}
    rows["mean"] = {"zero_shot": rep.mean("model", 0), "ten_shot": rep.mean("model", 10),
                    "macs": rep.mean("macs", 10), "ceiling": rep.mean("ceiling")}
    return rows


def profiles_lodo(level: str) -> dict:
    rep = leave_one_device_out(sources.profiles_matrix(level), shots=(0, 10), draws=5)
    rows = {}
    for h in rep.devices:
        z, t = h.by_shots[0], h.by_shots[10]
        rows[h.device] = {"targets": h.measured, "zero_shot_from": h.zero_shot_from,
                          "zero_within_25": z.within_25pct, "zero_within_10": z.within_10pct,
                          "zero_spearman": z.spearman, "ten_within_10": t.within_10pct,
                          "ten_within_25": t.within_25pct, "ten_spearman": t.spearman,
                          "ceiling_within_10": h.ceiling.within_10pct}
    return rows


def predict_speed() -> dict:
    from dlas_predict.crossdev import predictor

    archs = sources.help_matrix().targets[:1000]
    targets = [f"nasbench201:{a}" for a in archs]
    t = time.perf_counter()
    predictor.predict(targets[:1], "gold_6240")
    cold = time.perf_counter() - t
    t = time.perf_counter()
    preds = predictor.predict(targets, "gold_6240")
    warm = time.perf_counter() - t
    assert len(preds) == 1000
    return {"cold_start_s": cold, "seconds_for_1000": warm, "networks_per_minute": 60000 / warm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = {}
    t0 = time.perf_counter()
    res["help"] = h = help_protocol()
    print("1. HELP's protocol (10 shots, Spearman over archs 900-1899, tails dropped)")
    for d in HELP_VAL:
        print(f"   {d:12s} model {h[d]['spearman']:.3f}   MACs {h[d]['macs_spearman']:.3f}")
    print(f"   mean         model {h['mean']['spearman']:.3f}   MACs "
          f"{h['mean']['macs_spearman']:.3f}   (k={h['k']}, chosen on the training devices)")
    res["tophub"] = th = tophub_lodo()
    print("2. TopHub kernels, each device left out (Spearman over its other workloads)")
    for d, r in th.items():
        print(f"   {d:12s} zero-shot {r['zero_shot']:.3f}  10-shot {r['ten_shot']:.3f}  "
              f"MACs {r['macs']:.3f}  ceiling {r['ceiling']:.3f}"
              + (f"  ({r['targets']} workloads)" if "targets" in r else ""))
    for level in ("network", "kernel"):
        res[f"profiles_{level}"] = pr = profiles_lodo(level)
        print(f"3. profiles left out, {level} level")
        for d, r in pr.items():
            print(f"   {d:16s} n={r['targets']:5d} zero-shot ({r['zero_shot_from']}): "
                  f"±25% {r['zero_within_25']:.0%} ±10% {r['zero_within_10']:.0%} "
                  f"Spearman {r['zero_spearman']:.3f} | 10-shot: ±10% {r['ten_within_10']:.0%}"
                  f" ±25% {r['ten_within_25']:.0%} Spearman {r['ten_spearman']:.3f} | ceiling "
                  f"±10% {r['ceiling_within_10']:.0%}")
    res["predict"] = sp = predict_speed()
    print(f"4. predict: 1,000 NAS-Bench-201 networks in {sp['seconds_for_1000']:.3f} s = "
          f"{sp['networks_per_minute']:,.0f} networks/min (first call {sp['cold_start_s']:.1f} s)")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
