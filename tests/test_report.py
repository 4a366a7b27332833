"""The DLAS report: summary tables, ideal-speedup shares, verdict rules, the HTML page (opened
in a real headless browser), and the command."""
import json
import os
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from dlas_predict.cli import app
from dlas_predict.analysis import report as R
from conftest import CPU
from dlas_predict.compression.accuracy import AccuracyCurve

runner = CliRunner()


def _net(latencies: dict[tuple[str, str, str], float], macs=1e6) -> pd.DataFrame:
    """A network frame from {(network, config, algorithm): ms}."""
    rows = []
    for (network, config, alg), ms in latencies.items():
        comp, _, ratio = config.partition("@")
        ratio = float(ratio or 0)
        rows.append({"device": "local", "network": network, "config": config,
                     "algorithm": alg, "compression": comp, "ratio": ratio,
                     "tuning": "untuned", "latency_ms": ms, "net_macs": macs,
                     "effective_macs": macs * (1 - ratio), "latency_source": "whole network",
                     "speedup": float("nan")})
    return pd.DataFrame(rows)


def _grid(fn):
    out = {}
    for net in ("a", "b", "c", "d"):
        for config in ("dense", "float16", "int8", "weight_pruning@0.9",
                       "channel_pruning@0.9"):
            for alg in ("direct", "gemm", "spatial_pack"):
                out[(net, config, alg)] = fn(net, config, alg)
    return out


def _by_number(obs):
    return {o.number: o for o in obs}


def test_tables_and_shares_follow_the_latencies():
    speed = {"direct": 3.0, "gemm": 1.0, "spatial_pack": 2.0}
    comp = {"dense": 1.0, "float16": 2.0, "int8": 0.5, "weight_pruning@0.9": 0.8,
            "channel_pruning@0.9": 0.2}
    net = _net(_grid(lambda n, c, a: speed[a] * comp[c]))
    t3, t4, t6 = R.summary_tables(net)
    assert len(t3) == 4 and t3[0]["dense"] == "gemm 1" and t3[0]["float16"] == "gemm 2"
    assert t4[0]["direct"].startswith("channel_pruning@0.9 0.6")
    assert t6[0]["config"] == "channel_pruning@0.9" and t6[0]["speedup"] == "5.00x"
    shares = {(s["network"], s["compression"]): s for s in R.ideal_shares(net)}
    wp = shares[("a", "weight_pruning")]
    assert wp["ideal"] == pytest.approx(10.0) and wp["achieved"] == pytest.approx(1.25)
    assert wp["share"] == pytest.approx(0.125)
    assert shares[("a", "channel_pruning")]["share"] == pytest.approx(0.5)


def test_verdicts_follow_their_rules():
    speed = {"direct": 3.0, "gemm": 1.0, "spatial_pack": 2.0}
    slow16 = {"dense": 1.0, "float16": 2.0, "int8": 0.5, "weight_pruning@0.9": 0.8,
              "channel_pruning@0.9": 0.2}
    obs = _by_number(R.observations(_net(_grid(lambda n, c, a: speed[a] * slow16[c])), None,
                                    None, CPU))
    assert len(obs) == 13 and list(obs) == ["I", "II", "III", "IV", "V", "VI", "VII", "VIII",
                                            "IX", "X", "XI", "XII", "XIII"]
    assert obs["V"].verdict == R.HOLDS          # float16 slower everywhere
    assert obs["III"].verdict == R.FAILS        # int8 2x faster everywhere
    assert obs["IV"].verdict == R.HOLDS         # channel 5x, weight 1.25x
    assert obs["VI"].verdict == R.HOLDS         # gemm wins dense
    assert obs["VII"].verdict == R.HOLDS and obs["VIII"].verdict == R.HOLDS
    # the two prunings a hair apart (channel 0.2 % above weight): the same share, not larger
    even = dict(slow16, **{"channel_pruning@0.9": 0.8 / 1.002})
    tie = _by_number(R.observations(_net(_grid(lambda n, c, a: speed[a] * even[c])), None,
                                    None, CPU))
    assert tie["VIII"].numbers["median_share"] > tie["VIII"].numbers["median_share_other"]
    assert tie["VIII"].verdict == R.FAILS
    assert obs["X"].verdict == R.FAILS          # gemm wins every cell
    assert obs["II"].verdict == R.NO_DATA and "curves" in obs["II"].evidence
    for n in ("XI", "XII", "XIII"):
        assert obs[n].verdict == R.NO_DATA and obs[n].evidence
    fast16 = dict(slow16, float16=0.7)
    spatial = {"direct": 3.0, "gemm": 2.0, "spatial_pack": 1.0}
    obs = _by_number(R.observations(_net(_grid(lambda n, c, a: spatial[a] * fast16[c])),
                                    None, None, CPU))
    assert obs["V"].verdict == R.FAILS and obs["VI"].verdict == R.FAILS
    def curves(weight_elbow, channel_elbow):
        return {"a": AccuracyCurve.from_dict("a", {
            "metric": "top1", "data": "d", "n_samples": 10, "dense": 0.9, "elbow_drop_pp": 1.0,
            "source": "test", "weight_pruning": {"points": [[0.4, 0.9]], "elbow": weight_elbow},
            "channel_pruning": {"points": [[0.6, 0.9]], "elbow": channel_elbow}})}

    assert _by_number(R.observations(None, None, curves(0.4, None), CPU))["II"].verdict \
        == R.HOLDS
    assert _by_number(R.observations(None, None, curves(0.4, 0.6), CPU))["II"].verdict \
        == R.FAILS


def test_each_family_is_judged_on_its_own_networks():
    """int8 pays on the CNNs and slows the transformers: the corpus-wide verdict is one,
    each family's another, with its own numbers."""
    cnn = ("cnn_layers=2_kernels=32_input=32", "resnet18-cifar")
    tr = ("transformer_layers=1_d_model=64_heads=2_ffn=4_seq=16_batch=1",
          "transformer_layers=2_d_model=64_heads=2_ffn=4_seq=16_batch=1")
    comp = {"dense": 1.0, "float16": 2.0, "int8": 0.4, "weight_pruning@0.9": 0.8,
            "channel_pruning@0.9": 0.2}
    lat = {}
    for net in cnn + tr:
        for config, factor in comp.items():
            if net in tr and config == "int8":
                factor = 1.3
            for alg in ("direct", "gemm", "spatial_pack"):
                lat[(net, config, alg)] = factor
    frame = _net(lat)
    assert R.network_family(tr[0]) == "transformers" and R.network_family(cnn[1]) == "CNNs"
    assert R.network_family("lstm-cifar") == "recurrent networks"
    assert R.network_family("vit-tiny-cifar") == "transformers"
    assert R.network_family("rnn_layers=1_hidden=64_embedding=64_vocab=500_seq=8_batch=1"
                            "_cell=gru") == "recurrent networks"
    fam = R.family_observations(frame, None, CPU)
    assert list(fam) == ["CNNs", "transformers"]
    iii = {f: _by_number(obs)["III"] for f, obs in fam.items()}
    assert iii["CNNs"].verdict == R.FAILS and iii["CNNs"].numbers["networks"] == 2
    assert iii["transformers"].verdict == R.HOLDS
    assert iii["transformers"].numbers["slower_on"] == 2
    assert [o.number for o in fam["CNNs"]] == [r.__name__.strip("_").upper()
                                               for r in R.FAMILY_RULES]
    # one family: nothing to split
    assert R.family_observations(frame[frame["network"].isin(cnn)], None, CPU) == {}


def test_channel_pruning_evidence_says_how_its_builds_were_made():
    comp = {"dense": 1.0, "float16": 2.0, "int8": 0.5, "weight_pruning@0.9": 0.8,
            "channel_pruning@0.9": 0.2}
    net = _net(_grid(lambda n, c, a: comp[c]))

    def evidence(engine_of):
        frame = net.assign(engine=[engine_of(n) for n in net["network"]])
        return _by_number(R.observations(frame, None, None, CPU))["IV"].evidence

    assert "zeroed filters removed)" in evidence(lambda n: "6")
    assert "CSR kernels over their zeroed filters" in evidence(lambda n: "2")
    assert "3 built with their zeroed filters removed, 1 with CSR kernels" in \
        evidence(lambda n: "2" if n == "a" else "5")
    assert "zeroed" not in evidence(lambda n: "")         # conv kernel sums: no build


def test_backend_table_compares_what_both_backends_timed(tmp_path):
    from dlas_predict.measure.networks.plans import NetworkMeasurement, onnxruntime_plan
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.space.devices import get_device

    speed = {"direct": 3.0, "gemm": 1.0, "spatial_pack": 2.0}
    net = _net(_grid(lambda n, c, a: speed[a]))
    dev = get_device("local", with_target=False)
    with CorpusStore(tmp_path / "s.sqlite") as db:
        for network, config, ms in (("a", "dense", 0.5), ("a", "int8", 4.0), ("zz", "dense", 1)):
            plan = onnxruntime_plan(f"{network}.onnx", network, config, None)
            db.add_network(NetworkMeasurement(
                key=plan.key(dev), device="local", fingerprint=dev.fingerprint,
                network=network, config=config, algorithm=plan.algorithm, plan="[]",
                dtype=plan.dtype.value, run_secs=[ms / 1e3] * 3, verified=True))
    rows = R.backend_table(net, tmp_path / "s.sqlite", dev)
    assert [(r["network"], r["config"]) for r in rows] == [("a", "dense"), ("a", "int8")]
    assert rows[0]["fastest"] == "onnxruntime" and rows[0]["tvm / onnxruntime"] == "2.00"
    assert rows[1]["fastest"] == "tvm" and rows[1]["tvm"] == "gemm 1"
    assert rows[1]["onnxruntime"] == "int8 4"
    with CorpusStore(tmp_path / "empty.sqlite"):
        pass
    assert R.backend_table(net, tmp_path / "empty.sqlite", dev) == []


def test_tuning_observations_use_tuned_records():
    rows = []
    for alg, untuned, tuned in (("direct", 3.0, 0.5), ("gemm", 1.0, 0.9),
                                ("spatial_pack", 2.0, 0.8)):
        for tuning, ms in (("untuned", untuned), ("tuned", tuned)):
            for comp, f in (("dense", 1.0), ("weight_pruning", 1.0)):
                rows.append({"device": "local", "network": "a", "family": "zoo", "C": 8,
                             "K": 8, "H": 8, "W": 8, "R": 3, "S": 3, "stride": 1,
                             "groups": 1, "compression": comp,
                             "ratio": 0.5 if comp != "dense" else 0.0, "algorithm": alg,
                             "tuning": tuning,
                             "latency_ms": ms * f if tuning == "untuned" or comp == "dense"
                             else untuned * 0.9,
                             "tuning_seconds": 1800.0 if tuning == "tuned" else None,
                             "speedup": 1.0, "sparsity": 0.5})
    obs = _by_number(R.observations(None, pd.DataFrame(rows), None, CPU))
    assert obs["XI"].verdict == R.HOLDS          # gemm untuned, direct tuned
    assert obs["XII"].verdict == R.HOLDS         # sparse gains 1.1x, dense 2x
    assert obs["XIII"].verdict == R.HOLDS        # 6 x 0.5 h = 3 h for network a
    assert obs["XIII"].numbers["tuning_hours"]["a"] == pytest.approx(3.0)


@pytest.fixture(scope="module")
def shipped_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = runner.invoke(app, ["report", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out, res.output


@pytest.mark.slow  # the whole shipped snapshot
def test_report_on_the_shipped_corpus(shipped_report):
    out, text = shipped_report
    page = (out / "index.html").read_text()
    for n in ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII",
              "XIII"):
        assert f"id='obs-{n}'" in page and f"{n})" in text
    for section in ("table3", "table4", "table6", "ideal", "backends"):
        assert f"id='{section}'" in page
    data = json.loads((out / "report.json").read_text())
    # the family-by-family section exactly where this machine's corpus holds two families
    several = len(data["counts"]["networks_by_family"]) > 1
    assert ("id='families'" in page) == several == ("family by family" in text)
    assert data["device"] == "local" and len(data["observations"]) == 13
    assert data["counts"]["whole_network_latencies"] > 400
    # the shipped corpus decides most observations
    decided = [o for o in data["observations"] if o["verdict"] != "no data"]
    assert len(decided) >= 10
    assert page.count("data:image/png;base64,") == len(data["plots"]) >= 5


@pytest.mark.slow  # a report from a shipped snapshot
def test_a_gpus_report_decides_the_observations_of_its_measurements(tmp_path):
    res = runner.invoke(app, ["report", "--device", "h200", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "report.json").read_text())
    obs = {o["number"]: o for o in data["observations"]}
    assert obs["V"]["verdict"] == "no data"  # a CPU observation
    assert obs["II"]["verdict"] != "no data"  # accuracy does not depend on the device
    assert {"XI", "XII", "XIII"} <= {k for k, o in obs.items() if o["verdict"] != "no data"}
    assert sum(o["verdict"] != "no data" for o in obs.values()) == 12


def test_report_bad_input(tmp_path):
    res = runner.invoke(app, ["report", "--device", "nodev", "--out", str(tmp_path)])
    assert res.exit_code == 1 and "Error: unknown device 'nodev'" in res.output
    res = runner.invoke(app, ["report", "--store", str(tmp_path / "no.sqlite"), "--out",
                              str(tmp_path)])
    assert res.exit_code == 1 and "Error: corpus store not found" in res.output


def _browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs Debian's chromium and chromium-driver (setup.sh installs "
                        "them)")
        pytest.skip("no chromium/chromedriver here (setup.sh installs them when root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1300,1000"):
        opts.add_argument(arg)
    opts.binary_location = chromium
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.mark.slow  # the browser, on the whole shipped snapshot's report
def test_report_page_in_a_headless_browser(shipped_report, tmp_path):
    out, _ = shipped_report
    browser = _browser()
    try:
        browser.get((out / "index.html").as_uri())
        assert browser.title == "DLAS report: local"
        verdicts = browser.execute_script(
            "return Array.from(document.querySelectorAll('#observations-table tbody tr'))"
            ".map(r => [r.id, r.cells[2].innerText])")
        assert [v[0] for v in verdicts] == [f"obs-{n}" for n in (
            "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII", "XIII")]
        assert {v[1] for v in verdicts} <= {"holds", "does not hold", "no data"}
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
            "i.getBoundingClientRect().width])")
        assert len(images) >= 5
        assert all(done and natural > 300 and shown > 100 for done, natural, shown in images)
        rows = browser.execute_script(
            "return ['table3-data', 'table4-data', 'table6-data', 'ideal-data'].map("
            "id => document.getElementById(id).tBodies[0].rows.length)")
        assert all(n >= 8 for n in rows)
        browser.save_screenshot(str(tmp_path / "report.png"))
        assert (tmp_path / "report.png").stat().st_size > 10000
    finally:
        browser.quit()
