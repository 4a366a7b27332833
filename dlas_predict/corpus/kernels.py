"""A kernel record's configuration, and which record of a configuration the models learn
from: the configuration a corpus row describes (:class:`KernelConfig`), its key
(:class:`KernelKey`), the latency learned from it (:func:`modelled_seconds`), and, among the
records of one configuration, the one today's untuned schedule ran (:func:`preferred_records`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from dlas_predict.compression.netplan import ratio_key
from dlas_predict.space.config import COMPRESSION_KERNEL, Algorithm, Compression, ConvSpec, Tuning
from dlas_predict.space.devices import Device


@dataclass(frozen=True)
class KernelConfig:
    """What is measured or predicted: a workload under one configuration on one device."""

    spec: ConvSpec
    algorithm: Algorithm
    compression: Compression
    sparsity: float  # the layer's own (0 when unpruned)
    tuning: Tuning = Tuning.UNTUNED
    knobs: tuple[tuple[str, int], ...] = ()  # empty: the untuned defaults for the shape

    def _variant(self):
        from dlas_predict.space.config import Variant

        sparse = COMPRESSION_KERNEL[self.compression][0]
        return Variant(self.algorithm, self.compression, 0.5 if sparse else 0.0)

    def untuned_knobs(self, simd_bits: int | None = None, vnni: bool = False) -> dict[str, int]:
        """The untuned schedule's knobs for the shape on a CPU of ``simd_bits``, with AVX-512
        VNNI or not (:func:`dlas_predict.measure.kernels.knobs.default_knobs`)."""
        from dlas_predict.measure.kernels.knobs import default_knobs

        return default_knobs(self.spec, self._variant(), simd_bits, vnni)

    def resolved_knobs(self, simd_bits: int | None = None,
                       vnni: bool = False) -> dict[str, int]:
        """The knobs known before measuring: the untuned defaults; for a tuned kernel only
        the layout knobs it is tuned under (its loop schedule is the search's result, unknown
        when predicting, so training rows do not use it either)."""
        from dlas_predict.measure.kernels.knobs import tuned_knobs

        if self.knobs:
            return dict(self.knobs)
        if self.tuning is Tuning.TUNED:
            return {k: v for k, v in tuned_knobs(self.spec, self._variant(), 1,
                                                 simd_bits).items() if k != "budget"}
        return self.untuned_knobs(simd_bits, vnni)


def config_from_row(row: dict) -> KernelConfig:
    """A corpus row (``CorpusStore.rows``) → its :class:`KernelConfig`."""
    spec = ConvSpec.parse(row["conv"])
    comp = Compression.parse(row["compression"])
    sparse = COMPRESSION_KERNEL[comp][0]
    tuning = Tuning.parse(row["tuning"])
    # an untuned row carries the knobs it ran with (the defaults of its CPU's vector width
    # when measured), TopHub rows their tuned knobs; our tuned rows' layout knobs are
    # recomputed
    knobs = ()
    if row.get("knobs") and (tuning is Tuning.UNTUNED or row.get("tuner") is None):
        import json

        knobs = tuple(sorted(json.loads(row["knobs"]).items()))
    return KernelConfig(spec, Algorithm.parse(row["algorithm"]), comp,
                        float(row["ratio"] or 0.0) if sparse else 0.0, tuning, knobs)


def untuned_simd(device: Device) -> int | None:
    """The vector width the untuned knobs of ``device``'s kernels are sized for."""
    return device.simd_bits if device.kind == "cpu" else None


def codegen(device: Device) -> tuple[int | None, bool]:
    """What the untuned knobs of ``device``'s kernels depend on: its vector width, and
    whether it has AVX-512 VNNI."""
    return untuned_simd(device), device.vnni


def modelled_seconds(row: dict) -> float:
    """The latency the models learn from a store row (kernel or whole network): the fastest
    timed run (:func:`~dlas_predict.measure.records.best_of`); the median where the row keeps no
    runs (imported TopHub costs)."""
    import json

    from dlas_predict.measure.records import best_of

    best = best_of(json.loads(row["run_secs"]))  # the store keeps them as JSON text
    return float(best if best is not None else row["median_s"])


class KernelKey(NamedTuple):
    """One kernel of the corpus: the workload, its algorithm and compression, the layer
    ratio it was measured at (rounded as :func:`ratio_key`), and tuning."""

    conv: str
    algorithm: str
    compression: str
    ratio: float
    tuning: str = "untuned"


def kernel_key(conv: str, algorithm: str, compression: str, ratio: float,
               tuning: str = "untuned") -> KernelKey:
    return KernelKey(conv, algorithm, compression, ratio_key(ratio), tuning)


def preferred_records(rows: list[dict], device: Device) -> dict[KernelKey, dict]:
    """The record each kernel configuration of ``device`` is learned from and a whole
    network's layers are paired with, by kernel key (in order of first appearance), among
    ``rows`` (kernel records, in insertion order). Records of one configuration on one
    machine with other knobs (a CPU kernel's blocks before and after a change of its
    defaults, a GPU's float16 accumulating in float32 and in float16): the one of today's
    untuned schedule (:func:`runs_today`), which our builds run; between two of today's, or
    two of neither, the faster, which a deployment would run. A repeat measurement on
    another machine replaces the earlier machine's."""
    def rank(r: dict) -> tuple:  # only where a configuration has two records
        return runs_today(r, device), -modelled_seconds(r)

    out: dict[KernelKey, dict] = {}
    for r in rows:
        k = kernel_key(r["conv"], r["algorithm"], r["compression"], r["ratio"], r["tuning"])
        old = out.get(k)
        if old is None or old["fingerprint"] != r["fingerprint"] or rank(r) > rank(old):
            out[k] = r
    return out


def _untuned_cpu_record(row: dict, device: Device) -> bool:
    """Whether ``row`` is an untuned kernel record of CPU ``device`` that carries its knobs."""
    return row["tuning"] == "untuned" and device.kind == "cpu" and bool(row.get("knobs"))


def runs_today(row: dict, device: Device, cfg: KernelConfig | None = None) -> bool:
    """Whether untuned kernel record ``row`` of CPU ``device`` ran the schedule today's code
    gives its configuration (:meth:`~dlas_predict.corpus.kernels.KernelConfig.untuned_knobs`
    for the device's vector width): a record timed before a change of the defaults ran other
    blocks than a build of today's engine runs. ``cfg``: the row's configuration, where the
    caller has parsed it already."""
    import json

    if not _untuned_cpu_record(row, device):
        return False
    cfg = cfg or config_from_row(row)
    return json.loads(row["knobs"]) == cfg.untuned_knobs(*codegen(device))


def other_schedule(row: dict, device: Device, cfg: KernelConfig | None = None) -> bool:
    """Whether ``row`` is an untuned CPU kernel record timed with other knobs than today's
    untuned schedule of its configuration (before a change of the defaults): the only
    timing of that configuration, but not of the kernel a build of today's engine runs."""
    return _untuned_cpu_record(row, device) and not runs_today(row, device, cfg)
