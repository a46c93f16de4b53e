"""GPU tier for the Triton backend's split-K kernels (two-kernel, fused and TMA): every
split-K config offered for a decode-sized, a few-tile and a deep-K product, exact on
small-integer operands against float64 with and without alpha, beta and C and with B in
both layouts, run again on fresh operands; on random operands (float32 sums whose order
matters) the same bits from a CUDA graph's replays as from the first call; and the fused
kernels' tile counters: one buffer per stream, none allocated while capturing, left at zero,
and two streams running the same product at once both exact."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402

pytestmark = pytest.mark.gpu

#: a decode-sized product (ragged N and K), a few-tile one, and a deep-K one with ragged M
SHAPES = [(7, 1000, 4104), (1000, 1000, 1000), (130, 136, 8200)]


def _ints(shape, gen):
    return torch.randint(-2, 3, shape, generator=gen, device="cuda").to(torch.float16)


def _splitk_configs(a, b):
    from multibackend.registry import REGISTRY
    from multibackend.request import matmul_call

    offered = [c for c in REGISTRY.get("triton").configs(matmul_call(a, b).problem)
               if c.get("kind") in ("splitk", "tma_splitk")]
    assert offered, (tuple(a.shape), tuple(b.shape))
    return offered


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_splitk_config_exact_with_and_without_c(shape):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    for config in _splitk_configs(_ints((m, k), gen), _ints((k, n), gen)):
        for rep in range(3):  # fresh operands each run: nothing left over from the last
            a = _ints((m, k), gen)
            b = _ints((k, n), gen) if rep != 2 else _ints((n, k), gen).T
            c = _ints((m, n), gen) if rep == 1 else None
            alpha, beta = (0.5, -1.0) if rep == 1 else (1.0, None)
            d = mb.matmul(a, b, c, alpha=alpha, beta=beta, backend="triton", config=config)
            want = alpha * (a.double() @ b.double())
            if c is not None:
                want = want - c.double()
            assert torch.equal(d.double(), want.half().double()), (shape, config.name, rep)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_splitk_replayed_from_a_graph_gives_the_first_calls_bits(shape):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = (torch.rand((m, k), generator=gen, device="cuda") * 2 - 1).half()
    b = (torch.rand((k, n), generator=gen, device="cuda") * 2 - 1).half()
    config = _splitk_configs(a, b)[0]
    expected = mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
    out = torch.empty((m, n), device="cuda", dtype=torch.float32)
    for _ in range(3):
        mb.matmul(a, b, backend="triton", config=config, out=out, out_dtype=torch.float32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mb.matmul(a, b, backend="triton", config=config, out=out, out_dtype=torch.float32)
    for _ in range(10):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected), config.name


def test_fused_splitk_counters_per_stream_zero_and_exact_on_two_streams_at_once():
    from multibackend.registry import REGISTRY

    gen = torch.Generator(device="cuda").manual_seed(5)
    m, n, k = 5, 4096, 4096
    a, b = _ints((m, k), gen), _ints((k, n), gen)
    fused = [c for c in _splitk_configs(a, b)
             if c.get("FUSED") or (c.get("kind") == "tma_splitk" and c.get("SPLIT_K") > 1)]
    assert fused
    want = (a.double() @ b.double()).half()
    counters = REGISTRY.get("triton")._counters
    streams = [torch.cuda.Stream() for _ in range(2)]
    for config in fused:
        outs = [torch.empty((m, n), device="cuda", dtype=torch.float16) for _ in streams]
        torch.cuda.synchronize()
        for _ in range(20):  # the two streams' launches overlap on the GPU
            for stream, out in zip(streams, outs):
                with torch.cuda.stream(stream):
                    mb.matmul(a, b, backend="triton", config=config, out=out)
        torch.cuda.synchronize()
        for out in outs:
            assert torch.equal(out, want), config.name
    held = [counters._given[(torch.cuda.current_device(), s.cuda_stream)] for s in streams]
    assert held[0].data_ptr() != held[1].data_ptr()
    assert all(not t.any() for t in counters._given.values())
    before = dict(counters._given)
    graph, out = torch.cuda.CUDAGraph(), torch.empty((m, n), device="cuda", dtype=torch.float16)
    with torch.cuda.graph(graph):
        mb.matmul(a, b, backend="triton", config=fused[0], out=out)
    new = [key for key in counters._given if key not in before]
    pool = counters._pools[torch.cuda.current_device()][0]
    for key in new:  # the capture stream's counters: a chunk of the pool, no allocation
        t = counters._given[key]
        assert pool.data_ptr() <= t.data_ptr() < pool.data_ptr() + pool.numel() * 4
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
