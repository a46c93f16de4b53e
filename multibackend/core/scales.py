"""Scales of fp8 products: what shapes they take, and how a tensor is quantized to fp8 with them.

A scaled product is ``D = (scale_a * A) @ (scale_b * B) (+ beta * C)`` for e4m3/e5m2 A and B and
float32 scales, each given at one granularity:

- ``"tensor"``: one value for the whole operand (a 0-d tensor, or one of shape (1,) or (1, 1));
- ``"row"``: A one per row, (M,) or (M, 1) (per token); B one per column, (N,) or (1, N) (per
  channel);
- ``"block"``: A one per row and :data:`BLOCK` elements of K, (M, ceil(K/128)); B one per
  128 x 128 tile, (ceil(K/128), ceil(N/128)).

A scale multiplies the values it covers (it is the dequantizing factor): :func:`quantize`
returns values and scales such that ``scales * values`` approximates the tensor it was given.
Where one shape fits two granularities (M = 1, or K <= 128) they give the same product, and the
coarser name is taken.
"""
from __future__ import annotations

from typing import Any

from multibackend.core import dtypes
from multibackend.core.errors import InvalidArgument

#: the side of a scale block along K (and along N for B)
BLOCK = 128
GRANULARITIES = ("tensor", "row", "block")
FP8 = ("float8_e4m3fn", "float8_e5m2")


def _blocks(size: int) -> int:
    return -(-size // BLOCK)


def shapes(operand: str, rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The shapes a scale of ``operand`` ("A", M x K; or "B", K x N) takes, per granularity."""
    if operand == "A":
        m, k = rows, cols
        return {"tensor": ((), (1,), (1, 1)), "row": ((m,), (m, 1)),
                "block": ((m, _blocks(k)),)}
    k, n = rows, cols
    return {"tensor": ((), (1,), (1, 1)), "row": ((n,), (1, n)),
            "block": ((_blocks(k), _blocks(n)),)}


def granularity(op: str, name: str, scale: Any, operand: str, rows: int, cols: int) -> str:
    """The granularity of the float32 tensor ``scale`` (argument ``name``) for ``operand`` of
    ``rows`` x ``cols``; InvalidArgument naming the shapes it could have where it has none."""
    shape = tuple(int(s) for s in scale.shape)
    offered = shapes(operand, rows, cols)
    for kind in GRANULARITIES:
        if shape in offered[kind]:
            return kind
    words = {"A": ("one per row of A", "one per row and 128 elements of K"),
             "B": ("one per column of B", "one per 128 x 128 tile of B")}[operand]
    raise InvalidArgument(
        f"{op}: {name} is {shape} but {operand} is ({rows}, {cols}): {name} must be a scalar "
        f"(tensor-wise), {' or '.join(map(str, offered['row']))} ({words[0]}), or "
        f"{offered['block'][0]} ({words[1]})")


def canonical(scale: Any, kind: str, operand: str, rows: int, cols: int) -> Any:
    """``scale`` (a torch tensor of granularity ``kind``) as the backends take it,
    contiguous: tensor-wise 0-d, A's row-wise (rows, 1), B's (1, cols), block-wise as given."""
    if kind == "tensor":
        scale = scale.reshape(())
    elif kind == "row":
        scale = scale.reshape((rows, 1) if operand == "A" else (1, cols))
    return scale.contiguous()


def expanded(scale: Any, kind: str, operand: str, rows: int, cols: int) -> Any:
    """``scale`` (of granularity ``kind``) repeated over every element of ``operand``'s
    ``rows`` x ``cols``: the factor each element is multiplied by."""
    if kind == "tensor":
        return scale.reshape(()).expand(rows, cols)
    if kind == "row":
        return scale.reshape(rows, 1).expand(rows, cols) if operand == "A" else \
            scale.reshape(1, cols).expand(rows, cols)
    grid = scale.repeat_interleave(BLOCK, dim=1)[:, :cols]
    if operand == "B":
        grid = grid.repeat_interleave(BLOCK, dim=0)[:rows]
    return grid


def quantize(x: Any, granularity: str = "tensor", *, dtype: str = "float8_e4m3fn",
             operand: str = "A") -> tuple[Any, Any]:
    """``x`` (a 2-D float torch tensor) as fp8 ``values`` and float32 ``scales`` of one
    granularity, for use as ``operand`` ("A" or "B") of a scaled matmul:
    ``matmul(values_a, values_b, scale_a=scales_a, scale_b=scales_b)``. Each scale is the
    largest magnitude it covers times the float32 reciprocal of the fp8 type's largest finite
    value (1 where all it covers is zero), so that ``scales * values`` approximates ``x`` to the fp8 type's precision."""
    import torch

    if dtype not in FP8:
        raise InvalidArgument(f"quantize: dtype is {dtype!r}: expected one of {', '.join(FP8)}")
    if granularity not in GRANULARITIES:
        raise InvalidArgument(f"quantize: granularity is {granularity!r}: expected one of "
                              f"{', '.join(GRANULARITIES)}")
    if operand not in ("A", "B"):
        raise InvalidArgument(f"quantize: operand is {operand!r}: expected 'A' or 'B'")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise InvalidArgument(f"quantize: x is {getattr(x, 'shape', type(x).__name__)} "
                              f"{getattr(x, 'dtype', '')}: expected a 2-D float torch tensor")
    rows, cols = x.shape
    wide = x.detach().to(torch.float32).abs()
    if granularity == "tensor":
        amax = wide.amax()
    elif granularity == "row":
        amax = wide.amax(dim=1) if operand == "A" else wide.amax(dim=0)
    else:
        amax = _block_amax(wide, operand)
    largest = torch.finfo(dtypes.torch_dtype(dtype)).max
    # times the reciprocal, not over the number: torch's CUDA division by a number multiplies
    # by its reciprocal and its host division divides, so this gives the same bits on both
    # (and as Triton's one-kernel quantization, backends/triton/quantize.py)
    scales = torch.where(amax > 0, amax * (1.0 / largest), torch.ones_like(amax))
    grid = expanded(scales, granularity, operand, rows, cols)
    values = (x.to(torch.float32) / grid).clamp(-largest, largest).to(dtypes.torch_dtype(dtype))
    return values, scales


def _block_amax(wide: Any, operand: str) -> Any:
    """The largest magnitude per scale block: A's 1 x 128 slices of each row, B's 128 x 128
    tiles (the last ones ragged)."""
    import torch.nn.functional as F

    rows, cols = wide.shape
    padded = F.pad(wide, (0, _blocks(cols) * BLOCK - cols,
                          0, (_blocks(rows) * BLOCK - rows) if operand == "B" else 0))
    if operand == "A":
        return padded.view(rows, _blocks(cols), BLOCK).amax(dim=2)
    return padded.view(_blocks(rows), BLOCK, _blocks(cols), BLOCK).amax(dim=(1, 3))
