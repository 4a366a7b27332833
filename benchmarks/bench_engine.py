"""Our builds against onnxruntime, measured in the same run on this machine.

For each network the grid is predicted (``recommend``, untuned half, the default accuracy
budget), then these are built and timed in one runner session, one after the other, with
the study's protocol, at the device's threads (2 on this machine):

- the ``--top`` fastest predicted configurations of our TVM builds, every dense float32
  build of ours (each algorithm and the per-layer choice: the kernel-quality figure, no
  compression) and every int8 build of ours the budget keeps;
- every onnxruntime configuration the budget keeps (fp32, static QDQ int8, float16, channel
  pruning with the zeroed filters removed); onnxruntime fp32 on the dense model is the
  reference.

The pruning ratios are 0.5 and 0.9. The generated networks have random weights, so their
accuracy is unknown and no candidate of theirs is dropped by the budget: there the fastest
configurations are the most pruned ones, which ``dense / ort`` leaves out.

Printed per network and as geometric means over the networks:

- ``ours / ort``: our fastest measured TVM build over onnxruntime fp32 (target ≤ 1.0, and
  ≤ 1.5 on every network);
- ``grid / ort``: the fastest measured configuration of the whole grid, onnxruntime's
  included, over onnxruntime fp32 (what ``recommend --validate`` would deploy);
- ``dense / ort``: our fastest dense float32 build over onnxruntime fp32;
- ``int8 / ort int8``: our fastest int8 build over onnxruntime's static QDQ int8 (target
  ≤ 1.0).

Networks: the 8 zoo networks, 20 generated CNNs of shapes no corpus holds (5 of each
block style: plain, residual, depthwise-separable, inverted-residual), drawn with a fixed
seed, and matrix networks of well-known shapes (:data:`MATRIX`: transformer encoders shaped
as BERT-tiny, BERT-mini and ViT-tiny's blocks, an MLP). Resumable: a network already in the
output file is not measured again.

    .venv/bin/python benchmarks/bench_engine.py [--out benchmarks/out/engine.jsonl]
        [--top 3] [--only NAME] [--skip-zoo] [--skip-matrix] [--generated 20] [--markdown]

``--markdown`` measures nothing: it prints the output file's tables for
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlas_predict.errors import DlasError  # noqa: E402
from dlas_predict.files import append_row, read_rows  # noqa: E402

STYLES = ("plain", "residual", "separable", "inverted")
#: Matrix networks of well-known shapes: (what, family, parameters as ``generate``).
MATRIX = [
    ("BERT-tiny", "transformer", "layers=2,d_model=128,heads=2,ffn=4,seq=128"),
    ("BERT-mini", "transformer", "layers=4,d_model=256,heads=4,ffn=4,seq=128"),
    ("ViT-tiny, 4 blocks", "transformer", "layers=4,d_model=192,heads=3,ffn=4,seq=197"),
    ("MLP 784-512-512-10", "fc", "layers=2,nodes=512"),
    ("LSTM LM, PTB-small shape", "rnn",
     "layers=2,hidden=200,embedding=200,vocab=10000,seq=20,cell=lstm"),
    ("GRU LM, PTB-small shape", "rnn",
     "layers=2,hidden=200,embedding=200,vocab=10000,seq=20,cell=gru"),
    ("LSTM 2x256", "rnn", "layers=2,hidden=256,embedding=128,vocab=1000,seq=32,cell=lstm"),
]
#: The pruning ratios of the grid here (recommend's default has ten of each).
RATIOS = (0.5, 0.9)


def _corpus_networks() -> set[str]:
    import pandas as pd

    names: set[str] = set()
    for path in (ROOT / "datasets" / "corpus").glob("*.networks.parquet"):
        names |= set(pd.read_parquet(path, columns=["network"])["network"])
    return names


def generated(n: int, seed: int = 27) -> list[str]:
    """``n`` generated-CNN parameter strings (``generate cnn`` syntax), an equal share of
    each block style, of shapes no corpus network has."""
    from dlas_predict.networks import generate as gen

    if n <= 0:
        return []
    rng = random.Random(seed)
    taken = _corpus_networks()
    out: list[str] = []
    per_style = max(1, n // len(STYLES))
    for style in STYLES:
        got = 0
        while got < per_style:
            p = {"layers": rng.choice([3, 4, 5]), "kernels": rng.choice([20, 40, 56, 80, 112]),
                 "input": rng.choice([18, 24, 36, 44, 52]),
                 "kernel_size": rng.choice([3, 5]) if style in ("separable", "inverted") else 3,
                 "block": style, "downsample": rng.choice([1, 2])}
            if style == "inverted":
                p["kernels"] = min(p["kernels"], 56)  # ×6 expansion
            params = ",".join(f"{k}={v}" for k, v in p.items())
            point = gen.parse_grid("cnn", params.split(","))[0]
            name = gen.file_name("cnn", point)[:-len(".onnx")]
            if name in taken or params in out:
                continue
            out.append(params)
            got += 1
    return out


def networks(args, out_dir: Path) -> list[tuple[str, str, str]]:
    """(family, name, model argument) of every benchmark network."""
    from dlas_predict.networks import generate as gen
    from dlas_predict.networks import zoo

    nets = [] if args.skip_zoo else [("zoo", n, f"zoo:{n}") for n in zoo.ZOO]
    for params in generated(args.generated):
        m = gen.generate("cnn", params.split(","), out_dir)[0]
        nets.append((f"cnn {m.params['block']}", m.path.stem, str(m.path)))
    for _what, family, params in ([] if args.skip_matrix else MATRIX):
        m = gen.generate(family, params.split(","), out_dir)[0]
        nets.append(("matrix", m.path.stem, str(m.path)))
    return nets


def measure(model: str, top: int) -> dict:
    """Predict the grid, then time the chosen configurations and onnxruntime fp32."""
    from dlas_predict.recommend.search import recommend
    from dlas_predict.recommend.validate import validate_top
    from dlas_predict.space.config import Compression

    rec = recommend(model, "local", top=0, tuning="untuned", ratios=RATIOS)
    ours = [c for c in rec.candidates if c.backend == "tvm"]
    chosen = ours[:top]
    # every dense build of ours (each algorithm and the per-layer choice): the kernel
    # quality is the fastest measured, not the fastest predicted
    chosen += [c for c in ours if c.compression is Compression.DENSE and c not in chosen]
    # and every int8 build of ours, to set beside onnxruntime's int8
    chosen += [c for c in ours if c.compression is Compression.INT8 and c not in chosen]
    chosen += [c for c in rec.candidates if c.backend == "onnxruntime"]
    rec.candidates = chosen
    validate_top(rec, model, _device(), len(chosen))
    ref = rec.reference
    rows = [{"config": c.label, "backend": c.backend, "compression": c.compression.value,
             "predicted_ms": c.predicted_s * 1e3 if c.predicted_s == c.predicted_s else None,
             "measured_ms": None if c.measured_s is None else c.measured_s * 1e3,
             "note": c.measured_note} for c in chosen]
    out = {"source": rec.source, "candidates": rows,
           "ort_fp32_ms": None if ref is None or ref.measured_s is None
           else ref.measured_s * 1e3}
    ok = [r for r in rows if r["measured_ms"]]
    for key, pick in (("ours", lambda r: r["backend"] == "tvm"),
                      ("dense", lambda r: r["backend"] == "tvm"
                       and r["compression"] == "dense"),
                      ("grid", lambda r: True)):
        best = min((r for r in ok if pick(r)), key=lambda r: r["measured_ms"], default=None)
        out[f"{key}_ms"] = best and best["measured_ms"]
        out[f"{key}_config"] = best and best["config"]
    return out


_DEV = None


def _device():
    global _DEV
    if _DEV is None:
        from dlas_predict.space.devices import get_device

        _DEV = get_device("local")
    return _DEV


def ratios(row: dict) -> dict:
    ort = row.get("ort_fp32_ms")
    out = {k: row[f"{k}_ms"] / ort for k in ("ours", "grid", "dense")
           if ort and row.get(f"{k}_ms")}
    int8 = {backend: min((c["measured_ms"] for c in row.get("candidates", ())
                          if c["backend"] == backend and c["compression"] == "int8"
                          and c["measured_ms"]), default=None)
            for backend in ("tvm", "onnxruntime")}
    if out and int8["tvm"] and int8["onnxruntime"]:
        out["int8"] = int8["tvm"] / int8["onnxruntime"]  # int8 against int8
    return out


def _geo(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


#: The ratios to onnxruntime (fp32; int8 to its int8), in the order the summaries print them.
RATIOS_SHOWN = (("ours", "our fastest build"), ("dense", "our fastest dense fp32 build"),
                ("grid", "the whole grid's fastest (either backend)"),
                ("int8", "our fastest int8 build, to onnxruntime int8"))


def summary(rows: list[dict]) -> list[tuple[str, float, float, str, int, int]]:
    """Per ratio of :data:`RATIOS_SHOWN` the networks have: (what, geometric mean, worst,
    the worst network's name, networks over 1.5, networks)."""
    out = []
    for key, what in RATIOS_SHOWN:
        by_name = {r["name"]: ratios(r)[key] for r in rows if key in ratios(r)}
        if by_name:
            worst = max(by_name, key=by_name.get)
            out.append((what, _geo(list(by_name.values())), by_name[worst], worst,
                        sum(v > 1.5 for v in by_name.values()), len(by_name)))
    return out


FAMILIES = {"zoo": "zoo", "cnn plain": "plain", "cnn residual": "residual",
            "cnn separable": "depthwise-separable", "cnn inverted": "inverted-residual",
            "matrix": "matrix (transformer, MLP, recurrent)"}


def label(row: dict) -> str:
    """A generated network's name as its shape: ``plain: 5 layers, 80 ch, 3×3, 36², ds 2``."""
    if row["family"] == "zoo":
        return row["name"]
    if row["family"] == "matrix":
        from dlas_predict.networks.generate import file_name, parse_grid

        return next((what for what, family, params in MATRIX
                     if file_name(family, parse_grid(family, params.split(","))[0])
                     == row["name"] + ".onnx"), row["name"])
    from dlas_predict.networks.generate import name_value

    v = {k: name_value(row["name"], k) for k in
         ("block", "layers", "kernels", "kernel_size", "input", "downsample")}
    k = v["kernel_size"] or "3"
    return (f"{v['block']}: {v['layers']} layers, {v['kernels']} ch, {k}×{k}, "
            f"{v['input']}², ds {v['downsample']}")


def markdown(done: dict[str, dict]) -> int:
    """The summary, family and per-network tables of ``benchmarks/README.md``."""
    rows = [r for r in done.values() if ratios(r)]
    if not rows:
        raise DlasError("no measured network in the output file")
    print("| ratio to onnxruntime fp32 (same run) | geometric mean | worst | over 1.5 |")
    print("|---|---|---|---|")
    for what, geo, worst, _name, over, n in summary(rows):
        print(f"| {what} | ×{geo:.2f} | ×{worst:.2f} | {over} of {n} |")
    print("\n| family | networks | ours / ort | dense / ort | grid / ort | int8 / ort int8 |")
    print("|---|---|---|---|---|---|")
    for family, shown in FAMILIES.items():
        fam = [ratios(r) for r in rows if r["family"] == family]
        if fam:
            print(f"| {shown} | {len(fam)} | " + " | ".join(
                f"{_geo([f[k] for f in fam if k in f]):.2f}" if any(k in f for f in fam)
                else "—" for k in ("ours", "dense", "grid", "int8")) + " |")
    print("\n| network | onnxruntime fp32 ms | our best dense fp32 build | dense / ort "
          "| our best build | ours / ort | grid's best | grid / ort | int8 / ort int8 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = ratios(r)
        cells = [label(r), f"{r['ort_fp32_ms']:.3f}"]
        for key in ("dense", "ours", "grid"):
            if key in q:
                cells += [f"{r[f'{key}_config']} {r[f'{key}_ms']:.3f}", f"{q[key]:.2f}"]
            else:
                cells += ["—", "—"]
        cells.append(f"{q['int8']:.2f}" if "int8" in q else "—")
        print("| " + " | ".join(cells) + " |")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "engine.jsonl")
    ap.add_argument("--top", type=int, default=3, help="our fastest predicted builds timed")
    ap.add_argument("--generated", type=int, default=20)
    ap.add_argument("--skip-zoo", action="store_true")
    ap.add_argument("--skip-matrix", action="store_true", help="leave the matrix networks out")
    ap.add_argument("--only", help="measure just this network (name)")
    ap.add_argument("--markdown", action="store_true",
                    help="print the output file's tables as markdown; measure nothing")
    args = ap.parse_args()
    if args.generated < 0 or args.top < 1:
        print("Error: --generated must be at least 0 and --top at least 1", file=sys.stderr)
        return 1
    try:
        if args.markdown:
            return markdown(read_rows(args.out))
        return _run(args)
    except DlasError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _run(args) -> int:
    if args.top < 1:
        raise DlasError(f"--top must be >= 1, got {args.top}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = read_rows(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for family, name, model in networks(args, Path(tmp)):
            if name in done or (args.only and args.only != name):
                continue
            t = time.time()
            row = {"family": family, "name": name, **measure(model, args.top),
                   "seconds": round(time.time() - t, 1)}
            append_row(args.out, row)
            done[name] = row
            r = ratios(row)
            print(f"{family:14s} {name[:58]:58s} ort {row['ort_fp32_ms'] or 0:8.3f} ms  "
                  + "  ".join(f"{k}/ort {v:.2f}" for k, v in r.items())
                  + f"  ({row['seconds']:.0f} s)", flush=True)
    rows = [r for r in done.values() if ratios(r)]
    if not rows:
        return 0
    print(f"\n{len(rows)} networks, ratios to onnxruntime fp32 measured in the same run "
          "(geometric mean, worst):")
    for what, geo, worst, name, over, n in summary(rows):
        print(f"  {what:42s} ×{geo:.2f}  worst ×{worst:.2f} ({name[:40]}), over 1.5 on "
              f"{over} of {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
