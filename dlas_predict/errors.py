"""Exception types raised by the library.

Every error a user can cause is a :class:`DlasError`; the CLI prints ``Error: <message>`` and
exits non-zero. Messages name what is allowed, and a parameter by its name in backquotes
(:func:`param`): the library's callers read the parameter, the CLI shows the option that sets
it.
"""

import re

#: A parameter as a message names it (:func:`param`).
PARAM = re.compile(r"`([a-z][a-z0-9_]*)`")


def param(name: str) -> str:
    """A parameter of the function that raises, as its error message names it: ```name```.
    The CLI replaces it by the option that sets it (``--name``, :func:`with_flags`)."""
    return f"`{name}`"


def with_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with each parameter it names (:func:`param`) that ``flags`` maps to an
    option replaced by that option."""
    return PARAM.sub(lambda m: flags.get(m.group(1), m.group(0)), message)


class DlasError(Exception):
    """Base class of every user-facing error."""


class SpecError(DlasError):
    """A malformed or impossible convolution specification."""


class ConfigError(DlasError):
    """An unknown algorithm, compression, dtype, tuning, or an out-of-range ratio."""


class DeviceError(DlasError):
    """An unknown device, or a device that cannot be measured here."""


class StoreError(DlasError):
    """A corpus store that cannot be opened, read or written."""


class NetworkError(DlasError):
    """A network file that cannot be read (missing, malformed, unsupported)."""


class BoardError(DlasError):
    """A tracker or board that cannot be used: ``code`` is ``unreachable``, ``unknown_key``,
    ``no_board`` (none came free in time), ``lost`` (the session died) or ``mismatch`` (the
    board is not the device)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
