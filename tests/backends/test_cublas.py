"""CPU tier for the cuBLAS backend's fp8 route, run on host tensors (torch's ``_scaled_mm`` runs
there too, with unit scales exactly as cuBLASLt): D written in place by one
``torch._scaled_mm``, its scales made once."""
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


def test_fp8_scales_are_made_once_and_fp8_products_are_not_one_torch_op():
    """The scales a call hands ``torch._scaled_mm`` are kept (a repeated or captured call
    allocates nothing); an fp8 product is not handed out as one of torch's own ops (which
    torch.compile would trace and family plans would serve for any layout)."""
    assert cublas.scale(0.5, "cpu") is cublas.scale(0.5, "cpu")
    assert cublas.scale(0.5, "cpu").dtype == torch.float32
    assert cublas.scale(0.5, "cpu").item() == 0.5
    problem = synthetic(16, 32, 48, "float8_e4m3fn", b_layout="col", out_dtype="bfloat16",
                        device="cpu", cc=None)
    assert cublas.CublasBackend().produce(problem, Config.of("default"), 1.0, 0, "torch",
                                          True) is None
