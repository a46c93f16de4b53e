"""fp8 quantization of a matrix's rows in one kernel: the activations of an fp8 layer, quantized
on every call (:class:`multibackend.nn.Fp8Linear`).

:func:`multibackend.quantize` makes the same values and scales with torch operations: the
float32 copy of the input, its magnitudes, their maxima, the quotients and the clamp each pass
over memory. Here one program takes BLOCK_ROWS rows (row-wise: the whole of each row, read
twice, the second time mostly from L2; block-wise: one 128-wide slice of them), finds the
largest magnitude of each row or slice, and writes the fp8 values and the float32 scales once.
The arithmetic is the torch path's: the scale is the largest magnitude times the float32
reciprocal of the fp8 type's largest finite value (1 where all it covers is zero); each value
is its quotient by the scale, rounded to nearest, clamped to the largest finite value and
converted rounding to nearest even. For finite inputs both give the same bits.
"""
from __future__ import annotations

import contextlib
from typing import Any

import triton
import triton.language as tl

from multibackend.core import dtypes
from multibackend.core.errors import InvalidArgument
from multibackend.core.scales import BLOCK

#: rows per program, and the width of a row-wise program's steps along K
BLOCK_ROWS = 4
ROW_STEP = 1024


@triton.jit
def _scale(amax, LARGEST: tl.constexpr):
    """The scales of rows whose largest magnitudes are ``amax``: times the float32 reciprocal
    of LARGEST, as :func:`~multibackend.core.scales.quantize` computes them; 1 for none."""
    return tl.where(amax > 0, amax * (1.0 / LARGEST), 1.0)


@triton.jit
def _quantized(x, scale, LARGEST: tl.constexpr):
    """The values of ``x`` over their rows' ``scale``, rounded to nearest and clamped."""
    return tl.minimum(tl.maximum(tl.math.div_rn(x, scale[:, None]), -LARGEST), LARGEST)


@triton.jit
def _slice(x_rows, rows_ok, offs, K, stride_xk):
    """The rows' elements at columns ``offs`` (zeros past K and past the last row), in
    float32; column offsets in 64 bits (a transposed input's columns stride far)."""
    mask = rows_ok[:, None] & (offs[None, :] < K)
    x = tl.load(x_rows + offs.to(tl.int64)[None, :] * stride_xk, mask=mask, other=0.0)
    return x.to(tl.float32), mask


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_xk, stride_qm,
                         stride_sm, stride_sk, LARGEST: tl.constexpr,
                         BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                         PER_BLOCK: tl.constexpr):
    """Row-wise (one scale per row: program (i,) takes rows [i * BLOCK_ROWS, ...) whole) or,
    with PER_BLOCK, block-wise (one per row and BLOCK_K elements: program (i, j) takes
    those rows' j-th slice)."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = rows < M
    cols = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * stride_qm
    if PER_BLOCK:
        part = tl.program_id(1)
        offs = part * BLOCK_K + cols
        x, mask = _slice(x_rows, row_ok, offs, K, stride_xk)
        scale = _scale(tl.max(tl.abs(x), axis=1), LARGEST)
        q = _quantized(x, scale, LARGEST)
        tl.store(q_rows + offs[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + rows * stride_sm + part * stride_sk, scale, mask=row_ok)
    else:
        amax = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            x, _ = _slice(x_rows, row_ok, start + cols, K, stride_xk)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        scale = _scale(amax, LARGEST)
        for start in range(0, K, BLOCK_K):
            offs = start + cols
            x, mask = _slice(x_rows, row_ok, offs, K, stride_xk)
            q = _quantized(x, scale, LARGEST)
            tl.store(q_rows + offs[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + rows * stride_sm, scale, mask=row_ok)


def quantize_rows(x: Any, granularity: str, dtype: str = "float8_e4m3fn") -> tuple[Any, Any]:
    """:func:`multibackend.quantize` of the 2-D float tensor ``x`` as operand A, row-wise
    (scales (M,)) or block-wise (scales (M, ceil(K/128))), in one kernel on ``x``'s device."""
    import torch

    if granularity not in ("row", "block"):
        raise InvalidArgument(f"quantize_rows: granularity is {granularity!r}: expected 'row' "
                              "or 'block'")
    rows, cols = x.shape
    fp8 = dtypes.torch_dtype(dtype)
    values = torch.empty((rows, cols), dtype=fp8, device=x.device)
    block = granularity == "block"
    parts = -(-cols // BLOCK)
    scales = torch.empty((rows, parts) if block else (rows,), dtype=torch.float32,
                         device=x.device)
    if rows == 0 or cols == 0:
        return values, scales.fill_(1.0)
    grid = (triton.cdiv(rows, BLOCK_ROWS), parts if block else 1)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        # on x's GPU and its current stream (Triton launches on the current device's)
        quantize_rows_kernel[grid](
            x, values, scales, rows, cols, x.stride(0), x.stride(1), values.stride(0),
            scales.stride(0), scales.stride(1) if block else 0,
            LARGEST=float(torch.finfo(fp8).max), BLOCK_ROWS=BLOCK_ROWS,
            BLOCK_K=BLOCK if block else min(ROW_STEP, triton.next_power_of_2(cols)),
            PER_BLOCK=block, num_warps=4)
    return values, scales
