"""``python -m dlas_predict.cli``: the ``dlas-predict`` command."""

from dlas_predict.cli import main

main()
