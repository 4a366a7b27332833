"""The numpy reference is itself checked against an independent implementation (torch)."""
import numpy as np
import pytest
import torch

from dlas_predict.space.config import ConvSpec, DType
from dlas_predict.measure.kernels.reference import (check_output, conv2d_reference, int8_scale,
                                                    make_inputs, requantize)


@pytest.mark.parametrize("text", [
    "C=8,H=11,W=9,K=6,R=3,S=3,stride=1,pad=1",
    "C=8,H=11,W=9,K=8,R=3,S=3,stride=2,pad=1,groups=8",
    "C=6,H=10,W=12,K=9,R=3,S=2,stride=2x1,pad=2:1:0:1,groups=3,dilation=2x1",
])
def test_reference_matches_torch(text):
    spec = ConvSpec.parse(text)
    x, w = make_inputs(spec, DType.FLOAT32, seed=3)
    xt = torch.nn.functional.pad(torch.tensor(x), (spec.pad_l, spec.pad_r, spec.pad_t,
                                                   spec.pad_b))
    ref = torch.nn.functional.conv2d(xt, torch.tensor(w), stride=(spec.stride_h, spec.stride_w),
                                     dilation=(spec.dilation_h, spec.dilation_w),
                                     groups=spec.groups).numpy()
    out = conv2d_reference(x, w, spec, DType.FLOAT32)
    assert out.shape == spec.output_shape
    assert np.allclose(out, ref, atol=1e-5)


def test_int8_reference_requantises_exact_integer_accumulation():
    spec = ConvSpec.parse("C=4,H=5,W=5,K=3,R=3,S=3,stride=1,pad=1")
    x, w = make_inputs(spec, DType.INT8, seed=0)
    out = conv2d_reference(x, w, spec, DType.INT8)
    acc = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64),
                                     torch.tensor(w, dtype=torch.float64), padding=1).numpy()
    assert out.dtype == np.int8
    assert np.array_equal(out, requantize(acc.astype(np.int32), int8_scale(spec)))
    assert np.unique(out).size > 20  # the scale uses the int8 range, not just a few values


def test_check_output_flags_wrong_results():
    ref = np.ones((1, 2, 3, 3))
    assert check_output(ref.astype(np.float32), ref, DType.FLOAT32)[0]
    bad = ref.copy()
    bad[0, 0, 0, 0] = 1.5
    ok, err = check_output(bad.astype(np.float32), ref, DType.FLOAT32)
    assert not ok and err == pytest.approx(0.5)
