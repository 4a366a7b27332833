"""The tuned half of the grid: MetaSchedule for dense kernels, the knob search for CSR
kernels, the reusable tuning database, and the records and commands around them."""
import json
import sqlite3
import time

import pytest
from typer.testing import CliRunner

from dlas_predict.cli import app
from dlas_predict.space.config import Algorithm, ConvSpec, Tuning, Variant
from dlas_predict.space.devices import get_device
from dlas_predict.errors import ConfigError
from dlas_predict.corpus.store import CorpusStore
from dlas_predict.measure.kernels.knobs import default_knobs, search_space, tuned_knobs
from dlas_predict.measure.execution.runner import LocalRunner, MeasureTask, TuningOptions
from dlas_predict.measure.execution.tasks import Protocol

SPEC = ConvSpec.parse("C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1")
QUICK = Protocol(max_repeats=5, min_repeats=3, time_budget_s=0.05, quiet_wait_s=0)


# ---- pure Python: knobs, keys, options ---------------------------------------------------------
def test_tuned_knobs_hold_budget_and_only_layout_knobs():
    assert tuned_knobs(SPEC, Variant("direct", "dense"), 64) == {"budget": 64}
    sp = tuned_knobs(SPEC, Variant("spatial_pack", "int8"), 8)
    defaults = default_knobs(SPEC, Variant("spatial_pack", "int8"))
    assert sp == {"budget": 8, **{k: defaults[k] for k in ("tile_k", "tile_h", "tile_w")}}
    assert tuned_knobs(SPEC, Variant("gemm", "weight_pruning", 0.5), 16) == {"budget": 16}
    with pytest.raises(ConfigError):
        tuned_knobs(SPEC, Variant("gemm", "dense"), 0)


@pytest.mark.parametrize("alg,names", [("direct", {"tile_w"}), ("gemm", {"tile_p"}),
                                       ("spatial_pack", {"tile_h", "tile_w"})])
def test_search_space_starts_at_the_default_and_has_no_repeats(alg, names):
    v = Variant(alg, "weight_pruning", 0.8)
    space = search_space(SPEC, v)
    assert space[0] == default_knobs(SPEC, v)
    assert len({json.dumps(k, sort_keys=True) for k in space}) == len(space) > 2
    assert all(set(k) == names for k in space)
    with pytest.raises(ConfigError):
        search_space(SPEC, Variant(alg, "dense"))


def test_tuned_key_depends_on_budget_and_differs_from_untuned():
    dev = get_device("local")
    untuned = MeasureTask.make(SPEC, Variant("gemm", "dense"), dev)
    t64 = MeasureTask.make(SPEC, Variant("gemm", "dense", tuning="tuned"), dev,
                           tuning=TuningOptions(budget=64))
    t8 = MeasureTask.make(SPEC, Variant("gemm", "dense", tuning="tuned"), dev,
                          tuning=TuningOptions(budget=8))
    assert len({untuned.key, t64.key, t8.key}) == 3
    assert untuned.tuning is None and t8.tuning.budget == 8
    assert t64.tuning.timeout_s() > t8.tuning.timeout_s() >= 300


def test_a_small_budget_evolves_a_small_population_and_the_default_is_metaschedules():
    from dlas_predict.measure import import_tvm

    import_tvm()
    from dlas_predict.measure.kernels.tuning import POPULATION, search_strategy

    sizes = {b: search_strategy(b).population_size for b in (1, 2, 8, 63, 64, 1000)}
    assert sizes == {1: 16, 2: 16, 8: 64, 63: 504, 64: POPULATION, 1000: POPULATION}
    assert POPULATION == 512  # MetaSchedule's own default, which the corpus's searches used


@pytest.mark.slow
def test_only_the_cpu_tensor_intrinsics_are_imported_and_the_rest_on_demand():
    """In a fresh process (this one may hold the package already): the CPU intrinsics are
    registered for MetaSchedule's rules, the CUDA module is not imported, and it can be (its
    import takes seconds: found, not run)."""
    from conftest import run_python

    proc = run_python("import importlib.util, sys",
                      "from dlas_predict.measure import import_tvm",
                      "import_tvm()",
                      "from dlas_predict.measure.kernels.tuning import import_tensor_intrinsics",
                      "import_tensor_intrinsics()",
                      "from tvm.s_tir import TensorIntrin",
                      "TensorIntrin.get('dot_16x4_avx512')",
                      "assert 'tvm.s_tir.tensor_intrin.x86' in sys.modules",
                      "assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules",
                      "print('ok', importlib.util.find_spec('tvm.s_tir.tensor_intrin.cuda').name)",
                      # the CUDA search asks for its family on top of the CPU's
                      "import_tensor_intrinsics(('cuda',))",
                      "from tvm.s_tir.tensor_intrin.cuda import LDMATRIX_f16_A_INTRIN as A",
                      "TensorIntrin.get(A)",
                      "print(A)",
                      "assert 'tvm.s_tir.tensor_intrin.rocm' not in sys.modules")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ok", "tvm.s_tir.tensor_intrin.cuda",
                                   "mma_ldmatrix_f16_a"]


def test_tuning_options_reject_impossible_values(tmp_path):
    with pytest.raises(ConfigError, match="between 1 and 20000"):
        TuningOptions(budget=20001)
    with pytest.raises(ConfigError, match="`patience`"):
        TuningOptions(patience=-1)
    dev = get_device("local")
    assert TuningOptions().db_path(dev).name == f"local-{dev.fingerprint}"
    assert TuningOptions(db=str(tmp_path)).db_path(dev) == tmp_path


def test_tuning_db_index_survives_a_cut_line(tmp_path):
    from dlas_predict.measure.kernels.tuning import KNOB_SEARCH, TuneOutcome, TuningDB

    db = TuningDB(tmp_path / "db")
    out = TuneOutcome(KNOB_SEARCH, 8, 5, 1.5, 1e-4, True, {"tile_w": 8})
    db.record("a", out)
    with open(db.index_path, "a") as fh:
        fh.write('{"key": "b", "tuner": "meta')   # a search killed while writing
    got = db.lookup("a")
    assert got.reused and got.knobs == {"tile_w": 8} and got.seconds == 1.5 and got.trials == 5
    assert db.lookup("b") is None


# ---- the store ------------------------------------------------------------------------------
def test_store_keeps_tuning_fields_and_migrates_old_stores(tmp_path):
    from dlas_predict.measure.records import MeasureResult

    path = tmp_path / "old.sqlite"
    CorpusStore(path).close()
    con = sqlite3.connect(path)   # a store written before the tuning columns existed
    con.execute("ALTER TABLE measurements DROP COLUMN trials")
    con.execute("ALTER TABLE measurements DROP COLUMN tuner")
    con.commit()
    con.close()
    rec = MeasureResult(key="k1", device="local", fingerprint="f", conv=SPEC,
                        variant=Variant("gemm", "dense", tuning="tuned"), knobs={"budget": 8},
                        run_secs=[1e-4, 1.1e-4], tuning_seconds=12.5, trials=8,
                        tuner="metaschedule")
    with CorpusStore(path) as db:
        db.add(rec)
        (back,) = db.results()
    assert (back.tuning_seconds, back.trials, back.tuner) == (12.5, 8, "metaschedule")
    assert back.variant.tuning is Tuning.TUNED
    snap = tmp_path / "snap.parquet"
    with CorpusStore(path) as db:
        db.export(snap, "parquet")
    with CorpusStore(tmp_path / "new.sqlite") as db:
        assert db.import_snapshot(snap) == (1, 0)
        (again,) = db.results()
    assert (again.trials, again.tuner) == (8, "metaschedule")


# ---- real tuning in the worker ----------------------------------------------------------------
@pytest.mark.slow
def test_knob_search_tunes_csr_kernel_and_reuses_the_database(tmp_path):
    dev = get_device("local")
    opts = TuningOptions(budget=3, patience=0, db=str(tmp_path / "tdb"))
    v = Variant("direct", "weight_pruning", 0.7, tuning="tuned")
    task = MeasureTask.make(SPEC, v, dev, tuning=opts)
    with LocalRunner(dev, protocol=QUICK) as runner:
        first = runner.run_one(task)
        t0 = time.perf_counter()
        second = runner.run_one(task)
        again_s = time.perf_counter() - t0
    assert first.ok and first.verified, first.error
    assert first.tuner == "knob-search" and first.trials == 3
    assert first.tuning_seconds > 0 and "tile_w" in first.knobs
    assert first.knobs["tile_w"] in [k["tile_w"] for k in search_space(SPEC, v)[:3]]
    # the second run found the search in the database: same winner, same recorded cost
    assert second.ok and second.knobs == first.knobs
    assert second.tuning_seconds == first.tuning_seconds
    assert again_s < 30
    lines = (tmp_path / "tdb" / "index.jsonl").read_text().splitlines()
    assert len(lines) == 1


@pytest.mark.slow
# ---- CLI ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--tuning", "tuned", "--trials", "0"], "--trials must be between 1 and 20000"),
    (["--tuning", "sometimes"], "'sometimes' is not one of 'untuned', 'tuned', 'all'"),
    (["--tuning", "tuned", "--early-stop", "-2"], "--early-stop must be 0"),
])
def test_measure_rejects_bad_tuning_options(args, message):
    res = CliRunner().invoke(app, ["measure", "--conv", "C=8,H=10,W=10,K=16,R=3,S=3,pad=1",
                                   *args])
    assert res.exit_code in (1, 2)  # 2: a word outside the option's choices
    assert message in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_measure_tuned_json_has_tuning_fields(tmp_path):
    res = CliRunner().invoke(app, [
        "measure", "--conv", "C=8,H=10,W=10,K=16,R=3,S=3,pad=1", "--algorithm", "gemm",
        "--compression", "weight_pruning", "--ratio", "0.6", "--tuning", "all", "--trials",
        "2", "--tuning-db", str(tmp_path / "tdb"), "--max-repeats", "5", "--time-budget",
        "0.05", "--quiet-wait", "0", "--json", "--store", str(tmp_path / "s.sqlite")])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["tuning"] for r in rows] == ["untuned", "tuned"]
    untuned, tuned = rows
    assert untuned["tuning_seconds"] is None and untuned["tuner"] is None
    assert tuned["tuner"] == "knob-search" and tuned["trials"] == 2
    assert tuned["tuning_seconds"] > 0 and tuned["verified"] is True
    with CorpusStore(tmp_path / "s.sqlite") as db:
        assert sorted(r.variant.tuning.value for r in db.results()) == ["tuned", "untuned"]


# `tune --network` and a tuned whole-network build from its database are tested in
# tests/test_rpc.py, where the search runs through a loopback tracker.


# ---- the cost of tuning, predicted ------------------------------------------------------------
def _tuned_rows():
    from dlas_predict.space.devices import get_device
    from dlas_predict.models.features import features
    from dlas_predict.corpus.kernels import KernelConfig

    dev = get_device("local")
    specs = [ConvSpec.parse(f"C={c},H=16,W=16,K=32,R=3,S=3,pad=1") for c in (8, 16, 32, 64)]
    X, secs, trials, budgets, tuners = [], [], [], [], []
    for spec in specs:
        for alg, comp, tuner, per_trial in (("gemm", "dense", "metaschedule", 3.0),
                                            ("direct", "weight_pruning", "knob-search", 0.2)):
            X.append(features(KernelConfig(spec, Algorithm.parse(alg), comp,
                                           0.5 if comp != "dense" else 0.0, Tuning.TUNED), dev))
            n = 16 if tuner == "metaschedule" else 4
            secs.append(per_trial * n * (spec.macs / 1e6) ** 0.1)
            trials.append(n if tuner == "knob-search" else 8)   # MS stopped early at half
            budgets.append(16)
            tuners.append(tuner)
    import numpy as np

    return np.array(X), np.array(secs), np.array(trials), np.array(budgets), tuners


def test_tuning_time_model_learns_per_trial_cost_and_round_trips(tmp_path):
    import numpy as np

    from dlas_predict.models.costmodel import ModelError, TuningInputs, TuningTimeModel

    X, secs, trials, budgets, tuners = _tuned_rows()
    runs = TuningInputs(X, budgets, trials=trials, tuners=tuners)
    model = TuningTimeModel(about={"device": "local"}).fit(runs, secs)
    assert model.trial_share_ == {"knob-search": 0.25, "metaschedule": 0.5}
    per = model.per_trial(X)
    dense = [i for i, t in enumerate(tuners) if t == "metaschedule"]
    sparse = [i for i, t in enumerate(tuners) if t == "knob-search"]
    assert min(per[dense]) > 5 * max(per[sparse])     # a MetaSchedule trial costs far more
    ask = TuningInputs(X, np.full(len(X), 64), np.full(len(X), 4))
    pred = model.predict(ask)
    # dense: 64 trials x the observed share; CSR: the search space bounds the trials
    assert pred[dense[0]] == pytest.approx(per[dense[0]] * 32)
    assert pred[sparse[0]] == pytest.approx(per[sparse[0]] * 4)
    model.save(tmp_path)
    back = TuningTimeModel.load(tmp_path)
    assert back.predict(ask) == pytest.approx(pred)
    with pytest.raises(ModelError, match="too few"):
        TuningTimeModel().fit(TuningInputs(X[:2], budgets[:2], trials=trials[:2],
                                           tuners=tuners[:2]), secs[:2])


def test_tuning_verdict_weighs_gain_against_search_time():
    from dlas_predict.space.config import Compression
    from dlas_predict.recommend.tuning import tuning_verdict
    from dlas_predict.recommend.candidates import Candidate

    def cand(tn, s, search=None):
        return Candidate(Compression.DENSE, None, "gemm", (("gemm", False),), s, s, s,
                         tuning=Tuning.parse(tn), tuning_s=search)

    worth = tuning_verdict([cand("tuned", 0.004, 600.0), cand("untuned", 0.005)], 64)
    assert "save 1.00 ms" in worth and "10.0 min" in worth and "600,000 inferences" in worth
    not_worth = tuning_verdict([cand("untuned", 0.004), cand("tuned", 0.005, 60.0)], 64)
    assert "not to pay off" in not_worth


@pytest.mark.parametrize("conv", ["C=160,H=16,W=16,K=160,R=3,S=3,pad=1",
                                  "C=64,H=56,W=56,K=64,R=3,S=3,pad=1",
                                  "C=24,H=7,W=7,K=40,R=1,S=1",
                                  "C=96,H=14,W=14,K=96,R=3,S=3,pad=1,groups=96"])
def test_register_tiles_fit_the_cpus_vector_registers(conv):
    """Untuned tiles keep at most half the vector registers as accumulators: an AVX-512
    tile (16 of 32 zmm) is 16 of AVX2's 16 ymm registers, which spill. The pointwise GEMM
    holds 12 of AVX2's: its steps need one broadcast register beside its inputs."""
    from dlas_predict.measure.kernels.knobs import POINTWISE_ACCUMULATORS, registers
    from dlas_predict.space.config import ConvSpec

    spec = ConvSpec.parse(conv)
    for alg in ("direct", "gemm", "spatial_pack"):
        v = Variant(alg, "dense")
        assert default_knobs(spec, v, 512) == default_knobs(spec, v)
        for bits in (128, 256, 512):
            lanes, acc = registers(bits)
            k = default_knobs(spec, v, bits)
            if alg == "direct":  # a depthwise tile also spans tile_h rows
                held = k["tile_k"] * k.get("tile_h", 1) * -(-k["tile_w"] // lanes)
            elif alg == "gemm":
                held = k["tile_k"] * -(-k["tile_p"] // lanes)
            elif spec.K // spec.groups >= 8:
                held = k["tile_w"] * k["tile_h"] * -(-k["tile_k"] // lanes)
            else:  # depthwise: vectorised along the width
                held = k["tile_k"] * k["tile_h"] * -(-k["tile_w"] // lanes)
            if k.get("pointwise"):
                acc = POINTWISE_ACCUMULATORS[lanes >= 16]
            assert held <= acc, (alg, bits, k)
            # (the pointwise GEMM's positions: two vectors)
            widest = 2 * lanes if k.get("pointwise") else max(lanes, 16)
            assert k["tile_w" if "tile_w" in k else "tile_p"] <= widest
    assert registers(256) == (8, 8) and registers(512) == (16, 16) and registers(None) == (16, 16)


def test_a_device_measures_with_tiles_for_its_vector_width():
    from dlas_predict.measure.execution.runner import MeasureTask
    from dlas_predict.space.config import ConvSpec
    from dlas_predict.space.devices import get_device

    spec = ConvSpec.parse("C=160,H=16,W=16,K=160,R=3,S=3,pad=1")
    v = Variant("spatial_pack", "dense")
    for name in ("local", "rpi3b"):
        dev = get_device(name, with_target=False)
        task = MeasureTask.make(spec, v, dev)
        assert task.knobs == default_knobs(spec, v, dev.simd_bits)
    arm = MeasureTask.make(spec, v, get_device("rpi3b", with_target=False))
    assert arm.knobs != default_knobs(spec, v, 512)  # NEON's 128-bit registers
