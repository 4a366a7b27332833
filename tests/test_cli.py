"""The command line: JSON shapes, exit codes, and one clear error line for bad input."""
import json

import pytest
from typer.testing import CliRunner

from cli import app
from conftest import DEMO

runner = CliRunner()
TINY = "C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1"
FAST = ["--max-repeats", "3", "--time-budget", "0.01"]


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _assert_clean_error(result, needle):
    assert result.exit_code != 0
    assert f"Error: " in result.output and needle in result.output
    assert "Traceback" not in result.output and result.exception is None or \
        isinstance(result.exception, SystemExit)


def test_help_lists_commands():
    result = _run("--help")
    assert result.exit_code == 0
    for cmd in ("devices", "measure", "collect", "corpus", "demo"):
        assert cmd in result.output


def test_devices_json():
    result = _run("devices", "--json")
    assert result.exit_code == 0
    devs = json.loads(result.output)
    names = [d["name"] for d in devs]
    assert names[0] == "local" and "xavier" in names
    assert all({"target", "kind", "cores", "peak_gflops", "mem_bandwidth_gbs", "caches"}
               <= set(d) for d in devs)


@pytest.mark.slow
def test_measure_full_grid_json(tmp_path):
    store = tmp_path / "m.sqlite"
    result = _run("measure", "--conv", TINY, "--device", "local", "--algorithm", "all",
                  "--compression", "all", "--ratio", "0.8", "--json", "--store", store, *FAST)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 15
    keys = {"algorithm", "compression", "ratio", "sparse", "dtype", "tuning", "median_ms",
            "gflops", "verified", "max_error", "error"}
    assert all(keys <= set(r) for r in rows)
    assert all(r["verified"] and r["error"] is None and r["median_ms"] > 0 for r in rows)
    assert {(r["compression"], r["sparse"], r["dtype"]) for r in rows} == {
        ("dense", False, "float32"), ("weight_pruning", True, "float32"),
        ("channel_pruning", True, "float32"), ("float16", False, "float16"),
        ("int8", False, "int8")}
    assert all(r["ratio"] == 0.8 for r in rows if r["sparse"])
    stats = json.loads(_run("corpus", "stats", "--store", store, "--json").output)
    assert stats["records"] == 15 and stats["duplicates"] == 0 and stats["failures"] == 0


@pytest.mark.slow
def test_measure_table_subset():
    result = _run("measure", "--conv", TINY, "--algorithm", "gemm,direct", "--compression",
                  "dense", "-q", *FAST)
    assert result.exit_code == 0, result.output
    assert "gemm" in result.output and "direct" in result.output
    assert "spatial_pack" not in result.output and "median ms" in result.output


@pytest.mark.parametrize("args,needle", [
    (["--conv", "C=0,H=5,W=5,K=4,R=3,S=3"], "positive"),
    (["--conv", "C=4,H=2,W=2,K=4,R=5,S=5"], "larger than the padded input"),
    (["--conv", "C=4,H=8,W=8,K=4,R=3"], "missing S"),
    (["--conv", TINY, "--algorithm", "winograd"], "allowed: direct, gemm, spatial_pack"),
    (["--conv", TINY, "--compression", "int4"], "allowed: dense, weight_pruning"),
    (["--conv", TINY, "--device", "cray-1"], "known devices: local"),
    (["--conv", TINY, "--device", "xavier"], "cannot be measured from here"),
    (["--conv", TINY, "--ratio", "1.0"], "(0, 1)"),
    (["--conv", TINY, "--ratio", "-0.2"], "(0, 1)"),
    (["--conv", TINY, "--ratio", "0"], "(0, 1)"),
])
def test_measure_bad_input(args, needle):
    _assert_clean_error(_run("measure", *args), needle)


def test_collect_bad_input(tmp_path):
    _assert_clean_error(_run("collect", "--network", tmp_path / "x.onnx", "--store",
                             tmp_path / "s.sqlite"), "not found")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"garbage" * 50)
    _assert_clean_error(_run("collect", "--network", junk, "--store", tmp_path / "s.sqlite"),
                        "ONNX")
    _assert_clean_error(_run("collect", "--network", DEMO, "--store", tmp_path / "s.sqlite",
                             "--compressions", "dense,zip"), "allowed")


def test_corpus_bad_input(tmp_path):
    _assert_clean_error(_run("corpus", "stats", "--store", tmp_path / "none.sqlite"),
                        "no corpus store")
    _assert_clean_error(_run("corpus", "export", "--store", tmp_path / "none.sqlite",
                             "--format", "csv", "-o", tmp_path / "o.csv"), "no corpus store")
    _run("corpus", "stats", "--store", tmp_path / "none.sqlite")
    store = tmp_path / "empty.sqlite"
    from dlas_predict.store import CorpusStore

    CorpusStore(store).close()
    _assert_clean_error(_run("corpus", "export", "--store", store, "--format", "xlsx", "-o",
                             tmp_path / "o.xlsx"), "parquet, csv")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _assert_clean_error(_run("corpus", "export", "--store", store, "--format", "csv", "-o",
                             blocker / "sub" / "o.csv"), "Not a directory")


@pytest.mark.slow
def test_collect_then_resume_then_export(tmp_path):
    store = tmp_path / "c.sqlite"
    args = ["collect", "--network", DEMO, "--store", store, "--algorithms", "gemm",
            "--compressions", "dense,weight_pruning", "--json", *FAST]
    first = _run(*args)
    assert first.exit_code == 0, first.output
    s1 = json.loads(first.output)
    assert s1["planned"] == 12 and s1["measured"] == 12 and s1["skipped"] == 0
    again = json.loads(_run(*args).output)
    assert again["measured"] == 0 and again["skipped"] == 12
    out = tmp_path / "c.parquet"
    assert _run("corpus", "export", "--store", store, "--format", "parquet", "-o",
                out).exit_code == 0
    import pandas as pd

    frame = pd.read_parquet(out)
    assert len(frame) == 12 and frame["verified"].all()
    stats = json.loads(_run("corpus", "stats", "--store", store, "--json").output)
    assert stats["networks"] == 1 and stats["workloads"] == 6 and stats["duplicates"] == 0
