"""onnxruntime as a backend of the grid: timed in the isolated worker like our builds,
checked against the float32 outputs, unsupported devices and bad models recorded."""
import json
from dataclasses import replace

import pytest

from conftest import DEMO, assert_clean_error, run_cli
from dlas_predict.corpus.collect import collect_networks
from dlas_predict.measure.networks.plans import ONNXRUNTIME, onnxruntime_mode, onnxruntime_plan
from dlas_predict.corpus.store import CorpusStore
from dlas_predict.measure.networks.runner import NetworkRunner, onnxruntime_unsupported
from dlas_predict.measure.execution.tasks import OrtTask, Protocol, from_wire, to_wire
from dlas_predict.space.config import Compression
from dlas_predict.space.devices import get_device, profile_names

FAST = Protocol(max_repeats=3, min_repeats=2, min_repeat_ms=0.1, time_budget_s=0.05,
                quiet_wait_s=0)


@pytest.fixture(scope="module")
def runner():
    with NetworkRunner(get_device("local"), protocol=FAST, timeout_s=300) as r:
        yield r


def test_each_mode_runs_verifies_and_records_what_it_ran(runner):
    recs = {c: runner.measure(onnxruntime_plan(str(DEMO), "demo", c, None))
            for c in ("dense", "float16", "int8")}
    for comp, rec in recs.items():
        assert rec.error is None, rec.error
        assert rec.algorithm == ONNXRUNTIME and rec.plan == "[]"
        assert rec.verified and rec.top1_agreement == 1.0
        assert rec.best_s > 0 and len(rec.run_secs) >= 2
        assert rec.details["backend"] == "onnxruntime"
        assert rec.details["mode"] == onnxruntime_mode(comp)
        assert rec.details["threads"] == get_device("local").cores
    assert recs["dense"].max_error < 1e-4  # the same float32 model as the reference
    # int8 on a network with no trained weights says what it calibrated on
    assert "generated inputs" in recs["int8"].details["calibration"]
    assert recs["int8"].max_error > recs["dense"].max_error


def test_channel_pruning_runs_the_model_with_its_zeroed_filters_removed(runner):
    rec = runner.measure(onnxruntime_plan(str(DEMO), "demo", "channel_pruning", 0.5))
    assert rec.error is None and rec.verified
    assert "physically removed" in " ".join(rec.details["prepared"])
    pruned = json.loads(rec.summary)
    dense = json.loads(runner.measure(onnxruntime_plan(str(DEMO), "demo", "dense",
                                                       None)).summary)
    assert pruned["conv_io_bytes"] < dense["conv_io_bytes"]


def test_a_model_that_cannot_be_prepared_is_a_recorded_failure(runner, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    rec = runner.measure(onnxruntime_plan(str(bad), "bad", "dense", None))
    assert rec.error and rec.error.startswith("prepare:") and rec.run_secs == []


def test_where_onnxruntime_cannot_run_as_the_device_it_says_why():
    local = get_device("local")
    assert onnxruntime_unsupported(local) is None
    assert "over TVM RPC" in onnxruntime_unsupported(local, rpc=object())
    assert "this machine only" in onnxruntime_unsupported(get_device("rpi3b",
                                                                     with_target=False))
    limited = [n for n in profile_names() if "-native-" not in n]
    if limited:
        why = onnxruntime_unsupported(get_device(limited[0]))
        assert why and "instruction set" in why
    native = [n for n in profile_names() if "-native-" in n]
    if native:
        assert onnxruntime_unsupported(get_device(native[0])) is None


def test_an_unsupported_device_is_recorded_not_run(tmp_path):
    limited = [n for n in profile_names() if "-native-" not in n]
    if not limited:
        pytest.skip("this machine has no ISA-limited profile")
    dev = get_device(limited[0])
    with NetworkRunner(dev, protocol=FAST) as nr:
        rec = nr.measure(onnxruntime_plan(str(DEMO), "demo", "dense", None))
    assert rec.error.startswith("unsupported:") and "instruction set" in rec.error


def test_no_onnxruntime_session_lives_while_the_probes_read_the_machine(
        tmp_path, monkeypatch):
    """The contention probes run right before and after the timing: onnxruntime's pool
    threads, spinning after the output check's runs or parked, must not be what they read:
    no session lives while they probe."""
    import os
    import time

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from dlas_predict.measure.execution import contention
    from dlas_predict.measure.networks.ortrun import run_ort_task

    w = np.random.default_rng(0).random((768, 768), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 768])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).random((4, 1, 768), dtype=np.float32)
    np.savez(tmp_path / "check.npz", x=x, y=x @ w)
    busy, threads = [], []
    tasks = "/proc/self/task"  # this process's threads, onnxruntime's pool's among them

    def probed(run, *args, **kwargs):  # what the probes around the timing would see
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(0.1)
        busy.append((time.process_time() - c0) / (time.perf_counter() - t0))
        threads.append(len(os.listdir(tasks)))
        secs = run()
        threads.append(len(os.listdir(tasks)))
        return {"run_secs": secs}

    monkeypatch.setattr(contention, "timed_fields", probed)
    task = OrtTask(onnx=str(tmp_path / "m.onnx"), input_name="x", mode="fp32",
                   check=str(tmp_path / "check.npz"), threads=2, target={"kind": "llvm"},
                   protocol=FAST)
    before = len(os.listdir(tasks))
    out = run_ort_task(task)
    assert out["verified"] and out["run_secs"]
    assert busy[0] < 0.1, f"onnxruntime's threads used {busy[0]:.2f} cores while probed"
    assert threads == [before, before], "an onnxruntime session lived while probed"


def test_the_task_crosses_the_pipe_unchanged():
    task = OrtTask(onnx="/m.onnx", input_name="x", mode="int8", check="/c.npz", threads=2,
                   target={"kind": "llvm"}, calibration="/cal.npz",
                   calibration_source="digits images", protocol=FAST, fingerprint="f")
    assert from_wire(json.loads(json.dumps(to_wire(task)))) == task


def test_collected_records_survive_the_store_and_a_resume(runner, tmp_path):
    dev = get_device("local")
    plans = [onnxruntime_plan(str(DEMO), "demo", c, None) for c in ("dense", "int8")]
    with CorpusStore(tmp_path / "s.sqlite") as db:
        first = collect_networks(plans, db, runner, dev)
        again = collect_networks(plans, db, runner, dev)
        stored = db.network_records("algorithm = ?", (ONNXRUNTIME,))
    assert len(first.records) == 2 and again.records == []
    assert {r.config for r in stored} == {"dense", "int8"}
    back = {r.config: r for r in stored}
    mine = {r.config: r for r in first.records}
    for c in back:
        assert back[c].details == mine[c].details and back[c].run_secs == mine[c].run_secs


def test_modes_of_compressions():
    assert onnxruntime_mode(Compression.DENSE) == "fp32"
    assert onnxruntime_mode("channel_pruning@0.9") == "fp32"
    assert onnxruntime_mode("weight_pruning") == "fp32"
    assert onnxruntime_mode(Compression.INT8) == "int8"
    assert onnxruntime_mode("float16") == "float16"
    plan = onnxruntime_plan("m.onnx", "m", "int8", None)
    assert plan.backend == "onnxruntime" and plan.layers == ()
    dense = onnxruntime_plan("m.onnx", "m", "dense", None)
    assert plan.key(get_device("local")) != dense.key(get_device("local"))
    assert replace(dense, algorithm="direct").backend == "tvm"


@pytest.mark.slow  # a real collection: onnxruntime timed with the full protocol
def test_collect_times_onnxruntime_alone_and_refuses_what_it_cannot(tmp_path):
    store = tmp_path / "s.sqlite"
    fast = ["--max-repeats", "3", "--time-budget", "0.05", "--quiet-wait", "0", "-q"]
    res = run_cli("collect", "--network", DEMO, "--store", store, "--whole-network",
                  "--backends", "onnxruntime", *fast)
    assert res.exit_code == 0, res.output
    with CorpusStore(store) as db:
        recs = db.network_records()
        assert next(db.rows(), None) is None  # no kernel measured
    assert len(recs) == 5 and {r.algorithm for r in recs} == {ONNXRUNTIME}
    assert all(r.error is None and r.verified for r in recs)
    # the onnxruntime model needs more networks than one: a clean error, not a traceback
    assert_clean_error(run_cli("train", "--store", store, "--out", tmp_path / "m"),
                       "at least 5 networks")
    assert_clean_error(run_cli("collect", "--network", DEMO, "--store", store,
                               "--backends", "cuda"), "unknown backend")
    assert_clean_error(run_cli("collect", "--network", DEMO, "--store", store,
                               "--backends", "onnxruntime"), "--whole-network")
    limited = [n for n in profile_names() if "-native-" not in n]
    if limited:
        assert_clean_error(run_cli("collect", "--network", DEMO, "--store", store,
                                   "--device", limited[0], "--whole-network",
                                   "--backends", "onnxruntime"), "instruction set")
