"""``calibrate`` proved on networks of families no corpus holds: zero-shot against calibrated.

For each network (generated CNNs of shapes the corpus lacks, one per block style, and
a transformer, a recurrent network and an MLP of unseen shapes, as ``bench_unseen.py``;
``--no-matrix``: the CNNs only), ``recommend NET --tuning untuned --validate K`` runs with the
calibrated ``local`` of the last ``--calibrated-home`` (a DLAS_HOME where ``dlas-predict
calibrate`` ran): its top K candidates of both backends are built and timed here. The same
candidates are priced zero-shot (a DLAS_HOME without the calibration; and one with only
this machine's roofs, as the calibration measured them), by every calibrated home given
(e.g. calibrations of 1, 3 and 5 minutes) and by a MACs fit (log latency on log MACs, per
backend, fitted on the last calibration's own whole-network runs: the same shots). A
candidate the canary found timed on a busy machine is left out (and listed). Where this
CPU id has a model of its own (trained on another host of it), the homes without a
calibration answer from that model (``uncalibrated_source``: trained), and the calibration
is of this host's speed. ``--rescore JSON`` prices the candidates a run saved (``--json``)
again, from the same homes, with today's models and maps, and times nothing. Printed:
within ±10 %, MAPE and Spearman of each (and by backend), the share of measured times
inside each 80 % interval, and the pick after validating 3 against the best measured.

    DLAS_HOME=H1 dlas-predict calibrate --minutes 1; DLAS_HOME=H5 dlas-predict calibrate
    .venv/bin/python benchmarks/bench_calibrate.py --calibrated-home H1 --calibrated-home H5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_unseen import CNNS, MATRIX  # noqa: E402

#: The matrix networks validated: the first of each family in ``bench_unseen.MATRIX``.
MATRIX_FIRST = list({f: (f, p) for f, p in reversed(MATRIX)}.values())[::-1]


def _macs(path: Path) -> float:
    from dlas_predict.networks.graph import read_network

    return float(read_network(path, path.stem).macs)


def _score(pred: np.ndarray, meas: np.ndarray) -> dict:
    from scipy.stats import spearmanr

    err = pred / meas - 1
    return {"within_10pct": float(np.mean(np.abs(err) <= 0.10)),
            "mape": float(np.mean(np.abs(err))),
            "spearman": float(spearmanr(pred, meas).statistic) if len(pred) > 2 else None}


def _key(c) -> tuple[str, str, str]:
    """A candidate as one run and the next name it: a per-layer plan is the same candidate
    only with the same layers' kernels."""
    return c.label, c.backend, ";".join(f"{a}{'/sparse' if s else ''}" for a, s in c.layers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibrated-home", type=Path, action="append", required=True,
                    help="repeatable; the last one's top candidates are validated")
    ap.add_argument("--validate", type=int, default=12)
    ap.add_argument("--device", default="local")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-matrix", action="store_true",
                    help="validate the generated CNNs only")
    ap.add_argument("--rescore", type=Path,
                    help="a --json of an earlier run: price its timed candidates again")
    args = ap.parse_args()
    homes = [h.resolve() for h in args.calibrated_home]
    cals = []
    for home in homes:
        saved = home / "adapted" / f"{args.device}.json"
        if not saved.is_file():
            print(f"Error: {saved} not found: run `DLAS_HOME={home} dlas-predict calibrate` "
                  "first")
            return 1
        cals.append(json.loads(saved.read_text()))
    saved_rows = None
    if args.rescore:
        try:
            saved_rows = json.loads(args.rescore.read_text())["rows"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"Error: {args.rescore}: not a --json of this benchmark ({exc})")
            return 1
    home, cal = homes[-1], cals[-1]
    names = [f"calibrated_{len(c.get('active_learning', {}).get('measured', []))}k_"
             f"{len(c.get('networks', []))}n" for c in cals[:-1]] + ["calibrated"]
    from dlas_predict.recommend.search import recommend
    from dlas_predict.space.devices import get_device

    dev = get_device(args.device, with_target=False)
    rows, noisy = [], []
    # how the homes without a calibration answer: zero-shot, or the CPU's own model where it
    # was trained on this CPU id (on another host of it)
    uncalibrated: dict[str, str] = {}
    zero_home = Path(tempfile.mkdtemp(prefix="dlas-zero-"))
    # zero-shot with this machine's roofs measured (as the last calibration measured them,
    # `devices --measure-peaks`), no latency measured
    roofs_home = Path(tempfile.mkdtemp(prefix="dlas-roofs-"))
    for f in (home / "cache" / "devices").glob("local-peaks-*.json"):
        (roofs_home / "cache" / "devices").mkdir(parents=True, exist_ok=True)
        (roofs_home / "cache" / "devices" / f.name).write_text(f.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        from dlas_predict.networks import generate as gen

        specs = [("cnn", spec) for spec in CNNS] + ([] if args.no_matrix else MATRIX_FIRST)
        paths = [gen.generate(f, spec.split(","), Path(tmp))[0].path for f, spec in specs]
        # the MACs fit, per backend, on the calibration's own whole-network runs
        fit = {}
        shots = cal.get("networks", [])
        from dlas_predict.corpus.collect import CALIBRATION_SET, calibration_networks
        from dlas_predict.networks import zoo
        from dlas_predict.recommend.calibrate import generated_networks

        macs_of = {}
        for n in calibration_networks(CALIBRATION_SET) + generated_networks(
                home / "calibrate" / "networks"):
            p = Path(zoo.resolve(n))
            macs_of[p.stem if not n.startswith("zoo:") else n[4:]] = _macs(p)
        for backend in ("tvm", "onnxruntime"):
            r = [s for s in shots if s["backend"] == backend and s["network"] in macs_of]
            if len(r) >= 2:
                x = np.log([macs_of[s["network"]] for s in r])
                y = np.log([s["measured_ms"] for s in r])
                fit[backend] = np.polyfit(x, y, 1)
        for path in paths:
            os.environ["DLAS_HOME"] = str(home)
            if saved_rows is not None:
                timed = [r for r in saved_rows if r["network"] == path.stem]
                if not timed:
                    continue
            rec = recommend(str(path), args.device, max_accuracy_drop=float("inf"),
                            top=0 if saved_rows is not None else args.validate,
                            validate=0 if saved_rows is not None else args.validate,
                            tuning="untuned", ratios=(0.5, 0.9))
            validated = rec.validated
            if saved_rows is not None:  # the saved timings, on today's prices
                priced = {_key(c): c for c in rec.candidates}
                validated = []
                for r in timed:
                    c = priced.get((r["label"], r["backend"], r.get("layers")))
                    if c is None:
                        print(f"{path.stem} {r['label']}: not priced today, left out")
                        continue
                    c.measured_s = r["measured_ms"] / 1e3
                    validated.append(c)
            others = {}
            for name, h in [*zip(names[:-1], homes[:-1]), ("zero_shot", zero_home),
                            ("zero_shot_roofs", roofs_home)]:
                os.environ["DLAS_HOME"] = str(h)
                o = recommend(str(path), args.device, max_accuracy_drop=float("inf"), top=0,
                              tuning="untuned", ratios=(0.5, 0.9))
                # a per-layer plan is the same candidate only with the same layers' kernels
                others[name] = {_key(c): c for c in o.candidates}
                uncalibrated[name] = o.source
            macs = _macs(path)
            for c in validated:
                if c.measured_s is None:
                    continue
                if (c.measured_note or "").startswith("noisy"):
                    noisy.append(f"{path.stem} {c.label}")
                    continue  # timed on a busy machine: not a figure to score against
                f = fit.get(c.backend)
                row = {"network": path.stem, "family": path.stem.split("_")[0],
                       "label": c.label, "backend": c.backend, "layers": _key(c)[2],
                       "measured_ms": c.measured_s * 1e3}
                for name, o in [("calibrated", c), *((n, m.get(_key(c)))
                                                     for n, m in others.items())]:
                    row[f"{name}_ms"] = o.predicted_s * 1e3 if o is not None else None
                    row[f"{name}_low_ms"] = o.low_s * 1e3 if o is not None else None
                    row[f"{name}_high_ms"] = o.high_s * 1e3 if o is not None else None
                row["macs_fit_ms"] = float(np.exp(np.polyval(f, np.log(macs)))) \
                    if f is not None else None
                rows.append(row)
            print(f"{path.stem}: {len(validated)} validated", flush=True)
    meas = np.array([r["measured_ms"] for r in rows])
    out = {"device": args.device, "cpu": dev.description, "fingerprint": dev.fingerprint,
           "calibration": {"kernels": len(cal.get("active_learning", {}).get("measured", [])),
                           "network_runs": len(shots)},
           "candidates": len(rows), "noisy_left_out": noisy,
           "uncalibrated_source": uncalibrated}
    for k in ("zero_shot_ms", "zero_shot_roofs_ms", *(f"{n}_ms" for n in names),
              "macs_fit_ms"):
        ok = [i for i, r in enumerate(rows) if r[k] is not None]
        name = k.removesuffix("_ms")
        # a method that priced another per-layer plan than the one timed is not scored on it
        out[name] = {**_score(np.array([rows[i][k] for i in ok]), meas[ok]),
                     "candidates": len(ok)}
        for part in ("tvm", "onnxruntime", *sorted({r["family"] for r in rows})):
            b = [i for i in ok if part in (rows[i]["backend"], rows[i]["family"])]
            if b:
                out[name][part] = _score(np.array([rows[i][k] for i in b]), meas[b])
        if f"{name}_low_ms" in rows[0]:  # the 80 % interval's share of measured times
            out[name]["interval_holds"] = float(np.mean(
                [rows[i][f"{name}_low_ms"] <= rows[i]["measured_ms"]
                 <= rows[i][f"{name}_high_ms"] for i in ok]))
    picks = []
    for net in sorted({r["network"] for r in rows}):
        r = [x for x in rows if x["network"] == net]
        top3 = sorted(r, key=lambda x: x["calibrated_ms"])[:3]
        picks.append(min(x["measured_ms"] for x in top3) / min(x["measured_ms"] for x in r))
    out["pick_of_top3_over_best"] = picks
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": out, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
