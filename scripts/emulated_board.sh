#!/usr/bin/env bash
# An emulated aarch64 board on loopback: Debian's qemu-user running an aarch64 Python 3.11
# (Debian's arm64 packages, unpacked into a sysroot) with the aarch64 apache-tvm wheel, as a
# TVM RPC server registered under the key qemu-aarch64 with a tracker on 127.0.0.1.
#
#   scripts/emulated_board.sh DIR [PORT]   # build DIR/sysroot once, start tracker + server
#
# then, for every kernel kind built for the HiKey 970 and verified on the emulated board:
#
#   .venv/bin/dlas-predict measure --device hikey970-cpu --conv C=8,H=8,W=8,K=8,R=3,S=3,pad=1 \
#       --tracker 127.0.0.1:PORT --rpc-key qemu-aarch64 --emulated --quiet-wait 0 \
#       --time-budget 0.2 --max-repeats 3 --timeout 600
#
# Timings on it are the emulator's: `measure --emulated` labels them, the corpus refuses them.
# Needs root (apt-get), qemu-user, and the package registries. Stop it with
# `kill -- -$(cat DIR/pgid)`.
set -euo pipefail
DIR=$(realpath -m "${1:?usage: scripts/emulated_board.sh DIR [PORT]}")
PORT=${2:-9390}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$ROOT/.venv/bin/python
mkdir -p "$DIR"/debs "$DIR"/wheels "$DIR"/site "$DIR"/sysroot
command -v qemu-aarch64 >/dev/null || apt-get install -y -q qemu-user >/dev/null
if [ ! -x "$DIR/sysroot/usr/bin/python3.11" ]; then
    dpkg --print-foreign-architectures | grep -q arm64 || dpkg --add-architecture arm64
    apt-get update -q >/dev/null
    (cd "$DIR/debs" && apt-get download -q python3.11-minimal:arm64 \
        libpython3.11-minimal:arm64 libpython3.11-stdlib:arm64 libc6:arm64 libexpat1:arm64 \
        zlib1g:arm64 libffi8:arm64 libssl3:arm64 libbz2-1.0:arm64 liblzma5:arm64 \
        libsqlite3-0:arm64 libncursesw6:arm64 libtinfo6:arm64 libreadline8:arm64 \
        libuuid1:arm64 libgcc-s1:arm64 libstdc++6:arm64 libcrypt1:arm64 libdb5.3:arm64 \
        libgdbm6:arm64 libnsl2:arm64 libtirpc3:arm64 libgssapi-krb5-2:arm64 libkrb5-3:arm64 \
        libk5crypto3:arm64 libcom-err2:arm64 libkrb5support0:arm64 libkeyutils1:arm64 \
        media-types >/dev/null 2>&1)
    for d in "$DIR"/debs/*.deb; do dpkg -x "$d" "$DIR/sysroot"; done
fi
if [ ! -d "$DIR/site/tvm" ]; then
    "$PY" -m pip download --quiet --only-binary=:all: --platform manylinux_2_28_aarch64 \
        --python-version 3.11 --implementation cp -d "$DIR/wheels" "apache-tvm==0.27.0.post1" \
        "apache-tvm-ffi==0.1.14.post1" "numpy<2.4" cloudpickle psutil tornado 2>/dev/null
    for w in "$DIR"/wheels/*.whl; do (cd "$DIR/site" && "$PY" -m zipfile -e "$w" .); done
fi
# The server starts its workers with sys.executable; without binfmt_misc the host cannot run
# an aarch64 binary directly, so sys.executable is this wrapper script.
cat > "$DIR/python-aarch64" <<WRAP
#!/bin/sh
export PYTHONPATH=$DIR/site
exec qemu-aarch64 -L $DIR/sysroot $DIR/sysroot/usr/bin/python3.11 "\$@"
WRAP
chmod +x "$DIR/python-aarch64"
setsid bash -c "
    '$PY' -m tvm.exec.rpc_tracker --host 127.0.0.1 --port $PORT --port-end $((PORT + 1)) \
        > '$DIR/tracker.log' 2>&1 &
    sleep 2
    '$DIR/python-aarch64' -c \"import sys, runpy; sys.executable = '$DIR/python-aarch64'; \
sys.argv = ['rpc_server', '--host', '127.0.0.1', '--port', '$((PORT + 3))', '--port-end', \
'$((PORT + 4))', '--tracker', '127.0.0.1:$PORT', '--key', 'qemu-aarch64']; \
runpy.run_module('tvm.exec.rpc_server', run_name='__main__')\" > '$DIR/server.log' 2>&1 &
    wait" &
echo $! > "$DIR/pgid"
echo "tracker 127.0.0.1:$PORT; an emulated aarch64 board registers under qemu-aarch64 in about" \
     "a minute (TVM imports in ~25 s under emulation); logs in $DIR"
