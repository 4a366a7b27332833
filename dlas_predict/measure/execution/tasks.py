"""What crosses the pipe to the isolated worker: typed tasks in, a typed reply out.

A runner sends one task per line as JSON (:func:`to_wire`) and reads one reply per line
(:meth:`WorkerReply.from_dict`); the worker decodes the task with :func:`from_wire`. Pure
Python: importable without TVM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Union

from dlas_predict.space.config import Algorithm, Compression, ConvSpec, DType, SparsityPattern


@dataclass(frozen=True)
class Protocol:
    """Timing protocol: warm-up discarded, then up to ``max_repeats`` timed runs, each of
    ``number`` back-to-back calls lasting at least ``min_repeat_ms``; a measurement stops
    adding runs after ``time_budget_s`` seconds but keeps at least ``min_repeats``.

    Before timing, wait up to ``quiet_wait_s`` for the machine to run at its usual speed:
    no other process holding a core (the chain probe's parallel/serial ratio at most
    ``contention_limit``) and the canary kernel at most ``slowdown_limit`` times its fastest
    (:mod:`dlas_predict.measure.execution.contention`); time once more if it slowed during the
    timing."""

    max_repeats: int = 150
    min_repeats: int = 10
    min_repeat_ms: float = 1.0
    time_budget_s: float = 3.0
    quiet_wait_s: float = 30.0
    contention_limit: float = 1.25
    slowdown_limit: float = 1.05

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def plan_timing(single_s: float, proto: Protocol) -> tuple[int, int]:
    """(number, repeats) for a kernel whose one call takes ``single_s`` seconds."""
    single_s = max(single_s, 1e-7)
    number = max(1, math.ceil(proto.min_repeat_ms / 1e3 / single_s))
    per_repeat = number * single_s
    repeats = int(proto.time_budget_s / per_repeat)
    repeats = max(proto.min_repeats, min(proto.max_repeats, repeats))
    return number, repeats


@dataclass(frozen=True)
class TuningRequest:
    """How the worker finds a tuned schedule: the tuning database, the trial budget, early
    stopping after ``patience`` trials without gain (0: never), the cores it tunes for,
    (whole networks) the pruning pattern of the CSR layers, and (a dense kernel) the knobs
    of its untuned twin, whose hand schedule the search's best must beat to be kept."""

    db: str
    budget: int
    cores: int
    patience: int = 0
    pattern: str = "unstructured"
    hand_knobs: dict[str, int] | None = None


@dataclass(frozen=True)
class KernelTask:
    """Build one conv kernel, check it against the numpy reference, time it."""

    conv: ConvSpec
    algorithm: Algorithm
    sparse: bool
    dtype: DType
    knobs: dict[str, int]
    ratio: float | None
    pattern: SparsityPattern
    compression: Compression
    target: dict[str, Any]
    protocol: Protocol = field(default_factory=Protocol)
    seed: int = 0
    fingerprint: str = ""
    tuning: TuningRequest | None = None
    fault: str | None = None  # test hook, honoured only with DLAS_FAULT_INJECTION=1
    simd_bits: int | None = None  # the CPU's vector width, for the CSR search's default

    kind = "kernel"


@dataclass(frozen=True)
class NetworkTask:
    """Build one whole network with TVM Relax, check it against onnxruntime's outputs (the
    ``check`` file), time it."""

    onnx: str
    input_name: str
    input_shape: tuple[int, ...]
    dtype: DType
    layers: tuple[tuple[str, bool], ...]          # (algorithm, sparse) per conv
    specs: tuple[ConvSpec, ...]
    scales: tuple[tuple[float, float], ...] | None  # int8: (input, output) scale per conv
    check: str
    target: dict[str, Any]
    protocol: Protocol = field(default_factory=Protocol)
    fingerprint: str = ""
    tuning: TuningRequest | None = None
    fault: str | None = None
    simd_bits: int | None = None  # the CPU's vector width: the layers' register tiles
    vnni: bool = False  # the CPU has AVX-512 VNNI: int8 GEMM layers use it

    kind = "network"


@dataclass(frozen=True)
class OrtTask:
    """Run one whole network with onnxruntime's CPU provider (``mode``: ``fp32``, ``int8``
    as static QDQ calibrated on the ``calibration`` inputs, or ``float16``), check it against
    the float32 outputs (the ``check`` file), time it with the study's protocol."""

    onnx: str
    input_name: str
    mode: str
    check: str
    threads: int
    target: dict[str, Any]
    calibration: str | None = None   # .npz with ``x``: the int8 calibration inputs
    calibration_source: str = ""     # what they are ("digits images", "generated inputs")
    protocol: Protocol = field(default_factory=Protocol)
    fingerprint: str = ""
    fault: str | None = None
    simd_bits: int | None = None  # the CPU's vector width: the contention canary's tiles

    kind = "onnxruntime"


@dataclass(frozen=True)
class PeaksTask:
    """Measure the machine's roofs: peak GFLOP/s per dtype and memory bandwidth."""

    target: dict[str, Any]
    cores: int
    simd_bits: int
    stream_mib: int = 256
    #: AVX-512 VNNI: also measure the int8 dot-product roof
    vnni: bool = False
    #: cache sizes (``L1d_kb``, ``L2_kb``, ``L3_kb``): also measure each level's bandwidth
    caches: dict[str, int] = field(default_factory=dict)
    fault: str | None = None

    kind = "peaks"


Task = Union[KernelTask, NetworkTask, OrtTask, PeaksTask]


def to_wire(task: Task) -> dict[str, Any]:
    """A task as a JSON-ready dict, tagged with its kind."""
    d: dict[str, Any] = {"kind": task.kind}
    for f in fields(task):
        v = getattr(task, f.name)
        if isinstance(v, ConvSpec):
            v = v.to_dict()
        elif isinstance(v, (Algorithm, DType, SparsityPattern, Compression)):
            v = v.value
        elif isinstance(v, (Protocol, TuningRequest)):
            v = asdict(v)
        elif f.name == "specs":
            v = [s.to_dict() for s in v]
        elif isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        d[f.name] = v
    return d


def from_wire(d: dict[str, Any]) -> Task:
    """The task :func:`to_wire` encoded."""
    d = dict(d)
    kind = d.pop("kind", "kernel")
    raw = d.pop("tuning", None)
    tuning = TuningRequest(**raw) if raw else None
    if kind == "peaks":
        return PeaksTask(**d)
    proto = Protocol(**d.pop("protocol", {}))
    if kind == "onnxruntime":
        return OrtTask(**d, protocol=proto)
    if kind == "network":
        return NetworkTask(
            onnx=d["onnx"], input_name=d["input_name"], input_shape=tuple(d["input_shape"]),
            dtype=DType.parse(d["dtype"]), layers=tuple((a, bool(s)) for a, s in d["layers"]),
            specs=tuple(ConvSpec.from_dict(s) for s in d["specs"]),
            scales=tuple(tuple(s) for s in d["scales"]) if d.get("scales") else None,
            check=d["check"], target=d["target"], protocol=proto,
            fingerprint=d.get("fingerprint", ""), tuning=tuning, fault=d.get("fault"),
            simd_bits=d.get("simd_bits"), vnni=bool(d.get("vnni", False)))
    if kind != "kernel":
        raise ValueError(f"unknown task kind {kind!r}")
    return KernelTask(
        conv=ConvSpec.from_dict(d["conv"]), algorithm=Algorithm.parse(d["algorithm"]),
        sparse=bool(d["sparse"]), dtype=DType.parse(d["dtype"]), knobs=dict(d["knobs"]),
        ratio=d.get("ratio"), pattern=SparsityPattern.parse(d.get("pattern", "none")),
        compression=Compression.parse(d.get("compression", "dense")), target=d["target"],
        protocol=proto, seed=int(d.get("seed", 0)), fingerprint=d.get("fingerprint", ""),
        tuning=tuning, fault=d.get("fault"), simd_bits=d.get("simd_bits"))


@dataclass
class WorkerReply:
    """The worker's answer to one task; ``ok`` false with an ``error`` on failure (a kernel
    that raised, crashed the worker or outlived its timeout)."""

    ok: bool
    error: str | None = None
    error_detail: str | None = None
    # timing (kernels and networks)
    run_secs: list[float] = field(default_factory=list)
    number: int | None = None
    repeats: int | None = None
    compile_s: float | None = None
    contention: float | None = None
    slowdown: float | None = None
    quiet_wait_s: float | None = None
    timing_attempts: int | None = None
    # checks
    verified: bool | None = None
    max_error: float | None = None
    relative_error: float | None = None
    top1_agreement: float | None = None
    # kernels
    knobs: dict[str, int] | None = None
    sparsity: float | None = None
    nnz: int | None = None
    # tuned kernels and networks
    tuning_seconds: float | None = None
    trials: int | None = None
    tuner: str | None = None
    tuning_reused: bool | None = None
    stopped_early: bool | None = None
    tuner_best_s: float | None = None
    tuning_kept: str | None = None  # MetaSchedule: "search" or "hand" (see tuning.TuneOutcome)
    tuned_layers: list[int] | None = None
    untuned_layers: list[int] | None = None
    # roofs
    peak_gflops: dict[str, float] | None = None
    mem_bandwidth_gbs: float | None = None
    int8_dot_gflops: float | None = None
    cache_bandwidth_gbs: dict[str, float] | None = None
    details: dict[str, Any] | None = None
    tvm_version: str | None = None
    #: measured through RPC: the board's session died during the task (not the task's fault)
    board_lost: bool | None = None

    @classmethod
    def failure(cls, error: str, detail: str | None = None) -> "WorkerReply":
        return cls(ok=False, error=error, error_detail=detail)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WorkerReply":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown reply fields: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()
                if v is not None and not (k == "run_secs" and not v)}
