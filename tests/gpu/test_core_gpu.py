"""GPU tier for the front end, the cuBLAS baseline and the Triton backend: every dtype and
layout the Triton capability table accepts, on fresh random ragged shapes, against float64,
with outputs poisoned before each run."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.io.request import matmul_call
from multibackend.verify import reference
from multibackend.verify.crosscheck import crosscheck_call, poison

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (7, 17, 33), (16, 16, 16), (17, 31, 129), (127, 129, 65),
          (129, 127, 1000), (1000, 333, 777), (4097, 64, 40)]
DTYPES = [("float16", {}), ("bfloat16", {}), ("float32", {"precision": "ieee"}),
          ("float32", {"precision": "tf32"}), ("float32", {"precision": "tf32x3"}),
          ("float64", {}), ("int8", {}), ("float8_e4m3fn", {}), ("float8_e5m2", {})]


def _rand(shape, dtype, gen, layout="row"):
    from multibackend.core import dtypes

    tdtype = dtypes.torch_dtype(dtype)
    if layout == "col":
        shape = shape[:-2] + (shape[-1], shape[-2])
    if dtypes.get(dtype).is_integer:
        t = torch.randint(-8, 8, shape, generator=gen, dtype=torch.int8)
    else:
        t = (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).to(tdtype)
    t = t.cuda()
    return t.transpose(-1, -2) if layout == "col" else t


def _check(call, backend="triton", config=None):
    from multibackend.choose.dispatch import decide
    from multibackend.run.execute import execute

    poison(call.operands.d)
    execute(call, decide(call.problem, backend, config))
    ref = reference.reference_matmul(call.operands.a, call.operands.b, call.operands.c,
                                     call.operands.alpha, call.operands.beta)
    cmp = reference.compare(call.problem, call.operands.d, ref)
    assert cmp.ok, f"{call.problem.describe()}: {cmp.detail}"
    return cmp


@pytest.mark.parametrize("dtype,kw", DTYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("a_layout", ["row", "col"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_triton_every_dtype_and_layout(dtype, kw, a_layout, b_layout):
    gen = torch.Generator().manual_seed(hash((dtype, a_layout, b_layout)) % 2**31)
    for m, n, k in SHAPES:
        a = _rand((m, k), dtype, gen, a_layout)
        b = _rand((k, n), dtype, gen, b_layout)
        call = matmul_call(a, b, **kw)
        _check(call, "triton", _first_fixed_config(call))


def _first_fixed_config(call):
    from multibackend.choose.registry import REGISTRY

    return [c for c in REGISTRY.get("triton").configs(call.problem) if c.name != "autotune"][0]


@pytest.mark.parametrize("config_index", range(7))
def test_triton_every_tile_f16(config_index):
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator().manual_seed(config_index)
    a = _rand((1000, 777), "float16", gen)
    b = _rand((777, 1031), "float16", gen)
    call = matmul_call(a, b)
    configs = [c for c in REGISTRY.get("triton").configs(call.problem) if c.name != "autotune"]
    _check(call, "triton", configs[config_index])


@pytest.mark.parametrize("b_layout", ["row", "col"])
def test_triton_tma_tiles_relaunched_with_new_operands_are_exact(b_layout):
    """Every TMA tile run three times on fresh small-integer operands (new descriptors each
    call through the kept launcher), with and without alpha, beta and C, D on and off the
    16-byte grid (rows of 264 halves: whole 16 bytes that Triton's specialization does not
    show, stored 16 bytes at a time with C): exact against float64."""
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator(device="cuda").manual_seed(7)

    def ints(shape):
        return torch.randint(-2, 3, shape, generator=gen, device="cuda").to(torch.float16)

    ran = set()
    for m, n, k in ((300, 264, 136), (272, 258, 200)):  # D rows of 264 and 258 halves
        for rep in range(3):
            a = ints((m, k))
            b = ints((n, k)).T if b_layout == "col" else ints((k, n))
            c = ints((m, n)) if rep == 1 else None
            alpha, beta = (2.0, -1.0) if rep == 1 else (1.0, None)
            call = matmul_call(a, b, c, alpha=alpha, beta=beta)
            tiles = [t for t in REGISTRY.get("triton").configs(call.problem)
                     if t.get("kind") == "tma"]
            assert tiles, call.problem.describe()
            want = alpha * (a.double() @ b.double()) + (-1.0 * c.double() if rep == 1 else 0)
            for tile in tiles:
                d = mb.matmul(a, b, c, alpha=alpha, beta=beta, backend="triton", config=tile)
                assert torch.equal(d.double(), want), (m, n, k, rep, tile.name)
                ran.add(tile.name)
    assert len(ran) >= 3, ran


def test_triton_autotune_and_epilogue_batched():
    gen = torch.Generator().manual_seed(1)
    a = _rand((3, 200, 136), "float16", gen)
    b = _rand((136, 72), "float16", gen)  # broadcast over the batch
    c = _rand((3, 200, 72), "float16", gen)
    call = matmul_call(a, b, c, alpha=0.5, beta=-2.0)
    _check(call, "triton")


REPEATED_SHAPE = (96, 136, 72)


@pytest.mark.parametrize("backend", ["triton", "cublas", "raw_wmma",
                                     pytest.param("cutlass", marks=pytest.mark.cutlass)])
def test_repeated_calls_through_plans_and_kept_kernels(backend):
    """Calls after the first reuse the remembered plan and (Triton) the kept compiled kernel:
    new data, a C operand, a D that is off the 16-byte grid, and another stream each give the
    reference's answer, on outputs poisoned before every call."""
    from multibackend.choose.registry import REGISTRY

    if REGISTRY.availability(backend) is not None:
        pytest.skip(f"{backend}: {REGISTRY.availability(backend).message}")
    gen = torch.Generator().manual_seed(11)
    m, n, k = REPEATED_SHAPE
    storage = torch.empty((m * n + 8,), dtype=torch.float16, device="cuda")
    outs = [storage[:m * n].view(m, n), storage[8:].view(m, n), storage[1:1 + m * n].view(m, n)]
    stream = torch.cuda.Stream()
    for i in range(6):
        a, b = _rand((m, k), "float16", gen), _rand((k, n), "float16", gen)
        c = _rand((m, n), "float16", gen) if i % 2 else None
        out = outs[i % 3]
        poison(out)
        expected = reference.reference_matmul(a, b, c, 1.5, 0.5 if c is not None else 0)
        stream.wait_stream(torch.cuda.current_stream())  # operands and poison are written
        with torch.cuda.stream(stream if i >= 3 else torch.cuda.current_stream()):
            try:
                d = mb.matmul(a, b, c, alpha=1.5, beta=0.5 if c is not None else None, out=out,
                              backend=backend)
            except (mb.UnsupportedProblem, mb.InvalidArgument) as exc:
                # only the D off the 16-byte grid may be refused, and never by Triton or
                # CUTLASS (whose kernels for it store D element by element)
                assert i % 3 == 2 and backend not in ("triton", "cutlass"), str(exc)
                continue
        torch.cuda.current_stream().wait_stream(stream)
        problem = matmul_call(a, b, c, alpha=1.5, out=out).problem
        cmp = reference.compare(problem, d, expected)
        assert cmp.ok, f"call {i} ({backend}): {cmp.detail}"


def cutlass_jobs(item):
    """The (problem, config) of the CUTLASS kernels a test runs, by numbers alone (the GPU
    tier's conftest builds them before the tests start): the repeated calls' default kernel,
    without and with C, into a D on the 16-byte grid and into one 2 bytes past it."""
    if item.originalname != "test_repeated_calls_through_plans_and_kept_kernels":
        return []
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic

    backend = REGISTRY.get("cutlass")
    cc = torch.cuda.get_device_capability()
    problems = [synthetic(*REPEATED_SHAPE, "float16", has_c=c, cc=cc).with_(d_align=align)
                for c in (False, True) for align in (16, 2)]
    return [(p, backend.default_config(p)) for p in problems if backend.supports(p) is None]


def test_int8_epilogue_integer_scalars_exact():
    gen = torch.Generator().manual_seed(2)
    a = _rand((65, 96), "int8", gen)
    b = _rand((96, 40), "int8", gen)
    c = torch.randint(-100, 100, (65, 40), generator=gen, dtype=torch.int32).cuda()
    cmp = _check(matmul_call(a, b, c, alpha=3, beta=-2), "triton")
    assert cmp.exact


def test_cublas_baseline_matches_reference():
    gen = torch.Generator().manual_seed(3)
    for dtype, kw in DTYPES[:4] + [("float64", {}), ("int8", {})]:
        a, b = _rand((256, 128), dtype, gen), _rand((128, 64), dtype, gen)
        report = crosscheck_call(matmul_call(a, b, **kw), ("cublas",), time_it=False)
        assert report.ok, str(report)


def test_result_kinds_and_streams():
    cupy = pytest.importorskip("cupy")
    gen = torch.Generator().manual_seed(4)
    a, b = _rand((70, 50), "float16", gen), _rand((50, 30), "float16", gen)
    expected = (a.double() @ b.double())
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        d = mb.matmul(cupy.from_dlpack(a), cupy.from_dlpack(b), backend="triton")
    stream.synchronize()
    assert isinstance(d, cupy.ndarray)
    assert torch.allclose(torch.from_dlpack(d).double(), expected, rtol=1e-2, atol=1e-2)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        d = mb.matmul(a, b, backend="triton")
    s.synchronize()
    assert isinstance(d, torch.Tensor) and torch.allclose(d.double(), expected, rtol=1e-2,
                                                          atol=1e-2)
    d = mb.matmul(a.cpu().numpy(), b.cpu().numpy())
    assert type(d).__module__ == "numpy"


def test_k_zero_gives_beta_c():
    a = torch.empty((5, 0), dtype=torch.float16, device="cuda")
    b = torch.empty((0, 7), dtype=torch.float16, device="cuda")
    c = torch.ones((5, 7), dtype=torch.float16, device="cuda")
    d = mb.matmul(a, b, c, beta=3.0)
    assert torch.equal(d, torch.full_like(c, 3.0))


def test_nan_inf_propagate():
    a = torch.ones((32, 32), dtype=torch.float16, device="cuda")
    b = torch.ones((32, 32), dtype=torch.float16, device="cuda")
    a[3, 5] = float("nan")
    a[7, 0] = float("inf")
    d = mb.matmul(a, b, backend="triton")
    assert torch.isnan(d[3]).all() and torch.isinf(d[7]).all()
    assert torch.isfinite(d[0]).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("n", [1, 1000, 4097, (1 << 22) + 5])
def test_triton_dot(dtype, n):
    gen = torch.Generator().manual_seed(n)
    x, y = _rand((n,), dtype, gen), _rand((n,), dtype, gen)
    from multibackend.io.request import dot_call

    call = dot_call(x, y)
    poison(call.operands.d)
    from multibackend.choose.dispatch import decide
    from multibackend.run.execute import execute

    execute(call, decide(call.problem, "triton"))
    cmp = reference.compare(call.problem, call.operands.d, reference.reference_dot(x, y))
    assert cmp.ok, cmp.detail


def test_cublas_fp8_applies_alpha_to_the_float32_sums_and_rounds_once():
    """alpha goes to cuBLASLt as A's scale: D = round(alpha * sums), within half a bfloat16
    unit of the exact value, on the first call and on repeated ones.
    Rounded first and scaled after, D would be off by up to a whole unit: with these sums
    (integers past 256, which bfloat16 rounds) some would be."""
    gen = torch.Generator(device="cuda").manual_seed(9)
    a = torch.randint(-7, 8, (64, 512), generator=gen, device="cuda").float()
    b = torch.randint(-7, 8, (96, 512), generator=gen, device="cuda").float()
    a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).T  # exact in e4m3
    exact = (a.double() @ b.double()) * (1 / 3)
    magnitude = exact.abs().clamp_min(2.0 ** -126)
    half_unit = torch.exp2(torch.floor(torch.log2(magnitude)) - 8)  # bfloat16: 8 bits
    for _ in range(4):
        d = mb.matmul(a, b, alpha=1 / 3, out_dtype="bfloat16", backend="cublas")
        excess = (d.double() - exact).abs() - half_unit * (1 + 2 ** -10)
        assert excess.max().item() <= 0, f"{int((excess > 0).sum())} entries rounded twice"
