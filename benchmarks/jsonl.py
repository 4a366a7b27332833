"""The resumable output of the benchmarks that measure network by network: one JSON row per
network, appended as soon as it is measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def read_rows(path: Path, keep: Callable[[dict], bool] = lambda row: True) -> dict[str, dict]:
    """The rows already in ``path`` (that ``keep`` accepts), by network name."""
    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if keep(row):
                    done[row["name"]] = row
    return done


def append_row(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
