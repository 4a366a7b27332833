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
    """Run the command. Under ``--json`` an error the parser finds (an unknown option, a
    word outside an option's choices) is printed as ``{"error": ...}`` on stdout too, as
    every library error is."""
    import sys

    args = sys.argv[1:]
    if "--json" not in args:
        app()
        return
    import json

    import typer

    try:
        code = typer.main.get_command(app).main(args, prog_name="dlas-predict",
                                                standalone_mode=False)
    except Exception as exc:
        if not hasattr(exc, "format_message"):  # not the parser's: as without --json
            raise
        print(json.dumps({"error": exc.format_message()}))
        exc.show()
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)

