import pytest

from dlas_predict.space.config import (GRID_ALGORITHMS, Algorithm, Compression, ConvSpec, DType, Variant,
                                       check_ratio, variant_grid)
from dlas_predict.errors import ConfigError, SpecError


def test_parse_spec_and_round_trip():
    spec = ConvSpec.parse("C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1")
    assert (spec.OH, spec.OW) == (56, 56)
    assert spec.macs == 64 * 64 * 9 * 56 * 56
    assert ConvSpec.parse(spec.to_spec()) == spec


@pytest.mark.parametrize("text", [
    "C=32,H=112,W=112,K=32,R=3,S=3,stride=1,pad=1,groups=32",
    "C=3,H=20,W=21,K=8,R=5,S=3,stride=2x1,pad=2:1:0:1,dilation=2x1",
    "C=24,H=9,W=10,K=36,R=1,S=1,stride=1,pad=0,groups=3",
])
def test_round_trip_general(text):
    spec = ConvSpec.parse(text)
    assert ConvSpec.parse(spec.to_spec()) == spec
    assert ConvSpec.from_dict(spec.to_dict()) == spec


def test_depthwise_shape():
    spec = ConvSpec.parse("C=32,H=112,W=112,K=32,R=3,S=3,stride=2,pad=1,groups=32")
    assert spec.depthwise and spec.weight_shape == (32, 1, 3, 3) and spec.OH == 56


@pytest.mark.parametrize("text,needle", [
    ("C=0,H=56,W=56,K=64,R=3,S=3", "positive"),
    ("C=64,H=-1,W=56,K=64,R=3,S=3", "positive"),
    ("C=64,H=4,W=4,K=64,R=7,S=7,pad=1", "larger than the padded input"),
    ("C=64,H=56,W=56,K=64,R=3", "missing S"),
    ("C=64,H=56,W=56,K=64,R=3,S=3,groups=5", "must divide"),
    ("C=64,H=56,W=56,K=64,R=3,S=3,foo=1", "unknown conv spec key"),
    ("C=sixty,H=56,W=56,K=64,R=3,S=3", "not an integer"),
    ("", "empty"),
    ("C=64,H=56,W=56,K=64,R=3,S=3,N=4", "batch"),
])
def test_bad_specs(text, needle):
    with pytest.raises(SpecError, match=needle):
        ConvSpec.parse(text)


def test_enums_parse_and_list_allowed_values():
    assert Algorithm.parse("spatial-pack") is Algorithm.SPATIAL_PACK
    assert Compression.parse_list("all") == list(Compression)
    with pytest.raises(ConfigError, match="allowed: direct, gemm, spatial_pack, winograd"):
        Algorithm.parse("fft")
    with pytest.raises(ConfigError, match="weight_pruning"):
        Compression.parse_list("dense,bogus")


@pytest.mark.parametrize("ratio", [0, 1, 1.5, -0.1, "x"])
def test_ratio_out_of_range(ratio):
    with pytest.raises(ConfigError, match=r"\(0, 1\)"):
        check_ratio(ratio)


def test_full_grid_is_15_variants_with_canonical_kernels():
    grid = variant_grid(GRID_ALGORITHMS, list(Compression), 0.8)
    assert len(grid) == 15
    pruned = [v for v in grid if v.sparse]
    assert len(pruned) == 6 and all(v.ratio == 0.8 and v.dtype is DType.FLOAT32 for v in pruned)
    assert {v.dtype for v in grid if v.compression is Compression.INT8} == {DType.INT8}
    assert all(v.ratio == 0 for v in grid if not v.sparse)


def test_variant_round_trip_and_ratio_rules():
    v = Variant("gemm", "weight_pruning", 0.5, knobs={"tile_p": 32})
    assert Variant.from_dict(v.to_dict()) == v
    with pytest.raises(ConfigError, match="takes no ratio"):
        Variant("gemm", "dense", 0.5)
