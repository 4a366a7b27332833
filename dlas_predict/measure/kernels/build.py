"""A kernel built: the hand-scheduled module of a kernel specification (dense TE compute and
schedule, the VNNI int8 GEMM, or CSR TVMScript), compiled for a target, and its call
arguments."""

from __future__ import annotations

from functools import partial

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule

from dlas_predict.space.config import Algorithm
from dlas_predict.measure.kernels.spec import KernelSpec, output_shape, uses_pmaddwd, uses_vnni
from dlas_predict.measure.kernels.cpu import DENSE_KERNELS, pack_weights, spatial_pack_compute
from dlas_predict.measure.kernels.vnni import (gemm_pmaddwd_compute, gemm_vnni_compute,
                                               gemm_vnni_schedule)
from dlas_predict.measure.kernels.csr import SPARSE_KERNELS
from dlas_predict.measure.kernels.pointwise import pointwise_script
from dlas_predict.measure.kernels.winograd import (pack_winograd_weights, winograd_compute,
                                                   winograd_schedule)


def _dense(ks: KernelSpec) -> tuple:
    """A dense kernel's (TE compute definition, hand schedule)."""
    if uses_vnni(ks):
        return gemm_vnni_compute, gemm_vnni_schedule
    if uses_pmaddwd(ks):
        return gemm_pmaddwd_compute, gemm_vnni_schedule
    if ks.algorithm is Algorithm.WINOGRAD:
        return winograd_compute, winograd_schedule
    return DENSE_KERNELS[ks.algorithm]


def kernel_weights(ks: KernelSpec, w: np.ndarray) -> list[np.ndarray]:
    """Weights [K, C/g, R, S] -> the kernel's weight arguments, packed once (not timed):
    Winograd's transformed filters, or :func:`~dlas_predict.measure.kernels.cpu.
    pack_weights`' layouts."""
    if ks.algorithm is Algorithm.WINOGRAD:
        return pack_winograd_weights(ks, w)
    return pack_weights(ks, w)


def device_args(ks: KernelSpec, x: np.ndarray, w: np.ndarray, dev,
                extras: dict[str, np.ndarray] | None = None) -> list:
    """The kernel's call arguments on ``dev``: the input, the packed weights of ``w``, the
    epilogue's arguments (``extras`` by name: ``bias``, ``residual``), and a zeroed output
    buffer (last)."""
    extras = extras or {}
    missing = [n for n, _, _ in ks.extra_inputs() if n not in extras]
    if missing:
        raise ValueError(f"the epilogue needs {', '.join(missing)}")
    args = [x, *kernel_weights(ks, w),
            *(np.asarray(extras[n], dtype=dt).reshape(shape)
              for n, shape, dt in ks.extra_inputs())]
    return [tvm.runtime.tensor(a, dev) for a in args] + [
        tvm.runtime.tensor(np.zeros(output_shape(ks), dtype=ks.out_dtype), dev)]


def dense_prim_func(ks: KernelSpec) -> "tvm.tirx.PrimFunc":
    """The unscheduled TensorIR function of a dense kernel: what MetaSchedule tunes.

    Only spatial pack's data layout depends on knobs (``tile_k``, ``tile_h``, ``tile_w`` shape
    the packed tensors); the loop schedule is left to the tuner.
    """
    if ks.sparse:
        raise ValueError("CSR kernels have data-dependent loops; they are not TE computes")
    compute, _ = _dense(ks)
    return te.create_prim_func(compute(ks))


def kernel_module(ks: KernelSpec) -> tvm.IRModule:
    """The hand-scheduled TensorIR module of a kernel (not yet compiled)."""
    if ks.sparse or ks.knobs.get("pointwise"):
        from tvm.script import from_source

        script = SPARSE_KERNELS[ks.algorithm] if ks.sparse else pointwise_script
        return tvm.IRModule({"main": from_source(script(ks))})
    compute, schedule = _dense(ks)
    if ks.algorithm is Algorithm.SPATIAL_PACK:  # the output stage the hand schedule tiles
        compute = partial(spatial_pack_compute, tile_epilogue=True)
    elif not (uses_vnni(ks) or uses_pmaddwd(ks) or ks.algorithm is Algorithm.WINOGRAD):
        # extents the vector tiles do not divide, over whole tiles
        compute = partial(compute, tiles=True)
    sch = Schedule(te.create_prim_func(compute(ks)))
    schedule(sch, ks)
    return sch.mod


def build_kernel(ks: KernelSpec, target: "tvm.target.Target"):
    """Compile a kernel for ``target``; returns the executable (call ``ex["main"](...)``)."""
    return tvm.compile(kernel_module(ks), target=target)


def tvm_target(target_json: dict):
    """The TVM target of a target's JSON form (a registry entry's ``target``)."""
    import tvm

    return tvm.target.Target(target_json)
