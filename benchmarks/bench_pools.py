"""The generic schedule of pools and the ops after them: a padded pool's padding as a stage
of its own and the ops after a reduction in its parallel loop, against the padding inlined
into the window and every op after it in a loop nest of its own (``_schedule_generic``'s
``pools`` off), same run.

Two parts:

- ops: the pools of the networks the tool builds, each with the add or division after it
  as the Relax build fuses them: NAS-Bench-201's 3×3 average pools (stride 1, padding not
  counted) at its three stages, ResNet-50's padded 3×3 max pool, VGG's 2×2 max pool and
  the CIFAR ResNets' 4×4 average pool. Checked against each other, timed with TVM's
  ``time_evaluator`` (7 repeats of at least 20 ms, the best);
- networks: whole builds (dense float32, direct kernels, epilogues fused) of NAS-Bench-201
  cells chosen at random with a fixed seed (and the all-pool cell below) and of zoo
  networks, each built both ways, outputs compared, the two timed in alternation (three
  rounds of 7 repeats of at least 50 ms each; the best).

Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_pools.py [--threads 2] [--cells 3] \\
        [--network zoo:resnet18-cifar ...]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: A cell of five 3×3 average pools and one conv: the pools' share at its largest.
POOL_CELL = ("|avg_pool_3x3~0|+|avg_pool_3x3~0|avg_pool_3x3~1|+|nor_conv_3x3~0|"
             "avg_pool_3x3~1|avg_pool_3x3~2|")
NETWORKS = ["zoo:resnet18-cifar", "zoo:vgg16-cifar", "zoo:mobilenetv2-cifar"]


def _ops():
    """(name, TE tensors) of each op: inputs, then the output."""
    from tvm import te, topi

    def pool(c, size, kind, k, s, p, add, count_pad=False):
        x = te.placeholder((1, c, size, size), "float32", name="x")
        y = topi.nn.pool2d(x, (k, k), (s, s), (1, 1), (p, p, p, p), kind,
                           count_include_pad=count_pad)
        if not add:
            return [x, y]
        z = te.placeholder(tuple(y.shape), "float32", name="z")
        return [x, z, te.compute(y.shape, lambda *i: y(*i) + z(*i), name="T_add")]

    out = []
    for c, size in ((16, 32), (32, 16), (64, 8)):
        out.append((f"avg 3x3 s1 p1, {c}x{size}x{size}", pool(c, size, "avg", 3, 1, 1, False)))
        out.append((f"avg 3x3 s1 p1 + add, {c}x{size}x{size}",
                    pool(c, size, "avg", 3, 1, 1, True)))
    out.append(("max 3x3 s2 p1, 64x112x112", pool(64, 112, "max", 3, 2, 1, False)))
    out.append(("max 2x2 s2, 64x32x32", pool(64, 32, "max", 2, 2, 0, False)))
    out.append(("avg 4x4 s4, 512x4x4", pool(512, 4, "avg", 4, 4, 0, False)))
    return out


def _time(func, arrays, target, dev) -> tuple[float, "object"]:
    import tvm

    ex = tvm.compile(tvm.IRModule({"main": func}), target=target)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    ex["main"](*args)
    timer = ex.mod.time_evaluator("main", dev, number=20, repeat=7, min_repeat_ms=20)
    return min(timer(*args).results) * 1e6, args[-1].numpy()


def bench_ops(target, dev) -> list[float]:
    import numpy as np
    from tvm import te

    from dlas_predict.measure.netbuild import _schedule_generic

    rng = np.random.default_rng(0)
    print(f"{'op':34s} {'before us':>10s} {'after us':>9s} {'speedup':>8s}")
    ratios = []
    for name, tensors in _ops():
        func = te.create_prim_func(tensors)
        arrays = [rng.standard_normal([int(d) for d in t.shape]).astype("float32")
                  for t in tensors[:-1]]
        arrays.append(np.zeros([int(d) for d in tensors[-1].shape], "float32"))
        (old, a), (new, b) = (_time(_schedule_generic(func, pools=p), arrays, target, dev)
                              for p in (False, True))
        if not np.allclose(a, b, rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"{name}: the two schedules disagree")
        ratios.append(old / new)
        print(f"{name:34s} {old:10.2f} {new:9.2f} {old / new:7.2f}x", flush=True)
    return ratios


def _network_vm(model, shape, device, pools: bool):
    """The network built dense float32 on direct kernels, its VM and input."""
    import numpy as np
    import tvm
    from tvm import relax

    from dlas_predict.measure import netbuild
    from dlas_predict.space.config import Algorithm, DType

    generic = netbuild._schedule_generic
    netbuild._schedule_generic = functools.partial(generic, pools=pools)
    try:
        n = sum(1 for node in model.graph.node if node.op_type == "Conv")
        choices = [netbuild.LayerChoice(Algorithm.DIRECT, False)] * n
        ex = netbuild.build(model, model.graph.input[0].name, shape, DType.FLOAT32, choices,
                            tvm.target.Target(device.target), simd_bits=device.simd_bits)
    finally:
        netbuild._schedule_generic = generic
    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.random.default_rng(0).random(shape, dtype=np.float32), dev)
    return relax.VirtualMachine(ex, dev), x


def _networks_ms(model, shape, device, rounds: int = 3) -> list[tuple[float, "object"]]:
    """(best ms, output) of the build before and after, timed in alternation (``rounds``
    times each, 7 repeats of at least 50 ms per round), so drift in the machine's speed
    falls on both."""
    vms = [_network_vm(model, shape, device, p) for p in (False, True)]
    best = [float("inf")] * len(vms)
    for _ in range(rounds):
        for i, (vm, x) in enumerate(vms):
            timer = vm.time_evaluator("main", x.device, number=10, repeat=7,
                                      min_repeat_ms=50)
            best[i] = min(best[i], min(timer(x).results) * 1e3)
    return [(ms, vm["main"](x).numpy()) for ms, (vm, x) in zip(best, vms)]


def bench_networks(cells: int, networks: list[str]) -> list[float]:
    import random

    import numpy as np
    import onnx

    from dlas_predict.networks import nasbench201 as nb
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.zoo import resolve
    from dlas_predict.space.devices import get_device

    device = get_device("local")
    archs = [nb.parse_arch(POOL_CELL)] + random.Random(0).sample(nb.all_archs(), cells)
    print(f"\n{'network (dense float32, direct)':58s} {'before ms':>10s} {'after ms':>9s} "
          f"{'speedup':>8s}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = nb.generate(archs, Path(tmp)) + [resolve(n) for n in networks]
        for path, label in zip(paths, [a.string for a in archs] + networks):
            model = onnx.load(str(path))
            shape = tuple(read_network(path).input_shape)
            (old, a), (new, b) = _networks_ms(model, shape, device)
            if not np.allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(a).max())):
                raise RuntimeError(f"{label}: the two builds disagree")
            ratios.append(old / new)
            print(f"{label[:58]:58s} {old:10.3f} {new:9.3f} {old / new:7.2f}x", flush=True)
    return ratios


def main() -> int:
    from kerneltime import spread, thread_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, default=3, help="random NAS-Bench-201 cells")
    ap.add_argument("--network", action="append", default=None,
                    help=f"zoo:NAME or ONNX (repeatable; default {' '.join(NETWORKS)})")
    args = thread_args(ap)
    if args is None:
        return 1
    if args.cells < 0:
        print(f"Error: --cells must be at least 0, got {args.cells}", file=sys.stderr)
        return 1
    from dlas_predict.errors import DlasError
    from dlas_predict.networks.zoo import resolve

    networks = args.network or NETWORKS
    try:  # every network named is readable before anything is measured
        for name in networks:
            resolve(name)
    except (DlasError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    import tvm

    from dlas_predict.space.devices import get_device

    target = tvm.target.Target(get_device("local").target)
    ops = bench_ops(target, tvm.cpu())
    nets = bench_networks(args.cells, networks)
    print(f"\nops: {len(ops)}, after over before {spread(ops)}")
    print(f"networks: {len(nets)}, after over before {spread(nets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
