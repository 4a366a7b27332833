"""NAS-Bench-201 networks (Dong & Yang, ICLR 2020) as ONNX, from the public search space.

An architecture string ``|op~0|+|op~0|op~1|+|op~0|op~1|op~2|`` names, for nodes 1, 2 and 3
of a cell, the operation on the edge from each earlier node; node j is the sum of its
incoming edges and node 3 is the cell's output. Operations:

- ``none``: the zero operation, written as NAS-Bench-201's PyTorch runs it (``x · 0``);
- ``skip_connect``: identity;
- ``nor_conv_1x1`` and ``nor_conv_3x3``: ReLU → conv (no bias) → batch norm;
- ``avg_pool_3x3``: average pool, stride 1, pad 1, padding not counted.

The network: stem conv 3×3 (3→16) + batch norm; three stages of 5 cells at 16, 32 and 64
channels, joined by ResNet basic reduction blocks (ReLU-conv 3×3 stride 2-BN, ReLU-conv
3×3-BN, shortcut 2×2 average pool + conv 1×1); batch norm + ReLU; global average pool; a
10-way classifier. Input 1×3×32×32 (CIFAR). Weights are seeded by the architecture.

Index files (``--index-file``) hold one architecture per line: a string, or an integer index
of the benchmark, resolved through the HELP latency table in the shared data folder.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from dlas_predict.errors import ConfigError

OPS = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
#: One letter per operation in file names: n, s, 1, 3, p.
_CODE = {"none": "n", "skip_connect": "s", "nor_conv_1x1": "1", "nor_conv_3x3": "3",
         "avg_pool_3x3": "p"}
_DECODE = {v: k for k, v in _CODE.items()}
#: (to node, from node) of the six edges, in the architecture string's order.
EDGES = ((1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2))
STAGES = (16, 32, 64)
CELLS_PER_STAGE = 5
INPUT = 32
_ARCH_RE = re.compile(r"^\|([a-z_0-9]+)~0\|\+\|([a-z_0-9]+)~0\|([a-z_0-9]+)~1\|\+"
                      r"\|([a-z_0-9]+)~0\|([a-z_0-9]+)~1\|([a-z_0-9]+)~2\|$")


@dataclass(frozen=True)
class Arch:
    """One cell: the operation of each of the six edges (``EDGES`` order)."""

    ops: tuple[str, ...]

    @property
    def string(self) -> str:
        o = self.ops
        return f"|{o[0]}~0|+|{o[1]}~0|{o[2]}~1|+|{o[3]}~0|{o[4]}~1|{o[5]}~2|"

    @property
    def code(self) -> str:
        return "".join(_CODE[o] for o in self.ops)

    @property
    def file_name(self) -> str:
        return f"nasbench201-{self.code}.onnx"


def parse_arch(text: str) -> Arch:
    """An architecture string, or the six-letter code of a file name (``n s 1 3 p``)."""
    text = text.strip()
    code = text.removeprefix("nasbench201-").removesuffix(".onnx")
    if len(code) == 6 and all(c in _DECODE for c in code):
        return Arch(tuple(_DECODE[c] for c in code))
    m = _ARCH_RE.match(text)
    if not m:
        raise ConfigError(f"not a NAS-Bench-201 architecture: {text!r} (expected "
                          "|op~0|+|op~0|op~1|+|op~0|op~1|op~2| with op one of "
                          + ", ".join(OPS) + ")")
    ops = m.groups()
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ConfigError(f"unknown NAS-Bench-201 operation {bad[0]!r}; allowed: "
                          + ", ".join(OPS))
    return Arch(tuple(ops))


def all_archs() -> list[Arch]:
    """The 5^6 = 15,625 cells of the space (in enumeration order, not the benchmark's)."""
    import itertools
    return [Arch(ops) for ops in itertools.product(OPS, repeat=6)]


def arch_features(arch: Arch) -> np.ndarray:
    """One-hot operation per edge (30 values): a complete description of the cell."""
    x = np.zeros(len(EDGES) * len(OPS))
    for e, op in enumerate(arch.ops):
        x[e * len(OPS) + OPS.index(op)] = 1.0
    return x


def arch_macs(arch: Arch) -> int:
    """Multiply-accumulates of one forward pass (convs and the classifier; batch 1)."""
    macs = 3 * 16 * 9 * INPUT * INPUT  # stem
    size = INPUT
    per_cell = sum({"nor_conv_1x1": 1, "nor_conv_3x3": 9}.get(op, 0) for op in arch.ops)
    for s, c in enumerate(STAGES):
        if s:
            cin = STAGES[s - 1]
            size //= 2
            hw = size * size
            macs += cin * c * 9 * hw + c * c * 9 * hw + cin * c * hw  # reduction block
        macs += CELLS_PER_STAGE * per_cell * c * c * size * size
    return macs + STAGES[-1] * 10


def read_index_file(path: Path,
                    arch_strings: Callable[[], dict[int, str]] | None = None) -> list[Arch]:
    """Architectures listed one a line: strings, codes, or benchmark indices, resolved by
    ``arch_strings()`` (index → architecture string: HELP's table names both), called once
    where an index is listed."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text().splitlines()]
    except OSError as exc:
        raise ConfigError(f"cannot read the index file {path}: {exc.strerror}") from None
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise ConfigError(f"no architecture in {path}")
    by_index: dict[int, str] | None = None
    out = []
    for ln in lines:
        if ln.isdigit():
            if by_index is None:
                if arch_strings is None:
                    raise ConfigError(f"{path} lists benchmark indices, which need the public "
                                      "data's table of architecture strings")
                by_index = arch_strings()
            if int(ln) not in by_index:
                raise ConfigError(f"NAS-Bench-201 index {ln} out of range "
                                  f"(0..{max(by_index)})")
            out.append(parse_arch(by_index[int(ln)]))
        else:
            out.append(parse_arch(ln))
    return out


class _Net:
    def __init__(self, seed: int):
        from dlas_predict.networks.generate import NetworkBuilder
        self.b = NetworkBuilder(seed)

    def bn(self, x: str, c: int) -> str:
        b = self.b
        rng = b.rng
        return b.node("BatchNormalization",
                      [x, b.const(rng.uniform(0.5, 1.5, c), "gamma"),
                       b.const(rng.normal(0, 0.1, c), "beta"),
                       b.const(rng.normal(0, 0.1, c), "mean"),
                       b.const(rng.uniform(0.5, 1.5, c), "var")], "bn", epsilon=1e-5)

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        b = self.b
        w = b.rng.standard_normal((cout, cin, k, k), np.float32)
        w *= np.float32(np.sqrt(2.0 / (cin * k * k)))
        return b.node("Conv", [x, b.const(w, "w")], "conv", kernel_shape=[k, k],
                      strides=[stride, stride], pads=[k // 2] * 4)

    def relu_conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        return self.bn(self.conv(self.b.node("Relu", [x], "relu"), cin, cout, k, stride), cout)

    def edge(self, x: str, op: str, c: int) -> str:
        b = self.b
        if op == "none":
            return b.node("Mul", [x, b.const(np.zeros(1), "zero")], "zero")
        if op == "skip_connect":
            return x
        if op == "avg_pool_3x3":
            return b.node("AveragePool", [x], "avgpool", kernel_shape=[3, 3],
                          strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
        return self.relu_conv_bn(x, c, c, 1 if op == "nor_conv_1x1" else 3)

    def cell(self, x: str, arch: Arch, c: int) -> str:
        nodes = [x]
        for j in (1, 2, 3):
            terms = [self.edge(nodes[i], arch.ops[e], c)
                     for e, (to, i) in enumerate(EDGES) if to == j]
            s = terms[0]
            for t in terms[1:]:
                s = self.b.node("Add", [s, t], "add")
            nodes.append(s)
        return nodes[3]

    def reduction(self, x: str, cin: int, cout: int) -> str:
        b = self.b
        y = self.relu_conv_bn(self.relu_conv_bn(x, cin, cout, 3, 2), cout, cout, 3)
        short = b.node("AveragePool", [x], "avgpool", kernel_shape=[2, 2], strides=[2, 2])
        short = self.conv(short, cin, cout, 1)
        return b.node("Add", [short, y], "add")


def build(arch: Arch):
    """The ONNX ModelProto of one architecture (batch 1, 3×32×32 input, 10 classes)."""
    from onnx import TensorProto, helper

    n = _Net(seed=int(hashlib.sha256(arch.string.encode()).hexdigest()[:8], 16))
    b = n.b
    x = n.bn(n.conv("input", 3, STAGES[0], 3), STAGES[0])
    for s, c in enumerate(STAGES):
        if s:
            x = n.reduction(x, STAGES[s - 1], c)
        for _ in range(CELLS_PER_STAGE):
            x = n.cell(x, arch, c)
    x = b.node("Relu", [n.bn(x, STAGES[-1])], "relu")
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    w = b.rng.normal(0, np.sqrt(1.0 / STAGES[-1]), (10, STAGES[-1]))
    b.node("Gemm", [x, b.const(w, "w"), b.const(np.zeros(10), "b")], "fc", transB=1)
    b.nodes[-1].output[0] = "output"
    graph = helper.make_graph(
        b.nodes, "nasbench201",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, INPUT, INPUT])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])], b.inits)
    graph.doc_string = arch.string
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="dlas-predict generate nasbench201")
    model.ir_version = 8
    return model


def generate(archs: list[Arch], out_dir: Path) -> list[Path]:
    """Write one ONNX file per architecture into ``out_dir`` (named by its code)."""
    import onnx

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for arch in dict.fromkeys(archs):
        path = out_dir / arch.file_name
        onnx.save(build(arch), str(path))
        written.append(path)
    return written
