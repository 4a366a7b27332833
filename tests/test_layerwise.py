"""Whole networks priced from their layers: the terms of a network, a device's costs, the
few-shot fit through a basis device, and adapt/predict on another runtime's latencies."""
import json
import math

import numpy as np
import pytest

from conftest import SHARED_DATA, assert_clean_error, run_cli
from dlas_predict.crossdev import layerwise as lw
from dlas_predict.errors import DlasError

HELP = SHARED_DATA / "help_nb201" / "latency.csv.gz"


def _term(name: str) -> int:
    return lw.TERMS.index(name)


def test_the_terms_of_a_network_sum_its_layers_by_kind():
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network

    net = read_network(zoo.resolve("zoo:mobilenetv1-cifar"))
    t = lw.layer_terms(net)
    convs = [l for l in net.layers if l.conv is not None]
    dw = sum(l.macs for l in convs if l.conv.groups == l.conv.C > 1)
    pw = sum(l.macs for l in convs if l.conv.R * l.conv.S == 1 and l.conv.groups == 1)
    assert dw > 0 and pw > 0
    assert t[_term("depthwise_gmacs")] == pytest.approx(dw * 1e-9)
    assert t[_term("pointwise_gmacs")] == pytest.approx(pw * 1e-9)
    assert t[_term("depthwise_layers")] * 100 == sum(l.conv.groups == l.conv.C > 1 for l in convs)
    assert t[_term("constant")] == 1.0
    assert lw.macs_of(t)[0] == pytest.approx(sum(l.macs for l in net.layers
                                                if l.conv is not None or l.op in ("Gemm",
                                                                                   "MatMul"))
                                             * 1e-9)
    resnet = lw.layer_terms(read_network(zoo.resolve("zoo:resnet18-cifar")))
    assert resnet[_term("depthwise_gmacs")] == 0 and resnet[_term("kxk_gmacs")] > 0


def _synthetic(devices: int = 4, networks: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    # the layer kinds alone (the onnxruntime terms zero), so that the draws do not depend
    # on how many onnxruntime terms follow them
    layer = len(lw.LAYER_TERMS)
    X = np.zeros((networks, len(lw.TERMS)))
    X[:, :layer] = rng.uniform(0.0, 1.0, (networks, layer))
    X[:, lw.TERMS.index("constant")] = 1.0
    costs = np.zeros((devices, len(lw.TERMS)))
    costs[:, :layer] = rng.uniform(0.1, 2.0, (devices, layer))
    costs[:, 3:7] = 0.0  # kinds some devices price at nothing
    return X, costs


def test_a_devices_costs_are_recovered_from_its_latencies():
    X, costs = _synthetic()
    got = lw.fit_costs(X, X @ costs[0])
    assert np.allclose(X @ got, X @ costs[0], rtol=1e-6)
    assert (got >= 0).all()


def test_a_robust_fit_leaves_out_a_tables_rows_timed_otherwise_and_says_so_in_its_spread():
    """A public table whose rows are partly timed otherwise (a fifth of them 20-100× too
    fast): the plain fit is pulled off the rest, the robust one recovers the costs, and its
    80 % interval holds about 80 % of the rows it was fitted on."""
    X, costs = _synthetic(networks=200)
    rng = np.random.default_rng(3)
    truth = X @ costs[0]
    ms = truth * np.exp(rng.normal(0.0, 0.03, len(truth)))
    bad = rng.choice(len(ms), size=40, replace=False)
    ms[bad] /= rng.uniform(20.0, 100.0, len(bad))
    good = np.setdiff1d(np.arange(len(ms)), bad)
    err = lambda c: np.median(np.abs(X[good] @ c / truth[good] - 1))  # noqa: E731
    assert err(lw.fit_costs(X, ms)) > 0.10
    assert err(lw.fit_costs(X, ms, robust=True)) < 0.03
    basis = lw.basis_of({"board": (X, ms)}, "table", robust=True)
    low, high = basis.own_fit("board").predict_interval(X)
    assert 0.75 <= np.mean((ms >= low) & (ms <= high)) <= 0.9
    # without outliers a robust fit is the plain one
    assert np.allclose(lw.fit_costs(X, truth, robust=True), lw.fit_costs(X, truth))


def test_a_few_shot_device_is_priced_through_the_basis_device_it_scales():
    X, costs = _synthetic()
    basis = lw.Basis([f"d{i}" for i in range(len(costs))], costs, ["test"] * len(costs),
                     [0.0] * len(costs), np.tile(X.max(axis=0), (len(costs), 1)))
    truth = 2.5 * (X @ costs[2])
    shots = np.arange(10)
    fit = lw.fit_few_shot(basis, X[shots], truth[shots])
    assert fit.basis_device == "d2" and fit.scales == pytest.approx([2.5, 2.5])
    assert np.allclose(fit.predict(X[10:]), truth[10:])
    assert max(abs(e) for e in fit.loo_log_errors) < 1e-9
    low, high = fit.predict_interval(X[10:])
    assert (low <= truth[10:] * (1 + 1e-9)).all() and (high >= truth[10:] * (1 - 1e-9)).all()
    # a network beyond every term the costs were fitted on: a wider interval
    far = X[10:11] * 5.0
    far[:, -1] = 1.0
    lo_far, hi_far = fit.predict_interval(far)
    assert fit.extrapolation(far)[0] == pytest.approx(5.0, rel=0.2)
    assert hi_far[0] / lo_far[0] > high[0] / low[0]
    assert lw.FewShotFit.from_dict(json.loads(json.dumps(fit.to_dict()))) == fit


def test_the_terms_version_follows_the_terms_so_no_cache_of_another_length_is_read(tmp_path,
                                                                                  monkeypatch):
    """The version names a digest of the terms: a term added (the onnxruntime model's) is a
    new version, whose caches and saved fits are apart from the old ones."""
    import hashlib

    monkeypatch.setenv("DLAS_HOME", str(tmp_path))
    assert lw.TERMS_VERSION.endswith(hashlib.sha1(" ".join(lw.TERMS).encode()).hexdigest()[:8])
    calls = []
    first = lw._cached_terms("t", ["a"], lambda k: calls.append(k) or [1.0] * len(lw.TERMS))
    monkeypatch.setattr(lw, "TERMS_VERSION", lw.TERMS_VERSION + "x")
    again = lw._cached_terms("t", ["a"], lambda k: calls.append(k) or [2.0] * len(lw.TERMS))
    assert calls == ["a", "a"] and first["a"] != again["a"]
    old = {**_saved_fit(), "terms_version": "4"}
    with pytest.raises(DlasError, match="run `adapt` again"):
        lw.FewShotFit.from_dict(old)


def _saved_fit() -> dict:
    X, costs = _synthetic()
    basis = lw.Basis(["d0"], costs[:1], ["test"], [0.0], X.max(axis=0)[None])
    return lw.fit_few_shot(basis, X[:5], X[:5] @ costs[0]).to_dict()


@pytest.mark.slow
def test_a_shipped_onnxruntime_model_is_a_basis_device_that_prices_as_the_model_does():
    """Each shipped onnxruntime model prices a network's terms as the model prices the dense
    float32 network; a device whose latencies it explains once scaled is fitted through it."""
    from dlas_predict.models.ortmodel import OrtInputs, OrtLatencyModel, ort_terms
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.networks.summary import NetworkSummary
    from dlas_predict.paths import MODELS_STORE

    basis = lw.onnxruntime_basis()
    name = "shipped:local:onnxruntime model"
    assert name in basis.devices and set(basis.sources) == {lw.ORT_SOURCE}
    model = OrtLatencyModel.load(MODELS_STORE / "local")
    nets = ["zoo:resnet18-cifar", "zoo:mobilenetv2-cifar", "zoo:vgg16-cifar",
            "zoo:mobilenetv1-cifar", "zoo:efficientnet-b0"]
    X, want = [], []
    for n in nets:
        net = read_network(zoo.resolve(n))
        specs = [c.spec for c in net.convs()]
        x = ort_terms(specs, [0.0] * len(specs), NetworkSummary.of(net), "fp32", False,
                      lw.ORT_BLOCK)
        want.append(1e3 * model.predict(OrtInputs(x[None], ["fp32"]))[0])
        X.append(lw.layer_terms(net))
    X = np.array(X)
    got = basis.predict_ms(X)[:, basis.devices.index(name)]
    assert got == pytest.approx(want, rel=1e-9)
    # the layer-kind terms play no part in its price, nor its terms in a fitted device's
    assert np.all(basis.costs[:, :len(lw.LAYER_TERMS)] == 0)
    assert np.all(lw.fit_costs(X, np.array(want))[len(lw.LAYER_TERMS):] == 0)
    fit = lw.fit_few_shot(basis, X, 0.5 * np.array(want))
    assert fit.basis_device == name and fit.scales == pytest.approx([0.5, 0.5])
    assert fit.basis_source == lw.ORT_SOURCE and "costs scaled by 0.5" in fit.describe()


def test_the_shipped_terms_hold_every_corpus_network_as_it_builds_today():
    """The terms a first adapt starts from (shipped, not built again) hold every network the
    shipped corpora time whole, and are those the networks give today (one network of each
    generated family built again)."""
    import json
    import lzma

    path = lw.shipped_terms_path()
    assert path.is_file(), "no terms of today's version: datasets/make_layerwise_terms.py"
    shipped = json.loads(lzma.decompress(path.read_bytes()))
    missing = sorted(set(lw.corpus_network_names()) - set(shipped))
    assert not missing, f"{missing[:3]} not shipped: datasets/make_layerwise_terms.py"
    families = {}
    for name in sorted(shipped):
        families.setdefault(name.split("_")[0], name)
    sample = [n for n in families.values() if "=" in n]  # the generated families
    assert len(sample) >= 4, families
    for name in sample:
        assert shipped[name] == pytest.approx(lw.named_network_terms(name), rel=1e-9), name


def test_the_number_of_scales_is_chosen_by_leave_one_out_or_fixed():
    """A device whose compute costs 3× a basis device's and the rest 1×: two scales are
    chosen (shrunk towards one) and predict better than one scale, which, when asked, is
    one factor for the whole price. (The basis device is given alone: which of several
    random ones explains such a device best is a matter of the draw.)"""
    X, costs = _synthetic(seed=5)
    basis = lw.Basis(["d1"], costs[1:2], ["test"], [0.0])
    comp = np.array([t.endswith("gmacs") for t in lw.TERMS[:len(lw.LAYER_TERMS)]]
                    + [False] * (len(lw.TERMS) - len(lw.LAYER_TERMS)))
    X[:, comp] *= np.linspace(0.2, 5.0, len(X))[:, None]  # networks from light to heavy
    truth = 3.0 * (X * comp) @ costs[1] + (X * ~comp) @ costs[1]
    chosen = lw.fit_few_shot(basis, X[:12], truth[:12])
    assert chosen.basis_device == "d1" and chosen.scales[0] > chosen.scales[1]
    one = lw.fit_few_shot(basis, X[:12], truth[:12], parametrisation="one scale")
    assert one.scales[0] == one.scales[1]
    assert np.mean(np.abs(np.log(chosen.predict(X[12:]) / truth[12:]))) < np.mean(
        np.abs(np.log(one.predict(X[12:]) / truth[12:])))
    two = lw.fit_few_shot(basis, X[:2], truth[:2], parametrisation="two scales")
    assert two.scales[0] == two.scales[1]  # two rows fit one scale only


def test_a_device_between_two_basis_devices_is_priced_by_their_blend():
    """A device whose every cost is halfway between d1's and d2's: neither basis device
    scaled (one scale or two) explains it, their blend does, is chosen by leave-one-out,
    predicts held-out networks closer, says so, and survives save and load; a device that
    is one basis device scaled keeps that device alone."""
    X, costs = _synthetic(devices=4, networks=40, seed=3)
    comp = lw._COMPUTE.astype(bool)
    X[:, comp] *= np.linspace(0.2, 5.0, len(X))[:, None]  # light to compute-heavy
    basis = lw.Basis([f"d{i}" for i in range(4)], costs, ["test"] * 4, [0.0] * 4)
    truth = X @ (0.5 * costs[1] + 0.5 * costs[2])
    shots = np.arange(0, 40, 4)
    rest = np.setdiff1d(np.arange(40), shots)
    blend = lw.fit_few_shot(basis, X[shots], truth[shots])
    assert sorted(blend.blend) == ["d1", "d2"]
    assert blend.describe().startswith("a blend of ") and " (compute ×" in blend.describe()
    assert len(blend.blend_scales) == 4 and min(blend.blend_scales) >= 0
    err = lambda f: np.median(np.abs(f.predict(X[rest]) / truth[rest] - 1))  # noqa: E731
    for p in ("one scale", "two scales"):
        assert err(blend) < 0.5 * err(lw.fit_few_shot(basis, X[shots], truth[shots], p))
    assert err(blend) < 0.03
    assert lw.FewShotFit.from_dict(json.loads(json.dumps(blend.to_dict()))) == blend
    scaled = lw.fit_few_shot(basis, X[shots], 2.0 * (X[shots] @ costs[3]))
    assert scaled.blend == [] and scaled.basis_device == "d3"
    assert scaled.scales == pytest.approx([2.0, 2.0])
    with pytest.raises(DlasError, match="two basis devices"):
        lw.fit_few_shot(lw.Basis(["d0"], costs[:1], ["test"], [0.0]), X[shots],
                        truth[shots], "two basis devices")


def test_the_leave_one_out_error_is_the_fit_made_without_that_row():
    """What adapt reports (leave-one-out, the basis device chosen again each time) is what
    a fit on the other rows predicts for the row left out."""
    X, costs = _synthetic(seed=3)
    rng = np.random.default_rng(4)
    truth = (X @ costs[1]) * np.exp(rng.normal(0.0, 0.15, len(X)))
    fit = lw.fit_few_shot(lw.Basis(["a", "b", "c", "d"], costs, ["t"] * 4, [0.0] * 4),
                          X[:8], truth[:8])
    for i in range(8):
        keep = np.arange(8) != i
        alone = lw.fit_few_shot(lw.Basis(["a", "b", "c", "d"], costs, ["t"] * 4, [0.0] * 4),
                                X[:8][keep], truth[:8][keep])
        assert math.log(alone.predict(X[i])[0] / truth[i]) == pytest.approx(
            fit.loo_log_errors[i])


def test_a_family_the_basis_misprices_gets_its_own_offset_from_mixed_shots():
    """A device on which recurrent networks run ×1.6 what the basis device's costs say and
    CNNs ×1.0: shots of both families give each family its own (shrunk) offset, and the
    held-out recurrent networks are priced closer than by one scale; shots of one family
    give none. The offsets survive save and load, and leave-one-out still reports the fit
    made without the row."""
    X, costs = _synthetic(seed=6)
    recurrent = np.arange(len(X)) % 2 == 1
    first = lw.TERMS.index(f"onnxruntime {lw.ORT_FAMILIES[2]}{lw.ORT_TERMS[0]}")
    X[recurrent, first] = 1.0  # work counted in the recurrent block: a recurrent network
    assert lw.network_family(X[:2]) == ["cnn", "recurrent"]
    basis = lw.Basis(["d0"], costs[:1], ["test"], [0.0])
    base = X @ costs[0]
    truth = base * np.where(recurrent, 1.6, 1.0)
    fit = lw.fit_few_shot(basis, X[:12], truth[:12], parametrisation="one scale")
    off = fit.family_offsets
    assert set(off) == {"cnn", "recurrent"} and off["recurrent"] - off["cnn"] > 0.25
    err = lambda f: np.abs(np.log(f.predict(X[12:]) / truth[12:]))  # noqa: E731
    plain = lw.FewShotFit(**{**fit.to_dict(), "family_offsets": {}})
    assert err(fit)[recurrent[12:]].mean() < 0.6 * err(plain)[recurrent[12:]].mean()
    assert lw.FewShotFit.from_dict(json.loads(json.dumps(fit.to_dict()))) == fit
    alone = lw.fit_few_shot(basis, X[1:12], truth[1:12], parametrisation="one scale")
    assert math.log(alone.predict(X[0])[0] / truth[0]) == pytest.approx(fit.loo_log_errors[0])
    cnns = lw.fit_few_shot(basis, X[:12][~recurrent[:12]], truth[:12][~recurrent[:12]])
    assert cnns.family_offsets == {}


def test_the_macs_baseline_is_a_power_law_of_the_multiply_adds():
    X, _ = _synthetic()
    ms = 3.0 * lw.macs_of(X) ** 0.8
    f = lw.macs_fit(X[:10], ms[:10])
    assert np.allclose(f(X[10:]), ms[10:])


def _write(path, header, rows):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("rows, needle", [
    (["zoo:resnet18-cifar,dense,3.0,tflite", "zoo:vgg16-cifar,dense,4.0,tflite",
      "zoo:mobilenetv1-cifar,dense,1.0,armnn"], ":4: runtime 'armnn', but line 2 is 'tflite'"),
    (["zoo:resnet18-cifar,dense,3.0,tflite", "zoo:vgg16-cifar,int8,4.0,tflite",
      "zoo:mobilenetv1-cifar,dense,1.0,tflite"], "one configuration at a time"),
    (["zoo:resnet18-cifar,dense/gemm,3.0,tflite", "zoo:vgg16-cifar,dense,4.0,tflite",
      "zoo:mobilenetv1-cifar,dense,1.0,tflite"], ":2: dense/gemm names our engine's build"),
    (["zoo:resnet18-cifar,dense,3.0,tf lite", "zoo:vgg16-cifar,dense,4.0,tflite",
      "zoo:mobilenetv1-cifar,dense,1.0,tflite"], ":2: runtime 'tf lite': use one word"),
])
def test_adapt_refuses_rows_of_another_runtime_badly(tmp_path, rows, needle):
    csv = _write(tmp_path / "m.csv", "target,config,latency_ms,runtime", rows)
    assert_clean_error(run_cli("adapt", "--device", "box", "--measurements", csv), needle)


@pytest.mark.slow
def test_adapt_on_another_runtime_then_predict_in_it(tmp_path, monkeypatch):
    """Whole networks timed in another runtime: predict answers in that runtime, with the
    fit adapt reported, and refuses a runtime the device was not adapted on."""
    monkeypatch.setenv("DLAS_SHARED_DATA", str(tmp_path / "none"))  # the shipped basis only
    nets = ["zoo:resnet18-cifar", "zoo:mobilenetv2-cifar", "zoo:vgg16-cifar",
            "zoo:mobilenetv1-cifar"]
    times = [3.1, 1.4, 4.8, 0.9]
    csv = _write(tmp_path / "m.csv", "target,config,latency_ms,runtime",
                 [f"{n},dense,{v},tflite" for n, v in zip(nets, times)])
    r = run_cli("adapt", "--device", "tfl-box", "--measurements", csv, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["runtime"] == "tflite" and rep["registered"] and "layer-kind" in rep["parameters"]
    saved = json.loads(open(rep["path"]).read())
    fit = lw.FewShotFit.from_dict(saved["fit"])
    got = json.loads(run_cli("predict", *nets, "--device", "tfl-box", "--json").output)
    for p, n in zip(got, nets):
        assert p["runtime"] == "tflite" and p["source"] == "adapted"
        assert p["config"] == "dense/tflite" and p["low_ms"] < p["predicted_ms"] < p["high_ms"]
        assert p["predicted_ms"] == pytest.approx(fit.predict(lw.network_terms(n))[0])
    # the reported error is the fit without each row, as predict would make it
    y = np.log(times)
    loo = y + np.array(fit.loo_log_errors)
    assert rep["loo_median_error"] == pytest.approx(float(np.median(np.abs(np.exp(loo - y) - 1))))
    assert_clean_error(run_cli("predict", nets[0], "--device", "tfl-box", "--runtime", "armnn"),
                       "adapted on tflite latencies, not 'armnn'")
    assert_clean_error(run_cli("predict", nets[0], "--device", "tfl-box", "--config", "int8"),
                       "prices dense, not int8")


@pytest.mark.slow
@pytest.mark.skipif(not HELP.is_file(), reason="HELP's latencies not there")
def test_a_help_device_prices_an_onnx_network_by_its_layers():
    r = run_cli("predict", "zoo:resnet18-cifar", "--device", "titanx_1", "--json")
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.output)
    assert p["source"] == "trained" and p["runtime"] == "help" and p["config"] == "dense/help"
    assert p["low_ms"] < p["predicted_ms"] < p["high_ms"]
    assert_clean_error(run_cli("predict", "zoo:resnet18-cifar", "--device", "titanx_1",
                               "--config", "int8"), "prices dense, not int8")
