"""A farm of boards under one tracker key, measured in parallel.

Each board gets its own runner (a worker process holding one RPC session), so each board
runs one measurement at a time and stays single-tenant. Tasks wait in one queue. A task
whose board dropped off, crashed or hung goes back to the queue for another board; after
``tries`` boards it is recorded as a failure with the last error. A task that fails on its
own (a kernel that raises, an output that does not verify) is recorded at once.

Records come back as boards finish them, to the caller's thread, which commits each one
(:mod:`dlas_predict.corpus.collect`): a collector killed at any moment resumes from the
store, measuring only what is missing.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

from dlas_predict.measure.records import board_emulated
from dlas_predict.measure.execution.remote import BoardError, boards_under
from dlas_predict.measure.execution.rpcopts import RpcOptions


@dataclass
class BoardProgress:
    """What one board did in a run."""

    address: str
    done: int = 0
    failed: int = 0
    requeued: int = 0
    busy_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"board": self.address, "done": self.done, "failed": self.failed,
                "requeued": self.requeued, "busy_s": round(self.busy_s, 2)}


@dataclass
class _Item:
    task: Any
    tries: int = 0
    errors: list[str] = field(default_factory=list)


_STOP = object()


class Farm:
    """Runs tasks on every board under ``rpc.key`` (or ``rpc.boards`` of them) at once.

    ``open_runner(rpc)`` makes one board's runner: an object with ``run_one(task)``
    returning a record (``error`` set on failure), ``last_lost`` (the last failure was the
    board's), ``board`` (a :class:`~dlas_predict.measure.execution.remote.BoardInfo` once started),
    ``protocol`` and ``close()``. ``log`` gets one progress line per finished task, naming
    its board.
    """

    def __init__(self, rpc: RpcOptions, open_runner: Callable[[RpcOptions], Any],
                 protocol: Any, log: Callable[[str], None] | None = None) -> None:
        self.rpc = rpc
        self.protocol = protocol
        self._open = open_runner
        self._log = log
        self.boards: dict[str, BoardProgress] = {}
        self._lock = threading.Lock()
        self._runners: list[Any] = []

    def slots(self) -> int:
        """Sessions to hold at once: ``rpc.boards``, else every board under the key."""
        if self.rpc.boards:
            return self.rpc.boards
        return max(1, boards_under(self.rpc.host, self.rpc.port, self.rpc.key))

    def run(self, tasks: Iterable[Any]) -> Iterator[Any]:
        """One record per task, as boards finish them (not in task order)."""
        items = [_Item(t) for t in tasks]
        if not items:
            return
        todo: queue.Queue = queue.Queue()
        for item in items:
            todo.put(item)
        results: queue.Queue = queue.Queue()
        stop = threading.Event()
        n = min(self.slots(), len(items))
        threads = [threading.Thread(target=self._board_loop, args=(todo, results, stop),
                                    daemon=True, name=f"board-{i}") for i in range(n)]
        for t in threads:
            t.start()
        remaining, alive, fatal = len(items), n, None
        try:
            while remaining and alive:
                kind, payload = results.get()
                if kind == "record":
                    remaining -= 1
                    yield payload
                elif kind == "exit":
                    alive -= 1
                    if payload is not None and fatal is None:
                        fatal = payload
                        if payload.code != "no_board":  # a wrong board or key stops the run
                            break
            if remaining and fatal is not None:
                raise fatal
        finally:
            stop.set()
            for _ in threads:
                todo.put(_STOP)
            if remaining:  # stopped early: end the workers still waiting for a board
                with self._lock:
                    runners = list(self._runners)
                for r in runners:
                    r.close()
            for t in threads:
                t.join(timeout=30)

    def _board_loop(self, todo: queue.Queue, results: queue.Queue,
                    stop: threading.Event) -> None:
        runner = self._open(self.rpc)
        with self._lock:
            self._runners.append(runner)
        error: BoardError | None = None
        try:
            while not stop.is_set():
                item = todo.get()
                if item is _STOP or stop.is_set():
                    break
                t0 = time.perf_counter()
                try:
                    record = runner.run_one(item.task)
                except BoardError as exc:
                    todo.put(item)  # never started on a board: not a try
                    error = exc
                    break
                board = runner.board.address if runner.board else "?"
                progress = self._progress(board)
                progress.busy_s += time.perf_counter() - t0
                item.tries += 1
                if runner.last_lost and item.tries < self.rpc.tries:
                    item.errors.append(f"{board}: {record.error}")
                    progress.requeued += 1
                    todo.put(item)
                    self._say(f"{board}: lost a task ({(record.error or '')[:120]}); back in "
                              f"the queue for another board (try {item.tries} of "
                              f"{self.rpc.tries})")
                    continue
                if runner.last_lost:
                    item.errors.append(f"{board}: {record.error}")
                    record = replace(record, error=(f"failed on {item.tries} boards: "
                                                    + " | ".join(item.errors))[:2000])
                progress.done += 1
                progress.failed += int(record.error is not None)
                self._say(f"{board}: {self._describe(record)} ({progress.done} done here)")
                results.put(("record", record))
        except Exception as exc:  # noqa: BLE001 - a thread's surprise ends the run cleanly
            error = BoardError(f"a board runner failed: {type(exc).__name__}: {exc}", "lost")
        finally:
            try:
                runner.close()
            finally:
                results.put(("exit", error))

    def _progress(self, board: str) -> BoardProgress:
        with self._lock:
            return self.boards.setdefault(board, BoardProgress(board))

    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)

    @staticmethod
    def _describe(record: Any) -> str:
        label = getattr(record, "network", None) or getattr(record, "conv", "")
        label = label.to_spec() if hasattr(label, "to_spec") else str(label)
        if record.error is not None:
            return f"{label}: FAILED {record.error[:120]}"
        emulated = "emulated " if board_emulated(record.board) else ""
        return f"{label}: {emulated}{record.best_s * 1e3:.3f} ms"

    def progress(self) -> list[dict[str, Any]]:
        """Per board: tasks done, failed and given back, and seconds busy."""
        return [p.to_dict() for p in self.boards.values()]

    def close(self) -> None:
        pass

    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kernel_runner(device, protocol, timeout_s: float, rpc: RpcOptions | None = None,
                  log: Callable[[str], None] | None = None):
    """The runner of kernel tasks for ``device``: this machine's, or a farm of the boards
    under ``rpc.key``."""
    from dlas_predict.measure.execution.runner import LocalRunner

    if rpc is None:
        return LocalRunner(device, protocol=protocol, timeout_s=timeout_s)
    return Farm(rpc, lambda r: LocalRunner(device, protocol=protocol, timeout_s=timeout_s,
                                           rpc=r), protocol, log)


def network_runner(device, protocol, timeout_s: float, rpc: RpcOptions | None = None,
                   log: Callable[[str], None] | None = None):
    """The runner of whole-network plans for ``device``, here or on a farm."""
    from dlas_predict.measure.networks.runner import NetworkRunner

    if rpc is None:
        return NetworkRunner(device, timeout_s=timeout_s, protocol=protocol)
    return Farm(rpc, lambda r: NetworkRunner(device, timeout_s=timeout_s, protocol=protocol,
                                             rpc=r), protocol, log)
