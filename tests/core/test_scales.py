"""fp8 scales: the shapes each granularity takes for A and B, the errors that name them, and
:func:`multibackend.quantize`, whose values times scales must give back the tensor to the fp8
type's precision."""
from __future__ import annotations

import pytest

from multibackend.core import scales
from multibackend.core.errors import InvalidArgument

torch = pytest.importorskip("torch")

#: (mantissa bits, spacing of the smallest subnormals) of the fp8 types
FORMATS = {"float8_e4m3fn": (3, 2.0**-9), "float8_e5m2": (2, 2.0**-16)}


@pytest.mark.parametrize("operand, rows, cols, shape, kind", [
    ("A", 64, 300, (), "tensor"), ("A", 64, 300, (1,), "tensor"), ("A", 64, 300, (1, 1), "tensor"),
    ("A", 64, 300, (64,), "row"), ("A", 64, 300, (64, 1), "row"), ("A", 64, 300, (64, 3), "block"),
    ("A", 1, 300, (1,), "tensor"),  # one row: per row is per tensor
    ("A", 64, 128, (64, 1), "row"),  # one block of K: per block is per row
    ("B", 300, 200, (200,), "row"), ("B", 300, 200, (1, 200), "row"),
    ("B", 300, 200, (3, 2), "block"), ("B", 300, 200, (), "tensor"),
])
def test_each_shape_names_its_granularity(operand, rows, cols, shape, kind):
    assert scales.granularity("matmul", "s", torch.ones(shape), operand, rows, cols) == kind


@pytest.mark.parametrize("operand, shape, words", [
    ("A", (300, 64), (r"scale_a must be a scalar \(tensor-wise\), \(64,\) or \(64, 1\) \(one "
                      r"per row of A\), or \(64, 3\) \(one per row and 128 elements of K\)")),
    ("B", (200, 300), (r"\(200,\) or \(1, 200\) \(one per column of B\), or \(3, 2\) \(one "
                       r"per 128 x 128 tile of B\)")),
])
def test_a_scale_of_no_granularity_is_named_with_the_shapes_it_could_have(operand, shape, words):
    rows, cols = (64, 300) if operand == "A" else (300, 200)
    name = "scale_a" if operand == "A" else "scale_b"
    with pytest.raises(InvalidArgument, match=words):
        scales.granularity("matmul", name, torch.ones(shape), operand, rows, cols)


@pytest.mark.parametrize("dtype", sorted(FORMATS))
@pytest.mark.parametrize("granularity", scales.GRANULARITIES)
@pytest.mark.parametrize("operand", ["A", "B"])
def test_quantized_values_times_scales_give_the_tensor_back(dtype, granularity, operand):
    """Ragged sizes (blocks cut short), magnitudes spread over six decades so that scales
    differ between rows and blocks; every element within half an fp8 step of itself."""
    gen = torch.Generator().manual_seed(5)
    rows, cols = 200, 300
    x = torch.randn(rows, cols, generator=gen) * torch.logspace(-3, 3, rows).unsqueeze(1)
    values, found = scales.quantize(x, granularity, dtype=dtype, operand=operand)
    assert values.dtype == getattr(torch, dtype) and values.shape == x.shape
    assert found.dtype == torch.float32
    expected = {"tensor": (), "row": (rows,) if operand == "A" else (cols,),
                "block": (rows, 3) if operand == "A" else (2, 3)}[granularity]
    assert tuple(found.shape) == expected
    grid = scales.expanded(found, granularity, operand, rows, cols).double()
    back = values.double() * grid
    mantissa, subnormal = FORMATS[dtype]
    bound = x.double().abs() * 2.0**-(mantissa + 1) + grid * subnormal / 2
    assert bool(((back - x.double()).abs() <= bound * (1 + 1e-6)).all())
    largest = torch.finfo(getattr(torch, dtype)).max
    assert float(values.float().abs().max()) == largest  # each scale spans its fp8 range


def test_a_block_of_zeros_has_the_unit_scale_and_zero_values():
    x = torch.zeros(4, 256)
    x[:, 128:] = torch.arange(1, 129, dtype=torch.float32)
    values, found = scales.quantize(x, "block", operand="A")
    assert torch.equal(found[:, 0], torch.ones(4)) and bool((values[:, :128].float() == 0).all())


@pytest.mark.parametrize("arguments, words", [
    ({"granularity": "channel"}, "granularity is 'channel'"),
    ({"dtype": "float16"}, "dtype is 'float16'"),
    ({"operand": "C"}, "operand is 'C'"),
])
def test_quantize_names_a_bad_argument(arguments, words):
    with pytest.raises(InvalidArgument, match=words):
        scales.quantize(torch.ones(4, 4), **arguments)


def test_quantize_takes_2d_float_tensors_only():
    with pytest.raises(InvalidArgument, match="expected a 2-D float torch tensor"):
        scales.quantize(torch.ones(2, 3, 4))
    with pytest.raises(InvalidArgument, match="expected a 2-D float torch tensor"):
        scales.quantize(torch.ones(4, 4, dtype=torch.int32))
