"""The generic CPU schedule of every op of a network that is not one of our conv kernels:
injective stages inlined, outer loops fused and parallel, the contiguous inner loop
vectorised (unscheduled, TVM's legalised ops run serially)."""

from __future__ import annotations

import numpy as np
import tvm

from dlas_predict.networks.summary import GENERIC_LANES, whole_vector

#: Marks our conv kernels, so the generic scheduler leaves them alone and FuseOps treats them
#: as opaque (fusing an epilogue into a hand-scheduled kernel would unschedule it).
KERNEL_ATTR = "dlas.kernel"


# ---- generic schedules for everything that is not a conv ---------------------------------
def _selects(block) -> bool:
    """Whether a block stores a select (``if_then_else``): a padding stage."""
    body = block.body
    return (isinstance(body, tvm.tirx.BufferStore) and isinstance(body.value, tvm.ir.Call)
            and body.value.op.same_as(tvm.ir.Op.get("prim.if_then_else")))


def _reduces(sch, b) -> bool:
    return any(iv.iter_type != 0 for iv in sch.get(b).iter_vars)


def _elements(block) -> int:
    """Elements of the buffer a block writes."""
    return int(np.prod([int(d) for d in block.writes[0].source.shape]))


def _window_stage(sch, b) -> bool:
    """Whether a padding stage is worth keeping as a stage: a stride-1 window reduction (a
    padded pool) reads it, whose output is nearly as large as the padded input, so copying
    it once costs little beside the window's loads it frees of the bounds check (a strided
    pool's output is a quarter of it or less, and the copy costs more than it frees)."""
    if not _selects(sch.get(b)):
        return False
    size = _elements(sch.get(b))
    return any(_reduces(sch, c) and 2 * _elements(sch.get(c)) >= size
               for c in sch.get_consumers(b))


def _batched_product(block, n_spatial: int) -> bool:
    """Whether a reduction block is a product of batched matrices (attention's QKᵀ and its
    product with V: three spatial axes or more), not a pool's window or a classifier's
    matrix-vector product."""
    return str(block.name_hint).startswith("matmul") and n_spatial >= 3


def _concat_axis(block) -> int | None:
    """The axis along which a concatenation block (TVM's legalised concat, ``T_concat``: each
    element picks its input by a chain of comparisons on that axis) joins its inputs; None
    for any other block."""
    if not str(block.name_hint).startswith("T_concat"):
        return None
    out = [int(d) for d in block.writes[0].source.shape]
    for region in block.reads:
        shape = [int(d) for d in region.source.shape]
        differ = [i for i, (a, o) in enumerate(zip(shape, out)) if a != o]
        if len(shape) == len(out) and len(differ) == 1:
            return differ[0]
    return None


def schedule_generic(func: tvm.tirx.PrimFunc, lanes: int = GENERIC_LANES,
                     serial_below: int = 0) -> tvm.tirx.PrimFunc:
    """The generic CPU schedule of an op that is not one of our convs: injective producers
    inlined (but the padding a stride-1 pool reads), reductions vectorised on their
    contiguous spatial axis with the ops after them computed on each tile, elementwise
    stages vectorised, or parallel over rows where no whole vector divides them.
    ``serial_below``: an elementwise op whose every stage writes fewer elements runs on
    one thread (a recurrent step's gates: waking the thread pool costs more than them)."""
    from tvm.s_tir import Schedule

    sch = Schedule(func)
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    outputs = {str(sch.get(b).name_hint) for b in sch.get_output_blocks(root)}
    # the output shapes of concatenations, and the axis each joins along
    joins = {tuple(int(d) for d in sch.get(b).writes[0].source.shape): axis
             for b in blocks if (axis := _concat_axis(sch.get(b))) is not None}
    for b in blocks:  # inline injective producers into their consumers
        if str(sch.get(b).name_hint) in outputs:
            continue
        if _window_stage(sch, b):
            # the padding a stride-1 pool reads stays a stage: inlined, each of the
            # window's loads would carry the bounds check and keep its lanes from
            # vectorising
            continue
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001 - a reduction or an opaque block stays
            pass
    if serial_below and _serial(sch, root, lanes, serial_below):
        return sch.mod["main"].with_attr("tirx.is_scheduled", True)
    reductions = []
    for b in sch.get_child_blocks(root):
        block = sch.get(b)
        kinds = [iv.iter_type for iv in block.iter_vars]
        loops = sch.get_loops(b)
        if len(loops) != len(kinds) or not loops:
            continue
        n_spatial = 0
        for k in kinds:
            if k != 0:  # 0: data parallel
                break
            n_spatial += 1
        if n_spatial == 0:
            continue
        shape = tuple(int(sch.get(loop).extent) for loop in loops)
        axis = joins.get(shape)
        if n_spatial == len(kinds) and axis is not None and axis < len(shape) - 1:
            # a concatenation (and the elementwise ops after it): parallel over the axes up
            # to the one it joins along, the axes inside it one contiguous loop,
            # vectorised where whole vectors divide it; the chain of comparisons that picks
            # each element's input then runs once per row of that loop, not per element
            outer = sch.fuse(*loops[:axis + 1]) if axis > 0 else loops[0]
            inner = sch.fuse(*loops[axis + 1:]) if len(shape) - axis > 2 else loops[-1]
            vec = whole_vector(int(sch.get(inner).extent), lanes)
            if vec:
                sch.vectorize(sch.split(inner, [None, vec])[1])
            sch.parallel(outer)
            continue
        last = shape[n_spatial - 1]
        vec = whole_vector(last, lanes)
        if not vec and n_spatial < len(kinds) and _batched_product(block, n_spatial) \
                and last >= lanes:
            vec = lanes  # attention's product over a sequence no vector divides: a tail tile
        if n_spatial < len(kinds) and vec:
            # reduction (matmul, pooling): vectorise the contiguous spatial axis inside the
            # reduction loops, parallel over the rest
            outer, inner = sch.split(loops[n_spatial - 1], [None, vec])
            sch.reorder(*loops[:n_spatial - 1], outer, *loops[n_spatial:], inner)
            fused = sch.fuse(*loops[:n_spatial - 1], outer) if n_spatial > 1 else outer
            sch.parallel(fused)
            sch.decompose_reduction(b, loops[n_spatial])
            sch.unroll(inner)  # LLVM's SLP vectoriser turns the unrolled lanes into SIMD
            reductions.append((b, fused))
            continue
        if n_spatial == len(kinds) and vec and (n_spatial > 1 or last >= 4 * vec):
            # elementwise: vectorise the contiguous axis (whole vectors only, so every lane
            # is a contiguous load), parallel over everything outside it
            outer, inner = sch.split(loops[-1], [None, vec])
            sch.vectorize(inner)
            sch.parallel(sch.fuse(*loops[:-1], outer) if n_spatial > 1 else outer)
            continue
        rows = int(np.prod([int(sch.get(loop).extent) for loop in loops[:n_spatial - 1]]))
        if n_spatial == len(kinds) and rows > 1 and last > 1:
            # elementwise on a contiguous axis no whole vector divides (a padded stage's
            # rows): parallel over the rows, each row one inner loop
            sch.parallel(sch.fuse(*loops[:-1]))
            continue
        fused = sch.fuse(*loops[:n_spatial]) if n_spatial > 1 else loops[0]
        if int(sch.get(fused).extent) > 1:
            sch.parallel(fused)
    for b, fused in reductions:
        # the ops after a reduction (a pool's division, a residual add) run on each tile of
        # its output while it is in cache, in the same parallel loop
        for consumer in sch.get_consumers(b):
            try:
                sch.reverse_compute_at(consumer, fused)
            except Exception:  # noqa: BLE001 - left as its own loop nest, still correct
                continue
            try:
                sch.vectorize(sch.get_loops(consumer)[-1])
            except Exception:  # noqa: BLE001 - a tile that does not vectorise stays scalar
                pass
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _serial(sch, root, lanes: int, limit: int) -> bool:
    """Schedule a function of elementwise stages that each write fewer than ``limit``
    elements on one thread, its contiguous axis vectorised where whole vectors divide it;
    False (nothing done) for any other function."""
    blocks = sch.get_child_blocks(root)
    for b in blocks:
        block = sch.get(b)
        if (_elements(block) >= limit or any(iv.iter_type != 0 for iv in block.iter_vars)
                or len(sch.get_loops(b)) != len(block.iter_vars)):
            return False
    for b in blocks:
        loops = sch.get_loops(b)
        if not loops:
            continue
        last = int(sch.get(loops[-1]).extent)
        vec = whole_vector(last, lanes)
        if vec:
            sch.vectorize(sch.split(loops[-1], [None, vec])[1])
    return True


#: A recurrent network's step kernels (:func:`schedule_rest`'s ``serial_below``): elementwise
#: ops of fewer elements than this run on one thread.
STEP_ELEMENTS = 16384


def schedule_rest(mod: tvm.IRModule, serial_below: int = 0) -> tvm.IRModule:
    """Give every PrimFunc that is not one of our conv kernels the generic schedule
    (``serial_below``: :func:`schedule_generic`'s)."""
    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and KERNEL_ATTR not in (func.attrs or {}):
            try:
                out[gv] = schedule_generic(func, serial_below=serial_below)
            except Exception:  # noqa: BLE001 - left as legalised, still correct
                continue
    for gv, func in out.items():
        mod[gv] = func
    return mod
