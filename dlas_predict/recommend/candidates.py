"""What `recommend` answers: one priced configuration (:class:`Candidate`: its predicted time
and interval, accuracy and their sources, measured time once validated) and the ranked
answer for one network on one device (:class:`Recommendation`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlas_predict.space.config import Compression, Tuning
from dlas_predict.measure.networks.plans import ONNXRUNTIME, PER_LAYER


@dataclass
class Candidate:
    """One point of the grid with its predicted (and, once validated, measured) latency."""

    compression: Compression
    ratio: float | None
    algorithm: str                         # an Algorithm value, "per_layer" or "onnxruntime"
    layers: tuple[tuple[str, bool], ...]   # (algorithm, sparse) per conv layer; () for ort
    predicted_s: float
    low_s: float
    high_s: float
    accuracy: float | None = None
    accuracy_source: str = ""
    accuracy_drop_pp: float | None = None
    accuracy_drop_high_pp: float | None = None  # a predicted drop's 80 % interval upper end
    measured_s: float | None = None         # fastest timed run: what the models predict
    measured_median_s: float | None = None  # the protocol's median, for reference
    measured_note: str | None = None
    tuning: Tuning = Tuning.UNTUNED
    tuning_s: float | None = None          # predicted search time (tuned candidates)
    conv_s: float | None = None            # predicted conv kernels' sum, before the network
    source: str = "trained"                # the prediction's: trained | adapted | zero-shot
    #: the prediction before a calibration's whole-network or onnxruntime offset (seconds)
    basis_s: float | None = None
    #: onnxruntime rows: the share of the prediction in per-op costs (its model's
    #: :data:`~dlas_predict.models.ortmodel.FIXED_TERMS`), which a calibration scales apart
    fixed_share: float | None = None
    #: onnxruntime rows: the mode its model priced the run in
    #: (:func:`~dlas_predict.models.ortmodel.model_mode`): a channel-pruned network none of
    #: whose zeroed filters could be removed runs the dense network, an ``fp32`` run
    ort_mode: str | None = None
    #: a per-layer candidate that chose one algorithm for every layer: that candidate's
    #: label (the same network, built and timed once for both)
    same_build_as: str | None = None
    #: ranked before the reference, yet within its model's error of it (:func:`_rank`)
    warning: str | None = None

    @property
    def unchecked(self) -> bool:
        """A compressed candidate whose accuracy is neither measured, known from a curve
        nor predicted."""
        return self.accuracy_drop_pp is None and self.compression is not Compression.DENSE

    @property
    def mixed(self) -> bool:
        """A per-layer plan whose layers run more than one algorithm."""
        return self.algorithm == PER_LAYER and len({a for a, _ in self.layers}) > 1

    @property
    def backend(self) -> str:
        return "onnxruntime" if self.algorithm == ONNXRUNTIME else "tvm"

    @property
    def sparse(self) -> bool | str:
        if self.backend == "onnxruntime":
            return False
        kinds = {s for _, s in self.layers}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def label(self) -> str:
        from dlas_predict.compression.netplan import config_label

        tuned = " tuned" if self.tuning is Tuning.TUNED else ""
        return f"{config_label(self.compression, self.ratio)} {self.algorithm}{tuned}"

    def to_dict(self) -> dict:
        ms = (lambda s: None if s is None or s != s else round(s * 1e3, 4))
        out = {"config": {"backend": self.backend, "compression": self.compression.value,
                          "ratio": self.ratio, "algorithm": self.algorithm,
                          "sparse": self.sparse, "tuning": self.tuning.value},
               "predicted_ms": ms(self.predicted_s), "predicted_low_ms": ms(self.low_s),
               "predicted_high_ms": ms(self.high_s), "source": self.source,
               "accuracy": self.accuracy,
               "accuracy_source": self.accuracy_source,
               "accuracy_drop_pp": self.accuracy_drop_pp,
               "accuracy_drop_high_pp": self.accuracy_drop_high_pp, "measured_ms": ms(self.measured_s),
               "measured_median_ms": ms(self.measured_median_s),
               "predicted_tuning_s": None if self.tuning_s is None else round(self.tuning_s, 1)}
        if self.algorithm == PER_LAYER:
            out["config"]["layers"] = [{"algorithm": a, "sparse": s} for a, s in self.layers]
        if self.measured_note:
            out["measured_note"] = self.measured_note
        if self.same_build_as:
            out["same_build_as"] = self.same_build_as
        if self.warning:
            out["warning"] = self.warning
        return out


@dataclass
class Recommendation:
    network: str
    device: str
    candidates: list[Candidate]            # kept, ranked by predicted latency
    dropped: list[tuple[str, str]]         # (candidate label, why)
    skipped: list[tuple[str, str]]         # (grid point, why)
    dense_baseline_s: float
    model_info: dict
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    validated: list[Candidate] = field(default_factory=list)
    #: trained (the device's own models), adapted or zero-shot (a reference device's
    #: models mapped to this one: :mod:`dlas_predict.crossdev.transfer`)
    source: str = "trained"
    mapping: dict | None = None
    #: onnxruntime fp32 on the dense model: the incumbent every speedup is relative to
    #: (predicted by the onnxruntime model, measured by --validate); None where neither is
    reference: Candidate | None = None
    #: the network's family as calibration offsets group it: "transformer", "mlp",
    #: "recurrent" or "" (a conv network)
    family: str = ""

    @property
    def reference_s(self) -> float | None:
        """The reference's latency the speedups divide: measured where validated, else
        predicted (None without either)."""
        r = self.reference
        if r is None:
            return None
        if r.measured_s is not None:
            return r.measured_s
        return r.predicted_s if r.predicted_s == r.predicted_s else None

    def accuracy_counts(self) -> dict[str, int]:
        """The kept candidates by accuracy source (measured, shipped curve, predicted,
        uncompressed, unchecked), most first."""
        counts: dict[str, int] = {}
        for c in self.candidates:
            kind = ("unchecked" if c.unchecked
                    else c.accuracy_source.split(":")[0] or "uncompressed")
            counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_dict(self, top: int | None = None) -> dict:
        shown = self.candidates if top is None else self.candidates[:top]
        extra = [c for c in self.validated if c not in shown]
        return {"network": self.network, "device": self.device,
                "candidates": [c.to_dict() for c in [*shown, *extra]],
                "dense_baseline_predicted_ms": round(self.dense_baseline_s * 1e3, 4),
                "latency_source": "predicted by the cost models in "
                                  f"{self.model_info.get('directory')} (layer LightGBM summed "
                                  "over conv layers × network residual) for the fastest "
                                  "timed run; measured_ms: whole network built by TVM "
                                  "Relax and timed here, its fastest run (measured_median_ms: "
                                  "the median run)",
                "source": self.source, "mapping": self.mapping,
                "reference": None if self.reference is None else {
                    **self.reference.to_dict(),
                    "what": "onnxruntime fp32 (CPU provider) on the dense model: speedups "
                            "are relative to it"},
                "accuracy_sources": self.accuracy_counts(),
                "model": self.model_info, "dropped": [list(d) for d in self.dropped],
                "skipped": [list(s) for s in self.skipped], "notes": self.notes,
                "seconds": round(self.seconds, 2)}
