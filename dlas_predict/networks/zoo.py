"""The model zoo: the study's eight networks, and five of other families.

CIFAR-10 (3×32×32, 10 classes): the study's four networks are trained here on scikit-learn's
digits (``datasets/train_digits.py``) and their weights ship in ``datasets/weights``; so are
five networks beyond CNNs of well-known shapes (a ViT of DeiT-tiny's shape, a BERT-tiny
encoder over the image's rows as tokens, an LSTM and a GRU over its rows as steps, an MLP),
which the study has no published size for. ImageNet
(3×224×224, 1000 classes): torchvision 0.28 definitions with seeded random weights — nothing
can be downloaded here, so their accuracy is meaningless and says so.

``zoo:NAME`` names a zoo network wherever a model path is accepted; it is exported to ONNX
once and cached under ``DLAS_HOME/cache/zoo``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import lzma
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlas_predict.errors import NetworkError
from dlas_predict.paths import WEIGHTS_DIR, cache_dir

ZOO_PREFIX = "zoo:"
EXPORT_VERSION = "z1"  # bump when the export changes, to invalidate cached ONNX files


@dataclass(frozen=True)
class ZooEntry:
    """One zoo network and the study's published size (Tables 2 and 5)."""

    name: str
    dataset: str  # "cifar10" | "imagenet"
    input_shape: tuple[int, int, int]
    num_classes: int
    paper_params: float | None  # None: a network the study did not measure
    paper_macs: float | None
    source: str
    family: str = "cnn"  # cnn | transformer | recurrent | mlp

    @property
    def weights_path(self) -> Path:
        return WEIGHTS_DIR / f"{self.name}.npz.xz"

    @property
    def trained(self) -> bool:
        return self.weights_path.is_file()

    @property
    def pruned_in_torch(self) -> bool:
        """Whether pruning ranks this network's layers on its torch definition (a CNN's
        convs with their batch norms); another family's layers are pruned as any ONNX
        file's, in the form the grid reads."""
        return self.family == "cnn"

    def to_dict(self) -> dict:
        return {"name": self.name, "dataset": self.dataset,
                "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "family": self.family,
                "paper_params": self.paper_params, "paper_macs": self.paper_macs,
                "weights": "trained on digits (shipped)" if self.trained else "random (seeded)",
                "source": self.source}


_CIFAR_SRC = "PyTorch CIFAR definitions (kuangliu/pytorch-cifar), as in the study"
ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("resnet18-cifar", "cifar10", (3, 32, 32), 10, 11.2e6, 557e6, _CIFAR_SRC),
    ZooEntry("mobilenetv1-cifar", "cifar10", (3, 32, 32), 10, 3.2e6, 48e6, _CIFAR_SRC),
    ZooEntry("mobilenetv2-cifar", "cifar10", (3, 32, 32), 10, 2.3e6, 98e6, _CIFAR_SRC),
    ZooEntry("vgg16-cifar", "cifar10", (3, 32, 32), 10, 14.7e6, 314e6, _CIFAR_SRC),
    ZooEntry("resnet50", "imagenet", (3, 224, 224), 1000, 25.6e6, 4.1e9,
             "torchvision 0.28 resnet50"),
    ZooEntry("mobilenetv2", "imagenet", (3, 224, 224), 1000, 3.5e6, 327e6,
             "torchvision 0.28 mobilenet_v2"),
    ZooEntry("densenet161", "imagenet", (3, 224, 224), 1000, 27.7e6, 7.8e9,
             "torchvision 0.28 densenet161"),
    ZooEntry("efficientnet-b0", "imagenet", (3, 224, 224), 1000, 5.3e6, 415e6,
             "torchvision 0.28 efficientnet_b0"),
    ZooEntry("vit-tiny-cifar", "cifar10", (3, 32, 32), 10, None, None,
             "DeiT-tiny's shape (192 wide, 3 heads, 12 layers) on 4×4 patches", "transformer"),
    ZooEntry("bert-tiny-cifar", "cifar10", (3, 32, 32), 10, None, None,
             "BERT-tiny's encoder (128 wide, 2 heads, 2 layers) over the 32 rows as tokens",
             "transformer"),
    ZooEntry("lstm-cifar", "cifar10", (3, 32, 32), 10, None, None,
             "an LSTM of 256 units over the 32 rows as steps", "recurrent"),
    ZooEntry("gru-cifar", "cifar10", (3, 32, 32), 10, None, None,
             "a GRU of 256 units over the 32 rows as steps", "recurrent"),
    ZooEntry("mlp-cifar", "cifar10", (3, 32, 32), 10, None, None,
             "ParaDnn's fully connected family: 3072-512-512-10", "mlp"),
)}


def get(name: str) -> ZooEntry:
    """The zoo entry ``name``; an unknown name raises, listing the known ones."""
    name = name.removeprefix(ZOO_PREFIX)
    if name not in ZOO:
        raise NetworkError(f"unknown zoo network {name!r}; known: {', '.join(ZOO)}")
    return ZOO[name]


# ---- shipped weights ---------------------------------------------------------------------
def save_weights(model, path: Path) -> None:
    """Store a torch model's state compactly: conv, linear and recurrent weights as int8 per
    output channel (symmetric, one fp32 scale per channel), everything else fp32;
    xz-compressed.

    The network the tool uses is the one loaded back from this file: every accuracy figure
    is measured on the dequantised weights, never on the unrounded training result.
    """
    arrays: dict[str, np.ndarray] = {}
    for key, tensor in model.state_dict().items():
        a = tensor.detach().cpu().numpy()
        weight = key.endswith("weight") or ".weight_ih_l" in key or ".weight_hh_l" in key
        if weight and a.ndim in (2, 4):
            flat = a.reshape(a.shape[0], -1)
            scale = np.abs(flat).max(axis=1) / 127.0
            scale[scale == 0] = 1.0
            arrays[f"q8:{key}"] = np.round(flat / scale[:, None]).astype(np.int8).reshape(a.shape)
            arrays[f"scale:{key}"] = scale.astype(np.float32)
        else:
            arrays[f"raw:{key}"] = a
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(lzma.compress(buf.getvalue(), preset=9))


@functools.lru_cache(maxsize=8)
def _decoded_weights(path: str, mtime_ns: int, size: int) -> dict[str, np.ndarray]:
    """The float arrays of a :func:`save_weights` file, decoded once per process and file
    version (decompressing a zoo network's weights takes about a second; a recommendation
    builds its torch model several times). The arrays are read-only: loading copies them."""
    try:
        data = np.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())))
    except (lzma.LZMAError, ValueError, OSError) as exc:
        raise NetworkError(f"weights file {path} is unreadable ({exc})") from None
    state = {}
    for key in data.files:
        kind, name = key.split(":", 1)
        if kind == "q8":
            state[name] = (data[key].astype(np.float32)
                           * data[f"scale:{name}"].reshape(-1, *[1] * (data[key].ndim - 1)))
        elif kind == "raw":
            state[name] = data[key].copy()
    for array in state.values():
        array.flags.writeable = False
    return state


def load_weights(model, path: Path) -> None:
    """Load :func:`save_weights`' file into a torch model (strict: every key must match)."""
    import torch

    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise NetworkError(f"weights file {path} is unreadable ({exc})") from None
    arrays = _decoded_weights(str(path), stat.st_mtime_ns, stat.st_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # from_numpy on a read-only array; load copies it
        state = {name: torch.from_numpy(a) for name, a in arrays.items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise NetworkError(f"weights file {path} does not fit the network: "
                           f"{str(exc)[:300]}") from None


def torch_model(name: str):
    """The torch model of zoo network ``name``: shipped weights if any, else seeded random."""
    from dlas_predict.networks import torchmodels

    entry = get(name)
    model = torchmodels.build(entry.name)
    if entry.trained:
        load_weights(model, entry.weights_path)
    return model.eval()


# ---- ONNX export -------------------------------------------------------------------------
def export_model(model, input_shape: tuple[int, int, int], path: Path) -> Path:
    """Export a torch model to ONNX (batch 1, opset 17, batch norms folded in eval mode)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.zeros(1, *input_shape),), str(tmp),
                          dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["logits"])
    tmp.replace(path)
    return path


def _weights_tag(entry: ZooEntry) -> str:
    if not entry.trained:
        return "random"
    return hashlib.sha256(entry.weights_path.read_bytes()).hexdigest()[:12]


def export(name: str, out: Path | None = None) -> Path:
    """The ONNX file of zoo network ``name`` (cached), or a copy written to ``out``."""
    import shutil

    entry = get(name)
    cached = cache_dir("zoo") / f"{entry.name}-{EXPORT_VERSION}-{_weights_tag(entry)}.onnx"
    if not cached.is_file():
        export_model(torch_model(entry.name), entry.input_shape, cached)
    if out is None:
        return cached
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached, out)
    return out


#: The weight signature of each trained zoo network's export (:func:`weights_signature`),
#: written by :func:`write_fingerprints`; a test checks it against the exports.
FINGERPRINTS = WEIGHTS_DIR / "fingerprints.json"

#: Two files hold the same weights when each initializer's sums agree to this share of its
#: sum of magnitudes: the export folds batch norms into convolutions, and CPUs round that
#: arithmetic differently in the last bits.
SAME_WEIGHTS_TOLERANCE = 1e-4


def weights_signature(path: str | Path) -> list[list]:
    """A network's weights, whatever their names and order: each initializer's data type,
    shape, sum, sum of magnitudes and sum of squares (in float64), sorted."""
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # onnx raises several types for a file that is not ONNX
        raise NetworkError(f"{path} is not a readable ONNX model ({exc})") from None
    rows = []
    for init in graph.initializer:
        a = numpy_helper.to_array(init)
        v = a.astype(np.float64).ravel() if a.dtype.kind in "fiub" else np.zeros(0)
        rows.append([str(a.dtype), list(a.shape), float(f"{v.sum():.9g}"),
                     float(f"{np.abs(v).sum():.9g}"), float(f"{(v * v).sum():.9g}")])
    return sorted(rows, key=lambda r: (r[0], r[1], r[4], r[3]))


def same_weights(a: list[list], b: list[list]) -> bool:
    """Whether two :func:`weights_signature` results are of the same weights: the same data
    types and shapes, and each initializer's sums within :data:`SAME_WEIGHTS_TOLERANCE`."""
    if len(a) != len(b):
        return False
    left = list(b)
    for dtype, shape, total, mag, sq in a:
        tol = SAME_WEIGHTS_TOLERANCE * mag
        hit = next((i for i, (d, s, t, m, q) in enumerate(left)
                    if d == dtype and s == shape and abs(t - total) <= tol
                    and abs(m - mag) <= tol and abs(q - sq) <= SAME_WEIGHTS_TOLERANCE * sq),
                   None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def write_fingerprints() -> Path:
    """Record the weight signature of every trained zoo network's export."""
    nets = {e.name: weights_signature(export(e.name)) for e in ZOO.values() if e.trained}
    body = ",\n".join(f" {json.dumps(n)}: {json.dumps(sig, separators=(',', ':'))}"
                      for n, sig in sorted(nets.items()))
    FINGERPRINTS.write_text(f'{{"export": {json.dumps(EXPORT_VERSION)}, "networks": {{\n'
                            f'{body}\n}}}}\n')
    return FINGERPRINTS


def match(path: str | Path) -> ZooEntry | None:
    """The trained zoo network whose weights ``path`` holds (an exported zoo network under
    another name, exported on any CPU), or None."""
    try:
        known = json.loads(FINGERPRINTS.read_text())["networks"]
    except (OSError, ValueError, KeyError):
        return None
    if not known:
        return None
    sig = weights_signature(path)
    return next((ZOO[name] for name, s in known.items()
                 if name in ZOO and same_weights(sig, s)), None)


def resolve(model: str | Path, grid: bool = True) -> Path:
    """A model argument (a path, or ``zoo:NAME``) → an ONNX file path: with ``grid``, the
    form the grid reads (a matrix network's fully connected layers as 1×1 convolutions,
    :func:`dlas_predict.networks.matrix.grid_form`), else the file itself."""
    text = str(model)
    path = export(text) if text.startswith(ZOO_PREFIX) else Path(text)
    if not path.is_file():
        hint = f"; zoo networks are named zoo:NAME ({', '.join(ZOO)})" if text in ZOO else ""
        raise NetworkError(f"model file not found: {path}{hint}")
    if grid:
        from dlas_predict.networks.matrix import grid_form

        return grid_form(path)
    return path


def named_network(name: str):
    """The network a corpus names, as the grid reads it: a zoo network, or the generated
    network or NAS-Bench-201 cell its name describes (built again: its weights are seeded by
    its name; a matrix network in its grid form); None for any other name."""
    from dlas_predict.errors import DlasError
    from dlas_predict.networks import generate, nasbench201
    from dlas_predict.networks.graph import network_of_proto, read_network

    from dlas_predict.networks.matrix import grid_proto

    spec = generate.parse_name(name)
    try:
        if spec is not None:  # a matrix network as the grid reads it
            return network_of_proto(grid_proto(generate.build(*spec), name), name)
        if name.startswith("nasbench201-"):  # a cell's name is its architecture's code
            return network_of_proto(nasbench201.build(nasbench201.parse_arch(name)), name)
        return read_network(resolve(ZOO_PREFIX + name))
    except DlasError:
        return None
