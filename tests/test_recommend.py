"""recommend: the grid predicted by the shipped models, the accuracy budget, validation by
building and timing, the JSON schema, and one clear error for bad input."""
import json

import numpy as np
import pytest

from conftest import DEMO, assert_clean_error, run_cli
from dlas_predict.errors import DlasError
from dlas_predict.recommend.search import MODELS_STORE, ONNXRUNTIME, PER_LAYER, recommend
from dlas_predict.space.config import Tuning

SHIPPED = MODELS_STORE / "local"


_run = run_cli
_clean_error = assert_clean_error


def test_a_local_model_ships():
    for name in ("layer", "network"):
        meta = json.loads((SHIPPED / f"{name}.json").read_text())
        assert meta["device"] == "local" and meta["n_train"] > 0


def test_json_schema_and_ranking():
    res = _run("recommend", "zoo:resnet18-cifar", "--top", "500", "--max-accuracy-drop",
               "100", "--json")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert rec["network"] == "resnet18-cifar" and rec["device"] == "local"
    cands = rec["candidates"]
    # 3 unpruned + 2 × 10 pruned compressions, each × 3 algorithms, plus per-layer choices
    assert len(cands) >= 23 * 3
    # by predicted latency, except that onnxruntime fp32 (the reference) comes before a
    # candidate predicted less than 1 % faster
    ref_ms = rec["reference"]["predicted_ms"]
    times = [ref_ms if ref_ms * 0.99 <= c["predicted_ms"] <= ref_ms else c["predicted_ms"]
             for c in cands]
    assert times == sorted(times)
    for c in cands:
        assert set(c) >= {"config", "predicted_ms", "predicted_low_ms", "predicted_high_ms",
                          "accuracy", "accuracy_source", "measured_ms"}
        assert set(c["config"]) >= {"compression", "ratio", "algorithm", "sparse", "tuning"}
        assert c["predicted_low_ms"] <= c["predicted_ms"] <= c["predicted_high_ms"]
        assert c["measured_ms"] is None
        assert c["accuracy_source"].startswith("shipped curve")
        pruned = c["config"]["compression"].endswith("pruning")
        assert (c["config"]["ratio"] is not None) == pruned
    assert any(c["config"]["algorithm"] == PER_LAYER for c in cands)
    assert "predicted" in rec["latency_source"]


def test_accuracy_budget_drops_what_breaks_it():
    strict = recommend("zoo:mobilenetv1-cifar", max_accuracy_drop=0.0)
    loose = recommend("zoo:mobilenetv1-cifar", max_accuracy_drop=100.0)
    assert len(strict.candidates) < len(loose.candidates)
    assert all(c.accuracy_drop_pp <= 1e-9 for c in strict.candidates)
    assert any("accuracy drop" in why for _, why in strict.dropped)

    # the per-layer choice never predicts slower conv work than the best uniform algorithm
    groups: dict = {}
    for c in loose.candidates:
        groups.setdefault((c.compression, c.ratio, c.tuning), []).append(c)
    compared = 0
    for cands in groups.values():
        per_layer = [c for c in cands if c.algorithm == PER_LAYER]
        uniform = [c.conv_s for c in cands if c.algorithm not in (PER_LAYER, ONNXRUNTIME)]
        if not uniform:  # tuned ones predicted no faster than untuned are not listed
            continue
        for c in per_layer:
            assert c.conv_s <= min(uniform) * (1 + 1e-9), (c.label, c.conv_s, min(uniform))
            compared += 1
    assert compared >= 3


@pytest.mark.slow
def test_validate_builds_and_times_the_top_candidate(tmp_path):
    res = _run("recommend", DEMO, "--validate", "1", "--top", "3", "--json", "--quiet-wait", "0")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    measured = [c for c in rec["candidates"] if c["measured_ms"] is not None]
    ref = rec["reference"]
    # the top candidate, and onnxruntime fp32 (the reference) in the same run
    assert measured[0] == rec["candidates"][0]
    assert len(measured) == 1 or (len(measured) == 2
                                  and ref["config"] in [c["config"] for c in measured])
    assert ref["config"]["backend"] == "onnxruntime" and ref["measured_ms"] > 0
    # the fastest timed run (what the models predict) and, beside it, the median run
    assert 0 < measured[0]["measured_ms"] <= measured[0]["measured_median_ms"]
    # no labelled data and no shipped curve: the drop is predicted from the weights, and the
    # budget checked against its interval's upper end
    top = rec["candidates"][0]
    assert top["config"]["compression"] == "dense" or (
        top["accuracy_source"].startswith("predicted") and top["accuracy_drop_high_pp"] <= 1)


class _Timed:
    """A network runner (its own factory) that builds nothing: each plan's timing is
    ``timing(i, plan)``'s fields, verified and of every layer untuned."""

    def __init__(self, dev, timing) -> None:
        self.dev, self.timing = dev, timing

    def __call__(self) -> "_Timed":
        return self

    def __enter__(self) -> "_Timed":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def run(self, plans):
        from types import SimpleNamespace

        for i, p in enumerate(plans):
            yield SimpleNamespace(key=p.key(self.dev), error=None, verified=True,
                                  untuned_layers=None, details=None, **self.timing(i, p))


def test_a_per_layer_choice_of_one_algorithm_is_built_and_timed_once_for_both():
    """Validation builds each distinct network once: a per-layer choice that picked GEMM for
    every layer is the GEMM build, and gets its measurement (not a second run's noise)."""
    from types import SimpleNamespace

    from dlas_predict.recommend.validate import validate_top
    from dlas_predict.recommend.candidates import Candidate, Recommendation
    from dlas_predict.space.config import Compression

    gemm2 = (("gemm", False), ("gemm", False))
    mixed = (("direct", False), ("gemm", False))

    def cand(comp, alg, layers, ratio=None):
        return Candidate(comp, ratio, alg, layers, 1e-3, 1e-3, 1e-3)

    same = cand(Compression.INT8, PER_LAYER, gemm2)
    gemm = cand(Compression.INT8, "gemm", gemm2)
    other = cand(Compression.DENSE, PER_LAYER, mixed)
    pruned = cand(Compression.CHANNEL_PRUNING, PER_LAYER, gemm2, 0.5)  # no twin among them
    rec = Recommendation("net", "local", [same, gemm, other, pruned], [], [], 1e-3, {},
                         reference=cand(Compression.DENSE, ONNXRUNTIME, ()))
    dev = SimpleNamespace(name="local", fingerprint="f", measured_here=False)
    ran = []

    def timed(i, p):
        ran.append((p.config, p.algorithm))
        return {"best_s": (i + 2) * 1e-3, "median_s": (i + 2.5) * 1e-3}

    lines = []
    got = validate_top(rec, "net.onnx", dev, 4, log=lines.append,
                       network_runner=_Timed(dev, timed))
    assert got == [same, gemm, other, pruned]
    # one line per build as it is timed
    assert [line.split()[:2] for line in lines] == [["validate", f"[{i}/3]"] for i in (1, 2, 3)]
    # the time the table shows (the fastest run), and the median beside it
    assert ("tvm int8 gemm: 2.000 ms measured (fastest run; median 2.500), 1.000 ms "
            "predicted") in lines[0]
    assert ran == [("int8", "gemm"), ("dense", PER_LAYER), ("channel_pruning@0.5", PER_LAYER)]
    assert same.same_build_as == "int8 gemm" and same.measured_s == gemm.measured_s == 2e-3
    assert other.same_build_as is None and other.measured_s == 3e-3
    assert pruned.same_build_as is None and pruned.measured_s == 4e-3
    assert same.to_dict()["same_build_as"] == "int8 gemm" and "same_build_as" not in \
        other.to_dict()


def test_a_validation_timed_on_a_busy_machine_says_so():
    """A whole network timed while the probes saw the machine busy (the canary 1.3x its
    usual time) keeps its time, with a note that it is noisy; a quiet one has none."""
    from types import SimpleNamespace

    from dlas_predict.recommend.candidates import Candidate
    from dlas_predict.recommend.validate import measure_candidates
    from dlas_predict.space.config import Compression

    cands = [Candidate(Compression.DENSE, None, "gemm", (("gemm", False),), 1e-3, 1e-3, 1e-3),
             Candidate(Compression.INT8, None, "gemm", (("gemm", False),), 1e-3, 1e-3, 1e-3)]
    dev = SimpleNamespace(name="local", fingerprint="f", measured_here=True)
    runner = _Timed(dev, lambda i, p: {"best_s": 2e-3, "median_s": 2e-3, "contention": 1.0,
                                       "slowdown": (1.30, 1.01)[i]})
    measure_candidates("net.onnx", "net", dev, cands, network_runner=runner)
    assert cands[0].measured_s == 2e-3 and cands[0].measured_note.startswith("noisy")
    assert "canary ×1.30" in cands[0].measured_note
    assert cands[1].measured_s == 2e-3 and cands[1].measured_note is None


def test_table_output_names_sources():
    res = _run("recommend", "zoo:resnet18-cifar", "--top", "5")
    assert res.exit_code == 0, res.output
    assert "predicted ms" in res.output and "80% interval" in res.output
    assert "accuracy source: shipped curve" in res.output
    assert "speedup" in res.output


def test_bad_input(tmp_path):
    _clean_error(_run("recommend", "zoo:resnet18-cifar", "--device", "pentium"),
                 "unknown device")
    _clean_error(_run("recommend", tmp_path / "missing.onnx"), "not found")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file")
    _clean_error(_run("recommend", bad), "bad.onnx")
    from dlas_predict.networks.generate import generate

    import onnx

    tr = generate("transformer", ["layers=1", "d_model=32", "seq=8"], tmp_path / "tr")[0].path
    model = onnx.load(str(tr))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "sequence"
    onnx.save(model, tmp_path / "open.onnx")  # a sequence length left open
    _clean_error(_run("recommend", tmp_path / "open.onnx"), "unknown operand shapes")
    _clean_error(_run("recommend", DEMO, "--validate", "some"), "--validate")
    _clean_error(_run("recommend", DEMO, "--top", "0"), "--top")
    _clean_error(_run("recommend", DEMO, "--max-accuracy-drop", "-1"), "max-accuracy-drop")
    empty = tmp_path / "models"
    empty.mkdir()
    _clean_error(_run("recommend", DEMO, "--models", empty), "no cost model")


def test_corrupt_network_model_is_refused(tmp_path):
    import shutil

    shutil.copytree(SHIPPED, tmp_path / "m")
    (tmp_path / "m" / "network.json").write_text("{garbage")
    with pytest.raises(DlasError, match="not valid JSON"):
        recommend("zoo:resnet18-cifar", models_dir=tmp_path / "m")
    shutil.copytree(SHIPPED, tmp_path / "m2")
    (tmp_path / "m2" / "layer.median.txt.xz").write_bytes(b"garbage")
    with pytest.raises(DlasError, match="cannot load"):
        recommend("zoo:resnet18-cifar", models_dir=tmp_path / "m2")


def test_network_model_save_load_predict_equal(tmp_path):
    from dlas_predict.models.netmodel import NET_TERMS, NetworkCostModel, NetworkInputs

    rng = np.random.default_rng(0)
    T = np.abs(rng.normal(size=(60, len(NET_TERMS)))) * 1e-3
    true = np.zeros(len(NET_TERMS))
    true[0], true[6] = 1.1, 0.5
    whole = T @ true * np.exp(0.02 * rng.normal(size=60))
    m = NetworkCostModel(cache_bytes=32 << 20).fit(NetworkInputs.point(T, T[:, 0]), whole)
    assert m.coef_[0] == pytest.approx(1.1, rel=0.1) and np.all(m.coef_ >= 0)
    m.save(tmp_path)
    back = NetworkCostModel.load(tmp_path)
    assert back.cache_bytes == 32 << 20
    conv = T[:, 0]
    X = NetworkInputs(T, conv, conv * 0.9, conv * 1.1)
    assert np.allclose(m.predict(X), back.predict(X))
    for a, b in zip(m.predict_interval(X), back.predict_interval(X)):
        assert np.allclose(a, b)
    mid, (lo, hi) = back.predict(X), back.predict_interval(X)
    assert np.all(lo <= mid) and np.all(mid <= hi)
    with pytest.raises(DlasError, match="whole-network"):
        NetworkCostModel().fit(NetworkInputs.point(T[:3], T[:3, 0]), whole[:3])
    meta = json.loads((tmp_path / "network.json").read_text())
    (tmp_path / "network.json").write_text(json.dumps({**meta, "cache_bytes": None}))
    with pytest.raises(DlasError, match="cache size"):
        NetworkCostModel.load(tmp_path)
    meta["coef"][0] = -1
    (tmp_path / "network.json").write_text(json.dumps(meta))
    with pytest.raises(DlasError, match="invalid"):
        NetworkCostModel.load(tmp_path)


def test_network_model_correction_learns_what_terms_miss(tmp_path):
    """A latency the linear terms cannot express (a factor that depends on a network feature)
    is learned by the correction, predicted alike after save → load, and an interval is
    widened by out-of-fold errors; a correction whose file is missing is one clear error."""
    from dlas_predict.models.netmodel import (CORRECTION_FEATURES, NET_FEATURE_NAMES,
                                              NET_TERMS, NetworkCostModel, NetworkInputs)

    rng = np.random.default_rng(1)
    n = 240
    T = np.abs(rng.normal(size=(n, len(NET_TERMS)))) * 1e-3
    F = rng.normal(size=(n, len(NET_FEATURE_NAMES)))
    layers = NET_FEATURE_NAMES.index("layers")
    F[:, layers] = rng.integers(2, 40, size=n)
    factor = np.where(F[:, layers] > 20, 1.3, 0.8)  # deeper networks: slower than the terms
    whole = T[:, 0] * factor * np.exp(0.01 * rng.normal(size=n))
    groups = [f"net{i % 48}" for i in range(n)]
    T[:, 1:] = 0
    X = NetworkInputs.point(T, T[:, 0], F)
    linear = NetworkCostModel().fit(NetworkInputs.point(T, T[:, 0]), whole)
    assert linear.correction_ is None  # no features: the linear model alone
    few = NetworkCostModel().fit(X, whole, groups=[f"net{i % 5}" for i in range(n)])
    assert few.correction_ is None  # too few networks to learn a correction from
    m = NetworkCostModel().fit(X, whole, groups=groups)
    assert m.meta_["correction"] == list(CORRECTION_FEATURES)
    err = lambda model: np.median(np.abs(model.predict(X) / whole - 1))
    assert err(m) < 0.05 < err(linear)
    m.save(tmp_path)
    back = NetworkCostModel.load(tmp_path)
    assert np.allclose(m.predict(X), back.predict(X))
    lo, hi = back.predict_interval(X)
    assert np.all(lo <= back.predict(X)) and np.all(back.predict(X) <= hi)
    with pytest.raises(DlasError, match="network features"):
        back.predict(NetworkInputs.point(T, T[:, 0]))
    # kernels mapped to a device 3x slower: the linear part scales, while the correction
    # reads the model's own device's terms, so its factor is the same
    slower = NetworkInputs(3 * T, 3 * T[:, 0], 3 * T[:, 0], 3 * T[:, 0], F, correction_terms=T)
    assert np.allclose(back.predict(slower), 3 * back.predict(X))
    linear.save(tmp_path)  # a fit without correction removes the old one's file
    assert not (tmp_path / "network.correction.txt.xz").exists()
    m.save(tmp_path)
    (tmp_path / "network.correction.txt.xz").unlink()
    with pytest.raises(DlasError, match="missing"):
        NetworkCostModel.load(tmp_path)



def test_network_terms_scale_each_kernel_family():
    from dlas_predict.space.config import Compression
    from dlas_predict.models.netmodel import NET_TERMS, net_terms
    from dlas_predict.networks.summary import NetworkSummary

    summary = NetworkSummary(conv_layers=3, layers=7, nonconv_macs=0, nonconv_bytes=2_000_000,
                             activation_ops=3, elementwise_ops=1, input_elems=3072,
                             exp_elems=5_000, broadcast_bytes=1_000_000,
                             product_out_elems=6_000, product_narrow_macs=9_000)
    terms = dict(zip(NET_TERMS, net_terms(summary, [1e-3, 2e-3, 4e-3],
                                          Compression.parse("weight_pruning"),
                                          [("gemm", True), ("gemm", True), ("direct", False)],
                                          [1e6, 2e6, 3e6], 4_500_000)))
    assert terms["conv_s_csr_gemm"] == pytest.approx(3e-3)
    assert terms["conv_s_float32_direct"] == pytest.approx(4e-3)  # a dense kernel on a pruned layer
    assert terms["conv_s_mixed"] == pytest.approx(7e-3)  # mixed plan: two algorithms, CSR and dense
    assert sum(v for k, v in terms.items() if k.startswith("conv_s_") and k != "conv_s_mixed") \
        == pytest.approx(7e-3)
    assert terms["nonconv_gb"] == pytest.approx(2e-3) and terms["nonconv_gb_int8"] == 0
    assert terms["broadcast_gb"] == pytest.approx(1e-3)  # counted in nonconv_gb too
    # the weights beyond the last-level cache stream from memory; exponentials in float32
    assert terms["weight_gb_beyond_cache"] == pytest.approx(1.5e-3)
    assert terms["exp_gelems"] == pytest.approx(5e-6) and terms["exp_gelems_float16"] == 0
    assert terms["product_gelems"] == pytest.approx(6e-6)  # what attention's products write
    assert terms["product_gmacs_narrow"] == pytest.approx(9e-6)
    one = dict(zip(NET_TERMS, net_terms(summary, [1e-3, 1e-3, 1e-3], Compression.parse("int8"),
                                        [("spatial_pack", False)] * 3, [1e6] * 3, 4_500_000)))
    assert one["conv_s_int8_spatial_pack"] == pytest.approx(3e-3) and one["conv_s_mixed"] == 0
    assert one["nonconv_gb_int8"] == pytest.approx(2e-3)
    assert one["weight_gb_beyond_cache"] == 0  # they fit
    half = dict(zip(NET_TERMS, net_terms(summary, [1e-3] * 3, Compression.parse("float16"),
                                         [("direct", False)] * 3, [1e6] * 3, 0)))
    assert half["exp_gelems_float16"] == pytest.approx(5e-6)
    assert half["weight_gb_beyond_cache"] == pytest.approx(3e-3)  # no cache known


def test_ranker_orders_by_speed():
    from dlas_predict.models.netmodel import ConfigRanker

    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 5))
    secs = np.exp(X[:, 0])
    groups = [f"net{i % 6}" for i in range(120)]
    scores = ConfigRanker(seed=0).fit(X, secs, groups).predict(X)
    # higher score = faster: strongly anti-correlated with the latency
    assert np.corrcoef(scores, secs)[0, 1] < -0.5


def test_a_grid_of_some_compressions_prices_them_as_the_full_grid_does():
    """``compressions`` leaves rows out of the grid without changing the others' latencies;
    dense, the speedups' reference, cannot be left out."""
    from dlas_predict.space.config import Compression

    full = recommend("zoo:resnet18-cifar", max_accuracy_drop=float("inf"), top=0,
                     tuning="untuned", ratios=(0.9,))
    some = recommend("zoo:resnet18-cifar", max_accuracy_drop=float("inf"), top=0,
                     tuning="untuned", ratios=(0.9,),
                     compressions=(Compression.DENSE, Compression.INT8))
    assert {c.compression for c in some.candidates} == {Compression.DENSE, Compression.INT8}
    key = lambda c: (c.compression, c.algorithm)  # noqa: E731
    want = {key(c): c.predicted_s for c in full.candidates
            if c.compression in (Compression.DENSE, Compression.INT8)}
    assert {key(c): c.predicted_s for c in some.candidates} == pytest.approx(want, rel=1e-9)
    assert some.dense_baseline_s == pytest.approx(full.dense_baseline_s, rel=1e-9)
    with pytest.raises(DlasError, match="must include dense"):
        recommend("zoo:resnet18-cifar", compressions=(Compression.INT8,))


def test_onnxruntime_is_in_the_grid_and_its_fp32_is_the_reference():
    rec = recommend("zoo:resnet18-cifar", max_accuracy_drop=100.0)
    ort = [c for c in rec.candidates if c.backend == "onnxruntime"]
    assert {c.compression.value for c in ort} == {"dense", "float16", "int8",
                                                  "channel_pruning"}
    assert rec.reference in ort and rec.reference.compression.value == "dense"
    # its own model's, or (its model another machine's) the map's, as our rows
    assert all(c.layers == () for c in ort)
    assert {c.source for c in ort} == {"trained" if rec.source == "trained" else rec.source}
    # one skipped grid point per weight-pruning ratio, each named
    sparse = [label for label, why in rec.skipped if "no sparse kernel" in why]
    assert sparse and len(sparse) == len(set(sparse))
    assert all(label.startswith("weight_pruning@") and label.endswith(" onnxruntime")
               for label in sparse)
    # channel pruning removes work; the ranking is one list, both backends in it
    cp = [c for c in ort if c.compression.value == "channel_pruning"]
    assert max(c.predicted_s for c in cp if c.ratio >= 0.9) < rec.reference.predicted_s
    ref_s = rec.reference.predicted_s
    times = [ref_s if ref_s * 0.99 <= c.predicted_s <= ref_s else c.predicted_s
             for c in rec.candidates]
    assert times == sorted(times)
    out = rec.to_dict(top=5)
    assert out["reference"]["config"]["backend"] == "onnxruntime"
    res = _run("recommend", "zoo:resnet18-cifar", "--top", "3")
    assert res.exit_code == 0, res.output
    assert "onnxruntime (ref)" in res.output
    assert "speedup over onnxruntime fp32, the reference" in res.output


def test_without_an_onnxruntime_model_the_reference_is_ours(tmp_path):
    import shutil

    models = tmp_path / "models"
    shutil.copytree(SHIPPED, models)
    (models / "onnxruntime.json").unlink()
    rec = recommend("zoo:resnet18-cifar", models_dir=models)
    assert rec.reference is None
    assert all(c.backend == "tvm" for c in rec.candidates)
    assert any(label == "onnxruntime" and "no onnxruntime model" in why
               for label, why in rec.skipped)
    res = _run("recommend", "zoo:resnet18-cifar", "--models", models, "--top", "3")
    assert res.exit_code == 0, res.output
    assert "speedup over the fastest predicted dense configuration" in res.output


def test_channel_pruning_is_priced_as_the_network_with_its_zeroed_filters_removed():
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.recommend.search import _grid
    from dlas_predict.space.config import Compression

    convs = read_network(zoo.resolve("zoo:resnet18-cifar")).convs()
    cp = next(p for p in _grid(convs, "zoo:resnet18-cifar", (0.9,), [])
              if p.compression is Compression.CHANNEL_PRUNING)
    assert sum(s.macs for s in cp.specs) < 0.5 * sum(c.spec.macs for c in convs)
    # the residual network keeps the zeroed filters that feed its additions
    assert any(r > 0 for r in cp.layer_ratios) and any(r == 0 for r in cp.layer_ratios)
    assert cp.summary.conv_io_bytes < sum(4 * (c.spec.C * c.spec.H * c.spec.W + c.spec.K *
                                               c.spec.OH * c.spec.OW) for c in convs)
    rec = recommend("zoo:resnet18-cifar", max_accuracy_drop=100.0, ratios=(0.9,))
    gemm = {c.compression: c for c in rec.candidates
            if c.algorithm == "gemm" and c.backend == "tvm"}
    # CSR where zeroed filters are left, the dense kernel on the removed layers
    assert gemm[Compression.CHANNEL_PRUNING].layers == tuple(("gemm", r > 0)
                                                            for r in cp.layer_ratios)
    assert gemm[Compression.CHANNEL_PRUNING].predicted_s < gemm[Compression.DENSE].predicted_s


def test_onnxruntime_rows_move_with_the_map_where_its_model_is_another_machines(monkeypatch):
    """With the layer model mapped from a reference machine, onnxruntime's rows (its model
    that reference's) are scaled by the network's ratio of mapped to reference dense float32
    kernel time and take the map's source; where our kernels' code is not the CPU's own
    instruction set, which onnxruntime runs, their work (not their per-op costs) also by the
    map's compute term between the two; on the machine the model was trained on, they stay as predicted."""
    from types import SimpleNamespace

    from dlas_predict.crossdev import transfer

    from dlas_predict.recommend.search import _map_onnxruntime
    from dlas_predict.recommend.candidates import Candidate
    from dlas_predict.space.config import Algorithm, Compression, Tuning

    def rows():
        return [Candidate(Compression.DENSE, None, ONNXRUNTIME, (), 2e-3, 1.8e-3, 2.2e-3),
                Candidate(Compression.INT8, None, ONNXRUNTIME, (), 1e-3, 0.9e-3, 1.1e-3)]

    kernels = [("spec", Algorithm.DIRECT, Compression.DENSE, 0.0, Tuning.UNTUNED),
               ("spec", Algorithm.GEMM, Compression.DENSE, 0.0, Tuning.UNTUNED),
               ("spec", Algorithm.DIRECT, Compression.INT8, 0.0, Tuning.UNTUNED),
               ("spec", Algorithm.DIRECT, Compression.DENSE, 0.0, Tuning.TUNED)]
    own = np.array([1.0, 3.0, 5.0, 7.0])
    mid = np.array([0.5, 1.5, 50.0, 70.0])  # dense untuned: ×0.5 (int8 and tuned: not read)
    low, high = mid * 0.5, mid * 3.0
    model = SimpleNamespace(meta={"onnxruntime_fingerprints": ["aaaa"], "cpu_model": "Zen"})
    cpu = dict(kind="cpu", simd_bits=256)
    su = SimpleNamespace(mapping=SimpleNamespace(source="zero-shot", onnxruntime_offsets={},
                                                 alpha=0.8),
                         ort_model=model,
                         dev=SimpleNamespace(name="local", fingerprint="bbbb", **cpu),
                         ref_dev=SimpleNamespace(name="local", fingerprint="aaaa", **cpu),
                         ort_here=False, ort_elsewhere=True, ort_machine="Zen", notes=[])
    monkeypatch.setattr(transfer, "onnxruntime_roof_ratio", lambda dev: 1.0)
    ort = rows()
    _map_onnxruntime(ort, su, kernels, own, (mid, low, high))
    assert [c.predicted_s for c in ort] == pytest.approx([1e-3, 0.5e-3])
    assert [c.source for c in ort] == ["zero-shot", "zero-shot"]
    assert ort[0].low_s == pytest.approx(1.8e-3 * 0.5 * 0.5)
    assert ort[0].high_s == pytest.approx(2.2e-3 * 0.5 * 3.0)
    assert len(su.notes) == 1 and "scaled by ×0.50" in su.notes[0]
    assert "instruction sets" not in su.notes[0]
    # this device's kernels run code of half the width its CPU's own (which onnxruntime
    # runs): its rows take the map's compute term between the two, 2 ** -alpha
    monkeypatch.setattr(transfer, "onnxruntime_roof_ratio",
                        lambda dev: 2.0 if dev.fingerprint == "bbbb" else 1.0)
    ort, su.notes = rows(), []
    _map_onnxruntime(ort, su, kernels, own, (mid, low, high))
    assert [c.predicted_s for c in ort] == pytest.approx([1e-3 * 2 ** -0.8,
                                                          0.5e-3 * 2 ** -0.8])
    assert "instruction sets" in su.notes[0]
    # that term moves its work, not its per-op costs (the model's fixed terms' share)
    ort, su.notes = rows(), []
    ort[0].fixed_share = 0.25
    _map_onnxruntime(ort, su, kernels, own, (mid, low, high))
    assert ort[0].predicted_s == pytest.approx(1e-3 * (0.25 + 0.75 * 2 ** -0.8))
    assert ort[1].predicted_s == pytest.approx(0.5e-3 * 2 ** -0.8)
    # trained here (or no map): untouched
    here = SimpleNamespace(name="local", fingerprint="aaaa")
    same = rows()
    _map_onnxruntime(same, SimpleNamespace(mapping=su.mapping, ort_model=model, dev=here,
                                           ort_here=True, ort_elsewhere=False,
                                           ort_machine="Zen", notes=[]),
                     kernels, own, (mid, low, high))
    assert [c.predicted_s for c in same] == [2e-3, 1e-3]
    assert {c.source for c in same} == {"trained"}
    same = rows()
    _map_onnxruntime(same, SimpleNamespace(mapping=None, ort_model=model, dev=su.dev,
                                           ort_here=False, ort_elsewhere=True,
                                           ort_machine="Zen", notes=[]),
                     kernels, own, (mid, low, high))
    assert [c.predicted_s for c in same] == [2e-3, 1e-3]


def test_no_gain_ranks_after_the_reference_and_a_doubtful_lead_is_flagged():
    from dlas_predict.recommend.search import _rank
    from dlas_predict.recommend.candidates import Candidate
    from dlas_predict.space.config import Compression

    def cand(comp, alg, s, high, accuracy=0.99):
        return Candidate(comp, None, alg, (), s, s * 0.8, high, accuracy=accuracy,
                         accuracy_drop_pp=None if accuracy is None else 0.0)

    ref = cand(Compression.DENSE, ONNXRUNTIME, 1.0e-3, 1.2e-3)
    tie = cand(Compression.FLOAT16, ONNXRUNTIME, 0.995e-3, 1.2e-3)    # 0.5 % faster
    sure = cand(Compression.INT8, "gemm", 0.5e-3, 0.8e-3)             # interval under ref
    doubt = cand(Compression.DENSE, "direct", 0.8e-3, 1.3e-3)         # interval reaches it
    slow = cand(Compression.DENSE, "gemm", 2e-3, 3e-3)
    blind = cand(Compression.CHANNEL_PRUNING, "gemm", 0.1e-3, 0.2e-3, None)  # accuracy unknown
    blind2 = cand(Compression.INT8, "direct", 0.3e-3, 0.4e-3, None)
    kept = [slow, blind2, tie, doubt, ref, blind, sure]
    _rank(kept, ref)
    # an unchecked compression is never the first answer, however fast: after the reference
    assert kept == [sure, doubt, ref, blind, blind2, tie, slow]
    assert sure.warning is None and ref.warning is None and tie.warning is None
    assert doubt.warning.startswith("not surely faster than onnxruntime fp32")
    assert "warning" in doubt.to_dict() and "warning" not in sure.to_dict()
    # no onnxruntime reference: the fastest dense candidate is the one they follow
    kept = [slow, blind, sure, doubt]
    _rank(kept, None)
    assert kept == [sure, doubt, blind, slow]


@pytest.mark.parametrize("name", ["mobilenetv2-cifar", "bert-tiny-cifar"])
def test_an_exported_zoo_network_keeps_its_measured_accuracy_curve(tmp_path, name):
    """A CNN, and a matrix network (whose grid form holds its weights reshaped)."""
    from dlas_predict.networks import zoo

    path = zoo.export(name, tmp_path / "copy.onnx")
    rec = recommend(str(path), max_accuracy_drop=100.0)
    assert rec.network == "copy"
    assert all(c.accuracy_source.startswith("shipped curve") for c in rec.candidates)
    assert any(f"copy.onnx holds the weights of zoo:{name}" in n for n in rec.notes)


def test_without_data_a_network_s_accuracy_is_predicted_and_the_budget_checks_the_upper_end():
    from dlas_predict.space.config import Compression

    rec = recommend(str(DEMO), max_accuracy_drop=1.0)
    predicted = [c for c in rec.candidates if c.accuracy_source.startswith("predicted")]
    assert predicted, "no candidate was priced by the accuracy-cost model"
    for c in predicted:
        assert c.accuracy is None and c.accuracy_drop_pp <= c.accuracy_drop_high_pp <= 1.0
    assert not any(c.unchecked for c in rec.candidates)
    assert any(why.startswith("predicted drop up to") for _, why in rec.dropped)
    # removing nine channels in ten is never kept within one point
    assert not any(c.compression is Compression.CHANNEL_PRUNING and c.ratio >= 0.9
                   for c in rec.candidates)
    loose = recommend(str(DEMO), max_accuracy_drop=100.0)
    assert len(loose.candidates) > len(rec.candidates)
    row = next(c for c in loose.candidates if c.accuracy_source.startswith("predicted"))
    assert row.to_dict()["accuracy_drop_high_pp"] == row.accuracy_drop_high_pp


def test_without_data_a_transformer_s_accuracy_is_predicted_too(tmp_path):
    """A matrix network of the user's (no curve, no data): its compressions priced by the
    accuracy-cost model, the budget checked against the interval's upper end."""
    import onnx

    from dlas_predict.networks.generate import build
    from dlas_predict.space.config import Compression

    path = tmp_path / "enc.onnx"
    onnx.save(build("transformer", {"layers": 1, "d_model": 32, "heads": 2, "ffn": 2,
                                    "seq": 8, "batch": 1}), str(path))
    rec = recommend(str(path), max_accuracy_drop=100.0)
    compressed = [c for c in rec.candidates if c.compression is not Compression.DENSE]
    assert compressed and all(c.accuracy_source.startswith("predicted") for c in compressed)
    strict = recommend(str(path), max_accuracy_drop=1.0)
    assert all(c.accuracy_drop_high_pp <= 1.0 for c in strict.candidates
               if c.compression is not Compression.DENSE)


def test_random_weights_are_not_priced_and_stay_unchecked():
    from dlas_predict.recommend.accuracy import Accuracies
    from dlas_predict.space.config import Compression

    acc = Accuracies("zoo:resnet50", "resnet50", None,
                     unpredictable="its weights are random (nothing to predict from)")
    fig = acc.get(Compression.CHANNEL_PRUNING, 0.5)
    assert fig.value is None and fig.drop_pp is None
    assert fig.source.startswith("unknown") and "random" in fig.source
    assert acc.get(Compression.DENSE, None).drop_pp == 0


def test_the_header_counts_each_accuracy_source():
    res = _run("recommend", DEMO, "--top", "3")
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if l.startswith("accuracy of the kept"))
    assert "predicted" in line and "uncompressed" in line and "dropped as over the budget" in line


def test_fine_tune_needs_data_to_measure_on():
    _clean_error(_run("recommend", "zoo:mobilenetv1-cifar", "--fine-tune", "1"), "give --data")
    _clean_error(_run("recommend", DEMO, "--fine-tune", "1"), "give --data")
    _clean_error(_run("recommend", "zoo:mobilenetv1-cifar", "--fine-tune", "-1", "--data",
                      "digits"), "0 or more epochs")


@pytest.mark.slow
def test_fine_tuned_pruning_is_measured_and_said_so():
    from dlas_predict.space.config import Compression

    rec = recommend("zoo:mobilenetv1-cifar", max_accuracy_drop=100.0, data="digits",
                    ratios=(0.5,), compressions=(Compression.DENSE,
                                                 Compression.WEIGHT_PRUNING),
                    finetune_epochs=1, tuning="untuned")
    pruned = [c for c in rec.candidates if c.compression is Compression.WEIGHT_PRUNING]
    assert pruned and all("fine-tuned 1 epochs" in c.accuracy_source for c in pruned)
    dense = next(c for c in rec.candidates if c.compression is Compression.DENSE)
    assert "fine-tuned" not in dense.accuracy_source
    # the shipped curve: 1 epoch of fine-tuning holds weight pruning at 0.5 within a point
    assert pruned[0].accuracy_drop_pp < 2


def test_a_tuned_candidate_predicted_no_faster_than_untuned_is_not_listed():
    """Tuning that is predicted to gain nothing costs its search for nothing: such a tuned
    candidate is skipped, with the reason, and every tuned one kept beats its untuned
    twin (the shipped model of local, which learned tuned kernels, on any CPU)."""
    rec = recommend("zoo:resnet18-cifar", max_accuracy_drop=100.0,
                    models_dir=MODELS_STORE / "local")
    untuned = {(c.backend, c.compression, c.ratio, c.algorithm, c.layers): c.predicted_s
               for c in rec.candidates if c.tuning is Tuning.UNTUNED}
    tuned = [c for c in rec.candidates if c.tuning is Tuning.TUNED]
    assert tuned
    for c in tuned:
        twin = untuned.get((c.backend, c.compression, c.ratio, c.algorithm, c.layers))
        assert twin is None or c.predicted_s < twin, c.label
    skipped = [label for label, why in rec.skipped if "no faster tuned than untuned" in why]
    # one entry per candidate: the command line counts them
    assert skipped and all(label.endswith(" tuned") and ", " not in label for label in skipped)



def test_a_matrix_network_says_which_network_model_prices_it(tmp_path):
    """A device whose models measured matrix networks prices one by their network model; one
    whose models measured CNNs alone says so, and that its rows are unproven."""
    import onnx

    from dlas_predict.networks.generate import build
    from dlas_predict.space.devices import model_dir

    path = tmp_path / "enc.onnx"
    onnx.save(build("transformer", {"layers": 1, "d_model": 32, "heads": 2, "ffn": 2,
                                    "seq": 8, "batch": 1}), str(path))
    for device in ("local-avx2-2t", "local-avx2-1t"):
        has_matrix = (model_dir(device) / "network_matrix.json").is_file()
        rec = recommend(str(path), device, max_accuracy_drop=100.0, top=1)
        note = next(n for n in rec.notes if "is a matrix network" in n)
        assert ("the network model of matrix networks prices the rest" in note) == has_matrix
        assert ("network model of CNNs prices the rest" in note) == (not has_matrix)


def test_channel_pruning_of_a_matrix_network_is_what_removing_its_neurons_builds(tmp_path):
    """An MLP's channel-pruned rows are the smaller network its removed neurons leave: fewer
    multiply-adds, onnxruntime's priced by its model of matrix networks in float32 (a dense
    matrix network), below the dense row. A recurrent network's gates are tied, so nothing
    is removed: its onnxruntime row and a per-layer plan of dense kernels would be the dense
    network, less accurate, and are left out with that reason."""
    from dlas_predict.networks import generate as gen
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.zoo import resolve

    fc = gen.generate("fc", ["layers=2", "nodes=256"], tmp_path)[0].path
    rec = recommend(str(fc), "local", top=0, tuning="untuned", max_accuracy_drop=float("inf"))
    ort = {c.label: c for c in rec.candidates if c.backend == "onnxruntime"}
    pruned = ort["channel_pruning@0.9 onnxruntime"]
    assert pruned.ort_mode == "channel_pruning"
    assert pruned.predicted_s < ort["dense onnxruntime"].predicted_s
    from dlas_predict.compression.compress import cached_channel_removed

    layers, _ = cached_channel_removed(str(fc), [0.9])[0.9]
    dense = read_network(resolve(fc)).convs()
    assert sum(s.macs for s, _ in layers) < 0.5 * sum(c.spec.macs for c in dense)
    rnn = gen.generate("rnn", ["hidden=16", "embedding=8", "vocab=50", "seq=4"], tmp_path)[0]
    rec = recommend(str(rnn.path), "local", top=0, tuning="untuned",
                    max_accuracy_drop=float("inf"))
    why = dict(rec.skipped)
    assert "no zeroed filter could be removed" in why["channel_pruning@0.5 onnxruntime"]
    assert not [c for c in rec.candidates if c.compression.value == "channel_pruning" and
                (c.backend == "onnxruntime" or not any(s for _, s in c.layers))]
