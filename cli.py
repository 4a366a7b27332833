"""Run the command line from a source checkout: ``python cli.py --help``.

The installed command is ``dlas-predict`` (:func:`dlas_predict.cli.main`).
"""

from dlas_predict.cli import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    main()
