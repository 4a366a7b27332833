"""The ops that follow a conv and run in its kernel's epilogue: each the only user of the one
before, a per-channel bias add, ReLU, the clamps of ReLU6, SiLU and one residual add
(:func:`plan_epilogues`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax


@dataclass
class Epilogue:
    """The elementwise ops after one conv that its kernel runs on the output tile: the steps
    (:attr:`KernelSpec.epilogue`), the bias and the residual operand, and the bindings they
    replace (the conv's first, the chain's last)."""

    conv: relax.Var
    steps: list = field(default_factory=list)
    bias: np.ndarray | None = None
    residual: relax.Var | None = None
    replaced: list = field(default_factory=list)

    @property
    def end(self) -> relax.Var:
        return self.replaced[-1] if self.replaced else self.conv


def _used_vars(expr, out: list) -> None:
    if isinstance(expr, relax.Var):
        out.append(expr)
    elif isinstance(expr, relax.Call):
        for a in expr.args:
            _used_vars(a, out)
    elif isinstance(expr, relax.Tuple):
        for f in expr.fields:
            _used_vars(f, out)
    elif isinstance(expr, relax.TupleGetItem):
        _used_vars(expr.tuple_value, out)
    elif isinstance(expr, relax.SeqExpr):
        _used_vars(expr.body, out)


def op_name(expr) -> str:
    """The operator of a call to a Relax op, else ''."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return str(expr.op.name)
    return ""


def _scalar(expr, values: dict) -> float | None:
    """The value of a constant of one value, seen through a cast (ToMixedPrecision casts
    the bounds of a ReLU6 to float16 and leaves the cast unfolded)."""
    bound = values.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(bound) == "relax.astype" and isinstance(bound.args[0], tvm.ir.expr.Constant):
        expr = bound.args[0]
    if isinstance(expr, tvm.ir.expr.Constant):
        v = expr.value.numpy()
        if v.size >= 1 and v.min() == v.max():
            return float(v.flat[0])
    return None


def _per_channel(expr, k: int) -> np.ndarray | None:
    """A constant that broadcasts along the channel axis of [1, K, H, W] only, as [K]."""
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    v = expr.value.numpy().astype(np.float32)
    if v.size == 1:
        return np.full(k, v.flat[0], np.float32)
    if v.size == k and v.shape in ((1, k, 1, 1), (k, 1, 1)):
        return v.reshape(k)
    return None


def dataflow(func: relax.Function) -> tuple[list, dict, set]:
    """``func``'s dataflow bindings in order, the bindings using each var, and the vars its
    result uses."""
    bindings = [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock)
                for b in block.bindings if isinstance(b, relax.VarBinding)]
    users: dict = {}
    for b in (b for block in func.body.blocks for b in block.bindings):
        used: list = []
        _used_vars(b.value, used)
        for v in used:
            users.setdefault(v, []).append(b)
    outputs: list = []
    _used_vars(func.body.body, outputs)
    return bindings, users, set(outputs)


def plan_epilogues(func: relax.Function) -> dict:
    """For each conv binding of ``func``'s dataflow blocks, the chain of ops it can fuse
    (conv var -> :class:`Epilogue`): a per-channel bias add, ReLU, clamps (ReLU6), SiLU
    (``x * sigmoid(x)``) and one residual add of a tensor of the output's shape, in any
    order, each op the only user of the one before it."""
    bindings, users, output_set = dataflow(func)
    binding_set = set(b.var for b in bindings)
    values = {b.var: b.value for b in bindings}
    claimed: set = set()
    plans = {}
    for b in bindings:
        call = b.value
        if op_name(call) != "relax.nn.conv2d":
            continue
        shape = [int(d) for d in b.var.ty.shape]
        dtype = b.var.ty.dtype
        plan = Epilogue(b.var)
        cur = b.var
        while cur not in output_set:
            uses = users.get(cur, [])
            nxt = _next_step(cur, uses, plan, shape, dtype, binding_set, claimed, values)
            if nxt is None:
                break
            step, new_vars = nxt
            plan.steps.append(step)
            plan.replaced.extend(new_vars)
            claimed.update(new_vars)
            cur = new_vars[-1]
        plans[b.var] = plan
    return plans


def _same_tensor(var, shape, dtype) -> bool:
    ty = var.ty
    return (isinstance(ty, relax.TensorType) and ty.dtype == dtype and ty.shape is not None
            and [int(d) for d in ty.shape] == shape)


def _next_step(cur, uses, plan: Epilogue, shape, dtype, bindings, claimed, values):
    """(step, the bindings it replaces) if ``cur``'s users continue the chain, else None."""
    if any(u.var in claimed or u.var not in bindings for u in uses):
        return None
    if len(uses) == 2:  # SiLU: s = sigmoid(cur); y = cur * s
        sig = next((u for u in uses if op_name(u.value) == "relax.sigmoid"), None)
        mul = next((u for u in uses if op_name(u.value) == "relax.multiply"), None)
        if sig is None or mul is None or not _same_tensor(mul.var, shape, dtype):
            return None
        args = list(mul.value.args)
        if not (any(a.same_as(cur) for a in args) and any(a.same_as(sig.var) for a in args)):
            return None
        return ("silu",), [sig.var, mul.var]
    if len(uses) != 1:
        return None
    (u,) = uses
    call = u.value
    op = op_name(call)
    if not op or not _same_tensor(u.var, shape, dtype):
        return None
    ops = {s[0] for s in plan.steps}
    if op == "relax.nn.relu":
        return ("relu",), [u.var]
    if op == "relax.nn.silu":
        return ("silu",), [u.var]
    if op in ("relax.maximum", "relax.minimum"):
        other = [a for a in call.args if not a.same_as(cur)]
        c = _scalar(other[0], values) if len(other) == 1 else None
        return None if c is None else ((op[len("relax."):len("relax.") + 3], c), [u.var])
    if op == "relax.add":
        other = [a for a in call.args if not a.same_as(cur)]
        if len(other) != 1:
            return None
        bias = _per_channel(other[0], shape[1])
        if bias is not None and "bias" not in ops:
            plan.bias = bias
            return ("bias",), [u.var]
        if (isinstance(other[0], relax.Var) and "residual" not in ops
                and _same_tensor(other[0], shape, dtype)):
            plan.residual = other[0]
            return ("residual",), [u.var]
    return None
