"""Matrix layers in the grid: a fully connected layer as the 1×1 convolution it is.

A fully connected layer ``Y = X·W + b`` over R rows (a sequence's tokens, a batch) is a 1×1
convolution of ``K`` input channels into ``N`` filters over a 1 × R image, whose input is
``Xᵀ`` and whose output is ``Yᵀ``. :func:`as_convs` rewrites a network's matrix layers
(``MatMul`` or ``Gemm`` with a constant weight, and a constant bias ``Add`` that only it
feeds) into that form::

    X [..., R, K] -Reshape-> [1, 1, R, K] -Transpose-> [1, K, 1, R] -Conv 1×1 (W, b)->
    [1, N, 1, R] -Transpose-> [1, 1, R, N] -Reshape-> Y [..., R, N]

(one row: Reshapes only). The network computes the same function; the grid then prices,
prunes, quantises and builds its matrix layers with the conv kernels (direct, GEMM, spatial
pack; dense and CSR; float32, float16, int8), and the two transposes per layer are ops of
the network, measured with it. Products of two activations (attention's QKᵀ and its product
with V) stay matrix products, outside the grid.

A *matrix network* is one whose matrix layers hold more of its multiply-accumulates than its
convolutions (an MLP, a transformer; not a CNN's classifier): :func:`grid_form` gives such a
network's rewritten file (kept under DLAS_HOME by the original's hash), and any other
network's own path.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Bumped when the rewrite changes, so a kept grid form is rewritten again.
REWRITE_VERSION = "5"
#: The end of a rewritten layer's Conv node name: the grid's records name its layers so, and
#: onnxruntime's model tells them from convolutions by it (:func:`is_matrix_layer`).
MATRIX_CONV = "/matrix_conv"
_MATRIX_CONV_END = re.compile(re.escape(MATRIX_CONV) + r"(_\d+)?$")
#: The grid form's metadata key listing each conv weight and the matrix weight it came from.
ORIGINS_KEY = "dlas.matrix_weights"


def matrix_nodes(model, shapes: dict) -> list:
    """The ``MatMul``/``Gemm`` nodes of ``model`` that :func:`as_convs` rewrites: a constant
    2-D float32 weight, an activation of known shape of rank ≥ 2 whose last axis is the
    weight's input size (``Gemm``: no transposed input, a bias of one value per output or
    none)."""
    from dlas_predict.networks.graph import node_attributes

    inits = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        w, x = inits.get(node.input[1]), shapes.get(node.input[0])
        if w is None or len(w.dims) != 2 or x is None or len(x) < 2 or node.input[0] in inits:
            continue
        if w.data_type != 1:  # float32 (the network's float16 or int8 forms are the grid's)
            continue
        attrs = node_attributes(node)
        k = w.dims[1] if attrs.get("transB", 0) else w.dims[0]
        if x[-1] != k:
            continue
        if node.op_type == "Gemm":
            n = w.dims[0] if attrs.get("transB", 0) else w.dims[1]
            bias = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if attrs.get("transA", 0) or len(x) != 2 or (
                    len(node.input) > 2 and node.input[2]
                    and (bias is None or int(math.prod(bias.dims)) != n)):
                continue
        found.append(node)
    return found


def matrix_macs(net) -> tuple[int, int]:
    """(MACs of ``net``'s fully connected layers with constant weights and of its recurrent
    layers' products, MACs of its convolutions)."""
    fc = sum(layer.macs for layer in net.layers
             if (layer.kind == "fc" and layer.weight) or layer.kind == "recurrent")
    conv = sum(layer.macs for layer in net.layers if layer.conv is not None)
    return fc, conv


def is_matrix_layer(name: str) -> bool:
    """Whether a conv layer of this name is a rewritten matrix layer."""
    return _MATRIX_CONV_END.search(name) is not None


def is_matrix_network(net) -> bool:
    """Whether ``net``'s matrix layers hold more of its MACs than its convolutions."""
    fc, conv = matrix_macs(net)
    return fc > conv


def _bias_add(model, node, inits: dict, n: int, readers: dict[str, list]):
    """The ``Add`` of a constant with one value per output that alone reads ``node``'s
    output (``readers``: tensor → the nodes reading it), or None."""
    from onnx import numpy_helper

    out = node.output[0]
    if out in {o.name for o in model.graph.output}:
        return None, None
    if len(readers.get(out, ())) != 1 or readers[out][0].op_type != "Add":
        return None, None
    add = readers[out][0]
    other = add.input[1] if add.input[0] == out else add.input[0]
    if other not in inits:
        return None, None
    b = numpy_helper.to_array(inits[other])
    if b.size != n or (b.ndim and b.shape[-1] != n):
        return None, None
    return add, b.reshape(n)


def _joined_add(out: str, reading: dict[str, list], inits: dict, shapes: dict):
    """The ``Add`` that alone reads ``out`` and adds a computed tensor of the same shape, and
    that tensor; else None."""
    readers = reading.get(out, ())
    if len(readers) != 1 or readers[0].op_type != "Add" or len(readers[0].input) != 2:
        return None
    add = readers[0]
    other = add.input[1] if add.input[0] == out else add.input[0]
    if other == out or other in inits:
        return None
    shape = shapes.get(other)
    if shape is None or shape != shapes.get(add.output[0]):
        return None
    return add, other


#: Ops that compute each element from the same element of their inputs: with scalar
#: operands they run as well on a layer's output in its image layout as in its rows.
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Relu",
               "Exp", "Neg", "Reciprocal", "Abs", "Clip", "HardSigmoid", "HardSwish",
               "LeakyRelu", "Gelu", "Softplus", "Elu", "Selu"}


@dataclass(frozen=True)
class _Layout:
    """The tensors of one rewritten layer of several rows: its input (rows), the input as
    rows of one image (Reshape) and transposed into the image (Transpose), the conv's output,
    and that output transposed back (Transpose) and reshaped into rows (its output)."""

    src: str
    rows: str
    image: str
    conv: str
    transposed: str
    out: str
    n_rows: int


def _scalars(model) -> set[str]:
    """Initializers and Constant outputs of one element."""
    from dlas_predict.networks.graph import constant_values

    return set(constant_values(model, lambda dims: math.prod(dims) == 1))


def _keep_image_layout(model, layouts: list[_Layout]) -> int:
    """Where a rewritten layer's output reaches the next rewritten layer of as many rows
    only through elementwise ops with scalar operands (an FFN's activation, or nothing),
    run those ops on the image itself: the transposes out of one layer and into the next
    cancel, and go. Returns how many pairs were joined."""
    nodes = list(model.graph.node)
    producer = {o: node for node in nodes for o in node.output}
    readers: dict[str, list[str]] = {}
    for node in nodes:
        for i in node.input:
            readers.setdefault(i, []).append(node.output[0])
    outputs = {o.name for o in model.graph.output}
    scalars = _scalars(model)
    by_out = {lay.out: lay for lay in layouts}
    rename: dict[tuple[str, str], str] = {}  # (node, input) -> the tensor it reads instead
    gone: set[str] = set()
    joined = 0
    for lay in layouts:
        if len(readers.get(lay.image, ())) != 1:  # an image several layers read stays
            continue
        stack, inside, source, ok = [lay.src], set(), None, True
        while stack and ok:
            t = stack.pop()
            if t in by_out:
                ok = source in (None, t)
                source = t
                continue
            if t in scalars:
                continue
            node = producer.get(t)
            if node is None or node.op_type not in ELEMENTWISE:
                ok = False
                continue
            if node.output[0] not in inside:
                inside.add(node.output[0])
                stack.extend(i for i in node.input if i)
        if not ok or source is None:
            continue
        first = by_out[source]
        if first.transposed in gone or first.n_rows != lay.n_rows:
            continue
        allowed = inside | {lay.rows}
        if any(t in outputs or any(r not in allowed for r in readers.get(t, ()))
               for t in inside | {source}):
            continue
        for r in inside:
            node = producer[r]
            for i in node.input:
                if i == source:
                    rename[(r, i)] = first.conv
        rename[(lay.conv, lay.image)] = lay.src
        gone |= {first.transposed, first.out, lay.rows, lay.image}
        joined += 1
    if not joined:
        return 0
    kept = []
    for node in nodes:
        if node.output[0] in gone:
            continue
        for k, i in enumerate(node.input):
            if (node.output[0], i) in rename:
                node.input[k] = rename[(node.output[0], i)]
        kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return joined


def as_convs(model) -> int:
    """Rewrite ``model``'s matrix layers (:func:`matrix_nodes`) into 1×1 convolutions between
    transposes, in place; returns how many were rewritten. ``model`` must carry its inferred
    shapes (``graph.infer_shapes``)."""
    from onnx import helper, numpy_helper

    from dlas_predict.networks.graph import node_attributes, value_shapes

    shapes = value_shapes(model)
    inits = {t.name: t for t in model.graph.initializer}
    # protobuf hands out a new wrapper per access: nodes are known by their position
    nodes_ = list(model.graph.node)
    matrix = {node.output[0] for node in matrix_nodes(model, shapes)}
    targets = {i for i, node in enumerate(nodes_) if node.output[0] in matrix}
    if not targets:
        return 0
    used = {n.name for n in model.graph.node} | set(inits) | {
        o for n in model.graph.node for o in n.output}
    dropped: set[int] = set()
    replacement: dict[int, list] = {}
    new_inits = []

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        return name

    def const(base: str, values: np.ndarray) -> str:
        name = fresh(base)
        new_inits.append(numpy_helper.from_array(values, name))
        return name

    out_index = {o: i for i, node in enumerate(nodes_) for o in node.output}
    reading: dict[str, list] = {}
    for node in nodes_:
        for i in node.input:
            reading.setdefault(i, []).append(node)
    shared_weights: dict = {}
    layouts = []
    images: dict[str, str] = {}  # rows -> their image, shared by the layers that read them
    images_rows: dict[str, str] = {}  # image -> the reshape of rows it transposes
    origins = []  # each rewritten layer's weights and where they came from
    for index in sorted(targets):
        node = nodes_[index]
        attrs = node_attributes(node)
        w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        if not attrs.get("transB", 0):
            w = w.T  # [N, K]
        w = w * np.float32(attrs.get("alpha", 1.0))
        n, k = w.shape
        x = shapes[node.input[0]]
        rows = int(math.prod(x[:-1]))
        bias, out, bias_source = None, node.output[0], None
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            bias = (numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(n)
                    * np.float32(attrs.get("beta", 1.0)))
            bias_source = (node.input[2], float(attrs.get("beta", 1.0)))
        else:
            add, b = _bias_add(model, node, inits, n, reading) \
                if node.op_type == "MatMul" else (None, None)
            if add is not None:
                bias, out = b.astype(np.float32), add.output[0]
                bias_source = (add.input[1] if add.input[0] == node.output[0]
                               else add.input[0], 1.0)
                dropped.add(out_index[add.output[0]])
        base = node.name or node.output[0]
        # a weight several layers read (tied weights) stays one weight
        key = (node.input[1], bool(attrs.get("transB", 0)), float(attrs.get("alpha", 1.0)))
        weight = shared_weights.get(key)
        if weight is None:
            weight = const(f"{base}/conv_weight", np.ascontiguousarray(w.reshape(n, k, 1, 1)))
            shared_weights[key] = weight
            origins.append({"conv_weight": weight, "weight": node.input[1],
                            "transposed": key[1], "alpha": key[2]})
        conv_in = [weight]
        if bias is not None:  # (a bias has its source: the Gemm's input or the Add's)
            if (bias_source, key) not in shared_weights:
                shared_weights[(bias_source, key)] = const(f"{base}/conv_bias", bias)
            conv_in.append(shared_weights[(bias_source, key)])
        nodes = []
        shared = images.get(node.input[0])  # another layer reads the same rows: one image
        if shared is not None:
            x4 = shared
        elif rows == 1:
            x4 = fresh(f"{base}/as_image")
            nodes.append(helper.make_node("Reshape", [node.input[0], const(
                f"{base}/image_shape", np.array([1, -1, 1, 1], np.int64))], [x4], name=x4))
        else:
            rk, x4 = fresh(f"{base}/rows"), fresh(f"{base}/as_image")
            nodes.append(helper.make_node("Reshape", [node.input[0], const(
                f"{base}/rows_shape", np.array([1, 1, rows, -1], np.int64))], [rk], name=rk))
            nodes.append(helper.make_node("Transpose", [rk], [x4], name=x4, perm=[0, 3, 1, 2]))
            images_rows[x4] = rk
        images.setdefault(node.input[0], x4)
        y4 = fresh(f"{base}{MATRIX_CONV}")
        nodes.append(helper.make_node("Conv", [x4, *conv_in], [y4], name=y4,
                                      kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0]))
        # -1: a channel-pruned network may have fewer outputs
        out_shape = np.array([*x[:-1], -1], np.int64)
        joined = _joined_add(out, reading, inits, shapes) if rows == 1 else None
        if joined is not None:
            # one row plus another tensor of its shape (a residual at batch 1): the add on
            # the image, where the conv's epilogue takes it
            add, other = joined
            o4, s4 = fresh(f"{base}/other_image"), fresh(f"{base}/joined")
            nodes.append(helper.make_node("Reshape", [other, const(
                f"{base}/image_shape", np.array([1, -1, 1, 1], np.int64))], [o4], name=o4))
            nodes.append(helper.make_node("Add", [y4, o4], [s4], name=s4))
            nodes.append(helper.make_node("Reshape", [s4, const(f"{base}/out_shape",
                                                                out_shape)],
                                          [add.output[0]], name=fresh(f"{base}/as_rows")))
            dropped.add(out_index[add.output[0]])
        elif rows == 1:
            nodes.append(helper.make_node("Reshape", [y4, const(f"{base}/out_shape", out_shape)],
                                          [out], name=fresh(f"{base}/as_rows")))
        else:
            yt = fresh(f"{base}/rows_out")
            nodes.append(helper.make_node("Transpose", [y4], [yt], name=yt, perm=[0, 2, 3, 1]))
            nodes.append(helper.make_node("Reshape", [yt, const(f"{base}/out_shape", out_shape)],
                                          [out], name=fresh(f"{base}/as_rows")))
            layouts.append(_Layout(node.input[0], images_rows[x4], x4, y4, yt, out, rows))
        replacement[index] = nodes
    kept = []
    for i, node in enumerate(nodes_):
        if i not in dropped:
            kept.extend(replacement.get(i, [node]))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(new_inits)
    _keep_image_layout(model, layouts)
    entry = model.metadata_props.add()
    entry.key, entry.value = ORIGINS_KEY, json.dumps(origins)
    readers = {i for node in model.graph.node for i in node.input}
    outputs = {o.name for o in model.graph.output}
    unread = [t for t in model.graph.initializer if t.name not in readers | outputs]
    for t in unread:  # the matrix layers' weights and biases, now in their conv form
        model.graph.initializer.remove(t)
    del model.graph.value_info[:]  # the rewritten tensors' shapes are inferred again
    return len(replacement)


def grid_proto(model, name: str):
    """``model`` (a ModelProto, not modified) as the grid reads it: a matrix network's copy
    with its matrix layers as 1×1 convolutions, any other network itself."""
    import copy

    from dlas_predict.networks.graph import infer_shapes, network_of_proto

    if not is_matrix_network(network_of_proto(model, name)):
        return model
    model = copy.deepcopy(model)
    infer_shapes(model)
    _rewrite(model)
    return model


def _rewrite(model) -> None:
    """:func:`as_convs` on ``model`` (its shapes inferred), its shape arithmetic folded
    (:func:`~dlas_predict.networks.graph.fold_shape_arithmetic`) and its recurrent layers
    unrolled (:func:`dlas_predict.networks.recurrent.unroll`) first, and its shapes inferred
    again."""
    from dlas_predict.networks.graph import fold_shape_arithmetic, infer_shapes
    from dlas_predict.networks.recurrent import unroll

    if fold_shape_arithmetic(model):  # an exporter's shape arithmetic, as constants
        infer_shapes(model)
    if unroll(model, MATRIX_CONV):
        infer_shapes(model)
    as_convs(model)
    infer_shapes(model)


def grid_form(path: str | Path) -> Path:
    """The file the grid reads for the network at ``path``: for a matrix network
    (:func:`is_matrix_network`), its matrix layers as 1×1 convolutions (:func:`as_convs`),
    written once under DLAS_HOME by the original's hash with the original's file name;
    for any other network, ``path`` itself."""
    import onnx

    from dlas_predict.errors import NetworkError
    from dlas_predict.networks.graph import BATCH_AXIS_KEY, load_onnx, read_network
    from dlas_predict.paths import cache_dir

    path = Path(path)
    try:
        if not is_matrix_network(read_network(path)):
            return path
    except NetworkError:  # what cannot be read is said by whoever reads it next
        return path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    target = cache_dir("grid_form") / f"{digest}-v{REWRITE_VERSION}" / path.name
    if target.is_file():
        return target
    model = load_onnx(path)
    axis = read_network(path).batch_axis
    _rewrite(model)
    if axis:  # the unrolled steps no longer say which axis of the input is the batch
        entry = model.metadata_props.add()
        entry.key, entry.value = BATCH_AXIS_KEY, str(axis)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, target)
    return target


def weights_back(original, grid) -> int:
    """Put the weights of ``grid`` (the grid form of ``original``, compressed: pruned, or
    given timing values) back into ``original``, in place, in its own layout: each matrix
    layer's weight from its conv weight (transposed back, the ``Gemm``'s alpha divided
    out), and every other initializer that both hold with the same shape. The original
    then computes what the compressed grid form computes, in the form its author wrote,
    which is what onnxruntime is given. Returns how many weights were put back; raises
    ValueError where a weight's shape changed (channels removed)."""
    from onnx import numpy_helper

    from dlas_predict.networks import recurrent

    meta = {p.key: p.value for p in grid.metadata_props}
    if ORIGINS_KEY not in meta and recurrent.ORIGINS_KEY not in meta:
        raise ValueError("the model is no grid form of a matrix network")
    arrays = {t.name: t for t in grid.graph.initializer}
    mine = {t.name: i for i, t in enumerate(original.graph.initializer)}
    new: dict[str, np.ndarray] = {}
    for origin in json.loads(meta.get(ORIGINS_KEY, "[]")):
        w = numpy_helper.to_array(arrays[origin["conv_weight"]])
        w = (w.reshape(w.shape[0], -1) / np.float32(origin["alpha"])).astype(np.float32)
        new[origin["weight"]] = w if origin["transposed"] else np.ascontiguousarray(w.T)
    if recurrent.ORIGINS_KEY in meta:  # unrolled products back into their LSTM/GRU/RNN
        origins = json.loads(meta[recurrent.ORIGINS_KEY])
        new.update(recurrent.put_back(original, {
            o["conv_weight"]: numpy_helper.to_array(arrays[o["conv_weight"]])
            for o in origins if o["conv_weight"] in arrays}, origins))
    for name, t in arrays.items():
        if name in mine and name not in new:
            new[name] = numpy_helper.to_array(t)
    done = 0
    for name, values in new.items():
        if name not in mine:
            continue
        old = original.graph.initializer[mine[name]]
        if tuple(old.dims) != values.shape:
            raise ValueError(f"{name}: shape {tuple(old.dims)} in the original, "
                             f"{values.shape} compressed")
        original.graph.initializer[mine[name]].CopyFrom(
            numpy_helper.from_array(values.astype(numpy_helper.to_array(old).dtype), name))
        done += 1
    return done
