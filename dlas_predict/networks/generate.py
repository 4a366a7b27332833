"""ParaDnn-style parameterised model families: sweep a design space as ONNX files.

Four families, each a grid over its performance-sensitive parameters (ParaDnn, Wang et al.,
MLSys 2020):

- ``fc``: fully connected; ``layers`` hidden layers of ``nodes`` units, ``input`` features,
  ``output`` classes, ``batch``.
- ``cnn``: a stem conv then ``layers`` blocks of ``kernels`` filters of ``kernel_size``, on a
  3×``input``×``input`` image, ``batch``; ``block`` is ``plain`` (conv-relu), ``residual``
  (conv-relu-conv, add, relu; a block that downsamples adds ResNet's 1×1 stride-2
  projection to its shortcut), ``separable`` (depthwise k×k-relu, pointwise 1×1-relu)
  or ``inverted`` (MobileNetV2's inverted residual: pointwise 1×1 expanding ×6-relu,
  depthwise k×k-relu, pointwise 1×1 projection, and the shortcut add where the block keeps
  its resolution);
  ``se`` (0 or 1; ``inverted`` blocks only) adds EfficientNet's squeeze-excitation after the
  depthwise conv: global average pool, 1×1 conv down to a quarter of the block's input
  channels with the activation, 1×1 conv back with a sigmoid, and the product with the
  depthwise output, so that an ``activation=silu, se=1`` block is EfficientNet's MBConv;
  ``downsample`` blocks (evenly spaced) halve the resolution and double the filters. Global
  average pool and a 10-way classifier end it. ``activation`` is ``relu`` or ``silu``
  (x·sigmoid(x), EfficientNet's), after every conv and add.
- ``rnn``: ParaDnn's recurrent family; token ids (``batch`` × ``seq``) through an embedding
  of ``vocab`` rows of ``embedding`` values, ``layers`` stacked ``cell`` layers (``lstm``,
  ``gru`` or ``rnn``: ONNX's LSTM, GRU and RNN ops) of ``hidden`` units, and a projection
  of every step onto the ``vocab`` (a language model's logits).
- ``transformer``: an encoder of ``layers`` blocks on ``seq`` tokens of ``d_model`` values
  (already embedded: ``batch`` × ``seq`` × ``d_model``), each block BERT's: multi-head
  self-attention of ``heads`` heads (query, key and value projections, QKᵀ scaled by
  1/√(d_model/heads), softmax, the product with V, the output projection), the residual
  add and LayerNormalization, then a feed-forward of ``ffn`` × ``d_model`` units with GELU
  (x·Φ(x), by its erf form), the residual add and LayerNormalization. The mean over the
  tokens and a 10-way classifier end it.

The ONNX graphs are built directly (no torch) with seeded He-initialised weights.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlas_predict.errors import ConfigError, param

FAMILIES: dict[str, dict[str, object]] = {
    "fc": {"layers": 4, "nodes": 512, "input": 784, "output": 10, "batch": 1},
    "cnn": {"layers": 4, "kernels": 64, "kernel_size": 3, "input": 32, "batch": 1,
            "block": "plain", "downsample": 0, "activation": "relu", "se": 0},
    "rnn": {"layers": 2, "hidden": 256, "embedding": 128, "vocab": 1000, "seq": 32,
            "batch": 1, "cell": "lstm"},
    "transformer": {"layers": 2, "d_model": 128, "heads": 2, "ffn": 4, "seq": 64, "batch": 1},
}
CHOICES = {"block": ("plain", "residual", "separable", "inverted"),
           "activation": ("relu", "silu"), "cell": ("lstm", "gru", "rnn")}
#: A recurrent cell's gates (ONNX's order of the op's weight rows).
CELL_GATES = {"lstm": 4, "gru": 3, "rnn": 1}
#: The inverted-residual block's expansion (MobileNetV2's and EfficientNet's 6).
EXPAND = 6
#: The squeeze-excitation's reduction: its hidden width is the block's input channels over
#: this (EfficientNet's 0.25).
SE_REDUCE = 4
#: Integer parameters that are switches (0 or 1), not sizes.
_SWITCHES = ("se",)
#: Parameters left out of a file name at their default, so that names written before the
#: parameter existed still name the same network (and the same seeded weights).
UNNAMED_DEFAULTS = {"activation": "relu", "se": 0}


@dataclass(frozen=True)
class GeneratedModel:
    """One grid point: its family, parameters and file."""

    family: str
    params: dict
    path: Path


def _family(name: str) -> dict[str, object]:
    if name not in FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}, "
                          "nasbench201")
    return FAMILIES[name]


def parse_grid(family: str, items: list[str]) -> list[dict]:
    """``["layers=2,4", "kernels=32"]`` → every grid point, defaults filling the rest."""
    defaults = _family(family)
    axes: dict[str, list] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{param('param')} {item!r} is not NAME=V1,V2,..")
        key, values = item.split("=", 1)
        key = key.strip()
        if key not in defaults:
            raise ConfigError(f"unknown parameter {key!r} for family {family!r}; allowed: "
                              f"{', '.join(defaults)}")
        if key in axes:
            raise ConfigError(f"{param('param')} {key} given twice")
        parsed = []
        for v in (v.strip() for v in values.split(",")):
            if key in CHOICES:
                if v not in CHOICES[key]:
                    raise ConfigError(f"{key}={v!r}: allowed: {', '.join(CHOICES[key])}")
                parsed.append(v)
                continue
            try:
                n = int(v)
            except ValueError:
                raise ConfigError(f"{key}={v!r} is not an integer") from None
            if key in _SWITCHES and n not in (0, 1):
                raise ConfigError(f"{key}={n}: must be 0 or 1")
            low = 0 if key == "downsample" or key in _SWITCHES else 1
            if n < low:
                raise ConfigError(f"{key}={n}: must be at least {low}")
            parsed.append(n)
        if not parsed:
            raise ConfigError(f"{param('param')} {key} has no values")
        axes[key] = parsed
    keys = list(defaults)
    grid = [dict(zip(keys, combo)) for combo in itertools.product(
        *[axes.get(k, [defaults[k]]) for k in keys])]
    for point in grid:
        _check(family, point)
    return grid


def _check(family: str, p: dict) -> None:
    if family == "transformer" and p["d_model"] % p["heads"]:
        raise ConfigError(f"d_model={p['d_model']} is not a multiple of heads={p['heads']}")
    if family == "cnn":
        if p["kernel_size"] > p["input"]:
            raise ConfigError(f"kernel_size={p['kernel_size']} exceeds input={p['input']}")
        if p["downsample"] > p["layers"]:
            raise ConfigError(f"downsample={p['downsample']} exceeds layers={p['layers']}")
        if p["input"] >> p["downsample"] < 1:
            raise ConfigError(f"input={p['input']} cannot be halved {p['downsample']} times")
        if p["se"] and p["block"] != "inverted":
            raise ConfigError(f"se=1 needs block=inverted (squeeze-excitation sits in the "
                              f"inverted-residual block), not block={p['block']}")


def file_name(family: str, params: dict) -> str:
    return family + "_" + "_".join(f"{k}={v}" for k, v in params.items()
                                   if UNNAMED_DEFAULTS.get(k) != v) + ".onnx"


def name_value(name: str, key: str) -> str | None:
    """The value a generated network's name gives ``key`` (None: the name leaves it out)."""
    m = re.search(rf"(?:^|_){key}=([A-Za-z0-9.]+?)(?=_[a-z_]+=|$)", name)
    return m.group(1) if m else None


def parse_name(name: str) -> tuple[str, dict] | None:
    """A generated network's name (its file name without ``.onnx``) → (family, params), or
    None for a name :func:`file_name` does not write (so the network can be built again)."""
    family = name.split("_", 1)[0]
    if family not in FAMILIES:
        return None
    params = {}
    for key, default in FAMILIES[family].items():
        value = name_value(name, key)
        if value is None:
            if key not in UNNAMED_DEFAULTS:
                return None
            value = UNNAMED_DEFAULTS[key]
        params[key] = int(value) if isinstance(default, int) and str(value).isdigit() else value
    try:
        _check(family, params)
    except (ConfigError, TypeError):
        return None
    return (family, params) if file_name(family, params) == name + ".onnx" else None


class NetworkBuilder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, array: np.ndarray, prefix: str) -> str:
        from onnx import numpy_helper

        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32, copy=False), name))
        return name

    def node(self, op: str, inputs: list[str], prefix: str, **attrs) -> str:
        from onnx import helper

        out = self._name(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1,
             groups: int = 1) -> str:
        fan_in = cin // groups * k * k
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k))
        b = np.zeros(cout)
        return self.node("Conv", [x, self.const(w, "w"), self.const(b, "b")], "conv",
                         kernel_shape=[k, k], strides=[stride, stride],
                         pads=[k // 2] * 4 if k % 2 else [(k - 1) // 2, (k - 1) // 2,
                                                         k // 2, k // 2], group=groups)

    def gemm(self, x: str, cin: int, cout: int) -> str:
        w = self.rng.normal(0, np.sqrt(2.0 / cin), (cout, cin))
        return self.node("Gemm", [x, self.const(w, "w"), self.const(np.zeros(cout), "b")],
                         "fc", transB=1)

    def ints(self, values, prefix: str = "shape") -> str:
        """An int64 constant (a shape, axes)."""
        from onnx import numpy_helper

        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def dense(self, x: str, cin: int, cout: int) -> str:
        """x · W + b over the last axis of an activation of any rank (MatMul, Add)."""
        w = self.rng.normal(0, np.sqrt(2.0 / cin), (cin, cout))
        return self.node("Add", [self.node("MatMul", [x, self.const(w, "w")], "matmul"),
                                 self.const(np.zeros(cout), "b")], "bias")

    def layer_norm(self, x: str, width: int) -> str:
        return self.node("LayerNormalization", [x, self.const(np.ones(width), "gamma"),
                                                self.const(np.zeros(width), "beta")],
                         "layernorm", axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        """x · Φ(x) = 0.5 · x · (1 + erf(x / √2))."""
        erf = self.node("Erf", [self.node("Mul", [x, self.const(np.array(1 / np.sqrt(2)),
                                                                "c")], "scale")], "erf")
        half = self.node("Mul", [x, self.const(np.array(0.5), "c")], "half")
        return self.node("Mul", [half, self.node("Add", [erf, self.const(np.array(1.0), "c")],
                                                 "one_plus")], "gelu")

    def attention(self, x: str, batch: int, seq: int, d: int, heads: int) -> str:
        """Multi-head self-attention of ``x`` (batch × seq × d) and its output projection."""
        dh = d // heads

        def split(t: str) -> str:  # batch × heads × seq × dh
            t = self.node("Reshape", [t, self.ints([batch, seq, heads, dh])], "heads")
            return self.node("Transpose", [t], "heads_t", perm=[0, 2, 1, 3])

        q, k, v = (split(self.dense(x, d, d)) for _ in range(3))
        kt = self.node("Transpose", [k], "keys_t", perm=[0, 1, 3, 2])
        scores = self.node("Mul", [self.node("MatMul", [q, kt], "qk"),
                                   self.const(np.array(1 / np.sqrt(dh)), "c")], "scaled")
        probs = self.node("Softmax", [scores], "softmax", axis=-1)
        ctx = self.node("Transpose", [self.node("MatMul", [probs, v], "av")], "merge_t",
                        perm=[0, 2, 1, 3])
        ctx = self.node("Reshape", [ctx, self.ints([batch, seq, d])], "merge")
        return self.dense(ctx, d, d)

    def recurrent(self, x: str, cell: str, cin: int, hidden: int) -> str:
        """One ``cell`` layer over ``x`` (seq × batch × cin) → seq × batch × hidden."""
        gates = CELL_GATES[cell]
        w = self.rng.normal(0, np.sqrt(1.0 / cin), (1, gates * hidden, cin))
        r = self.rng.normal(0, np.sqrt(1.0 / hidden), (1, gates * hidden, hidden))
        b = np.zeros((1, 2 * gates * hidden))
        y = self.node(cell.upper() if cell != "rnn" else "RNN",
                      [x, self.const(w, "w"), self.const(r, "r"), self.const(b, "b")],
                      cell, hidden_size=hidden)
        return self.node("Squeeze", [y, self.ints([1], "axes")], "steps")

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], "relu")

    def silu(self, x: str) -> str:
        return self.node("Mul", [x, self.node("Sigmoid", [x], "sigmoid")], "silu")

    def squeeze_excite(self, x: str, channels: int, hidden: int, act) -> str:
        """x · sigmoid(conv(act(conv(pool(x))))): each channel scaled by a gate computed
        from every channel's mean."""
        s = act(self.conv(self.node("GlobalAveragePool", [x], "se_pool"), channels, hidden, 1))
        gate = self.node("Sigmoid", [self.conv(s, hidden, channels, 1)], "se_gate")
        return self.node("Mul", [x, gate], "se_scale")


def build(family: str, params: dict):
    """The ONNX ModelProto of one grid point."""
    from onnx import TensorProto, helper

    _family(family)
    p = dict(params)
    _check(family, p)
    # seeded by the name without the activation: a SiLU network has its ReLU twin's weights,
    # so both prune to the same layer sparsities and share every conv kernel
    twin = {**p, "activation": UNNAMED_DEFAULTS["activation"]}
    b = NetworkBuilder(seed=int(hashlib.sha256(file_name(family, twin).encode()).hexdigest()[:8], 16))
    batch = p["batch"]
    in_type = TensorProto.FLOAT
    if family == "rnn":
        in_type, shape = TensorProto.INT64, [batch, p["seq"]]
        table = b.rng.normal(0, 1.0, (p["vocab"], p["embedding"]))
        x = b.node("Gather", [b.const(table, "embedding"), "input"], "embed")
        x = b.node("Transpose", [x], "time_major", perm=[1, 0, 2])  # seq × batch × emb
        width = p["embedding"]
        for _ in range(p["layers"]):
            x, width = b.recurrent(x, p["cell"], width, p["hidden"]), p["hidden"]
        x = b.dense(x, width, p["vocab"])
        out_shape = [p["seq"], batch, p["vocab"]]
    elif family == "transformer":
        d, seq = p["d_model"], p["seq"]
        shape = [batch, seq, d]
        x = "input"
        for _ in range(p["layers"]):
            x = b.layer_norm(b.node("Add", [x, b.attention(x, batch, seq, d, p["heads"])],
                                    "residual"), d)
            y = b.dense(b.gelu(b.dense(x, d, p["ffn"] * d)), p["ffn"] * d, d)
            x = b.layer_norm(b.node("Add", [x, y], "residual"), d)
        x = b.node("ReduceMean", [x], "tokens_mean", axes=[1], keepdims=0)
        x = b.gemm(x, d, 10)
        out_shape = [batch, 10]
    elif family == "fc":
        shape = [batch, p["input"]]
        x, width = "input", p["input"]
        for _ in range(p["layers"]):
            x, width = b.relu(b.gemm(x, width, p["nodes"])), p["nodes"]
        x = b.gemm(x, width, p["output"])
        out_shape = [batch, p["output"]]
    else:
        k, width = p["kernel_size"], p["kernels"]
        act = b.silu if p["activation"] == "silu" else b.relu
        shape = [batch, 3, p["input"], p["input"]]
        x = act(b.conv("input", 3, width, k))
        down_at = set()
        if p["downsample"]:
            step = p["layers"] / p["downsample"]
            down_at = {int(i * step) for i in range(p["downsample"])}
        for i in range(p["layers"]):
            stride, cout = (2, width * 2) if i in down_at else (1, width)
            if p["block"] == "plain":
                x = act(b.conv(x, width, cout, k, stride))
            elif p["block"] == "separable":
                x = act(b.conv(x, width, width, k, stride, groups=width))
                x = act(b.conv(x, width, cout, 1))
            elif p["block"] == "inverted":
                wide = width * EXPAND
                y = act(b.conv(x, width, wide, 1))
                y = act(b.conv(y, wide, wide, k, stride, groups=wide))
                if p["se"]:
                    y = b.squeeze_excite(y, wide, max(1, width // SE_REDUCE), act)
                y = b.conv(y, wide, cout, 1)  # the linear bottleneck: no activation
                x = b.node("Add", [x, y], "add") if stride == 1 else y
            else:
                y = b.conv(act(b.conv(x, width, cout, k, stride)), cout, cout, k)
                if stride > 1:  # ResNet's projection shortcut: 1×1, stride 2, to cout
                    x = b.conv(x, width, cout, 1, stride)
                x = act(b.node("Add", [x, y], "add"))
            width = cout
        x = b.node("GlobalAveragePool", [x], "gap")
        x = b.node("Flatten", [x], "flatten", axis=1)
        x = b.gemm(x, width, 10)
        out_shape = [batch, 10]
    b.nodes[-1].output[0] = "output"
    graph = helper.make_graph(
        b.nodes, f"{family}-generated",
        [helper.make_tensor_value_info("input", in_type, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="dlas-predict generate")
    model.ir_version = 8
    return model


def generate(family: str, items: list[str], out_dir: Path) -> list[GeneratedModel]:
    """Write one ONNX file per grid point into ``out_dir``; returns what was written."""
    import onnx

    grid = parse_grid(family, items)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for point in grid:
        path = out_dir / file_name(family, point)
        onnx.save(build(family, point), str(path))
        written.append(GeneratedModel(family, point, path))
    return written
