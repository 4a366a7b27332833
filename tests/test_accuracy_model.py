"""The accuracy-cost model: fit, interval, save → load → predict equality, the shipped model on
a real network, and clear errors for what it cannot use."""
import json

import numpy as np
import pytest

from conftest import DEMO
from dlas_predict.compression.sensitivity import FEATURE_NAMES, ConvWeights, features
from dlas_predict.models.accuracy import (HIGH_MAX, AccuracyCostModel, AccuracyPredictor,
                                          curve_points, held_out, normalised_drop)
from dlas_predict.models.costmodel import ModelError
from dlas_predict.networks.generate import build
from dlas_predict.space.config import Compression

RATIOS = tuple(round(0.05 * i, 2) for i in range(1, 20))


def _table(n_networks=5):
    """Rows of real features of generated networks; a drop that grows with the energy the
    compression removes, so that the trees have something to learn."""
    rng = np.random.default_rng(0)
    X, y, groups = [], [], []
    for i in range(n_networks):
        net = build("cnn", {"layers": 2 + i % 3, "kernels": 8 + 4 * i, "kernel_size": 3,
                            "input": 16, "batch": 1, "block": ("plain", "residual")[i % 2],
                            "downsample": 1, "activation": "relu", "se": 0})
        cw = ConvWeights.of(net)
        for comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING):
            for r in RATIOS:
                row = features(cw, comp, r)
                X.append(row)
                energy = row[FEATURE_NAMES.index("energy_mean")]
                y.append(float(np.clip(energy * 1.5 + rng.normal(0, 0.02), 0, 1)))
                groups.append(f"net{i}")
    return np.array(X), np.array(y), np.array(groups)


def test_normalised_drop_is_the_share_of_above_chance_accuracy_lost():
    assert normalised_drop(0.9, 0.9, 0.1) == 0
    assert normalised_drop(0.9, 0.1, 0.1) == pytest.approx(1)
    assert normalised_drop(0.9, 0.5, 0.1) == pytest.approx(0.5)


@pytest.mark.slow
def test_fit_save_load_predict_equality(tmp_path):
    X, y, groups = _table()
    model = AccuracyCostModel(tree_scale=0.5).fit(X, y, groups)
    mid = model.predict(X)
    low, high = model.predict_interval(X)
    assert ((-1 <= low) & (low <= mid) & (mid <= high) & (high <= HIGH_MAX)).all()
    assert ((0 <= mid) & (mid <= 1)).all()
    assert np.corrcoef(mid, y)[0, 1] > 0.8
    model.save(tmp_path)
    back = AccuracyCostModel.load(tmp_path)
    assert np.allclose(back.predict(X), mid, atol=1e-9)
    assert all(np.allclose(a, b, atol=1e-9) for a, b in zip(back.predict_interval(X),
                                                             (low, high)))
    # a retrain that changes nothing rewrites nothing
    before = (tmp_path / "accuracy.json").stat().st_mtime_ns
    AccuracyCostModel(tree_scale=0.5).fit(X, y, groups).save(tmp_path)
    assert (tmp_path / "accuracy.json").stat().st_mtime_ns == before


def test_held_out_predicts_each_network_from_the_others_only():
    X, y, groups = _table(4)
    mid, low, high = held_out(X, y, groups, tree_scale=0.1)
    assert np.isfinite(mid).all() and (low <= mid).all() and (mid <= high).all()
    # a network's held-out prediction differs from the all-networks fit's
    full = AccuracyCostModel(tree_scale=0.1).fit(X, y, groups).predict(X)
    assert not np.allclose(mid, full)


def test_what_the_model_cannot_use_is_a_clear_error(tmp_path):
    X, y, groups = _table(2)
    with pytest.raises(ModelError, match="3 networks or more"):
        AccuracyCostModel(tree_scale=0.1).fit(X, y, groups)
    with pytest.raises(ModelError, match="no accuracy-cost model"):
        AccuracyCostModel.load(tmp_path)
    X, y, groups = _table(3)
    AccuracyCostModel(tree_scale=0.1).fit(X, y, groups).save(tmp_path)
    meta = json.loads((tmp_path / "accuracy.json").read_text())
    (tmp_path / "accuracy.json").write_text(json.dumps({**meta, "features": ["ratio"]}))
    with pytest.raises(ModelError, match="other features"):
        AccuracyCostModel.load(tmp_path)
    (tmp_path / "accuracy.json").write_text("{not json")
    with pytest.raises(ModelError, match="not valid JSON"):
        AccuracyCostModel.load(tmp_path)


def test_the_shipped_model_prices_a_real_network_in_points():
    p = AccuracyPredictor(DEMO)
    drops = p.drops([(Compression.CHANNEL_PRUNING, 0.1), (Compression.CHANNEL_PRUNING, 0.9),
                     (Compression.FLOAT16, None)])
    for d in drops:
        assert d.low_pp <= d.drop_pp <= d.high_pp <= 100 * d.dense + 1e-9
        assert 0 <= d.drop_pp
        assert d.dense == 1.0 and d.source.startswith("predicted")
    # removing 90 % of the channels costs more than 10 %, and more than float16
    assert drops[1].drop_pp > drops[0].drop_pp and drops[1].drop_pp > drops[2].drop_pp
    assert drops[1].drop_pp > 20
    # a known uncompressed accuracy scales the points
    half = p.drops([(Compression.CHANNEL_PRUNING, 0.9)], dense=0.5)[0]
    assert half.drop_pp == pytest.approx(drops[1].drop_pp * (0.5 - p.chance) / (1 - p.chance))


def test_the_shipped_model_prices_a_matrix_network_s_file():
    """A trained transformer's export: read in the form the grid prunes, priced as a CNN
    is; its curve is measured (the zoo's), and the prediction follows it."""
    from dlas_predict.compression.accuracy import load_curves
    from dlas_predict.networks import zoo

    p = AccuracyPredictor(zoo.export("zoo:bert-tiny-cifar"))
    drops = p.drops([(Compression.WEIGHT_PRUNING, 0.1), (Compression.WEIGHT_PRUNING, 0.9),
                     (Compression.CHANNEL_PRUNING, 0.5), (Compression.INT8, None)])
    for d in drops:
        assert d.low_pp <= d.drop_pp <= d.high_pp <= 100 + 1e-9
    weak, strong, channels, int8 = drops
    assert strong.drop_pp > 20 > weak.drop_pp and channels.drop_pp > 20 > int8.drop_pp
    curve = load_curves()["bert-tiny-cifar"]
    measured = (curve.dense - curve.accuracy("weight_pruning", 0.9)) / (curve.dense - 0.1)
    assert strong.low_pp <= measured * 100 <= strong.high_pp


def test_curve_points_read_every_measured_compression():
    from dlas_predict.compression.accuracy import load_curves

    entry = load_curves()["resnet18-cifar"].to_dict()
    pts = curve_points("resnet18-cifar", entry)
    kinds = [p.compression for p in pts]
    assert kinds.count(Compression.WEIGHT_PRUNING) == len(entry["weight_pruning"]["points"])
    assert Compression.INT8 in kinds and Compression.FLOAT16 in kinds
    assert all(p.chance == 0.1 and p.dense == entry["dense"] for p in pts)


def test_the_training_table_keeps_the_rows_of_a_network_whose_file_is_gone(tmp_path):
    """A rebuild reads each network's file in the form the grid prunes; a CNN whose file is
    gone keeps its rows (the matrix features, where the old table lacks them, 0 as on any
    CNN); a matrix network's cannot be kept without them."""
    import onnx
    import pandas as pd

    from dlas_predict.models.accuracy import MATRIX_FEATURES, write_training_table

    def entry(family):
        return {"dense": 0.9, "float16": 0.9, "int8": 0.88, "network": {"family": family},
                "weight_pruning": {"points": [[0.5, 0.8]]},
                "channel_pruning": {"points": [[0.5, 0.4]]}}

    cnn = build("cnn", {"layers": 2, "kernels": 8, "kernel_size": 3, "input": 16, "batch": 1,
                        "block": "plain", "downsample": 1, "activation": "relu", "se": 0})
    mlp = build("fc", {"layers": 2, "nodes": 32, "input": 16, "output": 10, "batch": 1})
    onnx.save(cnn, str(tmp_path / "c.onnx"))
    onnx.save(mlp, str(tmp_path / "m.onnx"))
    curves = {"c": entry("plain"), "m": entry("mlp")}
    out = tmp_path / "t.parquet"
    first = pd.read_parquet(write_training_table(curves, tmp_path, out))
    assert len(first) == 8 and (first[first.network == "m"].matrix_share == 1).all()
    assert (first[first.network == "c"][list(MATRIX_FEATURES)] == 0).all().all()
    (tmp_path / "c.onnx").unlink()
    first.drop(columns=list(MATRIX_FEATURES)).to_parquet(out)  # a table of before them
    again = pd.read_parquet(write_training_table(curves, tmp_path, out))
    kept = again[again.network == "c"].reset_index(drop=True)
    assert len(kept) == 4 and (kept[list(MATRIX_FEATURES)] == 0).all().all()
    assert np.allclose(kept["energy_mean"], first[first.network == "c"]["energy_mean"])
    (tmp_path / "m.onnx").unlink()
    first.drop(columns=list(MATRIX_FEATURES)).to_parquet(out)
    with pytest.raises(ModelError, match="matrix features of m cannot be read"):
        write_training_table(curves, tmp_path, out)
