"""An ONNX network prepared for our builds and imported into Relax: ReLU6's Clip as Max and
Min, batch norms folded into the convs they follow (as exporters do), stacked extrema as
binary ones."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


# ---- build and run ------------------------------------------------------------------------
def _clip_as_max_min(model) -> None:
    """Rewrite ``Clip(x, lo, hi)`` (ReLU6) as ``Min(Max(x, lo), hi)``, in place. The frontend
    imports Clip as pre-lowered TE calls, which ``ToMixedPrecision`` cannot convert; Max and
    Min import as Relax ops."""
    from onnx import helper

    nodes = []
    for node in model.graph.node:
        if node.op_type != "Clip":
            nodes.append(node)
            continue
        inputs = list(node.input) + [""] * (3 - len(node.input))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x = inputs[0]
        for i, (op, key) in enumerate((("Max", "min"), ("Min", "max")), 1):
            bound = inputs[i]
            if not bound and key in attrs:  # opset < 11: bounds are attributes
                bound = f"{node.output[0]}_{key}"
                model.graph.initializer.append(helper.make_tensor(bound, 1, [], [attrs[key]]))
            if not bound:
                continue
            out = f"{node.output[0]}_{op.lower()}"
            nodes.append(helper.make_node(op, [x, bound], [out], name=f"{node.name}_{op}"))
            x = out
        nodes.append(helper.make_node("Identity", [x], [node.output[0]], name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _fold_batch_norms(model) -> int:
    """Fold each inference ``BatchNormalization`` that is the only user of a ``Conv``'s output
    into that conv's weights and bias, in place (what exporters do: a graph that kept its
    norms runs them as ops of their own otherwise). Needs the conv's weights, bias and the
    norm's four parameters as initializers. Returns how many were folded."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for out in model.graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    producer = {node.output[0]: node for node in model.graph.node if node.output}
    dropped, folded = set(), 0
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or len(node.output) != 1:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        conv = producer.get(node.input[0])
        params = node.input[1:5]
        if (attrs.get("training_mode", 0) or conv is None or conv.op_type != "Conv"
                or uses.get(node.input[0]) != 1 or len(params) != 4
                or not all(p in inits for p in params)
                or conv.input[1] not in inits
                or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits)):
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[p]).astype(np.float64)
                                  for p in params)
        w = numpy_helper.to_array(inits[conv.input[1]])
        bias = (numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64)
                if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0]))
        scale = gamma / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        w_name, b_name = f"{node.output[0]}_folded_w", f"{node.output[0]}_folded_b"
        model.graph.initializer.extend([
            numpy_helper.from_array((w * scale.reshape(-1, *[1] * (w.ndim - 1))).astype(
                w.dtype), w_name),
            numpy_helper.from_array(((bias - mean) * scale + beta).astype(w.dtype), b_name)])
        x = conv.input[0]
        del conv.input[:]
        conv.input.extend([x, w_name, b_name])
        conv.output[0] = node.output[0]
        dropped.add(id(node))
        folded += 1
    if folded:
        keep = [n for n in model.graph.node if id(n) not in dropped]
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return folded


def _stacked_extrema_as_binary(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite ``max(stack((x, c)), axis=0)`` with ``c`` a constant of one value as
    ``maximum(x, c)`` (and ``min`` as ``minimum``).

    The ONNX frontend imports a two-input Max or Min (and so each ReLU6, through
    :func:`_clip_as_max_min`) as broadcast, stack and reduce, with the bound folded into a
    constant of the activation's full size. Lowered, that copies the activation twice and
    reduces over the copies: a ReLU6 on a 112×112×96 activation took 5 ms, and in
    mobilenetv2 (ImageNet) those ops cost more than all the convolutions. As a binary op
    with a scalar it is elementwise and fuses into the preceding op."""
    from tvm.relax.dpl import is_const, is_op, is_tuple, rewrite_call, wildcard

    inner, shape = wildcard(), wildcard()
    broadcast = is_op("relax.broadcast_to")(inner, shape)
    x, c = broadcast | wildcard(), is_const()
    binary = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum}

    def rewriter(call: relax.Call, matches: dict) -> relax.Expr:
        attrs = call.attrs
        if attrs.axis is None or [int(a) for a in attrs.axis] != [0] or attrs.keepdims:
            return call
        bound = matches[c].value.numpy()
        if bound.size == 0 or bound.min() != bound.max():
            return call
        arg = matches[x]
        if inner in matches and list(matches[inner].ty.shape) == list(call.ty.shape):
            arg = matches[inner]  # the broadcast is to the shape it already has
        return binary[call.op.name](arg, relax.const(bound.flat[0], str(bound.dtype)))

    stacked = is_op("relax.stack")(is_tuple([x, c]) | is_tuple([c, x]))
    patterns = [is_op(op)(stacked) for op in binary]
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        for pattern in patterns:
            func = rewrite_call(pattern, rewriter, func)
        mod[gv] = func
    return mod


def relax_module(model, input_name: str, input_shape: tuple[int, ...]) -> tvm.IRModule:
    import copy

    from tvm.relax.frontend.onnx import from_onnx

    model = copy.deepcopy(model)
    _fold_batch_norms(model)
    _clip_as_max_min(model)
    mod = from_onnx(model, shape_dict={input_name: list(input_shape)})
    mod = relax.transform.FoldConstant()(mod)
    return relax.transform.DeadCodeElimination()(_stacked_extrema_as_binary(mod))
