"""calibrate: the kernel map and the whole-network offsets fitted from measurements, used by
recommend on this CPU only, resumed after an interruption, and bad input refused."""

from __future__ import annotations

import json
import math
import platform

import numpy as np
import pytest
from typer.testing import CliRunner

from dlas_predict.cli import app
from dlas_predict.recommend import calibrate as cal
from dlas_predict.errors import DlasError
from dlas_predict.paths import DEMO_NETWORK


@pytest.fixture
def uncalibrated(monkeypatch, tmp_path):
    """``local`` as a CPU with no model of its own: this CPU forced to AVX2 (another
    fingerprint than any shipped model's), with a DLAS_HOME of its own (no calibration
    of another test)."""
    from dlas_predict.crossdev.transfer import own_model
    from dlas_predict.space import devices as D

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cal, "MAX_KERNELS", 24)  # the loop, not its length, is tested

    _, flags, _ = D._cpuinfo()
    if platform.machine() not in ("x86_64", "AMD64") or "avx2" not in flags:
        pytest.skip("forcing AVX2 needs an x86-64 CPU with AVX2")
    monkeypatch.setenv(D.FORCE_ISA_ENV, "avx2")
    D._cpuinfo.cache_clear()
    if own_model("local"):
        pytest.skip("this CPU at AVX2 has a shipped model of its own")
    yield
    monkeypatch.undo()
    D._cpuinfo.cache_clear()


class Kernels:
    """A CPU whose kernels take 2 µs per million MACs (and a failure, where asked)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.asked: list[str] = []
        self.stop_after = stop_after

    def __call__(self, k):
        from dlas_predict.space.config import ConvSpec

        if self.stop_after is not None and len(self.asked) >= self.stop_after:
            raise KeyboardInterrupt  # the process killed mid-calibration
        self.asked.append(k.key)
        factor = {"float16": 1.6, "int8": 0.7}.get(k.compression, 1.0)
        return 0.002 * ConvSpec.parse(k.conv).macs / 1e6 * factor + 0.01, ""


class Networks:
    """onnxruntime runs 1.5× (int8 2×), our builds 1.2× (a per-layer plan of mixed
    algorithms 1.6×) what was predicted before calibration."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, model, network, cands):
        out = []
        for c in cands:
            self.asked.append(f"{network}|{c.label}")
            basis = c.basis_s if c.basis_s is not None else c.predicted_s
            f = (1.6 if c.mixed else 1.2) if c.backend == "tvm" else \
                2.0 if c.compression.value == "int8" else 1.5
            out.append((basis * 1e3 * f, ""))
        return out


class Clock:
    """Time that passes by one second a reading: a budget of minutes is never the limit."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.01
        return self.t


def test_calibrate_fits_both_backends_and_recommend_uses_it_on_this_cpu_only(uncalibrated,
                                                                              tmp_path):
    from dlas_predict.crossdev.transfer import DeviceMap
    from dlas_predict.paths import dlas_home
    from dlas_predict.recommend.search import recommend
    from dlas_predict.space.devices import get_device

    before = recommend(str(DEMO_NETWORK), "local", top=0, tuning="untuned")
    assert before.source == "zero-shot"
    assert any("`dlas-predict calibrate`" in n for n in before.notes)
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK)], Kernels(), Networks(), clock=Clock())
    assert rep.fingerprint == get_device("local", with_target=False).fingerprint
    assert rep.kernels == 24
    assert {r.backend for r in rep.network_rows} == {"tvm", "onnxruntime"}
    # onnxruntime's residuals are log 1.5 (int8: log 2): the offsets land near them
    for mode, off in rep.onnxruntime_offsets.items():
        assert 1.35 < math.exp(off) <= (2.0 if mode == "int8" else 1.6), (mode, off)
    saved = json.loads((dlas_home() / "adapted" / "local.json").read_text())
    m = DeviceMap.from_dict(saved["recommend_map"])
    assert m.fingerprint == rep.fingerprint and m.source == "adapted"

    after = recommend(str(DEMO_NETWORK), "local", top=0, tuning="untuned")
    assert after.source == "adapted"
    ort = {c.compression.value: c for c in after.candidates if c.backend == "onnxruntime"}
    dense = ort["dense"]
    assert dense.source == "adapted"
    assert dense.predicted_s == pytest.approx(
        dense.basis_s * math.exp(m.onnxruntime_offset("fp32")), rel=1e-9)
    assert dense.low_s < dense.predicted_s < dense.high_s
    # the interval of a calibrated row is the calibration's own error on this machine; our
    # builds' adds the kernel map's (a new network's kernels are not the measured ones)
    assert dense.low_s == pytest.approx(dense.predicted_s * math.exp(m.onnxruntime_q[0]))
    assert dense.high_s == pytest.approx(dense.predicted_s * math.exp(m.onnxruntime_q[1]))
    assert m.network_q[0] <= min(m.q10, -0.05) and m.network_q[1] >= max(m.q90, 0.05)
    # the offsets are per mode: int8, slower here, is moved further than fp32
    assert ort["int8"].predicted_s / ort["int8"].basis_s > 1.05 * (
        dense.predicted_s / dense.basis_s)
    assert any("calibrated" in n for n in after.notes)
    # a per-layer plan of mixed algorithms has its own offset, timed apart
    assert {r.group for r in rep.network_rows if r.backend == "tvm"} >= {"dense", "mixed"}
    assert math.exp(rep.network_offsets["mixed"]) > 1.1 * math.exp(rep.network_offsets["dense"])
    mixed = [c for c in after.candidates if c.mixed]
    single = [c for c in after.candidates if c.backend == "tvm" and not c.mixed]
    assert mixed and single
    for c in mixed + single:
        assert c.predicted_s == pytest.approx(c.basis_s * math.exp(
            m.network_offset(c.compression.value, c.mixed)), rel=1e-9)

    # the same file measured on another CPU is not used here, and recommend says so
    saved["recommend_map"]["fingerprint"] = "0123456789abcdef"
    (dlas_home() / "adapted" / "local.json").write_text(json.dumps(saved))
    other = recommend(str(DEMO_NETWORK), "local", top=0, tuning="untuned")
    assert other.source == "zero-shot"
    assert any("another machine (fingerprint 0123456789abcdef" in n for n in other.notes)


@pytest.mark.slow
def test_an_interrupted_calibration_resumes_without_measuring_anything_twice(uncalibrated):
    first = Kernels(stop_after=7)
    with pytest.raises(KeyboardInterrupt):
        cal.run("local", 5.0, [str(DEMO_NETWORK)], first, Networks(), clock=Clock())
    assert len(first.asked) == 7
    again, nets = Kernels(), Networks()
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK)], again, nets, clock=Clock())
    assert not set(again.asked) & set(first.asked)
    memo = cal.Memo(cal.Path(rep.memo))
    try:
        assert memo.count("kernel") == len(set(first.asked) | set(again.asked))
        assert memo.count("network") == len(nets.asked)
    finally:
        memo.close()
    # a third run measures nothing at all
    third, nets3 = Kernels(), Networks()
    cal.run("local", 5.0, [str(DEMO_NETWORK)], third, nets3, clock=Clock())
    assert third.asked == [] and nets3.asked == []


_KILLED_CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from dlas_predict.recommend import calibrate as cal
from test_calibrate import Clock, Kernels, Networks

class Slow(Kernels):
    def __call__(self, k):
        time.sleep(0.05)
        return super().__call__(k)

cal.MAX_KERNELS = 24
cal.run("local", 5.0, [{net!r}], Slow(), Networks(), clock=Clock())
"""


@pytest.mark.slow
def test_a_calibration_killed_by_sigkill_resumes_without_duplicates(uncalibrated):
    """The process killed with SIGKILL in the middle of its kernels: every measurement
    committed before is kept, the resumed run measures none of them again, and the store
    is intact."""
    import signal
    import sqlite3
    import subprocess
    import sys
    import time
    from pathlib import Path

    from dlas_predict.paths import dlas_home
    from dlas_predict.space.devices import get_device

    memo_path = dlas_home() / "calibrate" / f"{get_device('local').fingerprint}.sqlite"
    code = _KILLED_CHILD.format(tests=str(Path(__file__).parent), net=str(DEMO_NETWORK))
    child = subprocess.Popen([sys.executable, "-c", code])
    count = lambda: sqlite3.connect(memo_path).execute(  # noqa: E731
        "SELECT COUNT(*) FROM calibration WHERE kind = 'kernel'").fetchone()[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if memo_path.is_file() and count() >= 5:
            break
        time.sleep(0.02)
    assert child.poll() is None, "the child ended before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    db = sqlite3.connect(memo_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    before = {k for (k,) in db.execute("SELECT key FROM calibration WHERE kind = 'kernel'")}
    db.close()
    assert 5 <= len(before) < 24
    again = Kernels()
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK)], again, Networks(), clock=Clock())
    assert not set(again.asked) & before
    assert rep.kernels == 24
    memo = cal.Memo(memo_path)
    try:
        assert memo.count("kernel") == len(before | set(again.asked))
    finally:
        memo.close()


@pytest.mark.slow
def test_a_noisy_or_failed_kernel_is_recorded_and_left_out_of_the_fit(uncalibrated):
    class Noisy(Kernels):
        def __call__(self, k):
            ms, _ = super().__call__(k)
            if len(self.asked) % 5 == 0:
                return ms * 1.4, "noisy: the machine was busy (canary ×1.40); not fitted"
            if len(self.asked) % 7 == 0:
                return None, "failed: crashed"
            return ms, ""

    lines = []
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK)], Noisy(), Networks(), clock=Clock(),
                  log=lines.append)
    assert rep.kernels_failed > 0
    assert any("noisy: the machine was busy" in x and "left out" in x for x in lines)
    assert any("failed: crashed" in x for x in lines)


def test_shrunk_offsets_pull_a_lone_group_to_the_common_offset():
    from dlas_predict.crossdev.offsets import shrunk_offsets

    off, loo = shrunk_offsets(np.log([1.2, 1.2, 1.2, 2.0]), ["a", "a", "a", "b"])
    assert 0 < off["*"] < np.log(2.0)
    assert off["a"] < off["b"] < np.log(2.0)
    assert len(loo) == 4 and abs(loo[-1]) > abs(loo[0])
    # one network the reference misprices moves neither its group's offset nor the common
    base = np.log([0.50, 0.55, 0.52, 0.50, 0.55, 0.52])
    groups = ["fp32", "int8", "fp32", "int8", "fp32", "int8"]
    off, _ = shrunk_offsets(base, groups)
    out, _ = shrunk_offsets(np.r_[base, np.log(0.78)], groups + ["fp32"])
    assert abs(out["fp32"] - off["fp32"]) < 0.03 and abs(out["*"] - off["*"]) < 0.03


def test_calibrate_refuses_what_it_cannot_measure(monkeypatch):
    r = CliRunner().invoke(app, ["calibrate", "--device", "rpi3b", "--minutes", "1"])
    assert r.exit_code == 1 and r.output.startswith("Error: ")
    assert "not measured here" in r.output or "trained on this very CPU" in r.output
    r = CliRunner().invoke(app, ["calibrate", "--minutes", "0"])
    assert r.exit_code == 1 and r.output.startswith("Error: ")


def test_a_corrupt_calibration_is_one_clear_error(uncalibrated):
    from dlas_predict.paths import dlas_home

    path = dlas_home() / "adapted" / "local.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": "local", "recommend_map": {"device": "local",
                                                                     "bogus": 1}}))
    r = CliRunner().invoke(app, ["recommend", str(DEMO_NETWORK), "--top", "1"])
    assert r.exit_code == 1 and r.output.startswith("Error: adapted model")
    assert "unreadable" in r.output
    path.write_text("{not json")
    r = CliRunner().invoke(app, ["recommend", str(DEMO_NETWORK), "--top", "1"])
    assert r.exit_code == 1 and "unreadable" in r.output
    with pytest.raises(DlasError, match="unreadable"):
        from dlas_predict.crossdev.transfer import device_map

        device_map("local")


@pytest.mark.slow
def test_the_demo_calibrates_a_cpu_only_until_it_is_calibrated(uncalibrated):
    assert cal.needed("local")
    cal.run("local", 5.0, [str(DEMO_NETWORK)], Kernels(), Networks(), clock=Clock())
    assert not cal.needed("local")


def test_the_kernel_pool_holds_the_narrow_layers_of_channel_pruned_plans(tmp_path,
                                                                         monkeypatch):
    """Calibration's kernel pool holds each network's layers at the shapes its channel-
    pruned plans run (its zeroed filters removed), beside the dense ones; a network whose
    weights cannot be pruned keeps its dense layers alone."""
    from dlas_predict.compression.compress import cached_channel_removed
    from dlas_predict.recommend import active
    from dlas_predict.space.config import ConvSpec

    monkeypatch.setenv("DLAS_HOME", str(tmp_path))
    dense = active.pool_from_networks([str(DEMO_NETWORK)])
    pool = active.pool_from_networks([str(DEMO_NETWORK)], cal.CHANNEL_RATIOS)
    assert {k.key for k in dense.kernels} < {k.key for k in pool.kernels}
    removed = cached_channel_removed(str(DEMO_NETWORK), cal.CHANNEL_RATIOS)
    narrow = {spec.to_spec() for layers, _ in removed.values() for spec, _ in layers}
    wide = {k.conv for k in dense.kernels}
    assert narrow - wide and narrow - wide <= {k.conv for k in pool.kernels}
    smallest = min((ConvSpec.parse(k.conv) for k in pool.kernels), key=lambda c: c.macs)
    assert smallest.macs < min(ConvSpec.parse(c).macs for c in wide)
    assert {p[1] for p in pool.plans} >= {"dense", "channel_pruning@0.5",
                                          "channel_pruning@0.9"}
    # a network of no constant weights (a graph input) has nothing to prune: dense alone
    monkeypatch.setattr("dlas_predict.compression.compress.cached_channel_removed",
                        lambda *a: (_ for _ in ()).throw(DlasError("no weights")))
    assert {k.key for k in active.pool_from_networks([str(DEMO_NETWORK)],
                                                      cal.CHANNEL_RATIOS).kernels} == \
        {k.key for k in dense.kernels}


@pytest.mark.slow
def test_live_kernels_are_timed_here_and_kept_in_this_machines_corpus(tmp_path, monkeypatch):
    """A kernel calibrate times is a record of DLAS_HOME's corpus too, where the analysis
    and the report of local find this machine's measurements."""
    from dlas_predict.analysis import frames as A
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.recommend.active import PoolKernel
    from dlas_predict.paths import default_store_path
    from dlas_predict.space.devices import get_device

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    live = cal.LiveKernels(get_device("local"))
    try:
        ms, note = live(PoolKernel("C=8,H=8,W=8,K=16,R=3,S=3,pad=1", "gemm", "dense", 0.0))
    finally:
        live.close()
    assert ms > 0 and (note == "" or note.startswith("noisy"))
    with CorpusStore(default_store_path(), must_exist=True) as db:
        (row,) = db.current_rows()
    assert (row["device"], row["C"], row["K"], row["algorithm"]) == ("local", 8, 16, "gemm")
    assert row["median_s"] * 1e3 == pytest.approx(ms)
    corpus = A.open_corpus("local", None)
    assert (corpus.origin, corpus.this_machine) == ("measured here", True)


def test_shrunk_offsets_give_each_network_family_its_own_level():
    from dlas_predict.crossdev.offsets import offset_of, shrunk_offsets

    r = np.log([0.5, 0.5, 0.5, 0.5, 0.8, 0.8, 0.8])
    groups = ["fp32", "fp32", "int8", "int8", "fp32", "int8", "float16"]
    families = ["", "", "", "", "transformer", "transformer", "transformer"]
    off, loo = shrunk_offsets(r, groups, families=families)
    assert len(loo) == len(r)
    assert np.log(0.5) < off["*"] < off["transformer *"] < np.log(0.8) + 1e-9
    # a transformer's mode is moved toward the transformer's runs, not the conv ones
    assert off["transformer fp32"] > off["fp32"] + 0.1
    # lookups: the family's own mode, its common offset, then the conv networks'
    assert offset_of(off, ["fp32"], "transformer") == off["transformer fp32"]
    assert offset_of(off, ["channel_pruning"], "transformer") == off["transformer *"]
    assert offset_of(off, ["int8"], "recurrent") == off["int8"]
    assert offset_of(off, ["channel_pruning"], "") == off["*"]
    # no family given: as before, one level under the common offset
    plain, _ = shrunk_offsets(r, groups)
    assert set(plain) == {"*", "fp32", "int8", "float16"}


def test_an_onnxruntime_float16_run_without_an_offset_of_its_own_takes_fp32s():
    """onnxruntime's float16 run is its fp32 graph with float16 weights: where no float16
    run was calibrated, its offset is fp32's (the family's first), not the common one; a
    calibrated float16 offset, any other mode and our own float16 builds are unchanged.
    The calibration's rows price themselves the same way."""
    from dlas_predict.crossdev.offsets import onnxruntime_groups
    from dlas_predict.crossdev.transfer import DeviceMap

    off = {"*": 0.3, "fp32": -0.1, "int8": 0.5, "mlp *": 0.6, "mlp fp32": 0.7}
    m = DeviceMap("local", "ref", "adapted", 0.5, 0.5, -0.1, 0.1, onnxruntime_offsets=off)
    assert onnxruntime_groups("float16") == ["float16", "fp32"]
    assert onnxruntime_groups("int8") == ["int8"]
    assert m.onnxruntime_offset("float16") == -0.1
    assert m.onnxruntime_offset("float16", "mlp") == 0.7
    assert m.onnxruntime_offset("float16", "transformer") == -0.1
    assert m.onnxruntime_offset("channel_pruning") == 0.3
    assert m.onnxruntime_offset("int8", "mlp") == 0.6
    m.onnxruntime_offsets = {**off, "float16": 0.2}
    assert m.onnxruntime_offset("float16") == 0.2
    ort = cal.NetworkRow("n", "float16/onnxruntime", "onnxruntime", "float16", 2.0, 1.0)
    ours = cal.NetworkRow("n", "float16/gemm", "tvm", "float16", 2.0, 1.0)
    assert ort.calibrated_ms((1.0, 1.0), off) == pytest.approx(2.0 * math.exp(-0.1))
    assert ours.calibrated_ms((1.0, 1.0), off) == pytest.approx(2.0 * math.exp(0.3))


def test_calibration_goes_round_by_round_and_offsets_each_family(uncalibrated, tmp_path):
    """Every network's dense runs before any network's pruned ones; an MLP's runs give its
    family offsets of its own, which recommend applies to MLPs only."""
    from dlas_predict.networks import generate as gen
    from dlas_predict.recommend.search import recommend

    fc = gen.generate("fc", ["layers=2", "nodes=256"], tmp_path)[0].path

    class ByFamily(Networks):
        def __call__(self, model, network, cands):
            out = super().__call__(model, network, cands)
            return [(ms * (2.5 if network.startswith("fc") else 1.0), note)
                    for ms, note in out]

    nets = ByFamily()
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK), str(fc)], Kernels(), nets,
                  clock=Clock())
    first = [a.split("|")[0] for a in nets.asked[:4]]
    assert first == ["demo-cnn", "demo-cnn", fc.stem, fc.stem], nets.asked[:4]
    assert all("dense" in a for a in nets.asked[:4])
    assert {r.family for r in rep.network_rows} == {"", "mlp"}
    assert math.exp(rep.network_offsets["mlp *"] - rep.network_offsets["*"]) > 1.1
    assert math.exp(rep.onnxruntime_offsets["mlp *"] - rep.onnxruntime_offsets["*"]) > 1.1

    for path, family in ((DEMO_NETWORK, ""), (fc, "mlp")):
        rec = recommend(str(path), "local", top=0, tuning="untuned",
                        max_accuracy_drop=float("inf"))
        assert rec.family == family
        from dlas_predict.crossdev.transfer import device_map

        m = device_map("local")[0]
        # channel-pruned runs (an MLP's with its zeroed neurons removed) are a mode apart
        pruned = {c.ort_mode for c in rec.candidates if c.backend == "onnxruntime"
                  and c.compression.value == "channel_pruning"}
        assert pruned == {"channel_pruning"}, (family, pruned)
        for c in rec.candidates:
            off = (m.onnxruntime_offset(_mode(c), family) if c.backend == "onnxruntime"
                   else m.network_offset(c.compression.value, c.mixed, family))
            assert c.predicted_s == pytest.approx(c.basis_s * math.exp(off), rel=1e-9)


def _mode(c) -> str:
    """The mode an onnxruntime row was priced in, which its offset is read by."""
    assert c.ort_mode is not None
    return c.ort_mode


def test_onnxruntime_per_op_costs_and_the_rest_are_scaled_apart():
    """Runs whose per-op part is 0.7× the reference's and the rest 0.5× give those scales
    back; too few runs or networks leave both at 1 (the offsets alone)."""
    rows = []
    for i in range(12):
        pred, share = 1.0 + i, [0.05, 0.3, 0.6][i % 3]
        fixed = pred * share
        rows.append(cal.NetworkRow(f"net{i % 4}", "dense onnxruntime", "onnxruntime", "fp32",
                                   pred, 0.7 * fixed + 0.5 * (pred - fixed), "", fixed))
    a, b = cal.onnxruntime_scales(rows)
    assert a == pytest.approx(0.7, abs=0.02) and b == pytest.approx(0.5, abs=0.02)
    scales, off, loo = cal.onnxruntime_calibration(rows)
    assert scales == (a, b) and abs(off["*"]) < 0.02
    assert np.all(np.abs(loo) < 0.03)
    assert cal.onnxruntime_scales(rows[:4]) == (1.0, 1.0)              # too few runs
    assert cal.onnxruntime_scales([r for r in rows if r.network == "net0"] * 3) == (1.0, 1.0)


def test_roofs_are_measured_first_only_for_this_uncalibrated_cpu(uncalibrated, tmp_path,
                                                                 monkeypatch):
    """Not when switched off, not for a device of elsewhere or of public data only, and a
    file that cannot be read fails before anything is measured."""
    from conftest import assert_clean_error, run_cli

    def never(line):
        pytest.fail(f"measured: {line}")

    assert not cal.roofs_first("local", never)  # DLAS_MEASURE_ROOFS=0 (the tests' default)
    monkeypatch.setenv(cal.MEASURE_ROOFS_ENV, "1")
    assert not cal.roofs_first("xavier", never)  # a board: `devices --measure-peaks` there
    assert not cal.roofs_first("titanx_1", never)  # HELP's: no registry entry to measure
    r = run_cli("recommend", tmp_path / "nothere.onnx")
    assert_clean_error(r, "not found")
    assert "measuring the roofs" not in r.output


@pytest.mark.slow  # the roofs measured for real: about 15 s
def test_an_uncalibrated_cpu_s_roofs_are_measured_once_before_its_first_answer(uncalibrated,
                                                                              monkeypatch):
    from dlas_predict.space import devices as D

    # as on a CPU whose roofs were never measured (none shipped for its fingerprint)
    monkeypatch.setattr(D, "SHIPPED_PEAKS", "data/no_such_peaks.json")
    monkeypatch.setenv(cal.MEASURE_ROOFS_ENV, "1")
    assert D.get_device("local", with_target=False).source == "estimate"
    said: list[str] = []
    assert cal.roofs_first("local", said.append)
    assert said[0].startswith("measuring the roofs of local") and "(measured)" in said[-1]
    dev = D.get_device("local", with_target=False)
    assert dev.source == "measured" and dev.peak_gflops["float32"] > 0
    assert not cal.roofs_first("local", said.append)  # kept: once per CPU


@pytest.fixture
def same_cpu_id(monkeypatch, tmp_path):
    """``local``'s shipped model as if trained on a host of this very CPU id (its sidecar's
    fingerprint this machine's), with a DLAS_HOME of its own; the model's recorded roofs."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.space import devices as D

    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cal, "MAX_KERNELS", 24)
    fp = D.get_device("local", with_target=False).fingerprint
    shipped = transfer._layer_meta
    mine = D.model_dir("local")
    monkeypatch.setattr(transfer, "_layer_meta", lambda d: {**shipped(d),
                                                            "device_fingerprint": fp}
                        if d == mine else shipped(d))
    roofs = shipped(mine).get("device_roofs")
    if not roofs:
        pytest.skip("local's model records no roofs")
    return fp, roofs


def _roofs_here(fp: str, roofs: dict, factor: float) -> None:
    """This host's roofs as `devices --measure-peaks` keeps them: the model's × factor."""
    from dlas_predict.space import devices as D

    D.save_measured_peaks({
        "fingerprint": fp,
        "peak_gflops": {k: v * factor for k, v in roofs["peak_gflops"].items()},
        "mem_bandwidth_gbs": roofs["mem_bandwidth_gbs"] * factor})


def test_a_slower_host_of_the_models_cpu_id_is_told_and_can_be_calibrated(same_cpu_id):
    from dlas_predict.crossdev import transfer
    from dlas_predict.recommend.search import recommend

    fp, roofs = same_cpu_id
    assert transfer.own_model("local")
    assert transfer.roof_drift("local") is None  # this host's roofs not measured yet
    # ... nor measured by the demo's and recommend's check where switched off (the tests'
    # default); switched on, this host's roofs are measured once, then kept
    assert cal.host_drift("local", lambda line: pytest.fail(f"measured: {line}")) is None
    measured = []

    def measure(dev, say):
        measured.append(dev.name)
        _roofs_here(fp, roofs, 0.99)
        return dev

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cal, "_measure_roofs", measure)
        mp.setenv(cal.MEASURE_ROOFS_ENV, "1")
        assert cal.host_drift("local", print) is None  # within the noise: no drift
        assert cal.host_drift("local", print) is None and measured == ["local"]
    # measured within the noise of one host: nothing to calibrate, and calibrate says why
    _roofs_here(fp, roofs, 1.04)
    assert transfer.roof_drift("local") is None
    with pytest.raises(DlasError, match="roofs match"):
        cal.run("local", 5.0, [str(DEMO_NETWORK)], Kernels(), Networks(), clock=Clock())
    # a host at 80 % of the model's roofs: recommend answers from the model and says so
    _roofs_here(fp, roofs, 0.8)
    drift = transfer.roof_drift("local")
    assert drift and f"{roofs['peak_gflops']['float32'] * 0.8:.1f} GFLOP/s" in drift
    assert cal.host_drift("local", print) == drift  # the demo then calibrates first
    before = recommend(str(DEMO_NETWORK), "local", top=0, tuning="untuned")
    assert before.source == "trained"
    assert any(drift in n and "`dlas-predict calibrate`" in n for n in before.notes)
    # ... and calibrate measures it; the calibration then answers for this host
    said: list[str] = []
    rep = cal.run("local", 5.0, [str(DEMO_NETWORK)], Kernels(), Networks(), clock=Clock(),
                  log=said.append)
    assert rep.fingerprint == fp and rep.reference == "local"
    assert said[0].startswith(drift) and "calibrating this one" in said[0]
    assert not transfer.own_model("local") and transfer.calibrated_here("local", fp)
    assert cal.host_drift("local", print) is None and not cal.needed("local")
    after = recommend(str(DEMO_NETWORK), "local", top=0, tuning="untuned")
    assert after.source == "adapted"
    assert any("another host of this CPU id" in n for n in after.notes)
    assert not any(drift in n for n in after.notes)
    # onnxruntime's rows take this host's calibrated offsets, though its model is of the id
    ort = [c for c in after.candidates if c.backend == "onnxruntime"]
    assert ort and all(c.source == "adapted" and c.basis_s is not None for c in ort)
    # a calibration of another machine is not this host's
    assert not transfer.calibrated_here("local", "0123456789abcdef")
