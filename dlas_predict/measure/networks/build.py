"""Whole networks in TVM Relax, every convolution lowered to a chosen kernel of our own.

The ONNX network is imported with Relax's frontend. Each ``relax.nn.conv2d`` is replaced
(:func:`lower_convs`) by a ``call_tir`` to the scheduled kernel of
:mod:`dlas_predict.measure.kernels.cpu` that the plan names for that layer. Weights are packed
offline, in numpy, into the kernel's layout: CSR for sparse layers, with the layer's own (pruned)
zeros.

The ops that follow a conv, each the only user of the one before (:func:`plan_epilogues`): a
per-channel bias add, ReLU, the clamps of ReLU6, SiLU and one residual add, run in the
kernel's epilogue, on the output tile before it is stored, for every algorithm, dense and
CSR, in every dtype. A batch norm that is the only user of a conv's output is folded into the
conv's weights and bias first, as exporters do (:mod:`~dlas_predict.measure.networks.importer`). In a tuned build,
the spatial pack and CSR layers fuse theirs too (:meth:`TunedKernels.fuses`): the tuned
schedule of the bare convolution is replayed on the kernel with its epilogue. Each record
says what was fused (``details``: :func:`epilogue_details`).

- float16: ``ToMixedPrecision`` first, so the network runs in float16; convs use the float16
  kernels (float32 accumulation).
- int8: each conv's input is quantised per tensor with its calibrated scale, the int8 kernel
  accumulates in int32 and requantises with ``s_in * s_w / s_out``, and its output is
  dequantised; the ops between convs stay float32 (as a QNN graph with float glue). With a
  fused epilogue the kernel dequantises the accumulator (``s_in * s_w``) and returns float32.

Every other op gets a generic CPU schedule (injective stages inlined, outer loops fused and
parallel, contiguous inner loop vectorised). Unscheduled, TVM's legalised ops run serially.

This module imports TVM; it runs inside the isolated worker (:func:`run_network_task`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax, te

from dlas_predict.space.config import Algorithm, Compression, ConvSpec, DType, Variant
from dlas_predict.measure.kernels.cpu import pack_weights
from dlas_predict.measure.kernels.build import kernel_module, kernel_weights
from dlas_predict.measure.kernels.spec import KernelSpec, output_shape
from dlas_predict.measure.kernels.knobs import resolve_knobs
from dlas_predict.measure.networks.epilogues import Epilogue, dataflow, op_name, plan_epilogues
from dlas_predict.measure.networks.importer import relax_module
from dlas_predict.measure.networks.plans import as_input, first_output
from dlas_predict.measure.networks.schedules import KERNEL_ATTR, STEP_ELEMENTS, schedule_rest
from dlas_predict.networks.recurrent import ORIGINS_KEY as RECURRENT_KEY

if TYPE_CHECKING:
    from dlas_predict.measure.execution.tasks import NetworkTask

#: FuseOps' pattern of an opaque op, which our kernels (marked with ``schedules.KERNEL_ATTR``)
#: take: fusing an epilogue into a hand-scheduled kernel would unschedule it.
_OPAQUE = 8


@dataclass(frozen=True)
class LayerChoice:
    """The kernel of one conv layer."""

    algorithm: Algorithm
    sparse: bool

    @classmethod
    def from_dict(cls, d: dict) -> "LayerChoice":
        return cls(Algorithm.parse(d["algorithm"]), bool(d["sparse"]))


#: The compression a dense layer of each dtype is measured (and tuned) as.
DENSE_COMPRESSION = {DType.FLOAT32: Compression.DENSE, DType.FLOAT16: Compression.FLOAT16,
                     DType.INT8: Compression.INT8}


class BuildError(RuntimeError):
    """The network cannot be built as planned (reported as a recorded failure)."""


class TunedKernels:
    """A tuned whole network's source of schedules: the tuning database the layers were tuned
    into (``dlas-predict tune``), with the budget they were tuned with.

    A dense layer gets the best MetaSchedule trace of its workload, replayed on the network's
    own kernel (int8 layers differ from the tuned kernel only in their calibrated scale); a
    CSR layer gets the knobs its search chose. A dense layer whose search's best lost to the
    hand schedule (``TuneOutcome.kept``) keeps the hand schedule, counted as tuned. A layer
    the database does not hold keeps its hand schedule and is counted in ``untuned``.
    """

    def __init__(self, db: str, budget: int, fingerprint: str, target_json: dict, cores: int,
                 pattern: str = "unstructured", simd_bits: int | None = None) -> None:
        from dlas_predict.measure.kernels import tuning as tn

        self.db = tn.TuningDB(db)
        self.budget, self.fingerprint, self.target_json = budget, fingerprint, target_json
        self.target = tn.tuning_target(target_json, cores)
        self.pattern = pattern
        self.simd_bits = simd_bits
        self.tuned: list[int] = []
        self.untuned: list[int] = []

    def function(self, i: int, ks: KernelSpec, comp: Compression,
                 w: np.ndarray) -> "tvm.tirx.PrimFunc":
        from dataclasses import replace

        from dlas_predict.compression.netplan import kernel_ratio
        from dlas_predict.measure.kernels.build import dense_prim_func
        from dlas_predict.measure.kernels.sparse import sparsity

        ratio = kernel_ratio(sparsity(w)) if ks.sparse else 0.0
        asked, key = self._search(ks, comp, ratio)
        found = self.db.lookup(key)
        if found is None:
            self.untuned.append(i)
            return kernel_module(ks)["main"]
        if ks.sparse:
            self.tuned.append(i)
            return kernel_module(replace(ks, knobs={**ks.knobs, **found.knobs}))["main"]
        if found.kept == "hand":  # the hand schedule beat the search: tuning kept it
            self.tuned.append(i)
            return kernel_module(ks)["main"]
        from tvm.s_tir import Schedule
        from tvm.s_tir.meta_schedule.tir_integration import compile_tir

        sch_key = compile_tir(self.db.metaschedule(), dense_prim_func(asked), self.target)
        if sch_key is None:
            self.untuned.append(i)
            return kernel_module(ks)["main"]
        sch = Schedule(dense_prim_func(replace(ks, knobs={**ks.knobs, **asked.knobs})))
        try:
            sch_key.trace.apply_to_schedule(sch, remove_postproc=False)
        except (RuntimeError, ValueError):  # the trace does not replay with the epilogue
            self.untuned.append(i)
            return kernel_module(ks)["main"]
        self.tuned.append(i)
        return sch.mod["main"]

    def replaces_hand(self, spec: ConvSpec, choice: "LayerChoice", dtype: DType) -> bool:
        """Whether a search's schedule replaces the hand schedule of a dense layer of
        ``spec``: the database holds a search of it whose best beat the hand schedule (any
        other layer keeps its hand schedule, and with it its fused epilogue). CSR layers:
        True (their searched knobs depend on the pruned weights, and they fuse either
        way)."""
        if choice.sparse:
            return True
        _, key = self._search(KernelSpec(spec, choice.algorithm, False, dtype, {}),
                              DENSE_COMPRESSION[dtype], 0.0)
        found = self.db.lookup(key)
        return found is not None and found.kept != "hand"

    def _search(self, ks: KernelSpec, comp: Compression,
                ratio: float) -> tuple[KernelSpec, str]:
        """The kernel a layer of ``ks`` was searched as (the bare convolution, at the scale
        of random inputs, with the tuned knobs) and that search's database key."""
        from dataclasses import replace

        from dlas_predict.measure.kernels import tuning as tn
        from dlas_predict.measure.kernels.knobs import tuned_knobs

        asked = replace(ks, scale=None, epilogue=(), knobs=tuned_knobs(
            ks.conv, Variant(ks.algorithm, comp, ratio), self.budget, self.simd_bits))
        return asked, tn.tuning_key(self.fingerprint, asked, self.budget, self.target_json,
                                    (ratio, self.pattern) if ks.sparse else None)

    @staticmethod
    def fuses(choice: "LayerChoice") -> bool:
        """Whether a tuned layer of ``choice`` runs its epilogue in its kernel: a CSR layer
        (its hand schedule with the searched knobs) and a spatial pack (its epilogue is in
        the output stage the tuned schedule covers). A direct or GEMM layer's trace does not
        replay on a kernel with an epilogue block (it counts the blocks), so its epilogue
        stays a separate op, unless the database holds no search of it (:meth:`holds`)."""
        return choice.sparse or choice.algorithm is Algorithm.SPATIAL_PACK


def _call_spec(call: relax.Call) -> ConvSpec:
    """The workload of a ``relax.nn.conv2d`` call with constant weights."""
    attrs = call.attrs
    n, c, h, wd = (int(v) for v in call.args[0].ty.shape)
    k, _, r, s_ = (int(v) for v in call.args[1].ty.shape)
    pad = [int(p) for p in attrs.padding]
    return ConvSpec(C=c, H=h, W=wd, K=k, R=r, S=s_,
                    stride_h=int(attrs.strides[0]), stride_w=int(attrs.strides[1]),
                    pad_t=pad[0], pad_l=pad[1], pad_b=pad[2], pad_r=pad[3],
                    groups=int(attrs.groups), dilation_h=int(attrs.dilation[0]),
                    dilation_w=int(attrs.dilation[1]), N=n)


class _ConvLowering:
    """Lowers one ``relax.nn.conv2d`` (with the epilogue it fuses) to a ``call_tir`` of our
    kernel; convs are numbered in graph order, the plan's layer order."""

    def __init__(self, choices: list[LayerChoice], dtype: DType,
                 specs: list[ConvSpec] | None, scales: list[tuple[float, float]] | None,
                 tuned: TunedKernels | None = None, simd_bits: int | None = None,
                 fuse: bool = True, gpu: bool = False, fold_scales: bool = True,
                 vnni: bool = False):
        self.choices, self.dtype, self.specs, self.scales = choices, dtype, specs, scales
        self.tuned, self.simd_bits, self.fuse, self.gpu = tuned, simd_bits, fuse, gpu
        #: the CPU has AVX-512 VNNI: int8 GEMM layers use it (their default knobs)
        self.vnni = vnni
        #: fold a sigmoid gate's channel scale into the next conv's weights (with ``fuse``)
        self.fold_scales = fuse and fold_scales
        self.count = 0
        #: conv layers lowered with a fused epilogue, and the ops those epilogues replaced
        self.fused_layers = 0
        self.fused_steps = 0
        #: tuned layers whose epilogue stays a separate op (:meth:`TunedKernels.fuses`)
        self.separate_layers = 0
        #: convs whose input's channel scale was folded into their weights
        self.folded_scales = 0

    def hand_vnni(self, spec: ConvSpec, choice: "LayerChoice") -> bool:
        """Whether a layer runs AVX-512 VNNI (where the CPU has it): every layer that keeps
        its hand schedule, untuned, tuned with no search in the database, or tuned to the
        hand schedule; a layer of a search's schedule keeps the knobs it was tuned under (no
        VNNI)."""
        return self.vnni and (self.tuned is None
                              or not self.tuned.replaces_hand(spec, choice, self.dtype))

    def folds_scale(self, i: int, spec: ConvSpec) -> bool:
        """Whether conv ``i`` of workload ``spec`` takes a channel scale of its input into
        its weights (:func:`plan_scale_folds`): an untuned dense float kernel on a CPU."""
        return (not self.gpu and self.tuned is None and self.dtype is not DType.INT8
                and i < len(self.choices) and not self.choices[i].sparse
                and scale_fold_pays(spec))

    def next_index(self) -> int:
        i = self.count
        self.count += 1
        if i >= len(self.choices):
            raise BuildError(f"the network has more convolutions than the plan's "
                             f"{len(self.choices)} layers")
        return i

    def lower(self, bb: relax.BlockBuilder, i: int, call: relax.Call, data: relax.Expr,
              want: str, epi: Epilogue | None = None,
              residual: relax.Expr | None = None,
              channel_scale: relax.Expr | None = None) -> relax.Expr:
        weight = call.args[1]
        if not isinstance(weight, tvm.ir.expr.Constant):
            raise BuildError(f"conv {i}: weights are not constants; cannot pack them offline")
        attrs = call.attrs
        if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
            raise BuildError(f"conv {i}: layout {attrs.data_layout}/{attrs.kernel_layout}; "
                             "only NCHW/OIHW")
        w = weight.value.numpy()
        spec = _call_spec(call)
        if self.specs is not None and self.specs[i] != spec:
            raise BuildError(f"conv {i} is {spec.to_spec()} in TVM but "
                             f"{self.specs[i].to_spec()} in the plan")
        choice = self.choices[i]
        comp = Compression.WEIGHT_PRUNING if choice.sparse else DENSE_COMPRESSION[self.dtype]
        if choice.sparse and self.dtype is not DType.FLOAT32:
            raise BuildError("sparse kernels run in float32 only (the study's grid)")
        variant = Variant(choice.algorithm, comp, 0.5 if choice.sparse else 0.0)
        if self.gpu:
            from dlas_predict.measure.kernels.knobs import resolve_gpu_knobs

            knobs = resolve_gpu_knobs(spec, variant)
        else:
            knobs = resolve_knobs(spec, variant, self.simd_bits, self.hand_vnni(spec, choice))
        steps = tuple(epi.steps) if epi is not None else ()
        x = data
        scale = None
        if self.dtype is DType.INT8:
            s_in, s_out = self.scales[i]
            s_w = float(np.max(np.abs(w))) / 127.0 or 1.0
            w = np.clip(np.rint(w / s_w), -127, 127).astype(np.int8)
            # fused: the epilogue dequantises; otherwise the kernel requantises to s_out
            scale = s_in * s_w if steps else s_in * s_w / s_out
            x = bb.emit_te(_quantize, data, s_in, primfunc_name_hint=f"quantize{i}")
        elif self.dtype is DType.FLOAT16:
            w = w.astype(np.float16)
            if data.ty.dtype != "float16":
                x = bb.emit_te(lambda t: te.compute(t.shape, lambda *j: t(*j).astype("float16"),
                                                    name="cast"), data)
        ks = KernelSpec(spec, choice.algorithm, choice.sparse, self.dtype, knobs, scale, steps)
        if self.gpu:
            from dlas_predict.measure.kernels.cuda import gpu_prim_func

            func = gpu_prim_func(ks).without_attr("global_symbol").with_attr(
                "tirx.is_scheduled", True)
        elif self.tuned is not None:
            func = self.tuned.function(i, ks, comp, w).without_attr("global_symbol")
        else:
            func = kernel_module(ks)["main"].without_attr("global_symbol")
        func = func.with_attr(KERNEL_ATTR, 1).with_attr("op_pattern", _OPAQUE)
        gv = bb.add_func(func, f"conv{i}_{choice.algorithm.value}"
                               f"{'_csr' if choice.sparse else ''}"
                               f"{'_fused' if steps else ''}")
        packed = kernel_weights(ks, w)
        if choice.sparse and packed[0].size == 0:  # all-zero layer: keep buffers non-empty
            packed = [np.zeros(1, packed[0].dtype), np.zeros(1, np.int32), packed[2]]
        args = [x, *(relax.const(a) for a in packed)]
        if channel_scale is not None:  # the input's channel scale, folded into the weights
            args[1] = bb.emit_te(_scale_weights, args[1], relax.const(_weight_channels(ks)),
                                 channel_scale, primfunc_name_hint=f"scale_weights{i}")
            self.folded_scales += 1
        for name, _shape, dt in ks.extra_inputs():
            if name == "bias":
                args.append(relax.const(epi.bias.astype(dt)))
            else:
                r = residual
                if r.ty.dtype != dt:
                    r = bb.emit_te(lambda t, d=dt: te.compute(
                        t.shape, lambda *j: t(*j).astype(d), name="cast"), r)
                args.append(r)
        self.fused_layers += bool(steps)
        self.fused_steps += len(steps)
        y = bb.emit(relax.call_tir(gv, args, relax.TensorType(output_shape(ks), ks.out_dtype)))
        if output_shape(ks) != spec.output_shape:
            y = bb.emit_te(_reshape, y, spec.output_shape)
        if self.dtype is DType.INT8 and not steps:
            y = bb.emit_te(_dequantize, y, s_out, want, primfunc_name_hint=f"dequantize{i}")
        elif want != ks.out_dtype:
            y = bb.emit_te(lambda t: te.compute(t.shape, lambda *j: t(*j).astype(want),
                                                name="cast"), y)
        return y


@relax.expr_functor.mutator
class _LowerConvs(relax.PyExprMutator):
    """Replaces each conv, and the ops its kernel fuses, by the kernel's ``call_tir``.

    A fused kernel is emitted where the last op of its chain was, so a residual operand
    computed after the conv is ready by then."""

    def __init__(self, mod: tvm.IRModule, lowering: _ConvLowering, plans: dict,
                 folds: dict | None = None):
        super().__init__(mod)
        self.lowering = lowering
        self.plans = plans
        self.folds = folds or {}
        self.by_end = {p.end: p for p in plans.values() if p.steps}
        self.skip = {v for p in plans.values() if p.steps for v in [p.conv, *p.replaced[:-1]]}
        self.skip |= {m for m, _x, _s in self.folds.values()}
        self.pending: dict = {}

    def _input(self, conv: relax.Var, call: relax.Call) -> tuple:
        """A conv's data operand and the channel scale folded into its weights (or None)."""
        fold = self.folds.get(conv)
        if fold is None:
            return self.visit_expr(call.args[0]), None
        _m, x, scale = fold
        return self.visit_expr(x), self.visit_expr(scale)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var, value = binding.var, binding.value
        if op_name(value) == "relax.nn.conv2d":
            i = self.lowering.next_index()
            plan = self.plans.get(var)
            if plan is not None and plan.steps:
                self.pending[var] = (i, value)  # emitted at the chain's end
                return
            data, scale = self._input(var, value)
            y = self.lowering.lower(self.builder_, i, value, data, var.ty.dtype,
                                    channel_scale=scale)
            self._bind(var, y)
            return
        if var in self.skip:
            return
        plan = self.by_end.get(var)
        if plan is not None:
            i, call = self.pending.pop(plan.conv)
            residual = None if plan.residual is None else self.visit_expr(plan.residual)
            data, scale = self._input(plan.conv, call)
            y = self.lowering.lower(self.builder_, i, call, data, var.ty.dtype, plan,
                                    residual, channel_scale=scale)
            self._bind(var, y)
            return
        super().visit_var_binding_(binding)

    def _bind(self, var: relax.Var, y: relax.Expr) -> None:
        if not isinstance(var, relax.DataflowVar):
            y = self.builder_.emit_output(y)
        self.set_var_remap(var, y)


def lower_convs(mod: tvm.IRModule, lowering: _ConvLowering) -> tvm.IRModule:
    """Every conv of ``mod``'s Relax functions lowered by ``lowering``, with its epilogue
    fused unless ``lowering.fuse`` is off."""
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        plans = plan_epilogues(func) if lowering.fuse else {}
        if lowering.tuned is not None:  # plans are in graph order, the plan's layer order
            calls = {b.var: b.value for block in func.body.blocks for b in block.bindings
                     if isinstance(b, relax.VarBinding)}
            kept = {conv: plan for i, (conv, plan) in enumerate(plans.items())
                    if i >= len(lowering.choices) or TunedKernels.fuses(lowering.choices[i])
                    or not lowering.tuned.replaces_hand(_call_spec(calls[conv]),
                                                        lowering.choices[i], lowering.dtype)}
            lowering.separate_layers += sum(1 for conv, plan in plans.items()
                                            if plan.steps and conv not in kept)
            plans = kept
        folds = plan_scale_folds(func, plans, lowering) if lowering.fold_scales else {}
        mutator = _LowerConvs(mod, lowering, plans, folds)
        new = mutator.visit_expr(func)
        mod = mutator.builder_.get()
        mod[gv] = new
    return mod


def _quantize(t: te.Tensor, scale: float) -> te.Tensor:
    inv = tvm.tirx.const(1.0 / scale, "float32")
    lo, hi = tvm.tirx.const(-128.0, "float32"), tvm.tirx.const(127.0, "float32")
    return te.compute(t.shape, lambda *i: tvm.tirx.max(tvm.tirx.min(
        tvm.tirx.nearbyint(t(*i) * inv), hi), lo).astype("int8"), name="quantize")


def _dequantize(t: te.Tensor, scale: float, dtype: str) -> te.Tensor:
    s = tvm.tirx.const(scale, "float32")
    return te.compute(t.shape, lambda *i: (t(*i).astype("float32") * s).astype(dtype),
                      name="dequantize")


def _fast_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Sigmoid as the kernels' fused SiLU computes it (:func:`~.kernels.fast_sigmoid`, in
    float32): it vectorises, where libm's exp does not."""
    from dlas_predict.measure.kernels.spec import fast_sigmoid

    def sigmoid(t: te.Tensor) -> te.Tensor:
        if t.dtype == "float32":
            return te.compute(t.shape, lambda *i: fast_sigmoid(t(*i)), name="sigmoid")
        return te.compute(t.shape, lambda *i: fast_sigmoid(t(*i).astype("float32"))
                          .astype(t.dtype), name="sigmoid")

    return bb.call_te(sigmoid, call.args[0], primfunc_name_hint="sigmoid")


def _in_float32(fn, t: te.Tensor) -> te.Tensor:
    """``fn`` computed in float32 (a float16 tensor converted in and out)."""
    if t.dtype == "float32":
        return fn(t)
    y = fn(te.compute(t.shape, lambda *i: t(*i).astype("float32"), name="to_float32"))
    return te.compute(y.shape, lambda *i: y(*i).astype(t.dtype), name="from_float32")


def _fast_erf(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """erf as TVM's rational approximation (``topi.fast_erf``, float32): it vectorises,
    where libm's erf does not (a GELU's)."""
    from tvm import topi

    return bb.call_te(lambda t: _in_float32(topi.fast_erf, t), call.args[0],
                      primfunc_name_hint="erf")


def _fast_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """softmax with its exponential as TVM's polynomial (``topi.fast_exp``, float32),
    which vectorises, where libm's exp does not (attention's)."""
    from tvm import topi

    axis = int(call.attrs.axis)

    def softmax(t: te.Tensor) -> te.Tensor:
        e = topi.fast_exp(topi.subtract(t, topi.max(t, axis=axis, keepdims=True)))
        return topi.divide(e, topi.sum(e, axis=axis, keepdims=True))

    return bb.call_te(lambda t: _in_float32(softmax, t), call.args[0],
                      primfunc_name_hint="softmax")


def _tree_concat(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A concatenation whose every element picks its input by a balanced tree of
    comparisons (TVM's legalisation tests the inputs one after another: a recurrent
    network's sequence of steps, one input each, costs as many tests per element)."""
    t = call.args[0]
    while isinstance(t, relax.Var):
        binding = bb.lookup_binding(t)
        if not isinstance(binding, (relax.Tuple, relax.Var)):
            break
        t = binding
    fields = (list(t.fields) if isinstance(t, relax.Tuple) else
              [bb.emit(relax.TupleGetItem(t, i)) for i in range(len(t.ty.fields))])
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis)

    def concat(*tensors: te.Tensor) -> te.Tensor:
        ax = axis % len(tensors[0].shape)
        sizes = [int(x.shape[ax]) for x in tensors]
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        shape = list(tensors[0].shape)
        shape[ax] = starts[-1]

        def pick(idx, lo: int, hi: int):
            if hi - lo == 1:
                at = list(idx)
                at[ax] = idx[ax] - starts[lo]
                return tensors[lo](*at)
            mid = (lo + hi) // 2
            return tvm.tirx.if_then_else(idx[ax] < starts[mid], pick(idx, lo, mid),
                                         pick(idx, mid, hi))

        return te.compute(shape, lambda *idx: pick(idx, 0, len(tensors)), name="concat")

    return bb.call_te(concat, *fields, primfunc_name_hint="concatenate")


def scale_fold_pays(spec: ConvSpec) -> bool:
    """Whether scaling an ungrouped conv's weights per input channel costs no more
    multiplies than scaling its input: ``conv(x * s) = conv'(x)`` with filter ``k``'s
    channel ``c`` times ``s[c]``."""
    return spec.groups == 1 and spec.K * spec.R * spec.S <= spec.H * spec.W


def _weight_channels(ks: KernelSpec) -> np.ndarray:
    """The input channel of each element of ``ks``'s packed dense weights (int32)."""
    c = ks.conv
    channels = np.broadcast_to(np.arange(c.C, dtype=np.int32)[None, :, None, None],
                               (c.K, c.C, c.R, c.S))
    return pack_weights(ks, channels)[0].astype(np.int32)


def _scale_weights(w: te.Tensor, channel: te.Tensor, scale: te.Tensor) -> te.Tensor:
    """Packed weights ``w`` with each element times the scale [1, C, 1, 1] of its input
    channel (``channel``, in ``w``'s layout)."""
    return te.compute(w.shape, lambda *j: w(*j) * scale[0, channel(*j), 0, 0].astype(w.dtype),
                      name="scale_weights")


def plan_scale_folds(func: relax.Function, plans: dict, lowering: "_ConvLowering") -> dict:
    """The channel scales ``func``'s convs take into their weights: conv var -> (the
    ``x * s`` binding's var, ``x``, ``s``) where ``s`` [1, C, 1, 1] is a sigmoid's output
    (a squeeze-excitation's gate) scaling ``x`` [1, C, H, W], the product's one user is the
    conv, and :meth:`_ConvLowering.folds_scale` holds. The product is then never computed."""
    bindings, users, outputs = dataflow(func)
    claimed = {v for p in plans.values() for v in p.replaced}
    values = {b.var: b.value for b in bindings}
    folds = {}
    i = -1
    for b in bindings:
        if op_name(b.value) != "relax.nn.conv2d":
            continue
        i += 1
        m = b.value.args[0]
        call = values.get(m)
        if (op_name(call) != "relax.multiply" or m in claimed or m in outputs
                or len(users.get(m, [])) != 1 or not isinstance(m, relax.DataflowVar)):
            continue
        shape = [int(d) for d in m.ty.shape]
        pair = [a for a in call.args if isinstance(a, relax.Var)]
        if len(pair) != 2:
            continue
        shapes = [[int(d) for d in a.ty.shape] if getattr(a.ty, "shape", None) is not None
                  else None for a in pair]
        gate = [1, shape[1], 1, 1]
        if shapes[0] == shape and shapes[1] == gate:
            x, scale = pair
        elif shapes[1] == shape and shapes[0] == gate:
            scale, x = pair
        else:
            continue
        if (shape[2] * shape[3] == 1 or op_name(values.get(scale)) != "relax.sigmoid"
                or not lowering.folds_scale(i, _call_spec(b.value))):
            continue
        folds[b.var] = (m, x, scale)
    return folds


def _reshape(t: te.Tensor, shape: tuple[int, ...]) -> te.Tensor:
    from tvm import topi

    return topi.reshape(t, shape)


def epilogue_details(lowering: _ConvLowering) -> dict:
    """What a build's record says of its epilogues: ``fused`` (some conv ran its bias,
    activation or residual add in its kernel), ``separate`` (fusion off, or a tuned build
    whose every epilogue stayed its own op), or ``none`` (nothing followed a conv that it
    could fuse); how many layers and ops were fused, and how many tuned layers kept their
    epilogue separate."""
    if not lowering.fuse:
        kind = "separate"
    elif lowering.fused_layers:
        kind = "fused"
    else:
        kind = "separate" if lowering.separate_layers else "none"
    return {"epilogue": kind, "fused_layers": lowering.fused_layers,
            "fused_ops": lowering.fused_steps, "separate_layers": lowering.separate_layers,
            "folded_gates": lowering.folded_scales}


def _with_kernels(model, input_name: str, input_shape: tuple[int, ...],
                  lowering: _ConvLowering) -> tvm.IRModule:
    """The network's Relax module (in float16 for a float16 plan) with every conv lowered
    by ``lowering``; the plan must have a layer per conv (and int8, a scale pair each)."""
    choices, dtype = lowering.choices, lowering.dtype
    mod = relax_module(model, input_name, input_shape)
    if dtype is DType.FLOAT16:
        mod = relax.transform.ToMixedPrecision(out_dtype="float16")(mod)
        mod = relax.transform.FoldConstant()(mod)
    if dtype is DType.INT8 and (lowering.scales is None
                                or len(lowering.scales) != len(choices)):
        raise BuildError("int8 needs one calibrated (input, output) scale pair per conv")
    mod = lower_convs(mod, lowering)
    if lowering.count != len(choices):
        raise BuildError(f"the plan has {len(choices)} conv layers, the network "
                         f"{lowering.count}")
    return mod


def lower(model, input_name: str, input_shape: tuple[int, ...], dtype: DType,
          choices: list[LayerChoice], specs: list[ConvSpec] | None = None,
          scales: list[tuple[float, float]] | None = None,
          tuned: TunedKernels | None = None, simd_bits: int | None = None,
          fuse: bool = True, stats: dict | None = None,
          fold_scales: bool = True, vnni: bool = False) -> tvm.IRModule:
    """The Relax module with every conv lowered to its kernel (register tiles sized for a CPU
    of ``simd_bits``; the bias, activation and residual add that follow it fused into its
    epilogue, and a sigmoid gate's channel scale before it folded into its weights
    (:func:`plan_scale_folds`), unless ``fuse`` is off) and every other op scheduled; int8
    GEMM layers on AVX-512 VNNI where ``vnni``.
    ``stats``, if given, receives the epilogue fusion's counts (:func:`epilogue_details`)."""
    lowering = _ConvLowering(choices, dtype, specs, scales, tuned, simd_bits, fuse=fuse,
                             fold_scales=fold_scales, vnni=vnni)
    mod = _with_kernels(model, input_name, input_shape, lowering)
    # an unrolled recurrent network: its steps' small elementwise kernels run serially, and
    # the concatenation of its steps selects each input by a tree of comparisons
    steps = any(p.key == RECURRENT_KEY for p in getattr(model, "metadata_props", ()))
    mod = relax.transform.LegalizeOps(customize_legalize_map={
        "relax.sigmoid": _fast_sigmoid, "relax.erf": _fast_erf,
        "relax.nn.softmax": _fast_softmax,
        **({"relax.concat": _tree_concat} if steps else {})})(mod)
    if stats is not None:
        stats.update(epilogue_details(lowering))
    mod = tvm.transform.Sequential([
        relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
        relax.transform.FuseOps(), relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination()])(mod)
    return schedule_rest(mod, serial_below=STEP_ELEMENTS if steps else 0)


def _static_dim(expr: relax.Expr, axis: int) -> int | None:
    """Extent ``axis`` of a tensor expression when it is a known constant, else None."""
    shape = getattr(expr.ty, "shape", None)
    try:
        dims = list(shape)
        return int(dims[axis]) if -len(dims) <= axis < len(dims) else None
    except (TypeError, ValueError, RuntimeError):
        return None


def unit_matmuls(mod: tvm.IRModule) -> tvm.IRModule:
    """Rewrite each matmul whose reduction has one element as the broadcast product it is.
    dlight's GPU reduction rules schedule such a matmul with a fused bias add wrongly (the
    bias is added twice, measured on an H200: a channel-pruned network whose classifier
    reads one feature), and the product needs no reduction."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    def rewriter(call: relax.Call, _matches: dict) -> relax.Expr:
        a, b = call.args
        if _static_dim(a, -1) == 1 and _static_dim(b, -2) == 1:
            return relax.op.multiply(a, b)
        return call

    pattern = is_op("relax.matmul")(wildcard(), wildcard())
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = rewrite_call(pattern, rewriter, func)
    return mod


def lower_cuda(model, input_name: str, input_shape: tuple[int, ...], dtype: DType,
               choices: list[LayerChoice], target: "tvm.target.Target",
               specs: list[ConvSpec] | None = None,
               scales: list[tuple[float, float]] | None = None) -> tvm.IRModule:
    """The Relax module of a network for a CUDA GPU: every conv lowered to our CUDA kernel
    (:func:`dlas_predict.measure.kernels.cuda.gpu_prim_func`, its bias and activation left as ops of
    their own), every other op given dlight's default GPU schedule (thread-bound loops,
    reductions across a block's threads)."""
    from tvm.s_tir import dlight as dl

    mod = _with_kernels(model, input_name, input_shape,
                        _ConvLowering(choices, dtype, specs, scales, fuse=False, gpu=True))
    mod = unit_matmuls(mod)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination()])(mod)
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                       dl.gpu.Fallback())(mod)


def build(model, input_name: str, input_shape: tuple[int, ...], dtype: DType,
          choices: list[LayerChoice], target, specs=None, scales=None, tuned=None,
          simd_bits: int | None = None, fuse: bool = True, stats: dict | None = None,
          fold_scales: bool = True, vnni: bool = False):
    """Compile; returns the executable (run it with :class:`_Runnable`)."""
    mod = lower(model, input_name, input_shape, dtype, choices, specs, scales, tuned,
                simd_bits, fuse, stats, fold_scales, vnni)
    return tvm.compile(mod, target=target)


class _Runnable:
    """A compiled network where the worker runs code: a Relax VM on this CPU, or on a
    board (uploaded, loaded there, and driven through ``set_input`` and
    ``invoke_stateful``: a VM called directly over RPC fails on the argument types)."""

    def __init__(self, executable, target_json: dict) -> None:
        from dlas_predict.measure.execution.remote import execution

        run = execution()
        self.dev, self.remote = run.dev, run.remote
        self.vm = relax.VirtualMachine(run.load(executable, target_json), self.dev)

    def __call__(self, x):
        if not self.remote:
            return self.vm["main"](x)
        self.vm.set_input("main", x)
        self.vm.invoke_stateful("main")
        return self.vm.get_outputs("main")

    def timer(self, number: int, repeat: int):
        if not self.remote:
            t = self.vm.time_evaluator("main", self.dev, number=number, repeat=repeat)
            return lambda x: t(x).results
        t = self.vm.time_evaluator("invoke_stateful", self.dev, number=number, repeat=repeat)

        def run(x):
            self.vm.set_input("main", x)
            return t("main").results

        return run



def run_network_task(task: "NetworkTask") -> dict[str, Any]:
    """Worker entry: build the planned network, check it against the reference outputs,
    and time it with the study's protocol."""
    import onnx

    from dlas_predict.measure.execution.tasks import plan_timing
    from dlas_predict.measure.execution.contention import timed_fields
    from dlas_predict.measure.kernels.build import tvm_target

    model = onnx.load(task.onnx)
    dtype = task.dtype
    choices = [LayerChoice(Algorithm.parse(a), bool(s)) for a, s in task.layers]
    specs = list(task.specs) or None
    scales = [tuple(s) for s in task.scales] if task.scales else None
    shape = tuple(task.input_shape)
    tuned = None
    if task.tuning is not None:
        opts = task.tuning
        tuned = TunedKernels(opts.db, opts.budget, task.fingerprint, task.target, opts.cores,
                             opts.pattern, task.simd_bits)
    t0 = time.perf_counter()
    engine: dict[str, Any] = {}
    executable = build(model, task.input_name, shape, dtype, choices,
                       tuned.target if tuned else tvm_target(task.target), specs, scales, tuned,
                       task.simd_bits, stats=engine, vnni=task.vnni)
    result: dict[str, Any] = {"compile_s": time.perf_counter() - t0, "details": engine}
    if tuned is not None:
        result.update(tuned_layers=tuned.tuned, untuned_layers=tuned.untuned)
    vm = _Runnable(executable, task.target)
    dev = vm.dev
    check = np.load(task.check)
    xs, refs = check["x"], check["y"]
    outs = []
    for i in range(len(xs)):
        out = first_output(vm(tvm.runtime.tensor(as_input(xs[i]), dev)))
        outs.append(np.asarray(out.numpy(), dtype=np.float64).reshape(-1))
    outs_a, refs_a = np.stack(outs), refs.reshape(len(refs), -1).astype(np.float64)
    err = float(np.max(np.abs(outs_a - refs_a)))
    scale = max(1.0, float(np.max(np.abs(refs_a))))
    agree = float(np.mean(outs_a.argmax(1) == refs_a.argmax(1)))
    tol = {DType.FLOAT32: 1e-3}.get(dtype)
    result.update(max_error=err, relative_error=err / scale, top1_agreement=agree,
                  verified=bool(err <= tol * scale) if tol else bool(agree >= 0.9))
    if vm.remote and not result["verified"]:
        raise RuntimeError(f"wrong results on the board: max error {err:.3g}, top-1 "
                           f"agreement {agree:.0%} against onnxruntime (not timed)")
    x = tvm.runtime.tensor(as_input(xs[0]), dev)
    t0 = time.perf_counter()
    vm(x)
    single = time.perf_counter() - t0
    proto = task.protocol
    number, repeats = plan_timing(single, proto)
    timer = vm.timer(number, repeats)
    result.update(number=number, repeats=repeats,
                  **timed_fields(lambda: timer(x), task.target, proto, task.fingerprint,
                                 task.simd_bits))
    return result
