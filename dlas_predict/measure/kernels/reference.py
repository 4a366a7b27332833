"""Numpy reference convolution, input generation and the int8 requantisation rule.

The kernels are checked against these functions, both in the tests and in every measurement
(``verified`` and ``max_error`` in the record).
"""

from __future__ import annotations

import math

import numpy as np

from dlas_predict.space.config import ConvSpec, DType


def int8_scale(spec: ConvSpec) -> float:
    """Requantisation scale of the int8 kernels: maps about 3 standard deviations of the
    int32 accumulator (inputs and weights uniform in [-64, 64]) onto the int8 range."""
    n = (spec.C // spec.groups) * spec.R * spec.S
    return float(np.float32(127.0 / (3.0 * 37.0 * 37.0 * math.sqrt(n))))


def requantize(acc: np.ndarray, scale: float) -> np.ndarray:
    """int32 accumulator -> int8: round half to even of acc*scale (float32), saturated."""
    scaled = acc.astype(np.float32) * np.float32(scale)
    return np.clip(np.rint(scaled), -128, 127).astype(np.int8)


def make_inputs(spec: ConvSpec, dtype: DType, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random input [1,C,H,W] and weights [K,C/g,R,S] of ``dtype``."""
    rng = np.random.default_rng(seed)
    if dtype is DType.INT8:
        x = rng.integers(-64, 65, size=spec.input_shape).astype(np.int8)
        w = rng.integers(-64, 65, size=spec.weight_shape).astype(np.int8)
        return x, w
    x = rng.uniform(-1.0, 1.0, size=spec.input_shape)
    w = rng.uniform(-1.0, 1.0, size=spec.weight_shape) / math.sqrt(spec.weight_shape[1] * spec.R
                                                                    * spec.S)
    return x.astype(dtype.value), w.astype(dtype.value)


def im2col(x: np.ndarray, spec: ConvSpec) -> np.ndarray:
    """[1,C,H,W] -> [groups, C/g*R*S, OH*OW] (zero padding, stride, dilation)."""
    xp = np.pad(x[0], ((0, 0), (spec.pad_t, spec.pad_b), (spec.pad_l, spec.pad_r)))
    cg = spec.C // spec.groups
    cols = np.empty((spec.C, spec.R, spec.S, spec.OH, spec.OW), dtype=x.dtype)
    for r in range(spec.R):
        for s in range(spec.S):
            h0, w0 = r * spec.dilation_h, s * spec.dilation_w
            cols[:, r, s] = xp[:, h0:h0 + spec.stride_h * (spec.OH - 1) + 1:spec.stride_h,
                               w0:w0 + spec.stride_w * (spec.OW - 1) + 1:spec.stride_w]
    return cols.reshape(spec.groups, cg * spec.R * spec.S, spec.OH * spec.OW)


def conv2d_reference(x: np.ndarray, w: np.ndarray, spec: ConvSpec, dtype: DType) -> np.ndarray:
    """Exact-as-possible reference: float64 (floats) or int64 (int8, then requantised)."""
    acc_t = np.int64 if dtype is DType.INT8 else np.float64
    cols = im2col(x.astype(acc_t), spec)
    kg = spec.K // spec.groups
    wm = w.astype(acc_t).reshape(spec.groups, kg, -1)
    out = np.einsum("gkj,gjp->gkp", wm, cols).reshape(1, spec.K, spec.OH, spec.OW)
    if dtype is DType.INT8:
        return requantize(out.astype(np.int32), int8_scale(spec))
    return out


def check_output(out: np.ndarray, ref: np.ndarray, dtype: DType) -> tuple[bool, float]:
    """(verified, max_error). Tolerances relative to the output's scale: float32 1e-4,
    float16 5e-3 (fp16 output rounding is 4.9e-4); int8 at most 1 (rounding of ties)."""
    err = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64)))) \
        if out.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if dtype is DType.INT8:
        return err <= 1.0, err
    tol = {DType.FLOAT32: 1e-4, DType.FLOAT16: 5e-3}[dtype] * max(scale, 1.0)
    return bool(err <= tol), err
