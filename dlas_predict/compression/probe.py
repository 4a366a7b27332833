"""A data-free look at what a pruning does to the network's function: the network run on
synthetic inputs, pruned and not, and the outputs compared.

The inputs are smooth random images (Gaussian noise blurred over 2 pixels, scaled to unit
spread, seeded), sequences blurred over their steps, or token ids for an embedding: no
data, but inputs that pass through every layer as the network's own do. One
onnxruntime session serves every pruning: the conv weights are inputs of the session, not
constants, so each pruning only feeds its masked weights. Three figures per pruning:

- ``probe_agreement``: the share of inputs whose top class is unchanged;
- ``probe_logit_change``: the norm of the change of the outputs over the spread of the
  unpruned outputs around their mean;
- ``probe_cosine``: the mean cosine between each input's centred outputs, pruned and not.
"""

from __future__ import annotations

import json

import numpy as np

from dlas_predict.compression.compress import conv_nodes
from dlas_predict.errors import NetworkError
from dlas_predict.networks.graph import BATCH_AXIS_KEY

PROBE_FEATURES = ("probe_agreement", "probe_logit_change", "probe_cosine")
#: Synthetic inputs per pruning, their seed and blur (pixels).
INPUTS, SEED, BLUR = 32, 0, 2.0
#: The cache's format: a change of the inputs or the figures changes it.
CACHE_VERSION = f"probe-1-{INPUTS}-{SEED}-{BLUR}"


def synthetic_inputs(shape: tuple[int, ...], tokens: int | None = None) -> np.ndarray:
    """``INPUTS`` smooth random inputs of ``shape`` (batch axis excluded): an image (C×H×W)
    blurred over its height and width, a sequence (steps × features) over its steps, plain
    noise otherwise; ``tokens``: token ids drawn uniformly below it (an embedding's
    input)."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(SEED)
    if tokens is not None:
        return rng.integers(0, tokens, size=(INPUTS, *shape)).astype(np.int64)
    x = rng.normal(size=(INPUTS, *shape)).astype(np.float32)
    if len(shape) >= 2:
        blur = (0, 0, BLUR, BLUR) if len(shape) >= 3 else (0, BLUR, 0)
        x = gaussian_filter(x, sigma=(*blur, *[0] * (x.ndim - len(blur))))
    return (x / x.std()).astype(np.float32)


def _token_rows(model) -> int | None:
    """The rows of the table a ``Gather`` reads the graph's integer input from (the input
    of an embedding), or None for a float input."""
    from onnx import TensorProto

    first = model.graph.input[0]
    if first.type.tensor_type.elem_type not in (TensorProto.INT64, TensorProto.INT32):
        return None
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == first.name \
                and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    raise NetworkError(f"the probe cannot draw inputs for {first.name}: an integer input "
                       "that no embedding table reads")


class FunctionProbe:
    """One network, ready to be run with any masked conv weights."""

    def __init__(self, model, weights: tuple[np.ndarray, ...]):
        import onnx

        from dlas_predict.compression.accuracy import onnx_session

        m = onnx.ModelProto()
        m.CopyFrom(model)
        names = [n.input[1] for n in conv_nodes(m)]
        if len(names) != len(weights):
            raise NetworkError("the probe's conv layers do not match the network's")
        # a weight several layers share (an unrolled recurrent layer's steps) is fed once
        moved = set(names)
        keep = [i for i in m.graph.initializer if i.name not in moved]
        by_name = {i.name: i for i in m.graph.initializer}
        listed = {i.name for i in m.graph.input}  # older files list initializers as inputs
        inputs = [onnx.helper.make_tensor_value_info(n, by_name[n].data_type,
                                                     list(by_name[n].dims))
                  for n in dict.fromkeys(names) if n not in listed]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)
        m.graph.input.extend(inputs)
        self.names = names
        dims = m.graph.input[0].type.tensor_type.shape.dim
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in dims]
        # the batch's axis: the second of a sequence read steps first
        meta = {p.key: p.value for p in model.metadata_props}
        self.axis = int(meta.get(BATCH_AXIS_KEY, 0))
        if len(shape) < 2 or self.axis >= len(shape):
            raise NetworkError(f"the probe needs an input with a batch axis, not {shape}")
        self.input_name = m.graph.input[0].name
        self.x = synthetic_inputs(tuple(shape[:self.axis] + shape[self.axis + 1:]),
                                  _token_rows(model))
        self.one = shape[self.axis]
        # all inputs in one run where the graph takes any batch, else one run per batch
        batched = onnx.ModelProto()
        batched.CopyFrom(m)
        batched.graph.input[0].type.tensor_type.shape.dim[self.axis].dim_param = "batch"
        try:  # quiet: onnxruntime would log the failure of a graph that fixes its batch
            self.session, self.batch = onnx_session(batched, log_level=4), INPUTS
            self.reference = self.run(weights)
        except Exception:  # a graph that fixes its batch (a constant reshape): one by one
            try:
                self.session, self.batch = onnx_session(m, log_level=4), self.one
                self.reference = self.run(weights)
            except Exception as exc:  # onnxruntime raises several types
                raise NetworkError("the probe cannot run the network on synthetic inputs "
                                   f"({str(exc).splitlines()[0][:200]})") from None

    def run(self, weights) -> np.ndarray:
        """The outputs (INPUTS × classes) with these conv weights."""
        feed = {n: np.ascontiguousarray(w, dtype=np.float32)
                for n, w in zip(self.names, weights)}
        out = []
        for i in range(0, len(self.x), self.batch):
            feed[self.input_name] = np.moveaxis(self.x[i:i + self.batch], 0, self.axis)
            out.append(np.asarray(self.session.run(None, feed)[0]).reshape(self.batch, -1))
        return np.concatenate(out)

    def compare(self, weights) -> tuple[float, float, float]:
        """(agreement, logit change, cosine) of these weights against the unpruned ones."""
        o, ref = self.run(weights), self.reference
        agree = float((o.argmax(1) == ref.argmax(1)).mean())
        spread = float(np.linalg.norm(ref - ref.mean(0)))
        rel = float(np.linalg.norm(o - ref) / spread) if spread > 0 else 0.0
        a, b = o - o.mean(1, keepdims=True), ref - ref.mean(1, keepdims=True)
        den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-9
        cos = float(np.mean((a * b).sum(1) / den))
        return agree, rel, cos


class ProbeCache:
    """Probe figures of one network, kept under ``DLAS_HOME/cache/probe`` by its ``digest``
    (the sha256 of its file): a second question about the same network runs nothing."""

    def __init__(self, digest: str):
        from dlas_predict.paths import cache_dir

        self.path = cache_dir("probe") / f"{digest[:20]}.json"
        try:
            d = json.loads(self.path.read_text())
            self.data = d["figures"] if d.get("version") == CACHE_VERSION else {}
        except (OSError, ValueError, KeyError, TypeError):
            self.data = {}

    def get(self, key: str):
        v = self.data.get(key)
        return tuple(v) if isinstance(v, list) and len(v) == len(PROBE_FEATURES) else None

    def put(self, key: str, figures) -> None:
        from dlas_predict.files import write_if_changed

        self.data[key] = list(figures)
        write_if_changed(self.path, json.dumps({"version": CACHE_VERSION,
                                                "figures": self.data}).encode())

