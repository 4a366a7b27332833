"""Measured accuracy: data loading, the fidelity proxy, the elbow rule, and real drops."""
import numpy as np
import pytest

from dlas_predict.compression import accuracy
from dlas_predict.compression import digits
from dlas_predict.compression.accuracy import DataError


def test_digits_split_is_fixed_and_sized():
    tr = digits.digits("train", (3, 32, 32))
    te = digits.digits("test", (1, 16, 16))
    assert len(tr) == 1437 and len(te) == 360
    assert tr.x.shape == (1437, 3, 32, 32) and te.x.shape == (360, 1, 16, 16)
    assert tr.x.min() >= -1 and tr.x.max() <= 1 and set(np.unique(te.y)) == set(range(10))
    assert np.array_equal(te.y, digits.digits("test", (3, 8, 8)).y)


def test_npz_layouts_and_mismatch(tmp_path):
    x = np.random.rand(5, 32, 32, 3).astype(np.float32)  # channels last
    np.savez(tmp_path / "a.npz", images=x, labels=np.arange(5))
    d = accuracy.load_data(str(tmp_path / "a.npz"), (3, 32, 32))
    assert d.x.shape == (5, 3, 32, 32) and accuracy.labelled(d)
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 3, 28, 28), np.float32))
    with pytest.raises(DataError, match="do not match the model input"):
        accuracy.load_data(str(tmp_path / "b.npz"), (3, 32, 32))
    np.savez(tmp_path / "c.npz", x=np.zeros((4, 3, 8, 8), np.float32))
    assert not accuracy.labelled(accuracy.load_data(str(tmp_path / "c.npz"), (3, 8, 8)))
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3, 8, 8), np.float32), y=np.arange(3))
    with pytest.raises(DataError, match="4 images but 3 labels"):
        accuracy.load_data(str(tmp_path / "d.npz"), (3, 8, 8))
    (tmp_path / "e.npz").write_bytes(b"junk")
    with pytest.raises(DataError, match="not a readable"):
        accuracy.load_data(str(tmp_path / "e.npz"), (3, 8, 8))
    with pytest.raises(DataError, match="not found"):
        accuracy.load_data(str(tmp_path / "none.npz"), (3, 8, 8))


def test_image_folder(tmp_path):
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(2):
            Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(
                tmp_path / label / f"{i}.png")
    d = accuracy.load_data(str(tmp_path), (3, 8, 8))
    assert d.x.shape == (4, 3, 8, 8) and list(d.y) == [0, 0, 1, 1]
    assert d.x.min() == -1.0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no images"):
        accuracy.load_data(str(empty), (3, 8, 8))


def test_elbow_rule():
    pts = [(0.1, 0.99), (0.3, 0.985), (0.5, 0.97), (0.7, 0.99), (0.9, 0.2)]
    assert accuracy.elbow(pts, 0.99, 1.0) == 0.3   # first significant drop at 0.5
    assert accuracy.elbow(pts, 0.99, 3.0) == 0.7
    assert accuracy.elbow([(0.1, 0.5)], 0.99) is None


def test_proxy_without_labels(tmp_path):
    x = digits.digits("test", (3, 32, 32)).x[:40]
    np.savez(tmp_path / "u.npz", x=x)
    res = accuracy.measure("zoo:mobilenetv1-cifar", str(tmp_path / "u.npz"))
    assert res.metric == "fidelity_proxy" and res.value == 1.0 and res.reference_top1 is None
    pruned = accuracy.measure("zoo:mobilenetv1-cifar", str(tmp_path / "u.npz"),
                              "weight_pruning", 0.95)
    assert pruned.metric == "fidelity_proxy" and pruned.value < 0.5
    assert pruned.to_dict()["fidelity_proxy"] == pruned.value


@pytest.mark.slow
def test_extreme_pruning_genuinely_drops_and_finetuning_is_refused_on_plain_onnx(tmp_path):
    dense = accuracy.measure("zoo:mobilenetv1-cifar")
    assert dense.metric == "top1" and dense.value >= 0.9
    assert dense.weights.startswith("trained")
    wp = accuracy.measure("zoo:mobilenetv1-cifar", compression="weight_pruning", ratio=0.95)
    cp = accuracy.measure("zoo:mobilenetv1-cifar", compression="channel_pruning", ratio=0.9)
    assert wp.value < 0.5 and cp.value < 0.5
    assert wp.reference_top1 == dense.value
    from dlas_predict.networks import zoo
    from dlas_predict.errors import ConfigError

    with pytest.raises(ConfigError, match="zoo:NAME"):
        accuracy.measure(str(zoo.export("mobilenetv1-cifar")), compression="weight_pruning",
                         ratio=0.5, finetune_epochs=1)


@pytest.mark.slow
def test_int8_reports_before_and_after_calibration():
    res = accuracy.measure("zoo:mobilenetv1-cifar", compression="int8")
    assert res.uncalibrated is not None and res.value >= 0.9
    assert "uncalibrated_top1" in res.to_dict()


def test_the_shipped_curves_load_as_records_and_round_trip():
    import json

    from dlas_predict.compression.accuracy import load_curves
    from dlas_predict.paths import CURVES

    curves = load_curves()
    raw = json.loads(CURVES.read_text())
    assert set(curves) == set(raw) and len(curves) == 4
    for name, c in curves.items():
        assert c.to_dict() == raw[name]
        assert c.accuracy("dense") == raw[name]["dense"]
        r, v = raw[name]["weight_pruning"]["points"][2]
        assert c.accuracy("weight_pruning", r) == v
        assert c.accuracy("weight_pruning", 0.123) is None
    assert "weight_pruning+finetune1" in curves["mobilenetv1-cifar"].pruning
