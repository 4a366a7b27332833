"""A data-free look at what a pruning does to the network's function: the network run on
synthetic inputs, pruned and not, and the outputs compared.

The inputs are smooth random images (Gaussian noise blurred over 2 pixels, scaled to unit
spread, seeded): no data, but inputs that pass through every layer as images do. One
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

PROBE_FEATURES = ("probe_agreement", "probe_logit_change", "probe_cosine")
#: Synthetic inputs per pruning, their seed and blur (pixels).
INPUTS, SEED, BLUR = 32, 0, 2.0
#: The cache's format: a change of the inputs or the figures changes it.
CACHE_VERSION = f"probe-1-{INPUTS}-{SEED}-{BLUR}"


def synthetic_inputs(shape: tuple[int, ...]) -> np.ndarray:
    """``INPUTS`` smooth random images of C×H×W ``shape``."""
    from scipy.ndimage import gaussian_filter

    x = np.random.default_rng(SEED).normal(size=(INPUTS, *shape)).astype(np.float32)
    x = gaussian_filter(x, sigma=(0, 0, BLUR, BLUR))
    return (x / x.std()).astype(np.float32)


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
        moved = set(names)
        keep = [i for i in m.graph.initializer if i.name not in moved]
        by_name = {i.name: i for i in m.graph.initializer}
        listed = {i.name for i in m.graph.input}  # older files list initializers as inputs
        inputs = [onnx.helper.make_tensor_value_info(n, by_name[n].data_type,
                                                     list(by_name[n].dims))
                  for n in names if n not in listed]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)
        m.graph.input.extend(inputs)
        self.names = names
        dims = m.graph.input[0].type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
        if len(shape) < 2:
            raise NetworkError(f"the probe needs an image input, not {shape}")
        self.input_name = m.graph.input[0].name
        self.x = synthetic_inputs(shape[1:])
        # all inputs in one run where the graph takes any batch, else one run per batch
        batched = onnx.ModelProto()
        batched.CopyFrom(m)
        batched.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
        try:
            self.session, self.batch = onnx_session(batched), INPUTS
            self.reference = self.run(weights)
        except Exception:  # a graph that fixes its batch (a constant reshape): one by one
            self.session, self.batch = onnx_session(m), shape[0]
            self.reference = self.run(weights)

    def run(self, weights) -> np.ndarray:
        """The outputs (INPUTS × classes) with these conv weights."""
        feed = {n: np.ascontiguousarray(w, dtype=np.float32) for n, w in zip(self.names, weights)}
        out = []
        for i in range(0, len(self.x), self.batch):
            feed[self.input_name] = self.x[i:i + self.batch]
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

