"""Features of one kernel measurement: layer shape × configuration × device.

One row per (conv workload, algorithm, compression, layer sparsity, tuning, device). The
same function builds them for training (from corpus rows) and for prediction (from a planned
configuration), so the two cannot drift apart. Device descriptors are included so that one
model can later span devices.

A row has two parts: :data:`TREE_FEATURES`, what the gradient-boosted trees split on, then
:data:`STAGE_TERMS`, what the kernel's loops execute (vector instructions, sparse-index
decodes, layout copies, parallel tasks), counted from its schedule
(``dlas_predict/measure/kernels/cpu.py``): the terms of the stage-cost model
(:class:`~dlas_predict.models.costmodel.StageCostModel`), whose prediction the trees correct.
"""

from __future__ import annotations

import math

from dlas_predict.space.config import COMPRESSION_KERNEL, Algorithm, ConvSpec, DType, Tuning
from dlas_predict.space.devices import Device
from dlas_predict.corpus.kernels import KernelConfig, codegen
from dlas_predict.measure.kernels.knobs import winograd_extents, winograd_weight_bytes

DTYPE_BYTES = {DType.FLOAT32: 4, DType.FLOAT16: 2, DType.INT8: 1}

#: The columns the trees split on.
TREE_FEATURES = (
    # layer shape
    "C", "K", "H", "W", "R", "S", "stride", "groups", "OH", "OW", "depthwise",
    "cin_per_group", "log_macs", "log_bytes", "log_params", "intensity",
    # configuration
    "sparsity", "log_effective_macs", "dtype_bytes", "is_float16", "is_int8", "sparse",
    "channel_pattern", "algo_direct", "algo_gemm", "algo_spatial_pack", "algo_winograd",
    "tuned",
    # device
    "dev_peak_gflops", "dev_bandwidth_gbs", "dev_cores", "dev_simd_bits",
    "log_roofline_s",
    # schedule knobs (the untuned defaults, or a tuned record's own) and the work they waste
    "tile_k", "tile_w", "tile_h", "tile_p", "tile_waste", "vnni", "winograd_tile",
)

#: What the kernel's loops execute, in units that cost about the same on every shape: the
#: stage-cost model's terms (its time is a non-negative sum of them). Per core where the
#: work is split over the parallel loop, times that loop's imbalance over the cores.
STAGE_TERMS = (
    "stage_const",        # call overhead
    "stage_vector_ops",   # vector multiply-adds of the main loop, unit-stride loads
    "stage_vector_ops_strided",  # the same with strided (gathered) loads
    "stage_decodes",      # CSR nonzeros decoded (index arithmetic, scalar loads)
    "stage_layout_elems",  # elements written by padding / im2col / packing stages
    "stage_out_bytes",    # output written
    "stage_tasks",        # iterations of the parallel loop
    "stage_weight_bytes",  # weights read (nonzeros only for CSR)
    "stage_in_bytes",     # input read
    "stage_macs",         # multiply-adds that do work (scalar-bound loops)
)

#: Every column of a feature row, in model order.
FEATURE_NAMES = TREE_FEATURES + STAGE_TERMS
LANES = 16  # SIMD lanes the kernels' vector tiles are sized for (see measure/kernels/knobs.py)


def _waste(spec: ConvSpec, knobs: dict[str, int]) -> float:
    """Padded over useful work of the vector/tile loops (1.0: the tiles divide the output)."""
    if knobs.get("tile"):  # Winograd: output tiles, tiles in register blocks, filter vectors
        a, kb, tiles, padded = winograd_extents(spec, knobs)
        return (tiles * (a - 2) ** 2 / (spec.OH * spec.OW) * padded / tiles
                * _cdiv(spec.K, kb) * kb / spec.K)
    w = 1.0
    if knobs.get("tile_k"):  # a dense kernel's last block of filters, padded
        w *= math.ceil(spec.K / knobs["tile_k"]) * knobs["tile_k"] / spec.K
    if knobs.get("tile_w"):
        w *= math.ceil(spec.OW / knobs["tile_w"]) * knobs["tile_w"] / spec.OW
    if knobs.get("tile_h"):
        w *= math.ceil(spec.OH / knobs["tile_h"]) * knobs["tile_h"] / spec.OH
    if knobs.get("tile_p"):
        p = spec.OH * spec.OW
        w *= math.ceil(p / knobs["tile_p"]) * knobs["tile_p"] / p
    return w


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def loop_counts(cfg: KernelConfig, knobs: dict[str, int]) -> tuple[int, float, float, int]:
    """(parallel tasks, vector ops, CSR decodes, layout-stage elements) of the kernel's
    schedule with ``knobs`` (counted as ``dlas_predict/measure/kernels/cpu.py`` builds it; a vector
    op is one multiply-add instruction over at most :data:`LANES` lanes)."""
    s = cfg.spec
    sparse = COMPRESSION_KERNEL[cfg.compression][0]
    crs = (s.C // s.groups) * s.R * s.S
    p = s.OH * s.OW
    padded = s.C * (s.H + s.pad_t + s.pad_b) * (s.W + s.pad_l + s.pad_r)
    alg = cfg.algorithm
    if alg is Algorithm.WINOGRAD:
        # the (m+2)² GEMMs, parallel over (element, filter block): one vector multiply-add
        # per element, filter vector, padded tile and channel; the layout stages write the
        # padded input, its transform and the GEMMs' output
        a, kb, tiles, tiles_padded = winograd_extents(s, knobs)
        gemms = a * a * _cdiv(s.K, kb)
        return (gemms, gemms * tiles_padded * s.C * _cdiv(kb, LANES), 0.0,
                padded + a * a * s.C * tiles_padded + gemms * tiles_padded * kb)
    if not sparse:
        if alg is Algorithm.DIRECT and s.depthwise:
            # tasks of tile_k channels, each a register tile of rows by vector columns over
            # the output padded to whole tiles, and its input planes padded, in phases
            from dlas_predict.measure.kernels.knobs import depthwise_extents

            tk, tw = knobs["tile_k"], knobs["tile_w"]
            ohp, owp, hp, wq = depthwise_extents(s, knobs["tile_h"], tw)
            return (s.K // tk, s.K * ohp * (owp // tw) * crs * _cdiv(tw, LANES), 0.0,
                    s.C * hp * s.stride_w * wq)
        if alg is Algorithm.DIRECT:  # the output padded to whole tiles, its input wide enough
            from dlas_predict.measure.kernels.knobs import direct_input_width

            tk, tw = knobs["tile_k"], knobs["tile_w"]
            wide = direct_input_width(s, _cdiv(s.OW, tw) * tw)
            padded = s.C * (s.H + s.pad_t + s.pad_b) * wide
            return (_cdiv(s.K, tk) * s.OH, _cdiv(s.K, tk) * tk * s.OH * _cdiv(s.OW, tw) * crs,
                    0.0, padded)
        if alg is Algorithm.GEMM and knobs.get("vnni"):
            # blocks of tile_k filters by vectors of tile_p positions, one instruction per
            # filter, vector and word of four reduction elements; the im2col words over the
            # padded positions
            tk, tp = knobs["tile_k"], knobs["tile_p"]
            words, vectors = _cdiv(crs, 4), _cdiv(p, tp)
            return (_cdiv(s.K, tk) * vectors, _cdiv(s.K, tk) * tk * vectors * words, 0.0,
                    words * vectors * tp)
        if alg is Algorithm.GEMM and knobs.get("pointwise"):
            # tiles of tile_k filters by tile_p positions, the last of each overlapping the
            # one before; the input read where it lies (no layout stage)
            tk, tp = knobs["tile_k"], knobs["tile_p"]
            blocks, tiles = _cdiv(s.K, tk), _cdiv(p, tp)
            return (blocks * tiles, blocks * tk * tiles * crs * _cdiv(tp, LANES), 0.0, 0)
        if alg is Algorithm.GEMM:  # the im2col matrix padded to whole tiles of positions
            tk, tp = knobs["tile_k"], knobs["tile_p"]
            return (_cdiv(s.K, tk) * _cdiv(p, tp), _cdiv(s.K, tk) * tk * _cdiv(p, tp) * crs,
                    0.0, s.groups * crs * _cdiv(p, tp) * tp)
        kb, vh, vw = knobs["tile_k"], knobs["tile_h"], knobs["tile_w"]
        oht, owt = _cdiv(s.OH, vh), _cdiv(s.OW, vw)
        if kb >= 4:  # vectorised over the output-channel block (the last one padded)
            ops = _cdiv(s.K, kb) * oht * owt * vh * vw * crs * _cdiv(kb, LANES)
        else:        # depthwise: vectorised along the output width
            ops = s.K * oht * owt * vh * crs * _cdiv(vw, LANES)
        packed = oht * owt * s.C * ((vh - 1) * s.stride_h + s.R) * (vw + s.S) * s.stride_w
        return _cdiv(s.K, kb) * oht, ops, 0.0, packed
    nnz_row = max((1.0 - cfg.sparsity) * crs, 1.0)
    if alg is Algorithm.DIRECT:
        vl = knobs["tile_w"]
        tasks = s.K * s.OH
        return tasks, tasks * nnz_row * _cdiv(s.OW, vl) * _cdiv(vl, LANES), tasks * nnz_row, \
            padded
    if alg is Algorithm.GEMM:
        tp = knobs["tile_p"]
        tasks = s.K * _cdiv(p, tp)
        return tasks, tasks * nnz_row * _cdiv(tp, LANES), tasks * nnz_row, \
            s.groups * crs * _cdiv(p, tp) * tp
    vh, vw = knobs["tile_h"], knobs["tile_w"]
    oht, owt = _cdiv(s.OH, vh), _cdiv(s.OW, vw)
    tasks = s.K * oht
    packed = oht * owt * s.C * ((vh - 1) * s.stride_h + s.R) * ((vw - 1) * s.stride_w + s.S)
    return tasks, tasks * owt * nnz_row * vh * _cdiv(vw, LANES), tasks * owt * nnz_row, packed


def stage_terms(cfg: KernelConfig, knobs: dict[str, int], device: Device) -> list[float]:
    """The :data:`STAGE_TERMS` of one kernel on ``device``; ``knobs``: its
    :meth:`~KernelConfig.resolved_knobs`."""
    s = cfg.spec
    sparse, dtype, _ = COMPRESSION_KERNEL[cfg.compression]
    # a tuned kernel's loop knobs are the search's result, unknown before it runs: its loops
    # are counted as the untuned schedule's, under the layout knobs it is tuned with
    tasks, ops, decodes, layout = loop_counts(cfg, {**cfg.untuned_knobs(*codegen(device)),
                                                    **knobs})
    cores = max(device.cores, 1)
    per_core = _cdiv(tasks, cores) / tasks  # a core's share, with the loop's imbalance
    nbytes = DTYPE_BYTES[dtype]
    density = 1.0 - cfg.sparsity if sparse else 1.0
    strided = s.stride_w > 1
    weights = s.params * nbytes * density
    if cfg.algorithm is Algorithm.WINOGRAD:  # the transformed filters, float32
        weights = winograd_weight_bytes(s, {**cfg.untuned_knobs(*codegen(device)), **knobs})
    return [1.0, 0.0 if strided else ops * per_core, ops * per_core if strided else 0.0,
            decodes * per_core, layout / cores, s.K * s.OH * s.OW * nbytes, tasks / cores,
            weights, s.C * s.H * s.W * nbytes, s.macs * density * per_core]


def weight_bytes(X):
    """Each feature row's kernel weights as stored (an array): the values (nonzeros for
    CSR), plus a 4-byte column index per nonzero for CSR."""
    import numpy as np

    X = np.asarray(X, dtype=np.float64)
    values = X[:, FEATURE_NAMES.index("stage_weight_bytes")]
    nonzeros = values / X[:, FEATURE_NAMES.index("dtype_bytes")]
    return values + X[:, FEATURE_NAMES.index("sparse")] * 4 * nonzeros


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
    knobs = cfg.resolved_knobs(*codegen(device))
    return [
        s.C, s.K, s.H, s.W, s.R, s.S, s.stride_h, s.groups, s.OH, s.OW, float(s.depthwise),
        s.C // s.groups, math.log(macs), math.log(moved), math.log(s.params),
        2 * macs / moved,
        cfg.sparsity if sparse else 0.0, math.log(max(macs * density, 1.0)), nbytes,
        float(dtype is DType.FLOAT16), float(dtype is DType.INT8), float(sparse),
        float(pattern.value == "channel"),
        float(cfg.algorithm is Algorithm.DIRECT), float(cfg.algorithm is Algorithm.GEMM),
        float(cfg.algorithm is Algorithm.SPATIAL_PACK),
        float(cfg.algorithm is Algorithm.WINOGRAD), float(cfg.tuning is Tuning.TUNED),
        peak, bw, device.cores, device.simd_bits or 0, math.log(roofline),
        knobs.get("tile_k", 0), knobs.get("tile_w", 0), knobs.get("tile_h", 0),
        knobs.get("tile_p", 0), _waste(s, knobs), float(bool(knobs.get("vnni"))),
        knobs.get("tile", 0), *stage_terms(cfg, knobs, device),
    ]


