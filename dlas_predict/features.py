"""Features of one kernel measurement: layer shape × configuration × device.

One row per (conv workload, algorithm, compression, layer sparsity, tuning, device). The
same function builds them for training (from corpus rows) and for prediction (from a planned
configuration), so the two cannot drift apart. Device descriptors are included so that one
model can later span devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import COMPRESSION_KERNEL, Algorithm, Compression, ConvSpec, DType, Tuning
from .devices import Device

DTYPE_BYTES = {DType.FLOAT32: 4, DType.FLOAT16: 2, DType.INT8: 1}

#: Feature columns, in model order.
FEATURE_NAMES = (
    # layer shape
    "C", "K", "H", "W", "R", "S", "stride", "groups", "OH", "OW", "depthwise",
    "cin_per_group", "log_macs", "log_bytes", "log_params", "intensity",
    # configuration
    "sparsity", "log_effective_macs", "dtype_bytes", "is_float16", "is_int8", "sparse",
    "channel_pattern", "algo_direct", "algo_gemm", "algo_spatial_pack", "tuned",
    # device
    "dev_peak_gflops", "dev_bandwidth_gbs", "dev_cores", "dev_simd_bits",
    "log_roofline_s",
    # schedule knobs (the untuned defaults, or a tuned record's own) and the work they waste
    "tile_k", "tile_w", "tile_h", "tile_p", "tile_waste",
)


@dataclass(frozen=True)
class KernelConfig:
    """What is measured or predicted: a workload under one configuration on one device."""

    spec: ConvSpec
    algorithm: Algorithm
    compression: Compression
    sparsity: float  # the layer's own (0 when unpruned)
    tuning: Tuning = Tuning.UNTUNED
    knobs: tuple[tuple[str, int], ...] = ()  # empty: the untuned defaults for the shape

    def resolved_knobs(self) -> dict[str, int]:
        """The knobs known before measuring: the untuned defaults; for a tuned kernel only
        the layout knobs it is tuned under (its loop schedule is the search's result, unknown
        when predicting, so training rows do not use it either)."""
        from measure.knobs import default_knobs, tuned_knobs

        from .config import Variant

        if self.knobs:
            return dict(self.knobs)
        sparse = COMPRESSION_KERNEL[self.compression][0]
        variant = Variant(self.algorithm, self.compression, 0.5 if sparse else 0.0)
        if self.tuning is Tuning.TUNED:
            return {k: v for k, v in tuned_knobs(self.spec, variant, 1).items()
                    if k != "budget"}
        return default_knobs(self.spec, variant)


def _waste(spec: ConvSpec, knobs: dict[str, int]) -> float:
    """Padded over useful work of the vector/tile loops (1.0: the tiles divide the output)."""
    w = 1.0
    if knobs.get("tile_w"):
        w *= math.ceil(spec.OW / knobs["tile_w"]) * knobs["tile_w"] / spec.OW
    if knobs.get("tile_h"):
        w *= math.ceil(spec.OH / knobs["tile_h"]) * knobs["tile_h"] / spec.OH
    if knobs.get("tile_p"):
        p = spec.OH * spec.OW
        w *= math.ceil(p / knobs["tile_p"]) * knobs["tile_p"] / p
    return w


def features(cfg: KernelConfig, device: Device) -> list[float]:
    """The feature row of one kernel (order: :data:`FEATURE_NAMES`)."""
    s = cfg.spec
    sparse, dtype, pattern = COMPRESSION_KERNEL[cfg.compression]
    nbytes = DTYPE_BYTES[dtype]
    macs = s.macs
    moved = s.bytes_moved(nbytes)
    density = 1.0 - cfg.sparsity if sparse else 1.0
    peak = device.peak_gflops.get(dtype.value) or device.peak_gflops.get("float32") or 1.0
    bw = device.mem_bandwidth_gbs or 1.0
    roofline = max(2 * macs * density / (peak * 1e9), moved / (bw * 1e9))
    knobs = cfg.resolved_knobs()
    return [
        s.C, s.K, s.H, s.W, s.R, s.S, s.stride_h, s.groups, s.OH, s.OW, float(s.depthwise),
        s.C // s.groups, math.log(macs), math.log(moved), math.log(s.params),
        2 * macs / moved,
        cfg.sparsity if sparse else 0.0, math.log(max(macs * density, 1.0)), nbytes,
        float(dtype is DType.FLOAT16), float(dtype is DType.INT8), float(sparse),
        float(pattern.value == "channel"),
        float(cfg.algorithm is Algorithm.DIRECT), float(cfg.algorithm is Algorithm.GEMM),
        float(cfg.algorithm is Algorithm.SPATIAL_PACK), float(cfg.tuning is Tuning.TUNED),
        peak, bw, device.cores, device.simd_bits or 0, math.log(roofline),
        knobs.get("tile_k", 0), knobs.get("tile_w", 0), knobs.get("tile_h", 0),
        knobs.get("tile_p", 0), _waste(s, knobs),
    ]


def roofline_seconds(cfg: KernelConfig, device: Device) -> float:
    """The roofline bound: max(dense-equivalent work / peak, bytes / bandwidth)."""
    return math.exp(features(cfg, device)[FEATURE_NAMES.index("log_roofline_s")])


def config_from_row(row: dict) -> KernelConfig:
    """A corpus row (``CorpusStore.rows``) → its :class:`KernelConfig`."""
    spec = ConvSpec.parse(row["conv"])
    comp = Compression.parse(row["compression"])
    sparse = COMPRESSION_KERNEL[comp][0]
    tuning = Tuning.parse(row["tuning"])
    # TopHub rows carry their tuned knobs; our tuned rows' layout knobs are recomputed
    knobs = ()
    if tuning is Tuning.TUNED and row.get("tuner") is None and row.get("knobs"):
        import json

        knobs = tuple(sorted(json.loads(row["knobs"]).items()))
    return KernelConfig(spec, Algorithm.parse(row["algorithm"]), comp,
                        float(row["ratio"] or 0.0) if sparse else 0.0, tuning, knobs)
