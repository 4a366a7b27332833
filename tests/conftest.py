"""Shared test helpers: the command runner, the clean-error check, a standard conv layer and
a fake CPU device; and a DLAS_HOME per test session."""

import os
import sys
from pathlib import Path

#: The threads of one test process: every core, or under pytest-xdist its worker's share.
THREADS = max(1, len(os.sched_getaffinity(0))
              // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # parallel workers share the cores: each one's thread pools get its share (set before
    # numpy, LightGBM and onnxruntime read them)
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(THREADS))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlas_predict.paths import DEMO_NETWORK as DEMO  # noqa: E402,F401 (for the tests)
from dlas_predict.space.config import ConvSpec  # noqa: E402
from dlas_predict.space.devices import Device  # noqa: E402

#: A small conv layer that compiles and times in well under a second.
TINY = "C=8,H=10,W=10,K=16,R=3,S=3,stride=1,pad=1"
SPEC = ConvSpec.parse(TINY)
#: A CPU device that is not this machine: nothing measures on it.
CPU = Device(name="local", kind="cpu", description="test CPU", target={}, cores=2,
             clock_ghz=None, simd_bits=512, peak_gflops={"float32": 100.0},
             mem_bandwidth_gbs=20.0, source="measured")
#: The public data of other projects (TopHub, HELP), read from where the workplace keeps it:
#: ``../shared/data`` beside the checkout, or ``DLAS_SHARED_DATA``.
SHARED_DATA = Path(os.environ.get("DLAS_SHARED_DATA") or ROOT.parent / "shared" / "data")


def run_cli(*args):
    """Invoke the ``dlas-predict`` command in-process; every argument is turned into text."""
    from typer.testing import CliRunner

    from dlas_predict.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def run_python(*lines: str, env: dict | None = None, timeout: float = 120):
    """Run ``lines`` as a program in a fresh Python process (for what one process's import
    state would hide); returns the completed process, output captured as text."""
    import subprocess

    return subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_clean_error(result, needle: str) -> None:
    """A non-zero exit, one ``Error:`` line naming ``needle``, and no traceback."""
    assert result.exit_code != 0, result.output
    assert "Error: " in result.output and needle in result.output, result.output
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)


def snapshot_subset(directory: Path, networks):
    """The shipped local snapshot cut to ``networks``: their configurations, the kernels
    their layers use, and their whole-network records, written beside each other as a
    snapshot in ``directory``. Returns (snapshot path, kernels frame, whole-network frame)."""
    import pandas as pd

    from dlas_predict.corpus.store import networks_path
    from dlas_predict.paths import CORPUS_SNAPSHOTS

    full = CORPUS_SNAPSHOTS / "local.parquet"
    nets = pd.read_parquet(networks_path(full))
    nets = nets[nets["network"].isin(networks)]
    kernels = pd.read_parquet(full)
    kernels = kernels[kernels["conv"].isin(set(nets["conv"]))]
    whole = pd.read_parquet(networks_path(full, "wholenet"))
    whole = whole[whole["network"].isin(networks)]
    out = directory / "local.parquet"
    kernels.to_parquet(out, index=False)
    nets.to_parquet(networks_path(out), index=False)
    whole.to_parquet(networks_path(out, "wholenet"), index=False)
    return out, kernels, whole


@pytest.fixture(autouse=True)
def _machine_share(request, tmp_path_factory):
    """Under pytest-xdist, a test marked ``quiet`` runs while no other test does: every test
    holds a shared lock on a file the workers share, a quiet one an exclusive lock."""
    if not hasattr(request.config, "workerinput"):  # not an xdist worker
        yield
        return
    import fcntl

    quiet = request.node.get_closest_marker("quiet") is not None
    # each worker's base temporary folder lies in the run's own
    with open(tmp_path_factory.getbasetemp().parent / "machine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True)
def _dlas_home(tmp_path_factory, monkeypatch):
    """Every test gets its own DLAS_HOME, sharing the cached local-target detection; on a
    CPU without a model of its own, recommend keeps its estimated roofs (the tests that
    measure them say so)."""
    home = tmp_path_factory.getbasetemp() / "dlas_home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("DLAS_HOME", str(home))
    monkeypatch.setenv("DLAS_MEASURE_ROOFS", "0")
    monkeypatch.setenv("TVM_NUM_THREADS", str(THREADS))
    yield home


def trained_here(monkeypatch, here: bool) -> None:
    """Make the shipped models of this machine and its profiles this machine's (or another
    machine's), whichever machine runs the test."""
    from dlas_predict.crossdev import transfer
    from dlas_predict.space.devices import get_device

    monkeypatch.setattr(transfer, "model_machine", lambda name: (
        get_device(name, with_target=False).fingerprint if here else "0123456789abcdef"))


def token_lstm(steps: int, hidden: int = 8):
    """Token ids, steps first (PyTorch's default ``batch_first=False``), through an
    embedding into an LSTM in ONNX's default layout, its last state classified."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = {"table": rng.normal(size=(40, 6)), "W": rng.normal(size=(1, 4 * hidden, 6)),
             "R": rng.normal(size=(1, 4 * hidden, hidden)), "fc": rng.normal(size=(hidden, 10))}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    inits["shape"] = np.array([1, hidden], dtype=np.int64)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("LSTM", ["emb", "W", "R"], ["y", "yh"], hidden_size=hidden,
                              name="lstm"),
             helper.make_node("Reshape", ["yh", "shape"], ["h"]),
             helper.make_node("MatMul", ["h", "fc"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [steps, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model
