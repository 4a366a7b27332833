"""CUDA kernels: what can be checked without a GPU (schedules lower, thread bindings verify,
CUDA source is produced), the bundle round trip, and the GPU runner's refusals. The one test
that runs kernels on a GPU skips where there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlas_predict.space.config import GRID_ALGORITHMS, Algorithm, Compression, ConvSpec, Variant
from dlas_predict.space.devices import get_device
from dlas_predict.errors import ConfigError, DlasError
from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

ROOT = Path(__file__).resolve().parent.parent
SPEC = ConvSpec.parse("C=8,H=9,W=9,K=16,R=3,S=3,stride=1,pad=1")
DEPTHWISE = ConvSpec.parse("C=8,H=8,W=8,K=8,R=3,S=3,stride=2,pad=1,groups=8")


def _kernel(spec, alg, comp, **knobs):
    from dlas_predict.measure.kernels.spec import KernelSpec

    ratio = 0.7 if comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING) else 0.0
    v = Variant(alg, comp, ratio, knobs=knobs)
    return KernelSpec(spec, alg, v.sparse, v.dtype, resolve_gpu_knobs(spec, v))


def _source(kernels: dict) -> str:
    from dlas_predict.measure.kernels import cuda

    return cuda.cuda_source(cuda.build(kernels, cuda.cuda_target("sm_90")))


@pytest.mark.parametrize("alg", GRID_ALGORITHMS)
@pytest.mark.parametrize("spec", [SPEC, DEPTHWISE], ids=["conv", "depthwise"])
@pytest.mark.slow
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


@pytest.mark.slow
def test_int8_gemm_with_dp4a_sums_packed_words_with_the_instruction():
    src = _source({"plain": _kernel(SPEC, Algorithm.GEMM, Compression.INT8),
                   "packed": _kernel(SPEC, Algorithm.GEMM, Compression.INT8, dp4a=1)})
    body = src.split("packed_kernel", 1)[1]
    assert "__dp4a(" in body
    assert "__dp4a(" not in src.split("packed_kernel", 1)[0]


@pytest.mark.parametrize("spec", [SPEC, ConvSpec.parse("C=5,H=7,W=6,K=6,R=3,S=3,stride=2,pad=1"),
                                  ConvSpec.parse("C=6,H=5,W=5,K=6,R=1,S=1,groups=3")],
                         ids=["conv", "odd-reduction", "grouped"])
def test_dp4a_packing_matches_the_numpy_reference(spec):
    """The packed words and their sums, with dp4a written in shifts and multiplies (a CPU
    runs it): bit-exact against the int8 reference, a reduction not a multiple of four
    included."""
    import tvm
    from tvm import te

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.cpu import _gemm_compute, pack_weights
    from dlas_predict.measure.kernels.reference import conv2d_reference, make_inputs

    ks = _kernel(spec, Algorithm.GEMM, Compression.INT8, dp4a=1)
    func = tvm.compile(te.create_prim_func(_gemm_compute(ks, native_dp4a=False)),
                       target="llvm")
    x, w = make_inputs(spec, DType.INT8, seed=3)
    packed = pack_weights(ks, w)
    assert packed[0].dtype == np.int32 and packed[0].shape == (spec.K, -(-(
        spec.C // spec.groups) * spec.R * spec.S // 4))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((1, spec.K, spec.OH * spec.OW), np.int8), dev)
    func(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(packed[0], dev), out)
    ref = conv2d_reference(x, w, spec, DType.INT8)
    assert np.array_equal(out.numpy().reshape(ref.shape), ref)


def test_dp4a_is_a_knob_of_dense_int8_gemm_only():
    v = Variant(Algorithm.GEMM, Compression.INT8, 0.0, knobs={"dp4a": 1})
    assert resolve_gpu_knobs(SPEC, v)["dp4a"] == 1
    assert "dp4a" not in resolve_gpu_knobs(SPEC, Variant(Algorithm.GEMM, Compression.INT8))
    for alg, comp in ((Algorithm.DIRECT, Compression.INT8), (Algorithm.GEMM, Compression.DENSE)):
        with pytest.raises(ConfigError, match="dp4a"):
            resolve_gpu_knobs(SPEC, Variant(alg, comp, 0.0, knobs={"dp4a": 1}))
    with pytest.raises(ConfigError, match="dp4a must be 0 or 1"):
        resolve_gpu_knobs(SPEC, Variant(Algorithm.GEMM, Compression.INT8, 0.0,
                                        knobs={"dp4a": 2}))


@pytest.mark.parametrize("alg", GRID_ALGORITHMS)
def test_csr_kernels_are_row_parallel(alg):
    src = _source({"csr": _kernel(SPEC, alg, Compression.WEIGHT_PRUNING),
                   "chan": _kernel(SPEC, alg, Compression.CHANNEL_PRUNING)})
    assert "w_indptr" in src and "threadIdx.x" in src and "blockIdx.x" in src


def test_thread_bindings_verify_within_gpu_limits():
    from dlas_predict.measure.kernels import cuda

    kernels = {f"k{i}": _kernel(SPEC, alg, Compression.DENSE)
               for i, alg in enumerate(GRID_ALGORITHMS)}
    mod = cuda.kernels_module(kernels)
    assert cuda.verify(mod) == []


def test_unsupported_or_malformed_arch_is_a_clear_error():
    from dlas_predict.measure.kernels.cuda import check_arch

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
    from dlas_predict.measure.gpu.bundle import GpuTask

    with pytest.raises(DlasError, match="not a CUDA GPU"):
        GpuTask.make(SPEC, Variant(Algorithm.DIRECT, Compression.DENSE),
                     get_device("local", with_target=False))


def _small_bundle(tmp_path: Path) -> tuple[Path, list]:
    from dlas_predict.measure.gpu.bundle import GpuTask, write_bundle

    dev = get_device("h100")
    tasks = [GpuTask.make(SPEC, Variant(a, Compression.DENSE), dev) for a in GRID_ALGORITHMS]
    out = tmp_path / "bundle"
    counts = write_bundle(tasks, dev, out, chunk_size=2)
    assert counts == {"planned": 3, "skipped": 0, "built": 3, "failed": 0}
    return out, tasks


@pytest.mark.slow
def test_bundle_is_resumable_and_results_import_once(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu.bundle import write_bundle
    from dlas_predict.corpus.gpu import import_results

    out, tasks = _small_bundle(tmp_path)
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    assert {ln["key"] for ln in lines} == {t.key for t in tasks}
    assert len(list(out.glob("chunk-*.so"))) == 2
    again = write_bundle(tasks, get_device("h100"), out, chunk_size=2)
    assert again["built"] == 0 and again["skipped"] == 3
    # what dlas_predict.measure.gpu.run writes: one success, one failure, and a line cut short by a
    # kill
    ok, bad = lines[0], lines[1]
    results = tmp_path / "results.jsonl"
    results.write_text(
        json.dumps({**ok, "run_secs": [2e-5, 3e-5, 2.5e-5], "number": 10, "verified": True,
                    "max_error": 1e-6, "error": None}) + "\n"
        + json.dumps({**bad, "error": "timeout: no result within 60 s; worker killed"}) + "\n"
        + '{"key": "cut sh')
    with CorpusStore(tmp_path / "s.sqlite") as db:
        counts = import_results(out, results, db)
        assert counts == {"records": 2, "failed": 1, "skipped": 0, "incomplete_searches": 0,
                          "networks": 0, "network_failures": 0}
        recs = {r.key: r for r in db.results()}
        assert recs[ok["key"]].ok and recs[ok["key"]].median_s == pytest.approx(2.5e-5)
        assert recs[ok["key"]].device == "h100"
        assert recs[ok["key"]].fingerprint == get_device("h100").fingerprint
        assert "timeout" in recs[bad["key"]].error
        assert import_results(out, results, db)["records"] == 0
        # the failed kernel measured by a later run: its failure gives way, once
        retried = tmp_path / "retried.jsonl"
        retried.write_text(json.dumps({**bad, "run_secs": [4e-5] * 3, "number": 10,
                                       "verified": True, "max_error": 1e-6,
                                       "error": None}) + "\n")
        assert import_results(out, retried, db)["records"] == 1
        assert import_results(out, retried, db)["records"] == 0
        fixed = {r.key: r for r in db.results()}[bad["key"]]
        assert fixed.ok and fixed.median_s == pytest.approx(4e-5)
        # and a success is never replaced by a failure
        assert import_results(out, results, db)["records"] == 0
        assert {r.key: r for r in db.results()}[bad["key"]].ok


DEPTHWISE_16 = ConvSpec.parse("C=128,H=16,W=16,K=128,R=3,S=3,stride=1,pad=1,groups=128")
WIDE_2 = ConvSpec.parse("C=512,H=2,W=2,K=512,R=3,S=3,stride=1,pad=1")


@pytest.mark.parametrize("spec", [DEPTHWISE_16, WIDE_2, SPEC], ids=["dw", "wide", "conv"])
@pytest.mark.parametrize("alg", GRID_ALGORITHMS)
def test_default_tiles_fit_a_blocks_shared_memory_within_the_estimate(spec, alg):
    from dlas_predict.measure.kernels import cuda
    from dlas_predict.measure.kernels.knobs import gpu_shared_estimate

    ks = _kernel(spec, alg, Compression.DENSE)
    used = cuda.shared_bytes(_source({"k": ks}))
    assert 0 < max(used.values()) <= cuda.MAX_STATIC_SHARED
    estimate = gpu_shared_estimate(spec, alg, False, ks.knobs)
    assert estimate >= max(used.values()) >= 0.6 * estimate


def test_a_kernel_over_the_shared_memory_fails_alone_in_its_bundle(tmp_path):
    from dlas_predict.measure.gpu.bundle import GpuTask, write_bundle

    dev = get_device("h100")
    over = GpuTask.make(DEPTHWISE_16, Variant(Algorithm.GEMM, Compression.DENSE, knobs={
        "thr_k": 8, "reg_k": 4, "thr_p": 16, "reg_p": 4, "tile_rc": 9}), dev)
    fine = GpuTask.make(DEPTHWISE_16, Variant(Algorithm.DIRECT, Compression.DENSE), dev)
    counts = write_bundle([over, fine], dev, tmp_path / "b", chunk_size=8)
    assert counts["built"] == 1 and counts["failed"] == 1
    failure = json.loads((tmp_path / "b" / "build_failures.jsonl").read_text())
    assert failure["key"] == over.key and "74880 bytes of static shared memory" in \
        failure["error"]
    built = json.loads((tmp_path / "b" / "manifest.jsonl").read_text())
    assert built["key"] == fine.key and (tmp_path / "b" / built["chunk"]).is_file()


def _fail_second_kernel(monkeypatch) -> None:
    """Make TVM's CUDA build fail, as its lowering does, on the second kernel of a chunk."""
    from dlas_predict.measure.kernels import cuda

    real = cuda.build

    def build(funcs, target):
        if "k0000_001" in funcs:
            raise RuntimeError("InternalError: Check failed: (eval_vec_) is false:")
        return real(funcs, target)

    monkeypatch.setattr(cuda, "build", build)


@pytest.mark.slow
def test_a_kernel_over_the_shared_memory_fails_beside_one_tvm_cannot_compile(tmp_path,
                                                                              monkeypatch):
    from dlas_predict.measure.gpu.bundle import GpuTask, write_bundle

    dev = get_device("h100")
    over = GpuTask.make(DEPTHWISE_16, Variant(Algorithm.GEMM, Compression.DENSE, knobs={
        "thr_k": 8, "reg_k": 4, "thr_p": 16, "reg_p": 4, "tile_rc": 9}), dev)
    fine = [GpuTask.make(DEPTHWISE_16, Variant(a, Compression.DENSE), dev)
            for a in (Algorithm.DIRECT, Algorithm.SPATIAL_PACK)]
    _fail_second_kernel(monkeypatch)
    counts = write_bundle([fine[0], fine[1], over], dev, tmp_path / "b", chunk_size=8)
    assert counts["built"] == 1 and counts["failed"] == 2
    failures = {json.loads(t)["key"]: json.loads(t)["error"] for t in
                (tmp_path / "b" / "build_failures.jsonl").read_text().splitlines()}
    assert "eval_vec_" in failures[fine[1].key]
    assert "74880 bytes of static shared memory" in failures[over.key]
    built = json.loads((tmp_path / "b" / "manifest.jsonl").read_text())
    assert built["key"] == fine[0].key


@pytest.mark.slow
def test_a_kernel_tvm_cannot_compile_fails_alone_in_its_bundle(tmp_path, monkeypatch):
    from dlas_predict.measure.gpu.bundle import GpuTask, write_bundle

    dev = get_device("h100")
    tasks = [GpuTask.make(SPEC, Variant(a, Compression.DENSE), dev) for a in GRID_ALGORITHMS]
    _fail_second_kernel(monkeypatch)
    counts = write_bundle(tasks, dev, tmp_path / "b", chunk_size=8)
    assert counts["built"] == 2 and counts["failed"] == 1
    failure = json.loads((tmp_path / "b" / "build_failures.jsonl").read_text())
    assert failure["key"] == tasks[1].key and "eval_vec_" in failure["error"]
    built = [json.loads(t) for t in (tmp_path / "b" / "manifest.jsonl").read_text()
             .splitlines()]
    assert [b["key"] for b in built] == [tasks[0].key, tasks[2].key]
    assert (tmp_path / "b" / built[0]["chunk"]).is_file()


@pytest.mark.parametrize("alg", GRID_ALGORITHMS)
@pytest.mark.parametrize("comp", [Compression.DENSE, Compression.FLOAT16,
                                  Compression.WEIGHT_PRUNING])
def test_knob_search_space_starts_untuned_and_stays_within_the_gpus_limits(alg, comp):
    from dlas_predict.measure.kernels.knobs import (GPU_SHARED_BYTES, gpu_search_space,
                                                    gpu_shared_estimate)

    v = Variant(alg, comp, 0.7 if comp is Compression.WEIGHT_PRUNING else 0.0)
    space = gpu_search_space(WIDE_2, v, 10)
    assert space[0] == resolve_gpu_knobs(WIDE_2, v) and 1 < len(space) <= 10
    assert len({tuple(sorted(k.items())) for k in space}) == len(space)
    assert space == gpu_search_space(WIDE_2, v, 10)  # seeded: the same bundle twice
    for knobs in space:
        assert resolve_gpu_knobs(WIDE_2, Variant(alg, comp, v.ratio, knobs=knobs)) == knobs
        assert gpu_shared_estimate(WIDE_2, alg, v.sparse, knobs) <= GPU_SHARED_BYTES
    if comp is Compression.FLOAT16:
        assert {k["acc_bits"] for k in space} <= {16, 32}


@pytest.mark.slow
def test_a_knob_search_imports_as_one_tuned_record_once_every_candidate_ran(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu.bundle import KNOB_SEARCH, GpuTask, search_tasks, write_bundle
    from dlas_predict.corpus.gpu import import_results

    dev = get_device("h100")
    tasks = search_tasks(SPEC, Variant(Algorithm.GEMM, Compression.DENSE), dev, 4)
    assert len(tasks) == 4 and len({t.search for t in tasks}) == 1
    out = tmp_path / "b"
    write_bundle(tasks, dev, out, chunk_size=8)
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    secs = [[4e-5] * 3, [1e-5] * 3, [2e-5] * 3, [3e-5] * 3]
    rows = [{**ln, "run_secs": s, "number": 10, "verified": True, "max_error": 0.0,
             "error": None, "compile_s": 0.5, "measure_s": 0.1} for ln, s in zip(lines, secs)]
    rows[1].update(verified=False, error="verification failed: max error 0.5")
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    with CorpusStore(tmp_path / "s.sqlite") as db:
        assert import_results(out, results, db) == {
            "records": 0, "failed": 0, "skipped": 0, "incomplete_searches": 1,
            "networks": 0, "network_failures": 0}
        results.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert import_results(out, results, db)["records"] == 2
        recs = {r.variant.tuning.value: r for r in db.results()}
    rec, first = recs["tuned"], recs["untuned"]
    assert first.key == GpuTask.make(SPEC, Variant(Algorithm.GEMM, Compression.DENSE),
                                     dev).key and first.median_s == pytest.approx(4e-5)
    assert rec.key == tasks[0].search and rec.ok
    assert rec.knobs == lines[2]["knobs"] and rec.median_s == pytest.approx(2e-5)
    assert rec.trials == 4 and rec.tuner == KNOB_SEARCH
    assert rec.tuning_seconds == pytest.approx(4 * 0.6)


def test_a_modules_cubin_is_compiled_once_across_processes(tmp_path):
    from dlas_predict.measure.gpu.run import _cached_cubin

    calls = []

    def compile_cuda(code, **kw):  # stands in for NVRTC
        calls.append((code, kw["arch"]))
        return bytearray(f"cubin of {code} for {kw['arch']}".encode())

    first = _cached_cubin(tmp_path / "c", "__global__ void k() {}", "sm_90", compile_cuda)
    again = _cached_cubin(tmp_path / "c", "__global__ void k() {}", "sm_90", compile_cuda)
    other = _cached_cubin(tmp_path / "c", "__global__ void k() {}", "sm_80", compile_cuda)
    assert first == again == bytearray(b"cubin of __global__ void k() {} for sm_90")
    assert other != first and len(calls) == 2
    assert sorted(p.suffix for p in (tmp_path / "c").iterdir()) == [".cubin", ".cubin"]


def test_a_gpu_error_keeps_its_message_line():
    from dlas_predict.measure.gpu.run import error_text

    exc = RuntimeError("NVRTC compilation failed:\nptxas info : Used 121 registers\n"
                       " ptxas error   : Entry function 'k_kernel_1' uses too much shared "
                       "data (0x12480 bytes, 0xc000 max)\n  \n")
    assert error_text(exc) == ("RuntimeError: ptxas error   : Entry function 'k_kernel_1' uses too much shared data "
                               "(0x12480 bytes, 0xc000 max)")
    assert error_text(RuntimeError("")) == "RuntimeError: (no message)"


@pytest.mark.slow
def test_gpu_runner_refuses_without_a_gpu_or_a_bundle(tmp_path):
    import tvm

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "dlas_predict.measure.gpu.run", str(tmp_path),
                           "--out", str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "Error: " in proc.stderr and "not a kernel bundle" in \
        proc.stderr
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU: the no-GPU refusal cannot be seen here")
    out, _ = _small_bundle(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "dlas_predict.measure.gpu.run", str(out), "--out",
                           str(tmp_path / "r.jsonl")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode != 0
    assert "Error: no CUDA GPU" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def _has_gpu() -> bool:
    try:
        import tvm

        from dlas_predict.measure.gpu.run import load_cuda_runtime

        load_cuda_runtime()
        return bool(tvm.cuda(0).exist)
    except (ImportError, SystemExit, OSError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine: the kernels are "
                    "checked against the numpy reference on the GPU machine only")
def test_kernels_match_numpy_reference_on_the_gpu(tmp_path):
    from dlas_predict.measure.gpu.run import run_bundle

    out, tasks = _small_bundle(tmp_path)
    counts = run_bundle(out, tmp_path / "r.jsonl", workers=1, allow_other_gpu=True,
                        log=lambda s: None)
    assert counts["measured"] == len(tasks) and counts["failed"] == 0


@pytest.mark.slow
def test_recommend_answers_for_the_gpu_from_the_shipped_model(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from cli import app
    from dlas_predict.paths import MODELS_STORE

    def notes(*extra):
        res = CliRunner().invoke(app, ["recommend", "zoo:resnet18-cifar", "--device", "h100",
                                       "--top", "3", "--json", *extra])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["device"] == "h100" and out["candidates"]
        return out["notes"]

    # the shipped model has a network model (its whole networks); without one, the
    # latencies are conv sums, and the answer says so
    assert not any("no whole-network measurements" in n for n in notes())
    layer_only = tmp_path / "h100"
    shutil.copytree(MODELS_STORE / "h100", layer_only)
    (layer_only / "network.json").unlink()
    assert any("no whole-network measurements" in n
               for n in notes("--models", str(layer_only)))
    bad = CliRunner().invoke(app, ["recommend", "zoo:resnet18-cifar", "--device", "h100",
                                   "--validate", "1"])
    assert bad.exit_code != 0 and "Error: " in bad.output and "GPU" in bad.output


@pytest.mark.slow
def test_results_from_another_gpu_are_filed_under_the_gpu_that_measured_them(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu.bundle import GpuTask, search_tasks, write_bundle
    from dlas_predict.corpus.gpu import import_results
    from dlas_predict.space.devices import gpu_fingerprint

    h100, h200 = get_device("h100"), get_device("h200")
    plain = GpuTask.make(SPEC, Variant(Algorithm.DIRECT, Compression.DENSE), h100)
    search = search_tasks(SPEC, Variant(Algorithm.GEMM, Compression.DENSE), h100, 3)
    out = tmp_path / "b"
    write_bundle([plain, *search], h100, out, chunk_size=8)
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    for ln in lines:
        ln.pop("search_trials", None)  # a bundle whose candidates do not say their search's trials
    results = tmp_path / "run" / "r.jsonl"
    results.parent.mkdir()
    results.write_text("".join(json.dumps({**ln, "run_secs": [1e-5 * (i + 1)] * 3,
                                           "number": 10, "verified": True, "error": None})
                               + "\n" for i, ln in enumerate(lines)))
    (results.parent / "gpu.json").write_text(json.dumps(h200.gpu) + "\n")
    assert gpu_fingerprint(h200.gpu) == h200.fingerprint
    with CorpusStore(tmp_path / "s.sqlite") as db:
        with pytest.raises(DlasError, match="`device`"):
            import_results(out, results, db)
        with pytest.raises(DlasError, match="fingerprint"):
            import_results(out, results, db, get_device("local", with_target=False))
        counts = import_results(out, results, db, h200)
        recs = {r.key: r for r in db.results()}
    # the plain kernel, the search's tuned record and its untuned first candidate
    assert counts["records"] == 3 and {r.device for r in recs.values()} == {"h200"}
    again = search_tasks(SPEC, Variant(Algorithm.GEMM, Compression.DENSE), h200, 3)
    untuned = GpuTask.make(SPEC, Variant(Algorithm.GEMM, Compression.DENSE), h200)
    assert set(recs) == {GpuTask.make(SPEC, plain.variant, h200).key, again[0].search,
                         untuned.key}
    assert recs[again[0].search].trials == 3 and recs[untuned.key].tuning_seconds is None
    assert recs[untuned.key].median_s == pytest.approx(2e-5)  # the search's first candidate


def test_recommend_prices_the_h200s_tuned_kernels_at_their_search_size():
    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["recommend", "zoo:mobilenetv1-cifar", "--device", "h200",
                                   "--top", "40", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    tuned = [c for c in out["candidates"] if c["config"]["tuning"] == "tuned"]
    assert tuned and all(c["predicted_tuning_s"] > 0 for c in tuned)
    assert any("knob searches of 8 trials, not 64" in n for n in out["notes"])
    # MetaSchedule's rounds tuned its 3×3 dense layers: the note names them too
    assert any("MetaSchedule searches of 32 trials ran too" in n for n in out["notes"])


@pytest.mark.parametrize("dtype,sparse", [("float32", False), ("float32", True),
                                          ("float16", False), ("int8", False)])
@pytest.mark.slow
def test_a_whole_network_lowers_to_cuda_with_our_kernels_and_every_op_on_the_gpu(
        tmp_path, dtype, sparse):
    import onnx
    import tvm

    from dlas_predict.measure.kernels import cuda
    from dlas_predict.measure.networks.build import LayerChoice, lower_cuda
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.space.config import DType

    model = build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 16, "input": 16,
                          "block": "residual", "downsample": 1})
    n = sum(1 for node in model.graph.node if node.op_type == "Conv")
    algs = [GRID_ALGORITHMS[i % 3] for i in range(n)]  # a per-layer plan of every algorithm
    choices = [LayerChoice(a, sparse) for a in algs]
    dt = DType.parse(dtype)
    scales = [(0.05, 0.05)] * n if dt is DType.INT8 else None
    target = cuda.cuda_target("sm_90")
    mod = lower_cuda(model, model.graph.input[0].name, (1, 3, 16, 16), dt, choices, target,
                     scales=scales)
    convs = [gv.name_hint for gv, f in mod.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint.startswith("conv")]
    assert convs and all(("_csr" in c) == sparse for c in convs)
    assert str(mod["main"]).count("R.call_tir(conv") == n  # one shape's layers share one
    exe = tvm.compile(mod, target=target)  # refuses a GPU function with unbound loops
    src = cuda.cuda_source(exe)  # the VM's host module imports the CUDA one
    used = cuda.shared_bytes(src)
    assert {c for c in convs} <= {f.split("_kernel")[0] for f in used}
    assert max(used.values()) <= cuda.MAX_STATIC_SHARED
    assert "blockIdx.x" in src and "threadIdx.x" in src


@pytest.mark.slow
def test_a_whole_network_bundle_builds_each_configuration_and_imports_as_network_records(
        tmp_path):
    import onnx

    from dlas_predict.corpus.collect import plan_networks as plan_whole, whole_network_plans
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.corpus.gpu import import_results
    from dlas_predict.measure.gpu.networks import write_network_bundle
    from dlas_predict.networks.generate import FAMILIES, build

    path = tmp_path / "net.onnx"
    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 16, "input": 16,
                            "block": "residual"}), path)
    h100, h200 = get_device("h100"), get_device("h200")
    nets = plan_whole([str(path)], [Compression.DENSE, Compression.INT8], 0.9)
    with CorpusStore(tmp_path / "kernels.sqlite") as db:
        plans = whole_network_plans(nets, [Algorithm.DIRECT, Algorithm.SPATIAL_PACK], 0.9,
                                    db, h100, backends=("tvm", "onnxruntime"))
    out = tmp_path / "b"
    counts = write_network_bundle(plans, h100, out)
    assert counts == {"planned": 6, "skipped": 2, "built": 4, "failed": 0}  # 2 onnxruntime
    assert write_network_bundle(plans, h100, out)["built"] == 0  # resumable
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    assert all((out / ln["chunk"]).is_file() and (out / ln["check"]).is_file()
               for ln in lines)
    assert {(ln["config"], ln["algorithm"]) for ln in lines} == {
        ("dense", "direct"), ("dense", "spatial_pack"), ("int8", "direct"),
        ("int8", "spatial_pack")}
    # what dlas_predict.measure.gpu.run writes on an H200 for a bundle built for the H100
    results = tmp_path / "run" / "r.jsonl"
    results.parent.mkdir()
    rows = [{**{k: v for k, v in ln.items() if k not in ("chunk", "check")},
             "run_secs": [1e-4 * (i + 1)] * 5, "number": 10, "verified": True,
             "max_error": 1e-6, "top1_agreement": 1.0, "error": None}
            for i, ln in enumerate(lines)]
    # a float32 build off onnxruntime is a failure; an int8 one that loses top-1 agreement is
    # an accuracy figure: timed, unverified
    f32 = next(i for i, r in enumerate(rows) if r["dtype"] == "float32")
    i8 = next(i for i, r in enumerate(rows) if r["dtype"] == "int8")
    for i in (f32, i8):
        rows[i].update(verified=False, error="verification failed: max error 3, top-1 "
                       "agreement 50% against onnxruntime")
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (results.parent / "gpu.json").write_text(json.dumps(h200.gpu) + "\n")
    with CorpusStore(tmp_path / "s.sqlite") as db:
        counts = import_results(out, results, db, h200)
        recs = {r.key: r for r in db.network_records()}
    assert counts["networks"] == 4 and counts["network_failures"] == 1
    want = {p.key(h200) for p in plans if p.backend == "tvm"}
    assert set(recs) == want and {r.device for r in recs.values()} == {"h200"}
    ok = [r for r in recs.values() if r.error is None]
    assert len(ok) == 3 and all(r.details["engine"] == "cuda" for r in ok)
    assert sorted(r.median_s for r in ok) == pytest.approx(
        sorted(1e-4 * (i + 1) for i in range(4) if i != f32))
    assert [r.dtype for r in ok if r.verified is False] == ["int8"]
    assert [r.dtype for r in recs.values() if r.error] == ["float32"]


@pytest.mark.parametrize("features", [1, 8])
def test_a_matmul_over_one_feature_becomes_a_product_for_the_gpu(features):
    """dlight's GPU reduction schedule adds a fused bias twice when a matmul reduces over
    one element (a channel-pruned classifier reading one feature): such a matmul is lowered
    as the broadcast product, which computes the same; others stay matmuls."""
    import tvm
    from tvm import relax

    from dlas_predict.measure.networks.build import unit_matmuls

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, features), "float32"))
    w = np.random.default_rng(0).normal(size=(features, 10)).astype("float32")
    b = np.random.default_rng(1).normal(size=(10,)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            out = bb.emit_output(relax.op.add(y, relax.const(b)))
        bb.emit_func_output(out)
    mod = unit_matmuls(bb.get())
    text = mod["main"].script()
    assert ("R.matmul" in text) == (features > 1) and ("R.multiply" in text) == (features == 1)
    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    xs = np.random.default_rng(2).normal(size=(2, features)).astype("float32")
    got = vm["main"](tvm.runtime.tensor(xs, tvm.cpu())).numpy()
    np.testing.assert_allclose(got, xs @ w + b, rtol=1e-5, atol=1e-5)


def test_a_matmul_whose_reduction_is_not_known_stays_a_matmul():
    import tvm
    from tvm import relax

    from dlas_predict.measure.networks.build import unit_matmuls

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, n), "float32"))
    w = relax.Var("w", relax.TensorType((n, 10), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    assert "R.matmul" in unit_matmuls(bb.get())["main"].script()


def test_timing_weights_keep_shapes_and_zeros_and_compress():
    import lzma

    import onnx
    from onnx import helper, numpy_helper

    from dlas_predict.measure.networks.runner import TIMING_PERIOD, timing_weights

    rng = np.random.default_rng(0)
    big = rng.normal(size=(64, 32, 3, 3)).astype(np.float32)
    big[np.abs(big) < 1.0] = 0.0  # pruned: about two thirds zeros
    small = rng.normal(size=(8, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "wb"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["x2", "ws"], ["y2"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 32, 8, 8]),
         helper.make_tensor_value_info("x2", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(big, "wb"), numpy_helper.from_array(small, "ws")])
    model = helper.make_model(graph)
    assert timing_weights(model) == 1  # the small tensor keeps its values
    got = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(got["ws"], small)
    w = got["wb"]
    assert w.shape == big.shape and w.dtype == np.float32
    assert np.array_equal(w == 0, big == 0)  # the pruning mask is the model's
    assert len(np.unique(np.abs(w[w != 0]))) <= 4
    rms = np.sqrt(np.mean(big[big != 0] ** 2))  # the layer's gain is kept
    assert np.sqrt(np.mean(w[w != 0] ** 2)) == pytest.approx(rms, rel=0.1)
    flat, both = w.reshape(-1), (w.reshape(-1)[:-TIMING_PERIOD] != 0) & (
        w.reshape(-1)[TIMING_PERIOD:] != 0)
    assert np.array_equal(flat[:-TIMING_PERIOD][both], flat[TIMING_PERIOD:][both])
    assert len(lzma.compress(w.tobytes())) < len(lzma.compress(big.tobytes())) / 2
    # a dense tensor becomes the pattern itself, in any layout that keeps runs of it
    dense = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "d",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.normal(size=(256, 32, 3, 3)).astype(np.float32), "w")]))
    timing_weights(dense)
    wd = numpy_helper.to_array(dense.graph.initializer[0])
    packed = np.ascontiguousarray(wd.reshape(16, 16, 32, 3, 3).transpose(0, 2, 3, 4, 1))
    for layout in (wd, packed):  # as direct reads it, and as spatial pack's tiles
        assert len(lzma.compress(layout.tobytes())) < layout.nbytes / 20


@pytest.mark.parametrize("timing,family", [(False, "cnn"), (True, "cnn"), (True, "rnn")],
                         ids=["model-weights", "timing-weights", "token-ids"])
@pytest.mark.slow
def test_the_gpu_runners_network_check_and_timing_run_a_network_on_any_device(tmp_path,
                                                                              timing, family):
    """measure_network's check and timing, driven here on this CPU (the GPU machine runs the
    same code on a CUDA build), with the model's weights or timing weights (the check is
    computed on the weights the build has); a language model is fed its token ids as
    integers."""
    import onnx
    import tvm

    from dlas_predict.measure.gpu.networks import _Preparer, measure_network
    from dlas_predict.measure.networks.build import LayerChoice, build as build_net
    from dlas_predict.measure.networks.plans import uniform_plan
    from dlas_predict.networks.generate import FAMILIES, build
    from dlas_predict.space.config import DType

    from dlas_predict.networks.matrix import grid_form

    path = tmp_path / "net.onnx"
    small = {"cnn": {"layers": 2, "kernels": 32, "input": 12},
             "rnn": {"layers": 1, "hidden": 16, "embedding": 8, "vocab": 50, "seq": 4}}
    onnx.save(build(family, {**FAMILIES[family], **small[family]}), path)
    path = grid_form(path)
    n = sum(1 for node in onnx.load(str(path)).graph.node if node.op_type == "Conv")
    plan = uniform_plan(str(path), "net", Compression.DENSE, None, "direct", n)
    prep_of = _Preparer(timing)
    try:
        prep = prep_of(plan)
        assert any("timing weights" in note for note in prep.notes) == timing
        exe = build_net(onnx.load(str(prep.path)), prep.input_name, tuple(prep.input_shape),
                        DType.FLOAT32, [LayerChoice(Algorithm.DIRECT, False)] * n, "llvm",
                        list(prep.specs))
        exe.export_library(str(tmp_path / "net.so"))
        (tmp_path / "net.check.npz").write_bytes(prep.check.read_bytes())
    finally:
        prep_of.close()
    mod = tvm.runtime.load_module(str(tmp_path / "net.so"))
    line = {"check": "net.check.npz", "dtype": "float32"}
    proto = {"max_repeats": 5, "min_repeats": 2, "min_repeat_ms": 0.1, "time_budget_s": 0.05}
    got = measure_network(mod, line, tmp_path, tvm.cpu(), proto)
    assert got["verified"] and got["error"] is None and got["top1_agreement"] == 1.0
    assert 2 <= len(got["run_secs"]) <= 5 and min(got["run_secs"]) > 0
    bad = tmp_path / "bad.check.npz"
    check = dict(np.load(tmp_path / "net.check.npz"))
    np.savez(bad, x=check["x"], y=check["y"] + 1.0)
    got = measure_network(mod, {**line, "check": "bad.check.npz"}, tmp_path, tvm.cpu(), proto)
    assert not got["verified"] and "verification failed" in got["error"]


@pytest.mark.parametrize("args,needle", [
    (["--timing-weights"], "--timing-weights applies to whole networks"),
    (["--whole-network", "--trials", "1"], "--trials must be 0"),
])
def test_bundle_refuses_options_that_do_not_go_together(tmp_path, args, needle):
    from conftest import assert_clean_error, run_cli

    assert_clean_error(run_cli("bundle", "zoo:resnet18-cifar", "--device", "h200", "--out",
                               tmp_path / "b", *args), needle)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("extra", [[], ["--whole-network"]], ids=["kernels", "networks"])
@pytest.mark.slow
def test_bundle_refuses_a_device_that_is_not_a_cuda_gpu_before_writing(tmp_path, extra):
    from conftest import assert_clean_error, run_cli

    assert_clean_error(run_cli("bundle", "zoo:resnet18-cifar", "--device", "local", "--out",
                               tmp_path / "b", *extra), "is not a CUDA GPU")
    assert not (tmp_path / "b").exists()
