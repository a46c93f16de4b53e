"""Bad input of the kinds a caller makes by mistake: each gives an error of the library's own
types that names the argument, its value and the rule, never an AttributeError or an
OverflowError from inside."""
from __future__ import annotations

import pytest
import torch

import multibackend as mb

A = torch.ones(4, 4)
I8 = torch.ones(32, 32, dtype=torch.int8)


@pytest.mark.parametrize("call, name", [
    (lambda: mb.matmul(A, None), "B"),
    (lambda: mb.matmul(None, A), "A"),
    (lambda: mb.dot(A[0], None), "y"),
    (lambda: mb.dot(None, A[0]), "x"),
    (lambda: mb.explain(A, None, A), "B"),
])
def test_a_missing_operand_is_named(call, name):
    with pytest.raises(mb.InvalidType, match=rf"{name} is None: expected an array"):
        call()


def test_a_missing_operand_is_named_on_a_repeated_call_too():
    mb.matmul(A, A)  # planned: the repeated call's shortest path sees None first
    with pytest.raises(mb.InvalidType, match="B is None"):
        mb.matmul(A, None)


@pytest.mark.parametrize("keyword, value", [("alpha", 10**400), ("beta", -10**400)])
def test_a_scalar_beyond_float64_is_named(keyword, value):
    with pytest.raises(mb.InvalidArgument, match=rf"{keyword} is .*digits\): beyond float64"):
        mb.matmul(A, A, A, **{keyword: value})


@pytest.mark.parametrize("value, rule", [
    (10**400, r"int32 \(-2\*\*31\.\.2\*\*31-1\)"),
    (2**31, r"int32 \(-2\*\*31\.\.2\*\*31-1\)"),
    (2.5, "integer outputs take integer alpha and beta"),
    (float("inf"), "finite integer alpha and beta"),
])
def test_integer_outputs_take_int32_scalars(value, rule):
    with pytest.raises(mb.InvalidArgument, match=rule):
        mb.matmul(I8, I8, alpha=value)


@pytest.mark.parametrize("backend", ["auto", "triton", "host"])
@pytest.mark.parametrize("with_c", [True, False])
def test_alpha_zero_reads_neither_a_nor_b_in_every_backend(backend, with_c):
    """As BLAS says: alpha = 0 gives beta * C (zeros without C) even where A holds NaN."""
    a = torch.full((5, 7), float("nan"))
    b = torch.ones(7, 3)
    c = torch.arange(15.0).reshape(5, 3) if with_c else None
    got = mb.matmul(a, b, c, alpha=0.0, beta=2.0 if with_c else None, backend=backend)
    want = 2 * c if with_c else torch.zeros(5, 3)
    assert torch.equal(got, want)
    decision = mb.explain(a, b, c, alpha=0.0, beta=2.0 if with_c else None, backend=backend)
    assert decision.rule == "trivial" and "alpha is 0" in decision.detail


@pytest.mark.parametrize("backend", ["auto", "triton", "host"])
def test_beta_zero_does_not_read_c(backend):
    a, b = torch.ones(4, 6), torch.ones(6, 2)
    c = torch.full((4, 2), float("nan"))
    assert torch.equal(mb.matmul(a, b, c, beta=0.0, backend=backend), torch.full((4, 2), 6.0))


def test_e5m2_by_e5m2_is_not_given_to_cublas():
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic

    refused = REGISTRY.get("cublas").supports(synthetic(64, 64, 64, "float8_e5m2",
                                                        cc=(9, 0), b_layout="col"))
    assert refused is not None and "e5m2 by e5m2" in refused.message
    e4m3 = synthetic(64, 64, 64, "float8_e4m3fn", cc=(9, 0), b_layout="col")
    assert REGISTRY.get("cublas").capability.check(e4m3) is None


@pytest.mark.parametrize("call", [
    lambda m: mb.matmul(m, m),
    lambda m: mb.matmul(A, A, m),
    lambda m: mb.dot(m[0], m[0]),
])
def test_a_meta_tensor_holds_no_values_and_is_refused(call):
    for _ in range(3):  # host products of A's kind planned: no plan may serve a meta tensor
        mb.matmul(A, A)
    meta = torch.empty(4, 4, device="meta")
    with pytest.raises(mb.InvalidArgument, match="on the meta device"):
        call(meta)


def test_int8_sums_that_can_pass_int32_are_not_given_to_cublas():
    """cuBLASLt's int8 GEMM saturates a sum past int32's range where the library's result wraps
    (as every other backend's does): such K is refused by cuBLAS, so backends agree."""
    from multibackend.backends.cublas.backend import INT8_EXACT_K
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic

    cublas = REGISTRY.get("cublas")
    fits = synthetic(64, 64, INT8_EXACT_K - INT8_EXACT_K % 8, "int8", b_layout="col")
    assert cublas.capability.check(fits) is None
    past = synthetic(64, 64, INT8_EXACT_K + 8 - INT8_EXACT_K % 8, "int8", b_layout="col")
    refused = cublas.capability.check(past)
    assert refused is not None and refused.rule == "size" and "wraps" in refused.message
