"""Train the CIFAR-style zoo networks on scikit-learn's digits, once; ship the weights.

    .venv/bin/python datasets/train_digits.py [--epochs 10] [NAME ...]

Writes ``datasets/weights/NAME.npz.xz`` (see ``dlas_predict.networks.zoo.save_weights``
for the compact format) and records the run in ``datasets/weights/trained.json``: epochs, seconds,
and the held-out top-1 measured on the exported ONNX model with onnxruntime (the path ``accuracy``
uses), next to the top-1 of the torch model itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from dlas_predict.compression import accuracy
    from dlas_predict.compression import digits
    from dlas_predict.networks import torchmodels
    from dlas_predict.compression import training
    from dlas_predict.networks import zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=list(torchmodels.CIFAR))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=None,
                   help="default 0.05; 0.01 for vgg16-cifar (no residual path: 0.05 diverged); "
                        "the networks of other families: AdamW at 0.001")
    args = p.parse_args()
    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    out_dir = ROOT / "datasets" / "weights"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "trained.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    for name in args.names:
        entry = zoo.get(name)
        train = digits.digits("train", entry.input_shape)
        test = digits.digits("test", entry.input_shape)
        model = torchmodels.build(name)
        adam = entry.family != "cnn"
        lr = args.lr or (0.001 if adam else 0.01 if name == "vgg16-cifar" else 0.05)
        t0 = time.time()
        training.train(model, train.x, train.y, args.epochs, lr=lr, max_shift=2, adam=adam,
                       batch_size=args.batch_size,
                       weight_decay=0.05 if adam else 5e-4,
                       log=lambda s: print(f"{name}: {s}", flush=True))
        seconds = time.time() - t0
        torch_top1 = training.top1(model, test.x, test.y)
        zoo.save_weights(model, entry.weights_path)
        # What users get: the shipped weights loaded back, exported, run by onnxruntime.
        onnx_path = zoo.export(name)
        shipped = accuracy.evaluate_onnx(onnx_path, test)
        log[name] = {
            "data": "sklearn digits, stratified split seed 0: 1437 train / 360 test",
            "epochs": args.epochs, "batch_size": args.batch_size, "lr": lr,
            "optimizer": "AdamW" if adam else "SGD",
            "augmentation": "random shifts <= 2 px",
            "train_seconds": round(seconds, 1), "torch_top1": round(torch_top1, 4),
            "top1": round(shipped, 4), "n_test": len(test), "torch": torch.__version__,
        }
        print(f"{name}: held-out top-1 {shipped:.2%} (torch before storage {torch_top1:.2%}),"
              f" trained in {seconds:.0f} s", flush=True)
        log_path.write_text(json.dumps(log, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
