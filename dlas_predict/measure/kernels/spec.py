"""A kernel's specification (:class:`KernelSpec`: workload, algorithm, CSR or not, data type,
knobs, fused epilogue) and the fast math its epilogue evaluates (a polynomial exp and sigmoid,
in TE and in TVMScript). Shared by the dense CPU kernels (``cpu``), the CSR ones (``csr``)
and the CUDA ones (``cuda``)."""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from dlas_predict.space.config import Algorithm, ConvSpec, DType
from dlas_predict.measure.kernels.knobs import vnni_capable
from dlas_predict.measure.kernels.reference import int8_scale


ACC_DTYPE = {DType.FLOAT32: "float32", DType.FLOAT16: "float32", DType.INT8: "int32"}


@dataclass(frozen=True)
class KernelSpec:
    """What to build: a workload, an algorithm, dense or CSR, a dtype, and schedule knobs."""

    conv: ConvSpec
    algorithm: Algorithm
    sparse: bool
    dtype: DType
    knobs: dict
    #: int8 only: the requantisation scale (accumulator -> int8 output). None: the scale of
    #: :func:`dlas_predict.measure.kernels.reference.int8_scale`, for random inputs; whole networks
    #: pass their calibrated ``s_in * s_w / s_out``. With an epilogue: the dequantisation scale
    #: ``s_in * s_w`` (accumulator -> float32).
    scale: float | None = None
    #: The fused epilogue, applied in float32 to each output element while it is in registers:
    #: steps ``("bias",)`` (per output channel, an extra float32 [K] argument),
    #: ``("residual",)`` (an extra [1, K, OH, OW] argument of the network's dtype, added),
    #: ``("relu",)``, ``("max", c)``, ``("min", c)`` (clamps: ReLU6 is max 0 then min 6) and
    #: ``("silu",)``, in order. Empty: the bare convolution. An int8 kernel with an epilogue
    #: returns float32 (dequantised, not requantised).
    epilogue: tuple = ()

    @property
    def requant_scale(self) -> float:
        return int8_scale(self.conv) if self.scale is None else float(self.scale)

    @property
    def out_dtype(self) -> str:
        if self.epilogue and self.dtype is DType.INT8:
            return "float32"
        return self.dtype.value

    @property
    def residual_dtype(self) -> str:
        return "float16" if self.dtype is DType.FLOAT16 else "float32"

    def extra_inputs(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of the epilogue's arguments, after the weights."""
        ops = {step[0] for step in self.epilogue}
        out = []
        if "bias" in ops:
            out.append(("bias", (self.conv.K,), "float32"))
        if "residual" in ops:
            out.append(("residual", self.conv.output_shape, self.residual_dtype))
        return out


def uses_vnni(ks: KernelSpec) -> bool:
    """An int8 GEMM kernel whose ``vnni`` knob is set (:func:`~dlas_predict.measure.kernels.knobs.
    vnni_capable`): AVX-512 VNNI's ``vpdpbusd`` sums four products per int32 lane."""
    return vnni_capable(ks) and bool(ks.knobs.get("vnni"))


def uses_pmaddwd(ks: KernelSpec) -> bool:
    """An int8 GEMM kernel whose ``pmaddwd`` knob is set: AVX2's ``vpmaddwd`` sums two
    int16 products per int32 lane (:mod:`dlas_predict.measure.kernels.vnni`)."""
    return vnni_capable(ks) and bool(ks.knobs.get("pmaddwd"))


def output_shape(ks: KernelSpec) -> tuple[int, ...]:
    """Shape of the kernel's output buffer; always the same memory layout as NCHW (a dense
    GEMM without a fused epilogue writes its natural [1, K, OH*OW])."""
    spec = ks.conv
    if ks.algorithm is Algorithm.GEMM and not ks.sparse and not ks.epilogue:
        return (1, spec.K, spec.OH * spec.OW)
    return spec.output_shape


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


EPILOGUE_STEPS = ("bias", "residual", "relu", "max", "min", "silu")


_LOG2E = 1.44269504088896341
#: ln 2 in two parts (Cephes), so ``n * ln 2`` is subtracted without losing ``r``'s bits
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
#: exp(x) = 2**n * e**r with n = round(x / ln 2) and |r| <= ln 2 / 2, e**r by Cephes' expf
#: polynomial (relative error under 1e-6 in float32). LLVM calls libm's scalar ``expf`` for
#: ``exp`` lane by lane; this form vectorises.
_EXP_CLAMP = 88.3762626647949


_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def fast_exp(x):
    """``exp(x)`` of a float32 TIR expression, as FMAs and an exponent shift (no libm call)."""
    tir = tvm.tirx

    def const(v):
        return tir.const(v, "float32")

    x = tir.max(tir.min(x, const(_EXP_CLAMP)), const(-_EXP_CLAMP))
    n = tir.floor(x * const(_LOG2E) + const(0.5))
    r = x - n * const(_LN2_HI) - n * const(_LN2_LO)
    p = const(_EXP_POLY[0])
    for coef in _EXP_POLY[1:]:
        p = p * r + const(coef)
    pow2 = tir.reinterpret("float32", tir.shift_left(n.astype("int32") + tir.const(127, "int32"),
                                                     tir.const(23, "int32")))
    return pow2 * (p * r * r + r + const(1.0))


#: sigmoid(x) = 1/2 + x P(x^2) / Q(x^2), a rational least-squares fit on |x| <= 16 with
#: absolute error under 1e-6 evaluated in float32; the input is clamped to 15.75, where it
#: is 2.4e-7 from 0 or 1 (the true sigmoid 1.4e-7), so past it a SiLU is off by about two
#: float32 roundings of its input. Eleven FMAs and a division per lane against the sixteen
#: operations and one of ``1 / (1 + fast_exp(-x))``.
_SIGMOID_BOUND = 15.75


_SIGMOID_P = (0.24999752485375207, -0.019594305082563056, 0.0018489075831897208,
              7.587417263793711e-05, 3.410463103551773e-07, 1.2911197971598988e-10)


_SIGMOID_Q = (1.0, 0.004942097699361777, -0.0005199109020404272, 0.0010609990128949802,
              1.3022516934214862e-05, 2.0168176715079546e-08)


def _sigmoid(x, const, clamp):
    """The formula of :func:`fast_sigmoid` over the operations it is given: TIR expressions
    for the TE kernels, TVMScript text (:class:`_Script`) for the CSR ones."""
    x = clamp(x, const(-_SIGMOID_BOUND), const(_SIGMOID_BOUND))
    t = x * x
    p, q = const(_SIGMOID_P[-1]), const(_SIGMOID_Q[-1])
    for coef in _SIGMOID_P[-2::-1]:
        p = p * t + const(coef)
    for coef in _SIGMOID_Q[-2::-1]:
        q = q * t + const(coef)
    return x * p / q + const(0.5)


def fast_sigmoid(x):
    """``1 / (1 + exp(-x))`` of a float32 TIR expression as a rational function: FMAs and
    one division per lane, no libm call (LLVM lowers ``exp`` to a scalar ``expf`` per lane)."""
    tir = tvm.tirx
    return _sigmoid(x, lambda v: tir.const(v, "float32"),
                    lambda v, lo, hi: tir.max(tir.min(v, hi), lo))


class _Script(str):
    """TVMScript text of a float32 expression, combined by ``+``, ``-`` and ``*``."""

    def __add__(self, other):
        return _Script(f"({self} + {other})")

    def __sub__(self, other):
        return _Script(f"({self} - {other})")

    def __mul__(self, other):
        return _Script(f"({self} * {other})")

    def __truediv__(self, other):
        return _Script(f"({self} / {other})")


def fast_sigmoid_script(x: str) -> str:
    """:func:`fast_sigmoid` as a TVMScript expression of the float32 expression ``x``."""
    return _sigmoid(_Script(f"({x})"), lambda v: _Script(f"T.float32({v!r})"),
                    lambda v, lo, hi: _Script(f"T.max(T.min({v}, {hi}), {lo})"))


def script_epilogue(ks: KernelSpec, scale: float) -> str:
    """The output expression of a TVMScript kernel (CSR, pointwise), a template of ``{x}``
    (the accumulator) and ``{k}``, ``{h}``, ``{w}`` (the output element): as the TE kernels'
    epilogue, in TVMScript."""
    dt = ks.dtype
    if not ks.epilogue:
        if dt is DType.INT8:
            return ('T.Cast("int8", T.max(T.min(T.nearbyint(T.Cast("float32", {x}) * '
                    f'T.float32({scale!r})), T.float32(127.0)), T.float32(-128.0)))')
        return 'T.Cast("float16", {x})' if dt is DType.FLOAT16 else "{x}"
    y = "{x}" if dt is DType.FLOAT32 else 'T.Cast("float32", {x})'
    if dt is DType.INT8:
        y = f"({y} * T.float32({scale!r}))"
    for step in ks.epilogue:
        op = step[0]
        if op == "bias":
            y = f"({y} + bias[{{k}}])"
        elif op == "residual":
            y = f'({y} + T.Cast("float32", residual[0, {{k}}, {{h}}, {{w}}]))'
        elif op == "relu":
            y = f"T.max({y}, T.float32(0.0))"
        elif op in ("max", "min"):
            y = f"T.{op}({y}, T.float32({float(step[1])!r}))"
        elif op == "silu":
            y = f"({y} * {fast_sigmoid_script(y)})"
        else:
            raise ValueError(f"unknown epilogue step {step!r}")
    return f'T.Cast("float16", {y})' if ks.out_dtype == "float16" else y
