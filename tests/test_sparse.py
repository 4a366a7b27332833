import numpy as np
import pytest

from dlas_predict.space.config import SparsityPattern
from dlas_predict.measure.kernels.sparse import prune, sparsity, to_csr


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9, 0.99])
def test_unstructured_prune_hits_ratio_and_keeps_largest(ratio):
    w = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype(np.float32)
    p = prune(w, ratio, SparsityPattern.UNSTRUCTURED)
    assert abs(sparsity(p) - ratio) < 1e-3
    kept = np.abs(w[p != 0])
    dropped = np.abs(w[p == 0])
    assert kept.min() >= dropped.max()


def test_channel_prune_zeroes_whole_lowest_l1_channels():
    w = np.random.default_rng(1).standard_normal((20, 8, 3, 3)).astype(np.float32)
    p = prune(w, 0.5, SparsityPattern.CHANNEL)
    zero_rows = [k for k in range(20) if not p[k].any()]
    assert len(zero_rows) == 10
    norms = np.abs(w).reshape(20, -1).sum(1)
    assert set(zero_rows) == set(np.argsort(norms)[:10])
    assert all(np.array_equal(p[k], w[k]) for k in range(20) if k not in zero_rows)


def test_csr_round_trip():
    w = prune(np.random.default_rng(2).standard_normal((6, 4, 3, 3)).astype(np.float32), 0.7,
              SparsityPattern.UNSTRUCTURED)
    csr = to_csr(w)
    dense = np.zeros((6, 36), np.float32)
    for k in range(6):
        for j in range(csr.indptr[k], csr.indptr[k + 1]):
            dense[k, csr.indices[j]] = csr.data[j]
    assert np.array_equal(dense.reshape(w.shape), w)
    assert csr.nnz == np.count_nonzero(w) and csr.indices.dtype == np.int32


def test_csr_of_all_zero_weights_is_valid():
    csr = to_csr(np.zeros((4, 2, 1, 1), np.float32))
    assert csr.indptr.tolist() == [0, 1, 1, 1, 1] and csr.data.tolist() == [0.0]
