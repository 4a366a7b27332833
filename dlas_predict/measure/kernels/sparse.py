"""Pruning a single layer's weights and the CSR format the sparse kernels read.

Pruning here is per layer (magnitude, the L1 criterion); global pruning over a network is the
compression module's job and hands each layer its own sparsity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlas_predict.space.config import SparsityPattern


@dataclass(frozen=True)
class CSR:
    """Weights [K, C/g*R*S] in compressed sparse rows: one row per output channel."""

    data: np.ndarray     # [nnz] weight values
    indices: np.ndarray  # [nnz] int32 column index j = c*R*S + r*S + s
    indptr: np.ndarray   # [K+1] int32

    @property
    def nnz(self) -> int:
        return int(self.data.size)


def prune(w: np.ndarray, ratio: float, pattern: SparsityPattern) -> np.ndarray:
    """Zero the ``ratio`` fraction of weights with the smallest magnitude.

    ``unstructured``: individual weights; ``channel``: whole output channels, ranked by L1 norm.
    """
    out = w.copy()
    if pattern is SparsityPattern.CHANNEL:
        k = w.shape[0]
        n_zero = int(round(ratio * k))
        n_zero = min(max(n_zero, 0), k - 1)  # keep at least one channel
        norms = np.abs(w.reshape(k, -1).astype(np.float64)).sum(axis=1)
        out[np.argsort(norms, kind="stable")[:n_zero]] = 0
        return out
    flat = out.reshape(-1)
    n_zero = min(int(round(ratio * flat.size)), flat.size - 1)
    order = np.argsort(np.abs(flat.astype(np.float64)), kind="stable")
    flat[order[:n_zero]] = 0
    return out


def to_csr(w: np.ndarray) -> CSR:
    """[K, C/g, R, S] -> CSR over rows K and columns C/g*R*S."""
    mat = w.reshape(w.shape[0], -1)
    rows, cols = np.nonzero(mat)
    indptr = np.zeros(mat.shape[0] + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=mat.shape[0]), out=indptr[1:])
    data = mat[rows, cols]
    if data.size == 0:  # keep buffers non-empty; an explicit zero changes nothing
        data = np.zeros(1, dtype=w.dtype)
        cols = np.zeros(1, dtype=np.int64)
        indptr[1:] = 1
        indptr[0] = 0
    return CSR(data=np.ascontiguousarray(data), indices=cols.astype(np.int32),
               indptr=indptr)


def sparsity(w: np.ndarray) -> float:
    """Fraction of exactly-zero weights."""
    return float(np.count_nonzero(w == 0)) / max(w.size, 1)
