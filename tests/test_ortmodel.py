"""The onnxruntime latency model: fitted on whole networks run by onnxruntime, per mode."""
import json
from dataclasses import replace

import numpy as np
import pytest

from dlas_predict.measure.networks.plans import NetworkMeasurement, onnxruntime_plan
from dlas_predict.corpus.store import CorpusStore
from dlas_predict.errors import DlasError
from dlas_predict.networks.summary import NetworkSummary
from dlas_predict.models.ortmodel import (OrtInputs, OrtLatencyModel, TERMS, model_mode, nothing_removed,
                                          ort_terms, training_rows)
from dlas_predict.space.config import ConvSpec
from dlas_predict.space.devices import get_device

#: seconds per unit of each term: a law the fit should find again
LAW = np.array([2e-5, 4e-3, 2e-2, 1e-5, 0.0, 2e-5, 1e-6, 3e-6, 0.0, 0.0, 3e-3, 1e-6, 2e-3,
                1e-6, 5e-3, 2e-6, 1e-6, 0.0, 0.0, 0.0, 2e-3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def _net(rng, i):
    n = int(rng.integers(2, 6))
    c, h = int(rng.choice([16, 32, 64])), int(rng.choice([8, 16, 32]))
    specs = [ConvSpec(C=3, H=h, W=h, K=c, R=3, S=3, pad_t=1, pad_l=1, pad_b=1, pad_r=1)]
    for j in range(n):
        if j % 2:
            specs.append(ConvSpec(C=c, H=h, W=h, K=c, R=3, S=3, pad_t=1, pad_l=1, pad_b=1,
                                  pad_r=1, groups=c))
        else:
            specs.append(ConvSpec(C=c, H=h, W=h, K=c, R=1, S=1))
    summary = NetworkSummary(conv_layers=len(specs), layers=2 * len(specs) + 3,
                             nonconv_macs=1000, nonconv_bytes=int(8 * c * h * h),
                             activation_ops=len(specs), elementwise_ops=1,
                             input_elems=3 * h * h)
    return f"net{i}", specs, summary


def _data(seed=0, networks=12, noise=0.02):
    rng = np.random.default_rng(seed)
    X, y, modes, nets = [], [], [], []
    for i in range(networks):
        name, specs, summary = _net(rng, i)
        for mode, scale in (("fp32", 1.0), ("float16", 1.3), ("int8", 0.7)):
            x = ort_terms(specs, [0.0] * len(specs), summary, mode, False)
            X.append(x)
            y.append(float(x @ LAW) * scale * float(np.exp(rng.normal(0, noise))))
            modes.append(mode)
            nets.append(name)
    return np.array(X), np.array(y), modes, nets


def test_the_fit_finds_the_law_and_reports_held_out_error():
    X, y, modes, nets = _data()
    m = OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets)
    mid, low, high = m.predict_all(OrtInputs(X, modes))
    assert np.all(np.abs(mid / y - 1) < 0.1)
    assert set(m.coef_) == {"fp32", "float16", "int8"} and len(m.coef_["fp32"]) == len(TERMS)
    assert all(c >= 0 for c in m.coef_["fp32"])
    for mode, figures in m.meta_["lono"].items():
        assert figures["networks"] == 12 and figures["within_25pct"] > 0.9
    assert np.all(low <= mid) and np.all(mid <= high)


def test_save_load_predict_equality(tmp_path):
    X, y, modes, nets = _data(seed=1)
    m = OrtLatencyModel(about={"device": "local"}).fit(OrtInputs(X, modes), y, groups=nets)
    m.save(tmp_path)
    back = OrtLatencyModel.load(tmp_path)
    for a, b in zip(m.predict_all(OrtInputs(X, modes)), back.predict_all(OrtInputs(X, modes))):
        assert np.array_equal(a, b)
    assert back.meta_["device"] == "local"
    with pytest.raises(DlasError, match="no onnxruntime model"):
        OrtLatencyModel.load(tmp_path / "none")
    (tmp_path / "onnxruntime.json").write_text("{not json")
    with pytest.raises(DlasError, match="not an onnxruntime model"):
        OrtLatencyModel.load(tmp_path)


def test_a_mode_with_too_few_networks_is_priced_by_the_fp32_fit():
    X, y, modes, nets = _data(seed=2)
    keep = [i for i, (m, n) in enumerate(zip(modes, nets))
            if m != "int8" or n in ("net0", "net1")]
    model = OrtLatencyModel().fit(OrtInputs(X[keep], [modes[i] for i in keep]), y[keep],
                                  groups=[nets[i] for i in keep])
    assert "int8" not in model.coef_
    x = X[[modes.index("int8")]]
    assert model.predict(OrtInputs(x, ["int8"]))[0] == model.predict(OrtInputs(x, ["fp32"]))[0]


def test_too_few_networks_is_a_clear_error():
    X, y, modes, nets = _data(networks=3)
    with pytest.raises(DlasError, match="at least 5 networks"):
        OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets)


def test_channel_pruning_counts_the_density_weight_pruning_all_of_it():
    rng = np.random.default_rng(3)
    _, specs, summary = _net(rng, 0)
    ratios = [0.5] * len(specs)
    full = ort_terms(specs, ratios, summary, "fp32", False)
    removed = ort_terms(specs, ratios, summary, "fp32", True)
    assert np.allclose(removed[1:3], full[1:3] * 0.5)
    assert removed[4] == pytest.approx(full[4] * 0.5)
    assert removed[0] == full[0] and removed[5:10].tolist() == full[5:10].tolist()
    assert removed[12:14].tolist() == full[12:14].tolist()  # the summary's, not scaled
    assert len(full) == len(TERMS)
    assert ort_terms(specs, ratios, summary, "int8", False)[4] == pytest.approx(full[4] / 4)


def test_the_average_pools_reads_are_an_int8_term_only():
    rng = np.random.default_rng(3)
    _, specs, summary = _net(rng, 0)
    summary = replace(summary, avgpool_window_elems=9_000_000)
    col = TERMS.index("qdq_avgpool_reads")
    assert ort_terms(specs, [0.0] * len(specs), summary, "int8", False)[col] == 9.0
    for mode in ("fp32", "float16"):
        assert ort_terms(specs, [0.0] * len(specs), summary, mode, False)[col] == 0.0


@pytest.mark.parametrize("old_summaries", [False, True])
def test_training_rows_read_the_stores_onnxruntime_records(tmp_path, old_summaries):
    """A summary stored before the int8-only fields, of a network not built again by name,
    still serves every mode but int8 (which of its convs ran in float is unknown)."""
    from dlas_predict.models.evaluation import INT8_ONLY

    dev = get_device("local")
    rng = np.random.default_rng(4)
    with CorpusStore(tmp_path / "s.sqlite") as db:
        for i in range(3):
            name, specs, summary = _net(rng, i)
            stored = {k: v for k, v in summary.__dict__.items()
                      if not (old_summaries and k in INT8_ONLY)}
            for config in ("dense", "int8"):
                db.add_network_config(name, config, [(j, f"c{j}", s.to_spec(), config, 0.0)
                                                     for j, s in enumerate(specs)])
                plan = onnxruntime_plan(f"{name}.onnx", name, config, None)
                rec = NetworkMeasurement(
                    key=plan.key(dev), device="local", fingerprint=dev.fingerprint,
                    network=name, config=config, algorithm=plan.algorithm,
                    plan=plan.plan_json(), dtype=plan.dtype.value, run_secs=[1e-3, 2e-3],
                    verified=True, summary=json.dumps(stored),
                    details={"backend": "onnxruntime"})
                db.add_network(rec)
    inputs, y, nets = training_rows(tmp_path / "s.sqlite", "local")
    X, modes = inputs.terms, inputs.modes
    assert inputs.recurrent == (False,) * len(y)
    n = 3 if old_summaries else 6
    assert len(y) == n and sorted(set(modes)) == (["fp32"] if old_summaries
                                                  else ["fp32", "int8"])
    assert np.all(y == 1e-3)  # the fastest run, as the other models learn
    assert X.shape == (n, len(TERMS))


def test_channel_pruned_networks_are_a_mode_of_their_own():
    assert [model_mode(c) for c in ("dense", "weight_pruning@0.9", "channel_pruning@0.5",
                                     "int8", "float16")] == [
        "fp32", "fp32", "channel_pruning", "int8", "float16"]
    X, y, modes, nets = _data(seed=5)
    fp32 = [i for i, m in enumerate(modes) if m == "fp32"]
    # the same networks pruned: a fixed cost per network four times the dense one's
    Xc, yc = X[fp32], y[fp32] + 3 * LAW[0]
    both = OrtLatencyModel().fit(
        OrtInputs(np.vstack([X, Xc]), modes + ["channel_pruning"] * len(fp32)),
        np.concatenate([y, yc]), groups=nets + [nets[i] for i in fp32])
    assert set(both.coef_) == {"fp32", "channel_pruning", "int8", "float16"}
    pruned = both.predict(OrtInputs(Xc, ["channel_pruning"] * len(fp32)))
    assert np.all(np.abs(pruned / yc - 1) < 0.1)
    assert np.all(both.predict(OrtInputs(X[fp32], ["fp32"] * len(fp32))) < pruned)


def test_narrow_and_unaligned_convs_are_counted():
    wide = ConvSpec(C=32, H=8, W=8, K=32, R=3, S=3, pad_t=1, pad_l=1, pad_b=1, pad_r=1)
    thin = ConvSpec(C=32, H=8, W=8, K=5, R=3, S=3, pad_t=1, pad_l=1, pad_b=1, pad_r=1)
    summary = NetworkSummary(conv_layers=2, layers=4, nonconv_macs=0, nonconv_bytes=0,
                             activation_ops=2, elementwise_ops=0, input_elems=32 * 64)
    t = ort_terms([wide, thin], [0.0, 0.0], summary, "fp32", False)
    assert t[TERMS.index("narrow_macs")] == pytest.approx(thin.macs / 1e9)
    assert t[TERMS.index("unaligned_convs")] == 1.0
    # dense shapes with a density: the kept filters decide (32 · 0.25 = 8: aligned, narrow)
    t = ort_terms([wide], [0.75], summary, "fp32", True)
    assert t[TERMS.index("unaligned_convs")] == 0.0
    assert t[TERMS.index("narrow_macs")] == pytest.approx(wide.macs * 0.25 / 1e9)


def test_convs_the_blocked_layout_cannot_take_are_counted_at_the_devices_block():
    """onnxruntime's NCHWc block is the vector width in floats: 16 channels on AVX-512, 8 on
    AVX2. It takes a conv of fewer input channels than the block, or of a multiple of 4,
    padding its filters up to the block (work counted apart); a channel-pruned conv is
    counted at its kept channels."""
    from dataclasses import replace

    from dlas_predict.models.ortmodel import nchwc_block

    pad = dict(pad_t=1, pad_l=1, pad_b=1, pad_r=1)
    first = ConvSpec(C=3, H=8, W=8, K=32, R=3, S=3, **pad)
    k24 = ConvSpec(C=32, H=8, W=8, K=24, R=3, S=3, **pad)
    c30 = ConvSpec(C=30, H=8, W=8, K=32, R=3, S=3, **pad)
    c6 = ConvSpec(C=6, H=8, W=8, K=32, R=3, S=3, **pad)
    summary = NetworkSummary(conv_layers=4, layers=8, nonconv_macs=0, nonconv_bytes=0,
                             activation_ops=4, elementwise_ops=0, input_elems=3 * 64)
    macs, n = TERMS.index("unblocked_macs"), TERMS.index("unblocked_convs")
    padded = TERMS.index("padded_macs")
    specs = [first, k24, c30, c6]
    t16 = ort_terms(specs, [0.0] * 4, summary, "fp32", False, block=16)
    assert t16[n] == 1.0 and t16[macs] == pytest.approx(c30.macs / 1e9)
    assert t16[TERMS.index("unblocked_io_bytes")] == 4 * (30 * 64 + 32 * 64) / 1e6
    # K 24 padded to 32 at block 16; at block 8 nothing is padded
    assert t16[padded] == pytest.approx(k24.macs * (32 / 24 - 1) / 1e9)
    t8 = ort_terms(specs, [0.0] * 4, summary, "fp32", False, block=8)
    assert t8[n] == 1.0 and t8[padded] == 0.0
    wide = ConvSpec(C=64, H=8, W=8, K=64, R=3, S=3, **pad)
    assert ort_terms([wide], [0.75], summary, "fp32", True, block=16)[n] == 0.0  # 16 kept
    assert ort_terms([wide], [0.375], summary, "fp32", True, block=16)[n] == 0.0  # 40 kept
    assert ort_terms([wide], [0.46875], summary, "fp32", True, block=16)[n] == 1.0  # 34 kept
    dw = ConvSpec(C=30, H=8, W=8, K=30, R=3, S=3, groups=30, **pad)
    assert ort_terms([dw], [0.0], summary, "fp32", False, block=16)[n] == 1.0
    local = get_device("local", with_target=False)
    assert nchwc_block(replace(local, simd_bits=512)) == 16
    assert nchwc_block(replace(local, simd_bits=256)) == 8
    assert nchwc_block(replace(local, simd_bits=128)) == 8


def _optimized(model, tmp_path):
    """onnxruntime's optimized graph of ``model`` (all optimizations, CPU provider)."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(so.optimized_model_filepath).graph


def test_the_blocked_layout_rule_is_onnxruntimes(tmp_path):
    """Which convs onnxruntime runs outside its blocked layout, read from its own optimized
    graph of a channel-pruned network with its zeroed filters removed (odd channel counts)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("onnxruntime's blocked layout is MLAS's on x86-64 only")
    from dlas_predict.compression.compress import compress_onnx
    from dlas_predict.models.ortmodel import blocked_layout, nchwc_block
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.networks.graph import network_of_proto

    block = nchwc_block(get_device("local", with_target=False))
    convs, plain = [], []
    for ratio in (0.3, 0.55, 0.8):
        model = compress_onnx(build("cnn", {**FAMILIES["cnn"], "layers": 3, "kernels": 48,
                                            "input": 12, "block": "separable"}),
                              "channel_pruning", ratio, remove_channels=True).model
        graph = _optimized(model, tmp_path)
        plain += [n.name for n in graph.node if n.op_type in ("Conv", "FusedConv")
                  and n.domain != "com.microsoft.nchwc"]
        convs += [l for l in network_of_proto(model, "pruned").layers if l.conv is not None]
    expected = sorted(l.name for l in convs
                      if not blocked_layout(l.conv.C, l.conv.K, l.conv.groups, block))
    assert sorted(plain) == expected and 0 < len(expected) < len(convs)


def test_the_qdq_float_convs_are_onnxruntimes(tmp_path):
    """Which convs onnxruntime's QDQ int8 run leaves in float, read from its own optimized
    graph: a residual network (a conv whose input also skips to the add) and one with SiLU."""
    from dlas_predict.compression.compress import compress_onnx
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.networks.graph import network_of_proto

    for extra in ({"block": "residual"}, {"block": "plain", "activation": "silu"},
                  {"block": "inverted", "se": 1}):
        model = build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 16, "input": 12,
                              **extra})
        convs = [l for l in network_of_proto(model, "n").layers if l.conv is not None]
        quantized = compress_onnx(model, "int8", calibration=np.random.default_rng(0).normal(
            size=(2, 3, 12, 12)).astype(np.float32)).model
        graph = _optimized(quantized, tmp_path)
        floats = {n.name for n in graph.node if n.op_type == "Conv" and n.domain == ""}
        qlinear = [n for n in graph.node if n.op_type == "QLinearConv"]
        assert sorted(l.name for l in convs if l.qdq_float) == sorted(floats), extra
        assert len(qlinear) + len(floats) == len(convs), extra


def test_a_model_fitted_on_other_terms_asks_to_be_fitted_again(tmp_path):
    X, y, modes, nets = _data(seed=6)
    OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets).save(tmp_path)
    d = json.loads((tmp_path / "onnxruntime.json").read_text())
    d["meta"]["terms"] = d["meta"]["terms"][:10]
    (tmp_path / "onnxruntime.json").write_text(json.dumps(d))
    with pytest.raises(DlasError, match="fit it again"):
        OrtLatencyModel.load(tmp_path)


def test_a_pruned_model_with_nothing_removed_is_priced_at_its_dense_shapes():
    line = ("0 zeroed channels physically removed; 1008 stay zeroed (they reach a residual "
            "addition, a concatenation or an op the remover does not follow, such as SiLU)")
    assert nothing_removed({"prepared": [line]})
    assert not nothing_removed({"prepared": [line.replace("0 zeroed", "254 zeroed", 1)]})
    assert not nothing_removed(None) and not nothing_removed({"backend": "onnxruntime"})


def test_a_pruned_model_with_nothing_removed_trains_and_prices_as_the_dense_fp32_one(tmp_path):
    """onnxruntime ran the dense network: its record is an fp32 row, with the dense terms."""
    assert model_mode("channel_pruning@0.5", removed=False) == "fp32"
    assert model_mode("channel_pruning@0.5", removed=True) == "channel_pruning"
    assert model_mode("int8", removed=False) == "int8"
    dev = get_device("local")
    name, specs, summary = _net(np.random.default_rng(6), 0)
    kept = ("0 zeroed channels physically removed; 90 stay zeroed (they reach a residual "
            "addition, a concatenation or an op the remover does not follow, such as SiLU)")
    with CorpusStore(tmp_path / "s.sqlite") as db:
        for config, ratio, details in (("dense", 0.0, {}),
                                       ("channel_pruning@0.5", 0.5, {"prepared": [kept]})):
            db.add_network_config(name, config, [(j, f"c{j}", s.to_spec(), config.split("@")[0],
                                                  ratio) for j, s in enumerate(specs)])
            plan = onnxruntime_plan(f"{name}.onnx", name, config.split("@")[0], ratio or None)
            rec = NetworkMeasurement(
                key=plan.key(dev), device="local", fingerprint=dev.fingerprint, network=name,
                config=config, algorithm=plan.algorithm, plan=plan.plan_json(),
                dtype=plan.dtype.value, run_secs=[1e-3], verified=True,
                summary=json.dumps(summary.__dict__),
                details={"backend": "onnxruntime", **details})
            db.add_network(rec)
    inputs, y, nets = training_rows(tmp_path / "s.sqlite", "local")
    X, modes = inputs.terms, inputs.modes
    assert modes == ["fp32", "fp32"]
    assert X[0].tolist() == X[1].tolist()


def test_int8_prices_the_convs_qdq_leaves_in_float_dearer():
    """QDQ int8 leaves some convs in float (a conv whose input feeds a residual add too, one
    whose output feeds SiLU's gate): the shipped model of this machine prices int8 against
    fp32 dearer when they are float."""
    from dataclasses import replace

    from dlas_predict.paths import MODELS_STORE

    model = OrtLatencyModel.load(MODELS_STORE / "local")
    specs = [ConvSpec(C=64, H=32, W=32, K=64, R=3, S=3, pad_t=1, pad_l=1, pad_b=1, pad_r=1)] * 4
    plain = NetworkSummary(conv_layers=4, layers=9, nonconv_macs=0, nonconv_bytes=2_000_000,
                           activation_ops=4, elementwise_ops=0, input_elems=3 * 32 * 32)
    macs = sum(s.macs for s in specs)
    joined = replace(plain, elementwise_ops=2, qdq_float_conv_macs=macs,
                     qdq_float_conv_io_bytes=4 * 2 * 64 * 32 * 32 * 4,
                     qdq_float_conv_params=4 * 64 * 64 * 9, joined_conv_macs=macs)
    t = ort_terms(specs, [0.0] * 4, joined, "int8", False)
    assert t[TERMS.index("qdq_float_macs")] == pytest.approx(macs / 1e9)
    assert t[TERMS.index("joined_macs")] == 0.0  # int8 prices the float convs instead
    assert ort_terms(specs, [0.0] * 4, joined, "fp32", False)[TERMS.index("qdq_float_macs")] \
        == 0.0
    ratio = {}
    for name, summary in (("plain", plain), ("joined", joined)):
        x = [ort_terms(specs, [0.0] * 4, summary, mode, False) for mode in ("fp32", "int8")]
        mid = model.predict(OrtInputs(np.array(x), ["fp32", "int8"]))
        ratio[name] = mid[1] / mid[0]
    assert ratio["plain"] < 0.8 and ratio["joined"] > 1.5 * ratio["plain"]


def test_training_on_another_machines_onnxruntime_runs_saves_into_that_machines_folder(
        tmp_path, monkeypatch):
    """A store of onnxruntime runs alone, timed on a machine with a folder of its own under
    ``models_store/machines``, trains that machine's model, not this one's."""
    from dlas_predict import paths
    from dlas_predict.models.train import train

    monkeypatch.setattr(paths, "MODELS_STORE", tmp_path / "models")
    other = "0123456789abcdef"
    (tmp_path / "models" / paths.MACHINES / other / "local").mkdir(parents=True)
    dev = get_device("local")
    rng = np.random.default_rng(7)
    store = tmp_path / "s.sqlite"
    with CorpusStore(store) as db:
        for i in range(6):
            name, specs, summary = _net(rng, i)
            db.add_network_config(name, "dense", [(j, f"c{j}", s.to_spec(), "dense", 0.0)
                                                  for j, s in enumerate(specs)])
            plan = onnxruntime_plan(f"{name}.onnx", name, "dense", None)
            t = float(ort_terms(specs, [0.0] * len(specs), summary, "fp32", False) @ LAW)
            db.add_network(NetworkMeasurement(
                key=plan.key(dev), device="local", fingerprint=other, network=name,
                config="dense", algorithm=plan.algorithm, plan=plan.plan_json(),
                dtype=plan.dtype.value, run_secs=[t], verified=True,
                summary=json.dumps(summary.__dict__),
                details={"backend": "onnxruntime"}))
    report = train(store, "local", only_onnxruntime=True)
    saved = tmp_path / "models" / paths.MACHINES / other / "local" / "onnxruntime.json"
    assert report.onnxruntime_model == str(saved) and saved.is_file()
    assert not (tmp_path / "models" / "local").exists()
    assert OrtLatencyModel.load(saved.parent).meta_["onnxruntime_fingerprints"] == [other]


def test_a_matrix_network_s_layers_are_terms_of_their_own():
    """onnxruntime runs a matrix network's fully connected layers as matrix products: their
    MACs and bytes leave the conv terms for terms of their own."""
    fc = ConvSpec(C=128, H=1, W=64, K=512, R=1, S=1)
    conv = ConvSpec(C=16, H=8, W=8, K=32, R=3, S=3, pad_t=1, pad_l=1, pad_b=1, pad_r=1)
    summary = NetworkSummary(conv_layers=2, layers=9, nonconv_macs=5000, nonconv_bytes=100,
                             activation_ops=1, elementwise_ops=2, input_elems=64)
    t = ort_terms([conv, fc], [0.0, 0.0], summary, "fp32", False, 16, [False, True])
    alone = ort_terms([conv], [0.0], summary, "fp32", False, 16)
    i = TERMS.index
    assert t[i("dense_macs")] == alone[i("dense_macs")] == conv.macs / 1e9
    assert t[i("conv_io_bytes")] == alone[i("conv_io_bytes")]
    assert t[i("matrix_macs")] == pytest.approx(fc.macs / 1e9)
    assert t[i("matrix_bytes")] == pytest.approx(4 * (128 * 64 + 512 * 64 + 128 * 512) / 1e6)
    assert t[i("other_macs")] == pytest.approx(5000 / 1e9)
    assert alone[i("matrix_macs")] == 0.0


def test_a_matrix_network_s_weights_beyond_the_l2_are_a_term_kept_where_it_helps():
    """A fully connected layer's weights beyond the cores' L2 count in the spill term (none
    without a known L2); a mode keeps the term only where it is better held out."""
    summary = NetworkSummary(conv_layers=1, layers=3, nonconv_macs=0, nonconv_bytes=100,
                             activation_ops=1, elementwise_ops=1, input_elems=784)
    i = TERMS.index("matrix_spill_bytes")

    def terms(width, l2):
        fc = ConvSpec(C=784, H=1, W=1, K=width, R=1, S=1)
        return ort_terms([fc], [0.0], summary, "fp32", False, 16, [True], [False], l2)

    assert terms(1024, 2 ** 21)[i] == pytest.approx((4 * 784 * 1024 - 2 ** 21) / 1e6)
    assert terms(256, 2 ** 21)[i] == 0.0 and terms(1024, 0)[i] == 0.0
    widths = [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
    X = np.array([terms(w, 2 ** 21) for w in widths])
    law = np.zeros(len(TERMS))
    law[TERMS.index("const")], law[TERMS.index("matrix_bytes")] = 5e-6, 1e-5
    nets = [f"mlp{w}" for w in widths]
    Xc, yc, modes, cnns = _data(networks=12)  # the CNNs every model is fitted with
    for spill_cost, kept in ((1e-5, True), (0.0, False)):
        law[i] = spill_cost
        y = X @ law * np.exp(np.random.default_rng(0).normal(0, 0.02, len(X)))
        m = OrtLatencyModel().fit(OrtInputs(np.vstack([Xc, X]), [*modes, *["fp32"] * len(X)]),
                                  np.concatenate([yc, y]), groups=[*cnns, *nets])
        assert ("matrix fp32" in m.meta_["spill"]) is kept
        assert np.median(np.abs(m.predict(OrtInputs(X, ["fp32"] * len(X))) / y - 1)) < 0.05


def test_matrix_networks_are_fitted_apart_and_fall_back_to_their_mode_s_fit():
    """A matrix network's runs get a fit of their own per mode; without one (too few
    networks) they are priced by the mode's fit of the others."""
    X, y, modes, nets = _data(networks=12)
    col = TERMS.index("matrix_macs")
    Xm = X[::3].copy()  # fp32 rows, with matrix layers
    Xm[:, col] = 0.004
    ym = y[::3] * 3.0  # a law of their own
    both = OrtLatencyModel().fit(OrtInputs(np.vstack([X, Xm]), [*modes, *["fp32"] * len(Xm)]),
                                 np.concatenate([y, ym]),
                                 groups=[*nets, *[n + "-m" for n in nets[::3]]])
    assert "matrix fp32" in both.coef_ and "matrix int8" not in both.coef_
    cnn_only = OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets)
    assert both.coef_["fp32"] == cnn_only.coef_["fp32"]  # the CNNs' fit is untouched
    pred = both.predict(OrtInputs(Xm, ["fp32"] * len(Xm)))
    assert np.median(np.abs(pred / ym - 1)) < 0.1
    # an int8 matrix row: no matrix int8 fit, the int8 fit of the others prices it
    row = Xm[:1].copy()
    assert both.predict(OrtInputs(row, ["int8"]))[0] == pytest.approx(
        float(row[0] @ np.array(both.coef_["int8"])))


def test_recurrent_networks_are_fitted_apart_and_fall_back_to_the_matrix_fit():
    """A recurrent network's runs (onnxruntime loops over the steps in one op) get a fit of
    their own per mode; without one they are priced by the matrix networks' fit of the
    mode."""
    X, y, modes, nets = _data(networks=12)
    col = TERMS.index("matrix_macs")
    Xm = X[::3].copy()
    Xm[:, col] = 0.004
    ym = y[::3] * 3.0  # the matrix networks' law
    Xr, yr = Xm.copy(), y[::3] * 0.5  # the recurrent networks': another
    n = len(Xm)
    fp32 = ["fp32"] * n
    fit = OrtLatencyModel().fit(
        OrtInputs(np.vstack([X, Xm, Xr]), [*modes, *fp32, *fp32],
                  (False,) * (len(X) + n) + (True,) * n),
        np.concatenate([y, ym, yr]),
        groups=[*nets, *[k + "-m" for k in nets[::3]], *[k + "-r" for k in nets[::3]]])
    assert {"matrix fp32", "recurrent fp32"} <= set(fit.coef_)
    rec = fit.predict(OrtInputs(Xr, fp32, (True,) * n))
    mat = fit.predict(OrtInputs(Xm, fp32))
    assert np.median(np.abs(rec / yr - 1)) < 0.1 and np.median(np.abs(mat / ym - 1)) < 0.1
    # fitted without them: the same rows are priced by the matrix fit
    without = OrtLatencyModel().fit(
        OrtInputs(np.vstack([X, Xm]), [*modes, *fp32]), np.concatenate([y, ym]),
        groups=[*nets, *[k + "-m" for k in nets[::3]]])
    assert np.allclose(without.predict(OrtInputs(Xr, fp32, (True,) * n)),
                       without.predict(OrtInputs(Xm, fp32)))


def test_a_channel_pruned_matrix_network_s_grid_form_has_its_own_fit_or_a_split_one():
    """A channel-pruned matrix network's run (its terms its grid form's: 1×1 convs, no
    matrix MACs) is flagged a matrix network's. With enough such runs it gets a fit of its
    own; without, its convs are priced by the channel-pruned CNNs' fit and its other ops
    by the matrix networks' fp32 fit, never by the CNNs' fit alone."""
    X, y, modes, nets = _data(networks=12)
    col, other = TERMS.index("matrix_macs"), TERMS.index("other_macs")
    fp32 = [i for i, m in enumerate(modes) if m == "fp32"]
    Xc, yc = X[fp32], y[fp32] * 0.5  # channel-pruned CNNs
    Xm = X[fp32].copy()
    Xm[:, col] = 0.004
    ym = y[fp32] * 3.0  # dense matrix networks: a law of their own
    n = len(fp32)
    cnn = [*modes, *["channel_pruning"] * n, *["fp32"] * n]
    fit = OrtLatencyModel().fit(
        OrtInputs(np.vstack([X, Xc, Xm]), cnn), np.concatenate([y, yc, ym]),
        groups=[*nets, *[nets[i] + "-c" for i in fp32], *[nets[i] + "-m" for i in fp32]])
    grid = X[fp32[:1]].copy()  # a grid form: no matrix MACs, attention's in other MACs
    grid[0, other] = 0.5
    assert "matrix channel_pruning" not in fit.coef_
    assert fit.priced_by("matrix channel_pruning") == "channel_pruning convs, matrix fp32 other ops"
    coef = np.where(np.isin(TERMS, ["other_bytes", "layers", "elementwise_ops", "exp_elems",
                                    "broadcast_bytes", "other_macs"]),
                    fit.coef_["matrix fp32"], fit.coef_["channel_pruning"])
    flagged = fit.predict(OrtInputs(grid, ["channel_pruning"], (), (True,)))[0]
    assert flagged == pytest.approx(float(grid[0] @ coef))
    assert fit.predict(OrtInputs(grid, ["channel_pruning"]))[0] == pytest.approx(
        float(grid[0] @ np.array(fit.coef_["channel_pruning"])))  # a CNN's row: unchanged
    # with channel-pruned matrix networks' runs: their own fit, from the flag alone
    Xg, yg = X[fp32], y[fp32] * 2.0
    own = OrtLatencyModel().fit(
        OrtInputs(np.vstack([X, Xc, Xm, Xg]), [*cnn, *["channel_pruning"] * n], (),
                  (False,) * (len(X) + n) + (True,) * (2 * n)),
        np.concatenate([y, yc, ym, yg]),
        groups=[*nets, *[nets[i] + s for s in ("-c", "-m", "-g") for i in fp32]])
    assert own.priced_by("matrix channel_pruning") == "matrix channel_pruning"
    assert own.coef_["channel_pruning"] == fit.coef_["channel_pruning"]  # CNNs' untouched
    pred = own.predict(OrtInputs(Xg, ["channel_pruning"] * n, (), (True,) * n))
    assert np.median(np.abs(pred / yg - 1)) < 0.1


def _stepped(seed=0, networks=40):
    """``_data`` where int8 runs of the deeper networks take 1.6× the law's time: a step no
    non-negative sum of the terms can follow."""
    X, y, modes, nets = _data(seed=seed, networks=networks)
    deep = X[:, TERMS.index("layers")] >= 13
    y = np.where((np.array(modes) == "int8") & deep, 1.6 * y, y)
    return X, y, modes, nets


@pytest.mark.slow
def test_a_correction_is_kept_only_where_it_is_better_held_out(tmp_path):
    X, y, modes, nets = _stepped()
    m = OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets)
    assert m.meta_["corrected"] == ["int8"] and set(m.correction_) == {"int8"}
    lono = m.meta_["lono"]["int8"]
    assert lono["corrected"] and lono["within_10pct"] >= lono["uncorrected_within_10pct"] + 0.05
    assert "corrected" not in m.meta_["lono"]["fp32"]
    i8 = np.array(modes) == "int8"
    plain = OrtInputs(X[i8], [modes[i] for i in np.flatnonzero(i8)])
    assert np.median(np.abs(m.predict(plain) / y[i8] - 1)) < 0.05
    m.save(tmp_path)
    assert (tmp_path / "onnxruntime.correction.int8.txt.xz").is_file()
    back = OrtLatencyModel.load(tmp_path)
    for a, b in zip(m.predict_all(OrtInputs(X, modes)), back.predict_all(OrtInputs(X, modes))):
        assert np.allclose(a, b, rtol=1e-12)
    # too few networks for a correction: none, and the earlier fit's is not left behind
    X, y, modes, nets = _stepped(networks=12)
    small = OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets)
    assert small.meta_["corrected"] == [] and not small.correction_
    small.save(tmp_path)
    assert not list(tmp_path.glob("onnxruntime.correction.*"))


@pytest.mark.slow
def test_a_model_whose_correction_file_is_missing_asks_to_be_fitted_again(tmp_path):
    X, y, modes, nets = _stepped(seed=3)
    OrtLatencyModel().fit(OrtInputs(X, modes), y, groups=nets).save(tmp_path)
    (tmp_path / "onnxruntime.correction.int8.txt.xz").unlink()
    with pytest.raises(DlasError, match="names a correction of int8.*fit it again"):
        OrtLatencyModel.load(tmp_path)


def test_a_recurrent_layer_s_step_products_are_terms_of_their_own(tmp_path):
    """onnxruntime's LSTM op runs the recurrent products one step after another: their MACs
    and their number are counted apart from the matrix products (one per step and layer,
    but the first step's, whose state is zero)."""
    from dlas_predict.networks.generate import generate
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.matrix import grid_form, is_matrix_layer
    from dlas_predict.networks.recurrent import is_step_product

    [m] = generate("rnn", ["layers=2", "seq=5", "hidden=16", "embedding=8", "vocab=40"],
                   tmp_path)
    net = read_network(grid_form(m.path))
    convs = net.convs()
    specs, summary = [c.spec for c in convs], NetworkSummary.of(net)
    matrix = [is_matrix_layer(c.name) for c in convs]
    steps = [is_step_product(c.name) for c in convs]
    t = ort_terms(specs, [0.0] * len(specs), summary, "fp32", False, 16, matrix, steps)
    assert t[TERMS.index("steps")] == sum(steps) == 2 * (5 - 1)
    assert t[TERMS.index("step_macs")] == pytest.approx(
        sum(c.spec.macs for c, s in zip(convs, steps) if s) / 1e9)
    unsplit = ort_terms(specs, [0.0] * len(specs), summary, "fp32", False, 16, matrix)
    assert unsplit[TERMS.index("steps")] == unsplit[TERMS.index("step_macs")] == 0
    assert unsplit[TERMS.index("matrix_macs")] == pytest.approx(
        t[TERMS.index("matrix_macs")] + t[TERMS.index("step_macs")])
