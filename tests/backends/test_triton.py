"""CPU tier for the Triton backend: every kernel in Triton's interpreter against float64 on
ragged shapes, every dtype and layout; and the GPU kernels compiled ahead of time for sm_90,
with wgmma (and the TMA unit for the persistent kernel) found in the PTX."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import multibackend as mb
from multibackend.choose.dispatch import decide
from multibackend.io.request import dot_call, matmul_call
from multibackend.run.execute import execute
from multibackend.verify import reference
from multibackend.verify.crosscheck import poison

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="interpreter tests run where there is no GPU")

#: ragged (M, N, K): 1, 7, 17, 33, 65, 127, 129 and mixes; K = 48 and 80, multiples of 16
#: but not of the interpreter's BLOCK_K (32), whose tail only the K mask keeps in bounds;
#: M = 289, more rows of tiles than one group of GROUP_M (8) holds; 14 in all
SHAPES = [(1, 1, 1), (7, 7, 7), (17, 33, 65), (33, 17, 7), (65, 129, 17), (127, 1, 33),
          (129, 65, 127), (1, 129, 65), (17, 7, 129), (65, 33, 1), (33, 127, 17),
          (7, 65, 33), (9, 23, 48), (289, 40, 80)]
#: f16 and bf16 also into a float32 D, whose bound (float32 rounding) a float16 accumulator
#: would exceed, where a 16-bit D's own rounding hides it
DTYPES = [("float16", {}), ("bfloat16", {}), ("float32", {"precision": "ieee"}),
          ("float32", {"precision": "tf32"}), ("float32", {"precision": "tf32x3"}),
          ("float64", {}), ("int8", {}), ("float16", {"acc_dtype": "float16"}),
          ("float16", {"out_dtype": "float32"}), ("bfloat16", {"out_dtype": "float32"})]


def _rand(shape, dtype: torch.dtype, gen, layout: str = "row"):
    stored = shape if layout == "row" else shape[:-2] + (shape[-1], shape[-2])
    if dtype == torch.int8:
        t = torch.randint(-8, 8, stored, generator=gen, dtype=torch.int8)
    else:
        t = (torch.rand(stored, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)
    return t if layout == "row" else t.transpose(-1, -2)


def _run_and_compare(call):
    poison(call.operands.d)
    execute(call, decide(call.problem, "triton"))
    if call.problem.op == "dot":
        ref = reference.reference_dot(call.operands.a, call.operands.b)
    else:
        ref = reference.reference_matmul(call.operands.a, call.operands.b, call.operands.c,
                                         call.operands.alpha, call.operands.beta)
    return reference.compare(call.problem, call.operands.d, ref)


@interpreter_only
@pytest.mark.parametrize("dtype,kw", DTYPES, ids=lambda v: str(v))
def test_interpreter_matmul_ragged_shapes(dtype, kw):
    gen = torch.Generator().manual_seed(7)
    tdtype = getattr(torch, dtype)
    for i, (m, n, k) in enumerate(SHAPES):
        a_layout, b_layout = ("row", "col")[i % 2], ("row", "col")[(i // 2) % 2]
        call = matmul_call(_rand((m, k), tdtype, gen, a_layout),
                           _rand((k, n), tdtype, gen, b_layout), **kw)
        cmp = _run_and_compare(call)
        assert cmp.ok, f"{call.problem.describe()}: {cmp.detail}"


@interpreter_only
def test_interpreter_k_steps_past_2_31_elements():
    """B's rows 2^26 elements apart: one BLOCK_K step of K (32 rows) spans 2^31 elements, past
    32-bit offsets (only the rows touched are ever written: the rest stays unallocated)."""
    gen = torch.Generator().manual_seed(9)
    k, n = 40, 8
    rows = torch.empty((k, 1 << 26), dtype=torch.float16)[:, :n]
    rows.copy_(torch.randint(-4, 5, (k, n), generator=gen))
    call = matmul_call(torch.randint(-4, 5, (3, k), generator=gen).half(), rows)
    assert call.problem.b.ld == 1 << 26
    cmp = _run_and_compare(call)
    assert cmp.ok, cmp.detail


def test_k_offsets_go_64_bit_exactly_where_a_step_spans_2_31_elements():
    from multibackend.backends.triton.operands import wide_k
    from multibackend.core.problem import synthetic

    rows = synthetic(8, 8, 64, b_layout="col")  # B's K is contiguous: stride 1 along K
    assert not wide_k(rows, 64)
    a_col = synthetic(1 << 25, 8, 64, a_layout="col")  # A's K steps 2^25 elements apart
    assert wide_k(a_col, 64) and not wide_k(a_col, 32)
    b_row = synthetic(8, (1 << 25) - 8, 64)  # B's K steps 2^25 - 8 elements apart
    assert not wide_k(b_row, 64) and wide_k(b_row, 128)


@interpreter_only
def test_interpreter_batched_broadcast_epilogue():
    gen = torch.Generator().manual_seed(8)
    a = _rand((3, 17, 33), torch.float16, gen)
    b = _rand((33, 65), torch.float16, gen, "col")
    c = _rand((3, 17, 65), torch.float16, gen)
    call = matmul_call(a, b, c, alpha=-1.5, beta=0.25)
    cmp = _run_and_compare(call)
    assert cmp.ok, cmp.detail
    assert call.problem.batch == 3 and call.problem.b.batch_stride == 0


@interpreter_only
def test_interpreter_batch_over_a_broadcast_b_runs_as_one_product_of_stacked_rows(monkeypatch):
    """A batch over a broadcast B whose A (and C) hold their entries one after another runs
    as one product of batch x M rows, one launch (so too A's rows spaced wider than K and a
    batch of single rows); A's entries apart or C broadcast over the batch keep the batch.
    Every one matches float64."""
    from multibackend.choose.registry import REGISTRY

    backend = REGISTRY.get("triton")
    launches = []
    launch = backend._launch

    def recording(problem, operands, config):
        launches.append((problem.m, problem.batch, tuple(operands.a.shape)))
        return launch(problem, operands, config)

    monkeypatch.setattr(backend, "_launch", recording)
    gen = torch.Generator().manual_seed(28)
    b = _rand((33, 24), torch.float16, gen, "col")
    stacked, c = _rand((3, 17, 33), torch.float16, gen), _rand((3, 17, 24), torch.float16, gen)
    cases = [((stacked, c), (51, 1, (1, 51, 33))),
             ((_rand((3, 17, 40), torch.float16, gen)[:, :, :33], c), (51, 1, (1, 51, 33))),
             ((_rand((5, 1, 33), torch.float16, gen), None), (5, 1, (1, 5, 33))),
             ((_rand((3, 18, 33), torch.float16, gen)[:, :17], c), (17, 3, (3, 17, 33))),
             ((stacked, c[0]), (17, 3, (3, 17, 33)))]
    for (a, c_in), launched in cases:
        launches.clear()
        call = matmul_call(a, b, c_in, alpha=-1.5, beta=0.25 if c_in is not None else None)
        cmp = _run_and_compare(call)
        assert cmp.ok, (tuple(a.shape), a.stride(), cmp.detail)
        assert launches == [launched], (tuple(a.shape), a.stride())


@interpreter_only
def test_interpreter_int8_integer_epilogue_exact():
    gen = torch.Generator().manual_seed(9)
    a, b = _rand((33, 65), torch.int8, gen), _rand((65, 17), torch.int8, gen)
    c = torch.randint(-50, 50, (33, 17), generator=gen, dtype=torch.int32)
    cmp = _run_and_compare(matmul_call(a, b, c, alpha=3, beta=-2))
    assert cmp.ok and cmp.exact


@interpreter_only
def test_interpreter_detects_a_wrong_result():
    """The comparison catches a kernel that skips part of D: poison left in place fails."""
    gen = torch.Generator().manual_seed(10)
    call = matmul_call(_rand((17, 33), torch.float16, gen), _rand((33, 7), torch.float16, gen))
    poison(call.operands.d)
    execute(call, decide(call.problem, "triton"))
    call.operands.d[0, 5, 3] = float("nan")
    ref = reference.reference_matmul(call.operands.a, call.operands.b)
    assert not reference.compare(call.problem, call.operands.d, ref).ok
    call.operands.d[0, 5, 3] = 1e3
    assert not reference.compare(call.problem, call.operands.d, ref).ok


@interpreter_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_interpreter_dot(dtype):
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator().manual_seed(11)
    for n in (1, 7, 4096, 4097, 20000):
        x, y = _rand((n,), getattr(torch, dtype), gen), _rand((n,), getattr(torch, dtype), gen)
        cmp = _run_and_compare(dot_call(x, y))
        assert cmp.ok, f"n={n}: {cmp.detail}"
    # the partials go into the stream's kept scratch: a repeated call allocates none
    held = {key: t.data_ptr() for key, t in REGISTRY.get("triton")._scratch._given.items()}
    assert held and _run_and_compare(dot_call(x, y)).ok
    assert held == {key: t.data_ptr()
                    for key, t in REGISTRY.get("triton")._scratch._given.items()}


@interpreter_only
def test_interpreter_public_calls_numpy_in_numpy_out():
    import numpy as np

    rng = np.random.default_rng(12)
    a = rng.standard_normal((17, 33)).astype(np.float32)
    b = rng.standard_normal((33, 9)).astype(np.float32)
    d = mb.matmul(a, b, backend="triton")
    assert isinstance(d, np.ndarray) and d.shape == (17, 9)
    np.testing.assert_allclose(d, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal(1000).astype(np.float16)
    s = mb.dot(x, x)
    assert isinstance(s, np.ndarray) and s.shape == () and s.dtype == np.float32
    assert abs(float(s) - float((x.astype(np.float64) ** 2).sum())) < 1e-3 * float(s)


def _aot(kind: str, dtype: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("triton_aot.py")
    out = subprocess.run([sys.executable, str(script), kind, dtype], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pointer_gemm_compiles_to_wgmma_for_sm90(dtype):
    info = _aot("pointer", dtype)
    assert info["target"] and info["wgmma"] > 0 and info["mma_sync"] == 0, info


@pytest.mark.parametrize("mode", ["epilogue", "block"])
def test_scaled_fp8_kernel_compiles_to_e4m3_wgmma_for_sm90(mode):
    """The scaled kernel's fp8 products on Hopper's fp8 warpgroup MMA, per tile (scales on the
    sums) and per K step (block-wise scales on each step's partial sums), in shared memory;
    in both, the MMA's narrow sums are added in float32 after each step of K (Triton's
    default on sm_90 adds none: the whole of K in the tensor cores' ~14-bit accumulator)."""
    info = _aot("scaled", mode)
    assert info["target"] and info["wgmma_e4m3"] > 0 and info["mma_sync"] == 0, info
    assert info["wgmma_e4m3"] == info["wgmma"] and 0 < info["shared"] <= 232448, info
    assert info["f32_adds"] >= 128 * 256 // 256, info  # a tile's sums, over its 256 threads


@pytest.mark.parametrize("mode", ["epilogue", "block"])
def test_scaled_fp8_tma_kernel_compiles_to_e4m3_wgmma_fed_and_stored_by_tma(mode):
    """The scaled persistent kernel in the tile offered first for its scales: fp8 warpgroup
    MMAs only, A and B fetched and D stored by the TMA unit (no element stores), within the
    H100's shared memory, and the MMA's sums added in float32 after each step of K (one
    addition per accumulator element a thread holds: 128 x 256 over 256 threads)."""
    info = _aot("scaled_tma", mode)
    assert info["target"] and info["wgmma_e4m3"] > 0 and info["mma_sync"] == 0, info
    assert info["wgmma_e4m3"] == info["wgmma"] and 0 < info["shared"] <= 232448, info
    assert info["tma_load"] > 0 and info["tma_store"] > 0 and info["global_stores"] == 0, info
    assert info["f32_adds"] >= 128 * 256 // 256, info


@pytest.mark.parametrize("mode", ["row", "block"])
def test_one_kernel_quantization_divides_and_converts_rounding_to_nearest(mode):
    """The quantization's arithmetic as compiled for sm_90 (the interpreter's fp8 conversion
    rounds otherwise; see tests/backends/test_triton_quantize.py): IEEE division (div.rn,
    not Triton's default approximate one), conversion to e4m3 rounding to nearest even, and
    no element-by-element loads of contiguous rows."""
    info = _aot("quantize", mode)
    assert info["target"] and info["div_rn"] > 0 and info["div_approx"] == 0, info
    assert info["cvt_e4m3_rn"] > 0 and info["element_loads"] == 0, info
    assert mode == "block" or info["vector_loads"] > 0, info


def test_float32_precision_modes_reach_the_tensor_cores_as_asked():
    """float32 operands as the backend launches them: "ieee" on no tensor core (the
    interpreter ignores the mode, so only the compiled kernel tells), "tf32" on tf32 wgmma,
    "tf32x3" on three times as many (the split operands' three products)."""
    ieee, tf32, tf32x3 = (_aot("float32", mode) for mode in ("ieee", "tf32", "tf32x3"))
    assert ieee["wgmma"] == 0 and ieee["mma_sync"] == 0, ieee
    assert tf32["wgmma_tf32"] > 0 and tf32["wgmma_tf32"] == tf32["wgmma"], tf32
    assert tf32x3["wgmma_tf32"] == 3 * tf32["wgmma_tf32"], (tf32, tf32x3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_persistent_gemm_uses_wgmma_and_tma(dtype):
    info = _aot("tma", dtype)
    assert info["wgmma"] > 0 and info["tma_load"] > 0 and info["tma_store"] > 0, info
    assert info["global_stores"] == 0, info
    assert info["shared"] <= 232448, info


def test_every_tma_tile_fits_in_shared_memory_with_and_without_c():
    """Each TMA tile compiled as its launches specialize it (C and D on the 16-byte grid,
    the epilogue d_by_tma picks) fits the H100's 227 KB; a 128x256 tile storing D by TMA
    beside C's converted tile needed 240 KB."""
    shared = _aot("tma_tiles", "float16")["shared_by_tile"]
    assert len(shared) >= 3 and all(len(v) == 2 for v in shared.values()), shared
    assert all(0 < b <= 232448 for v in shared.values() for b in v), shared


def test_tma_gemm_stores_a_misaligned_d_through_pointers():
    """A D whose rows are off the 16-byte grid (a staged misaligned product): TMA still
    loads A and B, D goes out through masked stores."""
    info = _aot("tma_pointer_d", "float16")
    assert info["wgmma"] > 0 and info["tma_load"] > 0, info
    assert info["tma_store"] == 0 and info["global_stores"] > 0, info


def test_tma_gemm_with_c_moves_c_and_d_16_bytes_at_a_time_where_told_n_allows_it():
    """The persistent TMA kernel with C stores D through the pointer epilogue: where N and
    the rows of C and D come in whole 16 bytes that Triton's specialization does not show
    (N = 1000), C is loaded and D stored one 16-bit element per instruction unless D_UNIT
    tells it, and then none."""
    told, plain = _aot("tma_c_n8_unit", "float16"), _aot("tma_c_n8_plain", "float16")
    assert told["wgmma"] > 0 and told["tma_load"] > 0 and told["tma_store"] == 0, told
    assert told["d_element_stores"] == 0 and told["global_stores"] > 0, told
    assert told["element_loads"] == 0 and told["vector_loads"] > 0, told
    assert plain["d_element_stores"] > 0 and plain["element_loads"] > 0, plain


@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("layout", ["row", "col"])
def test_pointer_kernel_loads_16_bytes_at_a_time_where_told_an_operand_comes_in_8s(operand,
                                                                                   layout):
    """An operand's contiguous extent and leading dimension multiples of 8 but not of 16
    (1000): its tile (and the other's too, where the extent is K) goes to shared memory by
    one-element loads unless A_UNIT or B_UNIT tells the kernel, and then by 16-byte
    asynchronous copies only, as where everything shows 16."""
    told = _aot(f"pointer_{operand}_{layout}_8s_unit", "bfloat16")
    plain = _aot(f"pointer_{operand}_{layout}_8s_plain", "bfloat16")
    assert told["wgmma"] > 0 and told["element_loads"] == 0, told
    assert told["async_copies"] > plain["async_copies"], (told, plain)
    assert plain["element_loads"] > 0, plain


def test_load_units_where_triton_cannot_see_them():
    from multibackend.backends.triton.operands import load_units
    from multibackend.io.request import matmul_call

    def units(a, b):
        return load_units(matmul_call(a, b).problem, a, b)

    f16, f32 = torch.float16, torch.float32
    col_a = torch.empty((1000, 1000), dtype=f16).t()  # M = 1000 contiguous, lda 1000
    assert units(col_a, torch.empty((1000, 64), dtype=f16)) == dict(
        A_UNIT=8, A_COL=True, B_UNIT=1, B_COL=False)
    row_a = torch.empty((64, 1000), dtype=f16)  # K = 1000 contiguous
    assert units(row_a, torch.empty((1000, 24), dtype=f16)) == dict(
        A_UNIT=8, A_COL=False, B_UNIT=8, B_COL=False)
    col_b = torch.empty((24, 1000), dtype=f16).t()  # B's K = 1000 contiguous
    assert units(row_a, col_b)["B_UNIT"] == 8 and units(row_a, col_b)["B_COL"]
    shown = torch.empty((64, 1024), dtype=f16)  # Triton sees 16s: nothing to tell
    assert units(shown, torch.empty((1024, 64), dtype=f16))["A_UNIT"] == 1
    assert units(torch.empty((64, 1000), dtype=f32), torch.empty((1000, 64), dtype=f32))[
        "A_UNIT"] == 1  # measured slower with 32-bit operands
    off_grid = torch.empty((64 * 1000 + 1), dtype=f16)[1:].view(64, 1000)
    assert units(off_grid, torch.empty((1000, 64), dtype=f16))["A_UNIT"] == 1
    ragged = torch.empty((64, 1004), dtype=f16)  # 1004: a multiple of 4, not of 8
    assert units(ragged, torch.empty((1004, 64), dtype=f16))["A_UNIT"] == 1
    assert units(torch.empty((64, 40), dtype=torch.int8),
                 torch.empty((40, 64), dtype=torch.int8))["A_UNIT"] == 1
    b = torch.empty((1000, 64), dtype=f16)
    assert units(torch.empty((2, 64, 1000), dtype=f16), b)["A_UNIT"] == 8
    assert units(row_a.expand(2, 64, 1000), b)["A_UNIT"] == 8  # batch stride 0
    apart = torch.empty((2, 64 * 1000 + 4), dtype=f16)[:, :64 * 1000].view(2, 64, 1000)
    assert apart.stride(0) == 64004 and units(apart, b)["A_UNIT"] == 1  # 4 mod 8


@interpreter_only
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_interpreter_with_load_units(dtype):
    """Every layout with A's and B's extents and leading dimensions whole 16 bytes but not 16
    elements (units told), batched, with C: the results match float64."""
    from multibackend.backends.triton.operands import load_units

    gen = torch.Generator().manual_seed(31)
    tdtype = getattr(torch, dtype)
    m, n, k = 24, 40, 56
    told = set()
    for a_layout in ("row", "col"):
        for b_layout in ("row", "col"):
            a = _rand((2, m, k), tdtype, gen, a_layout)
            b = _rand((2, k, n), tdtype, gen, b_layout)
            c = _rand((2, m, n), tdtype, gen)
            call = matmul_call(a, b, c, alpha=0.5, beta=-1.0)
            units = load_units(call.problem, call.operands.a, call.operands.b)
            told.add((units["A_UNIT"], units["A_COL"], units["B_UNIT"], units["B_COL"]))
            cmp = _run_and_compare(call)
            assert cmp.ok, (a_layout, b_layout, cmp.detail)
    assert told == {(8, False, 8, False), (8, True, 8, False), (8, False, 8, True),
                    (8, True, 8, True)}


def test_dot_kernel_uses_16_byte_loads():
    info = _aot("dot", "float16")
    assert info["vector_loads"] > 0, info


class _FakeCompiled:
    """Stands in for a compiled Triton kernel: records launches through its launcher."""

    def __init__(self, launches: list):
        self.launches = launches
        self.run = object()

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.launches.append(("kept", grid, args, stream))
        return runner


class _FakeJit:
    """Stands in for a ``@triton.jit`` function with two runtime and two constexpr params."""

    def __init__(self):
        import inspect

        def kernel(x_ptr, n, BLOCK, MODE=7):
            pass

        self.signature = inspect.signature(kernel)
        self.launches: list = []

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.launches.append(("triton", grid, args, constexprs))
            return _FakeCompiled(self.launches)
        return launch


def test_launcher_keeps_the_compiled_kernel_per_key(monkeypatch):
    from multibackend.backends.triton.launch import Launcher, aligned

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fn = _FakeJit()
    launch = Launcher(fn)
    asked: list = []

    def constexprs(**named):
        def make():
            asked.append(named["BLOCK"])
            return named
        return make
    launch(("k", 1), (4, 1, 1), 99, ("x", 10), constexprs(BLOCK=32, num_warps=4))
    launch(("k", 1), (4, 1, 1), 123, ("y", 10), constexprs(BLOCK=32, num_warps=4))
    launch(("k", 2), (8, 1, 1), 123, ("z", 11), constexprs(BLOCK=64, MODE=1, num_warps=4))
    launch(("k", 2), (8, 1, 1), 5, ("w", 11), constexprs(BLOCK=64, MODE=1, num_warps=4))
    assert fn.launches == [
        ("triton", (4, 1, 1), ("x", 10), {"BLOCK": 32, "num_warps": 4}),
        # the kept kernel takes every parameter, constexprs (and their defaults) included,
        # and not the launch options
        ("kept", (4, 1, 1), ("y", 10, 32, 7), 123),
        ("triton", (8, 1, 1), ("z", 11), {"BLOCK": 64, "MODE": 1, "num_warps": 4}),
        ("kept", (8, 1, 1), ("w", 11, 64, 1), 5),
    ]
    assert asked == [32, 64]  # the constexprs are worked out only for a new key
    assert aligned(0, 16, 8, 4096 + 2) == (True, True, False, False)


def test_launcher_keeps_nothing_under_the_interpreter(monkeypatch):
    from multibackend.backends.triton.launch import Launcher

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fn = _FakeJit()
    launch = Launcher(fn)
    for _ in range(2):
        launch("k", (1, 1, 1), 0, ("x", 1), lambda: {"BLOCK": 1})
    assert [entry[0] for entry in fn.launches] == ["triton", "triton"]


class _RecordingLauncher:
    """Stands in for the matmul kernel's Launcher: records launches, keeps a fake kernel."""

    def __init__(self):
        self.launches: list = []
        self.keys: list = []

    def __call__(self, key, grid, stream, args, constexprs):
        self.keys.append(key)
        self.launches.append((args, stream))

    def kept(self, key):
        if key not in self.keys:
            return None
        from multibackend.backends.triton.launch import Kept

        return Kept(lambda *args, stream: self.launches.append((args[:-1], stream)), ("TAIL",),
                    None, (1, 1, 1))


@pytest.mark.parametrize("with_c", [False, True])
def test_bound_launch_passes_what_run_passes(with_c):
    from multibackend.backends.triton.backend import TritonBackend

    backend = TritonBackend()
    backend._matmul_launcher = recorder = _RecordingLauncher()
    gen = torch.Generator().manual_seed(9)
    a = torch.rand((9, 5), generator=gen)
    b = torch.rand((7, 5), generator=gen).T
    c = torch.rand((9, 7), generator=gen) if with_c else None
    d = torch.empty((9, 7))
    call = matmul_call(a, b, c, alpha=2.0, beta=0.5 if with_c else None, out=d)
    config = backend.configs(call.problem)[0]
    assert backend.bind(call.problem, config, call.operands) is None  # nothing kept yet
    backend.run(call.problem, call.operands, config)
    launch = backend.bind(call.problem, config, call.operands)
    ops = call.operands
    launch(ops.a, ops.b, ops.c, ops.d, 77)
    (run_args, run_stream), (bound_args, bound_stream) = recorder.launches
    assert bound_stream == 77 and run_stream == ops.stream
    assert len(bound_args) == len(run_args)
    assert all(x is y for x, y in zip(bound_args[:4], run_args[:4]))  # the same tensors
    assert bound_args[4:] == run_args[4:]  # integers, alpha, beta
    assert run_args[-2:] == (2.0, 0.5 if with_c else 0)
    assert (run_args[2] is ops.c) if with_c else (run_args[2] is ops.d)


def test_dot_has_no_bound_launch():
    from multibackend.backends.triton.backend import TritonBackend

    backend = TritonBackend()
    x = torch.rand(100)
    call = dot_call(x, x)
    assert backend.bind(call.problem, backend.configs(call.problem)[0], call.operands) is None


def test_configs_of_one_name_and_other_parameters_each_run_their_own():
    """A kernel's launch settings are kept per config, not per name: a caller's config that
    shares a name with an earlier one but not its tiles runs its own tiles."""
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.config import Config

    gen = torch.Generator().manual_seed(5)
    a, b = _rand((40, 24), torch.float16, gen), _rand((24, 36), torch.float16, gen)
    backend = REGISTRY.get("triton")
    problem = matmul_call(a, b, None).problem
    expected = (a.double() @ b.double()).half()
    grids = []
    for block_n in (16, 32):
        config = Config.of("mine", BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=32, GROUP_M=1,
                           num_warps=4, num_stages=1)
        torch.testing.assert_close(mb.matmul(a, b, backend="triton", config=config), expected,
                                   rtol=1e-3, atol=1e-2)
        grids.append(backend._matmul_statics(problem, config)[0])
    assert grids == [(3 * 3, 1, 1), (3 * 2, 1, 1)]


def _tma_tile():
    from multibackend.backends.triton import configs as backend_module

    return backend_module.tma_tile((32, 32, 32, 4, 1, 8, False))


@pytest.mark.parametrize("what,a,b", [
    ("a batch", (3, 32, 64), (3, 64, 32)),
    ("float64", (32, 64), (64, 32)),
    ("int8", (32, 64), (64, 16)),
    ("a column-major A", (64, 32), (64, 32)),
])
def test_a_persistent_tma_tile_is_refused_for_a_problem_it_is_not_written_for(what, a, b):
    """Before, the tile ran such a problem: a batch's entries past the first unwritten, int8
    and float64 summed in float16 (wrong, or garbage)."""
    gen = torch.Generator().manual_seed(3)
    dtype = {"float64": torch.float64, "int8": torch.int8}.get(what, torch.float16)
    x = torch.randint(-3, 4, a, generator=gen).to(dtype)
    y = torch.randint(-3, 4, b, generator=gen).to(dtype)
    if what == "a column-major A":
        x = x.T
    with pytest.raises(mb.InvalidArgument, match="kind is 'tma': the persistent TMA kernel"):
        mb.matmul(x, y, backend="triton", config=_tma_tile())


def test_a_persistent_tma_tile_reads_only_arrays_the_tma_unit_takes(monkeypatch):
    """One column of D (a unit row stride) is no contiguous row: D is then stored without
    the TMA unit (a descriptor of its 2-byte rows raised); a column-major B goes through the
    TMA unit as its transpose, and so does one row of A."""
    from multibackend.backends.triton import backend as backend_module

    backend = backend_module.TritonBackend
    monkeypatch.setattr(backend, "_sm_count", lambda self, t: 4)
    launched = []
    tma = backend._launch_tma
    monkeypatch.setattr(backend, "_launch_tma",
                        lambda self, *args: (launched.append(True), tma(self, *args)))
    gen = torch.Generator().manual_seed(4)
    ints = lambda *shape: torch.randint(-3, 4, shape, generator=gen).to(torch.float16)  # noqa
    for a, b in [(ints(48, 32), ints(32, 1)), (ints(48, 32), ints(40, 32).T),
                 (ints(1, 32), ints(32, 48))]:
        launched.clear()
        d = mb.matmul(a, b, backend="triton", config=_tma_tile())
        torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=0, atol=0)
        assert launched, (tuple(a.shape), tuple(b.shape))


def test_threads_take_turns_in_the_interpreter():
    """Triton's interpreter is not thread-safe: launches from several threads at once take
    turns, and every result is right."""
    import threading

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter is off (a GPU runs the kernels)")
    shapes = [(9, 17, 33), (33, 9, 17), (17, 33, 9), (16, 16, 16)]
    failures: list[str] = []

    def work(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for m, n, k in shapes:
            a = torch.randint(-3, 4, (m, k), generator=g).half()
            b = torch.randint(-3, 4, (k, n), generator=g).half()
            try:
                got = mb.matmul(a, b, backend="triton")
                if not torch.equal(got, (a.double() @ b.double()).half()):
                    failures.append(f"{seed} {m}x{n}x{k}: wrong")
            except Exception as exc:  # noqa: BLE001 - what a thread raised is the finding
                failures.append(f"{seed} {m}x{n}x{k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


@pytest.mark.parametrize("dtype, special", [(torch.float8_e5m2, float("inf")),
                                            (torch.float8_e4m3fn, float("nan"))])
def test_fp8_inf_and_nan_propagate_in_the_interpreter(dtype, special):
    """Triton's interpreter reads e5m2's Inf as 65536 and e4m3's NaN as 480: the backend hands
    it exactly converted values, so Inf and NaN propagate as on the GPU, repeated calls too."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter is off (a GPU runs the kernels)")
    a = torch.ones(32, 48).to(dtype)
    a[0, 0] = special
    b = torch.ones(16, 48).to(dtype).T  # column-major, as fp8 products take B
    for _ in range(2):  # the first call plans, the second is served by its plan
        d = mb.matmul(a, b, backend="triton")
        want = a.float() @ b.float()
        assert torch.equal(torch.isnan(d), torch.isnan(want))
        assert torch.equal(d.nan_to_num(), want.nan_to_num())


def test_an_unusable_triton_cache_folder_is_replaced_for_the_process(tmp_path):
    """A home where ``~/.triton`` cannot be made: Triton would fail every compile; the backend
    gives it a private temporary folder, and leaves a folder the user named as it is."""
    home = tmp_path / "home-is-a-file"
    home.write_text("x")
    code = ("import os; from multibackend.backends.triton.backend import usable_cache; "
            "usable_cache(); print(os.environ.get('TRITON_CACHE_DIR', ''))")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "TRITON_HOME")}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "HOME": str(home)},
                          capture_output=True, text=True, timeout=120)
    folder = done.stdout.strip()
    assert done.returncode == 0 and "multibackend-triton-" in folder, done.stderr[-2000:]
    assert os.access(folder, os.W_OK)
    named = tmp_path / "named"
    done = subprocess.run([sys.executable, "-c", code],
                          env={**env, "HOME": str(home), "TRITON_CACHE_DIR": str(named)},
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == str(named)


def test_bfloat16_subnormals_are_rounded_as_on_the_gpu_in_the_interpreter():
    """The interpreter reads and rounds bfloat16's subnormals wrongly: the backend hands it
    exactly converted float32 values and rounds D once with torch, so a product (and C) in the
    subnormal range comes out as the GPU's conversion rounds it."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter is off (a GPU runs the kernels)")
    g = torch.Generator().manual_seed(5)
    a = (torch.randn(16, 32, generator=g) * 3e-21).bfloat16()
    b = (torch.randn(32, 16, generator=g) * 1e-19).bfloat16()
    c = (torch.randn(16, 16, generator=g) * 1e-39).bfloat16()
    exact = a.double() @ b.double()
    assert exact.abs().max() < 1.2e-38, "the products lie in bfloat16's subnormal range"
    for _ in range(2):  # planned, then served by the plan
        assert torch.equal(mb.matmul(a, b, backend="triton"), exact.bfloat16())
        assert torch.equal(mb.matmul(a, b, c, backend="triton"), (exact + c.double()).bfloat16())


def _shipped_triton_configs() -> list[dict]:
    """Every Triton config the shipped calibration data names, winners and timed candidates."""
    found = []
    for path in sorted((Path(mb.__file__).parent / "data").glob("calibration-*.json")):
        for entry in json.loads(path.read_text())["entries"].values():
            if entry["backend"] == "triton":
                found.append(entry["config"])
    return found


def test_typed_records_name_every_offered_config_and_make_it_again(monkeypatch):
    """Each Triton config offered on an sm_90 GPU is made by a typed record whose name is
    derived from its fields: reading a config back into its record and making it again
    gives the same config, name included, for every kind (pointer, TMA, split-K, TMA
    split-K) and the dot."""
    from multibackend.backends.triton.records import dot_of, tile_of
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic, synthetic_dot
    from multibackend.gpu import staging

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the GPU's candidates, not the interpreter's
    backend = REGISTRY.get("triton")
    kinds = set()
    for m, n, k in ((1, 4096, 4096), (64, 14336, 4096), (512, 512, 512), (4096, 4096, 4096),
                    (3000, 4097, 1000), (256, 10240, 8192)):
        for b_layout in ("row", "col"):
            problem = synthetic(m, n, k, "float16", cc=(9, 0), b_layout=b_layout)
            for config in backend.configs(problem)[1:]:
                if staging.is_staged(config):
                    continue
                record = tile_of(config)
                kinds.add(record.kind)
                assert record.config() == config and record.name == config.name
    assert kinds == {"pointer", "tma", "splitk", "tma_splitk"}
    dot = backend.configs(synthetic_dot(4096))[0]
    assert dot_of(dot).config() == dot


def test_the_shipped_calibrations_triton_configs_are_records_own():
    """Names written into the shipped data before the records existed are the records' names."""
    from multibackend.backends.triton.records import tile_of
    from multibackend.core.config import Config

    shipped = _shipped_triton_configs()
    assert shipped, "the shipped calibration names Triton configs"
    for data in shipped:
        config = Config.from_dict(data)
        if config.name == "autotune" or config.get("staged"):
            continue
        assert tile_of(config).config() == config, data
