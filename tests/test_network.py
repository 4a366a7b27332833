import numpy as np
import pytest

from conftest import DEMO
from dlas_predict.errors import NetworkError
from dlas_predict.networks.graph import conv_layers, unique_specs


def test_demo_network_layers():
    layers = conv_layers(DEMO)
    assert [l.name for l in layers][:3] == ["conv1", "block1.conv_a", "block1.conv_b"]
    assert len(layers) == 7 and len(unique_specs(layers)) == 6
    dw = next(l for l in layers if l.name == "dw1").spec
    assert dw.depthwise and (dw.C, dw.H, dw.W) == (64, 16, 16)
    assert next(l for l in layers if l.name == "down1").spec.OH == 16


def test_missing_malformed_and_truncated_files(tmp_path):
    with pytest.raises(NetworkError, match="not found"):
        conv_layers(tmp_path / "nope.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\xffnot a protobuf at all" * 10)
    with pytest.raises(NetworkError):
        conv_layers(junk)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(DEMO.read_bytes()[:2000])
    with pytest.raises(NetworkError):
        conv_layers(cut)


def test_demo_graph_has_every_op_with_shapes_and_costs():
    from dlas_predict.networks.graph import read_network

    net = read_network(DEMO)
    kinds = [l.kind for l in net.layers]
    assert kinds.count("conv") + kinds.count("depthwise_conv") == 7
    assert {"activation", "elementwise", "global_pool", "fc"} <= set(kinds)
    conv = net.layers[0]
    assert conv.conv is not None and conv.output_shape == conv.conv.output_shape
    assert conv.macs == conv.conv.macs
    assert conv.params in (conv.conv.params, conv.conv.params + conv.conv.K)  # bias or not
    add = next(l for l in net.layers if l.kind == "elementwise")
    assert len(add.input_shapes) == 2 and add.macs == 0 and add.params == 0
    assert add.bytes_moved == 4 * 3 * int(np.prod(add.output_shape))
    t = net.totals()
    assert t["params"] == sum(l.params for l in net.layers) and t["macs"] == net.macs
    d = net.to_dict()
    assert set(d) == {"network", "input_shape", "layers", "totals"}
    assert d["layers"][0]["conv"] == conv.conv.to_spec()


def test_unsupported_op_is_named(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from dlas_predict.networks.graph import read_network

    node = helper.make_node("LpNormalization", ["x"], ["y"], name="norm7")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "lp.onnx"
    onnx.save(helper.make_model(g), str(path))
    with pytest.raises(NetworkError, match="unsupported op 'LpNormalization'.*norm7"):
        read_network(path)


def test_weights_saved_as_external_data_are_read_from_beside_the_file(tmp_path):
    import onnx

    from dlas_predict.compression.compress import pruned_sparsities
    from dlas_predict.networks.graph import read_proto

    m = onnx.load(str(DEMO))
    path = tmp_path / "demo.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="demo.weights", size_threshold=0)
    assert (tmp_path / "demo.weights").stat().st_size > 1000
    back = read_proto(path)
    w0 = next(t for t in back.graph.initializer if len(t.dims) == 4)
    assert w0.HasField("raw_data") and len(w0.raw_data) == 4 * int(np.prod(w0.dims))
    assert [l.spec for l in conv_layers(path)] == [l.spec for l in conv_layers(DEMO)]
    grid = {"weight_pruning": [0.5]}
    assert pruned_sparsities(str(path), grid) == pruned_sparsities(str(DEMO), grid)


def test_a_network_read_once_is_read_again_from_the_cache_until_its_file_changes(
        tmp_path, monkeypatch):
    """The second read of an unchanged file parses no ONNX and gives an equal network; a
    changed file, a damaged cache entry or another name is read from the file again."""
    import os
    import shutil

    from dlas_predict.networks import graph
    from dlas_predict.paths import cache_dir

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    path = tmp_path / "net.onnx"
    shutil.copy(DEMO, path)
    first = graph.read_network(path)
    real = graph.load_onnx
    calls = []
    monkeypatch.setattr(graph, "load_onnx", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = graph.read_network(path)
    assert again == first and again is not first and calls == []
    assert graph.read_network(path, "other").name == "other" and len(calls) == 1
    for entry in cache_dir("networks").glob("*.pkl"):
        entry.write_bytes(b"damaged")
    assert graph.read_network(path) == first and len(calls) == 2
    # a different network under the same path and size: read again for its new mtime
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert graph.read_network(path) == first and len(calls) == 3
    path.write_bytes(DEMO.read_bytes()[:2000])  # truncated since: an error, not the cache
    with pytest.raises(NetworkError):
        graph.read_network(path)
