"""The float64 reference's two tests on the CPU: results a correct kernel makes (float32 sums
rounded to D's dtype) pass, on random data and where cancellation leaves elements near zero;
one wrong element of a large result, within the norm-wise bound, fails the element-wise one."""
from __future__ import annotations

import pytest
import torch

from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import synthetic, synthetic_dot
from multibackend.verify import reference


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.rand((1, m, k), generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    b = (torch.rand((1, k, n), generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    c = (torch.rand((1, m, n), generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    return a, b, c


def _kernel_like(a, b, c=None, alpha=1.0, beta=0.0):
    """What a correct kernel returns: float32 sums, the epilogue in float32, D's rounding."""
    d = alpha * (a.float() @ b.float())
    if c is not None:
        d = d + beta * c.float()
    return d.to(a.dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (33, 17, 4096), (256, 256, 256), (7, 300, 65)])
def test_correct_results_pass(dtype, m, n, k):
    torch_dtype = getattr(torch, dtype)
    a, b, c = _operands(m, n, k, torch_dtype, seed=m + n + k)
    plain = reference.compare(synthetic(m, n, k, dtype), _kernel_like(a, b),
                              reference.reference_matmul(a, b))
    assert plain.ok, plain.detail
    full = reference.compare(synthetic(m, n, k, dtype, has_c=True),
                             _kernel_like(a, b, c, alpha=-1.5, beta=0.25),
                             reference.reference_matmul(a, b, c, -1.5, 0.25))
    assert full.ok, full.detail


def test_product_rounded_before_c_is_added_passes():
    """``A @ B`` rounded to float16, then C added and rounded again (what torch's addmm does
    on float16): where C cancels the product, the error is the product's rounding."""
    a, b, c = _operands(200, 96, 64, torch.float16, seed=63)
    got = (_kernel_like(a, b).float() + c.float()).to(torch.float16)
    cmp = reference.compare(synthetic(200, 96, 64, "float16", has_c=True), got,
                            reference.reference_matmul(a, b, c, 1.0, 1.0))
    assert cmp.ok, cmp.detail


def test_cancellation_passes():
    """C cancels A @ B up to D's rounding: the results are rounding noise, far below their
    scale, and the element-wise bound measures them against the scale."""
    a, b, _ = _operands(64, 64, 512, torch.float16, seed=3)
    c = _kernel_like(a, b)
    got = _kernel_like(a, b, c, alpha=1.0, beta=-1.0)
    ref = reference.reference_matmul(a, b, c, 1.0, -1.0)
    assert float(abs(ref.value).max()) < 1e-2 * float(ref.scale.min())
    cmp = reference.compare(synthetic(64, 64, 512, "float16", has_c=True), got, ref)
    assert cmp.ok, cmp.detail


def test_a_product_cancelled_far_below_its_terms_is_held_to_their_size():
    """(1 + 2^-40) - 1 in float64, off by one rounding of its terms: correct (a summation in
    another order gives it), though 2^-12 of the result, which the norm-wise test measured
    it against; an error many roundings of the terms large still fails."""
    a = torch.tensor([[[1 + 2.0**-40, -1.0]]], dtype=torch.float64)
    b = torch.tensor([[[1.0], [1.0]]], dtype=torch.float64)
    ref = reference.reference_matmul(a, b)
    problem = synthetic(1, 1, 2, "float64")
    rounded = reference.compare(problem, torch.full((1, 1, 1), 2.0**-40 + 2.0**-52,
                                                    dtype=torch.float64), ref)
    assert rounded.ok, rounded.detail
    wrong = reference.compare(problem, torch.full((1, 1, 1), 2.0**-40 + 2.0**-40,
                                                  dtype=torch.float64), ref)
    assert not wrong.ok


def test_one_wrong_element_fails():
    """A 512x512 result with one element 3% off: its norm-wise error is below the norm bound
    (the norm test alone passes it), the element-wise test names it."""
    a, b, _ = _operands(512, 512, 256, torch.float16, seed=5)
    got = _kernel_like(a, b)
    ref = reference.reference_matmul(a, b)
    value = ref.value
    i, j = int(abs(value[0]).argmax()) // 512, int(abs(value[0]).argmax()) % 512
    got[0, i, j] = float(value[0, i, j]) * 1.03
    problem = synthetic(512, 512, 256, "float16")
    cmp = reference.compare(problem, got, ref)
    assert cmp.rel_err < reference.error_bound(problem)
    assert not cmp.ok
    assert f"1 of {512 * 512} elements" in cmp.detail and f"(0, {i}, {j})" in cmp.detail


def test_dot_reference_and_bounds():
    gen = torch.Generator().manual_seed(7)
    x = (torch.rand(4099, generator=gen, dtype=torch.float64) * 2 - 1).to(torch.float16)
    y = (torch.rand(4099, generator=gen, dtype=torch.float64) * 2 - 1).to(torch.float16)
    ref = reference.reference_dot(x, y)
    assert ref.shape == (1,)
    problem = synthetic_dot(4099)
    good = (x.float() * y.float()).sum().reshape(1)
    assert reference.compare(problem, good, ref).ok
    bad = good + float(ref.scale[0]) * 1e-3
    assert not reference.compare(problem, bad, ref).ok


def test_bare_array_for_a_float_result_is_refused():
    a, b, _ = _operands(4, 4, 4, torch.float16, seed=1)
    with pytest.raises(InvalidArgument, match="ref is a bare ndarray for a float16 result"):
        reference.compare(synthetic(4, 4, 4), _kernel_like(a, b),
                          reference.reference_matmul(a, b).value)


def test_subnormal_elements_pass():
    """Products scaled near float16's smallest normal (2**-14): the elements cancellation
    leaves below it round to subnormals, whose spacing is far above their own rounding
    (u_out |ref|); the bound's part measured against the scale allows it."""
    a, b, _ = _operands(64, 64, 16, torch.float16, seed=2)
    got = _kernel_like(a, b, alpha=2.0**-12)
    ref = reference.reference_matmul(a, b, alpha=2.0**-12)
    assert int((abs(got) < 2.0**-14).sum()) > 10
    cmp = reference.compare(synthetic(64, 64, 16), got, ref)
    assert cmp.ok, cmp.detail


def test_results_below_the_normal_range_pass():
    """A row of A scaled by 2**-20: its products lie in float16's subnormal range, where D's
    rounding is absolute (half of 2**-24), whatever the elements' scale; the float64 result
    rounded once passes."""
    a, b, _ = _operands(64, 64, 64, torch.float16, seed=4)
    a[0, 0] *= 2.0**-20
    ref = reference.reference_matmul(a, b)
    got = torch.from_numpy(ref.value).to(torch.float16)
    cmp = reference.compare(synthetic(64, 64, 64), got, ref)
    assert cmp.ok, cmp.detail


def test_integer_results_against_a_bare_array_and_sizes_that_differ():
    x = torch.arange(-8, 8, dtype=torch.int8)
    got = (x.int() * x.int()).sum().reshape(1)
    exact = reference.compare(synthetic_dot(16, "int8"), got, torch.tensor([float(got)]).numpy())
    assert exact.ok and exact.exact
    with pytest.raises(InvalidArgument, match="reference holds 2 elements but out"):
        reference.compare(synthetic_dot(16, "int8"), got, torch.tensor([1.0, 2.0]).numpy())
