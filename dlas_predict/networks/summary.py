"""What a network does besides its convolutions: the summary the network cost models read
(element counts, bytes moved and op counts of its other layers, and the convs whose epilogue
takes more than a clamp)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlas_predict.networks.graph import OP_KINDS, Network
from dlas_predict.networks.recurrent import is_step_product

#: Ops that evaluate an exponential per element (SiLU's sigmoid, tanh, softmax, ...): far
#: dearer per element than a ReLU or an add, and dearer still in float16, which the CPU
#: emulates through conversions.
EXP_OPS = frozenset({"Sigmoid", "Tanh", "Softmax", "Elu", "Selu", "Softplus", "Gelu", "Erf"})
#: The exp-like ops the engine computes as TVM's polynomials (a GELU's erf, softmax).
ERF_SOFTMAX_OPS = frozenset({"Softmax", "Gelu", "Erf"})
#: float32 lanes of the engine's generic schedule of the ops that are not our kernels
#: (``dlas_predict.measure.networks.schedules``), whatever the CPU's vector width.
GENERIC_LANES = 16


def whole_vector(extent: int, lanes: int = GENERIC_LANES) -> int:
    """The widest of a vector, half and a quarter of one that divides ``extent``, else 0:
    the width the generic schedule vectorises a contiguous axis by."""
    return next((v for v in (lanes, lanes // 2, lanes // 4) if extent % v == 0 and extent >= v),
                0)


def product_vector(columns: int) -> int:
    """The lanes a product of two activations computes at once, by the columns of its
    output: a whole vector, half or a quarter of one that divides them, else a whole vector
    with a tail tile (one lane at a time for fewer columns than a vector)."""
    return whole_vector(columns) or (GENERIC_LANES if columns >= GENERIC_LANES else 1)


@dataclass(frozen=True)
class NetworkSummary:
    """What a network does besides its convolutions."""

    conv_layers: int
    layers: int
    nonconv_macs: int
    nonconv_bytes: int
    activation_ops: int
    elementwise_ops: int
    input_elems: int
    conv_io_bytes: int = 0  # float32 bytes of every conv's input and output activations
    exp_elems: int = 0  # elements through the ops of EXP_OPS
    erf_softmax_elems: int = 0  # elements through the ops of ERF_SOFTMAX_OPS
    broadcast_bytes: int = 0  # float32 bytes moved by elementwise ops that broadcast
    #: MACs and float32 activation bytes of the convs whose output joins an elementwise op
    #: or an activation other than ReLU (a residual add, SiLU's gate): an epilogue that
    #: takes a second tensor or more than a clamp (onnxruntime's QDQ int8 leaves such a conv
    #: in float).
    joined_conv_macs: int = 0
    joined_conv_io_bytes: int = 0
    #: MACs, float32 activation bytes and weights of the convs that onnxruntime's QDQ int8
    #: run leaves in float (:attr:`~dlas_predict.networks.graph.Layer.qdq_float`).
    qdq_float_conv_macs: int = 0
    qdq_float_conv_io_bytes: int = 0
    qdq_float_conv_params: int = 0
    #: Window reads of the windowed pools: output elements × window area (a 3×3 average
    #: pool at stride 1 reads nine inputs per output, which its bytes moved do not count).
    pool_window_elems: int = 0
    #: The average pools' window reads alone: onnxruntime's QDQ int8 runs each as
    #: QLinearAveragePool, several times slower per read than its float pool.
    avgpool_window_elems: int = 0
    #: Output elements of the products of two activations (attention's QKᵀ and its product
    #: with V): with a short inner dimension (a head's width), their cost follows the
    #: elements they write more than their multiply-adds.
    product_out_elems: int = 0
    #: The products' multiply-adds beyond those of full vectors: each product's MACs times
    #: (lanes / the lanes it computes at once − 1) (:func:`product_vector`). A head's width
    #: of 36 runs on quarter vectors: 3× its MACs more than a width of 32 pays.
    product_narrow_macs: int = 0
    #: Inputs of the concatenations of two inputs or more (a DenseNet block joins the
    #: outputs of every layer before it) that pick each element's input by a chain of
    #: comparisons on the axis they join along, as TVM legalises them; an unrolled
    #: recurrent network's (its steps joined into the sequence) pick by a balanced tree of
    #: them, and are not counted.
    concat_inputs: int = 0

    @classmethod
    def of(cls, net: Network) -> "NetworkSummary":
        other = [layer for layer in net.layers if layer.conv is None]
        joined = [layer for layer in net.layers if layer.conv is not None and _joins(layer)]
        qdq_float = [layer for layer in net.layers if layer.qdq_float]
        unrolled = any(is_step_product(layer.name) for layer in net.layers
                       if layer.conv is not None)
        return cls(conv_layers=len(net.layers) - len(other), layers=len(net.layers),
                   nonconv_macs=sum(layer.macs for layer in other),
                   nonconv_bytes=sum(layer.bytes_moved for layer in other),
                   activation_ops=sum(layer.kind == "activation" for layer in other),
                   elementwise_ops=sum(layer.kind == "elementwise" for layer in other),
                   input_elems=int(math.prod(net.input_shape)),
                   conv_io_bytes=sum(io_bytes(layer) for layer in net.layers
                                     if layer.conv is not None),
                   exp_elems=sum(int(math.prod(layer.output_shape)) for layer in other
                                 if layer.op in EXP_OPS),
                   erf_softmax_elems=sum(int(math.prod(layer.output_shape))
                                         for layer in other if layer.op in ERF_SOFTMAX_OPS),
                   broadcast_bytes=sum(layer.bytes_moved for layer in other
                                       if _broadcasts(layer)),
                   joined_conv_macs=sum(layer.macs for layer in joined),
                   joined_conv_io_bytes=sum(io_bytes(layer) for layer in joined),
                   qdq_float_conv_macs=sum(layer.macs for layer in qdq_float),
                   qdq_float_conv_io_bytes=sum(io_bytes(layer) for layer in qdq_float),
                   qdq_float_conv_params=sum(layer.params for layer in qdq_float),
                   pool_window_elems=sum(int(math.prod(layer.output_shape)) * layer.window
                                         for layer in other),
                   avgpool_window_elems=sum(int(math.prod(layer.output_shape)) * layer.window
                                            for layer in other if layer.op == "AveragePool"),
                   product_out_elems=sum(int(math.prod(layer.output_shape)) for layer in other
                                         if layer.kind == "matmul"),
                   product_narrow_macs=sum(
                       layer.macs * (GENERIC_LANES // product_vector(layer.output_shape[-1]) - 1)
                       for layer in other if layer.kind == "matmul"),
                   concat_inputs=0 if unrolled else sum(
                       len(layer.input_shapes) for layer in other
                       if layer.op == "Concat" and len(layer.input_shapes) > 1))


def io_bytes(layer) -> int:
    """float32 bytes of a layer's first input and its output."""
    return 4 * (int(math.prod(layer.input_shapes[0])) + int(math.prod(layer.output_shape)))


def _joins(layer) -> bool:
    return any(OP_KINDS.get(op) in ("elementwise", "activation") for op in layer.feeds)


def _broadcasts(layer) -> bool:
    """An elementwise op on activations of different sizes (squeeze-excitation's per-channel
    scale: a feature map times a gate of one value per channel)."""
    return layer.kind == "elementwise" and len({int(math.prod(s)) for s in layer.input_shapes}) > 1
