"""Generate datasets/networks/demo-cnn.onnx: a small CIFAR-sized CNN (3x32x32) with the layer
kinds of the study's networks: a plain 3x3 conv, a strided 3x3, a depthwise 3x3, a pointwise
1x1 and a residual add. Weights are random (seeded): the demo measures latency, not accuracy.

    .venv/bin/python datasets/make_demo_network.py
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parent / "networks" / "demo-cnn.onnx"


def main() -> None:
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, x, c_in, c_out, k, stride, groups=1, relu=True):
        w = (rng.standard_normal((c_out, c_in // groups, k, k)) * 0.1).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}.w"))
        pad = k // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.y"], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[pad] * 4, group=groups))
        if not relu:
            return f"{name}.y"
        nodes.append(helper.make_node("Relu", [f"{name}.y"], [f"{name}.r"], name=f"{name}.relu"))
        return f"{name}.r"

    x = conv("conv1", "input", 3, 32, 3, 1)                       # 32x32
    y = conv("block1.conv_a", x, 32, 32, 3, 1)
    y = conv("block1.conv_b", y, 32, 32, 3, 1, relu=False)
    nodes.append(helper.make_node("Add", [x, y], ["block1.out"], name="block1.add"))
    x = conv("down1", "block1.out", 32, 64, 3, 2)                 # 16x16
    x = conv("dw1", x, 64, 64, 3, 1, groups=64)                   # depthwise
    x = conv("pw1", x, 64, 128, 1, 1)                             # pointwise
    x = conv("down2", x, 128, 128, 3, 2)                          # 8x8
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"))
    fc = (rng.standard_normal((10, 128)) * 0.1).astype(np.float32)
    inits.append(numpy_helper.from_array(fc, "fc.w"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "demo-cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=8, producer_name="dlas-predict")
    onnx.checker.check_model(model)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
