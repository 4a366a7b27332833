"""The DLAS configuration space: algorithms, compressions, dtypes, tuning, conv workloads.

One name for one thing: the enum values below are the canonical names used in code, on the
command line, in corpus columns and in the docs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from dlas_predict.errors import ConfigError, SpecError
from dlas_predict.space.choices import Choice


class Algorithm(Choice):
    """Convolution algorithms: the study's three (:data:`GRID_ALGORITHMS`, what ``all``
    names), and Winograd F(m×m, 3×3), where it applies (:func:`winograd_skip`) and is named or
    a per-layer plan chooses it."""

    DIRECT = "direct"
    GEMM = "gemm"
    SPATIAL_PACK = "spatial_pack"
    WINOGRAD = "winograd"

    @classmethod
    def parse_list(cls, text: str) -> list["Algorithm"]:
        if text.strip().lower() == "all":
            return list(GRID_ALGORITHMS)
        return super().parse_list(text)


#: The algorithms of the grid's uniform plans (one algorithm on every layer), what ``all``
#: names; per-layer plans also choose Winograd where it applies (:data:`LAYER_ALGORITHMS`).
GRID_ALGORITHMS = (Algorithm.DIRECT, Algorithm.GEMM, Algorithm.SPATIAL_PACK)
#: The algorithms a layer of a per-layer plan may run.
LAYER_ALGORITHMS = GRID_ALGORITHMS + (Algorithm.WINOGRAD,)


class PlanAlgorithm(Choice):
    """What a configuration's algorithm part may name: a convolution algorithm, ``per_layer``
    (each layer its fastest algorithm) or ``onnxruntime`` (the systems software in place of
    our kernels)."""

    DIRECT = "direct"
    GEMM = "gemm"
    SPATIAL_PACK = "spatial_pack"
    PER_LAYER = "per_layer"
    ONNXRUNTIME = "onnxruntime"

    @classmethod
    def _label(cls) -> str:
        return "algorithm"


class Compression(Choice):
    """Model optimisations of the study."""

    DENSE = "dense"
    WEIGHT_PRUNING = "weight_pruning"
    CHANNEL_PRUNING = "channel_pruning"
    FLOAT16 = "float16"
    INT8 = "int8"


class DType(Choice):
    """Data type of inputs and weights (int8 accumulates in int32 and requantises)."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    INT8 = "int8"


class Tuning(Choice):
    """Code generation: a fixed hand schedule, or a searched one."""

    UNTUNED = "untuned"
    TUNED = "tuned"


class SparsityPattern(Choice):
    """How zeros are placed in pruned weights."""

    NONE = "none"
    UNSTRUCTURED = "unstructured"
    CHANNEL = "channel"


#: For each compression: (sparse kernel?, dtype, sparsity pattern).
COMPRESSION_KERNEL = {
    Compression.DENSE: (False, DType.FLOAT32, SparsityPattern.NONE),
    Compression.WEIGHT_PRUNING: (True, DType.FLOAT32, SparsityPattern.UNSTRUCTURED),
    Compression.CHANNEL_PRUNING: (True, DType.FLOAT32, SparsityPattern.CHANNEL),
    Compression.FLOAT16: (False, DType.FLOAT16, SparsityPattern.NONE),
    Compression.INT8: (False, DType.INT8, SparsityPattern.NONE),
}

DEFAULT_RATIO = 0.9
#: Pruning ratios of an accuracy-vs-ratio curve.
DEFAULT_CURVE_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
#: The elbow rule's threshold: a drop of more than this many percentage points of the
#: metric below the uncompressed model is "significant".
ELBOW_DROP_PP = 1.0


def check_ratio(ratio: float, allow_zero: bool = False) -> float:
    """Validate a pruning ratio: the fraction of weights removed, inside (0, 1) — or [0, 1)
    with ``allow_zero`` (a network pruned at ratio 0 is the dense one)."""
    span = "[0, 1)" if allow_zero else "(0, 1)"
    try:
        value = float(ratio)
    except (TypeError, ValueError):
        raise ConfigError(f"ratio must be a number in {span}, got {ratio!r}") from None
    if not (0.0 <= value < 1.0 if allow_zero else 0.0 < value < 1.0):
        raise ConfigError(f"ratio must be in {span}, got {ratio!r}")
    return value


_SPEC_KEYS = {
    "N": "batch", "C": "in_channels", "H": "height", "W": "width", "K": "out_channels",
    "R": "kernel_h", "S": "kernel_w", "stride": "stride", "pad": "pad", "groups": "groups",
    "dilation": "dilation",
}
SPEC_HELP = (
    "C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1[,groups=G][,dilation=D]; "
    "stride, pad and dilation take N or HxW (pad also T:L:B:R); batch is 1"
)


def _pair(text: str, key: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) not in (1, 2):
        raise SpecError(f"{key}={text!r}: expected N or HxW")
    values = tuple(_int(p, key) for p in parts)
    return (values[0], values[-1])


def _int(text: str, key: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{key}={text!r} is not an integer (spec form: {SPEC_HELP})") from None


@dataclass(frozen=True)
class ConvSpec:
    """One 2-D convolution workload, NCHW, batch 1.

    Weights are ``[K, C/groups, R, S]``; padding is (top, left, bottom, right).
    """

    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride_h: int = 1
    stride_w: int = 1
    pad_t: int = 0
    pad_l: int = 0
    pad_b: int = 0
    pad_r: int = 0
    groups: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    N: int = 1

    def __post_init__(self) -> None:
        self.validate()

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> "ConvSpec":
        """Parse the compact form ``C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1[,groups=G]``
        (a spec is frozen: the same text gives the one parsed spec)."""
        return _parse_spec(cls, text)

    @classmethod
    def _parse(cls, text: str) -> "ConvSpec":
        if not text or not text.strip():
            raise SpecError(f"empty conv spec; expected {SPEC_HELP}")
        fields: dict[str, str] = {}
        for part in text.replace(" ", "").split(","):
            if not part:
                continue
            if "=" not in part:
                raise SpecError(f"conv spec item {part!r} is not KEY=VALUE; expected {SPEC_HELP}")
            key, value = part.split("=", 1)
            match = next((k for k in _SPEC_KEYS if k.lower() == key.lower() and
                          (len(k) > 1 or k == key.upper())), None)
            if match is None:
                raise SpecError(f"unknown conv spec key {key!r}; allowed: {', '.join(_SPEC_KEYS)}")
            if match in fields:
                raise SpecError(f"conv spec key {match!r} given twice")
            fields[match] = value
        missing = [k for k in ("C", "H", "W", "K", "R", "S") if k not in fields]
        if missing:
            raise SpecError(f"conv spec is missing {', '.join(missing)}; expected {SPEC_HELP}")
        stride = _pair(fields.get("stride", "1"), "stride")
        dilation = _pair(fields.get("dilation", "1"), "dilation")
        pad_text = fields.get("pad", "0")
        if ":" in pad_text:
            pads = [_int(p, "pad") for p in pad_text.split(":")]
            if len(pads) != 4:
                raise SpecError(f"pad={pad_text!r}: expected N, HxW or T:L:B:R")
            pad = tuple(pads)
        else:
            ph, pw = _pair(pad_text, "pad")
            pad = (ph, pw, ph, pw)
        n = _int(fields.get("N", "1"), "N")
        if n != 1:
            raise SpecError(f"batch N={n} is not supported; the study's protocol is batch 1")
        return cls(
            C=_int(fields["C"], "C"), H=_int(fields["H"], "H"), W=_int(fields["W"], "W"),
            K=_int(fields["K"], "K"), R=_int(fields["R"], "R"), S=_int(fields["S"], "S"),
            stride_h=stride[0], stride_w=stride[1],
            pad_t=pad[0], pad_l=pad[1], pad_b=pad[2], pad_r=pad[3],
            groups=_int(fields.get("groups", "1"), "groups"),
            dilation_h=dilation[0], dilation_w=dilation[1],
        )

    def validate(self) -> None:
        for name in ("C", "H", "W", "K", "R", "S", "stride_h", "stride_w", "groups",
                     "dilation_h", "dilation_w", "N"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise SpecError(f"{name} must be a positive integer, got {value!r}")
        for name in ("pad_t", "pad_l", "pad_b", "pad_r"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise SpecError(f"{name} must be a non-negative integer, got {value!r}")
        if self.C % self.groups or self.K % self.groups:
            raise SpecError(
                f"groups={self.groups} must divide both C={self.C} and K={self.K}")
        eff_r = self.dilation_h * (self.R - 1) + 1
        eff_s = self.dilation_w * (self.S - 1) + 1
        if eff_r > self.H + self.pad_t + self.pad_b or eff_s > self.W + self.pad_l + self.pad_r:
            raise SpecError(
                f"kernel {eff_r}x{eff_s} is larger than the padded input "
                f"{self.H + self.pad_t + self.pad_b}x{self.W + self.pad_l + self.pad_r}")

    # ---- derived shape quantities ---------------------------------------------------------
    @property
    def OH(self) -> int:
        return (self.H + self.pad_t + self.pad_b - self.dilation_h * (self.R - 1) - 1) \
            // self.stride_h + 1

    @property
    def OW(self) -> int:
        return (self.W + self.pad_l + self.pad_r - self.dilation_w * (self.S - 1) - 1) \
            // self.stride_w + 1

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.C and self.K % self.C == 0

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.K, self.C // self.groups, self.R, self.S)

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.H, self.W)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.K, self.OH, self.OW)

    @property
    def params(self) -> int:
        return self.K * (self.C // self.groups) * self.R * self.S

    @property
    def macs(self) -> int:
        """Dense multiply-accumulates of the convolution."""
        return self.N * self.K * self.OH * self.OW * (self.C // self.groups) * self.R * self.S

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def bytes_moved(self, dtype_bytes: int = 4) -> int:
        """Compulsory traffic: input, weights and output once each."""
        n = self.N * self.C * self.H * self.W + self.params + self.N * self.K * self.OH * self.OW
        return n * dtype_bytes

    def to_spec(self) -> str:
        """The compact form; ``ConvSpec.parse(spec.to_spec()) == spec``."""
        out = f"C={self.C},H={self.H},W={self.W},K={self.K},R={self.R},S={self.S}"
        out += "," + ("stride=%d" % self.stride_h if self.stride_h == self.stride_w
                      else "stride=%dx%d" % (self.stride_h, self.stride_w))
        if self.pad_t == self.pad_b and self.pad_l == self.pad_r:
            out += ("," + ("pad=%d" % self.pad_t if self.pad_t == self.pad_l
                           else "pad=%dx%d" % (self.pad_t, self.pad_l)))
        else:
            out += ",pad=%d:%d:%d:%d" % (self.pad_t, self.pad_l, self.pad_b, self.pad_r)
        if self.groups != 1:
            out += f",groups={self.groups}"
        if (self.dilation_h, self.dilation_w) != (1, 1):
            out += "," + ("dilation=%d" % self.dilation_h if self.dilation_h == self.dilation_w
                          else "dilation=%dx%d" % (self.dilation_h, self.dilation_w))
        return out

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConvSpec":
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})


@functools.lru_cache(maxsize=8192)
def _parse_spec(cls: type, text: str) -> ConvSpec:
    return cls._parse(text)


@dataclass(frozen=True)
class Variant:
    """One point of the kernel grid for a workload: algorithm × compression × tuning.

    ``ratio`` is the requested pruning ratio (0 for unpruned compressions). ``knobs`` are the
    schedule parameters (empty means: the untuned defaults chosen from the shape).
    """

    algorithm: Algorithm
    compression: Compression
    ratio: float = 0.0
    tuning: Tuning = Tuning.UNTUNED
    knobs: tuple[tuple[str, int], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", Algorithm.parse(self.algorithm))
        object.__setattr__(self, "compression", Compression.parse(self.compression))
        object.__setattr__(self, "tuning", Tuning.parse(self.tuning))
        if self.sparse:
            object.__setattr__(self, "ratio", check_ratio(self.ratio, allow_zero=True))
        elif self.ratio:
            raise ConfigError(
                f"compression {self.compression.value} takes no ratio (got {self.ratio}); "
                "only weight_pruning and channel_pruning are pruned")
        if isinstance(self.knobs, dict):
            object.__setattr__(self, "knobs", tuple(sorted(self.knobs.items())))

    @property
    def sparse(self) -> bool:
        return COMPRESSION_KERNEL[self.compression][0]

    @property
    def dtype(self) -> DType:
        return COMPRESSION_KERNEL[self.compression][1]

    @property
    def pattern(self) -> SparsityPattern:
        return COMPRESSION_KERNEL[self.compression][2]

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm.value, "compression": self.compression.value,
            "ratio": self.ratio, "sparse": self.sparse, "dtype": self.dtype.value,
            "tuning": self.tuning.value, "knobs": dict(self.knobs),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Variant":
        return cls(algorithm=data["algorithm"], compression=data["compression"],
                   ratio=float(data.get("ratio") or 0.0), tuning=data.get("tuning", "untuned"),
                   knobs=tuple(sorted((data.get("knobs") or {}).items())))


def winograd_skip(spec: "ConvSpec", compression: "Compression", device_kind: str = "cpu",
                  tuning: "Tuning | str" = "untuned") -> str | None:
    """Why a Winograd kernel is not built for ``spec`` under ``compression`` and ``tuning``
    (None: it is). It computes dense 3×3 windows at stride 1, ungrouped, in float32 or
    float16, on a CPU, with its hand schedule."""
    compression = Compression.parse(compression)
    if device_kind != "cpu":
        return "Winograd runs on CPUs only (no CUDA Winograd kernel)"
    if Tuning.parse(tuning) is Tuning.TUNED:
        return "Winograd is measured untuned (its hand schedule; no tuner searches it)"
    if COMPRESSION_KERNEL[compression][0]:
        return "Winograd has no CSR form (the transformed weights of a pruned filter are dense)"
    if compression is Compression.INT8:
        return "Winograd is float32 and float16 only (its transforms leave int8's range)"
    if (spec.R, spec.S) != (3, 3):
        return f"Winograd here is F(m×m, 3×3); this window is {spec.R}×{spec.S}"
    if (spec.stride_h, spec.stride_w) != (1, 1):
        return f"Winograd needs stride 1; this conv has stride {spec.stride_h}"
    if (spec.dilation_h, spec.dilation_w) != (1, 1):
        return "Winograd needs dilation 1"
    if spec.groups != 1:
        return f"Winograd needs an ungrouped conv; this one has {spec.groups} groups"
    return None


def variant_grid(algorithms: Iterable[Algorithm], compressions: Iterable[Compression],
                 ratio: float = DEFAULT_RATIO,
                 tuning: Tuning = Tuning.UNTUNED) -> list[Variant]:
    """The cross product of algorithms and compressions, pruning at ``ratio``."""
    ratio = check_ratio(ratio)
    out = []
    for compression in compressions:
        for algorithm in algorithms:
            sparse = COMPRESSION_KERNEL[Compression.parse(compression)][0]
            out.append(Variant(algorithm, compression, ratio if sparse else 0.0, tuning))
    return out


def stable_hash(obj: Any) -> str:
    """A short, stable hash of a JSON-serialisable object (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
