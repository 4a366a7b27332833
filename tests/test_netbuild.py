"""Whole networks built by TVM Relax with our conv kernels: checked against onnxruntime,
timed in the isolated worker, failures recorded."""
import json

import numpy as np
import onnx
import pytest
from dataclasses import replace
from onnx import helper, numpy_helper

from dlas_predict.space.config import Compression
from dlas_predict.space.devices import get_device
from dlas_predict.networks.generate import FAMILIES, build
from dlas_predict.corpus.collect import collect_networks
from dlas_predict.measure.networks.plans import PER_LAYER, NetworkPlan, uniform_plan
from dlas_predict.measure.networks.runner import NetworkRunner, conv_scales
from dlas_predict.networks.graph import read_network
from dlas_predict.corpus.store import CorpusStore
from dlas_predict.measure.execution.tasks import Protocol

#: Every test here builds whole networks with TVM Relax.
pytestmark = pytest.mark.slow

FAST = Protocol(max_repeats=3, min_repeats=2, min_repeat_ms=0.1, time_budget_s=0.05,
                quiet_wait_s=0)


@pytest.fixture(scope="module")
def small_cnn(tmp_path_factory):
    """Plain and separable blocks with a downsample: dense, strided and depthwise convs."""
    path = tmp_path_factory.mktemp("nets") / "small.onnx"
    onnx.save(build("cnn", {**FAMILIES["cnn"], "layers": 2, "kernels": 16, "input": 16,
                            "block": "separable", "downsample": 1}), path)
    return path


@pytest.fixture(scope="module")
def measurer():
    with NetworkRunner(get_device("local"), protocol=FAST, timeout_s=300) as m:
        yield m


def _n(path):
    return len(read_network(path).convs())


@pytest.mark.parametrize("comp,ratio,alg", [
    ("dense", None, "direct"), ("dense", None, "gemm"), ("dense", None, "spatial_pack"),
    ("weight_pruning", 0.7, "gemm"), ("channel_pruning", 0.5, "spatial_pack"),
    ("float16", None, "spatial_pack"), ("int8", None, "direct"),
])
def test_every_kernel_kind_builds_verifies_and_times(small_cnn, measurer, comp, ratio, alg):
    plan = uniform_plan(str(small_cnn), "small", comp, ratio, alg, _n(small_cnn))
    rec = measurer.measure(plan)
    assert rec.error is None, rec.error
    assert rec.verified, (rec.max_error, rec.top1_agreement)
    if comp in ("dense", "weight_pruning", "channel_pruning"):  # float32: tight
        assert rec.max_error < 1e-3
    assert len(rec.run_secs) >= 2 and rec.median_s > 0 and rec.compile_s > 0
    assert json.loads(rec.summary)["conv_layers"] == _n(small_cnn)


def test_a_channel_pruned_network_is_built_with_its_zeroed_filters_removed(small_cnn,
                                                                          measurer):
    from dlas_predict.compression.netplan import network_configs

    cfg = network_configs(str(small_cnn), [Compression.CHANNEL_PRUNING], 0.5)[
        "channel_pruning@0.5"]
    plan = uniform_plan(str(small_cnn), "small", "channel_pruning", 0.5, "gemm", len(cfg),
                        [lc.ratio for lc in cfg])
    assert not any(sparse for _, sparse in plan.layers)  # nothing zeroed is left
    rec = measurer.measure(plan)
    assert rec.error is None and rec.verified and rec.max_error < 1e-3, rec.error
    assert "physically removed" in rec.details["prepared"][0]
    dense = measurer.measure(uniform_plan(str(small_cnn), "small", "dense", None, "gemm",
                                          len(cfg)))
    # the timed network is the smaller one the layers describe
    assert json.loads(rec.summary)["conv_io_bytes"] < json.loads(dense.summary)["conv_io_bytes"]
    assert json.loads(rec.summary)["conv_io_bytes"] == sum(
        4 * (s.C * s.H * s.W + s.K * s.OH * s.OW) for s in (lc.spec for lc in cfg))


def test_per_layer_plan_mixes_algorithms_and_formats(small_cnn, measurer):
    n = _n(small_cnn)
    layers = tuple((("direct", "gemm", "spatial_pack")[i % 3], i % 2 == 0) for i in range(n))
    plan = NetworkPlan(str(small_cnn), "small", Compression.WEIGHT_PRUNING, 0.5, PER_LAYER,
                       layers)
    rec = measurer.measure(plan)
    assert rec.error is None and rec.verified and rec.max_error < 1e-3


def test_a_plan_of_the_wrong_length_is_refused(small_cnn, measurer):
    from dlas_predict.errors import ConfigError

    plan = uniform_plan(str(small_cnn), "small", "dense", None, "direct", _n(small_cnn) + 1)
    with pytest.raises(ConfigError, match="conv layers"):
        measurer.measure(plan)


def _relu6_net(path):
    """conv → Clip(0, 6) → conv → global pool → flatten → gemm (torchvision's ReLU6)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.normal(size=(8, 3, 3, 3)) * 0.5), ("b1", rng.normal(size=8)),
        ("w2", rng.normal(size=(8, 8, 3, 3)) * 0.2), ("lo", np.array(0.0)),
        ("hi", np.array(6.0)), ("fw", rng.normal(size=(4, 8))), ("fb", np.zeros(4))]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "relu6", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 3, 12, 12])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), path)
    return path


@pytest.mark.parametrize("compression", ["dense", "float16"])
def test_relu6_network_runs_and_verifies(tmp_path, measurer, compression):
    path = _relu6_net(tmp_path / "relu6.onnx")
    rec = measurer.measure(uniform_plan(str(path), "relu6", compression, None, "direct", 2))
    assert rec.error is None, rec.error
    assert rec.verified


def _bn_net(path):
    """conv → BatchNormalization → ReLU, and a norm whose conv output is also used elsewhere
    (an add): the first folds, the second cannot."""
    rng = np.random.default_rng(1)
    arr = {"w1": rng.normal(size=(6, 3, 3, 3)), "w2": rng.normal(size=(6, 6, 1, 1)) * 0.3,
           "b2": rng.normal(size=6)}
    for k in ("1", "2"):
        arr |= {f"g{k}": rng.uniform(0.5, 2, 6), f"be{k}": rng.normal(size=6),
                f"m{k}": rng.normal(size=6), f"v{k}": rng.uniform(0.2, 3, 6)}
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arr.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"],
                         epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"]),
        helper.make_node("Add", ["n2", "c2"], ["y"])]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 6, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), path)
    return path


def test_a_batch_norm_after_a_conv_is_folded_into_its_weights(tmp_path):
    import onnxruntime as ort
    import tvm

    from dlas_predict.measure.networks.build import LayerChoice, build as build_net
    from dlas_predict.measure.networks.importer import relax_module
    from dlas_predict.space.config import Algorithm, DType

    path = _bn_net(tmp_path / "bn.onnx")
    model = onnx.load(str(path))
    text = relax_module(model, "x", (1, 3, 8, 8)).script()
    assert text.count("R.nn.batch_norm(") == 1  # the second norm's conv output is shared
    assert sum(n.op_type == "BatchNormalization" for n in model.graph.node) == 2  # a copy
    x = np.random.default_rng(2).normal(size=(1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    exe = build_net(model, "x", (1, 3, 8, 8), DType.FLOAT32,
                    [LayerChoice(Algorithm.DIRECT, False)] * 2, "llvm")
    vm = tvm.relax.VirtualMachine(exe, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_relu6_lowers_to_elementwise_ops_with_scalar_bounds(tmp_path):
    """The frontend's Max/Min is broadcast + stack + reduce over a full-size constant; the
    builder turns each back into one elementwise op with a scalar bound."""
    from dlas_predict.measure.networks.importer import relax_module

    model = onnx.load(str(_relu6_net(tmp_path / "relu6.onnx")))
    text = relax_module(model, "x", (1, 3, 12, 12)).script()
    assert "R.stack" not in text and "R.max(" not in text and "R.min(" not in text
    assert text.count("R.maximum(") == 1 and 'R.const(0.0, "float32")' in text
    assert text.count("R.minimum(") == 1 and 'R.const(6.0, "float32")' in text


def test_a_max_with_a_bound_of_many_values_keeps_its_meaning(tmp_path):
    from dlas_predict.measure.networks.importer import relax_module

    bound = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("Max", ["x", "c"], ["y"])], "max",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 2, 2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 2, 2])],
        [numpy_helper.from_array(bound, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    text = relax_module(model, "x", (1, 4, 2, 2)).script()
    assert "R.stack" in text and "R.maximum(" not in text


def test_int8_scales_come_from_the_float_model(small_cnn):
    model = onnx.load(str(small_cnn))
    x = np.random.default_rng(0).normal(size=(4, 1, 3, 16, 16)).astype(np.float32)
    scales = conv_scales(model, x)  # four inputs of one image each
    assert len(scales) == _n(small_cnn)
    # the first conv's input scale is the input's own max / 127
    assert scales[0][0] == pytest.approx(float(np.abs(x).max()) / 127, rel=1e-5)
    assert all(s_in > 0 and s_out > 0 for s_in, s_out in scales)


def test_a_crashing_build_is_a_recorded_failure_and_the_store_keeps_it(small_cnn, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("DLAS_FAULT_INJECTION", "1")
    dev = get_device("local")
    plan = uniform_plan(str(small_cnn), "small", "dense", None, "direct", _n(small_cnn))
    with CorpusStore(tmp_path / "s.sqlite") as db, NetworkRunner(dev, protocol=FAST) as nm:
        real = nm.runner.call
        nm.runner.call = lambda task, timeout_s=None: real(replace(task, fault="segfault"))
        recs = collect_networks([plan], db, nm, dev).records
        assert recs[0].error and "worker crashed" in recs[0].error
        rows = db.network_measurements()
        assert len(rows) == 1 and rows[0]["error"]
        nm.runner.call = real  # the failure is retried on the next run, and replaced
        recs = collect_networks([plan], db, nm, dev).records
        assert recs[0].error is None
        rows = db.network_measurements()
        assert len(rows) == 1 and rows[0]["error"] is None and rows[0]["verified"] == 1
        assert db.stats().network_measurements == 1


def _epilogue_net(path):
    """conv+bias → SiLU (Sigmoid, Mul) → conv+bias → Add(the SiLU output) → ReLU → conv →
    Clip(0, 6) → pool → gemm: every epilogue step the builder fuses."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.normal(size=(8, 3, 3, 3)) * 0.5), ("b1", rng.normal(size=8)),
        ("w2", rng.normal(size=(8, 8, 3, 3)) * 0.2), ("b2", rng.normal(size=8)),
        ("w3", rng.normal(size=(12, 8, 1, 1)) * 0.3), ("lo", np.array(0.0)),
        ("hi", np.array(6.0)), ("fw", rng.normal(size=(4, 12))), ("fb", np.zeros(4))]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "a1"], ["r2"]),
        helper.make_node("Relu", ["r2"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3"], ["c3"], strides=[2, 2]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["a3"]),
        helper.make_node("GlobalAveragePool", ["a3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "epilogues", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 3, 10, 10])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), path)
    return path


def _gated_net(path, size: int = 12, project: int = 8):
    """conv+bias → SiLU → a squeeze-excitation gate (pool, 1×1 conv, ReLU, 1×1 conv,
    Sigmoid) multiplied in → 1×1 projection conv of ``project`` filters + bias."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.normal(size=(16, 8, 3, 3)) * 0.3), ("b1", rng.normal(size=16)),
        ("ws", rng.normal(size=(4, 16, 1, 1))), ("bs", rng.normal(size=4)),
        ("we", rng.normal(size=(16, 4, 1, 1))), ("be", rng.normal(size=16)),
        ("wp", rng.normal(size=(project, 16, 1, 1)) * 0.3), ("bp", rng.normal(size=project))]]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("GlobalAveragePool", ["a1"], ["p"]),
        helper.make_node("Conv", ["p", "ws", "bs"], ["q"]),
        helper.make_node("Relu", ["q"], ["qa"]),
        helper.make_node("Conv", ["qa", "we", "be"], ["e"]),
        helper.make_node("Sigmoid", ["e"], ["g"]),
        helper.make_node("Mul", ["a1", "g"], ["gated"]),
        helper.make_node("Conv", ["gated", "wp", "bp"], ["y"])]
    graph = helper.make_graph(nodes, "gated", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, [1, 8, size, size])], [helper.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, project, size, size])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), path)
    return path


@pytest.mark.parametrize("dtype,alg", [("float32", "gemm"), ("float32", "spatial_pack"),
                                       ("float32", "direct"), ("float16", "gemm")])
def test_a_sigmoid_gate_folded_into_the_next_convs_weights_computes_the_same(
        tmp_path, dtype, alg):
    import tvm
    import onnxruntime as ort

    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.measure.networks.build import LayerChoice, lower

    path = _gated_net(tmp_path / "gated.onnx")
    model = onnx.load(str(path))
    x = np.random.default_rng(3).normal(size=(1, 8, 12, 12)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    target = tvm.target.Target(get_device("local").target)
    outs, funcs, folded = [], [], []
    for fold in (False, True):
        got: dict = {}
        mod = lower(model, "x", x.shape, DType(dtype), [LayerChoice(Algorithm(alg), False)] * 4,
                    stats=got, fold_scales=fold)
        names = [gv.name_hint for gv, f in mod.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc)]
        funcs.append(names)
        folded.append(got["folded_gates"])
        vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    # the projection (8 filters on 12×12) takes the gate; the gate's own convs (on 1×1) do not
    assert folded == [0, 1]
    assert any("multiply" in n for n in funcs[0])
    assert not any("multiply" in n for n in funcs[1])
    assert any("scale_weights" in n for n in funcs[1])
    tol = 1e-4 if dtype == "float32" else 2e-2
    for out in outs:
        assert np.abs(out - ref).max() < tol * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("dtype,project,size", [("int8", 8, 12), ("float32", 64, 6)])
def test_a_gate_stays_a_multiply_for_int8_or_where_the_weights_outnumber_the_input(
        tmp_path, dtype, project, size):
    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.measure.networks.build import LayerChoice, lower

    model = onnx.load(str(_gated_net(tmp_path / "gated.onnx", size, project)))
    got: dict = {}
    scales = [(0.05, 0.05)] * 4 if dtype == "int8" else None
    lower(model, "x", (1, 8, size, size), DType(dtype),
          [LayerChoice(Algorithm.GEMM, False)] * 4, scales=scales, stats=got)
    assert got["folded_gates"] == 0


def _padded_pool_add(c, size):
    """An average pool (3x3, stride 1, padding not counted) plus a residual, as TE."""
    from tvm import te, topi

    x = te.placeholder((1, c, size, size), "float32", name="x")
    z = te.placeholder((1, c, size, size), "float32", name="z")
    pool = topi.nn.pool2d(x, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), "avg",
                          count_include_pad=False)
    out = te.compute(pool.shape, lambda *i: pool(*i) + z(*i), name="T_add")
    return te.create_prim_func([x, z, out])


def _pool_reference(x, z):
    n, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones((h, w)), 1)
    total = sum(padded[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3))
    count = sum(ones[i:i + h, j:j + w] for i in range(3) for j in range(3))
    return total / count + z


@pytest.mark.parametrize("size", [32, 7])
def test_a_padded_pool_keeps_its_padding_stage_and_finishes_in_its_own_loop(size):
    """The generic schedule of a padded average pool and the add after it: the padding is a
    stage of its own (inlined, every load of the window would carry a bounds check), and
    the division and the add run in the pool's parallel loop, not in a pass of their own;
    the result matches numpy's, on a width a vector divides (32) and on one none does (7)."""
    import tvm

    from dlas_predict.measure.networks.schedules import schedule_generic

    func = schedule_generic(_padded_pool_add(16, size))
    text = func.script()
    assert 'T.sblock("pad_temp")' in text
    if size % 4 == 0:  # the pool's row is vectorised: its consumers join its loop
        assert text.count("T.parallel(") == 2, text  # the padding stage's, the pool's
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, size, size)).astype("float32")
    z = rng.standard_normal((1, 16, size, size)).astype("float32")
    dev = tvm.cpu()
    ex = tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros_like(x), dev)
    ex["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(z, dev), out)
    np.testing.assert_allclose(out.numpy(), _pool_reference(x, z), rtol=1e-5, atol=1e-5)


def _concat_affine_relu(channels, size, axis=1):
    """A concatenation along ``axis`` with a per-channel affine and a ReLU after it (a
    DenseNet block's BN and ReLU), as TE: the op FuseOps makes of them."""
    import tvm
    from tvm import te, topi

    shapes = [[1, c, size, size] if axis == 1 else [1, channels[0], size, c]
              for c in channels]
    xs = [te.placeholder(tuple(s), "float32", name=f"x{i}") for i, s in enumerate(shapes)]
    cat = topi.concatenate(xs, axis=axis)
    g = te.placeholder((int(cat.shape[1]),), "float32", name="g")
    out = te.compute(cat.shape, lambda n, c, h, w: te.max(
        cat[n, c, h, w] * g[c], tvm.tirx.const(0, "float32")), name="out")
    return te.create_prim_func([*xs, g, out]), shapes


@pytest.mark.parametrize("size,axis", [(14, 1), (7, 1), (8, 3)])
def test_a_concatenation_runs_parallel_over_its_channels_and_vectorised_inside_them(size,
                                                                                    axis):
    """The generic schedule of a concatenation of channels and the ops fused after it: one
    parallel loop over the channels, each channel's map one contiguous loop inside it,
    vectorised where whole vectors divide it (14x14: quarter vectors of 4; 7x7: none); a
    concatenation along the last axis keeps the elementwise schedule. The result matches
    numpy's."""
    import tvm

    from dlas_predict.measure.networks.schedules import schedule_generic

    func, shapes = _concat_affine_relu((24, 8, 8), size, axis)
    text = schedule_generic(func).script()
    assert text.count("T.parallel(") == 1, text
    if axis == 1:
        assert "T.parallel(40)" in text, text  # the channels: 24 + 8 + 8
        assert ("T.vectorized(4)" in text) is (size == 14), text
        assert f"h_w_fused in range({size * size})" in text or "T.vectorized" in text, text
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    cat = np.concatenate(xs, axis=axis)
    g = rng.standard_normal(cat.shape[1]).astype("float32")
    dev = tvm.cpu()
    ex = tvm.compile(tvm.IRModule({"main": schedule_generic(func)}),
                     target=tvm.target.Target({"kind": "llvm"}))
    out = tvm.runtime.tensor(np.zeros_like(cat), dev)
    ex["main"](*(tvm.runtime.tensor(a, dev) for a in (*xs, g)), out)
    np.testing.assert_allclose(out.numpy(), np.maximum(cat * g[None, :, None, None], 0),
                               rtol=1e-6)


def test_a_cell_of_padded_pools_builds_and_verifies(tmp_path, measurer):
    from dlas_predict.networks.nasbench201 import build as build_cell, parse_arch

    path = tmp_path / "cell.onnx"
    onnx.save(build_cell(parse_arch(
        "|avg_pool_3x3~0|+|avg_pool_3x3~0|avg_pool_3x3~1|+|nor_conv_3x3~0|avg_pool_3x3~1|"
        "avg_pool_3x3~2|")), path)
    rec = measurer.measure(uniform_plan(str(path), "cell", "dense", None, "direct", _n(path)))
    assert rec.error is None, rec.error
    # float32: verified means within 1e-3 of onnxruntime's output, relative to its largest
    assert rec.verified, (rec.max_error, rec.top1_agreement)


def test_each_conv_fuses_the_ops_after_it(tmp_path):
    from dlas_predict.measure.networks.build import plan_epilogues
    from dlas_predict.measure.networks.importer import relax_module

    model = onnx.load(str(_epilogue_net(tmp_path / "epi.onnx")))
    plans = plan_epilogues(relax_module(model, "x", (1, 3, 10, 10))["main"])
    steps = [p.steps for p in plans.values()]
    assert steps == [[("bias",), ("silu",)], [("bias",), ("residual",), ("relu",)],
                     [("max", 0.0), ("min", 6.0)]]
    first, second, _ = plans.values()
    assert second.residual.same_as(first.end)  # the residual is the first chain's output
    assert first.bias.shape == (8,)


@pytest.mark.slow
def test_tuned_spatial_pack_kernels_fuse_their_epilogues(tmp_path):
    """A tuned build replays a spatial pack layer's search of the bare convolution on the
    kernel with its epilogue; a tuned GEMM or direct layer keeps its epilogue as its own op
    (its trace does not replay with one); a layer the database does not hold keeps its hand
    schedule and fuses its epilogue. The output is onnxruntime's."""
    import onnxruntime as ort
    import tvm

    from dlas_predict.measure.kernels import tuning as tn
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.knobs import tuned_knobs
    from dlas_predict.measure.networks.build import LayerChoice, TunedKernels, lower
    from dlas_predict.space.config import Algorithm, DType, Variant

    path = _epilogue_net(tmp_path / "epi.onnx")
    model = onnx.load(str(path))
    x = np.random.default_rng(2).normal(size=(1, 3, 10, 10)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    dev = get_device("local")
    algs = [Algorithm.GEMM, Algorithm.DIRECT, Algorithm.SPATIAL_PACK]
    db = tn.TuningDB(tmp_path / "db")
    target = tn.tuning_target(dev.target, dev.cores)
    for layer, alg in zip(read_network(path).convs(), algs):  # one trial each
        if alg is Algorithm.DIRECT:
            continue  # not tuned: the database does not hold it
        ks = KernelSpec(layer.spec, alg, False, DType.FLOAT32,
                        tuned_knobs(layer.spec, Variant(alg, "dense"), 1, dev.simd_bits))
        tn.tune_dense(ks, target, db, tn.tuning_key(dev.fingerprint, ks, 1, dev.target), 1, 0)
    tuned = TunedKernels(str(db.path), 1, dev.fingerprint, dev.target, dev.cores,
                         simd_bits=dev.simd_bits)
    stats: dict = {}
    mod = lower(model, "x", x.shape, DType.FLOAT32, [LayerChoice(a, False) for a in algs],
                tuned=tuned, stats=stats)
    assert (tuned.tuned, tuned.untuned) == ([0, 2], [1])
    # the untuned direct layer runs its bias, residual and ReLU, the tuned spatial pack
    # layer its ReLU6 clamps; the tuned GEMM layer's bias and SiLU run apart
    assert stats == {"epilogue": "fused", "fused_layers": 2, "fused_ops": 5,
                     "separate_layers": 1, "folded_gates": 0}
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=tuned.target), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(out - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("dtype,alg", [("float32", "gemm"), ("float32", "spatial_pack"),
                                       ("float16", "direct"), ("int8", "direct")])
def test_fused_and_separate_epilogues_compute_the_same(tmp_path, dtype, alg):
    import tvm
    import onnxruntime as ort

    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.measure.networks.build import LayerChoice, lower

    path = _epilogue_net(tmp_path / "epi.onnx")
    model = onnx.load(str(path))
    x = np.random.default_rng(2).normal(size=(1, 3, 10, 10)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    dt = DType(dtype)
    scales = [(0.05, 0.05)] * 3 if dt is DType.INT8 else None
    target = tvm.target.Target(get_device("local").target)
    outs, funcs, stats = [], [], []
    for fuse in (False, True):
        got: dict = {}
        mod = lower(model, "x", x.shape, dt, [LayerChoice(Algorithm(alg), False)] * 3,
                    scales=scales, fuse=fuse, stats=got)
        funcs.append(sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in mod.functions_items()))
        vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=target),
                                      tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
        stats.append(got)
    assert stats[0] == {"epilogue": "separate", "fused_layers": 0, "fused_ops": 0,
                        "separate_layers": 0, "folded_gates": 0}
    assert stats[1] == {"epilogue": "fused", "fused_layers": 3, "fused_ops": 7,
                        "separate_layers": 0, "folded_gates": 0}
    assert funcs[1] < funcs[0]  # the bias, activation and add functions are gone
    tol = {"float32": 1e-4, "float16": 2e-2}.get(dtype)
    if tol:  # float: both builds match onnxruntime
        for out in outs:
            assert np.abs(out - ref).max() < tol * max(1.0, np.abs(ref).max())
    else:  # int8: the fused build dequantises in the epilogue, the separate one requantises
        assert np.abs(outs[1] - ref).max() <= np.abs(outs[0] - ref).max() * 1.5 + 1e-3


@pytest.mark.skipif(not get_device("local").vnni,
                    reason="this CPU has no AVX-512 VNNI to run the VNNI GEMM")
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_an_int8_network_on_vnni_computes_what_the_plain_int8_gemm_does(tmp_path, fuse):
    """The same int8 network built with its GEMM layers on VNNI and without: the layers'
    int32 sums are exact either way, so the outputs agree to float32 rounding."""
    import tvm

    from dlas_predict.space.config import Algorithm, DType
    from dlas_predict.measure.networks.build import LayerChoice, lower

    model = onnx.load(str(_epilogue_net(tmp_path / "epi.onnx")))
    x = np.random.default_rng(2).normal(size=(1, 3, 10, 10)).astype(np.float32)
    target = tvm.target.Target(get_device("local").target)
    outs = []
    for vnni in (False, True):
        mod = lower(model, "x", x.shape, DType.INT8, [LayerChoice(Algorithm.GEMM, False)] * 3,
                    scales=[(0.05, 0.05)] * 3, fuse=fuse, vnni=vnni)
        names = [gv.name_hint for gv, f in mod.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc)
                 and "vpdpbusd" in f.script()]
        assert bool(names) is vnni, names
        vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    assert np.abs(outs[1] - outs[0]).max() <= 1e-5 * max(1.0, np.abs(outs[0]).max())


@pytest.mark.slow
@pytest.mark.skipif(not get_device("local").vnni,
                    reason="this CPU has no AVX-512 VNNI to run the VNNI GEMM")
def test_a_tuned_int8_build_keeps_vnni_on_every_layer_the_database_holds_no_search_for(
        tmp_path):
    """A layer with no search in the tuning database keeps its hand schedule, VNNI
    included: with an empty database the tuned int8 build's GEMM layers are the untuned
    build's (a tuned build without them ran 10.2 ms against 2.6 on resnet18-cifar)."""
    import tvm

    from dlas_predict.measure.kernels import tuning as tn
    from dlas_predict.measure.networks.build import LayerChoice, TunedKernels, lower
    from dlas_predict.space.config import Algorithm, DType

    model = onnx.load(str(_epilogue_net(tmp_path / "epi.onnx")))
    dev = get_device("local")
    tn.TuningDB(tmp_path / "db")
    tuned = TunedKernels(str(tmp_path / "db"), 1, dev.fingerprint, dev.target, dev.cores,
                         simd_bits=dev.simd_bits)
    scripts = []
    for t in (None, tuned):
        mod = lower(model, "x", (1, 3, 10, 10), DType.INT8,
                    [LayerChoice(Algorithm.GEMM, False)] * 3, scales=[(0.05, 0.05)] * 3,
                    tuned=t, vnni=True)
        scripts.append(sorted(f.script() for _, f in mod.functions_items()
                              if isinstance(f, tvm.tirx.PrimFunc) and "vpdpbusd" in f.script()))
    assert tuned.untuned == [0, 1, 2] and tuned.tuned == []
    assert len(scripts[0]) == 3 and scripts[1] == scripts[0]


def test_a_layer_whose_search_lost_to_the_hand_schedule_is_built_by_hand(tmp_path):
    """Where a search's best was timed slower than the hand schedule (the database's index
    says ``kept: hand``), the tuned build lowers the layer as the untuned build does, fused
    epilogue included, and counts it as tuned."""
    import tvm

    from dlas_predict.measure.kernels import tuning as tn
    from dlas_predict.measure.kernels.knobs import tuned_knobs
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.networks.build import LayerChoice, TunedKernels, lower
    from dlas_predict.space.config import Algorithm, DType, Variant

    path = _epilogue_net(tmp_path / "epi.onnx")
    model = onnx.load(str(path))
    dev = get_device("local")
    db = tn.TuningDB(tmp_path / "db")
    for layer in read_network(path).convs():
        ks = KernelSpec(layer.spec, Algorithm.GEMM, False, DType.FLOAT32,
                        tuned_knobs(layer.spec, Variant("gemm", "dense"), 1, dev.simd_bits))
        db.record(tn.tuning_key(dev.fingerprint, ks, 1, dev.target),
                  tn.TuneOutcome("metaschedule", 1, 1, 1.0, 2e-3, False, kept="hand",
                                 search_s=2e-3, hand_s=1e-3))
    tuned = TunedKernels(str(db.path), 1, dev.fingerprint, dev.target, dev.cores,
                         simd_bits=dev.simd_bits)
    scripts, stats = [], []
    for t in (None, tuned):
        got: dict = {}
        mod = lower(model, "x", (1, 3, 10, 10), DType.FLOAT32,
                    [LayerChoice(Algorithm.GEMM, False)] * 3, tuned=t, stats=got)
        scripts.append(sorted(f.script() for _, f in mod.functions_items()
                              if isinstance(f, tvm.tirx.PrimFunc)))
        stats.append(got)
    assert tuned.tuned == [0, 1, 2] and tuned.untuned == []
    assert scripts[1] == scripts[0]
    assert stats[1]["fused_layers"] == stats[0]["fused_layers"] == 3
    assert stats[1]["separate_layers"] == 0


def test_a_collection_after_an_engine_change_times_only_the_builds_it_altered(tmp_path):
    """A build a carried engine timed is not timed again where today's engine builds it the
    same way: on 16 lanes, 124 filters were blocked 31 at a time by engine 11 (today 32, the
    last padded), so that spatial pack build is timed again; a network with a sigmoid is
    built otherwise since engine 12, so each of its builds is, and so is each build engine
    16 timed of a network with a concatenation (17 schedules it otherwise); the direct build and the 64-filter network's
    spatial pack are the same builds, and are skipped; a failed record carries nothing."""
    from dlas_predict.compression.netplan import LayerConfig
    from dlas_predict.corpus.collect import NetworkToCollect, uncarried
    from dlas_predict.measure.networks.plans import NetworkMeasurement
    from dlas_predict.networks.graph import Layer, Network
    from dlas_predict.space.config import ConvSpec

    dev = get_device("local")
    if (dev.simd_bits or 512) < 512:
        pytest.skip("the 31-filter block is chosen on 16 lanes (AVX-512) only")
    nets, plans = [], []
    versions = {"wide": "11", "even": "11", "gated": "12", "joined": "16"}
    for name, k in (("wide", 124), ("even", 64), ("gated", 64), ("joined", 64)):
        spec = ConvSpec.parse(f"C=16,H=8,W=8,K={k},R=3,S=3,stride=1,pad=1")
        net = Network(name, (1, 16, 8, 8))
        if name == "gated":
            net.layers.append(Layer(1, "gate", "Sigmoid", "activation", ((1, 64, 8, 8),),
                                    (1, 64, 8, 8), 0, 0, 0))
        if name == "joined":
            net.layers.append(Layer(1, "join", "Concat", "concat",
                                    ((1, 64, 8, 8), (1, 16, 8, 8)), (1, 80, 8, 8), 0, 0, 0))
        nets.append(NetworkToCollect(f"{name}.onnx", name, net, {
            "dense": [LayerConfig(0, "conv0", spec, Compression.DENSE, 0.0)]}))
        plans += [uniform_plan(f"{name}.onnx", name, "dense", None, alg, 1)
                  for alg in ("direct", "spatial_pack")]
    with CorpusStore(tmp_path / "s.sqlite") as db:
        assert uncarried(plans, nets, db, dev) == plans  # nothing stored: all to time
        for p in plans:
            failed = p.network == "even" and p.algorithm == "direct"
            version = versions[p.network]
            db.add_network(NetworkMeasurement(
                key=p.key(dev, version), device=dev.name,
                fingerprint=dev.fingerprint, network=p.network, config=p.config,
                algorithm=p.algorithm, plan=p.plan_json(), dtype="float32",
                run_secs=[] if failed else [1e-3], version=version,
                error="crashed" if failed else None))
        left = uncarried(plans, nets, db, dev)
    assert [(p.network, p.algorithm) for p in left] == [
        ("wide", "spatial_pack"), ("even", "direct"), ("gated", "direct"),
        ("gated", "spatial_pack"), ("joined", "direct"), ("joined", "spatial_pack")]


@pytest.fixture(scope="module")
def small_transformer(tmp_path_factory):
    """One encoder block on 8 tokens: attention, LayerNorm, a GELU FFN."""
    from dlas_predict.networks.generate import generate

    [m] = generate("transformer", ["layers=1", "d_model=32", "heads=2", "seq=8"],
                   tmp_path_factory.mktemp("tr"))
    return m.path


@pytest.mark.parametrize("comp,ratio,alg", [
    ("dense", None, "gemm"), ("dense", None, "spatial_pack"), ("weight_pruning", 0.8, "gemm"),
    ("int8", None, "gemm"), ("float16", None, "direct")])
def test_a_transformer_builds_its_matrix_layers_on_our_kernels_and_verifies(
        small_transformer, measurer, comp, ratio, alg):
    from dlas_predict.networks import zoo

    n = len(read_network(zoo.resolve(small_transformer)).convs())
    rec = measurer.measure(uniform_plan(str(small_transformer), "tr", comp, ratio, alg, n))
    assert rec.error is None, rec.error
    assert rec.verified, (rec.max_error, rec.top1_agreement)
    if comp in ("dense", "weight_pruning"):  # erf and softmax as polynomials: still tight
        assert rec.max_error < 1e-3
    fcs = sum(layer.kind == "fc" for layer in read_network(small_transformer).layers)
    assert json.loads(rec.summary)["conv_layers"] == n == fcs


def test_onnxruntime_runs_a_matrix_network_in_its_author_s_form(small_transformer, measurer):
    from dlas_predict.measure.networks.plans import onnxruntime_plan

    plan = onnxruntime_plan(str(small_transformer), "tr", "weight_pruning", 0.5)
    rec = measurer.measure(plan)
    assert rec.error is None and rec.verified and rec.max_error < 1e-4, rec.error
    ran = onnx.load(str(measurer._ort_model(plan, measurer._prepare(plan))))
    weights = {t.name: numpy_helper.to_array(t) for t in ran.graph.initializer}
    assert not any(node.op_type == "Conv" for node in ran.graph.node)
    fc = [weights[node.input[1]] for node in ran.graph.node
          if node.op_type in ("MatMul", "Gemm") and node.input[1] in weights]
    fcs = sum(layer.kind == "fc" for layer in read_network(small_transformer).layers)
    assert len(fc) == fcs and np.mean(np.concatenate([w.ravel() for w in fc]) == 0) > 0.4
