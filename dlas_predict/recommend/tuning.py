"""Tuning in ``recommend``: the predicted search time of each tuned kernel, the tuned
candidates that a search would not pay for, and the one-line verdict on whether tuning is
worth it on this device."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlas_predict.recommend.candidates import Candidate
from dlas_predict.space.config import COMPRESSION_KERNEL, Tuning
from dlas_predict.space.devices import model_dir


def tuning_model(info: dict, models_dir: Path | None, device: str):
    """The device's tuning-time model, or None when its corpus had no tuned record."""
    from dlas_predict.models.costmodel import TuningTimeModel

    directory = Path(models_dir) if models_dir else model_dir(device)
    if not (directory / "tuning.json").is_file():
        return None
    model = TuningTimeModel.load(directory)
    info["tuning_model"] = {"tuned_kernels": model.meta_.get("n_train"),
                            "trial_share": model.trial_share_}
    return model


def searched_trials(model, gpu: bool) -> tuple[int | None, int | None]:
    """The trials of the fixed-size searches a device's tuned kernels came from (GPU bundles
    tune by searches of a set size, not by a budget): the knob searches', or None; and a
    GPU's MetaSchedule rounds', or None. A CPU's MetaSchedule searches run to a budget
    (``--trials``): (None, None)."""
    from dlas_predict.measure.records import KNOB_SEARCH, METASCHEDULE

    if model is None or (METASCHEDULE in model.trial_share_ and not gpu):
        return None, None
    medians = model.meta_.get("median_trials", {})
    trials, ms = medians.get(KNOB_SEARCH), medians.get(METASCHEDULE)
    return (int(trials) if trials else None), (int(ms) if ms else None)


def tuning_seconds(model, X: np.ndarray, kernels: list[tuple], trials: int):
    """Predicted search seconds of each tuned kernel row (None without a tuning model)."""
    if model is None or not len(X):
        return None
    from dlas_predict.measure.kernels.knobs import search_space

    from dlas_predict.space.config import Variant

    sizes = []
    for spec, alg, comp, ratio, _tn in kernels:
        sparse = COMPRESSION_KERNEL[comp][0]
        sizes.append(len(search_space(spec, Variant(alg, comp, ratio or 0.5))) if sparse
                     else 0)
    from dlas_predict.models.costmodel import TuningInputs

    return model.predict(TuningInputs(X, np.full(len(X), trials), np.array(sizes)))


def without_dominated_tuning(kept: list[Candidate], skipped: list) -> list[Candidate]:
    """``kept`` without the tuned candidates predicted no faster than the same build
    untuned: a search that costs time for no predicted gain is never the answer (each is
    listed in ``skipped``)."""
    untuned = {(c.backend, c.compression, c.ratio, c.algorithm, c.layers): c.predicted_s
                for c in kept if c.tuning is Tuning.UNTUNED}
    out, dominated = [], []
    for c in kept:
        twin = untuned.get((c.backend, c.compression, c.ratio, c.algorithm, c.layers))
        if c.tuning is Tuning.TUNED and twin is not None and c.predicted_s >= twin:
            dominated.append(c.label)
        else:
            out.append(c)
    skipped.extend((label, "predicted no faster tuned than untuned: the search would cost "
                    "time for no gain, the untuned build is listed") for label in dominated)
    return out


def tuning_verdict(kept: list[Candidate], trials: int) -> str:
    """Whether tuning is worth it here: the best tuned against the best untuned candidate."""
    tuned = [c for c in kept if c.tuning is Tuning.TUNED]
    untuned = [c for c in kept if c.tuning is Tuning.UNTUNED]
    if not tuned or not untuned:
        return "tuning: no candidate of one half survives the accuracy budget"
    bt, bu = tuned[0], untuned[0]
    gain = bu.predicted_s - bt.predicted_s
    cost = (f"{bt.tuning_s / 60:.1f} min of search ({trials} trials per kernel)"
            if bt.tuning_s is not None else "an unknown search time (no tuning-time model)")
    if gain <= 0:
        return (f"tuning is predicted not to pay off here: the best tuned candidate "
                f"({bt.label}, {bt.predicted_s * 1e3:.2f} ms) is no faster than the best "
                f"untuned ({bu.label}, {bu.predicted_s * 1e3:.2f} ms); it would cost {cost}")
    text = (f"tuning is predicted to save {gain * 1e3:.2f} ms per inference "
            f"({gain / bu.predicted_s:.0%}: {bu.label} {bu.predicted_s * 1e3:.2f} ms → "
            f"{bt.label} {bt.predicted_s * 1e3:.2f} ms) for {cost}")
    if bt.tuning_s is not None:
        text += f"; it pays for itself after {bt.tuning_s / gain:,.0f} inferences"
    return text + " (all figures predicted by models trained on measurements)"


