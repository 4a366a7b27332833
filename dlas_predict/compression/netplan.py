"""A network's conv layers under each compression, as the kernels ``collect`` measures.

Global pruning prunes layers unevenly, so a pruned network is not "every layer at ratio r":
each conv layer's kernels are measured at that layer's own sparsity, read from the pruned
weights, rounded so that similar layers share measurements (:func:`kernel_ratio`).

Channel pruning builds a smaller network: its zeroed filters are removed
(:func:`~dlas_predict.compression.compress.remove_zero_channels`), so its layers have
fewer channels, and the sparsity left in a layer is the zeroed filters that could not be
removed (those feeding a residual addition or a concatenation). A layer with none left runs
the dense kernels (:func:`layer_sparse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlas_predict.space.config import Compression, ConvSpec

#: The sparsest kernel a layer is measured at: one weight in 10,000 left. A layer pruned to
#: nothing is measured there (its CSR kernel holds at least one entry).
MIN_LAYER_DENSITY = 1e-4


@dataclass(frozen=True)
class LayerConfig:
    """One conv layer of a (compressed) network and the kernel ratio it is measured at."""

    index: int
    name: str
    spec: ConvSpec
    compression: Compression
    ratio: float  # 0 for unpruned compressions


def layer_sparse(compression: Compression, ratio: float) -> bool:
    """Whether a layer of a network compressed so, measured at kernel ratio ``ratio``, runs
    the CSR kernel in the study's uniform configurations: weight-pruned layers always,
    channel-pruned layers where zeroed filters are left after removal."""
    from dlas_predict.space.config import COMPRESSION_KERNEL

    if compression is Compression.CHANNEL_PRUNING:
        return ratio > 0
    return COMPRESSION_KERNEL[compression][0]


def layer_kernel(compression: Compression, ratio: float) -> tuple[Compression, float]:
    """The kernel (compression, ratio) a layer measured at ``ratio`` runs in the study's
    uniform configurations: a channel-pruned layer with no zeroed filter left is dense."""
    if compression is Compression.CHANNEL_PRUNING and not ratio:
        return Compression.DENSE, 0.0
    return compression, ratio


def config_label(compression: Compression, ratio: float | None) -> str:
    """``dense``, ``float16``, ``int8``, ``weight_pruning@0.9``, ``channel_pruning@0.5``."""
    if compression in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING):
        return f"{compression.value}@{ratio:g}"
    return compression.value


def kernel_ratio(sparsity: float) -> float:
    """The ratio a layer of this sparsity is measured at: its density (1 - sparsity) to two
    significant figures, so the kernel does the layer's work within ±5 %. That is 0.01 steps
    up to 0.9, then 0.001 up to 0.99, and so on: a channel-pruned layer keeping 1 of 768
    filters is measured with 1, not with 1 % of them."""
    density = max(1.0 - float(sparsity), MIN_LAYER_DENSITY)
    step = 10.0 ** (math.floor(math.log10(density)) - 1)
    return max(ratio_key(1.0 - round(density / step) * step), 0.0)


def ratio_key(ratio: float | None) -> float:
    """A stored kernel ratio as a lookup key: rounded finer than :func:`kernel_ratio`'s
    finest step, so that every reader matches the ratios ``collect`` wrote."""
    return round(float(ratio or 0.0), 6)


def network_configs(model: str, compressions: list[Compression], ratio: float,
                    per_layer: bool = True, net=None) -> dict[str, list[LayerConfig]]:
    """For each compression, the conv layers of ``model`` (a path or ``zoo:NAME``) with the
    ratio to measure each at: its own sparsity after global pruning at ``ratio`` (or
    ``ratio`` itself for every layer when ``per_layer`` is false). Channel pruning gives the
    layers of the network with its zeroed filters removed, each at the sparsity left in it,
    ``per_layer`` or not. ``net``: the model's
    :class:`~dlas_predict.networks.graph.Network`, when the caller has already read it."""
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network

    convs = (net or read_network(zoo.resolve(model))).convs()
    out: dict[str, list[LayerConfig]] = {}
    for comp in compressions:
        pruning = comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
        if not pruning:
            out[config_label(comp, None)] = [LayerConfig(c.index, c.name, c.spec, comp, 0.0)
                                             for c in convs]
            continue
        if comp is Compression.CHANNEL_PRUNING:
            out[config_label(comp, ratio)] = [
                LayerConfig(c.index, c.name, spec, comp, kernel_ratio(left))
                for c, (spec, left) in zip(convs, removed_layers(model, ratio, len(convs)))]
            continue
        if not per_layer:
            out[config_label(comp, ratio)] = [LayerConfig(c.index, c.name, c.spec, comp, ratio)
                                              for c in convs]
            continue
        from dlas_predict.compression.accuracy import prepare

        layers = prepare(model, comp.value, ratio).compressed.layers
        if len(layers) != len(convs):
            from dlas_predict.errors import NetworkError

            raise NetworkError(f"{model}: {len(convs)} conv layers but {len(layers)} with "
                               "constant weights; per-layer sparsity needs constant weights")
        out[config_label(comp, ratio)] = [
            LayerConfig(c.index, c.name, c.spec, comp, kernel_ratio(l.sparsity))
            for c, l in zip(convs, layers)]
    return out


def removed_layers(model: str, ratio: float, n_convs: int) -> list[tuple[ConvSpec, float]]:
    """Each conv layer of ``model`` channel-pruned at ``ratio`` with its zeroed filters
    removed: its spec and the sparsity left in it."""
    from dlas_predict.compression.compress import cached_channel_removed
    from dlas_predict.errors import NetworkError

    layers, _summary = cached_channel_removed(model, [ratio])[float(ratio)]
    if len(layers) != n_convs:
        raise NetworkError(f"{model}: {n_convs} conv layers but {len(layers)} with constant "
                           "weights; channel pruning needs constant weights")
    return layers
