"""What a compression does to a network's weights, read without data: the features of the
accuracy-cost model (``dlas_predict.models.accuracy``).

Each compression is applied to the conv weights exactly as :mod:`compress` applies it to
an ONNX file (global L1 unstructured masks, global L1 channel masks, per-tensor symmetric
int8, float16 rounding), and described by dimensionless figures that carry from one
network to another: the share of each layer's weights (or output channels) removed, the
share of each layer's L2 energy removed (the error it injects, relative to its signal),
their worst layer, first layer and sum over depth, the channels left in the thinnest layer;
and the network's own shape: depth, depthwise share, residual adds, size, and the share of
its weights in matrix layers, in recurrent steps, and attention's products. A matrix network
is read in the form the grid prunes: its matrix layers as 1×1 convolutions, a recurrent
layer's steps unrolled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dlas_predict.compression.compress import channel_masks, conv_nodes, initializer_arrays
from dlas_predict.compression.probe import PROBE_FEATURES
from dlas_predict.errors import NetworkError
from dlas_predict.space.config import Compression, check_ratio

#: The compressions the model prices, in the order of their one-hot features.
KINDS = (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING, Compression.INT8,
         Compression.FLOAT16)
FEATURE_NAMES = (
    "is_weight_pruning", "is_channel_pruning", "is_int8", "is_float16", "ratio",
    # what the compression removes, per layer
    "removed_max", "removed_mean", "removed_first", "removed_last",
    "energy_max", "energy_mean", "energy_first", "energy_last", "energy_depth_sum",
    "energy_depth_mean", "heavy_layers", "kept_channels_min_log2",
    # the network
    "conv_layers_log2", "depthwise_share", "residual_adds_per_conv", "conv_params_log10",
    "first_params_share", "weight_spread",
    # a matrix network (in the form the grid reads: its matrix layers as 1×1 convolutions)
    "matrix_share", "shared_layers_share", "products_per_layer",
    # the pruned network run on synthetic inputs (compression.probe; missing when quantised)
    *PROBE_FEATURES,
)
#: A layer that loses more than this share of its energy counts as heavily hit.
HEAVY = 0.5


@dataclass(frozen=True)
class ConvWeights:
    """A network's conv layers as the compressions see them (graph order)."""

    weights: tuple[np.ndarray, ...]
    prunable: tuple[bool, ...]       # a channel pruning candidate (not depthwise or grouped)
    residual_adds: int
    classes: int | None              # the output width, where the graph says it
    layer_names: tuple[str, ...] = ()   # each layer's node name
    weight_names: tuple[str, ...] = ()  # its weight's name: an unrolled recurrent layer's
    #                                     steps share one
    products: int = 0                # products of two activations (attention's)
    model: object = field(default=None, compare=False, repr=False)  # the ModelProto
    digest: str | None = field(default=None, compare=False, repr=False)  # its file's sha256

    @classmethod
    def of(cls, model) -> "ConvWeights":
        """Read from an ONNX ModelProto, or a path to one: a matrix network's file in the
        form the grid reads and prunes (its matrix layers as 1×1 convolutions)."""
        from dlas_predict.files import file_digest
        from dlas_predict.networks.graph import read_proto
        from dlas_predict.networks.matrix import grid_form

        digest = None
        if not hasattr(model, "graph"):
            model = grid_form(model)
            digest = file_digest(model)
            model = read_proto(model)
        convs = conv_nodes(model)
        if not convs:
            raise NetworkError("the model has no convolution and no matrix layer with "
                               "constant weights: the accuracy-cost model prices their "
                               "compressions")
        arrays = initializer_arrays(model)
        weights = tuple(arrays[n.input[1]].astype(np.float32) for n in convs)
        adds = sum(1 for n in model.graph.node if n.op_type in ("Add", "Sum")
                   and not any(i in arrays for i in n.input))
        classes = None
        out = model.graph.output[0].type.tensor_type.shape.dim if model.graph.output else ()
        if len(out) >= 2 and out[-1].dim_value > 1:
            classes = int(out[-1].dim_value)
        groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in convs]
        products = sum(1 for n in model.graph.node if n.op_type == "MatMul"
                       and not any(i in arrays for i in n.input))
        return cls(weights, tuple(g == 1 for g in groups), adds, classes,
                   tuple(n.name or n.output[0] for n in convs),
                   tuple(n.input[1] for n in convs), products, model, digest)

    @cached_property
    def probe(self):
        """The network ready to run on synthetic inputs (:mod:`compression.probe`)."""
        from dlas_predict.compression.probe import FunctionProbe

        if self.model is None:
            raise NetworkError("the probe needs the network itself, not only its weights")
        return FunctionProbe(self.model, self.weights)

    @cached_property
    def probe_cache(self):
        import hashlib

        from dlas_predict.compression.probe import ProbeCache

        return ProbeCache(self.digest
                          or hashlib.sha256(self.model.SerializeToString()).hexdigest())

    def probed(self, compression: Compression, ratio: float, keeps) -> tuple:
        """The probe's figures of a pruning whose keep-masks ``keeps()`` gives (called only
        when the figures are not cached)."""
        key = f"{compression.value}@{ratio:.6g}"
        cached = self.probe_cache.get(key)
        if cached is None:
            cached = self.probe.compare([np.where(k, w, 0).astype(np.float32)
                                         for w, k in zip(self.weights, keeps())])
            self.probe_cache.put(key, cached)
        return cached

    @cached_property
    def magnitudes(self) -> "_Magnitudes":
        """Each layer's sorted magnitudes, their running sum of squares and each output
        channel's largest magnitude: global weight pruning at any ratio from one sort."""
        return _Magnitudes.of(self.weights)


@dataclass(frozen=True)
class _Magnitudes:
    sorted_abs: tuple[np.ndarray, ...]
    cum_sq: tuple[np.ndarray, ...]
    channel_max: tuple[np.ndarray, ...]
    flat_sorted: np.ndarray

    @classmethod
    def of(cls, weights) -> "_Magnitudes":
        s = tuple(np.sort(np.abs(w).ravel()) for w in weights)
        return cls(s, tuple(np.cumsum(np.square(a, dtype=np.float64)) for a in s),
                   tuple(np.abs(w).reshape(w.shape[0], -1).max(axis=1) for w in weights),
                   np.sort(np.concatenate(s), kind="stable"))  # merges the sorted runs

    def _cut(self, ratio: float) -> tuple[int, float | None]:
        """How many weights global pruning of ``ratio`` removes, and the magnitude of the
        largest of them (None when it removes none)."""
        k = int(np.floor(ratio * self.flat_sorted.size))
        return k, (float(self.flat_sorted[k - 1]) if k else None)

    def weight_pruning(self, ratio: float):
        """Per layer, for global L1 unstructured pruning of ``ratio`` (``weight_masks``):
        (removed weights, removed energy share, output channels left with a weight). Ties
        at the threshold are pruned in layer order."""
        k, t = self._cut(ratio)
        if t is None:
            n = len(self.sorted_abs)
            return np.zeros(n), np.zeros(n), [len(c) for c in self.channel_max]
        below = [int(np.searchsorted(a, t, "left")) for a in self.sorted_abs]
        ties = [int(np.searchsorted(a, t, "right")) - b for a, b in zip(self.sorted_abs, below)]
        left = k - sum(below)
        counts = []
        for b, tie in zip(below, ties):
            take = min(tie, max(left, 0))
            counts.append(b + take)
            left -= take
        energy = np.array([c[n - 1] / c[-1] if n and c[-1] > 0 else 0.0
                           for c, n in zip(self.cum_sq, counts)])
        kept = [int((m > t).sum()) if n < a.size else 0
                for m, n, a in zip(self.channel_max, counts, self.sorted_abs)]
        return np.array(counts, float), energy, kept

    def keep_masks(self, weights, ratio: float) -> list[np.ndarray]:
        """The keep-masks of global weight pruning at ``ratio``: every weight above the
        threshold (``weight_masks`` less its choice among weights tied at the threshold)."""
        _k, t = self._cut(ratio)
        if t is None:
            return [np.ones(w.shape, bool) for w in weights]
        return [np.abs(w) > t for w in weights]


def _network(cw: ConvWeights) -> list[float]:
    sizes = np.array([w.size for w in cw.weights], float)
    depthwise = np.array([not p for p in cw.prunable])
    spread = [float(np.std(np.abs(w)) / (np.mean(np.abs(w)) + 1e-12)) for w in cw.weights]
    return [np.log2(len(cw.weights)), float(sizes[depthwise].sum() / sizes.sum()),
            cw.residual_adds / len(cw.weights), float(np.log10(sizes.sum())),
            float(sizes[0] / sizes.sum()), float(np.average(spread, weights=sizes)),
            *_matrix(cw)]


def _matrix(cw: ConvWeights) -> list[float]:
    """The share of (distinct) weights in matrix layers, the share of layers whose weight
    another layer shares (a recurrent layer's steps), attention's products per layer: all
    0 for a CNN."""
    from dlas_predict.networks.matrix import is_matrix_layer

    if not cw.layer_names:
        return [0.0, 0.0, 0.0]
    first = {}
    for i, n in enumerate(cw.weight_names):
        first.setdefault(n, i)
    distinct = list(first.values())
    size = np.array([cw.weights[i].size for i in distinct], float)
    matrix = np.array([is_matrix_layer(cw.layer_names[i]) for i in distinct])
    counts = Counter(cw.weight_names)
    shared = np.mean([counts[n] > 1 for n in cw.weight_names])
    return [float(size[matrix].sum() / size.sum()), float(shared),
            cw.products / len(cw.weights)]


def _summary(removed: np.ndarray, energy: np.ndarray, sizes: np.ndarray,
             kept_min: float) -> list[float]:
    depth = -np.log1p(-np.minimum(energy, 0.999))
    return [float(removed.max()), float(np.average(removed, weights=sizes)), float(removed[0]),
            float(removed[-1]), float(energy.max()), float(np.average(energy, weights=sizes)),
            float(energy[0]), float(energy[-1]), float(depth.sum()), float(depth.mean()),
            float((energy > HEAVY).mean()), float(np.log2(max(kept_min, 1.0)))]


def _energy(w: np.ndarray, kept: np.ndarray) -> float:
    total = float(np.square(w).sum())
    return float(np.square(w[~kept]).sum()) / total if total > 0 else 0.0


def _quantised(w: np.ndarray, kind: Compression) -> np.ndarray:
    if kind is Compression.FLOAT16:
        return w.astype(np.float16).astype(np.float32)
    scale = float(np.abs(w).max()) / 127 or 1.0
    return np.clip(np.round(w / scale), -127, 127) * scale


def features(cw: ConvWeights, compression: Compression, ratio: float | None) -> np.ndarray:
    """One row of :data:`FEATURE_NAMES`: what ``compression`` at ``ratio`` does to ``cw``."""
    if compression not in KINDS:
        raise NetworkError(f"the accuracy-cost model prices {', '.join(k.value for k in KINDS)}"
                           f", not {compression.value}")
    ws = cw.weights
    sizes = np.array([w.size for w in ws], float)
    onehot = [float(compression is k) for k in KINDS]
    probe = (np.nan,) * len(PROBE_FEATURES)
    if compression is Compression.WEIGHT_PRUNING:
        check_ratio(float(ratio), allow_zero=True)
        counts, energy, kept = cw.magnitudes.weight_pruning(float(ratio))
        removed = counts / sizes
        kept_min = min(kept)
        if cw.model is not None:
            probe = cw.probed(compression, float(ratio),
                              lambda: cw.magnitudes.keep_masks(ws, float(ratio)))
    elif compression is Compression.CHANNEL_PRUNING:
        keeps = channel_masks(list(ws), float(ratio), list(cw.prunable))
        full = [np.broadcast_to(k.reshape(-1, *[1] * (w.ndim - 1)), w.shape)
                for w, k in zip(ws, keeps)]  # each channel's keep over its weights (views)
        removed = np.array([1 - k.mean() for k in keeps])
        energy = np.array([_energy(w, f) for w, f in zip(ws, full)])
        kept_min = min(int(k.sum()) for k, p in zip(keeps, cw.prunable) if p) \
            if any(cw.prunable) else min(len(k) for k in keeps)
        ratio = float(ratio)
        if cw.model is not None:
            probe = cw.probed(compression, ratio, lambda: full)
    else:
        errors = []
        for w in ws:
            q = _quantised(w, compression)
            total = float(np.square(w).sum())
            errors.append(float(np.square(q - w).sum()) / total if total > 0 else 0.0)
        removed = np.zeros(len(ws))
        energy = np.array(errors)
        kept_min = min(w.shape[0] for w in ws)
        ratio = 0.0
    return np.array(onehot + [float(ratio or 0.0)]
                    + _summary(removed, energy, sizes, kept_min) + _network(cw) + list(probe),
                    np.float64)
