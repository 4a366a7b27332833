"""Cross-device models: the latent model on known structure, leave-one-device-out, predict
and adapt (save → load → predict equality, bad input), and HELP's data where it lies."""
import hashlib
import json

import numpy as np
import pytest

from conftest import SHARED_DATA, assert_clean_error, run_cli, trained_here
from dlas_predict.crossdev.evaluate import leave_one_device_out
from dlas_predict.crossdev.latent import LatentModel, _complete, spearman
from dlas_predict.crossdev.sources import LatencyMatrix
from dlas_predict.errors import DlasError

HELP = SHARED_DATA / "help_nb201" / "latency.csv.gz"
needs_help = pytest.mark.skipif(not HELP.is_file(), reason=f"HELP's data not at {HELP}")


def synthetic(n_targets=400, n_devices=9, k=2, noise=0.02, seed=0) -> LatencyMatrix:
    """Devices that are exact low-rank mixtures of target factors, plus noise."""
    rng = np.random.default_rng(seed)
    macs = rng.uniform(1e5, 1e8, n_targets)
    base = np.log(macs) - 14
    U = rng.normal(0, 1, (n_targets, k))
    Y = np.array([rng.normal(0, 1) + rng.uniform(0.7, 1.3) * base + U @ rng.normal(0, 0.5, k)
                  for _ in range(n_devices)]).T + rng.normal(0, noise, (n_targets, n_devices))
    return LatencyMatrix("synthetic", "kernel", [f"t{i}" for i in range(n_targets)],
                         [f"d{j}" for j in range(n_devices)], Y, macs)


def test_completion_recovers_missing_entries_of_a_low_rank_matrix():
    mat = synthetic(noise=0.0)
    rng = np.random.default_rng(1)
    Y = mat.log_ms.copy()
    hole = rng.random(Y.shape) < 0.2
    Y[hole] = np.nan
    X = _complete(Y, rank=3)
    err = np.abs(X[hole] - mat.log_ms[hole])
    assert np.percentile(err, 95) < 0.02 and np.median(err) < 0.005
    # against filling each hole with its device's mean
    assert np.median(err) < 0.1 * np.median(np.abs(np.nanmean(Y, axis=0) - mat.log_ms)[hole])


def test_ten_shots_rank_a_held_out_device_and_beat_its_zero_shot_prior():
    mat = synthetic()
    held = "d4"
    model = LatentModel().fit(mat.without(held))
    y = mat.column(held)
    shots = np.arange(10)
    post = model.adapt(shots, y[shots])
    rest = np.arange(10, len(y))
    pred, sd = model.predict(post, rest)
    zero = model.predict(model.zero_shot(), rest)[0]
    assert spearman(pred, y[rest]) > 0.97
    assert np.median(np.abs(pred - y[rest])) < np.median(np.abs(zero - y[rest]))
    # the interval shrinks with measurements
    assert sd.mean() < model.predict(model.zero_shot(), rest)[1].mean()
    # with every target measured the posterior is the device's least-squares loading
    full = model.adapt(np.arange(len(y)), y)
    assert np.median(np.abs(model.predict(full, rest)[0] - y[rest])) < 0.03


def test_an_adapted_device_s_80_percent_intervals_hold_about_80_percent_of_held_out_truths():
    """The scale of the adapted intervals is learned by leaving each training device out
    (never the held-out one): on devices whose noise the fitted one underrates, the
    intervals widen until about 80 % of the truths lie in them."""
    mat = synthetic(noise=0.1)
    rep = leave_one_device_out(mat, shots=(10,), draws=3)
    cover = np.mean([h.by_shots[10].coverage for h in rep.devices])
    assert 0.7 <= cover <= 0.9
    model = LatentModel().fit(mat)
    assert model.interval_scale_ > 1.0
    post, rows, scale = model.adapt(np.arange(10), mat.column("d0")[:10]), np.arange(10, 20), \
        model.interval_scale_
    sd = model.predict(post, rows)[1]
    model.interval_scale_ = 1.0
    assert np.allclose(sd, scale * model.predict(post, rows)[1])
    # a zero-shot answer has a scale of its own
    zero = model.predict(model.zero_shot(), np.arange(5))[1]
    model.interval_scale_ = 3.0
    assert np.array_equal(model.predict(model.zero_shot(), np.arange(5))[1], zero)


def test_a_device_noisier_than_the_training_ones_widens_its_own_intervals_from_its_shots():
    """Its shots, each predicted from the others, miss by more than the model's intervals
    allow: the device's own spread widens them until about 80 % of its other truths lie in
    them (shrunk a little towards the model's: 61 % here); a device as quiet as the
    training ones keeps about the model's."""
    mat = synthetic(noise=0.02)
    model = LatentModel().fit(mat.without("d4"))
    rng = np.random.default_rng(3)
    quiet = mat.column("d4")
    noisy = quiet + rng.normal(0, 0.3, len(quiet))
    shots, rest = np.arange(20), np.arange(20, len(quiet))
    for y, low, high in ((noisy, 0.55, 0.95), (quiet, 0.7, 0.95)):
        post = model.adapt(shots, y[shots])
        pred, sd = model.predict(post, rest)
        assert low <= np.mean(np.abs(pred - y[rest]) <= 1.2816 * sd) <= high
    pred, narrow = model.predict(model.adapt(shots, noisy[shots], spread=False), rest)
    assert np.mean(np.abs(pred - noisy[rest]) <= 1.2816 * narrow) < 0.3
    wide = model.adapt(shots, noisy[shots])
    assert wide.spread > 3 and model.adapt(shots, quiet[shots]).spread < 2
    # the closed-form leave-one-out is refitting without each shot
    A, y = model.Z_[shots], noisy[shots]
    loo = [A[i] @ model.adapt(np.delete(shots, i), np.delete(y, i), spread=False).mean
           for i in range(len(shots))]
    cov, mean = wide.cov, wide.mean
    v = np.einsum("ij,jk,ik->i", A, cov, A)
    assert np.allclose(y - (y - A @ mean) / (1 - v / model.noise_var_), loo)


def test_a_zero_shot_spec_beyond_the_training_devices_widens_its_interval_by_its_leverage():
    mat = synthetic()
    model = LatentModel().fit(mat)
    specs = np.random.default_rng(0).normal(size=(len(mat.devices), 2))
    inside = model.zero_shot(specs.mean(axis=0), specs)
    beyond = model.zero_shot(specs.mean(axis=0) + 6 * specs.std(axis=0), specs)
    assert inside.spread == 1.0 and beyond.spread > 1.5
    rows = np.arange(5)
    assert np.allclose(model.predict(beyond, rows)[1],
                       beyond.spread * model.predict(inside, rows)[1])


def test_zero_shot_intervals_hold_about_80_percent_over_held_out_devices_not_the_whole_prior():
    """A device placed from its spec is far nearer its truth than the spread of the
    training devices' loadings says; the zero-shot scale, learned by placing each training
    device the same way, brings the share of truths its intervals hold over held-out
    devices from nearly all to about 80 %."""
    rng = np.random.default_rng(0)
    n, devices = 300, [f"d{j}" for j in range(12)]
    base = rng.normal(0, 1, n)
    U = rng.normal(0, 1, (n, 2))
    spec = {d: rng.normal(0, 1, 2) for d in devices}  # the device's level and slope
    Y = np.array([3 * spec[d][0] + (1 + 0.3 * spec[d][1]) * base + U @ rng.normal(0, 0.2, 2)
                  + rng.normal(0, 0.3) for d in devices]).T
    mat = LatencyMatrix("synthetic", "kernel", [f"t{i}" for i in range(n)], devices, Y,
                        np.exp(base + 14))

    def placed(model, d):
        return model.zero_shot(spec[d], np.array([spec[x] for x in model.devices_]))

    held, unscaled = [], []
    for d in devices:
        m = LatentModel(k=2, noise=1.0, zero_shot_of=placed).fit(mat.without(d))
        assert m.zero_shot_scale_ < 0.8
        mean, sd = m.predict(placed(m, d), np.arange(n))
        inside = np.abs(mean - mat.column(d)) <= 1.2816 * sd
        held.append(inside.mean())
        unscaled.append((np.abs(mean - mat.column(d)) <= 1.2816 * sd / m.zero_shot_scale_)
                        .mean())
    assert np.mean(unscaled) > 0.95
    assert 0.65 <= np.mean(held) <= 0.92


def test_leave_one_device_out_reports_every_device_and_refuses_too_many_shots():
    mat = synthetic(n_devices=7)
    rep = leave_one_device_out(mat, shots=(0, 10), draws=2)
    assert [h.device for h in rep.devices] == mat.devices
    for h in rep.devices:
        assert set(h.by_shots) == {0, 10}
        assert h.by_shots[10].spearman > 0.9
        assert 0 <= h.by_shots[10].within_10pct <= 1
        assert h.ceiling is not None and h.roofline is None  # no spec for synthetic devices
    assert rep.mean("model", 10) > rep.mean("macs", 10)
    with pytest.raises(DlasError, match="larger than device d1's data"):
        leave_one_device_out(mat, shots=(500,), devices=["d1"])
    with pytest.raises(DlasError, match="no data of device 'nope'"):
        leave_one_device_out(mat, devices=["nope"])


def test_an_unquoted_conv_target_is_named(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text(f"target,config,latency_ms\n{C1},dense/gemm,1.0\n")
    assert_clean_error(run_cli("adapt", "--device", "q", "--measurements", path),
                       "quote")


@pytest.mark.parametrize("text, expect", [
    ("dense", ("dense", None, None, None)),
    ("int8/spatial_pack", ("int8", None, "spatial_pack", None)),
    ("weight_pruning@0.9/gemm/tuned", ("weight_pruning", 0.9, "gemm", "tuned")),
    ("*/direct", (None, None, "direct", None)),
    ("int8/per_layer", ("int8", None, "per_layer", None)),
    ("float16/onnxruntime", ("float16", None, "onnxruntime", None)),
])
def test_config_syntax(text, expect):
    from dlas_predict.recommend.predict import parse_config

    c = parse_config(text)
    assert (c.compression, c.ratio, c.algorithm, c.tuning) == expect


@pytest.mark.parametrize("text, needle", [
    ("sparse", "allowed: dense"), ("dense@0.5", "only weight_pruning"),
    ("weight_pruning@1.5", "(0, 1)"), ("dense/winograd", "allowed: direct"),
])
def test_bad_configs(text, needle):
    from dlas_predict.recommend.predict import parse_config

    with pytest.raises(DlasError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_config(text)


def test_a_bad_algorithm_lists_every_algorithm_a_config_may_name():
    """The allowed list comes from the enum the parser reads, so it cannot go stale."""
    from dlas_predict.recommend.predict import parse_config
    from dlas_predict.space.config import PlanAlgorithm

    with pytest.raises(DlasError) as err:
        parse_config("dense/foo")
    assert str(err.value).endswith("allowed: " + ", ".join(a.value for a in PlanAlgorithm))
    assert "per_layer" in str(err.value) and "onnxruntime" in str(err.value)


def _write(path, rows):
    """Rows ``TARGET,CONFIG,MS``; the target is quoted (a conv's spec holds commas)."""
    lines = []
    for r in rows:
        t, c, v = r.rsplit(",", 2)
        lines.append(f'"{t}",{c},{v}\n')
    path.write_text("target,config,latency_ms\n" + "".join(lines))
    return path


C1, C2, C3 = ("conv:C=64,H=56,W=56,K=64,R=3,S=3,pad=1", "conv:C=32,H=28,W=28,K=64,R=1,S=1",
              "conv:C=128,H=14,W=14,K=128,R=3,S=3,pad=1,groups=128")


@pytest.mark.parametrize("rows, needle", [
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,2.0", "zoo:resnet50,dense,3"],
     "mixes conv and network targets"),
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,2.0", "model.pt,dense,3"],
     "cannot predict 'model.pt'"),
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,2.0", f"{C3},fp8/gemm,3"], "allowed: dense"),
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,-2", f"{C3},dense/gemm,3"], "must be positive"),
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,", f"{C3},dense/gemm,3"], "missing"),
    ([f"{C1},dense/gemm,1.0", f"{C1},dense/gemm,2.5", f"{C3},dense/gemm,3"],
     "disagrees with line 2"),
    ([f"{C1},dense/gemm,1.0", f"{C2},dense/gemm,2.0"], "at least 3"),
])
def test_adapt_refuses_bad_measurements(tmp_path, rows, needle):
    r = run_cli("adapt", "--device", "bad-dev", "--measurements", _write(tmp_path / "m.csv", rows))
    assert_clean_error(r, needle)


def test_predict_refuses_a_device_with_neither_spec_nor_measurements():
    assert_clean_error(run_cli("predict", C1, "--device", "never-seen"),
                       "neither a spec")


def _tree_hash(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.slow
def test_adapt_on_convs_saves_under_dlas_home_and_predicts_the_same_after_reload(tmp_path):
    """A new x86 device adapted from six conv latencies of the avx2 profile's corpus: saved
    under DLAS_HOME, the shipped models and corpora untouched, and a fresh process-state
    load predicts exactly what the adapt-time model did."""
    import pandas as pd

    from dlas_predict.recommend import predict as predictor
    from dlas_predict.paths import CORPUS_SNAPSHOTS, MODELS_STORE, dlas_home

    df = pd.read_parquet(CORPUS_SNAPSHOTS / "local-avx2-1t.parquet")
    df = df[(df.compression == "dense") & df.error.isna()].drop_duplicates("conv").head(6)
    rows = [f"conv:{c},dense/{a},{m * 1e3:.6f}" for c, a, m in
            zip(df.conv, df.algorithm, df.median_s)]
    before = _tree_hash(MODELS_STORE), _tree_hash(CORPUS_SNAPSHOTS)
    r = run_cli("adapt", "--device", "my-avx2-box", "--measurements",
                _write(tmp_path / "m.csv", rows), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["registered"] and rep["source"] == "profiles" and rep["rows"] == 6
    assert (dlas_home() / "adapted" / "my-avx2-box.json").is_file()
    assert (_tree_hash(MODELS_STORE), _tree_hash(CORPUS_SNAPSHOTS)) == before
    listed = {d["name"]: d for d in json.loads(run_cli("devices", "--json").output)}
    box = listed["my-avx2-box"]  # known by its measurements alone: every field, none invented
    assert set(box) == set(listed["local"]) and box["model"] == "adapted"
    assert box["peak_gflops"] == {} and box["cores"] is None
    targets = [f"conv:{c}" for c in df.conv] + [C3]
    first = predictor.predict(targets, "my-avx2-box", "dense/gemm")
    predictor.basis.cache_clear()
    again = predictor.predict(targets, "my-avx2-box", "dense/gemm")
    assert [p.to_dict() for p in first] == [p.to_dict() for p in again]
    assert {p.source for p in first} == {"adapted"}
    # the measured convs come back near their latencies (the fit, not a lookup)
    meas = df.median_s.to_numpy() * 1e3
    pred = np.array([p.predicted_ms for p in first[:6]])
    assert np.median(np.abs(pred / meas - 1)) < 0.5
    r = run_cli("predict", *targets[:2], "--device", "my-avx2-box", "--config", "dense/gemm",
                "--json")
    out = json.loads(r.output)
    assert r.exit_code == 0 and [o["target"] for o in out] == targets[:2]
    assert set(out[0]) == {"target", "config", "predicted_ms", "low_ms", "high_ms", "source",
                           "runtime"}
    assert out[0]["low_ms"] < out[0]["predicted_ms"] < out[0]["high_ms"]
    # recommend answers the new device from the map adapt fitted
    rec = json.loads(run_cli("recommend", "zoo:resnet18-cifar", "--device", "my-avx2-box",
                             "--json").output)
    assert rec["source"] == "adapted" and rec["mapping"]["shots"] == 6


def test_predict_answers_each_config_given():
    r = run_cli("predict", C1, C2, "--device", "local", "--config", "dense/gemm",
                "--config", "int8/direct", "--config", "dense/gemm", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [(p["target"], p["config"].split("/")[:2]) for p in out] == [
        (C1, ["dense", "gemm"]), (C2, ["dense", "gemm"]),
        (C1, ["int8", "direct"]), (C2, ["int8", "direct"])]
    assert out[0]["predicted_ms"] != out[2]["predicted_ms"]


@pytest.mark.slow
def test_a_registry_device_without_data_is_zero_shot_and_says_so():
    r = run_cli("predict", C1, "--device", "i7-8700", "--config", "dense")
    assert r.exit_code == 0, r.output
    assert "zero-shot" in r.output and "adapt --device i7-8700" in r.output


@needs_help
def test_help_ten_shots_rank_a_device_left_out(tmp_path):
    """titanx (its three batch sizes) left out of HELP's devices: titanx_1's ten
    hardware-embedding latencies, then Spearman over architectures 900-1899 far above the
    MACs baseline (kernel launches, not MACs, set a GPU's batch-1 latency)."""
    from dlas_predict.crossdev.sources import help_matrix

    mat = help_matrix()
    train = mat.without("titanx_1").without("titanx_32").without("titanx_256")
    model = LatentModel(k=4, noise=4.0).fit(train)
    shots = np.array([11982, 431, 55, 9, 14451, 8636, 9881, 13479, 6196, 1462])
    y = mat.column("titanx_1")
    post = model.adapt(shots, y[shots])
    ev = np.arange(900, 1900)
    rho = spearman(model.predict(post, ev)[0], y[ev])
    assert rho > 0.9
    assert rho > spearman(mat.macs[ev], y[ev]) + 0.1


@pytest.mark.slow
@needs_help
def test_adapt_a_new_device_on_nasbench201_latencies(tmp_path):
    from dlas_predict.crossdev.sources import help_matrix

    mat = help_matrix()
    y = np.exp(mat.column("silver_4114"))
    idx = [11982, 431, 55, 9, 14451, 8636, 9881, 13479, 6196, 1462]
    rows = [f"nasbench201:{mat.targets[i]},dense,{y[i]:.4f}" for i in idx]
    r = run_cli("adapt", "--device", "xeon-like", "--measurements",
                _write(tmp_path / "nb.csv", rows))
    assert r.exit_code == 0 and "new device" in r.output, r.output
    ev = list(range(900, 960))
    r = run_cli("predict", *[f"nasbench201:{mat.targets[i]}" for i in ev], "--device",
                "xeon-like", "--json")
    pred = [o["predicted_ms"] for o in json.loads(r.output)]
    assert spearman(np.array(pred), y[ev]) > 0.8
    assert_clean_error(run_cli("predict", C1, "--device", "xeon-like"), "adapted on help")


@pytest.mark.slow
def test_active_learn_replays_a_profile_and_draws_its_curve(tmp_path):
    out = tmp_path / "curve.png"
    r = run_cli("active-learn", "--device", "local-avx2-1t", "--budget", "6", "--replay",
                "datasets/corpus/local-avx2-1t.parquet", "--network", "zoo:resnet18-cifar",
                "--random-runs", "1", "--plot", out, "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["reference"] != "local-avx2-1t"  # the device learned is no reference of itself
    assert res["plans"] == 15 and out.stat().st_size > 1000
    main = res["curves"]["variance"][0]
    assert [s["measured"] for s in main] == list(range(7))
    assert len({s["picked"] for s in main[:-1]}) == 6  # six distinct kernels measured
    assert len(res["curves"]["random"]) == 1
    assert all(0 <= s["within_10pct"] <= 1 for s in main)


@pytest.mark.parametrize("args, needle", [
    (["--budget", "0"], "at least 1"),
    (["--budget", "5", "--replay", "nope.parquet"], "not found"),
    (["--budget", "5", "--replay", "datasets/corpus/local-avx2-1t.parquet", "--network",
      "zoo:resnet50"], "'resnet50' is not in the recorded"),
    (["--budget", "5"], "--network is needed"),
])
def test_active_learn_bad_input(args, needle):
    assert_clean_error(run_cli("active-learn", "--device", "local-avx2-1t", *args), needle)


@pytest.mark.parametrize("args, needle", [
    (["--level", "layer"], "'layer' is not one of 'kernel', 'network'"),
    (["--source", "help"], "help has networks only; use --level network"),
    (["--source", "tophub", "--level", "network"], "tophub has kernels only"),
    (["--shots", "0,ten"], "--shots takes comma-separated counts"),
    (["--shots", ","], "--shots is empty"),
    (["--draws", "0"], "--draws must be at least 1"),
])
def test_evaluate_leave_one_device_out_bad_input(args, needle):
    assert_clean_error(run_cli("evaluate", "--leave-one-device-out", *args), needle)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "tophub").is_dir(), reason="TopHub's logs not there")
def test_evaluate_leave_one_device_out_cli():
    r = run_cli("evaluate", "--leave-one-device-out", "--source", "tophub", "--device",
                "rk3399-cpu", "--shots", "0,10", "--draws", "2", "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    (h,) = rep["devices"]
    assert h["device"] == "rk3399-cpu" and set(h["by_shots"]) == {"0", "10"}
    assert h["by_shots"]["10"]["spearman"] > h["macs"]["10"]["spearman"]
    assert_clean_error(run_cli("evaluate", "--leave-one-device-out", "--source", "tophub",
                               "--device", "ultra96", "--shots", "40"), "larger than")


@pytest.mark.slow
def test_predict_a_network_is_the_recommend_candidate_it_names(monkeypatch):
    """A whole network on a trained device: the prediction of the configuration named is
    recommend's own for that candidate; an open config is recommend's first within the
    accuracy budget (channel pruning at 0.9 breaks resnet18-cifar's shipped curve), the
    fastest with no budget."""
    trained_here(monkeypatch, True)  # the profile's model is this machine's, whichever
    r = run_cli("predict", "zoo:resnet18-cifar", "--device", "local-avx2-1t", "--config",
                "dense/gemm", "--json")
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.output)
    assert p["config"] == "dense/gemm/untuned" and p["source"] == "trained"
    rec = json.loads(run_cli("recommend", "zoo:resnet18-cifar", "--device", "local-avx2-1t",
                             "--tuning", "untuned", "--max-accuracy-drop", "100", "--top",
                             "1000", "--json").output)
    same = [c for c in rec["candidates"] if c["config"]["compression"] == "dense"
            and c["config"]["algorithm"] == "gemm"]
    assert same and abs(same[0]["predicted_ms"] - p["predicted_ms"]) < 1e-3
    (fast,) = json.loads(run_cli("predict", "zoo:resnet18-cifar", "--device",
                                 "local-avx2-1t", "--json").output)
    assert fast["predicted_ms"] <= p["predicted_ms"]
    assert not fast["config"].startswith("channel_pruning@0.9")
    (free,) = json.loads(run_cli("predict", "zoo:resnet18-cifar", "--device", "local-avx2-1t",
                                 "--max-accuracy-drop", "100", "--json").output)
    assert free["predicted_ms"] <= fast["predicted_ms"] and "pruning@0.9" in free["config"]
    assert_clean_error(run_cli("predict", "zoo:resnet18-cifar", "--device", "local",
                               "--max-accuracy-drop", "-1"), "accuracy budget must be >= 0")
    assert_clean_error(run_cli("predict", "zoo:nope", "--device", "local"), "unknown zoo")


@pytest.mark.slow
def test_a_large_batch_is_shared_among_the_cores_and_priced_as_one_process_prices_it(
        monkeypatch):
    """Forked processes price a large batch's networks as this process would, each distinct
    network once, and every target keeps its own text and place."""
    import os
    from dataclasses import replace

    from dlas_predict.recommend import predict as predictor

    trained_here(monkeypatch, True)
    nets = ["zoo:resnet18-cifar", "zoo:mobilenetv1-cifar", "zoo:vgg16-cifar",
            "zoo:mobilenetv2-cifar", "zoo:resnet18-cifar"]
    alone = predictor.predict(nets, "local-avx2-1t", "dense")
    priced = predictor.predict_network
    monkeypatch.setattr(predictor, "predict_network", lambda t, device, cfg, **kw: replace(
        priced(t, device, cfg, **kw), basis=str(os.getpid())))
    monkeypatch.setattr(predictor, "PARALLEL_FROM", 2)
    monkeypatch.setattr("dlas_predict.space.devices.local_cores", lambda: 2)
    shared = predictor.predict(nets, "local-avx2-1t", "dense")
    pids = {p.basis for p in shared}
    assert str(os.getpid()) in pids and len(pids) >= 2  # this process and a forked one
    assert [replace(p, basis="") for p in shared] == [replace(p, basis="") for p in alone]
    assert shared[4].target == "zoo:resnet18-cifar" and shared[4].basis == shared[0].basis


@pytest.mark.slow
def test_adapt_on_whole_network_latencies_then_recommend(tmp_path):
    """Latencies of whole zoo networks measured in any runtime: the map from the reference
    engine's predictions is fitted, and recommend and predict answer from it."""
    rows = ["zoo:resnet18-cifar,dense/spatial_pack,49.5", "zoo:resnet18-cifar,int8/gemm,40",
            "zoo:mobilenetv1-cifar,dense/direct,10"]
    r = run_cli("adapt", "--device", "net-box", "--measurements",
                _write(tmp_path / "n.csv", rows), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["rows"] == 3 and rep["registered"] and "offset" in rep["parameters"]
    (p,) = json.loads(run_cli("predict", "zoo:resnet18-cifar", "--device", "net-box",
                              "--config", "dense/spatial_pack", "--json").output)
    assert p["source"] == "adapted"
    assert 49.5 / 3 < p["predicted_ms"] < 49.5 * 3  # pulled to the measurement's scale
    rec = json.loads(run_cli("recommend", "zoo:resnet18-cifar", "--device", "net-box",
                             "--json").output)
    assert rec["source"] == "adapted" and rec["mapping"]["shots"] == 3
    # fitted on whole networks, applied to each of their kernels: offsets only
    assert rec["mapping"]["slope"] == 1.0


@pytest.mark.machine
def test_a_map_fitted_without_a_slope_fits_offsets_to_what_the_slope_leaves():
    """``fit_slope=False``: slope 1, and the offset and group offsets (each shrunk towards
    the zero-shot map's 0) fit y - x."""
    from types import SimpleNamespace

    from dlas_predict.crossdev.transfer import DeviceMap, adapted_map

    x = np.log(np.linspace(0.1, 30.0, 20))
    groups = ["dense/direct"] * 10 + ["int8/direct"] * 10
    y = x + 0.3 + np.where(np.arange(20) < 10, 0.0, 0.5)
    base = DeviceMap("box", "local", "zero-shot", 0.0, 0.0, -0.5, 0.5)
    dev = SimpleNamespace(name="box", peak_gflops={})
    m = adapted_map(dev, "local", x, np.zeros(20), y, groups, base, fit_slope=False)
    assert m.slope == 1.0
    pred = m.apply(x, np.zeros(20), groups)
    assert np.abs(pred - y).max() < 0.2  # the prior pulls the offsets in a little
    assert m.group_offsets["int8/direct"] - m.group_offsets["dense/direct"] > 0.3
    free = adapted_map(dev, "local", x, np.zeros(20), y, groups, base)
    assert free.slope != 1.0


@pytest.mark.machine
@pytest.mark.slow
def test_predict_prices_a_network_run_by_onnxruntime(monkeypatch):
    """As its model's machine, onnxruntime's row is trained; elsewhere (the layer model
    mapped here too) it moves with the map and is the map's."""
    from dlas_predict.models.ortmodel import OrtLatencyModel
    from dlas_predict.space.devices import model_dir
    from dlas_predict.space.devices import get_device

    trained_here(monkeypatch, True)
    res = run_cli("predict", "zoo:resnet18-cifar", "--device", "local", "--config",
                  "dense/onnxruntime", "--json")
    assert res.exit_code == 0, res.output
    (p,) = json.loads(res.output)
    assert p["config"] == "dense/onnxruntime/untuned" and p["source"] == "trained"
    assert p["low_ms"] <= p["predicted_ms"] <= p["high_ms"]
    trained_here(monkeypatch, False)
    (q,) = json.loads(run_cli("predict", "zoo:resnet18-cifar", "--device", "local",
                              "--config", "dense/onnxruntime", "--json").output)
    # the onnxruntime model read here: this machine's own where the project measured it
    where = OrtLatencyModel.load(model_dir("local")).meta_["onnxruntime_fingerprints"]
    here = get_device("local", with_target=False).fingerprint in where
    assert q["source"] == ("trained" if here else "zero-shot")
    assert (q["predicted_ms"] == p["predicted_ms"]) == here
    assert q["low_ms"] <= q["predicted_ms"] <= q["high_ms"]
    assert_clean_error(run_cli("predict", "conv:C=64,H=32,W=32,K=64,R=3,S=3,pad=1",
                               "--device", "local", "--config", "dense/onnxruntime"),
                       "per whole network")
    assert_clean_error(run_cli("predict", "zoo:resnet18-cifar", "--device", "rpi3b",
                               "--config", "dense/onnxruntime"), "no onnxruntime model")


def test_a_channel_pruned_layer_left_without_zeros_is_a_plan_of_the_dense_kernel():
    """After channel removal a layer may keep no zeroed filter (ratio 0): it runs the dense
    kernel, so a replay scores its plan from the dense kernel's recording."""
    import pandas as pd

    from dlas_predict.recommend.active import PoolKernel, _pool

    convs = ["C=3,H=8,W=8,K=8,R=3,S=3,stride=1,pad=1", "C=8,H=8,W=8,K=5,R=3,S=3,stride=1,pad=1"]
    layers = pd.DataFrame({"network": "n", "config": "channel_pruning@0.9",
                           "layer_index": [0, 1], "conv": convs,
                           "compression": "channel_pruning", "ratio": [0.0, 0.2]})
    recorded = {PoolKernel(convs[0], "gemm", "dense", 0.0).key: 0.1,
                PoolKernel(convs[1], "gemm", "channel_pruning", 0.2).key: 0.2}
    pool = _pool(layers, recorded)
    assert pool.plans == [("n", "channel_pruning@0.9", "gemm")]
    assert [k.compression for k in pool.kernels] == ["dense", "channel_pruning"]


@pytest.mark.slow  # fits the zero-shot map from the shipped corpora alone
def test_every_registry_gpu_answers_from_what_ships_without_the_public_data(tmp_path,
                                                                            monkeypatch):
    """No public data: a GPU's zero-shot map is fitted on the shipped corpora's CPU and GPU
    pairs together, and says so; a TopHub device's convs are priced as any device's."""
    monkeypatch.setenv("DLAS_SHARED_DATA", str(tmp_path / "nothing"))
    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    r = run_cli("recommend", "zoo:resnet18-cifar", "--device", "xavier", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)
    assert rec["source"] == "zero-shot" and rec["candidates"]
    assert any("CPU and GPU pairs together" in n and "public data folder not found" in n
               for n in rec["notes"])
    r = run_cli("predict", "conv:C=64,H=56,W=56,K=64,R=3,S=3,pad=1", "--device", "rpi3b",
                "--json")
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.output)
    assert p["source"] == "zero-shot" and p["low_ms"] < p["predicted_ms"] < p["high_ms"]


def test_a_json_command_that_fails_says_so_in_json_too():
    r = run_cli("predict", "zoo:nonexistent", "--device", "rpi3b", "--json")
    assert r.exit_code != 0
    first = r.output.splitlines()[0]
    assert json.loads(first) == {"error": json.loads(first)["error"]}
    assert "unknown zoo network 'nonexistent'" in json.loads(first)["error"]
    assert_clean_error(r, "unknown zoo network")


def test_the_unknown_device_error_names_the_adapted_devices(tmp_path, monkeypatch):
    from dlas_predict.crossdev.adapted import adapted_path

    monkeypatch.setenv("DLAS_HOME", str(tmp_path))
    adapted_path("my-box").write_text(json.dumps({"device": "my-box", "source": "help",
                                                  "level": "network", "targets": []}))
    r = run_cli("recommend", "zoo:resnet18-cifar", "--device", "nosuch")
    assert_clean_error(r, "unknown device 'nosuch'")
    assert "my-box" in r.output.split("known:")[1]


@pytest.mark.skipif(not (SHARED_DATA / "tophub").is_dir(), reason="TopHub's logs not there")
def test_tuned_kernels_adapt_a_device_on_tophubs_tuned_kernels(tmp_path):
    """Rows of ``conv:`` with a ``/tuned`` config, as TopHub publishes them, adapt a device
    on TopHub's tuned kernels; predict then prices tuned configurations on it."""
    from dlas_predict.crossdev import sources

    mat = sources.tophub_matrix(None)
    j = mat.devices.index("rk3399-cpu")
    rows = np.flatnonzero(np.isfinite(mat.log_ms[:, j]))[:12]
    lines = [f'conv:{mat.targets[i].split("|")[0]},dense/direct/tuned,'
             f'{np.exp(mat.log_ms[i, j]):.5f}' for i in rows[:10]]
    csv = _write(tmp_path / "t.csv", lines)
    r = run_cli("adapt", "--device", "tuned-box", "--measurements", csv, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["source"] == "tophub"
    held = [f"conv:{mat.targets[i].split('|')[0]}" for i in rows[10:]]
    got = json.loads(run_cli("predict", *held, "--device", "tuned-box", "--config",
                             "dense/direct/tuned", "--json").output)
    truth = np.exp(mat.log_ms[rows[10:], j])
    assert [p["config"] for p in got] == ["dense/tuned"] * 2
    assert all(0.5 < p["predicted_ms"] / t < 2.0 for p, t in zip(got, truth))
    mixed = _write(tmp_path / "m.csv", lines[:5] + [lines[5].replace("/tuned", "")])
    assert_clean_error(run_cli("adapt", "--device", "tuned-box", "--measurements", mixed),
                       "tuned and untuned kernels")


@pytest.mark.skipif(not (SHARED_DATA / "tophub").is_dir(), reason="TopHub's logs not there")
@pytest.mark.slow
def test_leave_one_device_out_reports_how_often_the_interval_holds():
    r = run_cli("evaluate", "--leave-one-device-out", "--source", "tophub", "--device",
                "rk3399-cpu", "--shots", "10", "--json")
    assert r.exit_code == 0, r.output
    (dev,) = json.loads(r.output)["devices"]
    scores = next(iter(dev["by_shots"].values()))
    assert 0.0 <= scores["coverage"] <= 1.0
    text = run_cli("evaluate", "--leave-one-device-out", "--source", "tophub", "--device",
                   "rk3399-cpu", "--shots", "10").output
    assert "80% holds" in text and "inside the 80 % interval: 10 shots" in text
