"""Cross-device prediction: HELP's protocol, TopHub and the profiles left out, and speed.

1. **HELP's protocol** on its meta-validation devices (titanx_1, titanx_32, titanx_256,
   gold_6240): the four are left out of the model together (HELP meta-trained without
   them); each is adapted from the latencies of HELP's ten hardware-embedding
   architectures, then scored by Spearman over architectures 900-1899 with the slowest
   and fastest 10 % dropped. Printed beside: MACs.
2. **Kernel level, TopHub's devices left out one at a time**: zero-shot and 10 random
   measured workloads (5 draws), Spearman over the rest and the share of them inside the
   80 % intervals.
3. **The profiles of this CPU left out one at a time**: zero-shot (from the spec) and
   10-shot, whole networks and kernels: share within ±25 % and ±10 %.
4. **Speed**: ``predict`` of 1,000 NAS-Bench-201 networks (one call, the cached model),
   and its cold start; ``recommend zoo:resnet50`` (its own reported seconds and the
   process's wall clock, first call on a fresh DLAS_HOME and the next one).
5. **The zero-shot map** ``recommend`` uses for a device without a model: kernels of each
   CPU device predicted from the others' by the spec scaling, α and β fitted without it;
   the GPU map's fit, and each shipped GPU corpus predicted from another by it.
6. **Active learning, replayed** on each one-thread profile (its shipped corpus is the
   device; its own trained model is no reference): plans (network × configuration ×
   algorithm, conv time) within ±10 % after 10, 25 and 50 kernel measurements, the
   variance and uncertainty criteria against random choice (3 seeds), one network at a
   time.
7. **Whole networks from their layers, a device left out, targets as ONNX**: 10 shots drawn
   at random (3 draws), the rest predicted by the layer-kind model
   (``crossdev.layerwise``: the basis device that explains the shots best, scaled) and by
   a MACs fit on the same shots. HELP's devices one at a time (the basis: the other HELP
   devices on 800 cells, the shipped corpora; targets: 300 other cells, written as ONNX
   files and read back), and each machine's onnxruntime timings (another runtime; the
   basis: HELP, the other machines' corpora and their onnxruntime models). Within
   ±10 %/±25 %, Spearman, and how often the 80 % interval holds the truth. Then the same
   at 3, 5, 10 and 30 shots: one scale, two scales, a blend of two basis devices, and the
   parametrisation chosen by leave-one-out.
   And HELP's devices trained: each priced by its own costs, fitted on the 800 basis cells
   without the rows its fit misses far (a table's rows timed otherwise), on the 300 cells.

The public data is read from ``$DLAS_SHARED_DATA`` (default: the public data folder beside the checkout).

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
    model = LatentModel().fit(train)
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
    out["k"], out["noise"] = model.k_, model.noise_var_
    return out


def tophub_lodo() -> dict:
    rep = leave_one_device_out(sources.tophub_matrix(), shots=(0, 10), draws=5)
    rows = {h.device: {"targets": h.measured, "zero_shot": h.by_shots[0].spearman,
                       "ten_shot": h.by_shots[10].spearman, "macs": h.macs[10].spearman,
                       "ceiling": h.ceiling.spearman,
                       "zero_coverage": h.by_shots[0].coverage,
                       "ten_coverage": h.by_shots[10].coverage} for h in rep.devices}
    rows["mean"] = {"zero_shot": rep.mean("model", 0), "ten_shot": rep.mean("model", 10),
                    "macs": rep.mean("macs", 10), "ceiling": rep.mean("ceiling"),
                    "zero_coverage": rep.mean("model", 0, "coverage"),
                    "ten_coverage": rep.mean("model", 10, "coverage")}
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
    from dlas_predict.recommend import predict as predictor

    archs = sources.help_matrix().targets[:1000]
    targets = [f"nasbench201:{a}" for a in archs]
    t = time.perf_counter()
    predictor.predict(targets[:1], "gold_6240")
    cold = time.perf_counter() - t
    t = time.perf_counter()
    preds = predictor.predict(targets, "gold_6240")
    warm = time.perf_counter() - t
    assert len(preds) == 1000
    # a device HELP does not know: each cell is generated as ONNX (weights included, into
    # an empty cache, so every network is new) and priced by the engine
    import os
    import tempfile

    engine = {}
    fresh = sources.help_matrix().targets[5000:5201]
    old = os.environ.get("DLAS_HOME")
    shared, more = predictor.PARALLEL_FROM, sources.help_matrix().targets[5300:5500]
    with tempfile.TemporaryDirectory() as home:
        os.environ["DLAS_HOME"] = home
        try:
            predictor.predict([f"nasbench201:{fresh[0]}"], "local", "dense")
            # shared among the cores (the default), then in one process, same run; new
            # networks each time
            for label, share_from, nets in (("", shared, fresh[1:201]),
                                            (" one process", 10**9, more)):
                predictor.PARALLEL_FROM = share_from
                for config, batch in (("dense", nets[:100]), (None, nets[100:200])):
                    t = time.perf_counter()
                    out = predictor.predict([f"nasbench201:{a}" for a in batch], "local",
                                            config)
                    took = time.perf_counter() - t
                    assert len(out) == len(batch)
                    engine[(config or "open") + label] = 60 * len(batch) / took
        finally:
            predictor.PARALLEL_FROM = shared
            if old is None:
                os.environ.pop("DLAS_HOME", None)
            else:
                os.environ["DLAS_HOME"] = old
    return {"cold_start_s": cold, "seconds_for_1000": warm, "networks_per_minute": 60000 / warm,
            "engine_networks_per_minute": engine}


def recommend_speed(warm_runs: int = 5) -> dict:
    """``recommend zoo:resnet50 --top 3`` as fresh processes on a fresh DLAS_HOME: the
    first call (exports the network, parses the models) and ``warm_runs`` calls after it;
    the warm figures are the median and range."""
    import os
    import re
    import subprocess
    import tempfile

    exe = str(Path(sys.executable).with_name("dlas-predict"))
    runs = []
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DLAS_HOME": home}
        for _ in range(1 + warm_runs):
            t = time.perf_counter()
            p = subprocess.run([exe, "recommend", "zoo:resnet50", "--top", "3"], env=env,
                               capture_output=True, text=True)
            wall = time.perf_counter() - t
            m = re.search(r"; ([0-9.]+) s\n", p.stdout)
            runs.append({"wall_s": wall, "reported_s": float(m.group(1)) if m else None,
                         "rc": p.returncode})
    warm = runs[1:]
    out = {"first": runs[0]}
    if warm:
        walls = [r["wall_s"] for r in warm]
        out["warm"] = {"runs": len(warm), "wall_s": float(np.median(walls)),
                       "wall_min_s": min(walls), "wall_max_s": max(walls),
                       "reported_s": float(np.median([r["reported_s"] or np.nan
                                                      for r in warm])),
                       "rc": max(r["rc"] for r in warm)}
    return out


def zero_shot_map() -> dict:
    from dlas_predict.crossdev.transfer import fit_transfer

    f = fit_transfer("cpu")
    return {"alpha": f.alpha, "beta": f.beta, "q10": f.q10, "q90": f.q90,
            "within_25pct": f.within_25pct, "per_device": f.per_device, "pairs": f.pairs}


def gpu_maps() -> dict:
    """The GPU zero-shot map (fitted on TopHub's GPUs), and each shipped GPU corpus
    predicted from another one by it: untuned kernels both measured (same shape, algorithm,
    compression, knobs), neither GPU in the fit."""
    import pandas as pd

    from dlas_predict.crossdev.transfer import fit_transfer, zero_shot_map
    from dlas_predict.paths import CORPUS_SNAPSHOTS
    from dlas_predict.space.devices import device_names, get_device

    try:
        f = fit_transfer("gpu")
    except Exception as exc:  # noqa: BLE001 - the public data may be absent
        return {"error": str(exc)}
    out = {"alpha": f.alpha, "beta": f.beta, "q10": f.q10, "q90": f.q90,
           "within_25pct": f.within_25pct, "pairs": f.pairs, "shipped": {}}
    gpus = [n for n in device_names() if (CORPUS_SNAPSHOTS / f"{n}.parquet").is_file()
            and get_device(n, with_target=False).kind == "gpu"]
    cols = ["conv", "algorithm", "compression", "ratio", "knobs", "tuning", "median_s",
            "error"]
    frames = {}
    for n in gpus:
        df = pd.read_parquet(CORPUS_SNAPSHOTS / f"{n}.parquet", columns=cols)
        df = df[df.error.isna() & (df.tuning == "untuned")].copy()
        df["knobs"] = df.knobs.astype(str)
        frames[n] = df
    key = ["conv", "algorithm", "compression", "ratio", "knobs"]
    for r in gpus:
        for d in gpus:
            if r == d:
                continue
            m = frames[r].merge(frames[d], on=key, suffixes=("_r", "_d"))
            if len(m) < 10:
                continue
            R, D = get_device(r, with_target=False), get_device(d, with_target=False)
            zmap = zero_shot_map(D, r)
            pred = np.array([zmap.log_scale(R, D, f"{c}@{q:g}" if q else c, conv)
                             for c, q, conv in zip(m.compression, m.ratio, m.conv)])
            err = np.log(m.median_s_d / m.median_s_r).to_numpy() - pred
            out["shipped"][f"{r} -> {d}"] = {
                "kernels": len(m), "within_25pct": float(np.mean(np.abs(np.exp(err) - 1)
                                                                 <= 0.25)),
                "median_error": float(np.exp(np.median(err))),
                "coverage": float(np.mean((err >= f.q10) & (err <= f.q90)))}
    return out


def active_learning(budget: int = 50, seeds: int = 3) -> dict:
    from dlas_predict.recommend import active
    from dlas_predict.paths import CORPUS_SNAPSHOTS

    out = {}
    for dev in ("local-avx2-1t", "local-native-1t", "local-sse42-1t"):
        for net in ("resnet18-cifar", "mobilenetv2-cifar", "vgg16-cifar",
                    "mobilenetv1-cifar"):
            pool, replay = active.replay_source(CORPUS_SNAPSHOTS / f"{dev}.parquet", [net], dev)
            v = active.run(dev, pool, replay, budget, "variance")
            u = active.run(dev, pool, replay, budget, "uncertainty")
            rs = [active.run(dev, pool, replay, budget, "random", seed=i) for i in range(seeds)]
            at = (lambda c, n: c.steps[min(n, len(c.steps) - 1)].within_10pct)
            out[f"{dev} {net}"] = {
                "plans": len(pool.plans), "kernels": len(pool.kernels),
                "reference": v.reference,
                "variance": {n: at(v, n) for n in (0, 10, 25, budget)},
                "uncertainty": {n: at(u, n) for n in (0, 10, 25, budget)},
                "random": {n: float(np.mean([at(r, n) for r in rs])) for n in (0, 10, 25, budget)},
                "variance_reaches_90": v.first_reaching(0.9),
                "uncertainty_reaches_90": u.first_reaching(0.9),
                "random_reaches_90": [r.first_reaching(0.9) for r in rs]}
    return out


def _score(pred, low, high, truth) -> dict:
    from dlas_predict.crossdev.latent import spearman as rho

    err = np.abs(pred / truth - 1)
    out = {"within_10": float(np.mean(err <= 0.10)), "within_25": float(np.mean(err <= 0.25)),
           "spearman": float(rho(np.log(pred), np.log(truth)))}
    if low is not None:
        out["coverage"] = float(np.mean((truth >= low) & (truth <= high)))
    return out


#: The numbers of shots section 7 compares the parametrisations at.
SHOTS = (3, 5, 10, 30)


def _few_shot_draws(basis, X, ms, draws: int = 3, shots: int = 10, seed: int = 0,
                    parametrisation: str | None = None) -> dict:
    from dlas_predict.crossdev import layerwise as lw

    rng = np.random.default_rng(seed)
    model, macs = [], []
    for _ in range(draws):
        pick = rng.choice(len(ms), size=shots, replace=False)
        rest = np.setdiff1d(np.arange(len(ms)), pick)
        fit = lw.fit_few_shot(basis, X[pick], ms[pick], parametrisation)
        low, high = fit.predict_interval(X[rest])
        model.append(_score(fit.predict(X[rest]), low, high, ms[rest]))
        macs.append(_score(lw.macs_fit(X[pick], ms[pick])(X[rest]), None, None, ms[rest]))
    mean = lambda rows, k: float(np.mean([r[k] for r in rows]))  # noqa: E731
    return {"targets": int(len(ms)), **{k: mean(model, k) for k in model[0]},
            **{f"macs_{k}": mean(macs, k) for k in macs[0]}}


def layerwise_lodo(eval_archs: int = 300) -> dict:
    """Section 7: HELP's devices and each machine's onnxruntime timings left out."""
    import tempfile

    from dlas_predict.crossdev import layerwise as lw
    from dlas_predict.networks import nasbench201 as nb
    from dlas_predict.networks.graph import read_network

    mat = sources.help_matrix()
    train_idx = lw.help_sample(lw.HELP_SAMPLE)
    rng = np.random.default_rng(7)
    pool = np.setdiff1d(np.arange(len(mat.targets)), train_idx)
    test_idx = sorted(rng.choice(pool, size=eval_archs, replace=False).tolist())
    with tempfile.TemporaryDirectory() as tmp:
        files = nb.generate([nb.parse_arch(mat.targets[i]) for i in test_idx], Path(tmp))
        by_name = {Path(f).stem: lw.layer_terms(read_network(f)) for f in files}
    X_test = np.array([by_name[nb.parse_arch(mat.targets[i]).file_name.removesuffix(".onnx")]
                       for i in test_idx])
    helpb = lw.help_basis(indices=train_idx)
    cols = lw.corpus_columns()
    corpus = lw.corpus_basis(columns=cols) + lw.onnxruntime_basis(columns=cols)
    out: dict = {"help": {}, "onnxruntime": {}, "help_trained": {}}
    cases: dict = {"help": [], "onnxruntime": []}  # (basis, terms, ms) of each device left out
    for j, d in enumerate(mat.devices):
        own = helpb.own_fit(f"help:{d}")  # trained: its costs on the 800 basis cells
        y = mat.log_ms[test_idx, j]
        ok = np.isfinite(y)
        low, high = own.predict_interval(X_test[ok])
        out["help_trained"][d] = {"targets": int(ok.sum()), **_score(
            own.predict(X_test[ok]), low, high, np.exp(y[ok]))}
        basis = helpb.without(lambda name: name == f"help:{d}") + corpus
        out["help"][d] = _few_shot_draws(basis, X_test[ok], np.exp(y[ok]))
        cases["help"].append((basis, X_test[ok], np.exp(y[ok])))
    terms = lw.network_terms_by_name(sorted({n for names, _ in cols.values() for n in names}))
    for key, (names, ms) in cols.items():
        machine, _, backend = key.split(":")
        if backend != "onnxruntime":
            continue
        keep = [i for i, n in enumerate(names) if n in terms]
        if len(keep) < 15:
            continue
        same = (lambda k, m=machine: k.startswith(f"{m}:local")) if machine == "shipped" else \
            (lambda k, m=machine: k.startswith(f"{m}:"))
        basis = helpb + lw.corpus_basis(same, cols) + lw.onnxruntime_basis(same, cols)
        X = np.array([terms[names[i]] for i in keep])
        out["onnxruntime"][key] = _few_shot_draws(basis, X, ms[keep])
        cases["onnxruntime"].append((basis, X, ms[keep]))
    for part in ("help", "onnxruntime", "help_trained"):
        rows = list(out[part].values())
        out[part]["mean"] = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    # how many free parameters win with 3, 5, 10 and 30 shots: each parametrisation forced,
    # and chosen by leave-one-out (devices with at least 5 networks beyond the shots)
    out["shots"] = {part: {} for part in cases}
    for part, devs in cases.items():
        for shots in SHOTS:
            fit = [c for c in devs if len(c[2]) >= shots + 5]
            if not fit:
                continue
            row = {"devices": len(fit)}
            for name, p in (("chosen", None), *((q, q) for q in lw.PARAMETRISATIONS)):
                r = [_few_shot_draws(b, X, ms, shots=shots, parametrisation=p)
                     for b, X, ms in fit]
                row[name] = {k: float(np.mean([x[k] for x in r]))
                             for k in ("within_10", "within_25", "macs_within_10",
                                       "macs_within_25")}
            out["shots"][part][shots] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sections", default="1,2,3,4,5,6,7",
                    help="the sections to run, comma-separated (default: all seven)")
    args = ap.parse_args()
    try:
        only = {int(x) for x in args.sections.split(",")}
    except ValueError:
        only = set()
    if not only or not only <= set(range(1, 8)):
        print(f"Error: --sections takes numbers 1-7, comma-separated; got {args.sections!r}",
              file=sys.stderr)
        return 1
    res = {}
    t0 = time.perf_counter()
    if 1 in only:
        res["help"] = h = help_protocol()
        print("1. HELP's protocol (10 shots, Spearman over archs 900-1899, tails dropped)")
        for d in HELP_VAL:
            print(f"   {d:12s} model {h[d]['spearman']:.3f}   MACs {h[d]['macs_spearman']:.3f}")
        print(f"   mean         model {h['mean']['spearman']:.3f}   MACs "
              f"{h['mean']['macs_spearman']:.3f}   (k={h['k']}, chosen on the training devices)")
    if 2 in only:
        res["tophub"] = th = tophub_lodo()
        print("2. TopHub kernels, each device left out (Spearman over its other workloads; "
              "the share of them inside the 80 % intervals)")
        for d, r in th.items():
            print(f"   {d:12s} zero-shot {r['zero_shot']:.3f}  10-shot {r['ten_shot']:.3f}  "
                  f"MACs {r['macs']:.3f}  ceiling {r['ceiling']:.3f}  80% interval holds "
                  f"{r['zero_coverage']:.0%} / {r['ten_coverage']:.0%}"
                  + (f"  ({r['targets']} workloads)" if "targets" in r else ""))
    if 3 in only:
        for level in ("network", "kernel"):
            res[f"profiles_{level}"] = pr = profiles_lodo(level)
            print(f"3. profiles left out, {level} level")
            for d, r in pr.items():
                print(f"   {d:16s} n={r['targets']:5d} zero-shot ({r['zero_shot_from']}): "
                      f"±25% {r['zero_within_25']:.0%} ±10% {r['zero_within_10']:.0%} "
                      f"Spearman {r['zero_spearman']:.3f} | 10-shot: ±10% {r['ten_within_10']:.0%}"
                      f" ±25% {r['ten_within_25']:.0%} Spearman {r['ten_spearman']:.3f} | ceiling "
                      f"±10% {r['ceiling_within_10']:.0%}")
    if 4 in only:
        res["predict"] = sp = predict_speed()
        print(f"4. predict: 1,000 NAS-Bench-201 networks in {sp['seconds_for_1000']:.3f} s = "
              f"{sp['networks_per_minute']:,.0f} networks/min "
              f"(first call {sp['cold_start_s']:.1f} s); "
              "through the engine on local (new networks): "
              + ", ".join(f"{k}: {v:,.0f} networks/min"
                          for k, v in sp["engine_networks_per_minute"].items()))
        res["recommend"] = rs = recommend_speed()
        first, warm = rs["first"], rs.get("warm")
        print(f"   recommend zoo:resnet50: first call {first['reported_s']} s reported, "
              f"{first['wall_s']:.1f} s wall (rc {first['rc']})" + (
                  f"; {warm['runs']} calls after it: median {warm['reported_s']:.2f} s reported, "
                  f"{warm['wall_s']:.2f} s wall ({warm['wall_min_s']:.2f}-{warm['wall_max_s']:.2f};"
                  f" rc {warm['rc']})" if warm else ""))
    if 5 in only:
        res["zero_shot_map"] = zm = zero_shot_map()
        print(f"5. zero-shot map (CPU kernels): α={zm['alpha']:.2f} β={zm['beta']:.2f}, "
              f"held-out 80% interval ×{np.exp(zm['q10']):.2f}–×{np.exp(zm['q90']):.2f}, "
              f"{zm['within_25pct']:.0%} within ±25% ({zm['pairs']} kernel pairs)")
        for d, v in zm["per_device"].items():
            print(f"   {d:16s} within ±25% {v['within_25pct']:.0%}, median error "
                  f"×{np.exp(v['median_log_error']):.2f}")
        res["gpu_map"] = gm = gpu_maps()
        if "error" in gm:
            print(f"   GPU map: not fitted ({gm['error']})")
        else:
            print(f"   GPU map: α={gm['alpha']:.2f} β={gm['beta']:.2f}, held-out 80% interval "
                  f"×{np.exp(gm['q10']):.2f}–×{np.exp(gm['q90']):.2f}, "
                  f"{gm['within_25pct']:.0%} within ±25% ({gm['pairs']} kernel pairs)")
            for k, v in gm["shipped"].items():
                print(f"   {k:16s} {v['kernels']} kernels: within ±25% {v['within_25pct']:.0%},"
                      f" median error ×{v['median_error']:.2f}, interval holds "
                      f"{v['coverage']:.0%}")
    if 6 in only:
        res["active_learning"] = al = active_learning()
        print("6. active learning replayed (plans within ±10% after 0/10/25/50 measurements)")
        for k, v in al.items():
            fmt = (lambda d: "/".join(f"{d[n]:.0%}" for n in d))
            print(f"   {k:34s} variance {fmt(v['variance'])}  uncertainty {fmt(v['uncertainty'])}"
                  f"  random {fmt(v['random'])}  90% after: {v['variance_reaches_90']} / "
                  f"{v['uncertainty_reaches_90']} / {v['random_reaches_90']}")
        wins = sum(v["variance"][50] > v["random"][50] for v in al.values())
        print(f"   variance beats random after 50 on {wins} of {len(al)}; mean after 50: variance "
              f"{np.mean([v['variance'][50] for v in al.values()]):.0%}, uncertainty "
              f"{np.mean([v['uncertainty'][50] for v in al.values()]):.0%}, random "
              f"{np.mean([v['random'][50] for v in al.values()]):.0%}")
    if 7 in only:
        res["layerwise"] = lw = layerwise_lodo()
        line = ("   {:34s} n={:4d} ±10% {:4.0%} ±25% {:4.0%} Spearman {:.3f} 80% interval holds "
                "{:4.0%} | MACs fit: ±10% {:4.0%} ±25% {:4.0%} Spearman {:.3f}")
        for part, title in (("help", "HELP's devices (NAS-Bench-201 cells as ONNX)"),
                            ("onnxruntime", "onnxruntime timings of each machine")):
            print(f"7. whole networks, 10 shots, the rest predicted: {title}")
            for d, r in lw[part].items():
                print(line.format(d, int(r["targets"]), r["within_10"], r["within_25"],
                                  r["spearman"], r["coverage"], r["macs_within_10"],
                                  r["macs_within_25"], r["macs_spearman"]))
        print("7. HELP's devices trained (their costs on the 800 basis cells), 300 other cells")
        for d, r in lw["help_trained"].items():
            print(f"   {d:34s} ±10% {r['within_10']:4.0%} ±25% {r['within_25']:4.0%} Spearman "
                  f"{r['spearman']:.3f} 80% interval holds {r['coverage']:4.0%}")
        print("7. shots against free parameters (mean ±10% / ±25%; MACs fit on the same shots)")
        for part, by in lw["shots"].items():
            for shots, row in by.items():
                print(f"   {part:12s} {shots:2d} shots, {row['devices']:2d} devices: " + ", ".join(
                    f"{k} {v['within_10']:.0%} / {v['within_25']:.0%}" for k, v in row.items()
                    if k != "devices") + f" | MACs fit {row['chosen']['macs_within_10']:.0%} / "
                    f"{row['chosen']['macs_within_25']:.0%}")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
