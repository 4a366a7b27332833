"""Devices known by measurements alone: the maps and posteriors that `adapt`, `active-learn`
and `calibrate` fit, kept as one JSON file a device under DLAS_HOME/adapted."""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path

from dlas_predict.errors import DlasError
from dlas_predict.paths import dlas_home
from dlas_predict.space.devices import DeviceError


# ---- adapted devices ----------------------------------------------------------------------
def adapted_dir() -> Path:
    path = dlas_home() / "adapted"
    path.mkdir(parents=True, exist_ok=True)
    return path


def checked_name(device: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.@+-]{1,64}", device):
        raise DeviceError(f"device name {device!r}: use letters, digits and _ . @ + -")
    return device


def adapted_path(device: str) -> Path:
    """Where ``device``'s adapted map (``adapt``, ``active-learn``, ``calibrate``) is kept."""
    return adapted_dir() / f"{checked_name(device)}.json"


def read_adapted(device: str) -> dict | None:
    """``device``'s saved map (a copy the caller may change), None where it has none."""
    path = adapted_path(device)
    try:
        return copy.deepcopy(_parsed(path, path.stat().st_mtime_ns))
    except OSError:
        return None
    except ValueError:
        raise DlasError(f"adapted model {path} is unreadable; run `adapt` again") from None


def calibrated_on(device: str) -> str | None:
    """The fingerprint of the machine that ``calibrate`` fitted ``device``'s saved map on;
    None where the map is no calibration, or there is none, or it is unreadable."""
    path = adapted_path(device)
    try:
        saved = _parsed(path, path.stat().st_mtime_ns)
    except (OSError, ValueError):
        return None
    if saved.get("source") != "calibrate":
        return None
    return (saved.get("recommend_map") or {}).get("fingerprint") or saved.get("fingerprint")


@functools.lru_cache(maxsize=32)
def _parsed(path: Path, _mtime_ns: int) -> dict:
    """The saved map at ``path`` as it was at that modification time (read once)."""
    return json.loads(path.read_text())


def adapted_devices() -> list[str]:
    return sorted(p.stem for p in adapted_dir().glob("*.json"))


def adapted_summary(device: str) -> dict:
    """A device known by measurements alone, as `devices` lists it: a registry entry's
    fields, each empty (no spec invented)."""
    from dataclasses import fields

    from dlas_predict.space.devices import Device

    a = read_adapted(device) or {}
    n = len(a.get("targets", [])) or (a.get("recommend_map") or {}).get("shots", 0)
    empty = {f.name: {} if f.name in ("target", "peak_gflops", "caches") else None
             for f in fields(Device)}
    if a.get("source") == "layerwise":
        what = (f"known by {n} whole-network latencies in {a.get('runtime')} ({a.get('config')};"
                f" priced by layer kinds)")
    else:
        what = f"known by {n} measurement(s) on {a.get('source')}'s {a.get('level')}s"
    return {**empty, "name": device, "origin": "adapted", "model": "adapted",
            "description": f"{what} (DLAS_HOME/adapted/{device}.json)"}
