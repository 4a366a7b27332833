"""Each candidate's accuracy and where it comes from: measured on ``--data``, read from the
shipped curve of a zoo network (by name, or by its weights for an exported copy), or
predicted from the weights by the accuracy-cost model
(:mod:`dlas_predict.models.accuracy`), whose interval's upper end the budget is checked
against."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dlas_predict.errors import DlasError
from dlas_predict.paths import CURVES
from dlas_predict.space.config import Compression

#: The predicted rows' source (their figures are the candidate's drop and its upper end).
PREDICTED = ("predicted: accuracy-cost model, from the weights (80 % interval in points of a "
             "network right on every input; the budget is checked against its upper end)")


@dataclass(frozen=True)
class AccuracyFigure:
    """One compression's accuracy: the value (None where only the drop is known), its
    source, the drop in points and, where predicted, the 80 % interval's upper end."""

    value: float | None
    source: str
    drop_pp: float | None
    high_pp: float | None = None

    @property
    def checked_drop(self) -> float | None:
        """The drop the budget is checked against: the upper end where predicted."""
        return self.high_pp if self.high_pp is not None else self.drop_pp


def shipped_curves() -> dict:
    """The shipped accuracy curves by network ({} when the file is absent)."""
    from dlas_predict.compression.accuracy import load_curves

    return load_curves(CURVES)


class Accuracies:
    """Accuracy per (compression, ratio) of one network: measured on ``data``, else its
    shipped curve, else predicted, unless ``unpredictable`` says why not (a zoo network's
    random weights, or a caller that asks for no accuracy)."""

    def __init__(self, model: str, name: str, data: str | None, log=None,
                 unpredictable: str | None = None, options=None, finetune_epochs: int = 0):
        from dlas_predict.compression.data import DataOptions

        self.model, self.name, self.data, self.log = model, name, data, log
        self.finetune_epochs = finetune_epochs
        self.options = options or DataOptions()
        self.curve = None if data else shipped_curves().get(name)
        self.unpredictable = unpredictable
        self.reference = None
        self.cache: dict[tuple, AccuracyFigure] = {}
        self._predictor = None
        self._why_not = None

    def measure_all(self, keys) -> None:
        """Each (compression, ratio) of ``keys`` looked up once; measured or predicted under
        a progress bar on a terminal (measured: else one log line each)."""
        from dlas_predict.render import progress_bar

        keys = [k for k in keys if k not in self.cache]
        predicting = not self.data and self.curve is None and not self.unpredictable
        if predicting and keys and self.log:
            self.log("predicting each compression's accuracy from the weights (each pruning "
                     "run on synthetic inputs once; kept in DLAS_HOME/cache/probe)")
        bar = progress_bar(len(keys), "accuracy", "compression",
                           enabled=bool(self.data) or predicting)
        log = self.log
        if bar is not None:
            self.log = None
        try:
            for comp, ratio in keys:
                self.get(comp, ratio)
                if bar is not None:
                    bar.update(1)
        finally:
            self.log = log
            if bar is not None:
                bar.close()

    def get(self, comp: Compression, ratio: float | None) -> AccuracyFigure:
        key = (comp, ratio)
        if key not in self.cache:
            self.cache[key] = self._get(comp, ratio)
        return self.cache[key]

    def _get(self, comp: Compression, ratio: float | None) -> AccuracyFigure:
        if self.data:
            return self._measured(comp, ratio)
        if self.curve is not None:
            return self._from_curve(comp, ratio)
        if comp is Compression.DENSE:
            return AccuracyFigure(None, "uncompressed: no drop", 0.0)
        return self._predicted(comp, ratio)

    def _measured(self, comp: Compression, ratio: float | None) -> AccuracyFigure:
        from dlas_predict.compression.accuracy import measure

        t0 = time.perf_counter()
        pruned = comp in (Compression.WEIGHT_PRUNING, Compression.CHANNEL_PRUNING)
        epochs = self.finetune_epochs if pruned else 0
        res = measure(self.model, self.data, comp.value, ratio, epochs, reference=self.reference,
                      options=self.options)
        if self.log:
            self.log(f"accuracy [{len(self.cache) + 1}] {comp.value}"
                     + (f"@{ratio:g}" if ratio else "") + f": {res.metric} "
                     f"{res.value:.4f} on {res.n_samples} images "
                     f"({time.perf_counter() - t0:.1f} s)")
        more = (f"; {res.images_skipped} images could not be decoded and were skipped"
                if res.images_skipped else "")
        if epochs:
            more += (f"; fine-tuned {epochs} epochs on "
                     + ("the digits training split" if self.data == "digits" else
                        "the other half of the data"))
        if res.metric == "top1":
            self.reference = res.reference_top1
            return AccuracyFigure(res.value, f"measured: top-1 on {res.data} "
                                  f"({res.n_samples} images{more})",
                                  (res.reference_top1 - res.value) * 100)
        return AccuracyFigure(res.value, f"measured: fidelity proxy on {res.data} (agreement "
                              f"with the uncompressed model, {res.n_samples} images"
                              f"{more})", (1 - res.value) * 100)

    def _from_curve(self, comp: Compression, ratio: float | None) -> AccuracyFigure:
        dense = self.curve.dense
        src = (f"shipped curve: top-1 on {self.curve.data} "
               f"({self.curve.n_samples} images, datasets/accuracy/curves.json)")
        if comp is Compression.DENSE:
            return AccuracyFigure(dense, src, 0.0)
        v = (self.curve.accuracy(comp.value) if comp in (Compression.FLOAT16, Compression.INT8)
             else self.curve.accuracy(comp.value, ratio, digits=4))
        if v is None:
            return self._predicted(comp, ratio, "not on the shipped curve")
        return AccuracyFigure(v, src, (dense - v) * 100)

    def _predicted(self, comp: Compression, ratio: float | None,
                   why: str = "no --data and no shipped curve") -> AccuracyFigure:
        predictor = self._load_predictor()
        if predictor is None:
            return AccuracyFigure(None, f"unknown: {why}, and {self._why_not}; pass --data "
                                  "to measure", None)
        try:
            p = predictor.drops([(comp, ratio)])[0]
        except DlasError as exc:  # the probe cannot run this network
            self._why_not = f"the accuracy-cost model cannot price it ({exc})"
            self._predictor = None
            return AccuracyFigure(None, f"unknown: {why}, and {self._why_not}; pass --data "
                                  "to measure", None)
        return AccuracyFigure(None, PREDICTED, p.drop_pp, p.high_pp)

    def _load_predictor(self):
        if self._predictor is None and self._why_not is None:
            if self.unpredictable:
                self._why_not = self.unpredictable
                return None
            from dlas_predict.models.accuracy import AccuracyPredictor
            from dlas_predict.networks import zoo

            try:
                self._predictor = AccuracyPredictor(zoo.resolve(self.model))
            except DlasError as exc:
                self._why_not = f"the accuracy-cost model cannot price it ({exc})"
        return self._predictor
