"""What today's engine's int8 builds gained over the older engines' builds of the same
configurations, read from a store's whole-network records (nothing is measured).

For ``--device`` in ``--store``: the int8 builds with every layer on GEMM (and the per-layer
ones) of today's engine against the older engine's build of the same plan (fastest runs,
geometric mean); our fastest int8 build against our fastest float32 (dense) build of each
network; our fastest int8 build against onnxruntime fp32, with the older engines' int8
builds and with today's; and a table of the zoo networks. Older builds are those today's
engine builds otherwise (``rebuilt_since``); the others count as today's.

    .venv/bin/dlas-predict corpus import datasets/corpus/local.parquet --store /tmp/l.sqlite
    .venv/bin/dlas-predict corpus import datasets/corpus/local.onnxruntime.parquet \\
        --store /tmp/l.sqlite
    .venv/bin/python benchmarks/int8_builds.py --store /tmp/l.sqlite [--device local]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ZOO = ("resnet18-cifar", "vgg16-cifar", "mobilenetv1-cifar", "mobilenetv2-cifar", "resnet50",
       "mobilenetv2")


def _gm(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--device", default="local")
    args = ap.parse_args()

    import json

    from dlas_predict.corpus.networks import NETWORK_VERSION, ONNXRUNTIME
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.errors import DlasError
    from dlas_predict.models.evaluation import current_engine, unchanged_builds
    from dlas_predict.space.devices import get_device

    try:
        dev = get_device(args.device, with_target=False)
        with CorpusStore(args.store, must_exist=True) as db:
            meas = db.network_records("error IS NULL AND device = ?", (dev.name,))
            layers_of: dict[tuple, list[dict]] = {}
            for r in db.network_configs():
                layers_of.setdefault((r["network"], r["config"]), []).append(r)
    except DlasError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    unchanged = unchanged_builds(layers_of, dev)
    today, older = {}, {}
    for m in sorted(meas, key=lambda m: m.timestamp or 0):
        if m.tuned_layers is not None or not m.run_secs:
            continue
        key = (m.network, m.config, m.algorithm)
        (today if current_engine(m, unchanged) else older)[key] = m
    if not any(k[1] == "int8" and k[2] != ONNXRUNTIME for k in today):
        print(f"Error: {args.store} holds no int8 build of {dev.name} by today's engine",
              file=sys.stderr)
        return 1

    def best(m) -> float:
        return min(m.run_secs)

    def ours(pool: dict, net: str, config: str) -> list[float]:
        return [best(m) for k, m in pool.items()
                if k[0] == net and k[1] == config and k[2] != ONNXRUNTIME]

    print(f"{dev.name} in {args.store}: fastest runs")
    for alg in ("gemm", "per_layer"):
        r = [best(older[k]) / best(m) for k, m in today.items()
             if k[1] == "int8" and k[2] == alg and k in older and older[k].plan == m.plan]
        if r:
            print(f"int8 {alg}, older engine / today's on the same plan: {len(r)} networks, "
                  f"x{_gm(r):.2f} (x{min(r):.2f} to x{max(r):.2f})")
    nets = sorted({k[0] for k in today})
    # before today's engine: the builds it carries unchanged, else the latest older one
    before = {**older, **{k: m for k, m in today.items() if m.version != NETWORK_VERSION}}
    pools = (("older engines' int8 builds", before), ("today's", today))
    for label, pool in pools:
        ratios = [min(ours(pool, n, "int8")) / min(ours(today, n, "dense"))
                  for n in nets if ours(pool, n, "int8") and ours(today, n, "dense")]
        if ratios:
            print(f"our fastest int8 / our fastest float32 build, {label}: {len(ratios)} "
                  f"networks, x{_gm(ratios):.2f} (x{min(ratios):.2f} to x{max(ratios):.2f}), "
                  f"int8 faster on {sum(x < 1 for x in ratios)}")
    ort = {k[0]: best(m) for k, m in today.items() if k[2] == ONNXRUNTIME and k[1] == "dense"}
    ort8 = {k[0]: best(m) for k, m in today.items() if k[2] == ONNXRUNTIME and k[1] == "int8"}
    for label, pool in pools:
        r = [min(ours(pool, n, "int8")) / ort[n] for n in nets
             if n in ort and ours(pool, n, "int8")]
        if r:
            print(f"our fastest int8 / onnxruntime fp32, {label}: {len(r)} networks, "
                  f"x{_gm(r):.2f}, faster on {sum(x < 1 for x in r)}")

    def ms(m) -> str:
        return f"{best(m) * 1e3:.3f}" if m else "-"

    print("\n| network | int8 GEMM, older → today's (ms) | int8 per-layer, older → today's "
          "(layers on GEMM) | our fastest float32 build | onnxruntime fp32 | onnxruntime int8 |")
    print("|---|---|---|---|---|---|")
    for n in ZOO:
        if n not in nets or not ours(today, n, "dense"):
            continue
        per = today.get((n, "int8", "per_layer"))
        plan = json.loads(per.plan) if per else []
        on_gemm = f" ({sum(a == 'gemm' for a, _ in plan)} of {len(plan)})" if per else ""
        fmt = lambda v: f"{v * 1e3:.3f}" if v else "-"  # noqa: E731
        print(f"| {n} | {ms(older.get((n, 'int8', 'gemm')))} → "
              f"{ms(today.get((n, 'int8', 'gemm')))} | "
              f"{ms(older.get((n, 'int8', 'per_layer')))} → {ms(per)}{on_gemm} | "
              f"{min(ours(today, n, 'dense')) * 1e3:.3f} | {fmt(ort.get(n))} | "
              f"{fmt(ort8.get(n))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
