"""The grid collector: every unique conv workload × every requested variant, resumable.

Planning is pure Python: each task's measurement key is computed before anything compiles,
and tasks whose key is already in the store are skipped. Each record is committed as soon as
it is measured (see :mod:`dlas_predict.store`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from dlas_predict.config import ConvSpec, Variant
from dlas_predict.devices import Device
from dlas_predict.records import MeasureResult
from dlas_predict.store import CorpusStore
from measure.runner import MeasureTask, Runner

log = logging.getLogger(__name__)


@dataclass
class CollectSummary:
    """What a collection run did."""

    planned: int = 0
    skipped: int = 0
    measured: int = 0
    failed: int = 0
    #: timed on a slow machine, even after waiting (chain probe or canary; see
    #: :mod:`measure.contention`)
    contended: int = 0
    #: ``retime_slow``: records timed again that replaced a slower-machine timing, and those
    #: whose new timing was no quieter (the stored one is kept; it stays counted contended)
    retimed: int = 0
    kept: int = 0
    seconds: float = 0.0
    results: list[MeasureResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"planned": self.planned, "skipped": self.skipped, "measured": self.measured,
                "failed": self.failed, "contended": self.contended,
                "retimed": self.retimed, "kept": self.kept,
                "seconds": round(self.seconds, 2)}


def plan_tasks(specs: Iterable[ConvSpec], variants: Iterable[Variant],
               device: Device) -> list[MeasureTask]:
    """One task per (workload, variant), in workload-major order, without repeats."""
    tasks: dict[str, MeasureTask] = {}
    variants = list(variants)
    for spec in specs:
        for variant in variants:
            task = MeasureTask.make(spec, variant, device)
            tasks.setdefault(task.key, task)
    return list(tasks.values())


def collect(tasks: list[MeasureTask], store: CorpusStore | None, runner: Runner,
            retry_failures: bool = False,
            on_result: Callable[[MeasureResult], None] | None = None,
            progress: bool = True, desc: str = "measuring",
            retime_slow: bool = False, retime_unprobed: bool = False) -> CollectSummary:
    """Measure the tasks not yet in ``store``; commit each record as it arrives.

    With ``retime_slow`` the tasks whose stored record was timed on a slow machine (see
    :meth:`CorpusStore.slow_keys`) are timed again; the new record replaces the stored one
    when it was timed on a quieter machine (lower slowness), else the stored one is kept.
    ``retime_unprobed`` does the same for records timed before the probes were recorded, too
    (replaced only by a timing on a quiet machine).
    Without a store every task is measured and nothing is recorded (``measure``).
    """
    t0 = time.perf_counter()
    done = store.keys(include_failures=not retry_failures) if store is not None else set()
    slow = (store.slow_keys(runner.protocol, unprobed=retime_unprobed)
            if store is not None and (retime_slow or retime_unprobed) else {})
    todo = [t for t in tasks if t.key not in done or t.key in slow]
    summary = CollectSummary(planned=len(tasks), skipped=len(tasks) - len(todo))
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc=desc, unit="kernel", dynamic_ncols=True,
                   file=sys.stderr)
    try:
        for result in runner.run(todo):
            summary.measured += 1
            if result.key in slow:
                if result.quieter_than(slow[result.key], runner.protocol):
                    store.add(result, replace=True)
                    summary.retimed += 1
                    summary.contended += int(result.contended(runner.protocol))
                else:
                    summary.kept += 1
                    summary.contended += 1
            else:
                if store is not None:
                    store.add(result, replace_failure=True)
                summary.failed += int(not result.ok)
                summary.contended += int(result.contended(runner.protocol))
            summary.results.append(result)
            if on_result is not None:
                on_result(result)
            if bar is not None:
                bar.set_postfix_str(f"{result.variant.algorithm.value}/"
                                    f"{result.variant.compression.value} "
                                    f"{'FAIL' if not result.ok else '%.3f ms' % (result.median_s * 1e3)}")
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - t0
    return summary
