"""CPU tier for the Triton backend's split-K kernels, two-kernel and fused: exact results in
Triton's interpreter on small-integer operands against float64 (ragged M, N and K, every
layout, alpha, beta and C, a float32 D, batched and broadcast operands, bf16, a staged
misaligned product, a scratch workspace full of NaN), the same bits run after run with the tile
counters left at zero, where the configs (the TMA split-K ones too) are offered and which
split they choose, the bound launch, and every kernel compiled ahead of time for sm_90 with
its tensor-core instructions, loads and counter atomic found in the PTX.

Run as a script (``python tests/test_triton_splitk.py {few|skinny|fused|tma_*}
{float16|bfloat16}``), it compiles a split-K kernel for sm_90 with no GPU and prints what its
PTX holds as JSON: the tests run it in a child process, without the interpreter switch.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import multibackend as mb
from multibackend.core.problem import synthetic
from multibackend.io.request import matmul_call
from multibackend.verify import reference
from multibackend.verify.crosscheck import poison

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="interpreter tests run where there is no GPU")

#: the interpreter's split-K configs: 16x32x32 tiles, K cut into at most 3 slices, added up
#: by a second kernel or, fused, by the last program of each tile
CONFIG = "splitk_16x32x32_s3_w4_st1"
FUSED = "splitk_fused_16x32x32_s3_w4_st1"
#: K = 48: a multiple of 16, not of BLOCK_K (32): its tail is kept in bounds by the K mask only
SHAPES = [(m, n, k) for m in (1, 3, 17) for n in (5, 33, 64) for k in (31, 48, 96, 130)]
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]


def _ints(shape, gen, dtype=torch.float16, layout: str = "row"):
    """Small integers in [-4, 4] (exact in every float format, and so is every sum of their
    products here), stored row- or column-major."""
    stored = shape if layout == "row" else shape[:-2] + (shape[-1], shape[-2])
    t = torch.randint(-4, 5, stored, generator=gen).to(dtype)
    return t if layout == "row" else t.transpose(-1, -2)


def _reference(a, b, c=None, alpha=1.0, beta=0.0):
    d = alpha * (a.double() @ b.double())
    return d + beta * c.double() if c is not None else d


@pytest.fixture(params=[CONFIG, FUSED], ids=["two_kernels", "fused"])
def config(request):
    return request.param


def _splitk(a, b, c=None, *, config=CONFIG, out_dtype=None, **kw):
    """The product through an interpreter split-K config, D poisoned beforehand."""
    shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    out = torch.empty(shape, dtype=out_dtype or a.dtype)
    poison(out)
    d = mb.matmul(a, b, c, out=out, out_dtype=out_dtype, backend="triton", config=config, **kw)
    assert d is out
    return d


def _assert_exact(d, ref):
    """D equals the float64 result rounded once to D's dtype (the kernels sum exactly in
    float32 and round once)."""
    expected = ref.to(d.dtype)
    assert torch.equal(d, expected), (d - expected).abs().max()


@interpreter_only
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_splitk_exact_on_ragged_shapes(shape, config):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 10007 + n * 101 + k)
    a_layout, b_layout = LAYOUTS[SHAPES.index(shape) % len(LAYOUTS)]
    a, b = _ints((m, k), gen, layout=a_layout), _ints((k, n), gen, layout=b_layout)
    _assert_exact(_splitk(a, b, config=config), _reference(a, b))


@interpreter_only
@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda v: "-".join(v))
def test_splitk_every_layout_with_alpha_beta_and_c(layouts, config):
    gen = torch.Generator().manual_seed(len(layouts[0]) * 3 + len(layouts[1]))
    a = _ints((17, 130), gen, layout=layouts[0])
    b = _ints((130, 33), gen, layout=layouts[1])
    c = _ints((17, 33), gen)
    _assert_exact(_splitk(a, b, c, alpha=-1.5, beta=0.25, config=config),
                  _reference(a, b, c, -1.5, 0.25))
    _assert_exact(_splitk(a, b, alpha=2.0, config=config), _reference(a, b, alpha=2.0))


@interpreter_only
def test_splitk_float32_d_and_bfloat16(config):
    gen = torch.Generator().manual_seed(21)
    a, b = _ints((3, 96), gen), _ints((96, 64), gen, layout="col")
    d = _splitk(a, b, out_dtype=torch.float32, config=config)
    assert d.dtype == torch.float32
    _assert_exact(d, _reference(a, b))
    a, b, c = (_ints((17, 130), gen, torch.bfloat16), _ints((130, 33), gen, torch.bfloat16),
               _ints((17, 33), gen, torch.bfloat16))
    _assert_exact(_splitk(a, b, c, alpha=0.5, beta=-2.0, config=config),
                  _reference(a, b, c, 0.5, -2.0))
    # random values into float32: within float32's bound, which 16-bit partial sums exceed
    a = (torch.rand((17, 130), generator=gen, dtype=torch.float64) * 2 - 1).half()
    b = (torch.rand((130, 33), generator=gen, dtype=torch.float64) * 2 - 1).half()
    call = matmul_call(a, b, out_dtype="float32")
    cmp = reference.compare(call.problem, _splitk(a, b, out_dtype=torch.float32, config=config),
                            reference.reference_matmul(a, b))
    assert cmp.ok, cmp.detail


@interpreter_only
def test_splitk_float32_operands(config):
    gen = torch.Generator().manual_seed(22)
    a, b = _ints((17, 130), gen, torch.float32), _ints((130, 5), gen, torch.float32, "col")
    _assert_exact(_splitk(a, b, precision="ieee", config=config), _reference(a, b))


@interpreter_only
def test_splitk_batched_with_a_broadcast_b(config):
    gen = torch.Generator().manual_seed(23)
    a = _ints((3, 17, 130), gen)
    b = _ints((130, 33), gen, layout="col")
    c = _ints((3, 17, 33), gen)
    _assert_exact(_splitk(a, b, c, alpha=-1.0, beta=1.0, config=config),
                  _reference(a, b, c, -1.0, 1.0))
    b3 = _ints((3, 130, 33), gen)
    _assert_exact(_splitk(a, b3, config=config), _reference(a, b3))


@interpreter_only
@pytest.mark.parametrize("c_kind", ["matrix", "bias", "matrix_rows_1004"])
def test_splitk_with_c_in_16_byte_units_the_specialization_hides(config, c_kind):
    """N = 40 and C's rows 8 halves apart but not 16 (D_UNIT 8: N and the strides of C and
    D rounded down to it in the epilogue), or C's rows 1004 apart (no unit): exact."""
    from multibackend.backends.triton.operands import d_unit

    gen = torch.Generator().manual_seed(31)
    a, b = _ints((17, 130), gen), _ints((130, 40), gen)
    c = {"matrix": lambda: _ints((17, 40), gen),
         "bias": lambda: _ints((40,), gen).expand(17, 40),
         "matrix_rows_1004": lambda: _ints((17, 1004), gen)[:, :40]}[c_kind]()
    d = torch.empty((17, 40), dtype=torch.float16)
    assert d_unit(matmul_call(a, b).problem, d, c) == (1 if c_kind.endswith("1004") else 8)
    _assert_exact(_splitk(a, b, c, alpha=-1.0, beta=0.5, config=config),
                  _reference(a, b, c, -1.0, 0.5))


@interpreter_only
def test_splitk_staged_misaligned_product(config):
    """A misaligned product's staged split-K config: the copies, then both passes."""
    gen = torch.Generator().manual_seed(24)
    a = _ints((17, 131 + 3), gen)[:, 3:]  # rows off the 16-byte grid
    b = _ints((131, 33), gen)
    assert matmul_call(a, b).problem.misaligned
    d = mb.matmul(a, b, backend="triton", config="staged:" + config)
    _assert_exact(d, _reference(a, b))


def _poison_scratch():
    """Fill every float32 scratch buffer the Triton backend keeps with NaN."""
    from multibackend.choose.registry import REGISTRY

    kept = REGISTRY.get("triton")._scratch._given.values()
    assert kept
    for t in kept:
        t.fill_(float("nan"))


@interpreter_only
def test_splitk_never_reads_what_it_did_not_write(config):
    """The first pass (fused: each program) writes every element of the workspace it reads:
    the stream's scratch, full of NaN when the call comes, still gives the exact result,
    and the call after it finds the same scratch (none made per call)."""
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator().manual_seed(25)
    a, b = _ints((2, 17, 130), gen), _ints((2, 130, 33), gen)
    _splitk(a, b, config=config)
    _poison_scratch()
    kept = {key: t.data_ptr() for key, t in REGISTRY.get("triton")._scratch._given.items()}
    _assert_exact(_splitk(a, b, config=config), _reference(a, b))
    assert {key: t.data_ptr() for key, t in REGISTRY.get("triton")._scratch._given.items()
            } == kept


def test_stream_scratch_is_kept_per_stream_grows_by_doubling_and_is_left_unfilled(
        monkeypatch):
    """One buffer per stream, returned again while large enough; a larger need doubles it
    (the outgrown one kept for graphs that address it), up to the cap, past which each
    launch gets its own; made with torch's deterministic NaN fill off, which is restored."""
    from multibackend.backends.triton.buffers import StreamScratch

    cpu, scratch = torch.device("cpu"), StreamScratch(keep_bytes=4 * 1000)
    first = scratch.get(cpu, 1, 100)
    assert first.dtype == torch.float32 and first.numel() == 100
    assert scratch.get(cpu, 1, 60) is first and scratch.get(cpu, 2, 60) is not first
    grown = scratch.get(cpu, 1, 150)
    assert grown.numel() == 200 and scratch.get(cpu, 1, 200) is grown
    assert any(t is first for t in scratch._outgrown)
    assert scratch.get(cpu, 1, 900).numel() == 900
    capped = scratch._given[(-1, 1)]
    own = scratch.get(cpu, 1, 1001)
    assert own.numel() == 1001 and scratch._given[(-1, 1)] is capped
    assert scratch.get(cpu, 1, 1001) is not own
    flags, empty = [], torch.empty

    def recording_empty(*args, **kwargs):
        flags.append(torch.utils.deterministic.fill_uninitialized_memory)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        scratch.get(cpu, 3, 10)
        scratch.get(cpu, 3, 2000)
    finally:
        torch.use_deterministic_algorithms(before)
    assert flags == [False, False]
    assert torch.utils.deterministic.fill_uninitialized_memory


def test_tile_counters_give_each_stream_the_pool_chunks_it_needs_zeroed_once():
    """Each stream's share is carved from one zeroed pool per device: as many consecutive
    chunks as its count needs, a larger share when it outgrows one (at least twice as large
    where the pool has that left; the old kept), returned again while large enough; only a
    need beyond what the pool has left is made on its own."""
    from multibackend.backends.triton.buffers import TileCounters

    cpu, counters = torch.device("cpu"), TileCounters(chunk=100, chunks=12, dtype="float32")
    first = counters.get(cpu, 1, 60)
    pool = counters._pools[-1][0]
    assert pool.numel() == 1200 and not pool.any()

    def chunks_of(t):
        offset = (t.data_ptr() - pool.data_ptr()) // 4
        assert 0 <= offset < pool.numel() and t.untyped_storage().data_ptr() == \
            pool.untyped_storage().data_ptr()
        return offset // 100, t.numel() // 100

    assert chunks_of(first) == (0, 1) and counters.get(cpu, 1, 100) is first
    several = counters.get(cpu, 2, 150)
    assert chunks_of(several) == (1, 2)
    doubled = counters.get(cpu, 1, 101)  # one chunk outgrown: two taken
    assert chunks_of(doubled) == (3, 2) and counters.get(cpu, 1, 200) is doubled
    grown = counters.get(cpu, 2, 301)
    assert chunks_of(grown) == (5, 4) and counters.get(cpu, 2, 400) is grown
    assert any(t is first for t in counters._outgrown)
    assert any(t is several for t in counters._outgrown)
    last = counters.get(cpu, 1, 201)  # three wanted; twice its two is past the pool
    assert chunks_of(last) == (9, 3)
    own = counters.get(cpu, 3, 101)  # two chunks wanted, none left
    assert own.numel() == 101 and not own.any()
    assert own.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    assert counters.get(cpu, 2, 400) is grown and counters.get(cpu, 3, 50) is own


@interpreter_only
def test_splitk_is_deterministic(config):
    """The slices are added in one order (fused: by whichever program of a tile arrives
    last, always in slice order), so a fixed config gives the same bits on every run (on
    operands whose sums do round); the fused kernel leaves its tile counters at zero."""
    gen = torch.Generator().manual_seed(26)
    a = (torch.rand((17, 130), generator=gen) * 2 - 1).half()
    b = (torch.rand((130, 64), generator=gen) * 2 - 1).half()
    first = _splitk(a, b, out_dtype=torch.float32, config=config)
    second = _splitk(a, b, out_dtype=torch.float32, config=config)
    assert torch.equal(first, second)
    from multibackend.choose.registry import REGISTRY

    counters = REGISTRY.get("triton")._counters._given.values()
    assert all(not t.any() for t in counters)


@interpreter_only
def test_splitk_refuses_a_product_it_cannot_accumulate():
    """A split-K Config handed in directly for int8 operands: an error naming the config
    and the rule, nothing launched."""
    from multibackend.core.config import Config
    from multibackend.core.errors import InvalidArgument

    config = Config.of(CONFIG, kind="splitk", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=3,
                       num_warps=4, num_stages=1)
    a, b = torch.ones((3, 40), dtype=torch.int8), torch.ones((40, 5), dtype=torch.int8)
    with pytest.raises(InvalidArgument, match=f"config is '{CONFIG}': split-K runs"):
        mb.matmul(a, b, backend="triton", config=config)


#: the TMA split-K kernel in the interpreter: 16x32x32 tiles, K in at most 4 slices
TMA_TILE = (16, 32, 32, 4, 4, 1)
#: in 2 slices (paired)
TMA_PAIR_TILE = (16, 32, 32, 2, 4, 1)
#: and unsplit 16x48x32 tiles: two column blocks, 32 and 16 wide
TMA_WIDE_TILE = (16, 48, 32, 1, 4, 1)
#: products whose rows lie on the 16-byte grid, ragged against the tile (M, N, K); K = 1000
#: paired: slices of 14 and 18 BLOCK_K steps
TMA_SHAPES = [(1, 40, 256), (17, 72, 200), (33, 8, 136), (5, 96, 72), (9, 24, 1000)]


@pytest.fixture(params=[False, True], ids=["atomic", "slice_order"])
def deterministic(request):
    """torch's deterministic-algorithms switch, set for the test: off, the TMA split-K
    kernel sums more than two slices by atomics; on, it adds them in slice order (two are
    paired either way)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(before)


def _left_at_zero() -> bool:
    """The Triton backend's tile counters and float32 sums are all zero."""
    from multibackend.choose.registry import REGISTRY

    backend = REGISTRY.get("triton")
    held = [*backend._counters._given.values(), *backend._sums._given.values()]
    return all(not t.any() for t in held)


def _tma_splitk_call(a, b, c=None, *, tile=TMA_TILE, **kw):
    from multibackend.backends.triton.configs import tma_splitk_tile

    return _splitk(a, b, c, config=tma_splitk_tile(*tile), **kw)


@pytest.fixture(params=[TMA_TILE, TMA_PAIR_TILE, TMA_WIDE_TILE],
                ids=["split", "paired", "two_blocks"])
def tma_tile(request):
    return request.param


@interpreter_only
@pytest.mark.parametrize("shape", TMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_tma_splitk_exact_on_ragged_shapes(shape, deterministic, tma_tile):
    """The TMA split-K kernel (descriptors zero-filling past M, N and K), B row- and
    column-major, split or in tiles of two column blocks: exact either way the slices are
    added, counters and sums left at zero."""
    m, n, k = shape
    gen = torch.Generator().manual_seed(m * 7919 + n * 31 + k)
    for layout in ("row", "col"):
        a, b = _ints((m, k), gen), _ints((k, n), gen, layout=layout)
        _assert_exact(_tma_splitk_call(a, b, tile=tma_tile), _reference(a, b))
    assert _left_at_zero()


@interpreter_only
def test_tma_splitk_in_slice_order_never_reads_what_it_did_not_write():
    """Slices added in order (torch asked for deterministic algorithms): every slice's
    partial is written before the tile's last program reads them all, so the stream's
    scratch full of NaN when the call comes still gives the exact result."""
    gen = torch.Generator().manual_seed(30)
    a, b = _ints((17, 200), gen), _ints((200, 72), gen)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        _tma_splitk_call(a, b)
        _poison_scratch()
        _assert_exact(_tma_splitk_call(a, b), _reference(a, b))
    finally:
        torch.use_deterministic_algorithms(before)
    assert _left_at_zero()


@interpreter_only
def test_tma_splitk_paired_never_reads_what_it_did_not_write(deterministic):
    """Two slices paired: the partial handed over is written before the other program of
    its tile reads it, so the stream's scratch full of NaN when the call comes still gives
    the exact result, and the counters are left at zero."""
    gen = torch.Generator().manual_seed(31)
    a, b = _ints((17, 1000), gen), _ints((1000, 72), gen, layout="col")
    _tma_splitk_call(a, b, tile=TMA_PAIR_TILE)
    _poison_scratch()
    _assert_exact(_tma_splitk_call(a, b, tile=TMA_PAIR_TILE), _reference(a, b))
    assert _left_at_zero()


@pytest.mark.parametrize("splits, deterministic_, want", [
    (1, False, "ordered"), (2, False, "pair"), (2, True, "pair"), (3, False, "atomic"),
    (3, True, "ordered"), (64, False, "atomic")])
def test_tma_reduction_pairs_two_slices_and_sums_more_by_atomics_unless_deterministic(
        splits, deterministic_, want):
    from multibackend.backends.triton.operands import tma_reduction

    assert tma_reduction(splits, deterministic_) == want


@interpreter_only
def test_tma_splitk_alpha_beta_c_and_float32_d(deterministic, tma_tile):
    """The epilogue of the program that finishes a tile (of both column blocks). (bf16
    runs on the GPU only: the interpreter's bf16 dot is wrong and this kernel does not
    upcast.)"""
    gen = torch.Generator().manual_seed(27)
    a, b, c = _ints((17, 200), gen), _ints((200, 72), gen, layout="col"), _ints((17, 72), gen)
    _assert_exact(_tma_splitk_call(a, b, c, alpha=-1.5, beta=0.25, tile=tma_tile),
                  _reference(a, b, c, -1.5, 0.25))
    _assert_exact(_tma_splitk_call(a, b, alpha=2.0, out_dtype=torch.float32, tile=tma_tile),
                  _reference(a, b, alpha=2.0))
    assert _left_at_zero()


@interpreter_only
@pytest.mark.parametrize("operands", [((2, 17, 136), (136, 40)), ((136, 24), (136, 40)),
                                      ((17, 136), (136, 36))],
                         ids=["batched", "a_column_major", "b_rows_off_the_grid"])
def test_tma_splitk_on_operands_the_tma_unit_cannot_fetch_runs_the_pointer_kernel(operands,
                                                                                 tma_tile):
    """A TMA split-K Config handed in for a batched product, a column-major A or rows off
    the 16-byte grid: the config's split through plain loads (in tiles of its first column
    block), exact."""
    gen = torch.Generator().manual_seed(28)
    a, b = _ints(operands[0], gen), _ints(operands[1], gen)
    if operands[0] == (136, 24):
        a = a.T
    _assert_exact(_tma_splitk_call(a, b, tile=tma_tile), _reference(a, b))
    assert _left_at_zero()


@interpreter_only
def test_tma_splitk_refuses_to_split_a_tile_of_two_blocks():
    from multibackend.core.errors import InvalidArgument

    gen = torch.Generator().manual_seed(29)
    a, b = _ints((17, 256), gen), _ints((256, 72), gen)
    with pytest.raises(InvalidArgument, match="a tile 48 wide .* runs unsplit, not in 4 "
                                              "slices"):
        _tma_splitk_call(a, b, tile=(16, 48, 32, 4, 4, 1))


def test_width_blocks_are_a_power_of_two_and_a_smaller_one():
    from multibackend.backends.triton.configs import width_blocks

    assert [width_blocks(w) for w in (64, 80, 96, 160, 192, 320)] == [
        (64, 0), (64, 16), (64, 32), (128, 32), (128, 64), (256, 64)]
    with pytest.raises(ValueError, match="is 112 wide: a tile's width is a power of two or "
                                         "the sum of two"):
        width_blocks(112)


def _gpu_configs(monkeypatch, problem):
    from multibackend.choose.registry import REGISTRY

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the configs of the GPU
    backend = REGISTRY.get("triton")
    return backend, [c for c in backend.configs(problem) if c.get("kind") == "splitk"]


def test_splitk_offered_for_skinny_and_few_tile_products_only(monkeypatch):
    skinny, few, large = (synthetic(8, 4096, 4096), synthetic(1024, 1024, 1024),
                          synthetic(8192, 8192, 8192))
    backend, offered = _gpu_configs(monkeypatch, skinny)
    assert offered
    for config in offered:
        assert re.fullmatch(r"splitk_(fused_)?\d+x\d+x\d+_s\d+_w\d+_st\d+", config.name), \
            config.name
        assert config.get("BLOCK_M") == 16 and config.get("SPLIT_K") > 1
    shortlist = backend._shortlist(skinny, 132)
    assert [c for c in shortlist if c.get("kind") == "splitk"] == offered[:2]
    assert _gpu_configs(monkeypatch, few)[1]
    assert [c for c in backend._shortlist(few, 132) if c.get("kind") == "splitk"]
    assert not _gpu_configs(monkeypatch, large)[1]
    assert not [c for c in backend._shortlist(large, 132) if c.get("kind") == "splitk"]


@pytest.mark.parametrize("problem", [
    synthetic(8, 4096, 4096, "int8"), synthetic(8, 4096, 4096, "float64"),
    synthetic(8, 4096, 4096, "float8_e4m3fn", out_dtype="float16"),
    synthetic(8, 4096, 4096, acc="float16")], ids=["int8", "float64", "fp8", "f16acc"])
def test_splitk_not_offered_without_float32_accumulation(monkeypatch, problem):
    assert not _gpu_configs(monkeypatch, problem)[1]


def test_fused_splitk_offered_first_and_only_for_few_slices(monkeypatch):
    """Every tile is offered fused (one kernel) first where it has at most FUSED_MAX_SPLITS
    slices, and with the two-kernel reduction after; a deep-K product of one or two tiles
    cut into more slices than that gets the two-kernel reduction only."""
    from multibackend.backends.triton.configs import FUSED_MAX_SPLITS

    _, offered = _gpu_configs(monkeypatch, synthetic(8, 4096, 4096))
    fused = [c for c in offered if c.get("FUSED")]
    assert fused and offered[:len(fused)] == fused
    two_pass = offered[len(fused):]
    assert {c.name.replace("splitk_fused_", "splitk_") for c in fused} <= {c.name for c in two_pass}
    _, deep = _gpu_configs(monkeypatch, synthetic(128, 128, 65536))
    assert deep and all(c.get("SPLIT_K") > FUSED_MAX_SPLITS and not c.get("FUSED") for c in deep)


def _tma_splitk(monkeypatch, problem):
    from multibackend.choose.registry import REGISTRY

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend = REGISTRY.get("triton")
    return backend, [c for c in backend.configs(problem) if c.get("kind") == "tma_splitk"]


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (7, 1024, 4096), (24, 4096, 4096),
                                   (48, 14336, 4096), (128, 4096, 4096), (768, 768, 768),
                                   (2048, 2048, 2048), (256, 512, 32768), (512, 512, 512),
                                   (96, 80, 256), (1, 512, 1024)])
def test_tma_splitk_offered_first_for_skinny_and_few_tile_products(monkeypatch, shape):
    """Aligned 16-bit products with at most 64 rows get tiles of their rows rounded up to 16, 32 or
    64 (17-32 rows 16-row tiles too), wider ones the wide tiles; each split fills at most one
    wave with slices of at least TMA_SPLITK_MIN_STEPS steps, none empty; they come first among
    the tiles and their first TMA_SPLITK_SHORTLIST are in first-call autotuning's shortlist."""
    import triton

    from multibackend.backends.triton.configs import (
        TMA_SPLITK_MAX_SPLITS,
        TMA_SPLITK_MIN_STEPS,
        TMA_SPLITK_SHORTLIST,
    )

    m, n, k = shape
    problem = synthetic(m, n, k)
    backend, offered = _tma_splitk(monkeypatch, problem)
    assert offered and backend.configs(problem)[1:len(offered) + 1] == offered
    for config in offered:
        assert re.fullmatch(r"tma_splitk_\d+x\d+x\d+_s\d+_w\d+_st\d+", config.name)
        bm, bn, bk = (config.get(key) for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        if m <= 64:
            rows = max(16, triton.next_power_of_2(m))
            assert bm == rows or (rows == 32 and bm == 16), config.name
        split, steps = config.get("SPLIT_K"), triton.cdiv(k, bk)
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        assert 1 <= split <= TMA_SPLITK_MAX_SPLITS and (split == 1 or tiles * split <= 132)
        per = triton.cdiv(steps, split)
        assert triton.cdiv(steps, per) == split
        assert split == 1 or per >= TMA_SPLITK_MIN_STEPS, config.name
    if 16 < m <= 32:
        assert {c.get("BLOCK_M") for c in offered} == {16, 32}
    shortlist = backend._shortlist(problem, 132)
    assert shortlist[:TMA_SPLITK_SHORTLIST] == offered[:TMA_SPLITK_SHORTLIST]


@pytest.mark.parametrize("problem", [
    synthetic(8192, 8192, 8192), synthetic(1, 4096, 4096, "float32"),
    synthetic(1, 4096, 4096, "int8"), synthetic(1, 4096, 4096, batch=2),
    synthetic(8, 4096, 4096, a_layout="col"), synthetic(1, 4095, 4096),
    synthetic(1, 4096, 4096, cc=(8, 0)), synthetic(1, 4096, 4096, acc="float16")],
    ids=["large", "float32", "int8", "batched", "a_col", "misaligned", "sm80", "f16acc"])
def test_tma_splitk_not_offered_where_the_tma_kernels_do_not_run(monkeypatch, problem):
    assert not _tma_splitk(monkeypatch, problem)[1]


@pytest.mark.parametrize("shape, strides, want", [
    ((1, 40), (1, 1), [40, 1]), ((1, 37), (999, 1), [40, 1]), ((5, 1), (8, 3), [8, 1]),
    ((64, 128), (136, 1), [136, 1])])
def test_tma_descriptor_of_one_row_or_column_gets_strides_the_unit_takes(shape, strides,
                                                                         want):
    """A single row's row stride and a single column's column stride are never used: the
    descriptor states ones the TMA unit accepts; any other stride is kept."""
    from multibackend.backends.triton.operands import _descriptor

    base = torch.zeros(64 * 136, dtype=torch.float16)
    desc = _descriptor(base.as_strided(shape, strides), [16, 32])
    assert list(desc.shape) == list(shape) and list(desc.strides) == want
    assert list(desc.block_shape) == [16, 32]


def test_tma_split_choice():
    from multibackend.backends.triton.configs import tma_split

    assert tma_split(64, 16) == 2  # 1x4096x4096 in 16x64x256 tiles: one wave
    assert tma_split(16, 32) == 8  # N = 1024 in 16x64 tiles
    assert tma_split(96, 32) == 1  # N = 6144: a split would pass one wave
    assert tma_split(2, 512) == 64  # deep K: at most TMA_SPLITK_MAX_SPLITS slices
    assert tma_split(4, 512) == 32  # 128x128x65536 in 64x64x128 tiles: one wave
    assert tma_split(4, 6) == 3  # K allows slices of 2 steps
    assert tma_split(4, 7) == 3  # made exact: 3, 3 and 1 steps
    assert tma_split(8, 64, sms=64) == 8  # the count of multiprocessors given


def test_tma_stages_fill_shared_memory_on_one_wave_only():
    """One wave of programs: the deepest pipeline TMA_SPLITK_SMEM holds (at most
    TMA_SPLITK_MAX_STAGES); a larger grid: TMA_SPLITK_WAVES_STAGES, fewer where they do not
    fit; never under two."""
    from multibackend.backends.triton.configs import (
        TMA_SPLITK_MAX_STAGES,
        TMA_SPLITK_SMEM,
        TMA_SPLITK_WAVES_STAGES,
        tma_stages,
    )

    assert tma_stages(64, 64, 128, 128) == 7  # 32 KB a stage
    assert tma_stages(128, 128, 64, 132) == 7
    assert tma_stages(64, 128, 64, 64) == 9
    assert tma_stages(16, 64, 128, 96) == min(TMA_SPLITK_MAX_STAGES, 11)
    assert tma_stages(64, 64, 128, 133) == TMA_SPLITK_WAVES_STAGES
    assert tma_stages(16, 256, 64, 501) == TMA_SPLITK_WAVES_STAGES
    assert tma_stages(128, 256, 64, 96) == 4
    assert tma_stages(64, 256, 128, 1000) == 2  # 80 KB a stage: two fit
    assert tma_stages(64, 64, 128, 64, sms=32) == TMA_SPLITK_WAVES_STAGES  # two waves here
    for bm, bn, bk in [(16, 64, 256), (64, 256, 64), (128, 256, 64), (64, 64, 256)]:
        for programs in (1, 132, 1000):
            stages = tma_stages(bm, bn, bk, programs)
            assert 2 <= stages and (stages == 2 or stages * (bm + bn) * bk * 2
                                    <= TMA_SPLITK_SMEM), (bm, bn, bk, programs)


@pytest.mark.parametrize("shape, first", [
    ((128, 4096, 4096), "tma_splitk_64x64x128_s1_w4_st7"),
    ((512, 4096, 4096), "tma_splitk_128x128x64_s1_w8_st7"),
    ((1024, 1024, 1024), "tma_splitk_64x128x64_s1_w4_st9"),
    ((512, 6144, 4096), "tma_splitk_128x192x64_s1_w4_st5"),
    ((256, 10240, 8192), "tma_splitk_64x320x64_s1_w4_st4"),
    ((512, 10240, 8192), "tma_splitk_128x320x32_s1_w8_st8"),
    ((1536, 1536, 1536), "tma_splitk_64x320x64_s1_w4_st4"),
    ((1, 14336, 4096), "tma_splitk_16x128x128_s1_w4_st6"),
    ((32, 4096, 4096), "tma_splitk_16x64x256_s1_w4_st5"),
    ((32, 28672, 4096), "tma_splitk_32x256x64_s1_w4_st6"),
    ((1, 128256, 4096), "tma_splitk_16x256x64_s1_w4_st3"),
    ((128, 128, 65536), "tma_splitk_64x64x128_s32_w4_st7")])
def test_tma_splitk_ranks_the_fullest_single_wave_first(monkeypatch, shape, first):
    """Tiles that fit one wave unsplit come first, the most tiles first; then the others,
    the fewest tiles first; each with its split and :func:`tma_stages`' pipeline."""
    import triton

    m, n, _ = shape
    _, offered = _tma_splitk(monkeypatch, synthetic(*shape))
    assert offered[0].name == first
    tiles = [triton.cdiv(m, c.get("BLOCK_M")) * triton.cdiv(n, c.get("BLOCK_N"))
             for c in offered]
    single = [t for t in tiles if t <= 132]
    assert tiles == sorted(single, reverse=True) + sorted(t for t in tiles if t > 132)


@pytest.mark.parametrize("shape, widths", [
    ((512, 6144, 4096), [192]), ((256, 10240, 8192), [320, 192]),
    ((1536, 1536, 1536), [320, 192]),
    ((512, 4096, 4096), []), ((2048, 2048, 2048), []), ((128, 4096, 4096), []),
    ((4096, 4096, 4096), [])])
def test_tma_splitk_offers_two_block_tiles_only_for_a_fuller_single_wave(monkeypatch, shape,
                                                                         widths):
    """A tile of two column blocks (192, 320 wide) is offered, unsplit, only where its grid
    fits one wave and fills it fuller than any power-of-two tile's does (512x6144 in 128
    tiles of 128x192, against 96 of 128x256); where a power-of-two tile fills a wave as
    well (512x4096 in 128 tiles of 128x128), or none fits one, it is not."""
    import triton

    from multibackend.backends.triton.configs import width_blocks

    m, n, _ = shape
    _, offered = _tma_splitk(monkeypatch, synthetic(*shape))
    tiles = {c.name: triton.cdiv(m, c.get("BLOCK_M")) * triton.cdiv(n, c.get("BLOCK_N"))
             for c in offered}
    two = [c for c in offered if width_blocks(c.get("BLOCK_N"))[1]]
    assert [c.get("BLOCK_N") for c in two] == widths
    fullest = max((t for c in offered if not width_blocks(c.get("BLOCK_N"))[1]
                   for t in [tiles[c.name]] if t <= 132), default=0)
    for config in two:
        assert config.get("SPLIT_K") == 1 and fullest < tiles[config.name] <= 132, config.name


@pytest.mark.parametrize("shape, twins", [((1, 4096, 4096), True), ((256, 1024, 4096), True),
                                           ((64, 1024, 4096), False),
                                           ((128, 128, 65536), False)])
def test_tma_splitk_offers_a_split_tile_unsplit_where_it_fills_a_quarter_wave(monkeypatch,
                                                                              shape, twins):
    """A tile :func:`tma_split` cuts in slices comes again unsplit, right after, where its
    tiles fill TMA_SPLITK_UNSPLIT_WAVE of a wave (64 tiles: both measured best somewhere);
    with fewer tiles only split."""
    import triton

    from multibackend.backends.triton.configs import TMA_SPLITK_UNSPLIT_WAVE

    m, n, _ = shape
    _, offered = _tma_splitk(monkeypatch, synthetic(*shape))
    names = [c.name for c in offered]
    found = 0
    for i, config in enumerate(offered):
        tiles = triton.cdiv(m, config.get("BLOCK_M")) * triton.cdiv(n, config.get("BLOCK_N"))
        if config.get("SPLIT_K") > 1 and tiles >= TMA_SPLITK_UNSPLIT_WAVE * 132:
            twin = re.sub(r"_s\d+_", "_s1_", config.name)
            twin = re.sub(r"_st\d+$", f"_st{offered[i + 1].get('num_stages')}", twin)
            assert names[i + 1] == twin, names
            found += 1
    assert bool(found) == twins, names


def test_tma_splitk_tiles_at_their_deepest_fit_an_h100():
    """Every tile the TMA split-K candidates use, at the deepest pipeline
    :func:`tma_stages` gives it, compiles for sm_90 within an H100's shared memory: wgmma
    for 64 rows and more, mma.sync for fewer."""
    from multibackend.backends.triton.configs import TMA_SPLITK_NARROW, TMA_SPLITK_WIDE, tma_stages

    tiles = [(bm, bn, bk, warps) for bm in (16, 32, 64) for bn, bk, warps in TMA_SPLITK_NARROW]
    tiles += list(TMA_SPLITK_WIDE)
    tiles = [tile + (tma_stages(*tile[:3], 1),) for tile in dict.fromkeys(tiles)]
    for tile, info in zip(tiles, _aot_tiles("tma_few", "float16", tiles)):
        assert info["tma_loads"] > 0 and info["shared"] <= 232448, (tile, info)
        assert (info["wgmma"] > 0) == (tile[0] >= 64), (tile, info)


def test_splitk_skinny_n_gets_tall_narrow_tiles(monkeypatch):
    _, offered = _gpu_configs(monkeypatch, synthetic(4096, 8, 4096, b_layout="col"))
    assert offered and all(c.get("BLOCK_N") == 16 for c in offered)


def test_splitk_fills_the_multiprocessors_for_a_decode_product(monkeypatch):
    """M = 1, N = K = 4096: every offered split gives at least one program per SM, each
    slice at least SPLITK_MIN_STEPS BLOCK_K steps long, and no slice empty."""
    import triton

    from multibackend.backends.triton.configs import SPLITK_MIN_STEPS

    _, offered = _gpu_configs(monkeypatch, synthetic(1, 4096, 4096))
    assert offered
    for config in offered:
        tiles = triton.cdiv(4096, config.get("BLOCK_N"))
        split, steps = config.get("SPLIT_K"), triton.cdiv(4096, config.get("BLOCK_K"))
        assert tiles * split >= 132, config.name
        per = triton.cdiv(steps, split)
        assert per >= SPLITK_MIN_STEPS and triton.cdiv(steps, per) == split, config.name


def test_split_k_choice():
    from multibackend.backends.triton.configs import split_k

    assert split_k(128, 32) == 2  # 2048^3 in 128x256 tiles: two waves of 16-step slices
    assert split_k(32, 16) == 4  # 1024^3 in 128x256 tiles: K allows 4 slices of 4 steps
    assert split_k(64, 32) == 4  # 256 programs: two full waves
    assert split_k(512, 64) == 1  # enough tiles already
    assert split_k(16, 2) == 1  # K too short to cut
    assert split_k(32, 32, sms=64) == 2  # the count of multiprocessors given


class _RecordingLauncher:
    """Stands in for a split-K kernel's Launcher: records launches, keeps a fake kernel."""

    def __init__(self, launches: list, name: str):
        self.launches, self.name, self.keys = launches, name, []

    def __call__(self, key, grid, stream, args, constexprs):
        self.keys.append(key)
        self.launches.append((self.name, args, stream))

    def kept(self, key):
        if key not in self.keys:
            return None
        from multibackend.backends.triton.launch import Kept

        return Kept(lambda *args, stream: self.launches.append((self.name, args[:-1], stream)),
                    ("TAIL",), None, (1, 1, 1))


@pytest.mark.parametrize("with_c", [False, True])
def test_bound_splitk_launch_passes_what_run_passes(monkeypatch, with_c):
    from multibackend.backends.triton.backend import TritonBackend

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend = TritonBackend()
    launches: list = []
    backend._splitk_pair = (_RecordingLauncher(launches, "partial"),
                            _RecordingLauncher(launches, "reduce"))
    gen = torch.Generator().manual_seed(27)
    a, b = _ints((9, 130), gen), _ints((33, 130), gen).T
    c = _ints((9, 33), gen) if with_c else None
    d = torch.empty((9, 33), dtype=torch.float16)
    call = matmul_call(a, b, c, alpha=2.0, beta=0.5 if with_c else None, out=d)
    config = next(cfg for cfg in backend.configs(call.problem) if cfg.name == CONFIG)
    assert backend.bind(call.problem, config, call.operands) is None  # nothing kept yet
    backend.run(call.problem, call.operands, config)
    launch = backend.bind(call.problem, config, call.operands)
    ops = call.operands
    launch(ops.a, ops.b, ops.c, ops.d, 77)
    ran, bound = launches[:2], launches[2:]
    assert [entry[0] for entry in ran] == [entry[0] for entry in bound] == ["partial", "reduce"]
    for (_, run_args, run_stream), (_, bound_args, bound_stream) in zip(ran, bound):
        assert run_stream == ops.stream and bound_stream == 77
        assert len(run_args) == len(bound_args)
        work = [i for i, x in enumerate(run_args)
                if torch.is_tensor(x) and x.dtype == torch.float32 and x.dim() == 1]
        assert len(work) == 1  # the workspace: the scratch of the launch's stream
        scratch = backend._scratch._given
        assert run_args[work[0]] is scratch[(-1, ops.stream)]
        assert bound_args[work[0]] is scratch[(-1, 77)]
        rest = [i for i in range(len(run_args)) if i != work[0]]
        assert all(run_args[i] is bound_args[i] if torch.is_tensor(run_args[i])
                   else run_args[i] == bound_args[i] for i in rest)
    reduce_args = ran[1][1]
    assert reduce_args[-2:] == (2.0, 0.5 if with_c else 0)
    assert reduce_args[1] is (ops.c if with_c else ops.d) and reduce_args[2] is ops.d


def _aot_tiles(kind: str, dtype: str, tiles: list[tuple[int, ...]]) -> list[dict]:
    """What :func:`main` reports of the ``kind`` kernel compiled for sm_90 with each of
    ``tiles`` (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages; AOT_TILES[kind] if none), in a
    process of its own (without the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(Path(__file__)), kind, dtype,
                          *(",".join(map(str, tile)) for tile in tiles)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _aot(kind: str, dtype: str) -> dict:
    return _aot_tiles(kind, dtype, [])[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_splitk_few_tile_kernel_compiles_to_wgmma_for_sm90(dtype):
    info = _aot("few", dtype)
    assert info["target"] and info["wgmma"] > 0 and info["mma_sync"] == 0, info
    assert info["async_copies"] > 0 and info["shared"] <= 232448, info


def test_splitk_skinny_kernel_uses_tensor_cores_for_sm90():
    """A 16-row tile is below wgmma's 64 rows: Triton issues mma.sync."""
    info = _aot("skinny", "float16")
    assert info["wgmma"] + info["mma_sync"] > 0 and info["async_copies"] > 0, info


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_splitk_kernel_counts_tiles_with_one_acquire_release_atomic(dtype):
    """The fused kernel: wgmma fed by cp.async, one acquire-release add on the tile's
    counter at GPU scope, the partials read back through L2 (``ld.global.cg``)."""
    info = _aot("fused", dtype)
    assert info["target"] and info["wgmma"] > 0 and info["async_copies"] > 0, info
    assert info["counter_atomics"] == 1 and info["l2_loads"] > 0, info
    assert info["float_atomics"] == 0, info
    assert info["shared"] <= 232448, info


def test_tma_splitk_kernel_stores_d_16_bytes_at_a_time_where_told_n_allows_it():
    """N and D's row stride a multiple of 8 but not of 16 (N = 1000): Triton's
    specialization cannot show D's rows come in whole 16 bytes, so the epilogue stores one
    16-bit element per instruction unless D_UNIT tells it, and then none."""
    told, plain = _aot("tma_n8_unit", "float16"), _aot("tma_n8_plain", "float16")
    assert told["target"] and told["wgmma"] > 0 and told["d_element_stores"] == 0, told
    assert plain["d_element_stores"] > 0, plain


@pytest.mark.parametrize("n, dtype, view, want", [
    (1000, torch.float16, None, 8), (1024, torch.float16, None, 1),
    (1000, torch.float32, None, 4), (1000, torch.float16, 1008, 8),
    (1000, torch.float16, 1004, 1), (1000, torch.float16, "col", 1)])
def test_epilogue_unit_only_where_d_comes_in_16_bytes_that_specialization_hides(n, dtype,
                                                                                view, want):
    """D_UNIT: 16 bytes of D where N, D's base and strides come in whole 16 bytes and
    Triton's specialization (by 16) does not show it; 1 where it does (N = 1024), where a
    row stride is off the unit (1004) and for a column-major D."""
    from multibackend.backends.triton.operands import d_unit
    from multibackend.io.request import matmul_call

    a, b = torch.ones((24, 32), dtype=dtype), torch.ones((32, n), dtype=dtype)
    if view == "col":
        d = torch.empty((n, 24), dtype=dtype).T
    elif view:
        d = torch.empty((24, view), dtype=dtype)[:, :n]
    else:
        d = torch.empty((24, n), dtype=dtype)
    assert d_unit(matmul_call(a, b).problem, d) == want


@pytest.mark.parametrize("c_view, want", [("same", 8), ("bias", 8), ("row_1004", 1),
                                          ("col", 1), ("base_off_16", 1)])
def test_epilogue_unit_with_c_only_where_c_comes_in_the_same_units(c_view, want):
    """With a C, D_UNIT rounds C's row and batch strides too: given only where they are
    whole units as well and C's base is 16-byte aligned (a bias broadcast over the rows,
    row stride 0, is); else 1."""
    from multibackend.backends.triton.operands import d_unit
    from multibackend.io.request import matmul_call

    a, b = torch.ones((24, 32), dtype=torch.float16), torch.ones((32, 1000),
                                                                  dtype=torch.float16)
    d = torch.empty((24, 1000), dtype=torch.float16)
    c = {"same": lambda: torch.empty((24, 1000), dtype=torch.float16),
         "bias": lambda: torch.empty(1000, dtype=torch.float16).expand(24, 1000),
         "row_1004": lambda: torch.empty((24, 1004), dtype=torch.float16)[:, :1000],
         "col": lambda: torch.empty((1000, 24), dtype=torch.float16).T,
         "base_off_16": lambda: torch.empty(24 * 1000 + 8, dtype=torch.float16)[1:24001]
         .view(24, 1000)}[c_view]()
    assert d_unit(matmul_call(a, b).problem, d, c) == want


@pytest.mark.parametrize("kind", ["tma_few", "tma_skinny", "tma_ordered", "tma_kmajor"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_splitk_kernel_loads_through_the_tma_unit(kind, dtype):
    """The TMA split-K kernel (and in a tile of two column blocks from a K-major B): tiles
    fetched by bulk tensor copies (no cp.async of threads), wgmma for a 64-row tile and
    mma.sync for a 16-row one, one acquire-release
    counter atomic and L2 reads as in the fused kernel, float32 atomic adds at GPU scope
    where it sums slices by atomics and none where it adds them in slice order, within the
    shared memory of an H100."""
    info = _aot(kind, dtype)
    assert info["target"] and info["tma_loads"] > 0 and info["async_copies"] == 0, info
    if kind == "tma_skinny":
        assert info["mma_sync"] > 0, info
    else:
        assert info["wgmma"] > 0 and info["mma_sync"] == 0, info
    assert info["counter_atomics"] == 1 and info["l2_loads"] > 0, info
    if kind == "tma_ordered":
        assert info["float_atomics"] == 0, info
    else:
        assert info["float_atomics"] > 0, info
    assert info["release_atomics"] == 0 and info["acquire_loads"] == 0, info
    assert info["shared"] <= 232448, info


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_splitk_kernel_pairs_two_slices_without_float_atomics(dtype):
    """Two slices paired, in the deepest 128x128x64 pipeline an H100 holds (7 stages): one
    acquire-release counter atomic to take a turn, one release add when the first partial
    is written, one acquire load the second spins on, the partial read back through L2, no
    float atomics."""
    info = _aot("tma_pair", dtype)
    assert info["target"] and info["tma_loads"] > 0 and info["wgmma"] > 0, info
    assert info["counter_atomics"] == 1 and info["release_atomics"] == 1, info
    assert info["acquire_loads"] == 1 and info["l2_loads"] > 0, info
    assert info["float_atomics"] == 0, info
    assert info["shared"] <= 232448, info


#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the tiles compiled ahead of time
AOT_TILES = {"few": (128, 256, 64, 8, 3), "skinny": (16, 128, 128, 4, 4),
             "fused": (128, 128, 64, 8, 4), "tma_few": (64, 128, 128, 4, 4),
             "tma_skinny": (16, 64, 256, 4, 4), "tma_ordered": (64, 64, 128, 4, 4),
             "tma_pair": (128, 128, 64, 8, 7),
             "tma_kmajor": (128, 192, 64, 4, 5), "tma_n8_unit": (64, 128, 128, 4, 4),
             "tma_n8_plain": (64, 128, 128, 4, 4)}


def _compile_splitk(kind: str, dtype: str, tile: tuple[int, ...]):
    """A split-K kernel for sm_90, specialized as a launch on 16-byte aligned, row-major
    operands would be: the two-kernel first pass (``few``, ``skinny``), the fused pointer
    kernel (``fused``) or the TMA kernel (``tma_*``: adding slices by atomics, in slice
    order for ``tma_ordered``, two paired for ``tma_pair``; B read K-major for
    ``tma_kmajor``; ``tma_n8_*``: N and D's
    row stride multiples of 8 but not of 16, as N = 1000 is, with the epilogue told so,
    D_UNIT 8, or not)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton_aot import TYPES, _signature

    from multibackend.backends.triton import kernels

    bm, bn, bk, warps, stages = tile
    e = TYPES[dtype]
    t = f"*{e}"
    tile = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
    pointer = dict(tile, ACC=tl.float32, INPUT_PRECISION="ieee", EVEN_K=True, UPCAST=False,
                   WIDE_K=False, A_UNIT=1, A_COL=False, B_UNIT=1, B_COL=False)
    if kind.startswith("tma"):
        from multibackend.backends.triton.configs import width_blocks

        fn = kernels.matmul_tma_splitk_kernel
        block, extra = width_blocks(bn)
        tile.update(BLOCK_N=block, EXTRA_N=extra)
        kmajor = kind == "tma_kmajor"
        b_tiles = [[bk, width] if not kmajor else [width, bk] for width in (block, extra or block)]
        args = [("a_desc", f"tensordesc<{e}[{bm}, {bk}]>"),
                ("b_desc", f"tensordesc<{e}{b_tiles[0]}>"),
                ("bx_desc", f"tensordesc<{e}{b_tiles[1]}>"), ("c_ptr", t), ("d_ptr", t),
                ("w_ptr", "*fp32"), ("count_ptr", "*i32"), ("M", "i32"), ("N", "i32"),
                ("K", "i32"), ("K_SLICE", "i32"), ("stride_cm", "i32"), ("stride_dm", "i32"),
                ("alpha", "fp32"), ("beta", "fp32")]
        consts = dict(tile, stride_cn=1, stride_dn=1, B_KMAJOR=kmajor, HAS_C=False,
                      SCALE=False,
                      REDUCE={"tma_ordered": "ordered", "tma_pair": "pair"}.get(kind, "atomic"),
                      D_UNIT=8 if kind == "tma_n8_unit" else 1)
    elif kind == "fused":
        fn = kernels.matmul_splitk_fused_kernel
        args = [("a_ptr", t), ("b_ptr", t), ("c_ptr", t), ("d_ptr", t), ("w_ptr", "*fp32"),
                ("count_ptr", "*i32"), ("M", "i32"), ("N", "i32"), ("K", "i32"),
                ("K_SLICE", "i32"), ("stride_ab", "i32"), ("stride_am", "i32"),
                ("stride_bb", "i32"), ("stride_bk", "i32"), ("stride_cb", "i32"),
                ("stride_cm", "i32"), ("stride_cn", "i32"), ("stride_db", "i32"),
                ("stride_dm", "i32"), ("alpha", "fp32"), ("beta", "fp32")]
        consts = dict(pointer, stride_ak=1, stride_bn=1, stride_dn=1, HAS_C=False,
                      SCALE=False, D_UNIT=1)
    else:
        fn = kernels.matmul_splitk_kernel
        args = [("a_ptr", t), ("b_ptr", t), ("w_ptr", "*fp32"), ("M", "i32"), ("N", "i32"),
                ("K", "i32"), ("K_SLICE", "i32"), ("stride_ab", "i32"), ("stride_am", "i32"),
                ("stride_bb", "i32"), ("stride_bk", "i32")]
        consts = dict(pointer, stride_ak=1, stride_bn=1)
    params = list(fn.arg_names)
    aligned = {(params.index(name),): [["tt.divisibility", 16]] for name, kind_ in args
               if (kind_.startswith("*") or name.startswith(("stride", "K_SLICE")))
               and not (kind.startswith("tma_n8") and name == "stride_dm")}
    src = triton.compiler.ASTSource(fn=fn, signature=_signature(args, consts),
                                    constexprs=consts, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def _report(compiled) -> dict:
    ptx = compiled.asm["ptx"]
    return {
        "target": ".target sm_90a" in ptx or ".target sm_90" in ptx,
        "wgmma": ptx.count("wgmma.mma_async"),
        "mma_sync": ptx.count("mma.sync"),
        "async_copies": ptx.count("cp.async.cg.shared.global"),
        "tma_loads": ptx.count("cp.async.bulk.tensor"),
        "counter_atomics": len(re.findall(r"atom\.global\.gpu\.acq_rel\.add|"
                                          r"atom\.acq_rel\.gpu\.global\.add", ptx)),
        "float_atomics": len(re.findall(r"(?:atom|red)\.(?:global\.gpu\.relaxed|relaxed\.gpu"
                                        r"\.global)\.add(?:\.v[248])?\.f32", ptx)),
        "release_atomics": len(re.findall(r"atom\.global\.gpu\.release\.add|"
                                          r"atom\.release\.gpu\.global\.add", ptx)),
        "acquire_loads": len(re.findall(r"ld\.global\.gpu\.acquire|ld\.acquire\.gpu\.global",
                                        ptx)),
        "l2_loads": ptx.count("ld.global.cg"),
        "d_element_stores": len(re.findall(r"st\.global\.b16", ptx)),
        "shared": compiled.metadata.shared,
    }


def main() -> None:
    kind, dtype = sys.argv[1], sys.argv[2]
    tiles = [tuple(int(v) for v in tile.split(",")) for tile in sys.argv[3:]]
    print(json.dumps([_report(_compile_splitk(kind, dtype, tile))
                      for tile in tiles or [AOT_TILES[kind]]]))


if __name__ == "__main__":
    main()
