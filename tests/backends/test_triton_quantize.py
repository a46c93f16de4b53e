"""Triton's one-kernel fp8 quantization of a matrix's rows (``backends/triton/quantize.py``)
against :func:`multibackend.quantize`, in Triton's interpreter.

The interpreter converts float32 to fp8 with two faults of its own (a value rounded up to the
next power of two loses the carry: 127.8 becomes 64, not 128; ties round away from zero, not
to even), so here every quotient is an fp8 value already: each row (or 128-wide slice) holds
random fp8 values times a power of two and one of the type's largest magnitude, so its scale is
that power of two exactly and nothing rounds. What is checked is which elements each scale
covers (ragged slices, a zero row, strided input); the GPU tier checks the rounding, bit for
bit, on random data."""
from __future__ import annotations

import pytest

import multibackend as mb
from multibackend.core import dtypes

torch = pytest.importorskip("torch")


def _exact(rows: int, cols: int, fp8: str, granularity: str, gen) -> torch.Tensor:
    """float32 rows whose quotients by their scales are fp8 values (see the module doc)."""
    kind = dtypes.torch_dtype(fp8)
    largest = torch.finfo(kind).max
    codes = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.uint8)
    values = codes.view(kind).float()
    values = torch.where(values.isfinite(), values, torch.zeros(())).clamp(-largest, largest)
    width = 128 if granularity == "block" else cols
    for start in range(0, cols, width):
        values[:, start] = largest * torch.where(torch.rand(rows, generator=gen) < 0.5, -1, 1)
    powers = 2.0 ** torch.randint(-12, 6, (rows, -(-cols // width)), generator=gen).float()
    x = values * powers.repeat_interleave(width, dim=1)[:, :cols]
    x[1] = 0  # a zero row: scale 1
    return x


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("shape", [(9, 300), (5, 2100), (3, 128), (6, 17)])
def test_one_kernel_quantization_matches_quantize(shape, granularity, fp8):
    from multibackend.backends.triton.configs import interpreting
    from multibackend.backends.triton.quantize import quantize_rows

    if not interpreting():
        pytest.skip("Triton runs host arrays in its interpreter only (TRITON_INTERPRET=1)")
    gen = torch.Generator().manual_seed(shape[1])
    x = _exact(*shape, fp8, granularity, gen)
    for given in (x, x.bfloat16(), x.T.contiguous().T):  # bf16 holds these values exactly
        values, scales = quantize_rows(given, granularity, fp8)
        expected_values, expected_scales = mb.quantize(given, granularity, dtype=fp8,
                                                       operand="A")
        assert scales.shape == expected_scales.shape and torch.equal(scales, expected_scales)
        assert values.dtype == expected_values.dtype
        assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))


def test_other_granularities_are_refused_by_name():
    from multibackend.backends.triton.quantize import quantize_rows

    with pytest.raises(mb.InvalidArgument, match="granularity is 'tensor': expected 'row' or "
                                                 "'block'"):
        quantize_rows(torch.ones(2, 2), "tensor")
