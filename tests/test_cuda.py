"""CUDA kernels: what can be checked without a GPU (schedules lower, thread bindings verify,
CUDA source is produced), the bundle round trip, and the GPU runner's refusals. The one test
that runs kernels on a GPU skips where there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlas_predict.space.config import Algorithm, Compression, ConvSpec, Variant
from dlas_predict.space.devices import get_device
from dlas_predict.errors import ConfigError, DlasError
from dlas_predict.measure.knobs import resolve_gpu_knobs

ROOT = Path(__file__).resolve().parent.parent
SPEC = ConvSpec.parse("C=8,H=9,W=9,K=16,R=3,S=3,stride=1,pad=1")
DEPTHWISE = ConvSpec.parse("C=8,H=8,W=8,K=8,R=3,S=3,stride=2,pad=1,groups=8")


def _kernel(spec, alg, comp, **knobs):
    from dlas_predict.measure.kernels import KernelSpec

    ratio = 0.7 if comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING) else 0.0
    v = Variant(alg, comp, ratio, knobs=knobs)
    return KernelSpec(spec, alg, v.sparse, v.dtype, resolve_gpu_knobs(spec, v))


def _source(kernels: dict) -> str:
    from dlas_predict.measure import cuda

    mod = cuda.build(kernels, cuda.cuda_target("sm_90"))
    return mod.mod.imports[0].inspect_source()


@pytest.mark.parametrize("alg", list(Algorithm))
@pytest.mark.parametrize("spec", [SPEC, DEPTHWISE], ids=["conv", "depthwise"])
def test_dense_kernels_lower_to_cuda_with_shared_tiles(alg, spec):
    kernels = {f"k_{c.value}": _kernel(spec, alg, c)
               for c in (Compression.DENSE, Compression.FLOAT16, Compression.INT8)}
    kernels["k_acc16"] = _kernel(spec, alg, Compression.FLOAT16, acc_bits=16)
    src = _source(kernels)
    for name in kernels:
        assert f'extern "C" __global__' in src and name in src
    assert "__shared__" in src and "__syncthreads()" in src
    assert "threadIdx.x" in src and "blockIdx.x" in src
    assert "half" in src          # float16 inputs
    assert "signed char" in src or "int8_t" in src  # int8 inputs


@pytest.mark.parametrize("alg", list(Algorithm))
def test_csr_kernels_are_row_parallel(alg):
    src = _source({"csr": _kernel(SPEC, alg, Compression.WEIGHT_PRUNING),
                   "chan": _kernel(SPEC, alg, Compression.CHANNEL_PRUNING)})
    assert "w_indptr" in src and "threadIdx.x" in src and "blockIdx.x" in src


def test_thread_bindings_verify_within_gpu_limits():
    from dlas_predict.measure import cuda

    kernels = {f"k{i}": _kernel(SPEC, alg, Compression.DENSE)
               for i, alg in enumerate(Algorithm)}
    mod = cuda.kernels_module(kernels)
    assert cuda.verify(mod) == []


def test_unsupported_or_malformed_arch_is_a_clear_error():
    from dlas_predict.measure.cuda import check_arch

    assert check_arch("sm_90") == 90
    with pytest.raises(ConfigError, match="not supported"):
        check_arch("sm_50")
    with pytest.raises(ConfigError, match="sm_90"):
        check_arch("volta")


def test_gpu_knobs_are_validated():
    v = Variant(Algorithm.DIRECT, Compression.DENSE, knobs={"tile_w": 8})
    with pytest.raises(ConfigError, match="allowed: thr_k"):
        resolve_gpu_knobs(SPEC, v)
    bad = Variant(Algorithm.GEMM, Compression.FLOAT16, knobs={"acc_bits": 8})
    with pytest.raises(ConfigError, match="acc_bits"):
        resolve_gpu_knobs(SPEC, bad)
    fp16 = resolve_gpu_knobs(SPEC, Variant(Algorithm.GEMM, Compression.FLOAT16))
    assert fp16["acc_bits"] == 32


def test_cpu_device_gets_no_cuda_tasks():
    from dlas_predict.measure.gpu_bundle import GpuTask

    with pytest.raises(DlasError, match="not a CUDA GPU"):
        GpuTask.make(SPEC, Variant(Algorithm.DIRECT, Compression.DENSE),
                     get_device("local", with_target=False))


def _small_bundle(tmp_path: Path) -> tuple[Path, list]:
    from dlas_predict.measure.gpu_bundle import GpuTask, write_bundle

    dev = get_device("h100")
    tasks = [GpuTask.make(SPEC, Variant(a, Compression.DENSE), dev) for a in Algorithm]
    out = tmp_path / "bundle"
    counts = write_bundle(tasks, dev, out, chunk_size=2)
    assert counts == {"planned": 3, "skipped": 0, "built": 3, "failed": 0}
    return out, tasks


def test_bundle_is_resumable_and_results_import_once(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu_bundle import import_results, write_bundle

    out, tasks = _small_bundle(tmp_path)
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    assert {ln["key"] for ln in lines} == {t.key for t in tasks}
    assert len(list(out.glob("chunk-*.so"))) == 2
    again = write_bundle(tasks, get_device("h100"), out, chunk_size=2)
    assert again["built"] == 0 and again["skipped"] == 3
    # what measure.gpu_run writes: one success, one failure, and a line cut short by a kill
    ok, bad = lines[0], lines[1]
    results = tmp_path / "results.jsonl"
    results.write_text(
        json.dumps({**ok, "run_secs": [2e-5, 3e-5, 2.5e-5], "number": 10, "verified": True,
                    "max_error": 1e-6, "error": None}) + "\n"
        + json.dumps({**bad, "error": "timeout: no result within 60 s; worker killed"}) + "\n"
        + '{"key": "cut sh')
    with CorpusStore(tmp_path / "s.sqlite") as db:
        counts = import_results(out, results, db)
        assert counts == {"records": 2, "failed": 1, "skipped": 0}
        recs = {r.key: r for r in db.results()}
        assert recs[ok["key"]].ok and recs[ok["key"]].median_s == pytest.approx(2.5e-5)
        assert recs[ok["key"]].device == "h100"
        assert recs[ok["key"]].fingerprint == get_device("h100").fingerprint
        assert "timeout" in recs[bad["key"]].error
        assert import_results(out, results, db)["records"] == 0


@pytest.mark.slow
def test_gpu_runner_refuses_without_a_gpu_or_a_bundle(tmp_path):
    import tvm

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "measure.gpu_run", str(tmp_path), "--out",
                           str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Error: " in proc.stderr and "not a kernel bundle" in \
        proc.stderr
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU: the no-GPU refusal cannot be seen here")
    out, _ = _small_bundle(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "measure.gpu_run", str(out), "--out",
                           str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode != 0
    assert "Error: no CUDA GPU" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def _has_gpu() -> bool:
    try:
        import tvm

        from dlas_predict.measure.gpu_run import load_cuda_runtime

        load_cuda_runtime()
        return bool(tvm.cuda(0).exist)
    except (ImportError, SystemExit, OSError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine: the kernels are "
                    "checked against the numpy reference on the GPU machine only")
def test_kernels_match_numpy_reference_on_the_gpu(tmp_path):
    from dlas_predict.measure.gpu_run import run_bundle

    out, tasks = _small_bundle(tmp_path)
    counts = run_bundle(out, tmp_path / "r.jsonl", workers=1, allow_other_gpu=True,
                        log=lambda s: None)
    assert counts["measured"] == len(tasks) and counts["failed"] == 0


def test_recommend_answers_for_the_gpu_from_the_shipped_model():
    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["recommend", "zoo:resnet18-cifar", "--device", "h100",
                                   "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["device"] == "h100" and out["candidates"]
    assert any("no whole-network measurements" in n for n in out["notes"])
    bad = CliRunner().invoke(app, ["recommend", "zoo:resnet18-cifar", "--device", "h100",
                                   "--validate", "1"])
    assert bad.exit_code != 0 and "Error: " in bad.output and "GPU" in bad.output
