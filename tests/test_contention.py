"""The contention probe: waiting for a quiet machine, timing again when a neighbour came,
giving up on a machine that stays busy; and the real probe against a pinned busy process."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from measure import contention
from measure.contention import GIVE_UP, ContentionProbe, timed
from measure.worker import Protocol


class ScriptedProbe(ContentionProbe):
    """A probe whose ratios are given in advance (no TVM)."""

    def __init__(self, ratios):
        self.ratios, self.calls, self.timeouts = list(ratios), 0, 0

    def ratio(self):
        self.calls += 1
        return self.ratios.pop(0) if len(self.ratios) > 1 else self.ratios[0]


PROTO = Protocol(quiet_wait_s=0.05, contention_limit=1.25)


def test_quiet_machine_times_once_and_records_the_ratio():
    t = timed(lambda: [1.0, 2.0], ScriptedProbe([1.02, 1.05]), PROTO)
    assert t.runs == [1.0, 2.0] and t.attempts == 1 and t.contention == 1.05


def test_waits_for_the_neighbour_to_leave_before_timing(monkeypatch):
    monkeypatch.setattr(contention.time, "sleep", lambda s: None)
    probe = ScriptedProbe([2.0, 2.0, 1.0, 1.0])
    t = timed(lambda: [1.0], probe, Protocol(quiet_wait_s=60, contention_limit=1.25))
    assert probe.calls == 4 and t.attempts == 1 and t.contention == 1.0


def test_a_neighbour_during_the_timing_means_a_second_timing_and_all_runs_kept():
    batches = iter([[2.0, 2.1], [1.0, 1.1]])
    t = timed(lambda: next(batches), ScriptedProbe([1.0, 2.0, 1.0, 1.0]), PROTO)
    assert t.attempts == 2 and t.runs == [2.0, 2.1, 1.0, 1.1] and t.contention == 1.0


def test_a_machine_busy_for_good_is_recorded_and_no_longer_waited_for():
    probe = ScriptedProbe([2.0])
    for _ in range(GIVE_UP):
        t = timed(lambda: [1.0], probe, PROTO)
        assert t.contention == 2.0 and t.attempts == 2
    assert probe.timeouts >= GIVE_UP
    t = timed(lambda: [1.0], probe, Protocol(quiet_wait_s=3600, contention_limit=1.25))
    assert t.waited_s < 1.0 and t.contention == 2.0   # no hour-long wait


def test_without_a_probe_the_runs_pass_through():
    t = timed(lambda: [3.0], None, PROTO)
    assert t.runs == [3.0] and t.contention is None and t.attempts == 1


_PROBE_SCRIPT = """
import os, sys
os.sched_setaffinity(0, {0, 1})
from measure.contention import ContentionProbe
probe = ContentionProbe({"kind": "llvm"}, 2)
print(max(probe.ratio() for _ in range(5)))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to pin to")
def test_the_probe_sees_a_busy_process_on_one_of_its_cores():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    # the busy process may run on either of the probe's two CPUs (pinned to one, it starves
    # TVM's pool thread bound there for whole scheduler slices)
    hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {%d, %d})"
                            "\nwhile True: pass" % tuple(cpus)])
    try:
        env = {**os.environ, "TVM_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
        script = _PROBE_SCRIPT.replace("{0, 1}", "{%d, %d}" % tuple(cpus))
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
    finally:
        hog.kill()
        hog.wait()
    assert out.returncode == 0, out.stderr[-2000:]
    ratio = float(out.stdout.strip().splitlines()[-1])
    # alone: ~1.0; one of the two cores taken by the busy process: 2 or more
    assert ratio > 1.4, ratio


def test_the_probe_of_a_real_worker_is_reported_with_each_kernel():
    """A kernel measured by the isolated worker carries the probe's ratio (2 threads or
    more) or None (one thread: nothing to contend)."""
    from dlas_predict.config import ConvSpec, Variant
    from dlas_predict.devices import get_device
    from measure.runner import LocalRunner, MeasureTask

    dev = get_device("local")
    task = MeasureTask.make(ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1"),
                            Variant("direct", "dense"), dev)
    proto = Protocol(max_repeats=3, min_repeats=2, time_budget_s=0.01, quiet_wait_s=0)
    with LocalRunner(dev, protocol=proto) as runner:
        (result,) = runner.run([task])
    assert result.ok
    if (result.threads or 1) >= 2:
        assert result.contention is not None and 0.5 < result.contention < 50
    else:
        assert result.contention is None
