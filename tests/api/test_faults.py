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
