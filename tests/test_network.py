import pytest

from conftest import DEMO
from dlas_predict.errors import NetworkError
from dlas_predict.network import conv_layers, unique_specs


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
