"""The accuracy-cost model's features: each compression applied to the conv weights as the
ONNX path applies it, described by figures that grow with what it removes."""
import numpy as np
import pytest

from dlas_predict.compression.probe import PROBE_FEATURES
from dlas_predict.compression.sensitivity import FEATURE_NAMES, ConvWeights, features
from dlas_predict.errors import NetworkError
from dlas_predict.networks.generate import build
from dlas_predict.space.config import Compression


def _net(block="residual", layers=3):
    return build("cnn", {"layers": layers, "kernels": 16, "kernel_size": 3, "input": 16,
                         "batch": 1, "block": block, "downsample": 1, "activation": "relu",
                         "se": 0})


def _f(cw, comp, ratio=None):
    return dict(zip(FEATURE_NAMES, features(cw, comp, ratio)))


def test_the_network_is_read_from_its_graph():
    cw = ConvWeights.of(_net("residual"))
    assert cw.classes == 10 and cw.residual_adds == 3
    assert all(cw.prunable) and len(cw.weights) == 1 + 3 * 2 + 1  # stem, 2 per block, 1 shortcut
    sep = ConvWeights.of(_net("separable"))
    assert sep.prunable.count(False) == 3 and sep.residual_adds == 0
    assert _f(sep, Compression.INT8)["depthwise_share"] > 0
    assert _f(cw, Compression.INT8)["depthwise_share"] == 0


def test_weight_pruning_removes_its_ratio_and_more_energy_as_the_ratio_grows():
    cw = ConvWeights.of(_net())
    rows = [_f(cw, Compression.WEIGHT_PRUNING, r) for r in (0.1, 0.5, 0.9)]
    for r, row in zip((0.1, 0.5, 0.9), rows):
        assert row["removed_mean"] == pytest.approx(r, abs=0.01)
        assert row["is_weight_pruning"] == 1 and row["ratio"] == r
        # the global criterion removes the smallest weights: less energy than their share
        assert row["energy_mean"] < row["removed_mean"]
    for key in ("energy_mean", "energy_max", "energy_depth_sum", "removed_max"):
        assert rows[0][key] < rows[1][key] < rows[2][key], key


def test_channel_pruning_empties_channels_and_leaves_depthwise_layers_whole():
    cw = ConvWeights.of(_net("separable"))
    low, high = (_f(cw, Compression.CHANNEL_PRUNING, r) for r in (0.2, 0.8))
    assert low["energy_depth_sum"] < high["energy_depth_sum"]
    assert high["kept_channels_min_log2"] <= low["kept_channels_min_log2"]
    # each prunable layer keeps one channel at least: its energy is never all removed
    assert high["energy_max"] < 1


def test_float16_injects_far_less_error_than_int8_and_neither_removes_weights():
    cw = ConvWeights.of(_net())
    f16, i8 = _f(cw, Compression.FLOAT16), _f(cw, Compression.INT8)
    assert f16["removed_max"] == i8["removed_max"] == 0 and f16["ratio"] == 0
    assert 0 < f16["energy_mean"] < i8["energy_mean"] / 100


def test_what_cannot_be_priced_is_refused():
    # a matrix network's own graph (not a file, whose grid form would be read)
    with pytest.raises(NetworkError, match="no convolution and no matrix layer"):
        ConvWeights.of(build("fc", {"layers": 2, "nodes": 32, "input": 16, "output": 10,
                                    "batch": 1}))
    with pytest.raises(NetworkError, match="not dense"):
        features(ConvWeights.of(_net()), Compression.DENSE, None)
    row = features(ConvWeights.of(_net()), Compression.INT8, None)
    assert row.shape == (len(FEATURE_NAMES),)
    assert np.isfinite(row[:-len(PROBE_FEATURES)]).all() and np.isnan(row[-3:]).all()


def test_the_probe_runs_the_pruned_network_as_onnxruntime_runs_its_compressed_file(tmp_path):
    """The probe's figures equal those of the file ``compress`` writes, run on the same
    synthetic inputs; float16 and int8 rows have none; a second ask is answered from the
    cache without running anything."""
    import onnx

    from dlas_predict.compression import probe as probe_mod
    from dlas_predict.compression.accuracy import onnx_session
    from dlas_predict.compression.compress import compress_onnx

    net = _net()
    path = tmp_path / "net.onnx"
    onnx.save(net, str(path))
    cw = ConvWeights.of(path)
    row = _f(cw, Compression.CHANNEL_PRUNING, 0.3)
    pruned = compress_onnx(onnx.load(str(path)), "channel_pruning", 0.3).model
    x = probe_mod.synthetic_inputs((3, 16, 16))
    run = lambda m: np.concatenate([onnx_session(m).run(None, {"input": x[i:i + 1]})[0]
                                    for i in range(len(x))])
    o, ref = run(pruned), run(onnx.load(str(path)))
    assert row["probe_agreement"] == pytest.approx((o.argmax(1) == ref.argmax(1)).mean())
    rel = np.linalg.norm(o - ref) / np.linalg.norm(ref - ref.mean(0))
    assert row["probe_logit_change"] == pytest.approx(rel, rel=1e-4)
    assert -1 <= row["probe_cosine"] <= 1
    assert np.isnan(_f(cw, Compression.INT8)["probe_agreement"])
    # unpruned: the same function
    same = _f(cw, Compression.WEIGHT_PRUNING, 0.0)
    assert same["probe_agreement"] == 1 and same["probe_logit_change"] == 0
    again = ConvWeights.of(path)
    again.__dict__["probe"] = None  # running anything now would fail
    assert _f(again, Compression.CHANNEL_PRUNING, 0.3)["probe_cosine"] == row["probe_cosine"]


_MATRIX = {
    "fc": {"layers": 2, "nodes": 32, "input": 16, "output": 10, "batch": 1},
    "transformer": {"layers": 1, "d_model": 16, "heads": 2, "ffn": 2, "seq": 6, "batch": 1},
    "rnn": {"layers": 1, "hidden": 8, "embedding": 6, "vocab": 20, "seq": 5, "batch": 1,
            "cell": "gru"},
}


@pytest.mark.parametrize("family", ["fc", "transformer", "rnn", "steps-first lstm"])
def test_a_matrix_network_s_file_is_read_as_the_grid_prunes_it(tmp_path, family):
    """An MLP, a transformer (attention's products), a GRU over token ids (its steps
    unrolled: each step's products share one weight) and an LSTM fed steps first (its
    batch on the second axis): read in the form the grid prunes, their matrix features
    say what they are, and the probe runs each on inputs of its own kind."""
    import onnx

    from conftest import token_lstm

    path = tmp_path / "net.onnx"
    onnx.save(token_lstm(5) if family.startswith("steps")
              else build(family, _MATRIX[family]), str(path))
    cw = ConvWeights.of(path)
    weight, channel = (_f(cw, Compression.WEIGHT_PRUNING, 0.5),
                       _f(cw, Compression.CHANNEL_PRUNING, 0.5))
    assert weight["matrix_share"] == 1 and channel["matrix_share"] == 1
    recurrent = family in ("rnn", "steps-first lstm")
    assert (weight["shared_layers_share"] > 0) == recurrent
    assert (weight["products_per_layer"] > 0) == (family == "transformer")
    for row in (weight, channel):
        assert np.isfinite(list(row.values())).all()
        assert 0 <= row["probe_agreement"] <= 1 and row["probe_logit_change"] > 0
    # unpruned: the same function
    same = _f(cw, Compression.WEIGHT_PRUNING, 0.0)
    assert same["probe_agreement"] == 1 and same["probe_logit_change"] == 0
    cnn = _f(ConvWeights.of(_net()), Compression.WEIGHT_PRUNING, 0.5)
    assert cnn["matrix_share"] == cnn["shared_layers_share"] == cnn["products_per_layer"] == 0
