"""Exception types raised by the library.

Every error a user can cause is a :class:`DlasError`; the CLI prints ``Error: <message>`` and
exits non-zero. Messages name what is allowed.
"""


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
