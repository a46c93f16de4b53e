"""Scaled fp8 products through the public call: ``matmul(A, B, scale_a=..., scale_b=...)`` on
host arrays, run by the host backend and by Triton's scaled kernel in Triton's interpreter (every
granularity pair), checked against the float64 product of the operands times their scales; the
errors of bad scales; which backends take which scales.
"""
from __future__ import annotations

import itertools

import pytest

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.core import scales
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import synthetic

torch = pytest.importorskip("torch")

M, N, K = 40, 72, 300  # K and N ragged against the 128-wide blocks


def _operands(dtype: str = "float8_e4m3fn", seed: int = 3, k: int = K, n: int = N):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, k, generator=gen) * torch.logspace(-2, 2, M).unsqueeze(1)
    w = torch.randn(k, n, generator=gen) * torch.logspace(-1, 1, n)
    return x, w


def _dequantized(values, found, kind, operand):
    rows, cols = values.shape
    return values.double() * scales.expanded(found.double(), kind, operand, rows, cols)


def _interpreting() -> bool:
    from multibackend.backends.triton.configs import interpreting

    return interpreting()


@pytest.mark.parametrize("backend", ["host", "triton"])
@pytest.mark.parametrize("kind_a, kind_b", list(itertools.product(scales.GRANULARITIES,
                                                                  repeat=2)))
def test_every_granularity_pair_on_the_host_matches_the_scaled_product(kind_a, kind_b, backend):
    """Block-wise scales differ from block to block along K (300: two whole blocks and a
    ragged one), so a kernel that applied one block's scale to another's sums fails."""
    if backend == "triton" and not _interpreting():
        pytest.skip("Triton runs host arrays in its interpreter only (TRITON_INTERPRET=1)")
    x, w = _operands()
    x[:, 128:256] *= 50  # scales of the second block of K far from the first's
    w[256:] *= 0.01
    qa, sa = mb.quantize(x, kind_a, operand="A")
    qb, sb = mb.quantize(w, kind_b, operand="B")
    c = torch.randn(M, N, generator=torch.Generator().manual_seed(9))
    d = mb.matmul(qa, qb, c, alpha=0.5, beta=-2.0, scale_a=sa, scale_b=sb, out_dtype="float32",
                  backend=backend)
    a64, b64 = _dequantized(qa, sa, kind_a, "A"), _dequantized(qb, sb, kind_b, "B")
    expected = 0.5 * (a64 @ b64) - 2.0 * c.double()
    size = 0.5 * (a64.abs() @ b64.abs()) + 2.0 * c.double().abs()
    assert bool(((d.double() - expected).abs() <= 1e-5 * size).all())
    report = mb.crosscheck(qa, qb, c, alpha=0.5, beta=-2.0, scale_a=sa, scale_b=sb,
                           out_dtype="float32", time_it=False, backends=(backend,))
    assert report.ok, str(report)


@pytest.mark.parametrize("with_c", [False, True])
@pytest.mark.parametrize("kind_a, kind_b", list(itertools.product(scales.GRANULARITIES,
                                                                  repeat=2)))
def test_the_persistent_tma_kernel_matches_the_scaled_product(kind_a, kind_b, with_c,
                                                             monkeypatch):
    """Triton's scaled TMA kernel (B column-major, D bfloat16) in 32x32x32 tiles, four programs
    walking fourteen output tiles, K = 304 (rows of A and B on the TMA unit's 16-byte grid;
    two whole blocks of 128 and a ragged one), N = 200 (B's block-wise scales in two columns
    of blocks): D stored by the TMA unit without C, through the pointer epilogue with it.
    The interpreter truncates float32 to bfloat16 (a GPU rounds it to nearest): within 2**-7
    of each value."""
    if not _interpreting():
        pytest.skip("Triton runs host arrays in its interpreter only (TRITON_INTERPRET=1)")
    from multibackend.backends.triton import backend as backend_module
    from multibackend.backends.triton import scaled as scaled_module
    from multibackend.backends.triton.configs import tma_tile

    monkeypatch.setattr(backend_module.TritonBackend, "_sm_count", lambda self, t: 4)
    launched = []
    tma = scaled_module._launch_tma
    monkeypatch.setattr(scaled_module, "_launch_tma",
                        lambda *args: (launched.append(True), tma(*args)))
    x, w = _operands(k=304, n=200)
    x[:, 128:256] *= 50
    w[256:] *= 0.01
    w[:, 128:] *= 30  # B's second column of blocks scaled far from its first
    qa, sa = mb.quantize(x, kind_a, operand="A")
    qb, sb = mb.quantize(w, kind_b, operand="B")
    qb = qb.T.contiguous().T
    c = (torch.randn(M, 200, generator=torch.Generator().manual_seed(9)).bfloat16() if with_c
         else None)
    d = mb.matmul(qa, qb, c, alpha=0.5, beta=-2.0 if with_c else None, scale_a=sa,
                  scale_b=sb, out_dtype="bfloat16", backend="triton",
                  config=tma_tile((32, 32, 32, 4, 1, 8, False)))
    a64, b64 = _dequantized(qa, sa, kind_a, "A"), _dequantized(qb, sb, kind_b, "B")
    expected, size = 0.5 * (a64 @ b64), 0.5 * (a64.abs() @ b64.abs())
    if with_c:
        expected, size = expected - 2.0 * c.double(), size + 2.0 * c.double().abs()
    assert launched
    assert bool(((d.double() - expected).abs() <= 2**-7 * expected.abs() + 1e-5 * size).all())


@pytest.mark.parametrize("m, kinds, b_layout, out, first", [
    (4096, ("tensor", "tensor"), "col", "bfloat16", (256, 128)),
    (4096, ("row", "row"), "col", "float16", (256, 128)),
    (4096, ("block", "block"), "col", "bfloat16", (128, 256)),
    (4096, ("row", "block"), "col", "bfloat16", (128, 256)),
    (64, ("block", "block"), "col", "bfloat16", (64, 128)),
    (4096, ("tensor", "tensor"), "row", "bfloat16", None),
    (4096, ("tensor", "tensor"), "col", "float32", None),
])
def test_a_scaled_problem_is_offered_the_tma_tiles_written_for_it(m, kinds, b_layout, out, first):
    """On sm_90 (checked from the problem's numbers): the persistent TMA tiles first, in the
    order of the shape and the scales, for fp8 with B column-major and a 16-bit D; else the
    pointer tiles only, and a TMA tile named by the caller refused with the rule."""
    from multibackend.backends.triton import backend as backend_module
    from multibackend.backends.triton.configs import SCALED_TMA_TILES, tma_tile
    from multibackend.backends.triton.records import tile_of

    problem = synthetic(m, 4096, 4096, "float8_e4m3fn", b_layout=b_layout, out_dtype=out,
                        cc=(9, 0)).with_(scales=kinds)
    backend = REGISTRY.get("triton")
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(backend_module, "interpreting", lambda: False)
    try:
        offered = [tile_of(c) for c in backend.configs(problem)]
    finally:
        monkeypatch.undo()
    tma = [t for t in offered if t.kind == "tma"]
    if first is None:
        assert not tma and offered
        fault = backend.check_config(problem, tma_tile(SCALED_TMA_TILES[0]))
        assert fault is not None and "scaled persistent TMA kernel" in fault, fault
    else:
        assert offered[0].kind == "tma" and (offered[0].block_m, offered[0].block_n) == first
        assert len(tma) == len(SCALED_TMA_TILES)
        assert all(backend.check_config(problem, t.config()) is None for t in tma)


def test_first_call_autotuning_of_a_scaled_problem_times_its_first_tile(monkeypatch):
    """A scaled problem's configs have no "autotune" placeholder ahead of them: the
    shortlist starts at the first tile offered, not the second."""
    from multibackend.backends.triton import backend as backend_module

    problem = synthetic(4096, 4096, 4096, "float8_e4m3fn", b_layout="col", cc=(9, 0)).with_(
        scales=("row", "row"))
    monkeypatch.setattr(backend_module, "interpreting", lambda: False)
    backend = REGISTRY.get("triton")
    offered = backend.configs(problem)
    assert offered[0].name != "autotune" and offered[0] in backend._shortlist(problem, 132)


def test_e5m2_with_a_number_as_a_scale_and_bfloat16_out():
    x, w = _operands()
    qa, sa = mb.quantize(x, "row", dtype="float8_e5m2", operand="A")
    qb = w.to(torch.float8_e5m2)
    d = mb.matmul(qa, qb, scale_a=sa, scale_b=0.25, out_dtype="bfloat16", backend="host")
    a64, b64 = _dequantized(qa, sa, "row", "A"), qb.double() * 0.25
    expected, size = a64 @ b64, a64.abs() @ b64.abs()
    assert d.dtype == torch.bfloat16  # rounded once (unit roundoff 2**-8), float32 sums
    assert bool(((d.double() - expected).abs() <= 2**-8 * expected.abs() + 1e-5 * size).all())


def test_a_repeated_call_reads_the_scales_it_is_given():
    """No remembered plan replays the first call's scales: doubling them doubles D."""
    x, w = _operands()
    qa, sa = mb.quantize(x, "tensor", operand="A")
    qb, sb = mb.quantize(w, "row", operand="B")
    first = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32")
    again = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32")
    doubled = mb.matmul(qa, qb, scale_a=sa * 2, scale_b=sb, out_dtype="float32")
    assert torch.equal(again, first) and torch.equal(doubled, first * 2)


@pytest.mark.parametrize("arguments, words", [
    ({"scale_a": torch.ones(M, 7)}, (r"scale_a is \(40, 7\) but A is \(40, 300\): scale_a "
                                     r"must be a scalar \(tensor-wise\), \(40,\) or \(40, 1\)")),
    ({"scale_b": torch.ones(N, 1)}, r"scale_b is \(72, 1\) but B is \(300, 72\)"),
    ({"scale_a": torch.ones(M, dtype=torch.float64)}, "scale_a is .* float64: scales are float32"),
])
def test_a_bad_scale_is_named_with_the_rule(arguments, words):
    qa = torch.ones(M, K).to(torch.float8_e4m3fn)
    qb = torch.ones(K, N).to(torch.float8_e4m3fn)
    with pytest.raises(InvalidArgument, match=words):
        mb.matmul(qa, qb, **arguments)


def test_scales_apply_to_fp8_operands_only():
    with pytest.raises(InvalidArgument, match="scale_a is given but A is float16: scales apply "
                                              "to fp8 operands"):
        mb.matmul(torch.ones(4, 4, dtype=torch.float16), torch.ones(4, 4, dtype=torch.float16),
                  scale_a=torch.ones(()))


def test_scaled_products_take_2d_operands():
    qa = torch.ones(2, 8, 16).to(torch.float8_e4m3fn)
    qb = torch.ones(16, 8).to(torch.float8_e4m3fn)
    with pytest.raises(InvalidArgument, match="A or B is 3-D: scaled fp8 products take 2-D"):
        mb.matmul(qa, qb, scale_b=torch.ones(()))


@pytest.mark.parametrize("kinds, out, accepts", [
    (("tensor", "tensor"), "float32", {"cublas", "triton"}),
    (("row", "row"), "bfloat16", {"cublas", "triton"}),
    (("row", "row"), "float32", {"triton"}),  # torch._scaled_mm scales rows into bf16 only
    (("block", "block"), "bfloat16", {"triton"}),
    (("tensor", "row"), "bfloat16", {"triton"}),
])
def test_which_gpu_backends_take_which_scales(kinds, out, accepts):
    """On an sm_90 problem (checked from its numbers: no GPU needed), cuBLAS takes tensor-
    and row-wise pairs, Triton every pair; CUTLASS, which multiplies fp8, refuses scales with
    the rule that says so (raw WMMA has no fp8 kernel)."""
    problem = synthetic(256, 512, 1024, "float8_e4m3fn", b_layout="col", out_dtype=out,
                        cc=(9, 0)).with_(scales=kinds)
    taken = set()
    for name in ("cublas", "triton", "raw_wmma", "cutlass"):
        reason = REGISTRY.get(name).capability.check(problem)
        if reason is None:
            taken.add(name)
        else:
            assert reason.rule == ("dtype" if name == "raw_wmma" else "scales"), str(reason)
            assert name == "raw_wmma" or f"A {kinds[0]}-wise with B {kinds[1]}-wise" in \
                reason.message or (name == "cublas" and "bfloat16" in reason.message)
    assert taken == accepts


def test_a_scaled_call_under_torch_compile_is_refused_naming_why(monkeypatch):
    from multibackend import eager

    monkeypatch.setattr(eager, "_compiling", lambda: True)
    qa = torch.ones(16, 16).to(torch.float8_e4m3fn)
    with pytest.raises(InvalidArgument, match="not traced by torch.compile"):
        mb.matmul(qa, qa, scale_a=torch.ones(()))


def test_triton_offers_scaled_products_only_tiles_whose_steps_lie_in_one_block():
    """A step of K in one scale block, and the tensor cores' sums added in float32 after at
    most 128 elements of K, whatever the scales."""
    from multibackend.backends.triton.configs import pointer_tile
    from multibackend.backends.triton.scaled import config_fault

    problem = synthetic(256, 512, 1024, "float8_e4m3fn", b_layout="col", cc=(9, 0)).with_(
        scales=("block", "tensor"))
    for kinds in (("block", "tensor"), ("row", "row")):
        for block_k in (96, 256):
            fault = config_fault(problem.with_(scales=kinds),
                                 pointer_tile((64, 64, block_k, 4, 3, 8)))
            assert f"BLOCK_K {block_k}: scaled fp8 products need a BLOCK_K dividing 128" \
                in fault, fault
        assert config_fault(problem.with_(scales=kinds),
                            pointer_tile((64, 64, 64, 4, 3, 8))) is None
    offered = REGISTRY.get("triton").configs(problem)
    assert offered and all(config_fault(problem, c) is None for c in offered)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="host tensors are copied to the GPU on every call where there is one")
def test_a_repeated_scaled_call_runs_its_plan_with_the_scales_it_is_given(monkeypatch):
    """The second call with scales of the same shapes is not validated again (its plan runs),
    yet reads its own scales; scales of another granularity make a new plan; an ``out`` is
    written and answered."""
    from multibackend import eager
    from multibackend.run import plans

    plans.forget()  # no plan of another test's calls of these shapes
    x, w = _operands()
    qa, sa = mb.quantize(x, "block", operand="A")
    qb, sb = mb.quantize(w, "row", operand="B")
    first = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32")
    validated = []
    real = eager.matmul_call
    monkeypatch.setattr(eager, "matmul_call", lambda *a, **k: validated.append(1) or real(*a, **k))
    halved = mb.matmul(qa, qb, scale_a=sa / 2, scale_b=sb.clone(), out_dtype="float32")
    assert validated == [] and torch.equal(halved, first / 2)
    out = torch.full((M, N), float("nan"))
    assert mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32", out=out) is out
    assert torch.equal(out, first)
    again = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32", out=out)
    assert again is out and len(validated) == 1  # the call with out planned once
    tensor_wise = mb.matmul(qa, qb, scale_a=sa.amax(), scale_b=sb, out_dtype="float32")
    assert len(validated) == 2
    a64 = qa.double() * float(sa.amax())
    expected = a64 @ (qb.double() * sb.double())
    assert bool(((tensor_wise.double() - expected).abs()
                 <= 1e-5 * (a64.abs() @ (qb.double() * sb.double()).abs())).all())


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="host tensors are copied to the GPU on every call where there is one")
def test_a_missing_scale_on_a_repeated_call_is_float32_whatever_the_default_dtype():
    x, w = _operands()
    qa, sa = mb.quantize(x, "row", operand="A")
    qb = w.to(torch.float8_e4m3fn)
    first = mb.matmul(qa, qb, scale_a=sa, out_dtype="float32")
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        again = mb.matmul(qa, qb, scale_a=sa, out_dtype="float32")
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(again, first)
