"""The closed sets of words that options and parameters take: one enum each, which the
library checks against and the command line offers as its choices (so the two cannot
disagree). Standard library only: the command line imports it for ``--help``."""

from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """A word of a closed set; ``str(x)`` is the word."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class ExportFormat(Choice):
    """A corpus export's file format."""

    PARQUET = "parquet"
    CSV = "csv"


class DeviceKind(Choice):
    CPU = "cpu"
    GPU = "gpu"


class Level(Choice):
    """What a row is: one conv kernel, or one whole-network configuration."""

    KERNEL = "kernel"
    NETWORK = "network"


class Criterion(Choice):
    """How active learning picks the next kernel to measure."""

    VARIANCE = "variance"
    UNCERTAINTY = "uncertainty"
    RANDOM = "random"


class Tuner(Choice):
    """How a tuned kernel's schedule is searched."""

    KNOB_SEARCH = "knob-search"
    METASCHEDULE = "metaschedule"


class TuningChoice(Choice):
    """Which tunings to measure or rank: one, or both."""

    UNTUNED = "untuned"
    TUNED = "tuned"
    ALL = "all"
