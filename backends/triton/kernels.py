"""The Triton kernels: a strided, batched ``tl.dot`` GEMM with a fused alpha/beta/C epilogue,
and a two-pass dot product.

Imported only when the Triton backend first runs, so that ``TRITON_INTERPRET=1`` set by the
caller (or the test suite) before then takes effect: the interpreter decides at definition time.

GEMM: one program per BLOCK_M x BLOCK_N tile of D (grouped ordering, GROUP_M tile-rows at a time,
for L2 reuse), the batch on the grid's second axis. Loads use any strides, so row- and column-major
A and B run without copies; where a 16-bit operand's extents and strides come in 8s that Triton
cannot see (1000), the launch tells the kernel (A_UNIT, B_UNIT: :func:`_operand_units`) and its
loads move 16 bytes, not one element. Rows and columns past M and N are read wrapped (index modulo
M or N: always in bounds, never stored); K's ragged tail is masked with zeros unless EVEN_K.
Element offsets are 64-bit, so operands past 2^31 elements address correctly; offsets along K are
64-bit only where a step of K spans 2^31 elements or more (WIDE_K). The two compile differently: on
an H200 (graph mode, A column-major) 64-bit offsets everywhere ran 8x4096x4096 in 64x64x64 tiles
25% slower and bf16 1000^3 in 128x128x64 tiles 2.4x faster, so every other launch keeps the 32-bit
code its figures were measured with. The accumulator is float32, float16, float64 or int32 (ACC); D
is written masked, once.

Split-K GEMM, for products with too few output tiles to fill the GPU (see
:func:`matmul_splitk_kernel`): each program reduces one contiguous slice of K for one tile
into a float32 workspace, and a second kernel sums the slices in a fixed order (no atomics:
a fixed config gives bit-identical results run to run) and applies the epilogue. The fused
kernels (:func:`matmul_splitk_fused_kernel`, and :func:`matmul_tma_splitk_kernel` fed by the
TMA unit) need no second launch: the last program of a tile to finish, counted on an int32
counter, adds the slices, still in slice order, so the result is as deterministic. The TMA
kernel can instead add each slice into a float32 sum per tile by atomics (one tile of
additions per slice, in no fixed order, where the slice-order sum reads every slice's partial
in one program): faster with many slices, but the low bits vary run to run; it runs that way
unless the caller asks for deterministic algorithms (see :mod:`multibackend.backends.triton`).
A tile split in two slices needs neither: the slice finishing first hands its partial to the
other, which adds it in registers (two addends sum alike in either order: deterministic).
"""
from __future__ import annotations

import triton
import triton.language as tl

#: BLOCK_K steps by which the first of two paired slices is shorter
#: (:func:`matmul_tma_splitk_kernel`)
PAIR_LEAD = tl.constexpr(3)


@triton.jit
def _tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row, column) of output tile ``pid`` in grouped order: GROUP_M tile-rows at a time, so
    tiles that run together share the rows of A and the columns of B they read."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    group = pid // per_group
    first_m = group * GROUP_M
    group_size = min(grid_m - first_m, GROUP_M)
    return first_m + ((pid % per_group) % group_size), (pid % per_group) // group_size


@triton.jit
def _whole(x, UNIT: tl.constexpr):
    """``x``, a multiple of UNIT, written as one so that the compiler sees it (the value is
    unchanged): Triton's specialization shows only divisibility by 16."""
    if UNIT > 1:
        x = x // UNIT * UNIT
    return x


@triton.jit
def _operand_unit(rows, cols, stride_b, stride_r, stride_c, UNIT: tl.constexpr,
                  COL: tl.constexpr):
    """One operand's extents and (batch, row, column) strides with UNIT shown (values
    unchanged): UNIT > 1 says that the operand's base is 16-byte aligned and that its extent
    along its contiguous dimension (``cols`` where it is row-major, ``rows`` where COL) and
    its other strides are whole runs of UNIT elements (16 bytes)."""
    if UNIT > 1:
        stride_b = _whole(stride_b, UNIT)
        if COL:
            rows = _whole(rows, UNIT)
            stride_c = _whole(stride_c, UNIT)
        else:
            cols = _whole(cols, UNIT)
            stride_r = _whole(stride_r, UNIT)
    return rows, cols, stride_b, stride_r, stride_c


@triton.jit
def _operand_units(M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                   A_UNIT: tl.constexpr, A_COL: tl.constexpr, B_UNIT: tl.constexpr,
                   B_COL: tl.constexpr):
    """M, N, K and A's and B's strides with what the caller knows of them shown
    (:func:`_operand_unit`: A_UNIT for A, B_UNIT for B). Where Triton sees no divisibility (a
    multiple of 8 but not of 16, e.g. 1000) the loads would otherwise move one element per
    instruction: rows wrapped modulo M or N are contiguous only in runs that divide M or N,
    and lines 8 elements apart are not known to start on the 16-byte grid. With both units 1
    the kernels compile as they did without them (same PTX)."""
    M, K, stride_ab, stride_am, stride_ak = _operand_unit(M, K, stride_ab, stride_am,
                                                          stride_ak, A_UNIT, A_COL)
    K, N, stride_bb, stride_bk, stride_bn = _operand_unit(K, N, stride_bb, stride_bk,
                                                          stride_bn, B_UNIT, B_COL)
    return M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn


@triton.jit
def _tile_pointers(a_ptr, b_ptr, batch, offs_m, offs_n, M, N,
                   stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                   BLOCK_K: tl.constexpr, WIDE_K: tl.constexpr):
    """Pointers to the first BLOCK_K-wide step of A's rows ``offs_m`` and B's columns
    ``offs_n`` (read wrapped past M and N, so always in bounds); K offsets in 64 bits where
    WIDE_K (a step of K spans 2^31 elements or more)."""
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    if WIDE_K:
        offs_k = offs_k.to(tl.int64)
    a_ptrs = (a_ptr + batch * stride_ab + rows[:, None] * stride_am
              + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + batch * stride_bb + offs_k[:, None] * stride_bk
              + cols[None, :] * stride_bn)
    return a_ptrs, b_ptrs


@triton.jit
def k_steps(stride_ak, stride_bk, BLOCK_K: tl.constexpr, WIDE_K: tl.constexpr):
    """How far A's and B's pointers move for one BLOCK_K-wide step of K: in 64 bits where
    WIDE_K (a step spans 2^31 elements or more)."""
    if WIDE_K:
        return BLOCK_K * tl.cast(stride_ak, tl.int64), BLOCK_K * tl.cast(stride_bk, tl.int64)
    return BLOCK_K * stride_ak, BLOCK_K * stride_bk


@triton.jit
def _tile_dot(a_ptrs, b_ptrs, k_left, steps, stride_ak, stride_bk,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
              UPCAST: tl.constexpr, WIDE_K: tl.constexpr, MAX_IMPRECISE: tl.constexpr = None):
    """The BLOCK_M x BLOCK_N product over ``steps`` BLOCK_K-wide steps of K from the
    pointers given, accumulated in ACC; elements ``k_left`` or more along K from the first
    read as zeros unless EVEN_K. Steps in 64 bits where WIDE_K. MAX_IMPRECISE: for fp8, how
    many elements of K the tensor cores' narrower accumulator may sum before the partial
    sums are added in ACC (``tl.dot``'s ``max_num_imprecise_acc``; None: Triton's default,
    which on sm_90 never adds them in float32)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_step, b_step = k_steps(stride_ak, stride_bk, BLOCK_K, WIDE_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for kt in range(0, steps):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_rest = k_left - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_rest, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_rest, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, out_dtype=ACC,
                     max_num_imprecise_acc=MAX_IMPRECISE)
        a_ptrs += a_step
        b_ptrs += b_step
    return acc


@triton.jit
def _epilogue(acc, c_ptr, d_ptr, batch, offs_m, offs_n, M, N,
              stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn, alpha, beta,
              ACC: tl.constexpr, HAS_C: tl.constexpr, SCALE: tl.constexpr,
              D_UNIT: tl.constexpr):
    """D = alpha * acc + beta * C on rows ``offs_m`` and columns ``offs_n``, cast to D's
    dtype and stored masked to M x N.

    D_UNIT > 1 says that N and the base, row and batch strides of D, and of C where there is
    one, come in whole runs of D_UNIT elements (16 bytes of D), where Triton's
    specialization cannot tell (a multiple of 8 but not of 16, e.g. N = 1000): rounding
    them down to that unit changes no value and lets the compiler store D (and load C) 16
    bytes at a time, where it would otherwise move one element per instruction. On an H100
    (graph, f16, same run as torch.matmul) the 64x128x128 TMA tile ran 1000x1000x1024 at
    0.95x against 0.90x storing element by element; most of what N = 1000 costs against
    N = 1024 is in B's loads (the same tile, D stored 16 bytes at a time in both: 1000^3 at
    0.88x, 1024^3 at 1.02x)."""
    N = _whole(N, D_UNIT)
    stride_db = _whole(stride_db, D_UNIT)
    stride_dm = _whole(stride_dm, D_UNIT)
    if HAS_C:
        stride_cb = _whole(stride_cb, D_UNIT)
        stride_cm = _whole(stride_cm, D_UNIT)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_m = offs_m.to(tl.int64)
    out_n = offs_n.to(tl.int64)
    if SCALE:
        acc = acc * alpha
    if HAS_C:
        c_ptrs = (c_ptr + batch * stride_cb + out_m[:, None] * stride_cm
                  + out_n[None, :] * stride_cn)
        c = tl.load(c_ptrs, mask=mask, other=0)
        acc = acc + beta * c.to(ACC)
    d_ptrs = (d_ptr + batch * stride_db + out_m[:, None] * stride_dm
              + out_n[None, :] * stride_dn)
    tl.store(d_ptrs, acc.to(d_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, M, N, K,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_db, stride_dm, stride_dn,
    alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    HAS_C: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    SCALE: tl.constexpr, D_UNIT: tl.constexpr, WIDE_K: tl.constexpr,
    A_UNIT: tl.constexpr, A_COL: tl.constexpr, B_UNIT: tl.constexpr, B_COL: tl.constexpr,
):
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn = _operand_units(
        M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
        A_UNIT, A_COL, B_UNIT, B_COL)
    pid_m, pid_n = _tile_of(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    a_ptrs, b_ptrs = _tile_pointers(a_ptr, b_ptr, batch, offs_m, offs_n, M, N,
                                    stride_ab, stride_am, stride_ak,
                                    stride_bb, stride_bk, stride_bn, BLOCK_K, WIDE_K)
    acc = _tile_dot(a_ptrs, b_ptrs, K, tl.cdiv(K, BLOCK_K), stride_ak, stride_bk,
                    BLOCK_M, BLOCK_N, BLOCK_K, ACC, INPUT_PRECISION, EVEN_K, UPCAST, WIDE_K)
    _epilogue(acc, c_ptr, d_ptr, batch, offs_m, offs_n, M, N,
              stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn, alpha, beta,
              ACC, HAS_C, SCALE, D_UNIT)


@triton.jit
def _slice_dot(a_ptr, b_ptr, batch, pid, part, M, N, K, K_SLICE,
               stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
               EVEN_K: tl.constexpr, UPCAST: tl.constexpr, WIDE_K: tl.constexpr,
               A_UNIT: tl.constexpr, A_COL: tl.constexpr, B_UNIT: tl.constexpr,
               B_COL: tl.constexpr):
    """(partial tile, its rows, its columns) of a split-K program: output tile ``pid``
    multiplied over K in [part * K_SLICE, (part + 1) * K_SLICE) (K_SLICE a multiple of
    BLOCK_K; the last slice ends at K, ragged where K is), with the pointer kernel's loads,
    wrapping and masking."""
    M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn = _operand_units(
        M, N, K, stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
        A_UNIT, A_COL, B_UNIT, B_COL)
    pid_m, pid_n = _tile_of(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    a_ptrs, b_ptrs = _tile_pointers(a_ptr, b_ptr, batch, offs_m, offs_n, M, N,
                                    stride_ab, stride_am, stride_ak,
                                    stride_bb, stride_bk, stride_bn, BLOCK_K, WIDE_K)
    k_start = part * K_SLICE
    a_ptrs += k_start.to(tl.int64) * stride_ak
    b_ptrs += k_start.to(tl.int64) * stride_bk
    k_left = K - k_start
    acc = _tile_dot(a_ptrs, b_ptrs, k_left, tl.cdiv(min(K_SLICE, k_left), BLOCK_K),
                    stride_ak, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, ACC, INPUT_PRECISION,
                    EVEN_K, UPCAST, WIDE_K)
    return acc, offs_m, offs_n


@triton.jit
def matmul_splitk_kernel(
    a_ptr, b_ptr, w_ptr, M, N, K, K_SLICE,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, WIDE_K: tl.constexpr,
    A_UNIT: tl.constexpr, A_COL: tl.constexpr, B_UNIT: tl.constexpr, B_COL: tl.constexpr,
):
    """The first pass of a split-K GEMM. Grid: (output tiles, slices of K, batch). Program
    (tile, s, b) multiplies A and B over K in [s * K_SLICE, (s + 1) * K_SLICE) (K_SLICE is a
    multiple of BLOCK_K; the last slice ends at K, ragged where K is) and writes its float32
    partial tile to the workspace ``w`` [batch, slices, M, N], masked to M x N: every
    element of the workspace is written, none is read here. :func:`splitk_reduce_kernel`
    adds the slices up. Loads, wrapping and masking are the pointer kernel's."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    acc, offs_m, offs_n = _slice_dot(a_ptr, b_ptr, batch, pid, part, M, N, K, K_SLICE,
                                     stride_ab, stride_am, stride_ak,
                                     stride_bb, stride_bk, stride_bn,
                                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, ACC,
                                     INPUT_PRECISION, EVEN_K, UPCAST, WIDE_K,
                                     A_UNIT, A_COL, B_UNIT, B_COL)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    plane = (batch * tl.num_programs(1) + part) * M
    w_ptrs = w_ptr + (plane + offs_m[:, None]) * N + offs_n[None, :]
    tl.store(w_ptrs, acc.to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _last_slice_stores(acc, w_ptr, count_ptr, tile, part, splits, c_ptr, d_ptr, batch,
                       offs_m, offs_n, M, N, stride_cb, stride_cm, stride_cn,
                       stride_db, stride_dm, stride_dn, alpha, beta,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_C: tl.constexpr,
                       SCALE: tl.constexpr, D_UNIT: tl.constexpr):
    """The end of a fused split-K program: write this slice's float32 partial tile to the
    workspace ``w`` [tiles, slices, BLOCK_M, BLOCK_N] (the rows under M), then count this
    program in on the tile's counter (``count_ptr``, int32, zero at launch). The program that
    arrives last adds every slice's partial from the workspace in slice order, so the sum is
    the same whichever program that is (a fixed config gives bit-identical results run to
    run), applies the epilogue, writes D once and sets the counter back to zero for the next
    launch. Partials are read through L2 (``.cg``), after the counter's acquire; every thread
    of the program has stored its part before the release (a barrier)."""
    rows = offs_m[:, None] < M
    within = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    w_tile = w_ptr + tile * splits * (BLOCK_M * BLOCK_N) + within
    tl.store(w_tile + part * (BLOCK_M * BLOCK_N), acc.to(tl.float32), mask=rows)
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, splits):
            total += tl.load(w_tile + s * (BLOCK_M * BLOCK_N), mask=rows, other=0.0,
                             cache_modifier=".cg")
        tl.store(count_ptr + tile, 0)
        _epilogue(total, c_ptr, d_ptr, batch, offs_m, offs_n, M, N,
                  stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn, alpha,
                  beta, tl.float32, HAS_C, SCALE, D_UNIT)


@triton.jit
def _summed_slice_stores(acc, w_ptr, count_ptr, tile, splits, c_ptr, d_ptr, offs_m, offs_n,
                         M, N, stride_cm, stride_cn, stride_dm, stride_dn, alpha, beta,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_C: tl.constexpr,
                         SCALE: tl.constexpr, D_UNIT: tl.constexpr):
    """The end of a split-K program that sums slices by atomics: add this slice's float32
    partial into the tile's float32 sum in the workspace ``w`` [tiles, BLOCK_M, BLOCK_N]
    (zero at launch; the rows under M) at GPU scope, then count this program in on the
    tile's counter (``count_ptr``, int32, zero at launch). The program that arrives last
    reads the sum (through L2, after the counter's acquire), sets it and the counter back to
    zero for the next launch and applies the epilogue. Float additions in the order the
    slices arrive: the low bits of a float32 sum, and so at times the last bit of a 16-bit D,
    vary from run to run. Every thread has added its part before the release, and has read
    its part of the sum before any thread zeroes it (barriers: the two run in different
    layouts)."""
    rows = offs_m[:, None] < M
    within = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    w_tile = w_ptr + tile * (BLOCK_M * BLOCK_N) + within
    tl.atomic_add(w_tile, acc, mask=rows, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
        total = tl.load(w_tile, mask=rows, other=0.0, cache_modifier=".cg")
        tl.debug_barrier()
        tl.store(w_tile, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=rows)
        tl.store(count_ptr + tile, 0)
        _epilogue(total, c_ptr, d_ptr, 0, offs_m, offs_n, M, N, 0, stride_cm, stride_cn, 0,
                  stride_dm, stride_dn, alpha, beta, tl.float32, HAS_C, SCALE, D_UNIT)


@triton.jit
def _paired_slice_stores(acc, w_ptr, count_ptr, tile, c_ptr, d_ptr, offs_m, offs_n, M, N,
                         stride_cm, stride_cn, stride_dm, stride_dn, alpha, beta,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_C: tl.constexpr,
                         SCALE: tl.constexpr, D_UNIT: tl.constexpr):
    """The end of a program of a tile split in two slices: the program that counts in first
    on the tile's counter (``count_ptr``, int32, zero at launch) writes its float32 partial
    to the workspace ``w`` [tiles, BLOCK_M, BLOCK_N] (the rows under M, any contents at
    launch) and counts in again once every thread has (a barrier, then a release); the
    other waits for that (the counter at 3, acquired), adds the partial to its own in
    registers, sets the counter back to zero for the next launch and applies the epilogue.
    Two float32 partials sum to the same bits in either order, so a fixed config gives
    bit-identical results run to run with no atomics on the sums, and D is written once.
    The program that waits only ever waits on one that has counted in, so is running."""
    rows = offs_m[:, None] < M
    within = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    w_tile = w_ptr + tile * (BLOCK_M * BLOCK_N) + within
    if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") == 0:
        tl.store(w_tile, acc, mask=rows)
        tl.debug_barrier()
        tl.atomic_add(count_ptr + tile, 1, sem="release", scope="gpu")
    else:
        while tl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu") < 3:
            pass
        total = acc + tl.load(w_tile, mask=rows, other=0.0, cache_modifier=".cg")
        tl.store(count_ptr + tile, 0)
        _epilogue(total, c_ptr, d_ptr, 0, offs_m, offs_n, M, N, 0, stride_cm, stride_cn, 0,
                  stride_dm, stride_dn, alpha, beta, tl.float32, HAS_C, SCALE, D_UNIT)


@triton.jit
def matmul_splitk_fused_kernel(
    a_ptr, b_ptr, c_ptr, d_ptr, w_ptr, count_ptr, M, N, K, K_SLICE,
    stride_ab, stride_am, stride_ak,
    stride_bb, stride_bk, stride_bn,
    stride_cb, stride_cm, stride_cn,
    stride_db, stride_dm, stride_dn,
    alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, ACC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, HAS_C: tl.constexpr, SCALE: tl.constexpr,
    D_UNIT: tl.constexpr, WIDE_K: tl.constexpr,
    A_UNIT: tl.constexpr, A_COL: tl.constexpr, B_UNIT: tl.constexpr, B_COL: tl.constexpr,
):
    """Split-K in one kernel. Grid: (output tiles, slices of K, batch). Program (tile, s, b)
    multiplies its slice of K as :func:`matmul_splitk_kernel` does; the last program of each
    tile to finish reduces it (:func:`_last_slice_stores`)."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    acc, offs_m, offs_n = _slice_dot(a_ptr, b_ptr, batch, pid, part, M, N, K, K_SLICE,
                                     stride_ab, stride_am, stride_ak,
                                     stride_bb, stride_bk, stride_bn,
                                     BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, ACC,
                                     INPUT_PRECISION, EVEN_K, UPCAST, WIDE_K,
                                     A_UNIT, A_COL, B_UNIT, B_COL)
    _last_slice_stores(acc, w_ptr, count_ptr, batch * tl.num_programs(0) + pid, part,
                       tl.num_programs(1), c_ptr, d_ptr, batch, offs_m, offs_n, M, N,
                       stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn,
                       alpha, beta, BLOCK_M, BLOCK_N, HAS_C, SCALE, D_UNIT)


@triton.jit
def _tma_b_tile(b_desc, off_k, off_n, B_KMAJOR: tl.constexpr):
    """B's BLOCK_K x width tile at (off_k, off_n), read as such or, K-major, as the
    transpose of its width x BLOCK_K tile."""
    if B_KMAJOR:
        b = b_desc.load([off_n, off_k]).T
    else:
        b = b_desc.load([off_k, off_n])
    return b


@triton.jit
def matmul_tma_splitk_kernel(
    a_desc, b_desc, bx_desc, c_ptr, d_ptr, w_ptr, count_ptr, M, N, K, K_SLICE,
    stride_cm, stride_cn, stride_dm, stride_dn, alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXTRA_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr,
    HAS_C: tl.constexpr, SCALE: tl.constexpr, REDUCE: tl.constexpr, D_UNIT: tl.constexpr,
):
    """Split-K over tensor-memory-accelerator descriptors, in one kernel. Grid: (output
    tiles, slices of K). Program (tile, s) multiplies A and B over K in [s * K_SLICE,
    (s + 1) * K_SLICE) (K_SLICE a multiple of BLOCK_K; moved back for a pair, below; the
    last slice to K), the TMA unit fetching the tiles
    (zero-filled past M, N and K) as :func:`matmul_tma_persistent_kernel` does. With one
    slice it stores D directly; with more, by REDUCE: "pair" (two slices: the one to finish
    first hands its float32 partial to the other, :func:`_paired_slice_stores`, ``w``
    [tiles, BLOCK_M, BLOCK_N]), "atomic" (added by atomics into a float32 sum per tile,
    :func:`_summed_slice_stores`, ``w`` as for "pair", zero at launch) or "ordered" (written
    whole and added in slice order by the last program of each tile to finish,
    :func:`_last_slice_stores`, ``w`` [tiles, slices, BLOCK_M, BLOCK_N]). A matrix product
    of one batch entry, float32 accumulation.

    Paired, the first slice is PAIR_LEAD BLOCK_K steps shorter (an eighth of a slice's steps
    where that is fewer), so that it tends to finish first and writes its partial while the
    second still multiplies; with the slices even, the second waits for the write. On an
    H100 (graph, x torch.matmul, same run, f16 / bf16): 1024x1024x16384 in 128x128x64 tiles
    (128 steps a slice) ran 1.033x / 1.017x with the first slice 2 steps shorter, 1.031x /
    1.020x with 4, 1.016x / 1.010x with 8, 0.98x / 0.97x with 16, 1.027x / 1.015x even, and
    0.999x / 0.994x added by atomics; 256x1024x8192 in 64x64x128 tiles (32 steps a slice)
    1.059x / 1.065x with 2, 1.064x / 1.061x with 4, 1.044x / 1.051x even and 1.056x /
    1.065x by atomics.

    With EXTRA_N (a power of two below BLOCK_N; 0 for none) an output tile is BLOCK_N +
    EXTRA_N wide, e.g. 192 = 128 + 64 or 80 = 64 + 16: widths a power-of-two block cannot
    take, which let a grid of tiles match the multiprocessors (512x6144 in 128 tiles of
    128x192). Each A tile loaded feeds two products, against B's BLOCK_N-wide tile
    (``b_desc``) and the EXTRA_N-wide one beside it (``bx_desc``). Such a tile runs
    unsplit (one slice)."""
    pid = tl.program_id(0)
    part = tl.program_id(1)
    splits = tl.num_programs(1)
    pid_m, pid_n = _tile_of(pid, M, N, BLOCK_M, BLOCK_N + EXTRA_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * (BLOCK_N + EXTRA_N)
    lead = tl.minimum(PAIR_LEAD, K_SLICE // BLOCK_K // 8) * BLOCK_K if REDUCE == "pair" else 0
    k_start = tl.maximum(part * K_SLICE - lead, 0)
    k_end = tl.minimum((part + 1) * K_SLICE - lead, K)
    if part == splits - 1:
        k_end = K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if EXTRA_N > 0:
        acc_x = tl.zeros((BLOCK_M, EXTRA_N), dtype=tl.float32)
    for off_k in tl.range(k_start, k_end, BLOCK_K):
        a = a_desc.load([off_m, off_k])
        acc = tl.dot(a, _tma_b_tile(b_desc, off_k, off_n, B_KMAJOR), acc)
        if EXTRA_N > 0:
            acc_x = tl.dot(a, _tma_b_tile(bx_desc, off_k, off_n + BLOCK_N, B_KMAJOR), acc_x)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if EXTRA_N > 0:
        _epilogue(acc_x, c_ptr, d_ptr, 0, offs_m, off_n + BLOCK_N + tl.arange(0, EXTRA_N), M,
                  N, 0, stride_cm, stride_cn, 0, stride_dm, stride_dn, alpha, beta,
                  tl.float32, HAS_C, SCALE, D_UNIT)
    if splits == 1:
        _epilogue(acc, c_ptr, d_ptr, 0, offs_m, offs_n, M, N, 0, stride_cm, stride_cn, 0,
                  stride_dm, stride_dn, alpha, beta, tl.float32, HAS_C, SCALE, D_UNIT)
    elif REDUCE == "pair":
        _paired_slice_stores(acc, w_ptr, count_ptr, pid, c_ptr, d_ptr, offs_m, offs_n, M, N,
                             stride_cm, stride_cn, stride_dm, stride_dn, alpha, beta,
                             BLOCK_M, BLOCK_N, HAS_C, SCALE, D_UNIT)
    elif REDUCE == "atomic":
        _summed_slice_stores(acc, w_ptr, count_ptr, pid, splits, c_ptr, d_ptr, offs_m, offs_n,
                             M, N, stride_cm, stride_cn, stride_dm, stride_dn, alpha, beta,
                             BLOCK_M, BLOCK_N, HAS_C, SCALE, D_UNIT)
    else:
        _last_slice_stores(acc, w_ptr, count_ptr, pid, part, splits, c_ptr, d_ptr, 0,
                           offs_m, offs_n, M, N, 0, stride_cm, stride_cn, 0, stride_dm,
                           stride_dn, alpha, beta, BLOCK_M, BLOCK_N, HAS_C, SCALE, D_UNIT)


@triton.jit
def splitk_reduce_kernel(
    w_ptr, c_ptr, d_ptr, M, N, SPLITS,
    stride_cb, stride_cm, stride_cn,
    stride_db, stride_dm, stride_dn,
    alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_C: tl.constexpr, SCALE: tl.constexpr,
    D_UNIT: tl.constexpr,
):
    """The second pass of a split-K GEMM. Grid: (BLOCK_M x BLOCK_N blocks of D, batch). Adds
    the SPLITS float32 partials of each element in slice order (the same order on every
    run) and applies the pointer kernel's epilogue."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    grid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // grid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n.to(tl.int64)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for part in range(0, SPLITS):
        plane = (batch * SPLITS + part) * M
        acc += tl.load(w_ptr + (plane + rows) * N + cols, mask=mask, other=0.0)
    _epilogue(acc, c_ptr, d_ptr, batch, offs_m, offs_n, M, N,
              stride_cb, stride_cm, stride_cn, stride_db, stride_dm, stride_dn, alpha, beta,
              tl.float32, HAS_C, SCALE, D_UNIT)


@triton.jit
def dot_partial_kernel(x_ptr, y_ptr, partial_ptr, n, stride_x, stride_y,
                       BLOCK: tl.constexpr, ACC: tl.constexpr):
    """Each program sums x*y over a grid-stride sweep of BLOCK-wide chunks into one partial."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        idx = tl.multiple_of(start, BLOCK) + offs
        mask = idx < n
        x = tl.load(x_ptr + idx.to(tl.int64) * stride_x, mask=mask, other=0)
        y = tl.load(y_ptr + idx.to(tl.int64) * stride_y, mask=mask, other=0)
        acc += x.to(ACC) * y.to(ACC)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def dot_finish_kernel(partial_ptr, out_ptr, count, BLOCK: tl.constexpr, ACC: tl.constexpr):
    """One program adds the partials (deterministically, in a fixed order)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=ACC)
    for start in range(0, count, BLOCK):
        idx = start + offs
        acc += tl.load(partial_ptr + idx, mask=idx < count, other=0).to(ACC)
    tl.store(out_ptr, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty))


@triton.jit
def matmul_tma_persistent_kernel(
    a_desc, b_desc, d_desc, c_ptr, d_ptr, M, N, K, stride_cm, stride_cn, stride_dm,
    stride_dn, alpha, beta,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, ACC: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_C: tl.constexpr, SCALE: tl.constexpr,
    D_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, D_UNIT: tl.constexpr,
):
    """Persistent GEMM over tensor-memory-accelerator descriptors: one program per SM walks
    the output tiles in grouped order; the TMA unit fetches A and B tiles (zero-filling past
    the edges) and stores D (clipping past the edges) when D's rows are 16-byte aligned and
    there is no C (``D_TMA``), else the pointer kernels' epilogue stores D through masked
    pointers (``d_ptr``, any strides; ``D_UNIT`` as there). B is read as (K, N) tiles, or
    as (N, K) tiles and transposed in registers when it is column-major (``B_KMAJOR``)."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(pid, grid_m * grid_n, NUM_PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = a_desc.load([off_m, off_k])
            if B_KMAJOR:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc, out_dtype=ACC)
        if D_TMA:  # no C
            if SCALE:
                acc = acc * alpha
            d_desc.store([off_m, off_n], acc.to(d_desc.dtype))
        else:
            _epilogue(acc, c_ptr, d_ptr, 0, off_m + tl.arange(0, BLOCK_M),
                      off_n + tl.arange(0, BLOCK_N), M, N, 0, stride_cm, stride_cn, 0,
                      stride_dm, stride_dn, alpha, beta, ACC, HAS_C, SCALE, D_UNIT)
