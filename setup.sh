#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv with the pinned dependencies and the
# project installed in editable mode. Re-running it does nothing once pyproject.toml is
# unchanged (a stamp file records what was installed). Debian's chromium and
# chromium-driver (the report's browser test) and the aarch64 and armv7 cross g++ (kernels
# and networks linked for boards reached through RPC) are installed when missing and
# apt-get can run as root; elsewhere the tests that need them are skipped, except under
# CI=true, where they fail.
set -euo pipefail
cd "$(dirname "$0")"
apt_install() {  # apt_install WHAT PACKAGES...: install Debian packages as root, once
    local what=$1; shift
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing Debian's $* ($what)"
        (apt-get install -y -q "$@" >/dev/null 2>&1 ||
         (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$@" >/dev/null 2>&1)) ||
            echo "setup: could not install $*; $what will not work" >&2
    else
        echo "setup: no root apt-get to install $*; $what will not work" >&2
    fi
}
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v arm-linux-gnueabihf-g++ >/dev/null; then
    apt_install "cross-compiling for aarch64 and armv7 boards" \
        g++-aarch64-linux-gnu g++-arm-linux-gnueabihf
fi
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt_install "the report's browser test" chromium chromium-driver
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.dlas-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
quietly() {  # run a command, printing its output only if it fails
    local log
    if ! log=$("$@" 2>&1); then
        echo "$log" >&2
        echo "setup: failed: $*" >&2
        return 1
    fi
}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing the pinned dependencies and the project into .venv"
    quietly .venv/bin/python -m pip install --quiet --upgrade pip
    # torch first, pinned: the machine's local CPU wheel (pip's find-links), never the CUDA one.
    quietly .venv/bin/python -m pip install --quiet "torch==2.13.0"
    quietly .venv/bin/python -m pip install --quiet -e ".[test]"
    echo "$want" > "$stamp"
fi
