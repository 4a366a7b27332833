"""Networks with sigmoids, built three ways and timed in the same run: the sigmoid through a
vectorising polynomial exp with every squeeze-excitation gate multiplied in (the engine
before), the rational sigmoid the engine uses, and the rational sigmoid with the gates
folded into the next conv's weights (today's engine).

Each network is dense float32, every conv on ``--algorithm`` (the 1×1 layers on
``--pointwise``), epilogues fused. Every build's output is checked against onnxruntime's
on the same input (within 1e-3 of the output's scale), then timed with TVM's
``time_evaluator`` (10 calls a repeat, at least 50 ms each, 7 repeats; the best), the builds
taking turns for ``--rounds`` rounds; each build's best round is printed. Networks: the
zoo's EfficientNet-B0 and generated inverted-residual CNNs with SiLU and
squeeze-excitation. Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_gates.py [--network zoo:efficientnet-b0 ...] \\
        [--algorithm direct] [--pointwise gemm] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ALGORITHMS = ("direct", "gemm", "spatial_pack")
#: Generated networks of SiLU inverted-residual blocks with squeeze-excitation.
GENERATED = ("block=inverted", "activation=silu", "se=1", "layers=4", "kernels=32,64",
             "input=56", "downsample=1")


def _networks(names: list[str], tmp: Path) -> list[tuple[str, Path]]:
    from dlas_predict.networks.generate import generate
    from dlas_predict.networks.zoo import resolve

    if names:
        return [(n, resolve(n)) for n in names]
    out = [("zoo:efficientnet-b0", resolve("zoo:efficientnet-b0"))]
    for m in generate("cnn", list(GENERATED), tmp):
        out.append((m.path.stem, m.path))
    return out


def main() -> int:
    from kerneltime import pointwise as is_pointwise, thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", action="append", default=[],
                    help="zoo:NAME or an ONNX file (default: EfficientNet-B0 and two "
                         "generated SiLU networks with gates)")
    ap.add_argument("--algorithm", default="direct", choices=ALGORITHMS)
    ap.add_argument("--pointwise", default="gemm", choices=ALGORITHMS)
    ap.add_argument("--rounds", type=int, default=3)
    args = thread_args(ap)
    if args is None:
        return 1
    if args.rounds < 1:
        print("Error: --rounds must be at least 1", file=sys.stderr)
        return 1
    import numpy as np
    import onnx
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from dlas_predict.errors import DlasError
    from dlas_predict.measure import kernels
    from dlas_predict.measure.netbuild import LayerChoice, build
    from dlas_predict.measure.ortrun import session_options
    from dlas_predict.networks.graph import read_network
    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.space.devices import get_device

    device = get_device("local")
    target = tvm.target.Target(device.target)
    dev = tvm.cpu()
    rational = kernels.fast_sigmoid
    ways = (("exp sigmoid, gates multiplied", kernels.exp_sigmoid, False),
            ("rational sigmoid", rational, False),
            ("rational sigmoid, gates folded", rational, True))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            nets = _networks(args.network, Path(tmp))
        except (DlasError, OSError) as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        print(f"dense float32, {args.algorithm} (1×1 layers {args.pointwise}), "
              f"{args.threads} thread(s); best of {args.rounds} rounds, ms")
        print(f"{'network':52s} {'gates':>5s} " + " ".join(f"{w[0]:>31s}" for w in ways)
              + f" {'speedup':>8s}")
        for name, path in nets:
            try:
                net = read_network(path)
            except (DlasError, OSError) as e:
                print(f"Error: {name}: {e}", file=sys.stderr)
                return 1
            model = onnx.load(str(path))
            shape = tuple(net.input_shape)
            choices = [LayerChoice(Algorithm.parse(args.pointwise if is_pointwise(c.spec)
                                                   else args.algorithm), False)
                       for c in net.convs()]
            x = np.random.default_rng(0).random(shape, dtype=np.float32)
            sess = ort.InferenceSession(str(path), session_options(args.threads),
                                        providers=["CPUExecutionProvider"])
            ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
            runs, folded = [], 0
            for _label, sigmoid, fold in ways:
                kernels.fast_sigmoid = sigmoid  # read when the kernels and ops are built
                stats: dict = {}
                try:
                    exe = build(model, model.graph.input[0].name, shape, DType.FLOAT32,
                                choices, target, simd_bits=device.simd_bits, stats=stats,
                                fold_scales=fold)
                finally:
                    kernels.fast_sigmoid = rational
                folded = max(folded, stats.get("folded_gates", 0))
                vm = relax.VirtualMachine(exe, dev)
                xt = tvm.runtime.tensor(x, dev)
                out = vm["main"](xt).numpy()
                if np.abs(out - ref).max() > 1e-3 * max(1e-30, float(np.abs(ref).max())):
                    print(f"Error: {name}: a build disagrees with onnxruntime", file=sys.stderr)
                    return 1
                runs.append((vm, xt))
            best = [float("inf")] * len(ways)
            for _ in range(args.rounds):
                for i, (vm, xt) in enumerate(runs):
                    timer = vm.time_evaluator("main", dev, number=10, repeat=7,
                                              min_repeat_ms=50)
                    best[i] = min(best[i], min(timer(xt).results) * 1e3)
            cells = " ".join(f"{t:31.3f}" for t in best)
            print(f"{name[:52]:52s} {folded:5d} {cells} {best[0] / best[-1]:7.2f}x",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
