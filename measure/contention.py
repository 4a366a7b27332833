"""Whether another process holds one of the cores our parallel kernels run on.

On a shared machine with few cores, another tenant's busy thread makes a parallel kernel
wait for its slowest thread: for as long as the neighbour runs, every timed run is slower
(on 2 cores, about 2×). The corpus showed it as kernels whose runs fall in two groups
exactly 2× apart, and as kernels whose every run was 2× slower than the same layer inside
a whole network timed minutes later. The fastest run hides the first case, not the second.

The probe needs no quiet reference: it times the same chain of dependent multiply-adds once
on one thread and once on every thread of TVM's pool (each thread a chain of the same
length). Alone, the parallel run takes as long as the serial one (ratio 1.0). With a core
taken it waits for the thread that shares a core (about 2.0 on this 2-core machine).

Timing goes through :func:`timed`: wait (up to ``Protocol.quiet_wait_s``) for the ratio
to fall under ``Protocol.contention_limit``, time, probe again, and time once more if a
neighbour came during the timing. Every run is kept; the record carries the worst ratio
seen around its timing (``contention``), so a contended record is known as such.

This module imports TVM; it runs inside the isolated worker.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

#: Dependent multiply-adds per thread: ~0.2 ms on a 3 GHz core, short enough to probe
#: before and after every measurement.
CHAIN = 200_000
#: Untimed parallel calls before each probe: the first calls after an idle spell run slow
#: (pool threads asleep, the other vCPU descheduled); seen as a ratio of 2 without a
#: neighbour on the first three probes of a fresh process.
WAKE_CALLS = 20
#: Waits in a row that may end contended before the probe stops waiting.
GIVE_UP = 3

_SRC = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({P}, 16), "float32")):
    for t in T.parallel({P}):
        for i in range({N}):
            a[t, 0] = a[t, 0] * T.float32(0.99999) + T.float32(1e-5)
'''


@dataclass(frozen=True)
class Timed:
    """The runs of one measurement and what the probe saw around them."""

    runs: list[float]
    contention: float | None   # worst probe ratio around the kept timing (None: not probed)
    waited_s: float            # time spent waiting for a quiet machine
    attempts: int              # timings run (2: a neighbour came during the first)


class ContentionProbe:
    """Compiled once per worker: the serial and the parallel chain."""

    def __init__(self, target, threads: int, repeats: int = 5) -> None:
        import numpy as np
        import tvm
        from tvm.script import from_source

        self.timeouts = 0  # waits in a row that ended still contended
        dev = tvm.cpu(0)
        self._timers = []
        for p in (1, threads):
            lib = tvm.compile(from_source(_SRC.format(P=p, N=CHAIN)), target=target)
            buf = tvm.runtime.tensor(np.ones((p, 16), "float32"), dev)
            timer = lib.mod.time_evaluator("main", dev, number=1, repeat=repeats)
            self._timers.append((timer, lib.mod["main"], buf))

    def ratio(self) -> float:
        """Parallel over serial time of the same chain: 1.0 alone, up to ``threads`` when
        neighbours hold all the other cores."""
        (serial, _, a), (parallel, wake, b) = self._timers
        for _ in range(WAKE_CALLS):  # an idle pool (or an idle vCPU) starts slow: not a
            wake(b)                  # neighbour, so not timed
        s = statistics.median(serial(a).results)
        p = statistics.median(parallel(b).results)
        return p / s if s > 0 else 1.0

    def wait_for_quiet(self, limit: float, max_wait_s: float,
                       poll_s: float = 0.25) -> tuple[float, float]:
        """Probe until the ratio is at most ``limit`` or ``max_wait_s`` has passed; returns
        (last ratio, seconds waited). After ``GIVE_UP`` waits in a row that ended contended
        the machine is taken as busy for good: no more waiting (still probed and recorded)
        until a probe finds it quiet again, so a collection on a loaded machine is not
        slowed by a wait per record."""
        t0 = time.perf_counter()
        r = self.ratio()
        if self.timeouts >= GIVE_UP:
            max_wait_s = 0.0
        while r > limit and time.perf_counter() - t0 < max_wait_s:
            time.sleep(poll_s)
            r = self.ratio()
        self.timeouts = self.timeouts + 1 if r > limit else 0
        return r, time.perf_counter() - t0


_PROBES: dict[tuple, ContentionProbe] = {}


def probe_for(target, threads: int) -> ContentionProbe | None:
    """The worker's probe (built on first use); None with one thread (nothing to contend)."""
    if threads < 2:
        return None
    key = (str(target), threads)
    if key not in _PROBES:
        _PROBES[key] = ContentionProbe(target, threads)
    return _PROBES[key]


def pool_threads() -> int:
    """Threads of TVM's CPU pool in this process (TVM_NUM_THREADS, else the cores)."""
    import os

    env = os.environ.get("TVM_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


def timed(run: Callable[[], list[float]], probe: ContentionProbe | None,
          protocol: Any) -> Timed:
    """Time ``run`` (one call returns the timed runs) on a quiet machine where possible:
    wait for quiet, time, probe; if the probe finds a neighbour, wait again and time once
    more. All runs are kept (the fastest is what the models learn)."""
    if probe is None:
        return Timed(list(run()), None, 0.0, 1)
    limit, wait = float(protocol.contention_limit), float(protocol.quiet_wait_s)
    runs: list[float] = []
    waited = 0.0
    for attempts in (1, 2):
        before, w = probe.wait_for_quiet(limit, wait)
        waited += w
        runs += list(run())
        after = probe.ratio()
        worst = max(before, after)
        if after <= limit:
            break
    return Timed(runs, round(worst, 3), round(waited, 3), attempts)
