"""Isolation: a kernel that crashes, hangs or raises becomes a recorded failure, and the run
goes on with a fresh worker."""
import pytest

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import get_device
from dlas_predict.measure.execution.runner import LocalRunner, MeasureTask
from dlas_predict.measure.execution.tasks import Protocol, plan_timing

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
    # 6 s per task (a fresh worker's start is not counted): the healthy kernel compiles,
    # verifies and is timed in about 2 s, with room for a loaded machine
    with LocalRunner(dev, protocol=proto, timeout_s=6) as runner:
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


def _children(pid: int, needle: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line holds ``needle``."""
    from pathlib import Path

    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and needle in cmd:
            out.append(int(proc.name))
    return out


@pytest.mark.slow
def test_a_worker_exits_when_its_collector_is_killed(tmp_path):
    """A collector killed (SIGKILL) while its worker runs a task does not leave the worker
    running: it notices its parent is gone and exits within seconds."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "collector.py"
    script.write_text(
        "from dlas_predict.space.config import ConvSpec, Variant\n"
        "from dlas_predict.space.devices import get_device\n"
        "from dlas_predict.measure.execution.runner import LocalRunner, MeasureTask\n"
        "from dlas_predict.measure.execution.tasks import Protocol\n"
        "dev = get_device('local')\n"
        f"task = MeasureTask.make(ConvSpec.parse('{SPEC.to_spec()}'), Variant('gemm', 'dense'),"
        " dev, fault='hang')\n"
        "proto = Protocol(max_repeats=2, min_repeats=1, time_budget_s=0.01, quiet_wait_s=0)\n"
        "with LocalRunner(dev, protocol=proto, timeout_s=300) as runner:\n"
        "    list(runner.run([task]))\n")
    parent = subprocess.Popen([sys.executable, str(script)],
                              env={**os.environ, "DLAS_FAULT_INJECTION": "1"})
    workers: list[int] = []
    try:
        deadline = time.time() + 90
        while not workers and time.time() < deadline:
            time.sleep(0.5)
            workers = _children(parent.pid, "dlas_predict.measure.execution.worker")
        assert workers, "the collector started no worker"
        time.sleep(10)  # the worker is past its handshake (TVM imported) and in the hang
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 15
        while time.time() < deadline and any(os.path.exists(f"/proc/{w}") and
                                             "Z" not in _state(w) for w in workers):
            time.sleep(0.2)
        assert not any(os.path.exists(f"/proc/{w}") and "Z" not in _state(w)
                       for w in workers), "the worker outlived its collector"
    finally:
        parent.kill()
        for w in workers:  # whatever the outcome, no worker is left behind
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
def test_tvm_loads_without_torch_and_torch_still_imports_after(tmp_path):
    """A worker's TVM loads without torch (TVM's FFI layer imports it when installed); torch
    imports as usual afterwards, and the worker's TVM helper processes cannot import it."""
    import os

    from conftest import run_python

    from dlas_predict.measure import hide_torch_from_children

    proc = run_python("import sys",
                      "from dlas_predict.measure import import_tvm",
                      "tvm = import_tvm()",
                      "assert 'torch' not in sys.modules, 'TVM imported torch'",
                      "assert tvm.cpu(0).exist",
                      "import torch",
                      "print(int(torch.ones(2).sum()))")
    assert proc.returncode == 0 and proc.stdout.split() == ["2"], proc.stderr[-2000:]
    env = {**os.environ, **hide_torch_from_children(tmp_path / "shim")}
    child = run_python("import torch", env=env, timeout=60)
    assert child.returncode != 0 and "torch is hidden" in child.stderr
