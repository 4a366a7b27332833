"""Torch definitions of the study's networks (imports torch; load it only where needed).

The CIFAR-10 networks follow the widely used PyTorch CIFAR definitions the study used
(kuangliu/pytorch-cifar): 3×32×32 input, 10 classes, every convolution followed by its batch
norm. The ImageNet networks come from torchvision 0.28, imported with the workaround in
TVM_NOTES (the CUDA build's compiled ops cannot load against CPU torch; registering the
schemas of ``nms``/``qnms`` first makes the model definitions usable).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout)]


# ---- ResNet18 (CIFAR) --------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 3, stride)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 64, 3)
        blocks, cin = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for s in (stride, 1):
                blocks.append(BasicBlock(cin, planes, s))
                cin = planes
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.avg_pool2d(out, 4)
        return self.linear(torch.flatten(out, 1))


# ---- MobileNetV1 (CIFAR) -----------------------------------------------------------------
class MobileNetV1Cifar(nn.Module):
    # (out_planes, stride); stride 1 unless given
    CFG = (64, (128, 2), 128, (256, 2), 256, (512, 2), 512, 512, 512, 512, 512, (1024, 2), 1024)

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 32, 3)
        layers: list[nn.Module] = []
        cin = 32
        for item in self.CFG:
            cout, stride = item if isinstance(item, tuple) else (item, 1)
            layers += [*_conv_bn(cin, cin, 3, stride, groups=cin), nn.ReLU(),
                       *_conv_bn(cin, cout, 1), nn.ReLU()]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(1024, num_classes)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.avg_pool2d(out, 2)
        return self.linear(torch.flatten(out, 1))


# ---- MobileNetV2 (CIFAR) -----------------------------------------------------------------
class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expansion: int, stride: int):
        super().__init__()
        self.stride = stride
        planes = expansion * cin
        self.conv1, self.bn1 = _conv_bn(cin, planes, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, stride, groups=planes)
        self.conv3, self.bn3 = _conv_bn(planes, cout, 1)
        self.shortcut = nn.Sequential()
        if stride == 1 and cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return out + self.shortcut(x) if self.stride == 1 else out


class MobileNetV2Cifar(nn.Module):
    # (expansion, out_planes, num_blocks, stride); stride 1 in the second row for CIFAR
    CFG = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 32, 3)
        blocks, cin = [], 32
        for expansion, cout, n, stride in self.CFG:
            for s in [stride] + [1] * (n - 1):
                blocks.append(InvertedResidual(cin, cout, expansion, s))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.conv2, self.bn2 = _conv_bn(320, 1280, 1)
        self.linear = nn.Linear(1280, num_classes)

    def forward(self, x):
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.relu(self.bn2(self.conv2(out)))
        out = F.avg_pool2d(out, 4)
        return self.linear(torch.flatten(out, 1))


# ---- VGG-16 (CIFAR) ----------------------------------------------------------------------
class VGG16Cifar(nn.Module):
    CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M")

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for item in self.CFG:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [*_conv_bn(cin, item, 3), nn.ReLU()]
                cin = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


# ---- beyond CNNs: an MLP, encoders and recurrent networks of well-known shapes ---------
class Attention(nn.Module):
    """Multi-head self-attention with separate Q, K and V projections (exported as three
    matrix layers and the products of two activations); ``packed``: one projection of
    3 × d outputs split in three, as PyTorch's own attention exports."""

    def __init__(self, d: int, heads: int, packed: bool = False):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        if packed:
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        else:
            self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))
        self.packed = packed

    def forward(self, x):
        n, t, d = x.shape

        def split(y):
            return y.reshape(n, t, self.heads, self.dh).transpose(1, 2)

        if self.packed:
            q, k, v = (split(y) for y in self.qkv(x).chunk(3, dim=-1))
        else:
            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh), dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    """A transformer layer: attention and a feed-forward of ``ffn`` × d units (GELU, or
    ``activation``), each with its residual; layer norms before each (``pre``: ViT) or
    after (BERT)."""

    def __init__(self, d: int, heads: int, ffn: int, pre: bool, activation=nn.GELU,
                 packed: bool = False):
        super().__init__()
        self.pre = pre
        self.att, self.norm1, self.norm2 = (Attention(d, heads, packed), nn.LayerNorm(d),
                                            nn.LayerNorm(d))
        self.ff = nn.Sequential(nn.Linear(d, ffn * d), activation(), nn.Linear(ffn * d, d))

    def forward(self, x):
        if self.pre:
            x = x + self.att(self.norm1(x))
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.att(x))
        return self.norm2(x + self.ff(x))


def _rows(x):
    """An image batch as sequences of its rows: N × 3 × 32 × 32 → N × 32 × 96."""
    return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


class ViTTinyCifar(nn.Module):
    """DeiT-tiny's shape (width 192, 3 heads, 12 layers, FFN 4×) on 4×4 patches of a 32×32
    image: 64 patch tokens and a class token."""

    def __init__(self, num_classes: int = 10, d: int = 192, depth: int = 12, heads: int = 3):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, 65, d) * 0.02)
        self.blocks = nn.Sequential(*[TransformerBlock(d, heads, 4, pre=True)
                                      for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, num_classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class BertTinyCifar(nn.Module):
    """BERT-tiny's encoder (width 128, 2 heads, 2 layers, FFN 4×, layer norms after) over an
    image's 32 rows as tokens (a linear embedding of each row and a learned position)."""

    def __init__(self, num_classes: int = 10, d: int = 128, depth: int = 2, heads: int = 2):
        super().__init__()
        self.embed = nn.Linear(96, d)
        self.pos = nn.Parameter(torch.randn(1, 32, d) * 0.02)
        self.norm = nn.LayerNorm(d)
        self.blocks = nn.Sequential(*[TransformerBlock(d, heads, 4, pre=False)
                                      for _ in range(depth)])
        self.head = nn.Linear(d, num_classes)

    def forward(self, x):
        x = self.blocks(self.norm(self.embed(_rows(x)) + self.pos))
        return self.head(x.mean(dim=1))


class RecurrentCifar(nn.Module):
    """An LSTM or GRU over an image's 32 rows as steps (96 values each), classified from the
    last step's hidden state."""

    def __init__(self, cell: str, num_classes: int = 10, hidden: int = 256):
        super().__init__()
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(96, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        y, _ = self.rnn(_rows(x).transpose(0, 1))  # time-major
        return self.head(y[-1])


class MLPCifar(nn.Module):
    """ParaDnn's fully connected family: 3072 inputs, two hidden layers of 512, ReLU."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(3072, 512), nn.ReLU(),
                                    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes))

    def forward(self, x):
        return self.layers(x)


CIFAR = {
    "resnet18-cifar": ResNet18Cifar,
    "mobilenetv1-cifar": MobileNetV1Cifar,
    "mobilenetv2-cifar": MobileNetV2Cifar,
    "vgg16-cifar": VGG16Cifar,
    "vit-tiny-cifar": ViTTinyCifar,
    "bert-tiny-cifar": BertTinyCifar,
    "lstm-cifar": lambda: RecurrentCifar("lstm"),
    "gru-cifar": lambda: RecurrentCifar("gru"),
    "mlp-cifar": MLPCifar,
}

TORCHVISION = {
    "resnet50": "resnet50",
    "mobilenetv2": "mobilenet_v2",
    "densenet161": "densenet161",
    "efficientnet-b0": "efficientnet_b0",
}


def torchvision_models():
    """``torchvision.models``, importable against CPU torch (see the module docstring)."""
    import sys

    if "torchvision" not in sys.modules:
        for op in ("nms", "qnms"):
            try:
                torch.library.define(f"torchvision::{op}",
                                     "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:  # already defined (e.g. a working torchvision build)
                pass
    import torchvision.models

    return torchvision.models


def build(name: str) -> nn.Module:
    """A freshly initialised (seeded) torch model of the zoo network ``name``, in eval mode."""
    torch.manual_seed(0)
    if name in CIFAR:
        model = CIFAR[name]()
    else:
        model = getattr(torchvision_models(), TORCHVISION[name])()
    return model.eval()


def conv_bn_pairs(model: nn.Module) -> list[tuple[nn.Conv2d, nn.BatchNorm2d | None]]:
    """Each Conv2d with the BatchNorm2d defined right after it, if that norm has as many
    features as the conv has outputs (the CIFAR definitions pair every conv with its norm;
    in pre-activation networks such as DenseNet the next norm may belong elsewhere: then the
    pairing is a heuristic, used only to rank channels)."""
    mods = list(model.modules())
    pairs = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Conv2d):
            nxt = mods[i + 1] if i + 1 < len(mods) else None
            ok = isinstance(nxt, nn.BatchNorm2d) and nxt.num_features == m.out_channels
            pairs.append((m, nxt if ok else None))
    return pairs
