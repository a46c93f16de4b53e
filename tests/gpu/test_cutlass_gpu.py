"""GPU tier of the CUTLASS backend: every (dtype, layout) the capability table accepts, on fresh
ragged shapes, against the float64 reference; integer types exact with small-integer operands;
outputs poisoned before every run so that an element the kernel skipped fails."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass_library")

from multibackend import dtypes, reference  # noqa: E402
from multibackend.backends import cutlass as backend_module  # noqa: E402
from multibackend.backends.base import Operands  # noqa: E402
from multibackend.problem import Problem, make_operand  # noqa: E402
from tests.helpers import poisoned, random_tensor  # noqa: E402

BACKEND = backend_module.create()
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
#: (dtype, output, accumulator, precision, K multiple the kernels need)
TYPES = [
    ("float16", "float16", "float32", None, 1), ("float16", "float32", "float32", None, 1),
    ("float16", "float16", "float16", None, 1), ("bfloat16", "bfloat16", "float32", None, 2),
    ("bfloat16", "float32", "float32", None, 2), ("float32", "float32", "float32", "tf32", 1),
    ("float32", "float32", "float32", "tf32x3", 1), ("float32", "float32", "float32", "ieee", 1),
    ("float64", "float64", "float64", None, 1), ("int8", "int32", "int32", None, 4),
    ("uint8", "int32", "int32", None, 4), ("float8_e4m3fn", "float32", "float32", None, 4),
    ("float8_e5m2", "float32", "float32", None, 4),
    ("float8_e4m3fn", "bfloat16", "float32", None, 4),
]


def _cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def _matrix(dtype: str, batch: int, rows: int, cols: int, layout: str, gen, small_int: bool):
    tdtype = dtypes.torch_dtype(dtype)
    if tdtype.is_floating_point and tdtype.itemsize == 1:
        base = random_tensor((batch, rows, cols), torch.float32, generator=gen,
                             small_int=True).to(tdtype)
    else:
        base = random_tensor((batch, rows, cols), tdtype, generator=gen, small_int=small_int)
    base = base.cuda()
    if layout == "col":
        return base.transpose(1, 2).contiguous().transpose(1, 2)
    return base.contiguous()


def _problem(a, b, c, d_dtype, acc, precision) -> Problem:
    batch, m, k = a.shape
    n = b.shape[2]

    def operand(t, dtype):
        return make_operand(dtype, t.shape[1], t.shape[2], (t.stride(1), t.stride(2)),
                            t.stride(0) if batch > 1 else 0, t.data_ptr())

    in_dtype = dtypes.canonical(a.dtype)
    return Problem(op="matmul", m=m, n=n, k=k, batch=batch, a=operand(a, in_dtype),
                   b=operand(b, in_dtype), c=operand(c, d_dtype) if c is not None else None,
                   d_dtype=d_dtype, acc=acc, precision=precision, has_c=c is not None,
                   cc=_cc())


def _run(problem, a, b, c, alpha, beta, config=None):
    d = poisoned((problem.batch, problem.m, problem.n), dtypes.torch_dtype(problem.d_dtype),
                 device="cuda")
    config = config or BACKEND.default_config(problem)
    stream = torch.cuda.current_stream().cuda_stream
    BACKEND.run(problem, Operands(a, b, c, d, alpha, beta, stream), config)
    torch.cuda.synchronize()
    return d


def _check(problem, a, b, c, d, alpha, beta):
    ref = reference.reference_matmul(a, b, c, alpha, beta)
    result = reference.compare(problem, d, ref)
    assert result.ok, f"{problem.describe()}: {result.detail}"


@pytest.mark.parametrize("a_layout, b_layout", LAYOUTS)
@pytest.mark.parametrize("dtype, out, acc, precision, kmul", TYPES)
def test_accepted_types_and_layouts_on_ragged_shapes(dtype, out, acc, precision, kmul,
                                                     a_layout, b_layout):
    gen = torch.Generator().manual_seed(hash((dtype, out, a_layout, b_layout)) % 2**31)
    integer = dtypes.get(out).is_integer
    fp8 = dtypes.get(dtype).bits == 8 and not integer
    shapes = [(1, 77, 45, 33 * kmul), (3, 130, 257, 72 * kmul // max(1, kmul) * kmul)]
    ran = 0
    for batch, m, n, k in shapes:
        for alpha, beta in ((1, 0), (2, -1) if integer else (1.5, -0.5)):
            a = _matrix(dtype, batch, m, k, a_layout, gen, integer or fp8)
            b = _matrix(dtype, batch, k, n, b_layout, gen, integer or fp8)
            c = _matrix(out, batch, m, n, "row", gen, integer or fp8) if beta else None
            problem = _problem(a, b, c, out, acc, precision)
            if BACKEND.supports(problem) is not None:
                continue
            d = _run(problem, a, b, c, alpha, beta)
            _check(problem, a, b, c, d, alpha, beta)
            ran += 1
    if not ran:
        pytest.skip(f"the capability table rejects {dtype}->{out} {a_layout}/{b_layout} here")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_candidate_is_correct_on_one_shape(dtype):
    gen = torch.Generator().manual_seed(7)
    a = _matrix(dtype, 1, 200, 136, "row", gen, False)
    b = _matrix(dtype, 1, 136, 264, "row", gen, False)
    problem = _problem(a, b, None, dtype, "float32", None)
    configs = BACKEND.configs(problem)[:12]
    built = backend_module.prepare_many(problem, configs)
    assert built == configs
    for config in configs:
        d = _run(problem, a, b, None, 1.0, 0.0, config)
        _check(problem, a, b, None, d, 1.0, 0.0)


def test_broadcast_batch_operand():
    gen = torch.Generator().manual_seed(3)
    a = _matrix("float16", 1, 64, 128, "row", gen, False).expand(4, 64, 128)
    b = _matrix("float16", 4, 128, 96, "row", gen, False)
    problem = _problem(a, b, None, "float16", "float32", None)
    assert problem.a.batch_stride == 0
    d = _run(problem, a, b, None, 1.0, 0.0)
    _check(problem, a, b, None, d, 1.0, 0.0)


def test_fractional_alpha_is_refused_for_integer_kernels():
    gen = torch.Generator().manual_seed(5)
    a = _matrix("int8", 1, 64, 64, "row", gen, True)
    b = _matrix("int8", 1, 64, 64, "col", gen, True)
    problem = _problem(a, b, None, "int32", "int32", None)
    with pytest.raises(ValueError, match="alpha"):
        _run(problem, a, b, None, 0.5, 0)


def test_launch_is_on_the_callers_stream():
    gen = torch.Generator().manual_seed(11)
    a = _matrix("float16", 1, 512, 512, "row", gen, False)
    b = _matrix("float16", 1, 512, 512, "row", gen, False)
    problem = _problem(a, b, None, "float16", "float32", None)
    stream = torch.cuda.Stream()
    d = poisoned((1, 512, 512), torch.float16, device="cuda")
    config = BACKEND.default_config(problem)
    BACKEND.prepare(problem, config)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        BACKEND.run(problem, Operands(a, b, None, d, 1.0, 0.0, stream.cuda_stream), config)
    stream.synchronize()
    _check(problem, a, b, None, d, 1.0, 0.0)
