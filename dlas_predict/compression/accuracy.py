"""Measured accuracy: top-1 of an ONNX model run by onnxruntime, and the fidelity proxy.

Every figure here is measured: top-1 on labelled data (digits, an ``.npz`` or an image
folder), or — without labels — the *fidelity proxy*: the share of inputs on which a
compressed model's top-1 class agrees with the uncompressed model's. The proxy is always
labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlas_predict.space.config import DEFAULT_CURVE_RATIOS as DEFAULT_RATIOS, ELBOW_DROP_PP
from dlas_predict.compression.data import (DataError, DataOptions, check_labels, data_hash,
                                           labelled, load_data, split_for_finetune)
from dlas_predict.compression.digits import Dataset
from dlas_predict.errors import ConfigError, param


def onnx_session(model, log_level: int = 3):
    """An onnxruntime session on a path, bytes or ModelProto (a session is returned as it
    is); optimisations off (so the float16 emulation casts stay in place), 2 threads;
    onnxruntime's log at ``log_level`` and above (3: errors, 4: fatal ones only)."""
    import os

    import onnxruntime as ort

    if hasattr(model, "get_inputs"):  # a session already
        return model
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    opts.log_severity_level = log_level
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def input_shape(model, size: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """The C×H×W input of a model or session (batch dimension dropped); ``size`` (H, W)
    fills the height and width a model leaves open (and must match those it fixes)."""
    sess = onnx_session(model)
    shape = list(sess.get_inputs()[0].shape)
    fixed = lambda d: isinstance(d, int) and d > 0  # noqa: E731
    if len(shape) == 4 and size is not None:
        for i, want in zip((2, 3), size):
            if fixed(shape[i]) and shape[i] != want:
                raise DataError(f"{param('input_size')} {size[0]}x{size[1]} disagrees with the "
                                f"model's fixed input {shape}")
            shape[i] = want
    if len(shape) != 4 or not all(fixed(d) for d in shape[1:]):
        raise DataError(f"model input shape {shape} is not a fixed N×C×H×W image input"
                        + (f"; give its height and width with {param('input_size')} HxW"
                           if len(shape) == 4 and fixed(shape[1]) else ""))
    return tuple(shape[1:])


def with_fixed_input(path: Path, shape: tuple[int, int, int]) -> Path:
    """A copy of the model at ``path`` whose input is fixed to 1×``shape`` (kept in the
    cache): what the compressions read layer shapes from."""
    import onnx

    from dlas_predict.files import file_digest
    from dlas_predict.paths import cache_dir

    out = cache_dir("accuracy") / (f"{Path(path).stem}-{file_digest(path)[:16]}-"
                                   f"{'x'.join(map(str, shape))}.onnx")
    if not out.is_file():
        from dlas_predict.files import write_if_changed

        m = onnx.load(str(path))
        for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, (1, *shape)):
            d.Clear()
            d.dim_value = v
        write_if_changed(out, m.SerializeToString())
    return out


def output_classes(model) -> int | None:
    """The number of outputs (classes) of a model or session, where its graph fixes it."""
    out = onnx_session(model).get_outputs()[0].shape
    return int(out[-1]) if out and isinstance(out[-1], int) and out[-1] > 1 else None


def model_metadata(model) -> dict[str, str]:
    """The metadata of a model or session (ONNX's ``metadata_props``)."""
    return dict(onnx_session(model).get_modelmeta().custom_metadata_map)


def predict(model, x: np.ndarray) -> np.ndarray:
    """Top-1 class of each input (N×C×H×W float32), batch by batch of the model's batch."""
    sess = onnx_session(model)
    inp = sess.get_inputs()[0]
    want = tuple(inp.shape[1:])
    if len(x.shape[1:]) != len(want) or any(isinstance(w, int) and w > 0 and w != d
                                             for w, d in zip(want, x.shape[1:])):
        raise DataError(f"data shape {tuple(x.shape[1:])} does not match the model input "
                        f"{want}")
    batch = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 0 else 64
    out = []
    for start in range(0, len(x), batch):
        xb = x[start:start + batch]
        n = len(xb)
        if n < batch:  # fixed-batch model: pad the last batch
            xb = np.concatenate([xb, np.zeros((batch - n, *xb.shape[1:]), xb.dtype)])
        logits = sess.run(None, {inp.name: np.ascontiguousarray(xb, dtype=np.float32)})[0]
        out.append(np.asarray(logits).reshape(len(xb), -1)[:n].argmax(1))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def evaluate_onnx(model, data: Dataset) -> float:
    """Measured top-1 accuracy of an ONNX model on a labelled data set."""
    return float((predict(model, data.x) == data.y).mean())


def agreement(model, reference, x: np.ndarray) -> float:
    """The fidelity proxy: share of inputs whose top-1 matches the reference model's."""
    return float((predict(model, x) == predict(reference, x)).mean())


@dataclass(frozen=True)
class AccuracyResult:
    """One measured accuracy, with where it came from."""

    model: str
    compression: str
    ratio: float | None
    metric: str  # "top1" (labelled data) or "fidelity_proxy" (agreement, no labels)
    value: float
    data: str
    n_samples: int
    reference_top1: float | None = None  # the uncompressed model on the same data
    finetune_epochs: int = 0
    weights: str = ""
    notes: tuple[str, ...] = ()
    uncalibrated: float | None = None  # int8: the same metric with ranges from one random input
    images_skipped: int = 0  # images of the data that could not be decoded

    def to_dict(self) -> dict:
        d = {"model": self.model, "compression": self.compression, "ratio": self.ratio,
             "metric": self.metric, self.metric: self.value, "data": self.data,
             "n_samples": self.n_samples, "reference_top1": self.reference_top1,
             "finetune_epochs": self.finetune_epochs, "weights": self.weights,
             "notes": list(self.notes)}
        if self.uncalibrated is not None:
            d["uncalibrated_" + self.metric] = self.uncalibrated
        return d


# ---- compressed models -------------------------------------------------------------------
@dataclass
class Prepared:
    """A model argument resolved and compressed: what accuracy and collect work on."""

    name: str
    onnx_path: Path
    compressed: "object"  # compress.CompressedModel
    zoo_entry: "object | None"


def prepare(model: str, compression: str = "dense", ratio: float | None = None,
            remove_channels: bool = False, finetune_epochs: int = 0,
            calibration: np.ndarray | None = None, log=None,
            finetune_data: Dataset | None = None) -> Prepared:
    """Resolve ``model`` (path or ``zoo:NAME``) and compress it.

    Zoo networks are pruned on their torch definition before export; plain ONNX files are
    pruned on their weights. With ``finetune_epochs``, a pruned network is fine-tuned with
    its masks held on ``finetune_data`` (labelled images; default: the digits training
    split), a plain ONNX file through the torch module the importer makes of it
    (:mod:`dlas_predict.networks.torchimport`).
    """
    import onnx

    from dlas_predict.compression import compress
    from dlas_predict.networks import zoo
    from dlas_predict.space.config import Compression, check_ratio
    from dlas_predict.errors import ConfigError

    comp = Compression.parse(compression)
    pruning = comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
    if pruning:
        if ratio is None:
            raise ConfigError(f"{comp.value} needs {param('ratio')} in [0, 1)")
        check_ratio(ratio, allow_zero=True)
    elif ratio:
        raise ConfigError(f"{comp.value} takes no ratio (got {ratio})")
    if finetune_epochs < 0:
        raise ConfigError(f"{param('finetune_epochs')} must be >= 0, got {finetune_epochs}")
    if finetune_epochs and not pruning:
        raise ConfigError("fine-tuning applies to weight_pruning and channel_pruning")
    if remove_channels and comp is not Compression.CHANNEL_PRUNING:
        raise ConfigError(f"{param('remove_channels')} needs {param('compression')} "
                          "channel_pruning")
    entry = zoo.get(model) if str(model).startswith(zoo.ZOO_PREFIX) else None
    path = zoo.resolve(model)
    name = entry.name if entry else path.stem
    matched = None
    if entry is None and pruning:  # an exported zoo network is pruned as the zoo's is
        entry = matched = zoo.match(path)
    # a CNN of the zoo is pruned on its torch definition; another family's network as any
    # ONNX file, in the form the grid reads
    torch_entry = entry if entry is not None and entry.pruned_in_torch else None
    if pruning and (torch_entry is not None or finetune_epochs):
        import tempfile

        from dlas_predict.compression import training

        if torch_entry is not None:
            net, shape = zoo.torch_model(torch_entry.name), torch_entry.input_shape
        else:
            from dlas_predict.networks.torchimport import import_onnx, input_shape

            net, shape = import_onnx(path), input_shape(path)
        if finetune_epochs and finetune_data is None:
            from dlas_predict.compression import digits

            finetune_data = digits.digits("train", shape)
        if torch_entry is None:
            import torch

            net.insert_norms(torch.from_numpy(finetune_data.x[:NORM_IMAGES]))
        reapply = compress.torch_masks(net, comp, ratio)
        if finetune_epochs:
            trainable = net if torch_entry is not None else _Logits(net)
            training.train(trainable, finetune_data.x, finetune_data.y, finetune_epochs,
                           lr=0.01, max_shift=2 if len(shape) == 3 else 0,
                           after_step=reapply, log=log)
            training.recalibrate_norms(net, finetune_data.x)
        with tempfile.TemporaryDirectory(prefix="dlas-") as tmp:
            exported = zoo.export_model(net, shape, Path(tmp) / f"{name}.onnx")
            base = onnx.load(str(exported))
        notes = []
        if remove_channels:
            base, removed, kept = compress.remove_zero_channels(base)
            notes.append(compress.removal_note(removed, kept))
        # already pruned in torch: read each layer's sparsity, relabel
        done = compress.compress_onnx(base, "dense", None)
        done.compression, done.ratio = comp, ratio
        done.notes.extend(notes)
        if matched is not None and torch_entry is not None:
            done.notes.append(f"the file holds zoo:{matched.name}'s weights: pruned on its "
                              "torch definition")
        if finetune_epochs:
            done.notes.append(f"fine-tuned {finetune_epochs} epochs on {finetune_data.name} "
                              f"({len(finetune_data)} images) with the masks held, batch "
                              "norms recalibrated on them"
                              + ("" if torch_entry is not None else
                                 " (the ONNX file imported into torch)"))
    else:
        done = compress.compress_onnx(onnx.load(str(path)), comp, ratio, calibration,
                                      remove_channels=remove_channels)
    return Prepared(name, path, done, entry)


#: The fine-tuning procedure's version, in the key of a fine-tuned accuracy's cache entry.
FINETUNE_VERSION = "2"
#: Images whose conv outputs set the batch norms inserted into an imported graph.
NORM_IMAGES = 256


def _Logits(module):
    """A module that trains on an imported graph's logits (a final softmax's input)."""
    import torch.nn as nn

    class Logits(nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner.logits(x)

    return Logits(module)


def _weights_label(prep: Prepared) -> str:
    if prep.zoo_entry is None:
        return "from the ONNX file"
    if prep.zoo_entry.trained:
        return "trained on digits (shipped)"
    return "random (seeded; no pretrained weights can be downloaded): top-1 is chance level"


def measure(model: str, data: str = "digits", compression: str = "dense",
            ratio: float | None = None, finetune_epochs: int = 0,
            remove_channels: bool = False, log=None,
            reference: float | None = None,
            options: DataOptions = DataOptions()) -> AccuracyResult:
    """Measure the accuracy of ``model`` compressed as asked: top-1 on labelled data, else
    the fidelity proxy (agreement with the uncompressed model on the data's images).
    ``reference``: the uncompressed top-1 on the same data, when already measured.
    A result is cached under ``DLAS_HOME/cache/accuracy`` by the model file's hash, the
    data's hash and the compression; the same question is answered from there."""
    from dlas_predict.networks import zoo
    from dlas_predict.space.config import Compression

    comp = Compression.parse(compression)
    if finetune_epochs and data != "digits" and not options.finetune_split:
        from dataclasses import replace

        options = replace(options, finetune_split=True)
    path = zoo.resolve(model)
    sess = onnx_session(path)  # one session tells the input, the outputs and the metadata
    shape = input_shape(sess, options.input_size)
    test = load_data(data, shape, options=options, metadata=model_metadata(sess))
    check_labels(test, output_classes(sess))
    tune = None
    if options.finetune_split and data != "digits":
        tune, test = split_for_finetune(test)
    dims = sess.get_inputs()[0].shape
    if options.input_size is not None and not all(isinstance(d, int) and d > 0 for d in dims):
        path = with_fixed_input(path, shape)  # the open dimensions, now given
        model = str(path)
    key = _cache_key(path, test, comp, ratio, finetune_epochs, remove_channels, options)
    cached = _cached(key)
    if cached is not None:
        return cached
    calibration = None
    if comp is Compression.INT8:
        calib_src = (load_data("digits", shape, "train", options) if data == "digits"
                     else test)
        calibration = calib_src.x[:128]
    prep = prepare(model, comp.value, ratio, remove_channels, finetune_epochs, calibration,
                   log=log, finetune_data=tune)
    compressed = prep.compressed.model
    uncal = None
    if labelled(test):
        metric, value = "top1", evaluate_onnx(compressed, test)
        if reference is None:
            reference = evaluate_onnx(path, test)
    else:
        metric, value, reference = "fidelity_proxy", agreement(compressed, path, test.x), None
    if comp is Compression.INT8:
        import onnx

        from dlas_predict.compression.compress import compress_onnx

        noise = np.random.default_rng(0).normal(size=(1, *shape)).astype(np.float32)
        raw = compress_onnx(onnx.load(str(path)), "int8", calibration=noise).model
        uncal = (evaluate_onnx(raw, test) if metric == "top1"
                 else agreement(raw, path, test.x))
    notes = tuple(prep.compressed.notes) + ((f"{test.skipped} images could not be decoded "
                                             "and were skipped",) if test.skipped else ())
    res = AccuracyResult(
        model=prep.name, compression=comp.value, ratio=prep.compressed.ratio, metric=metric,
        value=value, data=test.name, n_samples=len(test), reference_top1=reference,
        finetune_epochs=finetune_epochs, weights=_weights_label(prep),
        notes=notes, uncalibrated=uncal, images_skipped=test.skipped)
    _store(key, res)
    return res


def _cache_key(path: Path, test: Dataset, comp, ratio, finetune_epochs: int,
               remove_channels: bool, options: DataOptions) -> str:
    import hashlib

    from dlas_predict.files import file_digest

    what = f"{comp.value}|{ratio}|{finetune_epochs}|{remove_channels}|{options.key}"
    if finetune_epochs:  # a result of another fine-tuning procedure is not this one's
        what += f"|finetune-{FINETUNE_VERSION}"
    return "-".join((file_digest(path)[:16], data_hash(test),
                     hashlib.sha256(what.encode()).hexdigest()[:12]))


def _cached(key: str) -> AccuracyResult | None:
    import json

    from dlas_predict.paths import cache_dir

    f = cache_dir("accuracy") / f"{key}.json"
    try:
        d = json.loads(f.read_text())
        return AccuracyResult(**{**d, "notes": tuple(d["notes"])})
    except (OSError, ValueError, TypeError, KeyError):
        return None  # absent or unreadable: measured again, and rewritten


def _store(key: str, res: AccuracyResult) -> None:
    import dataclasses
    import json

    from dlas_predict.files import write_if_changed
    from dlas_predict.paths import cache_dir

    write_if_changed(cache_dir("accuracy") / f"{key}.json",
                     json.dumps(dataclasses.asdict(res)).encode())


def elbow(points: list[tuple[float, float]], reference: float,
          max_drop_pp: float = ELBOW_DROP_PP) -> float | None:
    """The study's elbow rule: the highest ratio before the first significant drop (more
    than ``max_drop_pp`` points below ``reference``); None if the first ratio already drops."""
    best = None
    for r, value in sorted(points):
        if (reference - value) * 100 > max_drop_pp:
            break
        best = r
    return best


def curve(model: str, kind: str, ratios=DEFAULT_RATIOS, data: str = "digits",
          finetune_epochs: int = 0, log=None,
          options: DataOptions = DataOptions()) -> list[AccuracyResult]:
    """Accuracy against pruning ratio for one pruning kind (each point measured)."""
    points = []
    for r in ratios:
        points.append(measure(model, data, kind, r, finetune_epochs, log=log,
                              reference=points[0].reference_top1 if points else None,
                              options=options))
    return points


def curves_entry(model: str, ratios, source: str, finetune_epochs: tuple[int, ...] = (0,),
                 log=None) -> dict:
    """Every compression of ``model`` measured on digits: an entry in the format of
    ``datasets/accuracy/curves.json`` (dense, float16 and int8 with int8 before calibration,
    both pruning curves at ``ratios`` with their elbows, and ``KIND+finetuneN`` curves for
    each nonzero count of ``finetune_epochs``). ``log``: called with each curve's line."""
    dense = measure(model)
    entry = {"metric": "top1", "data": dense.data, "n_samples": dense.n_samples,
             "dense": dense.value, "elbow_drop_pp": ELBOW_DROP_PP, "source": source}
    for comp in ("float16", "int8"):
        r = measure(model, compression=comp, reference=dense.value)
        entry[comp] = r.value
        if r.uncalibrated is not None:
            entry[f"{comp}_uncalibrated"] = r.uncalibrated
    for epochs in sorted(set(finetune_epochs)):
        for kind in ("weight_pruning", "channel_pruning"):
            pts = curve(model, kind, ratios, finetune_epochs=epochs)
            key = kind if epochs == 0 else f"{kind}+finetune{epochs}"
            entry[key] = {"points": [[pt.ratio, pt.value] for pt in pts],
                          "elbow": elbow([(pt.ratio, pt.value) for pt in pts], dense.value)}
            if log:
                log(f"{key}: elbow {entry[key]['elbow']}; "
                    + " ".join(f"{r:g}:{v:.3f}" for r, v in entry[key]["points"]))
    return entry


@dataclass
class PruningCurves:
    """Accuracy against ratio under weight and channel pruning, each with its elbow: the
    highest ratio within ``elbow_drop_pp`` points of the uncompressed model."""

    model: str
    metric: str
    data: str
    reference: float | None
    finetune_epochs: int
    elbow_drop_pp: float
    ratios: list[float]
    curves: dict[str, list[AccuracyResult]]
    elbows: dict[str, float | None]

    def to_dict(self) -> dict:
        return {"model": self.model, "metric": self.metric, "data": self.data,
                "reference_top1": self.reference, "finetune_epochs": self.finetune_epochs,
                "elbow_drop_pp": self.elbow_drop_pp,
                "curves": {k: [{"ratio": p.ratio, self.metric: p.value} for p in v]
                           for k, v in self.curves.items()},
                "elbow": self.elbows}


def pruning_curves(model: str, ratios: str, data: str | None, finetune_epochs: int,
                   elbow_drop: float, log=None,
                   options: DataOptions = DataOptions()) -> PruningCurves:
    """Measure both pruning curves of ``model`` at ``ratios`` (a comma list)."""
    try:
        grid = sorted({float(r) for r in ratios.split(",") if r.strip()})
    except ValueError:
        raise ConfigError(f"{param('ratios')} {ratios!r} is not a comma list of numbers"
                          ) from None
    if not grid:
        raise ConfigError(f"{param('ratios')} is empty")
    curves, elbows, reference = {}, {}, None
    for kind in ("weight_pruning", "channel_pruning"):
        points = curve(model, kind, grid, data, finetune_epochs, log=log, options=options)
        reference = points[0].reference_top1
        ref = reference if reference is not None else 1.0  # proxy: agreement with itself
        curves[kind] = points
        elbows[kind] = elbow([(p.ratio, p.value) for p in points], ref, elbow_drop)
    first = curves["weight_pruning"][0]
    return PruningCurves(first.model, first.metric, first.data, reference, finetune_epochs,
                         elbow_drop, grid, curves, elbows)


# ---- the shipped accuracy curves (datasets/accuracy/curves.json) -------------------------------
@dataclass(frozen=True)
class PrunedCurve:
    """Accuracy at each pruning ratio, and the elbow (the highest ratio within the entry's
    ``elbow_drop_pp`` of dense; None when the lowest ratio already drops more)."""

    points: tuple[tuple[float, float], ...]
    elbow: float | None

    def at(self, ratio: float, digits: int = 4) -> float | None:
        """The accuracy measured at ``ratio`` (matched to ``digits`` decimals), else None."""
        return dict((round(r, digits), v) for r, v in self.points).get(round(ratio, digits))


@dataclass(frozen=True)
class AccuracyCurve:
    """One network's entry of the shipped curves: top-1 of the uncompressed, float16 and
    int8 networks, and the pruning curves (``weight_pruning``, ``channel_pruning``, and
    fine-tuned ones such as ``weight_pruning+finetune1``), all measured on ``data``."""

    network: str
    metric: str
    data: str
    n_samples: int
    dense: float
    elbow_drop_pp: float
    source: str
    pruning: dict[str, PrunedCurve]
    float16: float | None = None
    int8: float | None = None
    int8_uncalibrated: float | None = None
    seconds: float | None = None

    @classmethod
    def from_dict(cls, network: str, d: dict) -> "AccuracyCurve":
        scalar = {"metric", "data", "n_samples", "dense", "elbow_drop_pp", "source", "float16",
                  "int8", "int8_uncalibrated", "seconds"}
        pruning = {k: PrunedCurve(tuple((float(r), float(v)) for r, v in e["points"]),
                                  e.get("elbow"))
                   for k, e in d.items() if k not in scalar}
        return cls(network=network, pruning=pruning,
                   **{k: d.get(k) for k in scalar if k in d})

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("metric", "data", "n_samples", "dense",
                                             "elbow_drop_pp", "source", "float16", "int8",
                                             "int8_uncalibrated")
               if getattr(self, k) is not None}
        for k, c in self.pruning.items():
            out[k] = {"points": [list(p) for p in c.points], "elbow": c.elbow}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    def accuracy(self, compression: str, ratio: float | None = None,
                 digits: int = 4) -> float | None:
        """The curve's accuracy of ``compression`` (at ``ratio`` when pruned), else None."""
        if compression == "dense":
            return self.dense
        if compression in ("float16", "int8"):
            return getattr(self, compression)
        curve = self.pruning.get(compression)
        return curve.at(float(ratio), digits) if curve is not None and ratio is not None \
            else None


def load_curves(path: Path | None = None) -> dict[str, AccuracyCurve]:
    """The accuracy curves by network ({} when the file is absent); default: the shipped ones."""
    import json

    from dlas_predict.paths import CURVES

    path = Path(path or CURVES)
    if not path.is_file():
        return {}
    return {name: AccuracyCurve.from_dict(name, d)
            for name, d in json.loads(path.read_text()).items()}
