"""GPU tier for the fault classes only a GPU shows: a scale that takes D past its dtype's range
(Inf as torch gives it, never NaN, split-K partial sums included), int8 operands over their
whole range through ``auto`` and by name, int8 sums past int32 wrapping in every backend,
and e5m2 by e5m2 through ``auto`` (which cuBLAS cannot run). Each gives the right answer or
the library's own error naming the problem, never a wrong answer."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb

pytestmark = pytest.mark.gpu

NAMED = ("auto", "cublas", "triton", "raw_wmma")


def _ints(shape, seed: int, low: int, high: int, dtype):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(low, high + 1, shape, generator=gen, device="cuda").to(dtype)


def _answer_or_refusal(call):
    """The call's result, or None where the backend refuses the problem with our error."""
    try:
        return call()
    except mb.UnsupportedProblem:
        return None


@pytest.mark.parametrize("backend", NAMED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mnk", [(64, 80, 96), (16, 40, 4096)], ids=["tile", "split-k"])
def test_alpha_past_the_range_gives_inf_as_torch_never_nan(backend, dtype, mnk):
    """Small-integer operands make every sum exact, so the only question is the scaling:
    alpha = 1e38 takes most of D past the largest float16 and bfloat16 value. Partial sums of
    opposite signs (the split-K shape) must not meet as Inf - Inf."""
    m, n, k = mnk
    a, b = _ints((m, k), 1, -3, 3, dtype), _ints((k, n), 2, -3, 3, dtype)
    expected = (a.double() @ b.double() * 1e38).to(dtype)
    assert expected.isinf().any() and (~expected.isinf()).any()
    d = _answer_or_refusal(lambda: mb.matmul(a, b, alpha=1e38, backend=backend))
    if d is None:
        return
    assert not d.isnan().any(), f"{int(d.isnan().sum())} NaN where torch gives +-Inf"
    assert torch.equal(d, expected)


@pytest.mark.parametrize("backend", NAMED)
@pytest.mark.parametrize("b_major", ["row", "col"])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (33, 24, 40), (1000, 1000, 1000),
                                 (16, 4096, 1024)])
def test_int8_over_its_whole_range_is_exact(backend, b_major, mnk):
    m, n, k = mnk
    a = _ints((m, k), 3, -128, 127, torch.int8)
    b = _ints((k, n), 4, -128, 127, torch.int8)
    if b_major == "col":
        b = b.T.contiguous().T
    d = _answer_or_refusal(lambda: mb.matmul(a, b, backend=backend))
    if d is None:
        assert backend != "auto", "auto found no backend for an int8 product"
        return
    assert d.dtype == torch.int32
    assert torch.equal(d.cpu().long(), a.cpu().long() @ b.cpu().long())  # no int64 GEMM on GPUs


@pytest.mark.parametrize("backend", NAMED)
def test_int8_sums_past_int32_wrap_in_every_backend(backend):
    """127 * 127 * 133,200 passes 2**31: the documented result wraps modulo 2**32 (cuBLAS,
    which would saturate, refuses such K; ``auto`` goes elsewhere)."""
    k = 133_200
    a = torch.full((16, k), 127, dtype=torch.int8, device="cuda")
    b = torch.full((k, 16), 127, dtype=torch.int8, device="cuda").T.contiguous().T
    exact = 127 * 127 * k
    wrapped = (exact + 2**31) % 2**32 - 2**31
    d = _answer_or_refusal(lambda: mb.matmul(a, b, backend=backend))
    if d is None:
        assert backend == "cublas", f"{backend} refused K = {k}"
        return
    assert torch.equal(d, torch.full_like(d, wrapped))


def test_e5m2_by_e5m2_through_auto_is_answered_by_another_backend():
    a = _ints((64, 96), 5, -3, 3, torch.float16).to(torch.float8_e5m2)
    b = _ints((96, 48), 6, -3, 3, torch.float16).to(torch.float8_e5m2).T.contiguous().T
    assert mb.explain(a, b).backend not in ("cublas", None)
    d = mb.matmul(a, b)
    assert torch.equal(d.double(), a.double() @ b.double())
