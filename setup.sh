#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv with the pinned dependencies and the
# project installed in editable mode. Re-running it does nothing once pyproject.toml is
# unchanged (a stamp file records what was installed). Debian's chromium and
# chromium-driver (the report's browser test) are installed when missing and apt-get can
# run as root; elsewhere that test is skipped, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing Debian's chromium and chromium-driver (report browser test)"
        (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
         (apt-get update -q >/dev/null 2>&1 &&
          apt-get install -y -q chromium chromium-driver >/dev/null 2>&1)) ||
            echo "setup: could not install chromium; the browser test will not run" >&2
    else
        echo "setup: no chromium/chromedriver and no root apt-get; the browser test will" \
             "not run" >&2
    fi
fi
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
