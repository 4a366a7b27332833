"""Where a whole-network build spends its time: every call the Relax VM makes, timed.

The network is built as ``collect --whole-network`` builds it (dense float32, every conv on
one algorithm, epilogues fused), run once to warm up, then ``--runs`` times with a VM
instrument that reads the clock before and after each call. Calls are grouped by the
function they run (our conv kernels ``conv<i>_<algorithm>``, TVM's scheduled ops by their
fused name) and summed per inference; the table gives the share of each group, the kinds
they fall into, and the instrumented total beside the uninstrumented latency (TVM's
``time_evaluator``, best of 7 repeats), whose difference is the VM and the instrument.
With ``--onnxruntime``, onnxruntime's fp32 session (the configuration of ``collect``'s
onnxruntime timings) runs the same input ``--runs`` times with its profiler on, and each
conv layer's time in our build is set beside its node's in onnxruntime's (a fused node
counts for the conv it starts from), grouped by the layer's kind; the rest of each
network (other ops, the VM or the session) is one row. Run it on a quiet machine:

    .venv/bin/python benchmarks/profile_network.py zoo:efficientnet-b0 [--algorithm direct] \\
        [--pointwise spatial_pack] [--threads 2] [--runs 20] [--top 25] [--onnxruntime]
"""

from __future__ import annotations

import argparse
import os
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


def _thread_args(ap: argparse.ArgumentParser) -> argparse.Namespace | None:
    """Parse ``--threads`` (default 2) and set TVM's thread count before TVM loads; None
    (after one ``Error:`` line) when it is below 1."""
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.threads < 1:
        print(f"Error: --threads must be at least 1, got {args.threads}", file=sys.stderr)
        return None
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    return args


def _is_pointwise(spec) -> bool:
    """An ungrouped 1x1 convolution."""
    return spec.R == spec.S == 1 and spec.groups == 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("network", help="zoo:NAME or an ONNX file")
    ap.add_argument("--algorithm", default="direct", choices=ALGORITHMS)
    ap.add_argument("--pointwise", default=None, choices=ALGORITHMS,
                    help="the algorithm of the ungrouped 1x1 layers (default: --algorithm)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--onnxruntime", action="store_true",
                    help="set each conv layer beside onnxruntime's time for its node")
    args = _thread_args(ap)
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
    from dlas_predict.measure.networks.build import LayerChoice, build
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
    pointwise = args.pointwise or args.algorithm
    choices = [LayerChoice(Algorithm.parse(pointwise if _is_pointwise(c.spec)
                                           else args.algorithm), False) for c in net.convs()]
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
    on = args.algorithm + (f" (pointwise on {pointwise})" if pointwise != args.algorithm
                           else "")
    print(f"{args.network}, dense float32 on {on}, {args.threads} thread(s), "
          f"{len(choices)} convs, {stats.get('fused_layers', 0)} with fused epilogues")
    print(f"latency (time_evaluator, best of 7): {plain_ms:.3f} ms; instrumented calls sum "
          f"to {whole:.3f} ms per inference")
    print(f"\n{'kind':34s} {'calls':>6s} {'ms':>8s} {'share':>6s}")
    for k, (ms, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{k:34s} {n:6d} {ms:8.3f} {ms / whole:6.1%}")
    print(f"\n{'function':48s} {'calls':>6s} {'ms':>8s} {'share':>6s}")
    for s, ms in sorted(per_run.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{s[:48]:48s} {calls[s] // args.runs:6d} {ms:8.3f} {ms / whole:6.1%}")
    if args.onnxruntime:
        ours = {int(m.group(1)): ms for s, ms in per_run.items()
                if (m := re.match(r"conv(\d+)_", s))}
        compare_onnxruntime(path, net, ours, whole, x.numpy(), args)
    return 0


def layer_kind(conv) -> str:
    """A conv layer's kind, for the comparison's groups."""
    if conv.depthwise:
        return f"depthwise {conv.R}x{conv.S}"
    if conv.H == 1 and conv.W == 1:
        return "1x1 on 1x1 (squeeze-excite)"
    if conv.R == 1 and conv.S == 1:
        return "pointwise" + (" (expand)" if conv.K > conv.C else " (project)")
    return f"dense {conv.R}x{conv.S}"


def onnxruntime_node_ms(path: Path, x, threads: int, runs: int) -> tuple[dict, dict, float]:
    """Milliseconds per run of each node onnxruntime ran (by its name, fused or not), each
    node's operator, and the median run, from its profiler: three warm-up runs, then
    ``runs`` counted."""
    import json
    import tempfile

    import onnxruntime as ort

    from dlas_predict.measure.networks.ortrun import session_options

    opts = session_options(threads)
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(3 + runs):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    counted = sorted((e for e in events if e.get("name") == "model_run"),
                     key=lambda e: e["ts"])[3:]
    start = counted[0]["ts"]
    nodes: dict[str, float] = defaultdict(float)
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start \
                and str(e.get("name", "")).endswith("_kernel_time"):
            name = e["name"][:-len("_kernel_time")]
            nodes[name] += e["dur"] / 1e3 / runs
            ops[name] = str(e.get("args", {}).get("op_name", "?"))
    whole = sorted(e["dur"] / 1e3 for e in counted)
    return dict(nodes), ops, whole[len(whole) // 2]


def _conv_of_outputs(path: Path) -> dict[str, str]:
    """Each output of the ONNX graph's Conv nodes and of the single-input chains after them
    (what onnxruntime fuses into a conv) → the name of the conv it comes from."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    out: dict[str, str] = {}

    def back(node):  # the input a conv chain comes through (a residual add: the conv's)
        ins = [producer.get(i) for i in node.input if i in producer]
        return next((n for n in ins if n.op_type == "Conv"), ins[0] if ins else None)

    for node in graph.node:
        start = node
        while start is not None and start.op_type != "Conv":
            start = back(start)
        if start is not None and start.op_type == "Conv":
            out[node.output[0]] = start.name or start.output[0]
    return out


def compare_onnxruntime(path: Path, net, ours: dict[int, float], ours_whole: float, x,
                        args) -> None:
    """Each conv layer's milliseconds in our build beside onnxruntime's, by layer kind, and
    onnxruntime's other nodes by operator (our builds fuse bias, batch norm, ReLU, ReLU6,
    SiLU and a residual add into the conv; onnxruntime fuses some of them)."""
    nodes, ops, ort_whole = onnxruntime_node_ms(path, x, args.threads, args.runs)
    convs = net.convs()
    by_name = {c.name: c.index for c in convs}
    theirs: dict[int, float] = defaultdict(float)
    others: dict[str, float] = defaultdict(float)
    conv_of = _conv_of_outputs(path)
    for name, ms in nodes.items():
        index = by_name.get(name)
        if index is None and "Conv" in ops[name]:
            # a rewritten node, named from the output it ends with (the conv's, or the
            # last op onnxruntime fused into it: a ReLU's, say) and a suffix
            starts = [o for o in conv_of if o and name.startswith(o)]
            index = by_name.get(conv_of[max(starts, key=len)]) if starts else None
        if index is not None:
            theirs[index] += ms
        else:
            others[ops[name]] += ms
    # our builds share one kernel (conv<first layer>_...) among the layers of one workload
    # and epilogue: compare by workload
    spec_of = {c.index: str(c.spec) for c in convs}
    rows: dict[str, list] = {}
    for c in convs:
        row = rows.setdefault(str(c.spec), [layer_kind(c.spec), 0, 0.0, 0.0])
        row[1] += 1
        row[3] += theirs.get(c.index, 0.0)
    for index, ms in ours.items():
        rows[spec_of[index]][2] += ms
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for k, n, a, b in rows.values():
        g = groups[k]
        g[0] += n
        g[1] += a
        g[2] += b
    print(f"\nagainst onnxruntime fp32 ({args.threads} thread(s), its profiler, mean of "
          f"{args.runs} runs): ours {ours_whole:.3f} ms instrumented, onnxruntime "
          f"{ort_whole:.3f} ms (median run)")
    print(f"\n{'layer kind':30s} {'layers':>6s} {'ours ms':>8s} {'ort ms':>8s} {'ratio':>6s} "
          f"{'gap ms':>7s}")
    table = [(k, *g) for k, g in groups.items()]
    table.append(("not a conv kernel (all)", 0, ours_whole - sum(ours.values()),
                  sum(others.values())))
    for k, n, a, b in sorted(table, key=lambda r: -(r[2] - r[3])):
        print(f"{k:30s} {n:6d} {a:8.3f} {b:8.3f} {_ratio(a, b)} {a - b:7.3f}")
    print("\nonnxruntime's other nodes by operator: " + ", ".join(
        f"{op} {ms:.3f}" for op, ms in sorted(others.items(), key=lambda kv: -kv[1])))
    print(f"\n{'workload (most behind first)':56s} {'layers':>6s} {'ours ms':>8s} "
          f"{'ort ms':>8s} {'ratio':>6s}")
    for spec, (_, n, a, b) in sorted(rows.items(), key=lambda kv: kv[1][3] - kv[1][2])[
            :args.top]:
        print(f"{spec[:56]:56s} {n:6d} {a:8.3f} {b:8.3f} {_ratio(a, b)}")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:6.2f}" if b > 0 else "     -"

if __name__ == "__main__":
    sys.exit(main())
