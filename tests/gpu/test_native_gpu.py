"""GPU tier for native plans: a repeated call of raw WMMA, Triton or CUTLASS is launched by the
compiled front (multibackend/native.py) from its third call on, gives bit for bit what the
Python path's launch of the same kernel gives, runs on torch's current stream, is captured in
a CUDA graph, and leaves autograd and every call it does not cover to the Python path; so is
a repeated call naming a config, one writing an ``out`` laid out as D would be (cuBLAS's
too), and a batch over a broadcast B run as one product. Each
kind of Triton TMA launch (split-K unsplit, split, two column blocks; persistent) is
described for the front and checked the same way."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.choose.registry import REGISTRY
from multibackend.io.request import matmul_call
from multibackend.run import fastcall, plans
from multibackend.verify import reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(fastcall.compiler() is None, reason="no C++ compiler")]

BACKENDS = ["raw_wmma", "triton", "cutlass"]


def _rand(shape, dtype=torch.float16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(dtype)


def _front():
    plans.front()
    module = plans._COMPILED[0]
    assert module is not None, fastcall.status()
    return module


def _available(name):
    reason = REGISTRY.get(name).available() if name in REGISTRY.names else "not registered"
    if reason is not None:
        pytest.skip(f"{name}: {reason}")


def _handed_over(backend, m, n, k, seed):
    """(the front, A, B, D) after the two calls that plan matmul(A, B, backend=backend) and
    hand its launch to the front."""
    _available(backend)
    module = _front()
    a, b = _rand((m, k), seed=seed), _rand((k, n), seed=seed + 1)
    for _ in range(2):
        d = mb.matmul(a, b, backend=backend)
    return module, a, b, d


def _check(a, b, d):
    call = matmul_call(a, b, None)
    ref = reference.reference_matmul(call.operands.a, call.operands.b, None, 1.0, 0.0)
    cmp = reference.compare(call.problem, d, ref)
    assert cmp.ok, cmp.detail


def _late_on_a_side_stream(source, call):
    """``call(late)`` on a new side stream, where ``late`` holds -source until that stream,
    after a delay, copies source into it: a launch on any other stream would read -source."""
    late = -source
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(5_000_000)
        late.copy_(source)
        result = call(late)
    torch.cuda.current_stream().wait_stream(side)
    return result


def _launched_by_the_front(backend, a, b, seed):
    """Three calls of matmul(a, b, backend=backend): the third launched by the front, of
    torch.matmul's shape, with the first two's bits; then operands of the same layout with
    other values (pointers written per call), launched by the front as the Python path's
    launch gives them, both against float64."""
    module = _front()
    first = mb.matmul(a, b, backend=backend)  # plans
    second = mb.matmul(a, b, backend=backend)  # the Python path binds, and hands over
    served = module.stats()[2]
    third = mb.matmul(a, b, backend=backend)
    assert module.stats()[2] == served + 1, f"{backend} was not launched by the front"
    assert third.shape == a.shape[:-1] + b.shape[-1:] and third.dtype == torch.float16
    assert torch.equal(first, second) and torch.equal(second, third)
    _check(a, b, third)
    other = _rand(tuple(a.shape), seed=seed)
    served = module.stats()[2]
    by_front = mb.matmul(other, b, backend=backend)
    assert module.stats()[2] == served + 1
    by_python = mb.matmul(other, b, backend=backend, alpha=1.0)  # a keyword the front leaves
    assert module.stats()[2] == served + 1
    assert torch.equal(by_front, by_python)
    _check(other, b, by_front)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(96, 80, 256), (67, 40, 136)])
def test_a_repeated_call_is_launched_by_the_front(backend, shape):
    _available(backend)
    m, n, k = shape
    _launched_by_the_front(backend, _rand((m, k), seed=m), _rand((k, n), seed=n), seed=m + 1)


@pytest.mark.parametrize("backend", ["cublas", *BACKENDS])
def test_a_repeated_call_with_out_is_launched_by_the_front(backend):
    """matmul(A, B, out=D), D as the call would allocate it: the front writes D (from the
    third call; cuBLAS's from the second) and answers D, with the Python path's bits; an out
    sharing A's memory still gets the Python path's error, D of another layout its launch."""
    _available(backend)
    module = _front()
    m, n, k = 96, 80, 256
    a, b = _rand((m, k), seed=31), _rand((k, n), seed=32)
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    for _ in range(2):
        assert mb.matmul(a, b, backend=backend, out=out) is out
    expected = out.clone()
    _check(a, b, expected)
    out.fill_(float("nan"))
    served = module.stats()[2]
    assert mb.matmul(a, b, backend=backend, out=out) is out
    assert module.stats()[2] == served + 1, f"{backend} with out was not served by the front"
    assert torch.equal(out, expected)
    room = _rand((m * k + m * n,), seed=33)
    inside = room[:m * k].view(m, k)  # A's layout and alignment, D over its last 8 rows
    over = room[(m - 8) * k:(m - 8) * k + m * n].view(m, n)
    with pytest.raises(mb.InvalidArgument, match="out shares memory with A"):
        mb.matmul(inside, b, backend=backend, out=over)
@pytest.mark.parametrize("backend", ["cublas", *BACKENDS])
def test_a_repeated_call_on_cupy_arrays_with_out_is_launched_by_the_front(backend):
    """The same for CuPy arrays: from the third call the front writes the caller's own out
    (cuBLAS's by cublasGemmEx) and answers it."""
    _available(backend)
    cupy = pytest.importorskip("cupy")
    module = _front()
    a = cupy.from_dlpack(_rand((96, 256), seed=41))
    b = cupy.from_dlpack(_rand((256, 80), seed=42))
    out = cupy.full((96, 80), float("nan"), dtype=cupy.float16)
    for _ in range(2):
        assert mb.matmul(a, b, backend=backend, out=out) is out
    expected = out.copy()
    _check(torch.from_dlpack(a), torch.from_dlpack(b), torch.from_dlpack(expected))
    out.fill(float("nan"))
    served = module.stats()[2]
    assert mb.matmul(a, b, backend=backend, out=out) is out
    assert module.stats()[2] == served + 1, f"{backend} with a CuPy out was not served"
    assert bool((out == expected).all())


@pytest.mark.parametrize("backend", ["triton", "cutlass"])
def test_a_repeated_batch_over_a_broadcast_b_is_launched_by_the_front(backend):
    """A batch whose A stacks its entries over a 2-D B runs as one product of every entry's
    rows, and goes to the front like a product of two matrices, D of the batch's sizes."""
    _available(backend)
    _launched_by_the_front(backend, _rand((3, 67, 136), seed=21), _rand((136, 80), seed=22),
                           seed=23)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_launch_by_the_front_runs_on_torchs_current_stream_and_in_a_graph(backend):
    module, a, b, expected = _handed_over(backend, 128, 192, 256, seed=5)
    served = module.stats()[2]
    on_side = _late_on_a_side_stream(a, lambda late: mb.matmul(late, b, backend=backend))
    assert module.stats()[2] == served + 1
    assert torch.equal(on_side, expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(a, b, backend=backend)
    a.copy_(_rand((128, 256), seed=17))
    graph.replay()
    torch.cuda.synchronize()
    _check(a, b, captured)


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_is_left_to_the_python_path(backend):
    module, a, b, _ = _handed_over(backend, 64, 64, 128, seed=8)
    leaf = a.clone().requires_grad_()
    served = module.stats()[2]
    d = mb.matmul(leaf, b, backend=backend)
    d.float().sum().backward()
    assert leaf.grad is not None and module.stats()[2] == served


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_repeated_call_on_cupy_arrays_is_launched_by_the_front(backend):
    cupy = pytest.importorskip("cupy")
    _available(backend)
    module = _front()
    a = cupy.asarray(_rand((96, 256), seed=11))
    b = cupy.asarray(_rand((256, 80), seed=12))
    first = mb.matmul(a, b, backend=backend)
    mb.matmul(a, b, backend=backend)
    served = module.stats()[2]
    late = -a
    side = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with side:
        late[...] = a
        third = mb.matmul(late, b, backend=backend)  # wrong stream: it could read -A
    side.synchronize()
    assert module.stats()[2] == served + 1, f"{backend} on CuPy arrays was not served"
    assert isinstance(third, cupy.ndarray) and third.shape == (96, 80)
    assert bool((third == first).all())


def test_a_repeated_tma_raw_wmma_call_is_launched_by_the_front():
    """x @ W.T on sm_90a takes the TMA-fed kernel: from the third call on the front launches it,
    replacing its tensor maps' addresses with the operands' (other operands, a side stream, a
    graph whose capture holds the maps of the captured operands)."""
    from multibackend.backends.raw_wmma import kernels as rw_kernels

    _available("raw_wmma")
    if torch.cuda.get_device_capability() != rw_kernels.WGMMA_CC:
        pytest.skip("the TMA kernels need sm_90a")
    module = _front()
    m, n, k = 300, 520, 264
    a, w = _rand((m, k), seed=21), _rand((n, k), seed=22)
    assert mb.explain(a, w.T, backend="raw_wmma").config.name == next(iter(rw_kernels.TMA_TILES))
    first = mb.matmul(a, w.T, backend="raw_wmma")
    mb.matmul(a, w.T, backend="raw_wmma")
    served = module.stats()[2]
    third = mb.matmul(a, w.T, backend="raw_wmma")
    assert module.stats()[2] == served + 1, "the TMA kernel was not launched by the front"
    assert torch.equal(first, third)
    _check(a, w.T, third)
    other, w2 = _rand((m, k), seed=23), _rand((n, k), seed=24)
    by_front = mb.matmul(other, w2.T, backend="raw_wmma")
    assert module.stats()[2] == served + 2
    assert torch.equal(by_front, mb.matmul(other, w2.T, backend="raw_wmma",
                                           out=torch.empty_like(third)))
    _check(other, w2.T, by_front)
    on_side = _late_on_a_side_stream(a, lambda late: mb.matmul(late, w.T, backend="raw_wmma"))
    assert torch.equal(on_side, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(a, w.T, backend="raw_wmma")
    a.copy_(_rand((m, k), seed=25))
    graph.replay()
    torch.cuda.synchronize()
    _check(a, w.T, captured)


# -- Triton's TMA kernels: descriptors as tensor maps the front re-points per call ------------

#: a TMA split-K tile unsplit, split (slices added by atomics), two column blocks wide, and a
#: persistent TMA tile, by name
TRITON_TMA = {"unsplit": ("tma_splitk", (64, 128, 64, 1, 4, 4)),
              "split": ("tma_splitk", (64, 64, 128, 4, 4, 4)),
              "two_blocks": ("tma_splitk", (128, 192, 64, 1, 4, 4)),
              "persistent": ("tma", (128, 128, 64, 4, 4, 8, False))}


def _triton_tma_config(name):
    from multibackend.backends.triton import configs as tb

    kind, tile = TRITON_TMA[name]
    return tb.tma_splitk_tile(*tile) if kind == "tma_splitk" else tb.tma_tile(tile)


def _tma_handed_over(config, a, b):
    """D of ``config`` run by the Python path on (A, B), after which the backend's description
    of that launch is handed to the front for calls ``matmul(A', B', backend="triton")`` with
    A' and B' laid out as A and B (None where it describes none)."""
    from multibackend.core.config import Operands
    from multibackend.run import plans

    backend = REGISTRY.get("triton")
    problem = matmul_call(a, b, None).problem
    d = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float16, device="cuda")
    ops = Operands(a, b, None, d, 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
    backend.run(problem, ops, config)
    launch = backend.native(problem, config, ops)
    if launch is not None:
        plans.hand_over_native(("backend", "triton"), a, b, launch)
    return d, launch


def _same(d, expected, name):
    """The same bits, or for slices summed by atomics (float32 additions in arrival order)
    within one rounding of float16."""
    if name == "split":
        torch.testing.assert_close(d, expected, rtol=2e-3, atol=1e-2)
    else:
        assert torch.equal(d, expected), name


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("name", list(TRITON_TMA))
@pytest.mark.parametrize("shape", [(200, 520, 1000), (1, 392, 520)], ids=["200x520x1000",
                                                                          "1x392x520"])
def test_a_triton_tma_launch_is_launched_by_the_front(name, layout, shape):
    """Each kind of Triton TMA launch, described for the front: its descriptors' tensor maps
    encoded once as Triton's launcher encodes them, re-pointed at each call's A, B (and D)
    by the front; the same bits as the Python path's launch of the same kernel, on other
    operands too, on a side stream (a plan whose slices are summed by atomics runs only on
    its own stream: the Python path takes that call) and in a CUDA graph."""
    _available("triton")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("Triton's TMA kernels need sm_90")
    module = _front()
    m, n, k = shape
    config = _triton_tma_config(name)

    def operands(seed):
        a = _rand((m, k), seed=seed)
        return a, (_rand((n, k), seed=seed + 1).T if layout == "col" else _rand((k, n),
                                                                                  seed=seed + 1))

    a, b = operands(31)
    expected, launch = _tma_handed_over(config, a, b)
    assert launch is not None, f"{config.name} was not described"
    step, = launch.steps
    assert step.unordered == (name == "split") and (step.stream is not None) == step.unordered
    served = module.stats()[2]
    by_front = mb.matmul(a, b, backend="triton")
    assert module.stats()[2] == served + 1, f"{config.name} was not launched by the front"
    _same(by_front, expected, name)
    _check(a, b, by_front)
    other_a, other_b = operands(33)
    again = mb.matmul(other_a, other_b, backend="triton")
    assert module.stats()[2] == served + 2
    by_python = mb.matmul(other_a, other_b, backend="triton", config=config,
                          out=torch.empty_like(again))
    _same(again, by_python, name)
    _check(other_a, other_b, again)
    on_side = _late_on_a_side_stream(a, lambda late: mb.matmul(late, b, backend="triton"))
    assert module.stats()[2] == served + 2 + (name != "split")
    _check(a, b, on_side)
    # a call the front left to the Python path (the side stream's, for the plan pinned to its
    # stream) planned it there, and that plan's launch replaced this one: the graph is
    # captured from whichever serves calls now
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(a, b, backend="triton")
    if name != "split":
        assert module.stats()[2] == served + 4
    a.copy_(_rand((m, k), seed=35))
    graph.replay()
    torch.cuda.synchronize()
    _check(a, b, captured)


def test_a_triton_launch_summing_by_atomics_is_left_to_the_python_path_when_deterministic():
    """With torch asked for deterministic algorithms, the front does not run a plan whose
    kernel adds slices by atomics; the Python path runs the slice-order kernel instead."""
    _available("triton")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("Triton's TMA kernels need sm_90")
    module = _front()
    a, b = _rand((72, 1000), seed=41), _rand((1000, 264), seed=42)
    _, launch = _tma_handed_over(_triton_tma_config("split"), a, b)
    assert launch is not None and launch.steps[0].unordered
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        served = module.stats()[2]
        d = mb.matmul(a, b, backend="triton")
        assert module.stats()[2] == served
        _check(a, b, d)
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_triton_launch_adding_slices_in_order_is_launched_by_the_front_when_deterministic():
    """With torch asked for deterministic algorithms, the TMA split-K launch that adds slices
    in order (on its stream's float32 scratch and tile counters, the plan pinned to that
    stream) is described for the front: a repeated call is launched by it, with the bits of
    the Python path's launch."""
    _available("triton")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("Triton's TMA kernels need sm_90")
    module = _front()
    a, b = _rand((72, 1000), seed=43), _rand((1000, 264), seed=44)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        expected, launch = _tma_handed_over(_triton_tma_config("split"), a, b)
        assert launch is not None
        step, = launch.steps
        assert not step.unordered and step.stream == torch.cuda.current_stream().cuda_stream
        served = module.stats()[2]
        d = mb.matmul(a, b, backend="triton")
        assert module.stats()[2] == served + 1
        assert torch.equal(d, expected)
        assert torch.equal(mb.matmul(a, b, backend="triton"), expected)
    finally:
        torch.use_deterministic_algorithms(before)


# -- a staged raw WMMA call: copies into buffers of the plan's stream, then the fast kernel ---

@pytest.mark.parametrize("backend", BACKENDS + ["cublas"])
def test_a_repeated_call_naming_a_config_is_launched_by_the_front(backend):
    """matmul(A, B, backend=name, config=c), as the tuner times each candidate, is launched by
    the front from its third call like a plain call, with that config's kernel (for Triton a
    TMA tile): the same bits as the Python path's launch; with another keyword it is not."""
    _available(backend)
    module = _front()
    a, b = _rand((200, 1000), seed=41), _rand((1000, 520), seed=42)
    problem = matmul_call(a, b, None).problem
    config = REGISTRY.get(backend).default_config(problem)
    if backend == "triton" and torch.cuda.get_device_capability() >= (9, 0):
        config = _triton_tma_config("unsplit")
    first = mb.matmul(a, b, backend=backend, config=config)
    second = mb.matmul(a, b, backend=backend, config=config)
    served = module.stats()[2]
    third = mb.matmul(a, b, backend=backend, config=config)
    assert module.stats()[2] == served + 1, f"{backend} {config.name}: not launched by the front"
    assert torch.equal(first, second) and torch.equal(second, third)
    _check(a, b, third)
    by_python = mb.matmul(a, b, backend=backend, config=config, alpha=1.0)
    assert module.stats()[2] == served + 1
    assert torch.equal(by_python, third)


def _ints(shape, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen, device="cuda").half()


def _exact(a, b):
    return (a.double() @ b.double()).half()  # f32 sums of small integers are exact


@pytest.mark.parametrize("shape", [(300, 257, 1001), (1999, 72, 135), (64, 1001, 64)])
def test_a_repeated_staged_raw_wmma_call_is_launched_by_the_front(shape):
    _available("raw_wmma")
    module = _front()
    m, n, k = shape  # A's rows, B's rows or both off the 16-byte grid
    a, b = _ints((m, k), seed=m), _ints((k, n), seed=n)
    # sm_90a: the TMA kernel on the copies, else the fast one
    kernel = "tma_" if torch.cuda.get_device_capability() == (9, 0) else "fast_"
    assert mb.explain(a, b, backend="raw_wmma").config.name.startswith(f"staged:{kernel}")
    for _ in range(2):
        mb.matmul(a, b, backend="raw_wmma")
    served = module.stats()[2]
    third = mb.matmul(a, b, backend="raw_wmma")
    assert module.stats()[2] == served + 1, "the staged call was not launched by the front"
    assert torch.equal(third, _exact(a, b))
    other = _ints((m, k), seed=m + 1)  # other values: the copy reads this call's A
    by_front = mb.matmul(other, b, backend="raw_wmma")
    assert module.stats()[2] == served + 2
    assert torch.equal(by_front, _exact(other, b))
    assert torch.equal(third, _exact(a, b))  # the first result was not overwritten
    on_side = _late_on_a_side_stream(a, lambda late: mb.matmul(late, b, backend="raw_wmma"))
    assert module.stats()[2] == served + 2  # the copies' buffers are the plan stream's
    assert torch.equal(on_side, third)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(a, b, backend="raw_wmma")
    a.copy_(other)
    between = _ints((m, k), seed=m + 2)
    eager = mb.matmul(between, b, backend="raw_wmma")  # its copy, queued before the replay
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, _exact(other, b)) and torch.equal(eager, _exact(between, b))


# -- dot: two passes, the block partials a buffer of the stream the plan was made on ----------

DOT_BACKENDS = ["raw_wmma", "triton"]


def _dot_handed_over(backend, n, seed):
    _available(backend)
    module = _front()
    x, y = _rand((n,), seed=seed), _rand((n,), seed=seed + 1)
    for _ in range(2):
        d = mb.dot(x, y, backend=backend)
    return module, x, y, d


@pytest.mark.parametrize("backend", DOT_BACKENDS)
@pytest.mark.parametrize("n", [1 << 20, 4099])
def test_a_repeated_dot_is_launched_by_the_front(backend, n):
    module, x, y, second = _dot_handed_over(backend, n, seed=n)
    served = module.stats()[2]
    third = mb.dot(x, y, backend=backend)
    assert module.stats()[2] == served + 1, f"{backend}'s dot was not launched by the front"
    assert third.shape == () and third.dtype == torch.float32 and torch.equal(third, second)
    exact = (x.double() * y.double()).sum()
    assert abs(third.double() - exact) <= 1e-5 * (x.double().abs() @ y.double().abs())
    other = _rand((n,), seed=n + 7)
    served = module.stats()[2]
    by_front = mb.dot(other, y, backend=backend)
    assert module.stats()[2] == served + 1
    assert torch.equal(by_front, mb.dot(other, y, backend=backend, acc_dtype="float32"))


@pytest.mark.parametrize("backend", DOT_BACKENDS)
def test_a_dot_on_another_stream_goes_to_the_python_path_and_a_graph_captures_it(backend):
    module, x, y, expected = _dot_handed_over(backend, 1 << 18, seed=3)
    served = module.stats()[2]
    on_side = _late_on_a_side_stream(x, lambda late: mb.dot(late, y, backend=backend))
    assert module.stats()[2] == served  # the plan's partials are the main stream's
    assert torch.equal(on_side, expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.dot(x, y, backend=backend)
    x.copy_(_rand((1 << 18,), seed=21))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, mb.dot(x, y, backend=backend, acc_dtype="float32"))


@pytest.mark.parametrize("backend", DOT_BACKENDS)
def test_a_repeated_dot_on_cupy_arrays_is_launched_by_the_front(backend):
    cupy = pytest.importorskip("cupy")
    _available(backend)
    module = _front()
    x, y = cupy.asarray(_rand((5000,), seed=31)), cupy.asarray(_rand((5000,), seed=32))
    first = mb.dot(x, y, backend=backend)
    mb.dot(x, y, backend=backend)
    served = module.stats()[2]
    third = mb.dot(x, y, backend=backend)
    assert module.stats()[2] == served + 1, f"{backend}'s dot on CuPy arrays was not served"
    assert isinstance(third, cupy.ndarray) and third.shape == () and bool(third == first)


# -- CuPy callers of cuBLAS: the GEMM cupy.matmul ends in, called directly -------------------

@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("layouts", ["nn", "tn", "nt", "tt"])
def test_cublas_for_cupy_matrices_is_cupy_matmuls_own_gemm(dtype, layouts):
    cupy = pytest.importorskip("cupy")
    _available("cublas")
    from multibackend.backends.cublas import cupy_gemm as cublas_cupy

    m, n, k = 67, 45, 131
    a = cupy.asarray(_rand((k, m) if layouts[0] == "t" else (m, k), getattr(torch, dtype), 41))
    b = cupy.asarray(_rand((n, k) if layouts[1] == "t" else (k, n), getattr(torch, dtype), 42))
    a, b = (a.T if layouts[0] == "t" else a), (b.T if layouts[1] == "t" else b)
    direct = cublas_cupy.matrices(dtype, torch.cuda.get_device_capability())
    assert direct is not None
    expected = cupy.matmul(a, b)
    module = _front()
    got = [direct(a, b), mb.matmul(a, b, backend="cublas")]
    served = module.stats()[2]
    got.append(mb.matmul(a, b, backend="cublas"))  # its plan, from the compiled front
    assert module.stats()[2] == served + 1
    for d in got:
        assert d.flags.c_contiguous and d.dtype == expected.dtype
        assert bool((d == expected).all())
    strided = cupy.asarray(_rand((m, 2 * k), getattr(torch, dtype), 43))[:, ::2]
    assert bool((direct(strided, b) == cupy.matmul(strided, b)).all())  # cupy.matmul's copy
