"""GPU tier for the Triton backend's split-K kernels (two-kernel, fused and TMA): every
split-K config offered for a decode-sized, a few-tile and a deep-K product and for two
that get TMA tiles of two column blocks, exact on small-integer operands against float64
with and without alpha, beta and C and with B in both layouts, run again on fresh
operands; on random operands (float32 sums whose order matters), with torch's
deterministic algorithms on, the same bits from a CUDA graph's replays as from the first
call, and with them off the TMA kernel's two paired slices the same bits every run and
more slices, added by atomics, within a bound of the slice-order sum, graph replays
included; and the fused kernels' tile counters and
float32 sums: one buffer per stream, none allocated while capturing (sums spanning several
chunks of the pool included), left at zero, and two streams running the same product at once
both exact; and no call allocating (its stream's scratch kept)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402

pytestmark = pytest.mark.gpu

#: a decode-sized product (ragged N and K), a few-tile one, a deep-K one with ragged M, and
#: two offered TMA tiles of two column blocks (128x192 and 64x320, ragged M, N and K)
SPLIT_SHAPES = [(7, 1000, 4104), (1000, 1000, 1000), (130, 136, 8200)]
SHAPES = SPLIT_SHAPES + [(500, 6104, 1000), (250, 10200, 1032)]


def _ints(shape, gen):
    return torch.randint(-2, 3, shape, generator=gen, device="cuda").to(torch.float16)


def _splitk_configs(a, b):
    from multibackend.choose.registry import REGISTRY
    from multibackend.io.request import matmul_call

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


@pytest.fixture
def deterministic():
    """torch's deterministic algorithms on for the test (the TMA split-K kernel adds slices
    in slice order)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def _random(shape, gen):
    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).half()


def _graph_replays(a, b, config, runs: int = 10):
    """The float32 D of ``runs`` replays of a CUDA graph of the product, D poisoned before
    each."""
    out = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float32)
    for _ in range(3):
        mb.matmul(a, b, backend="triton", config=config, out=out, out_dtype=torch.float32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mb.matmul(a, b, backend="triton", config=config, out=out, out_dtype=torch.float32)
    found = []
    for _ in range(runs):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        found.append(out.clone())
    return found


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_splitk_replayed_from_a_graph_gives_the_first_calls_bits(shape, deterministic):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, b = _random((m, k), gen), _random((k, n), gen)
    for config in _splitk_configs(a, b)[:3]:
        expected = mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
        for out in _graph_replays(a, b, config):
            assert torch.equal(out, expected), config.name


@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_splitk_calls_allocate_nothing_per_call(shape, deterministic):
    """Repeated split-K calls of every config offered, D handed in, allocate no device
    memory: each finds its stream's scratch (where torch is asked for deterministic
    algorithms, a tensor made per call would be filled with NaN by a kernel of its own),
    and stays exact."""
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(6)
    a, b = _ints((m, k), gen), _ints((k, n), gen)
    want = (a.double() @ b.double()).half()
    for config in _splitk_configs(a, b):
        out = torch.empty((m, n), device="cuda", dtype=torch.float16)
        mb.matmul(a, b, backend="triton", config=config, out=out)
        torch.cuda.synchronize()
        made = torch.cuda.memory_stats()["allocation.all.allocated"]
        for _ in range(3):
            mb.matmul(a, b, backend="triton", config=config, out=out)
        torch.cuda.synchronize()
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == made, config.name
        assert torch.equal(out, want), config.name


@pytest.mark.parametrize("shape, tile", [((1000, 1000, 8200), (128, 128, 64, 2, 8, 7)),
                                         ((5, 4104, 4096), (16, 64, 256, 2, 4, 5))],
                         ids=["few_tile", "decode"])
def test_tma_splitk_in_two_slices_gives_the_same_bits_every_run(shape, tile):
    """Two slices paired (the first shorter), deterministic algorithms off: every call and
    every replay of a graph the same bits on random operands, within float32's bound for a
    K-long sum of the float64 product (K * 2^-24 * (|A| @ |B|)), counters left at zero."""
    from multibackend.backends.triton.configs import tma_splitk_tile
    from multibackend.choose.registry import REGISTRY

    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(9)
    a, b = _random((m, k), gen), _random((k, n), gen)
    config = tma_splitk_tile(*tile)
    first = mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
    bound = k * 2.0 ** -24 * (a.double().abs() @ b.double().abs())
    assert ((first.double() - a.double() @ b.double()).abs() <= bound).all()
    runs = [mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
            for _ in range(5)] + _graph_replays(a, b, config, runs=5)
    for out in runs:
        assert torch.equal(out, first), config.name
    assert all(not t.any() for t in REGISTRY.get("triton")._counters._given.values())


@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tma_splitk_atomic_sums_vary_only_within_float32_rounding(shape):
    """Slices added by atomics in the order they arrive: each result, graph replays too,
    within float32's rounding of the slice-order sum: |D - D_ordered| at most
    4 * slices * 2^-24 * (|A| @ |B|), with the float32 sums left at zero."""
    from multibackend.choose.registry import REGISTRY

    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(4)
    a, b = _random((m, k), gen), _random((k, n), gen)
    split = [c for c in _splitk_configs(a, b)
             if c.get("kind") == "tma_splitk" and c.get("SPLIT_K") > 1]
    assert split, shape
    magnitude = a.double().abs() @ b.double().abs()
    for config in split:
        torch.use_deterministic_algorithms(True)
        try:
            ordered = mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
        finally:
            torch.use_deterministic_algorithms(False)
        bound = 4 * config.get("SPLIT_K") * 2.0 ** -24 * magnitude
        runs = [mb.matmul(a, b, backend="triton", config=config, out_dtype=torch.float32)
                for _ in range(5)] + _graph_replays(a, b, config, runs=5)
        for out in runs:
            assert ((out.double() - ordered.double()).abs() <= bound).all(), config.name
    assert all(not t.any() for t in REGISTRY.get("triton")._sums._given.values())


def test_fused_splitk_counters_per_stream_zero_and_exact_on_two_streams_at_once():
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator(device="cuda").manual_seed(5)
    m, n, k = 5, 4096, 4096
    a, b = _ints((m, k), gen), _ints((k, n), gen)
    fused = [c for c in _splitk_configs(a, b)
             if c.get("FUSED") or (c.get("kind") == "tma_splitk" and c.get("SPLIT_K") > 1)]
    summed = [c for c in fused if c.get("kind") == "tma_splitk" and c.get("SPLIT_K") > 2]
    assert summed and len(fused) > len(summed)  # paired or pointer configs too
    want = (a.double() @ b.double()).half()
    counters, sums = REGISTRY.get("triton")._counters, REGISTRY.get("triton")._sums
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
    for buffers in (counters, sums):
        held = [buffers._given[(torch.cuda.current_device(), s.cuda_stream)] for s in streams]
        assert held[0].data_ptr() != held[1].data_ptr()
        assert all(not t.any() for t in buffers._given.values())
    before = {id(buffers): dict(buffers._given) for buffers in (counters, sums)}
    graph, out = torch.cuda.CUDAGraph(), torch.empty((m, n), device="cuda", dtype=torch.float16)
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):  # a stream met first here
        mb.matmul(a, b, backend="triton", config=summed[0], out=out)  # counters and sums
    for buffers in (counters, sums):
        new = [key for key in buffers._given if key not in before[id(buffers)]]
        assert new
        pool = buffers._pools[torch.cuda.current_device()][0]
        for key in new:  # the capture stream's share: a chunk of the pool, no allocation
            t = buffers._given[key]
            assert pool.data_ptr() <= t.data_ptr() < pool.data_ptr() + pool.numel() * 4
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_tma_splitk_graph_on_a_new_stream_takes_sums_spanning_chunks_from_the_pool(
        monkeypatch):
    """A product whose float32 sums need several chunks of the pool (1024 x 1024 in
    128-row tiles: four or more): a graph captured on a stream met first there takes them
    from the pool, already zero (a buffer of the stream's own would be zeroed by a memset
    node replayed with the graph on every run); its replays stay exact and leave the sums at
    zero."""
    from multibackend.backends.triton import configs as triton_module
    from multibackend.backends.triton.buffers import TileCounters
    from multibackend.choose.registry import REGISTRY

    backend = REGISTRY.get("triton")
    sums = TileCounters(triton_module.SUMS_CHUNK, triton_module.SUMS_CHUNKS, "float32")
    monkeypatch.setattr(backend, "_sums", sums)  # pools no other test has drawn on
    monkeypatch.setattr(backend, "_counters", TileCounters())
    m, n, k = 1024, 1024, 16384
    gen = torch.Generator(device="cuda").manual_seed(8)
    a, b = _ints((m, k), gen), _ints((k, n), gen)
    want = (a.double() @ b.double()).half()

    def need(config) -> int:
        bm, bn = config.get("BLOCK_M"), config.get("BLOCK_N")
        return -(-m // bm) * -(-n // bn) * bm * bn

    wide = sorted((c for c in _splitk_configs(a, b) if c.get("kind") == "tma_splitk"
                   and c.get("SPLIT_K") > 2 and need(c) > triton_module.SUMS_CHUNK),
                  key=need, reverse=True)  # the first capture takes the largest share
    assert wide
    device, stream = torch.cuda.current_device(), torch.cuda.Stream()
    out = torch.empty((m, n), device="cuda", dtype=torch.float16)
    for config in wide:
        mb.matmul(a, b, backend="triton", config=config, out=out)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            mb.matmul(a, b, backend="triton", config=config, out=out)
        pool, taken = sums._pools[device][0], sums._given[(device, stream.cuda_stream)]
        assert taken.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()
        assert taken.numel() >= need(config), config.name
        for _ in range(3):
            out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, want), config.name
        assert not taken.any()
