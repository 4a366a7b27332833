"""Slow spells: does the machine run the same kernels at the same speed, process after process,
and which probe sees it when it does not?

Each of ``--procs`` fresh processes builds a few conv kernels (float32 direct, GEMM, spatial
pack, a 1×1 conv, a CSR GEMM) and the two probes of :mod:`measure.contention`, then takes
``--rounds`` readings: the chain ratio, the canary's time, and each kernel's fastest run.
Afterwards, over all processes:

- a *slow reading* is one where some kernel ran over ``--slow`` (default 1.15) times its
  fastest reading of the whole benchmark;
- for each probe, how many slow readings it flagged (chain ratio over the protocol's
  ``contention_limit``; canary over ``slowdown_limit`` times its fastest of the benchmark)
  and how many quiet readings it flagged wrongly.

    .venv/bin/python benchmarks/bench_probe.py [--procs 16] [--rounds 3] [--json F]

Every figure is a measurement of this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KERNELS = (  # name, conv, algorithm, compression, ratio
    ("direct 64x32x32", "C=64,H=32,W=32,K=64,R=3,S=3,stride=1,pad=1", "direct", "dense", 0.0),
    ("gemm 64x32x32", "C=64,H=32,W=32,K=64,R=3,S=3,stride=1,pad=1", "gemm", "dense", 0.0),
    ("1x1 128x16x16", "C=128,H=16,W=16,K=128,R=1,S=1,stride=1,pad=0", "direct", "dense", 0.0),
    ("csr gemm 256x8x8 wp0.9", "C=256,H=8,W=8,K=256,R=3,S=3,stride=1,pad=1", "gemm",
     "weight_pruning", 0.9),
)


def one_process(rounds: int) -> list[dict]:
    """Run inside a fresh process: build the kernels and probes, take the readings."""
    import tvm

    from dlas_predict.space.config import ConvSpec, DType, SparsityPattern, Variant
    from dlas_predict.space.devices import get_device
    from dlas_predict.measure.contention import Canary, ContentionProbe, pool_threads
    from dlas_predict.measure.kernels import KernelSpec, build_kernel, device_args
    from dlas_predict.measure.knobs import resolve_knobs
    from dlas_predict.measure.reference import make_inputs
    from dlas_predict.measure.sparse import prune

    target_json = get_device("local").target
    target = tvm.target.Target(target_json)
    dev = tvm.cpu(0)
    timers = []
    for name, conv, alg, comp, ratio in KERNELS:
        spec, variant = ConvSpec.parse(conv), Variant(alg, comp, ratio)
        ks = KernelSpec(conv=spec, algorithm=variant.algorithm, sparse=variant.sparse,
                        dtype=DType.FLOAT32, knobs=resolve_knobs(spec, variant))
        x, w = make_inputs(spec, DType.FLOAT32, seed=0)
        if variant.sparse:
            w = prune(w, ratio, SparsityPattern.parse("none"))
        ex = build_kernel(ks, target)
        args = device_args(ks, x, w, dev)
        ex["main"](*args)
        timers.append((name, ex.mod.time_evaluator("main", dev, number=3, repeat=30), args))
    probe = ContentionProbe(target_json, pool_threads(), canary=Canary(target_json, None))
    out = []
    for _ in range(rounds):
        row = {"chain": probe.ratio(), "canary_s": probe.canary.seconds()}
        for name, timer, args in timers:
            row[name] = min(timer(*args).results)
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slow", type=float, default=1.15)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_process(args.rounds)))
        return 0

    from dlas_predict.measure.tasks import Protocol

    env = {**os.environ, "TVM_NUM_THREADS": str(os.cpu_count() or 1),
           "PYTHONPATH": str(ROOT)}
    readings = []
    for p in range(args.procs):
        out = subprocess.run([sys.executable, __file__, "--one", "--rounds", str(args.rounds)],
                             capture_output=True, text=True, env=env, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"process {p} failed: {out.stderr.strip()[-800:]}")
        readings += [{"proc": p, **r} for r in json.loads(out.stdout.strip().splitlines()[-1])]
    names = [k[0] for k in KERNELS]
    fastest = {n: min(r[n] for r in readings) for n in [*names, "canary_s"]}
    proto = Protocol()
    rows, counts = [], {"slow": 0, "quiet": 0, "chain_hit": 0, "chain_false": 0,
                        "canary_hit": 0, "canary_false": 0}
    for r in readings:
        worst = max(r[n] / fastest[n] for n in names)
        slow = worst > args.slow
        chain = r["chain"] > proto.contention_limit
        canary = r["canary_s"] / fastest["canary_s"] > proto.slowdown_limit
        counts["slow" if slow else "quiet"] += 1
        counts["chain_hit" if slow else "chain_false"] += int(chain)
        counts["canary_hit" if slow else "canary_false"] += int(canary)
        rows.append({"proc": r["proc"], "chain ratio": f"{r['chain']:.2f}",
                     "canary": f"{r['canary_s'] / fastest['canary_s']:.2f}",
                     **{n: f"{r[n] / fastest[n]:.2f}" for n in names},
                     "slow": "slow" if slow else ""})
    from dlas_predict.render import format_table

    print("each reading over the fastest of the benchmark:")
    print(format_table(rows))
    print(f"\n{len(readings)} readings in {args.procs} processes; fastest: "
          + ", ".join(f"{n} {fastest[n] * 1e3:.3f} ms" for n in [*names, "canary_s"]))
    print(f"slow readings (a kernel over {args.slow:g}× its fastest): {counts['slow']}; "
          f"chain probe (ratio > {proto.contention_limit:g}) flagged {counts['chain_hit']} of "
          f"them and {counts['chain_false']} of {counts['quiet']} quiet readings; canary "
          f"(> {proto.slowdown_limit:g}× its fastest) flagged {counts['canary_hit']} and "
          f"{counts['canary_false']}")
    if args.json:
        args.json.write_text(json.dumps({"readings": readings, "fastest": fastest,
                                         "counts": counts}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
