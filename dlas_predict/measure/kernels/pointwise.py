"""The float32 GEMM of a pointwise (1×1, stride 1, unpadded, ungrouped) convolution as
register tiles that overlap at the ends instead of padding.

A 1×1 convolution in NCHW is the product ``out[K, P] = weight[K, C] @ data[C, P]`` over the
``P = H·W`` positions, which lie contiguous in each input channel. Each register tile holds
``tile_k`` filters by ``tile_p`` positions (whole vectors): every step of the reduction loads
the tile's positions of one channel and multiplies them by each filter's weight, broadcast.
Where ``tile_p`` does not divide ``P`` (7×7, 14×14 maps) the last tile of a row starts at
``P − tile_p`` and computes again a few positions of the tile before it, writing the same
values; so does the last block of filters. (The TE GEMM, which runs every other layer and
this one under ``pointwise=0``, pads the positions: it copies the input into a padded im2col
matrix, then writes the cropped output as a separate stage.) Tasks run over blocks of
filters, each sweeping its row of tiles while its weights stay in cache; a layer of few
blocks also splits the row into chunks, so both threads have work.

Written in TVMScript: an index that moves the last tile back is no affine split of a TE
loop. The fused epilogue is the TE kernels' (:func:`~dlas_predict.measure.kernels.spec.
script_epilogue`). Which layers run it, and their tiles:
:func:`~dlas_predict.measure.kernels.knobs.pointwise_tile`.
"""

from __future__ import annotations

from dlas_predict.measure.kernels.spec import KernelSpec, ceil_div, output_shape, script_epilogue

#: The fewest tasks a layer's tiles are split into where its blocks of filters are fewer.
MIN_TASKS = 16


def pointwise_script(ks: KernelSpec) -> str:
    """The kernel's TVMScript: ``data`` [1, C, H, W], ``weight`` [K, C] (the GEMM's
    rows), the epilogue's inputs, then the output (of :func:`~dlas_predict.measure.kernels.
    spec.output_shape`'s shape)."""
    spec = ks.conv
    tk, tp = ks.knobs["tile_k"], ks.knobs["tile_p"]
    c, k, p = spec.C, spec.K, spec.OH * spec.OW
    if p < tp or k < tk:
        raise ValueError(f"a {tk}x{tp} tile does not fit {k} filters by {p} positions")
    blocks, tiles = ceil_div(k, tk), ceil_div(p, tp)
    chunks = min(tiles, ceil_div(MIN_TASKS, blocks))
    per_chunk = ceil_div(tiles, chunks)
    chunks = ceil_div(tiles, per_chunk)
    extra_args = "".join(f'\n         {name}_in: T.Buffer({shape!r}, "{dtype}"),'
                         for name, shape, dtype in ks.extra_inputs())
    # the residual viewed as [1, K, 1, P], so the epilogue reads it at (k, 0, q)
    views = "".join(f'\n    {name} = T.decl_buffer('
                    f'{(1, k, 1, p) if name == "residual" else shape!r}, "{dtype}", '
                    f'data={name}_in.data)' for name, shape, dtype in ks.extra_inputs())
    epi = script_epilogue(ks, ks.requant_scale).format(
        x="acc[ki, i]", k="k0 + ki", h="0", w="q0 + i")
    return f'''
# from tvm.script import tirx as T
@T.prim_func
def main(data_in: T.Buffer({spec.input_shape!r}, "float32"),
         weight: T.Buffer(({k}, {c}), "float32"),{extra_args}
         out_in: T.Buffer({output_shape(ks)!r}, "{ks.out_dtype}")):
    T.func_attr({{"tirx.noalias": True}})
    data = T.decl_buffer(({c}, {p}), "float32", data=data_in.data)
    out = T.decl_buffer(({k}, {p}), "{ks.out_dtype}", data=out_in.data){views}
    for task in T.parallel({blocks * chunks}):
        for t in range({per_chunk}):
            k0 = T.min(task // {chunks} * {tk}, {k - tk})
            q0 = T.min((task % {chunks} * {per_chunk} + t) * {tp}, {p - tp})
            acc = T.alloc_buffer(({tk}, {tp}), "float32", scope="local")
            for ki in T.unroll({tk}):
                for i in T.vectorized({tp}):
                    acc[ki, i] = T.float32(0)
            for rc in range({c}):
                for ki in T.unroll({tk}):
                    for i in T.vectorized({tp}):
                        acc[ki, i] = acc[ki, i] + weight[k0 + ki, rc] * data[rc, q0 + i]
            for ki in range({tk}):
                for i in T.vectorized({tp}):
                    out[k0 + ki, q0 + i] = {epi}
'''
