"""The Triton backend's configs: the tile, split-K and TMA candidates per problem, the rules
that pick among them (waves, splits, stages), and the check of a caller's own config."""
from __future__ import annotations

import os
from typing import Any, NamedTuple

import triton

from multibackend.backends.triton.records import TileConfig
from multibackend.core import dtypes
from multibackend.core.config import Config
from multibackend.core.problem import Problem
from multibackend.core.scales import FP8

#: GEMM tile candidates per operand width in bytes: (BLOCK_M, BLOCK_N, BLOCK_K, warps,
#: stages, GROUP_M), the expected best first. Sized for Hopper's 227 KB of shared memory.
POINTER_TILES = {
    1: ((128, 256, 128, 8, 3, 8), (256, 128, 128, 8, 3, 8), (128, 128, 128, 8, 4, 8),
        (128, 128, 128, 4, 4, 8), (64, 128, 128, 4, 4, 8), (64, 64, 128, 4, 3, 8)),
    2: ((128, 256, 64, 8, 3, 8), (128, 256, 64, 8, 3, 16), (256, 128, 64, 8, 3, 8),
        (128, 256, 64, 8, 4, 8), (128, 128, 64, 8, 4, 8), (128, 128, 64, 4, 4, 8),
        (128, 64, 64, 4, 4, 8), (64, 128, 64, 4, 4, 8), (64, 64, 64, 4, 3, 8)),
    4: ((128, 256, 32, 8, 3, 8), (128, 128, 32, 8, 4, 8), (128, 128, 32, 4, 4, 8),
        (64, 128, 32, 4, 4, 8), (64, 64, 32, 4, 3, 8)),
    8: ((64, 64, 16, 4, 3, 8), (64, 128, 16, 4, 3, 8), (32, 64, 16, 4, 3, 8)),
}
#: persistent TMA candidates for 16-bit operands: (BM, BN, BK, warps, stages, GROUP_M, ws).
#: First-call autotuning times the first and those whose last wave of programs is fullest
#: (:meth:`TritonBackend._shortlist`), in this order on a tie: 3000x4097 gives 408
#: tiles of 128x256 (3.09 waves on 132 SMs) and 396 of 256x128 (exactly 3), and the second
#: ran 14% faster on an H100. The one-warpgroup 128x128 and 64-row tiles fill a wave where
#: the large ones leave half of it idle: on an H100 (graph mode, one persistent program per
#: SM), 128x128x64 in 4 warps ran 512x4096x14336 at 0.94x torch.matmul and 1024x2048x4096 at
#: 0.89x (128 tiles), 64x128x128 ran 1536^3 at 0.77x (288 tiles), where 256x128 ran 0.55x,
#: 0.57x and 0.69x. The first stays timed: at 3000^3 (288 tiles of 128x256, 73% of three
#: waves) the fuller waves of the smaller tiles ran 6-8% slower.
TMA_TILES = ((128, 256, 64, 8, 3, 8, False), (256, 128, 64, 8, 3, 8, False),
             (128, 128, 64, 4, 4, 8, False), (64, 256, 64, 4, 4, 8, False),
             (64, 128, 128, 4, 4, 8, False), (128, 128, 64, 8, 4, 8, True),
             (128, 256, 64, 8, 3, 8, True), (128, 128, 64, 8, 4, 8, False),
             (128, 256, 64, 8, 3, 16, False))
#: TMA candidates that first-call autotuning times, the steps of wave use (a share of the
#: multiprocessors' slots, :func:`_wave_use`) within which they tie, and the least wave use
#: of one it times (below, the split-K kernels fill the GPU better)
TMA_SHORTLIST = 4
#: the scaled fp8 kernel's persistent TMA tiles (as TMA_TILES; :func:`scaled_tma_tiles`)
SCALED_TMA_TILES = ((256, 128, 128, 8, 3, 8, False), (128, 256, 128, 8, 3, 8, False),
                    (64, 128, 128, 4, 4, 8, False))
WAVE_USE_STEP = 0.05
TMA_MIN_WAVE_USE = 0.5
INTERPRETER_TILE = (32, 32, 32, 4, 1, 8)
MAX_GRID_Y = 65535
DOT_BLOCK = 4096
DOT_WARPS = 8
DOT_PROGRAMS_PER_SM = 4

#: split-K (see :func:`split_k`): a product whose M or N is at most this is skinny
SPLITK_NARROW = 256
#: the multiprocessors configs() plans split-K for (H100 SXM and H200 have 132)
SPLITK_SMS = 132
#: each program's slice of K is at least this many BLOCK_K steps (a pipeline to fill)
SPLITK_MIN_STEPS = 4
#: split-K plans between one and this many waves of programs
SPLITK_WAVES = 2
#: skinny candidates: (the wide side's block, BLOCK_K for 16-bit operands, warps), the
#: expected best first; the narrow side's block is the narrow size rounded up to 16, 32 or 64
SPLITK_SKINNY = ((128, 128, 4), (64, 128, 4), (256, 64, 4))
#: few-tile candidates: (BLOCK_M, BLOCK_N, BLOCK_K for 16-bit operands, warps)
SPLITK_FEW = ((128, 128, 64, 8), (128, 256, 64, 8), (64, 128, 64, 4))
#: shared memory a split-K tile's pipeline stages may take, and the most stages
SPLITK_SMEM = 160 * 1024
SPLITK_MAX_STAGES = 4
SPLITK_GROUP_M = 8
#: split-K candidates that first-call autotuning times (the first ones offered)
SPLITK_SHORTLIST = 2
#: the interpreter's split-K config: (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)
INTERPRETER_SPLITK = (16, 32, 32, 3, 4, 1)
#: the most slices the fused split-K kernel is offered with (its last program of a tile adds
#: every slice's partial alone; more slices go to the two-kernel reduction, which spreads
#: the adding over many programs)
FUSED_MAX_SPLITS = 16
#: TMA split-K candidate tiles (:func:`tma_splitk_configs`): for at most 64 rows (BLOCK_N, BLOCK_K,
#: warps), BLOCK_M the rows rounded up to 16, 32 or 64, and 16 for 17-32 rows too (two row tiles
#: give twice the grid: 32x4096x4096 ran in 128 tiles of 16x64x256 at 1.01x / 1.00x torch.matmul,
#: f16 / bf16, against 0.95x / 0.92x for the best 32-row tile; the best of the shortlist over 18
#: products of 24-32 rows: 1.018 / 1.014 against 0.998 / 0.994, none slower); else (BLOCK_M,
#: BLOCK_N, BLOCK_K, warps). Each problem ranks them by its grid (:func:`tma_splitk_configs`), in
#: this order on a tie. From H100 sweeps of decode and few-tile products (graph mode): the best
#: narrow tile widens with N (16x64x256 at N = 4096, 16x128x128 at 10240-14336, 16x256x64 at 28672
#: and over); 64x64x128 in one wave led at 128-512 rows of N = 1024-4096, 128x128x64 at
#: 512x4096x4096, 64x128x64 at 256x4096x4096 and 1024^3; 64x64x128 in 32 slices at 128x128x65536
#: and 64x128 in 8 at 256x512x32768. The last three are two column blocks wide
#: (:func:`width_blocks`), as cuBLAS's one-wave tiles of these products are (192 = 128 + 64, 320 =
#: 256 + 64): in one wave of 128 tiles, 128x192x64 (4 warps) ran 512x6144x4096 at 1.03x / 1.01x
#: (f16 / bf16; the best power-of-two tile 0.90x / 0.89x), 64x320x64 ran 256x10240x8192 at 1.01x /
#: 1.04x (0.88x / 0.91x) and, in 120 tiles, 1536^3 at 0.96x / 0.93x (0.83x / 0.82x); 128x320x32 in
#: 7 stages ran 512x10240x8192 at 1.03x / 1.02x, against 0.94x / 0.92x for 128x320x64 in 4 (0.79x /
#: 0.78x).
TMA_SPLITK_NARROW = ((64, 256, 4), (64, 128, 4), (128, 128, 4), (256, 64, 4))
TMA_SPLITK_WIDE = ((64, 64, 128, 4), (64, 128, 64, 4), (128, 64, 64, 4), (128, 128, 64, 8),
                   (128, 256, 64, 8), (64, 128, 128, 4), (128, 192, 64, 4), (64, 320, 64, 4),
                   (128, 320, 32, 8))
#: pipeline stages of a TMA split-K program: where its grid is one wave (a program per
#: multiprocessor) as many as TMA_SPLITK_SMEM holds, at most TMA_SPLITK_MAX_STAGES; where it
#: is more, TMA_SPLITK_WAVES_STAGES (fewer where they do not fit). On an H100 (graph mode,
#: f16, same run): one wave of 64x64x128 tiles in 7 stages ran 128x4096x4096 at 1.04x
#: torch.matmul and 512x1024x4096 at 1.03x, against 0.85x in 4 stages; on grids of more
#: than 132 programs 3 stages beat 4 in 74 of 108 decode tile-and-split pairs (1x14336x4096
#: in 16x64x128 tiles: 1.05x against 1.01x).
TMA_SPLITK_SMEM = 224 * 1024
TMA_SPLITK_MAX_STAGES = 12
TMA_SPLITK_WAVES_STAGES = 3
#: the fewest BLOCK_K steps a slice gets and the most slices (each adds one tile into the
#: float32 sum by atomics)
TMA_SPLITK_MIN_STEPS = 2
TMA_SPLITK_MAX_SPLITS = 64
#: the float32 sums of the TMA split-K kernel's atomic reduction: elements per chunk of a
#: device's pool, and chunks per pool (a stream takes as many as it needs; one needing more
#: than the pool has left gets a buffer of its own: :mod:`.stream_buffers`)
SUMS_CHUNK = 1 << 18
SUMS_CHUNKS = 32
#: a tile split in slices is offered unsplit too where its tiles fill this share of a wave:
#: on an H100 (graph, f16 and bf16, same run) 64 tiles unsplit beat 2 slices at K = 4096
#: (64x64x128 at 256x1024x4096: 1.04x against 0.99x torch.matmul; 16x64x256 at
#: 16x4096x4096: 1.11x against 1.06x) and lost at K = 8192 (256x1024x8192: 0.98x against
#: 1.06x); 16 tiles lost in 8 slices or 1 (64x1024x4096: 0.99x against 1.08x)
TMA_SPLITK_UNSPLIT_WAVE = 0.25
#: TMA split-K candidates that first-call autotuning times (the first ones offered)
TMA_SPLITK_SHORTLIST = 4
#: the split-K reduction: elements of D per program, and its warps
REDUCE_ELEMENTS = 1024
REDUCE_WARPS = 4

_FLOATS_OUT = ("float16", "bfloat16", "float32")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pointer_tile(tile: tuple) -> Config:
    """The pointer kernel's config of a (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, GROUP_M)
    tile of POINTER_TILES."""
    bm, bn, bk, warps, stages, group = tile
    return TileConfig("pointer", bm, bn, bk, warps, stages, group_m=group).config()


def tma_tile(tile: tuple) -> Config:
    """The persistent TMA kernel's config of a TMA_TILES entry."""
    bm, bn, bk, warps, stages, group, ws = tile
    return TileConfig("tma", bm, bn, bk, warps, stages, group_m=group,
                      warp_specialize=ws).config()


def splitk_tile(bm: int, bn: int, bk: int, split: int, warps: int, stages: int,
                fused: bool = False) -> Config:
    """A split-K config over pointer loads (``fused``: reduced by the same kernel)."""
    return TileConfig("splitk", bm, bn, bk, warps, stages, split_k=split, fused=fused).config()


def tma_splitk_tile(bm: int, bn: int, bk: int, split: int, warps: int, stages: int) -> Config:
    """A TMA split-K config."""
    return TileConfig("tma_splitk", bm, bn, bk, warps, stages, split_k=split).config()


#: the parameters each kind of matmul config must give (the dot's: BLOCK and num_warps)
_REQUIRED = {None: ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
             "tma": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"),
             "splitk": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"),
             "tma_splitk": ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps",
                            "num_stages")}


def _power_of_two(value: Any, least: int) -> bool:
    return type(value) is int and value >= least and value & (value - 1) == 0


def config_fault(problem: Problem, config: Config) -> str | None:
    """Why ``config`` cannot run ``problem`` whole, or None: its kind is one of this
    backend's, it gives every parameter its kernels read, tile sizes are powers of two of at
    least 16 (the least any config offered has; BLOCK_K at least 32 for 8-bit inputs, the
    least K of Triton's dot for them; a TMA split-K tile's width may be the sum of two
    powers), GROUP_M and SPLIT_K are whole numbers of at least 1, num_warps a power of two up
    to 32, num_stages at least 1; and a persistent TMA tile's problem is one that kernel is
    written for (:func:`tma_layout`, a 16-bit D: it reads one matrix, in 16-bit tiles, and
    accumulates in float32 or, for float16, float16)."""
    if problem.op == "dot":
        required, least = ("BLOCK", "num_warps"), {"BLOCK": 16}
    else:
        kind = config.get("kind")
        if kind not in _REQUIRED:
            return (f"kind is {kind!r}: Triton's matmul configs are of kind "
                    f"{', '.join(repr(k) for k in _REQUIRED)}")
        required = _REQUIRED[kind]
        byte_wide = problem.packed is None and dtypes.get(problem.in_dtype).itemsize == 1
        least = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32 if byte_wide else 16}
    for name in required:
        if config.get(name) is None:
            return f"it gives no {name} (a config of its kind sets {', '.join(required)})"
    for name, bound in least.items():
        value = config.get(name)
        if name == "BLOCK_N" and config.get("kind") == "tma_splitk" and type(value) is int:
            try:  # the kernel's second column block: none, or a tile size of its own
                extra = width_blocks(value)[1] if value >= 16 else -1
            except ValueError:
                extra = -1
            if extra == 0 or _power_of_two(extra, 16):
                continue
            return (f"BLOCK_N is {value!r}: a TMA split-K tile's width is a power of two of "
                    "at least 16, or the sum of two")
        if not _power_of_two(value, bound):
            return f"{name} is {value!r}: a tile size is a power of two of at least {bound}"
    for name in ("GROUP_M", "SPLIT_K", "num_stages"):
        value = config.get(name)
        if name in required and (type(value) is not int or value < 1):
            return f"{name} is {value!r}: expected a whole number of at least 1"
    warps = config.get("num_warps")
    if not _power_of_two(warps, 1) or warps > 32:
        return f"num_warps is {warps!r}: expected a power of two from 1 to 32"
    if config.get("kind") != "tma":
        return None
    if problem.scales is not None and not scaled_tma_layout(problem):
        return (f"kind is 'tma': the scaled persistent TMA kernel runs one fp8 product with "
                f"a 16-bit D, A row-major, B column-major, on sm_90 or later; this is "
                f"{problem.describe()}")
    if problem.scales is None and not (
            tma_layout(problem) and dtypes.get(problem.d_dtype).itemsize == 2):
        return (f"kind is 'tma': the persistent TMA kernel runs one float16 or bfloat16 "
                f"product with a 16-bit D, A row-major, B row- or column-major, on sm_90 or "
                f"later; this is {problem.describe()}")
    return None


def _tile_count(problem: Problem, bm: int, bn: int) -> int:
    """Output tiles of a BLOCK_M x BLOCK_N grid over every batch entry."""
    return triton.cdiv(problem.m, bm) * triton.cdiv(problem.n, bn) * problem.batch


def _wave_use(programs: int, sms: int) -> float:
    """The share of the multiprocessors' wave slots that ``programs`` programs keep busy."""
    return programs / (triton.cdiv(programs, sms) * sms)


def _exact_split(steps: int, split: int) -> int:
    """The slices a split of ``steps`` BLOCK_K steps into ``split`` gives once each slice is
    a whole number of steps (the last one shorter): never an empty slice."""
    per = triton.cdiv(steps, max(split, 1)) if steps else 1
    return max(1, triton.cdiv(steps, per))


def split_k(tiles: int, steps: int, sms: int = SPLITK_SMS) -> int:
    """Into how many slices to cut K for a product of ``tiles`` output tiles and ``steps``
    BLOCK_K steps of K on ``sms`` multiprocessors (1: no split).

    A data-parallel grid runs one program per output tile, which leaves multiprocessors
    idle when there are few tiles. A 2048^3 product with the 128x256 tile has 16 * 8 = 128
    tiles for 132 SMs: a single wave in which every program walks all 32 BLOCK_K steps of K
    alone, with no second program on its multiprocessor to hide the latency of its loads
    (plain pointer loads in the pointer kernel), which is why it ran at 0.2-0.3x
    torch.matmul; a decode product (M = 1, N = 4096) has 16 to 64 tiles and leaves most
    multiprocessors without work. Split-K runs tiles * slices programs: the split chosen
    gives at least one full wave (``sms`` programs) and at most SPLITK_WAVES waves, keeping
    the last wave as full as it can (the fewer slices on a tie: each adds a float32 partial
    of D to write and read back), with every slice SPLITK_MIN_STEPS steps or longer. Where
    K is too short to fill a wave, K is cut as finely as that allows."""
    most = max(1, steps // SPLITK_MIN_STEPS)
    exact = sorted({_exact_split(steps, s) for s in range(1, most + 1)})
    if tiles * exact[-1] < sms:
        return exact[-1]
    filling = [s for s in exact if sms <= tiles * s <= SPLITK_WAVES * sms]
    if not filling:
        return min(s for s in exact if tiles * s >= sms)
    return max(filling, key=lambda s: (_wave_use(tiles * s, sms), -s))


def splitk_eligible(problem: Problem) -> bool:
    """Whether the split-K kernels run the problem: a matrix product of 16-bit or float32
    operands accumulated in float32 (the workspace holds float32 partials)."""
    return (problem.op == "matmul" and problem.packed is None and problem.acc == "float32"
            and problem.in_dtype in ("float16", "bfloat16", "float32"))


def _splitk_tiles(problem: Problem) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps) split-K candidates for the problem: narrow tiles
    for a skinny product (M or N at most SPLITK_NARROW), else Hopper-sized ones where the
    default 128x256 tile leaves multiprocessors idle; none otherwise."""
    width = int(dtypes.get(problem.in_dtype).itemsize)
    narrow = min(problem.m, problem.n)
    if narrow <= SPLITK_NARROW:
        block = min(64, max(16, triton.next_power_of_2(narrow)))
        return [((block, wide) if problem.m <= problem.n else (wide, block))
                + (bk * 2 // width, warps) for wide, bk, warps in SPLITK_SKINNY]
    bm, bn = POINTER_TILES[2][0][:2]
    if _tile_count(problem, bm, bn) < SPLITK_SMS:
        return [(bm, bn, bk * 2 // width, warps) for bm, bn, bk, warps in SPLITK_FEW]
    return []


def splitk_configs(problem: Problem) -> list[Config]:
    """The split-K configs offered for the problem, the expected best first: each candidate
    tile with the split :func:`split_k` picks for it, where that is a split at all; in one
    kernel (``splitk_fused_...``) where there are at most FUSED_MAX_SPLITS slices, then
    (after every fused one) with the two-kernel reduction."""
    if not splitk_eligible(problem):
        return []
    width = int(dtypes.get(problem.in_dtype).itemsize)
    fused, two_pass = [], []
    for bm, bn, bk, warps in _splitk_tiles(problem):
        split = split_k(_tile_count(problem, bm, bn), triton.cdiv(problem.k, bk))
        if split > 1:
            stages = min(SPLITK_MAX_STAGES, SPLITK_SMEM // ((bm + bn) * bk * width))
            if split <= FUSED_MAX_SPLITS:
                fused.append(splitk_tile(bm, bn, bk, split, warps, stages, fused=True))
            two_pass.append(splitk_tile(bm, bn, bk, split, warps, stages))
    return fused + two_pass


def tma_split(tiles: int, steps: int, sms: int = SPLITK_SMS) -> int:
    """Into how many slices the TMA split-K kernel cuts K for ``tiles`` output tiles of
    ``steps`` BLOCK_K steps: at most one wave of programs (``sms``), each slice at least
    TMA_SPLITK_MIN_STEPS steps, at most TMA_SPLITK_MAX_SPLITS slices, made exact (no empty
    slice). A program per SM is what measured best on an H100 (decode products: 64 tiles of
    16x64 at N = 4096 ran fastest in 2 slices, 16 at N = 1024 in 8, 96 at N = 6144 in 1;
    few-tile ones: 256x512x32768 in 16x8, 768^3 in 72 tiles of 64x128 unsplit,
    128x128x65536 in 4x32 of 64x64); more slices cost more partial sums than they
    gained."""
    split = max(1, min(sms // max(tiles, 1), TMA_SPLITK_MAX_SPLITS,
                       steps // TMA_SPLITK_MIN_STEPS))
    return _exact_split(steps, split)


def tma_stages(bm: int, bn: int, bk: int, programs: int, sms: int = SPLITK_SMS) -> int:
    """Pipeline stages of a TMA split-K program of a BLOCK_M x BLOCK_N x BLOCK_K tile of
    16-bit operands in a grid of ``programs`` (see TMA_SPLITK_SMEM): on one wave a program
    has a multiprocessor to itself and takes the deepest pipeline its shared memory holds
    (loads in flight are what a product this small is bound by), on more it takes
    TMA_SPLITK_WAVES_STAGES."""
    fit = TMA_SPLITK_SMEM // ((bm + bn) * bk * 2)
    if programs <= sms:
        return max(2, min(TMA_SPLITK_MAX_STAGES, fit))
    return max(2, min(TMA_SPLITK_WAVES_STAGES, fit))


def tma_splitk_configs(problem: Problem) -> list[Config]:
    """The TMA split-K configs offered for a problem the TMA kernels take (:func:`tma_eligible`)
    that is skinny (at most SPLITK_NARROW rows) or has fewer 128x256 output tiles than two
    waves: the tiles of TMA_SPLITK_NARROW (rows rounded up to 16, 32 or 64, and 16 for 17-32
    rows too: at most 64 rows) or TMA_SPLITK_WIDE, each with :func:`tma_split`'s split (one
    slice included: a non-persistent grid), and unsplit too where its tiles fill
    TMA_SPLITK_UNSPLIT_WAVE of a wave, each with :func:`tma_stages`' pipeline. A tile of two
    column blocks runs unsplit and is offered only where its grid fits one wave and fills it
    fuller than any power-of-two tile's does. The expected best first: tiles that fit one wave
    unsplit, the most tiles first (the fullest wave before a split: cuBLAS runs these products
    as one wave of tiles with deep pipelines too), then the others, the fewest tiles first.

    Small products too: their launches are served by the compiled front like the pointer
    kernel's, and on an H100 (graph, same run) unsplit 64x64x128 tiles ran 512x512x512 at
    1.04x torch.matmul and 256x768x768 at 1.05x, where autotuning's pick without them ran at
    0.89x and 0.81x."""
    m, n, k = problem.m, problem.n, problem.k
    if not tma_eligible(problem) or problem.acc != "float32":
        return []
    if m > SPLITK_NARROW and _tile_count(problem, 128, 256) >= 2 * SPLITK_SMS:
        return []
    if m <= 64:
        block = max(16, triton.next_power_of_2(m))
        blocks = (16, 32) if block == 32 else (block,)
        shapes = [(rows, bn, bk, warps) for rows in blocks
                  for bn, bk, warps in TMA_SPLITK_NARROW]
    else:
        shapes = list(TMA_SPLITK_WIDE)

    def tiles(shape: tuple[int, int, int, int]) -> int:
        return triton.cdiv(m, shape[0]) * triton.cdiv(n, shape[1])

    def two_blocks(shape: tuple[int, int, int, int]) -> bool:
        return width_blocks(shape[1])[1] > 0

    fullest = max((tiles(shape) for shape in shapes
                   if not two_blocks(shape) and tiles(shape) <= SPLITK_SMS), default=0)
    shapes = [shape for shape in shapes
              if not two_blocks(shape) or fullest < tiles(shape) <= SPLITK_SMS]
    ranked = sorted(shapes, key=lambda shape: (tiles(shape) > SPLITK_SMS,
                                               abs(SPLITK_SMS - tiles(shape))))
    found = []
    for bm, bn, bk, warps in ranked:
        count = tiles((bm, bn, bk, warps))
        split = 1 if two_blocks((bm, bn, bk, warps)) else tma_split(count, triton.cdiv(k, bk))
        unsplit = (1,) if split > 1 and count >= TMA_SPLITK_UNSPLIT_WAVE * SPLITK_SMS else ()
        for slices in (split,) + unsplit:
            stages = tma_stages(bm, bn, bk, count * slices)
            found.append(tma_splitk_tile(bm, bn, bk, slices, warps, stages))
    return found


def tma_layout(problem: Problem) -> bool:
    """Whether the problem is one the TMA kernels are written for, wherever its arrays lie:
    one 16-bit matrix product on sm_90 or later, A row-major, B row- or column-major."""
    if problem.op != "matmul" or problem.batch != 1 or problem.in_dtype not in (
            "float16", "bfloat16") or problem.cc is None or problem.cc < (9, 0):
        return False
    return problem.a.layout == "row" and problem.b.layout in ("row", "col")


def scaled_tma_layout(problem: Problem) -> bool:
    """Whether the scaled persistent TMA kernel is written for the scaled problem wherever its
    arrays lie: one fp8 product on sm_90 or later, A row-major, B column-major (K-major, as
    the fp8 warpgroup MMA reads it), a 16-bit D."""
    return (problem.op == "matmul" and problem.batch == 1 and problem.cc is not None
            and problem.cc >= (9, 0) and problem.in_dtype in FP8
            and problem.a.layout == "row" and problem.b.layout == "col"
            and dtypes.get(problem.d_dtype).itemsize == 2)


def scaled_tma_tiles(problem: Problem) -> list[Config]:
    """The scaled persistent TMA kernel's tiles for the scaled problem, its default first, or
    none where :func:`scaled_tma_layout` fails or A's or B's rows are off the 16-byte grid.
    The default is 64x128 for M <= 64; 128x256 where a scale is block-wise; else 256x128. On
    an H200 (graph, e4m3 -> bfloat16, same run) 8192^3 ran tensor-wise at 1017 TFLOP/s in
    256x128 tiles and 841 in 128x256, block-wise at 500 in 128x256 and 150 in 256x128 (the
    sums of each step scaled in registers of half as many threads per row); 16x14336x4096
    took 28.4 us in 64x128 tiles and 33.0 in 64x256."""
    if not (scaled_tma_layout(problem) and problem.a.rows_aligned and problem.b.rows_aligned):
        return []
    tall, wide, skinny = (tma_tile(t) for t in SCALED_TMA_TILES)
    if problem.m <= 64:
        return [skinny, tall, wide]
    return [wide, tall, skinny] if "block" in problem.scales else [tall, wide, skinny]


def tma_operands(problem: Problem) -> bool:
    """Whether the TMA unit can fetch the problem's A and B: :func:`tma_layout`, and every
    base and row of A and B 16-byte aligned."""
    return tma_layout(problem) and problem.a.rows_aligned and problem.b.rows_aligned


def tma_eligible(problem: Problem) -> bool:
    """Whether the persistent TMA kernel can take the problem: :func:`tma_operands` and a
    16-bit D (D goes through the TMA unit where its rows are aligned too, checked at
    launch, else through masked stores)."""
    # a 32-bit D tile converted for the epilogue does not fit beside the 16-bit stages
    return tma_operands(problem) and dtypes.get(problem.d_dtype).itemsize == 2


class _SplitPlan(NamedTuple):
    """What a split-K launch needs beyond its arrays, for one problem and config."""

    grid: tuple[int, int, int]
    reduce_grid: tuple[int, int, int]
    #: float32: (batch, slices, M, N); fused: (batch * tiles, slices, BLOCK_M, BLOCK_N)
    workspace: tuple[int, int, int, int]
    k_slice: int
    splits: int
    constexprs: dict
    reduce_constexprs: dict
    fused: bool


def width_blocks(width: int) -> tuple[int, int]:
    """A TMA split-K tile's width as the TMA kernel's two column blocks: (BLOCK_N, EXTRA_N),
    the largest power of two in it and the rest (0, or a smaller power of two: 192 is
    128 + 64). Raises ValueError for a width that is neither."""
    block = 1 << (width.bit_length() - 1)
    extra = width - block
    if extra & (extra - 1):
        raise ValueError(f"triton: a TMA split-K tile is {width} wide: a tile's width is a "
                         f"power of two or the sum of two")
    return block, extra
