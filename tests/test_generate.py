"""ParaDnn-style generator: grids, names, valid ONNX, and the shapes it promises."""
import numpy as np
import onnxruntime as ort
import pytest

from dlas_predict.errors import ConfigError
from dlas_predict.generate import FAMILIES, build, file_name, generate, parse_grid
from dlas_predict.network import read_network


def test_grid_is_the_cross_product_with_defaults():
    grid = parse_grid("cnn", ["layers=2,4", "kernels=16,32,64"])
    assert len(grid) == 6
    assert {(p["layers"], p["kernels"]) for p in grid} == {(l, k) for l in (2, 4)
                                                           for k in (16, 32, 64)}
    assert all(p["kernel_size"] == FAMILIES["cnn"]["kernel_size"] for p in grid)


@pytest.mark.parametrize("items, needle", [
    (["width=3"], "allowed: layers"), (["layers=0"], "at least 1"), (["layers=a"], "integer"),
    (["block=dense"], "plain, residual, separable"), (["layers"], "NAME=V1"),
    (["kernel_size=9", "input=8"], "exceeds"), (["layers=2", "layers=3"], "twice"),
])
def test_bad_params(items, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_grid("cnn", items)
    with pytest.raises(ConfigError, match="known: fc, cnn"):
        parse_grid("rnn", [])


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
