"""Where the tool keeps its state: ``DLAS_HOME``.

``DLAS_HOME`` (environment variable) holds the default corpus store, tuning databases and
caches. Default: ``$XDG_DATA_HOME/dlas-predict``, else ``~/.local/share/dlas-predict``.
"""

from __future__ import annotations

import os
from pathlib import Path


def dlas_home() -> Path:
    """Return the DLAS_HOME directory, creating it if needed."""
    env = os.environ.get("DLAS_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        path = Path(base) / "dlas-predict"
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_store_path() -> Path:
    """The default corpus store: ``DLAS_HOME/corpus.sqlite``."""
    return dlas_home() / "corpus.sqlite"


def cache_dir(name: str) -> Path:
    """A named cache directory under ``DLAS_HOME/cache``."""
    path = dlas_home() / "cache" / name
    path.mkdir(parents=True, exist_ok=True)
    return path
