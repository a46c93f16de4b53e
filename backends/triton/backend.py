"""The Triton backend: our ``tl.dot`` kernels (see :mod:`.triton_kernels`) behind the
backend interface.

Dtypes: f16 and bf16 (float32 accumulation, float16 accumulation for f16 on request), float32
in the three precision modes (tf32, tf32x3, ieee), int8 -> int32, fp8 e4m3/e5m2 on sm_89+,
float64; any strides for A and B, batched operands, alpha/beta/C fused in the epilogue. Dot
for f16, bf16, f32 and f64.

Configs: "autotune" (the default on a GPU) times the Hopper-sized candidates below on the
first call for each shape and keeps the fastest; each candidate is also a config of its own so
the tuner can choose one directly. Skinny and few-tile products of 16-bit or float32 operands
are also offered split-K configs (``splitk_...``, see :func:`split_k`): K cut into slices
that separate programs multiply, added up by a second kernel or, with at most
FUSED_MAX_SPLITS slices (``splitk_fused_...``), by the last program of each tile to finish
(in slice order: deterministic). Aligned 16-bit ones on sm_90 are offered, first, the TMA
split-K configs (``tma_splitk_...``, see :func:`tma_splitk_configs`): small tiles fetched
by the TMA unit (some of them two column blocks wide, 192 or 320, where that gives a fuller
single wave), about one wave of programs, up to TMA_SPLITK_MAX_SPLITS slices: two are
added by the program finishing last, in registers (bit-identical run to run); more into a
float32 sum per tile by atomics, so the low bits of their results vary run to run; with
``torch.use_deterministic_algorithms(True)`` the same configs add those in slice order
instead (bit-identical run to run, slower with many slices). Under
``TRITON_INTERPRET=1`` (no GPU) one small config (and one small split-K config) runs and bf16
operands are upcast before ``tl.dot``, which the interpreter computes wrongly otherwise; the
interpreter also ignores tf32 rounding (its results are more accurate than the GPU's), which
the tests take into account.
"""
from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import triton

from multibackend.backends.base import AutotunePicks, Backend
from multibackend.backends.triton.buffers import StreamScratch, TileCounters
from multibackend.backends.triton.launch import LIMIT as LAUNCH_LIMIT
from multibackend.backends.triton.launch import Launcher, aligned
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands, folded_operands
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import Problem, folded_batch
from multibackend.gpu import driver, native, staging

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
#: 512x4096x4096, 64x128x64 at 256x4096x4096 and 1024^3; 64x64x128 in 32 slices at 128x128x65536 and
#: 64x128 in 8 at 256x512x32768. The last three are two column blocks wide (:func:`width_blocks`),
#: as cuBLAS's one-wave tiles of these products are (192 = 128 + 64, 320 = 256 + 64): in one wave of
#: 128 tiles, 128x192x64 (4 warps) ran 512x6144x4096 at 1.03x / 1.01x (f16 / bf16; the best
#: power-of-two tile 0.90x / 0.89x), 64x320x64 ran 256x10240x8192 at 1.01x / 1.04x (0.88x / 0.91x)
#: and, in 120 tiles, 1536^3 at 0.96x / 0.93x (0.83x / 0.82x); 128x320x32 in 7 stages ran
#: 512x10240x8192 at 1.03x / 1.02x, against 0.94x / 0.92x for 128x320x64 in 4 (0.79x / 0.78x).
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


def _tile_config(tile: tuple) -> Config:
    bm, bn, bk, warps, stages, group = tile
    return Config.of(f"{bm}x{bn}x{bk}_w{warps}_s{stages}_g{group}", BLOCK_M=bm, BLOCK_N=bn,
                     BLOCK_K=bk, num_warps=warps, num_stages=stages, GROUP_M=group)


def _tma_config(tile: tuple) -> Config:
    bm, bn, bk, warps, stages, group, ws = tile
    return Config.of(f"tma_{bm}x{bn}x{bk}_w{warps}_s{stages}_g{group}{'_ws' if ws else ''}",
                     kind="tma", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                     num_stages=stages, GROUP_M=group, WARP_SPECIALIZE=ws)


def _splitk_config(bm: int, bn: int, bk: int, split: int, warps: int, stages: int,
                   fused: bool = False) -> Config:
    return Config.of(f"splitk{'_fused' if fused else ''}_{bm}x{bn}x{bk}_s{split}_w{warps}"
                     f"_st{stages}", kind="splitk", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                     SPLIT_K=split, num_warps=warps, num_stages=stages, FUSED=fused)


def _tma_splitk_config(bm: int, bn: int, bk: int, split: int, warps: int,
                       stages: int) -> Config:
    return Config.of(f"tma_splitk_{bm}x{bn}x{bk}_s{split}_w{warps}_st{stages}",
                     kind="tma_splitk", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                     num_warps=warps, num_stages=stages)


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
    if config.get("kind") == "tma" and not (
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
                fused.append(_splitk_config(bm, bn, bk, split, warps, stages, fused=True))
            two_pass.append(_splitk_config(bm, bn, bk, split, warps, stages))
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
            found.append(_tma_splitk_config(bm, bn, bk, slices, warps, stages))
    return found


def tma_layout(problem: Problem) -> bool:
    """Whether the problem is one the TMA kernels are written for, wherever its arrays lie:
    one 16-bit matrix product on sm_90 or later, A row-major, B row- or column-major."""
    if problem.op != "matmul" or problem.batch != 1 or problem.in_dtype not in (
            "float16", "bfloat16") or problem.cc is None or problem.cc < (9, 0):
        return False
    return problem.a.layout == "row" and problem.b.layout in ("row", "col")


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


def d_by_tma(d_aligned: bool, has_c: bool) -> bool:
    """Whether the persistent TMA kernel stores D through a descriptor: where D's rows are on
    the 16-byte grid and there is no C (C's tile converted for the epilogue and D's TMA tile
    together do not fit beside a 128x256 tile's three stages: 240 KB of shared memory)."""
    return d_aligned and not has_c


def _tile_constexprs(problem: Problem, config: Config) -> dict[str, Any]:
    """The constexprs and launch options the pointer and split-K kernels share."""
    import triton.language as tl

    bk = config.get("BLOCK_K")
    acc = {"float32": tl.float32, "float16": tl.float16, "float64": tl.float64,
           "int32": tl.int32}[problem.acc]
    precision = "ieee" if problem.in_dtype == "float64" else problem.precision or "ieee"
    upcast = interpreting() and problem.in_dtype in ("bfloat16", "float8_e4m3fn",
                                                     "float8_e5m2")
    return dict(BLOCK_M=config.get("BLOCK_M"), BLOCK_N=config.get("BLOCK_N"), BLOCK_K=bk,
                ACC=acc, INPUT_PRECISION=precision, EVEN_K=problem.k % bk == 0,
                UPCAST=upcast, WIDE_K=wide_k(problem, bk), num_warps=config.get("num_warps"),
                num_stages=config.get("num_stages"))


def wide_k(problem: Problem, block_k: int) -> bool:
    """Whether a BLOCK_K-wide step of K spans 2^31 elements or more of A or B (the pointer
    kernels then take K offsets in 64 bits: see :mod:`.triton_kernels`)."""
    stride_ak, stride_bk = problem.a.strides[1], problem.b.strides[0]
    return block_k * max(abs(stride_ak), abs(stride_bk)) >= 2 ** 31


def _matrix(t: Any) -> Any:
    """The first matrix of a batch-1 operand, which may come 2-D or 3-D."""
    return t if t.dim() == 2 else t[0]


def _strides3(t: Any) -> tuple[int, int, int]:
    """A 2-D or 3-D operand's (batch, row, column) strides."""
    s = t.stride()
    return s if len(s) == 3 else (0, *s)


def _descriptor(t: Any, block: list[int]) -> Any:
    """A TMA descriptor of matrix ``t`` (its columns contiguous, or one column) read in
    ``block`` tiles. The stride of a dimension of one row or one column is never used: it
    is given as one the TMA unit takes (a row of whole 16-byte units; 1 along a row), so a
    single row or column taken from anything is described."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows, cols = t.shape
    per_unit = 16 // t.element_size()
    row_stride = t.stride(0) if rows > 1 else -(-cols // per_unit) * per_unit
    return TensorDescriptor(t, [rows, cols], [row_stride, 1], block)


def _b_read(problem: Problem, b: Any) -> Any:
    """B as the TMA unit reads it: its transpose (N x K, K contiguous) when column-major."""
    return b.T if problem.b.layout == "col" else b


def _b_descriptor(problem: Problem, b: Any, bn: int, bk: int) -> Any:
    """B's descriptor in BLOCK_K x ``bn`` tiles, or ``bn`` x BLOCK_K of its transpose when
    column-major."""
    return _descriptor(_b_read(problem, b), [bn, bk] if problem.b.layout == "col" else [bk, bn])


def _operand_descriptors(problem: Problem, a: Any, b: Any, bm: int, bn: int,
                         bk: int) -> tuple[bool, Any, Any]:
    """(whether B is read K-major, A's descriptor in BLOCK_M x BLOCK_K tiles, B's in
    BLOCK_K x BLOCK_N tiles, or BLOCK_N x BLOCK_K of its transpose when column-major)."""
    return (problem.b.layout == "col", _descriptor(a, [bm, bk]),
            _b_descriptor(problem, b, bn, bk))


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


def tma_reduction(splits: int, deterministic: bool) -> str:
    """How the TMA split-K kernel adds ``splits`` slices (its REDUCE): "pair" for two (the
    first to finish hands its partial to the other: deterministic, and on an H100 as fast as
    atomics or faster, by 3% at 1024x1024x16384), "ordered" for more where ``deterministic``
    (torch asked for deterministic algorithms) and for one (nothing to add), else
    "atomic"."""
    if splits == 2:
        return "pair"
    return "atomic" if splits > 2 and not deterministic else "ordered"


def _deterministic() -> bool:
    """Whether torch is asked for deterministic algorithms (slices then added in order)."""
    import torch

    return torch.are_deterministic_algorithms_enabled()


def d_unit(problem: Problem, d: Any, c: Any = None) -> int:
    """The epilogue's D_UNIT for D and C (see ``triton_kernels._epilogue``): D's elements
    per 16 bytes where N and D's base, row and batch strides, and C's base and row and
    batch strides where there is a C, come in whole 16 bytes of D but Triton's
    specialization (integers divisible by 16) does not show it all, else 1."""
    unit = 16 // d.element_size()
    if unit == 1 or d.stride()[-1] != 1 or problem.n % unit or not _tma_ready(d):
        return 1
    rows = [*d.stride()[:-1], *(c.stride()[:-1] if c is not None else ())]
    if c is not None and (c.data_ptr() % 16 or any(s % unit for s in rows)):
        return 1
    shown = problem.n % 16 == 0 and all(s % 16 == 0 for s in rows)
    return 1 if shown else unit


def load_units(problem: Problem, a: Any, b: Any) -> dict[str, Any]:
    """The pointer kernels' A_UNIT, A_COL, B_UNIT and B_COL for A and B as they are at launch
    (see ``triton_kernels._operand_units``)."""
    a_unit, a_col = _load_unit(a, problem.m, problem.k)
    b_unit, b_col = _load_unit(b, problem.k, problem.n)
    return dict(A_UNIT=a_unit, A_COL=a_col, B_UNIT=b_unit, B_COL=b_col)


def _load_unit(t: Any, rows: int, cols: int) -> tuple[int, bool]:
    """(8, column-major) for a 16-bit ``rows`` x ``cols`` operand whose base is 16-byte
    aligned and whose extent along its unit-stride dimension and other strides are whole
    16 bytes (multiples of 8), where Triton's specialization (integers divisible by 16) does
    not show it all; else (1, False). On an H200 (graph mode, same tiles, paired) telling it
    ran f16 and bf16 products with 1000 along A's or B's contiguous dimension 3.1-8.3x
    faster (1000^3 with A column-major in 128x128x64 tiles: 0.17x torch.matmul before,
    0.75x after), and a float32 one (tf32, A column-major) 1.4x slower: 32-bit operands are
    never told. 8-bit operands have 16 elements per 16 bytes: Triton sees them already."""
    unit = 8
    if t.element_size() != 2:
        return 1, False
    batch, row, col = _strides3(t)
    if col == 1:
        shown = (cols, row, batch)
    elif row == 1:
        shown = (rows, col, batch)
    else:
        return 1, False
    if t.data_ptr() % 16 or any(q % unit for q in shown) or all(q % 16 == 0 for q in shown):
        return 1, False
    return unit, col != 1


def _tma_ready(t: Any) -> bool:
    """The array as it is at launch meets the TMA unit's 16-byte rules as
    :func:`_descriptor` describes it: its base on the 16-byte grid, its last dimension
    contiguous, and every other dimension's stride whole 16 bytes (a dimension of one
    element aside: its stride is never read). A unit stride elsewhere (one column of a
    row-major matrix, a column-major one) is not the contiguous dimension."""
    if t.data_ptr() % 16 or (t.shape[-1] > 1 and t.stride(-1) != 1):
        return False
    size = t.element_size()
    return not any((s * size) % 16 for n, s in zip(t.shape[:-1], t.stride()[:-1]) if n > 1)


def _operands_ready(problem: Problem, ops: Operands) -> bool:
    """A and B as they are at launch are arrays the TMA unit fetches (see :func:`_tma_ready`;
    B as :func:`_b_read` reads it)."""
    return _tma_ready(_matrix(ops.a)) and _tma_ready(_b_read(problem, _matrix(ops.b)))


def _capability() -> Capability:
    f32_out = ("float32",)
    rules = (
        DtypeRule("float16", accs=("float32", "float16"), outs=_FLOATS_OUT),
        DtypeRule("bfloat16", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 0)),
        DtypeRule("float32", accs=("float32",), outs=f32_out,
                  precisions=("ieee", "tf32", "tf32x3")),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=(8, 0)),
        DtypeRule("int8", accs=("int32",), outs=("int32",), min_cc=(8, 0)),
        DtypeRule("float8_e4m3fn", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 9)),
        DtypeRule("float8_e5m2", accs=("float32",), outs=_FLOATS_OUT, min_cc=(8, 9)),
        DtypeRule("float16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), ops=("dot",)),
    )
    return Capability("triton", rules, batched=True, saturate=False,
                      extra_checks=(_accumulator_rule, _batch_rule))


def _accumulator_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.acc == "float16" and problem.d_dtype != "float16":
        return ("accumulator", "float16 accumulation writes a float16 D only")
    return None


def _batch_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.batch > MAX_GRID_Y:
        return ("batch", f"batch is {problem.batch}: the batch is the grid's second axis, "
                         f"at most {MAX_GRID_Y}")
    return None


class TritonBackend(Backend):
    name = "triton"
    takes_matrices = True

    def __init__(self) -> None:
        self._capability = _capability()
        self._picks = AutotunePicks()
        self._matmul_launcher: Launcher | None = None
        self._tma_kept: Launcher | None = None
        self._dot_pair: tuple[Launcher, Launcher] | None = None
        self._splitk_pair: tuple[Launcher, Launcher] | None = None
        self._fused_kept: Launcher | None = None
        self._tma_splitk_kept: Launcher | None = None
        self._counters = TileCounters()
        self._sums = TileCounters(SUMS_CHUNK, SUMS_CHUNKS, "float32")
        self._scratch = StreamScratch()
        self._sms: dict[int, int] = {}
        self._statics: dict[tuple[Problem, str], tuple] = {}

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        if interpreting():
            return None
        import torch

        if not torch.cuda.is_available():
            return self.unavailable("environment", "no CUDA GPU visible (set TRITON_INTERPRET=1 "
                                                   "to run the kernels in Triton's interpreter)")
        return None

    def supports(self, problem: Problem) -> Reason | None:
        if interpreting() and problem.cc is None:
            problem = problem.with_(cc=(9, 0))
        return super().supports(problem)

    def versions(self) -> dict[str, str]:
        return {"triton": triton.__version__}

    def configs(self, problem: Problem) -> list[Config]:
        """The candidates for ``problem``, the default first; a batch that
        :func:`~multibackend.core.problem.folded_batch` makes one product gets that product's
        (its TMA tiles among them), and runs as it."""
        folded = folded_batch(problem)
        if folded is not None:
            return self.configs(folded)
        if problem.op == "dot":
            return [Config.of(f"dot_b{DOT_BLOCK}_w{DOT_WARPS}", BLOCK=DOT_BLOCK,
                              num_warps=DOT_WARPS)]
        if interpreting():
            split = ([_splitk_config(*INTERPRETER_SPLITK, fused=True),
                      _splitk_config(*INTERPRETER_SPLITK)] if splitk_eligible(problem) else [])
            return [_tile_config(INTERPRETER_TILE)] + split + staging.offered(self, problem)
        width = int(dtypes.get(problem.in_dtype).itemsize)
        tma = [_tma_config(t) for t in TMA_TILES] if tma_eligible(problem) else []
        # split-K after TMA: a misaligned product's staged configs stay its TMA tiles
        tiles = (tma_splitk_configs(problem) + tma + splitk_configs(problem)
                 + [_tile_config(t) for t in POINTER_TILES[width]])
        if min(problem.m, problem.n) <= 64:
            # a skinny product wastes most of a 128-wide tile: narrow tiles first
            tiles.sort(key=lambda c: min(c.get("BLOCK_M"), c.get("BLOCK_N")) > 64)
        # a misaligned product: its staged TMA tiles (see :mod:`multibackend.gpu.staging`) first
        return ([Config.of("autotune")]
                + staging.offered(self, problem, keep=lambda c: c.get("kind") != "tma_splitk")
                + tiles)

    def check_config(self, problem: Problem, config: Config) -> str | None:
        """A handed-in config's parameters against the rules every kernel of its kind needs
        to cover D whole (see :func:`config_fault`), for the problem its kernel runs (a
        staged config's staged one, a folded batch's one product)."""
        if config.name == "autotune" and not config.params:
            return None
        problem, config = staging.unwrap(problem, config)
        problem = folded_batch(problem) or problem
        if interpreting() and problem.cc is None:
            problem = problem.with_(cc=(9, 0))
        return config_fault(problem, config)

    # -- matmul -------------------------------------------------------------------------
    def _keep_statics(self, problem: Problem, config: Config, statics: Any) -> Any:
        """``statics`` kept for this problem and config (the table emptied when full)."""
        if len(self._statics) >= LAUNCH_LIMIT:
            self._statics.clear()
        self._statics[(problem, config)] = statics
        return statics

    def _matmul_statics(self, problem: Problem, config: Config) -> tuple:
        """(grid, constexprs and launch options) of the pointer kernel for this problem and
        config, worked out once."""
        found = self._statics.get((problem, config))
        if found is not None:
            return found
        bm, bn = config.get("BLOCK_M"), config.get("BLOCK_N")
        grid = (-(-problem.m // bm) * -(-problem.n // bn), problem.batch, 1)
        constexprs = dict(_tile_constexprs(problem, config), GROUP_M=config.get("GROUP_M"))
        return self._keep_statics(problem, config, (grid, constexprs))

    def _matmul_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder) of the
        pointer kernel on these operands."""
        grid, constexprs = self._matmul_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        ints = (problem.m, problem.n, problem.k, *_strides3(a), *_strides3(b), *c_strides,
                *_strides3(d))
        scale = ops.alpha != 1
        key = (problem, config, scale, c is not None, ints,
               aligned(a.data_ptr(), b.data_ptr(), c_arg.data_ptr(), d.data_ptr()))
        return (key, grid, (a, b, c_arg, d, *ints, ops.alpha, ops.beta),
                lambda: dict(constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c), **load_units(problem, a, b)))

    def _launcher(self) -> Launcher:
        if self._matmul_launcher is None:
            from multibackend.backends.triton import kernels

            self._matmul_launcher = Launcher(kernels.matmul_kernel)
        return self._matmul_launcher

    def _launch_matmul(self, problem: Problem, ops: Operands, config: Config) -> None:
        key, grid, args, constexprs = self._matmul_launch(problem, ops, config)
        self._launcher()(key, grid, ops.stream, args, constexprs)

    def _launch_tma(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The persistent TMA kernel through a kept launcher (Triton's binding of its
        arguments, each call, cost more host time than the kernel's launch): the descriptors
        are built per call, everything Triton specializes on is in the key."""
        key, grid, args, constexprs = self._tma_launch(problem, ops, config)
        self._tma_launcher()(key, grid, ops.stream, args, constexprs)

    def _tma_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder) of the
        persistent TMA kernel on these operands."""
        import triton.language as tl

        bm, bn, bk = config.get("BLOCK_M"), config.get("BLOCK_N"), config.get("BLOCK_K")
        a, b, d = _matrix(ops.a), _matrix(ops.b), _matrix(ops.d)
        b_kmajor, a_desc, b_desc = _operand_descriptors(problem, a, b, bm, bn, bk)
        has_c, scale = ops.c is not None, ops.alpha != 1
        d_tma = d_by_tma(_tma_ready(d), has_c)
        d_desc = _descriptor(d, [bm, bn]) if d_tma else None
        c = _matrix(ops.c) if has_c else d
        programs = min(self._sm_count(a), triton.cdiv(problem.m, bm) * triton.cdiv(problem.n, bn))
        ints = (problem.m, problem.n, problem.k, c.stride(0), c.stride(1), d.stride(0),
                d.stride(1))
        key = (problem, config, has_c, scale, d_tma, programs, ints,
               aligned(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr()))

        def constexprs() -> dict[str, Any]:
            return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.get("GROUP_M"),
                        NUM_PROGRAMS=programs,
                        ACC=tl.float32 if problem.acc == "float32" else tl.float16,
                        B_KMAJOR=b_kmajor, HAS_C=has_c, SCALE=scale, D_TMA=d_tma,
                        WARP_SPECIALIZE=config.get("WARP_SPECIALIZE"),
                        D_UNIT=1 if d_tma else d_unit(problem, d, c if has_c else None),
                        num_warps=config.get("num_warps"), num_stages=config.get("num_stages"))

        return (key, (programs, 1, 1),
                (a_desc, b_desc, d_desc, c, d, *ints, ops.alpha, ops.beta), constexprs)

    def _tma_launcher(self) -> Launcher:
        if self._tma_kept is None:
            from multibackend.backends.triton import kernels

            self._tma_kept = Launcher(kernels.matmul_tma_persistent_kernel)
        return self._tma_kept

    # -- split-K ----------------------------------------------------------------------------
    def _splitk_statics(self, problem: Problem, config: Config) -> _SplitPlan:
        """The split-K kernels' grids, workspace and constexprs for this problem and config,
        worked out once. The split actually run is the config's made exact for this K (no
        empty slice): the same as the config's for the problems it was offered for."""
        found = self._statics.get((problem, config))
        if found is not None:
            return found
        if not splitk_eligible(problem):
            raise InvalidArgument(f"triton: config is {config.name!r}: split-K runs matrix "
                                  f"products of float16, bfloat16 or float32 operands "
                                  f"accumulated in float32, not {problem.describe()}")
        m, n, batch = problem.m, problem.n, problem.batch
        bm, bn, bk = config.get("BLOCK_M"), config.get("BLOCK_N"), config.get("BLOCK_K")
        steps = triton.cdiv(problem.k, bk)
        splits = _exact_split(steps, config.get("SPLIT_K"))
        rbm = min(16, triton.next_power_of_2(m))
        rbn = min(REDUCE_ELEMENTS // rbm, triton.next_power_of_2(n))
        fused = bool(config.get("FUSED")) or config.get("kind") == "tma_splitk"
        tiles = _tile_count(problem, bm, bn)
        plan = _SplitPlan(
            grid=(tiles // batch, splits, batch),
            reduce_grid=(triton.cdiv(m, rbm) * triton.cdiv(n, rbn), batch, 1),
            workspace=(tiles, splits, bm, bn) if fused else (batch, splits, m, n),
            k_slice=triton.cdiv(steps, splits) * bk, splits=splits,
            constexprs=dict(_tile_constexprs(problem, config), GROUP_M=SPLITK_GROUP_M),
            reduce_constexprs=dict(BLOCK_M=rbm, BLOCK_N=rbn, num_warps=REDUCE_WARPS),
            fused=fused)
        return self._keep_statics(problem, config, plan)

    def _splitk_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(plan, the partial kernel's key and integer arguments, the reduction's key, its
        arguments after the workspace, its constexprs builder). The workspace, the stream's
        scratch, comes from torch's caching allocator, whose blocks are 512-byte aligned: it
        takes no part in the keys."""
        plan = self._splitk_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        ints = (problem.m, problem.n, problem.k, plan.k_slice, *_strides3(a), *_strides3(b))
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        rints = (problem.m, problem.n, plan.splits, *c_strides, *_strides3(d))
        scale = ops.alpha != 1
        partial_key = (problem, config, ints, aligned(a.data_ptr(), b.data_ptr()))
        reduce_key = (problem, config, scale, c is not None, rints,
                      aligned(c_arg.data_ptr(), d.data_ptr()))
        return (plan, partial_key, ints, reduce_key,
                (c_arg, d, *rints, ops.alpha, ops.beta),
                lambda: dict(plan.reduce_constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c)))

    def _fused_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(plan, the fused split-K kernel's key, its integer arguments, its constexprs
        builder); the workspace and counters take no part in the key (512-byte and chunk
        aligned)."""
        plan = self._splitk_statics(problem, config)
        a, b, c, d = ops.a, ops.b, ops.c, ops.d
        c_arg = c if c is not None else d
        c_strides = _strides3(c) if c is not None else (0, 0, 0)
        ints = (problem.m, problem.n, problem.k, plan.k_slice, *_strides3(a), *_strides3(b),
                *c_strides, *_strides3(d))
        scale = ops.alpha != 1
        key = (problem, config, scale, c is not None, ints,
               aligned(a.data_ptr(), b.data_ptr(), c_arg.data_ptr(), d.data_ptr()))
        return (plan, key, ints,
                lambda: dict(plan.constexprs, HAS_C=c is not None, SCALE=scale,
                             D_UNIT=d_unit(problem, d, c), **load_units(problem, a, b)))

    def _fused_launcher(self) -> Launcher:
        if self._fused_kept is None:
            from multibackend.backends.triton import kernels

            self._fused_kept = Launcher(kernels.matmul_splitk_fused_kernel)
        return self._fused_kept

    def _launch_splitk_fused(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The fused split-K kernel on the stream's float32 scratch (each partial written
        before it is read) and tile counters."""
        plan, key, ints, constexprs = self._fused_launch(problem, ops, config)
        d = ops.d
        work = self._scratch.get(d.device, ops.stream, math.prod(plan.workspace))
        counters = self._counters.get(d.device, ops.stream, plan.workspace[0])
        c_arg = ops.c if ops.c is not None else d
        self._fused_launcher()(key, plan.grid, ops.stream,
                               (ops.a, ops.b, c_arg, d, work, counters, *ints, ops.alpha,
                                ops.beta), constexprs)

    def _bind_splitk_fused(self, problem: Problem, config: Config, ops: Operands):
        """The fused split-K kernel kept, with the integers, alpha and beta of these calls
        filled in, each call finding its stream's scratch and counters (None if not
        kept)."""
        plan, key, ints, _ = self._fused_launch(problem, ops, config)
        kept = self._fused_launcher().kept(key)
        if kept is None:
            return None
        runner, tail, counters, scratch = kept.runner, kept.tail, self._counters, self._scratch
        size, device, tiles = math.prod(plan.workspace), ops.d.device, plan.workspace[0]
        scalars = (ops.alpha, ops.beta)

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            work = scratch.get(device, stream, size)
            runner(a, b, d if c is None else c, d, work, counters.get(device, stream, tiles),
                   *ints, *scalars, *tail, stream=stream)
        return launch

    def _tma_splitk_launcher(self) -> Launcher:
        if self._tma_splitk_kept is None:
            from multibackend.backends.triton import kernels

            self._tma_splitk_kept = Launcher(kernels.matmul_tma_splitk_kernel)
        return self._tma_splitk_kept

    def _launch_tma_splitk(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The TMA split-K kernel: descriptors built per call and, where K is split, the
        stream's tile counters with, by :func:`tma_reduction`, the stream's float32 scratch
        for one partial per tile (two slices, paired) or for every slice's (in slice order),
        or its zeroed float32 sums (atomics); with one slice neither is touched (the
        counters stand in)."""
        key, grid, args, constexprs, _ = self._tma_splitk_launch(problem, ops, config)
        self._tma_splitk_launcher()(key, grid, ops.stream, args, constexprs)

    def _tma_splitk_launch(self, problem: Problem, ops: Operands, config: Config) -> tuple:
        """(the launcher's key, grid, the kernel's arguments, a constexprs builder, whether
        its slices are summed by atomics, in no fixed order) of the TMA split-K kernel on
        these operands."""
        plan = self._splitk_statics(problem, config)
        bm, bn, bk = config.get("BLOCK_M"), config.get("BLOCK_N"), config.get("BLOCK_K")
        block, extra = width_blocks(bn)
        if extra and plan.splits > 1:
            raise InvalidArgument(f"triton: config is {config.name!r}: a tile {bn} wide (two "
                                  f"column blocks) runs unsplit, not in {plan.splits} slices")
        a, b, d = _matrix(ops.a), _matrix(ops.b), _matrix(ops.d)
        b_kmajor, a_desc, b_desc = _operand_descriptors(problem, a, b, bm, block, bk)
        bx_desc = _b_descriptor(problem, b, extra, bk) if extra else b_desc
        has_c, scale = ops.c is not None, ops.alpha != 1
        c = _matrix(ops.c) if has_c else d
        tiles = plan.workspace[0]
        counters = self._counters.get(d.device, ops.stream, tiles)
        reduce = tma_reduction(plan.splits, _deterministic())
        if reduce == "atomic":
            work = self._sums.get(d.device, ops.stream, tiles * bm * bn)
        elif plan.splits > 1:
            size = tiles * bm * bn if reduce == "pair" else math.prod(plan.workspace)
            work = self._scratch.get(d.device, ops.stream, size)
        else:
            work = counters
        ints = (problem.m, problem.n, problem.k, plan.k_slice, c.stride(0), c.stride(1),
                d.stride(0), d.stride(1))
        key = (problem, config, has_c, scale, reduce, ints,
               aligned(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr()))

        def constexprs() -> dict[str, Any]:
            return dict(BLOCK_M=bm, BLOCK_N=block, EXTRA_N=extra, BLOCK_K=bk,
                        GROUP_M=SPLITK_GROUP_M, B_KMAJOR=b_kmajor, HAS_C=has_c, SCALE=scale,
                        REDUCE=reduce, D_UNIT=d_unit(problem, d, c if has_c else None),
                        num_warps=config.get("num_warps"),
                        num_stages=config.get("num_stages"))

        return (key, plan.grid[:2] + (1,),
                (a_desc, b_desc, bx_desc, c, d, work, counters, *ints, ops.alpha, ops.beta),
                constexprs, reduce == "atomic")

    def _splitk_launchers(self) -> tuple[Launcher, Launcher]:
        if self._splitk_pair is None:
            from multibackend.backends.triton import kernels

            self._splitk_pair = (Launcher(kernels.matmul_splitk_kernel),
                                 Launcher(kernels.splitk_reduce_kernel))
        return self._splitk_pair

    def _launch_splitk(self, problem: Problem, ops: Operands, config: Config) -> None:
        """Both split-K passes on the stream's float32 scratch, which the first fully
        writes."""
        plan, partial_key, ints, reduce_key, rest, reduce_constexprs = self._splitk_launch(
            problem, ops, config)
        work = self._scratch.get(ops.d.device, ops.stream, math.prod(plan.workspace))
        partial, finish = self._splitk_launchers()
        partial(partial_key, plan.grid, ops.stream, (ops.a, ops.b, work, *ints),
                lambda: dict(plan.constexprs, **load_units(problem, ops.a, ops.b)))
        finish(reduce_key, plan.reduce_grid, ops.stream, (work, *rest), reduce_constexprs)

    def _bind_splitk(self, problem: Problem, config: Config, ops: Operands):
        """Both split-K passes' kept kernels with the integers, alpha and beta of these
        calls filled in, each call finding its stream's scratch (None if a kernel is not
        kept)."""
        plan, partial_key, ints, reduce_key, rest, _ = self._splitk_launch(problem, ops, config)
        partial, finish = self._splitk_launchers()
        kept_partial, kept_finish = partial.kept(partial_key), finish.kept(reduce_key)
        if kept_partial is None or kept_finish is None:
            return None
        first, first_tail = kept_partial.runner, kept_partial.tail
        second, second_tail = kept_finish.runner, kept_finish.tail
        size, device, scratch = math.prod(plan.workspace), ops.d.device, self._scratch
        middle = rest[2:]  # the reduction's integers, alpha and beta

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            work = scratch.get(device, stream, size)
            first(a, b, work, *ints, *first_tail, stream=stream)
            second(work, d if c is None else c, d, *middle, *second_tail, stream=stream)
        return launch

    def _launch(self, problem: Problem, ops: Operands, config: Config) -> None:
        if staging.is_staged(config):
            staging.run(problem, ops, config, self._launch)
        elif config.get("kind") == "splitk" and config.get("FUSED"):
            self._launch_splitk_fused(problem, ops, config)
        elif config.get("kind") == "tma_splitk":
            sm90 = problem.with_(cc=(9, 0)) if interpreting() else problem
            if tma_operands(sm90) and _operands_ready(problem, ops):
                self._launch_tma_splitk(problem, ops, config)
            else:  # operands the TMA unit cannot fetch (a batch, a column-major A, arrays
                # off the 16-byte grid): the same split through plain loads, in tiles of
                # the config's first column block
                self._launch_splitk_fused(problem, ops, Config.of(
                    f"{config.name}_by_loads", **dict(
                        config.params, kind="splitk", FUSED=True,
                        BLOCK_N=width_blocks(config.get("BLOCK_N"))[0])))
        elif config.get("kind") == "splitk":
            self._launch_splitk(problem, ops, config)
        elif config.get("kind") != "tma":
            self._launch_matmul(problem, ops, config)
        elif _operands_ready(problem, ops):
            self._launch_tma(problem, ops, config)
        else:  # arrays off the 16-byte grid: the same tile through plain loads
            self._launch_matmul(problem, ops, _tile_config(POINTER_TILES[2][0]))

    def _shortlist(self, problem: Problem, sms: int) -> list[Config]:
        """The first TMA_SPLITK_SHORTLIST TMA split-K candidates (skinny and few-tile
        products), TMA_SHORTLIST TMA candidates (staged ones for a misaligned product) that
        fill at least TMA_MIN_WAVE_USE of the last wave on the ``sms`` multiprocessors: the
        first offered and those that fill it fullest, the first SPLITK_SHORTLIST
        split-K candidates on the caller's operands (skinny and few-tile products), the
        first two pointer candidates, and the largest pointer tile that still gives every
        multiprocessor a tile (small problems)."""
        tiles = self.configs(problem)[1:]
        pointer = [c for c in tiles if c.get("kind") not in ("tma", "splitk", "tma_splitk")]
        tma_splits = [c for c in tiles if c.get("kind") == "tma_splitk"][:TMA_SPLITK_SHORTLIST]
        split = [c for c in tiles
                 if c.get("kind") == "splitk" and not staging.is_staged(c)][:SPLITK_SHORTLIST]

        def count(c: Config) -> int:
            return _tile_count(problem, c.get("BLOCK_M"), c.get("BLOCK_N"))

        def use(c: Config) -> int:
            return round(_wave_use(count(c), sms) / WAVE_USE_STEP)

        # the first TMA tile offered (the largest: the most work per byte loaded, which can
        # outweigh an emptier last wave over several waves) and those whose last wave is
        # fullest, in the order offered on a tie
        tma = [c for c in tiles if c.get("kind") == "tma"
               and use(c) >= TMA_MIN_WAVE_USE / WAVE_USE_STEP]
        fullest = tma[:1] + sorted(tma[1:], key=lambda c: -use(c))[:TMA_SHORTLIST - 1]
        tma = [c for c in tma if c in fullest]

        filling = [c for c in pointer if count(c) >= sms]
        fill = (max(filling, key=lambda c: c.get("BLOCK_M") * c.get("BLOCK_N")) if filling
                else min(pointer, key=lambda c: c.get("BLOCK_M") * c.get("BLOCK_N")))
        picked = tma_splits + tma + split + pointer[:2]
        return picked + ([fill] if fill not in picked else [])

    def autotuned(self, problem: Problem) -> Config | None:
        return self._picks.get(folded_batch(problem) or problem)

    def _autotuned(self, problem: Problem, ops: Operands) -> Config:
        """The fastest of the shortlisted candidates for this problem
        (:func:`multibackend.gpu.timing.fastest`), timed once per process (the tuner,
        :func:`multibackend.tune`, times them all)."""
        def choose() -> Config:
            from multibackend.gpu.timing import fastest

            best = fastest(self._shortlist(problem, self._sm_count(ops.d)),
                           lambda candidate: self._launch(problem, ops, candidate))
            if best is None:
                raise RuntimeError(f"triton: no tile compiled for {problem.describe()}")
            return best

        return self._picks.pick(problem, choose)

    # -- dot ------------------------------------------------------------------------------
    def _launch_dot(self, problem: Problem, ops: Operands, config: Config) -> None:
        """The two-pass dot through kept launchers: the integers and alignment of a dot are
        its Problem's, so the Problem and config key each kernel's specialization."""
        import torch
        import triton.language as tl

        block, warps = config.get("BLOCK"), config.get("num_warps")
        acc = tl.float64 if problem.acc == "float64" else tl.float32
        programs = self._dot_programs(problem, block, ops.a)
        # the stream's float32 scratch (two words per float64 partial): written, then read
        words = 2 if ops.d.dtype == torch.float64 else 1
        partial = self._scratch.get(ops.d.device, ops.stream, words * programs)[
            :words * programs].view(ops.d.dtype)
        first, finish = self._dot_launchers()
        x, y = ops.a, ops.b
        first((problem, config), (programs, 1, 1), ops.stream,
              (x, y, partial, problem.k, x.stride(0), y.stride(0)),
              lambda: {"BLOCK": block, "ACC": acc, "num_warps": warps})
        finish((problem.acc, programs), (1, 1, 1), ops.stream, (partial, ops.d, programs),
               lambda: {"BLOCK": 1024, "ACC": acc, "num_warps": 4})

    def _dot_native(self, problem: Problem, config: Config,
                    ops: Operands) -> native.Native | None:
        import torch

        programs = self._dot_programs(problem, config.get("BLOCK"), ops.a)
        first, finish = self._dot_launchers()
        kept, last = first.kept((problem, config)), finish.kept((problem.acc, programs))
        if kept is None or last is None:
            return None
        partial = torch.empty((programs,), dtype=ops.d.dtype, device=ops.d.device)
        at, x, y = partial.data_ptr(), ops.a, ops.b
        steps = (native.triton_step(kept.compiled, kept.grid,
                                    (x, y, partial, problem.k, x.stride(0), y.stride(0),
                                     *kept.tail), {0: native.A, 1: native.B}, {2: at},
                                    ops.stream),
                 native.triton_step(last.compiled, last.grid, (partial, ops.d, programs,
                                                                *last.tail),
                                    {1: native.D}, {0: at}, ops.stream))
        if None in steps:
            return None
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (),
                             driver.primary_context(ops.d.get_device()), steps,
                             keep=(kept, last, partial))

    def _dot_programs(self, problem: Problem, block: int, x: Any) -> int:
        """Programs of the dot's first pass: enough blocks to fill the GPU, no more than
        there are chunks (the device's multiprocessor count asked once)."""
        sms = self._sm_count(x) if x.is_cuda else 2
        return max(1, min(triton.cdiv(problem.k, block), sms * DOT_PROGRAMS_PER_SM))

    def _sm_count(self, t: Any) -> int:
        """The multiprocessors of ``t``'s device (asked once per device)."""
        index = t.device.index or 0
        sms = self._sms.get(index)
        if sms is None:
            import torch

            sms = self._sms[index] = torch.cuda.get_device_properties(
                index).multi_processor_count
        return sms

    def _dot_launchers(self) -> tuple[Launcher, Launcher]:
        if self._dot_pair is None:
            from multibackend.backends.triton import kernels

            self._dot_pair = (Launcher(kernels.dot_partial_kernel),
                              Launcher(kernels.dot_finish_kernel))
        return self._dot_pair

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if problem.op == "dot":
            self._launch_dot(problem, operands, config)
            return
        folded = folded_batch(problem)
        if folded is not None:
            problem, operands = folded, folded_operands(operands, folded)
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        self._launch(problem, operands, config)

    def bind(self, problem: Problem, config: Config, operands: Operands):
        """The pointer kernel's (or both split-K kernels') kept launcher with the integer
        arguments, alpha and beta of these calls filled in (None for dot, TMA tiles and
        anything Triton did not keep)."""
        if problem.op != "matmul":
            return None
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        if config.get("kind") in ("tma", "tma_splitk") or staging.is_staged(config):
            return None
        if config.get("kind") == "splitk" and config.get("FUSED"):
            return self._bind_splitk_fused(problem, config, operands)
        if config.get("kind") == "splitk":
            return self._bind_splitk(problem, config, operands)
        key, _, args, _ = self._matmul_launch(problem, operands, config)
        kept = self._launcher().kept(key)
        if kept is None:
            return None
        runner, tail = kept.runner, kept.tail
        middle = args[4:]  # the integers, alpha and beta

        def launch(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            runner(a, b, d if c is None else c, d, *middle, *tail, stream=stream)
        return launch

    def native(self, problem: Problem, config: Config,
               operands: Operands) -> native.Native | None:
        """For a product without C: the pointer kernel's kept launch with this call's
        integers, alpha and beta; a TMA kernel's, its descriptors' tensor maps encoded once
        and pointed at each call's operands, and, where the TMA split-K kernel splits K, the
        tile counters of the caller's stream with its float32 sums (slices added by atomics)
        or its float32 scratch (two slices paired, or more added in order where torch asks
        for deterministic algorithms): the plan runs on that stream only. The dot's two
        passes with block partials the plan keeps, on the caller's stream. Split-K through
        pointers and staged configs: not described. A batch that
        :func:`~multibackend.core.problem.folded_batch` makes one product: that product's launch,
        D of the batch's sizes."""
        if problem.op == "dot":
            return self._dot_native(problem, config, operands)
        if operands.c is not None:
            return None
        sizes = native.d_sizes(problem)
        folded = folded_batch(problem)
        if folded is not None:
            problem, operands = folded, folded_operands(operands, folded)
        if config.name == "autotune":
            config = self._autotuned(problem, operands)
        kind = config.get("kind")
        if kind == "splitk" or staging.is_staged(config):
            return None
        maps = {0: native.A + native.MAP, 1: native.B + native.MAP}
        fixed, buffers, stream, atomic = {}, (), None, False
        if kind == "tma":
            key, _, args, _ = self._tma_launch(problem, operands, config)
            kept = self._tma_launcher().kept(key)
            sources = {**maps, 2: native.D + native.MAP, 3: native.D, 4: native.D}
        elif kind == "tma_splitk":
            key, _, args, _, atomic = self._tma_splitk_launch(problem, operands, config)
            kept = self._tma_splitk_launcher().kept(key)
            sources = {**maps, 2: native.B + native.MAP, 3: native.D, 4: native.D}
            split = self._splitk_statics(problem, config).splits > 1
            buffers, stream = args[5:7], operands.stream if split else None
            fixed = {5: buffers[0].data_ptr(), 6: buffers[1].data_ptr()}
        else:
            key, _, args, _ = self._matmul_launch(problem, operands, config)
            kept = self._launcher().kept(key)
            sources = {0: native.A, 1: native.B, 2: native.D, 3: native.D}
        if kept is None:
            return None
        step = native.triton_step(kept.compiled, kept.grid, (*args, *kept.tail), sources, fixed,
                                  stream, atomic)
        if step is None:
            return None
        device = operands.d.get_device()
        return native.Native(dtypes.torch_dtype(problem.d_dtype), sizes,
                             driver.primary_context(device), (step,), keep=(kept, *buffers))


def create() -> Backend:
    return TritonBackend()
