"""Measure the shipped accuracy-vs-ratio curves of the trained zoo networks.

    .venv/bin/python datasets/make_accuracy_curves.py [--finetune NAME:EPOCHS ...]

For each CIFAR-style zoo network (weights trained on digits, shipped), both pruning kinds at
the default ratios, each point measured (top-1 on the 360 held-out digits, onnxruntime), and
the elbow ratio of each (the study's rule, ``accuracy.ELBOW_DROP_PP``). Also float16 and
int8 (before and after calibration). Writes ``datasets/accuracy/curves.json``; the
recommender reads it when no data is given, labelled as the shipped curves.
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
    from dlas_predict.compression import accuracy
    from dlas_predict.networks import zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finetune", nargs="*", default=["mobilenetv1-cifar:1"],
                   help="NAME:EPOCHS: also measure fine-tuned curves for these networks")
    p.add_argument("--names", nargs="*",
                   default=[n for n, e in zoo.ZOO.items() if e.dataset == "cifar10"])
    args = p.parse_args()
    finetune = {item.split(":")[0]: int(item.split(":")[1]) for item in args.finetune}
    out_path = ROOT / "datasets" / "accuracy" / "curves.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    for name in args.names:
        t0 = time.time()
        model = f"zoo:{name}"
        entry = accuracy.curves_entry(model, accuracy.DEFAULT_RATIOS,
                                      "measured: datasets/make_accuracy_curves.py",
                                      (0, finetune.get(name, 0)),
                                      log=lambda line: print(f"{name} {line}", flush=True))
        entry["seconds"] = round(time.time() - t0, 1)
        result[name] = entry
        out_path.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
