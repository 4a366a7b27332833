"""Measurement records: one per (device, workload, configuration), failures included."""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from dlas_predict.space.config import ConvSpec, Variant, stable_hash
from dlas_predict.space.choices import Tuner


def measurement_key(device: str, fingerprint: str, spec: ConvSpec, variant: Variant,
                    knobs: dict[str, int], kernels_version: str) -> str:
    """The unique key of a measurement: a re-run with the same key is skipped."""
    return stable_hash({
        "device": device, "fingerprint": fingerprint, "conv": spec.to_dict(),
        "variant": {**variant.to_dict(), "knobs": dict(sorted(knobs.items()))},
        "kernels": kernels_version,
    })


def board_emulated(board: str | None) -> bool:
    """Whether a record's ``board`` (JSON, RPC only) was declared an emulator: its timings
    are not the device's."""
    return bool(board) and bool(json.loads(board).get("emulated"))


def summarise(run_secs: list[float]) -> tuple[float | None, float | None]:
    """(median seconds, spread) where spread is the inter-quartile range over the median."""
    if not run_secs:
        return None, None
    med = statistics.median(run_secs)
    if len(run_secs) < 4 or med <= 0:
        return med, 0.0
    q = statistics.quantiles(run_secs, n=4)
    return med, (q[2] - q[0]) / med


#: A point is flagged noisy when its inter-quartile range exceeds this share of the median.
NOISY_SPREAD = 0.10


def best_of(run_secs) -> float | None:
    """The fastest timed run (seconds per call; each run ≥ ``min_repeat_ms`` of back-to-back
    calls): the latency the cost models learn and predict. On a shared machine the median
    moves with other tenants' load (``benchmarks/bench_repeat.py`` collects a network twice
    and compares); the fastest run is what the hardware does and repeats better."""
    return min(run_secs) if len(run_secs) else None


class TimedRuns:
    """Median, spread and best derived from ``run_secs`` (every timed run, seconds per call):
    shared by kernel and whole-network records."""

    run_secs: list[float]
    error: str | None
    contention: float | None  # execution.contention's chain ratio around the timing
    slowdown: float | None    # execution.contention's canary slowdown around the timing

    @property
    def best_s(self) -> float | None:
        return best_of(self.run_secs)

    @property
    def median_s(self) -> float | None:
        return summarise(self.run_secs)[0]

    @property
    def spread(self) -> float | None:
        return summarise(self.run_secs)[1]

    def contended(self, protocol: Any) -> bool:
        """Timed on a slow machine: another process held a core (the chain ratio over
        ``protocol.contention_limit``) or the canary ran slow (over
        ``protocol.slowdown_limit``). See :mod:`dlas_predict.measure.execution.contention`."""
        return slowness(self.contention, self.slowdown, protocol) > 1.0

    def slowness(self, protocol: Any) -> float:
        """How far over its limits the machine was when this was timed (see
        :func:`slowness`)."""
        return slowness(self.contention, self.slowdown, protocol)

    def quieter_than(self, stored_slowness: float, protocol: Any) -> bool:
        """A successful timing on a quieter machine than a stored record's
        ``stored_slowness``: what replaces it under ``collect --retime-slow``."""
        return (self.error is None and bool(self.run_secs)
                and self.slowness(protocol) < stored_slowness)


def slowness(contention: float | None, slowdown: float | None, protocol: Any) -> float:
    """The larger of the chain ratio over ``protocol.contention_limit`` and the canary
    slowdown over ``protocol.slowdown_limit`` (0 when neither was probed): over 1 means timed
    on a slow machine; of two timings of one thing, the lower was the quieter."""
    return max(0.0 if contention is None else contention / float(protocol.contention_limit),
               0.0 if slowdown is None else slowdown / float(protocol.slowdown_limit))


def noisy_note(contention: float | None, slowdown: float | None, protocol: Any) -> str | None:
    """Why a timing is of a busy machine (its probes over ``protocol``'s limits, see
    :func:`slowness`), as a record's note says it, or None."""
    if slowness(contention, slowdown, protocol) <= 1.0:
        return None
    return (f"noisy: the machine was busy while it was timed (canary ×{slowdown or 0:.2f}, "
            f"threads ×{contention or 0:.2f})")


#: The tuners of a tuned record (``tuner``): TVM's MetaSchedule, or a measured search over a
#: hand schedule's knobs.
METASCHEDULE = Tuner.METASCHEDULE.value
KNOB_SEARCH = Tuner.KNOB_SEARCH.value


@functools.lru_cache(maxsize=16384)
def _spec_of_json(text: str) -> ConvSpec:
    """A corpus row's workload from its ``conv_json`` (thousands of rows share a few)."""
    return ConvSpec.from_dict(json.loads(text))


@dataclass(frozen=True)
class MeasureResult(TimedRuns):
    """One measurement of one kernel variant on one workload and device.

    ``run_secs`` keeps every timed run (seconds per call); the median and spread are derived.
    ``error`` is set (and ``run_secs`` empty) when the kernel failed to build, verify or run.
    ``knobs`` are the schedule knobs actually used (defaults resolved); ``variant`` carries
    none, so records of one configuration compare equal whatever knobs were requested.
    """

    def __post_init__(self) -> None:
        if self.variant.knobs:
            object.__setattr__(self, "variant", replace(self.variant, knobs=()))

    key: str
    device: str
    fingerprint: str
    conv: ConvSpec
    variant: Variant
    knobs: dict[str, int]
    sparsity: float = 0.0
    nnz: int | None = None
    run_secs: list[float] = field(default_factory=list)
    number: int | None = None
    compile_s: float | None = None
    verified: bool | None = None
    max_error: float | None = None
    error: str | None = None
    threads: int | None = None
    tvm_version: str = ""
    kernels_version: str = ""
    timestamp: float = 0.0
    #: Tuned records: the search's wall-clock cost, the trials it ran, and the tuner
    #: (:data:`METASCHEDULE` for dense kernels, :data:`KNOB_SEARCH` for CSR kernels and
    #: every GPU kernel).
    tuning_seconds: float | None = None
    trials: int | None = None
    tuner: str | None = None
    #: The contention probe's worst parallel/serial ratio around the timing (1.0: no other
    #: process held a core; about 2.0: one did, on 2 cores); None: not probed (one thread,
    #: or measured before the probe existed). See :mod:`dlas_predict.measure.execution.contention`.
    contention: float | None = None
    #: The canary kernel's worst time around the timing over the fastest this machine has
    #: run it (1.0: usual speed); None: not probed. See
    #: :mod:`dlas_predict.measure.execution.contention`.
    slowdown: float | None = None
    #: Measured through RPC: the board as it reported itself (LLVM CPU, triple, cores,
    #: fingerprint), its tracker key and address, as JSON; None: this machine.
    board: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.run_secs)

    @property
    def noisy(self) -> bool:
        spread = self.spread
        return spread is not None and spread > NOISY_SPREAD

    @property
    def gflops(self) -> float | None:
        """Dense-equivalent GFLOP/s: 2 x dense MACs / median (so variants compare directly)."""
        med = self.median_s
        return self.conv.flops / med / 1e9 if med else None

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON-ready form with the canonical field names."""
        med = self.median_s
        out = {
            "key": self.key, "device": self.device, "fingerprint": self.fingerprint,
            "conv": self.conv.to_spec(), **self.variant.to_dict(),
            "pattern": self.variant.pattern.value, "knobs": self.knobs,
            "sparsity": self.sparsity, "nnz": self.nnz,
            "median_ms": med * 1e3 if med is not None else None,
            "spread": self.spread, "noisy": self.noisy, "n_runs": len(self.run_secs),
            "gflops": self.gflops, "macs": self.conv.macs, "compile_s": self.compile_s,
            "verified": self.verified, "max_error": self.max_error, "error": self.error,
            "threads": self.threads, "tvm_version": self.tvm_version,
            "kernels_version": self.kernels_version, "timestamp": self.timestamp,
            "tuning_seconds": self.tuning_seconds, "trials": self.trials, "tuner": self.tuner,
            "contention": self.contention, "slowdown": self.slowdown,
            "board": self.board, "run_secs": list(self.run_secs),
        }
        return out

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "MeasureResult":
        """Rebuild from a corpus row (see :mod:`dlas_predict.corpus.store`)."""
        variant = Variant.from_dict({
            "algorithm": row["algorithm"], "compression": row["compression"],
            "ratio": row["ratio"], "tuning": row["tuning"]})
        return cls(
            key=row["key"], device=row["device"], fingerprint=row["fingerprint"],
            conv=_spec_of_json(row["conv_json"]), variant=variant,
            knobs=json.loads(row["knobs"] or "{}"), sparsity=row["sparsity"] or 0.0,
            nnz=row["nnz"], run_secs=json.loads(row["run_secs"] or "[]"),
            number=row["number"], compile_s=row["compile_s"],
            verified=None if row["verified"] is None else bool(row["verified"]),
            max_error=row["max_error"], error=row["error"], threads=row["threads"],
            tvm_version=row["tvm_version"] or "", kernels_version=row["kernels_version"] or "",
            timestamp=row["timestamp"] or 0.0, tuning_seconds=row["tuning_seconds"],
            trials=None if row.get("trials") is None else int(row["trials"]),
            tuner=row.get("tuner"),
            contention=None if row.get("contention") is None else float(row["contention"]),
            slowdown=None if row.get("slowdown") is None else float(row["slowdown"]),
            board=row.get("board"))
