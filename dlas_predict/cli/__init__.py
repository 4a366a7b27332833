"""The ``dlas-predict`` command: a thin layer over the library.

Every library error is a :class:`dlas_predict.errors.DlasError`; it is printed as one
``Error: …`` line on stderr and the command exits non-zero. Heavy packages (TVM, torch,
LightGBM, pandas) are imported inside the commands that need them. The commands live in
modules by role (``measuring``, ``networks``, ``models``, ``recommending``, ``data``, ``demo``,
``devices``, ``publicdata``); importing them registers them with :data:`app`, in the order ``--help`` lists
them.
"""

from dlas_predict.cli.common import app
from dlas_predict.cli import measuring, networks, models, recommending, data, demo  # noqa: F401
from dlas_predict.cli import devices, publicdata  # noqa: F401

__all__ = ["app", "main"]


def main() -> None:
    app()

