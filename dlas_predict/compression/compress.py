"""The study's four compressions, applied to ONNX weights (and to torch models for
fine-tuning).

- ``weight_pruning``: global L1 unstructured — the ``ratio`` smallest-magnitude weights of
  all convolutions together are zeroed, so layers end up pruned unevenly.
- ``channel_pruning``: global L1 structured over conv output channels — channels are ranked
  across all convolutions by their L1 norm per weight (the norm over the fan-in, so wide and
  narrow layers compare) and the lowest ``ratio`` share of the channels of ordinary
  convolutions gets zero weights, keeping at least one channel per layer; depthwise and
  grouped convs keep theirs (their channels are tied to their input's). The bias (the folded
  batch norm's shift) stays, as in the study's CSR form. ``remove_zero_channels`` then removes
  what can be removed exactly, giving a smaller dense network (beyond the study).
- ``float16``: weights rounded to float16 and every layer's output rounded to float16
  (Cast pairs), which is what the float16 kernels do (fp16 storage, fp32 accumulation).
- ``int8``: post-training static quantisation by onnxruntime (QDQ, per-tensor, MinMax),
  calibrated on sample inputs.

Where a torch definition exists (the zoo), pruning is applied to the torch model before
export (:func:`torch_masks`): weight pruning ranks the raw conv weights (as
``torch.nn.utils.prune.global_unstructured`` would), channel pruning ranks the effective
weights (batch-norm scale folded in: a raw channel norm means little next to its norm's
scale). On a plain ONNX file the weights at hand are ranked (exported networks usually have
their batch norms folded in).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from dlas_predict.space.config import Compression, ConvSpec, check_ratio
from dlas_predict.errors import ConfigError, NetworkError, param


@dataclass(frozen=True)
class LayerSparsity:
    """A compressed conv layer: its workload and how much of it is zero."""

    name: str
    spec: ConvSpec
    sparsity: float  # share of zero weights (what the CSR kernels see)
    channels_kept: int
    channels: int

    def to_dict(self) -> dict:
        return {"name": self.name, "conv": self.spec.to_spec(),
                "sparsity": round(self.sparsity, 6), "channels_kept": self.channels_kept,
                "channels": self.channels}


@dataclass
class CompressedModel:
    """An ONNX model after compression, with each conv layer's own sparsity."""

    model: object  # onnx.ModelProto
    compression: Compression
    ratio: float | None
    layers: list[LayerSparsity] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def sparsity(self) -> float:
        """Zero weights over all conv weights."""
        total = sum(l.spec.params for l in self.layers)
        return sum(l.sparsity * l.spec.params for l in self.layers) / total if total else 0.0


# ---- masks (shared by the ONNX and torch paths) ------------------------------------------
def weight_masks(weights: list[np.ndarray], ratio: float) -> list[np.ndarray]:
    """Global L1 unstructured: keep-masks zeroing the ``ratio`` smallest |w| overall."""
    check_ratio(ratio, allow_zero=True)
    flat = np.concatenate([np.abs(w).ravel() for w in weights])
    k = int(np.floor(ratio * flat.size))
    keep = np.ones(flat.size, bool)
    if k:
        keep[np.argpartition(flat, k - 1)[:k]] = False  # exactly k pruned, ties included
    bounds = np.cumsum([0] + [w.size for w in weights])
    return [keep[bounds[i]:bounds[i + 1]].reshape(w.shape) for i, w in enumerate(weights)]


def channel_masks(weights: list[np.ndarray], ratio: float,
                  prunable: list[bool] | None = None) -> list[np.ndarray]:
    """Global L1 structured: per-layer keep-masks over output channels. Layers not
    ``prunable`` (depthwise and grouped convs, whose channels are tied to their input's) keep
    every channel; ``ratio`` is the share of the prunable channels removed."""
    check_ratio(ratio, allow_zero=True)
    if prunable is None:
        prunable = [True] * len(weights)
    scores = [np.abs(w).reshape(w.shape[0], -1).mean(axis=1) for w in weights]
    scores = [s if ok else np.full(len(s), np.inf) for s, ok in zip(scores, prunable)]
    owner = np.concatenate([np.full(len(s), i) for i, s in enumerate(scores)])
    starts = np.cumsum([0] + [len(s) for s in scores])
    flat = np.concatenate(scores)
    n_prunable = sum(len(s) for s, ok in zip(scores, prunable) if ok)
    k = int(np.floor(ratio * n_prunable))
    keep = [np.ones(len(s), bool) for s in scores]
    left = [len(s) for s in scores]
    pruned = 0
    for j in np.argsort(flat, kind="stable"):
        if pruned >= k:
            break
        i = owner[j]
        if not prunable[i] or left[i] <= 1:  # keep at least one channel per layer
            continue
        keep[i][j - starts[i]] = False
        left[i] -= 1
        pruned += 1
    return keep


# ---- ONNX helpers ------------------------------------------------------------------------
def conv_nodes(model) -> list:
    inits = {i.name for i in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type == "Conv" and n.input[1] in inits]


def initializer_arrays(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i).copy() for i in model.graph.initializer}


def _write_arrays(model, arrays: dict[str, np.ndarray]) -> None:
    from onnx import numpy_helper

    for i, init in enumerate(model.graph.initializer):
        if init.name in arrays:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(arrays[init.name],
                                                                       init.name))


def layer_sparsity(model) -> list[LayerSparsity]:
    """Each conv layer's workload and share of zero weights, read from the weights."""
    import onnx

    from dlas_predict.networks.graph import conv_spec_of, value_shapes, inline_constant_identities

    model = copy.deepcopy(model)
    inline_constant_identities(model)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    shapes = value_shapes(model)
    arrays = initializer_arrays(model)
    out = []
    for node in conv_nodes(model):
        w = arrays[node.input[1]]
        name = node.name or node.output[0]
        spec = conv_spec_of(node, name, shapes.get(node.input[0]), tuple(w.shape))
        zero_rows = ~np.any(w.reshape(w.shape[0], -1) != 0, axis=1)
        out.append(LayerSparsity(name, spec, float((w == 0).mean()),
                                 int((~zero_rows).sum()), int(w.shape[0])))
    return out


def _prune_onnx(model, kind: Compression, ratio: float):
    arrays = initializer_arrays(model)
    convs = conv_nodes(model)
    if not convs:
        raise NetworkError("the model has no convolution with constant weights to prune")
    weights = [arrays[n.input[1]] for n in convs]
    if kind is Compression.WEIGHT_PRUNING:
        for n, w, m in zip(convs, weights, weight_masks(weights, ratio)):
            arrays[n.input[1]] = np.where(m, w, 0).astype(w.dtype)
    else:
        groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in convs]
        for n, w, keep in zip(convs, weights,
                              channel_masks(weights, ratio, [g == 1 for g in groups])):
            arrays[n.input[1]] = (w * keep.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
    _write_arrays(model, arrays)


def _float16(model) -> None:
    """Round weights to fp16 and every compute node's float output to fp16 (Cast pairs)."""
    import onnx
    from onnx import TensorProto, helper

    arrays = initializer_arrays(model)
    _write_arrays(model, {k: v.astype(np.float16).astype(np.float32)
                          for k, v in arrays.items() if v.dtype == np.float32})
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    float_vals = {vi.name for vi in [*inferred.graph.value_info, *inferred.graph.output]
                  if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type in ("Constant", "Identity", "Shape"):
            continue
        for j, out in enumerate(node.output):
            if out not in float_vals:
                continue
            raw = f"{out}__fp32"
            node.output[j] = raw
            half = f"{out}__fp16"
            nodes.append(helper.make_node("Cast", [raw], [half], to=TensorProto.FLOAT16,
                                          name=f"{out}/to_fp16"))
            nodes.append(helper.make_node("Cast", [half], [out], to=TensorProto.FLOAT,
                                          name=f"{out}/from_fp16"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _int8(model, calibration: np.ndarray):
    """onnxruntime static QDQ quantisation (per-tensor, MinMax) calibrated on ``calibration``."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self, name: str, x: np.ndarray):
            self.items = iter([{name: x[i:i + 1].astype(np.float32)} for i in range(len(x))])

        def get_next(self):
            return next(self.items, None)

    import logging

    logging.disable(logging.WARNING)  # onnxruntime's "consider pre-processing" advice
    try:
        return _quantize(model, calibration, Reader, os, tempfile, onnx, quantize_static,
                         QuantFormat, QuantType)
    finally:
        logging.disable(logging.NOTSET)


def _quantize(model, calibration, Reader, os, tempfile, onnx, quantize_static, QuantFormat,
              QuantType):
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        onnx.save(model, src)
        name = model.graph.input[0].name
        quantize_static(src, dst, Reader(name, calibration), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=False)
        return onnx.load(dst)


#: How :func:`removal_note` begins, after the count of removed channels.
_REMOVED = " zeroed channels physically removed; "


def removal_note(removed: int, kept_zero: int) -> str:
    return (f"{removed}{_REMOVED}{kept_zero} stay zeroed (they "
            "reach a residual addition, a concatenation or an op the remover does not "
            "follow, such as SiLU)")


def removed_channels(note: str) -> int | None:
    """The count of removed channels a :func:`removal_note` gives (None: not such a note)."""
    count, sep, _ = str(note).partition(_REMOVED)
    return int(count) if sep and count.isdigit() else None


def compress_onnx(model, compression: Compression | str, ratio: float | None = None,
                  calibration: np.ndarray | None = None,
                  remove_channels: bool = False) -> CompressedModel:
    """Compress an ONNX ModelProto (not modified); ``calibration`` feeds int8 (N×C×H×W)."""
    from dlas_predict.networks.graph import inline_constant_identities

    compression = Compression.parse(compression)
    model = copy.deepcopy(model)
    inline_constant_identities(model)
    notes = []
    if compression in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING):
        if ratio is None:
            raise ConfigError(f"{compression.value} needs a ratio in [0, 1)")
        check_ratio(ratio, allow_zero=True)
        _prune_onnx(model, compression, ratio)
    elif ratio is not None and ratio != 0:
        raise ConfigError(f"{compression.value} takes no ratio (got {ratio})")
    if remove_channels:
        if compression is not Compression.CHANNEL_PRUNING:
            raise ConfigError(f"removing channels needs {param('compression')} channel_pruning")
        model, removed, kept_zero = remove_zero_channels(model)
        notes.append(removal_note(removed, kept_zero))
    sparsity = layer_sparsity(model)
    if compression is Compression.FLOAT16:
        _float16(model)
        notes.append("float16 emulated: weights and every layer output rounded to float16, "
                     "fp32 accumulation (as the float16 kernels)")
    elif compression is Compression.INT8:
        if calibration is None or len(calibration) == 0:
            raise ConfigError("int8 needs calibration inputs")
        model = _int8(model, calibration)
        notes.append(f"int8: onnxruntime static QDQ quantisation, per-tensor MinMax, "
                     f"calibrated on {len(calibration)} inputs")
    return CompressedModel(model, compression, ratio if compression.value.endswith("pruning")
                           else None, sparsity, notes)


# ---- physically removing zeroed channels ------------------------------------------------
_PER_CHANNEL = {"Relu", "LeakyRelu", "Identity", "HardSwish", "Clip", "MaxPool",
                "GlobalAveragePool", "GlobalMaxPool",
                "AveragePool", "Dropout"}


#: Elementwise ops a zeroed channel's constant is followed through where each operand is
#: the channel's own tensor or a scalar constant (GELU's x·½·(1 + erf(x/√2)), a scaling).
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Sigmoid"}
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_UNARY = {"Erf": None, "Tanh": np.tanh, "Sigmoid": lambda v: 1 / (1 + np.exp(-v))}


def _apply_chain(ops: list, values: np.ndarray, consts: dict) -> np.ndarray:
    """A constant channel's value after per-channel ops (:meth:`_ChannelRemover.chain`, in
    the order they run): ``values`` enter at the one input that neither an op of ``ops`` nor
    a constant gives."""
    from scipy.special import erf

    env: dict[str, np.ndarray] = {}

    def operand(name: str) -> np.ndarray:
        if name in env:
            return env[name]
        return np.asarray(consts[name], np.float64).reshape(()) if name in consts else values

    out = values
    for node in ops:
        v = operand(node.input[0])
        if node.op_type == "Relu":
            v = np.maximum(v, 0)
        elif node.op_type == "Clip":
            lo = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
            hi = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            v = np.clip(v, -np.inf if lo is None else float(lo),
                        np.inf if hi is None else float(hi))
        elif node.op_type == "LeakyRelu":
            v = np.where(v > 0, v, v * 0.01)
        elif node.op_type == "HardSwish":
            v = v * np.clip(v / 6 + 0.5, 0, 1)
        elif node.op_type in _BINARY:
            v = _BINARY[node.op_type](v, operand(node.input[1]))
        elif node.op_type in _UNARY:
            v = erf(v) if node.op_type == "Erf" else _UNARY[node.op_type](v)
        # Identity, pooling, Dropout and a reshape that keeps the channels leave it unchanged
        env[node.output[0]] = out = np.broadcast_to(v, np.shape(values)).astype(np.float64)
    return out


def remove_zero_channels(model):
    """Remove the output channels whose conv weights are all zero, giving a smaller dense
    network. Such a channel outputs its bias everywhere; that constant is followed through
    per-channel ops (ReLU, ReLU6, pooling, GELU; a fully connected layer's reshapes) and
    folded into the biases of the consumers:
    convolutions (their input channel goes), a depthwise conv (its channel goes too, and its
    constant output is folded onward), or flatten-then-Gemm. The fold is exact for 1×1
    unpadded consumers and for constants that are zero; next to a padded border it is not
    (the border saw zeros), which is why the removed network's accuracy is measured on its
    own. Channels feeding a residual addition or a concatenation stay (zeroed).
    Returns ``(model, removed, kept_zero)``."""
    return _ChannelRemover(model).run()


def _attr(node, name: str, default):
    from onnx import helper

    for a_ in node.attribute:
        if a_.name == name:
            return helper.get_attribute_value(a_)
    return default


class _ChannelRemover:
    """:func:`remove_zero_channels` on a copy of ``model``: for each conv with zeroed output
    channels, plan how its consumers drop them (:meth:`plan_for`), then do it
    (:meth:`execute`)."""

    def __init__(self, model) -> None:
        from onnx import numpy_helper

        from dlas_predict.networks.graph import (infer_shapes, value_shapes,
                                                 inline_constant_identities)

        self.model = copy.deepcopy(model)
        inline_constant_identities(self.model)
        self.arrays = initializer_arrays(self.model)
        self.consts = dict(self.arrays)
        for node in self.model.graph.node:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.consumers: dict[str, list] = {}
        for node in self.model.graph.node:
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        self.graph_outputs = {o.name for o in self.model.graph.output}
        infer_shapes(self.model)  # into value_info, which run() clears: shapes change
        self.shapes = value_shapes(self.model)

    def run(self):
        from onnx import numpy_helper

        arrays = self.arrays
        removed = kept_zero = 0
        for node in conv_nodes(self.model):
            if _attr(node, "group", 1) != 1:
                continue  # a depthwise/grouped conv's channels are tied to its input's
            w = arrays[node.input[1]]
            zero = ~np.any(w.reshape(w.shape[0], -1) != 0, axis=1)
            if not zero.any() or zero.all():
                continue
            plan = self.plan_for(node.output[0], w.shape[0])
            if plan is None:
                kept_zero += int(zero.sum())
                continue
            bias_name = (node.input[2] if len(node.input) > 2 and node.input[2] in arrays
                         else None)
            const = (arrays[bias_name][zero].astype(np.float64) if bias_name
                     else np.zeros(int(zero.sum())))
            self.execute(plan, zero, const)
            arrays[node.input[1]] = w[~zero]
            if bias_name:
                arrays[bias_name] = arrays[bias_name][~zero]
            removed += int(zero.sum())
        for i, init in enumerate(self.model.graph.initializer):
            if init.name in arrays:  # weights as float32; shapes and indices keep theirs
                a = arrays[init.name]
                self.model.graph.initializer[i].CopyFrom(numpy_helper.from_array(
                    # (ascontiguousarray would make a scalar, e.g. a Gather's index, 1-d)
                    np.asarray(a, dtype=np.float32 if a.dtype.kind == "f" else a.dtype
                               ).copy(order="C"),
                    init.name))
        del self.model.graph.value_info[:]  # shapes changed: let inference redo them
        return self.model, removed, kept_zero

    def chain(self, tensor: str):
        """The per-channel ops after ``tensor`` in the order they run, the one tensor they
        end at, and its consumers; None when they reach a graph output or end at several
        tensors. An op is per-channel when it is one of :data:`_PER_CHANNEL` and the only
        user of its input, a reshape that keeps the channel axis (a fully connected layer's
        rows as an image and back), or one of :data:`_ELEMENTWISE` whose other operand is
        the same channel's or a scalar constant."""
        ops, inside, grown = [], {tensor}, True
        while grown:
            grown = False
            for node in self.model.graph.node:  # graph order: each op after its inputs
                if node.output[0] not in inside and \
                        any(i in inside for i in node.input) and self.per_channel(node, inside):
                    ops.append(node)
                    inside.add(node.output[0])
                    grown = True
        if inside & self.graph_outputs:
            return None
        ends = [t for t in inside if any(u not in ops for u in self.consumers.get(t, []))]
        if len(ends) > 1:
            return None
        end = ends[0] if ends else tensor
        return ops, end, self.consumers.get(end, [])

    def per_channel(self, node, inside: set) -> bool:
        """Whether ``node`` (an input in ``inside``) maps each channel of the tensors in
        ``inside`` to the same channel, as :meth:`chain` follows them."""
        if node.op_type in _ELEMENTWISE:
            return all(i in inside or (i in self.consts and np.size(self.consts[i]) == 1)
                       for i in node.input)
        if node.input[0] not in inside:
            return False
        if node.op_type in _PER_CHANNEL:
            return len(self.consumers.get(node.input[0], [])) == 1
        if node.op_type != "Reshape":
            return False
        a, b = self.shapes.get(node.input[0]), self.shapes.get(node.output[0])
        shape = self.consts.get(node.input[1]) if len(node.input) > 1 else None
        return (a is not None and b is not None and shape is not None and len(a) >= 2
                and len(b) >= 2 and list(a[:2]) == list(b[:2])
                and all(d == 1 for d in list(a[2:]) + list(b[2:]))
                and int(np.asarray(shape).ravel()[1]) in (-1, 0))

    def bias_of(self, node, n: int) -> str:
        """The name of ``node``'s bias, adding a zero one of ``n`` channels if it has none."""
        from onnx import numpy_helper

        if len(node.input) > 2 and node.input[2] in self.arrays:
            return node.input[2]
        name = f"{node.name or node.output[0]}__bias"
        self.arrays[name] = np.zeros(n, np.float32)
        self.model.graph.initializer.append(numpy_helper.from_array(self.arrays[name], name))
        if len(node.input) < 3:
            node.input.append(name)
        else:
            node.input[2] = name
        return name

    def plan_for(self, tensor: str, n_channels: int, depth: int = 0):
        """How to drop channels of ``tensor``: a list of (kind, node, extra), or None."""
        arrays, traced = self.arrays, self.chain(tensor)
        if traced is None:
            return None
        ops, end, users = traced
        if not users:
            return None
        plan = []
        for u in users:
            if u.op_type == "Conv" and u.input[0] == end and u.input[1] in arrays:
                groups = _attr(u, "group", 1)
                if groups == 1:
                    plan.append(("conv_in", u, ops))
                elif groups == n_channels == arrays[u.input[1]].shape[0] and depth == 0:
                    sub = self.plan_for(u.output[0], n_channels, depth + 1)
                    if sub is None:
                        return None
                    plan.append(("depthwise", u, (ops, sub)))
                else:
                    return None
            elif u.op_type == "Flatten" and len(self.consumers.get(u.output[0], [])) == 1:
                g = self.consumers[u.output[0]][0]
                shp = self.shapes.get(end)
                if not (g.op_type == "Gemm" and g.input[1] in arrays and shp is not None
                        and _attr(g, "transB", 0) == 1 and not _attr(g, "transA", 0)):
                    return None
                plan.append(("gemm", g, (ops, int(np.prod(shp[2:])))))
            else:
                return None
        return plan

    def execute(self, plan, zero: np.ndarray, const: np.ndarray) -> None:
        """Drop the ``zero`` channels from each consumer of ``plan``, folding their constant
        output ``const`` (after the per-channel ops) into the consumers' biases."""
        arrays, consts, keep = self.arrays, self.consts, ~zero
        for kind, u, extra in plan:
            if kind == "conv_in":
                w = arrays[u.input[1]]
                v = _apply_chain(extra, const, consts)
                if np.any(v != 0):
                    b = self.bias_of(u, w.shape[0])
                    arrays[b] = (arrays[b] + w[:, zero].sum(axis=(2, 3)) @ v).astype(np.float32)
                arrays[u.input[1]] = w[:, keep]
            elif kind == "gemm":
                ops, per = extra
                w = arrays[u.input[1]]
                v = np.repeat(_apply_chain(ops, const, consts), per)
                cols = np.repeat(keep, per)
                if np.any(v != 0):
                    b = self.bias_of(u, w.shape[0])
                    arrays[b] = (arrays[b] + w[:, ~cols] @ v).astype(np.float32)
                arrays[u.input[1]] = w[:, cols]
            else:
                ops, sub = extra
                w = arrays[u.input[1]]
                v = _apply_chain(ops, const, consts)
                b = arrays.get(u.input[2]) if len(u.input) > 2 else None
                dconst = w[zero].reshape(int(zero.sum()), -1).sum(axis=1) * v
                if b is not None:
                    dconst = dconst + b[zero]
                    arrays[u.input[2]] = b[keep]
                arrays[u.input[1]] = w[keep]
                for a_ in u.attribute:
                    if a_.name == "group":
                        a_.i = int(keep.sum())
                self.execute(sub, zero, dconst)


# ---- torch path (fine-tuning) ------------------------------------------------------------
def _masked_sparsity(weights: list[np.ndarray], compression: Compression, ratio: float,
                     prunable: list[bool], ranked: list[np.ndarray] | None = None) -> list[float]:
    """Each layer's share of zeros after global pruning of ``weights`` (ranked by ``ranked``,
    default the weights themselves), without touching them."""
    ranked = weights if ranked is None else ranked
    if compression is Compression.WEIGHT_PRUNING:
        masks = weight_masks(ranked, ratio)
        return [float(((w == 0) | ~m).mean()) for w, m in zip(weights, masks)]
    keeps = channel_masks(ranked, ratio, prunable)
    return [float(((w * k.reshape(-1, *[1] * (w.ndim - 1))) == 0).mean())
            for w, k in zip(weights, keeps)]


def _ranked_weights(model: str):
    """The conv weights of ``model`` as pruning ranks them: (raw, ranked, prunable) per conv
    layer in graph order (zoo networks from their torch definition, ranked with the batch
    norm's scale folded in for channel pruning; ONNX files from their initializers)."""
    from dlas_predict.networks import zoo

    if str(model).startswith(zoo.ZOO_PREFIX) and zoo.get(model).pruned_in_torch:
        import torch

        from dlas_predict.networks.torchmodels import conv_bn_pairs

        pairs = conv_bn_pairs(zoo.torch_model(zoo.get(model).name))
        raw = [conv.weight.detach().numpy() for conv, _ in pairs]
        folded = []  # channel pruning ranks the BN-folded weights
        for (conv, bn), w in zip(pairs, raw):
            if bn is None:
                folded.append(w)
                continue
            scale = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().numpy()
            folded.append(w * scale.reshape(-1, 1, 1, 1))
        return raw, folded, [conv.groups == 1 for conv, _ in pairs]
    from onnx import numpy_helper

    from dlas_predict.networks.graph import read_proto

    m = read_proto(zoo.resolve(model))
    convs = conv_nodes(m)
    inits = {i.name: i for i in m.graph.initializer}  # only the conv weights are read
    raw = [numpy_helper.to_array(inits[n.input[1]]) for n in convs]
    return raw, raw, [_attr(n, "group", 1) == 1 for n in convs]


def pruned_sparsities(model: str, grid: dict) -> dict[tuple, list[float]]:
    """Per conv layer (graph order), its sparsity after global pruning, for every
    (compression, ratio) of ``grid`` ({Compression: [ratios]}), pruned as
    :func:`dlas_predict.compression.accuracy.prepare` prunes (zoo networks on their torch
    weights, ONNX files on their initializers) but without exporting anything: what ``recommend``
    uses to enumerate the grid in seconds."""
    grid = {Compression.parse(c): list(r) for c, r in grid.items()}
    for comp in grid:
        if comp not in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING):
            raise ConfigError(f"{comp.value} prunes nothing")
    raw, folded, prunable = _ranked_weights(model)
    out: dict[tuple, list[float]] = {}
    for comp, ratios in grid.items():
        if comp is Compression.WEIGHT_PRUNING:
            out.update({(comp, r): v for r, v in _weight_sparsities(raw, ratios).items()})
        else:
            out.update({(comp, r): _masked_sparsity(raw, comp, r, prunable, folded)
                        for r in ratios})
    return out


def channel_removed_networks(model: str, ratios) -> dict[float, tuple[list, dict]]:
    """For each ratio, the network that channel pruning at that ratio builds (its zeroed
    filters removed by :func:`remove_zero_channels`), as ``(layers, summary)``: per conv
    layer (graph order) its ``(conv spec, sparsity left)``, where the sparsity left is the
    zeroed filters that could not be removed; and the
    :class:`~dlas_predict.networks.summary.NetworkSummary` fields of the removed network.
    Pruned as :func:`pruned_sparsities` prunes, on the model's own ONNX graph."""
    from dataclasses import asdict

    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import network_of_proto, read_proto

    raw, folded, prunable = _ranked_weights(model)
    base = read_proto(zoo.resolve(model))
    convs = conv_nodes(base)
    if len(convs) != len(raw):
        raise NetworkError(f"{model}: {len(convs)} conv layers with constant weights but "
                           f"{len(raw)} prunable convs in its definition")
    arrays = initializer_arrays(base)
    out = {}
    for r in ratios:
        keeps = channel_masks(folded, r, prunable)
        m = copy.deepcopy(base)
        pruned = {n.input[1]: arrays[n.input[1]] * k.reshape(-1, *[1] * (raw[i].ndim - 1))
                  for i, (n, k) in enumerate(zip(convs, keeps))}
        _write_arrays(m, {k: v.astype(np.float32) for k, v in pruned.items()})
        m, _removed, _kept = remove_zero_channels(m)
        left = initializer_arrays(m)
        net = network_of_proto(m, str(model))
        layers = []
        for node, layer in zip(conv_nodes(m), net.convs()):
            w = left[node.input[1]]
            layers.append((layer.spec, float((w == 0).mean())))
        out[r] = (layers, asdict(NetworkSummary.of(net)))
    return out


_SPARSITY_RULES = "1"


def cached_pruned_sparsities(model: str, grid: dict) -> dict[tuple, list[float]]:
    """:func:`pruned_sparsities`, remembered under DLAS_HOME per model file (path, size,
    modification time) and grid: the zoo's torch weights are loaded once, not per call."""
    import hashlib
    import json

    from dlas_predict.networks import zoo
    from dlas_predict.paths import cache_dir

    path = zoo.resolve(model)
    st = path.stat()
    key = json.dumps([str(model), str(path.resolve()), st.st_size, st.st_mtime_ns,
                      _SPARSITY_RULES, sorted((Compression.parse(c).value, sorted(r))
                                              for c, r in grid.items())])
    file = cache_dir("sparsities") / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
    try:
        rows = json.loads(file.read_text())
        return {(Compression(c), r): v for c, r, v in rows}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out = pruned_sparsities(model, grid)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps([[c.value, r, v] for (c, r), v in out.items()]))
    tmp.replace(file)
    return out


#: The version of the removal rules (:func:`remove_zero_channels`) the cache was made with.
_REMOVAL_RULES = "2"


def cached_channel_removed(model: str, ratios) -> dict[float, tuple[list, dict]]:
    """:func:`channel_removed_networks`, remembered under DLAS_HOME per model file (path,
    size, modification time) and ratios."""
    import hashlib
    import json
    from dataclasses import fields

    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks import zoo
    from dlas_predict.paths import cache_dir

    path = zoo.resolve(model)
    st = path.stat()
    ratios = sorted({float(r) for r in ratios})
    key = json.dumps([str(model), str(path.resolve()), st.st_size, st.st_mtime_ns,
                      _SPARSITY_RULES, _REMOVAL_RULES, ratios,
                      [f.name for f in fields(NetworkSummary)]])
    file = cache_dir("removed") / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
    try:
        rows = json.loads(file.read_text())
        return {float(r): ([(ConvSpec.parse(c), float(s)) for c, s in layers], summary)
                for r, layers, summary in rows}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out = channel_removed_networks(model, ratios)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps([[r, [[c.to_spec(), s] for c, s in layers], summary]
                               for r, (layers, summary) in out.items()]))
    tmp.replace(file)
    return out


def _weight_sparsities(weights: list[np.ndarray], ratios: list[float]) -> dict[float, list[float]]:
    """Global L1 unstructured pruning at several ratios at once: one partition finds every
    ratio's threshold; weights tied at a threshold are shared out in proportion (the masks
    of :func:`weight_masks` prune exactly ``floor(ratio·n)`` of them, ties in any order)."""
    for r in ratios:
        check_ratio(r, allow_zero=True)
    mags = [np.abs(w).ravel() for w in weights]
    flat = np.concatenate(mags)
    ks = [int(np.floor(r * flat.size)) for r in ratios]
    kth = sorted({k - 1 for k in ks if k > 0})
    part = np.partition(flat, kth) if kth else flat
    out = {}
    for r, k in zip(ratios, ks):
        if k == 0:
            out[r] = [float((m == 0).mean()) for m in mags]
            continue
        thr = part[k - 1]
        less = [int(np.count_nonzero(m < thr)) for m in mags]
        ties = [int(np.count_nonzero(m == thr)) for m in mags]
        share = (k - sum(less)) / max(sum(ties), 1)
        out[r] = [float((l + t * share) / m.size)
                  for m, l, t in zip(mags, less, ties)]
    return out


def torch_masks(model, compression: Compression | str, ratio: float):
    """Prune a torch model in place; returns a function that re-applies the masks (call after each
    optimiser step while fine-tuning)."""
    import torch

    from dlas_predict.networks.torchmodels import conv_bn_pairs

    compression = Compression.parse(compression)
    pairs = conv_bn_pairs(model)
    eff = []
    for conv, bn in pairs:
        w = conv.weight.detach().numpy()
        if compression is Compression.CHANNEL_PRUNING and bn is not None:
            scale = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().numpy()
            w = w * scale.reshape(-1, 1, 1, 1)
        eff.append(w)
    if compression is Compression.WEIGHT_PRUNING:
        masks = [torch.from_numpy(m.astype(np.float32)) for m in weight_masks(eff, ratio)]

        def apply() -> None:
            with torch.no_grad():
                for (conv, _), m in zip(pairs, masks):
                    conv.weight.mul_(m)
    elif compression is Compression.CHANNEL_PRUNING:
        keeps = [torch.from_numpy(k.astype(np.float32)) for k in
                 channel_masks(eff, ratio, [conv.groups == 1 for conv, _ in pairs])]

        def apply() -> None:
            with torch.no_grad():
                for (conv, _), k in zip(pairs, keeps):
                    conv.weight.mul_(k.view(-1, 1, 1, 1))
    else:
        raise ConfigError(f"fine-tuning applies to pruning, not {compression.value}")
    apply()
    return apply
