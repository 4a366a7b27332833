"""Validation: the top candidates built and timed as whole networks on the device, onnxruntime
fp32 timed in the same run as the reference, a build shared by two candidates timed once."""

from __future__ import annotations

import time

import numpy as np

from dlas_predict.space.config import Compression, Tuning
from dlas_predict.errors import DlasError, param
from dlas_predict.measure.networks.plans import ONNXRUNTIME, PER_LAYER
from dlas_predict.recommend.candidates import Candidate, Recommendation


def validate_top(rec: Recommendation, model: str, dev, k: int, log=None,
              tuned_opts=None, network_runner=None) -> list[Candidate]:
    """Build and time the top ``k`` kept candidates as whole networks, with the runner that
    ``network_runner()`` opens (default: the local CPU's); onnxruntime fp32, the reference,
    is timed in the same run wherever onnxruntime can run as the device."""
    if network_runner is None and not dev.measured_here:
        raise DlasError(f"{param('validate')} builds and times the candidates on the device: "
                        f"{dev.name!r} is reached through a tracker ({param('tracker')} HOST:PORT)")
    chosen = rec.candidates[:k]
    timed = list(chosen)
    if dev.measured_here:
        from dlas_predict.measure.networks.runner import onnxruntime_unsupported

        if onnxruntime_unsupported(dev) is None:
            if rec.reference is None:  # no model of it: measured only
                nan = float("nan")
                rec.reference = Candidate(Compression.DENSE, None, ONNXRUNTIME, (), nan, nan,
                                          nan, source="measured only")
            if rec.reference not in timed:
                timed.append(rec.reference)

    twins = _same_builds(timed)
    built = [c for c in timed if id(c) not in twins]
    measure_candidates(model, rec.network, dev, built, tuned_opts, network_runner, log)
    for c in timed:
        if id(c) in twins:
            twin = twins[id(c)]
            c.same_build_as = twin.label
            c.measured_s, c.measured_median_s = twin.measured_s, twin.measured_median_s
            c.measured_note = twin.measured_note
    return chosen


def measure_candidates(model: str, network: str, dev, cands: list[Candidate],
                       tuned_opts=None, network_runner=None, log=None) -> None:
    """Build and time each candidate as a whole network on ``dev`` with the runner that
    ``network_runner()`` opens (default: this machine's), filling its measured time, or its
    note where it failed or its output check did; ``log`` gets one line per candidate."""
    from dlas_predict.measure.execution.tasks import Protocol
    from dlas_predict.measure.networks.plans import NetworkPlan, onnxruntime_plan
    from dlas_predict.measure.records import noisy_note

    if network_runner is None:
        from dlas_predict.measure.networks.runner import NetworkRunner

        network_runner = (lambda: NetworkRunner(dev))

    def plan_of(c: Candidate) -> NetworkPlan:
        if c.backend == "onnxruntime":
            return onnxruntime_plan(model, network, c.compression, c.ratio)
        return NetworkPlan(model, network, c.compression, c.ratio, c.algorithm, c.layers,
                           tuning=tuned_opts if c.tuning is Tuning.TUNED else None)

    plans = [plan_of(c) for c in cands]
    t0 = time.perf_counter()
    with network_runner() as nr:
        protocol = getattr(nr, "protocol", None) or Protocol()
        by_key = {p.key(dev): c for p, c in zip(plans, cands)}  # a farm answers as boards
        for i, m in enumerate(nr.run(plans), 1):                # finish
            c = by_key[m.key]
            if log:
                got = (f"{m.best_s * 1e3:.3f} ms measured (fastest run; median "
                       f"{m.median_s * 1e3:.3f})" if not m.error
                       else f"failed: {m.error[:120]}")
                pred = (f", {c.predicted_s * 1e3:.3f} ms predicted"
                        if np.isfinite(c.predicted_s) else "")
                log(f"validate [{i}/{len(plans)}] {time.perf_counter() - t0:5.0f} s "
                    f"{c.backend} {c.label}: {got}{pred}")
            if m.error:
                c.measured_note = f"failed: {m.error[:300]}"
            else:
                c.measured_s, c.measured_median_s = m.best_s, m.median_s
                if not m.verified:
                    c.measured_note = (f"output check failed (max error {m.max_error:.3g}, "
                                       f"top-1 agreement {m.top1_agreement:.0%})")
                elif noisy := noisy_note(getattr(m, "contention", None),
                                         getattr(m, "slowdown", None), protocol):
                    c.measured_note = noisy
                elif m.untuned_layers:
                    c.measured_note = (f"{len(m.tuned_layers or [])} of {len(c.layers)} layers "
                                       "tuned; the tuning database holds no search for the "
                                       "others (run `dlas-predict tune --network ...`), they "
                                       "kept their hand schedules")
                elif c.backend == "onnxruntime" and (m.details or {}).get("calibration"):
                    c.measured_note = f"int8 calibrated on {m.details['calibration']}"


def _same_builds(timed: list[Candidate]) -> dict[int, Candidate]:
    """Per-layer candidates whose choice is one algorithm on every layer, by id, each to
    the single-algorithm candidate among ``timed`` that builds the same network: timing it
    twice would report one network's run-to-run noise as a difference."""
    twins = {}
    for c in timed:
        if c.algorithm != PER_LAYER:
            continue
        for o in timed:
            if (o.backend == "tvm" and o.algorithm != PER_LAYER and o.layers == c.layers
                    and o.compression is c.compression and o.ratio == c.ratio
                    and o.tuning is c.tuning):
                twins[id(c)] = o
                break
    return twins
