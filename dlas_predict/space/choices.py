"""The closed sets of words that options and parameters take: one enum each, which the
library checks against and the command line offers as its choices (so the two cannot
disagree), all of one base (:class:`Choice`, also the grid's: algorithms, compressions,
dtypes, tunings). Standard library only: the command line imports it for ``--help``."""

from __future__ import annotations

import enum
import re

from dlas_predict.errors import ConfigError


class Choice(str, enum.Enum):
    """A word of a closed set; ``str(x)`` is the word, and a parse error lists the allowed
    ones."""

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, value: "str | Choice") -> "Choice":
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower().replace("-", "_")
        for member in cls:
            if member.value.replace("-", "_") == text:
                return member
        raise ConfigError(f"unknown {cls._label()} {value!r}; allowed: "
                          + ", ".join(cls.words()))

    @classmethod
    def parse_list(cls, text: str) -> list["Choice"]:
        """Parse ``all`` or a comma-separated list, keeping order and dropping repeats."""
        if text.strip().lower() == "all":
            return list(cls)
        out: list[Choice] = []
        for part in text.split(","):
            if not part.strip():
                continue
            member = cls.parse(part)
            if member not in out:
                out.append(member)
        if not out:
            raise ConfigError(f"no {cls._label()} given; allowed: all, "
                              + ", ".join(cls.words()))
        return out

    @classmethod
    def _label(cls) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()

    def __str__(self) -> str:
        return self.value


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
