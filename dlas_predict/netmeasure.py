"""Whole-network measurements: a network compressed and lowered with a chosen conv algorithm
per layer, built by TVM Relax (:mod:`measure.netbuild`), checked against onnxruntime and
timed with the study's protocol, in the isolated worker.

A configuration is a compression (with its ratio) and an algorithm: ``direct``, ``gemm``,
``spatial_pack`` for every layer (the study's grid), or ``per_layer``, where each layer has
its own algorithm and kernel format (the candidate beyond the study).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Algorithm, Compression, COMPRESSION_KERNEL, DType
from .devices import Device
from .errors import ConfigError
from .records import TimedRuns

#: Algorithm label of a configuration whose layers each have their own kernel.
PER_LAYER = "per_layer"
#: How many inputs the numerical check runs (and the int8 calibration uses).
CHECK_SAMPLES = 8
NETWORK_VERSION = "2"


@dataclass(frozen=True)
class NetworkPlan:
    """One whole-network configuration to build: the compressed model and each conv's kernel."""

    model: str                       # path or zoo:NAME
    network: str                     # its name
    compression: Compression
    ratio: float | None
    algorithm: str                   # an Algorithm value or PER_LAYER
    layers: tuple[tuple[str, bool], ...]  # (algorithm, sparse) per conv, graph order
    #: tuned: each layer's schedule from the tuning database (dlas-predict tune) searched
    #: with ``budget`` trials; None: the hand schedules
    tuning: "object | None" = None   # measure.runner.TuningOptions

    @property
    def dtype(self) -> DType:
        return COMPRESSION_KERNEL[self.compression][1]

    @property
    def config(self) -> str:
        from .netplan import config_label

        return config_label(self.compression, self.ratio)

    def plan_json(self) -> str:
        return json.dumps([[a, bool(s)] for a, s in self.layers])

    def key(self, device: Device) -> str:
        parts = [device.name, device.fingerprint, self.network, self.config,
                 self.algorithm, self.plan_json(), NETWORK_VERSION]
        if self.tuning is not None:
            parts += ["tuned", str(self.tuning.budget)]
        text = "|".join(parts)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def uniform_plan(model: str, network: str, compression: Compression | str,
                 ratio: float | None, algorithm: str, n_layers: int) -> NetworkPlan:
    """The study's configuration: one algorithm for every layer; pruned networks run the
    CSR kernels, the others the dense ones."""
    comp = Compression.parse(compression)
    alg = Algorithm.parse(algorithm).value
    sparse = COMPRESSION_KERNEL[comp][0]
    return NetworkPlan(model, network, comp, ratio, alg, tuple([(alg, sparse)] * n_layers))


@dataclass
class NetworkMeasurement(TimedRuns):
    """The record of one whole-network build and timing (``error`` set on failure)."""

    key: str
    device: str
    fingerprint: str
    network: str
    config: str
    algorithm: str
    plan: str
    dtype: str
    run_secs: list[float] = field(default_factory=list)
    compile_s: float | None = None
    verified: bool | None = None
    max_error: float | None = None
    top1_agreement: float | None = None
    error: str | None = None
    timestamp: float = 0.0
    summary: str | None = None  # JSON of the network's NetworkSummary
    tuned_layers: list[int] | None = None    # tuned builds: layers with a tuned schedule
    untuned_layers: list[int] | None = None  # ... and those the database did not hold
    contention: float | None = None  # as MeasureResult.contention
    slowdown: float | None = None    # as MeasureResult.slowdown

    def to_row(self) -> dict:
        return {"key": self.key, "device": self.device, "fingerprint": self.fingerprint,
                "network": self.network, "config": self.config, "algorithm": self.algorithm,
                "plan": self.plan, "dtype": self.dtype, "run_secs": json.dumps(self.run_secs),
                "median_s": self.median_s, "spread": self.spread, "compile_s": self.compile_s,
                "verified": None if self.verified is None else int(self.verified),
                "max_error": self.max_error, "top1_agreement": self.top1_agreement,
                "error": self.error, "kernels_version": NETWORK_VERSION,
                "timestamp": self.timestamp, "summary": self.summary,
                "contention": self.contention, "slowdown": self.slowdown}


# ---- preparing the inputs of a build --------------------------------------------------------
def _samples(model: str, shape: tuple[int, ...], split: str) -> np.ndarray:
    """Real digits images for the trained zoo networks, else seeded normal noise."""
    from . import zoo

    if str(model).startswith(zoo.ZOO_PREFIX) and zoo.get(model).trained:
        from .digits import digits

        return digits(split, tuple(shape[1:])).x[:CHECK_SAMPLES].astype(np.float32)
    seed = 0 if split == "test" else 1
    return np.random.default_rng(seed).normal(size=(CHECK_SAMPLES, *shape[1:])).astype(np.float32)


def conv_scales(onnx_model, x: np.ndarray) -> list[tuple[float, float]]:
    """Per conv (graph order): the int8 scale of its input and of its output before the bias,
    from the float model run by onnxruntime on ``x`` (per-tensor MinMax, symmetric)."""
    import copy

    import onnx
    from onnx import helper, numpy_helper

    from .accuracy import _session

    model = copy.deepcopy(onnx_model)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    have = {o.name for o in model.graph.output}
    names = []
    for node in convs:
        for name in (node.input[0], node.output[0]):
            if name not in have:
                model.graph.output.append(helper.make_empty_tensor_value_info(name))
                have.add(name)
            names.append(name)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    sess = _session(model)
    input_name = sess.get_inputs()[0].name
    maxima: dict[str, float] = {}
    for i in range(len(x)):
        outs = sess.run(None, {input_name: x[i:i + 1]})
        by_name = dict(zip([o.name for o in sess.get_outputs()], outs))
        for node in convs:
            xin = by_name[node.input[0]]
            y = by_name[node.output[0]]
            if len(node.input) > 2 and node.input[2] in consts:
                y = y - consts[node.input[2]].reshape(1, -1, 1, 1)
            for key, arr in ((node.input[0], xin), (node.output[0] + "#acc", y)):
                maxima[key] = max(maxima.get(key, 0.0), float(np.max(np.abs(arr))))
    del onnx
    return [(max(maxima[n.input[0]], 1e-8) / 127.0,
             max(maxima[n.output[0] + "#acc"], 1e-8) / 127.0) for n in convs]


@dataclass
class _Prepared:
    path: Path
    input_name: str
    input_shape: tuple[int, ...]
    specs: list
    check: Path
    scales: list | None
    summary: str


class NetworkMeasurer:
    """Builds and times whole-network configurations on the local CPU, one worker task each.

    Compressed models are prepared once per (model, compression, ratio) and shared by the
    algorithms; ``store`` (a :class:`~dlas_predict.store.CorpusStore`) receives each record
    as soon as it is measured, and a key already stored is not measured again.
    """

    def __init__(self, device: Device, store=None, timeout_s: float = 600.0, protocol=None,
                 log=None) -> None:
        from measure.runner import LocalRunner
        from measure.worker import Protocol

        self.device, self.store, self.log = device, store, log
        self.runner = LocalRunner(device, protocol or Protocol(), timeout_s=timeout_s)
        self._tmp = tempfile.TemporaryDirectory(prefix="dlas-net-")
        self._prepared: dict[tuple, _Prepared] = {}
        # the last run's records timed again that replaced the stored one / kept it
        self.retimed = self.kept = 0

    def close(self) -> None:
        self.runner.close()
        self._tmp.cleanup()

    def __enter__(self) -> "NetworkMeasurer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self, plan: NetworkPlan) -> _Prepared:
        key = (plan.model, plan.compression, plan.ratio)
        if key in self._prepared:
            return self._prepared[key]
        import onnx

        from .accuracy import _session, prepare
        from .network import read_network

        pruning = plan.compression in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
        # float16 and int8 are applied by the build: start from the dense float model
        prep = prepare(plan.model, plan.compression.value if pruning else "dense",
                       plan.ratio if pruning else None)
        model = prep.compressed.model
        n = len(self._prepared)
        path = Path(self._tmp.name) / f"net{n}.onnx"
        onnx.save(model, str(path))
        net = read_network(path, plan.network)
        shape = tuple(net.input_shape)
        x = _samples(plan.model, shape, "test")
        sess = _session(model)
        y = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]})[0]
                            for i in range(len(x))])
        check = Path(self._tmp.name) / f"net{n}.check.npz"
        np.savez(check, x=x, y=y)
        scales = None
        if plan.compression is Compression.INT8:
            scales = conv_scales(model, _samples(plan.model, shape, "train"))
        from dataclasses import asdict

        from .netmodel import NetworkSummary

        done = _Prepared(path, sess.get_inputs()[0].name, shape,
                         [c.spec for c in net.convs()], check, scales,
                         json.dumps(asdict(NetworkSummary.of(net))))
        self._prepared[key] = done
        return done

    def measure(self, plan: NetworkPlan) -> NetworkMeasurement:
        """Build, check and time one configuration; a failure is a record with ``error``."""
        dev = self.device
        key = plan.key(dev)
        rec = NetworkMeasurement(key=key, device=dev.name, fingerprint=dev.fingerprint,
                                 network=plan.network, config=plan.config,
                                 algorithm=plan.algorithm, plan=plan.plan_json(),
                                 dtype=plan.dtype.value)
        try:
            prep = self._prepare(plan)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be prepared is data
            rec.error = f"prepare: {type(exc).__name__}: {exc}"[:2000]
            rec.timestamp = time.time()
            return rec
        rec.summary = prep.summary
        if len(plan.layers) != len(prep.specs):
            raise ConfigError(f"{plan.network}: the plan has {len(plan.layers)} conv layers, "
                              f"the network {len(prep.specs)}")
        payload = {
            "kind": "network", "onnx": str(prep.path), "input_name": prep.input_name,
            "input_shape": list(prep.input_shape), "dtype": plan.dtype.value,
            "layers": [{"algorithm": a, "sparse": s} for a, s in plan.layers],
            "specs": [s.to_dict() for s in prep.specs], "scales": prep.scales,
            "check": str(prep.check), "target": dev.target,
            "protocol": self.runner.protocol.to_dict(), "fingerprint": dev.fingerprint,
        }
        if plan.tuning is not None:
            pattern = COMPRESSION_KERNEL[plan.compression][2].value
            payload["tuning"] = {"db": str(plan.tuning.db_path(dev)),
                                 "budget": plan.tuning.budget, "cores": dev.cores,
                                 "pattern": "unstructured" if pattern == "none" else pattern}
        reply = self.runner.call(payload)
        rec.timestamp = time.time()
        if not reply.get("ok"):
            rec.error = str(reply.get("error") or "unknown failure")
            return rec
        rec.run_secs = list(reply["run_secs"])
        rec.compile_s = reply.get("compile_s")
        rec.verified = reply.get("verified")
        rec.max_error = reply.get("max_error")
        rec.top1_agreement = reply.get("top1_agreement")
        rec.tuned_layers = reply.get("tuned_layers")
        rec.untuned_layers = reply.get("untuned_layers")
        rec.contention = reply.get("contention")
        rec.slowdown = reply.get("slowdown")
        return rec

    def run(self, plans: list[NetworkPlan], skip_stored: bool = True,
            retime_slow: bool = False, retime_unprobed: bool = False
            ) -> list[NetworkMeasurement]:
        """Measure each plan (skipping keys already stored), committing each record; returns
        the records committed.

        With ``retime_slow`` a stored record timed on a slow machine is timed again and
        replaced when the new timing was quieter (counted in ``self.retimed``); otherwise the
        stored one is kept (counted in ``self.kept``, and not returned). ``retime_unprobed``
        also times again the records timed before the probes were recorded."""
        done, slow = set(), {}
        if self.store is not None and skip_stored:
            done = {r["key"] for r in self.store.network_measurements("error IS NULL")}
        if self.store is not None and (retime_slow or retime_unprobed):
            slow = self.store.slow_keys(self.runner.protocol, "network_measurements",
                                        unprobed=retime_unprobed)
        out = []
        self.retimed = self.kept = 0
        for i, plan in enumerate(plans, 1):
            key = plan.key(self.device)
            if key in done and key not in slow:
                continue
            rec = self.measure(plan)
            if key in slow and not rec.quieter_than(slow[key], self.runner.protocol):
                self.kept += 1
                if self.log:
                    self.log(f"[{i}/{len(plans)}] {plan.network} {plan.config} "
                             f"{plan.algorithm}: timed again, no quieter; the stored record "
                             "is kept")
                continue
            self.retimed += int(key in slow)
            if self.store is not None:
                self.store.add_network_measurement(rec.to_row(), replace=key in slow)
            if self.log:
                what = (f"{rec.median_s * 1e3:.2f} ms (compile {rec.compile_s:.1f} s, "
                        f"verified={rec.verified})" if rec.error is None
                        else f"FAILED: {rec.error[:200]}")
                self.log(f"[{i}/{len(plans)}] {plan.network} {plan.config} {plan.algorithm}: "
                         f"{what}")
            out.append(rec)
        return out
