"""Measuring through TVM RPC, against a real tracker and real servers on loopback.

Each test starts ``python -m tvm.exec.rpc_tracker`` and two ``python -m tvm.exec.rpc_server``
processes on free loopback ports, bounded in time, and stops them. No other address is
contacted.
"""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import assert_clean_error, run_cli

from dlas_predict.measure.execution.loopback import LoopbackFarm as Farm, free_port as _free_port
from dlas_predict.measure.execution.loopback import stop as _stop, wait_for_boards
from dlas_predict.space.config import ConvSpec, Variant

KEY = "dlas-loopback"
CONVS = ("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1", "C=16,H=8,W=8,K=8,R=1,S=1,stride=1,pad=0",
         "C=8,H=12,W=12,K=8,R=3,S=3,stride=2,pad=1")


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """One tracker and two boards for the module (starting them takes seconds); a test that
    stops a board starts another before it ends."""
    f = Farm(tmp_path_factory.mktemp("farm"), KEY)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def boards(farm):
    """The module's farm, with both boards free again when the test ends."""
    yield farm
    alive = [p for p in farm.servers if p.poll() is None]
    for _ in range(2 - len(alive)):
        farm.add_server()
    wait_for_boards(farm.port, KEY, 2)


def _protocol():
    from dlas_predict.measure.execution.tasks import Protocol

    return Protocol(max_repeats=12, min_repeats=3, time_budget_s=0.05, quiet_wait_s=0.0)


def _tasks(device):
    from dlas_predict.measure.execution.runner import MeasureTask

    return [MeasureTask.make(ConvSpec.parse(c), Variant(alg, comp, 0.9) if comp != "dense"
                             else Variant(alg, comp), device)
            for c in CONVS for alg in ("direct", "gemm")
            for comp in ("dense", "weight_pruning")]


def _rpc(farm, **kw):
    from dlas_predict.measure.execution.rpcopts import RpcOptions

    return RpcOptions(host="127.0.0.1", port=farm.port, key=KEY, request_timeout_s=8.0, **kw)


@pytest.mark.slow
def test_a_farm_measures_on_both_boards_and_survives_a_killed_one(boards, tmp_path):
    farm = boards
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.space.devices import get_device

    dev = get_device("local")
    tasks = _tasks(dev)
    lines: list[str] = []
    store = CorpusStore(tmp_path / "c.sqlite")
    with kernel_runner(dev, _protocol(), 120.0, _rpc(farm), lines.append) as runner:
        for n, rec in enumerate(runner.run(tasks), 1):
            store.add(rec)
            if n == 3:  # the board that measured it drops off: the rest go to the other
                _stop(farm.server_at(json.loads(rec.board)["address"]))
    rows = list(store.rows())
    store.close()
    (tmp_path / "lines.txt").write_text("\n".join(lines))
    assert sorted(r["key"] for r in rows) == sorted(t.key for t in tasks), tmp_path
    assert all(r["error"] is None and r["verified"] == 1 for r in rows), \
        [r["error"] for r in rows if r["error"]]
    boards = {json.loads(r["board"])["address"] for r in rows}
    assert len(boards) == 2, boards  # both boards measured
    board = json.loads(rows[0]["board"])
    assert board["key"] == KEY and board["cores"] >= 1 and board["triple"]
    assert any("done here" in line for line in lines)


@pytest.mark.slow
def test_a_task_that_hangs_every_board_is_a_recorded_failure_after_n_tries(boards, monkeypatch):
    farm = boards
    from dataclasses import replace

    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.space.devices import get_device

    monkeypatch.setenv("DLAS_FAULT_INJECTION", "1")
    dev = get_device("local")
    good, *_ = _tasks(dev)
    hung = replace(_tasks(dev)[1], fault="hang")
    lines: list[str] = []
    with kernel_runner(dev, _protocol(), 5.0, _rpc(farm, tries=2), lines.append) as runner:
        recs = {r.key: r for r in runner.run([hung, good])}
        progress = runner.progress()
    assert recs[good.key].ok
    assert recs[hung.key].error.startswith("failed on 2 boards"), recs[hung.key].error
    assert "timeout" in recs[hung.key].error
    assert sum(p["requeued"] for p in progress) == 1
    assert any("back in the queue" in line for line in lines)


@pytest.mark.slow
def test_a_board_that_returns_wrong_results_is_a_recorded_failure_never_a_timing(boards,
                                                                                 monkeypatch):
    from dataclasses import replace

    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.space.devices import get_device

    monkeypatch.setenv("DLAS_FAULT_INJECTION", "1")
    dev = get_device("local")
    wrong = replace(_tasks(dev)[0], fault="wrong")
    with kernel_runner(dev, _protocol(), 60.0, _rpc(boards)) as runner:
        (rec,) = list(runner.run([wrong]))
    assert not rec.ok and rec.run_secs == [] and "wrong results on the board" in rec.error
    assert runner.progress()[0]["requeued"] == 0  # the task's failure, not the board's


@pytest.mark.slow
def test_a_library_the_board_cannot_load_is_a_recorded_failure(boards, monkeypatch):
    from dataclasses import replace

    from dlas_predict.measure.execution.farm import kernel_runner
    from dlas_predict.space.devices import get_device

    monkeypatch.setenv("DLAS_FAULT_INJECTION", "1")
    dev = get_device("local")
    good, other, *_ = _tasks(dev)
    bad = replace(other, fault="truncate")
    with kernel_runner(dev, _protocol(), 60.0, _rpc(boards, boards=1)) as runner:
        recs = {r.key: r for r in runner.run([bad, good])}
    assert recs[good.key].ok  # the board still measures after the failed load
    assert not recs[bad.key].ok and recs[bad.key].run_secs == []
    assert "upload or load on the board at 127.0.0.1:" in recs[bad.key].error, recs[bad.key].error


@pytest.mark.slow
def test_whole_networks_are_built_here_and_checked_and_timed_on_the_board(boards, tmp_path):
    farm = boards
    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.measure.execution.farm import network_runner
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.space.devices import get_device
    import onnx

    net = tmp_path / "net.onnx"
    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 1, "kernels": 8, "input": 8}), net)
    from dlas_predict.networks.graph import read_network

    plan = uniform_plan(str(net), "net", "dense", None, "gemm", len(read_network(net).convs()))
    dev = get_device("local")
    with network_runner(dev, _protocol(), 300.0, _rpc(farm, boards=1)) as runner:
        (rec,) = list(runner.run([plan]))
    assert rec.error is None, rec.error
    assert rec.verified and rec.best_s > 0
    assert json.loads(rec.board)["key"] == KEY


@pytest.mark.slow
def test_collect_killed_with_sigkill_resumes_to_every_record_once(boards, tmp_path):
    farm = boards
    store = tmp_path / "s.sqlite"
    net = tmp_path / "net.onnx"
    from dlas_predict.networks.generate import FAMILIES, build
    import onnx

    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 8, "input": 8}), net)
    cmd = [sys.executable, "-m", "dlas_predict.cli", "collect", "--network", str(net),
           "--store", str(store), "--tracker", farm.address, "--rpc-key", KEY,
           "--algorithms", "direct,gemm", "--compressions", "dense,weight_pruning",
           "--quiet-wait", "0", "--time-budget", "0.05", "--max-repeats", "12", "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.monotonic()
    count = 0
    while time.monotonic() - t0 < 240 and proc.poll() is None:
        time.sleep(0.2)
        if store.is_file():
            try:
                count = sqlite3.connect(store).execute(
                    "SELECT COUNT(*) FROM measurements").fetchone()[0]
            except sqlite3.OperationalError:
                continue
            if count >= 2:
                break
    assert proc.poll() is None, "collect finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = sqlite3.connect(store).execute("SELECT key, error FROM measurements").fetchall()
    keys = [k for k, _ in rows]
    assert len(keys) == len(set(keys)) and all(e is None for _, e in rows)
    assert f"skipped {count}" in done.stdout or count <= len(keys)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert again.returncode == 0 and "measured 0 (0 failed)" in again.stdout, again.stdout
    assert sqlite3.connect(store).execute(
        "SELECT COUNT(*) FROM measurements").fetchone()[0] == len(keys)


# ---- clean errors -------------------------------------------------------------------------
def test_an_unreachable_tracker_is_one_clean_error():
    port = _free_port()
    assert_clean_error(run_cli("measure", "--conv", CONVS[0], "--tracker",
                               f"127.0.0.1:{port}", "--rpc-key", KEY), "cannot reach")


@pytest.mark.slow
def test_an_unknown_key_is_one_clean_error_naming_the_keys(boards):
    farm = boards
    r = run_cli("measure", "--conv", CONVS[0], "--tracker", farm.address, "--rpc-key", "nope")
    assert_clean_error(r, "no board under the key 'nope'")
    assert KEY in r.output


@pytest.mark.slow
def test_a_board_that_is_not_the_device_is_refused(boards):
    farm = boards
    # i7-8700's target is for a Skylake CPU; the loopback boards are this machine's CPU
    from dlas_predict.space.devices import get_device

    if get_device("local").target.get("mcpu") == "skylake":
        pytest.skip("this machine is a Skylake")
    r = run_cli("measure", "--conv", CONVS[0], "--device", "i7-8700", "--tracker",
                farm.address, "--rpc-key", KEY, "--algorithm", "gemm", "--compression",
                "dense")
    assert_clean_error(r, "not a i7-8700")


@pytest.mark.slow
def test_a_board_whose_server_runs_another_thread_count_is_refused(boards):
    """The loopback servers run TVM on every core; the one-thread profile needs a server
    started with TVM_NUM_THREADS=1."""
    from dlas_predict.space.devices import local_cores

    if local_cores() < 2:
        pytest.skip("one core: every server runs one thread")
    r = run_cli("measure", "--conv", CONVS[0], "--device", "local-native-1t", "--tracker",
                boards.address, "--rpc-key", KEY, "--algorithm", "gemm", "--compression",
                "dense")
    assert_clean_error(r, f"runs TVM kernels on {local_cores()} thread(s), the device on 1: "
                          "start it with TVM_NUM_THREADS=1")


@pytest.mark.slow
def test_no_free_board_within_the_timeout_is_one_clean_error(boards):
    farm = boards
    from dlas_predict.measure.execution.remote import request_board

    held = [request_board("127.0.0.1", farm.port, KEY, 30.0)
            for p in farm.servers if p.poll() is None]
    r = run_cli("measure", "--conv", CONVS[0], "--tracker", farm.address, "--rpc-key", KEY,
                "--timeout", "3", "--algorithm", "gemm", "--compression", "dense")
    assert_clean_error(r, "no free board")
    held.clear()  # the sessions end; the boards register as free again
    import gc

    gc.collect()


def test_a_tracker_off_loopback_needs_the_flag_and_is_warned_about():
    from dlas_predict.errors import ConfigError
    from dlas_predict.measure.execution.rpcopts import REMOTE_WARNING, rpc_options
    from dlas_predict.space.devices import get_device

    dev = get_device("xavier-cpu", with_target=False)
    r = run_cli("measure", "--conv", CONVS[0], "--device", "xavier-cpu", "--tracker",
                "192.0.2.1:9190")  # TEST-NET-1: never contacted, refused before any socket
    assert_clean_error(r, "--allow-remote-tracker")
    warned: list[str] = []
    opts = rpc_options("192.0.2.1:9190", None, dev, allow_remote=True, warn=warned.append)
    assert opts.key == "xavier" and warned == [REMOTE_WARNING.format(addr="192.0.2.1:9190")]
    with pytest.raises(ConfigError, match="not this machine"):
        rpc_options(None, None, dev)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        rpc_options("nohost", None, dev)


def test_the_tracker_comes_from_the_environment(monkeypatch):
    from dlas_predict.measure.execution.rpcopts import rpc_options
    from dlas_predict.space.devices import get_device

    monkeypatch.setenv("DLAS_TRACKER", "127.0.0.1:9555")
    opts = rpc_options(None, "k", get_device("local", with_target=False))
    assert (opts.host, opts.port, opts.key) == ("127.0.0.1", 9555, "k")


@pytest.mark.slow
def test_tune_through_the_tracker_then_build_the_network_tuned(boards, tmp_path):
    """`tune --network` through a tracker: MetaSchedule's candidates are linked here and
    timed on a board by its RPC runner (the worker gives its own board back meanwhile), the
    CSR knob search times its candidates on the worker's board; the records are verified on
    the board. The database then serves a tuned whole-network build, which takes every
    layer's schedule from it, verifies against onnxruntime, and says which layers it found."""
    import onnx

    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.measure.networks.runner import NetworkRunner
    from dlas_predict.measure.execution.runner import LocalRunner, MeasureTask, TuningOptions
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.networks.graph import read_network
    from dlas_predict.space.devices import get_device

    farm = boards
    net = tmp_path / "one.onnx"
    # one conv layer (the stem): each dense layer costs a MetaSchedule search
    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 0, "kernels": 8, "input": 8}), net)
    store, db = tmp_path / "t.sqlite", tmp_path / "db"
    args = ["tune", "--network", net, "--algorithms", "gemm", "--compressions",
            "dense,weight_pruning", "--ratio", "0.5", "--trials", "2", "--tuning-db", db,
            "--store", store, "--max-repeats", "3", "--time-budget", "0.05", "--quiet-wait",
            "0", "-q", "--tracker", farm.address, "--rpc-key", KEY, "--boards", "1"]
    r = run_cli(*args)
    assert r.exit_code == 0, r.output
    rows = sqlite3.connect(store).execute(
        "SELECT tuner, trials, verified, error, board, knobs, tuning_seconds "
        "FROM measurements").fetchall()
    assert sorted(t for t, *_ in rows) == ["knob-search", "metaschedule"]
    for tuner, trials, verified, error, board, knobs, secs in rows:
        assert error is None and verified == 1 and 1 <= trials <= 2 and secs > 0
        assert json.loads(board)["key"] == KEY
        if tuner == "metaschedule":  # the search's best, or the hand schedule that beat it
            (entry,) = [e for e in map(json.loads, (db / "index.jsonl").read_text().splitlines())
                        if e["tuner"] == "metaschedule"]
            assert entry["kept"] == ("hand" if entry["hand_s"] < entry["search_s"]
                                     else "search")
            hand = set(json.loads(knobs)) - {"budget"}
            assert json.loads(knobs)["budget"] == 2 and bool(hand) == (entry["kept"] == "hand")
    assert (db / "records.json").stat().st_size > 0 and (db / "workloads.json").is_file()
    # resumable: a second run finds everything in the store and tunes nothing
    again = run_cli(*args, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["skipped"] == len(rows)

    dev = get_device("local")
    opts = TuningOptions(budget=2, db=str(db))
    quick = _protocol()
    # measured again here without the store, the database's search is reused, not run again
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(store) as s:
        (ms,) = [rec for rec in s.results() if rec.tuner == "metaschedule"]
    with LocalRunner(dev, protocol=quick) as runner:
        reused = runner.run_one(MeasureTask.make(ms.conv, ms.variant, dev, tuning=opts))
    assert reused.ok and reused.verified and reused.tuning_seconds == ms.tuning_seconds

    n = len(read_network(net).convs())

    def plan(comp, ratio, alg):
        from dataclasses import replace

        return replace(uniform_plan(str(net), "one", comp, ratio, alg, n), tuning=opts)

    with NetworkRunner(dev, protocol=quick, timeout_s=300) as nm:
        dense = nm.measure(plan("dense", None, "gemm"))
        pruned = nm.measure(plan("weight_pruning", 0.5, "gemm"))
        missing = nm.measure(plan("dense", None, "direct"))
    for rec in (dense, pruned):
        assert rec.error is None and rec.verified, rec.error
        assert rec.tuned_layers == list(range(n)) and rec.untuned_layers == []
    assert missing.error is None and missing.tuned_layers == []
    assert missing.untuned_layers == list(range(n))


def test_emulated_timings_are_refused_by_the_corpus(tmp_path):
    from dlas_predict.measure.records import MeasureResult
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.errors import StoreError

    board = json.dumps({"cpu": "generic", "triple": "aarch64-linux-gnu", "emulated": True})
    rec = MeasureResult(key="k", device="hikey970-cpu", fingerprint="f",
                        conv=ConvSpec.parse(CONVS[0]), variant=Variant("gemm", "dense"),
                        knobs={}, run_secs=[1e-3], board=board)
    with CorpusStore(tmp_path / "s.sqlite") as store:
        with pytest.raises(StoreError, match="emulated"):
            store.add(rec)
        assert list(store.rows()) == []
    assert_clean_error(run_cli("measure", "--conv", CONVS[0], "--emulated"), "--tracker")
    assert_clean_error(run_cli("measure", "--conv", CONVS[0], "--device", "hikey970-cpu",
                               "--tracker", "127.0.0.1:9", "--emulated", "--store",
                               tmp_path / "x.sqlite"), "refuses them")


def test_an_emulated_board_matches_any_cpu_of_its_architecture():
    from dlas_predict.measure.execution.remote import BoardInfo, board_mismatch
    from dlas_predict.space.devices import get_device

    target = get_device("hikey970-cpu", with_target=False).target
    board = BoardInfo("generic", "aarch64-unknown-linux-gnu", 2, KEY, "127.0.0.1:1")
    assert "cortex-a73" in board_mismatch(target, board)
    assert board_mismatch(target, BoardInfo(**{**board.__dict__, "emulated": True})) is None
    x86 = BoardInfo("znver3", "x86_64-pc-linux-gnu", 2, KEY, "127.0.0.1:1", True)
    assert "aarch64" in board_mismatch(target, x86)


def test_a_board_is_checked_for_its_thread_pool_unless_unknown_or_emulated():
    from dlas_predict.measure.execution.remote import BoardInfo, board_mismatch

    target = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
    board = BoardInfo("znver3", "x86_64-pc-linux-gnu", 2, KEY, "127.0.0.1:1", threads=1)
    assert "TVM_NUM_THREADS=2" in board_mismatch(target, board, 2)
    assert board_mismatch(target, board, 1) is None
    assert board_mismatch(target, BoardInfo(**{**board.__dict__, "threads": 0}), 2) is None
    assert board_mismatch(target, BoardInfo(**{**board.__dict__, "emulated": True}), 2) is None
    assert BoardInfo.from_dict(board.to_dict()) == board
