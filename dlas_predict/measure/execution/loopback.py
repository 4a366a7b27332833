"""A TVM RPC tracker and its servers on loopback, for the tests and the benchmarks:
``python -m tvm.exec.rpc_tracker`` and ``python -m tvm.exec.rpc_server`` processes bound to
127.0.0.1 on free ports, each in its own process group, stopped with :meth:`close`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dlas_predict.measure import hide_torch_from_children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m ARGS`` in its own session, logging to ``log``; a tracker or a board never
    imports torch (:func:`hide_torch_from_children`)."""
    hidden = hide_torch_from_children(log.parent / "without-torch")
    return subprocess.Popen([sys.executable, "-m", *args], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **hidden, **(env or {})})


def stop(proc: subprocess.Popen) -> None:
    """SIGKILL a process and its group; wait for it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _wait_for_listener(port: int, proc: subprocess.Popen, deadline_s: float = 60.0) -> None:
    """Until something accepts connections on 127.0.0.1:``port`` (``proc`` listening)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the tracker exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the tracker did not listen on port {port} within {deadline_s} s")


def wait_for_boards(port: int, key: str, n: int, deadline_s: float = 90.0) -> None:
    """Until ``n`` boards under ``key`` are free at the tracker on ``port``."""
    from dlas_predict.measure.execution.remote import tracker_summary

    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        try:
            queue = tracker_summary("127.0.0.1", port).get("queue_info", {}).get(key, {})
            if int(queue.get("free", 0)) >= n:
                return
        except Exception:  # noqa: BLE001 - the tracker is still starting
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{n} boards did not register within {deadline_s} s")


class LoopbackFarm:
    """A tracker and ``boards`` servers under ``key``, all on 127.0.0.1; logs in ``tmp``.
    Each server's TVM pool runs ``threads`` threads (default: this machine's cores, the
    ``local`` device's; TVM's own default halves them on x86)."""

    def __init__(self, tmp: Path, key: str, boards: int = 2, threads: int | None = None) -> None:
        from dlas_predict.space.devices import local_cores

        self.tmp, self.key = Path(tmp), key
        self.threads = threads or local_cores()
        self.port = free_port()
        self.tracker = _start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port",
                               str(self.port), "--port-end", str(self.port + 1)],
                              self.tmp / "tracker.log")
        self.servers: list[subprocess.Popen] = []
        self._by_address: dict[str, subprocess.Popen] = {}
        try:
            # a server that finds no tracker yet retries 5 s later: start them once it listens
            _wait_for_listener(self.port, self.tracker)
            for _ in range(boards):
                self.add_server()
            wait_for_boards(self.port, key, boards)
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def add_server(self) -> subprocess.Popen:
        p = free_port()
        proc = _start(["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(p),
                       "--port-end", str(p + 1), "--tracker", self.address, "--key", self.key],
                      self.tmp / f"server{len(self.servers)}.log",
                      {"TVM_NUM_THREADS": str(self.threads)})
        self.servers.append(proc)
        self._by_address[f"127.0.0.1:{p}"] = proc
        return proc

    def server_at(self, address: str) -> subprocess.Popen:
        """The server process a board's ``address`` (``127.0.0.1:PORT``) names."""
        return self._by_address[address]

    def close(self) -> None:
        for proc in [*self.servers, self.tracker]:
            stop(proc)

    def __enter__(self) -> "LoopbackFarm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
