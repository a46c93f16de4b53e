"""GPU tier of scaled fp8 products against the float64 product of the operands times their
scales: cuBLAS (``torch._scaled_mm``) with tensor- and row-wise scales, through ``auto`` and by
name; Triton's scaled kernels (the persistent TMA one and the pointer one) with every pair of
granularities (block-wise through ``auto``, which cuBLAS cannot take) and in every config
offered."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import multibackend as mb
from multibackend.core import scales
from multibackend.io.request import matmul_call
from multibackend.verify import checks, reference

pytestmark = pytest.mark.gpu

M, N, K = 256, 384, 1024


def _quantized(kind_a: str, kind_b: str, seed: int):
    """e4m3 A (row-major) and B (column-major), quantized from magnitudes spread over four
    decades, with their scales."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda") * torch.logspace(
        -2, 2, M, device="cuda").unsqueeze(1)
    w = torch.randn(N, K, generator=gen, device="cuda")
    qa, sa = mb.quantize(x, kind_a, operand="A")
    qw, sw = mb.quantize(w.T, kind_b, operand="B")
    return qa, qw.T.contiguous().T, sa, sw


def _check(d, qa, qb, sa, sb, out):
    """``d`` against the float64 product of the operands times their scales, within the
    library's bound for the problem (which counts Hopper's ~14-bit fp8 accumulator over K)."""
    call = matmul_call(qa, qb, scale_a=sa, scale_b=sb, out_dtype=out)
    result = reference.compare(call.problem, d.view(1, M, N), checks.reference_for(call))
    assert result.ok, f"{call.problem.describe()}: {result.detail}"


@pytest.mark.parametrize("backend", ["auto", "cublas"])
@pytest.mark.parametrize("kinds, out", [(("tensor", "tensor"), "float32"),
                                        (("tensor", "tensor"), "bfloat16"),
                                        (("row", "row"), "bfloat16")])
def test_cublas_applies_the_scales(backend, kinds, out):
    qa, qb, sa, sb = _quantized(*kinds, seed=11)
    assert mb.explain(qa, qb, scale_a=sa, scale_b=sb, out_dtype=out).backend == "cublas"
    d = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype=out, backend=backend)
    _check(d, qa, qb, sa, sb, out)
    report = mb.crosscheck(qa, qb, scale_a=sa, scale_b=sb, out_dtype=out, time_it=False,
                           backends=("cublas",))
    assert report.ok, str(report)


@pytest.mark.parametrize("kinds", [(a, b) for a in scales.GRANULARITIES
                                   for b in scales.GRANULARITIES])
def test_triton_applies_every_pair_of_scales(kinds):
    qa, qb, sa, sb = _quantized(*kinds, seed=12)
    d = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16", backend="triton")
    _check(d, qa, qb, sa, sb, "bfloat16")


@pytest.mark.parametrize("with_c", [True, False])
@pytest.mark.parametrize("k", [1040, 1000])
@pytest.mark.parametrize("kinds", [("row", "tensor"), ("block", "block")])
def test_every_scaled_triton_config_on_a_ragged_shape(kinds, k, with_c):
    """Each config Triton offers the scaled problem (the persistent TMA tiles where A's and
    B's rows lie on the 16-byte grid, K = 1040; the pointer tiles always), 200 x 328 (no
    tile divides it), K ragged against the 128-wide blocks, alpha, and C with beta or none (D
    then stored by the TMA unit, its rows on the 16-byte grid)."""
    from multibackend.backends.triton.records import tile_of
    from multibackend.choose.registry import REGISTRY

    gen = torch.Generator(device="cuda").manual_seed(15)
    m, n = 200, 328
    x = torch.randn(m, k, generator=gen, device="cuda")
    w = torch.randn(n, k, generator=gen, device="cuda")
    qa, sa = mb.quantize(x, kinds[0], operand="A")
    qw, sw = mb.quantize(w.T, kinds[1], operand="B")
    qb = qw.T.contiguous().T
    c = torch.randn(m, n, generator=gen, device="cuda").bfloat16() if with_c else None
    beta = 2.0 if with_c else None
    call = matmul_call(qa, qb, c, alpha=0.5, beta=beta, scale_a=sa, scale_b=sw,
                       out_dtype="bfloat16")
    configs = REGISTRY.get("triton").configs(call.problem)
    assert (tile_of(configs[0]).kind == "tma") == (k == 1040)
    expected = checks.reference_for(call)
    for config in configs:
        d = mb.matmul(qa, qb, c, alpha=0.5, beta=beta, scale_a=sa, scale_b=sw,
                      out_dtype="bfloat16", backend="triton", config=config)
        result = reference.compare(call.problem, d.view(1, m, n), expected)
        assert result.ok, f"{config.name}: {result.detail}"


def test_block_scales_go_to_triton_through_auto():
    qa, qb, sa, sb = _quantized("block", "block", seed=13)
    decision = mb.explain(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16")
    assert decision.backend == "triton", str(decision)
    d = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16")
    _check(d, qa, qb, sa, sb, "bfloat16")


@pytest.mark.parametrize("kinds", [("row", "row"), ("block", "tensor")])
def test_a_repeated_scaled_call_is_captured_and_replayed_with_new_scales(kinds):
    """After a first call outside, the call runs its plan inside a capture (cuBLAS for
    row-wise scales, Triton for block-wise ones); the replay reads the scales' memory as it
    is then. A first call inside a capture says how to fix it."""
    qa, qb, sa, sb = _quantized(*kinds, seed=14)
    first = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16")
    sa.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, (first.float() * 2).bfloat16())
    other = torch.cuda.CUDAGraph()
    with pytest.raises(mb.CaptureError, match="call it once with the same arguments"), \
            torch.cuda.graph(other):
        mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="float32")


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("granularity", ["row", "block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_one_kernel_quantization_is_quantize_bit_for_bit(dtype, granularity, fp8):
    """Triton's one-kernel quantization of an fp8 layer's input against the torch operations
    of :func:`multibackend.quantize`, on random rows of magnitudes over six decades (ties and
    values rounded up to a power of two among them), a zero row, K ragged against 128."""
    from multibackend.backends.triton.quantize import quantize_rows

    gen = torch.Generator(device="cuda").manual_seed(21)
    for rows, cols in ((300, 4100), (1, 14336), (7, 100)):
        x = (torch.randn(rows, cols, generator=gen, device="cuda") * torch.logspace(
            -3, 3, rows, device="cuda").unsqueeze(1)).to(dtype)
        if rows > 2:
            x[rows // 2] = 0
        values, scales = quantize_rows(x, granularity, fp8)
        expected_values, expected_scales = mb.quantize(x, granularity, dtype=fp8, operand="A")
        assert torch.equal(scales, expected_scales)
        assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))


def test_an_fp8_layer_quantizes_its_input_in_one_kernel(monkeypatch):
    """Fp8Linear's input goes through the one-kernel quantization on the GPU, and the layer's
    output is the one the torch operations' quantization gives."""
    from multibackend import nn as mb_nn
    from multibackend.backends.triton import quantize as quantize_module

    calls = []
    one_kernel = quantize_module.quantize_rows
    monkeypatch.setattr(quantize_module, "quantize_rows",
                        lambda *args: (calls.append(args[1]), one_kernel(*args))[1])
    layer = mb_nn.Fp8Linear(4096, 1024, device="cuda", dtype=torch.bfloat16, fp8="row")
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = layer(x)
        qa, sa = mb.quantize(x, "row", operand="A")
        _, values, scales = layer._fp8_weight
        expected = mb.matmul(qa, values, layer.bias.expand(64, 1024), scale_a=sa,
                             scale_b=scales, out_dtype="bfloat16")
    assert calls == ["row"] and torch.equal(got, expected)
