"""Schedule knobs of every kernel, and the untuned defaults chosen from the shape.

Pure Python (no TVM), so the collector can compute a measurement's key without compiling.
Each kernel exposes its knobs; the untuned schedule is what these defaults give, and a tuner
may search over other values (see :data:`KNOB_NAMES`).
"""

from __future__ import annotations

from dlas_predict.space.config import Algorithm, ConvSpec, DType, Variant
from dlas_predict.errors import ConfigError

#: The knobs each (algorithm, sparse) kernel takes.
KNOB_NAMES: dict[tuple[Algorithm, bool], tuple[str, ...]] = {
    (Algorithm.DIRECT, False): ("tile_k", "tile_w", "tile_h"),
    (Algorithm.GEMM, False): ("tile_k", "tile_p", "pointwise"),
    (Algorithm.SPATIAL_PACK, False): ("tile_k", "tile_h", "tile_w"),
    (Algorithm.WINOGRAD, False): ("tile", "tile_k", "tile_p"),
    (Algorithm.DIRECT, True): ("tile_w",),
    (Algorithm.GEMM, True): ("tile_p",),
    (Algorithm.SPATIAL_PACK, True): ("tile_h", "tile_w"),
}
#: Winograd's output tiles: F(2×2, 3×3) and F(4×4, 3×3).
WINOGRAD_TILES = (2, 4)

def winograd_extents(spec: ConvSpec, knobs: dict[str, int]) -> tuple[int, int, int, int]:
    """(transformed tile side m+2, filters per vector, output tiles, tiles padded to whole
    register blocks) of a Winograd kernel with ``knobs``
    (:mod:`dlas_predict.measure.kernels.winograd`)."""
    m, kb, tp = knobs["tile"], knobs["tile_k"], knobs["tile_p"]
    tiles = -(-spec.OH // m) * -(-spec.OW // m)
    return m + 2, kb, tiles, -(-tiles // tp) * tp


def winograd_weight_bytes(spec: ConvSpec, knobs: dict[str, int]) -> int:
    """The bytes of a Winograd kernel's transformed filters: (m+2)² float32 of each input
    channel and filter, the filters padded to whole vectors."""
    a, kb, _, _ = winograd_extents(spec, knobs)
    return a * a * -(-spec.K // kb) * kb * spec.C * 4


def registers(simd_bits: int | None) -> tuple[int, int]:
    """(32-bit lanes of a vector register, accumulators a register tile may hold) for a CPU
    of ``simd_bits`` (None: 512). Every kernel accumulates in 32 bits (float32 for float16,
    int32 for int8). A tile keeps half the vector registers for accumulators: 16 of
    AVX-512's 32 zmm, 8 of the 16 ymm (AVX2) or xmm (SSE, NEON) registers, so the loaded
    inputs and weights fit beside them without spilling."""
    bits = int(simd_bits or 512)
    return max(4, bits // 32), 16 if bits >= 512 else 8


def _divisor_at_most(n: int, limit: int, prefer: tuple[int, ...] = ()) -> int:
    """The preferred value dividing ``n`` if any, else the largest divisor of n <= limit."""
    for p in prefer:
        if p <= limit and n % p == 0:
            return p
    for d in range(min(n, limit), 0, -1):
        if n % d == 0:
            return d
    return 1


def _vector_tile(extent: int, lanes: int) -> int:
    """The vector tile along a contiguous output axis of ``extent``: a divisor of it of at
    least half a vector (the whole axis if it fits in one), so no tile is padded; where
    there is none (11, 13, 22 on eight lanes), a whole vector or a half one, whichever
    takes fewer vector operations over the axis padded to whole tiles (the kernel
    computes the padding and crops it): a divisor of 1 or 2 would leave the loop
    scalar."""
    tile = _divisor_at_most(extent, lanes, prefer=(lanes, lanes // 2))
    if tile >= min(extent, lanes // 2):
        return tile
    return min((lanes, lanes // 2), key=lambda v: (-(-extent // v), _ceil_to(extent, v)))


def _filter_tile(spec: ConvSpec, acc: int, prefer: tuple[int, ...]) -> int:
    """The block of filters of a dense direct or GEMM register tile (``acc`` accumulator
    rows at most): a divisor of K (``prefer``'s first that divides, else the largest); where
    the largest is under four (K = 59, 118) and the conv is ungrouped, the block of at least
    four that pads K least (the kernel computes whole blocks and crops the padding), ties
    going to ``prefer``'s order, then the larger block: a block of one or two filters loads
    each input vector for one or two multiply-adds."""
    tile = _divisor_at_most(spec.K, acc, prefer=prefer)
    if tile >= min(4, spec.K) or spec.groups != 1:
        return tile
    order = {t: i for i, t in enumerate(prefer)}
    return min(range(4, acc + 1),
               key=lambda t: (_ceil_to(spec.K, t), order.get(t, len(order)), -t))


def filters_computed(spec: ConvSpec, tile_k: int | None) -> int:
    """The filters a dense direct or GEMM kernel computes with blocks of ``tile_k``: an
    ungrouped conv's K rounded up to whole blocks (the kernel crops the padded ones), a
    grouped conv's K (its blocks divide it)."""
    if spec.groups != 1 or not tile_k:
        return spec.K
    return _ceil_to(spec.K, tile_k)


def vnni_capable(kernel, spec: ConvSpec | None = None) -> bool:
    """Whether a CPU kernel (a :class:`Variant` of workload ``spec``, or a ``KernelSpec``)
    takes the ``vnni`` knob: dense int8 GEMM of an ungrouped conv, whose four reduction
    elements per int32 lane AVX-512 VNNI's ``vpdpbusd`` sums (its im2col words hold four
    input channels, which a grouped conv's group may not fill)."""
    spec = spec if spec is not None else kernel.conv
    return (kernel.dtype is DType.INT8 and kernel.algorithm is Algorithm.GEMM
            and not kernel.sparse and spec.groups == 1)


def pointwise_shape(spec: ConvSpec) -> bool:
    """A 1×1, stride-1, unpadded, ungrouped convolution: a plain GEMM over the input as
    it lies."""
    return (spec.R == spec.S == 1 and spec.stride_h == spec.stride_w == 1
            and spec.groups == 1
            and not (spec.pad_t or spec.pad_l or spec.pad_b or spec.pad_r))


#: Accumulators of the pointwise GEMM's register tile, by whether the CPU has AVX-512's 32
#: vector registers: each step of its reduction holds only the tile's input vectors and
#: one broadcast weight beside them, so it takes 12 of AVX2's (or SSE's) 16 registers (6 ×
#: 16 ran ×1.1-1.2 faster than 4 × 16 on a Zen 5 forced to AVX2) and half of AVX-512's
#: (8 × 32 ran as fast as 12 × 32 and faster than 14 × 32).
POINTWISE_ACCUMULATORS = {False: 12, True: 16}


def pointwise_tile(spec: ConvSpec, dtype: DType,
                   simd_bits: int | None = None) -> tuple[int, int] | None:
    """The register tile (filters, positions) of the overlapping-tile GEMM
    (:mod:`dlas_predict.measure.kernels.pointwise`, the ``pointwise`` knob) for a float32
    layer of shape ``spec`` on a CPU of ``simd_bits``: two vectors of positions by as many
    filters as :data:`POINTWISE_ACCUMULATORS` hold, or one vector where the map holds
    fewer than two; None where the layer is no pointwise GEMM, or its map or filters are
    fewer than one tile (the TE GEMM runs those)."""
    if dtype is not DType.FLOAT32 or not pointwise_shape(spec):
        return None
    lanes = registers(simd_bits)[0]
    acc = POINTWISE_ACCUMULATORS[lanes >= 16]
    p = spec.OH * spec.OW
    vectors = 2 if p >= 2 * lanes else 1
    tile_k = acc // vectors
    if p < lanes or spec.K < tile_k:
        return None
    return tile_k, vectors * lanes


#: The int32 lanes (output positions, ``tile_p``) of a VNNI GEMM's accumulators: an AVX-512
#: register, or half of one.
VNNI_LANES = (8, 16)
#: The fewest output positions a default VNNI GEMM computes: fewer would leave most of its
#: lanes padding, and the plain int8 GEMM's vectors are narrower.
VNNI_MIN_POSITIONS = 8


def _vnni_knobs(spec: ConvSpec, simd_bits: int | None) -> dict[str, int]:
    """The VNNI GEMM's defaults: a register tile of up to 16 filters (16 or 12 where they
    divide K, else the largest divisor within the accumulators, or the block that pads K
    least), one accumulator vector of 16 positions each (8 where fewer than 12 positions
    would leave half of 16 lanes padding)."""
    p = spec.OH * spec.OW
    acc = registers(simd_bits)[1]
    return {"tile_k": _filter_tile(spec, acc, (16, 12)), "tile_p": 16 if p >= 12 else 8,
            "vnni": 1}


#: The int32 lanes of the pmaddwd GEMM's accumulators: an AVX2 register.
PMADDWD_LANES = 8


def _pmaddwd_knobs(spec: ConvSpec, simd_bits: int | None) -> dict[str, int]:
    """The pmaddwd GEMM's defaults: a register tile of up to 12 filters (12 or 8 where they
    divide K), one accumulator vector of 8 positions each."""
    return {"tile_k": _filter_tile(spec, min(registers(simd_bits)[1], 12), (12, 8)),
            "tile_p": PMADDWD_LANES, "pmaddwd": 1}


def default_knobs(spec: ConvSpec, variant: Variant, simd_bits: int | None = None,
                  vnni: bool = False) -> dict[str, int]:
    """The untuned schedule's knobs for ``variant`` on ``spec``, chosen from the shape and the
    vector width of the CPU it runs on (``simd_bits``; None: 512).

    Rules a performance engineer would apply by hand: vector tiles along the contiguous axis
    sized to the SIMD width (a divisor of the extent where one is wide enough, else the
    extent padded to whole tiles, so no tail predicate blocks vectorisation), output-channel
    blocks that keep the accumulators in registers
    (:func:`registers`: sized for AVX-512, an AVX2 tile of the same shape spills and runs
    2-4x slower).
    """
    if (vnni and vnni_capable(variant, spec)
            and spec.OH * spec.OW >= VNNI_MIN_POSITIONS):
        return _vnni_knobs(spec, simd_bits)
    lanes, acc = registers(simd_bits)
    kg = spec.K // spec.groups
    p = spec.OH * spec.OW
    key = (variant.algorithm, variant.sparse)
    if key == (Algorithm.DIRECT, False) and spec.depthwise:
        return _depthwise_knobs(spec, lanes, acc)
    if key == (Algorithm.DIRECT, False):
        tile_w = _vector_tile(spec.OW, lanes)
        return {"tile_k": _filter_tile(spec, acc, (8, 16, 4) if tile_w >= 8 else (16, 8, 4)),
                "tile_w": tile_w}
    if key == (Algorithm.GEMM, False):
        tile = pointwise_tile(spec, variant.dtype, simd_bits)
        if tile is not None:
            return {"tile_k": tile[0], "tile_p": tile[1], "pointwise": 1}
        return _te_gemm_knobs(spec, lanes, acc)
    if key == (Algorithm.SPATIAL_PACK, False):
        if kg >= 8:
            tile_k = _divisor_at_most(kg, 2 * lanes, prefer=(2 * lanes, lanes, 8))
            if spec.groups == 1:
                # an ungrouped conv may pad its last block with zero filters (a channel-
                # pruned layer keeps any number of them): whole vectors where that takes
                # fewer vector updates than the largest divisor's blocks, and always where
                # that divisor is no whole vector (31 filters on 16 lanes run 10-17x slower
                # than 32 with one padded: the odd-width vector is split into pieces)
                tile_k = pack_block_by_updates(kg, lanes)
                if tile_k not in (2 * lanes, lanes, 8):
                    tile_k = min((2 * lanes, lanes),
                                 key=lambda b: _pack_block_cost(spec, b, lanes, acc))
            return {"tile_k": tile_k, "tile_h": 1,
                    "tile_w": balanced_width(spec.OW, _pack_width(spec, tile_k, lanes, acc))}
        # depthwise / narrow groups: vectorise along output width instead.
        return {"tile_k": _divisor_at_most(kg, 4), "tile_h": 2 if spec.OH > 1 else 1,
                "tile_w": min(lanes, _pow2_at_least(spec.OW))}
    if key == (Algorithm.WINOGRAD, False):
        # F(4×4, 3×3) multiplies 4x fewer times than a direct 3×3 conv, F(2×2) 2.25x: the
        # larger tile unless the output holds fewer than two of its tiles a side (its
        # transformed weights, 4x the filters', then outweigh the work saved); filters in
        # vector blocks (the last padded with zeros), a register tile of all the output's
        # tiles where they fit the accumulators (no padded tile is computed), else half
        tile = 4 if min(spec.OH, spec.OW) >= 8 else 2
        tiles = -(-spec.OH // tile) * -(-spec.OW // tile)
        return {"tile": tile, "tile_k": lanes, "tile_p": tiles if tiles <= acc else acc // 2}
    if key == (Algorithm.DIRECT, True):
        return {"tile_w": min(lanes, _pow2_at_least(spec.OW))}
    if key == (Algorithm.GEMM, True):
        return {"tile_p": min(4 * lanes, _pow2_at_least(p))}
    if key == (Algorithm.SPATIAL_PACK, True):
        return {"tile_h": 2 if spec.OH > 1 else 1, "tile_w": min(lanes, _pow2_at_least(spec.OW))}
    raise ConfigError(f"no kernel for {variant.algorithm.value} (sparse={variant.sparse})")


#: Output positions a depthwise direct task computes at least, in channels of small maps.
DEPTHWISE_TASK_POSITIONS = 64


def _depthwise_knobs(spec: ConvSpec, lanes: int, acc: int) -> dict[str, int]:
    """A depthwise direct kernel's defaults: one input plane per output channel, a tile of
    two rows by vector columns, padded to whole tiles. At stride 1 the row's tile takes
    the fewest vector operations over the row, then pads it least, of two vectors, one, a
    half or a quarter (of at least four lanes): a row of 4 or 8 columns takes a tile of its
    width, where a whole vector would compute mostly padding. At larger strides (strided
    loads) the wider of one vector or half of one that pads the row least, or four lanes
    for a row of four or fewer. Two channels a task at stride 1, one at larger strides, or
    enough channels for :data:`DEPTHWISE_TASK_POSITIONS` outputs where the map is smaller
    (a 4×4 map: four channels)."""
    unit = spec.stride_w == 1
    if unit:
        widths = [v for v in (2 * lanes, lanes, lanes // 2, lanes // 4) if v >= 4]
        tile_w = min(widths, key=lambda v: (-(-spec.OW // v) * -(-v // lanes),
                                            _ceil_to(spec.OW, v), -v))
    else:
        widths = [lanes, max(lanes // 2, 4)] + ([4] if spec.OW <= 4 else [])
        tile_w = min(widths, key=lambda v: (_ceil_to(spec.OW, v), -v))
    tile_h = 2 if spec.OH > 1 else 1
    per_task = max(2 if unit else 1, min(DEPTHWISE_TASK_POSITIONS // (spec.OH * spec.OW),
                                         acc // (tile_h * -(-tile_w // lanes))))
    return {"tile_k": _divisor_at_most(spec.K, per_task), "tile_h": tile_h, "tile_w": tile_w}


def _te_gemm_knobs(spec: ConvSpec, lanes: int, acc: int) -> dict[str, int]:
    """The TE GEMM's defaults: a block of filters by one vector tile of positions."""
    return {"tile_k": _filter_tile(spec, acc, (8, 4, 16)),
            "tile_p": _vector_tile(spec.OH * spec.OW, lanes)}


def pack_block_by_updates(k: int, lanes: int) -> int:
    """The block of ``k`` (at least eight) filters of fewest vector updates among the largest
    divisor of ``k`` up to two vectors and whole vectors of ``lanes`` (the last block
    padded), ties to the divisor, then the larger block: a dense ungrouped spatial pack's
    block before :func:`default_knobs` replaces one that is no whole vector."""
    tile_k = _divisor_at_most(k, 2 * lanes, prefer=(2 * lanes, lanes, 8))

    def updates(block: int, padded: bool) -> tuple[int, int, int]:
        n = -(-k // block) * -(-block // lanes) if block >= 4 else k
        return n, int(padded), -block

    return min([(tile_k, False), (2 * lanes, True), (lanes, True)],
               key=lambda c: updates(*c))[0]


def _pack_width(spec: ConvSpec, tile_k: int, lanes: int, acc: int) -> int:
    """Spatial pack's register tile width for blocks of ``tile_k`` filters: the columns
    whose accumulators (a vector of filters each) fit, at most 16 (8 on rows under 16
    wide), and no wider than the row rounded up to a power of two."""
    vectors = -(-tile_k // lanes)  # accumulators per output column
    tile_w = max(1, min(acc // vectors, 16 if spec.OW >= 16 else 8))
    return min(tile_w, _pow2_at_least(spec.OW))


def widest_pack_tile(spec: ConvSpec, tile_k: int, simd_bits: int | None = None) -> int:
    """Spatial pack's widest register tile for blocks of ``tile_k`` filters on a CPU of
    ``simd_bits`` (:func:`_pack_width`), which :func:`balanced_width` narrows."""
    lanes, acc = registers(simd_bits)
    return _pack_width(spec, tile_k, lanes, acc)


def balanced_width(columns: int, width: int) -> int:
    """The narrowest register tile that covers a row of ``columns`` in as many tiles as
    ``width`` does: the tiles split the row evenly, so the last computes no more padding
    than it must (a row of 9 columns in two tiles of 5, not two of 8; one of 18 in two of
    9, not two of 16)."""
    tiles = -(-columns // width)
    return -(-columns // tiles)


def _pack_block_cost(spec: ConvSpec, block: int, lanes: int, acc: int) -> tuple[int, int]:
    """What a row of spatial pack's register tiles with blocks of ``block`` filters (the last
    padded) executes per reduction step: each tile's vector multiply-adds plus its loads (a
    weight vector per accumulator row, an input broadcast per column), over the blocks and
    the row padded to whole tiles; ties go to the larger block."""
    width = _pack_width(spec, block, lanes, acc)
    vectors = -(-block // lanes)
    tiles = -(-spec.K // block) * -(-spec.OW // width)
    return tiles * (vectors * width + vectors + width), -block


def depthwise_extents(spec: ConvSpec, tile_h: int, tile_w: int) -> tuple[int, int, int, int]:
    """(output rows, output columns, padded input rows, columns per phase) of the depthwise
    direct kernel: the output padded to whole ``tile_h`` × ``tile_w`` tiles, and its padded
    input, split into ``stride_w`` column phases, tall and wide enough for them."""
    ohp, owp = _ceil_to(spec.OH, tile_h), _ceil_to(spec.OW, tile_w)
    hp = max(spec.H + spec.pad_t + spec.pad_b,
             (ohp - 1) * spec.stride_h + (spec.R - 1) * spec.dilation_h + 1)
    return ohp, owp, hp, owp + ((spec.S - 1) * spec.dilation_w) // spec.stride_w


def direct_input_width(spec: ConvSpec, owp: int) -> int:
    """The padded input's width the NCHW direct kernel reads to compute ``owp`` output
    columns (the output width padded to whole tiles): the padded row, or wider."""
    return max(spec.W + spec.pad_l + spec.pad_r,
               (owp - 1) * spec.stride_w + (spec.S - 1) * spec.dilation_w + 1)


def _ceil_to(n: int, tile: int) -> int:
    return -(-n // tile) * tile


def _pow2_at_least(n: int) -> int:
    out = 1
    while out < n:
        out *= 2
    return out


def _override(knobs: dict[str, int], variant: Variant, names, kernel: str) -> dict[str, int]:
    """``knobs`` with the variant's own knobs set over them; an unknown name (for ``kernel``,
    allowed ``names``) or a value under 1 is an error."""
    for name, value in variant.knobs:
        if name not in names:
            raise ConfigError(f"unknown knob {name!r} for {kernel}; allowed: "
                              f"{', '.join(names)}")
        if int(value) <= 0:
            raise ConfigError(f"knob {name} must be positive, got {value}")
        knobs[name] = int(value)
    return knobs


def _pointwise_asked(spec: ConvSpec, variant: Variant, asked: int, defaults: dict[str, int],
                     simd_bits: int | None) -> tuple[dict[str, int], Variant]:
    """The defaults of a dense GEMM whose ``pointwise`` knob is set, and the variant with
    that knob resolved: 1 asks for the overlapping-tile GEMM, which ``defaults`` hold where
    the layer has one (an error where not), 0 for the TE GEMM (its own defaults, the knob
    dropped)."""
    from dataclasses import replace

    if asked == 0:
        lanes, acc = registers(simd_bits)
        return _te_gemm_knobs(spec, lanes, acc), replace(
            variant, knobs=tuple((n, v) for n, v in variant.knobs if n != "pointwise"))
    if asked != 1:
        raise ConfigError(f"pointwise must be 1 (on) or 0 (off), got {asked}")
    if not defaults.get("pointwise"):
        raise ConfigError("the pointwise GEMM runs float32 1x1 stride-1 unpadded ungrouped "
                          "convolutions whose map and filters fill one register tile; "
                          f"not {spec}")
    return defaults, variant


def resolve_knobs(spec: ConvSpec, variant: Variant, simd_bits: int | None = None,
                  vnni: bool = False) -> dict[str, int]:
    """Defaults (for a CPU of ``simd_bits``, with AVX-512 VNNI or not) overridden by the
    variant's own knobs; unknown knob names are an error. The ``vnni`` knob (1) asks for the
    VNNI GEMM where the CPU's defaults do not."""
    if (variant.algorithm, variant.sparse) not in KNOB_NAMES:
        raise ConfigError(f"no kernel for {variant.algorithm.value} under "
                          f"{variant.compression.value}")
    names = KNOB_NAMES[(variant.algorithm, variant.sparse)]
    asked = pairs = False
    if vnni_capable(variant, spec):
        names += ("vnni", "pmaddwd")
        asked = dict(variant.knobs).get("vnni") == 1
        pairs = dict(variant.knobs).get("pmaddwd") == 1
    if asked and pairs:
        raise ConfigError("the vnni and pmaddwd knobs are two int8 GEMMs: ask for one")
    defaults = _vnni_knobs(spec, simd_bits) if asked else \
        _pmaddwd_knobs(spec, simd_bits) if pairs else default_knobs(spec, variant, simd_bits,
                                                                    vnni)
    pointwise = dict(variant.knobs).get("pointwise")
    if pointwise is not None and "pointwise" in names:
        defaults, variant = _pointwise_asked(spec, variant, int(pointwise), defaults,
                                             simd_bits)
    knobs = _override(defaults, variant, names,
                      f"{variant.algorithm.value}{' (sparse)' if variant.sparse else ''}")
    if knobs.get("pmaddwd"):
        if knobs["pmaddwd"] != 1:
            raise ConfigError(f"pmaddwd must be 1 (on), got {knobs['pmaddwd']}")
        if knobs["tile_p"] != PMADDWD_LANES:
            raise ConfigError(f"the pmaddwd GEMM's tile_p is its {PMADDWD_LANES} lanes; got "
                              f"{knobs['tile_p']}")
        return knobs
    if knobs.get("vnni"):
        if knobs["vnni"] != 1:
            raise ConfigError(f"vnni must be 1 (on), got {knobs['vnni']}")
        if knobs["tile_p"] not in VNNI_LANES:
            raise ConfigError(f"the VNNI GEMM's tile_p is its lanes, 8 or 16; got "
                              f"{knobs['tile_p']}")
        return knobs
    if variant.algorithm is Algorithm.WINOGRAD and knobs["tile"] not in WINOGRAD_TILES:
        raise ConfigError(f"the Winograd tile is one of {WINOGRAD_TILES}, got {knobs['tile']}")
    kg = spec.K // spec.groups
    if "tile_h" in knobs and variant.algorithm is Algorithm.DIRECT and not spec.depthwise:
        raise ConfigError("knob tile_h applies to depthwise direct kernels only")
    if "tile_k" in knobs and not (spec.groups == 1 and not variant.sparse
                                  and not spec.depthwise):
        # (a dense kernel of an ungrouped conv pads its last block of filters)
        divides = kg if variant.algorithm is Algorithm.SPATIAL_PACK else spec.K
        if divides % knobs["tile_k"] and variant.algorithm is not Algorithm.WINOGRAD:
            raise ConfigError(f"knob tile_k={knobs['tile_k']} must divide {divides}")
    return knobs


#: Knobs that shape a dense kernel's data layout (the tensors it reads), not its loops: a
#: tuned dense kernel keeps them at their defaults and MetaSchedule schedules the loops.
LAYOUT_KNOBS: dict[Algorithm, tuple[str, ...]] = {
    Algorithm.DIRECT: (), Algorithm.GEMM: (),
    Algorithm.SPATIAL_PACK: ("tile_k", "tile_h", "tile_w"),
    Algorithm.WINOGRAD: ("tile", "tile_k"),
}


def tuned_knobs(spec: ConvSpec, variant: Variant, budget: int,
                simd_bits: int | None = None) -> dict[str, int]:
    """What identifies a tuned measurement before it runs: the layout knobs a dense kernel is
    tuned under (none for CSR kernels, whose knobs are the search's result) and the trial
    budget, so the same workload tuned with another budget is another measurement."""
    if budget < 1:
        raise ConfigError(f"the trial budget must be at least 1, got {budget}")
    knobs = {"budget": int(budget)}
    if not variant.sparse:
        defaults = resolve_knobs(spec, variant, simd_bits)
        names = LAYOUT_KNOBS[variant.algorithm]
        if variant.algorithm is Algorithm.DIRECT and spec.depthwise:
            names = ("tile_h", "tile_w")  # the padded tile shapes its buffers
        knobs.update({k: defaults[k] for k in names})
    return knobs


def search_space(spec: ConvSpec, variant: Variant,
                 simd_bits: int | None = None) -> list[dict[str, int]]:
    """The CSR kernel's knob candidates for the measured search, defaults first.

    The hand schedule's knobs: the vector tile along the output row (direct), the output-pixel
    block (gemm), the register tile's height and width (spatial pack). Values past the extent
    they tile only add padding and are left out.
    """
    if not variant.sparse:
        raise ConfigError("search_space is the CSR kernels' tuner; dense kernels are tuned "
                          "by MetaSchedule")
    p = spec.OH * spec.OW
    widths = [v for v in (4, 8, 16, 32, 64) if v <= max(4, _pow2_at_least(spec.OW))]
    if variant.algorithm is Algorithm.DIRECT:
        space = [{"tile_w": v} for v in widths]
    elif variant.algorithm is Algorithm.GEMM:
        space = [{"tile_p": v} for v in (8, 16, 32, 64, 128, 256)
                 if v <= max(8, _pow2_at_least(p))]
    else:
        heights = [v for v in (1, 2, 4) if v <= max(1, spec.OH)]
        space = [{"tile_h": h, "tile_w": w} for h in heights for w in widths if w <= 32]
    default = default_knobs(spec, variant, simd_bits)
    return [default] + [k for k in space if k != default]


# ------------------------------------------------------------------------------------------
# GPU (CUDA) kernels: thread-block tiling knobs (see :mod:`dlas_predict.measure.kernels.cuda`).
# ------------------------------------------------------------------------------------------
#: The knobs each (algorithm, sparse) CUDA kernel takes; float16 kernels add ``acc_bits``,
#: dense int8 GEMM ``dp4a`` (:func:`dp4a_capable`).
GPU_KNOB_NAMES: dict[tuple[Algorithm, bool], tuple[str, ...]] = {
    (Algorithm.DIRECT, False): ("thr_k", "reg_k", "thr_w", "reg_w", "tile_rc"),
    (Algorithm.GEMM, False): ("thr_k", "reg_k", "thr_p", "reg_p", "tile_rc"),
    (Algorithm.SPATIAL_PACK, False): ("tile_k", "tile_h", "tile_w", "tile_rc"),
    (Algorithm.DIRECT, True): ("thr_w",),
    (Algorithm.GEMM, True): ("tile_p",),
    (Algorithm.SPATIAL_PACK, True): ("tile_h", "tile_w"),
}

def dp4a_capable(kernel) -> bool:
    """Whether a CUDA kernel (a :class:`Variant` or a ``KernelSpec``: anything with a dtype,
    an algorithm and ``sparse``) takes the ``dp4a`` knob: dense int8 GEMM (its reduction
    packed four int8 to a word, summed by ``__dp4a``; off unless set)."""
    return (kernel.dtype is DType.INT8 and kernel.algorithm is Algorithm.GEMM
            and not kernel.sparse)


#: Threads per block the untuned GPU schedules aim at.
GPU_THREADS = 128


def _pow2_at_most(n: int) -> int:
    out = 1
    while out * 2 <= n:
        out *= 2
    return out


def default_gpu_knobs(spec: ConvSpec, variant: Variant) -> dict[str, int]:
    """The untuned CUDA schedule's knobs, chosen from the shape.

    A thread block computes a tile of output channels × output pixels, each thread a small
    register tile (``reg_*``) of it, about :data:`GPU_THREADS` threads a block; the inputs of
    ``tile_rc`` reduction channels are staged in shared memory at a time. float16 kernels
    accumulate in float32 (``acc_bits`` 32) unless asked for 16.
    """
    cg = spec.C // spec.groups
    kg = spec.K // spec.groups
    p = spec.OH * spec.OW
    key = (variant.algorithm, variant.sparse)
    out: dict[str, int]
    if key == (Algorithm.DIRECT, False):
        reg_w = 2 if spec.OW >= 32 else 1
        thr_w = min(16, _pow2_at_least(-(-spec.OW // reg_w)))
        thr_k = max(1, min(GPU_THREADS // thr_w, _pow2_at_most(spec.K)))
        reg_k = 4 if spec.K >= 4 * thr_k else 2 if spec.K >= 2 * thr_k else 1
        out = {"thr_k": thr_k, "reg_k": reg_k, "thr_w": thr_w, "reg_w": reg_w,
               "tile_rc": min(cg, 8)}
    elif key == (Algorithm.GEMM, False):
        reg_p = 4 if p >= 256 else 2 if p >= 32 else 1
        thr_p = min(16, _pow2_at_least(-(-p // reg_p)))
        thr_k = max(1, min(GPU_THREADS // thr_p, _pow2_at_most(spec.K)))
        reg_k = 4 if spec.K >= 4 * thr_k else 2 if spec.K >= 2 * thr_k else 1
        out = {"thr_k": thr_k, "reg_k": reg_k, "thr_p": thr_p, "reg_p": reg_p,
               "tile_rc": min(cg * spec.R * spec.S, 16)}
    elif key == (Algorithm.SPATIAL_PACK, False):
        out = {"tile_k": _divisor_at_most(kg, 16, prefer=(16, 8, 4)),
               "tile_h": 2 if spec.OH > 1 else 1, "tile_w": min(8, _pow2_at_least(spec.OW)),
               "tile_rc": min(cg, 8)}
    elif key == (Algorithm.DIRECT, True):
        out = {"thr_w": min(256, _pow2_at_least(spec.OW))}
    elif key == (Algorithm.GEMM, True):
        out = {"tile_p": min(256, _pow2_at_least(p))}
    elif key == (Algorithm.SPATIAL_PACK, True):
        out = {"tile_h": 2 if spec.OH > 1 else 1, "tile_w": min(16, _pow2_at_least(spec.OW))}
    else:  # pragma: no cover - every algorithm is listed above
        raise ConfigError(f"no CUDA kernel for {variant.algorithm.value}")
    # a grouped layer's block spans several groups, each staging its own inputs: halve the
    # register tile, then the reduction tile, until the shared tiles fit a block
    while gpu_shared_estimate(spec, variant.algorithm, variant.sparse, out) > GPU_SHARED_BYTES:
        if out.get("reg_k", 1) > 1:
            out["reg_k"] //= 2
        elif out.get("tile_rc", 1) > 1:
            out["tile_rc"] //= 2
        else:
            break
    if variant.dtype is DType.FLOAT16:
        out["acc_bits"] = 32
    return out


#: Static shared memory of a thread block (48 KiB on every NVIDIA GPU without an opt-in).
GPU_SHARED_BYTES = 48 * 1024


def gpu_shared_estimate(spec: ConvSpec, algorithm: Algorithm, sparse: bool,
                        knobs: dict[str, int], elem_bytes: int = 4) -> int:
    """Bytes of the shared-memory tiles a dense CUDA kernel's block stages with ``knobs``
    (CSR kernels stage none): the weights of its output channels and the inputs they read
    (a block whose channels span several groups stages each group's inputs). An upper bound
    of what the lowered kernel declares, equal to it where the tiles divide the layer."""
    if sparse:
        return 0
    cg, kg = spec.C // spec.groups, spec.K // spec.groups
    r_eff = (spec.R - 1) * spec.dilation_h + 1
    s_eff = (spec.S - 1) * spec.dilation_w + 1
    height = spec.H + spec.pad_t + spec.pad_b
    width = spec.W + spec.pad_l + spec.pad_r
    if algorithm is Algorithm.SPATIAL_PACK:
        rc = min(knobs["tile_rc"], cg)
        rows = min(height, (knobs["tile_h"] - 1) * spec.stride_h + r_eff)
        cols = min(width, (knobs["tile_w"] - 1) * spec.stride_w + s_eff)
        return elem_bytes * rc * (min(knobs["tile_k"], kg) * spec.R * spec.S + rows * cols)
    k_tile = min(spec.K, knobs["thr_k"] * knobs["reg_k"])
    span = min(spec.groups, -(-k_tile // kg))
    if algorithm is Algorithm.GEMM:
        rc = min(knobs["tile_rc"], cg * spec.R * spec.S)
        p_tile = min(spec.OH * spec.OW, knobs["thr_p"] * knobs["reg_p"])
        return elem_bytes * rc * (k_tile + span * p_tile)
    rc = min(knobs["tile_rc"], cg)
    cols = min(width, (knobs["thr_w"] * knobs["reg_w"] - 1) * spec.stride_w + s_eff)
    return elem_bytes * rc * (k_tile * spec.R * spec.S + span * r_eff * cols)


def gpu_search_space(spec: ConvSpec, variant: Variant, trials: int,
                     seed: int = 0) -> list[dict[str, int]]:
    """Up to ``trials`` knob settings of a CUDA kernel for a measured search: the untuned
    defaults first, then distinct settings drawn at random (seeded) from the grid below,
    keeping blocks of 32 to 1,024 threads whose shared tiles fit a block. A float16 kernel's
    accumulator width is one of the knobs."""
    import random

    base = resolve_gpu_knobs(spec, variant)
    cg, kg = spec.C // spec.groups, spec.K // spec.groups
    p = spec.OH * spec.OW
    key = (variant.algorithm, variant.sparse)
    pw = [2 ** i for i in range(11)]
    grid: dict[str, list[int]]
    if key == (Algorithm.DIRECT, False):
        grid = {"thr_k": [k for k in pw if 1 <= k <= min(128, _pow2_at_least(spec.K))],
                "reg_k": [1, 2, 4, 8],
                "thr_w": [w for w in pw if 1 <= w <= min(32, _pow2_at_least(spec.OW))],
                "reg_w": [1, 2, 4], "tile_rc": sorted({min(cg, t) for t in (1, 2, 4, 8, 16)})}
        threads = ("thr_k", "thr_w")
    elif key == (Algorithm.GEMM, False):
        crs = cg * spec.R * spec.S
        grid = {"thr_k": [k for k in pw if 1 <= k <= min(128, _pow2_at_least(spec.K))],
                "reg_k": [1, 2, 4, 8],
                "thr_p": [q for q in pw if 1 <= q <= min(64, _pow2_at_least(p))],
                "reg_p": [1, 2, 4, 8], "tile_rc": sorted({min(crs, t) for t in (4, 8, 16, 32)})}
        threads = ("thr_k", "thr_p")
    elif key == (Algorithm.SPATIAL_PACK, False):
        grid = {"tile_k": [d for d in (1, 2, 4, 8, 16, 32) if kg % d == 0],
                "tile_h": [h for h in (1, 2, 4, 8) if h <= max(1, spec.OH)],
                "tile_w": [w for w in (1, 2, 4, 8, 16, 32) if w <= _pow2_at_least(spec.OW)],
                "tile_rc": sorted({min(cg, t) for t in (1, 2, 4, 8, 16)})}
        threads = ("tile_k", "tile_h", "tile_w")
    elif key == (Algorithm.DIRECT, True):
        grid = {"thr_w": [w for w in (32, 64, 128, 256, 512)
                          if w <= max(32, _pow2_at_least(spec.OW))]}
        threads = ()
    elif key == (Algorithm.GEMM, True):
        grid = {"tile_p": [q for q in (32, 64, 128, 256, 512, 1024)
                           if q <= max(32, _pow2_at_least(p))]}
        threads = ()
    else:
        grid = {"tile_h": [h for h in (1, 2, 4, 8) if h <= max(1, spec.OH)],
                "tile_w": [w for w in (4, 8, 16, 32) if w <= max(4, _pow2_at_least(spec.OW))]}
        threads = ()
    if variant.dtype is DType.FLOAT16:  # accumulating in float16 is a knob like the others
        grid["acc_bits"] = [32, 16]
    names = list(grid)

    def fits(knobs: dict[str, int]) -> bool:
        n = 1
        for name in threads:
            n *= knobs[name]
        return ((not threads or 32 <= n <= 1024)
                and gpu_shared_estimate(spec, variant.algorithm, variant.sparse, knobs)
                <= GPU_SHARED_BYTES)

    out = [base]
    seen = {tuple(sorted(base.items()))}
    total = 1
    for values in grid.values():
        total *= len(values)
    rng = random.Random(seed)
    tries = 0
    while len(out) < trials and tries < 50 * trials and len(seen) < total + 1:
        tries += 1
        knobs = {n: rng.choice(grid[n]) for n in names}
        sig = tuple(sorted(knobs.items()))
        if sig in seen:
            continue
        seen.add(sig)
        if fits(knobs):
            out.append(knobs)
    return out


def resolve_gpu_knobs(spec: ConvSpec, variant: Variant) -> dict[str, int]:
    """GPU defaults overridden by the variant's own knobs; unknown names are an error."""
    names = GPU_KNOB_NAMES[(variant.algorithm, variant.sparse)] + (
        ("acc_bits",) if variant.dtype is DType.FLOAT16 else ()) + (
        ("dp4a",) if dp4a_capable(variant) else ())
    knobs = _override(default_gpu_knobs(spec, variant), variant, names,
                      f"the CUDA {variant.algorithm.value}"
                      f"{' (sparse)' if variant.sparse else ''} kernel")
    if knobs.get("acc_bits", 32) not in (16, 32):
        raise ConfigError(f"acc_bits must be 16 or 32, got {knobs['acc_bits']}")
    if knobs.get("dp4a", 0) not in (0, 1):
        raise ConfigError(f"dp4a must be 0 or 1, got {knobs['dp4a']}")
    if "tile_k" in knobs and (spec.K // spec.groups) % knobs["tile_k"]:
        raise ConfigError(f"knob tile_k={knobs['tile_k']} must divide "
                          f"{spec.K // spec.groups}")
    return knobs
