"""Whole-network records: the plan of a configuration to build (:class:`NetworkPlan`) and the
record of its measurement (:class:`NetworkMeasurement`). The TVM backend builds and times
plans (:mod:`dlas_predict.measure.networks.runner`); :mod:`dlas_predict.corpus.collect` stores them.

A configuration is a compression (with its ratio) and an algorithm: ``direct``, ``gemm``,
``spatial_pack`` for every layer (the study's grid), or ``per_layer``, where each layer has
its own algorithm and kernel format (the candidate beyond the study).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dlas_predict.space.config import Algorithm, Compression, COMPRESSION_KERNEL, ConvSpec, DType
from dlas_predict.space.devices import Device
from dlas_predict.measure.records import TimedRuns

if TYPE_CHECKING:
    from dlas_predict.measure.execution.runner import TuningOptions

#: Algorithm label of a configuration whose layers each have their own kernel.
PER_LAYER = "per_layer"
#: Algorithm label of a configuration run by onnxruntime (the incumbent runtime) instead of
#: our kernels: the systems-software dimension of the grid.
ONNXRUNTIME = "onnxruntime"
#: The engine's version, in every whole-network record and its key, so a changed engine
#: measures again; which builds each version changed is :data:`ENGINE_CHANGES`' rules (for
#: the versions today's engine carries).
NETWORK_VERSION = "17"
ONNXRUNTIME_VERSION = "2"
#: Builds a newer engine left as they were keep their version, and their keys: onnxruntime's
#: runs are as they were in "2".
UNCHANGED_SINCE = {ONNXRUNTIME: ONNXRUNTIME_VERSION}
#: Engines whose builds today's engine carries where it builds them the same way
#: (:func:`rebuilt_since`): their records count as today's, and a collection does not
#: time them again. "10" changed the ops between the convs of every build of ours.
CARRIED_VERSIONS = ("10", "11", "12", "13", "14", "15", "16")
#: Engine versions whose records the network model still learns from, each until the same
#: configuration is measured by the current engine.
PREVIOUS_NETWORK_VERSIONS = ("16", "15", "14", "13", "12", "11", "10", "9", "8", "7", "6", "5",
                             "4", "3", "2")
#: The first engine version that removes the zeroed filters of a channel-pruned network;
#: older channel-pruning records timed another network (CSR kernels over the zeroed filters).
CHANNEL_REMOVAL_VERSION = "5"
#: The engine of whole networks built for a CUDA GPU (``dlas_predict/measure/gpu/networks.py``), a
#: series of its own beside the CPU engine's: our CUDA kernels per layer, every other op scheduled
#: by dlight; channel-pruned networks with their zeroed filters removed.
GPU_NETWORK_VERSION = "g1"


def as_input(x: np.ndarray) -> np.ndarray:
    """Check or calibration samples as a network's input: token ids keep their integers,
    anything else is float32."""
    return x if x.dtype.kind in "iu" else x.astype(np.float32)


def first_output(out):
    """A built network's first output, which the check compares with onnxruntime's first:
    the tensor itself, or the first of several (an LSTM's sequence, then its last
    states)."""
    return out if hasattr(out, "numpy") else out[0]


def removes_channels(version: str) -> bool:
    """Whether engine ``version`` builds a channel-pruned network with its zeroed filters
    removed (a GPU engine always does)."""
    if not version.isdigit():
        return version == GPU_NETWORK_VERSION
    return int(version) >= int(CHANNEL_REMOVAL_VERSION)


def _pads_register_filters(plan: list, convs: list, simd_bits: int | None,
                           _summary: dict | None, _dtype: DType | None, _vnni: bool) -> bool:
    """What engine "11" builds otherwise than "10": a dense direct or GEMM layer whose block
    of filters today's default pads (a filter count with no divisor of at least four that
    fits the accumulators)."""
    from dlas_predict.measure.kernels.knobs import default_knobs, filters_computed
    from dlas_predict.space.config import Variant

    for (algorithm, sparse), spec in zip(plan, convs):
        if sparse or algorithm not in (Algorithm.DIRECT.value, Algorithm.GEMM.value):
            continue
        knobs = default_knobs(spec, Variant(algorithm, "dense"), simd_bits)
        if filters_computed(spec, knobs["tile_k"]) != spec.K:
            return True
    return False


def _reblocks_pack_filters(plan: list, convs: list, simd_bits: int | None,
                           _summary: dict | None, _dtype: DType | None, _vnni: bool) -> bool:
    """What engine "12" builds otherwise than "11": a dense ungrouped spatial pack layer
    whose block of filters engine 11 took by fewest vector updates alone
    (:func:`~dlas_predict.measure.kernels.knobs.pack_block_by_updates`), where that block is no
    whole vector and today's default replaces it."""
    from dlas_predict.measure.kernels.knobs import default_knobs, pack_block_by_updates, registers
    from dlas_predict.space.config import Variant

    lanes = registers(simd_bits)[0]
    for (algorithm, sparse), spec in zip(plan, convs):
        if (sparse or algorithm != Algorithm.SPATIAL_PACK.value or spec.groups != 1
                or spec.K < 8):
            continue
        today = default_knobs(spec, Variant(algorithm, "dense"), simd_bits)["tile_k"]
        if today != pack_block_by_updates(spec.K, lanes):
            return True
    return False


def _computes_sigmoid(_plan: list, _convs: list, _simd_bits: int | None,
                      summary: dict | None, _dtype: DType | None, _vnni: bool) -> bool:
    """What engine "13" builds otherwise than "12": a network with a sigmoid (its SiLUs and
    gates), known by the elements its exp-like ops compute (a network whose summary is
    unknown is taken to have one)."""
    return summary is None or summary.get("exp_elems", 1) > 0


def _runs_vnni(plan: list, convs: list, _simd_bits: int | None, _summary: dict | None,
               dtype: DType | None, vnni: bool) -> bool:
    """What engine "14" builds otherwise than "13": an int8 network with a dense GEMM
    layer of an ungrouped conv, on a CPU with AVX-512 VNNI (a network whose dtype is
    unknown is taken to be int8)."""
    if not vnni or dtype not in (None, DType.INT8):
        return False
    return any(algorithm == Algorithm.GEMM.value and not sparse and spec.groups == 1
               for (algorithm, sparse), spec in zip(plan, convs))


def _fast_erf_softmax(_plan: list, _convs: list, _simd_bits: int | None,
                      summary: dict | None, _dtype: DType | None, _vnni: bool) -> bool:
    """What engine "15" builds otherwise than "14": a network with an erf (a GELU's) or a
    softmax, which now run as vectorised polynomials, and with them attention's batched
    products over a sequence no vector divides, now vectorised with a tail tile (a network
    whose summary is unknown is taken to have one; a summary written before it counted
    them, to have none: engine 14 built no network of matrix layers, where they weigh)."""
    return summary is None or summary.get("erf_softmax_elems", 0) > 0


def _depthwise_tiles_of_15(spec: ConvSpec, lanes: int) -> dict[str, int]:
    """The depthwise direct kernel's defaults under engine "15": at stride 1 the wider of
    two vectors or one that pads the row least and two channels a task, at larger strides
    the wider of one vector or half of one and one channel a task."""
    unit = spec.stride_w == 1
    widths = (2 * lanes, lanes) if unit else (lanes, max(lanes // 2, 4))
    return {"tile_k": 2 if unit and spec.K % 2 == 0 else 1,
            "tile_h": 2 if spec.OH > 1 else 1,
            "tile_w": min(widths, key=lambda v: -(-spec.OW // v) * v)}


def _tiles_small_maps(plan: list, convs: list, simd_bits: int | None, _summary: dict | None,
                      dtype: DType | None, _vnni: bool) -> bool:
    """What engine "16" builds otherwise than "15": a float32 network with a dense GEMM
    layer that today's defaults run on the overlapping-tile pointwise GEMM (a network whose
    dtype is unknown is taken to be float32); or any network with a dense depthwise direct
    layer whose default tiles changed (rows narrower than half a vector, maps of fewer
    than 32 positions)."""
    from dlas_predict.measure.kernels.knobs import default_knobs, pointwise_tile, registers
    from dlas_predict.space.config import Variant

    lanes = registers(simd_bits)[0]
    for (algorithm, sparse), spec in zip(plan, convs):
        if sparse:
            continue
        if (algorithm == Algorithm.GEMM.value
                and pointwise_tile(spec, dtype or DType.FLOAT32, simd_bits) is not None):
            return True
        if algorithm == Algorithm.DIRECT.value and spec.depthwise:
            today = default_knobs(spec, Variant(algorithm, "dense"), simd_bits)
            if today != _depthwise_tiles_of_15(spec, lanes):
                return True
    return False


def _concats_and_pack_rows(plan: list, convs: list, simd_bits: int | None,
                           summary: dict | None, _dtype: DType | None, _vnni: bool) -> bool:
    """What engine "17" builds otherwise than "16": a network with a concatenation of two
    inputs or more, whose op (with the elementwise ops fused after it) now runs parallel
    over the axes up to the one it joins along and vectorised inside it (a network whose
    summary is unknown, or was stored before it counted them, is taken to have one); or
    any network with a dense spatial pack layer whose row engine 16 tiled at the widest
    tile and today's splits evenly in narrower ones
    (:func:`~dlas_predict.measure.kernels.knobs.balanced_width`)."""
    from dlas_predict.measure.kernels.knobs import default_knobs, widest_pack_tile
    from dlas_predict.space.config import Variant

    if summary is None or summary.get("concat_inputs", 1) > 0:
        return True
    for (algorithm, sparse), spec in zip(plan, convs):
        if algorithm != Algorithm.SPATIAL_PACK.value or sparse or spec.K // spec.groups < 8:
            continue
        today = default_knobs(spec, Variant(algorithm, "dense"), simd_bits)
        if today["tile_w"] != widest_pack_tile(spec, today["tile_k"], simd_bits):
            return True
    return False


#: Each engine after the oldest of :data:`CARRIED_VERSIONS`, and which builds it makes
#: otherwise than the engine before it:
#: ``rule(plan, convs, simd_bits, summary, dtype, vnni)``.
ENGINE_CHANGES = {"11": _pads_register_filters, "12": _reblocks_pack_filters,
                  "13": _computes_sigmoid, "14": _runs_vnni, "15": _fast_erf_softmax,
                  "16": _tiles_small_maps, "17": _concats_and_pack_rows}


def rebuilt_since(version: str, plan: list, convs: list, simd_bits: int | None,
                  summary: dict | None, dtype: DType | None = None,
                  vnni: bool = False) -> bool:
    """Whether today's engine builds a network of conv layers ``convs`` (ConvSpecs, in
    order) under ``plan`` ((algorithm, CSR or not) per layer) otherwise than engine
    ``version`` (one of :data:`CARRIED_VERSIONS`) did, on a CPU of ``simd_bits`` (with
    AVX-512 VNNI or not); ``summary``: the network's
    :class:`~dlas_predict.networks.summary.NetworkSummary` fields (None if unknown);
    ``dtype``: the network's (None if unknown)."""
    return any(rule(plan, convs, simd_bits, summary, dtype, vnni)
               for v, rule in ENGINE_CHANGES.items() if int(v) > int(version))


def engine_version(algorithm: str, tuned: bool = False) -> str:
    """The version of the engine that runs configurations of ``algorithm``, tuned or not."""
    if tuned and algorithm != ONNXRUNTIME:
        return NETWORK_VERSION
    return UNCHANGED_SINCE.get(algorithm, NETWORK_VERSION)


@dataclass(frozen=True)
class NetworkPlan:
    """One whole-network configuration to build: the compressed model and each conv's kernel."""

    model: str                       # path or zoo:NAME
    network: str                     # its name
    compression: Compression
    ratio: float | None
    algorithm: str                   # an Algorithm value, PER_LAYER or ONNXRUNTIME
    layers: tuple[tuple[str, bool], ...]  # (algorithm, sparse) per conv; () for onnxruntime
    #: tuned: each layer's schedule from the tuning database (dlas-predict tune) searched
    #: with ``budget`` trials; None: the hand schedules
    tuning: "TuningOptions | None" = None

    @property
    def dtype(self) -> DType:
        return COMPRESSION_KERNEL[self.compression][1]

    @property
    def config(self) -> str:
        from dlas_predict.compression.netplan import config_label

        return config_label(self.compression, self.ratio)

    @property
    def backend(self) -> str:
        return "onnxruntime" if self.algorithm == ONNXRUNTIME else "tvm"

    def plan_json(self) -> str:
        return json.dumps([[a, bool(s)] for a, s in self.layers])

    def key(self, device: Device, version: str | None = None) -> str:
        """The record's key on ``device``: under today's engine, or engine ``version``."""
        parts = [device.name, device.fingerprint, self.network, self.config,
                 self.algorithm, self.plan_json(),
                 version or engine_version(self.algorithm, self.tuning is not None)]
        if self.tuning is not None:
            parts += ["tuned", str(self.tuning.budget)]
        text = "|".join(parts)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def config_dtype(label: str) -> DType:
    """The data type a configuration label (``int8``, ``channel_pruning@0.9``) runs in."""
    return COMPRESSION_KERNEL[Compression.parse(label.split("@")[0])][1]


def onnxruntime_mode(compression: Compression | str) -> str:
    """The onnxruntime mode that runs a compression (or a configuration label such as
    ``channel_pruning@0.9``): ``int8``, ``float16``, else ``fp32`` (pruned models)."""
    value = getattr(compression, "value", str(compression)).split("@")[0]
    return {"int8": "int8", "float16": "float16"}.get(value, "fp32")


def onnxruntime_plan(model: str, network: str, compression: Compression | str,
                     ratio: float | None) -> NetworkPlan:
    """The compressed model run by onnxruntime: pruned models in float32 (channel pruning
    removes the channels, so the model is smaller), float16 converted, int8 as static QDQ."""
    return NetworkPlan(model, network, Compression.parse(compression), ratio, ONNXRUNTIME, ())


def uniform_plan(model: str, network: str, compression: Compression | str,
                 ratio: float | None, algorithm: str, n_layers: int,
                 layer_ratios: list[float] | None = None) -> NetworkPlan:
    """The study's configuration: one algorithm for every layer; weight-pruned networks run
    the CSR kernels, channel-pruned ones the CSR kernels on the layers with zeroed filters
    left (``layer_ratios``: each layer's kernel ratio; without them, every layer), the
    others the dense ones."""
    from dlas_predict.compression.netplan import layer_sparse

    comp = Compression.parse(compression)
    alg = Algorithm.parse(algorithm).value
    if layer_ratios is None:
        sparse = [COMPRESSION_KERNEL[comp][0]] * n_layers
    else:
        if len(layer_ratios) != n_layers:
            raise ValueError(f"{n_layers} layers, {len(layer_ratios)} ratios")
        sparse = [layer_sparse(comp, r) for r in layer_ratios]
    return NetworkPlan(model, network, comp, ratio, alg, tuple((alg, s) for s in sparse))


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
    board: str | None = None         # as MeasureResult.board
    #: onnxruntime records: its version, mode, threads and (int8) what it was calibrated on;
    #: our builds: their epilogues (``dlas_predict.measure.networks.build.epilogue_details``)
    details: dict | None = None
    #: the engine version it was measured with (:data:`NETWORK_VERSION`); empty: the current
    version: str = ""

    @classmethod
    def from_row(cls, row: dict) -> "NetworkMeasurement":
        """Rebuild from a store row (:meth:`CorpusStore.network_records`)."""
        return cls(key=row["key"], device=row["device"], fingerprint=row["fingerprint"],
                   network=row["network"], config=row["config"], algorithm=row["algorithm"],
                   plan=row["plan"], dtype=row["dtype"],
                   run_secs=list(json.loads(row["run_secs"] or "[]")),
                   compile_s=row.get("compile_s"),
                   verified=None if row.get("verified") is None else bool(row["verified"]),
                   max_error=row.get("max_error"), top1_agreement=row.get("top1_agreement"),
                   error=row.get("error"), timestamp=row.get("timestamp") or 0.0,
                   summary=row.get("summary"), contention=row.get("contention"),
                   slowdown=row.get("slowdown"), board=row.get("board"),
                   details=json.loads(row["details"]) if row.get("details") else None,
                   version=row.get("kernels_version") or "")

    def to_row(self) -> dict:
        return {"key": self.key, "device": self.device, "fingerprint": self.fingerprint,
                "network": self.network, "config": self.config, "algorithm": self.algorithm,
                "plan": self.plan, "dtype": self.dtype, "run_secs": json.dumps(self.run_secs),
                "median_s": self.median_s, "spread": self.spread, "compile_s": self.compile_s,
                "verified": None if self.verified is None else int(self.verified),
                "max_error": self.max_error, "top1_agreement": self.top1_agreement,
                "error": self.error,
                "kernels_version": self.version or engine_version(
                    self.algorithm, self.tuned_layers is not None),
                "timestamp": self.timestamp, "summary": self.summary,
                "contention": self.contention, "slowdown": self.slowdown,
                "board": self.board,
                "details": json.dumps(self.details) if self.details else None}
