"""Winograd F(m×m, 3×3): against the numpy reference on this CPU (both tiles, float32 and
float16, shapes whose outputs and filters no tile divides, asymmetric padding, the fused
epilogue), where it applies and why not elsewhere, its knobs, and ``measure``'s handling."""

import numpy as np
import pytest

from conftest import assert_clean_error, run_cli
from dlas_predict.errors import ConfigError
from dlas_predict.space.config import (GRID_ALGORITHMS, Algorithm, Compression, ConvSpec,
                                       DType, Variant, winograd_skip)
from dlas_predict.space.devices import get_device
from dlas_predict.measure.kernels.knobs import resolve_knobs
from dlas_predict.measure.execution.tasks import KernelTask, Protocol
from dlas_predict.measure.execution.worker import run_task

FAST = Protocol(max_repeats=3, min_repeats=1, time_budget_s=0.01, quiet_wait_s=0)
#: filters no vector divides, an output no tile divides; no padding; padding on two sides
SHAPES = ["C=16,H=9,W=11,K=20,R=3,S=3,stride=1,pad=1",
          "C=3,H=7,W=5,K=5,R=3,S=3,stride=1,pad=0",
          "C=8,H=10,W=10,K=8,R=3,S=3,stride=1,pad=1:2:0:1"]


def _task(spec, compression, knobs=None):
    v = Variant(Algorithm.WINOGRAD, compression, 0.0, knobs=knobs or {})
    return KernelTask(conv=spec, algorithm=v.algorithm, sparse=False, dtype=v.dtype,
                      knobs=resolve_knobs(spec, v), ratio=0.0, pattern=v.pattern,
                      compression=v.compression, target=get_device("local").target,
                      protocol=FAST, seed=0)


def test_the_transforms_compute_a_correlation_exactly():
    """Aᵀ[(G g) ⊙ (Bᵀ d)] is the valid correlation of d with g, for both tiles."""
    from dlas_predict.measure.kernels.winograd import MATRICES

    rng = np.random.default_rng(0)
    for m, (bt, g, at) in MATRICES.items():
        d, f = rng.normal(size=m + 2), rng.normal(size=3)
        ref = [d[i:i + 3] @ f for i in range(m)]
        assert np.allclose(at @ ((g @ f) * (bt @ d)), ref, atol=1e-12)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.slow
def test_winograd_matches_reference(tile):
    result = run_task(_task(ConvSpec.parse(SHAPES[0]), Compression.DENSE, {"tile": tile}))
    assert result.verified, result.max_error
    assert len(result.run_secs) >= 1 and all(t > 0 for t in result.run_secs)


@pytest.mark.slow
@pytest.mark.parametrize("text", SHAPES)
@pytest.mark.parametrize("compression", [Compression.DENSE, Compression.FLOAT16])
@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_matches_reference_on_odd_shapes(text, compression, tile):
    result = run_task(_task(ConvSpec.parse(text), compression, {"tile": tile}))
    assert result.verified, result.max_error


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT16])
def test_winograd_fuses_its_epilogue(dtype):
    import tvm

    from dlas_predict.measure.kernels.build import build_kernel, device_args
    from dlas_predict.measure.kernels.reference import conv2d_reference, make_inputs
    from dlas_predict.measure.kernels.spec import KernelSpec

    spec = ConvSpec.parse(SHAPES[0])
    comp = Compression.DENSE if dtype is DType.FLOAT32 else Compression.FLOAT16
    knobs = resolve_knobs(spec, Variant(Algorithm.WINOGRAD, comp))
    steps = (("bias",), ("residual",), ("max", 0.0), ("min", 6.0))
    ks = KernelSpec(spec, Algorithm.WINOGRAD, False, dtype, knobs, None, steps)
    rng = np.random.default_rng(3)
    x, w = make_inputs(spec, dtype, 1)
    bias = rng.normal(size=spec.K).astype(np.float32)
    residual = rng.normal(size=spec.output_shape).astype(dtype.value)
    args = device_args(ks, x, w, tvm.cpu(), {"bias": bias, "residual": residual})
    build_kernel(ks, tvm.target.Target(get_device("local").target))["main"](*args)
    y = conv2d_reference(x, w, spec, DType.FLOAT32) + bias.reshape(1, -1, 1, 1) + residual
    y = np.minimum(np.maximum(y, 0.0), 6.0)
    out = args[-1].numpy()
    assert str(out.dtype) == dtype.value
    tol = (5e-3 if dtype is DType.FLOAT16 else 1e-4) * max(1.0, np.abs(y).max())
    assert np.abs(out.astype(np.float64) - y).max() < tol


@pytest.mark.slow
def test_a_numerically_wrong_winograd_is_a_recorded_verification_failure(monkeypatch):
    """Transformed filters off by 1 % (as a tile too large for its precision would be):
    the run is recorded as not verified, with its error, never as a good timing."""
    from dlas_predict.measure.kernels import build

    real = build.pack_winograd_weights
    monkeypatch.setattr(build, "pack_winograd_weights",
                        lambda ks, w: [u * np.float32(1.01) for u in real(ks, w)])
    result = run_task(_task(ConvSpec.parse(SHAPES[0]), Compression.DENSE))
    assert result.verified is False and result.max_error > 1e-3


def test_winograd_applies_to_dense_3x3_stride_1_convs_only():
    ok = ConvSpec.parse("C=64,H=28,W=28,K=64,R=3,S=3,stride=1,pad=1")
    assert winograd_skip(ok, Compression.DENSE) is None
    assert winograd_skip(ok, Compression.FLOAT16) is None
    refused = {
        "stride 2": ("C=64,H=28,W=28,K=64,R=3,S=3,stride=2,pad=1", Compression.DENSE, "cpu"),
        "5×5": ("C=64,H=28,W=28,K=64,R=5,S=5,stride=1,pad=2", Compression.DENSE, "cpu"),
        "1×1": ("C=64,H=28,W=28,K=64,R=1,S=1,stride=1,pad=0", Compression.DENSE, "cpu"),
        "32 groups": ("C=32,H=28,W=28,K=32,R=3,S=3,stride=1,pad=1,groups=32",
                      Compression.DENSE, "cpu"),
        "dilation": ("C=8,H=28,W=28,K=8,R=3,S=3,stride=1,pad=2,dilation=2",
                     Compression.DENSE, "cpu"),
        "int8": (ok.to_spec(), Compression.INT8, "cpu"),
        "CSR": (ok.to_spec(), Compression.WEIGHT_PRUNING, "cpu"),
        "CUDA": (ok.to_spec(), Compression.DENSE, "gpu"),
    }
    assert "untuned" in winograd_skip(ok, Compression.DENSE, tuning="tuned")
    for needle, (text, comp, kind) in refused.items():
        why = winograd_skip(ConvSpec.parse(text), comp, kind)
        assert why is not None and needle in why, (needle, why)


def test_winograd_knobs_take_its_two_tiles_and_pad_the_filters():
    big = ConvSpec.parse("C=64,H=28,W=28,K=20,R=3,S=3,stride=1,pad=1")
    small = ConvSpec.parse("C=64,H=4,W=4,K=64,R=3,S=3,stride=1,pad=1")
    v = Variant(Algorithm.WINOGRAD, Compression.DENSE)
    assert resolve_knobs(big, v, 512) == {"tile": 4, "tile_k": 16, "tile_p": 8}
    assert resolve_knobs(small, v, 256)["tile"] == 2  # one F(4×4) tile a side: F(2×2)
    with pytest.raises(ConfigError, match="tile is one of"):
        resolve_knobs(big, Variant(Algorithm.WINOGRAD, Compression.DENSE, knobs={"tile": 3}))
    with pytest.raises(ConfigError, match="no kernel for winograd"):
        resolve_knobs(big, Variant(Algorithm.WINOGRAD, Compression.WEIGHT_PRUNING, 0.5))


def test_all_is_the_grids_three_and_winograd_is_named():
    assert Algorithm.parse_list("all") == list(GRID_ALGORITHMS)
    assert Algorithm.WINOGRAD not in GRID_ALGORITHMS
    assert Algorithm.parse_list("winograd,gemm") == [Algorithm.WINOGRAD, Algorithm.GEMM]


def test_measure_skips_where_winograd_does_not_apply_and_says_why():
    import json

    res = run_cli("measure", "--conv", "C=8,H=10,W=10,K=8,R=3,S=3,stride=1,pad=1",
                  "--algorithm", "winograd", "--compression", "dense,int8,weight_pruning",
                  "--max-repeats", "3", "--time-budget", "0.01", "--quiet-wait", "0", "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    done = [r for r in rows if "skipped" not in r]
    assert [(r["algorithm"], r["compression"], r["verified"]) for r in done] == \
        [("winograd", "dense", True)]
    assert {r["compression"]: r["skipped"].split(" (")[0] for r in rows if "skipped" in r} == {
        "int8": "Winograd is float32 and float16 only",
        "weight_pruning": "Winograd has no CSR form"}


def test_measure_with_nothing_winograd_applies_to_is_one_clean_error():
    res = run_cli("measure", "--conv", "C=8,H=10,W=10,K=8,R=3,S=3,stride=2,pad=1",
                  "--algorithm", "winograd", "--compression", "dense")
    assert_clean_error(res, "Winograd needs stride 1")


def test_a_collection_plans_winograd_kernels_where_it_applies_and_no_uniform_plan(tmp_path):
    """Winograd's kernels: dense and float16 3x3 stride-1 layers, untuned; its whole-network
    builds: per-layer plans only (a uniform plan cannot run it on every layer)."""
    from dlas_predict.corpus.collect import (kernel_tasks, plan_networks, whole_network_plans,
                                             winograd_skips)
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.space.config import Tuning

    dev = get_device("local")
    nets = plan_networks(["zoo:resnet18-cifar"], [Compression.DENSE, Compression.FLOAT16,
                                                  Compression.INT8], 0.9)
    tasks = kernel_tasks(nets, [Algorithm.WINOGRAD], [Tuning.UNTUNED, Tuning.TUNED], dev)
    convs = {c.spec for c in nets[0].net.convs()}
    applies = {s for s in convs if winograd_skip(s, Compression.DENSE) is None}
    assert 0 < len(applies) < len(convs)  # the 1x1 and strided convs are left out
    assert {(t.spec, t.variant.compression) for t in tasks} == {
        (s, c) for s in applies for c in (Compression.DENSE, Compression.FLOAT16)}
    assert all(t.variant.tuning is Tuning.UNTUNED for t in tasks)
    with CorpusStore(tmp_path / "s.sqlite") as db:
        plans = whole_network_plans(nets, [Algorithm.DIRECT, Algorithm.WINOGRAD], 0.9, db, dev)
    assert {p.algorithm for p in plans} == {"direct"}  # no kernel measured: no per-layer plan
    # the kernels left out, counted by reason: what collect prints
    skips = winograd_skips(nets, [Tuning.UNTUNED], dev)
    assert sum(skips.values()) == 3 * len(convs) - len(tasks)
    assert set(skips) == {winograd_skip(s, c) for s in convs for c in
                          (Compression.DENSE, Compression.FLOAT16, Compression.INT8)} - {None}


def test_a_stored_winograd_record_is_learned_with_its_own_features(tmp_path):
    from dlas_predict.corpus.store import CorpusStore
    from dlas_predict.models.evaluation import load_corpus
    from dlas_predict.models.features import FEATURE_NAMES

    store = tmp_path / "s.sqlite"
    res = run_cli("measure", "--conv", "C=8,H=10,W=10,K=8,R=3,S=3,stride=1,pad=1",
                  "--algorithm", "winograd,direct", "--compression", "dense",
                  "--max-repeats", "3", "--time-budget", "0.01", "--quiet-wait", "0",
                  "--store", store)
    assert res.exit_code == 0, res.output
    with CorpusStore(store) as db:
        assert sorted(r.variant.algorithm.value for r in db.results()) == ["direct", "winograd"]
    corpus = load_corpus(store, "local")
    rows = {k.algorithm: x for k, x in zip(corpus.keys, corpus.X)}
    col = FEATURE_NAMES.index
    assert rows["winograd"][col("algo_winograd")] == 1 and rows["direct"][col("algo_winograd")] == 0
    # F(4×4) on an 8×8 output; its weights: 6×6 transformed elements of 8 channels by the
    # filters padded to a vector, float32
    w = rows["winograd"]
    assert w[col("winograd_tile")] == 4 and w[col("tile_k")] >= 8
    assert w[col("stage_weight_bytes")] == 36 * 8 * w[col("tile_k")] * 4


@pytest.mark.machine  # which models answer local depends on this CPU
def test_a_per_layer_plan_takes_winograd_only_from_a_model_that_learned_it():
    from dlas_predict.models.costmodel import LayerCostModel

    model = LayerCostModel()
    assert not model.knows("winograd") and model.knows("spatial_pack")
    model.meta_["algorithms"] = ["direct", "winograd"]
    assert model.knows("winograd")


def test_recommend_runs_winograd_layers_where_this_cpus_model_learned_them():
    """A per-layer candidate may run Winograd on the layers it applies to, and only where
    the layer model that prices this CPU (its own, or the one it is mapped from) learned it;
    a uniform candidate never does."""
    from dlas_predict.models.costmodel import LayerCostModel
    from dlas_predict.networks import zoo
    from dlas_predict.networks.graph import read_network
    from dlas_predict.recommend.search import recommend

    rec = recommend("zoo:resnet18-cifar", "local", top=0, tuning="untuned",
                    compressions=(Compression.DENSE, Compression.FLOAT16),
                    predict_accuracy=False)
    per_layer = [c for c in rec.candidates if c.algorithm == "per_layer"]
    uniform = [c for c in rec.candidates if c.algorithm in {a.value for a in GRID_ALGORITHMS}]
    assert per_layer and uniform
    assert not any(alg == "winograd" for c in uniform for alg, _ in c.layers)
    convs = [c.spec for c in read_network(zoo.resolve("zoo:resnet18-cifar")).convs()]
    for c in per_layer:
        assert all(alg != "winograd" or (not sparse and winograd_skip(spec, c.compression)
                                         is None)
                   for spec, (alg, sparse) in zip(convs, c.layers))
    learned = LayerCostModel.load(rec.model_info["directory"]).knows("winograd")
    chose = any(alg == "winograd" for c in per_layer for alg, _ in c.layers)
    assert chose == learned  # resnet18-cifar's 3x3 layers are Winograd's best case


@pytest.mark.machine  # which models answer local depends on this CPU
def test_predict_a_convs_per_layer_choice_includes_winograd_where_its_model_learned_it():
    import json

    from dlas_predict.crossdev.transfer import device_map, own_model, reference_dir
    from dlas_predict.models.costmodel import LayerCostModel
    from dlas_predict.space.devices import model_dir

    conv = "conv:C=128,H=28,W=28,K=128,R=3,S=3,stride=1,pad=1"
    res = run_cli("predict", conv, "--device", "local", "--config", "dense/per_layer", "--json")
    assert res.exit_code == 0, res.output
    label = json.loads(res.output)[0]["config"]
    # the model that answers: this CPU's own (shipped for its fingerprint), else the
    # reference the map starts from
    directory = model_dir("local") if own_model("local") else \
        reference_dir(device_map("local")[2].name)
    # a 128-channel 28×28 layer: F(4×4) runs it about 2.4x faster than the other three
    assert ("winograd" in label) == LayerCostModel.load(directory).knows("winograd")
    res = run_cli("predict", conv.replace("stride=1", "stride=2"), "--device", "local",
                  "--config", "dense/per_layer", "--json")
    assert res.exit_code == 0 and "winograd" not in json.loads(res.output)[0]["config"]
