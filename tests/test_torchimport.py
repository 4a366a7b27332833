"""ONNX graphs as torch modules (dlas_predict.networks.torchimport), checked against
onnxruntime's outputs."""
import numpy as np
import onnx
import pytest

from dlas_predict.networks.generate import FAMILIES, build

torch = pytest.importorskip("torch")


def _ort(path, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _save(tmp_path, family, **params):
    path = tmp_path / f"{family}-{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(build(family, {**FAMILIES[family], **params}), str(path))
    return path


@pytest.mark.parametrize("family,params", [
    ("cnn", dict(layers=2, kernels=8, block="residual", downsample=1)),
    ("cnn", dict(layers=2, kernels=8, block="inverted", activation="silu", se=1)),
    ("cnn", dict(layers=2, kernels=8, block="separable")),
    ("fc", dict(layers=2, nodes=32, input=64)),
])
def test_an_imported_graph_computes_what_onnxruntime_computes(tmp_path, family, params):
    from dlas_predict.networks.torchimport import import_onnx, input_shape

    path = _save(tmp_path, family, **params)
    shape = input_shape(path)
    x = np.random.default_rng(0).normal(size=(1, *shape)).astype(np.float32)
    with torch.no_grad():
        got = import_onnx(path)(torch.from_numpy(x)).numpy()
    ref = _ort(path, x)
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_a_nasbench201_cell_imports_and_exports_back_to_the_same_function(tmp_path):
    """A cell's pools, skips and convs; the module written back by the zoo's exporter
    computes the same."""
    from dlas_predict.networks import nasbench201 as nb
    from dlas_predict.networks.torchimport import import_onnx, input_shape
    from dlas_predict.networks.zoo import export_model

    arch = "|nor_conv_3x3~0|+|nor_conv_1x1~0|avg_pool_3x3~1|+|skip_connect~0|none~1|" \
           "nor_conv_3x3~2|"
    (path,) = nb.generate([nb.parse_arch(arch)], tmp_path)
    module = import_onnx(path)
    x = np.random.default_rng(1).normal(size=(1, *input_shape(path))).astype(np.float32)
    back = export_model(module, input_shape(path), tmp_path / "back.onnx")
    ref = _ort(path, x)
    assert np.abs(_ort(back, x) - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_inserted_norms_change_nothing_in_eval_mode_and_pair_with_their_convs(tmp_path):
    """A batch norm after each convolution, set from the conv's output statistics: the
    network computes the same in eval mode, and pruning sees each conv with its norm."""
    from dlas_predict.networks.torchimport import import_onnx
    from dlas_predict.networks.torchmodels import conv_bn_pairs

    path = _save(tmp_path, "cnn", layers=3, kernels=8, block="residual")
    module = import_onnx(path)
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(8, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        before = module(x).numpy()
        added = module.insert_norms(x)
        after = module(x).numpy()
    pairs = conv_bn_pairs(module)
    assert added == len(pairs) > 0 and all(bn is not None for _, bn in pairs)
    assert not any(bn.training for _, bn in pairs)
    assert np.abs(after - before).max() <= 1e-4 * max(1.0, np.abs(before).max())


def test_an_unsupported_operator_or_input_is_one_clear_error(tmp_path):
    from dlas_predict.errors import NetworkError
    from dlas_predict.networks.torchimport import import_onnx

    with pytest.raises(NetworkError, match="cannot run .*LayerNormalization.* in torch"):
        import_onnx(_save(tmp_path, "transformer", layers=1, d_model=32, heads=2, seq=8))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(NetworkError, match="not a readable ONNX model"):
        import_onnx(bad)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_padded_convs_and_pools_as_keras_exports_write_them(tmp_path, mode):
    from onnx import TensorProto, helper, numpy_helper

    from dlas_predict.networks.torchimport import import_onnx

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.normal(size=(6, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad=mode, strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["y"], auto_pad=mode, kernel_shape=[2, 2],
                              strides=[2, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 9, 10])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [w])
    path = tmp_path / "auto.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime reads
    onnx.save(model, str(path))
    x = rng.normal(size=(1, 3, 9, 10)).astype(np.float32)
    with torch.no_grad():
        got = import_onnx(path)(torch.from_numpy(x)).numpy()
    ref = _ort(path, x)
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
