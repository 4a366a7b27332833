"""How to reach boards through a TVM RPC tracker: the options every measuring command
shares (``--tracker``, ``--rpc-key``, ``--allow-remote-tracker``, ``--boards``, ``--tries``,
``--timeout``). Pure Python: importable without TVM.

TVM RPC has no authentication: whoever reaches a tracker or a board can run code on the
boards. Trackers are therefore used on loopback unless ``allow_remote`` says otherwise, and
nothing of ours listens on any address.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from dlas_predict.errors import ConfigError, param

#: The environment variable read when ``--tracker`` is not given.
TRACKER_ENV = "DLAS_TRACKER"

REMOTE_WARNING = ("warning: the tracker {addr} is not on loopback. TVM RPC has no "
                  "authentication: anyone who can reach this tracker or its boards on that "
                  "network can run code on the boards.")


def parse_tracker(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) → (host, port); a clear error otherwise."""
    text = (text or "").strip()
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{param('tracker')} must be HOST:PORT (e.g. 127.0.0.1:9190), got "
                          f"{text!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback
                               for a in addrs)


@dataclass(frozen=True)
class RpcOptions:
    """Measure on boards registered under ``key`` at the tracker ``host:port``.

    ``boards``: sessions used in parallel (None: every board under the key when the run
    starts); ``tries``: boards a task may be given before its failure is recorded;
    ``request_timeout_s``: how long to wait for a free board; ``session_timeout_s``: the
    board ends a session older than this (0: never)."""

    host: str
    port: int
    key: str
    boards: int | None = None
    tries: int = 3
    request_timeout_s: float = 60.0
    session_timeout_s: float = 0.0
    #: the boards are emulators (e.g. ``qemu-user``): outputs are verified, timings are
    #: labelled ``emulated``, never stored and never shown as the device's figures
    emulated: bool = False

    def __post_init__(self) -> None:
        if self.boards is not None and self.boards < 1:
            raise ConfigError(f"{param('boards')} must be at least 1, got {self.boards}")
        if self.tries < 1:
            raise ConfigError(f"{param('tries')} must be at least 1, got {self.tries}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"{param('request_timeout_s')} must be positive, got "
                              f"{self.request_timeout_s}")
        if not self.key:
            raise ConfigError(f"{param('rpc_key')} must not be empty")

    @property
    def tracker(self) -> str:
        return f"{self.host}:{self.port}"

    def worker_args(self) -> list[str]:
        """The worker's command-line arguments that make it measure on a board."""
        return ["--tracker", self.tracker, "--key", self.key,
                "--request-timeout", str(self.request_timeout_s),
                "--session-timeout", str(self.session_timeout_s),
                *(["--emulated"] if self.emulated else [])]


def tracker_given(tracker: str | None) -> str | None:
    """``--tracker``, else ``$DLAS_TRACKER``; None when neither is set."""
    import os

    return tracker or os.environ.get(TRACKER_ENV) or None


def rpc_options(tracker: str | None, key: str | None, device, allow_remote: bool = False,
                warn=None, **kwargs) -> RpcOptions | None:
    """The RPC options of a command, or None to measure on this machine.

    ``tracker`` falls back on ``$DLAS_TRACKER``; ``key`` on the device's ``rpc_key``. A
    device that is not this machine (or its profile) needs a tracker. A tracker off
    loopback needs ``allow_remote`` and is warned about through ``warn``."""
    tracker = tracker_given(tracker)
    if tracker is None:
        if not device.measured_here:
            raise ConfigError(
                f"device {device.name!r} is not this machine: its kernels are measured on "
                f"the device through a TVM RPC tracker ({param('tracker')} HOST:PORT or "
                f"${TRACKER_ENV}, with boards registered under the key "
                f"{device.rpc_key or '(give ' + param('rpc_key') + ')'})")
        return None
    if device.kind != "cpu":
        raise ConfigError(f"device {device.name!r} is a {device.kind}: measuring through RPC "
                          "covers CPU devices (a GPU's kernels travel as a bundle: "
                          "`dlas-predict bundle`)")
    host, port = parse_tracker(tracker)
    if not is_loopback(host):
        if not allow_remote:
            raise ConfigError(f"the tracker {host}:{port} is not on loopback; TVM RPC has no "
                              f"authentication, so using it needs {param('allow_remote')}")
        if warn is not None:
            warn(REMOTE_WARNING.format(addr=f"{host}:{port}"))
    key = key or device.rpc_key
    if not key:
        raise ConfigError(f"device {device.name!r} has no rpc_key in the registry: give "
                          f"{param('key')} KEY")
    return RpcOptions(host=host, port=port, key=key, **kwargs)
