"""Calibration offsets: the log offsets of measured over predicted latencies that a
calibration fits by group (a compression, an onnxruntime run mode) and network family, each
shrunk to the level above it, and how a prediction reads them."""

from __future__ import annotations

import numpy as np


def scaled_by_parts(total: float, fixed: float, scales: tuple[float, float]) -> float:
    """``total`` with its ``fixed`` part (per-op costs) scaled by ``scales[0]`` and the
    rest by ``scales[1]``
    (:attr:`~dlas_predict.crossdev.transfer.DeviceMap.onnxruntime_scales`)."""
    a, b = scales
    return a * fixed + b * (total - fixed)


def offset_key(group: str, family: str = "") -> str:
    """The key of a group's offset: a conv network's group by its name, another family's
    prefixed by it (``transformer fp32``, ``recurrent *``)."""
    return f"{family} {group}" if family else group


#: An onnxruntime run mode whose offset, where a calibration has none of its own, is another
#: mode's before the common one: a float16 run is the fp32 graph with its weights in
#: float16 (on the 2-core Xeon, three CNNs' float16 runs took ×0.99-1.00 their fp32 time),
#: where the common offset also holds the channel-pruned and int8 graphs'.
ONNXRUNTIME_MODE_FALLBACK = {"float16": "fp32"}


def onnxruntime_groups(mode: str) -> list[str]:
    """The offset groups an onnxruntime run of ``mode`` reads, first found first
    (:func:`offset_of`): its own, then :data:`ONNXRUNTIME_MODE_FALLBACK`'s."""
    return [mode] + ([ONNXRUNTIME_MODE_FALLBACK[mode]] if mode in ONNXRUNTIME_MODE_FALLBACK
                     else [])


def offset_of(table: dict[str, float], groups: list[str], family: str = "") -> float:
    """The first of ``groups`` calibrated for ``family``, then the family's own common
    offset, then the first of ``groups`` calibrated on any network, then the common one."""
    keys = [offset_key(g, family) for g in groups] + [offset_key("*", family)] \
        if family else []
    keys += [*groups, "*"]
    return next((table[k] for k in keys if k in table), 0.0)


def shrunk_offsets(residuals: np.ndarray, groups: list[str], prior_common: float = 0.5,
                   prior_group: float = 2.0, families: list[str] | None = None,
                   networks: list[str] | None = None, with_loo: bool = True
                   ) -> tuple[dict[str, float], np.ndarray]:
    """Log offsets of measured over predicted: a common one (``"*"``, shrunk to 0 by
    ``prior_common`` rows); one per network family other than the conv networks' (``""``;
    e.g. ``"transformer *"``), shrunk to the common one by one network's weight (a
    network's rows are not independent: its own error is in every one of them; by
    ``prior_group`` rows without ``networks``); and one per group within a family (shrunk
    to the family's by ``prior_group`` rows); with each row's leave-one-out residual
    (measured minus the offsets fitted without it; none without ``with_loo``). Each
    offset is a median, not a mean: the reference model misprices a network now and then
    (on a Zen 5, onnxruntime's vgg16-cifar measured ×0.75 of its prediction where four
    other networks measured ×0.48-0.57), and one such network should not move the rows of
    every other."""
    r = np.asarray(residuals, float)
    fams = list(families) if families is not None else [""] * len(r)
    nets = list(networks) if networks is not None else None

    def shrunk(values: np.ndarray, prior: float) -> float:
        return float(np.median(values) * len(values) / (len(values) + prior)) \
            if len(values) else 0.0

    def fit(idx) -> dict[str, float]:
        common = shrunk(r[idx], prior_common)
        out = {"*": common}
        for f in sorted({fams[i] for i in idx} - {""}):
            fi = [i for i in idx if fams[i] == f]
            d = r[fi] - common
            if nets is None:
                out[offset_key("*", f)] = common + shrunk(d, prior_group)
            else:
                k = len({nets[i] for i in fi})
                out[offset_key("*", f)] = common + float(np.median(d)) * k / (k + 1.0)
        for f, g in sorted({(fams[i], groups[i]) for i in idx}):
            gi = [i for i in idx if (fams[i], groups[i]) == (f, g)]
            base = out[offset_key("*", f)] if f else common
            out[offset_key(g, f)] = base + shrunk(r[gi] - base, prior_group)
        return out

    every = list(range(len(r)))
    loo = np.array([r[i] - offset_of(fit(every[:i] + every[i + 1:]), [groups[i]], fams[i])
                    for i in every] if with_loo else [])
    return fit(every), loo
