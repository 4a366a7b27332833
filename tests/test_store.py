import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest

from conftest import DEMO, ROOT
from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.errors import StoreError
from dlas_predict.measure.records import MeasureResult, measurement_key
from dlas_predict.corpus.store import CorpusStore

SPEC = ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1")


def _result(variant=Variant("direct", "dense"), runs=(1e-3, 2e-3, 3e-3), error=None, fp="f",
            version="k1", knobs=None):
    knobs = knobs or {"tile_k": 8}
    key = measurement_key("local", fp, SPEC, variant, knobs, version)
    return MeasureResult(key=key, device="local", fingerprint=fp, conv=SPEC, variant=variant,
                         knobs=knobs, run_secs=list(runs) if not error else [],
                         verified=None if error else True, max_error=0.0, error=error,
                         kernels_version=version, timestamp=time.time())


def test_add_is_idempotent_and_keeps_all_runs(tmp_path):
    with CorpusStore(tmp_path / "c.sqlite") as db:
        r = _result()
        assert db.add(r) and not db.add(r)
        (back,) = db.results()
        assert back.run_secs == [1e-3, 2e-3, 3e-3] and back.median_s == 2e-3
        assert back.variant == r.variant and back.conv == SPEC and back.key == r.key
        stats = db.stats()
        assert (stats.records, stats.failures, stats.duplicates) == (1, 0, 0)


def test_failure_replaced_by_retry_but_success_never_replaced(tmp_path):
    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(_result(error="boom"))
        assert db.stats().failures == 1
        db.add(_result())
        assert db.stats().failures == 0 and db.stats().records == 1
        assert not db.add(_result(error="later failure"))
        assert db.results()[0].error is None


def test_a_kernel_measured_again_under_new_code_hides_its_old_records(tmp_path):
    """A configuration timed under a newer kernels version keeps only those timings, even
    where the old code was faster; other configurations and machines keep theirs."""
    from dlas_predict.models.evaluation import load_corpus

    sp = Variant("spatial_pack", "dense")
    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(_result(sp, runs=(1e-3,) * 3, version="k4"))
        db.add(_result(Variant("gemm", "dense"), runs=(5e-3,) * 3, version="k4"))
        db.add(_result(sp, runs=(1e-3,) * 3, version="k4", fp="other machine"))
        assert len(db.current_rows()) == 3  # nothing measured again yet
        db.add(_result(sp, runs=(2e-3,) * 3, version="k5"))
        rows = db.current_rows()
        assert len(list(db.rows())) == 4 and len(rows) == 3
        assert {(r["algorithm"], r["fingerprint"], r["kernels_version"]) for r in rows} == {
            ("spatial_pack", "f", "k5"), ("gemm", "f", "k4"),
            ("spatial_pack", "other machine", "k4")}
    corpus = load_corpus(tmp_path / "c.sqlite")
    seconds = dict(zip([k.algorithm for k in corpus.keys], corpus.seconds))
    assert seconds["gemm"] > seconds["spatial_pack"] >= 1.5e-3  # the k5 timing, not k4's


def test_a_kernel_timed_before_and_after_a_change_of_its_defaults_keeps_todays(tmp_path):
    """Two records of one configuration and code version on one machine, with other knobs:
    the one of today's untuned schedule is kept, even where the other was faster (a build
    of today's engine runs it, so a whole network's layers are paired with it); where
    neither is today's, the faster."""
    from dlas_predict.corpus.store import store_device
    from dlas_predict.space.devices import fingerprint_here
    from dlas_predict.measure.kernels.knobs import default_knobs
    from dlas_predict.models.evaluation import load_corpus
    from dlas_predict.corpus.kernels import runs_today
    from dlas_predict.corpus.kernels import codegen

    direct, gemm = Variant("direct", "dense"), Variant("gemm", "dense")
    store = tmp_path / "c.sqlite"
    old = {"tile_k": 2, "tile_w": 4}
    with CorpusStore(store) as db:
        db.add(_result(direct, runs=(1e-3,) * 3, version="k4", knobs=old))
    dev = store_device(store, "local", fingerprint_here("local"))
    today = default_knobs(SPEC, direct, *codegen(dev))
    others = ({"tile_k": 2, "tile_p": 4}, {"tile_k": 4, "tile_p": 4})
    assert today != old and default_knobs(SPEC, gemm, *codegen(dev)) not in others
    with CorpusStore(store) as db:
        db.add(_result(direct, runs=(3e-3,) * 3, version="k4", knobs=today))
        db.add(_result(gemm, runs=(2e-3,) * 3, version="k4", knobs=others[0]))
        db.add(_result(gemm, runs=(1e-3,) * 3, version="k4", knobs=others[1]))
        rows = db.current_rows()
    assert [runs_today(r, dev) for r in rows] == [False, True, False, False]
    corpus = load_corpus(store)
    seconds = dict(zip([k.algorithm for k in corpus.keys], corpus.seconds))
    assert seconds["direct"] == pytest.approx(3e-3)  # today's schedule, though slower
    assert seconds["gemm"] == pytest.approx(1e-3)  # neither is today's: the faster
    # the layer model learns from today's schedule only; the gemm record, the only timing
    # of its configuration, still pairs with the whole networks built with it
    learns = dict(zip([k.algorithm for k in corpus.keys], corpus.learns))
    assert learns == {"direct": True, "gemm": False}
    assert [corpus.keys[i].algorithm for i in corpus.learned()] == ["direct"]


def test_each_kernel_carries_its_own_code_version():
    from dlas_predict.measure import KERNELS_VERSION, KERNEL_VERSIONS, kernels_version
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.devices import get_device

    assert kernels_version("gemm", False) == KERNELS_VERSION
    assert kernels_version("spatial_pack", True) == KERNELS_VERSION  # CSR: unchanged
    assert kernels_version("spatial_pack", False, tuned=True) == KERNELS_VERSION
    newer = kernels_version("spatial_pack", False)
    assert newer == KERNEL_VERSIONS[("spatial_pack", False, False)] != KERNELS_VERSION
    dev = get_device("local", with_target=False)
    keys = {MeasureTask.make(SPEC, Variant(a, "dense"), dev).key
            for a in ("direct", "gemm", "spatial_pack")}
    assert len(keys) == 3
    task = MeasureTask.make(SPEC, Variant("spatial_pack", "dense"), dev)
    assert task.key == measurement_key("local", dev.fingerprint, SPEC, task.variant,
                                       task.knobs, newer)
    # the int8 GEMM on VNNI is other code than the plain int8 GEMM of the same configuration
    from dlas_predict.measure import VNNI_KERNELS_VERSION

    vnni = MeasureTask.make(SPEC, Variant("gemm", "int8", knobs=(("vnni", 1),)), dev)
    assert kernels_version("gemm", False, knobs=vnni.knobs) == VNNI_KERNELS_VERSION
    assert kernels_version("gemm", False, knobs={"tile_k": 8, "tile_p": 16}) == \
        KERNELS_VERSION
    assert vnni.key == measurement_key("local", dev.fingerprint, SPEC, vnni.variant,
                                       vnni.knobs, VNNI_KERNELS_VERSION)


def test_contention_and_slowdown_are_kept_exported_imported_and_migrated(tmp_path):
    from dataclasses import replace

    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(replace(_result(), contention=1.97, slowdown=1.44))
        assert (db.results()[0].contention, db.results()[0].slowdown) == (1.97, 1.44)
        db.export(tmp_path / "c.parquet", "parquet")
    with CorpusStore(tmp_path / "d.sqlite") as db:
        db.import_snapshot(tmp_path / "c.parquet")
        assert (db.results()[0].contention, db.results()[0].slowdown) == (1.97, 1.44)
    # a store written before the column: migrated in place, its records read as not probed
    old = sqlite3.connect(tmp_path / "old.sqlite")
    with CorpusStore(tmp_path / "c.sqlite") as db:
        schema = [r[0] for r in db._db.execute("SELECT sql FROM sqlite_master WHERE sql "
                                                 "IS NOT NULL")]
    for sql in schema:
        old.execute(sql.replace(",\n    contention REAL,\n    slowdown REAL", ""))
    old.commit()
    assert not {"contention", "slowdown"} & {
        r[1] for r in old.execute("PRAGMA table_info(measurements)")}
    old.close()
    with CorpusStore(tmp_path / "old.sqlite") as db:
        db.add(_result())
        assert db.results()[0].contention is None and db.results()[0].slowdown is None


def test_fingerprint_is_part_of_the_key():
    assert _result(fp="a").key != _result(fp="b").key


def test_export_parquet_and_csv(tmp_path):
    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(_result())
        db.add(_result(Variant("gemm", "int8"), error="x"))
        assert db.export(tmp_path / "c.parquet", "parquet") == 2
        assert db.export(tmp_path / "c.csv", "csv") == 2
        with pytest.raises(StoreError, match="parquet, csv"):
            db.export(tmp_path / "c.xls", "xls")
    frame = pd.read_parquet(tmp_path / "c.parquet")
    assert set(frame["algorithm"]) == {"direct", "gemm"}
    assert json.loads(frame.loc[frame.algorithm == "direct", "run_secs"].iloc[0]) == [
        1e-3, 2e-3, 3e-3]
    assert len(pd.read_csv(tmp_path / "c.csv")) == 2


def test_an_unchanged_snapshot_exported_again_is_not_rewritten(tmp_path):
    """Snapshots are written deterministically: exporting the same records again, also
    from another store they were imported into, leaves the files (and their modification
    times) as they were; a new record rewrites the snapshot."""
    import os

    from dlas_predict.corpus.store import networks_path

    out = tmp_path / "c.parquet"
    files = [out, networks_path(out), networks_path(out, "wholenet")]
    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(_result())
        db.export(out, "parquet")
        for f in files:
            os.utime(f, ns=(1, 1))
        db.export(out, "parquet")
        assert [f.stat().st_mtime_ns for f in files] == [1, 1, 1]
    with CorpusStore(tmp_path / "d.sqlite") as db:
        db.import_snapshot(out)
        db.export(out, "parquet")
        assert [f.stat().st_mtime_ns for f in files] == [1, 1, 1]
        db.add(_result(Variant("gemm", "int8")))
        db.export(out, "parquet")
        assert out.stat().st_mtime_ns != 1
    assert len(pd.read_parquet(out)) == 2
    assert not list(tmp_path.glob(".*.tmp"))


def test_export_latest_leaves_out_only_superseded_kernel_records(tmp_path):
    """--latest drops a kernel timed again under newer code, keeps one whose newer timing
    failed, and the imported snapshot trains on exactly the rows the store does."""
    sp, gemm, direct = (Variant("spatial_pack", "dense"), Variant("gemm", "dense"),
                        Variant("direct", "dense"))
    with CorpusStore(tmp_path / "c.sqlite") as db:
        db.add(_result(sp, version="k2"))
        db.add(_result(sp, runs=(4e-3,) * 3, version="k4"))
        db.add(_result(gemm, version="k2"))
        db.add(_result(gemm, error="build failed", version="k4"))
        db.add(_result(direct, version="k2"))
        assert db.export(tmp_path / "all.parquet", "parquet") == 5
        assert db.export(tmp_path / "new.parquet", "parquet", latest=True) == 4
        current = {r["key"] for r in db.current_rows("error IS NULL")}
    frame = pd.read_parquet(tmp_path / "new.parquet")
    assert sorted(zip(frame.algorithm, frame.kernels_version)) == [
        ("direct", "k2"), ("gemm", "k2"), ("gemm", "k4"), ("spatial_pack", "k4")]
    with CorpusStore(tmp_path / "back.sqlite") as back:
        assert back.import_snapshot(tmp_path / "new.parquet") == (4, 0)
        assert {r["key"] for r in back.current_rows("error IS NULL")} == current


def test_import_keeps_the_layers_of_a_network_configuration_the_store_holds(tmp_path):
    """An older snapshot describing a channel-pruned network by its dense shapes does not
    overwrite the store's removed layers; configurations the store lacks are added."""
    removed = [(0, "conv0", "C=3,H=8,W=8,K=5,R=3,S=3,stride=1,pad=1", "channel_pruning", 0.0)]
    dense = [(0, "conv0", "C=3,H=8,W=8,K=16,R=3,S=3,stride=1,pad=1", "channel_pruning", 0.7)]
    with CorpusStore(tmp_path / "old.sqlite") as old:
        old.add(_result())
        old.add_network_config("net", "channel_pruning@0.7", dense)
        old.add_network_config("other", "dense", dense)
        old.export(tmp_path / "old.parquet", "parquet")
    with CorpusStore(tmp_path / "new.sqlite") as db:
        db.add_network_config("net", "channel_pruning@0.7", removed)
        db.import_snapshot(tmp_path / "old.parquet")
        configs = {(c["network"], c["config"]): c["conv"] for c in db.network_configs()}
    assert configs == {("net", "channel_pruning@0.7"): removed[0][2],
                       ("other", "dense"): dense[0][2]}


def test_missing_or_corrupt_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="no corpus store"):
        CorpusStore(tmp_path / "nope.sqlite", must_exist=True)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        CorpusStore(bad)


def _count(path):
    try:
        con = sqlite3.connect(str(path), timeout=5)
        n = con.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        con.close()
        return n
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_sigkill_mid_collection_loses_nothing_and_resume_completes(tmp_path):
    """Kill -9 a real collection after some records, then resume: every committed record
    survives, no row is half-written, and the resumed run measures only what is missing."""
    store = tmp_path / "kill.sqlite"
    cmd = [sys.executable, str(ROOT / "cli.py"), "collect", "--network", str(DEMO),
           "--store", str(store), "--algorithms", "direct,gemm", "--compressions",
           "dense,int8", "--max-repeats", "3", "--time-budget", "0.01", "--quiet-wait", "0",
           "--quiet", "--json"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 240
    while _count(store) < 5 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "collection finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    con = sqlite3.connect(str(store))
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    before = con.execute("SELECT key, run_secs FROM measurements").fetchall()
    con.close()
    assert 5 <= len(before) < 24
    assert all(json.loads(runs) for _, runs in before)  # every committed row is complete

    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["skipped"] == len(before)
    assert summary["measured"] == summary["planned"] - len(before) == 24 - len(before)
    with CorpusStore(store) as db:
        stats = db.stats()
        keys_after = {r["key"]: r["run_secs"] for r in db.rows()}
    assert stats.records == 24 and stats.duplicates == 0 and stats.failures == 0
    assert all(keys_after[k] == runs for k, runs in before)  # old records untouched


def test_a_corpus_of_vnni_kernels_proves_its_machine_has_vnni():
    """Another machine's shipped roofs carry no ISA flags: its verified kernel records built
    with the vnni knob prove the flag, and today's default knobs (which records are today's
    schedules) are reckoned with it."""
    from dataclasses import replace

    from dlas_predict.models.evaluation import with_evidenced_isa
    from dlas_predict.space.devices import get_device

    bare = replace(get_device("local", with_target=False), isa_flags=())
    plain = {"knobs": '{"block_k": 16}'}
    vnni = {"knobs": '{"block_k": 16, "vnni": true}'}
    assert not with_evidenced_isa(bare, [plain, {"knobs": None}]).vnni
    assert not with_evidenced_isa(bare, [{"knobs": '{"vnni": false}'}]).vnni
    assert with_evidenced_isa(bare, [plain, vnni]).vnni
    gpu = replace(bare, kind="gpu")
    assert not with_evidenced_isa(gpu, [vnni]).vnni
