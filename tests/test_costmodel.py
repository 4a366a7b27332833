"""Features, the layer cost model and its baselines, metrics, and leave-one-network-out.

Unit tests on synthetic latencies with a known law (the model must learn it); the shipped
corpus is what the benchmark and `evaluate` use."""
import json

import numpy as np
import pytest

from dlas_predict import costmodel
from dlas_predict.config import Algorithm, Compression, ConvSpec
from dlas_predict.costmodel import (LayerCostModel, MacsLinearBaseline, ModelError,
                                    RooflineBaseline)
from dlas_predict.devices import get_device
from dlas_predict.evaluation import Corpus, kernel_key, leave_one_network_out
from dlas_predict.features import FEATURE_NAMES, KernelConfig, config_from_row, features

DEV = get_device("xavier-cpu", with_target=False)
ALGS = list(Algorithm)
COMPS = [Compression.DENSE, Compression.WEIGHT_PRUNING, Compression.INT8]
LAW = {Algorithm.DIRECT: 3.0, Algorithm.GEMM: 2.0, Algorithm.SPATIAL_PACK: 1.5}


def _specs(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        c, k = (int(v) for v in rng.choice([16, 32, 64, 128, 256], 2))
        h = int(rng.choice([8, 16, 32, 56]))
        r = int(rng.choice([1, 3]))
        out.append(ConvSpec(C=c, H=h, W=h, K=k, R=r, S=r, pad_t=r // 2, pad_l=r // 2,
                            pad_b=r // 2, pad_r=r // 2))
    return out


def _law(cfg: KernelConfig) -> float:
    """A known latency law: the roofline × an algorithm factor × a sparsity effect."""
    f = features(cfg, DEV)
    roof = np.exp(f[FEATURE_NAMES.index("log_roofline_s")])
    return roof * LAW[cfg.algorithm] * (1.8 if cfg.compression is Compression.INT8 else 1.0)


def _corpus(seed=0, noise=0.02):
    rng = np.random.default_rng(seed)
    keys, X, y, configs = [], [], [], []
    for n, net in enumerate(("netA", "netB", "netC", "netD")):
        for i, spec in enumerate(_specs(12, seed + n)):
            for comp in COMPS:
                ratio = round(float(rng.uniform(0.3, 0.9)), 2) if comp.value.endswith(
                    "pruning") else 0.0
                label = comp.value + (f"@0.6" if ratio else "")
                configs.append({"network": net, "config": label, "layer_index": i,
                                "layer_name": f"l{i}", "conv": spec.to_spec(),
                                "compression": comp.value, "ratio": ratio})
                for alg in ALGS:
                    k = kernel_key(spec.to_spec(), alg.value, comp.value, ratio)
                    if k in keys:
                        continue
                    cfg = KernelConfig(spec, alg, comp, ratio)
                    keys.append(k)
                    X.append(features(cfg, DEV))
                    y.append(_law(cfg) * float(np.exp(rng.normal(0, noise))))
    return Corpus(DEV, keys, np.array(X), np.array(y), configs, "synthetic")


def test_features_shape_and_meaning():
    spec = ConvSpec.parse("C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1")
    dense = features(KernelConfig(spec, Algorithm.GEMM, Compression.DENSE, 0.0), DEV)
    sparse = features(KernelConfig(spec, Algorithm.GEMM, Compression.WEIGHT_PRUNING, 0.9), DEV)
    assert len(dense) == len(FEATURE_NAMES)
    f = dict(zip(FEATURE_NAMES, sparse))
    assert f["sparse"] == 1 and f["sparsity"] == 0.9 and f["algo_gemm"] == 1
    assert f["log_effective_macs"] == pytest.approx(np.log(spec.macs * 0.1))
    assert dict(zip(FEATURE_NAMES, dense))["dev_cores"] == DEV.cores
    row = {"conv": spec.to_spec(), "compression": "weight_pruning", "algorithm": "gemm",
           "ratio": 0.9, "tuning": "untuned"}
    assert config_from_row(row) == KernelConfig(spec, Algorithm.GEMM,
                                                Compression.WEIGHT_PRUNING, 0.9)


def test_metrics():
    t = np.array([1.0, 2.0, 4.0])
    p = np.array([1.05, 2.5, 3.0])
    assert costmodel.mape(p, t) == pytest.approx((0.05 + 0.25 + 0.25) / 3)
    assert costmodel.within(p, t) == pytest.approx(1 / 3)
    assert costmodel.kendall_tau(p, t) == pytest.approx(1.0)
    assert costmodel.top1_hit(p, t) == 1.0
    assert costmodel.regret(np.array([3.0, 1.0, 2.0]), t) == 2.0


def test_model_learns_the_law_with_an_interval_and_round_trips(tmp_path):
    corpus = _corpus()
    model = LayerCostModel().fit(corpus.X, corpus.seconds, meta={"corpus_fingerprint": "x"})
    test = _corpus(seed=7)
    mid, low, high = model.predict(test.X)
    assert np.all(low <= mid) and np.all(mid <= high)
    assert costmodel.mape(mid, test.seconds) < 0.25
    model.save(tmp_path, "layer")
    back = LayerCostModel.load(tmp_path, "layer")
    for a, b in zip(model.predict(test.X), back.predict(test.X)):
        np.testing.assert_array_equal(a, b)
    assert back.meta["corpus_fingerprint"] == "x" and back.meta["features"] == list(FEATURE_NAMES)


def test_load_refuses_missing_stale_and_corrupt_models(tmp_path):
    with pytest.raises(ModelError, match="dlas-predict train"):
        LayerCostModel.load(tmp_path, "layer")
    corpus = _corpus()
    LayerCostModel().fit(corpus.X, corpus.seconds).save(tmp_path, "layer")
    sidecar = tmp_path / "layer.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "features": meta["features"][:-1]}))
    with pytest.raises(ModelError, match="other features"):
        LayerCostModel.load(tmp_path, "layer")
    sidecar.write_text(json.dumps(meta))
    (tmp_path / "layer.q90.txt").write_text("garbage")
    with pytest.raises(ModelError, match="cannot load"):
        LayerCostModel.load(tmp_path, "layer")
    with pytest.raises(ModelError, match="too few"):
        LayerCostModel().fit(corpus.X[:3], corpus.seconds[:3])


def test_baselines():
    corpus = _corpus(noise=0.0)
    roof = RooflineBaseline().fit(corpus.X, corpus.seconds)
    # the law is roofline × a factor per algorithm × compression: the baseline recovers it
    np.testing.assert_allclose(roof.predict(corpus.X), corpus.seconds, rtol=1e-6)
    lin = MacsLinearBaseline().fit(corpus.X, corpus.seconds)
    assert np.all(lin.predict(corpus.X) > 0)


def test_leave_one_network_out_reports_every_model():
    report = leave_one_network_out(_corpus())
    assert set(report["networks"]) == {"netA", "netB", "netC", "netD"}
    for res in report["networks"].values():
        assert res["configurations"] == len(COMPS) * len(ALGS)
        assert set(res) >= {"lightgbm", "roofline", "macs_linear"}
    o = report["overall"]["lightgbm"]
    assert o["mape"] < 0.3 and o["regret"] >= 1.0 and -1 <= o["kendall_tau"] <= 1
    assert report["scope"].startswith("conv layers only")
