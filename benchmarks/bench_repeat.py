"""Repeatability: how far the same measurement moves when it is taken again.

The cost models can be no more accurate than the measurements they learn from and are scored
against. This collects one network's kernels and whole networks twice, back to back, into two
fresh stores (a repeat within one session), and compares them with each other and, with
``--against``, with a store measured in another session:

- the share of repeat medians within ±10 % of the first, kernels and whole networks;
- the same for the fastest timed run (what the models learn), kernels and whole networks;
- how stable the ratio whole / sum of its conv kernels is (what the network model learns)
  when kernels and whole networks come from one session or from two.

    .venv/bin/python benchmarks/bench_repeat.py [--network zoo:resnet18-cifar]
        [--compressions dense,weight_pruning] [--against S] [--json F]

Every figure is a measurement of this run (or of the ``--against`` store); nothing is
predicted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlas_predict.render import format_table  # noqa: E402


def collect(store: Path, network: str, compressions: str, ratio: float,
            quiet_wait: float) -> float:
    cli = ROOT / ".venv" / "bin" / "dlas-predict"
    t0 = time.perf_counter()
    out = subprocess.run([str(cli), "collect", "-q", "--whole-network", "--store", str(store),
                          "--network", network, "--compressions", compressions,
                          "--ratio", str(ratio), "--quiet-wait", str(quiet_wait)],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"collect failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


def measured(store: Path) -> tuple[dict, dict]:
    """(kernel key → median s, (network, config, algorithm) → (whole s, conv-sum s))."""
    from dlas_predict.models.evaluation import load_corpus, whole_rows

    corpus = load_corpus(store)
    kernels = dict(zip(corpus.keys, corpus.seconds))
    whole = {(r.network, r.config, r.algorithm):
             (r.seconds, float(sum(corpus.seconds[i] for i in r.rows)))
             for r in whole_rows(corpus, store)}
    return kernels, whole


def stored(store: Path) -> list[dict]:
    """Every successful record of the store, kernels and whole networks."""
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store, must_exist=True) as db:
        return [*db.rows("error IS NULL"), *db.network_measurements("error IS NULL")]


def contention(rows: list[dict]) -> dict:
    """How many records were timed on a slow machine (the chain probe's ratio or the
    canary's slowdown over the protocol's limits), of how many probed."""
    from dlas_predict.measure.execution.tasks import Protocol

    proto = Protocol()
    probed = [r for r in rows if r.get("contention") is not None]
    slow = [r["slowdown"] for r in probed if r.get("slowdown") is not None]
    return {"records": len(rows), "probed": len(probed),
            "contended": sum(1 for r in probed
                             if r["contention"] > proto.contention_limit
                             or (r.get("slowdown") or 0) > proto.slowdown_limit),
            "worst": max((r["contention"] for r in probed), default=None),
            "worst_slowdown": max(slow, default=None)}


def medians(rows: list[dict]) -> dict:
    """Store key → the protocol's median, for kernels and whole networks."""
    return {r["key"]: r["median_s"] for r in rows}


def compare(a: tuple[dict, dict], b: tuple[dict, dict], ma: dict, mb: dict) -> dict:
    """Figures of ``b`` against ``a`` over what both hold (``ma``, ``mb``: their medians)."""
    (ka, wa), (kb, wb) = a, b
    kr = np.array([kb[k] / ka[k] for k in ka if k in kb])
    mr = np.array([mb[k] / ma[k] for k in ma if k in mb])
    common = [k for k in wa if k in wb]
    wr = np.array([wb[k][0] / wa[k][0] for k in common])
    # the network model's target: whole over its conv sum, from each side's own kernels
    ra = np.array([wa[k][0] / wa[k][1] for k in common])
    rb = np.array([wb[k][0] / wb[k][1] for k in common])
    # ... and mixing sessions: b's whole networks over a's kernels, against over b's own
    rmix = np.array([wb[k][0] / wa[k][1] for k in common])

    def q(x: np.ndarray) -> dict:
        return {"n": int(len(x)), "median": float(np.median(x)),
                "q10": float(np.quantile(x, 0.1)), "q90": float(np.quantile(x, 0.9)),
                "within_10pct": float(np.mean(np.abs(x - 1) <= 0.1))}

    return {"medians": q(mr), "kernels": q(kr), "whole": q(wr),
            "ratio_change_same_session": q(rb / ra), "ratio_change_mixed": q(rmix / rb)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="zoo:resnet18-cifar")
    ap.add_argument("--compressions", default="dense,weight_pruning")
    ap.add_argument("--ratio", type=float, default=0.9)
    ap.add_argument("--against", type=Path, help="a store measured in another session")
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="collect's --quiet-wait (0: time at once, probe only)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        stores = [Path(tmp) / "first.sqlite", Path(tmp) / "repeat.sqlite"]
        secs = [collect(s, args.network, args.compressions, args.ratio, args.quiet_wait)
                for s in stores]
        first, repeat = (measured(s) for s in stores)
        rows = [stored(s) for s in stores]
        meds = [medians(r) for r in rows]
        busy = [contention(r) for r in rows]
    print(f"{args.network} ({args.compressions}, ratio {args.ratio}): collected twice, "
          f"{secs[0]:.0f} s and {secs[1]:.0f} s, {len(first[0])} kernels and "
          f"{len(first[1])} whole networks each; --quiet-wait {args.quiet_wait:g} s")
    for name, b in zip(("first", "repeat"), busy):
        worst = "" if b["worst"] is None else f", worst chain ratio {b['worst']:.2f}"
        if b["worst_slowdown"] is not None:
            worst += f", worst canary slowdown {b['worst_slowdown']:.2f}"
        print(f"  {name}: {b['contended']} of {b['probed']} probed records timed on a slow "
              f"machine{worst}")
    report = {"network": args.network, "compressions": args.compressions,
              "quiet_wait_s": args.quiet_wait, "collect_s": secs, "contention": busy,
              "repeat": compare(first, repeat, *meds)}
    if args.against:
        report["against"] = compare(measured(args.against), first,
                                    medians(stored(args.against)), meds[0])

    rows = []
    labels = {"medians": "medians (kernels and whole networks)",
              "kernels": "kernels, fastest run", "whole": "whole networks, fastest run",
              "ratio_change_same_session": "whole / conv sum, both sessions' own",
              "ratio_change_mixed": "whole / conv sum: other session's kernels over own"}
    for scope, title in (("repeat", "repeat, same session"),
                         ("against", f"this session over {args.against}")):
        if scope not in report:
            continue
        for what, r in report[scope].items():
            if scope == "repeat" and what == "ratio_change_mixed":
                continue
            if scope == "against" and what == "ratio_change_same_session":
                continue
            rows.append({"comparison": title, "quantity (new / old)": labels[what],
                         "n": r["n"], "median": f"{r['median']:.3f}",
                         "10–90 %": f"{r['q10']:.2f}–{r['q90']:.2f}",
                         "within ±10 %": f"{r['within_10pct']:.0%}"})
    print(format_table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
