"""The analysis toolbox: frames, heat map, regression, box plot, roofline, and their CLI."""
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_clean_error, run_cli
from dlas_predict.analysis import frames as A
from dlas_predict.analysis import plots as P
from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.errors import ConfigError, DlasError
from dlas_predict.measure.records import MeasureResult, measurement_key
from dlas_predict.measure.networks.plans import NetworkMeasurement
from dlas_predict.corpus.store import CorpusStore, store_device

GEN = "cnn_layers=2_kernels=32_kernel_size=3_input=20_batch=1_block=residual_downsample=0"


def _record(spec: ConvSpec, alg: str, comp: str, ratio: float, seconds: float,
            sparsity: float = 0.0) -> MeasureResult:
    v = Variant(alg, comp, ratio)
    return MeasureResult(key=measurement_key("local", "fp", spec, v, {}, "k1"), device="local",
                         fingerprint="fp", conv=spec, variant=v, knobs={}, sparsity=sparsity,
                         run_secs=[seconds] * 5, verified=True, kernels_version="k1")


SPECS = [ConvSpec.parse(f"C={c},H={h},W={h},K={k},R=3,S=3,stride=1,pad=1")
         for c, k, h in ((8, 16, 8), (16, 32, 8), (32, 32, 16), (16, 64, 16))]
#: latency = MACs / speed(algorithm) x factor(compression): known by construction
SPEED = {"direct": 1e9, "gemm": 2e9, "spatial_pack": 4e9}
FACTOR = {"dense": 1.0, "float16": 2.0, "weight_pruning": 0.5}


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.sqlite"
    with CorpusStore(path) as db:
        for spec in SPECS:
            for alg, speed in SPEED.items():
                for comp, f in FACTOR.items():
                    ratio = 0.5 if comp == "weight_pruning" else 0.0
                    db.add(_record(spec, alg, comp, ratio, spec.macs / speed * f,
                                   sparsity=ratio))
        for name in ("net-a", GEN):
            for comp in FACTOR:
                ratio = 0.5 if comp == "weight_pruning" else 0.0
                label = comp if not ratio else f"{comp}@{ratio}"
                db.add_network_config(name, label, [(i, f"conv{i}", s.to_spec(), comp, ratio)
                                                    for i, s in enumerate(SPECS[:2])])
    return path


def test_generated_params_parse_names():
    assert A.generated_params(GEN) == {"net_layers": 2, "net_kernels": 32, "net_kernel_size": 3,
                                       "net_input": 20, "net_batch": 1,
                                       "net_block": "residual", "net_downsample": 0,
                                       "net_activation": "relu", "net_se": 0}
    assert A.generated_params("resnet18-cifar") == {}
    # the parameters a name leaves out at their defaults are filled in, named ones read
    se = GEN.replace("residual", "inverted") + "_activation=silu_se=1"
    assert A.generated_params(se)["net_activation"] == "silu"
    assert A.generated_params(se)["net_se"] == 1
    assert A.short_name(GEN) == "cnn L2 K32 k3 in20 residual ds0"
    assert A.short_name(se) == "cnn L2 K32 k3 in20 inverted ds0 silu se"


def test_kernel_frame_derives_metrics(store):
    f = A.kernel_frame(store)
    # specs 0 and 1 belong to both networks, 2 and 3 to none: 2x2x9 + 2x9 rows
    assert len(f) == 2 * 2 * 9 + 2 * 9
    assert set(f["network"]) == {"net-a", GEN, "-"}
    row = f[(f.C == 8) & (f.algorithm == "gemm") & (f.compression == "float16")].iloc[0]
    spec = SPECS[0]
    assert row.latency_ms == pytest.approx(spec.macs / 2e9 * 2.0 * 1e3)
    assert row.gflops == pytest.approx(2 * spec.macs / (spec.macs / 2e9 * 2.0) / 1e9)
    assert row.speedup == pytest.approx(0.5)  # float16 is twice as slow as dense gemm
    wp = f[(f.compression == "weight_pruning") & (f.C == 8)].iloc[0]
    assert wp.useful_gflops == pytest.approx(wp.gflops * 0.5) and wp.speedup == 2.0
    gen = f[f.network == GEN].iloc[0]
    assert gen.net_kernels == 32 and gen.family == "generated"


def test_heatmap_is_the_median_per_cell(store):
    f = A.kernel_frame(store)
    h = A.heatmap(f, "algorithm", "compression", "speedup")
    assert h.x_values == ["direct", "gemm", "spatial_pack"]
    assert h.y_values == ["dense", "float16", "weight_pruning"]
    assert h.values[1] == [pytest.approx(0.5)] * 3 and h.values[2] == [pytest.approx(2.0)] * 3
    lat = A.heatmap(f, "algorithm", "C", "latency_ms")
    for j, alg in enumerate(lat.x_values):
        for i, c in enumerate(lat.y_values):
            cell = f[(f.algorithm == alg) & (f.C == c)]["latency_ms"]
            assert lat.values[i][j] == pytest.approx(float(np.median(cell)))
            assert lat.counts[i][j] == len(cell)


def test_regression_recovers_the_dominant_parameter(store):
    f = A.kernel_frame(store)
    r = A.regression(f, "log_latency", ["macs", "algorithm", "compression"])
    # log latency = log MACs - log speed + log factor: compression and algorithm both move it
    assert 0.6 < r.r2 <= 1.0 and r.n == len(f)
    coef = dict(zip(r.terms, r.coefficients))
    assert coef["macs"] > 0
    assert coef["algorithm=spatial_pack"] < coef["algorithm=gemm"] < 0  # faster than direct
    assert coef["compression=float16"] > 0 > coef["compression=weight_pruning"]
    assert set(r.importance) == {"macs", "algorithm", "compression"}


def test_boxplot_stats_are_quantiles(store):
    f = A.kernel_frame(store)
    b, samples = A.boxplot_stats(f, "latency_ms", "algorithm")
    for g, st, s in zip(b.groups, b.stats, samples):
        v = f[f.algorithm == g]["latency_ms"]
        assert st["n"] == len(v) == len(s)
        assert st["median"] == pytest.approx(v.median()) and st["q3"] >= st["q1"]


def test_unknown_names_list_the_available_ones(store):
    f = A.kernel_frame(store)
    with pytest.raises(ConfigError, match="available: .*algorithm"):
        A.heatmap(f, "nope", "C", "gflops")
    with pytest.raises(ConfigError, match="available: latency_ms"):
        A.boxplot_stats(f, "nope", "C")
    with pytest.raises(ConfigError, match="not in this corpus; available: dense"):
        A.Filters(compression="int8").apply(f)
    with pytest.raises(ConfigError, match="network-level metric"):
        A.check_metric("intensity", "network")


def test_network_frame_prefers_whole_network_latencies(store):
    with CorpusStore(store) as db:
        db.add_network(NetworkMeasurement(
            key="w1", device="local", fingerprint="fp", network="net-a", config="dense",
            algorithm="gemm", plan="[]", dtype="float32", run_secs=[0.01], verified=True))
    n = A.network_frame(store)
    assert len(n) == 2 * 3 * 3  # 2 networks x 3 configs x 3 algorithms
    whole = n[(n.network == "net-a") & (n.config == "dense") & (n.algorithm == "gemm")].iloc[0]
    assert whole.latency_source == "whole network" and whole.latency_ms == pytest.approx(10.0)
    other = n[(n.network == GEN) & (n.config == "dense") & (n.algorithm == "gemm")].iloc[0]
    kernel_sum = sum(s.macs / 2e9 for s in SPECS[:2]) * 1e3
    assert other.latency_source == "conv kernel sum"
    assert other.latency_ms == pytest.approx(kernel_sum)
    f16 = n[(n.network == GEN) & (n.config == "float16") & (n.algorithm == "gemm")].iloc[0]
    assert f16.speedup == pytest.approx(0.5)


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plots_are_written(store, tmp_path):
    from dlas_predict.space.devices import Device

    f = A.kernel_frame(store)
    dev = Device(name="local", kind="cpu", description="test CPU", target={}, cores=2,
                 clock_ghz=None, simd_bits=512, peak_gflops={"float32": 100.0},
                 mem_bandwidth_gbs=20.0, source="measured")
    outs = [P.plot_heatmap(A.heatmap(f, "algorithm", "compression", "gflops"),
                           tmp_path / "h.png"),
            P.plot_regression(A.regression(f, "gflops", ["C", "algorithm"]),
                              tmp_path / "r.png"),
            P.plot_boxplot(*A.boxplot_stats(f, "speedup", "compression"), tmp_path / "b.png"),
            P.plot_roofline(f, dev, tmp_path / "rf.png")]
    for out in outs:
        w, h = _png_size(out)
        assert w > 300 and h > 200
    with pytest.raises(ConfigError, match=".png, .svg or .pdf"):
        P.plot_boxplot(*A.boxplot_stats(f, "speedup", "compression"), tmp_path / "b.txt")


def test_attainable_roof():
    from dlas_predict.space.devices import Device

    dev = Device(name="x", kind="cpu", description="", target={}, cores=1, clock_ghz=None,
                 simd_bits=None, peak_gflops={"float32": 100.0}, mem_bandwidth_gbs=10.0)
    assert A.attainable_gflops(dev, "float32", 2.0) == 20.0
    assert A.attainable_gflops(dev, "float32", 50.0) == 100.0
    assert A.attainable_gflops(dev, "int8", 50.0) == 100.0  # falls back to float32
    # a kernel whose bytes fit a cache level whose bandwidth was measured: that level bounds
    # it; VNNI's int8 roof where measured
    dev = Device(name="x", kind="cpu", description="", target={}, cores=2, clock_ghz=None,
                 simd_bits=None, peak_gflops={"float32": 100.0, "int8": 80.0},
                 mem_bandwidth_gbs=10.0, caches={"L1d_kb": 32, "L2_kb": 512, "L3_kb": 8192},
                 int8_dot_gflops=400.0, cache_bandwidth_gbs={"L1": 300.0, "L2": 100.0})
    assert A.memory_level(dev, 60 * 1024) == ("L1", 300.0)  # 2 cores x 32 KB
    assert A.memory_level(dev, 600 * 1024) == ("L2", 100.0)
    assert A.memory_level(dev, 4 << 20) == ("DRAM", 10.0)  # L3's bandwidth not measured
    assert A.attainable_gflops(dev, "float32", 0.5, 600 * 1024) == 50.0
    assert A.attainable_gflops(dev, "float32", 0.5, 4 << 20) == 5.0
    assert A.attainable_gflops(dev, "int8", 50.0, 4 << 20) == 400.0


@pytest.mark.slow
def test_local_analysis_names_whose_corpus_and_every_kernel_lies_under_its_roof(
        tmp_path, monkeypatch):
    from dlas_predict import paths
    from dlas_predict.space import devices as D

    # DLAS_HOME's corpus here, its cache of the shipped snapshots the session's
    monkeypatch.setattr(paths, "default_store_path", lambda: tmp_path / "corpus.sqlite")
    default_store_path = paths.default_store_path
    # the shipped roofs, not a measurement of this machine another test cached
    monkeypatch.setattr(D, "_peaks_cache", lambda fingerprint: tmp_path / "no-peaks.json")
    # on another machine: the shipped corpus, and said so
    fp = store_device(A.resolve_store("local", None), "local",
                      D.fingerprint_here("local")).fingerprint
    monkeypatch.setattr(D, "local_fingerprint", lambda: "ffffffffffffffff")
    shipped = A.open_corpus("local", None)
    assert shipped.origin == "shipped" and shipped.this_machine is False
    assert "another machine" in shipped.device.description and fp in shipped.device.description
    assert "has no measurement of local of its own" in shipped.describe()
    res = _run("analyze", "roofline", "--out", tmp_path / "rf.png", "--json")
    got = json.loads(res.output)
    assert (got["corpus_origin"], got["this_machine"]) == ("shipped", False)
    # the roofs of the machine that measured it bound every kernel: no FLOP count or roof
    # is off (the int8 GEMM's VNNI and warm caches included)
    assert got["kernels"] > 10000 and got["above_roof"] == 0
    assert got["cache_bandwidth_gbs"] and got["int8_dot_gflops"]
    # this machine's rows in DLAS_HOME's corpus (what collect and calibrate write)
    monkeypatch.setattr(D, "local_fingerprint", lambda: "fp")
    with CorpusStore(default_store_path()) as db:
        for spec in SPECS:
            db.add(_record(spec, "gemm", "dense", 0.0, spec.macs / 1e9))
    mine = A.open_corpus("local", None)
    assert (mine.path, mine.origin, mine.this_machine) == (default_store_path(),
                                                          "measured here", True)
    res = _run("analyze", "roofline", "--out", tmp_path / "rf.png")
    assert res.exit_code == 0, res.output
    assert "(measured here); rows measured on this machine" in res.output
    assert "wrote" in res.output and "4 rows" in res.output
    # a device that is never this machine: its shipped corpus, no claim either way
    assert A.open_corpus("h100", None).this_machine is None


_run = run_cli


def test_cli_analyze_commands(store, tmp_path):
    res = _run("analyze", "heatmap", "--x", "algorithm", "--y", "compression", "--metric",
               "speedup", "--store", store, "--out", tmp_path / "h.png", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["median"][1] == [pytest.approx(0.5)] * 3
    res = _run("analyze", "regression", "--metric", "log_latency", "--params",
               "macs,algorithm", "--store", store, "--out", tmp_path / "r.png")
    assert res.exit_code == 0 and "R² = " in res.output and "macs" in res.output
    res = _run("analyze", "boxplot", "--metric", "speedup", "--by", "compression",
               "--level", "network", "--store", store, "--out", tmp_path / "b.png")
    assert res.exit_code == 0, res.output
    res = _run("analyze", "roofline", "--store", store, "--out", tmp_path / "rf.png",
               "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kernels"] == 4 * 9
    for out in ("h.png", "r.png", "b.png", "rf.png"):
        assert (tmp_path / out).stat().st_size > 1000


@pytest.mark.parametrize("args,needle", [
    (["heatmap", "--x", "foo", "--y", "C"], "unknown kernel-level parameter 'foo'; available"),
    (["boxplot", "--metric", "bar", "--by", "C"], "unknown kernel-level metric 'bar'"),
    (["boxplot", "--metric", "gflops", "--by", "C", "--network", "nope"],
     "--network nope is not in this corpus"),
    (["boxplot", "--metric", "gflops", "--by", "C", "--level", "layer"],
     "'layer' is not one of 'kernel', 'network'"),
    (["roofline", "--device", "nodev"], "unknown device 'nodev'"),
    (["roofline", "--device", "xavier"], "no shipped corpus for device 'xavier'"),
])
def test_cli_analyze_bad_input(args, needle, store, tmp_path):
    extra = [] if "--device" in args else ["--store", store]
    res = _run("analyze", *args, *extra, "--out", tmp_path / "x.png")
    assert res.exit_code in (1, 2)  # 2: a value outside an option's choices
    assert_clean_error(res, needle)


def test_shipped_corpora_resolve():
    snaps = A.shipped_snapshots()
    assert {"local", "h100"} <= set(snaps) and "rk3399-cpu" not in snaps
    with pytest.raises(DlasError, match="corpus store not found"):
        A.resolve_store("local", Path("/nonexistent/nope.sqlite"))
    with pytest.raises(DlasError, match="import-tophub"):
        A.resolve_store("rk3399-cpu", None)
