"""Every kernel (3 algorithms x dense/CSR x 3 dtypes) against the numpy reference, compiled
and run with TVM on this CPU, on shapes covering stride, padding, groups and dilation."""

from dataclasses import replace

import pytest

from dlas_predict.space.config import (GRID_ALGORITHMS, Algorithm, Compression, ConvSpec,
                                       DType, Variant, variant_grid)
from dlas_predict.space.devices import get_device
from dlas_predict.measure.kernels.knobs import default_knobs, pointwise_tile, resolve_knobs
from dlas_predict.measure.execution.tasks import KernelTask, Protocol
from dlas_predict.measure.execution.worker import run_task

SHAPES = [
    "C=16,H=12,W=12,K=32,R=3,S=3,stride=1,pad=1",
    "C=32,H=15,W=15,K=32,R=3,S=3,stride=2,pad=1,groups=32",
    "C=24,H=9,W=10,K=36,R=1,S=1,stride=1,pad=0,groups=3",
    "C=3,H=20,W=19,K=8,R=5,S=3,stride=2x1,pad=2:1:0:1,dilation=2x1",
    "C=20,H=7,W=7,K=36,R=1,S=1,stride=1,pad=0",
]
# correctness, not timing: no waiting for a quiet machine
FAST = Protocol(max_repeats=3, min_repeats=1, time_budget_s=0.01, quiet_wait_s=0)


@pytest.fixture(scope="module")
def target():
    return get_device("local").target


def _task(spec, variant, target, knobs=None, seed=0):
    return KernelTask(conv=spec, algorithm=variant.algorithm, sparse=variant.sparse,
                      dtype=variant.dtype, knobs=knobs or resolve_knobs(spec, variant),
                      ratio=variant.ratio, pattern=variant.pattern,
                      compression=variant.compression, target=target, protocol=FAST, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("text", SHAPES)
@pytest.mark.parametrize("variant", variant_grid(GRID_ALGORITHMS, list(Compression), 0.7),
                         ids=lambda v: f"{v.algorithm.value}-{v.compression.value}")
def test_kernel_matches_reference(text, variant, target):
    spec = ConvSpec.parse(text)
    result = run_task(_task(spec, variant, target))
    assert result.verified, f"max error {result.max_error}"
    assert len(result.run_secs) >= 1 and all(t > 0 for t in result.run_secs)
    if variant.sparse:
        assert abs(result.sparsity - 0.7) < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,sparse,knobs", [
    ("direct", False, {"tile_k": 4, "tile_w": 5}),      # tile_w not dividing OW: tail path
    ("gemm", False, {"tile_k": 2, "tile_p": 7}),
    ("spatial_pack", False, {"tile_k": 8, "tile_h": 3, "tile_w": 4}),
    ("direct", True, {"tile_w": 4}),
    ("gemm", True, {"tile_p": 24}),
    ("spatial_pack", True, {"tile_h": 3, "tile_w": 8}),
])
def test_non_default_knobs_still_correct(algorithm, sparse, knobs, target):
    spec = ConvSpec.parse("C=8,H=13,W=11,K=16,R=3,S=3,stride=1,pad=1")
    variant = Variant(algorithm, "weight_pruning" if sparse else "dense", 0.6 if sparse else 0)
    assert knobs != default_knobs(spec, variant)
    result = run_task(_task(spec, variant, target, knobs=knobs))
    assert result.verified, result.max_error


@pytest.mark.slow
def test_verification_catches_a_wrong_kernel(target, monkeypatch):
    """A kernel that computes the wrong thing is reported as not verified."""
    from dlas_predict.measure.kernels import build

    spec = ConvSpec.parse("C=4,H=6,W=6,K=8,R=3,S=3,stride=1,pad=1")
    variant = Variant("direct", "dense")
    real = build.pack_weights
    monkeypatch.setattr(build, "pack_weights", lambda ks, w: real(ks, w * 2))
    result = run_task(_task(spec, variant, target))
    assert not result.verified and result.max_error > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("bits", [128, 256])
@pytest.mark.parametrize("variant", variant_grid(GRID_ALGORITHMS, [Compression.DENSE,
                                                                    Compression.INT8,
                                                                    Compression.WEIGHT_PRUNING],
                                                 0.7),
                         ids=lambda v: f"{v.algorithm.value}-{v.compression.value}")
def test_tiles_for_narrower_vectors_match_reference(bits, variant, target):
    spec = ConvSpec.parse("C=32,H=16,W=16,K=48,R=3,S=3,stride=1,pad=1")
    knobs = resolve_knobs(spec, variant, bits)
    result = run_task(_task(spec, variant, target, knobs=knobs))
    assert result.verified, f"max error {result.max_error} with {knobs}"


@pytest.mark.parametrize("conv", ["C=1,H=7,W=7,K=1,R=3,S=3,stride=1,pad=1",
                                  "C=31,H=14,W=14,K=1,R=3,S=3,stride=2,pad=1",
                                  "C=31,H=14,W=14,K=31,R=3,S=3,stride=2,pad=1,groups=31"])
@pytest.mark.parametrize("algorithm", [Algorithm.DIRECT, Algorithm.GEMM])
@pytest.mark.slow
def test_a_tile_of_one_lane_builds_and_matches_reference(conv, algorithm, target):
    """A block of one filter (a channel-pruned layer reduced to one filter, 31 filters in
    groups of one) is a loop of one iteration that is left unvectorised, not a failed
    build."""
    spec = ConvSpec.parse(conv)
    variant = Variant(algorithm, Compression.DENSE)
    knobs = resolve_knobs(spec, variant, 128)
    assert 1 in knobs.values()
    result = run_task(_task(spec, variant, target, knobs=knobs))
    assert result.error is None and result.verified, (result.error, knobs)


#: output widths (and positions) no vector tile of at least half a vector divides
CROPPED_CONVS = ["C=16,H=11,W=11,K=24,R=3,S=3,stride=1,pad=1",
                 "C=12,H=13,W=13,K=20,R=1,S=1,stride=1,pad=0",
                 "C=16,H=18,W=18,K=24,R=3,S=3,stride=2,pad=1,groups=2"]


@pytest.mark.parametrize("algorithm", ["direct", "gemm"])
@pytest.mark.parametrize("conv", CROPPED_CONVS)
@pytest.mark.slow
def test_a_width_no_vector_divides_is_computed_over_whole_tiles(conv, algorithm, target):
    """11 or 13 output columns (121, 169 positions) on eight lanes: the tile is a whole
    vector, the output padded to whole tiles and cropped, not a scalar loop of one lane;
    every dtype matches the reference (the TE GEMM asked for where the float32 pointwise
    GEMM would run)."""
    spec = ConvSpec.parse(conv)
    name = "tile_w" if algorithm == "direct" else "tile_p"
    extent = spec.OW if algorithm == "direct" else spec.OH * spec.OW
    for compression in (Compression.DENSE, Compression.FLOAT16, Compression.INT8):
        te = algorithm == "gemm" and compression is Compression.DENSE and pointwise_tile(
            spec, DType.FLOAT32, 256)
        variant = Variant(algorithm, compression, knobs=(("pointwise", 0),) if te else ())
        knobs = resolve_knobs(spec, variant, 256)
        assert knobs[name] == 8 and extent % 8, knobs
        result = run_task(_task(spec, variant, target, knobs=knobs))
        assert result.error is None and result.verified, (result.error, result.max_error)


def test_a_spatial_pack_row_splits_evenly_into_its_register_tiles():
    """A row takes as many tiles as the widest the accumulators hold would need, each as
    narrow as that allows: 9 columns in two of 5 (not two of 8), 18 in two of 9 (not two
    of 16), 14 in two of 7; a row a tile divides keeps it (56 in 8s, 32 in 16s)."""
    from dlas_predict.measure.kernels.knobs import balanced_width, widest_pack_tile

    sp = Variant("spatial_pack", "dense")

    def row(h, k, bits=512):
        spec = ConvSpec.parse(f"C=64,H={h},W={h},K={k},R=3,S=3,stride=1,pad=1")
        knobs = default_knobs(spec, sp, bits)
        return knobs["tile_w"], widest_pack_tile(spec, knobs["tile_k"], bits)

    assert row(9, 224) == (5, 8) and row(18, 112) == (9, 16) and row(14, 256) == (7, 8)
    assert row(56, 64) == (8, 8) and row(32, 16) == (16, 16)
    assert [balanced_width(c, 8) for c in (1, 4, 8, 9, 15, 16, 17)] == [1, 4, 8, 5, 8, 8, 6]


@pytest.mark.slow
@pytest.mark.parametrize("conv", ["C=16,H=9,W=9,K=32,R=3,S=3,stride=1,pad=1",
                                  "C=8,H=36,W=36,K=16,R=3,S=3,stride=2,pad=1"])
def test_a_spatial_pack_row_of_even_tiles_matches_reference(conv, target):
    """Rows of 9 and 18 columns in tiles split evenly (AVX-512's, whatever this CPU is):
    the kernel matches the reference."""
    spec = ConvSpec.parse(conv)
    variant = Variant("spatial_pack", "dense")
    knobs = default_knobs(spec, variant, 512)
    assert knobs["tile_w"] in (5, 9)
    result = run_task(_task(spec, variant, target, knobs=knobs))
    assert result.error is None and result.verified, (result.error, knobs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("algorithm", ["direct", "gemm"])
def test_a_cropped_tile_runs_the_fused_epilogue(algorithm, dtype):
    import numpy as np

    from dlas_predict.space.config import DType

    dt = DType(dtype)
    out, ref, ks = _fused_case(algorithm, False, dt, conv=CROPPED_CONVS[0])
    assert ks.conv.OW % ks.knobs.get("tile_w", 1) or 121 % ks.knobs.get("tile_p", 1)
    tol = (5e-3 if dt is DType.FLOAT16 else 1e-4) * max(1.0, np.abs(ref).max())
    assert out.shape == ref.shape and np.abs(out.astype(np.float64) - ref).max() < tol


def test_a_widened_unpadded_input_is_copied_not_read_through_a_bounds_check():
    """A 1x1 conv on 13 columns computed over 16: the input is read 16 wide, so the direct
    kernel copies it into a zero-padded buffer once; read in place, every vector load of
    the tile would carry the bounds check (several times slower). 16 columns need no copy."""
    from dlas_predict.measure.kernels.build import kernel_module
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.space.config import DType

    def blocks(width):
        spec = ConvSpec.parse(f"C=12,H={width},W={width},K=16,R=1,S=1,stride=1,pad=0")
        variant = Variant("direct", "dense")
        ks = KernelSpec(spec, Algorithm.DIRECT, False, DType.FLOAT32,
                        resolve_knobs(spec, variant, 256))
        return kernel_module(ks).script()

    cropped, whole = blocks(13), blocks(16)
    assert 'T.sblock("pad")' in cropped and 'T.sblock("pad")' not in whole


def test_vector_tiles_divide_where_they_can_and_pad_where_they_cannot():
    from dlas_predict.measure.kernels.knobs import default_knobs

    def tile_w(ow, bits):
        spec = ConvSpec.parse(f"C=8,H={ow},W={ow},K=8,R=1,S=1,stride=1,pad=0")
        return default_knobs(spec, Variant("direct", "dense"), bits)["tile_w"]

    # a divisor of at least half a vector, or the whole row when it fits in one
    assert [tile_w(ow, 256) for ow in (4, 7, 14, 16, 20, 28)] == [4, 7, 7, 8, 4, 4]
    # none: a whole vector or a half one, whichever takes fewer vector ops
    assert [tile_w(ow, 256) for ow in (11, 13, 22, 9)] == [8, 8, 8, 8]
    assert [tile_w(ow, 128) for ow in (7, 5, 13)] == [4, 4, 4]
    assert tile_w(25, 512) == 16 and tile_w(14, 512) == 14


#: Every step of the fused epilogue, ReLU6 as its two clamps.
ALL_STEPS = (("bias",), ("residual",), ("max", 0.0), ("min", 6.0), ("silu",))


FUSED_CONV = "C=16,H=9,W=11,K=24,R=3,S=3,stride=2,pad=1"
#: depthwise with a channel multiplier, on a width no vector tile divides
DEPTHWISE_CONV = "C=12,H=9,W=11,K=24,R=3,S=3,stride=2,pad=1,groups=12"


def _fused_case(algorithm, sparse, dtype, steps=ALL_STEPS, conv=FUSED_CONV, vnni=False,
                asked=(), bits=256):
    """(kernel output, numpy reference) of a strided conv with the epilogue ``steps``
    (int8 GEMM: on AVX-512 VNNI where ``vnni``; ``asked``: the variant's own knobs; knobs
    for vectors of ``bits``)."""
    import numpy as np
    import tvm

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.build import build_kernel, device_args
    from dlas_predict.measure.kernels.spec import KernelSpec
    from dlas_predict.measure.kernels.reference import im2col, make_inputs

    spec = ConvSpec.parse(conv)
    comp = Compression.WEIGHT_PRUNING if sparse else {
        DType.FLOAT32: Compression.DENSE, DType.FLOAT16: Compression.FLOAT16,
        DType.INT8: Compression.INT8}[dtype]
    knobs = resolve_knobs(spec, Variant(algorithm, comp, 0.5 if sparse else 0.0, knobs=asked),
                          bits, vnni)
    rng = np.random.default_rng(3)
    x, w = make_inputs(spec, dtype, 1)
    if sparse:
        w = np.where(rng.random(w.shape) < 0.5, 0, w).astype(w.dtype)
    bias = rng.normal(size=spec.K).astype(np.float32)
    residual = rng.normal(size=spec.output_shape).astype(
        np.float16 if dtype is DType.FLOAT16 else np.float32)
    scale = 1e-3 if dtype is DType.INT8 else None
    ks = KernelSpec(spec, Algorithm(algorithm), sparse, dtype, knobs, scale, steps)
    args = device_args(ks, x, w, tvm.cpu(), {"bias": bias, "residual": residual})
    build_kernel(ks, tvm.target.Target(get_device("local").target))["main"](*args)
    out = args[-1].numpy()
    y = np.einsum("gkj,gjp->gkp",
                  w.astype(np.float64).reshape(spec.groups, spec.K // spec.groups, -1),
                  im2col(x.astype(np.float64), spec)).reshape(spec.output_shape)
    if dtype is DType.INT8:
        y = y * np.float32(scale)  # dequantised, not requantised
    for step in steps:
        y = {"bias": lambda v: v + bias.reshape(1, -1, 1, 1),
             "residual": lambda v: v + residual.astype(np.float64),
             "relu": lambda v: np.maximum(v, 0.0),
             "max": lambda v: np.maximum(v, step[-1]), "min": lambda v: np.minimum(v, step[-1]),
             "silu": lambda v: v / (1.0 + np.exp(-v))}[step[0]](y)
    return out, y, ks


def test_fused_epilogue_matches_reference():
    import numpy as np

    from dlas_predict.space.config import DType

    out, ref, ks = _fused_case("gemm", False, DType.FLOAT32)
    assert out.shape == ref.shape  # written NCHW: no reshape after the GEMM
    assert np.abs(out - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    # without the residual step there is no residual argument
    bias_relu = replace(ks, epilogue=(("bias",), ("relu",)))
    assert [name for name, _, _ in bias_relu.extra_inputs()] == ["bias"]


@pytest.mark.slow
@pytest.mark.parametrize("conv", [FUSED_CONV, DEPTHWISE_CONV], ids=["dense", "depthwise"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("algorithm", [a.value for a in GRID_ALGORITHMS])
def test_every_kernel_fuses_its_epilogue(algorithm, sparse, dtype, conv):
    import numpy as np

    from dlas_predict.space.config import DType

    dt = DType(dtype)
    out, ref, ks = _fused_case(algorithm, sparse, dt, conv=conv)
    # float16 rounds the output (about 5e-4 relative); int8 returns dequantised float32
    assert str(out.dtype) == ("float16" if dt is DType.FLOAT16 else "float32") == ks.out_dtype
    tol = (5e-3 if dt is DType.FLOAT16 else 1e-4) * max(1.0, np.abs(ref).max())
    assert np.abs(out.astype(np.float64) - ref).max() < tol


#: pointwise layers whose positions (49, 169) and filters (38, 22) no register tile divides
POINTWISE_CONVS = ["C=20,H=7,W=7,K=38,R=1,S=1,stride=1,pad=0",
                   "C=12,H=13,W=13,K=22,R=1,S=1,stride=1,pad=0"]


@pytest.mark.parametrize("bits", [512, 256])
@pytest.mark.parametrize("conv", POINTWISE_CONVS)
@pytest.mark.slow
def test_the_pointwise_gemm_overlaps_its_last_tiles_and_fuses_its_epilogue(conv, bits):
    """A float32 pointwise GEMM's last tile of positions and last block of filters start
    one tile before the end, computing a few outputs twice: every output matches the
    reference, through every epilogue step, on the tiles of either vector width."""
    import numpy as np

    from dlas_predict.space.config import DType

    spec = ConvSpec.parse(conv)
    out, ref, ks = _fused_case("gemm", False, DType.FLOAT32, conv=conv, bits=bits)
    tile_k, tile_p = ks.knobs["tile_k"], ks.knobs["tile_p"]
    assert ks.knobs["pointwise"] == 1
    assert (spec.OH * spec.OW) % tile_p and spec.K % tile_k
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_only_float32_pointwise_layers_that_fill_a_tile_run_the_pointwise_gemm():
    """Two vectors of positions by the filters the accumulators hold (one vector where the
    map holds fewer than two); the TE GEMM for another dtype, a strided, padded or grouped
    1x1, a 3x3, or a map or filters smaller than a tile. ``pointwise`` 0 asks for the TE
    GEMM; 1 where there is no pointwise GEMM is refused."""
    from dlas_predict.errors import ConfigError
    from dlas_predict.measure import kernels_version

    pw = ConvSpec.parse(POINTWISE_CONVS[0])
    dense = Variant("gemm", "dense")
    assert resolve_knobs(pw, dense, 512) == {"tile_k": 8, "tile_p": 32, "pointwise": 1}
    assert resolve_knobs(pw, dense, 256) == {"tile_k": 6, "tile_p": 16, "pointwise": 1}
    small = ConvSpec.parse("C=8,H=4,W=5,K=16,R=1,S=1,stride=1,pad=0")  # 20 positions
    assert pointwise_tile(small, DType.FLOAT32, 512) == (16, 16)
    for comp in ("float16", "int8"):
        assert "pointwise" not in resolve_knobs(pw, Variant("gemm", comp), 512)
    for text in ("C=20,H=7,W=7,K=36,R=1,S=1,stride=2,pad=0",
                 "C=20,H=7,W=7,K=36,R=1,S=1,stride=1,pad=1",
                 "C=20,H=7,W=7,K=36,R=1,S=1,stride=1,pad=0,groups=4",
                 "C=20,H=7,W=7,K=36,R=3,S=3,stride=1,pad=1",
                 "C=20,H=3,W=3,K=36,R=1,S=1,stride=1,pad=0",
                 "C=20,H=7,W=7,K=6,R=1,S=1,stride=1,pad=0"):
        spec = ConvSpec.parse(text)
        assert pointwise_tile(spec, DType.FLOAT32, 512) is None, text
        assert "pointwise" not in resolve_knobs(spec, dense, 512), text
        with pytest.raises(ConfigError, match="the pointwise GEMM runs"):
            resolve_knobs(spec, Variant("gemm", "dense", knobs=(("pointwise", 1),)), 512)
    te = resolve_knobs(pw, Variant("gemm", "dense", knobs=(("pointwise", 0),)), 512)
    assert "pointwise" not in te and te["tile_p"] == 16  # one vector, padded and cropped
    with pytest.raises(ConfigError, match="pointwise must be 1"):
        resolve_knobs(pw, Variant("gemm", "dense", knobs=(("pointwise", 2),)), 512)
    # its records are of other code than the TE GEMM's
    assert kernels_version("gemm", False, False, resolve_knobs(pw, dense, 512)) != \
        kernels_version("gemm", False, False, te)


def test_fast_exp_and_sigmoid_match_numpy_over_the_float32_range():
    import numpy as np
    import tvm
    from tvm import te

    from dlas_predict.measure.kernels.spec import fast_exp, fast_sigmoid

    x = np.concatenate([np.linspace(-87.0, 87.0, 20001), [-200.0, -88.0, 0.0, 1e-8, 88.0, 200.0]]
                       ).astype(np.float32)
    t = te.placeholder(x.shape, "float32", name="x")
    outs = [te.compute(x.shape, lambda i: fast_exp(t[i]), name="e"),
            te.compute(x.shape, lambda i: fast_sigmoid(t[i]), name="s")]
    f = tvm.compile(te.create_prim_func([t, *outs]), target="llvm")
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(np.zeros_like(x)) for _ in outs]
    f(*args)
    e, s = (a.numpy().astype(np.float64) for a in args[1:])
    ref = np.exp(x.astype(np.float64))
    inner = np.abs(x) <= 87.0
    assert np.max(np.abs(e[inner] - ref[inner]) / ref[inner]) < 1e-6
    assert e[x == -200.0][0] == 0.0 and np.isfinite(s).all()
    ref_s = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    assert np.max(np.abs(s - ref_s)) < 1e-6
    # past its bound the sigmoid is held a few float32 epsilons from 0 or 1, so a SiLU
    # there is off by about the rounding of its input
    assert 0.0 < 1.0 - s[x == 200.0][0] < 3e-7 and 0.0 < s[x == -200.0][0] < 3e-7
    silu = x.astype(np.float64) * s
    assert np.max(np.abs(silu - x * ref_s) / np.maximum(1.0, np.abs(x))) < 1e-6


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_fused_silu_calls_no_scalar_exp(sparse):
    """LLVM lowers ``exp`` to libm's scalar ``expf``, lane by lane: the fused SiLU must not."""
    import tvm

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.spec import KernelSpec

    spec = ConvSpec.parse(FUSED_CONV)
    comp = Compression.WEIGHT_PRUNING if sparse else Compression.DENSE
    algorithm = Algorithm.DIRECT if sparse else Algorithm.SPATIAL_PACK
    knobs = resolve_knobs(spec, Variant(algorithm, comp, 0.5 if sparse else 0.0), 256)
    ks = KernelSpec(spec, algorithm, sparse, DType.FLOAT32, knobs, None,
                    (("bias",), ("silu",)))
    lib = build_kernel(ks, tvm.target.Target(get_device("local").target))
    ir = lib.mod.inspect_source("ll")
    assert "define" in ir
    assert "expf" not in ir and "llvm.exp." not in ir


def test_depthwise_direct_kernel_pads_its_tiles_and_fuses_its_epilogue():
    """The depthwise direct kernel computes whole register tiles (neither 11 nor 5 output
    columns divide its vector width) and crops them through the epilogue."""
    import numpy as np

    from dlas_predict.space.config import DType

    out, ref, ks = _fused_case("direct", False, DType.FLOAT32, conv=DEPTHWISE_CONV)
    assert ks.knobs["tile_w"] % 8 == 0 and ks.conv.OW % ks.knobs["tile_w"]
    assert np.abs(out - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_a_strided_depthwise_row_takes_the_vector_or_half_vector_that_pads_it_least():
    """At stride 2 the row tile is a whole vector or half of one (never under four lanes),
    whichever pads the output row least, ties to the whole vector; at stride 1, two
    vectors or one."""
    def tile_w(ow, stride, bits):
        w = (ow - 1) * stride + 1
        spec = ConvSpec.parse(f"C=8,H={w},W={w},K=8,R=3,S=3,stride={stride},pad=1,groups=8")
        return default_knobs(spec, Variant("direct", "dense"), bits)["tile_w"]

    assert [tile_w(ow, 2, 512) for ow in (18, 56, 7, 26, 16)] == [8, 8, 8, 16, 16]
    assert [tile_w(ow, 2, 256) for ow in (18, 56, 7, 26, 4)] == [4, 8, 8, 4, 4]
    assert [tile_w(ow, 2, 128) for ow in (18, 26, 5)] == [4, 4, 4]
    assert [tile_w(ow, 1, 512) for ow in (18, 40, 32)] == [32, 16, 32]


@pytest.mark.slow
def test_a_small_depthwise_map_takes_a_tile_of_its_width_and_more_channels_a_task(target):
    """A row narrower than half a vector takes a tile of its width where a whole vector
    would compute mostly padding (4 columns: 4 lanes; 7 or 8: 8), at either stride; a map
    of fewer than 32 positions takes enough channels a task for 64 outputs, as many as the
    accumulators hold; larger maps keep their tiles. Each matches the reference."""
    def knobs(hw, stride, bits, c=96):
        w = (hw - 1) * stride + 1
        spec = ConvSpec.parse(f"C={c},H={w},W={w},K={c},R=3,S=3,stride={stride},pad=1,"
                              f"groups={c}")
        return spec, default_knobs(spec, Variant("direct", "dense"), bits)

    assert knobs(4, 1, 512)[1] == {"tile_k": 4, "tile_h": 2, "tile_w": 4}
    assert knobs(4, 2, 512)[1] == {"tile_k": 4, "tile_h": 2, "tile_w": 4}
    assert knobs(2, 1, 512)[1] == {"tile_k": 8, "tile_h": 2, "tile_w": 4}  # 16 accumulators
    assert knobs(7, 1, 512)[1]["tile_w"] == knobs(8, 1, 512)[1]["tile_w"] == 8
    assert knobs(8, 1, 512)[1]["tile_k"] == 2
    assert knobs(8, 1, 256)[1]["tile_w"] == 8 and knobs(4, 1, 256)[1]["tile_w"] == 4
    assert knobs(16, 1, 512)[1] == {"tile_k": 2, "tile_h": 2, "tile_w": 16}
    assert knobs(28, 1, 512)[1]["tile_w"] == 32 and knobs(56, 2, 512)[1]["tile_w"] == 8
    for hw, stride in ((4, 1), (4, 2), (7, 1)):
        spec, k = knobs(hw, stride, 512, c=12)
        result = run_task(_task(spec, Variant("direct", "dense"), target, knobs=k))
        assert result.error is None and result.verified, (result.error, k)


@pytest.mark.parametrize("knobs", [{"tile_k": 4, "tile_h": 3, "tile_w": 4},
                                   {"tile_k": 1, "tile_h": 1, "tile_w": 32}])
@pytest.mark.slow
def test_depthwise_direct_knobs_still_correct(knobs, target):
    spec = ConvSpec.parse("C=8,H=13,W=10,K=16,R=5,S=5,stride=1,pad=2,groups=8")
    variant = Variant("direct", "dense", knobs=tuple(knobs.items()))
    result = run_task(_task(spec, variant, target, knobs=resolve_knobs(spec, variant)))
    assert result.verified, result.max_error


#: a filter count no vector divides (a channel-pruned layer keeps any number)
ODD_K_CONV = "C=16,H=9,W=11,K=53,R=3,S=3,stride=2,pad=1"


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.slow
def test_spatial_pack_pads_its_last_block_of_filters(dtype):
    """A spatial pack on 53 filters computes whole vector blocks of filters, the last one
    padded with zero filters, and crops them through its (fused) epilogue."""
    import numpy as np

    from dlas_predict.space.config import DType

    dt = DType(dtype)
    out, ref, ks = _fused_case("spatial_pack", False, dt, conv=ODD_K_CONV)
    assert ks.knobs["tile_k"] == 8 and ks.conv.K % 8  # AVX2's 8 lanes: blocks of 56
    tol = (5e-3 if dt is DType.FLOAT16 else 1e-4) * max(1.0, np.abs(ref).max())
    assert out.shape == ref.shape and np.abs(out.astype(np.float64) - ref).max() < tol
    plain, ref, _ = _fused_case("spatial_pack", False, DType.FLOAT32, steps=(),
                                conv=ODD_K_CONV)
    assert np.abs(plain - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("steps", [(("bias",), ("silu",)),
                                   (("bias",), ("relu",), ("residual",), ("max", -0.5))],
                         ids=["on-the-tile", "split-at-the-residual"])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_spatial_pack_splits_its_epilogue_at_the_residual_add(steps, dtype):
    """The steps before a residual add run on the packed register tile (the padded filters
    of the last block read a real bias), the rest while the tile is unpacked to NCHW."""
    import numpy as np

    from dlas_predict.space.config import DType

    out, ref, ks = _fused_case("spatial_pack", False, DType(dtype), steps=steps,
                               conv=ODD_K_CONV)
    assert ks.conv.K % ks.knobs["tile_k"]
    assert np.abs(out.astype(np.float64) - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_the_filter_block_pads_only_where_no_vector_divides_the_filters():
    from dlas_predict.errors import ConfigError

    sp = Variant("spatial_pack", "dense")
    k = {K: default_knobs(ConvSpec.parse(f"C=16,H=8,W=8,K={K},R=3,S=3,stride=1,pad=1"), sp,
                          256)["tile_k"] for K in (64, 24, 20, 53, 31, 60)}
    # fewest vector updates: 20 as 3 blocks of 8 (the divisor 10 takes 2 vectors a block);
    # a divisor that is no whole vector (15, 12 on 8 lanes) gives way to whole vectors
    assert k == {64: 16, 24: 8, 20: 8, 53: 8, 31: 16, 60: 16}
    wide = {K: default_knobs(ConvSpec.parse(f"C=16,H=20,W=20,K={K},R=3,S=3,stride=1,pad=1"),
                             sp, 512) for K in (124, 54, 18, 13, 48)}
    # on 16 lanes: two vectors where that executes less (124 = 4 x 31, 54 = 2 x 27,
    # 18 = 2 x 9 each as two 32s, the last padded), one where a single vector covers the
    # filters (13), and a divisor of whole vectors is kept (48 as three 16s)
    assert {K: kn["tile_k"] for K, kn in wide.items()} == {124: 32, 54: 32, 18: 32, 13: 16,
                                                           48: 16}
    # a row of 20 in tiles split evenly: three of 7 (two vectors of filters), two of 10
    assert wide[124]["tile_w"] == 7 and wide[13]["tile_w"] == 10
    assert default_knobs(ConvSpec.parse("C=16,H=8,W=8,K=53,R=3,S=3,stride=1,pad=1"), sp,
                         512)["tile_k"] == 32
    # a grouped conv's blocks must stay within a group
    grouped = ConvSpec.parse("C=24,H=9,W=10,K=36,R=1,S=1,stride=1,pad=0,groups=3")
    with pytest.raises(ConfigError, match="must divide 12"):
        resolve_knobs(grouped, Variant("spatial_pack", "dense", knobs=(("tile_k", 8),)))
    # the kernel features count the padded filters
    from dlas_predict.models.features import _waste, loop_counts
    from dlas_predict.corpus.kernels import KernelConfig

    spec = ConvSpec.parse(ODD_K_CONV)
    cfg = KernelConfig(spec, Algorithm.SPATIAL_PACK, Compression.DENSE, 0.0)
    knobs = {"tile_k": 8, "tile_h": 1, "tile_w": 8}
    assert loop_counts(cfg, knobs)[0] == 7 * spec.OH
    assert _waste(spec, knobs) == pytest.approx(56 / 53 * 8 / spec.OW * 1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("algorithm", ["direct", "gemm"])
@pytest.mark.slow
def test_a_register_tile_pads_its_last_block_of_filters(algorithm, dtype):
    """53 filters (prime) and 118 (twice a prime): the register tile computes whole blocks
    of at least four filters, the last one padded, and crops them through the fused
    epilogue; every dtype matches the reference."""
    import numpy as np

    from dlas_predict.space.config import DType

    dt = DType(dtype)
    for conv in (ODD_K_CONV, "C=8,H=6,W=8,K=118,R=1,S=1,stride=1,pad=0"):
        out, ref, ks = _fused_case(algorithm, False, dt, conv=conv)
        assert ks.knobs["tile_k"] >= 4 and ks.conv.K % ks.knobs["tile_k"], ks.knobs
        tol = (5e-3 if dt is DType.FLOAT16 else 1e-4) * max(1.0, np.abs(ref).max())
        assert out.shape == ref.shape and np.abs(out.astype(np.float64) - ref).max() < tol


def test_the_register_tile_pads_filters_only_where_no_block_of_four_divides_them():
    from dlas_predict.errors import ConfigError
    from dlas_predict.models.features import _waste, loop_counts
    from dlas_predict.corpus.kernels import KernelConfig

    def tile_k(algorithm, K, groups=1, bits=512):
        spec = ConvSpec.parse(f"C={2 * groups},H=8,W=8,K={K},R=3,S=3,stride=1,pad=1,"
                              f"groups={groups}")
        return default_knobs(spec, Variant(algorithm, "dense"), bits)["tile_k"]

    for algorithm in ("direct", "gemm"):
        # a divisor of at least four (or all of a K under four) is kept: no padding
        assert [tile_k(algorithm, K) for K in (64, 48, 36, 35, 12, 3, 1)] == \
            [8, 8, 4, 7, 4, 3, 1]
        # otherwise the block of four or more that pads K least, within the accumulators
        assert tile_k(algorithm, 118) == 7 and tile_k(algorithm, 59) == 4
        assert tile_k(algorithm, 53, bits=512) == 9 and tile_k(algorithm, 53, bits=256) == 6
        # a grouped conv's blocks stay within its groups
        assert tile_k(algorithm, 118, groups=2) == 2
        grouped = ConvSpec.parse("C=4,H=8,W=8,K=118,R=3,S=3,stride=1,pad=1,groups=2")
        with pytest.raises(ConfigError, match="must divide 118"):
            resolve_knobs(grouped, Variant(algorithm, "dense", knobs=(("tile_k", 8),)))
    # the features count the padded filters
    spec = ConvSpec.parse(ODD_K_CONV)
    cfg = KernelConfig(spec, Algorithm.GEMM, Compression.DENSE, 0.0)
    knobs = {"tile_k": 6, "tile_p": 6}
    tasks, ops, _decodes, _layout = loop_counts(cfg, knobs)
    assert tasks == 9 * 5 and ops == 54 * 5 * 16 * 9
    assert _waste(spec, knobs) == pytest.approx(54 / 53 * 30 / 30)


def test_tile_h_is_refused_on_a_dense_direct_kernel():
    from dlas_predict.errors import ConfigError

    spec = ConvSpec.parse("C=8,H=13,W=10,K=16,R=3,S=3,stride=1,pad=1")
    with pytest.raises(ConfigError, match="depthwise"):
        resolve_knobs(spec, Variant("direct", "dense", knobs=(("tile_h", 2),)))


def test_a_missing_epilogue_argument_is_refused():
    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.build import device_args
    from dlas_predict.measure.kernels.spec import KernelSpec
    import numpy as np

    spec = ConvSpec.parse("C=4,H=6,W=6,K=8,R=3,S=3,stride=1,pad=1")
    ks = KernelSpec(spec, Algorithm.DIRECT, False, DType.FLOAT32, {"tile_k": 4, "tile_w": 6},
                    None, (("bias",), ("residual",)))
    with pytest.raises(ValueError, match="residual"):
        device_args(ks, np.zeros(spec.input_shape, np.float32),
                    np.zeros(spec.weight_shape, np.float32), None, {"bias": np.zeros(8)})


#: The VNNI GEMM runs where this CPU has AVX-512 VNNI; it is built and read anywhere.
needs_vnni = pytest.mark.skipif(not get_device("local").vnni,
                                reason="this CPU has no AVX-512 VNNI to run the VNNI GEMM")
VNNI_SHAPES = [SHAPES[3],                                        # strides, dilation, padding
               "C=40,H=7,W=7,K=20,R=1,S=1,stride=1,pad=0",     # K and positions padded
               "C=8,H=1,W=1,K=1000,R=1,S=1,stride=1,pad=0"]    # one position


@pytest.mark.slow
@needs_vnni
@pytest.mark.parametrize("text", VNNI_SHAPES)
def test_vnni_gemm_matches_reference(text, target):
    spec = ConvSpec.parse(text)
    variant = Variant("gemm", "int8", knobs=(("vnni", 1),))  # asked for: one position too
    knobs = resolve_knobs(spec, variant, 512)
    assert knobs["vnni"] == 1 and knobs["tile_p"] in (8, 16)
    result = run_task(_task(spec, variant, target, knobs))
    assert result.verified, f"max error {result.max_error}"


@pytest.mark.slow
@needs_vnni
@pytest.mark.parametrize("steps", [ALL_STEPS], ids=["all"])
@pytest.mark.parametrize("conv", [FUSED_CONV, "C=8,H=5,W=13,K=33,R=3,S=1,stride=1,pad=1",
                                  "C=8,H=8,W=8,K=32,R=3,S=3,stride=1,pad=1"],
                         ids=["cropped", "cropped-odd", "whole-tiles"])
def test_vnni_gemm_fuses_its_epilogue_and_writes_nchw(steps, conv):
    import numpy as np

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.spec import uses_vnni

    out, ref, ks = _fused_case("gemm", False, DType.INT8, steps=steps, conv=conv, vnni=True)
    assert uses_vnni(ks) and out.shape == ref.shape and str(out.dtype) == "float32"
    assert np.abs(out.astype(np.float64) - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.slow
def test_vnni_gemm_compiles_to_vpdpbusd_for_a_vnni_cpu():
    """Built for Cascade Lake (no VNNI hardware needed to compile): the main loop is
    ``vpdpbusd``; the same kernel without the knob has none."""
    import tvm

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.spec import KernelSpec

    spec = ConvSpec.parse(SHAPES[0])
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                "mcpu": "cascadelake"})
    for vnni in (True, False):
        knobs = resolve_knobs(spec, Variant("gemm", "int8"), 512, vnni)
        asm = build_kernel(KernelSpec(spec, Algorithm.GEMM, False, DType.INT8, knobs),
                           target).mod.inspect_source("s")
        assert ("vpdpbusd" in asm) is vnni


PMADDWD = (("pmaddwd", 1),)


@pytest.mark.slow
@pytest.mark.parametrize("text", VNNI_SHAPES)
def test_pmaddwd_gemm_matches_reference(text, target):
    """The int8 GEMM on AVX2's vpmaddwd (int16 pairs, exact) on any CPU of AVX2 or more."""
    spec = ConvSpec.parse(text)
    variant = Variant("gemm", "int8", knobs=PMADDWD)
    knobs = resolve_knobs(spec, variant, 256)
    assert knobs["pmaddwd"] == 1 and knobs["tile_p"] == 8
    result = run_task(_task(spec, variant, target, knobs))
    assert result.verified, f"max error {result.max_error}"


@pytest.mark.parametrize("conv", [FUSED_CONV, "C=7,H=5,W=13,K=33,R=3,S=1,stride=1,pad=1"],
                         ids=["cropped", "odd-reduction"])
@pytest.mark.slow
def test_pmaddwd_gemm_fuses_its_epilogue(conv):
    import numpy as np

    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.spec import uses_pmaddwd

    out, ref, ks = _fused_case("gemm", False, DType.INT8, conv=conv, asked=PMADDWD)
    assert uses_pmaddwd(ks) and out.shape == ref.shape
    assert np.abs(out.astype(np.float64) - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())


def test_pmaddwd_gemm_compiles_to_vpmaddwd_and_takes_its_knobs_only_as_asked():
    """Built for an AVX2 CPU: the main loop is ``vpmaddwd``; the knob is asked for by name
    (no default uses it), on the int8 GEMM only, with its 8 lanes, and not with vnni."""
    import tvm

    from dlas_predict.errors import ConfigError
    from dlas_predict.space.config import DType
    from dlas_predict.measure.kernels.build import build_kernel
    from dlas_predict.measure.kernels.spec import KernelSpec

    spec = ConvSpec.parse(SHAPES[0])
    knobs = resolve_knobs(spec, Variant("gemm", "int8", knobs=PMADDWD), 256)
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                "mcpu": "haswell"})
    asm = build_kernel(KernelSpec(spec, Algorithm.GEMM, False, DType.INT8, knobs),
                       target).mod.inspect_source("s")
    assert "vpmaddwd" in asm
    assert "pmaddwd" not in resolve_knobs(spec, Variant("gemm", "int8"), 256)
    with pytest.raises(ConfigError, match="8 lanes"):
        resolve_knobs(spec, Variant("gemm", "int8", knobs=(*PMADDWD, ("tile_p", 16))))
    with pytest.raises(ConfigError, match="ask for one"):
        resolve_knobs(spec, Variant("gemm", "int8", knobs=(*PMADDWD, ("vnni", 1))))
    with pytest.raises(ConfigError, match="unknown knob 'pmaddwd'"):
        resolve_knobs(spec, Variant("direct", "int8", knobs=PMADDWD))


def test_vnni_knobs_apply_to_ungrouped_int8_gemm_only():
    from dlas_predict.errors import ConfigError
    from dlas_predict.measure.kernels.knobs import vnni_capable
    from dlas_predict.models.features import loop_counts
    from dlas_predict.corpus.kernels import KernelConfig

    dense = ConvSpec.parse("C=64,H=16,W=16,K=24,R=3,S=3,stride=1,pad=1")
    grouped = ConvSpec.parse(SHAPES[1])
    assert default_knobs(dense, Variant("gemm", "int8"), 512, vnni=True) == \
        {"tile_k": 12, "tile_p": 16, "vnni": 1}
    # too few positions for a vector of them: the plain int8 GEMM
    one = ConvSpec.parse("C=64,H=2,W=2,K=24,R=1,S=1,stride=1,pad=0")
    assert "vnni" not in default_knobs(one, Variant("gemm", "int8"), 512, vnni=True)
    assert "vnni" not in default_knobs(dense, Variant("gemm", "int8"), 512)
    for spec, variant in ((grouped, Variant("gemm", "int8")),
                          (dense, Variant("gemm", "dense")),
                          (dense, Variant("direct", "int8")),
                          (dense, Variant("gemm", "weight_pruning", 0.5))):
        assert not vnni_capable(variant, spec)
        assert "vnni" not in default_knobs(spec, variant, 512, vnni=True)
    # asked for by name on a CPU whose defaults do not use it; its lanes are 8 or 16
    asked = resolve_knobs(dense, Variant("gemm", "int8", knobs=(("vnni", 1),)), 512)
    assert asked["vnni"] == 1 and asked["tile_k"] == 12
    with pytest.raises(ConfigError, match="8 or 16"):
        resolve_knobs(dense, Variant("gemm", "int8", knobs=(("vnni", 1), ("tile_p", 12))))
    with pytest.raises(ConfigError, match="unknown knob 'vnni'"):
        resolve_knobs(dense, Variant("gemm", "dense", knobs=(("vnni", 1),)))
    # the features count one instruction per filter, vector of 16 positions and word of
    # four reduction elements
    cfg = KernelConfig(dense, Algorithm.GEMM, Compression.INT8, 0.0)
    tasks, ops, _decodes, layout = loop_counts(cfg, asked)
    assert tasks == 2 * 16 and ops == 24 * 16 * 144 and layout == 144 * 256
