"""Whole networks: prepare a compressed model, build it with TVM Relax
(:mod:`dlas_predict.measure.networks.build`) in the isolated worker, check it against onnxruntime,
and time it with the study's protocol.

:class:`NetworkRunner` is the batch interface: plans in, one
:class:`~dlas_predict.measure.networks.plans.NetworkMeasurement` per plan out, a failure being a
record with ``error``. Storing and skipping what is stored is the corpus's job
(:func:`dlas_predict.corpus.collect.collect_networks`).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from dlas_predict.measure.networks.plans import NetworkMeasurement, NetworkPlan
from dlas_predict.errors import ConfigError
from dlas_predict.space.config import COMPRESSION_KERNEL, Compression
from dlas_predict.space.devices import Device

from dlas_predict.measure.execution.tasks import NetworkTask, TuningRequest

#: How many inputs the numerical check runs (and the int8 calibration uses).
CHECK_SAMPLES = 8


# ---- preparing the inputs of a build --------------------------------------------------------
def _samples(model: str, shape: tuple[int, ...], split: str, tokens: int = 0) -> np.ndarray:
    """:data:`CHECK_SAMPLES` inputs of ``shape`` (a batch of one, wherever its batch axis
    is: a sequence's steps may come first), stacked on a new first axis: real digits
    images for the trained zoo networks, else seeded normal noise; for a network of token
    ids (``tokens``: one more than the largest), seeded uniform ids."""
    from dlas_predict.networks import zoo

    if str(model).startswith(zoo.ZOO_PREFIX) and zoo.get(model).trained:
        from dlas_predict.compression.digits import digits

        images = digits(split, tuple(shape[1:])).x[:CHECK_SAMPLES].astype(np.float32)
        return images[:, None]
    rng = np.random.default_rng(0 if split == "test" else 1)
    if tokens:
        return rng.integers(0, tokens, size=(CHECK_SAMPLES, *shape), dtype=np.int64)
    return rng.normal(size=(CHECK_SAMPLES, *shape)).astype(np.float32)


def conv_scales(onnx_model, x: np.ndarray) -> list[tuple[float, float]]:
    """Per conv (graph order): the int8 scale of its input and of its output before the bias,
    from the float model run by onnxruntime on each input of ``x`` (inputs stacked on its
    first axis; per-tensor MinMax, symmetric)."""
    import copy

    import onnx
    from onnx import helper, numpy_helper

    from dlas_predict.compression.accuracy import onnx_session

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
    sess = onnx_session(model)
    input_name = sess.get_inputs()[0].name
    maxima: dict[str, float] = {}
    for i in range(len(x)):
        outs = sess.run(None, {input_name: x[i]})
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


#: Timing weights: a weight tensor smaller than this keeps its values.
TIMING_MIN_SIZE = 4096
#: Timing weights: the pattern's period (a prime, so it does not align with a layer's shape).
TIMING_PERIOD = 1021


def timing_weights(model, seed: int = 0) -> int:
    """Give ``model``'s large conv and dense weights (in place) values that compress: each
    tensor's nonzeros take the values of a seeded pattern, repeated every
    :data:`TIMING_PERIOD` positions, of eight values: both signs of four quantiles of the
    tensor's own magnitudes, scaled to its root mean square (a layer keeps its gain, so
    activations keep their scale through a deep network). Zeros stay zeros, so shapes,
    pruning masks and sparsity are the configuration's, and a kernel's time does not depend
    on the values. For a build shipped to a machine reached only through a small
    transfer; the check (onnxruntime's outputs) is computed on the same weights. Returns how
    many tensors were changed."""
    from onnx import numpy_helper

    weights = {n.input[1] for n in model.graph.node
               if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1}
    rng = np.random.default_rng(seed)
    changed = 0
    for i, t in enumerate(model.graph.initializer):
        if t.name not in weights:
            continue
        w = numpy_helper.to_array(t)
        if w.size < TIMING_MIN_SIZE or w.dtype.kind != "f":
            continue
        nz = np.flatnonzero(w)
        if nz.size == 0:
            continue
        values = np.abs(w.flat[nz]).astype(np.float64)
        mags = np.quantile(values, [0.125, 0.375, 0.625, 0.875])
        mags *= np.sqrt(np.mean(values ** 2) / max(np.mean(mags ** 2), 1e-30))
        pattern = (rng.choice(mags, TIMING_PERIOD)
                   * rng.choice([-1.0, 1.0], TIMING_PERIOD)).astype(w.dtype)
        # the pattern runs over every position (a zero is a hole in it, not a shift), so
        # that a layout that permutes the tensor (spatial pack's tiles) repeats too
        out = np.where(w != 0, np.resize(pattern, w.shape), 0).astype(w.dtype)
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(out, t.name))
        changed += 1
    return changed


@dataclass
class _Prepared:
    path: Path
    input_name: str
    input_shape: tuple[int, ...]
    specs: list
    check: Path
    scales: list | None
    summary: str
    model: str = ""
    calibration: Path | None = None   # int8 of onnxruntime: its calibration inputs
    tokens: int = 0  # a network of token ids: one more than the largest (0: a float input)
    notes: list = field(default_factory=list)  # what the preparation did (channels removed)


def _calibration_source(model: str) -> str:
    from dlas_predict.networks import zoo

    if str(model).startswith(zoo.ZOO_PREFIX) and zoo.get(model).trained:
        return "digits images"
    return "generated inputs (seeded normal noise): the int8 accuracy is not a real figure"


def onnxruntime_unsupported(device: Device, rpc=None) -> str | None:
    """Why onnxruntime cannot be timed as ``device`` (None: it can): it runs on this machine
    with its own ISA dispatch, so only ``local`` and the native-ISA profiles qualify."""
    if rpc is not None or not device.measured_here:
        return (f"onnxruntime is timed on this machine only; {device.name} is reached "
                "over TVM RPC, where there is no onnxruntime to call")
    if device.profile_of and device.target.get("mcpu") not in (None, _native_mcpu()):
        return (f"onnxruntime picks its instruction set at run time; {device.name}'s "
                f"code-generation limit ({device.target.get('mcpu')}) cannot be applied to it")
    return None


def _native_mcpu() -> str | None:
    from dlas_predict.space.devices import detect_local

    return detect_local(with_target=True).target.get("mcpu")


def prepare_network(plan: NetworkPlan, tmp: Path, cache: dict,
                    timing: bool = False) -> _Prepared:
    """A configuration's network made ready to build: its compressed ONNX model in ``tmp``
    (a channel-pruned one with its zeroed filters removed), onnxruntime's outputs on sample
    inputs as the check, its conv specs and summary, and int8's calibrated scales; shared
    through ``cache`` by every algorithm of the same (model, compression, ratio).
    ``timing``: the compressed model's weights become :func:`timing_weights` first."""
    # a channel-pruned model is built with its zeroed channels removed: a smaller dense
    # model, whose layers the plan's kernels are for (network_configs)
    remove = plan.compression is Compression.CHANNEL_PRUNING
    key = (plan.model, plan.compression, plan.ratio, remove, timing)
    if key in cache:
        return cache[key]
    import onnx

    from dlas_predict.compression.accuracy import onnx_session, prepare
    from dlas_predict.networks.graph import read_network, token_bound

    pruning = plan.compression in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
    # float16 and int8 are applied by the build: start from the dense float model
    prep = prepare(plan.model, plan.compression.value if pruning else "dense",
                   plan.ratio if pruning else None, remove_channels=remove)
    model = prep.compressed.model
    notes = list(prep.compressed.notes) if remove else []
    if timing:
        import copy

        model = copy.deepcopy(model)
        notes.append(f"timing weights: {timing_weights(model)} weight tensors given a "
                     f"periodic pattern of their own magnitudes (zeros kept)")
    n = len(cache)
    path = tmp / f"net{n}.onnx"
    onnx.save(model, str(path))
    net = read_network(path, plan.network)
    shape = tuple(net.input_shape)
    tokens = token_bound(model)
    x = _samples(plan.model, shape, "test", tokens)
    sess = onnx_session(model)
    # one output per sample, whatever axis the batch is on (a time-major sequence's)
    y = np.stack([sess.run(None, {sess.get_inputs()[0].name: x[i]})[0]
                  for i in range(len(x))])
    check = tmp / f"net{n}.check.npz"
    np.savez(check, x=x, y=y)
    scales = None
    if plan.compression is Compression.INT8:
        scales = conv_scales(model, _samples(plan.model, shape, "train", tokens))
    from dataclasses import asdict

    from dlas_predict.networks.summary import NetworkSummary

    done = _Prepared(path, sess.get_inputs()[0].name, shape,
                     [c.spec for c in net.convs()], check, scales,
                     json.dumps(asdict(NetworkSummary.of(net))), plan.model,
                     notes=notes, tokens=tokens)
    cache[key] = done
    return done


class NetworkRunner:
    """Builds and times whole-network configurations on the local CPU, one worker task each.

    Compressed models are prepared once per (model, compression, ratio) and shared by the
    algorithms.
    """

    def __init__(self, device: Device, timeout_s: float = 600.0, protocol=None,
                 rpc=None) -> None:
        from dlas_predict.measure.execution.runner import LocalRunner
        from dlas_predict.measure.execution.tasks import Protocol

        self.device = device
        self.runner = LocalRunner(device, protocol or Protocol(), timeout_s=timeout_s,
                                  rpc=rpc)
        self._tmp = tempfile.TemporaryDirectory(prefix="dlas-net-")
        self._prepared: dict[tuple, _Prepared] = {}

    @property
    def protocol(self):
        return self.runner.protocol

    @property
    def board(self):
        """The board the worker holds (RPC only)."""
        return self.runner.board

    @property
    def last_lost(self) -> bool:
        """The last measurement failed because its board dropped off (RPC only)."""
        return self.runner.last_lost

    def close(self) -> None:
        self.runner.close()
        self._tmp.cleanup()

    def __enter__(self) -> "NetworkRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _prepare(self, plan: NetworkPlan) -> _Prepared:
        return prepare_network(plan, Path(self._tmp.name), self._prepared)

    def _calibration(self, prep: _Prepared) -> Path:
        if prep.calibration is None:
            prep.calibration = prep.path.with_suffix(".calib.npz")
            np.savez(prep.calibration, x=_samples(prep.model, prep.input_shape, "train",
                                                  prep.tokens))
        return prep.calibration

    @staticmethod
    def _ort_model(plan: NetworkPlan, prep: _Prepared) -> Path:
        """The file onnxruntime runs: a matrix network in its own form (its fully connected
        layers as its author wrote them, with the prepared model's weights); any other
        network, the prepared model itself. A matrix network whose channels were removed
        keeps the prepared (grid) form, and its record says so."""
        import onnx

        from dlas_predict.networks import zoo
        from dlas_predict.networks.graph import read_proto
        from dlas_predict.networks.matrix import weights_back

        original = zoo.resolve(plan.model, grid=False)
        if original == zoo.resolve(plan.model):
            return prep.path
        path = prep.path.with_suffix(".matrix.onnx")
        if not path.is_file():
            model = read_proto(original)
            try:
                weights_back(model, onnx.load(str(prep.path)))
            except ValueError as exc:
                prep.notes.append(f"onnxruntime ran the grid form ({exc})")
                return prep.path
            onnx.save(model, str(path))
        return path

    def _ort_task(self, plan: NetworkPlan, prep: _Prepared):
        from dlas_predict.measure.networks.ortrun import mode_of
        from dlas_predict.measure.execution.tasks import OrtTask

        mode = mode_of(plan.compression)
        calib = self._calibration(prep) if mode == "int8" else None
        return OrtTask(onnx=str(self._ort_model(plan, prep)), input_name=prep.input_name,
                       mode=mode,
                       check=str(prep.check), threads=self.device.cores,
                       target=self.device.target,
                       calibration=str(calib) if calib else None,
                       calibration_source=_calibration_source(plan.model) if calib else "",
                       protocol=self.runner.protocol, fingerprint=self.device.fingerprint,
                       simd_bits=self.device.simd_bits)

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
        if plan.backend == "onnxruntime":
            why = onnxruntime_unsupported(dev, self.runner.rpc)
            if why:
                rec.error, rec.timestamp = f"unsupported: {why}", time.time()
                return rec
            rec = self._record(rec, self.runner.call(self._ort_task(plan, prep)))
            if rec.details is not None and prep.notes:
                rec.details["prepared"] = prep.notes
            return rec
        if len(plan.layers) != len(prep.specs):
            raise ConfigError(f"{plan.network}: the plan has {len(plan.layers)} conv layers, "
                              f"the network {len(prep.specs)}")
        tuning = None
        if plan.tuning is not None:
            pattern = COMPRESSION_KERNEL[plan.compression][2].value
            tuning = TuningRequest(db=str(plan.tuning.db_path(dev)), budget=plan.tuning.budget,
                                   cores=dev.cores,
                                   pattern="unstructured" if pattern == "none" else pattern)
        task = NetworkTask(onnx=str(prep.path), input_name=prep.input_name,
                           input_shape=tuple(prep.input_shape), dtype=plan.dtype,
                           layers=tuple((a, bool(s)) for a, s in plan.layers),
                           specs=tuple(prep.specs),
                           scales=tuple(tuple(s) for s in prep.scales) if prep.scales else None,
                           check=str(prep.check), target=dev.target,
                           protocol=self.runner.protocol, fingerprint=dev.fingerprint,
                           tuning=tuning, simd_bits=dev.simd_bits if dev.kind == "cpu" else None,
                           vnni=dev.vnni)
        rec = self._record(rec, self.runner.call(task))
        if rec.details is not None and prep.notes:
            rec.details["prepared"] = prep.notes
        return rec

    def _record(self, rec: NetworkMeasurement, reply) -> NetworkMeasurement:
        rec.timestamp = time.time()
        if not reply.ok:
            rec.error = str(reply.error or "unknown failure")
            rec.board = self.runner.board_json()
            return rec
        rec.run_secs = list(reply.run_secs)
        rec.compile_s = reply.compile_s
        rec.verified = reply.verified
        rec.max_error = reply.max_error
        rec.top1_agreement = reply.top1_agreement
        rec.tuned_layers = reply.tuned_layers
        rec.untuned_layers = reply.untuned_layers
        rec.contention = reply.contention
        rec.slowdown = reply.slowdown
        rec.details = reply.details
        rec.board = self.runner.board_json()
        return rec

    run_one = measure

    def run(self, plans: Iterable[NetworkPlan]) -> Iterator[NetworkMeasurement]:
        """Measure each plan in order; a failure is a record with ``error``."""
        for plan in plans:
            yield self.measure(plan)
