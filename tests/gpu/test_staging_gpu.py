"""GPU tier for staged configs (misaligned operands copied onto the 16-byte grid): every
backend's staged kernels exact on small-integer operands with rows off the grid — odd K and N,
views sliced at offsets of 1, 2, 4 and 8 elements, column-major operands, a batch with a
broadcast operand, alpha, beta and C — and captured in a CUDA graph after their first call."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.choose.registry import REGISTRY
from multibackend.core.config import Config
from multibackend.core.problem import Problem
from multibackend.gpu import staging
from multibackend.io.request import matmul_call

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
OFFSETS = [1, 2, 4, 8]


def _ints(shape, dtype, gen):
    return torch.randint(-2, 3, shape, generator=gen, device="cuda").to(dtype)


def _view(rows, cols, layout, offset, dtype, gen, batch=None):
    lines, length = (cols, rows) if layout == "col" else (rows, cols)
    lead = (batch,) if batch else ()
    part = _ints(lead + (lines, length + offset + 3), dtype, gen)[..., offset:offset + length]
    return part.transpose(-1, -2) if layout == "col" else part


def _cases(dtype, seed):
    """(label, A, B, C, alpha, beta) of misaligned products."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    yield "odd", _ints((257, 129), dtype, gen), _ints((129, 333), dtype, gen), None, 1.0, 0.0
    for offset in OFFSETS:
        for la, lb in (("row", "row"), ("col", "row"), ("row", "col"), ("col", "col")):
            yield (f"offset{offset}-{la}{lb}", _view(200, 72, la, offset, dtype, gen),
                   _view(72, 136, lb, offset, dtype, gen), None, 1.0, 0.0)
    c = _ints((130, 70), torch.float32, gen)  # C has D's dtype
    yield "alpha-beta-c", _ints((130, 99), dtype, gen), _ints((99, 70), dtype, gen), c, 2.0, -1.0
    yield ("batched-broadcast", _view(65, 47, "row", 2, dtype, gen, batch=3),
           _view(47, 31, "col", 1, dtype, gen), _ints((3, 65, 31), torch.float32, gen), 1.0, 1.0)


def _staged(name: str, problem: Problem) -> list[Config]:
    configs = [c for c in REGISTRY.get(name).configs(problem) if staging.is_staged(c)]
    return configs[:1]


def _exact(name: str, dtype) -> None:
    reason = REGISTRY.get(name).available()
    if reason is not None:
        pytest.skip(f"{name} cannot run here: {reason}")
    ran = 0
    for label, a, b, c, alpha, beta in _cases(dtype, seed=len(name)):
        call = matmul_call(a, b, c, alpha=alpha, beta=beta if c is not None else None,
                           out_dtype="float32")
        assert call.problem.misaligned, label
        configs = _staged(name, call.problem)
        if name == "cutlass" and call.problem.n * 4 % 16:
            assert not configs, label  # a D off the grid is not staged for CUTLASS
            continue
        assert configs, f"{name} offers no staged config for {label}"
        ran += 1
        want = alpha * (a.double() @ b.double())
        if c is not None:
            want = want + beta * c.double()
        for _ in range(2):  # the planning call, then the remembered one
            d = mb.matmul(a, b, c, alpha=alpha, beta=beta if c is not None else None,
                          out_dtype="float32", backend=name, config=configs[0])
            assert torch.equal(d.double(), want), (name, label, configs[0].name)
    assert ran >= 8, ran


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["triton", "raw_wmma"])
def test_staged_configs_are_exact(name, dtype):
    _exact(name, dtype)


@pytest.mark.cutlass
@pytest.mark.parametrize("dtype", DTYPES)
def test_staged_cutlass_configs_are_exact(dtype):
    _exact("cutlass", dtype)


def cutlass_jobs(item) -> list[tuple[Problem, Config]]:
    """The staged kernels the CUTLASS test runs, for the session's one parallel build."""
    dtype = item.callspec.params["dtype"]
    jobs = []
    for _, a, b, c, alpha, beta in _cases(dtype, seed=len("cutlass")):
        problem = matmul_call(a, b, c, alpha=alpha, beta=beta if c is not None else None,
                              out_dtype="float32").problem
        jobs += [(problem, cfg) for cfg in _staged("cutlass", problem)]
    return jobs


@pytest.mark.parametrize("name", ["triton", "raw_wmma"])
def test_staged_call_is_captured_in_a_cuda_graph(name):
    gen = torch.Generator(device="cuda").manual_seed(5)
    a, b = _ints((300, 1001), torch.float16, gen), _ints((1001, 257), torch.float16, gen)
    config = _staged(name, matmul_call(a, b, None).problem)[0]
    first = mb.matmul(a, b, backend=name, config=config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(a, b, backend=name, config=config)
    a.copy_(_ints(a.shape, a.dtype, gen))
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(first, captured)
    assert torch.equal(captured.double(), (a.double() @ b.double()).half().double())
