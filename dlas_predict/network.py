"""Reading the convolution layers of an ONNX network (with shape inference).

The full network graph (every op, MACs, bytes) and the model zoo build on this; ``collect``
needs the conv layers: their shapes, in order, and which are unique.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import ConvSpec
from .errors import NetworkError, SpecError


@dataclass(frozen=True)
class ConvLayer:
    """One Conv node of a network: its ONNX name and its workload."""

    index: int
    name: str
    spec: ConvSpec


def _load(path: str | Path):
    import onnx

    path = Path(path)
    if not path.is_file():
        raise NetworkError(f"network file not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises several types for garbage
        raise NetworkError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                           f"{str(exc)[:200]})") from None
    if not model.graph.node:
        raise NetworkError(f"{path} has an empty graph (malformed or truncated ONNX file)")
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:
        raise NetworkError(f"shape inference failed on {path}: {str(exc)[:300]}") from None
    return model


def _shapes(model) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                            for d in t.shape.dim]
    for init in model.graph.initializer:
        out[init.name] = list(init.dims)
    return out


def conv_layers(path: str | Path) -> list[ConvLayer]:
    """Every Conv node of the network at ``path``, in graph order, with its workload.

    Raises :class:`NetworkError` for a missing, malformed or unsupported file (dynamic
    spatial shapes, non-2-D convolutions, a batch other than 1 is read as batch 1).
    """
    import onnx.helper

    model = _load(path)
    shapes = _shapes(model)
    layers: list[ConvLayer] = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        name = node.name or f"conv_{len(layers)}"
        x_shape = shapes.get(node.input[0])
        w_shape = shapes.get(node.input[1])
        if not x_shape or not w_shape or len(x_shape) != 4 or len(w_shape) != 4:
            raise NetworkError(f"Conv {name!r}: only 2-D convolutions with known input and "
                               f"weight shapes are supported (got {x_shape}, {w_shape})")
        if any(d is None or d <= 0 for d in x_shape[1:]) or any(d <= 0 for d in w_shape):
            raise NetworkError(f"Conv {name!r}: dynamic or unknown shape {x_shape}; export "
                               "the network with a fixed input size")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise NetworkError(f"Conv {name!r}: auto_pad={attrs['auto_pad']!r} is not "
                               "supported; export with explicit pads")
        strides = list(attrs.get("strides", [1, 1]))
        dil = list(attrs.get("dilations", [1, 1]))
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        try:
            spec = ConvSpec(
                C=x_shape[1], H=x_shape[2], W=x_shape[3], K=w_shape[0], R=w_shape[2],
                S=w_shape[3], stride_h=strides[0], stride_w=strides[1], pad_t=pads[0],
                pad_l=pads[1], pad_b=pads[2], pad_r=pads[3], groups=int(attrs.get("group", 1)),
                dilation_h=dil[0], dilation_w=dil[1])
        except SpecError as exc:
            raise NetworkError(f"Conv {name!r}: {exc}") from None
        if spec.C // spec.groups != w_shape[1]:
            raise NetworkError(f"Conv {name!r}: weight shape {w_shape} does not match "
                               f"{spec.C} input channels in {spec.groups} groups")
        layers.append(ConvLayer(index=len(layers), name=name, spec=spec))
    return layers


def unique_specs(layers: list[ConvLayer]) -> list[ConvSpec]:
    """Distinct workloads, in order of first appearance."""
    seen: dict[ConvSpec, None] = {}
    for layer in layers:
        seen.setdefault(layer.spec, None)
    return list(seen)
