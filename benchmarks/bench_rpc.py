"""Measuring through TVM RPC: what it costs, and what a second board buys.

Starts a tracker and two servers on loopback (:mod:`dlas_predict.measure.execution.loopback`) and
measures the same untuned kernels three ways, in one run:

1. on this machine (the local runner);
2. through the tracker on one board;
3. through the tracker on two boards (the farm).

It prints, per kernel, the fastest run here and on a board, and for each way the wall-clock
seconds and kernels per minute. On loopback the two "boards" are processes sharing this
machine's cores with each other and with the client, so two boards cannot be twice as fast
here; on separate boards they would each have their own.

Then, for each profile of this CPU whose untuned corpus is shipped in ``datasets/corpus``,
how often the fastest algorithm per layer (and compression) differs from ``local``'s: the
study's observation VI across devices. A profile without a shipped corpus is reported as
such.

    .venv/bin/python benchmarks/bench_rpc.py [--kernels 12] [--json F]

Every figure is a measurement of this run or of the shipped corpora.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KEY = "bench-loopback"
CONVS = ("C=16,H=16,W=16,K=16,R=3,S=3,stride=1,pad=1", "C=32,H=16,W=16,K=32,R=3,S=3,stride=1,pad=1",
         "C=64,H=8,W=8,K=64,R=3,S=3,stride=1,pad=1", "C=32,H=16,W=16,K=64,R=1,S=1,stride=1,pad=0")


def _tasks(n: int):
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.config import ConvSpec, Variant
    from dlas_predict.space.devices import get_device

    dev = get_device("local")
    out = [MeasureTask.make(ConvSpec.parse(c), Variant(alg, "dense"), dev)
           for c in CONVS for alg in ("direct", "gemm", "spatial_pack")]
    return dev, out[:n]


def _run(runner, tasks) -> tuple[float, dict]:
    t0 = time.perf_counter()
    recs = {r.key: r for r in runner.run(tasks)}
    return time.perf_counter() - t0, recs


def measure_ways(n: int) -> dict:
    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.measure.execution.loopback import LoopbackFarm
    from dlas_predict.measure.execution.rpcopts import RpcOptions
    from dlas_predict.measure.execution.tasks import Protocol

    dev, tasks = _tasks(n)
    proto = Protocol(max_repeats=50, min_repeats=10, time_budget_s=0.5, quiet_wait_s=0.0)
    out: dict = {"kernels": len(tasks)}
    with kernel_runner(dev, proto, 300.0) as local:
        local.run_one(tasks[0])  # the worker's start (TVM import) is not measured
        out["local_s"], here = _run(local, tasks)
    with tempfile.TemporaryDirectory() as tmp, LoopbackFarm(Path(tmp), KEY, 2) as farm:
        for boards in (1, 2):
            rpc = RpcOptions("127.0.0.1", farm.port, KEY, boards=boards)
            with kernel_runner(dev, proto, 300.0, rpc) as runner:
                list(runner.run(tasks[:boards]))  # each board's worker started first
                out[f"rpc{boards}_s"], there = _run(runner, tasks)
            if boards == 1:
                one = there
    rows = []
    for t in tasks:
        a, b = here[t.key], one[t.key]
        rows.append({"conv": t.spec.to_spec(), "algorithm": t.variant.algorithm.value,
                     "local_ms": a.best_s * 1e3 if a.ok else None,
                     "board_ms": b.best_s * 1e3 if b.ok else None,
                     "board_error": b.error})
    out["rows"] = rows
    return out


def profile_choices() -> list[dict]:
    """For each profile: how often its fastest algorithm per (layer, compression) differs
    from local's, over the layers both corpora hold."""
    import pandas as pd

    from dlas_predict.paths import CORPUS_SNAPSHOTS
    from dlas_predict.space.devices import profile_names

    def fastest(frame):
        ok = frame[frame["error"].isna() & (frame["tuning"] == "untuned")].copy()
        ok["best"] = ok["run_secs"].map(lambda s: min(json.loads(s)) if s else None)
        idx = ok.groupby(["conv", "compression"])["best"].idxmin()
        return ok.loc[idx].set_index(["conv", "compression"])["algorithm"]

    local_path = CORPUS_SNAPSHOTS / "local.parquet"
    base = fastest(pd.read_parquet(local_path)) if local_path.is_file() else None
    out = []
    for name in profile_names():
        path = CORPUS_SNAPSHOTS / f"{name}.parquet"
        if base is None or not path.is_file():
            out.append({"profile": name, "note": f"no shipped corpus ({path.name})"})
            continue
        other = fastest(pd.read_parquet(path))
        both = base.index.intersection(other.index)
        changed = int((base[both] != other[both]).sum())
        out.append({"profile": name, "layers": len(both), "changed": changed,
                    "share": changed / len(both) if len(both) else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=12)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res = measure_ways(args.kernels)
    res["profiles"] = profile_choices()
    n = res["kernels"]
    print(f"{n} untuned kernels, measured here and through a loopback tracker")
    print(f"{'conv':48s} {'algorithm':13s} {'here ms':>9s} {'board ms':>9s}")
    for r in res["rows"]:
        fmt = (lambda v: "FAIL" if v is None else f"{v:.4f}")
        print(f"{r['conv']:48s} {r['algorithm']:13s} {fmt(r['local_ms']):>9s} "
              f"{fmt(r['board_ms']):>9s}")
    ratios = [r["board_ms"] / r["local_ms"] for r in res["rows"]
              if r["board_ms"] and r["local_ms"]]
    if ratios:
        print(f"board / here, fastest run: median {statistics.median(ratios):.2f}× "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    for way in ("local", "rpc1", "rpc2"):
        s = res[f"{way}_s"]
        print(f"{way:6s}: {s:7.1f} s for {n} kernels, {60 * n / s:6.1f} kernels/min")
    print(f"RPC overhead per measurement (1 board vs here): "
          f"{(res['rpc1_s'] - res['local_s']) / n:.2f} s")
    print("(on loopback the two boards share this machine's cores with each other and "
          "with the client)")
    for p in res["profiles"]:
        if "note" in p:
            print(f"{p['profile']}: {p['note']}")
        else:
            print(f"{p['profile']}: fastest algorithm differs from local's on {p['changed']} "
                  f"of {p['layers']} (layer, compression) pairs ({p['share']:.0%})")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
