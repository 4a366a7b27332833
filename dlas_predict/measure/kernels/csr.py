"""The study's CSR-sparse convolution kernels: direct, gemm and spatial pack as TVMScript loops
over the nonzeros of each filter (a TE reduction cannot depend on data), with the dense
kernels' fused epilogue (:func:`SPARSE_KERNELS` by algorithm)."""

from __future__ import annotations

from dlas_predict.space.config import Algorithm, DType
from dlas_predict.measure.kernels.spec import ACC_DTYPE, KernelSpec, ceil_div, script_epilogue


SPARSE_HEADER = '''
# from tvm.script import tirx as T
@T.prim_func
def main(data: T.Buffer(({C_}, {C}, {H}, {W}), "{dt}"), w_data_h: T.handle,
         w_indices_h: T.handle, w_indptr: T.Buffer(({K1},), "int32"),{extra}
         out: T.Buffer((1, {K}, {OH}, {OW}), "{odt}")):
    T.func_attr({{"tirx.noalias": True}})
    nnz = T.int32()
    w_data = T.match_buffer(w_data_h, (nnz,), "{dt}")
    w_indices = T.match_buffer(w_indices_h, (nnz,), "int32")
'''


def _sparse_terms(ks: KernelSpec) -> dict:
    spec, dt = ks.conv, ks.dtype
    acc = ACC_DTYPE[dt]
    load = 'T.Cast("int32", {x})' if dt is DType.INT8 else (
        'T.Cast("float32", {x})' if dt is DType.FLOAT16 else "{x}")
    extra = "".join(f'\n         {name}: T.Buffer({shape!r}, "{dtype}"),'
                    for name, shape, dtype in ks.extra_inputs())
    return {
        "C_": 1, "C": spec.C, "H": spec.H, "W": spec.W, "K": spec.K, "K1": spec.K + 1,
        "OH": spec.OH, "OW": spec.OW, "dt": dt.value, "acc": acc, "zero": f'T.{acc}(0)',
        "RS": spec.R * spec.S, "S": spec.S, "R": spec.R, "sh": spec.stride_h,
        "sw": spec.stride_w, "dh": spec.dilation_h, "dw": spec.dilation_w,
        "pt": spec.pad_t, "pl": spec.pad_l, "Cg": spec.C // spec.groups,
        "Kg": spec.K // spec.groups, "epi": script_epilogue(ks, ks.requant_scale),
        "load": load, "odt": ks.out_dtype, "extra": extra,
    }


def csr_decode(t: dict, indent: str) -> str:
    """Statements decoding nonzero ``jj`` of row ``k`` into (c, r, s) and its value."""
    return (f"{indent}jj = w_indptr[k] + j\n"
            f"{indent}col = w_indices[jj]\n"
            f"{indent}c = (k // {t['Kg']}) * {t['Cg']} + col // {t['RS']}\n"
            f"{indent}r = col % {t['RS']} // {t['S']}\n"
            f"{indent}s = col % {t['S']}\n"
            f"{indent}val = {t['load'].format(x='w_data[jj]')}\n")


def _pad_loop(t: dict, hp: int, wp: int) -> str:
    """Zero-padded copy of the input, parallel over channels."""
    return f'''
    pad = T.alloc_buffer(({t["C"]}, {hp}, {wp}), "{t["dt"]}")
    for c in T.parallel({t["C"]}):
        for h, w in T.grid({hp}, {wp}):
            pad[c, h, w] = T.if_then_else({t["pt"]} <= h and h < {t["pt"] + t["H"]} and
                                          {t["pl"]} <= w and w < {t["pl"] + t["W"]},
                                          data[0, c, h - {t["pt"]}, w - {t["pl"]}],
                                          T.{t["dt"]}(0))
'''


def _direct_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    vl = ks.knobs["tile_w"]
    owp = ceil_div(spec.OW, vl) * vl
    hp = spec.H + spec.pad_t + spec.pad_b
    wp = max(spec.W + spec.pad_l + spec.pad_r,
             (owp - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1)
    x = (f"pad[c, h * {t['sh']} + r * {t['dh']}, "
         f"(wc * {vl} + v) * {t['sw']} + s * {t['dw']}]")
    return SPARSE_HEADER.format(**t) + _pad_loop(t, hp, wp) + f'''
    for kh in T.parallel({spec.K * spec.OH}):
        acc = T.alloc_buffer(({owp},), "{t["acc"]}", scope="local")
        k = kh // {spec.OH}
        h = kh % {spec.OH}
        for wc in range({owp // vl}):
            for v in T.vectorized({vl}):
                acc[wc * {vl} + v] = {t["zero"]}
        for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 12)}            for wc in range({owp // vl}):
                for v in T.vectorized({vl}):
                    acc[wc * {vl} + v] = acc[wc * {vl} + v] + val * {t["load"].format(x=x)}
        for w in range({spec.OW}):
            out[0, k, h, w] = {t["epi"].format(x="acc[w]", k="k", h="h", w="w")}
'''


def _gemm_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    tp = ks.knobs["tile_p"]
    p = spec.OH * spec.OW
    pp = ceil_div(p, tp) * tp
    crs = (spec.C // spec.groups) * spec.R * spec.S
    rows = spec.groups * crs
    x = f"col[(k // {t['Kg']}) * {crs} + w_indices[jj], pb * {tp} + v]"
    return SPARSE_HEADER.format(**t) + f'''
    col = T.alloc_buffer(({rows}, {pp}), "{t["dt"]}")
    for gj in T.parallel({rows}):
        for q in range({pp}):
            g = gj // {crs}
            jcol = gj % {crs}
            ci = g * {t["Cg"]} + jcol // {t["RS"]}
            hh = q // {spec.OW} * {t["sh"]} + jcol % {t["RS"]} // {t["S"]} * {t["dh"]} - {t["pt"]}
            ww = q % {spec.OW} * {t["sw"]} + jcol % {t["S"]} * {t["dw"]} - {t["pl"]}
            col[gj, q] = T.if_then_else(q < {p} and 0 <= hh and hh < {spec.H} and
                                        0 <= ww and ww < {spec.W},
                                        data[0, ci, T.max(T.min(hh, {spec.H - 1}), 0),
                                             T.max(T.min(ww, {spec.W - 1}), 0)],
                                        T.{t["dt"]}(0))
    for kp in T.parallel({spec.K * (pp // tp)}):
        acc = T.alloc_buffer(({tp},), "{t["acc"]}", scope="local")
        k = kp // {pp // tp}
        pb = kp % {pp // tp}
        for v in T.vectorized({tp}):
            acc[v] = {t["zero"]}
        for j in range(w_indptr[k + 1] - w_indptr[k]):
            jj = w_indptr[k] + j
            val = {t["load"].format(x="w_data[jj]")}
            for v in T.vectorized({tp}):
                acc[v] = acc[v] + val * {t["load"].format(x=x)}
        for v in range({tp}):
            if pb * {tp} + v < {p}:
                out[0, k, (pb * {tp} + v) // {spec.OW}, (pb * {tp} + v) % {spec.OW}] = {
                    t["epi"].format(x="acc[v]", k="k", h=f"(pb * {tp} + v) // {spec.OW}",
                                    w=f"(pb * {tp} + v) % {spec.OW}")}
'''


def _spatial_pack_sparse(ks: KernelSpec) -> str:
    spec, t = ks.conv, _sparse_terms(ks)
    vh_, vw_ = ks.knobs["tile_h"], ks.knobs["tile_w"]
    oht, owt = ceil_div(spec.OH, vh_), ceil_div(spec.OW, vw_)
    vh_in = (vh_ - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1
    vw_in = (vw_ - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1
    x = (f"data_vec[ho, wo, c, vh * {t['sh']} + r * {t['dh']}, "
         f"vw * {t['sw']} + s * {t['dw']}]")
    return SPARSE_HEADER.format(**t) + f'''
    data_vec = T.alloc_buffer(({oht}, {owt}, {spec.C}, {vh_in}, {vw_in}), "{t["dt"]}")
    for ho in T.parallel({oht}):
        for wo, c, ih, iw in T.grid({owt}, {spec.C}, {vh_in}, {vw_in}):
            hh = ho * {vh_ * spec.stride_h} + ih - {t["pt"]}
            ww = wo * {vw_ * spec.stride_w} + iw - {t["pl"]}
            data_vec[ho, wo, c, ih, iw] = T.if_then_else(
                0 <= hh and hh < {spec.H} and 0 <= ww and ww < {spec.W},
                data[0, c, T.max(T.min(hh, {spec.H - 1}), 0), T.max(T.min(ww, {spec.W - 1}), 0)],
                T.{t["dt"]}(0))
    for kt in T.parallel({spec.K * oht}):
        acc = T.alloc_buffer(({vh_}, {vw_}), "{t["acc"]}", scope="local")
        k = kt // {oht}
        ho = kt % {oht}
        for wo in range({owt}):
            for vh in T.unroll({vh_}):
                for vw in T.vectorized({vw_}):
                    acc[vh, vw] = {t["zero"]}
            for j in range(w_indptr[k + 1] - w_indptr[k]):
{csr_decode(t, " " * 16)}                for vh in T.unroll({vh_}):
                    for vw in T.vectorized({vw_}):
                        acc[vh, vw] = acc[vh, vw] + val * {t["load"].format(x=x)}
            for vh, vw in T.grid({vh_}, {vw_}):
                if ho * {vh_} + vh < {spec.OH} and wo * {vw_} + vw < {spec.OW}:
                    out[0, k, ho * {vh_} + vh, wo * {vw_} + vw] = {
                        t["epi"].format(x="acc[vh, vw]", k="k", h=f"ho * {vh_} + vh",
                                        w=f"wo * {vw_} + vw")}
'''


#: CSR kernels: the TVMScript source of each algorithm's kernel.
SPARSE_KERNELS = {Algorithm.DIRECT: _direct_sparse, Algorithm.GEMM: _gemm_sparse,
                  Algorithm.SPATIAL_PACK: _spatial_pack_sparse}
