"""Recurrent layers unrolled into their products and cell: the same function as ONNX's LSTM,
GRU and RNN ops (onnxruntime's kernels as the reference), one weight per product whatever
the steps, compressed weights back into the node, nodes it cannot express kept with the
reason, and a TVM build of the result that matches."""
import copy
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import token_lstm
from dlas_predict.networks.generate import generate
from dlas_predict.networks.graph import infer_shapes, load_onnx, read_network
from dlas_predict.networks.matrix import MATRIX_CONV, grid_form, is_matrix_layer, weights_back
from dlas_predict.networks.recurrent import is_step_product, kept, unroll

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _node_model(op, direction="forward", lbr=0, initial=False, bias=True, seed=0, seq=5,
                batch=2, n_in=6, hidden=4, **attrs):
    rng = np.random.default_rng(seed)
    g, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array(rng.normal(size=(dirs, g * hidden, n_in)).astype(
        np.float32), "W"), numpy_helper.from_array(rng.normal(size=(dirs, g * hidden, hidden))
                                                   .astype(np.float32), "R")]
    ins = ["x", "W", "R", "B" if bias else "", ""]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=(dirs, 2 * g * hidden)).astype(
            np.float32), "B"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, n_in])]
    if initial:
        ins.append("h0")
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT,
                                                    [dirs, batch, hidden]))
        if op == "LSTM":
            ins.append("c0")
            inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT,
                                                        [dirs, batch, hidden]))
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ins, outs, name="rec", hidden_size=hidden,
                            direction=direction, **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    return {i.name: rng.normal(size=[d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


CASES = [(op, d, lbr, init, bias) for op, d, lbr, init, bias in itertools.product(
    GATES, ("forward", "reverse", "bidirectional"), (0, 1), (False, True), (False, True))
    if op == "GRU" or lbr == 0]


@pytest.mark.parametrize("op,direction,lbr,initial,bias", CASES)
def test_an_unrolled_recurrent_node_computes_what_onnx_s_op_computes(op, direction, lbr,
                                                                     initial, bias):
    model = _node_model(op, direction, lbr, initial, bias)
    feeds = _feeds(model)
    unrolled = copy.deepcopy(model)
    infer_shapes(unrolled)
    assert unroll(unrolled, MATRIX_CONV) == 1
    assert not any(n.op_type in GATES for n in unrolled.graph.node)
    for want, got in zip(_run(model, feeds), _run(unrolled, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # one weight per product and direction, however many steps read it
    convs = [n for n in unrolled.graph.node if n.op_type == "Conv"]
    assert all(is_matrix_layer(n.name) for n in convs)
    dirs = 2 if direction == "bidirectional" else 1
    products = 3 if op == "GRU" and not lbr else 2
    assert len({n.input[1] for n in convs}) == dirs * products
    assert len(convs) == dirs * (1 + (products - 1) * (5 if initial else 4))


def test_a_gru_whose_candidate_has_no_recurrent_bias_starts_from_zeros_right():
    model = _node_model("GRU", lbr=0, seq=3)
    b = numpy_helper.to_array(model.graph.initializer[2]).copy()
    b[:, 5 * 4:] = 0.0  # Rbₕ, the last of the six bias blocks (Wb z r h, Rb z r h), is zero
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(b, "B"))
    feeds = _feeds(model)
    want = _run(model, feeds)
    infer_shapes(model)
    assert unroll(model, MATRIX_CONV) == 1
    for w, g in zip(want, _run(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,reason", [
    ({"clip": 3.0}, "clip"),
    ({"activations": ["Relu", "Tanh", "Tanh"]}, "activations relu, tanh, tanh"),
    ({"layout": 1}, "layout 1"),
    ({"input_forget": 1}, "input_forget"),
])
def test_a_node_the_unrolling_cannot_express_stays_and_says_why(attrs, reason):
    model = _node_model("LSTM", **attrs)
    infer_shapes(model)
    assert unroll(model, MATRIX_CONV) == 0
    assert [n.op_type for n in model.graph.node] == ["LSTM"]
    [line] = kept(model)
    assert line.startswith("LSTM 'rec': ") and reason in line


def test_an_open_sequence_length_or_a_node_kept_whole_is_one_clear_error(tmp_path):
    """A symbolic first dimension is read as a batch of 1, but an LSTM's sequence axis (the
    first, in ONNX's default layout) has no length to price; a network of recurrent nodes
    the unrolling cannot express has nothing of the grid, and recommend says why."""
    from conftest import assert_clean_error, run_cli

    from dlas_predict.networks.graph import NetworkError

    model = _node_model("LSTM", batch=1)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    onnx.save(model, tmp_path / "open.onnx")
    with pytest.raises(NetworkError, match="LSTM 'rec': the sequence length of its input 'x'"):
        read_network(tmp_path / "open.onnx")
    assert_clean_error(run_cli("recommend", tmp_path / "open.onnx"), "--shape")
    r = run_cli("recommend", tmp_path / "open.onnx", "--shape", "5x1x6", "--top", "1")
    assert r.exit_code == 0 and "open on local" in r.output, r.output
    onnx.save(_node_model("LSTM", batch=1, activations=["Relu", "Tanh", "Tanh"]),
              tmp_path / "relu.onnx")
    assert_clean_error(run_cli("recommend", tmp_path / "relu.onnx"),
                       "LSTM 'rec': activations relu, tanh, tanh")


def test_an_lstm_s_input_in_onnx_s_layout_has_its_batch_second(tmp_path):
    """Steps first, then the batch: 5 steps of one sequence is batch 1, read directly or
    through an embedding, in the network and in its grid form (the steps unrolled); in
    layout 1 the batch comes first."""
    onnx.save(_node_model("LSTM", batch=1, seq=5), tmp_path / "steps.onnx")
    assert read_network(tmp_path / "steps.onnx").batch == 1
    assert read_network(grid_form(tmp_path / "steps.onnx")).batch == 1
    onnx.save(_node_model("LSTM", batch=3, seq=5), tmp_path / "three.onnx")
    assert read_network(grid_form(tmp_path / "three.onnx")).batch == 3
    onnx.save(token_lstm(7), tmp_path / "tokens.onnx")
    assert read_network(tmp_path / "tokens.onnx").batch == 1
    assert read_network(grid_form(tmp_path / "tokens.onnx")).batch == 1
    batch_first = _node_model("LSTM", batch=1, seq=5, layout=1)
    batch_first.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    onnx.save(batch_first, tmp_path / "first.onnx")
    assert read_network(tmp_path / "first.onnx").batch == 2


@pytest.mark.slow  # builds and times
def test_a_network_of_steps_first_is_validated_on_both_backends(tmp_path):
    """Each check input is a whole sequence of one batch, whatever its axes: our build and
    onnxruntime's run verify and time."""
    from dlas_predict.recommend.search import recommend
    from dlas_predict.recommend.validate import measure_candidates
    from dlas_predict.space.devices import get_device

    onnx.save(token_lstm(6), tmp_path / "tokens.onnx")
    path = str(tmp_path / "tokens.onnx")
    rec = recommend(path, top=0, tuning="untuned", max_accuracy_drop=float("inf"))
    ours = next(c for c in rec.candidates if c.backend == "tvm" and c.label == "dense gemm")
    measure_candidates(path, rec.network, get_device("local"), [ours, rec.reference])
    for c in (ours, rec.reference):
        assert c.measured_median_s > 0 and not (c.measured_note or "").startswith(
            ("failed", "output check")), c.measured_note


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_a_generated_recurrent_network_s_grid_form_and_weights_back(tmp_path, cell):
    from dlas_predict.compression.compress import compress_onnx

    [m] = generate("rnn", [f"cell={cell}", "seq=6", "hidden=16", "embedding=8",
                           "vocab=40"], tmp_path)
    g = grid_form(m.path)
    assert g != m.path
    grid = onnx.load(str(g))
    assert not any(n.op_type in GATES for n in grid.graph.node)
    assert not read_network(g).layers or all(layer.kind != "recurrent"
                                            for layer in read_network(g).layers)
    # one recurrent product a step but the first (it reads no state), named as such
    steps = [c.name for c in read_network(g).convs() if is_step_product(c.name)]
    assert len(steps) == 2 * 5  # two layers of six steps
    x = {"input": np.random.default_rng(2).integers(0, 40, size=(1, 6)).astype(np.int64)}
    original = onnx.load(str(m.path))
    np.testing.assert_allclose(_run(grid, x)[0], _run(original, x)[0], rtol=1e-4, atol=1e-5)
    # weight pruning on the grid form; the node's W and R take the pruned weights back
    pruned = compress_onnx(load_onnx(g), "weight_pruning", 0.7).model
    assert weights_back(original, pruned) >= 4
    np.testing.assert_allclose(_run(original, x)[0], _run(pruned, x)[0], rtol=1e-4,
                               atol=1e-5)
    node = next(n for n in original.graph.node if n.op_type in GATES)
    w = numpy_helper.to_array(next(t for t in original.graph.initializer
                                   if t.name == node.input[1]))
    assert 0.5 < float((w == 0).mean()) < 0.95


def test_channel_pruning_keeps_an_unrolled_network_whole(tmp_path):
    """The gates are sliced by position: channel pruning zeroes filters but removes none,
    and every scalar index keeps its rank."""
    from dlas_predict.compression.compress import channel_removed_networks

    [m] = generate("rnn", ["seq=4", "hidden=16", "embedding=8", "vocab=40"], tmp_path)
    out = channel_removed_networks(str(m.path), [0.5])
    layers, summary = out[0.5]
    assert len(layers) == len(read_network(grid_form(m.path)).convs())
    assert summary["conv_layers"] == len(layers)


@pytest.mark.slow  # a TVM build
def test_an_unrolled_lstm_builds_verifies_and_times_on_our_kernels(tmp_path):
    from dlas_predict.measure.execution.tasks import Protocol
    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.measure.networks.runner import NetworkRunner
    from dlas_predict.space.devices import get_device

    [m] = generate("rnn", ["layers=1", "seq=4", "hidden=16", "embedding=8", "vocab=40"],
                   tmp_path)
    n = len(read_network(grid_form(m.path)).convs())
    plan = uniform_plan(str(m.path), "lstm", "dense", None, "spatial_pack", n)
    fast = Protocol(max_repeats=3, min_repeats=2, min_repeat_ms=0.1, time_budget_s=0.05,
                    quiet_wait_s=0)
    with NetworkRunner(get_device("local"), protocol=fast, timeout_s=300) as runner:
        rec = runner.measure(plan)
    assert rec.error is None, rec.error
    assert rec.verified and rec.max_error < 1e-4, (rec.max_error, rec.top1_agreement)
    assert rec.median_s > 0


def test_a_constant_initial_state_is_zeros_or_kept_with_the_reason():
    """An exporter's zero initial state (torch writes one) starts from zeros: no product at
    the first step, which a build would fold away; a constant other state stays a node."""
    for value, unrolled in ((0.0, True), (0.5, False)):
        model = _node_model("LSTM", seq=4, batch=1)
        h0 = numpy_helper.from_array(np.full((1, 1, 4), value, np.float32), "h0")
        model.graph.initializer.append(h0)
        model.graph.node[0].input.extend(["h0"])
        feeds = _feeds(model)
        want = _run(model, feeds)
        infer_shapes(model)
        assert unroll(model, MATRIX_CONV) == int(unrolled)
        if unrolled:
            convs = [n for n in model.graph.node if n.op_type == "Conv"]
            assert len(convs) == 1 + 3  # the input product and steps 2-4's recurrent ones
            np.testing.assert_allclose(_run(model, feeds)[0], want[0], rtol=1e-5, atol=1e-5)
        else:
            assert "constant initial state" in kept(model)[0]
