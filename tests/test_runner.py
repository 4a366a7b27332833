"""Isolation: a kernel that crashes, hangs or raises becomes a recorded failure, and the run
goes on with a fresh worker."""
import pytest

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import get_device
from dlas_predict.measure.runner import LocalRunner, MeasureTask
from dlas_predict.measure.tasks import Protocol, plan_timing

SPEC = ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1")


def test_plan_timing_follows_protocol():
    proto = Protocol(max_repeats=150, min_repeats=10, min_repeat_ms=1.0, time_budget_s=3.0)
    assert plan_timing(1e-5, proto) == (100, 150)       # fast: 100 calls per run, 150 runs
    assert plan_timing(0.1, proto) == (1, 30)           # slow: budget limits the runs
    assert plan_timing(5.0, proto) == (1, 10)           # very slow: still the minimum


@pytest.mark.slow
def test_crash_hang_and_exception_are_recorded_and_run_goes_on(monkeypatch):
    monkeypatch.setenv("DLAS_FAULT_INJECTION", "1")
    dev = get_device("local")
    v = Variant("direct", "dense")
    tasks = [MeasureTask.make(SPEC, v, dev, fault="segfault"),
             MeasureTask.make(SPEC, Variant("gemm", "dense"), dev, fault="hang"),
             MeasureTask.make(SPEC, Variant("gemm", "int8"), dev, fault="raise"),
             MeasureTask.make(SPEC, Variant("spatial_pack", "dense"), dev, fault="exit"),
             MeasureTask.make(SPEC, Variant("gemm", "weight_pruning", 0.5), dev)]
    proto = Protocol(max_repeats=5, min_repeats=2, time_budget_s=0.05, quiet_wait_s=0)
    # 10 s per task (a fresh worker's start is not counted): the healthy kernel compiles,
    # verifies and is timed in about 2 s, with room for a loaded machine
    with LocalRunner(dev, protocol=proto, timeout_s=10) as runner:
        results = list(runner.run(tasks))
    assert [r.ok for r in results] == [False, False, False, False, True]
    assert "SIGSEGV" in results[0].error
    assert "timeout" in results[1].error
    assert "injected failure" in results[2].error
    assert "exited with status 3" in results[3].error
    last = results[4]
    assert last.verified and last.median_s > 0 and last.threads == dev.cores
    assert last.tvm_version.startswith("0.27")
    assert all(r.run_secs == [] for r in results[:4])


@pytest.mark.slow
def test_faults_are_ignored_without_the_test_switch(monkeypatch):
    monkeypatch.delenv("DLAS_FAULT_INJECTION", raising=False)
    dev = get_device("local")
    task = MeasureTask.make(SPEC, Variant("direct", "dense"), dev, fault="segfault")
    with LocalRunner(dev, protocol=Protocol(max_repeats=3, min_repeats=1, time_budget_s=0.01,
                                            quiet_wait_s=0)) as runner:
        (result,) = runner.run([task])
    assert result.ok and result.verified
