"""The sub-byte packing helpers: documented bit order, round trips, padding, argument errors,
and the exact packed references (int4 products, AND / XOR popcounts) against plain loops."""
from __future__ import annotations

import pytest
import torch

from multibackend.core.errors import InvalidArgument, InvalidType
from multibackend.core.packing import (
    pack_bits,
    pack_int4,
    reference_packed,
    unpack_bits,
    unpack_int4,
)
from multibackend.core.problem import synthetic


def test_int4_nibble_order_is_low_nibble_first():
    packed = pack_int4(torch.tensor([[1, 2, -1, 7]]))
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x21, 0x7F]]


def test_bit_order_is_lsb_first():
    bits = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]])
    assert pack_bits(bits).tolist() == [[0x01, 0x02]]


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("length", [1, 7, 8, 33])
@pytest.mark.parametrize("dim", [-1, 0])
def test_int4_round_trip(signed, length, dim):
    g = torch.Generator().manual_seed(length)
    lo, hi = (-8, 8) if signed else (0, 16)
    shape = (3, length) if dim == -1 else (length, 3)
    values = torch.randint(lo, hi, shape, generator=g)
    packed = pack_int4(values, dim, signed=signed)
    assert packed.shape[dim] == (length + 1) // 2
    back = unpack_int4(packed, dim, signed=signed, length=length)
    assert torch.equal(back.to(torch.int64), values)
    padded = unpack_int4(packed, dim, signed=signed)
    assert padded.shape[dim] == 2 * packed.shape[dim]
    assert int(padded.narrow(dim if dim >= 0 else padded.dim() + dim, length,
                             padded.shape[dim] - length).abs().sum()) == 0


@pytest.mark.parametrize("length", [1, 8, 13, 130])
@pytest.mark.parametrize("dim", [-1, 0])
def test_bits_round_trip(length, dim):
    g = torch.Generator().manual_seed(length)
    shape = (2, length) if dim == -1 else (length, 2)
    values = torch.randint(0, 2, shape, generator=g)
    packed = pack_bits(values.bool(), dim)
    assert packed.shape[dim] == (length + 7) // 8
    assert torch.equal(unpack_bits(packed, dim, length=length).to(torch.int64), values)


def test_errors_name_the_argument_and_rule():
    with pytest.raises(InvalidArgument, match="values spans .*-8..7"):
        pack_int4(torch.tensor([8]))
    with pytest.raises(InvalidArgument, match="0..15"):
        pack_int4(torch.tensor([-1]), signed=False)
    with pytest.raises(InvalidArgument, match="0 or 1"):
        pack_bits(torch.tensor([2]))
    with pytest.raises(InvalidArgument, match="uint8"):
        unpack_int4(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(InvalidType, match="torch tensor"):
        pack_bits([1, 0])
    with pytest.raises(InvalidArgument, match="length is 9"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), length=9)


def _loops(kind, op, a, b):
    m, k = a.shape
    n = b.shape[1]
    out = torch.zeros(m, n, dtype=torch.int64)
    for i in range(m):
        for j in range(n):
            if kind == "bit":
                x, y = a[i].tolist(), b[:, j].tolist()
                out[i, j] = sum((p ^ q) if op == "xor" else (p & q) for p, q in zip(x, y))
            else:
                out[i, j] = int((a[i].to(torch.int64) * b[:, j].to(torch.int64)).sum())
    return out


@pytest.mark.parametrize("kind,op", [("int4", None), ("uint4", None), ("bit", "xor"),
                                     ("bit", "and")])
def test_reference_packed_matches_loops(kind, op):
    g = torch.Generator().manual_seed(7)
    m, n, k = 5, 6, 19 if kind != "bit" else 21
    if kind == "bit":
        a = torch.randint(0, 2, (m, k), generator=g)
        b = torch.randint(0, 2, (k, n), generator=g)
        ap, bp = pack_bits(a, -1), pack_bits(b, 0)
        kp = ap.shape[-1] * 8
    else:
        lo, hi = (-8, 8) if kind == "int4" else (0, 16)
        a = torch.randint(lo, hi, (m, k), generator=g)
        b = torch.randint(lo, hi, (k, n), generator=g)
        ap, bp = pack_int4(a, -1, signed=kind == "int4"), pack_int4(b, 0, signed=kind == "int4")
        kp = ap.shape[-1] * 2
    problem = synthetic(m, n, kp, kind, bitop=op)
    got = reference_packed(problem, ap, bp)
    assert got.dtype == torch.int64 and got.shape == (1, m, n)
    assert torch.equal(got[0], _loops(kind, op, a, b))


def test_reference_packed_broadcasts_batch_and_checks_k():
    a = pack_int4(torch.ones(2, 3, 4, dtype=torch.int64))
    b = pack_int4(torch.ones(4, 5, dtype=torch.int64), 0)
    problem = synthetic(3, 5, 4, "int4", batch=2)
    assert torch.equal(reference_packed(problem, a, b), torch.full((2, 3, 5), 4, dtype=torch.int64))
    with pytest.raises(InvalidArgument, match="same K"):
        reference_packed(problem, a, pack_int4(torch.ones(6, 5, dtype=torch.int64), 0))
