"""GPU tier of the CUTLASS backend: every (dtype, layout) the capability table accepts, on fresh
ragged shapes, against the float64 reference; integer and fp8 cases exact with small-integer
operands; outputs poisoned before every run so that an element the kernel skipped fails.

Every kernel the module needs is built first, all at once in parallel nvcc processes, so the
tests themselves only load from the cache.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass_library")

from multibackend import cutlass_build, cutlass_emit, dtypes, reference  # noqa: E402
from multibackend.backends import cutlass as backend_module  # noqa: E402
from multibackend.backends.base import Config, Operands  # noqa: E402
from multibackend.problem import Problem, make_operand, synthetic  # noqa: E402
from tests.helpers import poisoned, random_tensor  # noqa: E402

BACKEND = backend_module.create()
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
#: (dtype, output, accumulator, precision, multiple of M and N, multiple of K): the multiples
#: keep every leading dimension at the alignment the type's kernels need, while the sizes
#: stay ragged against every tile shape
TYPES = [
    ("float16", "float16", "float32", None, 8, 8),
    ("float16", "float32", "float32", None, 8, 8),
    ("float16", "float16", "float16", None, 8, 8),
    ("bfloat16", "bfloat16", "float32", None, 8, 8),
    ("bfloat16", "float32", "float32", None, 8, 8),
    ("float32", "float32", "float32", "tf32", 4, 4),
    ("float32", "float32", "float32", "tf32x3", 4, 4),
    ("float32", "float32", "float32", "ieee", 1, 1),
    ("float64", "float64", "float64", None, 1, 1),
    ("int8", "int32", "int32", None, 1, 16),
    ("uint8", "int32", "int32", None, 1, 16),
    ("float8_e4m3fn", "float32", "float32", None, 1, 16),
    ("float8_e5m2", "float32", "float32", None, 1, 16),
    ("float8_e4m3fn", "bfloat16", "float32", None, 1, 16),
]
#: fully ragged sizes for the types whose kernels take 1- or 2-element alignment
ODD_TYPES = [
    ("float16", "float16", "float32", None, 1, 1),
    ("bfloat16", "bfloat16", "float32", None, 2, 2),
    ("bfloat16", "bfloat16", "float32", None, 1, 1),
    ("bfloat16", "float32", "float32", None, 1, 1),
    ("float32", "float32", "float32", "tf32", 1, 1),
    ("float32", "float32", "float32", "tf32x3", 1, 1),
]
CANDIDATES_PER_DTYPE = 6
#: kernels beyond the first few also checked: the stream-K scheduler and 4-CTA clusters
EXTRA_KERNELS = ("128x256x64_2x1x1_cooperative_tma_streamk", "128x256x64_2x2x1_cooperative_tma",
                 "256x128x64_1x4x1_cooperative_tma")


def _cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def _shapes(mn: int, kk: int) -> list[tuple[int, int, int, int, bool]]:
    """(batch, M, N, K, with C) cases: one plain, one batched with C."""
    return [(1, 17 * mn, 33 * mn, 25 * kk, False), (3, 9 * mn, 5 * mn, 7 * kk, True)]


def _plan(types) -> list[tuple[tuple, tuple[str, str], Problem]]:
    """Every (type, layout, problem) the tests below run, as numbers alone."""
    found = []
    for t in types:
        dtype, out, acc, precision, mn, kk = t
        for layouts in LAYOUTS:
            for batch, m, n, k, with_c in _shapes(mn, kk):
                problem = synthetic(m, n, k, dtype, batch=batch, a_layout=layouts[0],
                                    b_layout=layouts[1], out_dtype=out, acc=acc,
                                    precision=precision, has_c=with_c, cc=_cc())
                found.append((t, layouts, problem))
    return found


def _candidate_problem(dtype: str) -> Problem:
    return synthetic(200, 264, 136, dtype, cc=_cc())


@pytest.fixture(scope="module", autouse=True)
def built_kernels():
    """Build every kernel this module runs, in parallel, before the first test."""
    jobs = {}
    for _, _, problem in _plan(TYPES) + _plan(ODD_TYPES):
        if BACKEND.supports(problem) is None:
            cand = backend_module.candidate_for(problem, BACKEND.default_config(problem))
            jobs[cutlass_emit.emit(cand), cand.arch] = cand.name
    for dtype in ("float16", "bfloat16"):
        problem = _candidate_problem(dtype)
        every = BACKEND.configs(problem)
        extra = [c for c in every if c.name in EXTRA_KERNELS]
        for config in every[:CANDIDATES_PER_DTYPE] + extra:
            cand = backend_module.candidate_for(problem, config)
            jobs[cutlass_emit.emit(cand), cand.arch] = cand.name
    results = cutlass_build.build_many([(s, a, n) for (s, a), n in jobs.items()])
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of {len(results)} kernels failed to build: {failed[0]}"


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


def _run_type(t, layouts):
    dtype, out, acc, precision, mn, kk = t
    a_layout, b_layout = layouts
    probe = synthetic(64, 64, 64, dtype, a_layout=a_layout, b_layout=b_layout, out_dtype=out,
                      acc=acc, precision=precision, cc=_cc())
    reason = BACKEND.supports(probe)
    if reason is not None:  # the table refuses only 8-bit operands that are not K-major
        assert reason.rule == "layout" and dtypes.get(dtype).bits == 8, reason
        assert layouts != ("row", "col")
        return
    gen = torch.Generator().manual_seed(hash((t, layouts)) % 2**31)
    exact_data = dtypes.get(out).is_integer or dtypes.get(dtype).bits == 8
    for batch, m, n, k, with_c in _shapes(mn, kk):
        alpha, beta = ((2, -1) if dtypes.get(out).is_integer else (1.5, -0.5)) if with_c \
            else (1, 0)
        a = _matrix(dtype, batch, m, k, a_layout, gen, exact_data)
        b = _matrix(dtype, batch, k, n, b_layout, gen, exact_data)
        c = _matrix(out, batch, m, n, "row", gen, exact_data) if with_c else None
        problem = _problem(a, b, c, out, acc, precision)
        assert BACKEND.supports(problem) is None, BACKEND.supports(problem)
        d = _run(problem, a, b, c, alpha, beta)
        _check(problem, a, b, c, d, alpha, beta)


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: "".join(s[0] for s in x))
@pytest.mark.parametrize("t", TYPES, ids=lambda t: f"{t[0]}-{t[1]}-acc{t[2]}-{t[3]}")
def test_types_and_layouts_on_ragged_shapes_or_refused_for_layout(t, layouts):
    _run_type(t, layouts)


@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda x: "".join(s[0] for s in x))
@pytest.mark.parametrize("t", ODD_TYPES, ids=lambda t: f"{t[0]}-{t[1]}-{t[3]}-align{t[4]}")
def test_odd_sizes_take_the_small_alignment_kernels(t, layouts):
    _run_type(t, layouts)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_tuning_candidate_is_correct(dtype):
    gen = torch.Generator().manual_seed(7)
    a = _matrix(dtype, 1, 200, 136, "row", gen, False)
    b = _matrix(dtype, 1, 136, 264, "row", gen, False)
    problem = _problem(a, b, None, dtype, "float32", None)
    every = BACKEND.configs(problem)
    configs = every[:CANDIDATES_PER_DTYPE]
    assert [c.name for c in configs] == \
        [c.name for c in BACKEND.configs(_candidate_problem(dtype))[:CANDIDATES_PER_DTYPE]]
    extra = [c for c in every if c.name in EXTRA_KERNELS]
    assert len(extra) == len(EXTRA_KERNELS)
    names = {c.name for c in configs}
    configs += [c for c in every if c.get("kernel") in names and c.name not in names]
    for config in extra:
        configs += [config, *BACKEND.variants(problem, config)]
    assert any(c.get("swizzle") == 8 for c in configs)
    assert {"m", "n"} <= {c.get("raster") for c in configs}
    jobs = [(problem, config) for config in configs]
    assert backend_module.prepare_many(jobs) == jobs
    for config in configs:
        d = _run(problem, a, b, None, 1.0, 0.0, config)
        _check(problem, a, b, None, d, 1.0, 0.0)


@pytest.mark.parametrize("decomposition", ["heuristic", "stream_k", "data_parallel"])
def test_stream_k_kernel_with_c_and_every_decomposition(decomposition):
    """The stream-K scheduler splits K across CTAs and reduces partial tiles in a workspace:
    check it with a long K, a source C and beta, under each decomposition mode."""
    gen = torch.Generator().manual_seed(13)
    a = _matrix("bfloat16", 1, 200, 1032, "row", gen, False)
    b = _matrix("bfloat16", 1, 1032, 264, "row", gen, False)
    c = _matrix("bfloat16", 1, 200, 264, "row", gen, False)
    problem = _problem(a, b, c, "bfloat16", "float32", None)
    kernel = next(x for x in BACKEND.configs(problem) if x.name == EXTRA_KERNELS[0])
    config = Config(f"{kernel.name}_{decomposition}", tuple(sorted(
        {**dict(kernel.params), "decomposition": decomposition}.items())))
    assert backend_module.prepare_many([(problem, kernel)]) == [(problem, kernel)]
    d = _run(problem, a, b, c, 1.5, -0.5, config)
    _check(problem, a, b, c, d, 1.5, -0.5)


def test_broadcast_batch_operand():
    gen = torch.Generator().manual_seed(3)
    a = _matrix("float16", 1, 136, 200, "row", gen, False).expand(3, 136, 200)
    b = _matrix("float16", 3, 200, 264, "row", gen, False)
    problem = _problem(a, b, None, "float16", "float32", None)
    assert problem.a.batch_stride == 0
    d = _run(problem, a, b, None, 1.0, 0.0)
    _check(problem, a, b, None, d, 1.0, 0.0)


def test_fractional_alpha_is_refused_for_integer_kernels():
    gen = torch.Generator().manual_seed(5)
    a = _matrix("int8", 1, 17, 400, "row", gen, True)
    b = _matrix("int8", 1, 400, 33, "col", gen, True)
    problem = _problem(a, b, None, "int32", "int32", None)
    with pytest.raises(ValueError, match="alpha"):
        _run(problem, a, b, None, 0.5, 0)


def test_launch_is_on_the_callers_stream():
    gen = torch.Generator().manual_seed(11)
    a = _matrix("float16", 1, 136, 200, "row", gen, False)
    b = _matrix("float16", 1, 200, 264, "row", gen, False)
    problem = _problem(a, b, None, "float16", "float32", None)
    config = BACKEND.default_config(problem)
    BACKEND.prepare(problem, config)
    d = poisoned((1, 136, 264), torch.float16, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        BACKEND.run(problem, Operands(a, b, None, d, 1.0, 0.0, stream.cuda_stream), config)
    stream.synchronize()
    _check(problem, a, b, None, d, 1.0, 0.0)
