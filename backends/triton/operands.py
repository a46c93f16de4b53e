"""How the Triton kernels see their operands: TMA descriptors and their eligibility, the
constexprs a tile passes, and the vector widths the pointer kernels may load and store."""
from __future__ import annotations

from typing import Any

from multibackend.backends.triton.configs import interpreting
from multibackend.backends.triton.records import tile_of
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem


def d_by_tma(d_aligned: bool, has_c: bool) -> bool:
    """Whether the persistent TMA kernel stores D through a descriptor: where D's rows are on
    the 16-byte grid and there is no C (C's tile converted for the epilogue and D's TMA tile
    together do not fit beside a 128x256 tile's three stages: 240 KB of shared memory)."""
    return d_aligned and not has_c


def _tile_constexprs(problem: Problem, config: Config) -> dict[str, Any]:
    """The constexprs and launch options the pointer and split-K kernels share."""
    import triton.language as tl

    tile = tile_of(config)
    bk = tile.block_k
    acc = {"float32": tl.float32, "float16": tl.float16, "float64": tl.float64,
           "int32": tl.int32}[problem.acc]
    precision = "ieee" if problem.in_dtype == "float64" else problem.precision or "ieee"
    upcast = interpreting() and problem.in_dtype in ("bfloat16", "float8_e4m3fn",
                                                     "float8_e5m2")
    return dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=bk,
                ACC=acc, INPUT_PRECISION=precision, EVEN_K=problem.k % bk == 0,
                UPCAST=upcast, WIDE_K=wide_k(problem, bk), num_warps=tile.warps,
                num_stages=tile.stages)


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
