"""CPU tier for the registered operator ``multibackend::matmul`` (multibackend/torch_op.py):
its fake implementation against the real results, torch.compile(fullgraph=True) with no graph
break, the backward formulas against torch's gradients (and gradcheck in float64), and the
routing of :func:`multibackend.matmul` (which calls go through the operator, which do not).
Products run in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import multibackend as mb
from multibackend import eager
from multibackend.core.errors import InvalidArgument, InvalidType
from multibackend.integrations import torch_op

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU tier: runs the interpreter on host tensors")


def rand(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)


def bound(dtype) -> float:
    return {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}[dtype]


def close(x, ref, dtype=None):
    """Relative error of ``x`` against ``ref`` (Frobenius), within the dtype's bound."""
    err = ((x.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err <= bound(dtype or ref.dtype), f"relative error {err:.2e}"


# -- the fake implementation ---------------------------------------------------------------

FAKE_CASES = {
    "matrices": ((5, 7), (7, 3), torch.float32, {}),
    "batched": ((4, 5, 7), (4, 7, 3), torch.float32, {}),
    "broadcast A": ((5, 7), (4, 7, 3), torch.float32, {}),
    "broadcast B": ((4, 5, 7), (7, 3), torch.float32, {}),
    "batch of one": ((1, 5, 7), (4, 7, 3), torch.float32, {}),
    "float16 to float32": ((5, 7), (7, 3), torch.float16, {"out_dtype": "float32"}),
    "float64": ((5, 7), (7, 3), torch.float64, {}),
    "int8": ((5, 16), (16, 8), torch.int8, {}),
}


@pytest.mark.parametrize("case", list(FAKE_CASES))
def test_fake_matches_the_real_result(case):
    """Shape, dtype and strides of the fake result are those of the real one."""
    a_shape, b_shape, dtype, options = FAKE_CASES[case]
    if dtype == torch.int8:
        a = torch.randint(-3, 4, a_shape, dtype=dtype)
        b = torch.randint(-3, 4, b_shape, dtype=dtype)
    else:
        a, b = rand(a_shape, dtype, 1), rand(b_shape, dtype, 2)
    real = torch_op.matmul(a, b, **options)
    with FakeTensorMode() as mode:
        fake = torch_op.matmul(mode.from_tensor(a), mode.from_tensor(b), **options)
    assert (fake.shape, fake.dtype, fake.stride()) == (real.shape, real.dtype, real.stride())
    assert real.shape == torch.matmul(a.double(), b.double()).shape


def test_fake_gives_the_packed_result_type():
    a = torch.zeros((6, 8), dtype=torch.uint8)
    b = torch.zeros((8, 5), dtype=torch.uint8)
    with FakeTensorMode() as mode:
        fake = torch_op.matmul(mode.from_tensor(a), mode.from_tensor(b), dtype="int4")
    assert (tuple(fake.shape), fake.dtype) == ((6, 5), torch.int32)


@pytest.mark.parametrize("a_shape, b_shape, pattern", [
    ((5,), (5, 3), r"A is \(5,\): rank 1"),
    ((5, 7), (6, 3), r"A is \(5, 7\) but B is \(6, 3\): inner dimensions differ"),
    ((2, 5, 7), (3, 7, 3), r"batch dimensions differ"),
])
def test_fake_names_the_broken_rule(a_shape, b_shape, pattern):
    with FakeTensorMode() as mode, pytest.raises(InvalidArgument, match=pattern):
        torch_op.matmul(mode.from_tensor(torch.zeros(a_shape)),
                        mode.from_tensor(torch.zeros(b_shape)))


def test_fake_refuses_an_unserved_dtype():
    with FakeTensorMode() as mode, pytest.raises(InvalidArgument, match="int16"):
        torch_op.matmul(mode.from_tensor(torch.zeros((2, 2), dtype=torch.int16)),
                        mode.from_tensor(torch.zeros((2, 2), dtype=torch.int16)))


# -- torch.compile ------------------------------------------------------------------------

def _graph_targets(fn, *args):
    """(result, the call targets of every graph torch.compile(fullgraph=True) made)."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)(*args), targets


def _model(x, w, c, w2):
    h = torch.relu(mb.matmul(x, w, c, alpha=0.5, beta=2.0))
    return mb.matmul(h, w2.mT) + 1


def test_compile_fullgraph_traces_the_operator():
    x, w, c, w2 = rand((6, 9), seed=1), rand((9, 5), seed=2), rand((6, 5), seed=3), \
        rand((4, 5), seed=4)
    result, targets = _graph_targets(_model, x, w, c, w2)
    assert targets.count(torch_op.OP) == 2
    ref = torch.relu(0.5 * x @ w + 2.0 * c) @ w2.T + 1
    close(result, ref)
    explained = torch._dynamo.explain(_model)(x, w, c, w2)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def _linear_model(x, w, bias, w2):
    h = torch.relu(mb.matmul(x, w.mT, bias.expand(x.shape[0], w.shape[0])))
    return mb.matmul(h, w2.mT, backend="cublas") + mb.matmul(h, w2.mT, alpha=0.5)


def test_compile_traces_torchs_own_op_where_cublas_is_chosen(monkeypatch):
    """Where dispatch picks cuBLAS for a plain call, torch.compile sees torch's own op (a
    bias broadcast over the rows as addmm's vector), asked once per call site at trace
    time; other calls still trace the operator."""
    asked = []

    @torch._dynamo.assume_constant_result
    def chosen(A, B, C, backend):
        asked.append((tuple(A.shape), tuple(B.shape), None if C is None else C.stride(),
                      backend))
        return True

    monkeypatch.setattr(torch_op, "_cublas_chosen", chosen)
    x, w, bias, w2 = rand((6, 9), seed=1), rand((5, 9), seed=2), rand((5,), seed=3), \
        rand((4, 5), seed=4)
    result, targets = _graph_targets(_linear_model, x, w, bias, w2)
    assert targets.count(torch.ops.aten.addmm.default) + targets.count(torch.addmm) == 1
    assert targets.count(torch_op.OP) == 1  # alpha=0.5: not a plain call
    assert asked == [((6, 9), (9, 5), (0, 1), "auto"), ((6, 5), (5, 4), None, "cublas")]
    h = torch.relu(x @ w.T + bias)
    close(result, h @ w2.T + 0.5 * (h @ w2.T))


def test_compile_asks_dispatch_with_the_real_tensors():
    """On a machine without cuBLAS, the trace-time question answers no (the operator runs)
    and never raises, whatever the arguments."""
    a, b = rand((6, 9)), rand((9, 5))
    assert torch_op._cublas_chosen(a, b, None, "auto") is False
    assert torch_op._cublas_chosen(a, rand((8, 5)), None, "auto") is False  # refused
    assert torch_op._cublas_chosen(a, b, rand((2, 6, 5)), "auto") is False


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_batched_products_match_torch(backend):
    def fn(a, b):
        return mb.matmul(a, b).sum(-1)

    a, b = rand((3, 6, 8), seed=5), rand((8, 4), seed=6)
    torch._dynamo.reset()
    close(torch.compile(fn, fullgraph=True, backend=backend)(a, b), (a @ b).sum(-1))


def test_compiled_training_step_matches_torch_gradients():
    x = rand((6, 9), seed=1).requires_grad_()
    w, c, w2 = (rand(s, seed=i).requires_grad_() for i, s in ((2, (9, 5)), (3, (6, 5)),
                                                              (4, (4, 5))))
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, backend="aot_eager")
    compiled(x, w, c, w2).square().sum().backward()
    got = [t.grad for t in (x, w, c, w2)]
    for t in (x, w, c, w2):
        t.grad = None
    (torch.relu(0.5 * x @ w + 2.0 * c) @ w2.T + 1).square().sum().backward()
    for mine, ref in zip(got, (x.grad, w.grad, c.grad, w2.grad)):
        close(mine, ref)


# -- autograd -----------------------------------------------------------------------------

GRAD_CASES = {
    # name: (A shape, B shape, C shape or None, alpha, beta, B given transposed)
    "matrices": ((5, 7), (7, 3), None, 1.0, None, False),
    "alpha, beta, C": ((5, 7), (7, 3), (5, 3), -1.5, 0.5, False),
    "B column-major": ((5, 7), (7, 3), (5, 3), 2.0, 1.0, True),
    "batched": ((4, 5, 7), (4, 7, 3), (4, 5, 3), 1.0, 1.0, False),
    "broadcast A": ((5, 7), (4, 7, 3), None, 0.5, None, False),
    "broadcast B": ((4, 5, 7), (7, 3), (5, 3), 1.0, -2.0, False),
    "broadcast B column-major": ((4, 5, 7), (7, 3), None, 1.0, None, True),
    "batch of one": ((1, 5, 7), (4, 7, 3), (1, 5, 3), 1.0, 1.0, False),
    "B batch of one": ((4, 5, 7), (1, 7, 3), None, 1.0, None, False),
    "C batch of one": ((5, 7), (7, 3), (1, 5, 3), 1.0, 1.0, False),
}


#: gradcheck perturbs every element (two products each): its cases keep the layouts and
#: broadcasts of GRAD_CASES with fewer elements
SMALLER = {1: 1, 3: 2, 4: 2, 5: 3, 7: 4}


def _operands(case, dtype, small=False):
    a_shape, b_shape, c_shape, alpha, beta, transposed = GRAD_CASES[case]
    if small:
        a_shape, b_shape = (tuple(SMALLER[n] for n in s) for s in (a_shape, b_shape))
        c_shape = c_shape and tuple(SMALLER[n] for n in c_shape)
    a = rand(a_shape, dtype, 1).requires_grad_()
    if transposed:
        b_leaf = rand(b_shape[:-2] + b_shape[:-3:-1], dtype, 2).requires_grad_()
        b = b_leaf.mT
    else:
        b_leaf = b = rand(b_shape, dtype, 2).requires_grad_()
    c = None if c_shape is None else rand(c_shape, dtype, 3).requires_grad_()
    return a, b, b_leaf, c, alpha, beta


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_match_torch(case, dtype):
    a, b, b_leaf, c, alpha, beta = _operands(case, dtype)
    d = mb.matmul(a, b, c, alpha=alpha, beta=beta)
    grad_out = rand(d.shape, dtype, 4)
    assert d.grad_fn is not None and "multibackend" in type(d.grad_fn).__name__
    d.backward(grad_out)
    leaves = [t for t in (a, b_leaf, c) if t is not None]
    got = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    ref = alpha * torch.matmul(a, b)
    if c is not None:
        ref = ref + (1.0 if beta is None else beta) * c
    ref.reshape(d.shape).backward(grad_out)
    for mine, expected in zip(got, (t.grad for t in leaves)):
        assert mine.shape == expected.shape
        close(mine, expected)


@pytest.mark.parametrize("case", ["alpha, beta, C", "B column-major", "broadcast A",
                                  "broadcast B", "batch of one", "C batch of one"])
def test_gradcheck_float64(case):
    """The operator's gradients against finite differences. gradcheck perturbs every element,
    two products each: without a GPU they run on the host backend (the formulas are the
    operator's whatever backend computes the products), not in Triton's interpreter."""
    a, b, b_leaf, c, alpha, beta = _operands(case, torch.float64, small=True)
    transposed = b is not b_leaf
    backend = "auto" if torch.cuda.is_available() else "host"

    def fn(a, b_leaf, *c):
        return mb.matmul(a, b_leaf.mT if transposed else b_leaf, *c, alpha=alpha, beta=beta,
                         backend=backend)

    inputs = (a, b_leaf) + (() if c is None else (c,))
    assert torch.autograd.gradcheck(fn, inputs)


def test_gradients_keep_the_operands_layout():
    """A column-major operand (``weight.mT``) gets a column-major gradient (made as
    ``(dD^T @ A)^T``, no copy), so its weight's gradient is row-major like the weight; the
    other operand's gradient is row-major."""
    x = rand((6, 9), seed=1).requires_grad_()
    weight = rand((4, 9), seed=2).requires_grad_()
    seen = {}

    def strides_of(name):
        def hook(grad):
            seen[name] = grad.stride()
        return hook

    b = weight.mT
    b.register_hook(strides_of("b"))
    x.register_hook(strides_of("x"))
    mb.matmul(x, b).sum().backward()
    assert seen == {"b": (1, 9), "x": (9, 1)}
    assert weight.grad.stride() == weight.stride()
    close(weight.grad, torch.ones(6, 4, dtype=torch.float64).T @ x.detach().double(),
          torch.float32)


def test_out_dtype_gradients_are_in_the_operands_dtype():
    a = rand((5, 7), torch.float16, 1).requires_grad_()
    b = rand((7, 3), torch.float16, 2).requires_grad_()
    d = mb.matmul(a, b, out_dtype="float32")
    assert d.dtype == torch.float32
    g = rand((5, 3), torch.float32, 3)
    d.backward(g)
    assert (a.grad.dtype, b.grad.dtype) == (torch.float16, torch.float16)
    close(a.grad, g.double() @ b.detach().double().T, torch.float16)
    close(b.grad, a.detach().double().T @ g.double(), torch.float16)


def test_only_the_gradients_asked_for_are_computed(monkeypatch):
    calls = []
    product = torch_op._product
    monkeypatch.setattr(torch_op, "_product", lambda *args: calls.append(1) or product(*args))
    a, b = rand((5, 7), seed=1).requires_grad_(), rand((7, 3), seed=2)
    mb.matmul(a, b).sum().backward()
    assert len(calls) == 1 and b.grad is None and a.grad is not None


@pytest.mark.parametrize("saturate, dtype, pattern", [
    (True, torch.float16, "saturate is True: a saturated product has no gradient"),
    (False, torch.float8_e4m3fn, "gradients are computed for float16, bfloat16, float32"),
])
def test_gradients_refused_name_the_rule(saturate, dtype, pattern):
    """No CPU backend saturates or takes fp8: the backward is called as autograd would."""
    a, b = torch.zeros((5, 7), dtype=dtype), torch.zeros((7, 3), dtype=dtype)
    ctx = SimpleNamespace(saved_tensors=(a, b), needs_input_grad=(True,) + (False,) * 12,
                          saturate=saturate, alpha=1.0, beta=0.0, c_shape=None,
                          options=(None, None, "auto", None))
    with pytest.raises(InvalidArgument, match=pattern):
        torch_op._backward(ctx, torch.ones((5, 3)))


# -- which calls go through the operator ---------------------------------------------------

def test_the_compile_check_is_torchs_own():
    """The one check on every call is torch's constant-folded function, bound once."""
    assert eager._compiling is torch.compiler.is_dynamo_compiling


def _count_recorded(monkeypatch):
    calls = []
    recorded = eager._recorded
    monkeypatch.setattr(eager, "_recorded",
                        lambda *a, **k: calls.append(1) or recorded(*a, **k))
    return calls


def test_calls_autograd_need_not_record_skip_the_operator(monkeypatch):
    calls = _count_recorded(monkeypatch)
    a, b = rand((5, 7), seed=1), rand((7, 3), seed=2)
    for _ in range(2):
        assert mb.matmul(a, b).grad_fn is None
    with torch.no_grad():
        assert mb.matmul(a.requires_grad_(), b).grad_fn is None
    assert calls == []


def test_a_remembered_plan_does_not_bypass_autograd(monkeypatch):
    """A plan remembered from a call without grad (here Triton's) is not run for a call
    autograd must record: that one goes through the operator."""
    a, b = rand((5, 7), seed=1), rand((7, 3), seed=2)
    mb.matmul(a, b)
    calls = _count_recorded(monkeypatch)
    d = mb.matmul(a.requires_grad_(), b)
    assert calls == [1] and d.grad_fn is not None
    close(d, a.detach() @ b)


def test_recorded_calls_refuse_out_and_array_scalars():
    a, b = rand((5, 7), seed=1).requires_grad_(), rand((7, 3), seed=2)
    with pytest.raises(InvalidArgument, match=r"out is a \(5, 3\) array"):
        mb.matmul(a, b, out=torch.empty(5, 3))
    with pytest.raises(InvalidType, match="alpha is tensor"):
        mb.matmul(a, b, alpha=torch.tensor(2.0))
    with pytest.raises(InvalidType, match="A is a list"):
        torch_op.matmul([[1.0]], b)


def test_recorded_calls_take_a_config_by_name():
    a, b = rand((5, 7), seed=1).requires_grad_(), rand((7, 3), seed=2)
    config = mb.explain(a.detach(), b, backend="triton").config
    d = mb.matmul(a, b, backend="triton", config=config)
    close(d, a.detach() @ b)
    with pytest.raises(InvalidArgument, match="'no-such-tile': not a config of backend"):
        mb.matmul(a, b, backend="triton", config="no-such-tile")
