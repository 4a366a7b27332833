"""Runners: turn measurement tasks into records, each measurement isolated.

:class:`LocalRunner` keeps one worker subprocess (``python -m
dlas_predict.measure.execution.worker``) and sends it one task at a time. A task that raises is
answered as a failure by the worker; a task that crashes the worker (segfault, abort) or outlives
its timeout becomes a recorded failure here, the worker is replaced, and the run goes on with the
next task.
"""

from __future__ import annotations

import abc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from dlas_predict.space.config import ConvSpec, Tuning, Variant
from dlas_predict.space.devices import Device
from dlas_predict.errors import ConfigError, param
from dlas_predict.measure.records import MeasureResult, measurement_key
from dlas_predict.measure import kernels_version
from dlas_predict.measure.kernels.knobs import resolve_knobs, tuned_knobs
from dlas_predict.measure.execution.remote import BoardError, BoardInfo, board_mismatch
from dlas_predict.measure.execution.rpcopts import RpcOptions
from dlas_predict.measure.execution.tasks import (KernelTask, Protocol, Task, TuningRequest,
                                                  WorkerReply, to_wire)

#: The default trial budget of a tuned kernel, and the study's (the largest accepted).
DEFAULT_TRIALS = 64
MAX_TRIALS = 20000


@dataclass(frozen=True)
class TuningOptions:
    """How tuned variants are searched: the trial budget, early stopping after ``patience``
    trials without a 1 % gain (0: never), and the tuning database directory (None: the
    device's own under ``DLAS_HOME/tuning``)."""

    budget: int = DEFAULT_TRIALS
    patience: int = 32
    db: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.budget <= MAX_TRIALS:
            raise ConfigError(f"{param('budget')} must be between 1 and {MAX_TRIALS}, got "
                              f"{self.budget}")
        if self.patience < 0:
            raise ConfigError(f"{param('patience')} must be 0 (off) or positive, got "
                              f"{self.patience}")

    def db_path(self, device: Device) -> Path:
        if self.db:
            return Path(self.db)
        from dlas_predict.paths import tuning_db_dir

        return tuning_db_dir(device.name, device.fingerprint)

    def timeout_s(self) -> float:
        """A generous wall-clock limit for one tuned kernel (MetaSchedule builds each trial
        with LLVM: about 2-3 s per trial on two cores, plus its start-up)."""
        return 300.0 + 12.0 * self.budget


@dataclass(frozen=True)
class MeasureTask:
    """One kernel to measure: a workload, a variant, its resolved knobs, and its key."""

    spec: ConvSpec
    variant: Variant
    knobs: dict[str, int]
    key: str
    seed: int = 0
    fault: str | None = None  # test hook, honoured only with DLAS_FAULT_INJECTION=1
    tuning: TuningOptions | None = None  # tuned variants only

    @classmethod
    def make(cls, spec: ConvSpec, variant: Variant, device: Device, seed: int = 0,
             fault: str | None = None,
             tuning: TuningOptions | None = None) -> "MeasureTask":
        """A tuned variant's knobs are its budget and layout (see
        :func:`dlas_predict.measure.kernels.knobs.tuned_knobs`): the key says what was asked, the
        record the knobs the search chose."""
        simd = device.simd_bits if device.kind == "cpu" else None
        if variant.tuning is Tuning.TUNED:
            tuning = tuning or TuningOptions()
            knobs = tuned_knobs(spec, variant, tuning.budget, simd)
        else:
            tuning = None
            knobs = resolve_knobs(spec, variant, simd, device.vnni)
        key = measurement_key(device.name, device.fingerprint, spec, variant, knobs,
                              kernels_version(variant.algorithm.value, variant.sparse,
                                              variant.tuning is Tuning.TUNED, knobs))
        return cls(spec=spec, variant=variant, knobs=knobs, key=key, seed=seed, fault=fault,
                   tuning=tuning)


class Runner(abc.ABC):
    """Batch interface: tasks in, one record per task out (in order, as they complete)."""

    @abc.abstractmethod
    def run(self, tasks: Iterable[MeasureTask]) -> Iterator[MeasureResult]:
        ...

    def close(self) -> None:
        """Release workers."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerDied(Exception):
    """The worker process exited or was killed."""


@dataclass
class LocalRunner(Runner):
    """Measures on this machine in an isolated worker process.

    Parameters
    ----------
    device : the ``local`` device (its target and fingerprint go into every record).
    protocol : timing protocol (runs, minimum repeat time, budget).
    timeout_s : wall-clock limit of one task (build + verify + timing).
    startup_timeout_s : limit for a worker to start (importing TVM).
    """

    device: Device
    protocol: Protocol = field(default_factory=Protocol)
    timeout_s: float = 300.0
    startup_timeout_s: float = 180.0
    #: measure on a board of an RPC tracker instead of this machine
    rpc: RpcOptions | None = None
    #: the board the worker holds (RPC only), as it reported itself
    board: BoardInfo | None = field(default=None, init=False)
    #: the last call failed because its board dropped off, crashed or hung (RPC only):
    #: not the task's fault, so a farm gives it to another board
    last_lost: bool = field(default=False, init=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _stderr: Any = field(default=None, init=False, repr=False)
    _buf: bytes = field(default=b"", init=False, repr=False)
    _ready: dict = field(default_factory=dict, init=False, repr=False)

    # ---- worker lifecycle ---------------------------------------------------------------
    def _start(self) -> None:
        env = dict(os.environ)
        env["TVM_NUM_THREADS"] = str(self.device.cores)
        self._stderr = tempfile.TemporaryFile()
        self._buf = b""
        cmd = [sys.executable, "-m", "dlas_predict.measure.execution.worker"]
        startup = self.startup_timeout_s
        if self.rpc is not None:
            cmd += self.rpc.worker_args()
            startup += self.rpc.request_timeout_s
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, env=env, start_new_session=True)
        self._ready = self._read(startup)
        if not self._ready.get("ready"):
            self._kill()
            if self._ready.get("code"):
                raise BoardError(str(self._ready.get("error")), self._ready["code"])
            raise WorkerDied(f"worker did not start: {self._ready}")
        if self.rpc is not None:
            self.board = BoardInfo.from_dict(self._ready["board"])
            why = board_mismatch(self.device.target, self.board, self.device.cores)
            if why:
                self._kill()
                raise BoardError(f"{why}: not a {self.device.name} (check {param('rpc_key')})",
                                 "mismatch")

    def _stderr_tail(self, n: int = 600) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return text[-n:]

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _read(self, timeout: float) -> dict:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self._proc.wait()
                raise WorkerDied(_describe_exit(code))
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    # ---- measuring ----------------------------------------------------------------------
    def _task(self, task: MeasureTask) -> KernelTask:
        v = task.variant
        tuning = None
        if task.tuning is not None:
            hand = None
            if not v.sparse and self.device.kind == "cpu":  # the untuned twin's knobs
                hand = resolve_knobs(task.spec, v, self.device.simd_bits, self.device.vnni)
            tuning = TuningRequest(db=str(task.tuning.db_path(self.device)),
                                   budget=task.tuning.budget, cores=self.device.cores,
                                   patience=task.tuning.patience, hand_knobs=hand)
        return KernelTask(conv=task.spec, algorithm=v.algorithm, sparse=v.sparse,
                          dtype=v.dtype, knobs=dict(task.knobs), ratio=v.ratio,
                          pattern=v.pattern, compression=v.compression,
                          target=self.device.target, protocol=self.protocol, seed=task.seed,
                          fingerprint=self.device.fingerprint, tuning=tuning,
                          fault=task.fault, simd_bits=self.device.simd_bits)

    def run(self, tasks: Iterable[MeasureTask]) -> Iterator[MeasureResult]:
        for task in tasks:
            yield self.run_one(task)

    def run_one(self, task: MeasureTask) -> MeasureResult:
        """Measure one task; never raises for a kernel's failure (it is in ``error``)."""
        timeout = None
        if task.tuning is not None:
            timeout = max(self.timeout_s, task.tuning.timeout_s())
        return self._record(task, self.call(self._task(task), timeout))

    def call(self, task: Task, timeout_s: float | None = None) -> WorkerReply:
        """Send one task to the worker and return its reply. A crash or a timeout is a reply
        with ``ok`` false and an ``error``; the worker is then replaced on the next call."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        self.last_lost = False
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._start_or_fail()
            except WorkerDied as exc:
                self.last_lost = self.rpc is not None
                return WorkerReply.failure(f"worker crashed: {exc}")
        where = f" on the board at {self.board.address}" if self.board else ""
        try:
            assert self._proc is not None and self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(to_wire(task)) + "\n").encode())
            self._proc.stdin.flush()
            reply = WorkerReply.from_dict(self._read(timeout))
        except TimeoutError:
            self._kill()
            reply = WorkerReply.failure(f"timeout: no result within {timeout:g} s{where} "
                                        "(kernel hung or too slow); worker killed")
        except (WorkerDied, BrokenPipeError, OSError, ValueError) as exc:
            detail = self._stderr_tail()
            self._kill()
            reply = WorkerReply.failure(f"worker crashed{where}: {exc}"
                                        + (f"; stderr: {detail}" if detail else ""))
        if reply.board_lost:
            self._kill()  # the worker gave up its board and exits: start afresh next call
        # through RPC a crash, a hang or a lost session is the board's, not the task's
        self.last_lost = self.rpc is not None and (bool(reply.board_lost) or (
            not reply.ok and self._proc is None))
        return reply

    def _start_or_fail(self) -> None:
        """Start the worker; a worker that cannot start is a :class:`WorkerDied` here
        (answered as the task's failure by :meth:`call`'s caller) unless it is a board
        problem, which is raised as :class:`BoardError`."""
        try:
            self._start()
        except (TimeoutError, OSError, ValueError) as exc:
            detail = self._stderr_tail()
            self._kill()
            raise WorkerDied(f"the worker did not start ({type(exc).__name__}: {exc})"
                             + (f"; stderr: {detail}" if detail else "")) from None

    def _record(self, task: MeasureTask, reply: WorkerReply) -> MeasureResult:
        return MeasureResult(
            key=task.key, device=self.device.name, fingerprint=self.device.fingerprint,
            conv=task.spec, variant=task.variant, knobs=dict(reply.knobs or task.knobs),
            sparsity=float(reply.sparsity or 0.0), nnz=reply.nnz,
            run_secs=list(reply.run_secs) if reply.ok else [],
            number=reply.number, compile_s=reply.compile_s,
            verified=reply.verified, max_error=reply.max_error,
            error=None if reply.ok else str(reply.error or "unknown failure"),
            threads=self._ready.get("threads") or self.device.cores,
            tvm_version=self._ready.get("tvm_version", ""), kernels_version=kernels_version(
                task.variant.algorithm.value, task.variant.sparse,
                task.variant.tuning is Tuning.TUNED, task.knobs),
            timestamp=time.time(), tuning_seconds=reply.tuning_seconds,
            trials=reply.trials, tuner=reply.tuner,
            contention=reply.contention, slowdown=reply.slowdown,
            board=self.board_json())

    def board_json(self) -> str | None:
        """The board a record was measured on (RPC only): what it reported, its tracker
        key and address, as JSON."""
        return None if self.board is None else json.dumps(self.board.to_dict(),
                                                          sort_keys=True)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"worker killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with status {code}"
