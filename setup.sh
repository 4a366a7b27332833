#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv with the pinned dependencies and the
# project installed in editable mode. Re-running it does nothing once pyproject.toml is
# unchanged (a stamp file records what was installed).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.dlas-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # torch first, pinned: the machine's local CPU wheel (pip's find-links), never the CUDA one.
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[test]"
    echo "$want" > "$stamp"
fi
