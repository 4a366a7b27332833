"""Where things live: the data shipped with the tool, and the tool's state (``DLAS_HOME``).

Shipped data (cost models, accuracy curves, zoo weights, corpus snapshots, the demo network)
sits at the top of a source checkout (``models_store/``, ``datasets/``); a non-editable
install carries the same folders as package data under ``dlas_predict/_shipped``. This is the
one module that knows both places.

``DLAS_HOME`` (environment variable) holds the default corpus store, tuning databases and
caches. Default: ``$XDG_DATA_HOME/dlas-predict``, else ``~/.local/share/dlas-predict``.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped_root() -> Path:
    installed = _PACKAGE / "_shipped"
    if installed.is_dir():
        return installed
    return _PACKAGE.parent  # a source checkout (editable install or PYTHONPATH)


SHIPPED = _shipped_root()
#: Trained cost models, one folder per device.
MODELS_STORE = SHIPPED / "models_store"
#: The accuracy-cost model (a compression's top-1 drop predicted from the weights).
ACCURACY_MODEL = MODELS_STORE / "accuracy"
#: The local CPU's models and corpora measured on further machines, one folder per machine
#: fingerprint under MODELS_STORE and CORPUS_SNAPSHOTS (see :func:`model_dir`).
MACHINES = "machines"
#: Data sets shipped with the tool.
DATASETS = SHIPPED / "datasets"
#: Corpus snapshots (Parquet), one per device.
CORPUS_SNAPSHOTS = DATASETS / "corpus"
#: Accuracy-against-compression curves of the zoo networks.
CURVES = DATASETS / "accuracy" / "curves.json"
#: Trained weights of the zoo's CIFAR-10-shaped networks (digits).
WEIGHTS_DIR = DATASETS / "weights"
#: The demo's network.
DEMO_NETWORK = DATASETS / "networks" / "demo-cnn.onnx"


def machine_model_dir(name: str, fingerprint: str | None) -> Path:
    """The models of ``name`` measured on the machine ``fingerprint``: that machine's shipped
    folder (``models_store/machines/FINGERPRINT/NAME``) where there is one, else
    ``models_store/NAME``."""
    if fingerprint:
        mine = MODELS_STORE / MACHINES / fingerprint / name
        if mine.is_dir():
            return mine
    return MODELS_STORE / name


#: Public measurements of other projects (TopHub, HELP): read where they lie, never shipped.
#: ``DLAS_SHARED_DATA``, else ``shared/data`` beside the checkout.
def shared_data() -> Path:
    env = os.environ.get("DLAS_SHARED_DATA")
    return Path(env).expanduser() if env else _PACKAGE.parent.parent / "shared" / "data"


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


def tuning_db_dir(device: str, fingerprint: str) -> Path:
    """A device's default tuning database: ``DLAS_HOME/tuning/DEVICE-FINGERPRINT``."""
    return dlas_home() / "tuning" / f"{device}-{fingerprint}"
