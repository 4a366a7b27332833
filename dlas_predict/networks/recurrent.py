"""Recurrent layers as their matrix products and a cell of elementwise ops.

An ONNX ``LSTM``, ``GRU`` or ``RNN`` over ``seq`` steps is, per direction, one input product
of every step at once (``X·Wᵀ``: seq × batch rows) and one recurrent product per step
(``Hₜ₋₁·Rᵀ``: batch rows), joined by the cell's gates. :func:`unroll` writes each such node
out in those terms, so the grid prices, prunes, quantises and builds the products as the
matrix layers they are (1×1 convolutions, as :mod:`dlas_predict.networks.matrix` writes
fully connected layers) and the cell as ordinary elementwise ops. The unrolled network
computes what the node computes (ONNX's equations, its default activations); a node the
unrolling cannot express exactly stays as it is, and :func:`unsupported` says why.

Every step's recurrent product reads the same weight initializer; where each product's
weight came from in the node is recorded in the model's metadata (``dlas.recurrent_weights``)
so that compressed weights go back into the node for onnxruntime
(:func:`dlas_predict.networks.matrix.weights_back`).
"""

from __future__ import annotations

import json

import numpy as np

from dlas_predict.networks.graph import constant_values, node_attributes

#: The metadata key listing each product's conv weight and where it came from: the node's W
#: or R, the direction and the rows (gates) of it.
ORIGINS_KEY = "dlas.recurrent_weights"
OPS = ("LSTM", "GRU", "RNN")
_DEFAULT_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"],
                        "RNN": ["tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: The name of a step's recurrent product (one per step and direction) in the unrolled
#: network's layer names.
STEP_PRODUCT = "recurrent_product"


def is_step_product(name: str) -> bool:
    """Whether a conv layer of this name is a step's recurrent product of an unrolled
    recurrent layer."""
    return f"/{STEP_PRODUCT}/" in name


def unsupported(node, inits: dict, constants: dict | None = None) -> str | None:
    """Why ``node`` (an LSTM, GRU or RNN) cannot be unrolled exactly, or None;
    ``constants``: the model's constant tensors (:func:`_constants`)."""
    from onnx import numpy_helper

    a = node_attributes(node)
    dirs = {"forward": 1, "reverse": 1, "bidirectional": 2}
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in dirs:
        return f"direction {direction!r}"
    acts = [s.decode().lower() if isinstance(s, bytes) else str(s).lower()
            for s in a.get("activations", [])]
    if acts and acts != _DEFAULT_ACTIVATIONS[node.op_type] * dirs[direction]:
        return f"activations {', '.join(acts)} (only ONNX's defaults are unrolled)"
    if "activation_alpha" in a or "activation_beta" in a:
        return "activation_alpha/beta"
    if a.get("clip") is not None:
        return "clip"
    if a.get("input_forget", 0):
        return "input_forget"
    if a.get("layout", 0):
        return "layout 1 (batch first)"
    ins = list(node.input) + [""] * 8
    if ins[4]:  # sequence lengths: every sequence full, or not unrolled
        return "sequence_lens (per-sequence lengths)"
    if node.op_type == "LSTM" and ins[7]:
        return "peepholes (P)"
    for i in (1, 2) + ((3,) if ins[3] else ()):
        if ins[i] not in inits:
            return f"input {i} ({ins[i]}) is not a constant"
    if numpy_helper.to_array(inits[ins[1]]).dtype != np.float32:
        return "weights not float32"
    for i in (5, 6):
        value = (constants or {}).get(ins[i]) if ins[i] else None
        if value is not None and np.any(value):
            # its first recurrent product would be a constant, which a build folds away
            return "a constant initial state that is not zero"
    return None


def _constants(model) -> dict[str, np.ndarray]:
    """The values of ``model``'s initializers and Constant nodes of a state's size."""
    return constant_values(model, lambda dims: len(dims) == 3
                           and int(np.prod(dims)) <= 1 << 16)


class _Writer:
    """New nodes and initializers, under fresh names."""

    def __init__(self, model, base: str, suffix: str = "") -> None:
        self.suffix = suffix
        self.used = {n.name for n in model.graph.node} | {
            t.name for t in model.graph.initializer} | {
            o for n in model.graph.node for o in n.output} | {
            i.name for i in model.graph.input}
        self.base = base
        self.nodes: list = []
        self.inits: list = []
        self.counts: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        name, i = f"{self.base}/{hint}", self.counts.get(hint, 0)
        while name in self.used:
            i += 1
            name = f"{self.base}/{hint}_{i}"
        self.counts[hint] = i
        self.used.add(name)
        return name

    def const(self, hint: str, values: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(values, name))
        return name

    def op(self, op: str, inputs: list[str], hint: str, out: str | None = None, **attrs) -> str:
        from onnx import helper

        out = out or self.fresh(hint)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out


def _cell(wr: _Writer, op: str, pre: str, hr: str | None, h: str | None, c: str | None,
          hidden: int, cand, product):
    """One step of one direction: (Hₜ, Cₜ) from the input product ``pre`` (its biases in),
    the recurrent product ``hr`` of Hₜ₋₁ with its biases (None: zero), Hₜ₋₁ and Cₜ₋₁ (None:
    zeros), each 1 × channels × 1 × batch. A GRU whose candidate multiplies r ⊙ Hₜ₋₁ (``hr``
    then holds the z and r gates only) has ``cand``: ("product", weight, bias) with Hₜ₋₁,
    ("bias", tensor or None) from zeros; ``product(x, weight, bias)`` makes that product."""
    axis = wr.const("axis", np.array([1], np.int64))

    def gate(t: str, k: int) -> str:
        return wr.op("Slice", [t, wr.const("start", np.array([k * hidden], np.int64)),
                               wr.const("end", np.array([(k + 1) * hidden], np.int64)),
                               axis], f"gate{k}")

    if op == "RNN":
        s = pre if hr is None else wr.op("Add", [hr, pre], "gates")
        return wr.op("Tanh", [s], "hidden"), None
    if op == "LSTM":  # gates i, o, f, c
        s = pre if hr is None else wr.op("Add", [hr, pre], "gates")
        i, o, f = (wr.op("Sigmoid", [gate(s, k)], "sigmoid") for k in range(3))
        ic = wr.op("Mul", [i, wr.op("Tanh", [gate(s, 3)], "tanh")], "input_gated")
        c_new = ic if c is None else wr.op("Add", [wr.op("Mul", [f, c], "kept"), ic], "cell")
        return wr.op("Mul", [o, wr.op("Tanh", [c_new], "tanh")], "hidden"), c_new
    # GRU: gates z, r, h
    z, r = (wr.op("Sigmoid", [gate(pre, k) if hr is None else wr.op(
        "Add", [gate(hr, k), gate(pre, k)], "gate_in")], "sigmoid") for k in range(2))
    if cand is None:  # linear_before_reset: r ⊙ (Hₜ₋₁·Rₕᵀ + Rbₕ)
        rec = None if hr is None else wr.op("Mul", [r, gate(hr, 2)], "reset_rec")
        cand_in = gate(pre, 2) if rec is None else wr.op("Add", [gate(pre, 2), rec],
                                                          "cand_in")
    elif cand[0] == "product":  # (r ⊙ Hₜ₋₁)·Rₕᵀ + Rbₕ, the step's input added in its epilogue
        rec = product(wr.op("Mul", [r, h], "reset_hidden"), cand[1], cand[2])
        cand_in = wr.op("Add", [rec, gate(pre, 2)], "cand_in")
    elif cand[1] is not None:  # Hₜ₋₁ = 0: Rbₕ
        cand_in = wr.op("Add", [gate(pre, 2), cand[1]], "cand_in")
    else:
        cand_in = gate(pre, 2)
    new = wr.op("Tanh", [cand_in], "candidate")
    if h is None:
        one = wr.const("one", np.array(1.0, np.float32))
        return wr.op("Mul", [wr.op("Sub", [one, z], "keep_new"), new], "hidden"), None
    # (1 − z) ⊙ h̃ + z ⊙ Hₜ₋₁ = h̃ + z ⊙ (Hₜ₋₁ − h̃)
    return wr.op("Add", [new, wr.op("Mul", [z, wr.op("Sub", [h, new], "diff")], "kept")],
                 "hidden"), None


def _split_steps(wr: _Writer, xw: str, seq: int, opset: int) -> list[str]:
    """Each step's part of ``xw`` (1 × gates × seq × batch) along its third axis: one Split."""
    from onnx import helper

    if seq == 1:
        return [xw]
    parts = [wr.fresh("step") for _ in range(seq)]
    ins = [xw]
    attrs = {"axis": 2}
    if opset >= 13:
        ins.append(wr.const("split", np.ones(seq, np.int64)))
    else:
        attrs["split"] = [1] * seq
    wr.nodes.append(helper.make_node("Split", ins, parts, name=parts[0], **attrs))
    return parts


def _product(wr: _Writer, x: str, weight: np.ndarray, bias: np.ndarray | None, hint: str,
             origins: list, origin: dict, shared: dict) -> str:
    """The 1×1 convolution of image ``x`` by ``weight`` (outputs × inputs) with ``bias``, its
    name ending in the writer's ``suffix``; a weight already given (every step's) is read
    again, not copied."""
    key = (origin["node_input"], origin["direction"], tuple(origin.get("rows", ())))
    if key not in shared:
        names = [wr.const(f"{hint}/conv_weight", np.ascontiguousarray(
            weight.reshape(*weight.shape, 1, 1)))]
        if bias is not None and bias.any():
            names.append(wr.const(f"{hint}/conv_bias", bias.copy()))
        shared[key] = names
        origins.append({**origin, "conv_weight": names[0]})
    return wr.op("Conv", [x, *shared[key]], f"{hint}{wr.suffix}", kernel_shape=[1, 1],
                 strides=[1, 1], pads=[0, 0, 0, 0])


def _unroll_node(model, node, shapes: dict, inits: dict, origins: list,
                 suffix: str, constants: dict) -> "_Writer":
    """``node`` written out in the image layout of the grid's matrix layers: every tensor of
    a step is 1 × channels × 1 × batch, so each recurrent product is a 1×1 convolution that
    reads the previous step's hidden state as it is, and adds the step's input product in
    its epilogue."""
    from onnx import numpy_helper

    op = node.op_type
    a = node_attributes(node)
    ins = list(node.input) + [""] * 8
    outs = list(node.output) + [""] * 3
    seq, batch, n_in = (int(v) for v in shapes[ins[0]])
    w = numpy_helper.to_array(inits[ins[1]]).astype(np.float32)
    r = numpy_helper.to_array(inits[ins[2]]).astype(np.float32)
    dirs, gh, _ = w.shape
    hidden = gh // _GATES[op]
    b = (numpy_helper.to_array(inits[ins[3]]).astype(np.float32) if ins[3]
         else np.zeros((dirs, 2 * gh), np.float32))
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    lbr = bool(a.get("linear_before_reset", 0))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    wr = _Writer(model, node.name or outs[0] or op, suffix)
    shared: dict = {}
    # X (seq × batch × in) as an image of its rows: 1 × in × 1 × (seq·batch)
    rows = wr.op("Reshape", [ins[0], wr.const("rows_shape", np.array(
        [1, 1, seq * batch, n_in], np.int64))], "rows")
    image = wr.op("Transpose", [rows], "image", perm=[0, 3, 1, 2])
    step_image = wr.const("state_shape", np.array([1, hidden, 1, batch], np.int64))
    ys, last_h, last_c = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        wb, rb = b[d, :gh], b[d, gh:]
        # LSTM, RNN: both biases join the input product. GRU: the recurrent biases stay
        # with the recurrent product (the reset gate multiplies the candidate's).
        in_bias, rec_bias = (wb, rb) if op == "GRU" else (wb + rb, np.zeros_like(rb))
        xw = _product(wr, image, w[d], in_bias, "input_product", origins,
                      {"node_input": ins[1], "direction": d}, shared)
        xw = wr.op("Reshape", [xw, wr.const("steps_shape", np.array(
            [1, gh, seq, batch], np.int64))], "steps")
        steps = _split_steps(wr, xw, seq, opset)
        r_main, main_rows = r[d], [0, gh]
        cand_bias = None
        if op == "GRU" and not lbr:  # Hₜ₋₁ feeds z and r; r ⊙ Hₜ₋₁ feeds the candidate
            r_main, main_rows = r[d][:2 * hidden], [0, 2 * hidden]
            cand_bias = rec_bias[2 * hidden:]
            rec_bias = rec_bias[:2 * hidden]
        h = c = None
        index = wr.const("dir", np.array(d, np.int64))
        for k, i in (("h", 5), ("c", 6)):
            # dirs × batch × hidden; a constant initial state is zero (unsupported): none
            if ins[i] and ins[i] not in constants and (k == "h" or op == "LSTM"):
                t = wr.op("Transpose", [wr.op("Gather", [ins[i], index], f"{k}0", axis=0)],
                          f"{k}0_t", perm=[1, 0])
                t = wr.op("Reshape", [t, step_image], f"{k}0_image")
                h, c = (t, c) if k == "h" else (h, t)
        hs: dict[int, str] = {}
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            pre = steps[t]
            if h is not None:
                hr = _product(wr, h, r_main, rec_bias, STEP_PRODUCT, origins,
                              {"node_input": ins[2], "direction": d, "rows": main_rows},
                              shared)
            elif rec_bias.any():  # Hₜ₋₁ = 0: the recurrent product is its bias
                hr = wr.const("rec_bias_image", rec_bias.reshape(1, -1, 1, 1).copy())
            else:
                hr = None
            cand = None  # linear_before_reset: the candidate's term is in hr
            if cand_bias is not None and h is not None:
                cand = ("product", r[d][2 * hidden:], cand_bias)
            elif cand_bias is not None:  # Hₜ₋₁ = 0: Rbₕ alone (or nothing)
                cand = ("bias", wr.const("rb_candidate", cand_bias.reshape(1, -1, 1, 1).copy())
                        if cand_bias.any() else None)
            h, c = _cell(wr, op, pre, hr, h, c, hidden, cand,
                         lambda x, wt, bias: _product(
                             wr, x, wt, bias, "candidate_product", origins,
                             {"node_input": ins[2], "direction": d,
                              "rows": [2 * hidden, gh]}, shared))
            hs[t] = h
        # the steps in time order: seq × hidden × 1 × batch → seq × 1 × batch × hidden
        seq_image = wr.op("Concat", [hs[t] for t in range(seq)], "sequence", axis=0) \
            if seq > 1 else hs[0]
        ys.append(wr.op("Transpose", [seq_image], "sequence_t", perm=[0, 2, 3, 1]))
        last_h.append(wr.op("Transpose", [h], "last_hidden", perm=[0, 2, 3, 1]))
        if c is not None:
            last_c.append(wr.op("Transpose", [c], "last_cell", perm=[0, 2, 3, 1]))
    if outs[0]:
        if len(ys) == 1:
            wr.op("Identity", ys, "y", out=outs[0])
        else:
            wr.op("Concat", ys, "y", out=outs[0], axis=1)
    last_shape = wr.const("last_shape", np.array([1, batch, hidden], np.int64))
    for out, parts in ((outs[1], last_h), (outs[2], last_c)):
        if out:
            parts = [wr.op("Reshape", [p, last_shape], "last") for p in parts]
            if len(parts) == 1:
                wr.op("Identity", parts, "last", out=out)
            else:
                wr.op("Concat", parts, "last", out=out, axis=0)
    return wr


def unroll(model, suffix: str) -> int:
    """Write every LSTM, GRU and RNN node of ``model`` that :func:`unsupported` accepts out
    as its products (1×1 convolutions, each name ending in ``suffix``) and cell ops, in
    place; returns how many were unrolled. ``model`` must carry its inferred shapes
    (``graph.infer_shapes``); the unrolled tensors' shapes are to be inferred again."""
    from dlas_predict.networks.graph import value_shapes

    inits = {t.name: t for t in model.graph.initializer}
    constants = _constants(model)
    shapes = value_shapes(model)
    nodes = list(model.graph.node)
    origins: list = []
    done = 0
    kept = []
    new_inits = []
    for node in nodes:
        x = shapes.get(node.input[0]) if node.input else None
        if (node.op_type not in OPS or unsupported(node, inits, constants) is not None
                or x is None or len(x) != 3
                or any(not isinstance(v, int) or v <= 0 for v in x)):
            kept.append(node)
            continue
        wr = _unroll_node(model, node, shapes, inits, origins, suffix, constants)
        kept.extend(wr.nodes)
        new_inits.extend(wr.inits)
        done += 1
    if not done:
        return 0
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(new_inits)
    readers = {i for node in model.graph.node for i in node.input}
    outputs = {o.name for o in model.graph.output}
    for t in [t for t in model.graph.initializer if t.name not in readers | outputs]:
        model.graph.initializer.remove(t)  # the nodes' W, R and B, now unrolled
    del model.graph.value_info[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = ORIGINS_KEY, json.dumps(origins)
    return done


def kept(model) -> list[str]:
    """The LSTM, GRU and RNN nodes of ``model`` that :func:`unroll` leaves as they are, each
    with the reason: ``"LSTM 'name': clip"``."""
    inits, constants = {t.name: t for t in model.graph.initializer}, _constants(model)
    return [f"{node.op_type} {node.name or node.output[0]!r}: "
            f"{unsupported(node, inits, constants) or 'a sequence of unknown length'}"
            for node in model.graph.node if node.op_type in OPS]


def put_back(original, arrays: dict[str, np.ndarray], origins: list) -> dict[str, np.ndarray]:
    """The LSTM/GRU/RNN weights of ``original`` rebuilt from the unrolled products' conv
    weights ``arrays`` (name → values): node input name → array."""
    from onnx import numpy_helper

    mine = {t.name: t for t in original.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for o in origins:
        if o["conv_weight"] not in arrays or o["node_input"] not in mine:
            continue
        if o["node_input"] not in out:
            out[o["node_input"]] = numpy_helper.to_array(mine[o["node_input"]]).astype(
                np.float32).copy()
        conv = arrays[o["conv_weight"]]
        values = conv.reshape(conv.shape[0], -1)
        target = out[o["node_input"]][o["direction"]]
        lo, hi = o.get("rows", [0, target.shape[0]])
        if target[lo:hi].shape != values.shape:
            raise ValueError(f"{o['node_input']}: shape {target[lo:hi].shape} in the node, "
                             f"{values.shape} compressed")
        target[lo:hi] = values
    return out
