"""Import TVM TopHub tuning logs (public AutoTVM measurements) into a corpus.

Each log line is the best AutoTVM schedule found for one conv workload on one device
(the README of the public data folder's ``tophub``). A line becomes one :class:`MeasureResult`:

- device: the registry entry whose ``tophub_model`` (the target's ``-model=``) and
  ``tophub_file`` match; its fingerprint is the registry's;
- conv: the data and kernel tensors, strides, padding and dilation (depthwise kernels
  ``[C, M, R, S]`` become ``groups = C``, ``K = C x M``);
- algorithm: ``spatial_pack`` templates → spatial_pack; ``conv2d_nchw`` (direct loops) and
  ``depthwise_conv2d_nchw`` → direct;
- compression: dense, float16 or int8 by the data type; tuning: tuned (AutoTVM);
- ``run_secs``: the logged mean times; ``kernels_version`` names the source, so every
  imported row says where it came from (``tophub-f05376e:TEMPLATE``).

Lines outside the study's space (winograd, transposed conv, dense layers, failed runs,
batch ≠ 1) are counted by reason and left out, never guessed.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from dlas_predict.space.config import ConvSpec, Variant
from dlas_predict.space.devices import registry_entries, get_device
from dlas_predict.errors import DlasError
from dlas_predict.measure.records import MeasureResult, measurement_key

SOURCE = "tophub-f05376e"

_ALGORITHMS = {
    "conv2d_nchw_spatial_pack": "spatial_pack",
    "conv2d_nchw": "direct",
    "depthwise_conv2d_nchw": "direct",
}


@dataclass
class TophubImport:
    """What an import did: rows added, rows already present, and what was left out."""

    added: int = 0
    present: int = 0
    devices: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {"added": self.added, "present": self.present, "devices": dict(self.devices),
                "skipped": dict(self.skipped)}


def devices_by_model() -> dict[tuple[str, str], str]:
    return {(e["tophub_file"], e["tophub_model"]): e["name"]
            for e in registry_entries() if e.get("tophub_model")}


def _pads(p: list[int]) -> tuple[int, int, int, int]:
    if len(p) == 2:
        return p[0], p[1], p[0], p[1]
    if len(p) == 4:
        return p[0], p[1], p[2], p[3]
    raise ValueError(f"padding {p}")


@functools.lru_cache(maxsize=None)
def _fingerprint(name: str) -> str:
    """A registry device's fingerprint (the registry is shipped: it does not change while a
    log of thousands of lines is read)."""
    return get_device(name, with_target=False).fingerprint


def parse_line(line: str, file_name: str, devices: dict[tuple[str, str], str]
               ) -> MeasureResult | str:
    """One log line → a record, or the reason it is left out."""
    try:
        rec = json.loads(line)
        target, template, args = rec["input"][0], rec["input"][1], rec["input"][2]
        times, code = rec["result"][0], rec["result"][1]
    except (ValueError, KeyError, IndexError, TypeError):
        return "malformed line"
    m = re.search(r"-model=(\S+)", target)
    name = devices.get((file_name, m.group(1) if m else ""))
    if name is None:
        return f"device {m.group(1) if m else target!r} not in the registry"
    base = template.split(".")[0]
    algorithm = _ALGORITHMS.get(base)
    if algorithm is None:
        return f"template {base} (outside the study's algorithms)"
    if code != 0 or not times:
        return "failed run (error code)"
    try:
        (_, dshape, ddtype), (_, wshape, _), stride, pad, dilation = args[:5]
        n, c, h, w = dshape
        if n != 1:
            return "batch != 1"
        if base.startswith("depthwise"):
            cin, mult, r, s = wshape
            k, groups = cin * mult, cin
        else:
            k, _, r, s = wshape
            groups = c // wshape[1]
        stride = stride if isinstance(stride, list) else [stride, stride]
        dilation = dilation if isinstance(dilation, list) else [dilation, dilation]
        pt, pl, pb, pr = _pads(pad if isinstance(pad, list) else [pad, pad])
        spec = ConvSpec(C=c, H=h, W=w, K=k, R=r, S=s, stride_h=stride[0], stride_w=stride[1],
                        pad_t=pt, pad_l=pl, pad_b=pb, pad_r=pr, groups=groups,
                        dilation_h=dilation[0], dilation_w=dilation[1])
    except (ValueError, TypeError, DlasError) as exc:
        return f"unreadable workload ({exc})"
    compression = {"float32": "dense", "float16": "float16", "int8": "int8"}.get(ddtype)
    if compression is None:
        return f"data type {ddtype}"
    variant = Variant(algorithm, compression, 0.0, "tuned")
    fingerprint = _fingerprint(name)
    knobs = {"autotvm_config": int(rec.get("config", {}).get("index", -1))}
    version = f"{SOURCE}:{template}"
    return MeasureResult(
        key=measurement_key(name, fingerprint, spec, variant, knobs, version),
        device=name, fingerprint=fingerprint, conv=spec, variant=variant, knobs=knobs,
        run_secs=[float(t) for t in times], number=None, verified=None,
        tvm_version=str(rec.get("tvm_version", "")), kernels_version=version,
        timestamp=float(rec["result"][3]) if len(rec["result"]) > 3 else 0.0,
        tuning_seconds=None)


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """The ``.jsonl`` logs named, or found in the folders named."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.glob("*.jsonl")))
        elif p.is_file():
            out.append(p)
        else:
            raise DlasError(f"TopHub log not found: {p}")
    if not out:
        raise DlasError("no TopHub .jsonl log found in " + ", ".join(map(str, paths)))
    return out


def import_tophub(paths: Iterable[str | Path], store: str | Path) -> TophubImport:
    """Add every usable line of the logs to the corpus ``store``."""
    from dlas_predict.corpus.store import CorpusStore

    devices = devices_by_model()
    report = TophubImport()
    files = log_files(paths)
    with CorpusStore(store) as db:
        have = db.keys()
        for path in files:
            with open(path) as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    got = parse_line(line, path.name, devices)
                    if isinstance(got, str):
                        report.skipped[got] += 1
                        continue
                    if got.key in have:
                        report.present += 1
                        continue
                    db.add(got)
                    have.add(got.key)
                    report.added += 1
                    report.devices[got.device] += 1
    return report
