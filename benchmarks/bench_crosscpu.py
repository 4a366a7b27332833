"""Zero-shot on a CPU left out: one cost model of every measured CPU, against today's map.

Each CPU whose kernels the project measured (its shipped ``local`` corpora: this repository's
``datasets/corpus/local.parquet`` and ``datasets/corpus/machines/FP/local.parquet``, with the
reference machine's profiles) is left out in turn. Its untuned kernels are predicted, with
no measurement of it, by:

- **cross-CPU**: one layer model (the same LightGBM as every device's) trained on the
  kernels of every other CPU, each row with the features of the machine that measured it
  (measured roofs, cores, vector width, VNNI); the CPU left out is described by its own
  measured roofs (``devices --measure-peaks``);
- **map**: today's zero-shot path, a model trained on one other CPU (the reference), its
  predictions mapped by the spec ratio (α, β of ``transfer.fit_transfer``);
- **MACs**: log latency on log MACs per compression, fitted on the other CPUs' kernels.

Printed per CPU left out: within ±10 % and ±25 %, MAPE and Spearman of each.

Then **onnxruntime calibrated on a CPU left out**: each CPU's onnxruntime runs priced by
another CPU's shipped onnxruntime model, calibrated as ``calibrate`` does on a calibration
set of that CPU's own runs (the four zoo networks of the calibration set, four generated
CNNs, a transformer, a recurrent network and an MLP drawn at random; 30 draws), and scored
on its other networks' runs: offsets by run mode alone, by network family and mode
(:func:`~dlas_predict.crossdev.offsets.shrunk_offsets`), and by family and mode after
the two scales of per-op costs and the rest
(:func:`~dlas_predict.recommend.calibrate.onnxruntime_scales`).

    .venv/bin/python benchmarks/bench_crosscpu.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def machines() -> dict[str, list[tuple[Path, str]]]:
    """CPU fingerprint → its corpus snapshots and the device name of each (the reference
    machine's profiles are its own CPU)."""
    from dlas_predict.paths import CORPUS_SNAPSHOTS, MACHINES

    out: dict[str, list[tuple[Path, str]]] = {}
    ref = CORPUS_SNAPSHOTS / "local.parquet"
    import pandas as pd

    fp = str(pd.read_parquet(ref, columns=["fingerprint"])["fingerprint"].iloc[0])
    out[fp] = [(ref, "local")] + [(p, p.stem) for p in sorted(CORPUS_SNAPSHOTS.glob(
        "local-*.parquet")) if "." not in p.stem]
    for d in sorted((CORPUS_SNAPSHOTS / MACHINES).iterdir()):
        if (d / "local.parquet").is_file():
            out[d.name] = [(d / "local.parquet", "local")]
    return out


def corpus_store(snapshot: Path, tmp: Path) -> Path:
    """A SQLite store of ``snapshot`` under ``tmp`` (imported once)."""
    from dlas_predict.corpus.store import CorpusStore

    store = tmp / f"{snapshot.parent.name}-{snapshot.stem}.sqlite"
    if not store.is_file():
        with CorpusStore(store) as db:
            db.import_snapshot(snapshot)
    return store


def corpus(snapshot: Path, device: str, tmp: Path):
    from dlas_predict.models.evaluation import load_corpus

    return load_corpus(corpus_store(snapshot, tmp), device)


def score(pred: np.ndarray, meas: np.ndarray) -> dict:
    from scipy.stats import spearmanr

    err = pred / meas - 1
    return {"within_10pct": float(np.mean(np.abs(err) <= 0.10)),
            "within_25pct": float(np.mean(np.abs(err) <= 0.25)),
            "mape": float(np.mean(np.abs(err))),
            "spearman": float(spearmanr(pred, meas).statistic)}


def main() -> int:
    from dlas_predict.crossdev.transfer import DeviceMap, fit_transfer
    from dlas_predict.models.costmodel import LayerCostModel
    from dlas_predict.models.features import FEATURE_NAMES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="crosscpu-"))
    cpus = machines()
    data = {fp: [corpus(s, d, tmp) for s, d in parts] for fp, parts in cpus.items()}
    fit = fit_transfer("cpu")
    results = {}
    for held, parts in data.items():
        test = parts[0]  # the CPU's own local corpus (not its profiles)
        untuned = np.array([k.tuning == "untuned" for k in test.keys])
        X_test, y_test = test.X[untuned], test.seconds[untuned]
        train = [c for fp, cs in data.items() if fp != held for c in cs]
        X = np.vstack([c.X[c.learned()] for c in train])
        y = np.concatenate([c.seconds[c.learned()] for c in train])
        cross = LayerCostModel(seed=0).fit(X, y).predict(X_test)
        # the same, learning each kernel's time over its roofline time on its machine
        roof = FEATURE_NAMES.index("log_roofline_s")
        rel = LayerCostModel(seed=0).fit(X, y / np.exp(X[:, roof])).predict(X_test) \
            * np.exp(X_test[:, roof])
        # today's map: the reference CPU's own model, mapped by spec
        ref_fp = next(fp for fp in data if fp != held)
        ref = data[ref_fp][0]
        ref_model = LayerCostModel(seed=0).fit(ref.X[ref.learned()], ref.seconds[ref.learned()])
        test_keys = [k for k, u in zip(test.keys, untuned) if u]
        X_as_ref = _features_as(test_keys, ref.device)
        m = DeviceMap(test.device.name, "ref", "zero-shot", fit.alpha, fit.beta, fit.q10,
                      fit.q90)
        scale = np.array([m.log_scale(ref.device, test.device,
                                      f"{k.compression}", k.conv) for k in test_keys])
        mapped = np.exp(np.log(ref_model.predict(X_as_ref)) + scale)
        # MACs fit per compression on the other CPUs
        macs = _macs_fit(train, test_keys)
        results[held] = {
            "cpu": test.device.description, "kernels": int(untuned.sum()),
            "train_kernels": int(len(y)), "reference": ref.device.description,
            "cross_cpu": score(cross, y_test), "cross_cpu_roofline": score(rel, y_test),
            "map": score(mapped, y_test),
            "macs": score(macs, y_test)}
        r = results[held]
        print(f"\nleft out: {r['cpu']} ({r['kernels']} untuned kernels); trained on "
              f"{r['train_kernels']} kernels of the others; map reference: {r['reference']}")
        print(f"{'model':18s} {'±10%':>6s} {'±25%':>6s} {'MAPE':>7s} {'Spearman':>9s}")
        for name in ("cross_cpu", "cross_cpu_roofline", "map", "macs"):
            s = r[name]
            print(f"{name:18s} {s['within_10pct']:6.1%} {s['within_25pct']:6.1%} "
                  f"{s['mape']:7.1%} {s['spearman']:9.3f}")
    results["onnxruntime_calibrated"] = onnxruntime_calibrated(cpus, tmp)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


#: The zoo networks of ``calibrate``'s calibration set that every shipped corpus holds.
CALIBRATION_ZOO = ("resnet18-cifar", "mobilenetv2-cifar", "mobilenetv1-cifar", "vgg16-cifar")
#: Generated networks drawn into a calibration set, by family prefix.
DRAWN = (("cnn", 4), ("transformer", 1), ("rnn", 1), ("fc", 1))


def onnxruntime_calibrated(cpus: dict, tmp: Path, draws: int = 30) -> dict:
    """Each CPU's onnxruntime runs, another CPU's model calibrated on some of them (module
    doc); within ±10 % of the rest, mean over the draws, per method."""
    from dlas_predict.crossdev.offsets import shrunk_offsets
    from dlas_predict.models.ortmodel import (TERMS, OrtLatencyModel, fitted_modes,
                                              nchwc_block, training_rows)
    from dlas_predict.paths import MODELS_STORE
    from dlas_predict.recommend.calibrate import NetworkRow, fit_onnxruntime

    ref_fp = next(iter(cpus))
    models = {fp: MODELS_STORE / "local" if fp == ref_fp else
              MODELS_STORE / "machines" / fp / "local" for fp in cpus}
    models = {fp: OrtLatencyModel.load(d) for fp, d in models.items()
              if (d / "onnxruntime.json").is_file()}
    out = {}
    print("\nonnxruntime calibrated on a CPU left out: within ±10 % of its other networks' "
          f"runs (mean of {draws} calibration sets)")
    print(f"{'left out':18s} {'model of':18s} {'runs':>5s} {'mode':>6s} {'family':>7s} "
          f"{'+scales':>8s}  (CNNs: mode, family, +scales)")
    for held, parts in cpus.items():
        snapshot, device = parts[0]
        dev = corpus(snapshot, device, tmp).device
        # a machine's onnxruntime runs: in its snapshot, or in one of their own beside it
        apart = snapshot.with_name(f"{snapshot.stem}.onnxruntime.parquet")
        if apart.is_file():
            snapshot = apart
            corpus_store(snapshot, tmp)
        store = tmp / f"{snapshot.parent.name}-{snapshot.stem}.sqlite"
        X, y, nets = training_rows(store, device, nchwc_block(dev))
        if not len(y):
            continue
        nets = np.array(nets)
        T = np.asarray(X.terms, float)
        fm = fitted_modes(T, X.modes, X.recurrent)
        other = T[:, TERMS.index("other_macs")] > 0
        family = np.array(["recurrent" if f.startswith("recurrent") else
                           ("transformer" if o else "mlp") if f.startswith("matrix") else ""
                           for f, o in zip(fm, other)])
        cnn = np.char.startswith(nets.astype(str), "cnn_")
        by_l2 = {0: X}  # the runs' terms as a model counts them: its spill over its L2
        for ref, model in models.items():
            if ref == held:
                continue
            if model.l2_bytes not in by_l2:
                by_l2[model.l2_bytes] = training_rows(store, device, nchwc_block(dev),
                                                      model.l2_bytes)[0]
            Xm = by_l2[model.l2_bytes]
            pred = model.predict(Xm)
            fixed = pred * model.fixed_share(Xm)
            rows = [NetworkRow(n, "", "onnxruntime", md, p * 1e3, t * 1e3, f, fx * 1e3)
                    for n, md, p, t, f, fx in zip(nets, X.modes, pred, y, family, fixed)]
            scores: dict[str, list] = {k: [] for k in ("mode", "family", "scales",
                                                       "mode_cnn", "family_cnn",
                                                       "scales_cnn")}
            for seed in range(draws):
                rng = np.random.default_rng(seed)
                pick = [n for n in CALIBRATION_ZOO if n in set(nets)]
                for prefix, k in DRAWN:
                    pool = sorted({n for n in nets if n.startswith(prefix + "_")})
                    pick += list(rng.choice(pool, min(k, len(pool)), replace=False)) \
                        if pool else []
                cal = np.isin(nets, pick)
                rs = [r for r, c in zip(rows, cal) if c]
                res = np.log([r.measured_ms / r.predicted_ms for r in rs])
                groups = [r.group for r in rs]
                by_mode, _ = shrunk_offsets(res, groups, with_loo=False)
                by_family, _ = shrunk_offsets(res, groups, families=[r.family for r in rs],
                                              networks=[r.network for r in rs],
                                              with_loo=False)
                scales, scaled = fit_onnxruntime(rs)
                for name, table, fam, sc in (("mode", by_mode, "", (1.0, 1.0)),
                                             ("family", by_family, None, (1.0, 1.0)),
                                             ("scales", scaled, None, scales)):
                    p = np.array([r.calibrated_ms(sc, table, fam) for r in rows])
                    ok = np.abs(p / (y * 1e3) - 1) <= 0.10
                    scores[name].append(float(ok[~cal].mean()))
                    scores[name + "_cnn"].append(float(ok[~cal & cnn].mean()))
            mean = {k: float(np.mean(v)) for k, v in scores.items()}
            out[f"{held}<-{ref}"] = {"runs": int(len(y)), **mean}
            print(f"{held:18s} {ref:18s} {len(y):5d} {mean['mode']:6.0%} {mean['family']:7.0%} "
                  f"{mean['scales']:8.0%}  ({mean['mode_cnn']:.0%}, {mean['family_cnn']:.0%}, "
                  f"{mean['scales_cnn']:.0%})")
    return out


def _features_as(keys, device) -> np.ndarray:
    from dlas_predict.models.features import features
    from dlas_predict.corpus.kernels import KernelConfig
    from dlas_predict.space.config import Algorithm, Compression, ConvSpec, Tuning

    return np.array([features(KernelConfig(ConvSpec.parse(k.conv), Algorithm.parse(k.algorithm),
                                           Compression.parse(k.compression), float(k.ratio),
                                           Tuning.parse(k.tuning)), device) for k in keys])


def _macs_fit(train, keys) -> np.ndarray:
    from dlas_predict.space.config import ConvSpec

    rows: dict[str, list[tuple[float, float]]] = {}
    for c in train:
        for k, s in zip(c.keys, c.seconds):
            if k.tuning == "untuned":
                rows.setdefault(k.compression, []).append(
                    (np.log(ConvSpec.parse(k.conv).macs), np.log(s)))
    fits = {comp: np.polyfit(*np.array(v).T, 1) for comp, v in rows.items()}
    return np.array([np.exp(np.polyval(fits[k.compression], np.log(ConvSpec.parse(k.conv).macs)))
                     for k in keys])


if __name__ == "__main__":
    sys.exit(main())
