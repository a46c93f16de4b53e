"""GPU tier for the public calls' contract at its edges, on every backend and on the paths a
repeated call takes (the remembered plan, the compiled front): an operand with torch's lazy
negation bit read as its values, also after its plain twin was planned, an ``out`` that
shares memory with an operand refused on every call, empty batches and empty int8 products
answered without a kernel, a handed-in config that cannot cover D refused before
anything runs, host tensors computed on the GPU on every call with D answered on the host (a
host ``out`` written), and the caller's own ``out`` answered."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import multibackend as mb  # noqa: E402
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from tests.helpers import DLPackOnly  # noqa: E402

pytestmark = pytest.mark.gpu

BACKENDS = ("auto", "cublas", "triton", "raw_wmma", "cutlass")


def _ints(shape, seed: int, dtype=torch.float16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=gen, device="cuda").to(dtype)


def _negated(t):
    """A view equal to the float32 ``t`` whose memory holds ``-t`` (torch's negation bit)."""
    view = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert view.is_neg() and torch.equal(view, t)
    return view


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lazily_negated_operand_is_read_as_its_values_on_every_call(backend):
    """First call, remembered plan and compiled front alike (five calls): float32 operands
    (tf32 where a backend rounds to it: small integers are exact there too)."""
    a, b = _ints((96, 64), 1, torch.float32), _ints((64, 80), 2, torch.float32)
    options = {"precision": "tf32"} if backend == "raw_wmma" else {}
    expected = (a.double() @ b.double()).float()
    for _ in range(5):
        d = mb.matmul(_negated(a), b, backend=backend, **options)
        torch.testing.assert_close(d, expected, rtol=0, atol=0)
        d = mb.matmul(a, _negated(b), backend=backend, **options)
        torch.testing.assert_close(d, expected, rtol=0, atol=0)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cutlass"])
def test_a_negated_view_is_not_served_by_the_plan_of_its_plain_twin(backend):
    """``torch.complex(0, t).imag`` and ``torch.complex(0, -t).conj().imag`` are alike in
    dtype, shape, strides and alignment, all a remembered plan's key (and the compiled
    front's) holds; only the second has the negation bit. Planned on the first, the second
    must still be read as its values. (Both are element-strided views, which CUTLASS does
    not take.)"""
    a, b = _ints((96, 64), 9, torch.float32), _ints((64, 80), 10, torch.float32)
    options = {"precision": "tf32"} if backend == "raw_wmma" else {}
    plain = torch.complex(torch.zeros_like(a), a).imag
    expected = (a.double() @ b.double()).float()
    for _ in range(4):  # the first call plans; the front serves from the third
        torch.testing.assert_close(mb.matmul(plain, b, backend=backend, **options), expected,
                                   rtol=0, atol=0)
    for _ in range(2):
        torch.testing.assert_close(mb.matmul(_negated(a), b, backend=backend, **options),
                                   expected, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_sharing_an_operand_is_refused_after_a_plan_was_remembered(backend):
    a, b = _ints((64, 64), 3), _ints((64, 64), 4)
    out = torch.empty((64, 64), dtype=torch.float16, device="cuda")
    for _ in range(2):
        mb.matmul(a, b, out=out, backend=backend)
    torch.testing.assert_close(out, (a.double() @ b.double()).half(), rtol=0, atol=0)
    for alias, name in ((b, "B"), (a, "A")):
        kept = alias.clone()
        with pytest.raises(InvalidArgument, match=f"out shares memory with {name}"):
            mb.matmul(a, b, out=alias, backend=backend)
        assert torch.equal(alias, kept)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a_shape, b_shape", [((0, 32, 16), (16, 24)), ((32, 16), (0, 16, 24)),
                                              ((0, 32, 16), (0, 16, 24))])
def test_a_batch_of_none_gives_torchs_empty_result(backend, a_shape, b_shape):
    a, b = _ints(a_shape, 5), _ints(b_shape, 6)
    for _ in range(2):
        d = mb.matmul(a, b, backend=backend)
        assert d.shape == torch.matmul(a, b).shape == (0, 32, 24)
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", ("cublas", "triton", "cutlass"))
def test_an_empty_int8_product_is_not_held_to_size_rules(backend):
    """cuBLAS's int8 GEMM needs M > 16 and K, N multiples of 8; nothing runs for K = 0 or
    M = 0, so a named backend gives the empty answer."""
    for a_shape, b_shape, d_shape in (((64, 0), (0, 64), (64, 64)), ((0, 64), (64, 64), (0, 64))):
        a = torch.empty(a_shape, dtype=torch.int8, device="cuda")
        b = torch.empty(b_shape, dtype=torch.int8, device="cuda")
        d = mb.matmul(a, b, backend=backend)
        assert d.shape == d_shape and d.dtype == torch.int32 and not d.any()


def test_a_triton_config_that_cannot_cover_d_is_refused_before_launch():
    a, b = _ints((40, 24), 7), _ints((24, 17), 8)
    out = torch.full((40, 17), float("nan"), dtype=torch.float16, device="cuda")
    config = Config.of("mine", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=0, num_warps=4,
                       num_stages=1)
    with pytest.raises(InvalidArgument, match="config is 'mine': GROUP_M is 0"):
        mb.matmul(a, b, out=out, backend="triton", config=config)
    assert torch.isnan(out).all()
    whole = Config.of("mine", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4,
                      num_stages=1)
    d = mb.matmul(a, b, out=out, backend="triton", config=whole)
    torch.testing.assert_close(d, (a.double() @ b.double()).half(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_tensors_are_computed_on_the_gpu_on_every_call(backend):
    """Host torch tensors are copied to the GPU on every call, a repeated one too (no plan
    serves them: it would hand a kernel host pointers); D comes back on the host, as
    ``torch.matmul`` answers host tensors, and a host ``out`` gets D back."""
    a, b = _ints((33, 40), 11).cpu(), _ints((40, 24), 12).cpu()
    expected = (a.double() @ b.double()).half()
    for _ in range(4):
        d = mb.matmul(a, b, backend=backend)
        assert d.device.type == "cpu"
        torch.testing.assert_close(d, expected, rtol=0, atol=0)
    out = torch.empty(33, 24, dtype=torch.float16)
    held = np.empty((33, 24), np.float16)
    for _ in range(4):
        out.fill_(float("nan"))
        assert mb.matmul(a, b, backend=backend, out=out) is out
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        held.fill(np.nan)  # a host array known only through DLPack
        given = DLPackOnly(held)
        assert mb.matmul(a, b, backend=backend, out=given) is given
        torch.testing.assert_close(torch.from_numpy(held), expected, rtol=0, atol=0)


def test_a_dot_of_host_vectors_is_answered_on_the_host():
    x, y = _ints((1000,), 15).cpu(), _ints((1000,), 16).cpu()
    d = mb.dot(x, y)
    assert d.device.type == "cpu" and d.dim() == 0
    assert d.item() == (x.double() @ y.double()).item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_call_with_a_cupy_out_answers_that_array(backend):
    cupy = pytest.importorskip("cupy")
    a, b = cupy.from_dlpack(_ints((33, 40), 13)), cupy.from_dlpack(_ints((40, 24), 14))
    expected = torch.from_dlpack(a).double() @ torch.from_dlpack(b).double()
    out = cupy.empty((33, 24), dtype=cupy.float16)
    for _ in range(4):
        out.fill(float("nan"))
        assert mb.matmul(a, b, backend=backend, out=out) is out
        torch.testing.assert_close(torch.from_dlpack(out).double(), expected, rtol=0, atol=0)
