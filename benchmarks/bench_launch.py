"""What one kernel call costs beyond its work: our Relax VM's launch and TVM's thread pool,
beside onnxruntime's per-node cost, measured in one run.

A chain of ``--ops`` trivial kernels (each adds 1 to a tensor of ``--elems`` floats, the
output of one the input of the next) and a chain of one are timed; the difference over
``--ops - 1`` is the cost of one more call. Three kinds of kernel:

- *serial*: a plain loop (the VM's call and the kernel's entry, no thread pool);
- *parallel*: the loop split across the pool's threads (what every conv kernel of ours
  does: the pool's fork and join on top);
- *onnxruntime*: a chain of ``Add`` nodes in one session, at the same threads.

Each TVM configuration runs in its own process, because the pool reads its environment
once: the default pool, and ``TVM_THREAD_POOL_SPIN_COUNT`` at 0 (workers sleep at once
after a job) and at the values given by ``--spin``. Timing: ``time_evaluator`` (VM) or
``perf_counter`` loops (onnxruntime), the best of 7 repeats of at least 50 ms each.

    .venv/bin/python benchmarks/bench_launch.py [--threads 2] [--ops 64] [--elems 64]
        [--spin 0,1000000]
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


def _chain_module(n: int, elems: int, parallel: bool):
    import tvm
    from tvm import relax, te

    x_ = te.placeholder((elems,), "float32", name="x")
    y_ = te.compute((elems,), lambda i: x_[i] + 1.0, name="y")
    func = te.create_prim_func([x_, y_])
    if parallel:
        sch = tvm.s_tir.Schedule(func)
        (loop,) = sch.get_loops(sch.get_sblock("y"))
        sch.parallel(loop)
        func = sch.mod["main"]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((elems,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            # opaque: the pipeline must not fuse the chain into one kernel
            gv = bb.add_func(func.without_attr("global_symbol").with_attr("op_pattern", 8),
                             "add_one")
            y = x
            for _ in range(n):
                y = bb.emit(relax.call_tir(gv, [y], relax.TensorType((elems,),
                                                                          "float32")))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _time_vm(mod, elems: int) -> tuple[float, float]:
    """Seconds per call of ``main`` (best of 7 repeats), and its output's first element
    (the number of kernels that ran)."""
    import numpy as np
    import tvm
    from tvm import relax

    from dlas_predict.space.devices import get_device

    target = tvm.target.Target(get_device("local").target)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    x = tvm.runtime.tensor(np.zeros(elems, np.float32), tvm.cpu())
    out = vm["main"](x).numpy()
    timer = vm.time_evaluator("main", tvm.cpu(), number=10, repeat=7, min_repeat_ms=50)
    return min(timer(x).results), float(out[0])


def tvm_child(args) -> dict:
    """In a process of its own: the per-call cost of serial and parallel kernels."""
    res = {}
    for kind, parallel in (("serial", False), ("parallel", True)):
        one, v1 = _time_vm(_chain_module(1, args.elems, parallel), args.elems)
        many, vn = _time_vm(_chain_module(args.ops, args.elems, parallel), args.elems)
        assert (v1, vn) == (1.0, float(args.ops)), (v1, vn)  # every kernel ran
        res[kind] = {"one_us": one * 1e6, "chain_us": many * 1e6,
                     "per_call_us": (many - one) / (args.ops - 1) * 1e6}
    return res


def onnxruntime_cost(args) -> dict:
    import time

    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def session(n: int):
        one = helper.make_tensor("one", TensorProto.FLOAT, [args.elems], [1.0] * args.elems)
        names = ["x"] + [f"t{i}" for i in range(n)]
        nodes = [helper.make_node("Add", [names[i], "one"], [names[i + 1]])
                 for i in range(n)]
        g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [args.elems])], [helper.make_tensor_value_info(
                names[-1], TensorProto.FLOAT, [args.elems])], [one])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep n
        return ort.InferenceSession(m.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])

    x = np.zeros(args.elems, np.float32)

    def best(sess, n) -> float:
        out = sess.run(None, {"x": x})[0]
        assert float(out[0]) == float(n)
        reps = []
        for _ in range(7):
            k, t0 = 0, time.perf_counter()
            while True:
                sess.run(None, {"x": x})
                k += 1
                if time.perf_counter() - t0 >= 0.05:
                    break
            reps.append((time.perf_counter() - t0) / k)
        return min(reps)

    one, many = best(session(1), 1), best(session(args.ops), args.ops)
    return {"one_us": one * 1e6, "chain_us": many * 1e6,
            "per_call_us": (many - one) / (args.ops - 1) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ops", type=int, default=64)
    ap.add_argument("--elems", type=int, default=64)
    ap.add_argument("--spin", default="0,1000000",
                    help="TVM_THREAD_POOL_SPIN_COUNT values timed beside the default")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("threads", "elems"):
        if getattr(args, name) < 1:
            print(f"Error: --{name} must be at least 1", file=sys.stderr)
            return 1
    if args.ops < 2:
        print("Error: --ops must be at least 2 (a chain of one is the baseline)",
              file=sys.stderr)
        return 1
    try:
        spins = [int(s) for s in args.spin.split(",") if s.strip()]
    except ValueError:
        print(f"Error: --spin takes integers, comma-separated; got {args.spin!r}",
              file=sys.stderr)
        return 1
    if args.child:
        print(json.dumps(tvm_child(args)))
        return 0
    rows = []
    for spin in [None, *spins]:
        env = {**os.environ, "TVM_NUM_THREADS": str(args.threads)}
        env.pop("TVM_THREAD_POOL_SPIN_COUNT", None)
        if spin is not None:
            env["TVM_THREAD_POOL_SPIN_COUNT"] = str(spin)
        p = subprocess.run([sys.executable, __file__, "--child", "--threads",
                            str(args.threads), "--ops", str(args.ops), "--elems",
                            str(args.elems)], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"Error: the timing process failed: {p.stderr.strip()[-500:]}",
                  file=sys.stderr)
            return 1
        res = json.loads(p.stdout.strip().splitlines()[-1])
        label = "TVM, default pool" if spin is None else f"TVM, spin count {spin}"
        for kind in ("serial", "parallel"):
            rows.append((f"{label}, {kind} kernel", res[kind]))
    rows.append(("onnxruntime, Add node", onnxruntime_cost(args)))
    print(f"{args.ops} chained kernels of {args.elems} floats vs one, {args.threads} "
          "thread(s); best of 7 repeats")
    print(f"{'configuration':44s} {'one us':>8s} {'chain us':>9s} {'per call us':>12s}")
    for label, r in rows:
        print(f"{label:44s} {r['one_us']:8.2f} {r['chain_us']:9.1f} {r['per_call_us']:12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
