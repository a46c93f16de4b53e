"""The raw WMMA kernels and how one is picked: the tiles and fragments each entry point of
``raw_wmma/*.cu`` offers, their parameters as the ``extern "C"`` signatures declare them,
the rules that make a problem eligible for each (fast, mma, wgmma, TMA), and the
:class:`Kernel` a (problem, config) pair runs."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from multibackend.backends.raw_wmma.records import (
    DotBlocks,
    FastTile,
    MmaTile,
    TmaTile,
    WgmmaTile,
    WmmaFragment,
    by_name,
)
from multibackend.core import dtypes
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import Operand, Problem
from multibackend.gpu import staging
from multibackend.gpu.driver import FLOAT64, INT32, INT64, POINTER, TENSOR_MAP, Param

#: element codes of C and D, as raw_wmma/common.cuh numbers them
ELEM_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int32": 4}
MIN_CC = (8, 0)
GENERIC_THREADS = 128
DOT_THREADS = 256
DOT_UNROLL = 4
MAX_GRID_Y = 65535

#: fast-kernel tiles by name (:class:`~.records.FastTile`); the default first
#: (kept in step with the RW_FAST_DTYPE list in raw_wmma/wmma_fast.cu)
FAST_TILES = by_name(
    FastTile(128, 256, 32, 2, 4, 3), FastTile(128, 128, 64, 2, 2, 3),
    FastTile(256, 128, 64, 4, 2, 3), FastTile(128, 256, 64, 2, 4, 3),
    FastTile(128, 256, 64, 2, 4, 4), FastTile(128, 128, 32, 2, 4, 4),
    FastTile(128, 128, 32, 2, 2, 3))
FAST_PAD = 8

#: the PTX K-major kernel's kind for each input type (b1: AND products only)
MMA_KINDS = {"bit": "b1and", "int8": "s8", "uint8": "u8", "float16": "f16", "bfloat16": "bf16",
             "float32": "tf32", "float64": "f64"}
#: kinds whose instruction exists from sm_90 on (f64 m16n8k4)
MMA_SM90 = ("f64",)
#: (BM, BN, warps along M, warps along N, stages) of the PTX K-major tiles of every kind
_MMA_SHAPES = ((128, 256, 2, 4, 4), (256, 128, 4, 2, 4), (128, 128, 2, 2, 4))
#: PTX K-major tiles per kind, by name (:class:`~.records.MmaTile`); the default first (kept
#: in step with the RW_MMA list in raw_wmma/mma_kmajor.cu)
MMA_TILES: dict[str, dict[str, MmaTile]] = {
    kind: by_name(*(MmaTile(k, *shape) for shape in _MMA_SHAPES))
    for kind, k in (("b1and", 256), ("s8", 32), ("u8", 32), ("f16", 16), ("bf16", 16),
                    ("tf32", 8))}
MMA_TILES["b1and"].update(by_name(MmaTile(128, *_MMA_SHAPES[0])))
# f64: warp tiles of 64 x 32 and 32 x 64 (64 double accumulators per thread)
MMA_TILES["f64"] = by_name(MmaTile(4, 64, 128, 2, 2, 4), MmaTile(4, 128, 128, 2, 4, 4),
                           MmaTile(4, 128, 64, 2, 2, 4))
#: bytes of K each stage of the K-major kernel holds per row
MMA_ROW_BYTES = 128
#: kinds the warpgroup (wgmma) K-major kernel computes (sm_90a; wgmma has no f64)
WGMMA_KINDS = ("b1and", "s8", "u8", "f16", "bf16", "tf32")
#: warpgroup K-major tiles by name (:class:`~.records.WgmmaTile`); the default first (kept in
#: step with RW_WGMMA_TILES in raw_wmma/mma_kmajor.cu)
WGMMA_TILES = by_name(WgmmaTile(256, 128, 4), WgmmaTile(128, 256, 4))
#: the K-major kernels' config names, and how many of them a product in another layout is
#: offered as K-major staged configs (its first ones for the staged problem)
KMAJOR_PREFIXES = ("tma_", "wgmma_", "mma_")
KMAJOR_OFFERED = 2
#: the compute capability whose architecture-specific target (sm_90a) has wgmma
WGMMA_CC = (9, 0)
#: the bytes the warpgroup kernel's stages may need to start on a 1024-byte boundary
WGMMA_ALIGN = 1024
#: TMA-fed warpgroup tiles by name (:class:`~.records.TmaTile`), the default for more than 64
#: rows first (kept in step with RW_TMA_TILES in raw_wmma/mma_kmajor.cu); each also runs split
#: along K (``<name>_k<splits>``, :func:`tma_tile`), the choice of :func:`tma_choice`
TMA_TILES = by_name(TmaTile(128, 256, 1), TmaTile(128, 256, 2), TmaTile(64, 256, 1))
#: the tile of products of at most 64 rows: one consumer warpgroup, half the wasted rows
TMA_SKINNY = "tma_64x256_c1"
#: the multiprocessors the wave rule counts: 132 on every sm_90a part of the data centre but
#: the H100 PCIe (114)
WAVE_SMS = 132
#: split-K: at most MAX_SPLIT splits, each at least MIN_SPLIT_KTILES k-tiles (128 bytes of K)
MAX_SPLIT = 16
MIN_SPLIT_KTILES = 4
#: split-K's second pass (RW_TMA_REDUCE in mma_kmajor.cu): its block size, and its entry point
#: by the accumulators' type
REDUCE_THREADS = 256
REDUCE_KERNELS = {"float32": "rw_tma_reduce_f32", "int32": "rw_tma_reduce_s32"}
#: kinds whose wgmma also reads an operand MN-major (its transpose bit: A column-major, B
#: row-major), which the TMA kernel loads as it lies (RW_TMA_LAYOUTS in mma_kmajor.cu)
MN_MAJOR_KINDS = ("f16", "bf16")
#: the rows (k's) of each box of an MN-major operand: one 128-byte k-tile of 16-bit elements
MN_BOX_ROWS = 64

#: generic fragment shapes per input dtype, the first the default
FRAGS = {
    "float16": ("16x16x16", "32x8x16", "8x32x16"),
    "bfloat16": ("16x16x16", "32x8x16", "8x32x16"),
    "int8": ("16x16x16", "32x8x16", "8x32x16"),
    "uint8": ("16x16x16", "32x8x16", "8x32x16"),
    "float32": ("16x16x8",),
    "float64": ("8x8x4",),
    "int4": ("8x8x32",),
    "uint4": ("8x8x32",),
    "bit": ("8x8x128",),
}
#: (fragments per warp along M, along N) of the generic kernel for each shape
WARP_FRAGS = {"16x16x16": (2, 2), "32x8x16": (1, 4), "8x32x16": (4, 1), "16x16x8": (2, 2),
              "8x8x4": (2, 2)}
SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "tf32", "float64": "f64",
         "int8": "s8", "uint8": "u8", "int4": "s4", "uint4": "u4"}
#: the dot kernel's configs by name (:class:`~.records.DotBlocks`)
DOT_CONFIGS = by_name(DotBlocks(8, DOT_THREADS), DotBlocks(4, DOT_THREADS))

#: the parameters of each entry point, named and typed as the extern "C" signatures of
#: raw_wmma/*.cu declare them (RW_FAST, RW_GENERIC, RW_SUBBYTE, RW_DOT, RW_DOT_FINAL)
_GEMM_HEAD: tuple[Param, ...] = (("a", POINTER), ("b", POINTER), ("c", POINTER), ("d", POINTER),
                                 ("M", INT32), ("N", INT32))
_OPERAND_STRIDES: tuple[Param, ...] = (("sam", INT64), ("sak", INT64), ("sbk", INT64),
                                       ("sbn", INT64))
_EPILOGUE: tuple[Param, ...] = (("scm", INT64), ("scn", INT64), ("sba", INT64), ("sbb", INT64),
                                ("sbc", INT64), ("batch", INT32), ("alpha", FLOAT64),
                                ("beta", FLOAT64), ("c_code", INT32), ("d_code", INT32))
GEMM_PARAMS: dict[str, tuple[Param, ...]] = {
    "wmma_fast.cu": _GEMM_HEAD + (("K", INT32), ("lda", INT64), ("ldb", INT64)) + _EPILOGUE
    + (("vec_ok", INT32),),
    "wmma_generic.cu": _GEMM_HEAD + (("K", INT32),) + _OPERAND_STRIDES + _EPILOGUE
    + (("satf", INT32),),
    "wmma_subbyte.cu": _GEMM_HEAD + (("kbytes", INT32),) + _OPERAND_STRIDES + _EPILOGUE
    + (("satf", INT32),),
}
GEMM_PARAMS["mma_kmajor.cu"] = GEMM_PARAMS["wmma_subbyte.cu"]
#: the TMA kernels' parameters (RW_TMA): A and B as tensor maps, then C, D and the epilogue's
TMA_PARAMS: tuple[Param, ...] = (
    ("a_map", TENSOR_MAP), ("b_map", TENSOR_MAP), ("c", POINTER), ("d", POINTER), ("M", INT32),
    ("N", INT32), ("kbytes", INT32), ("scm", INT64), ("scn", INT64), ("sbc", INT64),
    ("batch", INT32), ("alpha", FLOAT64), ("beta", FLOAT64), ("c_code", INT32),
    ("d_code", INT32), ("ws", POINTER), ("splits", INT32))
#: split-K's second pass (RW_TMA_REDUCE)
REDUCE_PARAMS: tuple[Param, ...] = (
    ("ws", POINTER), ("splits", INT32), ("M", INT32), ("N", INT32), ("batch", INT32),
    ("c", POINTER), ("d", POINTER), ("scm", INT64), ("scn", INT64), ("sbc", INT64),
    ("alpha", FLOAT64), ("beta", FLOAT64), ("c_code", INT32), ("d_code", INT32))
DOT_PARAMS: tuple[Param, ...] = (("x", POINTER), ("sx", INT64), ("y", POINTER), ("sy", INT64),
                                 ("n", INT64), ("partial", POINTER))
DOT_FINAL_PARAMS: tuple[Param, ...] = (("partial", POINTER), ("count", INT32), ("out", POINTER),
                                       ("d_code", INT32))


def fast_eligible(problem: Problem) -> str | None:
    """None when the fast f16/bf16 kernel can run ``problem``, else why not (in words)."""
    if problem.op != "matmul" or problem.in_dtype not in ("float16", "bfloat16"):
        return "the fast kernel is for float16 / bfloat16 matmul"
    if problem.acc != "float32":
        return "the fast kernel accumulates in float32"
    if problem.saturate:
        return "the fast kernel does not saturate"
    if problem.d_dtype not in (problem.in_dtype, "float32"):
        return f"the fast kernel writes {problem.in_dtype} or float32"
    if problem.cc is not None and problem.cc < MIN_CC:
        return "cp.async needs sm_80+"
    for name, op in (("A", problem.a), ("B", problem.b)):
        if op.layout not in ("row", "col"):
            return f"{name} is {op.layout}: the fast kernel takes row- or column-major operands"
        if not op.rows_aligned:
            return (f"{name}'s rows are not all 16-byte aligned (ld={op.ld}, batch stride="
                    f"{op.batch_stride}, pointer alignment {op.align} bytes)")
    return None


def mma_kind(problem: Problem) -> str | None:
    """The PTX K-major kernel's kind that would compute ``problem`` (see :data:`MMA_KINDS`),
    whether or not its operands' layouts let it; None when no kind computes it."""
    if problem.op != "matmul" or problem.saturate:
        return None
    if problem.packed:
        return "b1and" if problem.packed == "bit" and problem.bitop == "and" else None
    if problem.in_dtype == "float32" and problem.precision != "tf32":
        return None
    if problem.in_dtype in ("float16", "bfloat16") and (
            problem.acc != "float32" or problem.d_dtype not in (problem.in_dtype, "float32")):
        return None
    return MMA_KINDS.get(problem.in_dtype)


def mma_eligible(problem: Problem, mn_major: bool = False) -> str | None:
    """None when the PTX K-major kernel can run ``problem``, else why not (in words); with
    ``mn_major``, the rule of a kernel that also reads the operands of
    :data:`MN_MAJOR_KINDS` MN-major (A column-major, B row-major)."""
    kind = mma_kind(problem)
    if kind is None:
        return ("the PTX mma.sync kernel computes AND popcounts of bit-packed operands, int8 "
                "and uint8 products, float16 and bfloat16 products accumulated in float32 "
                "(D in their type or float32), tf32 float32 products and float64 products, "
                "without saturation")
    if problem.cc is not None and problem.cc < MIN_CC:
        return "mma.sync and cp.async need sm_80+"
    if kind in MMA_SM90 and problem.cc is not None and problem.cc < (9, 0):
        major, minor = problem.cc
        return f"the {kind} mma.sync m16n8k4 needs sm_90+ (this GPU is sm_{major}{minor})"
    if mn_major and kind in MN_MAJOR_KINDS:
        for name, op in (("A", problem.a), ("B", problem.b)):
            if op.layout not in ("row", "col"):
                return (f"{name} is {op.layout}: the TMA kernel reads {kind} operands row- or "
                        "column-major")
    elif problem.a.layout != "row" or problem.b.layout != "col":
        return (f"A is {problem.a.layout}-major and B {problem.b.layout}-major: the PTX "
                f"{'wgmma' if mn_major else 'mma.sync'} kernel reads {kind} with A row-major "
                "and B column-major")
    for name, op in (("A", problem.a), ("B", problem.b)):
        if not op.rows_aligned:
            return (f"{name}'s rows are not all 16-byte aligned (ld={op.ld}, batch stride="
                    f"{op.batch_stride}, pointer alignment {op.align} bytes)")
    return None


def wgmma_eligible(problem: Problem, mn_major: bool = False) -> str | None:
    """None when the warpgroup (wgmma) K-major kernel can run ``problem``, else why not;
    ``mn_major`` as for :func:`mma_eligible`."""
    if why := mma_eligible(problem, mn_major):
        return why
    kind = mma_kind(problem)
    if kind not in WGMMA_KINDS:
        return f"wgmma has no {kind} instruction"
    if problem.cc is not None and problem.cc != WGMMA_CC:
        major, minor = problem.cc
        return f"wgmma needs sm_90a (this GPU is sm_{major}{minor})"
    return None


def tma_eligible(problem: Problem) -> str | None:
    """None when the TMA-fed warpgroup kernel can run ``problem``, else why not: the
    warpgroup kernel's rule, its 16-bit kinds in any major order of A and B."""
    if why := wgmma_eligible(problem, mn_major=True):
        return why
    for name, op in (("A", problem.a), ("B", problem.b)):
        if problem.batch > 1 and op.batch_stride == 0:
            return (f"{name} is shared by the {problem.batch} batch entries (batch stride 0): "
                    "the TMA kernel's tensor maps step through distinct entries")
    return None


def tma_tile(name: str) -> TmaTile | None:
    """The TMA tile a config name stands for: one of :data:`TMA_TILES`, or one of them split
    along K (``<name>_k<splits>``, 2 .. :data:`MAX_SPLIT` splits); None for any other name."""
    found = re.fullmatch(r"(.+)_k(\d+)", name)
    base = TMA_TILES.get(found.group(1) if found else name)
    if base is None:
        return None
    if not found:
        return base
    split = int(found.group(2))
    return replace(base, split=split) if 2 <= split <= MAX_SPLIT else None


def kbytes_of(problem: Problem) -> int:
    """The bytes of K in a row of A (packed bytes for sub-byte operands)."""
    return int(problem.a.cols * dtypes.get(problem.a.dtype).itemsize)


def tma_choice(problem: Problem) -> TmaTile:
    """The TMA tile the backend runs a problem on unless told otherwise, by waves of
    :data:`WAVE_SMS` multiprocessors: 64-row tiles for at most 64 rows (:data:`TMA_SKINNY`),
    else 128 x 256; where those tiles fill less than half a wave, K split so that the tiles
    times the splits fill at most one (each split at least :data:`MIN_SPLIT_KTILES` k-tiles,
    at most :data:`MAX_SPLIT` splits)."""
    tile = TMA_TILES[TMA_SKINNY] if problem.m <= 64 else next(iter(TMA_TILES.values()))
    tiles = max(1, -(-problem.m // tile.bm) * -(-problem.n // tile.bn) * problem.batch)
    if 2 * tiles >= WAVE_SMS:
        return tile
    ktiles = -(-kbytes_of(problem) // MMA_ROW_BYTES)
    split = min(WAVE_SMS // tiles, ktiles // MIN_SPLIT_KTILES, MAX_SPLIT)
    return replace(tile, split=split) if split > 1 else tile


def reduce_kernel(problem: Problem) -> str:
    """Split-K's second pass for ``problem``: by its accumulators' type."""
    return REDUCE_KERNELS["int32" if problem.acc == "int32" else "float32"]


def tma_smem_bytes(bm: int, bn: int, stages: int) -> int:
    """Dynamic shared memory of a TMA kernel instance (TmaGemm::kSmemBytes): the stages from a
    1024-byte boundary, then two mbarriers per stage."""
    return stages * (bm + bn) * MMA_ROW_BYTES + 2 * stages * 8 + WGMMA_ALIGN


def mma_smem_bytes(bm: int, bn: int, stages: int, warpgroup: bool = False) -> int:
    """Dynamic shared memory of a K-major kernel instance (KMajorGemm::kSmemBytes)."""
    return stages * (bm + bn) * MMA_ROW_BYTES + (WGMMA_ALIGN if warpgroup else 0)


def _lay(op: Operand) -> str:
    return "c" if op.layout == "col" else "r"


def tma_boxes(problem: Problem, tile: TmaTile) -> tuple[int, int]:
    """The rows of the TMA kernel's boxes of A and of B: a K-major operand's tile rows (B's
    shared by the cluster), an MN-major one's k's (:data:`MN_BOX_ROWS`)."""
    return (tile.bm if problem.a.layout == "row" else MN_BOX_ROWS,
            tile.bn // tile.cluster if problem.b.layout == "col" else MN_BOX_ROWS)


@dataclass(frozen=True)
class Kernel:
    """One entry point: its source file, name, block size and dynamic shared memory, the
    suffix of the target it needs ("a": sm_90a's architecture-specific instructions) and, for a
    TMA kernel, the rows of its boxes of A and of B (None: the kernel reads pointers), the
    CTAs of its clusters and the splits of K."""

    source: str
    name: str
    threads: int
    smem: int = 0
    tile: tuple[int, int] = (0, 0)
    arch_suffix: str = ""
    tma_boxes: tuple[int, int] | None = None
    cluster: int = 1
    splits: int = 1

    @property
    def params(self) -> tuple[Param, ...]:
        """The kernel's parameter list (:data:`GEMM_PARAMS`, :data:`TMA_PARAMS`)."""
        return TMA_PARAMS if self.tma_boxes else GEMM_PARAMS[self.source]


def fast_smem_bytes(bm: int, bn: int, bk: int, stages: int, a_row: bool, b_row: bool) -> int:
    """Dynamic shared memory of a fast-kernel instance (FastGemm::kSmemBytes)."""
    lda = (bk if a_row else bm) + FAST_PAD
    ldb = (bn if b_row else bk) + FAST_PAD
    stage_a = (bm if a_row else bk) * lda
    stage_b = (bk if b_row else bn) * ldb
    return stages * (stage_a + stage_b) * 2


def kernel_for(problem: Problem, config: Config) -> Kernel:
    """The entry point that runs ``problem`` under ``config`` (for a staged config: the
    kernel run on the staged copies); raises naming the rule when the config does not apply
    to the problem."""
    problem, config = staging.unwrap(problem, config)
    if problem.op == "dot":
        if config.name not in DOT_CONFIGS:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r}: dot configs are "
                                  f"{', '.join(DOT_CONFIGS)}")
        return Kernel("dot.cu", "", DOT_THREADS)
    lay = _lay(problem.a) + _lay(problem.b)
    dtype = problem.in_dtype
    if config.name in FAST_TILES:
        _require(fast_eligible(problem), config)
        fast = FAST_TILES[config.name]
        return Kernel("wmma_fast.cu",
                      f"rw_fast_{SHORT[dtype]}_{fast.name.removeprefix('fast_')}_{lay}",
                      fast.warps * 32,
                      fast_smem_bytes(fast.bm, fast.bn, fast.bk, fast.stages, lay[0] == "r",
                                      lay[1] == "r"), (fast.bm, fast.bn))
    tma = tma_tile(config.name)
    if tma is None and config.name.startswith("tma_"):
        raise InvalidArgument(f"raw_wmma: config is {config.name!r}: the TMA configs are "
                              f"{', '.join(TMA_TILES)}, each also split along K "
                              f"(<name>_k<splits>, 2 .. {MAX_SPLIT} splits)")
    if tma is not None:
        _require(tma_eligible(problem), config)
        suffix = "" if lay == "rc" else f"_{lay}"
        entry = f"rw_tma_{mma_kind(problem)}_{tma.bm}x{tma.bn}_c{tma.cluster}{suffix}"
        return Kernel("mma_kmajor.cu", entry, tma.warps * 32,
                      tma_smem_bytes(tma.bm, tma.bn, tma.stages), (tma.bm, tma.bn), "a",
                      tma_boxes(problem, tma), tma.cluster, tma.split)
    if config.name in WGMMA_TILES:
        _require(wgmma_eligible(problem), config)
        wg = WGMMA_TILES[config.name]
        return Kernel("mma_kmajor.cu",
                      f"rw_wgmma_{mma_kind(problem)}_{wg.name.removeprefix('wgmma_')}",
                      wg.warps * 32, mma_smem_bytes(wg.bm, wg.bn, wg.stages, warpgroup=True),
                      (wg.bm, wg.bn), "a")
    if config.name.startswith("mma_"):
        kind = mma_kind(problem)
        tiles = MMA_TILES.get(kind or "", {})
        if config.name not in tiles:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r}: {problem.describe()} "
                                  f"takes {', '.join(tiles) or 'no mma_* config'}")
        _require(mma_eligible(problem), config)
        mma = tiles[config.name]
        return Kernel("mma_kmajor.cu", f"rw_mma_{kind}_{mma.name.removeprefix('mma_')}",
                      mma.warps * 32, mma_smem_bytes(mma.bm, mma.bn, mma.stages),
                      (mma.bm, mma.bn))
    frag = config.name.removeprefix("wmma_")
    if not config.name.startswith("wmma_") or frag not in FRAGS.get(dtype, ()):
        raise InvalidArgument(f"raw_wmma: config is {config.name!r}: {dtype} takes "
                              f"{', '.join('wmma_' + f for f in FRAGS.get(dtype, ()))}"
                              f"{' or fast_*' if not fast_eligible(problem) else ''}")
    if problem.packed:
        kind = (f"b1{problem.bitop}" if problem.packed == "bit" else SHORT[dtype])
        return Kernel("wmma_subbyte.cu", f"rw_gemm_{kind}_s32_{frag}", GENERIC_THREADS, 0,
                      generic_tile(frag))
    acc = {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "s32"}[problem.acc]
    return Kernel("wmma_generic.cu", f"rw_gemm_{SHORT[dtype]}_{acc}_{frag}_{lay}",
                  GENERIC_THREADS, 0, generic_tile(frag))


def generic_tile(frag: str) -> tuple[int, int]:
    """(BM, BN) of the generic or sub-byte kernel for a fragment shape: 2 x 2 warps, each
    owning WARP_FRAGS fragments (sub-byte: 4 x 4 fragments of 8 x 8)."""
    fm, fn, _ = (int(x) for x in frag.split("x"))
    wfm, wfn = WARP_FRAGS.get(frag, (4, 4))
    return 2 * wfm * fm, 2 * wfn * fn


def _require(why: str | None, config: Config) -> None:
    """Raise naming the rule ``why`` where ``config``'s kernel cannot run the problem."""
    if why:
        raise InvalidArgument(f"raw_wmma: config is {config.name!r} but {why}")


def fragment(frag: str) -> WmmaFragment:
    """The generic or sub-byte kernel's record for a fragment shape."""
    return WmmaFragment(frag, *generic_tile(frag))


def dot_kernel_name(problem: Problem, vec: bool) -> str:
    """The pass-1 dot entry point for ``problem`` (contiguous 16-byte aligned or strided)."""
    short = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
    name = f"rw_dot_{short[problem.in_dtype]}_{'vec' if vec else 'strided'}"
    if vec and problem.in_dtype == "float16" and problem.acc == "float16":
        name += "_hfma2"
    return name


def dot_final_name(problem: Problem) -> str:
    """The pass-2 dot entry point: it sums float64 partials for float32 and float64 inputs,
    float32 partials for 16-bit ones."""
    return "rw_dot_final_f64" if _wide_dot(problem) else "rw_dot_final_f32"


def _wide_dot(problem: Problem) -> bool:
    return problem.in_dtype in ("float32", "float64")
