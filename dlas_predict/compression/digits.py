"""The shipped real task: scikit-learn's handwritten digits, upsampled to a network's input.

scikit-learn ships the data (1,797 8×8 grey images, 10 classes), so nothing is downloaded.
The split is fixed (stratified, seed 0): 1,437 training images, 360 held out. Images are
resized bilinearly to the network's input size, replicated over its channels and scaled to
[-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPLIT_SEED = 0
TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    """Labelled images ready for a network: ``x`` is float32 N×C×H×W, ``y`` int64 N."""

    name: str
    x: np.ndarray
    y: np.ndarray
    skipped: int = 0  # images that could not be decoded, left out

    def __len__(self) -> int:
        return len(self.y)


def _raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32), d.target.astype(np.int64)


def resize(images: np.ndarray, channels: int, size: tuple[int, int]) -> np.ndarray:
    """Grey N×h×w images in [0, 16] → float32 N×channels×H×W in [-1, 1] (bilinear)."""
    from scipy.ndimage import zoom

    n, h, w = images.shape
    big = zoom(images, (1, size[0] / h, size[1] / w), order=1, grid_mode=True,
               mode="nearest")
    big = np.clip(big / 16.0, 0.0, 1.0) * 2.0 - 1.0
    return np.ascontiguousarray(np.repeat(big[:, None], channels, axis=1), dtype=np.float32)


def digits(split: str, input_shape: tuple[int, int, int]) -> Dataset:
    """The ``train`` or ``test`` split of digits, sized for a C×H×W network input."""
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images, labels = _raw()
    idx_train, idx_test = train_test_split(np.arange(len(labels)), test_size=TEST_FRACTION,
                                           random_state=SPLIT_SEED, stratify=labels)
    idx = idx_train if split == "train" else idx_test
    c, h, w = input_shape
    return Dataset(f"digits-{split}", resize(images[idx], c, (h, w)), labels[idx])
