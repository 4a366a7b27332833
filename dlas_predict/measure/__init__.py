"""The TVM measurement backend, installed as ``dlas_predict.measure``: kernels and their
knobs, the numpy reference, the isolated worker and the typed tasks it runs, the runners
(batch in, batch out), whole-network builds, tuning, the roofs' kernels, the CUDA kernels
with their bundles and GPU runner, and measuring on boards through a TVM RPC tracker (where
built code runs, ``remote``; the farm of boards, ``farm``; its options, ``rpcopts``; a
tracker and servers on loopback for tests and benchmarks, ``loopback``).

It depends on the library (``dlas_predict``) one way: the library imports it only inside the
functions that measure. Only the modules that compile or run kernels (``kernels``,
``netbuild``, ``tuning``, ``worker``'s task code) import TVM, and they run inside the isolated
worker process. Everything importable from this package's top level is pure Python.
"""

#: The kernels' code version, in every kernel record and its key, so stored measurements of
#: old code are not reused: bump it when every kernel's code changes, or give the kernels
#: whose code changed their own version in :data:`KERNEL_VERSIONS`.
KERNELS_VERSION = "k4"
#: Kernels (algorithm value, CSR or not, tuned or not) of a newer version than
#: :data:`KERNELS_VERSION`: "k5" is spatial pack's hand schedule running the epilogue on the
#: packed register tile and unpacking each tile to NCHW while it is in cache (a tuned
#: spatial pack is MetaSchedule's schedule of the unchanged compute).
KERNEL_VERSIONS = {("spatial_pack", False, False): "k5"}
#: The int8 GEMM on AVX-512 VNNI (its ``vnni`` knob): other code than the int8 GEMM the same
#: configuration ran before, whose records it supersedes on a machine that measured both.
VNNI_KERNELS_VERSION = "k6"
#: The float32 GEMM of pointwise layers as overlapping register tiles (its ``pointwise``
#: knob): other code than the TE GEMM the same layer ran before.
POINTWISE_KERNELS_VERSION = "k7"


def kernels_version(algorithm: str, sparse: bool, tuned: bool = False,
                    knobs: dict | None = None) -> str:
    """The code version of the kernel running ``algorithm`` (an Algorithm value), CSR or
    not, tuned or not, with ``knobs``: what its records and keys carry."""
    if knobs and knobs.get("vnni"):
        return VNNI_KERNELS_VERSION
    if knobs and knobs.get("pointwise"):
        return POINTWISE_KERNELS_VERSION
    return KERNEL_VERSIONS.get((str(algorithm), bool(sparse), bool(tuned)), KERNELS_VERSION)


def import_tvm():
    """Import TVM without the torch import its FFI layer makes first, and return it.

    ``tvm_ffi`` imports torch, when installed, before it loads (a workaround for one Windows
    build) so as to convert torch tensors. That costs each TVM process about 2 s of start-up
    on this machine, and the backend never hands TVM a torch tensor. torch is hidden only
    while TVM loads: a later ``import torch`` in the same process works as usual."""
    import sys

    if "tvm" in sys.modules or "torch" in sys.modules:
        import tvm

        return tvm
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tvm_ffi expects
    try:
        import tvm
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return tvm


def hide_torch_from_children(folder) -> dict[str, str]:
    """``PYTHONPATH`` for child processes that cannot import torch, with a shim in
    ``folder``: the TVM processes a measurement starts (MetaSchedule's builders and runners,
    a loopback tracker and its boards) never need it, and each starts about 2 s sooner
    without it (see :func:`import_tvm`)."""
    import os
    from pathlib import Path

    shim = Path(folder) / "torch"
    init = shim / "__init__.py"
    if not init.is_file():
        shim.mkdir(parents=True, exist_ok=True)
        tmp = init.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text('raise ImportError("torch is hidden from this TVM helper process")\n')
        tmp.replace(init)
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(shim.parent), *([path] if path else [])])}
