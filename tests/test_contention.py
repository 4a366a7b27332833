"""The contention probe: waiting for a quiet machine, timing again when a neighbour came,
giving up on a machine that stays busy; the canary's slowdown against its fastest time;
and the real probes against a pinned busy process."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from dlas_predict.measure.execution import contention
from dlas_predict.measure.execution.contention import GIVE_UP, ContentionProbe, Reading, timed
from dlas_predict.measure.execution.tasks import Protocol


class ScriptedProbe(ContentionProbe):
    """A probe whose chain ratios (and canary slowdowns) are given in advance (no TVM)."""

    def __init__(self, ratios, slowdowns=None):
        self.ratios, self.calls = list(ratios), 0
        self.slowdowns = None if slowdowns is None else list(slowdowns)
        self.reset_waiting()

    def reading(self):
        self.calls += 1
        r = self.ratios.pop(0) if len(self.ratios) > 1 else self.ratios[0]
        if self.slowdowns is None:
            return Reading(r, None)
        s = self.slowdowns.pop(0) if len(self.slowdowns) > 1 else self.slowdowns[0]
        return Reading(r, s)


PROTO = Protocol(quiet_wait_s=0.05, contention_limit=1.25, slowdown_limit=1.05)


def test_quiet_machine_times_once_and_records_the_ratio():
    t = timed(lambda: [1.0, 2.0], ScriptedProbe([1.02, 1.05]), PROTO)
    assert t.runs == [1.0, 2.0] and t.attempts == 1 and t.contention == 1.05


def test_waits_for_the_neighbour_to_leave_before_timing(monkeypatch):
    monkeypatch.setattr(contention.time, "sleep", lambda s: None)
    probe = ScriptedProbe([2.0, 2.0, 1.0, 1.0])
    t = timed(lambda: [1.0], probe, Protocol(quiet_wait_s=60, contention_limit=1.25))
    assert probe.calls == 4 and t.attempts == 1 and t.contention == 1.0


def test_a_slow_canary_on_a_machine_the_chain_finds_quiet_is_waited_out(monkeypatch):
    """The host's slow spells: the chain reads 1.0, the canary 1.44× its fastest."""
    monkeypatch.setattr(contention.time, "sleep", lambda s: None)
    probe = ScriptedProbe([1.0], [1.44, 1.44, 1.01, 1.02])
    t = timed(lambda: [1.0], probe, Protocol(quiet_wait_s=60, slowdown_limit=1.05))
    assert probe.calls == 4 and t.attempts == 1
    assert t.contention == 1.0 and t.slowdown == 1.02


def test_a_canary_that_slowed_during_the_timing_means_a_second_timing():
    batches = iter([[1.4], [1.0]])
    t = timed(lambda: next(batches), ScriptedProbe([1.0], [1.0, 1.44, 1.0, 1.01]), PROTO)
    assert t.attempts == 2 and t.runs == [1.4, 1.0] and t.slowdown == 1.01


def test_a_neighbour_during_the_timing_means_a_second_timing_and_all_runs_kept():
    batches = iter([[2.0, 2.1], [1.0, 1.1]])
    t = timed(lambda: next(batches), ScriptedProbe([1.0, 2.0, 1.0, 1.0]), PROTO)
    assert t.attempts == 2 and t.runs == [2.0, 2.1, 1.0, 1.1] and t.contention == 1.0


def test_a_machine_busy_for_good_is_recorded_and_no_longer_waited_for():
    probe = ScriptedProbe([2.0])
    for _ in range(GIVE_UP):
        t = timed(lambda: [1.0], probe, PROTO)
        assert t.contention == 2.0 and t.attempts == 2
    assert probe.given_up
    t = timed(lambda: [1.0], probe, Protocol(quiet_wait_s=3600, contention_limit=1.25))
    assert t.waited_s < 1.0 and t.contention == 2.0   # no hour-long wait


def test_slow_spells_that_come_and_go_are_given_up_on_then_waited_for_again(monkeypatch):
    """A host slow on every other record: each slow record's wait times out, and a quiet
    reading between them does not start the count again; GIVE_UP quiet readings in a row
    make the probe wait again."""
    monkeypatch.setattr(contention.time, "sleep", lambda s: None)
    proto = Protocol(quiet_wait_s=0.02, contention_limit=1.25)
    probe = ScriptedProbe([2.0])
    waits = []
    for i in range(2 * GIVE_UP):
        probe.ratios = [2.0] if i % 2 == 0 else [1.0]
        waits.append(probe.wait_for_quiet(proto)[1])
    assert probe.given_up
    assert all(w >= 0.02 for w in waits[:2 * GIVE_UP - 1:2])  # the slow ones waited out
    probe.ratios = [2.0]
    assert probe.wait_for_quiet(proto)[1] < 0.02             # given up: no wait
    probe.ratios = [1.0]
    for _ in range(GIVE_UP):
        probe.wait_for_quiet(proto)
    assert not probe.given_up                                 # quiet again for a while
    probe.ratios = [2.0]
    assert probe.wait_for_quiet(proto)[1] >= 0.02             # so it waits again


def test_without_a_probe_the_runs_pass_through():
    t = timed(lambda: [3.0], None, PROTO)
    assert t.runs == [3.0] and t.contention is None and t.slowdown is None
    assert t.attempts == 1


def _scripted_canary(times, reference):
    """A canary whose readings are given in advance (no TVM)."""
    from dlas_predict.measure.execution.contention import Canary

    class Scripted(Canary):
        def __init__(self, times, reference):
            self.times, self.reference = list(times), reference
            self.best = contention._read_best(reference)
            self.recent, self._readings = contention._read_recent(reference), 0

        def seconds(self):
            return self.times.pop(0)

    return Scripted(times, reference)


def test_the_canary_keeps_the_fastest_time_and_reads_slowdowns_against_it(tmp_path):
    Scripted = _scripted_canary
    ref = tmp_path / "probe" / "canary.json"
    c = Scripted([2.0, 1.0, 1.5], ref)
    assert c.slowdown() == 1.0 and c.best == 2.0          # first reading: its own reference
    assert c.slowdown() == 1.0 and c.best == 1.0          # a faster one replaces it ...
    assert c.slowdown() == 1.5 and c.best == 1.0          # ... a slower one reads against it
    assert contention._read_best(ref) == 1.0
    # another worker of the machine starts from the kept reference
    assert Scripted([1.3], ref).slowdown() == 1.3
    # a reference another worker lowered in the meantime is taken when writing
    other = Scripted([0.9], ref)
    contention._write_best(ref, 0.8)
    assert other.slowdown() == 0.9 / 0.8 and contention._read_best(ref) == 0.8
    # an unreadable reference is no reference; an unwritable one stays in memory
    ref.write_text("not json")
    assert Scripted([1.0], ref).best is None
    blocked = tmp_path / "file"
    blocked.write_text("")
    c = Scripted([1.0, 2.0], blocked / "canary.json")
    assert c.slowdown() == 1.0 and c.slowdown() == 2.0


def test_a_canary_whose_quiet_readings_spread_reads_against_their_median(tmp_path):
    """Quiet readings between 1.00 and 1.12 (a host's own spread) read at most 1.12 against
    their median, not up to 1.12 against the one fastest; a lasting slow spell of
    1.5× still reads slow, the usual time being capped at 1.15× the fastest (and a spell
    leaving the readings' spread alone)."""
    Scripted = _scripted_canary
    ref = tmp_path / "canary.json"
    quiet = [1.0, 1.08, 1.1, 1.06, 1.12, 1.09, 1.07, 1.11, 1.1, 1.08] * 2
    c = Scripted(quiet, ref)
    readings = [c.slowdown() for _ in quiet]
    assert max(readings[12:]) < 1.05          # the spread is this machine's own
    assert max(r for r in readings[:8]) > 1.05  # before it is known, against the fastest
    # a new worker reads the kept readings, and a slow spell still reads slow
    slow = Scripted([1.5] * 70, ref)
    assert slow.slowdown() > 1.25
    assert all(slow.slowdown() > 1.2 for _ in range(69))


def test_a_host_whose_quiet_canary_jumps_reading_to_reading_is_allowed_its_own_noise(tmp_path):
    """A host whose canary, with nothing else running, reads anywhere between 1× and 2.4×
    its fastest, one reading to the next (as a 2-core Zen 3 did): most readings are quiet
    once its spread is known, where against its usual time alone most were busy. A host
    that is slow in spells (quiet, then 1.5× for a while, then quiet) is allowed nothing:
    its spells still read slow."""
    Scripted = _scripted_canary
    rng = np.random.default_rng(0)
    jumpy = list(1.0 + 1.4 * rng.random(200))
    c = Scripted(jumpy, tmp_path / "jumpy.json")
    readings = [c.slowdown() for _ in jumpy]
    assert 1.4 < c.spread() <= contention.SPREAD_ALLOWANCE_MAX
    assert np.mean(np.array(readings[64:]) > 1.05) < 0.35
    assert np.mean(np.array(jumpy[64:]) / c.usual() > 1.05) > 0.6
    spells = [1.0 + 0.01 * (i % 3) for i in range(40)] + [1.5] * 10 + [1.01] * 20 + [1.5] * 8
    c = Scripted(spells, tmp_path / "spells.json")
    readings = [c.slowdown() for _ in spells]
    assert c.spread() < 1.05
    assert all(r > 1.25 for r in readings[40:50] + readings[70:])
    assert all(r <= 1.05 for r in readings[50:70])


_PROBE_SCRIPT = """
import os, sys
os.sched_setaffinity(0, {0, 1})
from dlas_predict.measure.execution.contention import Canary, ContentionProbe
probe = ContentionProbe({"kind": "llvm"}, 2, canary=Canary({"kind": "llvm"}, None))
probe.canary.slowdown()            # its reference: a quiet moment (the busy process starts
print("ready", flush=True)         # after this line)
sys.stdin.readline()
readings = [probe.reading() for _ in range(5)]
print(max(r.ratio for r in readings), max(r.slowdown for r in readings))
"""


@pytest.mark.slow
@pytest.mark.quiet
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to pin to")
def test_the_probes_see_a_busy_process_on_one_of_their_cores():
    """The chain ratio and the canary (its reference taken on the quiet machine first) both
    see a busy process on one of the two cores."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    env = {**os.environ, "TVM_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    script = _PROBE_SCRIPT.replace("{0, 1}", "{%d, %d}" % tuple(cpus))
    probe = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    hog = None
    try:
        assert probe.stdout.readline().strip() == "ready", probe.stderr.read()[-2000:]
        # the busy process may run on either of the probe's two CPUs (pinned to one, it
        # starves TVM's pool thread bound there for whole scheduler slices)
        hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, "
                                "{%d, %d})\nwhile True: pass" % tuple(cpus)])
        out, err = probe.communicate("go\n", timeout=120)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        probe.kill()
    assert probe.returncode == 0, err[-2000:]
    ratio, slowdown = map(float, out.strip().splitlines()[-1].split())
    # alone: ~1.0; one of the two cores taken by the busy process: the chain 2 or more. The
    # canary keeps the fastest of its repeats, and a repeat that falls in a slice where the busy
    # process is off the CPU runs at full speed, so it can read well under 2. Timing waits at
    # 1.05, so 1.2 still shows it flags the busy process with a wide margin.
    assert ratio > 1.4, ratio
    assert slowdown > 1.2 > Protocol().slowdown_limit, slowdown


@pytest.mark.slow
def test_the_probe_of_a_real_worker_is_reported_with_each_kernel():
    """A kernel measured by the isolated worker carries the probe's ratio (2 threads or
    more) or None (one thread: nothing to contend)."""
    from dlas_predict.space.config import ConvSpec, Variant
    from dlas_predict.space.devices import get_device
    from dlas_predict.measure.execution.runner import LocalRunner, MeasureTask

    dev = get_device("local")
    task = MeasureTask.make(ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1"),
                            Variant("direct", "dense"), dev)
    proto = Protocol(max_repeats=3, min_repeats=2, time_budget_s=0.01, quiet_wait_s=0)
    with LocalRunner(dev, protocol=proto) as runner:
        (result,) = runner.run([task])
    assert result.ok
    if (result.threads or 1) >= 2:
        assert result.contention is not None and 0.5 < result.contention < 50
        assert result.slowdown is not None and 0.5 < result.slowdown < 50
        # the canary's reference is kept for the machine under DLAS_HOME/probe
        from dlas_predict.paths import dlas_home
        from dlas_predict.measure.execution.contention import _read_best
        (ref,) = (dlas_home() / "probe").glob(
            f"canary-{dev.fingerprint}-*t-{dev.simd_bits or 512}b.json")
        assert _read_best(ref) > 0
    else:
        assert result.contention is None and result.slowdown is None


# ---- collect --retime-slow ------------------------------------------------------------------
class _ScriptedRunner:
    """Yields, for each task, a record with the next scripted (contention, slowdown, seconds)
    of its algorithm; counts what it was asked to time."""

    protocol = Protocol(quiet_wait_s=0)

    def __init__(self, script):
        self.script, self.timed = script, []

    def run(self, todo):
        import time

        from dlas_predict.measure.records import MeasureResult

        for t in todo:
            self.timed.append(t.variant.algorithm.value)
            c, s, sec = self.script[t.variant.algorithm.value].pop(0)
            yield MeasureResult(key=t.key, device="local", fingerprint="f", conv=t.spec,
                                variant=t.variant, knobs=t.knobs, run_secs=[sec],
                                verified=True, max_error=0.0, timestamp=time.time(),
                                contention=c, slowdown=s)


def test_retime_slow_times_slow_records_again_and_keeps_the_quieter(tmp_path):
    from dlas_predict.space.config import ConvSpec, Variant
    from dlas_predict.space.devices import get_device
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.corpus.collect import collect_kernels as collect
    from dlas_predict.measure.execution.runner import MeasureTask

    spec = ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1")
    tasks = [MeasureTask.make(spec, Variant(a, "dense"), get_device("local"))
             for a in ("direct", "gemm", "spatial_pack")]
    runner = _ScriptedRunner({
        # quiet; slow canary then quiet; busy core then busy again (worse)
        "direct": [(1.0, 1.0, 1e-3)], "gemm": [(1.0, 1.6, 3e-3), (1.0, 1.01, 2e-3)],
        "spatial_pack": [(1.6, 1.0, 5e-3), (1.9, 1.0, 6e-3)]})
    with CorpusStore(tmp_path / "c.sqlite") as db:
        lines = []  # not a terminal: one log line per kernel instead of a bar
        first = collect(tasks, db, runner, log=lines.append)
        assert (first.measured, first.contended) == (3, 2)
        assert [line.split()[:2] for line in lines] == [["measuring", f"[{i}/3]"]
                                                        for i in (1, 2, 3)]
        assert "C=8,H=10,W=10,K=16" in lines[0] and lines[0].endswith("direct/dense 1.000 ms")
        assert set(db.slow_keys(runner.protocol)) == {tasks[1].key, tasks[2].key}
        again = collect(tasks, db, runner, progress=False)  # plain resume: nothing to do
        assert again.measured == 0 and again.skipped == 3
        retime = collect(tasks, db, runner, progress=False, retime_slow=True)
        assert runner.timed[3:] == ["gemm", "spatial_pack"]
        assert (retime.measured, retime.retimed, retime.kept, retime.contended) == (2, 1, 1, 1)
        best = {r.variant.algorithm.value: (r.best_s, r.slowdown, r.contention)
                for r in db.results()}
        assert best["gemm"] == (2e-3, 1.01, 1.0)  # replaced by the quieter timing
        assert best["spatial_pack"] == (5e-3, 1.0, 1.6)  # the stored timing was quieter
        assert db.stats().records == 3
        assert set(db.slow_keys(runner.protocol)) == {tasks[2].key}


class _ScriptedNetworkRunner:
    """A whole-network runner with the batch interface: each plan is "timed" with the next
    (contention, slowdown, seconds) of ``script``."""

    protocol = Protocol(quiet_wait_s=0)

    def __init__(self, script, dev):
        self.script, self.dev = script, dev

    def run(self, plans):
        from dlas_predict.measure.networks.plans import NetworkMeasurement

        for p in plans:
            c, s, sec = self.script.pop(0)
            yield NetworkMeasurement(key=p.key(self.dev), device=self.dev.name,
                                     fingerprint=self.dev.fingerprint, network=p.network,
                                     config=p.config, algorithm=p.algorithm,
                                     plan=p.plan_json(), dtype=p.dtype.value, run_secs=[sec],
                                     contention=c, slowdown=s)


def test_retime_slow_for_whole_networks_replaces_only_by_a_quieter_timing(tmp_path):
    from dlas_predict.space.devices import get_device
    from dlas_predict.corpus.collect import collect_networks
    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.corpus.store import CorpusStore

    dev = get_device("local")
    plan = uniform_plan("zoo:resnet18-cifar", "resnet18-cifar", "dense", None, "direct", 21)
    # slow; timed again slower (kept); timed again quiet (replaces)
    script = [(1.0, 1.5, 9e-3), (1.0, 1.6, 9.5e-3), (1.0, 1.02, 7e-3)]
    nr = _ScriptedNetworkRunner(script, dev)
    with CorpusStore(tmp_path / "c.sqlite") as db:
        run = (lambda **kw: collect_networks([plan], db, nr, dev, **kw))
        assert len(run().records) == 1 and run().records == []  # stored, then skipped
        out = run(retime_slow=True)
        assert out.records == [] and out.kept == 1
        assert [r["slowdown"] for r in db.network_measurements()] == [1.5]
        out = run(retime_slow=True)
        (rec,) = out.records
        assert (out.retimed, out.kept) == (1, 0) and rec.slowdown == 1.02
        assert [(r["slowdown"], json.loads(r["run_secs"])) for r in
                db.network_measurements()] == [(1.02, [7e-3])]
        assert run(retime_slow=True).records == [] and script == []  # quiet: not timed


def test_retime_unprobed_times_records_without_probes_and_replaces_only_by_a_quiet_one(
        tmp_path):
    from dlas_predict.space.config import ConvSpec, Variant
    from dlas_predict.space.devices import get_device
    from dlas_predict.corpus.collect import collect_networks
    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.corpus.collect import collect_kernels as collect
    from dlas_predict.measure.execution.runner import MeasureTask

    spec = ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1")
    tasks = [MeasureTask.make(spec, Variant(a, "dense"), get_device("local"))
             for a in ("direct", "gemm", "spatial_pack")]
    # timed before the probes existed (no readings); then a quiet, a slow and a quiet timing
    runner = _ScriptedRunner({"direct": [(None, None, 4e-3), (1.0, 1.01, 1e-3)],
                              "gemm": [(None, None, 2e-3), (1.0, 1.5, 3e-3)],
                              "spatial_pack": [(1.0, 1.0, 5e-3)]})
    with CorpusStore(tmp_path / "c.sqlite") as db:
        collect(tasks, db, runner, progress=False)
        runner.script["spatial_pack"] = []  # probed and quiet: never timed again
        assert collect(tasks, db, runner, progress=False, retime_slow=True).measured == 0
        assert db.slow_keys(runner.protocol, unprobed=True) == {tasks[0].key: 1.0,
                                                                tasks[1].key: 1.0}
        again = collect(tasks, db, runner, progress=False, retime_unprobed=True)
        assert runner.timed[3:] == ["direct", "gemm"]
        assert (again.measured, again.retimed, again.kept) == (2, 1, 1)
        best = {r.variant.algorithm.value: (r.best_s, r.slowdown) for r in db.results()}
        assert best == {"direct": (1e-3, 1.01), "gemm": (2e-3, None),
                        "spatial_pack": (5e-3, 1.0)}

    # whole networks: the same rule
    dev = get_device("local")
    plan = uniform_plan("zoo:resnet18-cifar", "resnet18-cifar", "dense", None, "direct", 21)
    script = [(None, None, 9e-3), (1.0, 1.02, 7e-3)]
    nr = _ScriptedNetworkRunner(script, dev)
    with CorpusStore(tmp_path / "n.sqlite") as db:
        run = (lambda **kw: collect_networks([plan], db, nr, dev, **kw))
        run()
        assert run(retime_slow=True).records == []  # no reading is not a slow reading
        out = run(retime_unprobed=True)
        (rec,) = out.records
        assert out.retimed == 1 and rec.slowdown == 1.02
        assert [json.loads(r["run_secs"]) for r in db.network_measurements()] == [[7e-3]]


@pytest.mark.slow
def test_the_canary_takes_the_tiles_of_the_device_s_vector_width(tmp_path):
    """A wider CPU's register tiles spill on a narrower one and vary by the run: the canary
    of an AVX2 device is built with AVX2's tiles, and its fastest time kept apart."""
    from dlas_predict.measure.kernels.knobs import resolve_knobs
    from dlas_predict.space.config import ConvSpec, Variant

    avx2 = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 2}
    spec, v = ConvSpec.parse(contention.CANARY_CONV), Variant("spatial_pack", "dense")
    canary = contention.Canary(avx2, None, repeats=1, simd_bits=256)
    assert canary.knobs == resolve_knobs(spec, v, 256) != resolve_knobs(spec, v, 512)
    assert canary.seconds() > 0
    assert contention.Canary({"kind": "llvm"}, None, repeats=1).knobs == resolve_knobs(spec, v, 512)
    assert len({contention.canary_reference("fp", 2, b) for b in (None, 256, 512)}) == 2
