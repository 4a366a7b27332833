"""MetaSchedule's CUDA candidates: proposed here, built into bundles, filed back as tuned
records and as the tuning database the next round reads. The GPU run itself (verification
against numpy, timing) is tested with the runner in test_cuda.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlas_predict.space.config import GRID_ALGORITHMS, Algorithm, Compression, ConvSpec, Variant
from dlas_predict.space.devices import get_device

SPEC = ConvSpec.parse("C=8,H=9,W=9,K=16,R=3,S=3,stride=1,pad=1")


def _kernel(alg: Algorithm):
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

    v = Variant(alg, Compression.DENSE, 0.0)
    return KernelSpec(SPEC, alg, False, v.dtype, resolve_gpu_knobs(SPEC, v))


@pytest.fixture(scope="module")
def proposed():
    """One round of three candidates for each algorithm (the search takes seconds)."""
    from dlas_predict.measure.gpu import metaschedule as gm

    target = gm.ms_target("sm_90")
    return {alg: gm.propose(_kernel(alg), target, 3)[0] for alg in GRID_ALGORITHMS}


@pytest.mark.slow
@pytest.mark.parametrize("alg", GRID_ALGORITHMS)
def test_candidates_take_the_hand_kernels_arguments_and_lower_to_cuda(proposed, alg):
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from dlas_predict.measure.kernels import cuda
    from dlas_predict.measure.gpu import metaschedule as gm
    from dlas_predict.measure.gpu.bundle import _build_chunk

    traces = proposed[alg]
    assert len(traces) == 3 and len(set(traces)) == 3
    def args(func) -> list[str]:
        return [str(a.as_json()) for a in ArgInfo.from_prim_func(func)]

    shapes = args(cuda.gpu_prim_func(_kernel(alg)))
    funcs = {}
    for i, trace in enumerate(traces):
        func = gm.candidate_func(_kernel(alg), trace)
        assert args(func) == shapes
        funcs[f"c{i}"] = func
    assert cuda.verify(cuda.kernels_module(funcs)) == []
    # the search is random (its threads race), and now and then it proposes a schedule
    # TVM's own lowering rejects (an internal error in its integer-set analysis): the
    # bundle's build records that candidate as a failure and compiles the others
    module, kept, refused = _build_chunk(funcs, cuda.cuda_target("sm_90"))
    assert len(refused) < len(funcs) and set(kept) | set(refused) == set(funcs)
    assert all(refused[name].strip() for name in refused)
    source = cuda.cuda_source(module)
    assert "threadIdx.x" in source
    assert all((f"{name}_kernel" in source) == (name in kept) for name in funcs)
    assert not cuda.over_shared(source, list(kept))
    assert isinstance(gm.candidate_func(_kernel(alg), traces[0]), tvm.tirx.PrimFunc)


@pytest.mark.slow
def test_a_search_is_reproducible_from_its_seed(proposed):
    from dlas_predict.measure.gpu import metaschedule as gm

    ks, target = _kernel(Algorithm.DIRECT), gm.ms_target("sm_90")
    assert gm.propose(ks, target, 3)[0] == proposed[Algorithm.DIRECT]
    assert not set(gm.propose(ks, target, 3, seed=1)[0]) & set(proposed[Algorithm.DIRECT])


@pytest.mark.slow
def test_csr_kernels_are_not_metaschedule_workloads():
    from dlas_predict.measure.gpu import metaschedule as gm
    from dlas_predict.measure.kernels.spec import KernelSpec

    ks = KernelSpec(SPEC, Algorithm.GEMM, True, _kernel(Algorithm.GEMM).dtype, {})
    with pytest.raises(ValueError, match="knob search"):
        gm.workload(ks)


@pytest.mark.slow
def test_a_metaschedule_round_imports_as_one_tuned_record_and_seeds_the_next(tmp_path,
                                                                            monkeypatch):
    from conftest import run_cli

    from dlas_predict.measure.records import METASCHEDULE
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.measure.gpu import metaschedule as gm
    from dlas_predict.measure.gpu.bundle import (GpuTask, file_metaschedule,
                                                 write_metaschedule_bundle)

    dev = get_device("h200")
    kernels = [(SPEC, Variant(Algorithm.DIRECT, Compression.DENSE, 0.0))]
    out = tmp_path / "b"
    counts = write_metaschedule_bundle(kernels, dev, out, 3)
    assert counts == {"searches": 1, "skipped": 0, "built": 3, "failed": 0}
    assert write_metaschedule_bundle(kernels, dev, out, 3)["skipped"] == 1  # resumable
    lines = [json.loads(t) for t in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and len({ln["search"] for ln in lines}) == 1
    hand = [ln for ln in lines if "schedule" not in ln]
    cands = [ln for ln in lines if ln.get("schedule") == METASCHEDULE]
    assert len(hand) == 1 and len(cands) == 2
    assert all(ln["tuner"] == METASCHEDULE and ln["search_round"] == 1 for ln in lines)
    assert all(ln["knobs"] == hand[0]["knobs"] for ln in cands)  # the same arguments
    traces = {json.loads(t)["key"]: json.loads(t)["trace"]
              for t in (out / "traces.jsonl").read_text().splitlines()}
    assert set(traces) == {ln["key"] for ln in cands}

    # what the GPU run writes: the hand schedule 30 µs, one candidate 10 µs, one wrong
    rows = [{**hand[0], "run_secs": [3e-5] * 3},
            {**cands[0], "run_secs": [1e-5] * 3},
            {**cands[1], "run_secs": [5e-6] * 3, "verified": False,
             "error": "verification failed: max error 0.5"}]
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps({"number": 10, "verified": True, "max_error": 0.0,
                                           "error": None, "compile_s": 0.5,
                                           "measure_s": 0.1, **r}) + "\n" for r in rows))
    # the import files the tuned and untuned records, and the measured candidates in the
    # device's default tuning database
    monkeypatch.setenv("DLAS_HOME", str(tmp_path / "home"))
    db_dir = tmp_path / "home" / "tuning" / f"h200-{dev.fingerprint}"
    got = run_cli("corpus", "import-results", out, results, "--store", tmp_path / "s.sqlite")
    assert got.exit_code == 0, got.output
    assert "imported 2 records" in got.output
    assert f"2 MetaSchedule candidates filed in {db_dir}" in " ".join(got.output.split())
    with CorpusStore(tmp_path / "s.sqlite") as db:
        recs = {r.variant.tuning.value: r for r in db.results()}
    tuned, untuned = recs["tuned"], recs["untuned"]
    assert tuned.key == lines[0]["search"] and tuned.tuner == METASCHEDULE
    assert tuned.median_s == pytest.approx(1e-5) and tuned.trials == 3
    search_s = sum(ln["search_s"] for ln in lines)
    assert tuned.tuning_seconds == pytest.approx(3 * 0.6 + search_s, abs=1e-3)
    assert untuned.key == GpuTask.make(SPEC, kernels[0][1], dev).key
    assert untuned.median_s == pytest.approx(3e-5)

    # each candidate is filed once; the next round reads the database
    assert file_metaschedule(out, results, db_dir) == (0, db_dir)
    from dlas_predict.measure.kernels.tuning import TuningDB

    ms_db = TuningDB(db_dir).metaschedule()
    ks = _kernel(Algorithm.DIRECT)
    records = ms_db.get_top_k(ms_db.commit_workload(gm.workload(ks)), 10)
    assert [list(map(float, r.run_secs)) for r in records] == [[1e-5] * 3]  # the failure
    #  has no times, so it is never a seed
    nxt, _ = gm.propose(ks, gm.ms_target("sm_90"), 3, ms_db, seed=2)
    assert nxt and not set(nxt) & set(traces.values())


@pytest.mark.parametrize("args,needle", [
    (["--tuner", "ansor", "--trials", "4"], "'ansor' is not one of 'knob-search', 'metaschedule'"),
    (["--tuner", "metaschedule"], "--tuner metaschedule tunes kernels"),
    (["--tuner", "metaschedule", "--trials", "4", "--whole-network"],
     "--tuner metaschedule tunes kernels"),
    (["--kernel-sizes", "3x3"], "--kernel-sizes takes integers"),
    (["--round", "0", "--tuner", "metaschedule", "--trials", "4"], "must be positive"),
    (["--tuner", "metaschedule", "--trials", "4", "--compressions", "weight_pruning"],
     "no dense kernel to tune"),
])
def test_bundle_refuses_a_metaschedule_search_it_cannot_make(tmp_path, args, needle):
    from conftest import assert_clean_error, run_cli

    assert_clean_error(run_cli("bundle", "zoo:resnet18-cifar", "--device", "h200", "--out",
                               tmp_path / "b", *args), needle)
    assert not (tmp_path / "b").exists()


def test_import_refuses_a_tuning_database_without_results(tmp_path):
    from conftest import assert_clean_error, run_cli

    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}")
    assert_clean_error(run_cli("corpus", "import-results", bundle, "--store",
                               tmp_path / "s.sqlite", "--tuning-db", tmp_path / "t"),
                       "--tuning-db files measured candidates")
