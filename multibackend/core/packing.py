"""Bit-packing of sub-byte operands (int4, uint4, bit) and their exact references.

Sub-byte matrices travel as ``uint8`` tensors packed along K, the reduction dimension: A (M x K)
is stored as M x K/2 bytes (int4, uint4) or M x K/8 bytes (bit), B (K x N) as K/2 x N or K/8 x N
bytes. Either byte matrix may be row- or column-major; a B made as the transposed view of a
row-major N x K/per array is column-major, which is what the tensor cores read directly.

Bit order (the one WMMA's sub-byte fragments use, so nothing is repacked on the device: they
read little-endian 32-bit words whose element ``j`` sits at bits ``[w*j, w*j + w)``):

- int4 / uint4: element ``k`` lives in byte ``k // 2``; even ``k`` in the low nibble (bits 0-3),
  odd ``k`` in the high nibble (bits 4-7). int4 is two's complement, -8..7; uint4 is 0..15.
- bit: element ``k`` lives in byte ``k // 8`` at bit ``k % 8`` (``(byte >> (k % 8)) & 1``).

A length that is not a multiple of 2 (or 8) is padded with zero elements, which add nothing to
an int4 product or to AND/XOR popcounts (0 xor 0 = 0); the logical K of a packed problem is the
packed length times the elements per byte.
"""
from __future__ import annotations

from typing import Any

from multibackend.core.errors import InvalidArgument, InvalidType

PER_BYTE = {"int4": 2, "uint4": 2, "bit": 8}


def _torch():
    import torch

    return torch


def _check_tensor(name: str, value) -> None:
    if not isinstance(value, _torch().Tensor):
        raise InvalidType(f"{name} is {type(value).__name__}: a torch tensor is required")


def _move_last(t, dim: Any, name: str):
    """``t`` with axis ``dim`` moved last, and that axis as a non-negative index; raises
    naming ``name`` (the tensor's argument) for a 0-d tensor or an axis it does not have."""
    if type(dim) is not int or not -t.dim() <= dim < t.dim():
        raise InvalidArgument(f"dim is {dim!r} but {name} is {tuple(t.shape)}: dim must be an "
                              f"axis of {name}, in -{t.dim()}..{t.dim() - 1}" if t.dim() else
                              f"dim is {dim!r} but {name} is 0-d: packing runs along an axis")
    dim = dim % t.dim()
    return t.movedim(dim, -1), dim


def _pad_last(t, multiple: int):
    extra = (-t.shape[-1]) % multiple
    if extra:
        t = _torch().nn.functional.pad(t, (0, extra))
    return t


def pack_int4(values: Any, dim: int = -1, *, signed: bool = True) -> Any:
    """Pack 4-bit integers along ``dim`` two to a byte (uint8 result; see the module doc for the
    nibble order). ``values`` holds integers in -8..7 (``signed``) or 0..15."""
    torch = _torch()
    _check_tensor("values", values)
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise InvalidArgument(f"values has dtype {values.dtype}: pack_int4 takes integer tensors")
    lo, hi = (-8, 7) if signed else (0, 15)
    if values.numel() and (int(values.min()) < lo or int(values.max()) > hi):
        raise InvalidArgument(f"values spans {int(values.min())}..{int(values.max())}: "
                              f"{'int4' if signed else 'uint4'} elements must lie in {lo}..{hi}")
    t, dim = _move_last(values.to(torch.int16), dim, "values")
    t = _pad_last(t, 2) & 0xF
    packed = (t[..., 0::2] | (t[..., 1::2] << 4)).to(torch.uint8)
    return packed.movedim(-1, dim).contiguous()


def unpack_int4(packed: Any, dim: int = -1, *, signed: bool = True,
                length: int | None = None) -> Any:
    """The int8 elements of a :func:`pack_int4` result along ``dim`` (``length`` of them; all
    by default)."""
    torch = _torch()
    _check_tensor("packed", packed)
    if packed.dtype != torch.uint8:
        raise InvalidArgument(f"packed has dtype {packed.dtype}: packed operands are uint8")
    t, dim = _move_last(packed.to(torch.int16), dim, "packed")
    out = torch.stack((t & 0xF, t >> 4), dim=-1).flatten(-2)
    if signed:
        out = torch.where(out >= 8, out - 16, out)
    if length is not None:
        if not 0 <= length <= out.shape[-1]:
            raise InvalidArgument(f"length is {length}: it must lie in 0..{out.shape[-1]}")
        out = out[..., :length]
    return out.to(torch.int8).movedim(-1, dim).contiguous()


def pack_bits(values: Any, dim: int = -1) -> Any:
    """Pack 0/1 (or bool) elements along ``dim`` eight to a byte, element ``k`` at bit ``k % 8``
    of byte ``k // 8`` (uint8 result)."""
    torch = _torch()
    _check_tensor("values", values)
    if values.dtype != torch.bool:
        if values.dtype.is_floating_point:
            raise InvalidArgument(f"values has dtype {values.dtype}: pack_bits takes bool or "
                                  "integer 0/1 tensors")
        if values.numel() and (int(values.min()) < 0 or int(values.max()) > 1):
            raise InvalidArgument(f"values spans {int(values.min())}..{int(values.max())}: "
                                  "bit elements must be 0 or 1")
    t, dim = _move_last(values.to(torch.int16), dim, "values")
    t = _pad_last(t, 8)
    t = t.reshape(*t.shape[:-1], -1, 8)
    weights = (1 << torch.arange(8, dtype=torch.int16, device=t.device))
    packed = (t * weights).sum(dim=-1).to(torch.uint8)
    return packed.movedim(-1, dim).contiguous()


def unpack_bits(packed: Any, dim: int = -1, *, length: int | None = None) -> Any:
    """The 0/1 elements (uint8) of a :func:`pack_bits` result along ``dim``."""
    torch = _torch()
    _check_tensor("packed", packed)
    if packed.dtype != torch.uint8:
        raise InvalidArgument(f"packed has dtype {packed.dtype}: packed operands are uint8")
    t, dim = _move_last(packed.to(torch.int16), dim, "packed")
    shifts = torch.arange(8, dtype=torch.int16, device=t.device)
    out = ((t.unsqueeze(-1) >> shifts) & 1).flatten(-2)
    if length is not None:
        if not 0 <= length <= out.shape[-1]:
            raise InvalidArgument(f"length is {length}: it must lie in 0..{out.shape[-1]}")
        out = out[..., :length]
    return out.to(torch.uint8).movedim(-1, dim).contiguous()


def _unpack(kind: str, packed, dim: int):
    if kind == "bit":
        return unpack_bits(packed, dim)
    return unpack_int4(packed, dim, signed=(kind == "int4"))


def reference_packed(problem: Any, a_packed: Any, b_packed: Any) -> Any:
    """The exact product of packed operands as an int64 tensor (batch, M, N).

    ``a_packed`` is (batch, M, K/per) or (M, K/per), ``b_packed`` (batch, K/per, N) or
    (K/per, N), uint8, packed along K as the module doc says. For ``problem.packed`` "int4" /
    "uint4" the result is A @ B; for "bit" it is, per (m, n), the popcount of A[m, :] AND B[:, n]
    (``problem.bitop`` "and") or of A[m, :] XOR B[:, n] ("xor": a Hamming distance). Computed in
    float64 on the operands' device, exact for every K below 2**45.
    """
    torch = _torch()
    kind = problem.packed
    if kind not in PER_BYTE:
        raise InvalidArgument(f"problem.packed is {kind!r}: one of {', '.join(PER_BYTE)} is "
                              "required for a packed reference")
    if kind == "bit" and problem.bitop not in ("xor", "and"):
        raise InvalidArgument(f"problem.bitop is {problem.bitop!r}: 'xor' or 'and' is required")
    a = a_packed if a_packed.dim() == 3 else a_packed.unsqueeze(0)
    b = b_packed if b_packed.dim() == 3 else b_packed.unsqueeze(0)
    if a.shape[-1] != b.shape[-2]:
        raise InvalidArgument(f"a_packed has {a.shape[-1]} bytes along K but b_packed has "
                              f"{b.shape[-2]}: both must be packed to the same K")
    a64 = _unpack(kind, a, -1).to(torch.float64)
    b64 = _unpack(kind, b, -2).to(torch.float64)
    prod = torch.matmul(a64, b64)
    if kind == "bit" and problem.bitop == "xor":
        prod = a64.sum(-1, keepdim=True) + b64.sum(-2, keepdim=True) - 2 * prod
    out = prod.round().to(torch.int64)
    batch = max(a.shape[0], b.shape[0])
    return out.expand(batch, *out.shape[-2:]).contiguous()
