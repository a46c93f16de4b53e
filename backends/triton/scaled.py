"""Scaled fp8 products in Triton: ``D = (scale_a * A) @ (scale_b * B) (+ beta * C)``.

The kernel is the pointer kernel's tile (grouped order, rows and columns read wrapped, K's tail
masked; :mod:`multibackend.backends.triton.kernels`) with the scales applied in float32:

- where neither scale changes along K (tensor- or row-wise: A one per row, B one per column),
  once, to the tile's sums, before alpha, beta * C and D's one rounding;
- where one does (block-wise: A one per row and 128 elements of K, B one per 128 x 128 tile),
  to each BLOCK_K step's partial sums as they are added, so that the sums of different blocks
  are never added before their scales are applied. BLOCK_K divides 128, so one step lies in
  one block of K.

Either way the tensor cores' fp8 sums, kept to about 14 bits on sm_90, are added into the
float32 accumulator after every BLOCK_K (128) elements of K (``tl.dot``'s
``max_num_imprecise_acc``; Triton's default on sm_90 would keep the whole of K in the narrow
accumulator), as DeepGEMM's kernels promote theirs.

A scale is read at ``base + row * RS + k_block * KS`` for A and at ``base + k_block * KS +
(column // COLUMNS) * CS`` for B: a tensor-wise scale has every stride 0, a row-wise one the
unit stride along its rows or columns, a block-wise one the strides of its (rows, K blocks) or
(K blocks, N blocks) matrix. The launch is Triton's own: a scaled call's plan runs the backend
with the call's scales (see :func:`multibackend.eager._scaled`), nothing bound.
"""
from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from multibackend.backends.triton import kernels
from multibackend.backends.triton.operands import _tile_constexprs
from multibackend.backends.triton.records import tile_of
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem
from multibackend.core.scales import BLOCK


@triton.jit
def _scale_factors(sa_ptr, sb_ptr, rows, cols, k_block, sa_rs, sa_ks, sb_ks, sb_cs,
                   SB_COLUMNS: tl.constexpr):
    """A's scales for ``rows`` and B's for ``cols`` in block ``k_block`` of K."""
    sa = tl.load(sa_ptr + rows * sa_rs + k_block * sa_ks)
    sb = tl.load(sb_ptr + k_block * sb_ks + (cols // SB_COLUMNS) * sb_cs)
    return sa, sb


@triton.jit
def matmul_scaled_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, sa_ptr, sb_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_dm, stride_dn,
    sa_rs, sa_ks, sb_ks, sb_cs, alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, WIDE_K: tl.constexpr,
    HAS_C: tl.constexpr, SCALE: tl.constexpr, PER_STEP: tl.constexpr,
    SB_COLUMNS: tl.constexpr, SCALE_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = kernels._tile_of(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_m % M
    cols = offs_n % N
    a_ptrs, b_ptrs = kernels._tile_pointers(a_ptr, b_ptr, 0, offs_m, offs_n, M, N,
                                            0, stride_am, stride_ak, 0, stride_bk, stride_bn,
                                            BLOCK_K, WIDE_K)
    steps = tl.cdiv(K, BLOCK_K)
    if PER_STEP:
        a_step, b_step = kernels.k_steps(stride_ak, stride_bk, BLOCK_K, WIDE_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        for kt in range(0, steps):
            part = kernels._tile_dot(a_ptrs, b_ptrs, K - kt * BLOCK_K, 1, stride_ak, stride_bk,
                                     BLOCK_M, BLOCK_N, BLOCK_K, ACC, INPUT_PRECISION, EVEN_K,
                                     UPCAST, WIDE_K, BLOCK_K)
            sa, sb = _scale_factors(sa_ptr, sb_ptr, rows, cols, (kt * BLOCK_K) // SCALE_BLOCK,
                                    sa_rs, sa_ks, sb_ks, sb_cs, SB_COLUMNS)
            acc += part * sa[:, None] * sb[None, :]
            a_ptrs += a_step
            b_ptrs += b_step
    else:
        acc = kernels._tile_dot(a_ptrs, b_ptrs, K, steps, stride_ak, stride_bk,
                                BLOCK_M, BLOCK_N, BLOCK_K, ACC, INPUT_PRECISION, EVEN_K,
                                UPCAST, WIDE_K, BLOCK_K)
        sa, sb = _scale_factors(sa_ptr, sb_ptr, rows, cols, 0, sa_rs, sa_ks, sb_ks, sb_cs,
                                SB_COLUMNS)
        acc = acc * sa[:, None] * sb[None, :]
    kernels._epilogue(acc, c_ptr, d_ptr, 0, offs_m, offs_n, M, N,
                      0, stride_cm, stride_cn, 0, stride_dm, stride_dn, alpha, beta,
                      ACC, HAS_C, SCALE, 1)


def scale_strides(kind: str, operand: str, scale: Any) -> tuple[int, int]:
    """(A's row stride, K-block stride) or (B's K-block stride, column stride) of a scale of
    granularity ``kind`` as :class:`~multibackend.core.config.Operands` holds it."""
    if kind == "tensor":
        return 0, 0
    if kind == "row":
        return (1, 0) if operand == "A" else (0, 1)
    return tuple(int(s) for s in scale.stride())


def config_fault(problem: Problem, config: Config) -> str | None:
    """Why ``config`` cannot run the scaled ``problem``, or None: the scaled kernel takes the
    pointer kernel's tiles, and block-wise scales a BLOCK_K dividing 128."""
    tile = tile_of(config)
    if tile.kind != "pointer":
        return (f"config {config.name!r} is a {tile.kind} tile: scaled fp8 products run the "
                "pointer kernel's tiles only")
    if "block" in problem.scales and BLOCK % tile.block_k:
        return (f"config {config.name!r} has BLOCK_K {tile.block_k}: block-wise scales need a "
                f"BLOCK_K dividing {BLOCK}, so that each step of K lies in one scale block")
    return None


def launch(problem: Problem, ops: Operands, config: Config) -> None:
    """One launch of the scaled kernel on the batch-1 operands ``ops``."""
    tile = tile_of(config)
    a, b, d = ops.a[0], ops.b[0], ops.d[0]
    c = ops.c[0] if ops.c is not None else None
    c_strides = tuple(c.stride()) if c is not None else (0, 0)
    sa_rs, sa_ks = scale_strides(problem.scales[0], "A", ops.scale_a)
    sb_ks, sb_cs = scale_strides(problem.scales[1], "B", ops.scale_b)
    grid = (-(-problem.m // tile.block_m) * -(-problem.n // tile.block_n),)
    matmul_scaled_kernel[grid](
        a, b, c if c is not None else d, d, ops.scale_a, ops.scale_b,
        problem.m, problem.n, problem.k, *a.stride(), *b.stride(), *c_strides, *d.stride(),
        sa_rs, sa_ks, sb_ks, sb_cs, ops.alpha, ops.beta,
        GROUP_M=tile.group_m, HAS_C=c is not None, SCALE=ops.alpha != 1,
        PER_STEP="block" in problem.scales,
        SB_COLUMNS=BLOCK if problem.scales[1] == "block" else 1, SCALE_BLOCK=BLOCK,
        **_tile_constexprs(problem, config))
