"""The data sets ``--data`` names, read into the network's input: ``digits``, an ``.npz``
(x/images [+ y/labels]), an image folder of class subfolders (ImageFolder's layout: labels
in sorted subfolder order) and a CSV of image paths and labels.

Images are resized bilinearly to the network's H×W, made grey or RGB by its C, and
normalised: ``(pixel/255 - mean) / std`` per channel, where mean and std come from the
options, else from the ONNX model's metadata (keys ``mean`` and ``std``: comma-separated,
on the 0-1 scale), else 0.5 and 0.5 (the digits task's [-1, 1]). An image that cannot be
decoded is skipped and counted (:attr:`Dataset.skipped`), never guessed.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dlas_predict.compression.digits import Dataset
from dlas_predict.errors import DlasError, param

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
#: The seed of the subset ``limit`` keeps (the same images every run).
LIMIT_SEED = 0


class DataError(DlasError):
    """A data set that cannot be read or does not fit the model."""


@dataclass(frozen=True)
class DataOptions:
    """How images become the network's input: ``limit`` images at most (a seeded random
    subset), per-channel ``mean``/``std`` on the 0-1 scale (None: the model's metadata, else
    0.5), and ``input_size`` (H, W) for a model whose input leaves them open.
    ``finetune_split``: the images (other than digits, which has its own training split) are
    split in two seeded halves, one to fine-tune pruned networks on and the other to measure
    every candidate on, the uncompressed network included (:func:`split_for_finetune`)."""

    limit: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    input_size: tuple[int, int] | None = None
    finetune_split: bool = False

    def __post_init__(self):
        if self.limit is not None and self.limit < 1:
            raise DataError(f"{param('limit')} must be at least 1, got {self.limit}")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None and (not v or any(not np.isfinite(a) for a in v)):
                raise DataError(f"{param(name)} needs one number or one per channel, got {v}")
        if self.std is not None and any(a <= 0 for a in self.std):
            raise DataError(f"{param('std')} must be positive, got {self.std}")
        if self.input_size is not None and min(self.input_size) < 1:
            raise DataError(f"{param('input_size')} must be positive, got {self.input_size}")

    @property
    def key(self) -> str:
        return (f"{self.limit}|{self.mean}|{self.std}|{self.input_size}"
                + ("|finetune-split" if self.finetune_split else ""))


def parse_floats(text: str | None, what: str) -> tuple[float, ...] | None:
    """``"0.485,0.456,0.406"`` → a tuple; None stays None."""
    if text is None:
        return None
    try:
        return tuple(float(a) for a in text.split(","))
    except ValueError:
        raise DataError(f"{what} {text!r} is not a comma-separated list of numbers") from None


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"224"`` or ``"224x192"`` (H×W) → (H, W); None stays None."""
    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        h, w = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]),
                                                                         int(parts[1]))
    except (ValueError, IndexError):
        raise DataError(f"{param('input_size')} {text!r} is not N or HxW") from None
    return h, w


@dataclass(frozen=True)
class Normalisation:
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    source: str = "default (pixels to [-1, 1])"

    def apply(self, x01: np.ndarray) -> np.ndarray:
        """N×C×H×W pixels on the 0-1 scale → the network's input."""
        c = x01.shape[1]
        mean, std = (np.array(v if len(v) == c else v[:1] * c, np.float32).reshape(1, c, 1, 1)
                     for v in (self.mean, self.std))
        return ((x01 - mean) / std).astype(np.float32)


def model_normalisation(metadata: dict[str, str], options: DataOptions) -> Normalisation:
    """The options' mean/std, else those of the model's ``metadata`` (its
    ``metadata_props``), else the default."""
    meta = {k.lower(): v for k, v in metadata.items()}
    mean = options.mean or parse_floats(meta.get("mean"), "the model's metadata mean")
    std = options.std or parse_floats(meta.get("std"), "the model's metadata std")
    if mean is None and std is None:
        return Normalisation()
    src = "--mean/--std" if options.mean or options.std else "the model's metadata"
    return Normalisation(mean or (0.5,), std or (0.5,), src)


def _fit(x: np.ndarray, shape: tuple[int, int, int], source: str) -> np.ndarray:
    """N×C×H×W float32 in the model's layout; N×H×W×C is transposed, N×H×W grey is
    replicated over C. A shape that still does not match raises :class:`DataError`."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 3 and shape[0] in (1, 3):
        x = np.repeat(x[:, None], shape[0], axis=1)
    if x.ndim == 4 and tuple(x.shape[1:]) != shape and tuple(x.shape[3:] + x.shape[1:3]) == shape:
        x = x.transpose(0, 3, 1, 2)
    if x.ndim != 4 or tuple(x.shape[1:]) != shape:
        raise DataError(f"{source}: images of shape {tuple(x.shape[1:])} do not match the "
                        f"model input {shape} (C×H×W)")
    return np.ascontiguousarray(x)


def _npz(path: Path, shape: tuple[int, int, int]) -> Dataset:
    try:
        data = np.load(path)
        keys = set(data.files)
    except Exception as exc:
        raise DataError(f"{path} is not a readable .npz ({exc})") from None
    xk = next((k for k in ("x", "images", "X") if k in keys), None)
    yk = next((k for k in ("y", "labels", "Y") if k in keys), None)
    if xk is None:
        raise DataError(f"{path} has no images array (named x or images); it has: "
                        f"{', '.join(sorted(keys)) or 'nothing'}")
    x = _fit(data[xk], shape, str(path))
    if len(x) == 0:
        raise DataError(f"{path} holds no images")
    if yk is None:
        return Dataset(path.name, x, np.full(len(x), -1, np.int64))
    y = np.asarray(data[yk]).astype(np.int64).ravel()
    if len(y) != len(x):
        raise DataError(f"{path}: {len(x)} images but {len(y)} labels")
    return Dataset(path.name, x, y)


def _read_images(files: list[tuple[Path, int]], shape: tuple[int, int, int], name: str,
                 norm: Normalisation) -> Dataset:
    """Decode, resize and normalise; an image that cannot be decoded is skipped and counted."""
    from PIL import Image

    c, h, w = shape
    xs, ys, skipped = [], [], []
    for f, label in files:
        try:
            with Image.open(f) as img:
                a = np.asarray(img.convert("L" if c == 1 else "RGB").resize(
                    (w, h), Image.BILINEAR), dtype=np.float32) / 255.0
        except Exception:  # PIL raises many types for a file it cannot decode
            skipped.append(f.name)
            continue
        xs.append(a[None] if c == 1 else a.transpose(2, 0, 1))
        ys.append(label)
    if not xs:
        raise DataError(f"{name}: none of its {len(files)} images could be decoded "
                        f"(e.g. {', '.join(skipped[:3])})")
    x = norm.apply(np.stack(xs).astype(np.float32))
    return Dataset(name, x, np.array(ys, np.int64), skipped=len(skipped))


def _folder(path: Path, shape: tuple[int, int, int], norm: Normalisation) -> Dataset:
    """ImageFolder's layout: one subfolder per class, labels in sorted subfolder order."""
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    if not subdirs:
        loose = [f for f in path.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES]
        raise DataError(f"{path} has no class subfolders (CLASS/IMAGE, labels in sorted "
                        "order of the class names)" + (f"; its {len(loose)} loose images "
                                                      "have no labels: put them in an .npz "
                                                      "without y for the fidelity proxy"
                                                      if loose else ""))
    files = [(f, label) for label, d in enumerate(subdirs) for f in sorted(d.iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise DataError(f"{path} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in "
                        "its class subfolders")
    return _read_images(files, shape, path.name, norm)


def _csv(path: Path, shape: tuple[int, int, int], norm: Normalisation) -> Dataset:
    """Rows of ``path,label`` (a header row is skipped); a relative path is relative to the
    CSV's folder."""
    try:
        rows = [r for r in csv.reader(path.read_text().splitlines()) if r and any(r)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is not a readable CSV ({exc})") from None
    if rows and len(rows[0]) >= 2 and not rows[0][1].strip().lstrip("-").isdigit():
        rows = rows[1:]  # a header
    files, bad = [], []
    for i, r in enumerate(rows, 1):
        if len(r) < 2 or not r[1].strip().lstrip("-").isdigit():
            bad.append(i)
            continue
        f = Path(r[0].strip())
        files.append((f if f.is_absolute() else path.parent / f, int(r[1])))
    if bad:
        raise DataError(f"{path}: rows {', '.join(map(str, bad[:5]))} are not PATH,LABEL "
                        "(an integer label)")
    if not files:
        raise DataError(f"{path} names no images (rows of PATH,LABEL)")
    missing = [str(f) for f, _ in files if not f.is_file()]
    if missing:
        raise DataError(f"{path} names {len(missing)} files that do not exist, e.g. "
                        f"{', '.join(missing[:3])}")
    return _read_images(files, shape, path.name, norm)


def load_data(spec: str, shape: tuple[int, int, int], split: str = "test",
              options: DataOptions = DataOptions(), metadata: dict | None = None) -> Dataset:
    """``digits`` (its ``split``), an ``.npz``, an image folder or a ``.csv``, as the
    network's input of ``shape`` (C×H×W), normalised as the options or the model's
    ``metadata`` say; at most ``options.limit`` images."""
    from dlas_predict.compression.digits import digits

    if spec == "digits":
        data = digits(split, shape)
    else:
        path = Path(spec)
        if not path.exists():
            raise DataError(f"data {spec!r} not found: give 'digits', an .npz file, a .csv "
                            "of PATH,LABEL rows or an image folder of class subfolders")
        norm = model_normalisation(metadata or {}, options)
        if path.is_dir():
            data = _folder(path, shape, norm)
        elif path.suffix.lower() == ".csv":
            data = _csv(path, shape, norm)
        else:
            data = _npz(path, shape)
    if options.limit is not None and len(data) > options.limit:
        keep = np.sort(np.random.default_rng(LIMIT_SEED).permutation(len(data))[:options.limit])
        data = replace(data, x=data.x[keep], y=data.y[keep])
    return data


#: The seed of the halves :func:`split_for_finetune` draws.
SPLIT_SEED = 0


def split_for_finetune(data: Dataset) -> tuple[Dataset, Dataset]:
    """(the half to fine-tune on, the half to measure on) of labelled ``data``: a seeded
    random half each (the measured half gets the odd image)."""
    if not labelled(data):
        raise DataError(f"{data.name}: fine-tuning needs labelled images (a label per image)")
    if len(data) < 2:
        raise DataError(f"{data.name}: {len(data)} image, too few to fine-tune on one half "
                        "and measure on the other")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(data))
    tune, held = np.sort(order[:len(data) // 2]), np.sort(order[len(data) // 2:])
    return (replace(data, name=f"{data.name} (fine-tuning half)", x=data.x[tune],
                    y=data.y[tune], skipped=0),
            replace(data, name=f"{data.name} (measured half)", x=data.x[held], y=data.y[held]))


def labelled(data: Dataset) -> bool:
    return bool(len(data)) and bool(np.all(data.y >= 0))


def check_labels(data: Dataset, classes: int | None) -> None:
    """Labels must name the model's outputs: 0 to classes - 1."""
    if classes is None or not labelled(data):
        return
    top = int(data.y.max())
    if top >= classes:
        raise DataError(f"{data.name}: label {top} is out of the model's range (it has "
                        f"{classes} outputs, labels 0-{classes - 1})")


def data_hash(data: Dataset) -> str:
    """The images and labels, hashed (the accuracy cache's key)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(data.x).tobytes())
    h.update(np.ascontiguousarray(data.y).tobytes())
    return h.hexdigest()[:16]

