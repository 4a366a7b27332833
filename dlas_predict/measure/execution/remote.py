"""Where built code runs: this process's CPU, or a board reached through a TVM RPC tracker.

The worker builds every kernel and network here, for the device's target, and hands the
result to an :class:`Execution`:

- :class:`LocalExecution` runs it in this process (``tvm.cpu(0)``);
- :class:`RemoteExecution` links it into a shared library (natively for x86, with Debian's
  cross g++ for aarch64 and armv7), uploads it to the board its session holds, loads it
  there and runs it on the board's CPU; the numpy or onnxruntime check and the timing's
  ``time_evaluator`` run on the board.

:func:`request_board` asks a tracker for a board under a key and tells which board it got
(its address) and what it is (:class:`BoardInfo`, read off the board: LLVM's name for its
CPU, its triple, its cores and TVM's thread count). Imports TVM; runs in the worker. The
tracker's own wire protocol (a magic number, then length-prefixed JSON) is spoken here so
that a request can time out and the board's address is known.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Callable

from dlas_predict.errors import BoardError

#: TVM RPC's tracker protocol constants (``tvm.rpc.base``).
#: Called when a board is given back, to drop what lives on it (the contention probes'
#: modules and tensors register theirs).
RELEASE_HOOKS: list[Callable[[], None]] = []


def pool_threads() -> int:
    """Threads of TVM's CPU pool in this process (TVM_NUM_THREADS, else the cores)."""
    env = os.environ.get("TVM_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


_TRACKER_MAGIC = 0x2F271
_CODE_SUCCESS, _CODE_REQUEST, _CODE_SUMMARY = 0, 4, 6




# ---- the tracker's protocol ----------------------------------------------------------------
def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("<i", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the tracker closed the connection")
        buf += chunk
    return buf


def _recv(sock: socket.socket) -> Any:
    size = struct.unpack("<i", _recv_exact(sock, 4))[0]
    return json.loads(_recv_exact(sock, size).decode())


def tracker_connect(host: str, port: int, timeout_s: float = 10.0) -> socket.socket:
    """A socket to the tracker after its handshake; :class:`BoardError` if unreachable."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.sendall(struct.pack("<i", _TRACKER_MAGIC))
        magic = struct.unpack("<i", _recv_exact(sock, 4))[0]
    except (OSError, ConnectionError, struct.error) as exc:
        raise BoardError(f"cannot reach the RPC tracker at {host}:{port} ({exc})",
                         "unreachable") from None
    if magic != _TRACKER_MAGIC:
        sock.close()
        raise BoardError(f"{host}:{port} is not a TVM RPC tracker", "unreachable")
    return sock


def _ask(host: str, port: int, message: list, what: str,
         reply_timeout_s: float | None = None) -> Any:
    """One exchange with the tracker: send ``message``, return the value of its success
    reply. :class:`BoardError` ``unreachable`` when the tracker does not answer or refuses
    (``what`` names the exchange); :class:`socket.timeout` when ``reply_timeout_s`` passes."""
    sock = tracker_connect(host, port)
    try:
        if reply_timeout_s is not None:
            sock.settimeout(reply_timeout_s)
        _send(sock, message)
        value = _recv(sock)
    except socket.timeout:
        raise
    except (OSError, ConnectionError, ValueError) as exc:
        raise BoardError(f"the RPC tracker at {host}:{port} dropped {what} ({exc})",
                         "unreachable") from None
    finally:
        sock.close()
    if value[0] != _CODE_SUCCESS:
        raise BoardError(f"the tracker at {host}:{port} refused {what}: {value}",
                         "unreachable")
    return value[1]


def tracker_summary(host: str, port: int) -> dict[str, Any]:
    """The tracker's queues: ``{"queue_info": {key: {"free": n, "pending": m}}, ...}``."""
    return _ask(host, port, [_CODE_SUMMARY], "a summary")


def boards_under(host: str, port: int, key: str) -> int:
    """How many boards are registered under ``key`` (free or busy); :class:`BoardError`
    ``unknown_key`` when none, listing the keys the tracker has."""
    summary = tracker_summary(host, port)
    servers = [s for s in summary.get("server_info", [])
               if str(s.get("key", "")).split(":", 1)[-1] == key]
    queue = summary.get("queue_info", {}).get(key)
    if not servers and not queue:
        keys = sorted(summary.get("queue_info", {}))
        raise BoardError(f"the tracker at {host}:{port} has no board under the key {key!r} "
                         f"(keys it has: {', '.join(keys) or 'none'})", "unknown_key")
    return max(len(servers), int((queue or {}).get("free", 0)))


def request_board(host: str, port: int, key: str, timeout_s: float,
                  session_timeout_s: float = 0.0):
    """Ask the tracker for a free board under ``key``; wait at most ``timeout_s``.

    Returns ``(session, "addr:port")``. :class:`BoardError` ``no_board`` when none came free
    in time, ``unreachable`` when the tracker or the board cannot be reached."""
    import time

    from tvm import rpc

    # Wait for a free board before asking: the tracker cannot cancel a request, and one
    # left behind by a client that gave up would take the next board that comes free.
    none_free = f"no free board under the key {key!r} within {timeout_s:g} s (--timeout)"
    deadline = time.monotonic() + timeout_s
    while True:
        queue = tracker_summary(host, port).get("queue_info", {}).get(key, {})
        if int(queue.get("free", 0)) > int(queue.get("pending", 0)):
            break
        if time.monotonic() >= deadline:
            raise BoardError(none_free, "no_board")
        time.sleep(0.25)
    try:
        url, bport, matchkey = _ask(host, port, [_CODE_REQUEST, key, "", 1],
                                    f"the request for {key!r}",
                                    max(1.0, deadline - time.monotonic()))
    except socket.timeout:
        raise BoardError(none_free, "no_board") from None
    try:
        session = rpc.connect(url, bport, matchkey, session_timeout=session_timeout_s)
    except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
        raise BoardError(f"the board at {url}:{bport} did not accept a session: "
                         f"{_last_line(exc)}", "unreachable") from None
    return session, f"{url}:{bport}"


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


# ---- what a board is -----------------------------------------------------------------------
@dataclass(frozen=True)
class BoardInfo:
    """A board as it reports itself: LLVM's name for its CPU (``znver3``,
    ``cortex-a73``), its LLVM triple, its logical cores and the threads of its server's TVM
    pool (``runtime.NumThreads``; 0: not reported), plus the tracker key it was found under
    and its address."""

    cpu: str
    triple: str
    cores: int
    key: str
    address: str
    #: declared an emulator by the user (``--emulated``): its timings are not a device's
    emulated: bool = False
    threads: int = 0

    @property
    def fingerprint(self) -> str:
        ident = {"cpu": self.cpu, "triple": self.triple, "cores": self.cores}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BoardInfo":
        return cls(**{k: d[k] for k in ("cpu", "triple", "cores", "key", "address")},
                   emulated=bool(d.get("emulated")), threads=int(d.get("threads") or 0))


def read_board(session, key: str, address: str, emulated: bool = False) -> BoardInfo:
    """Ask the board what it is. Its thread pool is the one its server started with: TVM
    sizes it from ``TVM_NUM_THREADS``, else from the cores (halved on x86 for
    hyper-threads), and ``runtime.config_threadpool`` through a session pinned it to one
    core (seen on loopback servers), so the pool is checked, not set."""
    def call(name: str, *args):
        return session.get_function(name)(*args)

    return BoardInfo(cpu=str(call("target.llvm_get_system_cpu")),
                     triple=str(call("target.llvm_get_system_triple")),
                     cores=int(call("s_tir.meta_schedule.cpu_count", True)), key=key,
                     address=address, emulated=emulated,
                     threads=int(call("runtime.NumThreads")))


#: LLVM CPU names that are ISA levels, not a particular CPU: any CPU of the arch runs them.
_GENERIC_CPUS = ("generic", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")


def _arch(triple: str) -> str:
    arch = triple.split("-", 1)[0].lower()
    if arch in ("x86_64", "amd64"):
        return "x86_64"
    if arch in ("aarch64", "arm64"):
        return "aarch64"
    if arch.startswith("arm") or arch.startswith("thumb"):
        return "arm"
    return arch


def _host(target: dict[str, Any]) -> dict[str, Any]:
    """The CPU part of a target: the target itself for ``llvm``, else its ``host``."""
    host = target if target.get("kind") == "llvm" else target.get("host")
    return host if isinstance(host, dict) else {}


def board_mismatch(target: dict[str, Any], board: BoardInfo, threads: int = 0) -> str | None:
    """Why ``board`` is not the device of ``target`` (None when it matches): another
    architecture, (for a target naming a particular CPU) another CPU, or (given the
    device's ``threads``) a server whose TVM pool runs another number of threads."""
    host = _host(target)
    triple = host.get("mtriple")
    if triple and _arch(triple) != _arch(board.triple):
        return (f"the board at {board.address} is {board.triple} ({board.cpu}); the device's "
                f"target is {triple}")
    mcpu = host.get("mcpu")
    if board.emulated:
        return None  # an emulator runs any CPU of its architecture, and names none
    if mcpu and mcpu not in _GENERIC_CPUS and mcpu != board.cpu:
        return (f"the board at {board.address} reports CPU {board.cpu!r}; the device's target "
                f"is for {mcpu!r}")
    if threads and board.threads and board.threads != threads:
        return (f"the server of the board at {board.address} runs TVM kernels on "
                f"{board.threads} thread(s), the device on {threads}: start it with "
                f"TVM_NUM_THREADS={threads}")
    return None


# ---- linking for a board ---------------------------------------------------------------------
#: Debian's cross compilers, by architecture (``setup.sh`` installs them).
CROSS_CXX = {"aarch64": "aarch64-linux-gnu-g++", "arm": "arm-linux-gnueabihf-g++"}


def linker_for(target: dict[str, Any]):
    """The ``fcompile`` that links a shared library for ``target``'s architecture: None
    (TVM's default, the native g++) for this machine's, else Debian's cross g++."""
    triple = _host(target).get("mtriple")
    arch = _arch(triple) if triple else _arch(os.uname().machine)
    if arch == _arch(os.uname().machine):
        return None
    cxx = CROSS_CXX.get(arch)
    if cxx is None:
        raise RuntimeError(f"no cross compiler known for {triple}")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{cxx} is not installed (setup.sh installs Debian's "
                           f"g++-{cxx.rsplit('-g++', 1)[0]} as root)")
    from tvm.support import cc

    return cc.cross_compiler(cxx)


def export_shared(executable, path: str, target: dict[str, Any]) -> str:
    """Link a compiled module (``tvm.compile``'s result) into the shared library ``path``
    for ``target``'s architecture."""
    executable.export_library(path, fcompile=linker_for(target))
    return path


# ---- where code runs -------------------------------------------------------------------------
class LocalExecution:
    """Built code runs in this process."""

    remote = False
    board: BoardInfo | None = None

    def __init__(self) -> None:
        import tvm

        self.dev = tvm.cpu(0)

    def load(self, executable, target: dict[str, Any] | None = None):
        """The runnable module of ``executable`` (``tvm.compile``'s result)."""
        return getattr(executable, "mod", executable)

    def threads(self) -> int:
        return pool_threads()

    def alive(self) -> bool:
        return True


class RemoteExecution:
    """Built code is linked here, uploaded to a board and run there.

    ``tracker`` is (host, port); the session is requested under ``key`` and kept for the
    worker's life (one board, one measurement at a time)."""

    remote = True

    def __init__(self, tracker: tuple[str, int], key: str, timeout_s: float,
                 session_timeout_s: float = 0.0, emulated: bool = False) -> None:
        self.tracker, self.key, self.timeout_s = tracker, key, timeout_s
        self.session_timeout_s, self.emulated = session_timeout_s, emulated
        self._count = 0
        self.session = None
        self.board: BoardInfo | None = None
        self.connect()

    def connect(self) -> None:
        """Request a board from the tracker and hold its session."""
        session, address = request_board(*self.tracker, self.key, self.timeout_s,
                                          self.session_timeout_s)
        try:
            self.board = read_board(session, self.key, address, self.emulated)
        except Exception as exc:  # noqa: BLE001
            raise BoardError(f"the board at {address} did not say what it is: "
                             f"{_last_line(exc)}", "lost") from None
        self.session = session
        self.dev = session.cpu(0)

    def release(self) -> None:
        """Give the board back: drop the session and everything on it (the probes' modules
        and tensors), so the server ends the session and registers again."""
        import gc

        for hook in RELEASE_HOOKS:
            hook()
        self.session, self.dev = None, None
        gc.collect()

    def load(self, executable, target: dict[str, Any], truncate: bool = False):
        """Link ``executable`` for the board, upload it, load it there. ``truncate`` (a test
        hook) cuts the library to its first 64 bytes before the upload, so the board's load
        fails as it does on a corrupted transfer."""
        self._count += 1
        name = f"m{os.getpid()}_{self._count}.so"
        with tempfile.TemporaryDirectory(prefix="dlas-rpc-") as tmp:
            path = export_shared(executable, os.path.join(tmp, name), target)
            if truncate:
                os.truncate(path, 64)
            try:
                self.session.upload(path)
                return self.session.load_module(name)
            except Exception as exc:  # noqa: BLE001
                raise RuntimeError(f"upload or load on the board at {self.board.address} "
                                   f"failed: {_last_line(exc)}") from None

    def threads(self) -> int:
        return self.board.threads or self.board.cores

    def alive(self) -> bool:
        """Whether the board still answers (a short call through the session)."""
        if self.session is None:
            return False
        try:
            self.session.get_function("runtime.NumThreads")()
            return True
        except Exception:  # noqa: BLE001 - any failure means the session is gone
            return False


_EXECUTION: LocalExecution | RemoteExecution | None = None


def execution() -> LocalExecution | RemoteExecution:
    """Where this worker's built code runs (local unless :func:`use` chose a board)."""
    global _EXECUTION
    if _EXECUTION is None:
        _EXECUTION = LocalExecution()
    return _EXECUTION


def use(ex: LocalExecution | RemoteExecution) -> None:
    global _EXECUTION
    _EXECUTION = ex

