"""Writing the tool's files so that an unchanged file is never rewritten.

Shipped data lives in git: a file whose bytes would not change keeps its bytes and its
modification time, and a file that does change is replaced whole (written beside it, then
renamed), so a process killed mid-write leaves the old file or the new one, never half.
"""

from __future__ import annotations

import os
from pathlib import Path


def scratch_path(path: Path) -> Path:
    """A hidden file beside ``path`` to write before :func:`replace_if_changed`."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def replace_if_changed(tmp: Path, path: Path) -> bool:
    """Put the written file ``tmp`` in place of ``path`` unless ``path`` already holds the
    same bytes; ``tmp`` is gone either way. Returns whether ``path`` changed."""
    tmp, path = Path(tmp), Path(path)
    try:
        if path.is_file() and path.read_bytes() == tmp.read_bytes():
            return False
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` whole, unless it already holds those bytes. Returns
    whether ``path`` changed."""
    path = Path(path)
    tmp = scratch_path(path)
    try:
        tmp.write_bytes(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return replace_if_changed(tmp, path)


_DIGESTS: dict[tuple, str] = {}


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes (hex), remembered while the file keeps its size and
    modification time: a model asked about many times is read and hashed once."""
    import hashlib

    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


def read_rows(path: Path, keep=lambda row: True, by: str = "name") -> dict[str, dict]:
    """The JSON rows already in the JSON-lines file ``path`` (that ``keep`` accepts), by
    their field ``by``: the resumable output of a run that appends one row per finished
    item (a later row of the same item wins)."""
    import json

    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # blank, or a line cut by a kill: that item is simply redone
                continue
            if keep(row):
                done[row[by]] = row
    return done


def append_row(path: Path, row: dict) -> None:
    """Append ``row`` to the JSON-lines file ``path`` (created if new)."""
    import json

    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
