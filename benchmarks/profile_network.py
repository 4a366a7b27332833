"""Where a whole-network build spends its time: every call the Relax VM makes, timed.

The network is built as ``collect --whole-network`` builds it (dense float32, every conv on
one algorithm, epilogues fused), run once to warm up, then ``--runs`` times with a VM
instrument that reads the clock before and after each call. Calls are grouped by the
function they run (our conv kernels ``conv<i>_<algorithm>``, TVM's scheduled ops by their
fused name) and summed per inference; the table gives the share of each group, the kinds
they fall into, and the instrumented total beside the uninstrumented latency (TVM's
``time_evaluator``, best of 7 repeats), whose difference is the VM and the instrument.
Run it on a quiet machine:

    .venv/bin/python benchmarks/profile_network.py zoo:efficientnet-b0 [--algorithm direct] \\
        [--threads 2] [--runs 20] [--top 25]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ALGORITHMS = ("direct", "gemm", "spatial_pack")


def kind(symbol: str) -> str:
    """The kind of a VM call: our conv kernel, a VM builtin, or a TVM-scheduled op."""
    if re.match(r"conv\d+_", symbol):
        return "conv kernel (ours)"
    if symbol.startswith("vm."):
        return "VM builtin (allocation, shapes)"
    return "other op (TVM-scheduled)"


def main() -> int:
    from kerneltime import thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("network", help="zoo:NAME or an ONNX file")
    ap.add_argument("--algorithm", default="direct", choices=ALGORITHMS)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = thread_args(ap)
    if args is None:
        return 1
    if args.runs < 1 or args.top < 1:
        print("Error: --runs and --top must be at least 1", file=sys.stderr)
        return 1
    import numpy as np
    import onnx
    import tvm
    from tvm import relax

    from dlas_predict.errors import DlasError
    from dlas_predict.measure.netbuild import LayerChoice, build
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.zoo import resolve
    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.space.devices import get_device

    try:
        path = resolve(args.network)
        net = read_network(path)
    except (DlasError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    device = get_device("local")
    model = onnx.load(str(path))
    input_name = model.graph.input[0].name
    shape = tuple(net.input_shape)
    choices = [LayerChoice(Algorithm.parse(args.algorithm), False)] * len(net.convs())
    stats: dict = {}
    executable = build(model, input_name, shape, DType.FLOAT32, choices,
                       tvm.target.Target(device.target), simd_bits=device.simd_bits,
                       stats=stats)
    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    x = tvm.runtime.tensor(np.random.default_rng(0).random(shape, dtype=np.float32), dev)
    timer = vm.time_evaluator("main", dev, number=10, repeat=7, min_repeat_ms=50)
    plain_ms = min(timer(x).results) * 1e3

    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    started: list[float] = []

    def instrument(func, symbol, before, ret, *fargs):
        now = time.perf_counter()
        if before:
            started.append(now)
        else:
            totals[str(symbol)] += now - started.pop()
            calls[str(symbol)] += 1
        return 0

    vm["main"](x)
    vm.set_instrument(instrument)
    vm["main"](x)
    totals.clear()
    calls.clear()
    for _ in range(args.runs):
        vm["main"](x)
    per_run = {s: t / args.runs * 1e3 for s, t in totals.items()}
    whole = sum(per_run.values())
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for s, ms in per_run.items():
        by_kind[kind(s)][0] += ms
        by_kind[kind(s)][1] += calls[s] // args.runs
    print(f"{args.network}, dense float32 on {args.algorithm}, {args.threads} thread(s), "
          f"{len(choices)} convs, {stats.get('fused_layers', 0)} with fused epilogues")
    print(f"latency (time_evaluator, best of 7): {plain_ms:.3f} ms; instrumented calls sum "
          f"to {whole:.3f} ms per inference")
    print(f"\n{'kind':34s} {'calls':>6s} {'ms':>8s} {'share':>6s}")
    for k, (ms, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{k:34s} {n:6d} {ms:8.3f} {ms / whole:6.1%}")
    print(f"\n{'function':48s} {'calls':>6s} {'ms':>8s} {'share':>6s}")
    for s, ms in sorted(per_run.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{s[:48]:48s} {calls[s] // args.runs:6d} {ms:8.3f} {ms / whole:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
