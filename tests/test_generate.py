"""ParaDnn-style generator: grids, names, valid ONNX, and the shapes it promises."""
import json

import numpy as np
import onnxruntime as ort
import pytest

from dlas_predict.errors import ConfigError
from dlas_predict.networks.generate import (FAMILIES, build, file_name, generate, parse_grid,
                                            parse_name)
from dlas_predict.networks.graph import read_network


def test_grid_is_the_cross_product_with_defaults():
    grid = parse_grid("cnn", ["layers=2,4", "kernels=16,32,64"])
    assert len(grid) == 6
    assert {(p["layers"], p["kernels"]) for p in grid} == {(l, k) for l in (2, 4)
                                                           for k in (16, 32, 64)}
    assert all(p["kernel_size"] == FAMILIES["cnn"]["kernel_size"] for p in grid)


@pytest.mark.parametrize("items, needle", [
    (["width=3"], "allowed: layers"), (["layers=0"], "at least 1"), (["layers=a"], "integer"),
    (["block=dense"], "plain, residual, separable, inverted"), (["layers"], "NAME=V1"),
    (["kernel_size=9", "input=8"], "exceeds"), (["layers=2", "layers=3"], "twice"),
])
def test_bad_params(items, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_grid("cnn", items)
    with pytest.raises(ConfigError, match="known: fc, cnn, rnn, transformer"):
        parse_grid("gan", [])
    with pytest.raises(ConfigError, match="not a multiple of heads"):
        parse_grid("transformer", ["d_model=100", "heads=3"])
    with pytest.raises(ConfigError, match="lstm, gru, rnn"):
        parse_grid("rnn", ["cell=mamba"])


def test_files_run_and_have_the_promised_layers(tmp_path):
    written = generate("cnn", ["block=plain,residual,separable", "kernels=8"], tmp_path)
    written += generate("fc", ["layers=1,2", "nodes=32", "batch=1,3"], tmp_path)
    assert len(written) == 7 and len({m.path for m in written}) == 7
    for m in written:
        assert m.path.name == file_name(m.family, m.params)
        sess = ort.InferenceSession(str(m.path))
        inp = sess.get_inputs()[0]
        out = sess.run(None, {inp.name: np.random.rand(*inp.shape).astype(np.float32)})[0]
        assert np.all(np.isfinite(out))
        net = read_network(m.path)
        p = m.params
        if m.family == "fc":
            assert [l.kind for l in net.layers].count("fc") == p["layers"] + 1
            want = p["batch"] * (784 * 32 + 32 * 32 * (p["layers"] - 1) + 32 * 10)
            assert net.macs == want
        else:
            kinds = [l.kind for l in net.layers]
            if p["block"] == "separable":
                assert kinds.count("depthwise_conv") == p["layers"]
            if p["block"] == "residual":
                assert kinds.count("elementwise") == p["layers"]
                assert kinds.count("conv") == 1 + 2 * p["layers"]
            # plain: stem + 4 layers of 3x3 8->8 at 32x32, then a 8->10 classifier
            if p["block"] == "plain":
                assert net.macs == 32 * 32 * 9 * (3 * 8 + 4 * 8 * 8) + 80


def test_batch_scales_macs_and_downsample_doubles_filters():
    a = build("cnn", {**FAMILIES["cnn"], "batch": 1})
    b = build("cnn", {**FAMILIES["cnn"], "batch": 4})
    import onnx, tempfile, os

    with tempfile.TemporaryDirectory() as d:
        pa, pb = os.path.join(d, "a.onnx"), os.path.join(d, "b.onnx")
        onnx.save(a, pa)
        onnx.save(b, pb)
        assert read_network(pb).macs == 4 * read_network(pa).macs
        onnx.save(build("cnn", {**FAMILIES["cnn"], "downsample": 2, "kernels": 8}), pa)
        convs = read_network(pa).convs()
        assert convs[-1].spec.K == 32 and convs[-1].spec.H == 8


def test_silu_networks_share_the_relu_networks_convs_and_keep_their_names(tmp_path):
    relu, silu = generate("cnn", ["block=plain,residual,separable", "kernels=8", "layers=2",
                                  "activation=relu,silu"], tmp_path)[:2]
    # a name written before the parameter existed still names the same ReLU network
    assert file_name("cnn", relu.params) == ("cnn_layers=2_kernels=8_kernel_size=3_input=32_"
                                             "batch=1_block=plain_downsample=0.onnx")
    assert "_activation=silu" in silu.path.name and silu.params["activation"] == "silu"
    a, b = read_network(relu.path), read_network(silu.path)
    assert [c.spec for c in a.convs()] == [c.spec for c in b.convs()]
    assert {l.op for l in a.layers} & {"Sigmoid", "Mul"} == set()
    # with the same weights, so that pruning finds the same layer sparsities
    import onnx
    from onnx import numpy_helper

    def weights(path):
        return [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer]

    assert all(np.array_equal(u, v) for u, v in zip(weights(relu.path), weights(silu.path)))
    # every Relu became x * sigmoid(x)
    ops = [l.op for l in b.layers]
    assert ops.count("Sigmoid") == ops.count("Mul") == [l.op for l in a.layers].count("Relu")
    # the network model prices the exponentials: one per element of every sigmoid's output
    from dlas_predict.networks.summary import NetworkSummary

    assert NetworkSummary.of(a).exp_elems == 0
    assert NetworkSummary.of(b).exp_elems == sum(int(np.prod(l.output_shape))
                                                 for l in b.layers if l.op == "Sigmoid") > 0
    sess = ort.InferenceSession(str(silu.path))
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    assert np.all(np.isfinite(sess.run(None, {sess.get_inputs()[0].name: x})[0]))
    with pytest.raises(ConfigError, match="relu, silu"):
        parse_grid("cnn", ["activation=gelu"])


def test_residual_blocks_that_downsample_project_their_shortcut(tmp_path):
    plain, down = generate("cnn", ["block=residual", "kernels=8", "layers=2", "input=16",
                                   "downsample=0,1"], tmp_path)
    convs = read_network(down.path).convs()
    # stem 3->8; block 1: 3x3 s2 8->16, 3x3 16->16, shortcut 1x1 s2 8->16; block 2: 16->16
    assert [(c.spec.C, c.spec.K, c.spec.R, c.spec.stride_h, c.spec.H) for c in convs] == [
        (3, 8, 3, 1, 16), (8, 16, 3, 2, 16), (16, 16, 3, 1, 8), (8, 16, 1, 2, 16),
        (16, 16, 3, 1, 8), (16, 16, 3, 1, 8)]
    sess = ort.InferenceSession(str(down.path))
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    assert sess.run(None, {sess.get_inputs()[0].name: x})[0].shape == (1, 10)
    # a residual network that keeps its resolution has no projection
    assert all(c.spec.R == 3 and c.spec.stride_h == 1 for c in read_network(plain.path).convs())


def test_inverted_residual_blocks_expand_filter_depthwise_and_project(tmp_path):
    (m,) = generate("cnn", ["block=inverted", "kernels=8", "layers=3", "input=16",
                            "downsample=1", "kernel_size=5"], tmp_path)
    net = read_network(m.path)
    convs = [(c.spec.C, c.spec.K, c.spec.R, c.spec.stride_h, c.spec.groups, c.spec.H)
             for c in net.convs()]
    # stem; block 1 downsamples (8 -> 16, no shortcut); blocks 2-3 keep 16 at 8x8 and add
    assert convs == [(3, 8, 5, 1, 1, 16),
                     (8, 48, 1, 1, 1, 16), (48, 48, 5, 2, 48, 16), (48, 16, 1, 1, 1, 8),
                     (16, 96, 1, 1, 1, 8), (96, 96, 5, 1, 96, 8), (96, 16, 1, 1, 1, 8),
                     (16, 96, 1, 1, 1, 8), (96, 96, 5, 1, 96, 8), (96, 16, 1, 1, 1, 8)]
    ops = [l.op for l in net.layers]
    assert ops.count("Add") == 2
    # activations after the stem, each expansion and each depthwise: not after a projection
    assert ops.count("Relu") == 1 + 2 * 3
    sess = ort.InferenceSession(str(m.path))
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    assert np.all(np.isfinite(sess.run(None, {sess.get_inputs()[0].name: x})[0]))


def test_squeeze_excitation_gates_the_depthwise_output_and_keeps_old_names(tmp_path):
    plain, se = generate("cnn", ["block=inverted", "kernels=8", "layers=2", "input=16",
                                 "activation=silu", "se=0,1"], tmp_path)
    assert "_se=" not in plain.path.name and se.path.name.endswith("_activation=silu_se=1.onnx")
    a, b = read_network(plain.path), read_network(se.path)
    # each block gains two 1x1 convs on the pooled 1x1 map: 48 -> 8 // 4 -> 48
    added = [(c.spec.C, c.spec.K, c.spec.R, c.spec.H) for c in b.convs()
             if (c.spec.C, c.spec.K, c.spec.R, c.spec.H) not in
             {(d.spec.C, d.spec.K, d.spec.R, d.spec.H) for d in a.convs()}]
    assert added == [(48, 2, 1, 1), (2, 48, 1, 1)] * 2
    ops = [l.op for l in b.layers]
    assert ops.count("GlobalAveragePool") == 2 + 1  # one per block, and the head's
    assert ops.count("Sigmoid") == [l.op for l in a.layers].count("Sigmoid") + 2 * 2
    # the network model prices the per-channel scale's bytes apart from other elementwise ops
    from dlas_predict.networks.summary import NetworkSummary

    scale = [l for l in b.layers if l.op == "Mul" and len(set(l.input_shapes)) > 1]
    assert len(scale) == 2 and all(l.input_shapes[1] == (1, 48, 1, 1) for l in scale)
    assert NetworkSummary.of(b).broadcast_bytes == sum(l.bytes_moved for l in scale) > 0
    assert NetworkSummary.of(a).broadcast_bytes == 0  # x * sigmoid(x) does not broadcast
    sess = ort.InferenceSession(str(se.path))
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    assert np.all(np.isfinite(sess.run(None, {sess.get_inputs()[0].name: x})[0]))
    with pytest.raises(ConfigError, match="se=1 needs block=inverted"):
        parse_grid("cnn", ["se=1"])
    with pytest.raises(ConfigError, match="0 or 1"):
        parse_grid("cnn", ["block=inverted", "se=2"])


def test_a_generated_name_parses_back_to_its_parameters(tmp_path):
    written = generate("cnn", ["block=plain,inverted", "kernels=8", "layers=2",
                               "activation=relu,silu"], tmp_path)
    written += generate("cnn", ["block=inverted", "kernels=8", "se=1"], tmp_path)
    written += generate("fc", ["layers=1", "nodes=32"], tmp_path)
    for m in written:
        assert parse_name(m.path.stem) == (m.family, m.params)
    # names it does not write: a zoo network, a missing parameter, an impossible grid point
    assert parse_name("resnet50") is None
    assert parse_name("cnn_layers=2_kernels=8") is None
    assert parse_name("cnn_layers=2_kernels=8_kernel_size=3_input=32_batch=1_block=plain_"
                      "downsample=3") is None


def test_nasbench201_networks_run_and_have_the_promised_convs_and_macs(tmp_path):
    """Architecture strings round-trip through file names; every cell's convs (5 cells ×
    3 stages), the stem and the two reduction blocks are in the graph, and its MACs are the
    analytic count."""
    from dlas_predict.networks import nasbench201 as nb

    arch = nb.parse_arch("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|"
                         "+|skip_connect~0|nor_conv_1x1~1|none~2|")
    assert nb.parse_arch(arch.code) == arch and nb.parse_arch(arch.file_name) == arch
    empty = nb.parse_arch("nnnnnn")
    written = nb.generate([arch, empty, arch], tmp_path)
    assert len(written) == 2
    for path, a in zip(written, (arch, empty)):
        net = read_network(path)
        convs = [l for l in net.layers if l.kind == "conv"]
        per_cell = sum(op.startswith("nor_conv") for op in a.ops)
        assert len(convs) == 1 + 15 * per_cell + 2 * 3
        assert sum(l.macs for l in net.layers if l.kind in ("conv", "fc")) == nb.arch_macs(a)
        sess = ort.InferenceSession(str(path))
        out = sess.run(None, {"input": np.random.rand(1, 3, 32, 32).astype(np.float32)})[0]
        assert out.shape == (1, 10) and np.isfinite(out).all()
    with pytest.raises(ConfigError, match="allowed: none, skip_connect"):
        nb.parse_arch("|conv_5x5~0|+|none~0|none~1|+|none~0|none~1|none~2|")


def test_the_summary_counts_the_window_reads_of_windowed_pools_only(tmp_path):
    """A NAS-Bench-201 cell's 3×3 average pools read nine inputs per output; its reduction
    blocks' 2×2 pools four; the global pool before the classifier is not a windowed pool."""
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.networks import nasbench201 as nb

    pools = nb.parse_arch("|avg_pool_3x3~0|+|none~0|none~1|+|none~0|none~1|none~2|")
    none = nb.parse_arch("nnnnnn")
    p_path, n_path = nb.generate([pools, none], tmp_path)
    p_net, n_net = read_network(p_path), read_network(n_path)
    windows = sorted({(l.op, l.window) for l in p_net.layers if "Pool" in l.op})
    assert windows == [("AveragePool", 4), ("AveragePool", 9), ("GlobalAveragePool", 0)]
    # the cells' pools: 5 cells × 3 stages of C × H × W outputs (16×32², 32×16², 64×8²)
    cells = 5 * (16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8) * 9
    # each reduction block's shortcut: a 2×2 pool of its input (16×16² and 32×8² outputs)
    shortcuts = (16 * 16 * 16 + 32 * 8 * 8) * 4
    assert NetworkSummary.of(p_net).pool_window_elems == cells + shortcuts
    assert NetworkSummary.of(n_net).pool_window_elems == shortcuts
    # every one of them an average pool: what onnxruntime's QDQ int8 quantizes
    assert NetworkSummary.of(p_net).avgpool_window_elems == cells + shortcuts


def test_the_summary_counts_the_average_pools_reads_apart_from_max_pools(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from dlas_predict.networks.summary import NetworkSummary

    def pool(op, x, y, k):
        return helper.make_node(op, [x], [y], kernel_shape=[k, k], strides=[1, 1],
                                pads=[k // 2] * 4)

    g = helper.make_graph(
        [pool("MaxPool", "x", "m", 3), pool("AveragePool", "m", "a", 5)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8, 6, 6])])
    path = tmp_path / "pools.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    s = NetworkSummary.of(read_network(path))
    assert s.pool_window_elems == 8 * 6 * 6 * (9 + 25)
    assert s.avgpool_window_elems == 8 * 6 * 6 * 25


def test_the_summary_counts_what_attention_s_products_write_and_a_cnn_has_none(tmp_path):
    """QKᵀ writes heads × seq × seq elements and its product with V heads × seq × the
    head's width, in every block; a CNN's layers all have weights."""
    from dlas_predict.networks.summary import NetworkSummary

    [t] = generate("transformer", ["layers=2", "d_model=48", "heads=3", "seq=10"], tmp_path)
    [c] = generate("cnn", ["layers=2", "kernels=8", "input=16"], tmp_path)
    assert NetworkSummary.of(read_network(t.path)).product_out_elems == \
        2 * (3 * 10 * 10 + 3 * 10 * 16)
    assert NetworkSummary.of(read_network(c.path)).product_out_elems == 0


def test_the_summary_counts_the_multiply_adds_products_run_on_narrow_vectors(tmp_path):
    """A head 36 wide: its product with V writes rows of 36, which the generic schedule runs
    on quarter vectors (3 MACs more per MAC); QKᵀ's rows of 16 tokens fill whole vectors."""
    from dlas_predict.networks.summary import NetworkSummary, product_vector

    assert [product_vector(n) for n in (32, 40, 36, 20, 17, 6)] == [16, 8, 4, 4, 16, 1]
    [t] = generate("transformer", ["layers=1", "d_model=72", "heads=2", "seq=16"], tmp_path)
    assert NetworkSummary.of(read_network(t.path)).product_narrow_macs == 2 * 16 * 16 * 36 * 3
    [w] = generate("transformer", ["layers=1", "d_model=64", "heads=2", "seq=16"], tmp_path)
    assert NetworkSummary.of(read_network(w.path)).product_narrow_macs == 0


def test_generate_nasbench201_cli(tmp_path):
    from conftest import assert_clean_error, run_cli

    idx = tmp_path / "archs.txt"
    idx.write_text("# two cells\n|none~0|+|none~0|none~1|+|none~0|none~1|none~2|\nnasbench201-333333.onnx\n")
    r = run_cli("generate", "nasbench201", "--index-file", idx, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "nasbench201-333333.onnx", "nasbench201-nnnnnn.onnx"]
    assert_clean_error(run_cli("generate", "nasbench201", "-o", tmp_path), "--arch STR")
    assert_clean_error(run_cli("generate", "nasbench201", "--arch", "|x~0|", "-o", tmp_path),
                       "not a NAS-Bench-201 architecture")
    assert_clean_error(run_cli("generate", "cnn", "--arch", "333333", "-o", tmp_path),
                       "for nasbench201")


def test_a_conv_says_what_its_output_feeds_and_the_summary_counts_the_joined_ones(tmp_path):
    """A conv whose output (through batch norm and ReLU) reaches a residual add or SiLU's
    gate joins a second tensor or an exponential: the summary counts its MACs apart."""
    from dlas_predict.networks.summary import NetworkSummary

    plain, res, silu = (generate("cnn", ["layers=2", "kernels=8", "input=16", *extra],
                                 tmp_path)[0]
                        for extra in (["block=plain"], ["block=residual"],
                                      ["block=plain", "activation=silu"]))
    plain, res, silu = (read_network(m.path) for m in (plain, res, silu))
    convs = {n.name: [l for l in n.layers if l.conv is not None] for n in (plain, res, silu)}
    summary = {n.name: NetworkSummary.of(n) for n in (plain, res, silu)}
    plain, res, silu = plain.name, res.name, silu.name
    assert all(set(l.feeds) <= {"Conv", "MaxPool", "GlobalAveragePool"} for l in convs[plain])
    assert summary[plain].joined_conv_macs == summary[plain].joined_conv_io_bytes == 0
    # residual: the convs before each add, and the one whose output the add skips to
    joined = [l for l in convs[res] if "Add" in l.feeds]
    assert 0 < len(joined) < len(convs[res])
    assert summary[res].joined_conv_macs == sum(l.macs for l in joined)
    assert summary[res].joined_conv_io_bytes > 0
    # x * sigmoid(x) after every conv: all of them
    assert all({"Sigmoid", "Mul"} <= set(l.feeds) for l in convs[silu])
    assert summary[silu].joined_conv_macs == sum(l.macs for l in convs[silu])
    # onnxruntime's QDQ int8 leaves in float every conv of SiLU's gate, and in the residual
    # network the convs whose input also skips to the add; none of the plain network's
    assert not any(l.qdq_float for l in convs[plain])
    assert summary[plain].qdq_float_conv_macs == 0
    assert all(l.qdq_float for l in convs[silu])
    assert summary[silu].qdq_float_conv_params == sum(l.params for l in convs[silu])
    floats = [l for l in convs[res] if l.qdq_float]
    assert 0 < len(floats) < len(convs[res])
    assert summary[res].qdq_float_conv_macs == sum(l.macs for l in floats)


def _initializers(model) -> dict:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _layer_norm(x, gamma, beta):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * gamma + beta


def test_a_transformer_is_bert_s_encoder_block_and_counts_its_attention(tmp_path):
    """The generated encoder against numpy: attention of two heads, residual adds,
    LayerNormalization, a GELU feed-forward; its MACs are the block's analytic count."""
    from scipy.special import erf

    p = {"layers": 1, "d_model": 8, "heads": 2, "ffn": 2, "seq": 5, "batch": 1}
    model = build("transformer", p)
    x = np.random.default_rng(0).normal(size=(1, 5, 8)).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    w = [v for v in _initializers(model).values() if v.dtype == np.float32 and v.ndim >= 1]
    mats = [a for a in w if a.ndim == 2]
    (wq, wk, wv, wo, w1, w2, wc) = mats
    gammas = [a for a in w if a.ndim == 1 and np.all(a == 1)]
    assert len(gammas) == 2

    def dense(a, m):
        return a @ m  # the biases are zero

    def heads(a):
        return a.reshape(1, 5, 2, 4).transpose(0, 2, 1, 3)

    q, k, v = heads(dense(x, wq)), heads(dense(x, wk)), heads(dense(x, wv))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(4)
    s = np.exp(s - s.max(-1, keepdims=True))
    ctx = (s / s.sum(-1, keepdims=True) @ v).transpose(0, 2, 1, 3).reshape(1, 5, 8)
    h = _layer_norm(x + dense(ctx, wo), 1.0, 0.0)
    f = dense(h, w1)
    f = 0.5 * f * (1 + erf(f / np.sqrt(2)))
    h = _layer_norm(h + dense(f, w2), 1.0, 0.0)
    want = h.mean(1) @ wc.T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    path = tmp_path / "t.onnx"
    import onnx

    onnx.save(build("transformer", {**p, "layers": 2, "d_model": 128, "heads": 4,
                                    "ffn": 4, "seq": 64, "batch": 2}), str(path))
    net = read_network(path)
    d, n, b = 128, 64, 2
    per_block = 4 * n * d * d + 2 * n * n * d + 2 * 4 * n * d * d
    assert net.macs == b * (2 * per_block + d * 10)
    kinds = [layer.kind for layer in net.layers]
    assert kinds.count("matmul") == 2 * 2 and kinds.count("layernorm") == 2 * 2
    qk = next(layer for layer in net.layers if layer.kind == "matmul")
    assert qk.macs == b * 4 * n * n * (d // 4) and qk.params == 0


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_a_recurrent_network_embeds_steps_and_projects_and_counts_its_cells(cell, tmp_path):
    """Token ids through the embedding, the recurrent layers and the projection: the LSTM
    against numpy (ONNX's gate order i, o, f, c); every cell's MACs are seq × gates ×
    hidden × (input + hidden), its parameters its three tensors, the embedding's its table
    and the rows it reads."""
    import onnx

    p = {"layers": 2, "hidden": 6, "embedding": 4, "vocab": 11, "seq": 3, "batch": 2,
         "cell": cell}
    model = build("rnn", p)
    ids = np.array([[1, 4, 10], [0, 2, 3]], dtype=np.int64)
    got = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"input": ids})[0]
    assert got.shape == (3, 2, 11) and np.isfinite(got).all()
    if cell == "lstm":
        w = _initializers(model)
        table = next(v for v in w.values() if v.shape == (11, 4))
        cells = [v for v in w.values() if v.ndim == 3]
        proj = next(v for v in w.values() if v.shape == (6, 11))
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
        x = table[ids].transpose(1, 0, 2)
        for W, R in (cells[0:2], cells[2:4]):
            h, c, ys = np.zeros((2, 6)), np.zeros((2, 6)), []
            for t in range(3):
                g = x[t] @ W[0].T + h @ R[0].T
                i, o, f, cc = np.split(g, 4, axis=1)
                c = sig(f) * c + sig(i) * np.tanh(cc)
                h = sig(o) * np.tanh(c)
                ys.append(h)
            x = np.stack(ys)
        np.testing.assert_allclose(got, x @ proj, rtol=1e-4, atol=1e-5)
    path = tmp_path / "r.onnx"
    onnx.save(model, str(path))
    net = read_network(path)
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell]
    rec = [layer for layer in net.layers if layer.kind == "recurrent"]
    assert [layer.macs for layer in rec] == [2 * 3 * gates * 6 * (4 + 6),
                                             2 * 3 * gates * 6 * (6 + 6)]
    assert rec[0].params == gates * 6 * 4 + gates * 6 * 6 + 2 * gates * 6
    emb = next(layer for layer in net.layers if layer.kind == "embedding")
    assert emb.params == 11 * 4 and emb.bytes_moved == 4 * 2 * (2 * 3 * 4)
    assert net.macs == sum(layer.macs for layer in rec) + 3 * 2 * 6 * 11


def test_the_grid_refuses_a_network_without_convolutions_or_weights_in_one_line(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from conftest import assert_clean_error, run_cli

    [m] = generate("transformer", ["layers=1", "d_model=32", "seq=8"], tmp_path)
    res = run_cli("layers", str(m.path), "--json")
    assert res.exit_code == 0, res.output
    kinds = {layer["kind"] for layer in json.loads(res.output)["layers"]}
    assert {"matmul", "layernorm", "fc", "activation"} <= kinds
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "relu.onnx")
    assert_clean_error(run_cli("recommend", tmp_path / "relu.onnx"), "has no convolution")
