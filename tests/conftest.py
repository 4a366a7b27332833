import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEMO = ROOT / "datasets" / "networks" / "demo-cnn.onnx"


@pytest.fixture(autouse=True)
def _dlas_home(tmp_path_factory, monkeypatch):
    """Every test gets its own DLAS_HOME, sharing the cached local-target detection."""
    home = tmp_path_factory.getbasetemp() / "dlas_home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("DLAS_HOME", str(home))
    monkeypatch.setenv("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    yield home
