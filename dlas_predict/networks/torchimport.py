"""An ONNX CNN as a torch module, so that a plain ONNX file can be fine-tuned (imports torch).

:class:`OnnxModule` runs the graph's nodes in order. Each ``Conv`` becomes an
``nn.Conv2d``, each ``Gemm`` or ``MatMul`` by a constant matrix an ``nn.Linear``, and each
``BatchNormalization`` an ``nn.BatchNorm2d``, holding the file's weights as parameters; every
other supported operator runs as a torch function of its inputs. The pruning of
:func:`dlas_predict.compression.compress.torch_masks` then sees the convolutions as it sees a
zoo network's, and :func:`dlas_predict.networks.zoo.export_model` writes the module back.

Supported: the operators a CNN exported by torch, Keras (tf2onnx) or this tool's generator
uses (:data:`SUPPORTED`), shape arithmetic included (``Shape``, ``Gather``, ``Concat`` of
shapes feeding ``Reshape``). Any other operator is one :class:`ImportError_`, naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

from dlas_predict.errors import NetworkError
from dlas_predict.networks.graph import node_attributes

#: The operators the importer runs.
SUPPORTED = (
    "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Constant", "Conv",
    "Div", "Dropout", "Elu", "Flatten", "Gather", "Gemm", "GlobalAveragePool",
    "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "LogSoftmax",
    "MatMul", "MaxPool", "Mul", "Pad", "ReduceMean", "Relu", "Reshape", "Shape", "Sigmoid",
    "Slice", "Softmax", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze")
#: Final operators that turn logits into probabilities: training reads their input.
_PROBABILITIES = ("Softmax", "LogSoftmax")


class ImportError_(NetworkError):
    """The ONNX graph uses something the importer cannot run in torch."""


def _pads(pads: list[int] | None, dims: int = 2) -> tuple[list[int], bool]:
    """ONNX pads (begins then ends) as torch's symmetric padding, or as F.pad's list
    (last dimension first) with True where begins and ends differ."""
    pads = list(pads or [0] * 2 * dims)
    begin, end = pads[:dims], pads[dims:]
    if begin == end:
        return begin, False
    out = []
    for b, e in zip(reversed(begin), reversed(end)):
        out += [b, e]
    return out, True


def _auto_pad(attrs: dict) -> str | None:
    """A node's ``auto_pad`` where it sets the padding (SAME_UPPER, SAME_LOWER, VALID), else
    None (explicit ``pads``)."""
    mode = attrs.get("auto_pad", b"NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return None if mode in ("NOTSET", "") else mode


def _same_pads(x: torch.Tensor, kernel, stride, dilation, mode: str) -> list[int]:
    """F.pad's list (last dimension first) that ``auto_pad`` ``mode`` gives an input of
    ``x``'s spatial size: SAME keeps ceil(size / stride) outputs, the odd pixel at the end
    (SAME_UPPER) or the beginning (SAME_LOWER); VALID pads nothing."""
    out: list[int] = []
    for size, k, s, d in reversed(list(zip(x.shape[2:], kernel, stride, dilation))):
        if mode == "VALID":
            out += [0, 0]
            continue
        total = max((-(-int(size) // s) - 1) * s + (k - 1) * d + 1 - int(size), 0)
        small, large = total // 2, total - total // 2
        out += [small, large] if mode == "SAME_UPPER" else [large, small]
    return out


class OnnxModule(nn.Module):
    """The graph of an ONNX model with one input, as a torch module (module doc)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        graph = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in inits]
        if len(inputs) != 1:
            raise ImportError_(f"the importer takes a model of one input, not {len(inputs)}")
        unknown = sorted({n.op_type for n in graph.node if n.op_type not in SUPPORTED
                          or n.domain not in ("", "ai.onnx")})
        if unknown:
            raise ImportError_(f"cannot run {', '.join(unknown)} in torch to fine-tune "
                               f"(the importer runs {len(SUPPORTED)} CNN operators)")
        self.input_name, self.output_names = inputs[0], [o.name for o in graph.output]
        self.nodes = list(graph.node)
        self.layers = nn.ModuleDict()
        self._consts: dict[str, torch.Tensor] = {}
        for i, node in enumerate(self.nodes):
            layer = self._layer(node, inits)
            if layer is not None:
                self.layers[str(i)] = layer
        used = {name for n in self.nodes for name in n.input}
        for name, value in inits.items():
            if name in used:
                self._consts[name] = torch.from_numpy(np.array(value))
        last = self.nodes[-1] if self.nodes else None
        #: the output training reads: a final softmax's input (the logits)
        self.logits_name = (last.input[0] if last is not None and last.op_type in
                            _PROBABILITIES and last.output[0] == self.output_names[0]
                            else self.output_names[0])

    # ---- layers with weights ------------------------------------------------------------
    @staticmethod
    def _layer(node: onnx.NodeProto, inits: dict[str, np.ndarray]) -> nn.Module | None:
        a = node_attributes(node)
        if node.op_type == "Conv":
            w = inits.get(node.input[1])
            if w is None or w.ndim != 4:
                raise ImportError_(f"Conv {node.name!r}: a 2-D convolution with constant "
                                   "weights is needed")
            b = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            auto = _auto_pad(a)
            pads, uneven = _pads(a.get("pads"))
            groups = int(a.get("group", 1))
            conv = nn.Conv2d(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]),
                             stride=tuple(a.get("strides", (1, 1))),
                             padding=0 if uneven or auto else tuple(pads),
                             dilation=tuple(a.get("dilations", (1, 1))), groups=groups,
                             bias=b is not None)
            conv.uneven_pads = pads if uneven and not auto else None
            conv.auto_pad = auto
            with torch.no_grad():
                conv.weight.copy_(torch.from_numpy(np.array(w, np.float32)))
                if b is not None:
                    conv.bias.copy_(torch.from_numpy(np.array(b, np.float32)))
            return conv
        if node.op_type in ("Gemm", "MatMul"):
            w = inits.get(node.input[1])
            if w is None or w.ndim != 2:
                return None  # a product of two activations: run as a function
            if node.op_type == "Gemm":
                if a.get("transA", 0):
                    raise ImportError_(f"Gemm {node.name!r}: transA is not supported")
                w = w.T if not a.get("transB", 0) else w
                w = w * a.get("alpha", 1.0)
                b = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
                if b is not None:
                    b = np.broadcast_to(np.asarray(b).reshape(-1) * a.get("beta", 1.0),
                                        (w.shape[0],))
            else:
                w, b = w.T, None
            lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(np.array(w, np.float32)))
                if b is not None:
                    lin.bias.copy_(torch.from_numpy(np.array(b, np.float32)))
            return lin
        if node.op_type == "BatchNormalization":
            scale, bias, mean, var = (inits.get(n) for n in node.input[1:5])
            if any(v is None for v in (scale, bias, mean, var)):
                raise ImportError_(f"BatchNormalization {node.name!r}: constant statistics "
                                   "are needed")
            bn = nn.BatchNorm2d(len(scale), eps=float(a.get("epsilon", 1e-5)),
                                momentum=1 - float(a.get("momentum", 0.9)))
            with torch.no_grad():
                for p, v in ((bn.weight, scale), (bn.bias, bias), (bn.running_mean, mean),
                             (bn.running_var, var)):
                    p.copy_(torch.from_numpy(np.array(v, np.float32)))
            return bn
        return None

    # ---- normalisation for training -------------------------------------------------------
    @torch.no_grad()
    def insert_norms(self, x: torch.Tensor) -> int:
        """Put a batch norm after every convolution the graph does not already normalise,
        set so that the network computes the same in eval mode: its statistics are the
        conv's output channels' mean and variance on the images ``x``, its scale and shift
        undo them. An exported network has its batch norms folded into its convolutions; a
        deep one without them diverges when fine-tuned after pruning (a ResNet-18 fine-tuned
        at a rate of 0.01 after channel pruning at 0.7 went to chance), with them it trains
        as the definition it came from. Returns how many were inserted."""
        normed = {n.input[0] for n in self.nodes if n.op_type == "BatchNormalization"}
        convs = {str(i): node.output[0] for i, node in enumerate(self.nodes)
                 if node.op_type == "Conv" and node.output[0] not in normed}
        outs: dict[str, torch.Tensor] = {}
        hooks = [self.layers[k].register_forward_hook(
            lambda m, i, o, k=k: outs.__setitem__(k, o)) for k in convs]
        was = self.training
        try:
            self.eval()
            self(x)
        finally:
            for h in hooks:
                h.remove()
            self.train(was)
        for k, o in outs.items():
            mean, var = o.mean(dim=(0, 2, 3)), o.var(dim=(0, 2, 3), unbiased=False)
            bn = nn.BatchNorm2d(len(mean))
            bn.running_mean.copy_(mean)
            bn.running_var.copy_(var)
            bn.weight.copy_(torch.sqrt(var + bn.eps))
            bn.bias.copy_(mean)
            self.layers[k] = nn.Sequential(self.layers[k], bn.train(self.training))
        return len(outs)

    # ---- running the graph ----------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, self.output_names[0])

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """What training reads: the output, or a final softmax's input."""
        return self._run(x, self.logits_name)

    def _run(self, x: torch.Tensor, want: str) -> torch.Tensor:
        env: dict[str, torch.Tensor] = dict(self._consts)
        env[self.input_name] = x
        for i, node in enumerate(self.nodes):
            ins = [env[n] if n else None for n in node.input]
            layer = self.layers[str(i)] if str(i) in self.layers else None
            outs = self._op(node, ins, layer)
            for name, value in zip(node.output, outs if isinstance(outs, tuple) else (outs,)):
                env[name] = value
            if want in env and want != self.input_name:
                return env[want]
        return env[want]

    @staticmethod
    def _op(node: onnx.NodeProto, ins: list, layer: nn.Module | None):
        op, a = node.op_type, node_attributes(node)
        x = ins[0] if ins else None
        if layer is not None:
            conv = layer[0] if isinstance(layer, nn.Sequential) else layer
            if isinstance(conv, nn.Conv2d) and conv.auto_pad:
                x = F.pad(x, _same_pads(x, conv.kernel_size, conv.stride, conv.dilation,
                                        conv.auto_pad))
            elif isinstance(conv, nn.Conv2d) and conv.uneven_pads is not None:
                x = F.pad(x, conv.uneven_pads)
            if isinstance(layer, nn.Linear) and op == "Gemm" and x.dim() > 2:
                x = x.flatten(1)
            return layer(x)
        if op in ("Relu", "Sigmoid", "Tanh"):
            return getattr(torch, op.lower())(x)
        if op == "LeakyRelu":
            return F.leaky_relu(x, float(a.get("alpha", 0.01)))
        if op == "Elu":
            return F.elu(x, float(a.get("alpha", 1.0)))
        if op == "HardSigmoid":
            return torch.clamp(x * float(a.get("alpha", 0.2)) + float(a.get("beta", 0.5)), 0, 1)
        if op == "HardSwish":
            return F.hardswish(x)
        if op == "Clip":
            lo = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("min")
            hi = ins[2] if len(ins) > 2 and ins[2] is not None else a.get("max")
            lo = float(lo) if lo is not None else None
            hi = float(hi) if hi is not None else None
            return torch.clamp(x, lo, hi)
        if op in ("Add", "Sub", "Mul", "Div"):
            return {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
                    "Div": torch.div}[op](x, ins[1])
        if op in ("Identity", "Dropout"):
            return x
        if op == "Constant":
            t = numpy_helper.to_array(a["value"]) if "value" in a else np.array(
                a.get("value_float", a.get("value_int")))
            return torch.from_numpy(np.array(t))
        if op == "Cast":
            to = onnx.helper.tensor_dtype_to_np_dtype(int(a["to"]))
            return x.to(torch.from_numpy(np.zeros(0, to)).dtype)
        if op in ("MaxPool", "AveragePool"):
            k = tuple(a["kernel_shape"])
            stride = tuple(a.get("strides", (1,) * len(k)))
            pads, uneven = _pads(a.get("pads"), len(k))
            auto = _auto_pad(a)
            if auto:
                pads, uneven = _same_pads(x, k, stride, a.get("dilations", (1,) * len(k)),
                                          auto), True
            if uneven:
                x = F.pad(x, pads, value=float("-inf") if op == "MaxPool" else 0.0)
                pads = [0] * len(k)
            ceil = bool(a.get("ceil_mode", 0))
            if op == "MaxPool":
                return F.max_pool2d(x, k, stride, tuple(pads), ceil_mode=ceil,
                                    dilation=tuple(a.get("dilations", (1,) * len(k))))
            return F.avg_pool2d(x, k, stride, tuple(pads), ceil_mode=ceil,
                                count_include_pad=bool(a.get("count_include_pad", 0)))
        if op == "GlobalAveragePool":
            return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)
        if op == "GlobalMaxPool":
            return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)
        if op == "Flatten":
            return x.flatten(int(a.get("axis", 1)) if a.get("axis", 1) else 0)
        if op == "Reshape":
            shape = [int(v) for v in ins[1].tolist()]
            shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
            return x.reshape(shape)
        if op == "Shape":
            return torch.tensor(x.shape, dtype=torch.int64)
        if op == "Gather":
            idx = ins[1].long()
            return torch.index_select(x, int(a.get("axis", 0)), idx.reshape(-1)).reshape(
                *x.shape[:int(a.get("axis", 0))], *idx.shape,
                *x.shape[int(a.get("axis", 0)) + 1:])
        if op == "Concat":
            return torch.cat([t for t in ins if t is not None], int(a["axis"]))
        if op in ("Unsqueeze", "Squeeze"):
            axes = a.get("axes")
            if axes is None and len(ins) > 1 and ins[1] is not None:
                axes = [int(v) for v in ins[1].reshape(-1).tolist()]
            if op == "Unsqueeze":
                for ax in sorted(int(v) % (x.dim() + len(axes)) for v in axes):
                    x = x.unsqueeze(ax)
                return x
            if axes is None:
                return x.squeeze()
            for ax in sorted((int(v) % x.dim() for v in axes), reverse=True):
                x = x.squeeze(ax)
            return x
        if op == "Transpose":
            return x.permute(*(a.get("perm") or reversed(range(x.dim()))))
        if op == "MatMul":
            return torch.matmul(x, ins[1])
        if op == "Gemm":
            w = ins[1].T if a.get("transB", 0) else ins[1]
            out = float(a.get("alpha", 1.0)) * (x @ w)
            return out + float(a.get("beta", 1.0)) * ins[2] if len(ins) > 2 and \
                ins[2] is not None else out
        if op in ("Softmax", "LogSoftmax"):
            fn = F.softmax if op == "Softmax" else F.log_softmax
            return fn(x, int(a.get("axis", -1)))
        if op == "ReduceMean":
            axes = a.get("axes")
            if axes is None and len(ins) > 1 and ins[1] is not None:
                axes = [int(v) for v in ins[1].tolist()]
            return x.mean(dim=tuple(axes) if axes else None, keepdim=bool(a.get("keepdims", 1)))
        if op == "Pad":
            pads = [int(v) for v in (ins[1].tolist() if len(ins) > 1 else a["pads"])]
            half = len(pads) // 2
            torch_pads = []
            for b, e in zip(reversed(pads[:half]), reversed(pads[half:])):
                torch_pads += [b, e]
            mode = a.get("mode", b"constant")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            value = float(ins[2]) if len(ins) > 2 and ins[2] is not None else 0.0
            return F.pad(x, torch_pads, mode=mode, value=value) if mode == "constant" \
                else F.pad(x, torch_pads, mode=mode)
        if op == "Slice":
            starts, ends = ins[1].tolist(), ins[2].tolist()
            axes = ins[3].tolist() if len(ins) > 3 and ins[3] is not None else \
                list(range(len(starts)))
            steps = ins[4].tolist() if len(ins) > 4 and ins[4] is not None else \
                [1] * len(starts)
            index = [slice(None)] * x.dim()
            for s, e, ax, st in zip(starts, ends, axes, steps):
                index[int(ax)] = slice(int(s), int(min(e, 2 ** 62)), int(st))
            return x[tuple(index)]
        raise ImportError_(f"cannot run {op} in torch")  # SUPPORTED lists every branch


def input_shape(path: str | Path) -> tuple[int, ...]:
    """The shape of one sample of the model's input (its dimensions after the batch)."""
    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits][:1] or [None]
    dims = [d.dim_value if d.HasField("dim_value") else 0
            for d in inp.type.tensor_type.shape.dim] if inp is not None else []
    if len(dims) < 2 or not all(dims[1:]):
        raise ImportError_(f"{path}: fine-tuning needs an input of fixed size after the batch "
                           f"(give --input-size H,W for open dimensions)")
    return tuple(dims[1:])


def import_onnx(path: str | Path) -> OnnxModule:
    """The ONNX file at ``path`` as an :class:`OnnxModule` in eval mode."""
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises its own error types for unreadable files
        raise ImportError_(f"{path}: not a readable ONNX model ({str(exc)[:200]})") from None
    return OnnxModule(model).eval()
