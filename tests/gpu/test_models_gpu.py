"""GPU tier for multibackend in models: a GPT-2-small-sized model with every Linear patched
(logits against torch's, torch.compile(fullgraph=True) with no graph break, CUDA-graph capture
of the eager and the compiled model, one training step's gradients within the bound of
benchmarks/gpu_models.py) and float64 gradcheck of the registered operator on every backend
that runs float64. Timing is benchmarks/gpu_models.py's."""
from __future__ import annotations

import copy
import functools
import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.integrations import torch_op

pytestmark = pytest.mark.gpu

#: two blocks of GPT-2 small's width at T = 256: compiles and trains in seconds
SMALL = dict(layers=2)
SMALL_SEQ = 256


@functools.lru_cache(maxsize=None)
def models():
    """benchmarks/gpu_models.py (the model, its tokens and the gradient bound) as a module."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_models.py"
    spec = importlib.util.spec_from_file_location("gpu_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def pair(backend="auto", seq=SMALL_SEQ, **config):
    """(torch's model, its patched copy, tokens), float16 on the GPU, in eval mode."""
    gm = models()
    cfg = gm.GPTConfig(**config)
    reference = gm.build(cfg, torch.float16, "cuda").eval()
    patched = mb.patch(copy.deepcopy(reference), backend=backend)
    return reference, patched, gm.tokens(cfg, 1, seq, "cuda", seed=1)


@pytest.mark.parametrize("backend, config, seq", [("auto", {}, 1024),
                                                  ("triton", SMALL, SMALL_SEQ)])
def test_patched_gpt2_logits_match_torch(backend, config, seq):
    reference, patched, idx = pair(backend, seq, **config)
    with torch.no_grad():
        err = models().rel_err(patched(idx), reference(idx))
    assert err <= models().LOGITS_BOUND


def test_patched_gpt2_compiles_fullgraph_and_replays_in_cuda_graphs():
    reference, patched, idx = pair("triton", **SMALL)
    gm = models()
    with torch.no_grad():
        explained = torch._dynamo.explain(patched)(idx)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        ops = [n.target for g in explained.graphs for n in g.graph.nodes]
        assert ops.count(torch_op.OP) == 4 * SMALL["layers"] + 1
        torch._dynamo.reset()
        compiled = torch.compile(patched, fullgraph=True)
        assert gm.rel_err(compiled(idx), reference(idx)) <= gm.LOGITS_BOUND
        fresh = gm.tokens(gm.GPTConfig(**SMALL), 1, SMALL_SEQ, "cuda", seed=7)
        for model in (patched, compiled):
            static = idx.clone()
            model(static)  # planned before the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = model(static)
            static.copy_(fresh)
            graph.replay()
            assert gm.rel_err(out, reference(fresh)) <= gm.LOGITS_BOUND


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_training_step_gradients_within_the_bound(backend, dtype):
    gm = models()
    reference, patched, idx = pair(backend, **SMALL)
    tdtype = getattr(torch, dtype)
    targets = gm.tokens(gm.GPTConfig(**SMALL), 1, SMALL_SEQ, "cuda", seed=2)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref32 = gm.gradients(copy.deepcopy(reference).float().train(), idx, targets, 1.0)
    scale = gm.LOSS_SCALE[tdtype]
    theirs = gm.gradients(reference.to(tdtype).train(), idx, targets, scale)
    ours = gm.gradients(patched.to(tdtype).train(), idx, targets, scale)
    check = gm.gradient_check(ref32, theirs, ours, tdtype)
    assert check["ok"], check["worst"]
    assert len(check["params"]) == len(list(reference.parameters()))


def _operands(case):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return (torch.rand(shape, generator=gen, device="cuda", dtype=torch.float64) * 2 - 1
                ).requires_grad_()

    if case == "alpha, beta, C":
        return (rand(5, 7), rand(7, 3), rand(5, 3)), dict(alpha=-1.5, beta=0.5)
    if case == "column-major B":
        b = rand(3, 7)
        return (rand(5, 7), b), dict(transpose_b=True)
    return (rand(4, 5, 7), rand(7, 3)), {}


@pytest.mark.parametrize("case", ["alpha, beta, C", "column-major B", "broadcast B"])
@pytest.mark.parametrize("backend", ["cublas", "triton", "raw_wmma"])
def test_gradcheck_float64(backend, case):
    inputs, options = _operands(case)
    transpose_b = options.pop("transpose_b", False)

    def fn(a, b, *c):
        return mb.matmul(a, b.mT if transpose_b else b, *c, backend=backend, **options)

    assert fn(*inputs).grad_fn is not None
    assert torch.autograd.gradcheck(fn, inputs)


def test_host_tensors_keep_their_device_through_the_operator():
    a = torch.rand((5, 7), requires_grad=True)
    b = torch.rand((7, 3))
    d = mb.matmul(a, b)
    assert d.device == a.device and d.grad_fn is not None
    d.sum().backward()
    assert a.grad.device == a.device
    assert models().rel_err(a.grad, torch.ones(5, 3) @ b.T) <= 1e-5


def test_compiled_training_through_the_operator_matches_torch():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, w, c = (torch.rand(s, generator=gen, device="cuda", dtype=torch.float16)
               .requires_grad_() for s in ((64, 96), (96, 48), (64, 48)))

    def fn(x, w, c):
        return torch.nn.functional.gelu(mb.matmul(x, w, c, backend="triton")).float()

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True)(x, w, c).square().sum().backward()
    got = [t.grad for t in (x, w, c)]
    for t in (x, w, c):
        t.grad = None
    torch.nn.functional.gelu(torch.addmm(c, x, w)).float().square().sum().backward()
    for mine, ref in zip(got, (x.grad, w.grad, c.grad)):
        assert models().rel_err(mine, ref) <= 1e-2
