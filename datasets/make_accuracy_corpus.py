"""Train small CNNs of varied families on digits and measure each one's accuracy curves.

    .venv/bin/python datasets/make_accuracy_corpus.py [--networks 48] [--zoo]

The training set of the accuracy-cost model (``dlas_predict.models.accuracy``). Network
``i`` is drawn from a seeded generator of four families (plain VGG-like, residual,
separable as MobileNetV1, inverted residual as MobileNetV2): its width, stages, blocks,
kernel size, activation, batch norm, input size and channels, and its training (epochs,
weight decay, learning rate) are all drawn; a draw under 90 % top-1 is trained again at a
quarter of the rate, then with batch norm and twice the epochs. Each is trained on the digits training split,
exported to ONNX, and measured as a user's ONNX file is (``accuracy.measure`` on the path:
the ONNX pruning criteria, top-1 on the 360 held-out digits): dense, float16, int8, and
both pruning kinds at ratios 0.05 to 0.95. ``--zoo`` adds the trained zoo networks' exports,
measured the same way. ``--skip NAME`` leaves out a draw too slow to train on 2 cores (the
shipped set leaves out gen031, an inverted-residual network of 290 k parameters at 32×32).

Resumable: each finished network is appended to ``datasets/accuracy/generated.json``, and a
network already there is skipped. The ONNX files are kept under
``DLAS_HOME/cache/accuracy-corpus`` for ``--features``, which writes the model's training
table ``datasets/accuracy/features.parquet`` from them; ``--fit`` fits the shipped model
(``models_store/accuracy``) on that table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "datasets" / "accuracy" / "generated.json"
TABLE = OUT.with_name("features.parquet")
RATIOS = tuple(round(0.05 * i, 2) for i in range(1, 20))


def draw(i: int) -> dict:
    """Network ``i``'s architecture and training, drawn from a generator seeded by ``i``."""
    rng = np.random.default_rng(1000 + i)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    return {
        "family": ("plain", "residual", "separable", "inverted")[i % 4],
        "width": int(pick([8, 12, 16, 24, 32])),
        "stages": int(pick([2, 3])),
        "blocks": int(pick([1, 2])),
        "kernel": int(pick([3, 3, 5])),
        "activation": pick(["relu", "relu", "silu"]),
        "bn": bool(pick([True, True, False])),
        "input": int(pick([16, 24, 32])),
        "channels": int(pick([1, 3])),
        "epochs": int(pick([4, 8, 12])),
        "weight_decay": float(pick([0.0, 5e-4, 2e-3])),
        "lr": float(pick([0.02, 0.05])),
        "head": "pool2",
    }


def build(spec: dict):
    """The torch network of a drawn spec (a 10-way classifier)."""
    import torch.nn as nn

    act = nn.SiLU if spec["activation"] == "silu" else nn.ReLU

    def conv(cin, cout, k, stride=1, groups=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=not spec["bn"])]
        if spec["bn"]:
            layers.append(nn.BatchNorm2d(cout))
        if relu:
            layers.append(act())
        return nn.Sequential(*layers)

    class Residual(nn.Module):
        def __init__(self, body, short):
            super().__init__()
            self.body, self.short, self.act = body, short, act()

        def forward(self, x):
            return self.act(self.body(x) + self.short(x))

    class Inverted(nn.Module):
        def __init__(self, body, skip):
            super().__init__()
            self.body, self.skip = body, skip

        def forward(self, x):
            return self.body(x) + x if self.skip else self.body(x)

    k, w = spec["kernel"], spec["width"]
    layers = [conv(spec["channels"], w, 3)]
    cin = w
    for s in range(spec["stages"]):
        cout = w * 2 ** s
        for b in range(spec["blocks"]):
            stride = 2 if (s > 0 and b == 0) else 1
            fam = spec["family"]
            if fam == "plain":
                layers.append(conv(cin, cout, k, stride))
            elif fam == "residual":
                body = nn.Sequential(conv(cin, cout, k, stride), conv(cout, cout, k, relu=False))
                short = (nn.Identity() if stride == 1 and cin == cout
                         else conv(cin, cout, 1, stride, relu=False))
                layers.append(Residual(body, short))
            elif fam == "separable":
                layers.append(nn.Sequential(conv(cin, cin, k, stride, groups=cin),
                                            conv(cin, cout, 1)))
            else:
                hidden = cin * 4
                body = nn.Sequential(conv(cin, hidden, 1),
                                     conv(hidden, hidden, k, stride, groups=hidden),
                                     conv(hidden, cout, 1, relu=False))
                layers.append(Inverted(body, stride == 1 and cin == cout))
            cin = cout
    # the head: a global average pool, or ("pool2") an average pool to 2×2, which keeps
    # where a stroke is (a shallow network's global pool cannot tell a 6 from a 9)
    grid = 2 if spec.get("head") == "pool2" else 1
    layers += [nn.AdaptiveAvgPool2d(grid), nn.Flatten(), nn.Linear(cin * grid * grid, 10)]
    return nn.Sequential(*layers)


#: The matrix families: networks whose multiply-adds are mostly in matrix layers.
MATRIX_FAMILIES = ("mlp", "encoder", "vit", "lstm", "gru")


#: Matrix draws from this index on reach deeper: 1-4 layers (recurrent: 1-3) and 8 heads.
DEEPER_FROM = 60


def draw_matrix(i: int) -> dict:
    """Matrix network ``i`` (``mat{i:03d}``): an MLP, a transformer encoder over the image's
    rows (BERT-like) or over 4×4 patches (ViT-like, a class token), or an LSTM or GRU over
    the rows, its sizes and training (AdamW) drawn from a generator seeded by ``i`` (deeper
    from :data:`DEEPER_FROM` on)."""
    rng = np.random.default_rng(5000 + i)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    family = MATRIX_FAMILIES[i % len(MATRIX_FAMILIES)]
    d = int(pick([32, 48, 64, 96, 128]))
    deep = i >= DEEPER_FROM
    recurrent = family in ("lstm", "gru")
    return {
        "family": family,
        "width": int(pick([64, 128, 256, 512])) if family == "mlp" else d,
        "layers": int(pick(([1, 2, 3] if recurrent else [1, 2, 3, 4]) if deep
                           else [1, 1, 2] if recurrent else [1, 2, 3])),
        "heads": int(pick([h for h in ((1, 2, 4, 8) if deep else (1, 2, 4)) if d % h == 0])),
        "ffn": int(pick([2, 4])),
        "norm_first": bool(pick([True, False])),
        "packed": bool(pick([True, False])),
        "activation": pick(["relu", "gelu"]),
        "input": int(pick([16, 24, 32])),
        "channels": int(pick([1, 3])),
        "epochs": int(pick([8, 12, 16])),
        "weight_decay": float(pick([0.0, 0.01, 0.05])),
        "lr": float(pick([0.001, 0.002])),
    }


def build_matrix(spec: dict):
    """The torch network of a drawn matrix spec (a 10-way classifier of C×H×W images)."""
    import torch
    import torch.nn as nn

    c, h, fam, d = spec["channels"], spec["input"], spec["family"], spec["width"]
    act = nn.GELU if spec["activation"] == "gelu" else nn.ReLU
    rows = c * h  # a row of the image, every channel: one token or step

    def tokens(x):  # N×C×H×W → N×H×(C·W)
        return x.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)

    if fam == "mlp":
        layers, cin = [nn.Flatten()], c * h * h
        for _ in range(spec["layers"]):
            layers += [nn.Linear(cin, d), act()]
            cin = d
        return nn.Sequential(*layers, nn.Linear(cin, 10))
    if fam in ("lstm", "gru"):
        class Recurrent(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = (nn.LSTM if fam == "lstm" else nn.GRU)(rows, d, spec["layers"],
                                                                  batch_first=True)
                self.head = nn.Linear(d, 10)

            def forward(self, x):
                y, _ = self.rnn(tokens(x))
                return self.head(y[:, -1])
        return Recurrent()

    from dlas_predict.networks.torchmodels import TransformerBlock

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            vit = fam == "vit"
            n = (h // 4) ** 2 + 1 if vit else h
            self.embed = nn.Conv2d(c, d, 4, stride=4) if vit else nn.Linear(rows, d)
            self.cls = nn.Parameter(torch.zeros(1, 1, d)) if vit else None
            self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
            self.blocks = nn.Sequential(*[
                TransformerBlock(d, spec["heads"], spec["ffn"], spec["norm_first"], act,
                                 spec["packed"]) for _ in range(spec["layers"])])
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

        def forward(self, x):
            if self.cls is not None:
                x = self.embed(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            else:
                x = self.embed(tokens(x))
            y = self.norm(self.blocks(x + self.pos))
            return self.head(y[:, 0] if self.cls is not None else y.mean(dim=1))
    return Encoder()


def corpus_dir() -> Path:
    from dlas_predict.paths import cache_dir

    return cache_dir("accuracy-corpus")


def train_matrix(name: str, spec: dict, train, test):
    """Matrix network ``name`` trained (AdamW); a draw under 90 % top-1 is trained again
    with twice the epochs, then also at half the rate. Returns (network, spec)."""
    import torch

    from dlas_predict.compression import training

    seed = int(name[3:])
    for attempt in range(3):
        torch.manual_seed(seed)
        net = build_matrix(spec)
        training.train(net, train.x, train.y, spec["epochs"], lr=spec["lr"],
                       weight_decay=spec["weight_decay"], adam=True,
                       max_shift=max(1, spec["input"] // 16), seed=seed)
        if training.top1(net, test.x, test.y) >= 0.9:
            break
        spec = {**spec, "epochs": spec["epochs"] * 2,
                **({"lr": spec["lr"] / 2} if attempt == 1 else {})}
    return net, spec


def generate(n: int, zoo_too: bool, skip: set[str] = frozenset(), matrix: int = 0) -> None:
    import torch

    from dlas_predict.compression import accuracy, digits, training
    from dlas_predict.networks import zoo

    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    done = json.loads(OUT.read_text()) if OUT.exists() else {}
    jobs = [f"gen{i:03d}" for i in range(n) if f"gen{i:03d}" not in skip]
    jobs += [f"mat{i:03d}" for i in range(matrix) if f"mat{i:03d}" not in skip]
    if zoo_too:
        jobs += [e.name for e in zoo.ZOO.values() if e.trained]
    for name in jobs:
        if name in done:
            continue
        t0 = time.time()
        path = corpus_dir() / f"{name}.onnx"
        if name.startswith("mat"):
            spec = draw_matrix(int(name[3:]))
            shape = (spec["channels"], spec["input"], spec["input"])
            train, test = digits.digits("train", shape), digits.digits("test", shape)
            net, spec = train_matrix(name, spec, train, test)
            zoo.export_model(net, shape, path)
            params = int(sum(p.numel() for p in net.parameters()))
        elif name.startswith("gen"):
            spec = draw(int(name[3:]))
            shape = (spec["channels"], spec["input"], spec["input"])
            train, test = digits.digits("train", shape), digits.digits("test", shape)
            for attempt in range(3):  # a draw that does not learn: a lower rate, then BN
                torch.manual_seed(int(name[3:]))
                net = build(spec)
                training.train(net, train.x, train.y, spec["epochs"], lr=spec["lr"],
                               weight_decay=spec["weight_decay"],
                               max_shift=max(1, shape[1] // 16), seed=int(name[3:]))
                if training.top1(net, test.x, test.y) >= 0.9:
                    break
                spec = ({**spec, "lr": spec["lr"] / 4} if attempt == 0
                        else {**spec, "bn": True, "epochs": spec["epochs"] * 2})
            zoo.export_model(net, shape, path)
            params = int(sum(p.numel() for p in net.parameters()))
        else:
            spec = {"family": "zoo", "network": name}
            zoo.export(f"zoo:{name}", path)
            params = None
        entry = accuracy.curves_entry(str(path), RATIOS,
                                      "measured: datasets/make_accuracy_corpus.py")
        entry["network"] = spec
        entry["params"] = params
        entry["seconds"] = round(time.time() - t0, 1)
        done[name] = entry
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(done, indent=1) + "\n")
        print(f"{name} {spec.get('family')}: dense {entry['dense']:.3f}, int8 "
              f"{entry['int8']:.3f}, weight elbow {entry['weight_pruning']['elbow']}, channel "
              f"elbow {entry['channel_pruning']['elbow']} ({entry['seconds']} s)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--networks", type=int, default=48)
    p.add_argument("--matrix", type=int, default=0,
                   help="also this many matrix networks (MLP, encoder, ViT, LSTM, GRU)")
    p.add_argument("--zoo", action="store_true", help="also the trained zoo networks")
    p.add_argument("--skip", nargs="*", default=[],
                   help="networks not to train (a draw too slow to train on the machine)")
    p.add_argument("--features", action="store_true",
                   help="write the training table from the kept ONNX files, then stop")
    p.add_argument("--fit", action="store_true",
                   help="fit the shipped accuracy-cost model on the training table, then stop")
    args = p.parse_args()
    if args.features:
        from dlas_predict.models.accuracy import write_training_table

        path = write_training_table(json.loads(OUT.read_text()), corpus_dir(), TABLE)
        print(f"wrote {path}")
        return 0
    if args.fit:
        from dlas_predict.models.accuracy import fit_shipped
        from dlas_predict.paths import ACCURACY_MODEL

        model = fit_shipped(TABLE, ACCURACY_MODEL)
        print(f"fitted on {model.meta_['n_train']} points of {model.meta_['networks']} networks;"
              f" saved to {ACCURACY_MODEL}")
        return 0
    generate(args.networks, args.zoo, set(args.skip), args.matrix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
