"""GPU tier for what ``auto`` promises: the torch baseline's contracts, every backend's calls
captured in a CUDA graph after their first call, the capture error of a first call, and
first-call autotuning kept in the user cache."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.choose.registry import REGISTRY
from multibackend.io.request import matmul_call
from multibackend.run import fastcall
from multibackend.verify import reference
from tests.helpers import record_torchs_linear  # noqa: E402

pytestmark = pytest.mark.gpu


def _rand(shape, dtype=torch.float16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(dtype)


def _assert_close(call_args, d, alpha=1.0, beta=0.0):
    a, b, c = call_args
    call = matmul_call(a, b, c, alpha=alpha, beta=beta if c is not None else None)
    ref = reference.reference_matmul(call.operands.a, call.operands.b, call.operands.c,
                                     call.operands.alpha, call.operands.beta)
    cmp = reference.compare(call.problem, d.reshape(call.operands.d.shape), ref)
    assert cmp.ok, cmp.detail


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["plain", "alpha", "c", "batched", "broadcast", "col", "strided"])
def test_torch_baseline_keeps_every_contract(dtype, case):
    m, n, k = 67, 45, 129
    a, b = _rand((m, k), dtype, 1), _rand((k, n), dtype, 2)
    c, alpha, beta = None, 1.0, 0.0
    if case == "alpha":
        alpha = -1.5
    elif case == "c":
        c, alpha, beta = _rand((m, n), dtype, 3), 0.5, 2.0
    elif case == "batched":
        a, b = _rand((3, m, k), dtype, 4), _rand((3, k, n), dtype, 5)
        c, beta = _rand((3, m, n), dtype, 6), -1.0
    elif case == "broadcast":
        a = _rand((4, m, k), dtype, 7)
    elif case == "col":
        a, b = _rand((k, m), dtype, 8).T, _rand((n, k), dtype, 9).T
    elif case == "strided":
        a = _rand((m, 2 * k), dtype, 10)[:, ::2]
    for _ in range(3):  # the full path, the plan's first run, then the remembered launch
        d = mb.matmul(a, b, c, alpha=alpha, beta=beta if c is not None else None,
                      backend="cublas", precision="ieee" if dtype == torch.float32 else None)
        _assert_close((a, b, c), d, alpha, beta)


def test_torch_baseline_float32_precision_is_the_calls_not_the_processes():
    a, b = _rand((256, 512), torch.float32, 1), _rand((512, 256), torch.float32, 2)
    exact = a.double() @ b.double()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ieee = mb.matmul(a, b, backend="cublas", precision="ieee")
        tf32 = mb.matmul(a, b, backend="cublas", precision="tf32")
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    err = lambda d: ((d.double() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert err(ieee) < 1e-6 < err(tf32) < 1e-2


def _capturable_backends():
    a, b = _rand((96, 64)), _rand((64, 80))
    problem = matmul_call(a, b).problem
    return [name for name in REGISTRY.names if REGISTRY.availability(name) is None
            and REGISTRY.get(name).supports(problem) is None]


CAPTURE_SHAPE = (96, 80, 64)


@pytest.mark.parametrize("name", ["cublas", "triton", "raw_wmma",
                                  pytest.param("cutlass", marks=pytest.mark.cutlass), "auto"])
def test_every_backend_is_captured_after_its_first_call(name):
    if name != "auto" and name not in _capturable_backends():
        pytest.skip(f"{name} cannot run here: {REGISTRY.availability(name)}")
    m, n, k = CAPTURE_SHAPE
    a, b, c = _rand((m, k), seed=11), _rand((k, n), seed=12), _rand((m, n), seed=13)
    mb.matmul(a, b, c, alpha=2.0, backend=name)  # plans
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mb.matmul(a, b, c, alpha=2.0, backend=name)  # the plan's first run (binds a launch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        d = mb.matmul(a, b, c, alpha=2.0, backend=name)
    d.fill_(float("nan"))
    a.copy_(_rand((m, k), seed=14))  # the replay reads the arrays' new contents
    graph.replay()
    torch.cuda.synchronize()
    _assert_close((a, b, c), d, 2.0, 1.0)


def cutlass_jobs(item):
    """The (problem, config) of the CUTLASS kernel a test runs, by numbers alone (the GPU
    tier's conftest builds it before the tests start): the captured call's default kernel."""
    if item.originalname != "test_every_backend_is_captured_after_its_first_call":
        return []
    from multibackend.core.problem import synthetic

    backend = REGISTRY.get("cutlass")
    problem = synthetic(*CAPTURE_SHAPE, "float16", has_c=True,
                        cc=torch.cuda.get_device_capability())
    return [(problem, backend.default_config(problem))] if backend.supports(problem) is None \
        else []


def test_first_call_inside_a_capture_names_the_fix():
    a, b = _rand((48, 40), seed=21), _rand((40, 24), seed=22)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(mb.CaptureError, match="call it once with the same arguments"):
        with torch.cuda.graph(graph):
            mb.matmul(a, b, alpha=3.0)


def test_untuned_auto_takes_torch_unless_measured_otherwise():
    a, b = _rand((4095, 4096)), _rand((4096, 333))
    decision = mb.explain(a, b)
    assert decision.rule in ("baseline", "calibrated"), str(decision)
    if decision.rule == "baseline":
        assert decision.backend == "cublas"


def test_first_call_autotune_persists_and_is_reused(tmp_path, monkeypatch):
    from multibackend.choose import store as autotune
    from multibackend.run import plans

    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "STORE", autotune.Store())
    plans.forget()
    a, b = _rand((333, 2048), seed=31), _rand((2048, 1000), seed=32)
    assert mb.explain(a, b, autotune=True).backend is None  # not measured yet
    d = mb.matmul(a, b, autotune=True)
    _assert_close((a, b, None), d)
    decision = mb.explain(a, b, autotune=True)
    assert decision.rule == "autotune" and decision.backend is not None
    assert "torch.matmul" in decision.detail and "cublas" in decision.detail
    files = list((tmp_path / "tuning").glob("autotune-*.json"))
    assert len(files) == 1
    fresh = autotune.Store(files[0])  # a later process reads the same entry
    entry = fresh.get(decision.problem, "eager")
    assert entry["backend"] == decision.backend and "cublas" in entry["timings_ms"]
    files[0].write_text("{ torn")  # a corrupt file is rebuilt, not trusted
    assert autotune.Store(files[0]).get(decision.problem, "eager") is None


def test_first_call_autotune_of_a_dot_drops_a_candidate_that_writes_nothing(tmp_path,
                                                                            monkeypatch):
    """A dot takes no ``out``: its candidates are checked in the call's own result, poisoned,
    so one that writes nothing fails there, where in fresh memory it could pass on the right
    answer an earlier candidate left in it."""
    from multibackend.choose import store as autotune
    from multibackend.io.request import dot_call
    from multibackend.run import plans

    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "STORE", autotune.Store())
    plans.forget()
    triton = REGISTRY.get("triton")
    writes, poisoned = triton.run, []

    def writes_nothing(problem, operands, config):
        if problem.op != "dot":
            return writes(problem, operands, config)
        poisoned.append(bool(torch.isnan(operands.d).all()))

    monkeypatch.setattr(triton, "run", writes_nothing)
    x, y = _rand((4099,), torch.float32, 41), _rand((4099,), torch.float32, 42)
    got = mb.dot(x, y, autotune="eager")
    assert torch.allclose(got.double(), x.double() @ y.double(), rtol=1e-5)
    assert poisoned == [True]  # checked once, in poisoned memory
    entry = autotune.STORE.get(dot_call(x, y).problem, "eager")
    assert entry["backend"] != "triton" and "triton" not in entry["timings_ms"]
    assert "triton" in entry["dropped"], entry


def test_a_shape_past_its_familys_bounds_is_served_by_the_compiled_front(monkeypatch):
    """A plain call whose shape lies past its family's bounds gets an exact plan in the
    compiled front (where it is built): repeated, it costs what a family-served call does."""
    from multibackend import eager
    from multibackend.run import plans

    plans.forget()
    monkeypatch.setattr(eager, "shape_free", lambda *args: (1, 1, 1, 1, 1))  # holds for none
    a, b = _rand((512, 256), seed=35), _rand((256, 384), seed=36)
    first = mb.matmul(a, b)
    assert plans.FAMILIES, "the family was remembered, with its bounds"
    compiled = plans._COMPILED[0] if plans.front() is not plans.served else None
    if fastcall.compiler() is not None:
        assert compiled is not None, fastcall.status()
    if compiled is None:
        pytest.skip(f"no compiled front: {fastcall.status()}")
    assert compiled.stats()[:2] == (1, 1)
    served = compiled.stats()[2]
    again = mb.matmul(a, b)
    assert compiled.stats()[2] == served + 1
    assert torch.equal(first, again) and torch.equal(again, torch.mm(a, b))


def test_repeated_autotuned_calls_taking_torchs_op_are_served_by_the_compiled_front(
        tmp_path, monkeypatch):
    """After the first (measuring) call, an autotuned call whose winner is torch's op (made
    the winner here, whatever the timings) is made by the compiled front (where it is built),
    exactly as the Python path would make it."""
    from multibackend.choose import store as autotune
    from multibackend.run import plans
    from multibackend.verify import measure

    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "STORE", autotune.Store())
    monkeypatch.setattr(measure, "winner", lambda timings, mode: ("cublas", 0.0))
    plans.forget()
    a, b = _rand((16, 1024), seed=33), _rand((1024, 5120), seed=34)
    first = mb.matmul(a, b, autotune="eager")
    compiled = plans._COMPILED[0] if plans.front() is not plans.served else None
    if fastcall.compiler() is not None:
        assert compiled is not None, fastcall.status()
    if compiled is None:
        pytest.skip(f"no compiled front: {fastcall.status()}")
    assert mb.explain(a, b, autotune="eager").backend == "cublas"
    assert compiled.stats()[1] >= 1, "the exact plan was handed over"
    served = compiled.stats()[2]
    again = mb.matmul(a, b, autotune="eager")
    assert compiled.stats()[2] == served + 1
    assert torch.equal(again, torch.mm(a, b)) and torch.equal(first, again)
    other = b.T.contiguous().T  # another layout: measured (through the front) and planned apart
    assert torch.equal(mb.matmul(a, other, autotune="eager"), torch.mm(a, other))
    served = compiled.stats()[2]
    assert torch.equal(mb.matmul(a, other, autotune="eager"), torch.mm(a, other))
    assert compiled.stats()[2] == served + 1


def test_first_call_autotune_times_the_backends_through_the_compiled_front(tmp_path, monkeypatch):
    """The first autotuned call times each backend by the plain call it runs once chosen, so
    (where the front is built) all but each backend's first two timed runs are launched by the
    compiled front: eager figures hold the host time the chosen backend's calls will have."""
    from multibackend import first_call
    from multibackend.choose import store as autotune
    from multibackend.run import plans

    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "STORE", autotune.Store())
    plans.forget()
    compiled = plans._COMPILED[0] if plans.front() is not plans.served else None
    if compiled is None:
        pytest.skip(f"no compiled front: {fastcall.status()}")
    a, b = _rand((24, 2048), seed=37), _rand((2048, 3072), seed=38)
    served = compiled.stats()[2]
    mb.matmul(a, b, autotune="eager")
    timed = mb.explain(a, b, autotune="eager")
    assert timed.rule == "autotune" and timed.backend is not None
    assert compiled.stats()[2] - served >= first_call.REPS, "the timed runs took the Python path"


@pytest.mark.parametrize("kind", ["torch", "cupy"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_shape_free_plans_serve_every_shape_and_word_errors_as_ours(kind, dtype):
    from multibackend.run import plans

    if kind == "cupy":
        cupy = pytest.importorskip("cupy")
        wrap, unwrap = cupy.from_dlpack, torch.from_dlpack
    else:
        wrap = unwrap = lambda x: x  # noqa: E731
    plans.forget()
    shapes = [(1, 64, 48, 32), (1, 7, 129, 4095), (1, 1, 4096, 333), (1, 300, 2, 65),
              (3, 33, 65, 129), (5, 8, 16, 1000)]
    for i, (batch, m, n, k) in enumerate(shapes):
        lead = (batch,) if batch > 1 else ()
        a, b = _rand(lead + (m, k), dtype, 40 + i), _rand((k, n), dtype, 50 + i)
        for _ in range(2):
            d = unwrap(mb.matmul(wrap(a), wrap(b)))
            assert d.shape == lead + (m, n) and d.dtype == dtype
            _assert_close((a, b, None), d)
        if kind == "torch" or dtype != torch.bfloat16:  # CuPy holds no bf16: no family
            assert plans.FAMILIES, "a shape-free plan was remembered"
    with pytest.raises(mb.InvalidArgument, match="inner dimensions differ"):
        mb.matmul(wrap(_rand((8, 16), dtype)), wrap(_rand((17, 8), dtype)))
    with pytest.raises(mb.InvalidArgument, match="same dtype"):
        mb.matmul(wrap(_rand((8, 16), dtype)), wrap(_rand((16, 8), torch.float32)))


@pytest.mark.parametrize("backend", [None, "auto", "cublas"])
def test_repeated_plain_calls_take_the_shortest_path(backend):
    """A repeated plain call (A and B, at most ``backend``) is made by its family plan,
    torch's own op, straight from :func:`multibackend.matmul`; host tensors and calls with
    other keywords never are."""
    from multibackend.run import plans

    plans.forget()
    a, b = _rand((96, 256), seed=61), _rand((256, 80), seed=62)
    options = {} if backend == "auto" else {"backend": backend}
    first = mb.matmul(a, b, **options)
    assert plans.plain(a, b, None, "auto" if backend == "auto" else backend) is not plans.MISS
    again = mb.matmul(a, b, **options)
    assert torch.equal(first, again) and torch.equal(again, torch.mm(a, b))
    compiled = plans._COMPILED[0] if plans.front() is not plans.served else None
    if fastcall.compiler() is not None:
        assert compiled is not None, fastcall.status()
    if compiled is not None:  # the compiled front serves names it was handed
        served = compiled.stats()[2]
        assert torch.equal(mb.matmul(a, b, **options), again)
        assert compiled.stats()[2] == served + 1
    assert plans.plain(a.cpu(), b.cpu(), None, "auto") is plans.MISS
    assert plans.plain(a, b, None, "triton") is plans.MISS  # never planned under that name
    with pytest.raises(mb.InvalidArgument, match="inner dimensions differ"):
        mb.matmul(a, _rand((255, 80)), **options)


def test_a_bias_broadcast_over_rows_goes_to_addmm_as_a_vector(monkeypatch):
    """C broadcast over the rows (a Linear's bias) reaches cuBLAS as the bias vector, the
    form its fused-bias epilogue takes, in every remembered call; a full C as itself."""
    from multibackend.run import plans

    plans.forget()
    a, b, bias = _rand((200, 64), seed=63), _rand((64, 96), seed=64), _rand((96,), seed=65)
    c = bias.expand(200, 96)
    seen = []
    addmm = torch.addmm

    def recording(c_arg, *args, **kwargs):
        seen.append(c_arg.dim())
        return addmm(c_arg, *args, **kwargs)

    monkeypatch.setattr(torch, "addmm", recording)
    full = _rand((200, 96), seed=66)
    for backend in ("cublas", "auto"):
        for _ in range(3):
            _assert_close((a, b, c), mb.matmul(a, b, c, backend=backend), beta=1.0)
    assert len(seen) >= 4 and set(seen) == {1}, seen
    for _ in range(2):
        _assert_close((a, b, full), mb.matmul(a, b, full, backend="cublas"), beta=1.0)
    assert seen[-1] == 2


def test_repeated_calls_with_a_bias_take_the_shortest_path():
    """A repeated call with C and no other keyword is made by its family plan too, for every
    M (a bias broadcast over the rows keys no shape); a C that is not D's shape still gets
    matmul's error, never torch's broadcast."""
    from multibackend.run import plans

    plans.forget()
    b, bias = _rand((128, 96), seed=71), _rand((96,), seed=72)
    for i, m in enumerate((8, 200, 33)):
        a = _rand((m, 128), seed=73 + i)
        c = bias.expand(m, 96)
        for _ in range(2):
            _assert_close((a, b, c), mb.matmul(a, b, c), beta=1.0)
        assert plans.plain(a, b, c, "auto") is not plans.MISS, m
    row = bias.reshape(1, 96)
    with pytest.raises(mb.InvalidArgument, match="C must be"):
        mb.matmul(a, b, row.expand(1, 96))
    with pytest.raises(mb.InvalidArgument, match="C must be"):
        mb.matmul(a, b, bias.expand(m + 1, 96))


@pytest.mark.parametrize("bias", [True, False])
def test_repeated_linear_calls_are_torchs_linear(monkeypatch, bias):
    """A Linear layer's repeated call whose product dispatch runs on cuBLAS is torch's own
    ``linear`` (one call, no views), with the planned call's result bit for bit; a layer
    named to another backend never is; a wrong input still gets matmul's error."""
    from multibackend import nn as mb_nn
    from multibackend.run import plans

    plans.forget()
    linear = mb_nn._F_LINEAR
    made = record_torchs_linear(monkeypatch)
    layer = mb.nn.Linear(128, 96, bias=bias, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        for shape in ((2, 33, 128), (70, 128)):
            x = _rand(shape, seed=80 + len(shape))
            first, again = layer(x), layer(x)
            expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
            assert torch.equal(first, expected) and torch.equal(again, expected), shape
        # the first call plans; every later one, of any rank and M, is torch's
        assert made == [(2, 33, 128), (70, 128), (70, 128)]
        assert torch.equal(layer(_rand((3, 128), seed=83)),
                           linear(_rand((3, 128), seed=83), layer.weight, layer.bias))
        assert len(made) == 4
        with pytest.raises(mb.InvalidArgument, match="inner dimensions differ"):
            layer(_rand((4, 127), seed=84))
        assert len(made) == 5  # torch's refused it first
        layer.backend = "triton"
        for _ in range(2):
            _assert_close((x, layer.weight.mT, layer.bias.expand(70, 96) if bias else None),
                          layer(x), beta=1.0 if bias else 0.0)
        assert len(made) == 5
