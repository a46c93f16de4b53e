"""GPU tier of the CUTLASS backend: every (dtype, layout) the capability table accepts, on fresh
ragged shapes, against the float64 reference; integer and fp8 cases exact with small-integer
operands; outputs poisoned before every run so that an element the kernel skipped fails.

nvcc needs tens of seconds per kernel and builds dominate the tier's cold run, so each case
here needs a kernel that no other case builds: a kernel is fixed by its types, layouts,
alignment, tile, cluster and schedule, and runs every shape, batch and C of its case. How A and
B are read in each major order is the code of a kernel family, and a type is a template
argument of it: so every layout the table accepts runs in each family (3.x TMA in f16 and in
tf32, whose K-major-only reads take the transposed kernels; 3.x cp.async in tf32; 2.x in f16 at
1-element alignment), and every other type, output or accumulator variant runs in one layout, a
different one for each where they share a family. The 8-bit types take only A row-major and B
column-major: their other layouts check the refusal and build nothing. Not reached here: f16
and the 8-bit types at the alignments that take the 3.x cp.async kernels, and the
warp-specialized schedule. The kernels are built before the tests run, all at once, by
``tests/gpu/conftest.py`` (:func:`cutlass_jobs` names each test's kernels), so the tests only
load them.
"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.cutlass]

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass_library")

from multibackend.backends.cutlass import backend as backend_module
from multibackend.core import dtypes
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem, folded_batch, make_operand, synthetic
from multibackend.verify import reference
from tests.helpers import poisoned, random_tensor  # noqa: E402

BACKEND = backend_module.create()
RR, RC, CR, CC = ("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")
LAYOUTS = [RR, RC, CR, CC]
#: (dtype, output, accumulator, precision, multiple of M and N, multiple of K) and the layouts
#: run: the multiples keep every leading dimension at the alignment the type's kernels need,
#: while the sizes stay ragged against every tile shape
TYPES = [
    (("float16", "float16", "float32", None, 8, 8), LAYOUTS),
    (("float16", "float32", "float32", None, 8, 8), [RC]),
    (("float16", "float16", "float16", None, 8, 8), [CR]),
    (("bfloat16", "bfloat16", "float32", None, 8, 8), [RR]),
    (("bfloat16", "float32", "float32", None, 8, 8), [CC]),
    (("float32", "float32", "float32", "tf32", 4, 4), LAYOUTS),
    (("float32", "float32", "float32", "tf32x3", 4, 4), [RC]),
    (("float32", "float32", "float32", "ieee", 1, 1), [RR]),
    (("float64", "float64", "float64", None, 1, 1), [CC]),
    (("int8", "int32", "int32", None, 1, 16), LAYOUTS),
    (("uint8", "int32", "int32", None, 1, 16), LAYOUTS),
    (("float8_e4m3fn", "float32", "float32", None, 1, 16), LAYOUTS),
    (("float8_e5m2", "float32", "float32", None, 1, 16), LAYOUTS),
    (("float8_e4m3fn", "bfloat16", "float32", None, 1, 16), LAYOUTS),
]
#: fully ragged sizes, which take the other kernel families: f16 at 1-element alignment the
#: 2.x sm_75 kernels, bf16 at 2 elements the 3.x cp.async ones and at 1 element sm_75's
#: retyped to bf16, tf32 at 1 element 3.x cp.async, tf32x3 at 1 element its 2.x kernel's
#: 1-element instance
ODD_TYPES = [
    (("float16", "float16", "float32", None, 1, 1), LAYOUTS),
    (("bfloat16", "bfloat16", "float32", None, 2, 2), [CR]),
    (("bfloat16", "bfloat16", "float32", None, 1, 1), [RC]),
    (("float32", "float32", "float32", "tf32", 1, 1), LAYOUTS),
    (("float32", "float32", "float32", "tf32x3", 1, 1), [RR]),
]
#: tuning candidates run beside the default (the first of the list) with every CTA swizzle and
#: raster order: with the "autotune" shortlist's kernels (128x128, 192x128, 64x128 and 128x64
#: tiles, ping-pong, one- and two-CTA clusters in both directions, stream-K) they have each
#: tile shape, each cluster size and direction (1, 2 and 4 CTAs) and each tile scheduler
#: (persistent, stream-K) of the 3.x candidates. f16 and bf16 kernels differ only in their
#: element type, so each is run in one. The candidate problem is the autotune problem's size
#: (few tiles, a long K, so that stream-K is offered for it): 256x128 1x2x1 is a kernel of both.
CANDIDATE_KERNELS = {
    "float16": ("256x128x64_1x2x1_cooperative_tma", "128x256x64_2x2x1_cooperative_tma",
                "128x256x64_1x4x1_cooperative_tma"),
    "bfloat16": ("256x128x64_1x1x1_cooperative_tma_streamk",),
}
#: the stream-K kernel offered for _stream_k_problem (and the candidate problem): of the
#: stream-K kernels, the one whose tiles pad 200 x 264 least (3 tiles of 256 x 128)
STREAM_K_KERNEL = "256x128x64_1x1x1_cooperative_tma_streamk"
#: the tests that run STREAM_K_KERNEL (on _stream_k_problem's kernel) and no other
STREAM_K_TESTS = ("test_stream_k_kernel_with_c_and_every_decomposition",
                  "test_stream_k_workspace_is_kept_and_results_repeat_bit_for_bit",
                  "test_stream_k_on_a_broadcast_batch")


def _layout_id(layouts) -> str:
    return "".join(s[0] for s in layouts)


def _cases(types, type_id) -> list:
    return [pytest.param(t, layouts, id=f"{type_id(t)}-{_layout_id(layouts)}")
            for t, runs in types for layouts in runs]


def _cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def _shapes(mn: int, kk: int) -> list[tuple[int, int, int, int, bool]]:
    """(batch, M, N, K, with C) cases: one plain, one batched with C."""
    return [(1, 17 * mn, 33 * mn, 25 * kk, False), (3, 9 * mn, 5 * mn, 7 * kk, True)]


def _problems(t, layouts) -> list[Problem]:
    """The problems one (type, layouts) case runs, as numbers alone (none where refused)."""
    dtype, out, acc, precision, mn, kk = t
    found = []
    for batch, m, n, k, with_c in _shapes(mn, kk):
        problem = synthetic(m, n, k, dtype, batch=batch, a_layout=layouts[0],
                            b_layout=layouts[1], out_dtype=out, acc=acc, precision=precision,
                            has_c=with_c, cc=_cc())
        if BACKEND.supports(problem) is None:
            found.append(problem)
    return found


def _candidate_problem(dtype: str) -> Problem:
    return synthetic(200, 264, 1032, dtype, cc=_cc())


def _checked_candidates(dtype: str, every: list[Config]) -> list[Config]:
    """The kernels of ``every`` (``dtype``'s candidate list) run in ``dtype``: the default, then
    CANDIDATE_KERNELS."""
    return every[:1] + [c for c in every if c.name in CANDIDATE_KERNELS[dtype]]


def _stream_k_problem() -> Problem:
    return synthetic(200, 264, 1032, "bfloat16", has_c=True, cc=_cc())


def _autotune_problem() -> Problem:
    return synthetic(200, 264, 1032, "float16", has_c=True, cc=_cc())


def _broadcast_problem() -> Problem:
    """A (136 x 200) broadcast over a batch of 3 (batch stride 0) times B (3 x 200 x 264)."""
    a = make_operand("float16", 136, 200, (200, 1), 0, 0)
    b = make_operand("float16", 200, 264, (264, 1), 200 * 264, 0)
    return Problem(op="matmul", m=136, n=264, k=200, batch=3, a=a, b=b, c=None,
                   d_dtype="float16", acc="float32", precision=None, has_c=False, cc=_cc())


def _broadcast_b_problem() -> Problem:
    """A (3 x 136 x 200, entries stacked) times B (200 x 264) broadcast over the batch, with C
    (3 x 136 x 264, stacked): one product of 408 rows."""
    a = make_operand("float16", 136, 200, (200, 1), 136 * 200, 0)
    b = make_operand("float16", 200, 264, (264, 1), 0, 0)
    c = make_operand("float16", 136, 264, (264, 1), 136 * 264, 0)
    return Problem(op="matmul", m=136, n=264, k=200, batch=3, a=a, b=b, c=c,
                   d_dtype="float16", acc="float32", precision=None, has_c=True, cc=_cc())


#: the problem each test with one fixed problem runs (its default kernel)
FIXED = {
    "test_broadcast_batch_operand": _broadcast_problem,
    "test_broadcast_b_over_stacked_rows_runs_as_one_launch": _broadcast_b_problem,
    "test_fractional_alpha_is_refused_for_integer_kernels":
        lambda: synthetic(17, 33, 400, "int8", b_layout="col", cc=_cc()),
    "test_launch_is_on_the_callers_stream": lambda: synthetic(136, 264, 200, "float16", cc=_cc()),
}


def cutlass_jobs(item) -> list[tuple[Problem, Config]]:
    """The (problem, config) of every kernel the test ``item`` runs, by numbers alone: the GPU
    tier's conftest builds those of all selected tests at once before they run."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    name = item.originalname
    if "t" in params:
        return [(p, BACKEND.default_config(p)) for p in _problems(params["t"], params["layouts"])]
    if name == "test_every_tuning_candidate_is_correct":
        problem = _candidate_problem(params["dtype"])
        return [(problem, c) for c in _checked_candidates(params["dtype"],
                                                          BACKEND.configs(problem))]
    if name == "test_autotune_runs_a_kernel_of_its_shortlist_and_keeps_it":
        return backend_module.kernel_jobs(_autotune_problem(), backend_module.AUTOTUNE)
    if name in STREAM_K_TESTS:
        problem = _stream_k_problem()
        return [(problem, c) for c in BACKEND.configs(problem) if c.name == STREAM_K_KERNEL]
    if name in FIXED:
        problem = FIXED[name]()
        return [(problem, BACKEND.default_config(problem))]
    return []


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


@pytest.mark.parametrize("t,layouts",
                         _cases(TYPES, lambda t: f"{t[0]}-{t[1]}-acc{t[2]}-{t[3]}"))
def test_types_and_layouts_on_ragged_shapes_or_refused_for_layout(t, layouts):
    _run_type(t, layouts)


@pytest.mark.parametrize("t,layouts",
                         _cases(ODD_TYPES, lambda t: f"{t[0]}-{t[1]}-{t[3]}-align{t[4]}"))
def test_odd_sizes_take_the_small_alignment_kernels(t, layouts):
    _run_type(t, layouts)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_tuning_candidate_is_correct(dtype):
    """The default kernel and the type's CANDIDATE_KERNELS, each with every CTA swizzle and
    raster order of its tile scheduler (runtime arguments of the same kernel)."""
    gen = torch.Generator().manual_seed(7)
    a = _matrix(dtype, 1, 200, 1032, "row", gen, False)
    b = _matrix(dtype, 1, 1032, 264, "row", gen, False)
    problem = _problem(a, b, None, dtype, "float32", None)
    every = BACKEND.configs(problem)
    assert every[0].name == BACKEND.configs(_candidate_problem(dtype))[0].name
    kernels = _checked_candidates(dtype, every)
    assert {c.name for c in kernels[1:]} == set(CANDIDATE_KERNELS[dtype])
    configs = [v for kernel in kernels for v in (kernel, *BACKEND.variants(problem, kernel))]
    assert any(c.get("swizzle") == 8 for c in configs)
    assert {"m", "n"} <= {c.get("raster") for c in configs}
    jobs = [(problem, config) for config in configs]
    assert backend_module.prepare_many(jobs) == jobs
    for config in configs:
        d = _run(problem, a, b, None, 1.0, 0.0, config)
        _check(problem, a, b, None, d, 1.0, 0.0)


def _stream_k_operands(seed: int):
    """A, B and C of _stream_k_problem's sizes, on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    a = _matrix("bfloat16", 1, 200, 1032, "row", gen, False)
    b = _matrix("bfloat16", 1, 1032, 264, "row", gen, False)
    c = _matrix("bfloat16", 1, 200, 264, "row", gen, False)
    return a, b, c


@pytest.mark.parametrize("decomposition, splits", [
    ("heuristic", 1), ("stream_k", 1), ("data_parallel", 1), ("split_k", 2), ("split_k", 3),
    ("split_k", 4)])
def test_stream_k_kernel_with_c_and_every_decomposition(decomposition, splits):
    """The stream-K scheduler splits K across CTAs and reduces partial tiles in a workspace:
    check it with a long K (17 K tiles: uneven splits), a source C and beta, under each
    decomposition mode and split count."""
    a, b, c = _stream_k_operands(13)
    problem = _problem(a, b, c, "bfloat16", "float32", None)
    kernel = next(x for x in BACKEND.configs(problem) if x.name == STREAM_K_KERNEL)
    config = Config(f"{kernel.name}_{decomposition}{splits}", tuple(sorted(
        {**dict(kernel.params), "decomposition": decomposition, "splits": splits}.items())))
    assert backend_module.prepare_many([(problem, kernel)]) == [(problem, kernel)]
    d = _run(problem, a, b, c, 1.5, -0.5, config)
    _check(problem, a, b, c, d, 1.5, -0.5)


def test_stream_k_workspace_is_kept_and_results_repeat_bit_for_bit():
    """Each offered stream-K config: later calls on one stream allocate nothing; the result
    is the same bit for bit on every call, on a second stream (its own workspace) and in a
    CUDA graph's replays (the barrier memset captured with the kernel)."""
    a, b, c = _stream_k_operands(17)
    problem = _problem(a, b, c, "bfloat16", "float32", None)
    offered = backend_module.stream_k_configs(problem)
    assert [x.name for x in offered] == [STREAM_K_KERNEL,
                                         "256x128x64_1x1x1_cooperative_tma_splitk4",
                                         "256x128x64_1x1x1_cooperative_tma_splitk2"]
    for config in offered:
        first = _run(problem, a, b, c, 1.5, -0.5, config)
        _check(problem, a, b, c, first, 1.5, -0.5)
        stream = torch.cuda.current_stream()
        d = torch.empty_like(first)
        before = torch.cuda.memory_allocated()
        for _ in range(3):
            BACKEND.run(problem, Operands(a, b, c, d, 1.5, -0.5, stream.cuda_stream), config)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before, config.name
        assert torch.equal(d, first), config.name
        side = torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            d_side = torch.empty_like(first)
            BACKEND.run(problem, Operands(a, b, c, d_side, 1.5, -0.5, side.cuda_stream),
                        config)
        torch.cuda.synchronize()
        assert torch.equal(d_side, first), config.name
        d_graph = torch.empty_like(first)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            BACKEND.run(problem, Operands(a, b, c, d_graph, 1.5, -0.5,
                                          torch.cuda.current_stream().cuda_stream), config)
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(d_graph, first), config.name


def test_autotune_runs_a_kernel_of_its_shortlist_and_keeps_it():
    """Every config of the "autotune" shortlist (persistent 128x256, 256x128, 128x128 and
    192x128 tiles, the ping-pong kernel, 64x128 and 128x64 tiles in two-CTA clusters, two
    stream-K kernels forced into stream-K and split-K) on ragged sizes with C and beta; then
    the config itself: it times them on the call's operands, runs the fastest, and a second
    call runs the same one, bit for bit."""
    gen = torch.Generator().manual_seed(23)
    a = _matrix("float16", 1, 200, 1032, "row", gen, False)
    b = _matrix("float16", 1, 1032, 264, "row", gen, False)
    c = _matrix("float16", 1, 200, 264, "row", gen, False)
    problem = _problem(a, b, c, "float16", "float32", None)
    shortlist = backend_module.autotune_shortlist(problem)
    assert shortlist == backend_module.autotune_shortlist(_autotune_problem())  # prebuilt
    assert len(shortlist) == 11 and any(x.get("splits") for x in shortlist)
    assert set(backend_module.AUTOTUNE_FEW_TILES) <= {x.name for x in shortlist}
    for config in shortlist:
        d = _run(problem, a, b, c, 1.5, -0.5, config)
        _check(problem, a, b, c, d, 1.5, -0.5)
    first = _run(problem, a, b, c, 1.5, -0.5, backend_module.AUTOTUNE)
    _check(problem, a, b, c, first, 1.5, -0.5)
    picked = BACKEND.autotuned(problem)
    assert picked in shortlist
    again = _run(problem, a, b, c, 1.5, -0.5, backend_module.AUTOTUNE)
    assert BACKEND.autotuned(problem) is picked
    assert torch.equal(again, first)


def test_stream_k_on_a_broadcast_batch():
    """A broadcast over the batch runs one launch per entry, one after another on the
    stream, each with the same workspace (200 rows: STREAM_K_KERNEL's tiles pad them least,
    as in _stream_k_problem)."""
    gen = torch.Generator().manual_seed(19)
    a = _matrix("bfloat16", 1, 200, 1032, "row", gen, False).expand(3, 200, 1032)
    b = _matrix("bfloat16", 3, 1032, 264, "row", gen, False)
    problem = _problem(a, b, None, "bfloat16", "float32", None)
    offered = backend_module.stream_k_configs(problem)
    assert offered and offered[0].name == STREAM_K_KERNEL
    for config in offered:
        d = _run(problem, a, b, None, 1.0, 0.0, config)
        _check(problem, a, b, None, d, 1.0, 0.0)


def test_rows_on_the_grid_with_a_ragged_k_run_exactly():
    """A is a view whose rows start 4096 elements apart (every one on the 16-byte grid) but
    hold K = 4095: CUTLASS's kernels check the contiguous extent too, so the call runs a
    kernel of smaller alignment (the TMA kernel refused it at run time), and no staged config
    is offered for it, nor for a contiguous K = 4095 whose D is on the grid."""
    import multibackend as mb
    from multibackend.gpu import staging
    from multibackend.io.request import matmul_call

    gen = torch.Generator().manual_seed(11)
    wide = random_tensor((200, 4096), torch.float16, "cuda", generator=gen, small_int=True)
    a = wide[:, :4095]
    b = random_tensor((4095, 264), torch.float16, "cuda", generator=gen, small_int=True)
    problem = matmul_call(a, b, None).problem
    assert problem.a.ld == 4096 and problem.k == 4095
    assert backend_module.candidate_for(problem, BACKEND.default_config(problem)).family \
        != "3x_tma"
    d = mb.matmul(a, b, backend="cutlass")
    assert torch.equal(d.double(), (a.double() @ b.double()).half().double())
    contiguous = synthetic(7, 11008, 4095, "float16", cc=_cc())
    assert not [c for c in BACKEND.configs(contiguous) if staging.is_staged(c)]


def test_broadcast_batch_operand():
    gen = torch.Generator().manual_seed(3)
    a = _matrix("float16", 1, 136, 200, "row", gen, False).expand(3, 136, 200)
    b = _matrix("float16", 3, 200, 264, "row", gen, False)
    problem = _problem(a, b, None, "float16", "float32", None)
    assert problem.a.batch_stride == 0
    d = _run(problem, a, b, None, 1.0, 0.0)
    _check(problem, a, b, None, d, 1.0, 0.0)


def test_broadcast_b_over_stacked_rows_runs_as_one_launch():
    """B broadcast over a batch of stacked A entries (and C): one launch of a product of 408
    rows, tiles straddling the entries (136 rows each), against float64."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(23)
    a = _matrix("float16", 3, 136, 200, "row", gen, False)
    b = _matrix("float16", 1, 200, 264, "row", gen, False).expand(3, 200, 264)
    c = _matrix("float16", 3, 136, 264, "row", gen, False)
    problem = _problem(a, b, c, "float16", "float32", None)
    assert problem.b.batch_stride == 0 and folded_batch(problem) is not None
    _run(problem, a, b, c, 0.5, -1.0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        d = _run(problem, a, b, c, 0.5, -1.0)
    launches = [e.name for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and "cutlass" in e.name]
    assert len(launches) == 1, launches
    _check(problem, a, b, c, d, 0.5, -1.0)


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
