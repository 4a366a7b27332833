"""ONNX networks as ordered lists of layers, with shapes, MACs, parameters and bytes moved.

``read_network(path)`` runs ONNX shape inference and returns a :class:`Network`: every compute
op of the graph, in graph order, as a :class:`Layer`. ``conv_layers`` gives the convolutions
as measurable workloads (what ``collect`` needs). An op the tool does not know raises one
:class:`NetworkError` naming it; a malformed or truncated file raises one too.

Conventions: batch 1 (a symbolic batch is read as 1); MACs are the multiply-accumulates of
convolutions, fully connected layers, products of two activations (attention's QKᵀ and
its product with V: kind ``matmul``) and recurrent cells (LSTM, GRU, RNN: every step's
input and recurrent products, each direction) (the study's Tables 2/5 convention);
parameters are the float weights a layer owns (a batch norm owns its scale and shift, not
its running statistics; an embedding its table); bytes moved are the compulsory fp32
traffic: activation inputs, weights and output, each once (an embedding reads the rows it
gathers, not its whole table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlas_predict.space.config import ConvSpec
from dlas_predict.errors import NetworkError, SpecError

#: A recurrent op's gates: each is one input and one recurrent product per step.
RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# ONNX op → layer kind. Ops that compute nothing (Identity, Constant, shape arithmetic) are
# not layers.
OP_KINDS = {
    "Conv": "conv",
    "Gemm": "fc", "MatMul": "fc",
    "MaxPool": "pool", "AveragePool": "pool",
    "GlobalAveragePool": "global_pool", "GlobalMaxPool": "global_pool",
    "ReduceMean": "global_pool",
    "ReduceSum": "reduce", "ReduceMax": "reduce",
    "BatchNormalization": "batchnorm",
    "LayerNormalization": "layernorm",
    **{op: "recurrent" for op in RECURRENT_GATES},
    **{op: "activation" for op in ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish",
                                   "LeakyRelu", "Tanh", "Softmax", "Elu", "Selu", "PRelu",
                                   "Softplus", "Gelu", "Erf")},
    **{op: "elementwise" for op in ("Add", "Mul", "Sub", "Div", "Pow", "Sqrt", "Neg",
                                    "Reciprocal", "Exp", "Where")},
    "Concat": "concat",
    **{op: "reshape" for op in ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose",
                                "Dropout", "Pad", "Split", "Slice", "Expand", "Tile")},
}
SILENT_OPS = {"Identity", "Constant", "Shape", "Gather", "Cast", "ConstantOfShape", "Range",
              "Equal", "Not", "Less", "Greater"}
#: Ops a layer's output passes through to reach what it feeds (:attr:`Layer.feeds`); Shape
#: reads no data and is not fed.
EPILOGUE_OPS = {"BatchNormalization", "Relu", "Clip"}
_PASS_OPS = EPILOGUE_OPS | {"Identity", "Cast"}


@dataclass(frozen=True)
class Layer:
    """One compute op of a network."""

    index: int
    name: str
    op: str
    kind: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    macs: int
    params: int
    bytes_moved: int
    conv: ConvSpec | None = None
    weight: str | None = None  # the initializer holding a conv/fc weight
    #: Op types its output reaches through batch norms, ReLU/Clip and identities (what a
    #: conv's fused epilogue stops at), sorted; "output" where it is a graph output.
    feeds: tuple[str, ...] = ()
    #: A windowed pool's window area (kernel height × width); 0 for every other op.
    window: int = 0
    #: A conv that onnxruntime's QDQ int8 run leaves in float (between a dequantize and a
    #: quantize) instead of fusing it into QLinearConv: see :func:`_qdq_float`.
    qdq_float: bool = False

    def to_dict(self) -> dict:
        d = {"index": self.index, "name": self.name, "op": self.op, "kind": self.kind,
             "input_shapes": [list(s) for s in self.input_shapes],
             "output_shape": list(self.output_shape), "macs": self.macs,
             "params": self.params, "bytes": self.bytes_moved}
        if self.conv is not None:
            d["conv"] = self.conv.to_spec()
        return d


@dataclass(frozen=True)
class ConvLayer:
    """One Conv node of a network: its ONNX name and its workload."""

    index: int
    name: str
    spec: ConvSpec


@dataclass
class Network:
    """A network's layers in graph order, with its input and totals."""

    name: str
    input_shape: tuple[int, ...]
    layers: list[Layer] = field(default_factory=list)
    #: The names of the graph's inputs (an attention mask beside the tokens, say).
    inputs: tuple[str, ...] = ()
    #: The input's batch axis: the first, but the second where the input is an LSTM's,
    #: GRU's or RNN's sequence in ONNX's default layout (steps first) (:func:`batch_axis`).
    batch_axis: int = 0

    def one_input(self, what: str) -> None:
        """Raise a :class:`NetworkError` unless the network has a single input: the grid
        builds, checks and times networks of one (``what``: the network as the user named
        it)."""
        if len(self.inputs) > 1:
            raise NetworkError(f"{what} has {len(self.inputs)} inputs ({', '.join(self.inputs)})"
                               "; the grid builds and times networks of one input: export it "
                               "with the others (an attention mask, say) as constants")

    @property
    def batch(self) -> int:
        return self.input_shape[self.batch_axis] if len(self.input_shape) > self.batch_axis \
            else 1

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def macs(self) -> int:
        return sum(layer.macs for layer in self.layers)

    @property
    def bytes_moved(self) -> int:
        return sum(layer.bytes_moved for layer in self.layers)

    def convs(self) -> list[ConvLayer]:
        convs = [layer for layer in self.layers if layer.conv is not None]
        return [ConvLayer(i, layer.name, layer.conv) for i, layer in enumerate(convs)]

    def totals(self) -> dict:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
        conv_macs = sum(layer.macs for layer in self.layers if layer.conv is not None)
        return {"params": self.params, "macs": self.macs, "conv_macs": conv_macs,
                "bytes": self.bytes_moved, "layers": len(self.layers),
                "conv_layers": sum(1 for layer in self.layers if layer.conv is not None),
                "by_kind": kinds}

    def to_dict(self) -> dict:
        return {"network": self.name, "input_shape": list(self.input_shape),
                "layers": [layer.to_dict() for layer in self.layers], "totals": self.totals()}


def inline_constant_identities(model) -> None:
    """Replace ``Identity(initializer)`` nodes by a copy of the initializer under the output
    name (in place). Exporters write a repeated constant — e.g. two layers pruned to all
    zeros — once and alias it through Identity; every conv then has its own weights again."""
    inits = {i.name: i for i in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in inits:
            copy_ = model.graph.initializer.add()
            copy_.CopyFrom(inits[node.input[0]])
            copy_.name = node.output[0]
            inits[copy_.name] = copy_
        else:
            keep.append(node)
    if len(keep) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(keep)


def read_proto(path: str | Path):
    """The ModelProto of an ONNX file, its external data (if any) loaded from beside it;
    a file with none is not walked for it."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        load_external_data_for_model(model, str(Path(path).parent))
    return model


def load_onnx(path: str | Path, infer: bool = True):
    """Load an ONNX file (with shape inference); every failure is a :class:`NetworkError`."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise NetworkError(f"network file not found: {path}")
    try:
        model = read_proto(path)
    except Exception as exc:  # protobuf raises several types for garbage
        raise NetworkError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                           f"{str(exc)[:200]})") from None
    if not model.graph.node:
        raise NetworkError(f"{path} has an empty graph (malformed or truncated ONNX file)")
    inline_constant_identities(model)
    if infer:
        try:
            infer_shapes(model)
        except Exception as exc:
            raise NetworkError(f"shape inference failed on {path}: {str(exc)[:300]}") from None
    return model


def with_input_shape(path: str | Path, dims: tuple[int, ...]) -> Path:
    """A copy of the ONNX network at ``path`` whose input has the shape ``dims`` (a
    dimension left open given its size, a fixed one kept), its shapes inferred again:
    written once under DLAS_HOME by the file's hash and ``dims``, with the file's name. A
    rank or a fixed size that disagrees is a :class:`NetworkError` naming the input."""
    import hashlib
    import os

    import onnx

    from dlas_predict.paths import cache_dir

    path = Path(path)
    model = load_onnx(path, infer=False)
    digest = hashlib.sha256(path.read_bytes() + repr(tuple(dims)).encode()).hexdigest()[:16]
    target = cache_dir("shaped") / digest / path.name
    if target.is_file():  # written by an earlier call, once its shape was checked
        return target
    consts = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in consts]
    if len(inputs) != 1:
        raise NetworkError(f"a shape is given for one input; {path.name} has {len(inputs)}"
                           + (f" ({', '.join(i.name for i in inputs)})" if inputs else ""))
    name, dim = inputs[0].name, inputs[0].type.tensor_type.shape.dim
    have = "×".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in dim)
    if len(dim) != len(dims) or any(n < 1 for n in dims):
        raise NetworkError(f"input {name!r} of {path.name} is {have}: the shape must give "
                           f"{len(dim)} sizes of at least 1, got "
                           f"{'×'.join(map(str, dims))}")
    for i, (d, n) in enumerate(zip(dim, dims)):
        if d.HasField("dim_value") and d.dim_value != n:
            raise NetworkError(f"input {name!r} of {path.name} is {have}: its dimension {i} "
                               f"is fixed at {d.dim_value}, the shape gives {n}")
        d.Clear()
        d.dim_value = n
    del model.graph.value_info[:]
    for out in model.graph.output:  # sizes left open there follow from the input's now
        if any(not d.HasField("dim_value") for d in out.type.tensor_type.shape.dim):
            out.type.tensor_type.ClearField("shape")
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types
        raise NetworkError(f"shape inference failed on {path.name} with input {name!r} "
                           f"{'×'.join(map(str, dims))}: {str(exc)[:300]}") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, target)
    return target


#: Initializers larger than this (elements) are left out of shape inference: weights, whose
#: shapes are in their dims; shape-like tensors (Reshape targets, Slice bounds) are small.
_INFER_KEEP = 1024


def infer_shapes(model) -> None:
    """ONNX shape inference into ``model.graph.value_info``, without serialising the weights
    (inference copies the model through protobuf: for ResNet-50 that is most of the time)."""
    import onnx

    held = []
    for init in model.graph.initializer:
        if init.HasField("raw_data") and int(math.prod(init.dims)) > _INFER_KEEP:
            held.append((init, init.raw_data))
            init.ClearField("raw_data")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    finally:
        for init, raw in held:
            init.raw_data = raw
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


#: Ops of shape arithmetic that :func:`fold_shape_arithmetic` evaluates once their inputs
#: are known.
_SHAPE_OPS = frozenset({"Shape", "Slice", "Concat", "Gather", "Unsqueeze", "Squeeze", "Cast",
                        "Add", "Sub", "Mul", "Div", "Equal", "Where", "ConstantOfShape",
                        "Expand", "Reshape", "Range", "Identity"})
#: A folded tensor holds at most this many elements (shapes, a class token), never weights.
_FOLD_LIMIT = 4096


def fold_shape_arithmetic(model) -> int:
    """Replace, in place, the shape arithmetic of a network whose shapes are all static (what
    an exporter writes for ``x.flatten(2)`` or ``t.expand(x.shape[0], -1, -1)``: ``Shape``,
    then ``Gather``, ``Concat``, ``Where`` … into a ``Reshape`` or ``Expand``) by the
    constants it computes, so that shape inference knows every tensor after it. ``model``
    must carry its inferred shapes; returns how many nodes were folded (shapes are then to
    be inferred again)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    shapes = value_shapes(model)
    known = constant_values(model, lambda dims: math.prod(dims) <= _FOLD_LIMIT)
    nodes, folded = [], 0
    for node in model.graph.node:
        if node.op_type == "Constant":
            nodes.append(node)
            continue
        value = None
        if node.op_type == "Shape" and shapes.get(node.input[0]) is not None:
            attrs = node_attributes(node)
            dims = list(shapes[node.input[0]])
            value = np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))],
                             np.int64)
        elif (node.op_type in _SHAPE_OPS and len(node.output) == 1
              and all(i in known for i in node.input if i)):
            try:
                value = np.asarray(ReferenceEvaluator(node).run(
                    None, {i: known[i] for i in node.input if i})[0])
            except Exception:  # noqa: BLE001 - an op the evaluator refuses stays as it is
                value = None
            if value is not None and value.size > _FOLD_LIMIT:
                value = None
        if value is None:
            nodes.append(node)
            continue
        known[node.output[0]] = value
        nodes.append(helper.make_node("Constant", [], [node.output[0]], name=node.name,
                                      value=numpy_helper.from_array(value)))
        folded += 1
    if folded:
        outputs = {o.name for o in model.graph.output}
        while True:  # the constants nothing reads any more (the folded arithmetic's inputs)
            read = {i for node in nodes for i in node.input} | outputs
            kept = [n for n in nodes if n.op_type != "Constant" or n.output[0] in read]
            if len(kept) == len(nodes):
                break
            nodes = kept
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return folded


def _declared_dims(vi) -> list[int | None] | None:
    """A value's declared sizes (None for one left open), or None where it has no shape."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]


def value_shapes(model) -> dict[str, tuple[int, ...] | None]:
    out: dict[str, tuple[int, ...] | None] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = _declared_dims(vi)
        if dims is not None:
            if dims and dims[0] is None:
                dims[0] = 1  # a symbolic batch is read as batch 1
            out[vi.name] = None if any(d is None for d in dims) else tuple(dims)
    for init in model.graph.initializer:
        out[init.name] = tuple(init.dims)
    return out


#: ONNX element types of integer tensors (token ids).
_INTEGER_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}


def token_bound(model) -> int:
    """For a network whose input is integer (token ids): one more than the largest id its
    embedding tables take (the fewest rows of a table a Gather reads the input from, through
    Casts); 0 for a float input."""
    inits = {t.name: t for t in model.graph.initializer}
    first = next((i for i in model.graph.input if i.name not in inits), None)
    if first is None or first.type.tensor_type.elem_type not in _INTEGER_TYPES:
        return 0
    ids, rows = {first.name}, []
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] in ids:
            ids.add(node.output[0])
        elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in ids \
                and node.input[0] in inits:
            rows.append(int(inits[node.input[0]].dims[0]))
    return min(rows) if rows else 2


def _constants(model) -> dict[str, int]:
    """Initializers and Constant outputs: name → element count (float tensors only)."""
    import onnx

    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
              onnx.TensorProto.BFLOAT16}
    out = {}
    for init in model.graph.initializer:
        out[init.name] = int(math.prod(init.dims)) if init.data_type in floats else 0
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = (int(math.prod(a.t.dims))
                                           if a.t.data_type in floats else 0)
            out.setdefault(node.output[0], 0)
    return out


def node_attributes(node) -> dict:
    """An ONNX node's attributes by name, as values."""
    import onnx.helper

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def constant_values(model, keep) -> dict[str, np.ndarray]:
    """The values of ``model``'s initializers and Constant nodes (a tensor ``value``) whose
    dims ``keep(dims)`` accepts, by name; the others are not decoded."""
    from onnx import helper, numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if keep(t.dims)}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            value = helper.get_attribute_value(node.attribute[0])
            if getattr(value, "dims", None) is not None and keep(value.dims):
                out[node.output[0]] = numpy_helper.to_array(value)
    return out


def conv_spec_of(node, name: str, x: tuple | None, w: tuple | None) -> ConvSpec:
    if not x or not w or len(x) != 4 or len(w) != 4:
        raise NetworkError(f"Conv {name!r}: only 2-D convolutions with known input and "
                           f"weight shapes are supported (got {x}, {w}); export the network "
                           "with a fixed input size")
    attrs = node_attributes(node)
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NetworkError(f"Conv {name!r}: auto_pad={attrs['auto_pad']!r} is not "
                           "supported; export with explicit pads")
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    try:
        spec = ConvSpec(C=x[1], H=x[2], W=x[3], K=w[0], R=w[2], S=w[3],
                        stride_h=strides[0], stride_w=strides[1], pad_t=pads[0],
                        pad_l=pads[1], pad_b=pads[2], pad_r=pads[3],
                        groups=int(attrs.get("group", 1)), dilation_h=dil[0],
                        dilation_w=dil[1])
    except SpecError as exc:
        raise NetworkError(f"Conv {name!r}: {exc}") from None
    if spec.C // spec.groups != w[1]:
        raise NetworkError(f"Conv {name!r}: weight shape {w} does not match {spec.C} input "
                           f"channels in {spec.groups} groups")
    return spec


def _fc_macs(node, name: str, ins: list, out: tuple | None) -> int:
    if node.op_type == "Gemm":
        a, b = ins[0], ins[1]
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            raise NetworkError(f"Gemm {name!r}: unknown operand shapes {a}, {b}; export the "
                               "network with a fixed input size")
        attrs = node_attributes(node)
        m, k = (a[1], a[0]) if attrs.get("transA", 0) else a
        n = b[0] if attrs.get("transB", 0) else b[1]
        return int(m * n * k)
    if ins[0] is None or out is None:
        raise NetworkError(f"MatMul {name!r}: unknown operand shapes (a dimension left "
                           "open); give the input's shape (`--shape`, e.g. 1x128x256) or "
                           "export the network with a fixed input size and sequence length")
    return int(math.prod(out)) * int(ins[0][-1])


#: The metadata key of a rewritten network (its recurrent layers unrolled) that keeps its
#: original input's batch axis (:func:`batch_axis`).
BATCH_AXIS_KEY = "dlas.batch_axis"


#: Ops whose output keeps the leading axes of the input they are given (an embedding's
#: Gather of token ids: the ids' axes, then the table's row).
_AXES_KEPT = frozenset({"Cast", "Identity", "Dropout", "Relu", "Tanh", "Sigmoid", "Add",
                        "Sub", "Mul", "Div", "Gather"})


def batch_axis(model, name: str) -> int:
    """The batch axis of the graph input ``name``: the second where an LSTM, GRU or RNN node
    in ONNX's default layout reads it as its sequence (steps first), directly or through
    ops that keep its leading axes (token ids through an embedding), or where the model
    says so (:data:`BATCH_AXIS_KEY`); else the first."""
    meta = {p.key: p.value for p in model.metadata_props}
    if BATCH_AXIS_KEY in meta:
        return int(meta[BATCH_AXIS_KEY])
    same = {name}
    for node in model.graph.node:
        read = node.input[1:2] if node.op_type == "Gather" else node.input
        if node.op_type in _AXES_KEPT and any(i in same for i in read):
            same.update(node.output)
        elif node.op_type in RECURRENT_GATES and node.input and node.input[0] in same \
                and not node_attributes(node).get("layout", 0):
            return 1
    return 0


def open_first_dims(model) -> set[str]:
    """The tensors whose first dimension is symbolic, which :func:`value_shapes` reads as a
    batch of 1."""
    return {vi.name for vi in [*model.graph.input, *model.graph.value_info,
                               *model.graph.output]
            if (dims := _declared_dims(vi)) and dims[0] is None}


def _recurrent_macs(node, name: str, shapes: dict, open_first: set[str] = frozenset()) -> int:
    """An LSTM, GRU or RNN's multiply-adds: every step, each direction, each gate's input
    product (input size × hidden) and recurrent product (hidden × hidden). ``open_first``:
    the tensors whose first dimension is symbolic (:func:`open_first_dims`): an input whose
    sequence axis (the first, in the default layout) is one has no length to price."""
    x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
    if x is None or w is None or len(x) != 3 or len(w) != 3:
        raise NetworkError(f"{node.op_type} {name!r}: unknown input or weight shapes "
                           f"({x}, {w}); give the input's shape (`--shape`) or export "
                           "with a fixed sequence length")
    attrs = node_attributes(node)
    if not attrs.get("layout", 0) and node.input[0] in open_first:
        raise NetworkError(f"{node.op_type} {name!r}: the sequence length of its input "
                           f"{node.input[0]!r} is left open (a symbolic first dimension); "
                           "give the input's shape (`--shape`, steps first) or export the "
                           "network with a fixed sequence length")
    seq, batch = (x[1], x[0]) if attrs.get("layout", 0) else (x[0], x[1])
    dirs, gates_hidden, inputs = w
    hidden = gates_hidden // RECURRENT_GATES[node.op_type]
    return int(seq * batch * dirs * gates_hidden * (inputs + hidden))


def _is_table(node, consts: dict[str, int], shapes: dict) -> bool:
    """A Gather that reads rows of a float table (an embedding), not shape arithmetic."""
    table = shapes.get(node.input[0])
    return consts.get(node.input[0], 0) > 0 and table is not None and len(table) == 2


def read_network(path: str | Path, name: str | None = None) -> Network:
    """Every compute op of the ONNX network at ``path``, in graph order.

    The result is kept under DLAS_HOME by the file's path, size and modification time
    (and the source of this module and of the records it builds): reading a network again
    skips ONNX's parse and shape inference (half a second for ResNet-50)."""
    name = name or Path(path).stem
    key = _network_key(path, name)
    if key is not None:
        net = _cached_network(key)
        if net is not None:
            return net
    net = _network(load_onnx(path), name, str(path))
    if key is not None:
        _keep_network(key, net)
    return net


def _network_key(path: str | Path, name: str) -> str | None:
    import hashlib
    import stat

    import dlas_predict.space.config as records

    try:
        st = Path(path).stat()
        # the code that reads a network and the records it is made of
        code = [(p.st_size, p.st_mtime_ns) for p in (Path(__file__).stat(),
                                                     Path(records.__file__).stat())]
    except OSError:
        return None  # load_onnx says what is wrong with the file
    if not stat.S_ISREG(st.st_mode):
        return None
    raw = repr((str(Path(path).resolve()), st.st_size, st.st_mtime_ns, name, code))
    return hashlib.sha1(raw.encode()).hexdigest()[:24]


def _cached_network(key: str) -> Network | None:
    import pickle

    from dlas_predict.paths import cache_dir

    try:
        with open(cache_dir("networks") / f"{key}.pkl", "rb") as f:
            net = pickle.load(f)
    except Exception:  # none yet, or damaged: read the file again
        return None
    return net if isinstance(net, Network) else None


def _keep_network(key: str, net: Network) -> None:
    import os
    import pickle

    from dlas_predict.paths import cache_dir

    try:
        path = cache_dir("networks") / f"{key}.pkl"
        tmp = path.with_name(f"{key}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(net, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written is only slower


def network_of_proto(model, name: str) -> Network:
    """:func:`read_network` of a ModelProto in memory (not modified)."""
    import copy

    model = copy.deepcopy(model)
    inline_constant_identities(model)
    try:
        infer_shapes(model)
    except Exception as exc:
        raise NetworkError(f"shape inference failed on {name}: {str(exc)[:300]}") from None
    return _network(model, name, name)


def _network(model, name: str, path: str) -> Network:
    shapes = value_shapes(model)
    open_first = open_first_dims(model)
    consts = _constants(model)
    unknown = sorted({n.op_type for n in model.graph.node
                      if n.op_type not in OP_KINDS and n.op_type not in SILENT_OPS})
    if unknown:
        node = next(n for n in model.graph.node if n.op_type == unknown[0])
        raise NetworkError(
            f"unsupported op {unknown[0]!r} (node {node.name or node.output[0]!r})"
            + (f" and {len(unknown) - 1} more: {', '.join(unknown[1:])}" if len(unknown) > 1
               else "") + f" in {Path(path).name}; supported ops: {', '.join(sorted(OP_KINDS))}")
    graph_inputs = [i for i in model.graph.input if i.name not in consts]
    if not graph_inputs:
        raise NetworkError(f"{path} has no graph input")
    net = Network(name, shapes.get(graph_inputs[0].name) or (),
                  inputs=tuple(i.name for i in graph_inputs),
                  batch_axis=batch_axis(model, graph_inputs[0].name))
    consumers = _consumers(model)
    feeds = _feeds(model, consumers)
    qdq_float = _qdq_float(consumers)
    for node in model.graph.node:
        embedding = node.op_type == "Gather" and _is_table(node, consts, shapes)
        if node.op_type in SILENT_OPS and not embedding:
            continue
        name_ = node.name or node.output[0]
        kind = "embedding" if embedding else OP_KINDS[node.op_type]
        act_in = [i for i in node.input if i and i not in consts]
        ins = [shapes.get(i) for i in node.input if i]
        out = shapes.get(node.output[0])
        if kind in ("concat", "elementwise", "reshape") and out is not None and len(out) <= 1 \
                and all(i in consts or shapes.get(i) is not None and len(shapes[i]) <= 1
                        for i in node.input if i):
            continue  # shape arithmetic on constant vectors, not a layer
        owned = [i for i in node.input if i and i in consts]
        if node.op_type == "BatchNormalization":
            owned = owned[:2]  # scale and shift; the running statistics are not parameters
        params = sum(consts[i] for i in owned)
        macs, spec, weight = 0, None, None
        if kind == "conv":
            spec = conv_spec_of(node, name_, shapes.get(node.input[0]), shapes.get(node.input[1]))
            kind = "depthwise_conv" if spec.depthwise else ("group_conv" if spec.groups > 1
                                                           else "conv")
            macs = spec.macs * shapes[node.input[0]][0]  # × batch
            weight = node.input[1] if node.input[1] in consts else None
        elif kind == "fc":
            macs = _fc_macs(node, name_, ins, out)
            weight = node.input[1] if node.input[1] in consts else None
            if weight is None and node.op_type == "MatMul":
                kind = "matmul"  # two activations: attention's QKᵀ and its product with V
        elif kind == "recurrent":
            macs = _recurrent_macs(node, name_, shapes, open_first)
            weight = node.input[1] if node.input[1] in consts else None
        window = 0
        if kind == "pool":
            window = int(math.prod(node_attributes(node).get("kernel_shape") or [1]))
        act_elems = sum(int(math.prod(shapes[i])) for i in act_in if shapes.get(i) is not None)
        out_elems = int(math.prod(out)) if out is not None else 0
        all_weights = sum(consts[i] for i in node.input if i and i in consts)
        if embedding:  # the rows gathered are read, not the whole table; indices are ints
            act_elems, all_weights = 0, out_elems
        net.layers.append(Layer(
            index=len(net.layers), name=name_, op=node.op_type, kind=kind,
            input_shapes=tuple(tuple(shapes[i]) for i in act_in if shapes.get(i) is not None),
            output_shape=tuple(out) if out is not None else (), macs=int(macs),
            params=int(params), bytes_moved=4 * (act_elems + out_elems + all_weights),
            conv=spec, weight=weight, feeds=feeds(node.output[0]), window=window,
            qdq_float=spec is not None and qdq_float(node)))
    return net


def _consumers(model) -> dict[str, list]:
    """tensor → the nodes that read it."""
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for i in node.input:
            if i:
                consumers.setdefault(i, []).append(node)
    return consumers


def _qdq_float(consumers: dict[str, list]):
    """conv node → whether onnxruntime's QDQ int8 run leaves it in float (``consumers``: of
    :func:`_consumers`). Measured on the optimized graphs of every network in the shipped
    corpus (onnxruntime 1.31, CPU provider): a conv becomes QLinearConv unless its input
    feeds another op too, or its output, after batch norms and ReLU/Clip, feeds more than
    one op and has passed an activation or feeds a sigmoid (SiLU's gate) or another conv."""

    def fed(tensor: str) -> list:
        return [c for c in consumers.get(tensor, ()) if c.op_type != "Shape"]

    def is_float(node) -> bool:
        if len(fed(node.input[0])) > 1:
            return True
        tensor, activated = node.output[0], False
        while True:
            after = fed(tensor)
            if len(after) == 1 and after[0].op_type in _PASS_OPS:
                activated |= after[0].op_type in ("Relu", "Clip")
                tensor = after[0].output[0]
                continue
            return len(after) > 1 and (activated or any(c.op_type in ("Sigmoid", "Conv")
                                                        for c in after))

    return is_float


def _feeds(model, consumers: dict[str, list]):
    """tensor → the op types it reaches through :data:`EPILOGUE_OPS` and identities
    (``consumers``: of :func:`_consumers`)."""
    outputs = {o.name for o in model.graph.output}

    def reach(tensor: str) -> tuple[str, ...]:
        found: set[str] = set()
        todo, seen = [tensor], set()
        while todo:
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            if t in outputs:
                found.add("output")
            for c in consumers.get(t, ()):
                if c.op_type in _PASS_OPS:
                    todo.extend(o for o in c.output if o)
                elif c.op_type != "Shape":
                    found.add(c.op_type)
        return tuple(sorted(found))

    return reach


def conv_layers(path: str | Path) -> list[ConvLayer]:
    """Every Conv node of the network at ``path``, in graph order, with its workload."""
    return read_network(path).convs()


def unique_specs(layers: list[ConvLayer]) -> list[ConvSpec]:
    """Distinct workloads, in order of first appearance."""
    seen: dict[ConvSpec, None] = {}
    for layer in layers:
        seen.setdefault(layer.spec, None)
    return list(seen)
