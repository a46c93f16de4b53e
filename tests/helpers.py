"""Operand factories for tests: fresh random data of every dtype, poisoned outputs, and
problems whose A is a view of a wider matrix; a recorder of the calls a Linear layer makes to
torch's own linear; an array known only through DLPack."""
from __future__ import annotations

import torch

from multibackend.core.problem import Problem, make_operand, synthetic
from multibackend.verify.crosscheck import poison


def random_tensor(shape, dtype: torch.dtype, device="cpu", *, generator=None, small_int=False):
    """Random values suited to ``dtype``: floats in [-1, 1), or with ``small_int`` small
    integers in [-3, 3] (exact in every float format); integers in their type's small range."""
    if dtype.is_floating_point:
        if small_int:
            t = torch.randint(-3, 4, shape, generator=generator, dtype=torch.int32)
            return t.to(dtype).to(device)
        t = torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1
        return t.to(dtype).to(device)
    lo, hi = (0, 8) if dtype == torch.uint8 else (-8, 8)
    return torch.randint(lo, hi, shape, generator=generator, dtype=torch.int64).to(dtype).to(device)


def poisoned(shape, dtype: torch.dtype, device="cpu"):
    """An output buffer every element of which fails a check unless overwritten."""
    out = torch.empty(shape, dtype=dtype, device=device)
    poison(out)
    return out


def sliced_problem(m: int, n: int, k: int, ld: int, dtype: str = "float16") -> Problem:
    """M x N x K with A a row-major view of a matrix ``ld`` elements wide (rows off the
    16-byte grid where ``ld`` is no multiple of 8), described by numbers alone."""
    return synthetic(m, n, k, dtype).with_(a=make_operand(dtype, m, k, (ld, 1), 0, 0))


def record_torchs_linear(monkeypatch) -> list:
    """The input shapes of every call :class:`multibackend.nn.Linear` makes to
    ``torch.nn.functional.linear`` from now on (the list fills as the layers run)."""
    from multibackend import nn as mb_nn

    shapes = []
    linear = mb_nn._F_LINEAR

    def recording(*args):
        shapes.append(args[0].shape)
        return linear(*args)

    monkeypatch.setattr(mb_nn, "_F_LINEAR", recording)
    return shapes


class DLPackOnly:
    """An array known to multibackend only through the DLPack protocol."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()
