"""The host backend: torch's own CPU product for host arrays where no GPU runs them, held to
the library's semantics (float32 accumulation rounded once, exact int8 that wraps, alpha = 0
and beta = 0 reading nothing), and ``auto`` and patched models on a machine without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import multibackend as mb
from multibackend.core.problem import synthetic


def _ints(shape, seed, dtype=torch.float16, low=-4, high=5):
    """Small integers: every product and sum is exact in the accumulator."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_small_integer_products_are_exact(dtype):
    a, b, c = _ints((37, 53), 1, dtype), _ints((53, 29), 2, dtype), _ints((37, 29), 3, dtype)
    got = mb.matmul(a, b, c, alpha=2, beta=-1, backend="host")
    want = 2 * (a.double() @ b.double()) - c.double()  # exact: rounded once to D's dtype
    assert got.dtype == dtype and torch.equal(got, want.to(dtype))


def test_half_products_round_once_from_float32():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(64, 300, generator=g).half()
    b = torch.randn(300, 48, generator=g).half()
    got = mb.matmul(a, b, backend="host")
    assert torch.equal(got, (a.float() @ b.float()).half())


def test_int8_accumulates_exactly_and_wraps_to_int32():
    a = torch.full((2, 70000), 127, dtype=torch.int8)
    b = torch.full((70000, 3), 127, dtype=torch.int8)
    exact = 127 * 127 * 70000
    wrapped = (exact + 2**31) % 2**32 - 2**31
    got = mb.matmul(a, b, backend="host")
    assert got.dtype == torch.int32 and (got == wrapped).all()


def test_alpha_zero_reads_neither_a_nor_b_and_beta_zero_not_c():
    a = torch.full((4, 8), float("nan"))
    b = torch.ones(8, 3)
    c = _ints((4, 3), 5, torch.float32)
    assert torch.equal(mb.matmul(a, b, c, alpha=0.0, beta=1.0, backend="host"), c)
    nan_c = torch.full((4, 3), float("nan"))
    ok = mb.matmul(torch.ones(4, 8), b, nan_c, beta=0.0, backend="host")
    assert torch.isfinite(ok).all()


def test_batches_and_dot():
    a, b = _ints((3, 5, 7), 6, torch.float32), _ints((7, 2), 7, torch.float32)
    assert torch.equal(mb.matmul(a, b, backend="host"), a @ b)
    for dtype in (torch.float16, torch.float32):
        x, y = _ints((100,), 8, dtype), _ints((100,), 9, dtype)
        got = mb.dot(x, y, backend="host")
        assert got.dtype == torch.float32 and got.item() == float(x.double() @ y.double())


def test_numpy_arrays_come_back_as_numpy():
    a, b = np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(4, 2)
    got = mb.matmul(a, b, backend="host")
    assert isinstance(got, np.ndarray) and np.array_equal(got, a @ b)


def test_refuses_gpu_problems_and_reduced_float32_precision():
    from multibackend.choose.registry import REGISTRY

    host = REGISTRY.get("host")
    refused = host.supports(synthetic(64, 64, 64, "float16", device="cuda:0"))
    assert refused.rule == "device" and "cuda:0" in refused.message
    tf32 = synthetic(64, 64, 64, "float32", precision="tf32", device="cpu", cc=None)
    assert host.supports(tf32).rule == "precision"


NO_GPU_SCRIPT = textwrap.dedent("""
    import torch
    import multibackend as mb
    from multibackend.eager import matmul as eager_matmul

    a, b = torch.randn(16, 32), torch.randn(32, 8)
    decision = mb.explain(a, b)
    assert decision.backend == "host" and "torch's own CPU product" in decision.detail, decision
    assert torch.allclose(mb.matmul(a, b), a @ b, rtol=1e-6, atol=1e-6)
    try:
        mb.matmul(a, b, backend="triton")
        raise SystemExit("a named GPU backend ran without a GPU")
    except mb.BackendUnavailable as exc:
        assert "TRITON_INTERPRET=1" in str(exc)

    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 32)
    want = model(x)
    mb.patch(model)
    import multibackend.nn as mbnn
    calls = []
    real = mbnn.matmul
    mbnn.matmul = lambda *args, **kw: calls.append(1) or real(*args, **kw)
    got = model(x)
    assert torch.equal(got, want) and not calls, "a patched CPU model ran torch's own layers"
    print("ok")
""")


def test_without_a_gpu_auto_and_patched_models_answer_on_the_host():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: host arrays are computed on it")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", NO_GPU_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
