"""The raw WMMA backend: CUDA C++ of our own against ``nvcuda::wmma`` (``raw_wmma/*.cu``),
compiled at run time by :mod:`multibackend.gpu.nvrtc` and launched through the CUDA driver API
(:mod:`multibackend.gpu.driver`).

Kernel families (one templated body each, one ``extern "C"`` entry point per instance):

- ``wmma_fast.cu``: the fast f16/bf16 GEMM (f32 accumulation): cp.async multi-stage pipeline,
  several fragments per warp, padded shared tiles, vectorized epilogue. Configs ``fast_*``.
  It needs 16-byte aligned operand rows; other problems take the generic kernel.
- ``wmma_generic.cu``: every byte-or-wider fragment type of the CUDA guide (f16 with f32 or f16
  accumulation, bf16, tf32, f64, s8, u8) in every shape, A and B row- or column-major (strided
  operands too), any alignment: tiles are staged element by element through aligned shared
  memory. Configs ``wmma_<m>x<n>x<k>``.
- ``wmma_subbyte.cu``: s4 / u4 (8x8x32) and b1 XOR / AND (8x8x128) on operands packed along K
  (see :mod:`multibackend.core.packing`).
- ``mma_kmajor.cu``: the PTX mma.sync GEMM on K-contiguous operands (A row-major, B
  column-major, 16-byte aligned rows), register fragments loaded by ldmatrix from a cp.async
  pipeline, two steps' fragments in registers: b1 AND (``m16n8k256`` or ``m16n8k128``), s8 and
  u8 (``m16n8k32``, int32 out), f16 and bf16 (``m16n8k16``, float32 accumulation), tf32
  (``m16n8k8``, float32 out) and, on sm_90, f64 (``m16n8k4``, fragments read with 8-byte
  shared loads). Configs ``mma_*``. On sm_90a the same pipeline feeds warpgroups' ``wgmma``
  (b1 AND, s8, u8, f16, bf16, tf32), which read both operands from the swizzled stages
  through shared memory descriptors (configs ``wgmma_*``), and the same wgmma GEMM is fed by
  the TMA unit: a producer warpgroup loads the stages through tensor maps
  (:mod:`multibackend.gpu.tensormap`) under mbarriers, optionally in 2-CTA clusters multicasting
  B (configs ``tma_*``, the default there). Products of those types in other layouts reach
  these kernels on K-major staged copies (``staged:tma_*``, ``staged:mma_*``: see
  :mod:`multibackend.gpu.staging`), offered ahead of the WMMA kernels (after the fast one for
  f16 / bf16).
- ``dot.cu``: two-pass vector dot products for f16, bf16, f32 and f64.

Each kernel is compiled alone (``-DRW_ONLY=<entry>``) the first time it is needed and its
cubin cached on disk; ``prepare`` does it (and loads the cubin) ahead of a timed run.

Launching: the first call of a kind (problem, config, operand strides and alignment, alpha
and beta) builds its :class:`~multibackend.gpu.driver.Launch`: the loaded function, grid, block,
dynamic shared memory and an argument buffer laid out as the kernel's parameter list
(:data:`GEMM_PARAMS`, :data:`DOT_PARAMS`, :data:`DOT_FINAL_PARAMS`, kept in step with the
``extern "C"`` signatures, which a CPU test parses). Every later call of that kind, through
``run`` or the function ``bind`` returns, writes only the array pointers into the buffer and
calls ``cuLaunchKernel`` with the caller's raw stream handle: no allocation, no
synchronization, nothing CuPy or torch does per launch. The dot's scratch buffer for the
block partials is allocated once per (device, stream).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from multibackend.backends.base import Backend
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands
from multibackend.core.environment import package_version
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import Operand, Problem
from multibackend.gpu import driver, native, nvrtc, staging, tensormap
from multibackend.gpu.driver import FLOAT64, INT32, INT64, POINTER, TENSOR_MAP, Param
from multibackend.raw_wmma import source_path

#: element codes of C and D, as raw_wmma/common.cuh numbers them
ELEM_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int32": 4}
MIN_CC = (8, 0)
GENERIC_THREADS = 128
DOT_THREADS = 256
DOT_UNROLL = 4
MAX_GRID_Y = 65535

#: fast-kernel tiles: name -> (BM, BN, BK, warps along M, warps along N, stages); default first
#: (kept in step with the RW_FAST_DTYPE list in raw_wmma/wmma_fast.cu)
FAST_TILES = {
    "fast_128x256x32_s3": (128, 256, 32, 2, 4, 3),
    "fast_128x128x64_s3": (128, 128, 64, 2, 2, 3),
    "fast_256x128x64_s3": (256, 128, 64, 4, 2, 3),
    "fast_128x256x64_s3": (128, 256, 64, 2, 4, 3),
    "fast_128x256x64_s4": (128, 256, 64, 2, 4, 4),
    "fast_128x128x32_s4": (128, 128, 32, 2, 4, 4),
    "fast_128x128x32_s3": (128, 128, 32, 2, 2, 3),
}
FAST_PAD = 8

#: the PTX K-major kernel's kind for each input type (b1: AND products only)
MMA_KINDS = {"bit": "b1and", "int8": "s8", "uint8": "u8", "float16": "f16", "bfloat16": "bf16",
             "float32": "tf32", "float64": "f64"}
#: kinds whose instruction exists from sm_90 on (f64 m16n8k4)
MMA_SM90 = ("f64",)
_MMA_TILES = {"128x256_s4": (128, 256, 2, 4, 4), "256x128_s4": (256, 128, 4, 2, 4),
              "128x128_s4": (128, 128, 2, 2, 4)}
#: PTX K-major tiles per kind: name -> (the instruction's K, BM, BN, warps along M, warps
#: along N, stages); the default first (kept in step with the RW_MMA list in
#: raw_wmma/mma_kmajor.cu)
MMA_TILES: dict[str, dict[str, tuple[int, int, int, int, int, int]]] = {
    kind: {f"mma_m16n8k{k}_{tile}": (k, *shape) for tile, shape in _MMA_TILES.items()}
    for kind, k in (("b1and", 256), ("s8", 32), ("u8", 32), ("f16", 16), ("bf16", 16),
                    ("tf32", 8))}
MMA_TILES["b1and"]["mma_m16n8k128_128x256_s4"] = (128, *_MMA_TILES["128x256_s4"])
# f64: warp tiles of 64 x 32 and 32 x 64 (64 double accumulators per thread)
MMA_TILES["f64"] = {"mma_m16n8k4_64x128_s4": (4, 64, 128, 2, 2, 4),
                    "mma_m16n8k4_128x128_s4": (4, 128, 128, 2, 4, 4),
                    "mma_m16n8k4_128x64_s4": (4, 128, 64, 2, 2, 4)}
#: bytes of K each stage of the K-major kernel holds per row
MMA_ROW_BYTES = 128
#: kinds the warpgroup (wgmma) K-major kernel computes (sm_90a; wgmma has no f64)
WGMMA_KINDS = ("b1and", "s8", "u8", "f16", "bf16", "tf32")
#: warpgroup K-major tiles: name -> (BM, BN, stages), one warp per 16 rows; the default first
#: (kept in step with RW_WGMMA_TILES in raw_wmma/mma_kmajor.cu)
WGMMA_TILES = {"wgmma_256x128_s4": (256, 128, 4), "wgmma_128x256_s4": (128, 256, 4)}
#: the K-major kernels' config names, and how many of them a product in another layout is
#: offered as K-major staged configs (its first ones for the staged problem)
KMAJOR_PREFIXES = ("tma_", "wgmma_", "mma_")
KMAJOR_OFFERED = 2
#: the compute capability whose architecture-specific target (sm_90a) has wgmma
WGMMA_CC = (9, 0)
#: the bytes the warpgroup kernel's stages may need to start on a 1024-byte boundary
WGMMA_ALIGN = 1024
#: TMA-fed warpgroup tiles: name -> (BM, BN, stages, CTAs per cluster sharing B's loads);
#: BM / 64 consumer warpgroups and one producer warpgroup; the default first (kept in step
#: with RW_TMA_TILES in raw_wmma/mma_kmajor.cu)
TMA_TILES = {"tma_128x256_c1": (128, 256, 4, 1), "tma_128x256_c2": (128, 256, 4, 2)}

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
BLOCKS_PER_SM = {"dot_8bps": 8, "dot_4bps": 4}

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
    ("d_code", INT32))
DOT_PARAMS: tuple[Param, ...] = (("x", POINTER), ("sx", INT64), ("y", POINTER), ("sy", INT64),
                                 ("n", INT64), ("partial", POINTER))
DOT_FINAL_PARAMS: tuple[Param, ...] = (("partial", POINTER), ("count", INT32), ("out", POINTER),
                                       ("d_code", INT32))
#: prepared launches kept for ``run`` (cleared when full)
LAUNCH_CACHE_LIMIT = 1024

_SATF_NOTE = ("saturate=True applies WMMA's satf in the epilogue (the f16 mma_sync of CUDA 13 "
              "takes no satf flag): +-inf -> +-65504, NaN -> +0")


def _saturate_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.saturate and (problem.in_dtype != "float16" or problem.d_dtype != "float16"):
        return ("saturate", f"saturate=True (satf) is offered for float16 inputs with a "
                            f"float16 output, not {problem.in_dtype} -> {problem.d_dtype}")
    return None


def _grid_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.op != "matmul":
        return None
    tiles = -(-problem.m // 32) * -(-problem.n // 32)
    if tiles > 2**31 - 1:
        return ("size", f"M={problem.m} x N={problem.n} needs {tiles} blocks of 32 x 32: more "
                        "than a grid holds (2**31 - 1)")
    return None


def _capability() -> Capability:
    i32 = ("int32",)
    rules = (
        DtypeRule("float16", accs=("float32", "float16"), outs=("float16", "float32"),
                  min_cc=MIN_CC),
        DtypeRule("bfloat16", accs=("float32",), outs=("bfloat16", "float32"), min_cc=MIN_CC),
        DtypeRule("float32", accs=("float32",), outs=("float32",), min_cc=MIN_CC,
                  precisions=("tf32",),
                  note="float32 operands are rounded to tf32 (__float_to_tf32) in the WMMA "
                       "and mma.sync fragments; the wgmma kernel's tensor cores ignore their "
                       "low 13 bits (truncation)"),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=MIN_CC),
        DtypeRule("int8", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("uint8", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("int4", accs=i32, outs=i32, min_cc=MIN_CC,
                  note="s4 WMMA is emulated on sm_90 (a called IMMA.8816 routine): correct, "
                       "not fast", note_cc=((9, 0),)),
        DtypeRule("uint4", accs=i32, outs=i32, min_cc=MIN_CC,
                  note="u4 WMMA is emulated on sm_90 (a called IMMA.8816 routine): correct, "
                       "not fast", note_cc=((9, 0),)),
        DtypeRule("bit", accs=i32, outs=i32, min_cc=MIN_CC),
        DtypeRule("float16", accs=("float32", "float16"), outs=("float32", "float16"),
                  min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("float32",), min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), min_cc=MIN_CC, ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), min_cc=MIN_CC, ops=("dot",)),
    )
    return Capability("raw_wmma", rules, batched=True, saturate=True,
                      extra_checks=(_saturate_rule, _grid_rule))


# ---- kernel choice (pure: from the Problem and Config alone) -----------------------------

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


def mma_eligible(problem: Problem) -> str | None:
    """None when the PTX K-major kernel can run ``problem``, else why not (in words)."""
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
    if problem.a.layout != "row" or problem.b.layout != "col":
        return (f"A is {problem.a.layout}-major and B {problem.b.layout}-major: the PTX "
                "mma.sync kernel reads A row-major and B column-major")
    for name, op in (("A", problem.a), ("B", problem.b)):
        if not op.rows_aligned:
            return (f"{name}'s rows are not all 16-byte aligned (ld={op.ld}, batch stride="
                    f"{op.batch_stride}, pointer alignment {op.align} bytes)")
    return None


def wgmma_eligible(problem: Problem) -> str | None:
    """None when the warpgroup (wgmma) K-major kernel can run ``problem``, else why not."""
    if why := mma_eligible(problem):
        return why
    kind = mma_kind(problem)
    if kind not in WGMMA_KINDS:
        return f"wgmma has no {kind} instruction"
    if problem.cc is not None and problem.cc != WGMMA_CC:
        major, minor = problem.cc
        return f"wgmma needs sm_90a (this GPU is sm_{major}{minor})"
    return None


def tma_eligible(problem: Problem) -> str | None:
    """None when the TMA-fed warpgroup kernel can run ``problem``, else why not."""
    if why := wgmma_eligible(problem):
        return why
    for name, op in (("A", problem.a), ("B", problem.b)):
        if problem.batch > 1 and op.batch_stride == 0:
            return (f"{name} is shared by the {problem.batch} batch entries (batch stride 0): "
                    "the TMA kernel's tensor maps step through distinct entries")
    return None


def tma_smem_bytes(bm: int, bn: int, stages: int) -> int:
    """Dynamic shared memory of a TMA kernel instance (TmaGemm::kSmemBytes): the stages from a
    1024-byte boundary, then two mbarriers per stage."""
    return stages * (bm + bn) * MMA_ROW_BYTES + 2 * stages * 8 + WGMMA_ALIGN


def mma_smem_bytes(bm: int, bn: int, stages: int, warpgroup: bool = False) -> int:
    """Dynamic shared memory of a K-major kernel instance (KMajorGemm::kSmemBytes)."""
    return stages * (bm + bn) * MMA_ROW_BYTES + (WGMMA_ALIGN if warpgroup else 0)


def _lay(op: Operand) -> str:
    return "c" if op.layout == "col" else "r"


@dataclass(frozen=True)
class Kernel:
    """One entry point: its source file, name, block size and dynamic shared memory, the
    suffix of the target it needs ("a": sm_90a's architecture-specific instructions) and, for a
    TMA kernel, the rows of its boxes of A and of B (None: the kernel reads pointers)."""

    source: str
    name: str
    threads: int
    smem: int = 0
    tile: tuple[int, int] = (0, 0)
    arch_suffix: str = ""
    tma_boxes: tuple[int, int] | None = None

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
        if config.name not in BLOCKS_PER_SM:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r}: dot configs are "
                                  f"{', '.join(BLOCKS_PER_SM)}")
        return Kernel("dot.cu", "", DOT_THREADS)
    lay = _lay(problem.a) + _lay(problem.b)
    dtype = problem.in_dtype
    if config.name in FAST_TILES:
        why = fast_eligible(problem)
        if why:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r} but {why}")
        bm, bn, bk, wm, wn, stages = FAST_TILES[config.name]
        short = SHORT[dtype]
        return Kernel("wmma_fast.cu", f"rw_fast_{short}_{bm}x{bn}x{bk}_s{stages}_{lay}",
                      wm * wn * 32,
                      fast_smem_bytes(bm, bn, bk, stages, lay[0] == "r", lay[1] == "r"),
                      (bm, bn))
    if config.name in TMA_TILES:
        why = tma_eligible(problem)
        if why:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r} but {why}")
        bm, bn, stages, cluster = TMA_TILES[config.name]
        return Kernel("mma_kmajor.cu",
                      f"rw_tma_{mma_kind(problem)}_{config.name.removeprefix('tma_')}",
                      bm // 16 * 32 + 128, tma_smem_bytes(bm, bn, stages), (bm, bn), "a",
                      (bm, bn // cluster))
    if config.name in WGMMA_TILES:
        why = wgmma_eligible(problem)
        if why:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r} but {why}")
        bm, bn, stages = WGMMA_TILES[config.name]
        return Kernel("mma_kmajor.cu",
                      f"rw_wgmma_{mma_kind(problem)}_{config.name.removeprefix('wgmma_')}",
                      bm // 16 * 32, mma_smem_bytes(bm, bn, stages, warpgroup=True), (bm, bn),
                      "a")
    if config.name.startswith("mma_"):
        kind = mma_kind(problem)
        tiles = MMA_TILES.get(kind or "", {})
        if config.name not in tiles:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r}: {problem.describe()} "
                                  f"takes {', '.join(tiles) or 'no mma_* config'}")
        why = mma_eligible(problem)
        if why:
            raise InvalidArgument(f"raw_wmma: config is {config.name!r} but {why}")
        _, bm, bn, wm, wn, stages = tiles[config.name]
        return Kernel("mma_kmajor.cu", f"rw_mma_{kind}_{config.name.removeprefix('mma_')}",
                      wm * wn * 32, mma_smem_bytes(bm, bn, stages), (bm, bn))
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


# ---- launch arguments ---------------------------------------------------------------------

def _strides3(t: Any) -> tuple[int, int, int]:
    """A 2-D or 3-D operand's (batch, row, column) strides; 0 as the batch stride of 2-D."""
    s = t.stride()
    return s if len(s) == 3 else (0, *s)


def gemm_c(problem: Problem, ops: Operands) -> Any:
    """The C operand the kernel reads, or None (no C, or beta = 0)."""
    return ops.c if (ops.c is not None and problem.has_c and ops.beta != 0) else None


def gemm_grid(problem: Problem, kernel: Kernel) -> tuple[int, int, int]:
    """The grid of a GEMM kernel: x over the output tiles (for a TMA kernel whose clusters
    share B, whole clusters along M), y over the batch (each block loops over the batch
    entries beyond MAX_GRID_Y)."""
    bm, bn = kernel.tile
    rows = -(-problem.m // bm)
    if kernel.tma_boxes:
        cluster = bn // kernel.tma_boxes[1]
        rows = -(-rows // cluster) * cluster
    return rows * -(-problem.n // bn), min(problem.batch, MAX_GRID_Y), 1


def gemm_arguments(problem: Problem, ops: Operands, kernel: Kernel) -> dict[str, int | float]:
    """The value of each parameter of ``kernel`` (named as in :data:`GEMM_PARAMS`) for the
    operands ``ops``, which may be 2-D (batch 1) or 3-D."""
    a, b, d = ops.a, ops.b, ops.d
    c = gemm_c(problem, ops)
    sa, sb = _strides3(a), _strides3(b)
    sc = _strides3(c) if c is not None else (0, 0, 0)
    code = ELEM_CODES[problem.d_dtype]  # C has D's dtype
    values: dict[str, int | float] = {
        "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr() if c is not None else 0,
        "d": d.data_ptr(), "M": problem.m, "N": problem.n,
        "scm": sc[1], "scn": sc[2], "sba": sa[0], "sbb": sb[0], "sbc": sc[0],
        "batch": problem.batch, "alpha": float(ops.alpha), "beta": float(ops.beta),
        "c_code": code, "d_code": code}
    if kernel.tma_boxes:
        del values["a"], values["b"], values["sba"], values["sbb"]
        values["kbytes"] = a.shape[-1] * a.element_size()
    elif kernel.source == "wmma_fast.cu":
        values.update(
            K=problem.k, lda=sa[1] if problem.a.layout == "row" else sa[2],
            ldb=sb[1] if problem.b.layout == "row" else sb[2],
            vec_ok=int(problem.d_dtype == problem.in_dtype and problem.n % 8 == 0
                       and d.data_ptr() % 16 == 0))
    else:
        values.update(sam=sa[1], sak=sa[2], sbk=sb[1], sbn=sb[2], satf=int(problem.saturate))
        if kernel.source in ("wmma_subbyte.cu", "mma_kmajor.cu"):
            values["kbytes"] = a.shape[-1] * a.element_size()
        else:
            values["K"] = problem.k
    return values


def tensor_maps(problem: Problem, ops: Operands,
                kernel: Kernel) -> tuple[tensormap.TensorMap, tensormap.TensorMap]:
    """The tensor maps of A (M rows of K bytes) and B (N columns of K bytes) a TMA kernel
    reads, with its boxes' rows."""
    a, b = ops.a, ops.b
    sa, sb = _strides3(a), _strides3(b)
    kbytes, size = a.shape[-1] * a.element_size(), a.element_size()
    box_a, box_b = kernel.tma_boxes
    return (tensormap.TensorMap("A", a.data_ptr(), kbytes, problem.m, sa[1] * size,
                                problem.batch, sa[0] * size, box_a),
            tensormap.TensorMap("B", b.data_ptr(), kbytes, problem.n, sb[2] * size,
                                problem.batch, sb[0] * size, box_b))


def dot_plan(problem: Problem, ops: Operands, config: Config, sms: int) -> tuple[bool, int]:
    """(whether pass 1 reads 16-byte vectors, its number of blocks) for ``ops`` on a device
    of ``sms`` multiprocessors."""
    x, y = ops.a, ops.b
    vec = (x.stride(0) == 1 and y.stride(0) == 1 and x.data_ptr() % 16 == 0
           and y.data_ptr() % 16 == 0)
    per_step = 16 // x.element_size() if vec else 1
    wanted = -(-problem.k // (DOT_THREADS * per_step * DOT_UNROLL))
    return vec, max(1, min(BLOCKS_PER_SM[config.name] * sms, wanted))


def dot_arguments(problem: Problem, ops: Operands, partial: int,
                  blocks: int) -> tuple[dict[str, int], dict[str, int]]:
    """The values of the parameters of dot's pass 1 (:data:`DOT_PARAMS`) and pass 2
    (:data:`DOT_FINAL_PARAMS`), ``partial`` the address of the block partials."""
    x, y = ops.a, ops.b
    first = {"x": x.data_ptr(), "sx": x.stride(0), "y": y.data_ptr(), "sy": y.stride(0),
             "n": problem.k, "partial": partial}
    final = {"partial": partial, "count": blocks, "out": ops.d.data_ptr(),
             "d_code": ELEM_CODES[problem.d_dtype]}
    return first, final


# ---- the backend ------------------------------------------------------------------------

#: a prepared launch: (a, b, c, d, stream) -> None (see Backend.bind)
BoundLaunch = Callable[[Any, Any, Any, Any, int], None]


class DotLaunch(NamedTuple):
    """The dot's two passes as :meth:`RawWmmaBackend.bind` prepared them, and ``partial``:
    the address of the block partials' buffer for a raw stream handle."""

    first: driver.Launch
    final: driver.Launch
    partial: Callable[[int], int]


class RawWmmaBackend(Backend):
    name = "raw_wmma"
    takes_matrices = True  # the kernels read 2-D operands as batch-1 ones

    def __init__(self) -> None:
        self._capability = _capability()
        self._functions: dict[tuple[int, str], driver.Function] = {}
        self._scratch: dict[tuple[int, int, bool], tuple[Any, int]] = {}
        self._launches: dict[tuple, BoundLaunch] = {}
        self._prepared: dict[tuple, driver.Launch] = {}  # the bound gemms' launches
        self._lock = threading.Lock()

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        try:
            import cuda.bindings.driver  # noqa: F401
            import torch
        except Exception as exc:  # noqa: BLE001 - recorded, never raised
            return self.unavailable("import", f"torch/cuda.bindings not importable: {exc}")
        try:
            if not torch.cuda.is_available():
                return self.unavailable("environment", "no CUDA GPU visible")
            nvrtc.compiler_version()
            nvrtc.include_dir()
        except Exception as exc:  # noqa: BLE001
            return self.unavailable("environment", str(exc))
        return None

    def versions(self) -> dict[str, str]:
        return {"compiler": nvrtc.compiler_version(),
                "cuda-bindings": package_version("cuda-bindings") or "none"}

    def note(self, problem: Problem) -> str | None:
        notes = [self.capability.note(problem)]
        if problem.op == "matmul":
            if problem.packed:
                if problem.a.layout != "row":
                    notes.append(f"A is {problem.a.layout}-major but sub-byte WMMA takes A "
                                 "row-major: it is transposed while staged into shared memory")
                if problem.b.layout != "col":
                    notes.append(f"B is {problem.b.layout}-major but sub-byte WMMA takes B "
                                 "column-major: it is transposed while staged into shared memory")
                if problem.bitop == "xor" and problem.cc == (9, 0):
                    notes.append("b1 XOR has no tensor-core instruction on sm_90: bmma_sync "
                                 "XOR is emulated from AND (correct, not fast)")

            if mma_kind(problem) and fast_eligible(problem) and (why := mma_eligible(problem)):
                notes.append(f"WMMA kernel, not the PTX mma.sync one ({why})")
            if problem.saturate:
                notes.append(_SATF_NOTE)
            for name, op in (("A", problem.a), ("B", problem.b)):
                if op.layout == "strided":
                    notes.append(f"{name} is strided: staged element by element into shared "
                                 "memory")
            if (problem.in_dtype in ("float16", "bfloat16") and problem.acc == "float32"
                    and not problem.saturate):
                why = fast_eligible(problem)
                if why:
                    notes.append(f"generic kernel ({why}): operands staged element by element "
                                 "through aligned shared memory")
        return "; ".join(n for n in notes if n) or None

    def configs(self, problem: Problem) -> list[Config]:
        if problem.op == "dot":
            return [Config.of(name, THREADS=DOT_THREADS, BLOCKS_PER_SM=bps)
                    for name, bps in BLOCKS_PER_SM.items()]
        out = []
        if tma_eligible(problem) is None:
            for name, (bm, bn, stages, cluster) in TMA_TILES.items():
                out.append(Config.of(name, BM=bm, BN=bn, STAGES=stages, WARPS=bm // 16 + 4,
                                     CLUSTER=cluster))
        if wgmma_eligible(problem) is None:
            for name, (bm, bn, stages) in WGMMA_TILES.items():
                out.append(Config.of(name, BM=bm, BN=bn, STAGES=stages, WARPS=bm // 16))
        # the K-major kernels on copies of A row-major and B column-major (staging.py): ahead
        # of the WMMA kernels, after the fast f16 / bf16 one (no copy, no stream pinning)
        kmajor = (staging.offered(self, problem, KMAJOR_OFFERED, kmajor=True,
                                  keep=lambda c: c.name.startswith(KMAJOR_PREFIXES))
                  if mma_kind(problem) and mma_eligible(problem) is not None else [])
        sixteen_bit = problem.in_dtype in ("float16", "bfloat16")
        if not sixteen_bit:
            out += kmajor
        fast = fast_eligible(problem)
        if fast is not None and sixteen_bit:
            # the fast kernel on staged copies (see :mod:`multibackend.gpu.staging`) comes first
            if fast_eligible(staging.staged_problem(problem)) is None:
                out += staging.offered(self, problem, len(FAST_TILES))
        if fast is None:
            for name, (bm, bn, bk, wm, wn, stages) in FAST_TILES.items():
                out.append(Config.of(name, BM=bm, BN=bn, BK=bk, STAGES=stages,
                                     WARPS=wm * wn, FRAG="16x16x16"))
        if sixteen_bit:
            out += kmajor
        if mma_eligible(problem) is None:
            for name, (k, bm, bn, wm, wn, stages) in MMA_TILES[mma_kind(problem)].items():
                out.append(Config.of(name, MMA_K=k, BM=bm, BN=bn, STAGES=stages, WARPS=wm * wn))
        for frag in FRAGS.get(problem.in_dtype, ()):
            bm, bn = generic_tile(frag)
            out.append(Config.of(f"wmma_{frag}", FRAG=frag, BM=bm, BN=bn, STAGES=1, WARPS=4))
        return out

    # -- compile and load --

    def _function(self, problem: Problem, source: str, name: str, smem: int = 0,
                  arch_suffix: str = "") -> driver.Function:
        device = problem.device_index
        key = (device, name)
        fn = self._functions.get(key)
        if fn is None:
            with self._lock:
                fn = self._functions.get(key)
                if fn is None:
                    compiled = nvrtc.compile_cubin(source_path(source), name,
                                                   nvrtc.arch(device, problem.cc) + arch_suffix,
                                                   [f"RW_ONLY={name}"])
                    fn = driver.load(compiled.path.read_bytes(), name, device, smem)
                    self._functions[key] = fn
        return fn

    def prepare(self, problem: Problem, config: Config) -> None:
        problem, config = staging.unwrap(problem, config)
        kernel = kernel_for(problem, config)
        if problem.op == "dot":
            for vec in (True, False):
                self._function(problem, kernel.source, dot_kernel_name(problem, vec))
            self._function(problem, kernel.source, dot_final_name(problem))
        else:
            self._function(problem, kernel.source, kernel.name, kernel.smem, kernel.arch_suffix)

    # -- launch --

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if staging.is_staged(config):
            staging.run(problem, operands, config, self.run)
            return
        self.bind(problem, config, operands)(operands.a, operands.b, operands.c, operands.d,
                                             operands.stream)

    def bind(self, problem: Problem, config: Config,
             operands: Operands) -> BoundLaunch | None:
        """The launch of ``problem`` under ``config`` for operands like ``operands``, prepared
        once and kept (keyed by what its argument buffer holds besides the array pointers);
        None for a staged config, whose copies :meth:`run` makes on every call."""
        if staging.is_staged(config):
            return None
        key = self._launch_key(problem, config, operands)
        bound = self._launches.get(key)
        if bound is None:
            kernel = kernel_for(problem, config)
            if problem.op == "dot":
                bound, prepared = self._bind_dot(problem, config, kernel, operands)
            else:
                bound, prepared = self._bind_gemm(problem, kernel, operands)
            with self._lock:
                if len(self._launches) >= LAUNCH_CACHE_LIMIT:
                    self._launches.clear()
                    self._prepared.clear()
                self._launches[key] = bound
                self._prepared[key] = prepared
        return bound

    def native(self, problem: Problem, config: Config,
               operands: Operands) -> native.Native | None:
        """The fast or generic kernel's launch as :meth:`bind` prepared it, for a product
        without C — for a staged config, after the copies of :func:`staging.native_copies`,
        its kernel reading them where they lie (the plan runs on the caller's stream only);
        the dot's two passes with the block partials of the caller's stream (the same)."""
        if problem.op == "dot":
            return self._dot_native(problem, config, operands)
        if problem.batch != 1 or gemm_c(problem, operands) is not None:
            return None
        copies, fixed, stream = (), {}, None
        if staging.is_staged(config):
            found = staging.native_copies(problem, operands, staging.is_kmajor(config))
            if found is None:
                return None
            copies, operands, fixed = found
            problem, config = staging.unwrap(problem, config)
            stream = operands.stream
            self.bind(problem, config, operands)
        prepared = self._prepared.get(self._launch_key(problem, config, operands))
        if prepared is None:
            return None
        # a TMA kernel reads A and B through tensor maps: their addresses are replaced per
        # call, a staged copy's map made once over its buffer
        tma = config.name in TMA_TILES
        slots = {(f"{role}_map" if tma else role): source + (native.MAP if tma else 0)
                 for role, source in (("a", native.A), ("b", native.B)) if role not in fixed}
        slots["d"] = native.D
        if tma and fixed:
            maps = dict(zip("ab", tensor_maps(problem, operands,
                                              kernel_for(problem, config))))
            fixed = {f"{role}_map": TENSOR_MAP.from_buffer_copy(maps[role].bytes())
                     for role in fixed}
        step = native.launch_step(prepared, slots, fixed, stream)
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (problem.m, problem.n),
                             prepared.function.context, (*copies, step), keep=(prepared,))

    def _dot_native(self, problem: Problem, config: Config,
                    operands: Operands) -> native.Native | None:
        prepared = self._prepared.get(self._launch_key(problem, config, operands))
        if prepared is None:
            return None
        first, final, partial = prepared.first, prepared.final, prepared.partial
        stream, at = operands.stream, {"partial": partial(operands.stream)}
        steps = (native.launch_step(first, {"x": native.A, "y": native.B}, at, stream),
                 native.launch_step(final, {"out": native.D}, at, stream))
        return native.Native(dtypes.torch_dtype(problem.d_dtype), (), first.function.context,
                             steps, keep=(prepared,))

    @staticmethod
    def _launch_key(problem: Problem, config: Config, ops: Operands) -> tuple:
        """Everything a prepared launch holds that the arrays' pointers do not give: the
        problem, the config, the operands' strides and the alignments the kernels test."""
        a, b = ops.a, ops.b
        if problem.op == "dot":
            return (problem, config.name, a.stride(), b.stride(), a.data_ptr() % 16 == 0,
                    b.data_ptr() % 16 == 0)
        c = gemm_c(problem, ops)
        return (problem, config.name, a.stride(), b.stride(), a.shape[-1],
                c.stride() if c is not None else None, ops.d.data_ptr() % 16 == 0,
                ops.alpha, ops.beta)

    def _bind_gemm(self, problem: Problem, kernel: Kernel,
                   ops: Operands) -> tuple[BoundLaunch, driver.Launch]:
        """The bound launch, and its :class:`~multibackend.gpu.driver.Launch`."""
        fn = self._function(problem, kernel.source, kernel.name, kernel.smem, kernel.arch_suffix)
        values = gemm_arguments(problem, ops, kernel)
        if kernel.tma_boxes:
            maps = tensor_maps(problem, ops, kernel)
            values.update(a_map=maps[0].bytes(), b_map=maps[1].bytes())
        args = driver.Arguments(kernel.name, kernel.params, values)
        prepared = driver.Launch(fn, gemm_grid(problem, kernel), (kernel.threads, 1, 1),
                                 kernel.smem, args)
        launch = prepared.launch
        slots, with_c, lock = args.values, gemm_c(problem, ops) is not None, threading.Lock()
        if kernel.tma_boxes:
            fields = (args.field_address("a_map"), args.field_address("b_map"))

            def bound_tma(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
                with lock:  # the maps and slots are shared: one launch at a time
                    for tmap, array, field in zip(maps, (a, b), fields):
                        if array.data_ptr() != tmap.address:
                            tmap.point_at(array.data_ptr())
                            tmap.write(field)
                    if with_c:
                        slots.c = c.data_ptr()
                    slots.d = d.data_ptr()
                    launch(stream)
            return bound_tma, prepared

        def bound(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            with lock:  # the slots are shared: one launch at a time writes and reads them
                slots.a = a.data_ptr()
                slots.b = b.data_ptr()
                if with_c:
                    slots.c = c.data_ptr()
                slots.d = d.data_ptr()
                launch(stream)
        return bound, prepared

    def _bind_dot(self, problem: Problem, config: Config, kernel: Kernel,
                  ops: Operands) -> tuple[BoundLaunch, DotLaunch]:
        """The bound launch of the dot's two passes, and their :class:`DotLaunch`."""
        import torch

        device = problem.device_index
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        vec, blocks = dot_plan(problem, ops, config, sms)
        wide = _wide_dot(problem)
        first_fn = self._function(problem, kernel.source, dot_kernel_name(problem, vec))
        final_fn = self._function(problem, kernel.source, dot_final_name(problem))
        first_values, final_values = dot_arguments(
            problem, ops, self._partials(device, ops.stream, sms, wide), blocks)
        first_args = driver.Arguments(first_fn.name, DOT_PARAMS, first_values)
        final_args = driver.Arguments(final_fn.name, DOT_FINAL_PARAMS, final_values)
        block = (kernel.threads, 1, 1)
        prepared = DotLaunch(driver.Launch(first_fn, (blocks, 1, 1), block, 0, first_args),
                             driver.Launch(final_fn, (1, 1, 1), block, 0, final_args),
                             functools.partial(self._partials, device, sms=sms, wide=wide))
        first, final, partials = prepared.first.launch, prepared.final.launch, prepared.partial
        first_slots, final_slots, lock = first_args.values, final_args.values, threading.Lock()

        def bound(a: Any, b: Any, c: Any, d: Any, stream: int) -> None:
            partial = partials(stream)
            with lock:  # the slots are shared: one launch at a time writes and reads them
                first_slots.x = a.data_ptr()
                first_slots.y = b.data_ptr()
                first_slots.partial = final_slots.partial = partial
                final_slots.out = d.data_ptr()
                first(stream)
                final(stream)
        return bound, prepared

    def _partials(self, device: int, stream: int, sms: int, wide: bool) -> int:
        """The address of a per-(device, stream) buffer for the dot's block partials (float64
        when ``wide``, else float32), kept for the backend's life (so no allocator can hand it
        to other work while a kernel on ``stream`` reads it)."""
        key = (device, stream, wide)
        found = self._scratch.get(key)
        if found is None:
            import torch

            with self._lock:
                found = self._scratch.get(key)
                if found is None:
                    buf = torch.empty(max(BLOCKS_PER_SM.values()) * sms,
                                      dtype=torch.float64 if wide else torch.float32,
                                      device=f"cuda:{device}")
                    found = self._scratch[key] = (buf, buf.data_ptr())
        return found[1]


def create() -> Backend:
    return RawWmmaBackend()
