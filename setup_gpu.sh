#!/usr/bin/env bash
# TVM's runtime for a GPU machine that cannot reach a package registry.
#
#   bash setup_gpu.sh pack [PYVER]   here: writes .gpu/site.tar.xz, TVM's Python package and
#                                    runtime libraries (no compiler: kernels are built here)
#                                    with tvm-ffi for the GPU machine's Python (default 3.12)
#   bash setup_gpu.sh unpack         there: extracts it to /tmp/dlas-gpu-site; then
#       export PYTHONPATH=/tmp/dlas-gpu-site:$PWD TVM_USE_RUNTIME_LIB=1
#   bash setup_gpu.sh run OUT BUNDLE[:SECONDS] ...
#                                    there: unpacks if needed, then measures each bundle in
#                                    turn for at most SECONDS (default: no limit) into
#                                    OUT/NAME.jsonl (NAME: the bundle's folder name);
#                                    WORKERS (default 8) loaders; OTHER_GPU=1 passes
#                                    --allow-other-gpu. A bundle cut short resumes next time.
#
# The GPU machine needs an NVIDIA driver (its NVRTC compiles the kernels' CUDA C at load)
# and numpy; nothing else.
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-}
case "$mode" in
pack)
    pyver=${2:-3.12}
    tag=cp${pyver/./}
    tvm_dir=$(.venv/bin/python -c "import tvm, os; print(os.path.dirname(tvm.__file__))")
    ffi=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))")
    work=$(mktemp -d)
    mkdir -p "$work/site" .gpu
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        -d "$work/whl" "apache-tvm-ffi==$ffi"
    (cd "$work/site" && python3 -m zipfile -e "$work"/whl/apache_tvm_ffi-*-"$tag"-*.whl .)
    cp -r "$tvm_dir" "$work/site/tvm"
    rm -rf "$work/site/tvm/lib/libtvm_compiler.so" "$work/site/tvm/3rdparty"
    find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
    tar -C "$work/site" -cJf .gpu/site.tar.xz .
    rm -rf "$work"
    ls -la .gpu/site.tar.xz
    ;;
unpack)
    mkdir -p /tmp/dlas-gpu-site
    tar -C /tmp/dlas-gpu-site -xJf .gpu/site.tar.xz
    ;;
run)
    out=${2:?usage: bash setup_gpu.sh run OUT BUNDLE[:SECONDS] ...}
    shift 2
    [ -d /tmp/dlas-gpu-site/tvm ] || bash "$0" unpack
    export PYTHONPATH=/tmp/dlas-gpu-site:$PWD TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
    mkdir -p "$out"
    status=0
    for item in "$@"; do
        bundle=${item%%:*}
        limit=()
        [ "$item" != "$bundle" ] && limit=(--time-limit "${item##*:}")
        other=()
        [ "${OTHER_GPU:-0}" = 1 ] && other=(--allow-other-gpu)
        echo "== $bundle ${limit[*]}"
        python3 -m dlas_predict.measure.gpu.run "$bundle" --out "$out/$(basename "$bundle").jsonl" \
            --workers "${WORKERS:-8}" "${limit[@]}" "${other[@]}" || status=$?
    done
    exit $status
    ;;
*)
    echo "usage: bash setup_gpu.sh pack [PYVER] | unpack | run OUT BUNDLE[:SECONDS] ..." >&2
    exit 2
    ;;
esac
