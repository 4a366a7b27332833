"""Importing TopHub logs: workloads, devices, algorithms, what is left out, idempotence."""
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dlas_predict.cli import app
from conftest import SHARED_DATA, assert_clean_error, run_cli
from dlas_predict.corpus.store import CorpusStore
from dlas_predict.corpus.tophub import devices_by_model, import_tophub, parse_line

runner = CliRunner()


def _line(target, template, data, kernel, stride=(1, 1), pad=(1, 1, 1, 1), times=(0.002,),
          code=0, dtype="float32"):
    return json.dumps({
        "input": [target, template, [["TENSOR", list(data), dtype],
                                     ["TENSOR", list(kernel), dtype], list(stride), list(pad),
                                     [1, 1], dtype], {}],
        "config": {"index": 7, "entity": []},
        "result": [list(times), code, 1.0, 1535933156.9], "version": 0.2,
        "tvm_version": "0.7.dev0"})


ARM = "llvm -device=arm_cpu -model=rk3399 -mtriple=aarch64-linux-gnu -mattr=+neon"
CUDA = "cuda -model=titanx"


def test_parse_spatial_pack_direct_and_depthwise():
    devs = devices_by_model()
    r = parse_line(_line(ARM, "conv2d_nchw_spatial_pack.arm_cpu", (1, 64, 56, 56),
                         (128, 64, 3, 3), stride=(2, 2)), "arm_cpu.jsonl", devs)
    assert r.device == "rk3399-cpu" and r.variant.algorithm.value == "spatial_pack"
    assert r.variant.tuning.value == "tuned" and r.variant.compression.value == "dense"
    assert (r.conv.C, r.conv.K, r.conv.H, r.conv.stride_h, r.conv.OH) == (64, 128, 56, 2, 28)
    assert r.median_s == 0.002 and r.kernels_version.startswith("tophub-")
    d = parse_line(_line(CUDA, "depthwise_conv2d_nchw.cuda", (1, 32, 112, 112), (32, 1, 3, 3)),
                   "cuda.jsonl", devs)
    assert d.device == "titanx" and d.variant.algorithm.value == "direct"
    assert d.conv.groups == 32 and d.conv.K == 32 and d.conv.depthwise
    q = parse_line(_line(CUDA, "conv2d_nchw.cuda", (1, 16, 8, 8), (16, 16, 1, 1), pad=(0, 0),
                         dtype="int8"), "cuda.jsonl", devs)
    assert q.variant.compression.value == "int8" and q.conv.pad_t == 0


@pytest.mark.parametrize("line,file,reason", [
    (_line(ARM, "conv2d_nchw_winograd.arm_cpu", (1, 8, 8, 8), (8, 8, 3, 3)), "arm_cpu.jsonl",
     "template conv2d_nchw_winograd"),
    (_line(ARM, "conv2d_nchw_spatial_pack.arm_cpu", (1, 8, 8, 8), (8, 8, 3, 3), code=1),
     "arm_cpu.jsonl", "failed run"),
    (_line(ARM, "conv2d_nchw_spatial_pack.arm_cpu", (2, 8, 8, 8), (8, 8, 3, 3)),
     "arm_cpu.jsonl", "batch != 1"),
    (_line("llvm -model=unknownboard", "conv2d_nchw_spatial_pack.arm_cpu", (1, 8, 8, 8),
           (8, 8, 3, 3)), "arm_cpu.jsonl", "not in the registry"),
    (_line(ARM, "conv2d_nchw_spatial_pack.arm_cpu", (1, 8, 8, 8), (8, 8, 3, 3)),
     "cuda.jsonl", "not in the registry"),  # rk3399 logs of another file are another device
    ("{not json", "arm_cpu.jsonl", "malformed line"),
])
def test_lines_left_out_say_why(line, file, reason):
    got = parse_line(line, file, devices_by_model())
    assert isinstance(got, str) and reason in got


def test_import_is_idempotent_and_counts(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "arm_cpu.jsonl").write_text("\n".join([
        _line(ARM, "conv2d_nchw_spatial_pack.arm_cpu", (1, 8, 8, 8), (8, 8, 3, 3)),
        _line(ARM, "conv2d_nchw_winograd.arm_cpu", (1, 8, 8, 8), (8, 8, 3, 3)),
        _line(ARM, "depthwise_conv2d_nchw.arm_cpu", (1, 8, 8, 8), (8, 1, 3, 3))]) + "\n")
    store = tmp_path / "t.sqlite"
    rep = import_tophub([logs], store)
    assert rep.added == 2 and rep.devices == {"rk3399-cpu": 2}
    assert sum(rep.skipped.values()) == 1
    again = import_tophub([logs / "arm_cpu.jsonl"], store)
    assert again.added == 0 and again.present == 2
    with CorpusStore(store) as db:
        rows = list(db.rows())
    assert {r["device"] for r in rows} == {"rk3399-cpu"} and all(r["tuning"] == "tuned"
                                                                 for r in rows)
    res = runner.invoke(app, ["corpus", "import-tophub", str(logs), "--store", str(store)])
    assert res.exit_code == 0 and "imported 0 TopHub records" in res.output
    res = runner.invoke(app, ["corpus", "import-tophub", str(tmp_path / "none"), "--store",
                              str(store)])
    assert res.exit_code == 1 and "Error: TopHub log not found" in res.output


@pytest.fixture(scope="module")
def tophub_store(tmp_path_factory):
    """TopHub's logs imported from the workplace's shared data (never shipped)."""
    logs = SHARED_DATA / "tophub"
    if not logs.is_dir():
        pytest.skip(f"no TopHub logs at {logs}")
    store = tmp_path_factory.mktemp("tophub") / "tophub.sqlite"
    import_tophub([logs], store)
    return store


def test_import_of_the_shared_tophub_logs(tophub_store):
    from dlas_predict.corpus.store import CorpusStore

    with CorpusStore(tophub_store, must_exist=True) as db:
        rows = list(db.rows())
    frame = pd.DataFrame(rows)
    assert len(frame) > 1000 and frame["key"].is_unique
    assert set(frame["tuning"]) == {"tuned"}
    assert frame["kernels_version"].str.startswith("tophub-").all()
    assert {"rpi3b", "rk3399-cpu", "titanx", "1080ti", "jetson-nano", "rk3399-mali"} <= \
        set(frame["device"])
    assert set(frame["algorithm"]) <= {"direct", "spatial_pack"}


def test_report_for_a_device_with_kernels_only(tophub_store, tmp_path):
    res = run_cli("report", "--device", "rk3399-cpu", "--store", tophub_store,
                  "--out", tmp_path)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["table3"] == [] and data["counts"]["sources"] == {"tophub": 199}
    assert all(o["verdict"] == "no data" for o in data["observations"]
               if o["number"] not in ("II", "IX"))
    # the pruning elbows come from the shipped accuracy curves: any device has them
    assert [o["verdict"] for o in data["observations"] if o["number"] == "II"] != ["no data"]


def test_a_tophub_device_has_no_shipped_corpus():
    res = run_cli("report", "--device", "rk3399-cpu", "--out", "/tmp/unused-report")
    assert_clean_error(res, "corpus import-tophub")
