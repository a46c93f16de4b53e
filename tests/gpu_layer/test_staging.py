"""CPU tier for staging (misaligned operands copied onto the 16-byte grid): which problems
count as misaligned, where staged operands lie, that every backend offers staged configs and
builds the aligned kernel for them, and exact results of the staged Triton path in the
interpreter on small-integer operands: odd M, N, K, leading dimensions and pointer offsets
of 1, 2, 4 and 8 elements, every layout, batched and broadcast operands, alpha, beta and C."""
from __future__ import annotations

import pytest
import torch

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.core.config import Config
from multibackend.core.problem import synthetic
from multibackend.gpu import staging
from multibackend.io.request import matmul_call
from tests.helpers import sliced_problem

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="interpreter tests run where there is no GPU")


def _ints(shape, gen, dtype=torch.float16):
    return torch.randint(-4, 5, shape, generator=gen).to(dtype)


def _view(rows: int, cols: int, layout: str, offset: int, pad: int, gen,
          batch: int | None = None, dtype=torch.float16):
    """A rows x cols operand (or a batch of them) in ``layout``, sliced ``offset`` elements
    into a wider buffer whose lines are ``pad`` elements longer than they need be."""
    lines, length = (cols, rows) if layout == "col" else (rows, cols)
    lead = (batch,) if batch else ()
    wide = _ints(lead + (lines, length + pad + offset), gen, dtype)
    part = wide[..., offset:offset + length]
    return part.transpose(-1, -2) if layout == "col" else part


def _reference(a, b, c, alpha, beta):
    d = alpha * (a.double() @ b.double())
    return d + beta * c.double() if c is not None else d


def _staged_config(call) -> str:
    names = [c.name for c in REGISTRY.get("triton").configs(call.problem)
             if c.name.startswith(staging.PREFIX)]
    assert names, "no staged config offered for a misaligned problem"
    return names[0]


def test_misaligned_is_about_lines_not_shapes():
    assert not synthetic(4096, 4096, 4096).misaligned
    assert synthetic(4096, 4096, 4095).misaligned  # A's rows: 4095 * 2 bytes
    assert synthetic(4096, 4095, 4096).misaligned  # B's rows
    assert not synthetic(4095, 4096, 4096).misaligned  # M does not touch a line's start
    assert not synthetic(4096, 4095, 4096, "float32", b_layout="col").misaligned
    assert synthetic(4096, 4096, 4095, "float32").misaligned
    assert synthetic(64, 64, 4095).key.endswith(":unaligned:b1:m64:n64:k4095")
    assert ":unaligned" not in synthetic(64, 64, 4096).key


@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"),
                                     ("col", "col")])
def test_staged_operands_lie_on_the_grid(layouts):
    p = synthetic(33, 65, 17, a_layout=layouts[0], b_layout=layouts[1], batch=3)
    s = staging.staged_problem(p)
    assert s is staging.staged_problem(p)
    for was, now in ((p.a, s.a), (p.b, s.b)):
        assert now.rows_aligned and now.layout == was.layout
        assert (now.rows, now.cols) == (was.rows, was.cols)
        assert now.ld % staging.PAD == 0 and now.ld >= (now.rows if now.layout == "col"
                                                        else now.cols)
    aligned = synthetic(64, 64, 64)
    assert staging.staged_problem(aligned).a == aligned.a


def test_staged_config_round_trip():
    cfg = REGISTRY.get("triton").configs(synthetic(100, 100, 99))[-1]
    assert staging.is_staged(cfg) and cfg.name.startswith(staging.PREFIX)
    inner = staging.inner(cfg)
    assert not staging.is_staged(inner) and staging.wrap(inner) == cfg


def test_every_backend_offers_staged_configs_only_where_misaligned():
    """Staged configs only for misaligned problems, except raw WMMA's K-major ones, offered
    for a product whose A is not row-major or B not column-major (B row-major here) of a type
    its wgmma reads K-major only (int8; its TMA kernel reads f16 in either order)."""
    odd, even = synthetic(4096, 4096, 4095), synthetic(4096, 4096, 4096)
    sliced = sliced_problem(4096, 4096, 4096, 4100)
    kmajor = synthetic(4096, 4096, 4096, b_layout="col")
    ints = synthetic(4096, 4096, 4096, "int8")
    assert [c.name for c in REGISTRY.get("raw_wmma").configs(ints) if staging.is_staged(c)] == \
        ["staged:tma_128x256_c1", "staged:tma_128x256_c2"]
    for name in ("triton", "cutlass", "raw_wmma"):
        backend = REGISTRY.get(name)
        assert not [c for c in backend.configs(even) if staging.is_staged(c)], name
        assert not [c for c in backend.configs(kmajor) if staging.is_staged(c)], name
        for problem in (odd, sliced):
            staged = [c for c in backend.configs(problem) if staging.is_staged(c)]
            # CUTLASS's kernels check K = 4095 itself, not only the rows' alignment
            assert bool(staged) == (name != "cutlass" or problem is sliced), name
            for cfg in staged:  # each runs a config of the aligned problem
                aligned = staging.staged_problem(problem, staging.is_kmajor(cfg))
                inner_names = {c.name for c in backend.configs(aligned)}
                assert staging.inner(cfg).name in inner_names, (name, cfg.name)


def test_staged_triton_and_raw_wmma_run_their_aligned_kernels(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the configs of the GPU, not the interpreter
    odd = synthetic(4095, 4095, 4095)
    staged = staging.staged_problem(odd)
    triton_cfgs = REGISTRY.get("triton").configs(odd)
    assert any(c.get("kind") == "tma" for c in triton_cfgs if staging.is_staged(c))
    assert not any(c.get("kind") == "tma" for c in triton_cfgs if not staging.is_staged(c))
    from multibackend.backends.raw_wmma.kernels import fast_eligible

    assert fast_eligible(odd) is not None and fast_eligible(staged) is None


def test_triton_autotune_shortlists_every_offered_staged_tile_and_the_fullest_waves(
        monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from multibackend.backends.triton.configs import TMA_SHORTLIST, _tile_count, _wave_use

    backend = REGISTRY.get("triton")
    odd, even = synthetic(3000, 4097, 4095), synthetic(3008, 4160, 4096)
    offered = [c.name for c in backend.configs(odd) if staging.is_staged(c)]
    picked = backend._shortlist(odd, 132)
    assert offered == [c.name for c in picked[:staging.OFFERED]]
    staged = {(c.get("BLOCK_M"), c.get("BLOCK_N")) for c in picked[:staging.OFFERED]}
    assert staged == {(128, 256), (256, 128), (128, 128)}, picked
    # 3008 rows by 4160 columns: 408 tiles of 128x256 leave the fourth wave of 132 programs
    # at 9% (77% of the slots used); 396 of 256x128 are exactly three waves, 792 of 128x128
    # six: the first tile offered and the three fullest are timed, 64x256 (799 tiles, 86%) not
    tma = [c for c in backend._shortlist(even, 132) if c.get("kind") == "tma"]
    assert len(tma) == TMA_SHORTLIST
    shapes = [(c.get("BLOCK_M"), c.get("BLOCK_N")) for c in tma]
    assert shapes[0] == (128, 256) and {(256, 128), (128, 128)} <= set(shapes), tma
    assert (64, 256) not in shapes, tma
    uses = {shape: _wave_use(_tile_count(even, *shape), 132)
            for shape in set(shapes) | {(64, 256)}}
    assert uses[(256, 128)] == 1.0 and uses[(128, 256)] < 0.8
    assert min(uses[shape] for shape in shapes[1:]) > uses[(64, 256)]


def test_triton_autotune_skips_persistent_tiles_that_fill_under_half_a_wave(monkeypatch):
    """A decode product has 16-64 output tiles of 64-256 columns at N = 4096: the persistent
    kernel would leave most multiprocessors idle, and first-call autotuning does not time it
    (the split-K kernels fill the GPU)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    backend = REGISTRY.get("triton")
    picked = backend._shortlist(synthetic(8, 4096, 4096), 132)
    assert not any(c.get("kind") == "tma" for c in picked), picked
    assert any(c.get("kind") == "tma_splitk" for c in picked), picked


@interpreter_only
@pytest.mark.parametrize("offset", [1, 2, 4, 8])
@pytest.mark.parametrize("layouts", [("row", "row"), ("row", "col"), ("col", "row"),
                                     ("col", "col")])
def test_staged_triton_exact_on_offset_views(offset, layouts):
    gen = torch.Generator().manual_seed(offset * 7 + len(layouts[0]))
    m, n, k = 33, 47, 29
    a = _view(m, k, layouts[0], offset, 3, gen)
    b = _view(k, n, layouts[1], offset, 5, gen)
    call = matmul_call(a, b, None)
    assert call.problem.misaligned
    d = mb.matmul(a, b, backend="triton", config=_staged_config(call))
    assert torch.equal(d.double(), _reference(a, b, None, 1, 0))


@interpreter_only
@pytest.mark.parametrize("shape", [(1, 9, 7), (17, 33, 65), (65, 17, 127), (7, 129, 3)])
def test_staged_triton_exact_with_alpha_beta_c(shape):
    m, n, k = shape
    gen = torch.Generator().manual_seed(m + n + k)
    a, b = _ints((m, k), gen), _ints((k, n), gen)
    c = _ints((m, n), gen)
    call = matmul_call(a, b, c, alpha=2.0, beta=-1.0)
    d = mb.matmul(a, b, c, alpha=2.0, beta=-1.0, backend="triton",
                  config=_staged_config(call))
    assert torch.equal(d.double(), _reference(a, b, c, 2.0, -1.0))


@interpreter_only
@pytest.mark.parametrize("broadcast", [False, True])
def test_staged_triton_exact_batched(broadcast):
    gen = torch.Generator().manual_seed(11)
    batch, m, n, k = 3, 19, 23, 37
    a = _view(m, k, "row", 2, 1, gen, batch=batch)
    b = _view(k, n, "col", 1, 2, gen) if broadcast else _view(k, n, "row", 4, 3, gen,
                                                                batch=batch)
    c = _ints((batch, m, n), gen)
    call = matmul_call(a, b, c, alpha=1.0, beta=2.0)
    assert call.problem.misaligned and call.problem.batch == batch
    d = mb.matmul(a, b, c, beta=2.0, backend="triton", config=_staged_config(call))
    assert torch.equal(d.double(), _reference(a, b, c, 1.0, 2.0))


@interpreter_only
def test_staged_copies_are_aligned_and_leave_aligned_operands_alone():
    gen = torch.Generator().manual_seed(3)
    a = _view(9, 13, "row", 1, 0, gen)  # misaligned
    b = _ints((13, 64), gen)  # aligned
    call = matmul_call(a, b, None)
    s = staging.staged_problem(call.problem)
    ops = staging.stage(call.problem, s, call.operands)
    assert ops.b is call.operands.b
    assert ops.a.data_ptr() % 16 == 0 and (ops.a.stride(-2) * 2) % 16 == 0
    assert torch.equal(ops.a, call.operands.a)


def _emulated_copy(src, now, itemsize: int):
    """What raw_wmma/stage.cu writes for ``src`` staged as ``now``, with the arguments and
    grid of :func:`staging.copy_plan`: the kernel's own indexing, line by line, read through
    the source strides it is given; the result viewed as the kernel's GEMM reads it."""
    values, grid, transpose = staging.copy_plan(src.stride(), now, itemsize)
    lines, length, ld = values["lines"], values["length"], values["ld"]
    vector = 16 // itemsize
    assert transpose == (values["src_line"] == 1 and values["src_pos"] != 1)
    if transpose:  # one block per 32 x 32 tile of lines by positions
        tile = staging.TRANSPOSE_TILE
        assert grid[0] * tile >= length and grid[1] == min(-(-lines // tile), staging.MAX_GRID_Y)
    else:
        assert grid[0] * staging.STAGE_THREADS * vector >= length  # every element has a thread
        assert grid[1] == min(lines, staging.MAX_GRID_Y)
    assert ld % vector == 0
    read = torch.as_strided(src, (lines, length), (values["src_line"], values["src_pos"]))
    flat = torch.zeros((lines * ld,), dtype=src.dtype)
    flat.view(lines, ld)[:, :length] = read
    return flat.as_strided((now.rows, now.cols), now.strides)


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8, torch.float64])
def test_the_copy_kernels_arguments_stage_every_layout(layout, offset, dtype):
    gen = torch.Generator().manual_seed(offset)
    a = _view(37, 29, layout, offset, pad=2, gen=gen, dtype=dtype)
    problem = matmul_call(a, _ints((29, 16), gen, dtype), None).problem
    now = staging.staged_problem(problem).a
    assert now != problem.a and now.layout == layout
    assert torch.equal(_emulated_copy(a, now, a.element_size()), a)


def test_the_copy_kernels_arguments_stage_a_strided_view_row_major():
    gen = torch.Generator().manual_seed(2)
    b = _ints((40, 60), gen)[::2, ::3]  # neither row- nor column-major: staged row-major
    problem = matmul_call(_ints((8, 20), gen), b, None).problem
    now = staging.staged_problem(problem).b
    assert now.layout == "row" and now.ld % staging.PAD == 0
    assert torch.equal(_emulated_copy(b, now, 2), b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8, torch.float64])
def test_kmajor_staging_copies_a_row_major_and_b_column_major(dtype):
    """K-major staging turns A row-major and B column-major (by the transposing copy where
    the source lies the other way), leaves operands already so, and its configs say so."""
    gen = torch.Generator().manual_seed(5)
    a = _view(37, 29, "col", 0, pad=8, gen=gen, dtype=dtype)
    b = _view(29, 45, "row", 1, pad=8, gen=gen, dtype=dtype)
    problem = matmul_call(a, b, None).problem
    staged = staging.staged_problem(problem, kmajor=True)
    assert staged is staging.staged_problem(problem, kmajor=True)
    assert (staged.a.layout, staged.b.layout) == ("row", "col")
    assert staged.a.rows_aligned and staged.b.rows_aligned
    assert staging.staged_problem(problem).b.layout == "row"  # the other staging keeps it
    for src, now in ((a, staged.a), (b, staged.b)):
        assert staging.copy_plan(src.stride(), now, src.element_size())[2]
        assert torch.equal(_emulated_copy(src, now, src.element_size()), src)
    kept = matmul_call(_ints((16, 32), gen, dtype), _ints((24, 32), gen, dtype).T, None).problem
    assert staging.staged_problem(kept, kmajor=True) == kept
    config = staging.wrap(Config.of("tma_128x256_c1", BM=128), kmajor=True)
    assert config.name == "staged:tma_128x256_c1" and staging.is_kmajor(config)
    assert staging.unwrap(problem, config) == (staged, Config.of("tma_128x256_c1", BM=128))


def test_arenas_grow_by_powers_of_two_per_stream_and_operand(monkeypatch):
    monkeypatch.setattr(staging, "_ARENAS", {})
    like = torch.empty(1)
    first = staging.arena(like, 7, "a", 1000)
    assert first.numel() == 1024 and staging.arena(like, 7, "a", 1024) is first
    grown = staging.arena(like, 7, "a", 1025)
    assert grown.numel() == 2048 and staging._ARENAS[(like.device, 7, "a")] == [first, grown]
    assert staging.arena(like, 7, "b", 10).numel() == 256  # another operand, another buffer
    assert staging.arena(like, 8, "a", 10) is not grown  # another stream too
