"""The model zoo: the study's eight networks at their published size, shipped weights that
really classify digits, and export."""
import json

import numpy as np
import pytest

from dlas_predict.compression import accuracy
from dlas_predict.networks import zoo
from dlas_predict.errors import NetworkError
from dlas_predict.networks.graph import read_network

# The study's Tables 2 and 5.
PAPER = {
    "resnet18-cifar": (11.2e6, 557e6), "mobilenetv1-cifar": (3.2e6, 48e6),
    "mobilenetv2-cifar": (2.3e6, 98e6), "vgg16-cifar": (14.7e6, 314e6),
    "resnet50": (25.6e6, 4.1e9), "densenet161": (27.7e6, 7.8e9),
    "efficientnet-b0": (5.3e6, 415e6), "mobilenetv2": (3.5e6, 327e6),
}


#: The largest ImageNet networks take seconds each to build in torch: the full suite checks them.
_BIG = {"resnet50", "densenet161"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _BIG else n
                                  for n in PAPER])
def test_params_and_macs_match_the_paper_within_10_percent(name):
    net = read_network(zoo.export(name))
    params, macs = PAPER[name]
    assert abs(net.params / params - 1) <= 0.10, (name, net.params)
    assert abs(net.macs / macs - 1) <= 0.10, (name, net.macs)
    assert net.input_shape == (1, *zoo.get(name).input_shape)
    assert zoo.ZOO[name].paper_params == params and zoo.ZOO[name].paper_macs == macs


def test_unknown_name_lists_the_zoo():
    with pytest.raises(NetworkError, match="resnet18-cifar"):
        zoo.get("resnet19")
    with pytest.raises(NetworkError, match="zoo:NAME"):
        zoo.resolve("resnet50")  # a bare zoo name that is not a file: hint at zoo:


#: The three largest CIFAR-10 networks take seconds each to classify 360 images: the full
#: suite checks them.
_BIG_CIFAR = {"resnet18-cifar", "vgg16-cifar", "vit-tiny-cifar"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _BIG_CIFAR
                                  else n for n, e in zoo.ZOO.items() if e.dataset == "cifar10"])
def test_shipped_weights_classify_held_out_digits(name):
    entry = zoo.get(name)
    assert entry.trained, f"{entry.weights_path} is missing"
    test = accuracy.load_data("digits", entry.input_shape)
    assert len(test) == 360
    assert accuracy.evaluate_onnx(zoo.export(name), test) >= 0.90
    log = json.loads((zoo.WEIGHTS_DIR / "trained.json").read_text())
    assert log[name]["top1"] >= 0.90


def test_weights_round_trip(tmp_path):
    import torch

    from dlas_predict.networks import torchmodels

    model = torchmodels.build("mobilenetv1-cifar")
    zoo.save_weights(model, tmp_path / "w.npz.xz")
    back = torchmodels.build("mobilenetv1-cifar")
    for p in back.parameters():
        torch.nn.init.zeros_(p)
    zoo.load_weights(back, tmp_path / "w.npz.xz")
    for (k, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        a, b = a.float().numpy(), b.float().numpy()
        # 8-bit per-channel storage: within half a step of each channel's scale
        step = np.abs(a).reshape(len(a), -1).max(1) / 127 if a.ndim in (2, 4) else 0
        tol = (np.reshape(step, (-1,) + (1,) * (a.ndim - 1)) / 2 + 1e-7) if a.ndim in (2, 4) \
            else 0
        assert np.all(np.abs(a - b) <= tol), k
    bad = tmp_path / "bad.npz.xz"
    bad.write_bytes(b"not xz")
    with pytest.raises(NetworkError, match="unreadable"):
        zoo.load_weights(back, bad)
    with pytest.raises(NetworkError, match="does not fit"):
        zoo.load_weights(torchmodels.build("vgg16-cifar"), tmp_path / "w.npz.xz")


def test_export_copy_is_cached_model(tmp_path):
    out = zoo.export("zoo:mobilenetv1-cifar", tmp_path / "sub" / "m.onnx")
    assert out.read_bytes() == zoo.export("mobilenetv1-cifar").read_bytes()


def test_weights_are_decoded_once_and_each_model_gets_its_own_copy(tmp_path):
    import torch

    def small(width=8):
        return torch.nn.Sequential(torch.nn.Conv2d(3, width, 3), torch.nn.BatchNorm2d(width))

    path = tmp_path / "w.npz.xz"
    zoo.save_weights(small(), path)
    first, second = small(), small()
    zoo.load_weights(first, path)
    before = zoo._decoded_weights.cache_info().hits
    zoo.load_weights(second, path)
    assert zoo._decoded_weights.cache_info().hits == before + 1
    with torch.no_grad():
        for p in first.parameters():
            p.zero_()  # pruning one model in place must not reach the other, or the cache
    zoo.load_weights(first, path)
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    assert any(p.abs().sum() > 0 for p in first.parameters())
    # A file written again is decoded again.
    zoo.save_weights(small(16), path)
    zoo.load_weights(small(16), path)
    with pytest.raises(NetworkError, match="does not fit"):
        zoo.load_weights(small(8), path)


@pytest.mark.slow
def test_an_exported_zoo_network_is_known_by_its_weights_under_any_name(tmp_path):
    """The shipped weight fingerprints are those of today's exports, and a copy of an export
    under another name (what `export` writes for a user) is matched to its zoo network."""
    import json

    from dlas_predict.networks import zoo
    from dlas_predict.paths import DEMO_NETWORK

    shipped = json.loads(zoo.FINGERPRINTS.read_text())
    assert shipped["export"] == zoo.EXPORT_VERSION
    trained = {e.name for e in zoo.ZOO.values() if e.trained}
    assert set(shipped["networks"]) == trained
    for name, sig in shipped["networks"].items():
        assert zoo.same_weights(zoo.weights_signature(zoo.export(name)), sig), name
    copy = zoo.export("mobilenetv2-cifar", tmp_path / "my-model.onnx")
    assert zoo.match(copy).name == "mobilenetv2-cifar"
    assert zoo.match(DEMO_NETWORK) is None


def _rewritten(src, out, change):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(change(a), init.name))
    onnx.save(model, str(out))
    return out


def test_an_export_rounded_otherwise_is_matched_and_retrained_weights_are_not(tmp_path):
    """Another CPU folds batch norms with other roundings: weights a few units in the last
    place away are the same network; weights scaled by 1 % (a fine-tuned copy) are not."""
    from dlas_predict.networks import zoo

    src = zoo.export("resnet18-cifar")
    rng = np.random.default_rng(0)

    def ulps(a):
        steps = rng.integers(-3, 4, a.shape).astype(np.float32)
        return (a + steps * np.spacing(a)).astype(np.float32)

    assert zoo.match(_rewritten(src, tmp_path / "rounded.onnx", ulps)).name == "resnet18-cifar"
    scaled = _rewritten(src, tmp_path / "tuned.onnx", lambda a: (a * 1.01).astype(np.float32))
    assert zoo.match(scaled) is None


@pytest.mark.parametrize("name", [n for n, e in zoo.ZOO.items() if e.family != "cnn"])
def test_the_members_beyond_cnns_reach_the_grid_as_matrix_networks(name):
    """Their fully connected layers and recurrent products are 1×1 convs of the grid form,
    which computes what the export computes; the study published no size for them."""
    import onnxruntime as ort

    from dlas_predict.networks.matrix import is_matrix_layer

    entry = zoo.get(name)
    assert entry.paper_params is None and entry.paper_macs is None
    assert not entry.pruned_in_torch
    original, grid = zoo.resolve(f"zoo:{name}", grid=False), zoo.resolve(f"zoo:{name}")
    assert grid != original
    net = read_network(grid)
    matrix = [c for c in net.convs() if is_matrix_layer(c.name)]
    assert len(matrix) >= len(net.convs()) - 1  # a ViT's patch embedding stays a conv
    assert not any(layer.kind == "recurrent" for layer in net.layers)
    x = accuracy.load_data("digits", entry.input_shape).x[:2]
    outs = []
    for path in (original, grid):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs.append(np.concatenate([sess.run(None, {"input": x[i:i + 1]})[0]
                                    for i in range(len(x))]))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-3, atol=1e-4)
