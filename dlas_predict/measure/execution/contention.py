"""Whether the machine runs our parallel kernels at their usual speed right now.

On a shared machine with few cores two things slow a parallel kernel for seconds at a time,
and the fastest of its timed runs hides neither:

- **Another process holds one of the cores.** A parallel kernel waits for its slowest
  thread: about 2× on 2 cores. The corpus showed it as kernels whose runs fall in two groups
  exactly 2× apart, and as kernels whose every run was 2× slower than the same layer inside
  a whole network timed minutes later.
- **The host slows our vCPUs without any process of ours in the way.** For spells of
  seconds to tens of seconds (about one process start in five here) every parallel kernel
  ran 1.1–2× slower: spatial pack 64×32×32 0.40 → 0.58 ms, a 1×1 conv 57 → 83 µs, an
  im2col GEMM 0.49 → 0.99 ms, identically in every slow spell. A single-threaded probe (a
  dependent chain, an L2, L3 or DRAM sweep) and the run queue (no steal time, no other task)
  saw nothing. Most likely the two vCPUs then share a physical core, or a neighbour's
  thread does (the same kernels and probes timed in one fresh process after another show
  it).

Two probes, each cheap enough to run before and after every measurement:

- **The chain** (no reference needed) times the same chain of dependent multiply-adds once
  on one thread and once on every thread of TVM's pool. Alone the parallel run takes as
  long as the serial one (ratio 1.0); with a core taken it waits for the thread that shares
  a core (about 2.0 here). It cannot see the second kind: a latency-bound chain leaves a
  shared core's units idle.
- **The canary** is a real parallel kernel (spatial pack, float32, 64×32×32, 3×3; 0.4 ms
  here), timed against the fastest this machine (device fingerprint, thread count) has ever
  run it, kept under ``DLAS_HOME/probe/``, or where its own quiet readings spread wider,
  their median (:meth:`Canary.usual`), allowing for that spread (:meth:`Canary.spread`).
  Its slowdown sees both kinds. A machine
  first met during a slow spell reads 1.0 until it has seen a quiet one.

Timing goes through :func:`timed`: wait (up to ``Protocol.quiet_wait_s``) until the chain
ratio is at most ``Protocol.contention_limit`` and the canary's slowdown at most
``Protocol.slowdown_limit``, time, probe again, and time once more if the machine slowed
during the timing. Every run is kept; the record carries the worst of each probe around its
timing (``contention``, ``slowdown``), so a record timed on a slow machine is known as such.

This module imports TVM; it runs inside the isolated worker.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

#: Dependent multiply-adds per thread: ~0.2 ms on a 3 GHz core, short enough to probe
#: before and after every measurement.
CHAIN = 200_000
#: Untimed parallel calls before each probe: the first calls after an idle spell run slow
#: (pool threads asleep, the other vCPU descheduled); seen as a ratio of 2 without a
#: neighbour on the first three probes of a fresh process.
WAKE_CALLS = 20
#: The probe stops waiting for quiet once this many of its last ``2 * GIVE_UP`` waits ended
#: contended (a host whose slow spells come and go would otherwise cost a full wait every
#: other record), and waits again once this many readings in a row were quiet.
GIVE_UP = 3

_SRC = '''
# from tvm.script import tirx as T
@T.prim_func
def main(a: T.Buffer(({P}, 16), "float32")):
    for t in T.parallel({P}):
        for i in range({N}):
            a[t, 0] = a[t, 0] * T.float32(0.99999) + T.float32(1e-5)
'''


#: The canary's own readings kept (its usual time is their median), the fewest
#: that define a usual time, how often they are saved, and the most the usual time may
#: exceed the fastest (a slowdown of the host that lasts must still read as one).
RECENT = 64
MIN_RECENT = 8
SAVE_EVERY = 8
USUAL_SPREAD_MAX = 1.15
#: How much slower than its usual time a quiet canary reads on a host whose quiet readings
#: jump from one to the next (:meth:`Canary.spread`), at most. On a 2-core Zen 3 whose
#: canary ran anywhere from 0.56 to 1.34 ms with nothing else running, a limit of 1.05 on
#: the usual time read 77 % of its readings, and every onnxruntime timing, as busy.
SPREAD_ALLOWANCE_MAX = 2.0

#: The canary's workload: a conv layer of the CIFAR networks, spatial pack, float32.
CANARY_CONV = "C=64,H=32,W=32,K=64,R=3,S=3,stride=1,pad=1"


@dataclass(frozen=True)
class Reading:
    """What the probes saw at one moment."""

    ratio: float               # the chain: parallel over serial time (1.0: no neighbour)
    slowdown: float | None     # the canary over its fastest time ever (None: no canary)

    def quiet(self, protocol: Any) -> bool:
        """Within the protocol's limits (``contention_limit``, ``slowdown_limit``)."""
        return (self.ratio <= float(protocol.contention_limit)
                and (self.slowdown is None
                     or self.slowdown <= float(protocol.slowdown_limit)))

    def worst(self, other: "Reading") -> "Reading":
        s = [v for v in (self.slowdown, other.slowdown) if v is not None]
        return Reading(max(self.ratio, other.ratio), max(s) if s else None)


@dataclass(frozen=True)
class Timed:
    """The runs of one measurement and what the probes saw around them."""

    runs: list[float]
    contention: float | None   # worst chain ratio around the kept timing (None: not probed)
    slowdown: float | None     # worst canary slowdown around it (None: no canary)
    waited_s: float            # time spent waiting for a quiet machine
    attempts: int              # timings run (2: the machine slowed during the first)


class Canary:
    """One real parallel kernel, timed against the fastest this machine has run it.

    ``reference`` is the file keeping that fastest time (None: this process only). It is
    shared by every worker of the machine; a faster time replaces it (atomically), a slower
    one never does. A reference that cannot be written is kept in memory.

    Its register tiles are those of the CPU's vector width (``simd_bits``; None: 512): the
    tiles of a wider CPU spill on a narrower one, and a kernel that spills varies by the run
    (on an AVX2 target, AVX-512's tiles timed 0.67-2.1 ms where AVX2's take 0.44 ms)."""

    def __init__(self, target_json: dict, reference: Path | None, repeats: int = 5,
                 simd_bits: int | None = None) -> None:
        import tvm

        from dlas_predict.measure.execution.remote import execution
        from dlas_predict.space.config import ConvSpec, DType, Variant
        from dlas_predict.measure.kernels.build import build_kernel, device_args
        from dlas_predict.measure.kernels.spec import KernelSpec
        from dlas_predict.measure.kernels.knobs import resolve_knobs
        from dlas_predict.measure.kernels.reference import make_inputs

        spec = ConvSpec.parse(CANARY_CONV)
        variant = Variant("spatial_pack", "dense")
        ks = KernelSpec(conv=spec, algorithm=variant.algorithm, sparse=False,
                        dtype=DType.FLOAT32, knobs=resolve_knobs(spec, variant, simd_bits))
        self.knobs = dict(ks.knobs)
        x, w = make_inputs(spec, DType.FLOAT32, seed=0)
        run = execution()
        dev = run.dev
        mod = run.load(build_kernel(ks, tvm.target.Target(target_json)), target_json)
        self._args = device_args(ks, x, w, dev)
        self._call = mod["main"]
        self._timer = mod.time_evaluator("main", dev, number=2, repeat=repeats)
        self.reference = reference
        self.best = _read_best(reference)
        self.recent = _read_recent(reference)
        self._readings = 0

    def seconds(self) -> float:
        """The canary's time now (the fastest of its runs; one untimed call first)."""
        self._call(*self._args)
        return min(self._timer(*self._args).results)

    def slowdown(self) -> float:
        """Time now over this machine's usual quiet time (1.0 at a new fastest): the
        fastest ever, or where its own readings spread wider, their median (at most
        :data:`USUAL_SPREAD_MAX` times the fastest, so a slow spell that lasts is still
        seen), times the spread of its quiet readings (:meth:`spread`). A host whose quiet
        canary varies by 10 %, or by 2×, is not kept waiting for a time it only reaches
        once in a while, nor are its timings all called busy."""
        t = self.seconds()
        if self.best is None or t < self.best:
            self.best = min(t, _read_best(self.reference) or math.inf)
        self.recent = (self.recent + [t])[-RECENT:]
        self._readings += 1
        if t <= self.best or self._readings % SAVE_EVERY == 0:
            _write_best(self.reference, self.best, self.recent)
        return t / (self.usual() * self.spread())

    def spread(self) -> float:
        """How far this machine's quiet readings spread above its usual time: e to twice
        the median jump in log time from one recent reading to the next (1.0 until
        :data:`MIN_RECENT` are known; at most :data:`SPREAD_ALLOWANCE_MAX`). A host that
        is slow in spells jumps only where a spell starts or ends, and a spell that lasts
        fills the readings with one slow time: either still reads slow against the usual
        time, while a host whose every reading differs from the last is allowed its own
        noise (the Zen 3's: ×1.59, 11 % of its readings over 1.05 of that)."""
        if len(self.recent) < MIN_RECENT:
            return 1.0
        jumps = sorted(abs(math.log(b / a)) for a, b in zip(self.recent, self.recent[1:]))
        return min(math.exp(2 * jumps[len(jumps) // 2]), SPREAD_ALLOWANCE_MAX)

    def usual(self) -> float:
        """The canary's usual quiet time (see :meth:`slowdown`)."""
        if len(self.recent) < MIN_RECENT:
            return self.best
        q = sorted(self.recent)[len(self.recent) // 2]
        return min(max(q, self.best), USUAL_SPREAD_MAX * self.best)


def _read_best(path: Path | None) -> float | None:
    if path is None or not path.is_file():
        return None
    try:
        best = float(json.loads(path.read_text())["best_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return best if best > 0 else None


def _read_recent(path: Path | None) -> list[float]:
    if path is None or not path.is_file():
        return []
    try:
        recent = [float(v) for v in json.loads(path.read_text()).get("recent", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return []
    return [v for v in recent if v > 0][-RECENT:]


def _write_best(path: Path | None, best: float, recent: list[float] | None = None) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"best_s": best, "conv": CANARY_CONV,
                                   "algorithm": "spatial_pack", "dtype": "float32",
                                   "recent": list(recent or [])}))
        os.replace(tmp, path)
    except OSError:
        pass  # the reference stays in memory for this worker


def canary_reference(fingerprint: str, threads: int, simd_bits: int | None = None) -> Path:
    """Where the canary's fastest time is kept for a machine, a thread count and the vector
    width its tiles are for (None: 512)."""
    from dlas_predict.paths import dlas_home

    safe = "".join(c for c in fingerprint if c.isalnum() or c in "-_") or "unknown"
    return dlas_home() / "probe" / f"canary-{safe}-{threads}t-{simd_bits or 512}b.json"


class ContentionProbe:
    """Compiled once per worker: the serial and the parallel chain, and the canary."""

    def __init__(self, target_json: dict, threads: int, repeats: int = 5,
                 canary: Canary | None = None) -> None:
        import numpy as np
        import tvm
        from tvm.script import from_source

        from dlas_predict.measure.execution.remote import execution

        self.reset_waiting()
        self.canary = canary
        run = execution()
        dev = run.dev
        target = tvm.target.Target(target_json)
        self._timers = []
        for p in (1, threads):
            lib = run.load(tvm.compile(from_source(_SRC.format(P=p, N=CHAIN)), target=target),
                           target_json)
            buf = tvm.runtime.tensor(np.ones((p, 16), "float32"), dev)
            timer = lib.time_evaluator("main", dev, number=1, repeat=repeats)
            self._timers.append((timer, lib["main"], buf))

    def ratio(self) -> float:
        """Parallel over serial time of the same chain: 1.0 alone, up to ``threads`` when
        neighbours hold all the other cores."""
        (serial, _, a), (parallel, wake, b) = self._timers
        for _ in range(WAKE_CALLS):  # an idle pool (or an idle vCPU) starts slow: not a
            wake(b)                  # neighbour, so not timed
        s = statistics.median(serial(a).results)
        p = statistics.median(parallel(b).results)
        return p / s if s > 0 else 1.0

    def reading(self) -> Reading:
        """The chain's ratio, then (the pool awake) the canary's slowdown."""
        ratio = self.ratio()
        return Reading(ratio, None if self.canary is None else self.canary.slowdown())

    def reset_waiting(self) -> None:
        """Wait for quiet before each timing (again)."""
        self.waits: deque[bool] = deque(maxlen=2 * GIVE_UP)  # True: ended contended
        self.given_up = False
        self.quiet_streak = 0

    def wait_for_quiet(self, protocol: Any, poll_s: float = 0.25) -> tuple[Reading, float]:
        """Probe until the reading is quiet (:meth:`Reading.quiet`) or
        ``protocol.quiet_wait_s`` has passed; returns (last reading, seconds waited). Once
        ``GIVE_UP`` of the last ``2 * GIVE_UP`` waits ended on a slow machine, it is taken
        as slow for good: no more waiting (still probed and recorded) until ``GIVE_UP``
        readings in a row find it quiet, so a collection on a loaded machine, or on a host
        whose slow spells come and go, is not slowed by a wait per record."""
        t0 = time.perf_counter()
        r = self.reading()
        max_wait_s = 0.0 if self.given_up else float(protocol.quiet_wait_s)
        while not r.quiet(protocol) and time.perf_counter() - t0 < max_wait_s:
            time.sleep(poll_s)
            r = self.reading()
        quiet = r.quiet(protocol)
        if self.given_up:
            self.quiet_streak = self.quiet_streak + 1 if quiet else 0
            if self.quiet_streak >= GIVE_UP:
                self.reset_waiting()
        else:
            self.waits.append(not quiet)
            if sum(self.waits) >= GIVE_UP:
                self.given_up, self.quiet_streak = True, 0
        return r, time.perf_counter() - t0


_PROBES: dict[tuple, ContentionProbe] = {}


def probe_for(target: dict, threads: int, fingerprint: str = "",
              simd_bits: int | None = None) -> ContentionProbe | None:
    """The worker's probe (built on first use), its canary's tiles for ``simd_bits`` and
    its reference kept for ``fingerprint``; None with one thread (nothing to contend)."""
    if threads < 2:
        return None
    key = (json.dumps(target, sort_keys=True), threads, fingerprint, simd_bits)
    if key not in _PROBES:
        from dlas_predict.measure.execution.remote import RELEASE_HOOKS

        if drop_probes not in RELEASE_HOOKS:
            RELEASE_HOOKS.append(drop_probes)  # a board given back takes its probes with it
        canary = Canary(target, canary_reference(fingerprint, threads, simd_bits),
                        simd_bits=simd_bits)
        _PROBES[key] = ContentionProbe(target, threads, canary=canary)
    return _PROBES[key]


def drop_probes() -> None:
    """Forget the worker's probes (and their modules and tensors, which may live on a
    board whose session is being given back)."""
    _PROBES.clear()


def timed(run: Callable[[], list[float]], probe: ContentionProbe | None,
          protocol: Any) -> Timed:
    """Time ``run`` (one call returns the timed runs) on a quiet machine where possible:
    wait for quiet, time, probe; if the machine slowed during the timing, wait again and
    time once more. All runs are kept (the fastest is what the models learn)."""
    if probe is None:
        return Timed(list(run()), None, None, 0.0, 1)
    runs: list[float] = []
    waited = 0.0
    for attempts in (1, 2):
        before, w = probe.wait_for_quiet(protocol)
        waited += w
        runs += list(run())
        after = probe.reading()
        worst = before.worst(after)
        if after.quiet(protocol):
            break
    slowdown = None if worst.slowdown is None else round(worst.slowdown, 3)
    return Timed(runs, round(worst.ratio, 3), slowdown, round(waited, 3), attempts)


def timed_fields(run, target_json: dict, proto: Any, fingerprint: str = "",
                 simd_bits: int | None = None) -> dict[str, Any]:
    """Time ``run`` on a quiet machine where possible (:func:`timed`; the canary's tiles
    for ``simd_bits``); the reply's timing fields."""
    from dlas_predict.measure.execution.remote import execution

    ex = execution()
    if ex.board is not None:  # the probes run on the board, their canary kept per board
        fingerprint = ex.board.fingerprint
    t = timed(run, probe_for(target_json, ex.threads(), fingerprint, simd_bits), proto)
    return {"run_secs": t.runs, "contention": t.contention, "slowdown": t.slowdown,
            "quiet_wait_s": t.waited_s, "timing_attempts": t.attempts}
