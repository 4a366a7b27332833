"""The device map: which reference answers a device, the zero-shot map fitted on device
pairs, a map's kernels in the units it was fitted in, models shipped for this very machine
or another, and recommend and predict on a mapped device."""
import json

import numpy as np
import pytest

from conftest import DEMO, run_cli, trained_here
from dlas_predict.crossdev.evaluate import leave_one_device_out
from dlas_predict.crossdev.latent import LatentModel


@pytest.mark.slow
def test_the_zero_shot_map_is_fitted_on_device_pairs_with_a_held_out_interval(monkeypatch,
                                                                                tmp_path):
    """From the shipped profiles alone (no public data): α, β of the spec scaling and a
    leave-one-device-out interval that brackets zero."""
    from dlas_predict.crossdev.transfer import fit_transfer

    monkeypatch.setenv("DLAS_SHARED_DATA", str(tmp_path))  # nothing there
    fit = fit_transfer("cpu")
    assert set(fit.devices) >= {"local-avx2-1t", "local-sse42-1t"}
    assert fit.q10 < 0 < fit.q90 and 0 < fit.within_25pct < 1
    assert 0 < fit.alpha < 2 and fit.pairs > 1000
    assert fit_transfer("cpu") == fit  # the cached fit


@pytest.mark.machine
def test_a_reference_is_priced_by_its_shipped_model_whichever_model_answers_here(
        monkeypatch):
    """A map scales a reference's predictions by the machine its shipped model and corpus
    are of (``data_spec``); where this machine answers ``local`` with a model of its own,
    ``local`` as a reference is still priced by the shipped one, as recommend prices it."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.models import device as device_models
    from dlas_predict.recommend import search
    from dlas_predict.space.config import ConvSpec

    rows = [(ConvSpec.parse("C=64,H=32,W=32,K=64,R=3,S=3,pad=1"), "gemm", "dense", 0.0,
             "untuned"), (ConvSpec.parse("C=32,H=16,W=16,K=64,R=1,S=1"), "direct", "int8",
                          0.0, "untuned")]
    shipped = transfer.reference_predictions("local", rows)
    other = search.MODELS_STORE / "local-sse42-1t"  # a model of this name of another machine
    monkeypatch.setattr(device_models, "model_dir", lambda name: other)
    assert device_models.load_models("local").info["directory"] == str(other)  # answers here
    assert not np.allclose(transfer.reference_predictions("local-sse42-1t", rows)[0],
                           shipped[0])
    assert np.allclose(transfer.reference_predictions("local", rows), shipped)


def test_a_pointwise_gemm_and_a_depthwise_direct_layer_are_kernel_groups_of_their_own():
    """The map's group of a kernel: compression/algorithm, and its own group for a float32
    layer the pointwise GEMM runs on the device's vectors and for a depthwise direct layer
    (other code than the algorithm's other layers); a CSR kernel, another dtype or a layer
    without its shape keeps the plain group."""
    from dlas_predict.crossdev.transfer import group_of

    pw = "C=32,H=7,W=7,K=64,R=1,S=1"
    dw = "C=32,H=8,W=8,K=32,R=3,S=3,pad=1,groups=32"
    assert group_of("dense", "gemm", pw, 512) == "dense/gemm/pointwise"
    assert group_of("dense", "gemm", pw, 256) == "dense/gemm/pointwise"
    assert group_of("dense", "gemm", "C=32,H=2,W=2,K=64,R=1,S=1", 512) == "dense/gemm"
    assert group_of("int8", "gemm", pw, 512) == "int8/gemm"
    assert group_of("weight_pruning", "gemm", pw, 512) == "weight_pruning/gemm"
    assert group_of("dense", "direct", pw, 512) == "dense/direct"
    assert group_of("dense", "direct", dw, 512) == "dense/direct/depthwise"
    assert group_of("float16", "direct", dw) == "float16/direct/depthwise"
    assert group_of("dense", "spatial_pack", dw, 512) == "dense/spatial_pack"
    assert group_of("dense", "gemm") == "dense/gemm"


@pytest.mark.machine
def test_a_conv_on_a_device_with_a_model_of_its_own_here_is_priced_by_that_model(monkeypatch):
    """Where this machine answers ``local`` with a model of its own (``models_store/
    machines/FINGERPRINT``), ``predict conv:`` prices it with that model, as ``recommend``
    prices its layers: not with the shipped one of the same name, which is a reference of
    another machine."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.recommend.predict import predict
    from dlas_predict.recommend import search
    from dlas_predict.space import devices
    from dlas_predict.space.config import ConvSpec

    conv = "C=64,H=32,W=32,K=64,R=3,S=3,pad=1"
    rows = [(ConvSpec.parse(conv), "direct", "dense", 0.0, "untuned")]
    shipped = transfer.reference_predictions("local", rows)[0][0]
    own = next((search.MODELS_STORE / "machines").glob("*/local"))
    trained_here(monkeypatch, True)
    monkeypatch.setattr(devices, "model_dir", lambda name: own)
    (p,) = predict([f"conv:{conv}"], "local", config="dense/direct")
    assert p.source == "trained"
    assert p.predicted_ms == pytest.approx(
        transfer.reference_predictions("local", rows, own)[0][0] * 1e3, rel=1e-9)
    assert p.predicted_ms != pytest.approx(shipped * 1e3, rel=1e-3)


@pytest.mark.machine
def test_a_model_of_another_machine_is_not_this_machines(monkeypatch):
    """The local CPU's and its profiles' models are this machine's only when trained on it;
    otherwise they are references described as the machine they were trained on."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.space.devices import get_device

    trained_here(monkeypatch, True)
    assert transfer.own_model("local") and transfer.own_model("local-avx2-1t")
    trained_here(monkeypatch, False)
    assert not transfer.own_model("local") and not transfer.own_model("local-avx2-1t")
    assert transfer.own_model("h100")  # not this machine: its model is its own anywhere
    assert not transfer.own_model("i7-8700")  # no model at all
    meta = json.loads((transfer.MODELS_STORE / "local" / "layer.json").read_text())
    spec = transfer.data_spec("local")
    assert spec.peak_gflops == meta["device_roofs"]["peak_gflops"]
    assert spec.mem_bandwidth_gbs == meta["device_roofs"]["mem_bandwidth_gbs"]
    # the reference of a device is a trained one of its kind, nearest in spec
    here = get_device("local", with_target=False)
    assert transfer.reference_for(here) in transfer.trained_devices()


@pytest.mark.machine
def test_a_cpu_is_answered_from_a_reference_of_its_own_thread_count():
    """Two references of the same code, one and two threads, at equal distance in peak and
    bandwidth: a two-core CPU takes the two-thread one, a one-core CPU the other."""
    from dataclasses import replace

    from dlas_predict.crossdev import transfer

    one, two = transfer.data_spec("local-avx2-1t"), transfer.data_spec("local-avx2-2t")
    mid = {k: float(np.sqrt(one.peak_gflops[k] * two.peak_gflops[k])) for k in one.peak_gflops}
    bw = float(np.sqrt(one.mem_bandwidth_gbs * two.mem_bandwidth_gbs))
    for cores, want in ((2, "local-avx2-2t"), (1, "local-avx2-1t")):
        cpu = replace(one, name="x", peak_gflops=mid, mem_bandwidth_gbs=bw, cores=cores)
        assert transfer.reference_for(cpu, ["local-avx2-1t", "local-avx2-2t"]) == want


def _shipped_for(root, fingerprint: str):
    """A models_store under ``root`` whose ``local`` is the shipped one, with a copy of it
    shipped for the machine ``fingerprint`` (its metadata saying it was trained there)."""
    from dlas_predict import paths

    store = root / "models_store"
    store.mkdir(parents=True)
    (store / "local").symlink_to(paths.MODELS_STORE / "local")
    mine = store / paths.MACHINES / fingerprint / "local"
    mine.mkdir(parents=True)
    for f in (paths.MODELS_STORE / "local").iterdir():
        if f.name != "layer.json":
            (mine / f.name).symlink_to(f)
    meta = json.loads((paths.MODELS_STORE / "local" / "layer.json").read_text())
    meta["device_fingerprint"] = fingerprint
    (mine / "layer.json").write_text(json.dumps(meta))
    return store


@pytest.mark.machine
def test_the_models_shipped_for_this_very_machine_answer_local_as_trained(monkeypatch,
                                                                          tmp_path):
    """Where the project measured the machine the tool runs on, ``local`` is answered by
    that machine's shipped models (trained, not mapped); a folder of another machine is
    never used, and a reference still answers with its own shipped models."""
    from dlas_predict import paths
    from dlas_predict.crossdev import transfer
    from dlas_predict.recommend import search
    from dlas_predict.space import devices
    from dlas_predict.space.devices import local_fingerprint

    here = local_fingerprint()
    store = _shipped_for(tmp_path / "a", here)
    monkeypatch.setattr(paths, "MODELS_STORE", store)
    mine = store / paths.MACHINES / here / "local"
    assert devices.model_dir("local") == mine
    assert devices.model_dir("local-avx2-1t") == store / "local-avx2-1t"  # none shipped here
    assert devices.model_dir("h100") == store / "h100"
    assert transfer.model_machine("local") == here and transfer.own_model("local")
    rec = search.recommend(str(DEMO), "local", tuning="untuned", top=0)
    assert rec.source == "trained" and rec.mapping is None
    assert rec.model_info["directory"] == str(mine)
    assert not any("local's model was trained on another machine" in n
                   or "price the grid" in n for n in rec.notes), rec.notes
    # a folder shipped for another machine is not this one's
    other = _shipped_for(tmp_path / "b", "0123456789abcdef")
    monkeypatch.setattr(paths, "MODELS_STORE", other)
    assert devices.model_dir("local") == other / "local"


@pytest.mark.slow
@pytest.mark.machine
@pytest.mark.machine
def test_active_learn_on_a_machine_its_model_was_not_trained_on_starts_from_that_model(
        monkeypatch):
    """Live, ``local``'s shipped model of another machine is a reference like any other
    device's (it is not the device's own data), and the nearest one: the loop starts from
    it. On the machine it was trained on, the device's own model is no reference of
    itself. The nearest is this machine's to say: ``local`` on a CPU of the shipped model's
    code, a profile of that machine of this one's vector width on another."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.recommend import active
    from dlas_predict.space.devices import get_device

    pool = active.pool_from_networks(["zoo:mobilenetv1-cifar"])
    oracle = lambda kernel: 0.05  # noqa: E731  (ms; what is measured does not matter here)
    here = get_device("local", with_target=False)
    trained_here(monkeypatch, False)
    trained = transfer.trained_devices()
    assert "local" in trained
    curve = active.run("local", pool, oracle, 1)
    assert curve.reference == transfer.reference_for(here, trained)
    if transfer.same_code(transfer.data_spec("local"), here):
        assert curve.reference == "local"
    trained_here(monkeypatch, True)
    curve = active.run("local", pool, oracle, 1)
    assert curve.reference != "local"
    assert curve.reference == transfer.reference_for(here, [r for r in trained
                                                            if r != "local"])


@pytest.mark.slow  # prices the whole grid of a zoo network through the mapped model
def test_recommend_here_with_a_model_of_another_machine_maps_it_and_says_so(monkeypatch):
    """On a machine that is not the one the local model was trained on, ``local`` is
    answered as a device without a model: zero-shot from the nearest trained reference."""
    from dlas_predict.recommend.search import recommend

    trained_here(monkeypatch, False)
    rec = recommend("zoo:resnet18-cifar", "local", tuning="untuned", top=0)
    assert rec.source == "zero-shot" and rec.mapping["reference"]
    # (the onnxruntime model's own note, where it was trained elsewhere, is another matter)
    mapped = "local's model was trained on another machine"
    assert any(mapped in n for n in rec.notes), rec.notes
    assert {c.source for c in rec.candidates if c.backend == "tvm"} == {"zero-shot"}
    trained_here(monkeypatch, True)
    own = recommend("zoo:resnet18-cifar", "local", tuning="untuned", top=0)
    assert own.source == "trained" and own.mapping is None
    assert not any(mapped in n or "price the grid" in n for n in own.notes), own.notes


@pytest.mark.slow
def test_recommend_on_a_device_without_a_model_is_zero_shot_and_says_so(monkeypatch):
    from dlas_predict.crossdev.transfer import trained_devices

    trained_here(monkeypatch, True)
    r = run_cli("recommend", "zoo:resnet18-cifar", "--device", "i7-8700", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["source"] == "zero-shot" and rec["mapping"]["reference"] in trained_devices()
    assert {c["source"] for c in rec["candidates"]} == {"zero-shot"}
    assert any("active-learn --device i7-8700" in n for n in rec["notes"])
    c = rec["candidates"][0]
    assert c["predicted_low_ms"] < c["predicted_ms"] < c["predicted_high_ms"]
    ref = json.loads(run_cli("recommend", "zoo:resnet18-cifar", "--json").output)
    assert ref["source"] == "trained"
    # the zero-shot interval carries the map's error on top of the reference model's
    width = lambda x: x["predicted_high_ms"] / x["predicted_low_ms"]  # noqa: E731
    assert width(c) > width(ref["candidates"][0])


def test_between_gpus_a_kernel_that_fits_their_l2_takes_little_of_the_bandwidth_term():
    from dlas_predict.crossdev.transfer import DeviceMap, kernel_bytes, memory_share
    from dlas_predict.space.config import ConvSpec
    from dlas_predict.space.devices import get_device

    small = ConvSpec.parse("C=64,H=32,W=32,K=64,R=3,S=3,stride=1,pad=1")
    big = ConvSpec.parse("C=256,H=224,W=224,K=256,R=3,S=3,stride=1,pad=1")
    assert kernel_bytes(small, "dense") == 4 * (2 * 64 * 32 * 32 + 64 * 64 * 9)
    assert kernel_bytes(small, "int8") == kernel_bytes(small, "dense") / 4
    assert kernel_bytes(small, "weight_pruning@0.9") == pytest.approx(
        4 * 2 * 64 * 32 * 32 + 0.1 * 2 * 4 * 64 * 64 * 9)
    h100, h200 = get_device("h100", with_target=False), get_device("h200", with_target=False)
    xavier = get_device("xavier", with_target=False)
    share = memory_share(kernel_bytes(small, "dense"), h100, h200)
    assert 0 < share < 0.02  # 0.7 MB of a 50 MB L2
    assert memory_share(kernel_bytes(big, "dense"), h100, h200) == 1.0
    tiny = ConvSpec.parse("C=16,H=16,W=16,K=16,R=3,S=3,stride=1,pad=1")
    assert memory_share(kernel_bytes(tiny, "dense"), h100, xavier) == pytest.approx(
        kernel_bytes(tiny, "dense") / (512 * 1024))  # xavier's L2 is the smaller one
    assert memory_share(kernel_bytes(small, "dense"), h100, xavier) == 1.0
    cpu = get_device("rk3399-cpu", with_target=False)
    assert memory_share(1.0, cpu, get_device("rpi3b", with_target=False)) == 1.0
    m = DeviceMap("h200", "h100", "zero-shot", 0.5, 0.6, -1.0, 1.0)
    whole = m.log_scale(h100, h200, "dense")
    fitted = m.log_scale(h100, h200, "dense", small)
    peak_only = 0.5 * np.log(h100.peak_gflops["float32"] / h200.peak_gflops["float32"])
    assert abs(fitted - peak_only) < 0.01 < abs(whole - peak_only)


@pytest.mark.machine
def test_an_adapted_map_prices_kernels_in_the_milliseconds_it_was_fitted_in():
    """A map is of log milliseconds (active-learn, adapt fit it there); kernels priced in
    seconds are mapped through milliseconds, so a slope pivots at 1 ms whatever the unit:
    with slope 1/2, 1 ms stays 1 ms and 4 ms becomes 2 ms."""
    from types import SimpleNamespace

    from dlas_predict.crossdev.transfer import DeviceMap

    m = DeviceMap("box", "local", "adapted", 0.0, 0.0, -0.1, 0.2, offset=0.0, slope=0.5)
    no_spec = SimpleNamespace(peak_gflops={}, mem_bandwidth_gbs=None)
    conv = "C=16,H=8,W=8,K=16,R=3,S=3,stride=1,pad=1"
    secs = np.array([1e-3, 4e-3])
    mid, low, high = m.map_kernels(no_spec, no_spec, [(conv, "direct", "dense")] * 2,
                                   secs, secs, secs)
    assert mid == pytest.approx([1e-3, 2e-3])
    assert low == pytest.approx(mid * np.exp(-0.1)) and high == pytest.approx(mid * np.exp(0.2))


@pytest.mark.machine
def test_predict_a_conv_here_with_a_model_of_another_machine_is_mapped_as_recommend_is(
        monkeypatch):
    """On a machine the shipped local model was not trained on, a conv on ``local`` is
    priced as ``recommend`` prices it (the reference mapped to this machine, zero-shot),
    not as the kernel data's column of that name, which is the other machine."""
    from dlas_predict.recommend.predict import predict
    from dlas_predict.crossdev.adapted import adapted_dir
    from dlas_predict.crossdev.transfer import DeviceMap, device_map, reference_for
    from dlas_predict.space.devices import get_device

    conv = "conv:C=64,H=32,W=32,K=64,R=3,S=3,pad=1"
    trained_here(monkeypatch, False)
    (p,) = predict([conv], "local", config="dense/direct")
    nearest = device_map("local")[0].reference  # recommend's reference for this machine
    assert nearest == reference_for(get_device("local", with_target=False))
    assert p.source == "zero-shot" and p.basis == f"engine:{nearest}"
    # after active-learn: its map (the file it writes), which doubles the zero-shot times
    saved = adapted_dir() / "local.json"
    zero = device_map("local")[0]  # the same spec term, and twice the time
    m = DeviceMap("local", zero.reference, "adapted", zero.alpha, zero.beta, -0.1, 0.1,
                  offset=np.log(2.0))
    saved.write_text(json.dumps({"device": "local", "source": "profiles", "level": "kernel",
                                 "targets": [], "log_ms": [],
                                 "recommend_map": m.to_dict()}))
    try:
        (a,) = predict([conv], "local", config="dense/direct")
        assert a.source == "adapted" and a.basis == f"engine:{nearest}"
        assert a.predicted_ms == pytest.approx(2 * p.predicted_ms, rel=1e-6)
        trained_here(monkeypatch, True)
        (own,) = predict([conv], "local", config="dense/direct")
        assert own.source == "trained"
    finally:
        saved.unlink()


@pytest.mark.slow
@pytest.mark.machine
@pytest.mark.machine
def test_a_profile_left_out_is_answered_from_its_sibling_of_the_same_code():
    """A held-out profile whose processor and vector width a training device shares (another
    thread count) is answered zero-shot from that sibling's measurements, scaled by the
    map's spec term; one of other code is not a sibling."""
    from dlas_predict.crossdev import sources
    from dlas_predict.crossdev.evaluate import sibling, sibling_map, zero_shot_prior

    names = sources.profile_devices()
    assert sibling("local-sse42-1t", names) == "local-sse42-2t"
    assert sibling("local-native-1t", names) == "local"
    assert sibling("local-sse42-1t", ["local", "local-native-1t"]) is None  # other code
    assert sibling("rk3399-cpu", ["pynq", "rpi3b", "ultra96"]) is None  # no shared processor
    full = sources.profiles_matrix("kernel")
    # the targets the sibling measured (two profiles also hold kernels the others lack)
    rows = full.measured("local-sse42-2t")
    mat = sources.LatencyMatrix(full.source, full.level, [full.targets[i] for i in rows],
                                full.devices, full.log_ms[rows], full.macs[rows],
                                full.features[rows], [full.groups[i] for i in rows])
    rep = leave_one_device_out(mat, shots=(0, 10), draws=2, devices=["local-sse42-1t"])
    (h,) = rep.devices
    assert h.zero_shot_from == "sibling"
    model = LatentModel().fit(mat.without("local-sse42-1t"))
    sib, shift = sibling_map(model, "local-sse42-1t")
    assert sib == "local-sse42-2t" and 0 < shift < np.log(4)  # one thread is slower than two
    assert zero_shot_prior(model, "local-sse42-1t")[1] == "sibling"
    # the sibling's measurements, mapped, against the spec regression of the loadings
    rows = mat.measured("local-sse42-1t")
    y = mat.column("local-sse42-1t")[rows]
    mapped = mat.column(sib)[rows] + shift
    ok = np.isfinite(mapped)
    assert np.isclose(h.by_shots[0].within_25pct,
                      np.mean(np.abs(np.exp(mapped[ok] - y[ok]) - 1) <= 0.25), atol=0.02)
    assert h.by_shots[0].within_25pct > 0.7 and h.by_shots[10].within_25pct > 0.7


@pytest.mark.machine
def test_an_offset_every_measurement_shares_reaches_the_kernels_not_measured():
    """Ten measurements of five conv shapes, each 40 % faster than the map says: the common
    offset goes to the map's overall offset (held by the weakest prior), not to the shapes'
    own offsets, so a kernel of a shape never measured is priced 40 % faster too."""
    from types import SimpleNamespace

    from dlas_predict.crossdev import transfer
    from dlas_predict.crossdev.transfer import DeviceMap, adapted_map

    rng = np.random.default_rng(0)
    x = np.log(rng.uniform(0.05, 5.0, 10))
    convs = [f"C={8 * (i % 5 + 1)},H=8,W=8,K=8,R=3,S=3" for i in range(10)]
    groups = ["dense/direct"] * 10
    y = x + np.log(0.6)
    base = DeviceMap("box", "local", "zero-shot", 0.0, 0.0, -0.5, 0.5)
    dev = SimpleNamespace(name="box", peak_gflops={})
    m = adapted_map(dev, "local", x, np.zeros(10), y, groups, base, convs=convs)
    unseen = m.apply(np.log([1.0]), np.zeros(1), ["dense/direct"], ["C=99,H=8,W=8,K=8,R=1,S=1"])
    assert np.exp(unseen[0]) == pytest.approx(0.6, rel=0.1)
    assert max(abs(v) for v in m.conv_offsets.values()) < 0.1
    assert transfer.PRIOR_ROWS["offset"] < min(transfer.PRIOR_ROWS[k] for k in ("group", "conv"))


@pytest.mark.machine
def test_onnxruntime_is_mapped_between_each_cpu_s_own_instruction_sets(monkeypatch):
    """onnxruntime runs a CPU's own instruction set whatever our kernels are built for: the
    roof it runs at over a device's own is 1 for code of the CPU's own level or vector width
    (an AVX2-only CPU's AVX2 profiles), never below 1 for a profile of a narrower level (a
    Zen 4's AVX2 roof measures level with its AVX-512 one), above 1 for SSE4.2's (measured
    where both roofs are, here or in the shipped data) and for this CPU forced to one under
    DLAS_FORCE_ISA; a GPU has none."""
    import platform

    from dlas_predict.crossdev.transfer import data_spec, onnxruntime_roof_ratio
    from dlas_predict.space import devices as D

    assert onnxruntime_roof_ratio(data_spec("local")) == 1.0
    assert onnxruntime_roof_ratio(data_spec("local-native-1t")) == 1.0
    assert onnxruntime_roof_ratio(data_spec("h100")) == 1.0
    sse = data_spec("local-sse42-1t")  # the shipped data's machine, both roofs measured
    native_1t = D.measured_peaks(data_spec("local-native-1t").fingerprint)
    assert onnxruntime_roof_ratio(sse) == pytest.approx(
        native_1t["peak_gflops"]["float32"] / sse.peak_gflops["float32"])
    here = D.get_device("local", with_target=False)
    forced_level = D.forced_isa()
    assert (onnxruntime_roof_ratio(here) > 1.0) == (
        forced_level is not None and forced_level.simd_bits < D.native_simd_bits())
    profiles = {n: D.get_device(n, with_target=False) for n in D.profile_names()
                if "native" not in n}
    lower = [n for n, d in profiles.items() if d.simd_bits < D.native_simd_bits()]
    for name, dev in profiles.items():
        if name not in lower:
            assert onnxruntime_roof_ratio(dev) == 1.0, name
    if platform.machine() not in ("x86_64", "AMD64") or not lower:
        pytest.skip("no profile of a lower x86-64 level on this CPU")
    for name in lower:  # at least 1; above where the profile's vectors are half as wide
        ratio = onnxruntime_roof_ratio(profiles[name])
        assert ratio >= 1.0, name
        if profiles[name].simd_bits == 128:
            assert ratio > 1.0, name
    if D.native_simd_bits() == 128:
        return
    monkeypatch.setenv(D.FORCE_ISA_ENV, "sse42")
    D._cpuinfo.cache_clear()
    try:
        forced = D.get_device("local", with_target=False)
        assert forced.simd_bits == 128
        assert onnxruntime_roof_ratio(forced) > 1.0
    finally:
        monkeypatch.undo()
        D._cpuinfo.cache_clear()
