import numpy as np
import onnx
import pytest

from dlas_predict.networks import generate
from dlas_predict.networks.graph import read_network
from dlas_predict.space.config import Compression, SparsityPattern
from dlas_predict.compression.netplan import MIN_LAYER_DENSITY, kernel_ratio, network_configs
from dlas_predict.measure.kernels.sparse import prune, sparsity


def test_kernel_ratio_keeps_the_hundredths_up_to_0_9():
    # the grid every stored kernel below 0.9 was measured on
    for i in range(91):
        assert kernel_ratio(i / 100) == pytest.approx(i / 100, abs=1e-12)
    assert kernel_ratio(0.004) == 0.0 and kernel_ratio(0.894) == 0.89


def test_kernel_ratio_does_the_layers_work_within_five_percent():
    for s in np.linspace(0.9, 1 - 2 * MIN_LAYER_DENSITY, 20001):
        dens, measured = 1 - s, 1 - kernel_ratio(s)
        assert abs(measured / dens - 1) <= 0.05 + 1e-9, s
    assert kernel_ratio(0.9987) == 0.9987 and kernel_ratio(0.99951) == 0.99951


@pytest.mark.parametrize("k", [768, 2048])
def test_a_layer_keeping_one_filter_is_measured_keeping_one(k):
    w = np.random.default_rng(0).standard_normal((k, 64, 3, 3)).astype("float32")
    layer = prune(w, 1 - 1 / k, SparsityPattern.CHANNEL)
    kernel = prune(w, kernel_ratio(sparsity(layer)), SparsityPattern.CHANNEL)
    assert np.count_nonzero(np.abs(kernel).sum(axis=(1, 2, 3))) == 1
    # before: 0.01 steps to at most 0.99 kept 1 % of the filters
    old = prune(w, 0.99, SparsityPattern.CHANNEL)
    assert np.count_nonzero(np.abs(old).sum(axis=(1, 2, 3))) == round(0.01 * k)


def test_a_layer_pruned_to_nothing_is_measured_at_the_sparsest_kernel():
    assert kernel_ratio(1.0) == pytest.approx(1 - MIN_LAYER_DENSITY)
    w = np.random.default_rng(1).standard_normal((16, 8, 3, 3)).astype("float32")
    assert np.count_nonzero(prune(w, kernel_ratio(1.0), SparsityPattern.UNSTRUCTURED)) == 1


def test_each_layers_kernel_keeps_the_filters_global_channel_pruning_kept(tmp_path):
    from dlas_predict.compression.accuracy import prepare

    # wide layers at 3x3: global pruning at 0.9 keeps 1 of 768 filters in some; a residual
    # network keeps the zeroed filters that feed its additions
    name = "cnn_layers=2_kernels=384_kernel_size=3_input=6_batch=1_block=residual_downsample=1"
    path = tmp_path / f"{name}.onnx"
    onnx.save(generate.build(*generate.parse_name(name)), str(path))
    layers = network_configs(str(path), [Compression.CHANNEL_PRUNING], 0.9)[
        "channel_pruning@0.9"]
    removed = prepare(str(path), "channel_pruning", 0.9, remove_channels=True).compressed.layers
    assert any(lc.ratio > 0 for lc in layers) and any(lc.ratio == 0 for lc in layers)
    rng = np.random.default_rng(2)
    for lc, p in zip(layers, removed):
        s = lc.spec
        assert s == p.spec  # the layer of the network that is built
        w = rng.standard_normal((s.K, s.C // s.groups, s.R, s.S)).astype("float32")
        kept = np.count_nonzero(np.abs(prune(w, lc.ratio, SparsityPattern.CHANNEL))
                                .sum(axis=(1, 2, 3)))
        assert kept == p.channels_kept, (lc.name, lc.ratio, p.channels_kept)


def test_channel_pruning_builds_the_network_with_its_zeroed_filters_removed(tmp_path):
    from dlas_predict.compression.accuracy import prepare
    from dlas_predict.compression.compress import cached_channel_removed, channel_removed_networks
    from dlas_predict.compression.netplan import layer_kernel, layer_sparse

    name = "cnn_layers=3_kernels=32_kernel_size=3_input=16_batch=1_block=separable_downsample=1"
    path = tmp_path / f"{name}.onnx"
    onnx.save(generate.build(*generate.parse_name(name)), str(path))
    dense = {c.index: c.spec for c in read_network(path).convs()}
    for r in (0.5, 0.9):
        layers, summary = channel_removed_networks(str(path), [r])[r]
        real = prepare(str(path), "channel_pruning", r, remove_channels=True).compressed.layers
        assert [(s, round(left, 6)) for s, left in layers] == \
            [(p.spec, round(p.sparsity, 6)) for p in real]
        # separable blocks feed no addition: every zeroed filter goes, the work shrinks
        assert all(left == 0 for _, left in layers)
        assert sum(s.macs for s, _ in layers) < sum(x.macs for x in dense.values()) * (1 - r / 2)
        assert summary["conv_layers"] == len(layers)
        assert cached_channel_removed(str(path), [r])[r][0] == layers
    cfg = network_configs(str(path), [Compression.CHANNEL_PRUNING], 0.9)["channel_pruning@0.9"]
    assert all(not layer_sparse(lc.compression, lc.ratio) for lc in cfg)
    assert layer_kernel(Compression.CHANNEL_PRUNING, 0.0) == (Compression.DENSE, 0.0)
    assert layer_kernel(Compression.CHANNEL_PRUNING, 0.3) == (Compression.CHANNEL_PRUNING, 0.3)
    assert layer_sparse(Compression.WEIGHT_PRUNING, 0.0)  # the study's CSR everywhere
    assert any(lc.spec != dense[lc.index] for lc in cfg)