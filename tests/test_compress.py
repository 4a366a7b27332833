"""Compression: global masks, per-layer sparsity, channel removal, float16 and int8."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dlas_predict.compression import accuracy
from dlas_predict.compression import compress
from dlas_predict.space.config import Compression
from dlas_predict.errors import ConfigError
from dlas_predict.networks.graph import read_network


def _chain_model(bias_zero: bool = True, seed: int = 0):
    """conv3x3(3→16) → relu → depthwise3x3 → relu → conv1x1(16→8) → relu → conv3x3(8→6)
    → GAP → flatten → gemm(6→4)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv(x, name, cin, cout, k, groups=1):
        w = const(f"{name}.w", rng.normal(0, 0.3, (cout, cin // groups, k, k)))
        b = const(f"{name}.b", np.zeros(cout) if bias_zero else rng.normal(0, 0.1, cout))
        nodes.append(helper.make_node("Conv", [x, w, b], [name], name=name, group=groups,
                                      kernel_shape=[k, k], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [name], [name + ".r"], name=name + ".relu"))
        return name + ".r"

    x = conv("input", "c1", 3, 16, 3)
    x = conv(x, "dw", 16, 16, 3, groups=16)
    x = conv(x, "pw", 16, 8, 1)
    x = conv(x, "c3", 8, 6, 3)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flat"))
    nodes.append(helper.make_node("Gemm", ["flat", const("fc.w", rng.normal(0, 0.3, (4, 6))),
                                           const("fc.b", np.zeros(4))], ["logits"],
                                  name="fc", transB=1))
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                             [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             [1, 4])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _run(model, x):
    return accuracy.onnx_session(model).run(None, {"input": x})[0]


def test_weight_masks_prune_exactly_the_smallest_globally():
    rng = np.random.default_rng(1)
    ws = [rng.normal(0, s, (8, 4, 3, 3)) for s in (0.1, 1.0)]
    masks = compress.weight_masks(ws, 0.5)
    flat = np.concatenate([w.ravel() for w in ws])
    assert sum(int((~m).sum()) for m in masks) == flat.size // 2
    kept_min = min(np.abs(w[m]).min() for w, m in zip(ws, masks))
    pruned_max = max(np.abs(w[~m]).max() for w, m in zip(ws, masks))
    assert pruned_max <= kept_min
    # global: the small-scale layer is pruned far more than the large one
    assert (~masks[0]).mean() > 0.8 and (~masks[1]).mean() < 0.2
    ties = [np.ones((4, 4))]
    assert int((~compress.weight_masks(ties, 0.25)[0]).sum()) == 4


def test_channel_masks_global_with_floor_and_frozen_layers():
    ws = [np.ones((4, 2, 1, 1)) * 0.01, np.ones((6, 2, 1, 1)), np.ones((3, 1, 3, 3)) * 1e-4]
    keep = compress.channel_masks(ws, 0.5, prunable=[True, True, False])
    assert keep[0].sum() == 1          # pruned first (smallest), but one channel stays
    assert keep[1].sum() == 6 - (5 - 3)  # 5 = half of the 10 prunable channels
    assert keep[2].all()               # depthwise: untouched despite tiny weights
    with pytest.raises(ConfigError):
        compress.channel_masks(ws, 1.0)


def test_pruned_onnx_records_each_layers_sparsity():
    m = _chain_model()
    c = compress.compress_onnx(m, "weight_pruning", 0.6)
    assert abs(c.sparsity - 0.6) < 0.01
    assert len({round(l.sparsity, 2) for l in c.layers}) > 1  # uneven: global pruning
    back = compress.layer_sparsity(c.model)
    assert [l.sparsity for l in back] == [l.sparsity for l in c.layers]
    cp = compress.compress_onnx(m, "channel_pruning", 0.5)
    dw = next(l for l in cp.layers if l.spec.depthwise)
    assert dw.channels_kept == dw.channels == 16
    with pytest.raises(ConfigError, match="ratio"):
        compress.compress_onnx(m, "weight_pruning")
    with pytest.raises(ConfigError, match="takes no ratio"):
        compress.compress_onnx(m, "float16", 0.5)


@pytest.mark.parametrize("bias_zero", [True, False])
def test_removing_zeroed_channels(bias_zero):
    m = _chain_model(bias_zero)
    zeroed = compress.compress_onnx(m, "channel_pruning", 0.4).model
    removed, n_removed, kept = compress.remove_zero_channels(zeroed)
    onnx.checker.check_model(removed)
    assert n_removed > 0 and kept == 0
    x = np.random.default_rng(2).normal(size=(1, 3, 12, 12)).astype(np.float32)
    a, b = _run(zeroed, x), _run(removed, x)
    if bias_zero:  # zero constants: removal is exact
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    else:  # constants folded; only the padded borders differ, by a few % of the output
        assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
    import tempfile, os

    with tempfile.TemporaryDirectory() as d:
        pa, pb = os.path.join(d, "a.onnx"), os.path.join(d, "b.onnx")
        onnx.save(zeroed, pa)
        onnx.save(removed, pb)
        assert read_network(pb).macs < read_network(pa).macs


def test_residual_channels_stay_zeroed(tmp_path):
    from dlas_predict.networks.generate import FAMILIES, build

    m = build("cnn", {**FAMILIES["cnn"], "block": "residual", "kernels": 8, "layers": 2})
    zeroed = compress.compress_onnx(m, "channel_pruning", 0.5).model
    _, n_removed, kept = compress.remove_zero_channels(zeroed)
    assert kept > 0  # the stem and second convs feed additions


@pytest.mark.parametrize("family,spec,removable", [
    ("fc", ["layers=2", "nodes=64", "input=48"], True),            # Gemm → ReLU → Gemm
    ("transformer", ["d_model=32", "heads=2", "seq=8"], True),     # the FFN's GELU
    ("rnn", ["hidden=16", "embedding=8", "vocab=50", "seq=4"], False),  # gates tied
])
def test_a_matrix_network_s_zeroed_neurons_are_removed_exactly(tmp_path, family, spec,
                                                                 removable):
    """The grid form of a matrix network (its fully connected layers as 1×1 convs between
    reshapes), channel-pruned with non-zero biases: the hidden neurons of an MLP and of a
    transformer's feed-forward block are removed, each one's constant output (ReLU or GELU
    of its bias) folded into the next layer's bias, and the network computes what the
    zeroed one does; a recurrent cell's gates are tied and stay zeroed."""
    from dlas_predict.networks import generate as gen, zoo

    path = gen.generate(family, spec, tmp_path)[0].path
    grid = onnx.load(str(zoo.resolve(path)))
    rng = np.random.default_rng(0)
    for t in grid.graph.initializer:  # biases the fold must carry
        a = numpy_helper.to_array(t)
        if a.ndim == 1 and a.dtype == np.float32 and a.size > 1 and not np.any(a):
            t.CopyFrom(numpy_helper.from_array(rng.normal(0, 0.5, a.shape).astype(
                np.float32), t.name))
    zeroed = compress.compress_onnx(grid, "channel_pruning", 0.6).model
    removed, n_removed, kept = compress.remove_zero_channels(zeroed)
    onnx.checker.check_model(removed)
    assert (n_removed > 0) == removable and kept > 0
    import onnxruntime as ort

    sess = [ort.InferenceSession(m.SerializeToString()) for m in (zeroed, removed)]
    inp = sess[0].get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = rng.integers(0, 50, shape) if "int" in inp.type else \
        rng.normal(size=shape).astype(np.float32)
    a, b = (s.run(None, {s.get_inputs()[0].name: x})[0] for s in sess)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(a).max())
    if removable:
        before = sum(numpy_helper.to_array(t).size for t in zeroed.graph.initializer)
        after = sum(numpy_helper.to_array(t).size for t in removed.graph.initializer)
        assert after < 0.8 * before


def test_float16_and_int8():
    m = _chain_model(False)
    x = np.random.default_rng(3).normal(size=(8, 3, 12, 12)).astype(np.float32)
    ref = np.stack([_run(m, x[i:i + 1])[0] for i in range(len(x))])
    half = compress.compress_onnx(m, "float16")
    out = np.stack([_run(half.model, x[i:i + 1])[0] for i in range(len(x))])
    assert 0 < np.abs(out - ref).max() < 1e-2 * np.abs(ref).max()
    q = compress.compress_onnx(m, "int8", calibration=x)
    assert any(n.op_type == "QuantizeLinear" for n in q.model.graph.node)
    outq = np.stack([_run(q.model, x[i:i + 1])[0] for i in range(len(x))])
    assert np.abs(outq - ref).max() < 0.2 * np.abs(ref).max()
    with pytest.raises(ConfigError, match="calibration"):
        compress.compress_onnx(m, "int8")


def test_torch_masks_hold_while_training():
    import torch

    from dlas_predict.networks import torchmodels
    from dlas_predict.compression import training

    net = torchmodels.build("mobilenetv1-cifar")
    reapply = compress.torch_masks(net, Compression.WEIGHT_PRUNING, 0.8)
    x = np.random.default_rng(0).normal(size=(16, 3, 32, 32)).astype(np.float32)
    y = np.arange(16) % 10
    training.train(net, x, y, 1, batch_size=8, after_step=reapply)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    zeros = sum(int((c.weight == 0).sum()) for c in convs)
    total = sum(c.weight.numel() for c in convs)
    assert abs(zeros / total - 0.8) < 0.01


def test_aliased_weights_are_inlined():
    """Exporters alias repeated constants (e.g. two layers pruned to all zeros) through
    Identity; every conv must still have its own weights and sparsity."""
    m = _chain_model()
    w = next(i for i in m.graph.initializer if i.name == "pw.w")
    zero = numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(w)), "pw.w")
    w.CopyFrom(zero)
    pw = next(n for n in m.graph.node if n.name == "pw")
    m.graph.node.insert(0, helper.make_node("Identity", ["pw.w"], ["pw.alias"]))
    pw.input[1] = "pw.alias"
    layers = compress.layer_sparsity(m)
    assert len(layers) == 4 and layers[2].sparsity == 1.0
    c = compress.compress_onnx(m, "weight_pruning", 0.5)
    assert len(c.layers) == 4


def test_the_removal_note_gives_back_its_count():
    from dlas_predict.compression.compress import removal_note, removed_channels

    assert removed_channels(removal_note(254, 322)) == 254
    assert removed_channels(removal_note(0, 1008)) == 0
    assert removed_channels("int8: calibrated on generated inputs") is None
