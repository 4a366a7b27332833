"""Timing single kernels in this process, for the benchmarks that compare schedules of one
layer: TVM's ``time_evaluator``, 7 repeats of 20 calls of at least 20 ms each, the best
repeat."""

from __future__ import annotations

import argparse
import os
import sys

#: Bias and ReLU, the epilogue the compared kernels run fused.
EPILOGUE = (("bias",), ("relu",))


def thread_args(ap: argparse.ArgumentParser,
                limit: int | None = None) -> argparse.Namespace | None:
    """Parse ``--threads`` (default 2), and ``--limit`` (default ``limit``) where ``limit``
    is given, and set TVM's thread count before TVM loads; None (after one ``Error:`` line)
    when either is below 1."""
    ap.add_argument("--threads", type=int, default=2)
    if limit is not None:
        ap.add_argument("--limit", type=int, default=limit, help="layers timed")
    args = ap.parse_args()
    for name in ("threads", "limit"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            print(f"Error: --{name} must be at least 1, got {value}", file=sys.stderr)
            return None
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    return args


class Timer:
    """Builds and times kernels of one shape's inputs on the local CPU."""

    def __init__(self) -> None:
        import tvm

        from dlas_predict.space.devices import get_device

        device = get_device("local")
        self.target = tvm.target.Target(device.target)
        self.bits = device.simd_bits or 512
        self.dev = tvm.cpu()

    def inputs(self, spec, rng):
        """Input, weights and the bias argument of ``spec``."""
        import numpy as np

        return (rng.random(spec.input_shape, dtype=np.float32),
                rng.random(spec.weight_shape, dtype=np.float32),
                {"bias": rng.random(spec.K, dtype=np.float32)})

    def time(self, ks, build, inputs) -> tuple[float, "object"]:
        """(best repeat in ms, output) of kernel ``ks`` built by ``build(ks, target)``."""
        from dlas_predict.measure.kernels.build import device_args

        x, w, extras = inputs
        mod = build(ks, self.target).mod
        call = device_args(ks, x, w, self.dev, extras)
        mod["main"](*call)
        timer = mod.time_evaluator("main", self.dev, number=20, repeat=7, min_repeat_ms=20)
        return min(timer(*call).results) * 1e3, call[-1].numpy()


def short(spec) -> str:
    """A layer's ``measure --conv`` text without its default stride and padding."""
    return spec.to_spec().replace(",stride=1", "").replace(",pad=0", "")


def disagree(outputs: list) -> bool:
    """Whether the outputs of builds of one layer differ by more than 1e-3 of its scale."""
    import numpy as np

    scale = max(1.0, float(np.abs(outputs[0]).max()))
    return any(float(np.abs(o - outputs[0]).max()) > 1e-3 * scale for o in outputs[1:])


def spread(ratios: list[float]) -> str:
    """``×G (geometric mean), ×MIN to ×MAX`` of a run's speedups."""
    import numpy as np

    geo = float(np.exp(np.mean(np.log(ratios))))
    return f"×{geo:.2f} (geometric mean), ×{min(ratios):.2f} to ×{max(ratios):.2f}"


def pointwise(spec) -> bool:
    """An ungrouped 1×1 convolution."""
    return (spec.R, spec.S, spec.groups) == (1, 1, 1)


def network_layers(network: str, keep, what: str) -> list | None:
    """The conv workloads of ``network`` (an ONNX file or ``zoo:NAME``) that ``keep`` holds
    for, one each, the most work first; None (after one ``Error:`` line) when it cannot be
    read or has no ``what``."""
    from dlas_predict.errors import DlasError
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.zoo import resolve

    try:
        net = read_network(resolve(network))
    except (DlasError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return None
    specs = sorted({c.spec for c in net.convs() if keep(c.spec)}, key=lambda s: -s.macs)
    if not specs:
        print(f"Error: {network} has no {what}", file=sys.stderr)
        return None
    return specs
