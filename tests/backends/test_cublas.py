"""CPU tier for the cuBLAS backend's fp8 route, run on host tensors (torch's ``_scaled_mm`` runs
there too, with unit scales exactly as cuBLASLt): D written by one ``torch._scaled_mm``; a
repeated call is the one ``torch._scaled_mm`` a caller would make, its scales made once."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from multibackend.backends.cublas import backend as cublas  # noqa: E402
from multibackend.core.config import Config, Operands  # noqa: E402
from multibackend.core.problem import synthetic  # noqa: E402


def _fp8_operands(m: int, n: int, k: int):
    """Small integers, exact in e4m3, B column-major as cuBLASLt takes it."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-3, 4, (m, k), generator=gen).float().to(torch.float8_e4m3fn)
    b = torch.randint(-3, 4, (n, k), generator=gen).float().to(torch.float8_e4m3fn).T
    return a, b


def test_an_fp8_product_is_written_into_d_by_one_scaled_mm():
    """Unit scales: small-integer sums are exact; D is written in place (no copy). (How the
    scales meet the sums is cuBLASLt's: the GPU tier checks alpha there.)"""
    a, b = _fp8_operands(32, 48, 64)
    problem = synthetic(32, 48, 64, "float8_e4m3fn", b_layout="col", out_dtype="float32",
                        device="cpu", cc=None)
    d = torch.full((1, 32, 48), float("nan"))
    cublas.CublasBackend._lt(problem, Operands(a.unsqueeze(0), b.unsqueeze(0), None, d))
    assert torch.equal(d[0].double(), a.double() @ b.double())


def test_a_repeated_fp8_call_is_one_scaled_mm_with_scales_made_once():
    a, b = _fp8_operands(16, 32, 48)
    problem = synthetic(16, 32, 48, "float8_e4m3fn", b_layout="col", out_dtype="bfloat16",
                        device="cpu", cc=None)
    backend = cublas.CublasBackend()
    produce = backend.produce(problem, Config.of("default"), 0.5, 0, "torch", True)
    assert produce is not None
    first, again = produce(a, b), produce(a, b)
    assert first.dtype == torch.bfloat16 and torch.equal(first, again)
    assert torch.equal(first, torch._scaled_mm(a, b, scale_a=cublas.scale(0.5, "cpu"),
                                               scale_b=cublas.scale(1.0, "cpu"),
                                               out_dtype=torch.bfloat16))
    assert cublas.scale(0.5, "cpu") is cublas.scale(0.5, "cpu")
    with_c = synthetic(16, 32, 48, "float8_e4m3fn", b_layout="col", out_dtype="bfloat16",
                       has_c=True, device="cpu", cc=None)
    assert backend.produce(with_c, Config.of("default"), 1.0, 1.0, "torch", True) is None
