"""Matrix layers as 1×1 convolutions: the rewrite computes what the network computes, joins
the transposes between layers, and puts compressed weights back into the author's form."""
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dlas_predict.networks.generate import generate
from dlas_predict.networks.graph import infer_shapes, load_onnx, read_network, token_bound
from dlas_predict.networks.matrix import (ORIGINS_KEY, as_convs, grid_form, is_matrix_network,
                                          weights_back)


def _run(model, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _rewritten(path):
    model = load_onnx(path)
    n = as_convs(model)
    infer_shapes(model)
    onnx.checker.check_model(model)
    return model, n


def test_a_transformer_s_layers_become_convs_and_compute_the_same(tmp_path):
    [m] = generate("transformer", ["layers=1", "d_model=32", "heads=2", "seq=8"], tmp_path)
    original = load_onnx(m.path)
    fcs = [layer for layer in read_network(m.path).layers if layer.kind == "fc"]
    model, n = _rewritten(m.path)
    assert n == len(fcs) and sum(node.op_type == "Conv" for node in model.graph.node) == n
    # the biases went into the convs; attention's products of two activations stay
    assert not any(node.op_type == "MatMul" and node.input[1] in
                   {t.name for t in model.graph.initializer} for node in model.graph.node)
    assert sum(node.op_type == "MatMul" for node in model.graph.node) == 2
    x = np.random.default_rng(0).normal(size=(1, 8, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x), _run(original, x), rtol=1e-4, atol=1e-5)
    # two transposes per layer of rows, but: Q, K and V read one image of their rows (two
    # fewer), and the FFN's GELU runs on the image (its pair of layers, two fewer)
    transposes = sum(node.op_type == "Transpose" for node in model.graph.node)
    before = sum(node.op_type == "Transpose" for node in original.graph.node)
    rows = sum(int(np.prod(layer.output_shape[:-1])) > 1 for layer in fcs)
    assert transposes == before + 2 * rows - 2 - 2


def _graph(nodes, inits, x_shape, y_shape):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("trans_b,alpha,beta", [(0, 1.0, 1.0), (1, 0.5, 2.0)])
def test_a_gemm_with_its_alpha_beta_and_transposed_weight_computes_the_same(tmp_path, trans_b,
                                                                            alpha, beta):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 5) if trans_b else (5, 6)).astype(np.float32)
    inits = {"w": w, "b": rng.normal(size=6).astype(np.float32)}
    m = _graph([helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=trans_b, alpha=alpha,
                                 beta=beta),
                helper.make_node("Relu", ["h"], ["y"])], inits, [1, 5], [1, 6])
    path = tmp_path / "gemm.onnx"
    onnx.save(m, path)
    model, n = _rewritten(path)
    assert n == 1 and not any(node.op_type == "Transpose" for node in model.graph.node)
    x = rng.normal(size=(1, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x), _run(m, x), rtol=1e-5, atol=1e-6)


def test_a_matmul_of_a_batch_of_rows_without_bias_and_a_product_of_activations_stay_right(
        tmp_path):
    rng = np.random.default_rng(2)
    inits = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    m = _graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 1, 3, 2]),
                helper.make_node("MatMul", ["h", "ht"], ["y"])],
               inits, [1, 2, 5, 4], [1, 2, 5, 5])
    path = tmp_path / "mm.onnx"
    onnx.save(m, path)
    model, n = _rewritten(path)
    assert n == 1
    x = rng.normal(size=(1, 2, 5, 4)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x), _run(m, x), rtol=1e-5, atol=1e-5)


def test_a_residual_of_one_row_joins_the_layer_s_output_on_the_image(tmp_path):
    """One row plus a computed tensor of its shape (a residual MLP at batch 1): the add runs
    on the conv's output in the image layout, where the epilogue takes it, and the network
    computes the same."""
    rng = np.random.default_rng(3)
    inits = {"w1": rng.normal(size=(6, 6)).astype(np.float32),
             "b1": rng.normal(size=6).astype(np.float32),
             "w2": rng.normal(size=(6, 6)).astype(np.float32)}
    m = _graph([helper.make_node("MatMul", ["x", "w1"], ["p"]),
                helper.make_node("Add", ["p", "b1"], ["q"]),
                helper.make_node("Relu", ["q"], ["h"]),
                helper.make_node("MatMul", ["h", "w2"], ["r"]),
                helper.make_node("Add", ["h", "r"], ["y"])], inits, [1, 6], [1, 6])
    path = tmp_path / "residual.onnx"
    onnx.save(m, path)
    model, n = _rewritten(path)
    assert n == 2
    conv_out = {node.output[0] for node in model.graph.node if node.op_type == "Conv"}
    adds = [node for node in model.graph.node if node.op_type == "Add"]
    assert len(adds) == 1 and set(adds[0].input) & conv_out  # joined on the image
    x = rng.normal(size=(1, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x), _run(m, x), rtol=1e-5, atol=1e-5)


def test_grid_form_rewrites_matrix_networks_once_and_leaves_cnns(tmp_path):
    from conftest import DEMO

    [t] = generate("transformer", ["layers=1", "d_model=32", "seq=8"], tmp_path)
    assert is_matrix_network(read_network(t.path))
    assert not is_matrix_network(read_network(DEMO)) and grid_form(DEMO) == DEMO
    g = grid_form(t.path)
    assert g != t.path and g.name == t.path.name
    mtime = g.stat().st_mtime_ns
    assert grid_form(t.path) == g and g.stat().st_mtime_ns == mtime
    net = read_network(g)
    assert len(net.convs()) == sum(layer.kind == "fc" for layer in read_network(t.path).layers)
    assert all(c.spec.R == c.spec.S == 1 and c.spec.H == 1 for c in net.convs())


def test_pruned_weights_go_back_into_the_author_s_form(tmp_path):
    from dlas_predict.compression.compress import compress_onnx

    [t] = generate("transformer", ["layers=1", "d_model=32", "seq=8"], tmp_path)
    pruned = compress_onnx(load_onnx(grid_form(t.path)), "weight_pruning", 0.7).model
    assert ORIGINS_KEY in {p.key for p in pruned.metadata_props}
    original = onnx.load(str(t.path))
    assert weights_back(original, pruned) >= 6
    weights = [numpy_helper.to_array(i) for i in original.graph.initializer
               if len(i.dims) == 2]
    assert np.mean(np.concatenate([w.ravel() for w in weights]) == 0) > 0.6
    x = np.random.default_rng(3).normal(size=(1, 8, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(original, x), _run(pruned, x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="no grid form"):
        weights_back(original, onnx.load(str(t.path)))


def test_a_token_network_says_its_vocabulary_and_a_float_one_none(tmp_path):
    [r] = generate("rnn", ["vocab=50", "seq=4", "hidden=8", "embedding=4"], tmp_path)
    [t] = generate("transformer", ["layers=1", "d_model=32", "seq=8"], tmp_path)
    assert token_bound(onnx.load(str(r.path))) == 50
    assert token_bound(onnx.load(str(t.path))) == 0


@pytest.mark.machine  # which models answer local depends on this CPU
def test_recommend_answers_for_a_transformer_and_an_lstm_with_the_grid(tmp_path):
    from conftest import run_cli

    [t] = generate("transformer", ["layers=1", "d_model=64", "seq=16"], tmp_path)
    res = run_cli("recommend", t.path, "--json", "--tuning", "untuned", "--top", "200")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    backends = {c["config"]["backend"] for c in out["candidates"]}
    assert backends == {"tvm", "onnxruntime"}
    # the models recommend answered local with (this machine's own, else a reference
    # device's, mapped: the folder it names) price a matrix network's other ops with their
    # own network model where they have one (the shipped models of another CPU may not)
    own = (Path(out["model"]["directory"]) / "network_matrix.json").is_file()
    [note] = [n for n in out["notes"] if "is a matrix network" in n]
    assert ("network model of matrix networks" in note) == own
    [r] = generate("rnn", ["seq=8", "hidden=32"], tmp_path)
    res = run_cli("recommend", r.path, "--json", "--tuning", "untuned", "--top", "200")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {c["config"]["backend"] for c in out["candidates"]} == {"tvm", "onnxruntime"}
    assert any("recurrent products" in note for note in out["notes"])
    # an LSTM the unrolling cannot express (a clip): onnxruntime's rows, and the reason
    model = onnx.load(str(r.path))
    for node in model.graph.node:
        if node.op_type == "LSTM":
            node.attribute.append(helper.make_attribute("clip", 3.0))
    onnx.save(model, tmp_path / "clipped.onnx")
    res = run_cli("recommend", tmp_path / "clipped.onnx", "--json", "--tuning", "untuned")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {c["config"]["backend"] for c in out["candidates"]} == {"onnxruntime"}
    assert any("not unrolled" in reason and ": clip" in reason
               for _, reason in out["skipped"])


def test_a_sequence_length_left_open_is_given_by_shape(tmp_path):
    """A transformer exported with its tokens' count open: one error that asks for the
    shape; with ``--shape`` it is read, and a shape that cannot be its input is refused."""
    from conftest import assert_clean_error, run_cli

    [m] = generate("transformer", ["layers=1", "d_model=32", "heads=2", "seq=8"], tmp_path)
    model = onnx.load(str(m.path))
    seq = model.graph.input[0].type.tensor_type.shape.dim[1]
    seq.ClearField("dim_value")
    seq.dim_param = "tokens"
    del model.graph.value_info[:]
    onnx.save(model, tmp_path / "open.onnx")
    assert_clean_error(run_cli("layers", tmp_path / "open.onnx"), "--shape")
    r = run_cli("layers", tmp_path / "open.onnx", "--shape", "1x8x32", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["input_shape"] == [1, 8, 32]
    r = run_cli("recommend", tmp_path / "open.onnx", "--shape", "1x8x32", "--top", "1")
    assert r.exit_code == 0 and "open on local" in r.output, r.output
    assert_clean_error(run_cli("layers", tmp_path / "open.onnx", "--shape", "1x8"),
                       "the shape must give 3 sizes")
    assert_clean_error(run_cli("layers", tmp_path / "open.onnx", "--shape", "2x8x32"),
                       "dimension 0 is fixed at 1")
    assert_clean_error(run_cli("layers", tmp_path / "open.onnx", "--shape", "1xNx32"),
                       "sizes like")
    assert_clean_error(run_cli("layers", "zoo:resnet18-cifar", "--shape", "1x3x32x32"),
                       "has its own")


def test_a_network_of_two_inputs_is_refused_naming_them(tmp_path):
    from conftest import assert_clean_error, run_cli

    w = np.random.default_rng(4).normal(size=(16, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Mul", ["h", "mask"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "masked.onnx")
    assert_clean_error(run_cli("recommend", tmp_path / "masked.onnx"), "2 inputs (x, mask)")
