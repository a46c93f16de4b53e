"""Operand factories for tests: fresh random data of every dtype, and poisoned outputs."""
from __future__ import annotations

import torch

from multibackend.crosscheck import poison


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
