"""Measured accuracy: data loading, the fidelity proxy, the elbow rule, and real drops."""
from dataclasses import replace

import numpy as np
import pytest

from dlas_predict.networks import zoo
from dlas_predict.compression import accuracy
from dlas_predict.compression import digits
from dlas_predict.compression import data as datasets
from dlas_predict.compression.data import DataError, DataOptions


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
    d = datasets.load_data(str(tmp_path / "a.npz"), (3, 32, 32))
    assert d.x.shape == (5, 3, 32, 32) and datasets.labelled(d)
    np.savez(tmp_path / "b.npz", x=np.zeros((4, 3, 28, 28), np.float32))
    with pytest.raises(DataError, match="do not match the model input"):
        datasets.load_data(str(tmp_path / "b.npz"), (3, 32, 32))
    np.savez(tmp_path / "c.npz", x=np.zeros((4, 3, 8, 8), np.float32))
    assert not datasets.labelled(datasets.load_data(str(tmp_path / "c.npz"), (3, 8, 8)))
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3, 8, 8), np.float32), y=np.arange(3))
    with pytest.raises(DataError, match="4 images but 3 labels"):
        datasets.load_data(str(tmp_path / "d.npz"), (3, 8, 8))
    (tmp_path / "e.npz").write_bytes(b"junk")
    with pytest.raises(DataError, match="not a readable"):
        datasets.load_data(str(tmp_path / "e.npz"), (3, 8, 8))
    with pytest.raises(DataError, match="not found"):
        datasets.load_data(str(tmp_path / "none.npz"), (3, 8, 8))


def test_image_folder(tmp_path):
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / label).mkdir()
        for i in range(2):
            Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(
                tmp_path / label / f"{i}.png")
    d = datasets.load_data(str(tmp_path), (3, 8, 8))
    assert d.x.shape == (4, 3, 8, 8) and list(d.y) == [0, 0, 1, 1]
    assert d.x.min() == -1.0
    empty = tmp_path / "empty"
    (empty / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no images"):
        datasets.load_data(str(empty), (3, 8, 8))


def test_elbow_rule():
    pts = [(0.1, 0.99), (0.3, 0.985), (0.5, 0.97), (0.7, 0.99), (0.9, 0.2)]
    assert accuracy.elbow(pts, 0.99, 1.0) == 0.3   # first significant drop at 0.5
    assert accuracy.elbow(pts, 0.99, 3.0) == 0.7
    assert accuracy.elbow([(0.1, 0.5)], 0.99) is None


@pytest.mark.slow
def test_proxy_without_labels(tmp_path):
    x = digits.digits("test", (3, 32, 32)).x[:40]
    np.savez(tmp_path / "u.npz", x=x)
    res = accuracy.measure("zoo:mobilenetv1-cifar", str(tmp_path / "u.npz"))
    assert res.metric == "fidelity_proxy" and res.value == 1.0 and res.reference_top1 is None
    pruned = accuracy.measure("zoo:mobilenetv1-cifar", str(tmp_path / "u.npz"),
                              "weight_pruning", 0.95)
    assert pruned.metric == "fidelity_proxy" and pruned.value < 0.5
    assert pruned.to_dict()["fidelity_proxy"] == pruned.value


def test_fine_tuning_splits_other_data_into_two_seeded_halves():
    d = digits.digits("test", (1, 8, 8))
    tune, held = datasets.split_for_finetune(d)
    assert len(tune) == 180 and len(held) == 180 and "fine-tuning half" in tune.name
    both = np.concatenate([tune.x, held.x]).reshape(360, -1)
    assert len(np.unique(both, axis=0)) == len(np.unique(d.x.reshape(360, -1), axis=0))
    again = datasets.split_for_finetune(d)[0]
    assert np.array_equal(again.x, tune.x) and np.array_equal(again.y, tune.y)
    with pytest.raises(DataError, match="labelled"):
        datasets.split_for_finetune(replace(d, y=np.full(360, -1)))


@pytest.mark.slow
def test_a_plain_onnx_file_is_fine_tuned_through_the_importer(tmp_path):
    """A pruned ONNX file with no zoo definition is fine-tuned as a torch module: its masks
    held (the exported weights keep the pruned share of zeros), its weights moved by the
    training, and the record says how."""
    import onnx
    from onnx import numpy_helper

    from dlas_predict.networks.generate import FAMILIES, build

    path = tmp_path / "small.onnx"
    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 8}), str(path))
    data = digits.digits("train", (3, 32, 32))
    few = replace(data, name="digits-few", x=data.x[:96], y=data.y[:96])
    pruned = accuracy.prepare(str(path), "weight_pruning", 0.8)
    tuned = accuracy.prepare(str(path), "weight_pruning", 0.8, finetune_epochs=1,
                             finetune_data=few)
    note = next(n for n in tuned.compressed.notes if n.startswith("fine-tuned"))
    assert "digits-few (96 images)" in note and "imported into torch" in note

    def convs(model):
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        return [inits[n.input[1]] for n in model.graph.node if n.op_type == "Conv"]

    for a, b in zip(convs(tuned.compressed.model), convs(pruned.compressed.model)):
        assert np.array_equal(a == 0, b == 0)  # the same global criterion, masks held
    sparsity = np.mean(np.concatenate([(w == 0).ravel() for w in
                                       convs(tuned.compressed.model)]))
    assert sparsity == pytest.approx(0.8, abs=0.02)
    assert any(not np.allclose(a, b) for a, b in zip(convs(tuned.compressed.model),
                                                    convs(pruned.compressed.model)))


@pytest.mark.slow
def test_extreme_pruning_genuinely_drops_and_an_exported_zoo_file_is_pruned_as_the_zoo(
        tmp_path):
    dense = accuracy.measure("zoo:mobilenetv1-cifar")
    assert dense.metric == "top1" and dense.value >= 0.9
    assert dense.weights.startswith("trained")
    wp = accuracy.measure("zoo:mobilenetv1-cifar", compression="weight_pruning", ratio=0.95)
    cp = accuracy.measure("zoo:mobilenetv1-cifar", compression="channel_pruning", ratio=0.9)
    assert wp.value < 0.5 and cp.value < 0.5
    assert wp.reference_top1 == dense.value
    from dlas_predict.networks import zoo

    prep = accuracy.prepare(str(zoo.export("mobilenetv1-cifar", tmp_path / "mine.onnx")),
                            "weight_pruning", 0.5)
    assert prep.name == "mine" and any("holds zoo:mobilenetv1-cifar's weights" in n
                                       for n in prep.compressed.notes)


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
    assert set(curves) == set(raw) == {n for n, e in zoo.ZOO.items() if e.trained}
    for name, c in curves.items():
        assert c.to_dict() == raw[name]
        assert c.accuracy("dense") == raw[name]["dense"]
        r, v = raw[name]["weight_pruning"]["points"][2]
        assert c.accuracy("weight_pruning", r) == v
        assert c.accuracy("weight_pruning", 0.123) is None
    assert "weight_pruning+finetune1" in curves["mobilenetv1-cifar"].pruning


def _images(folder, n, value=0):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(np.full((10, 12, 3), value + i, np.uint8)).save(folder / f"{i}.png")


def test_a_folder_without_class_subfolders_is_refused(tmp_path):
    _images(tmp_path / "flat", 2)
    with pytest.raises(DataError, match="no class subfolders.*2 loose images"):
        datasets.load_data(str(tmp_path / "flat"), (3, 8, 8))


def test_undecodable_images_are_skipped_and_counted(tmp_path):
    _images(tmp_path / "d" / "a", 2)
    (tmp_path / "d" / "a" / "broken.png").write_bytes(b"not a png")
    d = datasets.load_data(str(tmp_path / "d"), (1, 8, 8))
    assert len(d) == 2 and d.skipped == 1
    for f in (tmp_path / "d" / "a").glob("[0-9].png"):
        f.write_bytes(b"junk")
    with pytest.raises(DataError, match="none of its 3 images could be decoded"):
        datasets.load_data(str(tmp_path / "d"), (1, 8, 8))


def test_a_csv_of_paths_and_labels(tmp_path):
    _images(tmp_path / "img", 3)
    (tmp_path / "list.csv").write_text("path,label\nimg/0.png,2\nimg/1.png,0\n"
                                       f"{tmp_path / 'img' / '2.png'},1\n")
    d = datasets.load_data(str(tmp_path / "list.csv"), (3, 8, 8))
    assert list(d.y) == [2, 0, 1] and d.x.shape == (3, 3, 8, 8)
    (tmp_path / "bad.csv").write_text("img/0.png,1\nimg/9.png,1\ngone.png,0\n")
    with pytest.raises(DataError, match="names 2 files that do not exist"):
        datasets.load_data(str(tmp_path / "bad.csv"), (3, 8, 8))
    (tmp_path / "junk.csv").write_text("img/0.png,cat\nimg/1.png,dog\n")
    with pytest.raises(DataError, match="not PATH,LABEL"):
        datasets.load_data(str(tmp_path / "junk.csv"), (3, 8, 8))


def test_limit_and_normalisation(tmp_path):
    _images(tmp_path / "d" / "a", 4, value=51)  # 51/255 = 0.2
    d = datasets.load_data(str(tmp_path / "d"), (1, 8, 8), options=DataOptions(limit=2))
    assert len(d) == 2
    again = datasets.load_data(str(tmp_path / "d"), (1, 8, 8), options=DataOptions(limit=2))
    assert np.array_equal(d.x, again.x)  # the same subset every run
    plain = datasets.load_data(str(tmp_path / "d"), (1, 8, 8))
    assert plain.x[0].max() == pytest.approx((0.2 - 0.5) / 0.5, abs=1e-6)
    norm = datasets.load_data(str(tmp_path / "d"), (1, 8, 8),
                              options=DataOptions(mean=(0.1,), std=(0.2,)))
    assert norm.x[0].max() == pytest.approx((0.2 - 0.1) / 0.2, abs=1e-6)
    for bad in (dict(limit=0), dict(std=(0.0,)), dict(mean=()), dict(input_size=(0, 4))):
        with pytest.raises(DataError):
            DataOptions(**bad)
    with pytest.raises(DataError, match="not a comma-separated"):
        datasets.parse_floats("a,b", "--mean")
    assert datasets.parse_size("32") == (32, 32) and datasets.parse_size("24x16") == (24, 16)


def test_the_model_s_metadata_gives_the_normalisation(tmp_path):
    import onnx

    from dlas_predict.networks.generate import build

    m = build("cnn", {"layers": 1, "kernels": 4, "kernel_size": 3, "input": 8, "batch": 1,
                      "block": "plain", "downsample": 0, "activation": "relu", "se": 0})
    onnx.helper.set_model_props(m, {"mean": "0.2,0.2,0.2", "std": "0.25,0.25,0.25"})
    onnx.save(m, str(tmp_path / "m.onnx"))
    meta = accuracy.model_metadata(tmp_path / "m.onnx")
    norm = datasets.model_normalisation(meta, DataOptions())
    assert norm.mean == (0.2,) * 3 and norm.source == "the model's metadata"
    assert datasets.model_normalisation(meta, DataOptions(mean=(0.5,))).mean == (0.5,)


def _model(tmp_path, open_size=False):
    import onnx

    from dlas_predict.networks.generate import build

    m = build("cnn", {"layers": 1, "kernels": 4, "kernel_size": 3, "input": 8, "batch": 1,
                      "block": "plain", "downsample": 0, "activation": "relu", "se": 0})
    if open_size:
        dims = m.graph.input[0].type.tensor_type.shape.dim
        dims[2].dim_param, dims[3].dim_param = "h", "w"
    path = tmp_path / ("open.onnx" if open_size else "m.onnx")
    onnx.save(m, str(path))
    return path


def test_measure_checks_labels_and_input_size_and_caches_what_it_measured(tmp_path,
                                                                          monkeypatch):
    from conftest import assert_clean_error, run_cli

    x = np.random.default_rng(0).uniform(-1, 1, (6, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "ok.npz", x=x, y=np.arange(6))
    np.savez(tmp_path / "far.npz", x=x, y=np.arange(6) + 7)
    path = _model(tmp_path)
    with pytest.raises(DataError, match="label 12 is out of the model's range"):
        accuracy.measure(str(path), str(tmp_path / "far.npz"))
    assert_clean_error(run_cli("accuracy", path, "--data", tmp_path / "far.npz"),
                       "out of the model's range")
    first = accuracy.measure(str(path), str(tmp_path / "ok.npz"), "int8")
    monkeypatch.setattr(accuracy, "evaluate_onnx", lambda *a: pytest.fail("not cached"))
    again = accuracy.measure(str(path), str(tmp_path / "ok.npz"), "int8")
    assert again == first and again.metric == "top1"
    # a model that leaves its height and width open takes them from input_size
    open_path = _model(tmp_path, open_size=True)
    with pytest.raises(DataError, match="`input_size`"):
        accuracy.measure(str(open_path), str(tmp_path / "ok.npz"))
    monkeypatch.undo()
    res = accuracy.measure(str(open_path), str(tmp_path / "ok.npz"),
                           options=DataOptions(input_size=(8, 8)))
    assert res.n_samples == 6
    with pytest.raises(DataError, match="disagrees with the model's fixed input"):
        accuracy.input_shape(path, (16, 16))
