"""Features, the layer cost model and its baselines, metrics, and leave-one-network-out.

Unit tests on synthetic latencies with a known law (the model must learn it); the shipped
corpus is what the benchmark and `evaluate` use."""
import json
from pathlib import Path

import numpy as np
import pytest

from dlas_predict.models import costmodel
from dlas_predict.space.config import GRID_ALGORITHMS, Algorithm, Compression, ConvSpec
from dlas_predict.models.costmodel import (LayerCostModel, MacsLinearBaseline, ModelError,
                                           StageCostModel, RooflineBaseline)
from dlas_predict.space.devices import get_device
from dlas_predict.models.evaluation import Corpus, leave_one_network_out
from dlas_predict.corpus.kernels import kernel_key
from dlas_predict.models.features import (FEATURE_NAMES, STAGE_TERMS, TREE_FEATURES, features,
                                          weight_bytes)
from dlas_predict.corpus.kernels import KernelConfig, config_from_row

DEV = get_device("xavier-cpu", with_target=False)
ALGS = list(GRID_ALGORITHMS)
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
    half = features(KernelConfig(spec, Algorithm.GEMM, Compression.FLOAT16, 0.0), DEV)
    # weights as stored: 4 bytes per float32, 2 per float16, CSR nonzeros + a 4-byte index each
    assert list(weight_bytes(np.array([dense, half, sparse]))) == pytest.approx(
        [4 * spec.params, 2 * spec.params, (4 + 4) * 0.1 * spec.params])


def test_metrics():
    t = np.array([1.0, 2.0, 4.0])
    p = np.array([1.05, 2.5, 3.0])
    assert costmodel.mape(p, t) == pytest.approx((0.05 + 0.25 + 0.25) / 3)
    assert costmodel.within(p, t) == pytest.approx(1 / 3)
    assert costmodel.kendall_tau(p, t) == pytest.approx(1.0)
    assert costmodel.top1_hit(p, t) == 1.0
    assert costmodel.regret(np.array([3.0, 1.0, 2.0]), t) == 2.0


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One layer model fitted on the synthetic corpus and saved: (model, its folder)."""
    corpus = _corpus()
    model = LayerCostModel(about={"corpus_fingerprint": "x"}).fit(corpus.X, corpus.seconds)
    folder = tmp_path_factory.mktemp("fitted")
    model.save(folder)
    return model, folder


def _saved_copy(fitted, tmp_path) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(fitted[1], folder)
    return folder


@pytest.mark.slow
def test_model_learns_the_law_with_an_interval_and_round_trips(fitted, tmp_path):
    model = fitted[0]
    test = _corpus(seed=7)
    mid = model.predict(test.X)
    low, high = model.predict_interval(test.X)
    assert np.all(low <= mid) and np.all(mid <= high)
    assert costmodel.mape(mid, test.seconds) < 0.25
    model.save(tmp_path)
    back = LayerCostModel.load(tmp_path)
    np.testing.assert_array_equal(model.predict(test.X), back.predict(test.X))
    for a, b in zip(model.predict_interval(test.X), back.predict_interval(test.X)):
        np.testing.assert_array_equal(a, b)
    assert back.meta_["corpus_fingerprint"] == "x" and back.meta_["features"] == list(FEATURE_NAMES)


def test_load_refuses_missing_stale_and_corrupt_models(fitted, tmp_path):
    with pytest.raises(ModelError, match="dlas-predict train"):
        LayerCostModel.load(tmp_path)
    corpus = _corpus()
    tmp_path = _saved_copy(fitted, tmp_path)
    sidecar = tmp_path / "layer.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**meta, "features": meta["features"][:-1]}))
    with pytest.raises(ModelError, match="other features"):
        LayerCostModel.load(tmp_path)
    sidecar.write_text(json.dumps(meta))
    (tmp_path / "layer.q90.txt.xz").write_bytes(b"garbage")
    with pytest.raises(ModelError, match="cannot load"):
        LayerCostModel.load(tmp_path)
    with pytest.raises(ModelError, match="too few"):
        LayerCostModel().fit(corpus.X[:3], corpus.seconds[:3])


@pytest.mark.slow
def test_a_model_saved_before_a_tree_feature_was_added_predicts_from_its_own(tmp_path):
    """A shipped model trained on fewer tree features (here without ``vnni``) loads, and its
    trees read the columns they were trained on."""
    import lightgbm as lgb

    corpus = _corpus()
    names = [n for n in TREE_FEATURES if n != "vnni"]
    cols = [TREE_FEATURES.index(n) for n in names]
    model = LayerCostModel().fit(corpus.X, corpus.seconds)
    y = np.log(corpus.seconds) - np.log(model.stage_.predict(corpus.X))
    for key in model.models_:  # trees as a version without the feature trained them
        model.models_[key] = lgb.LGBMRegressor(n_estimators=20, verbose=-1).fit(
            corpus.X[:, cols], y + (key == "q90") - (key == "q10")).booster_
    model.meta_["features"] = [*names, *STAGE_TERMS]
    model.save(tmp_path)
    back = LayerCostModel.load(tmp_path)
    assert back.tree_columns() == cols
    test = _corpus(seed=7)
    expect = model.stage_.predict(test.X) * np.exp(model.models_["median"].predict(test.X[:, cols]))
    np.testing.assert_allclose(back.predict(test.X), expect, rtol=1e-9)


def test_baselines():
    corpus = _corpus(noise=0.0)
    roof = RooflineBaseline().fit(corpus.X, corpus.seconds)
    # the law is roofline × a factor per algorithm × compression: the baseline recovers it
    np.testing.assert_allclose(roof.predict(corpus.X), corpus.seconds, rtol=1e-6)
    # latency linear in MACs with its own slope and intercept per algorithm × compression:
    # the MACs baseline recovers it exactly
    from dlas_predict.models.costmodel import _group_keys
    from dlas_predict.models.features import FEATURE_NAMES

    macs = np.exp(corpus.X[:, FEATURE_NAMES.index("log_macs")])
    groups = sorted(set(_group_keys(corpus.X)))
    assert len(groups) >= 3
    law = {k: (1e-10 * (i + 1), 1e-5 * (i + 2)) for i, k in enumerate(groups)}
    linear = np.array([law[k][0] * m + law[k][1] for k, m in zip(_group_keys(corpus.X), macs)])
    lin = MacsLinearBaseline().fit(corpus.X, linear)
    np.testing.assert_allclose(lin.predict(corpus.X), linear, rtol=1e-6)


@pytest.mark.slow
def test_leave_one_network_out_reports_every_model():
    report = leave_one_network_out(_corpus())
    assert set(report.networks) == {"netA", "netB", "netC", "netD"}
    for res in report.networks.values():
        assert res.configurations == len(COMPS) * len(ALGS)
        assert set(res.scores) >= {"lightgbm", "roofline", "macs_linear"}
        assert res.kernels_held_out > 0 and res.kernels_trained > 0
    o = report.overall["lightgbm"]
    assert o.mape < 0.3 and o.regret >= 1.0 and -1 <= o.kendall_tau <= 1
    assert report.scope.startswith("conv layers only")
    d = report.to_dict()  # the JSON shape `evaluate --json` prints
    assert set(d["networks"]["netA"]) >= {"configurations", "kernels_held_out", "lightgbm"}
    assert set(d["overall"]["lightgbm"]) == {"layer_mape", "mape", "within_10pct",
                                             "kendall_tau", "top1_hit", "regret"}


# ---- the stage-cost model ------------------------------------------------------------------
def _parallel_extents(cfg: KernelConfig) -> list[int]:
    """Extents of the parallel loops of the kernel TVM builds for ``cfg`` (its TIR text)."""
    import re

    from dlas_predict.measure.kernels.build import kernel_module
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.knobs import default_knobs

    from dlas_predict.space.config import COMPRESSION_KERNEL, Variant

    sparse, dtype, _ = COMPRESSION_KERNEL[cfg.compression]
    knobs = default_knobs(cfg.spec, Variant(cfg.algorithm, cfg.compression, cfg.sparsity),
                          DEV.simd_bits)
    text = kernel_module(KernelSpec(cfg.spec, cfg.algorithm, sparse, dtype, knobs)).script()
    return [int(v) for v in re.findall(r"T\.parallel\((\d+)\)", text)]


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("comp", [Compression.DENSE, Compression.WEIGHT_PRUNING])
@pytest.mark.parametrize("conv", ["C=32,H=20,W=20,K=48,R=3,S=3,stride=1,pad=1",
                                  "C=24,H=28,W=28,K=24,R=3,S=3,stride=2,pad=1,groups=24"])
def test_stage_terms_count_the_built_kernels_loops(alg, comp, conv):
    from dlas_predict.measure.kernels.knobs import default_knobs

    from dlas_predict.space.config import Variant
    from dlas_predict.models.features import STAGE_TERMS, loop_counts

    spec = ConvSpec.parse(conv)
    ratio = 0.75 if comp is Compression.WEIGHT_PRUNING else 0.0
    cfg = KernelConfig(spec, alg, comp, ratio)
    tasks, ops, decodes, _ = loop_counts(cfg, default_knobs(spec, Variant(alg, comp, ratio),
                                                            DEV.simd_bits))
    assert tasks in _parallel_extents(cfg)  # the main loop's extent, as TVM builds it
    t = dict(zip(STAGE_TERMS, features(cfg, DEV)[-len(STAGE_TERMS):]))
    per_core = -(-tasks // DEV.cores) / tasks
    strided = spec.stride_w > 1
    assert t["stage_vector_ops_strided" if strided else "stage_vector_ops"] == \
        pytest.approx(ops * per_core)
    assert t["stage_vector_ops" if strided else "stage_vector_ops_strided"] == 0
    crs = spec.C // spec.groups * spec.R * spec.S
    if comp is Compression.DENSE:
        assert decodes == 0 and ops >= spec.macs / 16  # no vector op does more than 16 lanes
    else:  # every nonzero of every row is decoded once per task (and output tile)
        assert decodes >= tasks * (1 - ratio) * crs and ops >= decodes


def test_stage_model_learns_an_additive_law_and_extrapolates(tmp_path):
    """Latency = known costs × the stage terms: the stage-cost model recovers it, also on
    layers 4× larger than any it was trained on (where trees alone predict a constant)."""
    from dlas_predict.models.costmodel import StageCostModel
    from dlas_predict.models.features import STAGE_TERMS

    costs = {"stage_const": 2e-6, "stage_vector_ops": 1e-9, "stage_vector_ops_strided": 4e-9,
             "stage_decodes": 2e-9, "stage_layout_elems": 5e-10}
    cols = [FEATURE_NAMES.index(n) for n in costs]
    law = lambda X: X[:, cols] @ np.array(list(costs.values()))  # noqa: E731
    train = _corpus()
    model = StageCostModel().fit(train.X, law(train.X))
    assert len(model.scale_) == len(STAGE_TERMS)
    big = []
    for spec in _specs(10, 3):
        spec = ConvSpec(C=spec.C, H=spec.H * 4, W=spec.W * 4, K=spec.K, R=spec.R, S=spec.S,
                        pad_t=spec.pad_t, pad_l=spec.pad_l, pad_b=spec.pad_b, pad_r=spec.pad_r)
        for alg in ALGS:
            big.append(features(KernelConfig(spec, alg, Compression.WEIGHT_PRUNING, 0.8), DEV))
    big = np.array(big)
    assert costmodel.mape(model.predict(big), law(big)) < 0.01
    back = StageCostModel.from_dict(json.loads(json.dumps(model.to_dict())))
    np.testing.assert_array_equal(back.predict(big), model.predict(big))


def test_a_channel_pruned_csr_kernel_is_priced_like_the_csr_kernels_it_runs():
    """A CSR kernel runs the same loops whichever pattern its zeros follow: trained on
    weight-pruned CSR kernels only, the stage-cost model prices channel-pruned ones by their
    costs (here three times a dense kernel's), not by the costs fitted on every row."""
    from dlas_predict.models.costmodel import STAGE_FAMILY, StageCostModel

    sparse = FEATURE_NAMES.index("sparse")
    cols = [FEATURE_NAMES.index(n) for n in ("stage_const", "stage_vector_ops",
                                             "stage_decodes", "stage_layout_elems")]
    unit = np.array([2e-6, 1e-9, 2e-9, 5e-10])
    law = lambda X: (X[:, cols] @ unit) * np.where(X[:, sparse] > 0, 3.0, 1.0)  # noqa: E731
    train = _corpus()
    assert "channel_pattern" not in STAGE_FAMILY
    model = StageCostModel().fit(train.X, law(train.X))
    cp = np.array([features(KernelConfig(spec, alg, Compression.CHANNEL_PRUNING, 0.5), DEV)
                   for spec in _specs(10, 5) for alg in ALGS])
    assert costmodel.mape(model.predict(cp), law(cp)) < 0.02


def test_a_stage_model_saved_without_its_families_keeps_the_families_it_was_fitted_by():
    from dlas_predict.models.costmodel import _FAMILY, StageCostModel

    train = _corpus()
    legacy = StageCostModel(family=_FAMILY).fit(train.X, train.seconds)
    state = json.loads(json.dumps(legacy.to_dict()))
    assert state.pop("family") == list(_FAMILY)
    back = StageCostModel.from_dict(state)
    assert back.family == _FAMILY
    np.testing.assert_array_equal(back.predict(train.X), legacy.predict(train.X))
    with pytest.raises(ModelError, match="unknown columns"):
        StageCostModel.from_dict({**state, "family": ["no_such_column"]})


def test_load_refuses_a_model_without_its_stage_costs(fitted, tmp_path):
    tmp_path = _saved_copy(fitted, tmp_path)
    sidecar = tmp_path / "layer.json"
    meta = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({k: v for k, v in meta.items() if k != "stage"}))
    with pytest.raises(ModelError, match="stage-cost"):
        LayerCostModel.load(tmp_path)
    sidecar.write_text(json.dumps({**meta, "stage": {**meta["stage"], "scale": [1.0]}}))
    with pytest.raises(ModelError, match="other terms"):
        LayerCostModel.load(tmp_path)




@pytest.mark.parametrize("cls", [StageCostModel, RooflineBaseline, MacsLinearBaseline])
def test_every_kernel_model_shares_one_interface_and_round_trips(cls, tmp_path):
    corpus = _corpus()
    model = cls(name="m").fit(corpus.X, corpus.seconds)
    assert isinstance(model, costmodel.KernelCostModel)
    pred = model.predict(corpus.X)
    low, high = model.predict_interval(corpus.X)
    assert pred.shape == (len(corpus.X),) and np.all(low <= pred) and np.all(pred <= high)
    assert model.save(tmp_path) == tmp_path / "m.json"
    back = cls.load(tmp_path, "m")
    np.testing.assert_array_equal(back.predict(corpus.X), pred)
    with pytest.raises(ModelError, match="not a"):
        (RooflineBaseline if cls is not RooflineBaseline else MacsLinearBaseline).load(
            tmp_path, "m")
    with pytest.raises(ModelError, match="no"):
        cls.load(tmp_path)  # saved under another name than the default


def test_intervals_at_another_coverage_widen_or_narrow_around_the_prediction(fitted):
    """``predict_interval(X, q)``: the fitted 80 % interval as it is; a wider coverage
    gives a wider interval around the same median, a narrower one a narrower; a coverage
    outside (0, 1) is refused."""
    from dlas_predict.models.base import CostModel

    model, test = fitted[0], _corpus(seed=7)
    assert isinstance(model, CostModel)
    mid = model.predict(test.X)
    lo80, hi80 = model.predict_interval(test.X)
    lo95, hi95 = model.predict_interval(test.X, 0.95)
    lo50, hi50 = model.predict_interval(test.X, 0.5)
    assert np.all(lo95 <= lo80) and np.all(hi80 <= hi95)
    assert np.all(lo80 <= lo50) and np.all(lo50 <= mid) and np.all(hi50 <= hi80)
    assert np.any(hi95 > hi80) and np.any(hi50 < hi80)
    for q in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="coverage"):
            model.predict_interval(test.X, q)


@pytest.mark.slow  # trains a model to compare against
def test_the_numpy_tree_walk_predicts_what_lightgbm_predicts():
    """Every shipped layer model, read by models.trees, gives LightGBM's own predictions
    (NaN inputs too), so predicting need not import LightGBM."""
    import lightgbm as lgb

    from dlas_predict.models.trees import TreeFormatError, TreeModel, read_model_text
    from dlas_predict.paths import MODELS_STORE

    rng = np.random.default_rng(0)
    files = sorted(MODELS_STORE.glob("*/layer.*.txt.xz"))
    assert files
    for path in files:
        ours, theirs = TreeModel.load(path), lgb.Booster(model_str=read_model_text(path))
        X = rng.normal(size=(500, ours.num_feature())) * 4 + 4
        X[::9, 2] = np.nan
        X[::11, 5] = 0.0
        assert np.array_equal(ours.predict(X), theirs.predict(X)), path
    # a big batch with LightGBM loaded takes its C++ walk: the same numbers
    big = rng.normal(size=(2500, ours.num_feature())) * 4 + 4
    assert np.array_equal(ours.predict(big), ours._predict(np.unique(big, axis=0))[
        np.unique(big, axis=0, return_inverse=True)[1].reshape(-1)])
    with pytest.raises(TreeFormatError, match="not a LightGBM text model"):
        TreeModel.parse("hello", "x.txt")


@pytest.mark.slow
def test_a_tree_model_remembers_rows_and_files_without_changing_an_answer(tmp_path):
    """Rows predicted before are looked up, not walked: the same numbers alone, in another
    batch, or after the memo fills; a model file is parsed once until it changes."""
    import shutil

    from dlas_predict.models import trees
    from dlas_predict.models.trees import TreeModel
    from dlas_predict.paths import MODELS_STORE

    src = MODELS_STORE / "local" / "layer.median.txt.xz"
    path = tmp_path / "m.txt.xz"
    shutil.copy(src, path)
    model = TreeModel.load(path)
    assert TreeModel.load(path) is model
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, model.num_feature())) * 4 + 4
    fresh = TreeModel.parse(trees.read_model_text(src))
    first = model.predict(X)
    assert np.array_equal(first, fresh._predict(X))
    mixed = np.vstack([X[::-1][:100], rng.normal(size=(50, model.num_feature())) * 4 + 4])
    assert np.array_equal(model.predict(mixed), fresh._predict(mixed))
    old = trees._MEMO_ROWS
    try:
        trees._MEMO_ROWS = 10  # forgetting changes nothing either
        Y = rng.normal(size=(20, model.num_feature())) * 4 + 4
        assert np.array_equal(model.predict(Y), fresh._predict(Y))
        assert len(model._memo) == 20
        assert np.array_equal(model.predict(X), first)
    finally:
        trees._MEMO_ROWS = old
    trees.write_model_text(path, trees.read_model_text(src) + "\n")
    assert TreeModel.load(path) is not model  # a changed file is read again


def test_a_tree_model_parsed_once_is_kept_as_arrays_and_a_damaged_copy_is_parsed_again(
        tmp_path, monkeypatch):
    """A parsed model is cached under DLAS_HOME by its text: another process loads the
    arrays and predicts the same numbers; a damaged cached copy is parsed and written
    again."""
    import shutil

    from dlas_predict.models import trees
    from dlas_predict.models.trees import TreeModel
    from dlas_predict.paths import MODELS_STORE, cache_dir

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    src = MODELS_STORE / "local" / "layer.median.txt.xz"
    path = tmp_path / "m.txt.xz"
    shutil.copy(src, path)
    first = TreeModel.load(path)
    cached = list(cache_dir("trees").glob("*.npz"))
    assert len(cached) == 1
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, first.num_feature())) * 4 + 4
    trees._LOADED.clear()  # as a new process: from the arrays, not the text
    again = TreeModel.load(path)
    assert again is not first
    assert np.array_equal(again._predict(X),
                          TreeModel.parse(trees.read_model_text(src))._predict(X))
    for name in ("feature", "threshold", "left", "right", "leaf"):
        assert np.array_equal(getattr(again, name), getattr(first, name))
    cached[0].write_bytes(b"not an npz")
    trees._LOADED.clear()
    repaired = TreeModel.load(path)
    assert np.array_equal(repaired._predict(X), again._predict(X))
    with np.load(cached[0]) as z:  # written again, whole
        assert np.array_equal(z["leaf"], first.leaf)


def test_a_model_saved_again_unchanged_rewrites_no_file(tmp_path):
    """Models are saved xz-compressed and deterministically: saving the same model again
    (another training run's seconds aside) leaves every file, and its modification time, as
    it was; a changed model is written, and replaces an uncompressed file of its name."""
    import os

    from dlas_predict.models import trees

    corpus = _corpus()
    X, seconds = corpus.X[:40], corpus.seconds[:40]  # few rows: small trees, quick to pack
    model = LayerCostModel().fit(X, seconds)
    model.save(tmp_path)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["layer.json", "layer.median.txt.xz",
                                       "layer.q10.txt.xz", "layer.q90.txt.xz"]
    stamps = {f: f.stat().st_mtime_ns for f in files}
    for f in files:
        os.utime(f, ns=(1, 1))  # a rewrite would move it
    model.meta_["train_seconds"] = 123.0
    LayerCostModel.load(tmp_path).save(tmp_path)
    model.save(tmp_path)
    assert all(f.stat().st_mtime_ns == 1 for f in files), stamps
    back = LayerCostModel.load(tmp_path)
    assert np.array_equal(back.predict(X), model.predict(X))
    text = trees.read_model_text(tmp_path / "layer.median.txt.xz")
    (tmp_path / "n.txt").write_text(text)
    assert trees.model_file(tmp_path, "n") == tmp_path / "n.txt"  # plain, where only that
    assert trees.write_model_text(tmp_path / "n.txt.xz", text)
    assert not (tmp_path / "n.txt").exists()
    assert trees.model_file(tmp_path, "n") == tmp_path / "n.txt.xz"
    assert not trees.write_model_text(tmp_path / "n.txt.xz", text)
    assert trees.write_model_text(tmp_path / "n.txt.xz", text + "\n")


def test_a_sidecar_whose_floats_differ_in_their_last_bits_is_not_rewritten(tmp_path):
    """The same fit on another CPU's BLAS differs in the last bits of its floats: the
    sidecar says the same and is left as it was (the onnxruntime model's file too); a value
    that moves, a new field or a flag that becomes a number is written."""
    import os

    from dlas_predict.models.costmodel import same_meta, write_sidecar
    from dlas_predict.models.ortmodel import OrtLatencyModel

    meta = {"coef": [0.0019653256610083535, 0.0, 2], "q": {"fp32": -0.20210417839155995},
            "ok": True}
    again = {"coef": [0.0019653256610083518, 1e-17, 2], "q": {"fp32": -0.20210417839155997},
             "ok": True, "train_seconds": 3.0}
    path = write_sidecar(tmp_path, "m", meta)
    os.utime(path, ns=(1, 1))
    write_sidecar(tmp_path, "m", again)
    assert path.stat().st_mtime_ns == 1
    for changed in ({**meta, "coef": [0.00196533, 0.0, 2]}, {**meta, "new": 0},
                    {**meta, "ok": 1.0}, {**meta, "coef": [0.0019653256610083535, 0.0]}):
        assert not same_meta(meta, changed)
        write_sidecar(tmp_path, "m", changed)
        assert path.stat().st_mtime_ns != 1, changed
        write_sidecar(tmp_path, "m", meta)
        os.utime(path, ns=(1, 1))

    model = OrtLatencyModel()
    model.coef_, model.q10_, model.q90_ = {"fp32": [0.1, 0.2]}, {"fp32": -0.2}, {"fp32": 0.15}
    model.meta_, model.correction_ = {"n_train": 3}, {}
    saved = model.save(tmp_path)
    os.utime(saved, ns=(1, 1))
    model.coef_ = {"fp32": [0.1 * (1 + 1e-15), 0.2]}
    model.save(tmp_path)
    assert saved.stat().st_mtime_ns == 1
    model.coef_ = {"fp32": [0.11, 0.2]}
    model.save(tmp_path)
    assert saved.stat().st_mtime_ns != 1
    assert OrtLatencyModel.load(tmp_path).coef_ == {"fp32": [0.11, 0.2]}


def test_a_saved_model_keeps_only_what_prediction_reads_and_predicts_the_same(tmp_path):
    """Split gains, internal values, weights and counts and the header's tree sizes are
    dropped on saving: LightGBM and the numpy walk predict from the file what the booster
    predicts, to the bit; a booster's full text saved again rewrites nothing."""
    import lightgbm as lgb

    from dlas_predict.models import trees

    corpus = _corpus()
    X, y = corpus.X[:200], np.log(corpus.seconds[:200])
    booster = lgb.LGBMRegressor(n_estimators=30, num_leaves=15, verbose=-1).fit(X, y).booster_
    full = booster.model_to_string()
    assert "split_gain=" in full and "tree_sizes=" in full
    path = tmp_path / "m.txt.xz"
    assert trees.save_trees(booster, path)
    text = trees.read_model_text(path)
    assert len(text) < 0.8 * len(full)
    assert not any(f"{k}=" in text for k in ("split_gain", "internal_value", "internal_count",
                                              "leaf_count", "tree_sizes"))
    expect = booster.predict(X)
    assert np.array_equal(lgb.Booster(model_str=text).predict(X), expect)
    assert np.array_equal(trees.TreeModel.parse(text).predict(X), expect)
    assert not trees.save_trees(booster, path)


def test_a_loop_structure_its_family_lacks_takes_that_structures_costs_across_dtypes():
    """A family (here float16) measured on 1×1 layers only prices its 3×3 layers with the
    3×3 layers' costs of the other element types (fitted across them), not with its own
    1×1-only costs: 3×3 loops cost four times as much per vector op here, in every dtype."""
    from dlas_predict.models.costmodel import StageCostModel

    cols = [FEATURE_NAMES.index(n) for n in ("stage_const", "stage_vector_ops",
                                             "stage_layout_elems")]
    col_r = FEATURE_NAMES.index("R")
    unit = np.array([2e-6, 1e-9, 5e-10])
    law = lambda X: (X[:, cols] @ unit) * np.where(X[:, col_r] > 1, 4.0, 1.0)  # noqa: E731

    def rows(comp, r, n, seed):
        specs = [ConvSpec(C=s.C, H=s.H, W=s.W, K=s.K, R=r, S=r, pad_t=r // 2, pad_l=r // 2,
                          pad_b=r // 2, pad_r=r // 2) for s in _specs(n, seed)]
        return np.array([features(KernelConfig(s, Algorithm.DIRECT, comp, 0.0), DEV)
                         for s in specs])

    train = np.vstack([rows(Compression.DENSE, 3, 40, 1), rows(Compression.DENSE, 1, 40, 2),
                       rows(Compression.FLOAT16, 1, 40, 3)])
    model = StageCostModel().fit(train, law(train))
    held = rows(Compression.FLOAT16, 3, 20, 4)
    assert costmodel.mape(model.predict(held), law(held)) < 0.05
    # without the costs across element types, the family's 1×1-only costs are 4× too cheap
    own = StageCostModel.from_dict({**model.to_dict(), "costs": {
        k: v for k, v in model.costs_.items() if not k.startswith("any:")}})
    assert costmodel.mape(own.predict(held), law(held)) > 0.5
