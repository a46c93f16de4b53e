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

On sm_90, with A row-major, B column-major (K-major, as the fp8 warpgroup MMA reads it), both
on the TMA unit's 16-byte grid and a 16-bit D, the same product runs persistent over TMA
descriptors (:func:`matmul_scaled_tma_kernel`, config kind "tma"): one program per
multiprocessor walks the output tiles, the TMA unit fetches A's and B's tiles (zero-filled past
the edges) into shared memory. On an H200 (graph mode, e4m3 -> bfloat16, x
``torch._scaled_mm`` with the same scales, same run;
``benchmarks/results/NVIDIA-H200/fp8_graph.json``) it ran 8192^3 with tensor-wise scales in
256x128x128 tiles at 0.78x (1105 TFLOP/s; the pointer kernel: 0.29x) and block-wise in
128x256x128 tiles at 493 TFLOP/s (the pointer kernel: 345). Adding each step's sums in float32
is what costs: in a separate run the same tile without it ran at 1.02x, with a relative error
of 0.24 where torch's (which adds them too) was 6e-4 (all-positive operands, K = 16384).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from multibackend.backends.triton import kernels
from multibackend.backends.triton.configs import POINTER_TILES, pointer_tile
from multibackend.backends.triton.operands import (
    _descriptor,
    _matrix,
    _operand_descriptors,
    _operands_ready,
    _tile_constexprs,
    _tma_ready,
    d_by_tma,
    d_unit,
)
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


@triton.jit
def matmul_scaled_tma_kernel(
    a_desc, b_desc, d_desc, c_ptr, d_ptr, sa_ptr, sb_ptr, M, N, K,
    stride_cm, stride_cn, stride_dm, stride_dn, sa_rs, sa_ks, sb_ks, sb_cs, alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, HAS_C: tl.constexpr,
    SCALE: tl.constexpr, D_TMA: tl.constexpr, D_UNIT: tl.constexpr, PER_STEP: tl.constexpr,
    SB_COLUMNS: tl.constexpr, SCALE_BLOCK: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """The scaled product, persistent over TMA descriptors (A row-major, B read K-major as
    its transpose's BLOCK_N x BLOCK_K tiles); D stored by the TMA unit where ``D_TMA`` (no C,
    rows on the 16-byte grid), else through the pointer kernels' epilogue."""
    pid = tl.program_id(0)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(pid, tiles, NUM_PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = kernels._tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        rows = offs_m % M
        cols = offs_n % N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if PER_STEP:
            for kt in range(k_tiles):
                a = a_desc.load([off_m, kt * BLOCK_K])
                b = b_desc.load([off_n, kt * BLOCK_K]).T
                sa, sb = _scale_factors(sa_ptr, sb_ptr, rows, cols,
                                        (kt * BLOCK_K) // SCALE_BLOCK, sa_rs, sa_ks, sb_ks,
                                        sb_cs, SB_COLUMNS)
                acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
        else:
            for kt in range(k_tiles):
                a = a_desc.load([off_m, kt * BLOCK_K])
                b = b_desc.load([off_n, kt * BLOCK_K]).T
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            sa, sb = _scale_factors(sa_ptr, sb_ptr, rows, cols, 0, sa_rs, sa_ks, sb_ks, sb_cs,
                                    SB_COLUMNS)
            acc = acc * (sa[:, None] * sb[None, :])
        if D_TMA:  # no C
            if SCALE:
                acc = acc * alpha
            d_desc.store([off_m, off_n], acc.to(d_desc.dtype))
        else:
            kernels._epilogue(acc, c_ptr, d_ptr, 0, offs_m, offs_n, M, N, 0, stride_cm,
                              stride_cn, 0, stride_dm, stride_dn, alpha, beta, tl.float32,
                              HAS_C, SCALE, D_UNIT)


def scale_strides(kind: str, operand: str, scale: Any) -> tuple[int, int]:
    """(A's row stride, K-block stride) or (B's K-block stride, column stride) of a scale of
    granularity ``kind`` as :class:`~multibackend.core.config.Operands` holds it."""
    if kind == "tensor":
        return 0, 0
    if kind == "row":
        return (1, 0) if operand == "A" else (0, 1)
    return tuple(int(s) for s in scale.stride())


def config_fault(problem: Problem, config: Config) -> str | None:
    """Why ``config`` cannot run the scaled ``problem``, or None: the scaled kernels take the
    pointer kernel's tiles and persistent TMA ones (the layouts those are written for are
    :func:`~.configs.config_fault`'s to check), with a BLOCK_K dividing 128."""
    tile = tile_of(config)
    if tile.kind not in ("pointer", "tma"):
        return (f"config {config.name!r} is a {tile.kind} tile: scaled fp8 products run the "
                "pointer kernel's tiles and persistent TMA ones only")
    if BLOCK % tile.block_k:
        return (f"config {config.name!r} has BLOCK_K {tile.block_k}: scaled fp8 products need "
                f"a BLOCK_K dividing {BLOCK}, so that the tensor cores' sums are added in "
                f"float32 after at most {BLOCK} elements of K and each step of K lies in one "
                "scale block")
    return None


def launch(problem: Problem, ops: Operands, config: Config,
           sm_count: Callable[[], int]) -> None:
    """One launch of the scaled kernel of ``config``'s kind on the batch-1 operands ``ops``,
    on a GPU of ``sm_count()`` multiprocessors. A TMA tile whose A or B is off the TMA unit's
    16-byte grid as it is at launch runs the pointer kernel's first scaled tile (of 64 rows
    where M is 64 or less)."""
    tile = tile_of(config)
    if tile.kind == "tma":
        if _operands_ready(problem, ops):
            _launch_tma(problem, ops, config, sm_count())
            return
        config = pointer_tile(next(t for t in POINTER_TILES[1]
                                   if problem.m > 64 or t[0] <= 64))
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


def _launch_tma(problem: Problem, ops: Operands, config: Config, sms: int) -> None:
    """One launch of :func:`matmul_scaled_tma_kernel`: as many programs as multiprocessors
    (fewer where there are fewer tiles)."""
    tile = tile_of(config)
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    a, b, d = _matrix(ops.a), _matrix(ops.b), _matrix(ops.d)
    _, a_desc, b_desc = _operand_descriptors(problem, a, b, bm, bn, bk)
    has_c = ops.c is not None
    c = _matrix(ops.c) if has_c else d
    d_tma = d_by_tma(_tma_ready(d), has_c)
    programs = min(sms, -(-problem.m // bm) * -(-problem.n // bn))
    sa_rs, sa_ks = scale_strides(problem.scales[0], "A", ops.scale_a)
    sb_ks, sb_cs = scale_strides(problem.scales[1], "B", ops.scale_b)
    matmul_scaled_tma_kernel[(programs,)](
        a_desc, b_desc, _descriptor(d, [bm, bn]) if d_tma else None, c, d, ops.scale_a,
        ops.scale_b, problem.m, problem.n, problem.k, c.stride(0), c.stride(1), d.stride(0),
        d.stride(1), sa_rs, sa_ks, sb_ks, sb_cs, ops.alpha, ops.beta,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tile.group_m, NUM_PROGRAMS=programs,
        HAS_C=has_c, SCALE=ops.alpha != 1, D_TMA=d_tma,
        D_UNIT=1 if d_tma else d_unit(problem, d, c if has_c else None),
        PER_STEP="block" in problem.scales,
        SB_COLUMNS=BLOCK if problem.scales[1] == "block" else 1, SCALE_BLOCK=BLOCK,
        WARP_SPECIALIZE=tile.warp_specialize, num_warps=tile.warps, num_stages=tile.stages)
