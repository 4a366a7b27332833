"""Whole-network predictions on networks the corpus does not hold, proved by building and
timing every candidate (``recommend NET --validate all``, untuned half).

The networks, none of them in ``datasets/corpus/local*``:

- NAS-Bench-201 cells (a DAG cell of 3×3 and 1×1 ReLU-conv-BN, 3×3 average pools, skips
  and zeroed edges, 15 cells in 3 stages), chosen at random from the search space with a
  fixed seed; ``local``'s corpus holds eight other cells, the profiles' corpora none;
- generated CNNs of shapes the corpus lacks (depths, widths, input sizes and kernel sizes
  none of its generated networks has), one of each block style;
- generated matrix networks (transformer encoders and MLPs) of widths, head counts, FFN
  ratios, depths and sequence lengths none of the corpus's has;
- generated recurrent networks (LSTM, GRU, RNN language models) of hidden sizes,
  embeddings, vocabularies and sequence lengths none of the corpus's has.

For each network every untuned candidate of the grid (dense, float16, int8, and the two
prunings at 0.5 and 0.9; each algorithm and the per-layer choice) is predicted by the
shipped model of the device (``--device``: this machine or one of its profiles; its
``source`` is recorded: a model trained on this machine, or zero-shot) and then measured
here. Resumable: a network already in the output file is not measured again.

    .venv/bin/python benchmarks/bench_unseen.py [--out benchmarks/out/unseen.jsonl]
        [--device local] [--nasbench 6] [--only NAME] [--family FAMILY]

Two modes measure nothing and read a finished run's file instead (of the same device on
the same machine):

- ``--rescore`` prices every measured candidate again with the device's models as they
  are now (after ``devices --measure-peaks``, ``active-learn`` or ``adapt``, say) and
  scores them beside the run's own predictions; a per-layer candidate only where today's
  models choose the layers it was built with (the file records them);
- ``--adapt-networks N`` is few-shot with whole networks, each network held out in turn:
  ``adapt`` on N measured candidates drawn at random from the other generated CNNs (not
  per-layer ones, which no other runtime has; NAS-Bench-201 cells are HELP's targets, dense
  only), then the held-out network's candidates scored; ``--draws`` seeds. The device's
  own adapted map, if any, is put back afterwards.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlas_predict.measure.networks.plans import PER_LAYER  # noqa: E402
from dlas_predict.errors import DlasError  # noqa: E402
from dlas_predict.files import append_row, read_rows  # noqa: E402

#: Generated CNNs of unseen shapes: one per block style (parameters as ``generate cnn``).
CNNS = [
    "layers=5,kernels=40,input=36,block=plain,downsample=2",
    "layers=4,kernels=80,input=18,block=residual,downsample=1",
    "layers=5,kernels=56,input=36,kernel_size=5,block=separable,downsample=2",
    "layers=4,kernels=20,input=44,block=inverted,downsample=2",
]
#: Generated matrix networks of unseen shapes (parameters as ``generate FAMILY``).
MATRIX = [
    ("transformer", "layers=1,d_model=96,heads=3,ffn=3,seq=32"),
    ("transformer", "layers=3,d_model=96,heads=3,ffn=3,seq=32"),
    ("transformer", "layers=1,d_model=192,heads=3,ffn=3,seq=96"),
    ("transformer", "layers=3,d_model=192,heads=3,ffn=3,seq=32"),
    ("fc", "layers=3,nodes=768"),
    ("fc", "layers=3,nodes=1536"),
    ("rnn", "layers=1,hidden=192,embedding=96,vocab=1000,seq=24,cell=lstm"),
    ("rnn", "layers=2,hidden=96,embedding=96,vocab=1000,seq=12,cell=lstm"),
    ("rnn", "layers=2,hidden=384,embedding=96,vocab=1000,seq=12,cell=gru"),
    ("rnn", "layers=1,hidden=192,embedding=96,vocab=1000,seq=24,cell=gru"),
    ("rnn", "layers=2,hidden=192,embedding=96,vocab=1000,seq=12,cell=rnn"),
]
RATIOS = (0.5, 0.9)


def _nasbench_archs(n: int, seed: int = 2026) -> list[str]:
    import random

    from dlas_predict.networks.nasbench201 import OPS, parse_arch

    rng = random.Random(seed)
    archs = []
    while len(archs) < n:
        ops = [rng.choice(OPS) for _ in range(6)]
        if "nor_conv_3x3" not in ops and "nor_conv_1x1" not in ops:
            continue  # a cell with no conv: nothing of the grid applies to it
        a = ops
        archs.append(parse_arch(f"|{a[0]}~0|+|{a[1]}~0|{a[2]}~1|+|{a[3]}~0|{a[4]}~1|"
                                f"{a[5]}~2|").string)
    return archs


def networks(n_nasbench: int, out_dir: Path) -> list[tuple[str, str, Path]]:
    """(family, name, ONNX path) of every benchmark network, generated into ``out_dir``."""
    from dlas_predict.networks import generate as gen
    from dlas_predict.networks import nasbench201 as nb

    nets = []
    for params in CNNS:
        model = gen.generate("cnn", params.split(","), out_dir)[0]
        nets.append((f"cnn {model.params['block']}", model.path.stem, model.path))
    for family, params in MATRIX:
        model = gen.generate(family, params.split(","), out_dir)[0]
        nets.append((family, model.path.stem, model.path))
    archs = [nb.parse_arch(a) for a in _nasbench_archs(n_nasbench)]
    for arch, path in zip(archs, nb.generate(archs, out_dir)):
        nets.append(("nasbench201", arch.string, path))
    return nets


def measure(path: Path, device: str) -> tuple[str, list[dict]]:
    """(the latencies' source, every validated candidate) of one network."""
    from dlas_predict.recommend.search import recommend

    rec = recommend(str(path), device, max_accuracy_drop=float("inf"), top=0,
                    validate=10_000, tuning="untuned", ratios=RATIOS)
    return rec.source, [{"config": c.label, "backend": c.backend,
                         "predicted_ms": c.predicted_s * 1e3,
                         "measured_ms": None if c.measured_s is None else c.measured_s * 1e3,
                         "note": c.measured_note, **_layers(c)} for c in rec.validated]


def _layers(c) -> dict:
    """A per-layer candidate's layers as built (algorithm, sparse), which its label does not
    say: a rescore compares it only with a prediction of the same layers."""
    if c.algorithm != PER_LAYER:
        return {}
    return {"layers": [[a, s] for a, s in c.layers]}


def _ours(row: dict, backend: str = "tvm") -> list[dict]:
    """A row's measured candidates of our builds (``backend`` tvm) or onnxruntime's."""
    return [c for c in row["candidates"]
            if c["measured_ms"] and c.get("backend", "tvm") == backend]


def summarise(rows: list[dict], backend: str = "tvm") -> dict:
    pairs = [(c["predicted_ms"], c["measured_ms"]) for r in rows
             for c in _ours(r, backend)]  # our builds' models, or the onnxruntime model
    if not pairs:
        return {"n": 0}
    errs = [p / m - 1 for p, m in pairs]
    return {"n": len(pairs), "within_10": sum(abs(e) <= 0.10 for e in errs) / len(errs),
            "within_25": sum(abs(e) <= 0.25 for e in errs) / len(errs),
            "mape": sum(abs(e) for e in errs) / len(errs),
            "median_ratio": sorted(p / m for p, m in pairs)[len(pairs) // 2],
            "geo_ratio": math.exp(sum(math.log(p / m) for p, m in pairs) / len(pairs))}


def macs_baseline(rows: list[dict], backend: str = "tvm") -> dict:
    """The simplest baseline beside the models: each candidate priced by a fit of log latency
    on log MACs over the same configuration's measurements of the group's other networks
    (each network held out in turn); rows without their MACs (older runs) are left out."""
    import numpy as np

    rows = [r for r in rows if r.get("macs")]
    errs = []
    for r in rows:
        for c in _ours(r, backend):
            others = [(math.log(o["macs"]), math.log(oc["measured_ms"])) for o in rows
                      if o is not r for oc in _ours(o, backend) if oc["config"] == c["config"]]
            if len({x for x, _ in others}) < 2:
                continue
            x, y = np.array(others).T
            b, a = np.polyfit(x, y, 1)
            errs.append(math.exp(a + b * math.log(r["macs"])) / c["measured_ms"] - 1)
    if not errs:
        return {"n": 0}
    return {"n": len(errs), "within_10": sum(abs(e) <= 0.10 for e in errs) / len(errs),
            "mape": sum(abs(e) for e in errs) / len(errs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "unseen.jsonl")
    ap.add_argument("--nasbench", type=int, default=6)
    ap.add_argument("--only", help="measure just this network (name)")
    ap.add_argument("--family", action="append",
                    help="measure just the networks of this family (cnn, nasbench201, "
                         "transformer, fc, rnn; repeatable)")
    ap.add_argument("--device", default="local",
                    help="this machine or one of its profiles (default: local)")
    ap.add_argument("--rescore", action="store_true",
                    help="price --out's measured candidates again with today's models")
    ap.add_argument("--adapt-networks", type=int, metavar="N",
                    help="few-shot: adapt on N whole networks of the others, each held out")
    ap.add_argument("--draws", type=int, default=3, help="--adapt-networks: random draws")
    args = ap.parse_args()
    for name in ("adapt_networks", "draws"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"Error: --{name.replace('_', '-')} must be at least 1, got {value}",
                  file=sys.stderr)
            return 1
    try:
        if args.rescore or args.adapt_networks is not None:
            return _rescore(args)
        return _run(args)
    except DlasError as exc:  # an unknown device, a build that cannot start: one line
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _run(args) -> int:
    from dlas_predict.networks.graph import read_network
    from dlas_predict.space.devices import get_device

    dev = get_device(args.device, with_target=False)
    if not dev.measured_here:
        raise DlasError(f"{args.device} is not this machine or one of its profiles: the "
                        "benchmark builds and times every candidate here")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = read_rows(args.out, lambda r: r.get("device", "local") == args.device)
    with tempfile.TemporaryDirectory() as tmp:
        for family, name, path in networks(args.nasbench, Path(tmp)):
            if name in done or (args.only and args.only != name) or (
                    args.family and family.split()[0] not in args.family):
                continue
            t = time.time()
            source, cands = measure(path, args.device)
            row = {"family": family, "name": name, "device": args.device, "source": source,
                   "seconds": round(time.time() - t, 1), "candidates": cands,
                   "macs": read_network(path).macs}
            append_row(args.out, row)
            done[name] = row
            s = summarise([row])
            print(f"{family:14s} {name[:60]:60s} ({source}) {s.get('n', 0):3d} measured, "
                  f"within ±10 %: "
                  f"{s.get('within_10', 0):.0%}, MAPE {s.get('mape', 0):.1%} "
                  f"({row['seconds']:.0f} s)", flush=True)
    rows = list(done.values())
    print("\nfamily          candidates  within ±10 %  within ±25 %  MAPE   predicted/measured"
          "  MACs fit: within ±10 %, MAPE")
    groups = {fam: [r for r in rows if r["family"] == fam]
              for fam in sorted({r["family"] for r in rows})}
    groups["cnn (all)"] = [r for r in rows if r["family"].startswith("cnn ")]
    groups["all"] = rows
    for backend in ("tvm", "onnxruntime"):
        if backend == "onnxruntime":
            print("\nonnxruntime's candidates, priced by the onnxruntime model")
        for fam, members in groups.items():
            s, b = summarise(members, backend), macs_baseline(members, backend)
            if s["n"]:
                print(f"{fam:15s} {s['n']:10d}  {s['within_10']:11.0%}  "
                      f"{s['within_25']:11.0%}  {s['mape']:5.1%}  ×{s['geo_ratio']:.2f}"
                      + (f"  {b['within_10']:.0%} of {b['n']}, {b['mape']:.1%}"
                         if b["n"] else ""))
    return 0


def _predicted(path: Path, device: str) -> tuple[str, dict[str, float]]:
    """(the latencies' source, today's predicted ms of every untuned candidate of ours by
    label)."""
    from dlas_predict.recommend.search import recommend

    rec = recommend(str(path), device, max_accuracy_drop=float("inf"), top=0, validate=0,
                    tuning="untuned", ratios=RATIOS)
    return rec.source, {(c.backend, c.label): (c.predicted_s * 1e3, _layers(c).get("layers"))
                        for c in rec.candidates}


def _rescore(args) -> int:
    rows = list(read_rows(args.out, lambda r: r.get("device", "local") == args.device).values())
    if not rows:
        raise DlasError(f"{args.out} holds no run of {args.device}")
    scored: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: (fam, path) for fam, name, path in networks(args.nasbench, Path(tmp))}
        missing = [r["name"] for r in rows if r["name"] not in paths]
        if missing:
            raise DlasError(f"{missing[0]} is not among this benchmark's networks (the run "
                            "used another --nasbench?)")
        if args.adapt_networks is None:
            source = None
            for r in rows:
                source, pred = _predicted(paths[r["name"]][1], args.device)
                scored.setdefault(r["family"], []).append(_rescored(r, pred))
            print(f"today's {args.device} models ({source}) against the run's own predictions")
        else:
            source = _adapt_held_out(args, rows, paths, scored)
            print(f"adapted on {args.adapt_networks} whole networks of the other generated "
                  f"CNNs, {args.draws} draws, each network held out ({source})")
    skipped = sum(m["skipped"] for v in scored.values() for m in v)
    if skipped:
        print(f"{skipped} per-layer candidates left out: built with other layers than "
              "today's models choose, or with layers the file does not record")
    print("\nfamily          candidates  within ±10 %  within ±25 %  MAPE   predicted/measured"
          "   (the run's: within ±10 %, ±25 %)")
    groups = dict(sorted(scored.items()))
    groups["all"] = [x for v in scored.values() for x in v]
    for backend in ("tvm", "onnxruntime"):
        if backend == "onnxruntime":
            print("\nonnxruntime's candidates, priced by the onnxruntime model")
        for fam, members in groups.items():
            now = summarise([{"candidates": [c for m in members for c in m["now"]]}], backend)
            then = summarise([{"candidates": [c for m in members for c in m["then"]]}],
                             backend)
            if now["n"]:
                print(f"{fam:15s} {now['n']:10d}  {now['within_10']:11.0%}  "
                      f"{now['within_25']:11.0%}  {now['mape']:5.1%}  ×{now['geo_ratio']:.2f}"
                      f"               ({then['within_10']:.0%}, {then['within_25']:.0%})")
    return 0


def _rescored(row: dict, pred: dict[tuple, tuple], onnxruntime: bool = True) -> dict:
    """A run's row as (today's prediction, measured) and (the run's, measured) pairs, of our
    builds and (``onnxruntime``) onnxruntime's runs. A per-layer candidate is scored only
    where today's models choose the layers it was built with (a file that does not record
    them: never); ``skipped`` counts the others."""
    priced = [c for c in _ours(row) if ("tvm", c["config"]) in pred]
    ours = [c for c in priced if pred["tvm", c["config"]][1] == c.get("layers")]
    ort = [c for c in _ours(row, "onnxruntime")
           if ("onnxruntime", c["config"]) in pred] if onnxruntime else []
    return {"now": [{**c, "predicted_ms": pred[c.get("backend", "tvm"), c["config"]][0]}
                    for c in ours + ort], "then": ours + ort,
            "skipped": len(priced) - len(ours)}


def _adapt_held_out(args, rows: list[dict], paths: dict, scored: dict) -> str:
    import numpy as np

    from dlas_predict.crossdev import transfer

    from dlas_predict.crossdev.adapted import adapted_dir
    from dlas_predict.recommend.adapt import adapt

    saved = adapted_dir() / f"{args.device}.json"
    backup = saved.read_bytes() if saved.is_file() else None
    source = None
    try:
        for seed in range(args.draws):
            for held in rows:
                pool = [(r["name"], c) for r in rows
                        if r["name"] != held["name"] and r["family"].startswith("cnn")
                        for c in _ours(r) if "per_layer" not in c["config"]]
                if len(pool) < args.adapt_networks:
                    raise DlasError(f"{len(pool)} candidates to adapt on, fewer than "
                                    f"{args.adapt_networks}")
                pick = np.random.default_rng(seed).choice(len(pool), args.adapt_networks,
                                                          replace=False)
                with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
                    f.write("target,config,latency_ms\n")
                    for i in pick:
                        name, c = pool[i]
                        f.write(f"{paths[name][1]},{c['config'].replace(' ', '/')},"
                                f"{c['measured_ms']}\n")
                try:
                    transfer._MAPS.clear()
                    adapt(args.device, Path(f.name))
                finally:
                    Path(f.name).unlink()
                source, pred = _predicted(paths[held["name"]][1], args.device)
                scored.setdefault(held["family"], []).append(_rescored(held, pred, False))
    finally:
        if backup is None:
            saved.unlink(missing_ok=True)
        else:
            saved.write_bytes(backup)
        transfer._MAPS.clear()
    return source


if __name__ == "__main__":
    sys.exit(main())
