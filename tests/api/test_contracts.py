"""CPU tier for the public calls' contract at its edges: what a repeated call still checks,
configs a caller makes, torch's lazy negation, empty batches, products answered without a
kernel, and settings or cache files that are wrong. Runs without a GPU (Triton's
interpreter)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import multibackend as mb
from multibackend.choose import tables as tuning
from multibackend.core import packing
from multibackend.core.config import Config
from multibackend.core.errors import (
    BackendUnavailable,
    CacheUnusable,
    InvalidArgument,
    InvalidType,
    UnsupportedProblem,
)
from multibackend.gpu import cache
from multibackend.io.request import matmul_call
from multibackend.run import fastcall
from tests.helpers import DLPackOnly, poisoned, random_tensor

interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="runs Triton's interpreter on host tensors")


def _pair(m: int, k: int, n: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (random_tensor((m, k), dtype, generator=gen, small_int=True),
            random_tensor((k, n), dtype, generator=gen, small_int=True))


# -- a repeated call keeps the checks of its first ----------------------------------------
def _slab(count: int, seed: int) -> list:
    """``count`` 40x40 float32 matrices of small integers, carved from one buffer 256 bytes
    apart in alignment terms (each starts on a multiple of 64 elements): alike in everything
    a remembered plan's key holds."""
    gen = torch.Generator().manual_seed(seed)
    slab = random_tensor((count * 1600,), torch.float32, generator=gen, small_int=True)
    return [slab[i * 1600:(i + 1) * 1600].view(40, 40) for i in range(count)]


@interpreter_only
def test_out_sharing_an_operand_is_refused_on_a_repeated_call_too(monkeypatch):
    """The plan a call remembers is keyed by shapes, strides and alignment, not addresses: a
    later call of that key whose out is A, B or C must still be refused, not computed in
    place. The refusing calls are served by the plan (they never reach validation)."""
    from multibackend import eager

    a, b, c, separate, other = _slab(5, 1)
    first = mb.matmul(a, b, out=separate, backend="triton")
    assert torch.equal(first, a.double().matmul(b.double()).float())
    mb.matmul(a, b, c, out=other, backend="triton")
    validated = []
    real = eager.matmul_call
    monkeypatch.setattr(eager, "matmul_call", lambda *x, **kw: validated.append(1) or real(*x, **kw))
    for args, name in (((a, b), "B"), ((a, b), "A"), ((a, b, c), "C")):
        out = {"A": a, "B": b, "C": c}[name]
        kept = out.clone()
        with pytest.raises(InvalidArgument, match=f"out shares memory with {name}"):
            mb.matmul(*args, out=out, backend="triton")
        assert torch.equal(out, kept)
    assert not validated
    assert torch.equal(mb.matmul(a, b, out=separate, backend="triton"), first)


# -- configs a caller makes -----------------------------------------------------------------
@pytest.mark.parametrize("params, words", [
    ({"GROUP_M": 0}, "GROUP_M is 0: expected a whole number of at least 1"),
    ({"BLOCK_M": 24}, "BLOCK_M is 24: a tile size is a power of two of at least 16"),
    ({"BLOCK_K": 8}, "BLOCK_K is 8: a tile size is a power of two of at least 16"),
    ({"num_warps": 3}, "num_warps is 3: expected a power of two from 1 to 32"),
    ({"num_stages": 0}, "num_stages is 0"),
    ({"GROUP_M": None}, "it gives no GROUP_M"),
    ({"kind": "wide"}, "kind is 'wide'"),
    ({"kind": "splitk", "SPLIT_K": 0, "GROUP_M": None}, "SPLIT_K is 0"),
    ({"kind": "tma_splitk", "SPLIT_K": 1, "BLOCK_N": 112, "GROUP_M": None},
     "BLOCK_N is 112: a TMA split-K tile's width"),
])
def test_a_handed_in_triton_config_that_cannot_cover_d_is_refused(params, words):
    """Nothing is launched, and the error names the config, the parameter and the rule."""
    base = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 1}
    config = Config.of("mine", **{k: v for k, v in {**base, **params}.items() if v is not None})
    a, b = _pair(40, 24, 17, 4)
    out = poisoned((40, 17), torch.float32)
    with pytest.raises(InvalidArgument, match=f"config is 'mine': {words}"):
        mb.matmul(a, b, out=out, backend="triton", config=config)
    assert torch.isnan(out).all()


def test_an_8_bit_product_needs_a_block_k_of_32():
    """Triton's dot takes K steps of at least 32 for 8-bit inputs: 16 would fail to
    compile at launch."""
    config = Config.of("mine", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4,
                       num_stages=1)
    a = torch.ones((8, 64), dtype=torch.int8)
    with pytest.raises(InvalidArgument, match="BLOCK_K is 16: .* at least 32"):
        mb.matmul(a, a.T.contiguous(), backend="triton", config=config)


def test_a_config_without_parameters_is_refused():
    a, b = _pair(8, 8, 8, 5)
    with pytest.raises(InvalidArgument, match="config is 'bogus': it gives no BLOCK_M"):
        mb.matmul(a, b, backend="triton", config=Config("bogus"))


def test_every_config_triton_offers_passes_its_own_check(monkeypatch):
    """The rule refuses no config the backend offers itself, on sm_90 shapes of each kind:
    skinny (split-K and TMA split-K, widths of two powers), few-tile, large, misaligned (the
    GPU's candidates, not the interpreter's)."""
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    triton = REGISTRY.get("triton")
    seen = 0
    for dtype in ("float16", "bfloat16", "float32", "int8"):
        for shape in ((4096, 4096, 4096), (8, 4096, 4096), (1536, 1536, 1536),
                      (1, 128256, 4096), (128, 128, 65536), (7, 11008, 4095), (33, 17, 9)):
            problem = synthetic(*shape, dtype, cc=(9, 0))
            if triton.supports(problem) is not None:
                continue
            for config in triton.configs(problem):
                seen += 1
                assert triton.check_config(problem, config) is None, config
    assert seen > 100


@interpreter_only
def test_a_handed_in_config_that_holds_runs_whole():
    a, b = _pair(40, 24, 17, 6)
    config = Config.of("mine", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4,
                       num_stages=1)
    out = poisoned((40, 17), torch.float32)
    d = mb.matmul(a, b, out=out, backend="triton", config=config)
    assert torch.equal(d, a.double().matmul(b.double()).float())


# -- torch's lazy negation ---------------------------------------------------------------------
@interpreter_only
def test_a_lazily_negated_operand_is_read_as_its_values():
    """``z.conj().imag`` is a view whose memory holds the negation of its values (torch's
    negation bit); read raw it gives -(A @ B). Every call, first or repeated, resolves it."""
    a, b = _pair(16, 8, 12, 7)
    negated = torch.complex(torch.zeros_like(a), -a).conj().imag
    assert negated.is_neg() and torch.equal(negated, a)
    expected = a.double().matmul(b.double()).float()
    for _ in range(3):
        assert torch.equal(mb.matmul(negated, b, backend="triton"), expected)
        assert torch.equal(mb.matmul(a, torch.complex(torch.zeros_like(b), -b).conj().imag,
                                     backend="triton"), expected)
    out = torch.complex(torch.zeros(16, 12), torch.zeros(16, 12)).conj().imag
    with pytest.raises(InvalidArgument, match="out has torch's negation bit set"):
        mb.matmul(a, b, out=out, backend="triton")


# -- empty batches and products answered without a kernel -------------------------------------
@pytest.mark.parametrize("a_shape, b_shape", [
    ((0, 2, 3), (3, 4)), ((2, 3), (0, 3, 4)), ((0, 2, 3), (0, 3, 4)), ((1, 2, 3), (0, 3, 4))])
def test_a_batch_of_none_gives_an_empty_result_like_torch(a_shape, b_shape):
    a, b = torch.ones(a_shape), torch.ones(b_shape)
    assert mb.matmul(a, b).shape == torch.matmul(a, b).shape == (0, 2, 4)
    assert matmul_call(a, b).problem.batch == 0
    assert mb.explain(a, b).rule == "trivial"


def test_k_of_zero_saturates_beta_c_when_asked():
    c = torch.tensor([[float("nan"), float("inf")], [-float("inf"), 3.0]]).half()
    empty_a, empty_b = torch.empty(2, 0).half(), torch.empty(0, 2).half()
    d = mb.matmul(empty_a, empty_b, c, beta=0.5, saturate=True)
    big = torch.finfo(torch.float16).max
    assert torch.equal(d, torch.tensor([[0.0, big], [-big, 1.5]]).half())
    assert torch.equal(mb.matmul(empty_a[:1], empty_b[:, :1], c[1:, 1:].clone(), beta=1e6,
                                 saturate=True), torch.tensor([[big]]).half())
    plain = mb.matmul(empty_a, empty_b, c, beta=0.5)
    assert torch.isnan(plain[0, 0]) and torch.isinf(plain[0, 1])


def test_k_of_zero_keeps_the_rules_of_a_real_call():
    """A config, dtypes no backend computes, an unknown autotune value: refused as they are
    where K > 0."""
    empty_a, empty_b = torch.empty(2, 0).half(), torch.empty(0, 2).half()
    with pytest.raises(InvalidArgument, match="backend is 'auto'"):
        mb.matmul(empty_a, empty_b, config="nonsense")
    with pytest.raises(UnsupportedProblem, match="no backend computes .* at any size"):
        mb.matmul(empty_a, empty_b, acc_dtype="int32")
    with pytest.raises(UnsupportedProblem, match="not int8"):
        mb.matmul(empty_a, empty_b, out_dtype="int8")
    with pytest.raises(InvalidArgument, match="autotune is 'junk'"):
        mb.matmul(empty_a, empty_b, autotune="junk")
    with pytest.raises(InvalidArgument, match="autotune is 'junk'"):
        mb.matmul(empty_a, empty_b, backend="triton", autotune="junk")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_named_backend_that_cannot_run_here_is_refused_at_any_k():
    """matmul raises, also where K = 0; explain answers with the same words."""
    for k in (0, 3):
        with pytest.raises(BackendUnavailable, match="backend='cublas' cannot run"):
            mb.matmul(torch.ones(2, k), torch.ones(k, 2), backend="cublas")
    decision = mb.explain(torch.ones(2, 3), torch.ones(3, 2), backend="cublas")
    assert (decision.backend, decision.rule) == (None, "none")
    assert "backend='cublas' cannot run" in decision.detail


def test_explain_answers_an_empty_product_as_the_call_would():
    empty_a, empty_b = torch.empty(2, 0).half(), torch.empty(0, 2).half()
    refused = mb.explain(empty_a, empty_b, acc_dtype="int32")
    assert (refused.backend, refused.rule) == (None, "none")
    assert "no backend computes" in refused.detail
    assert mb.explain(empty_a, empty_b).rule == "trivial"


@interpreter_only
def test_an_empty_product_is_not_held_to_a_backends_size_rules():
    """Sizes and layouts are not checked where no kernel runs: an int8 product with K = 0
    on a named backend gives zeros, as with K > 0 it would give the product."""
    empty_a, empty_b = torch.empty(64, 0, dtype=torch.int8), torch.empty(0, 64, dtype=torch.int8)
    d = mb.matmul(empty_a, empty_b, backend="triton")
    assert d.dtype == torch.int32 and torch.equal(d, torch.zeros(64, 64, dtype=torch.int32))


def test_k_of_zero_with_an_fp8_product_scales_c():
    empty_a, empty_b = (torch.empty(2, 0).to(torch.float8_e4m3fn),
                        torch.empty(0, 2).to(torch.float8_e4m3fn))
    d = mb.matmul(empty_a, empty_b, torch.full((2, 2), 3.0), beta=-0.5)
    assert torch.equal(d, torch.full((2, 2), -1.5))


# -- arguments named with their rule ----------------------------------------------------------
@pytest.mark.parametrize("call, words", [
    (lambda v: packing.pack_int4(v, dim=2), r"dim is 2 but values is \(3, 4\): dim must be an "
                                            r"axis of values, in -2..1"),
    (lambda v: packing.pack_int4(v, dim=-3), "dim is -3"),
    (lambda v: packing.pack_bits(v.clamp(0, 1), dim=7), "dim is 7"),
    (lambda v: packing.unpack_bits(v.to(torch.uint8), dim=2), "dim is 2 but packed"),
    (lambda v: packing.pack_int4(v[0, 0]), "values is 0-d"),
    (lambda v: packing.unpack_int4(v[0, 0].to(torch.uint8)), "packed is 0-d"),
])
def test_packing_along_an_axis_the_tensor_lacks_is_an_error(call, words):
    with pytest.raises(InvalidArgument, match=words):
        call(torch.zeros(3, 4, dtype=torch.int8))


def test_packing_along_every_axis_it_has_round_trips():
    values = torch.randint(-8, 8, (3, 4), generator=torch.Generator().manual_seed(8))
    for dim in (0, 1, -1, -2):
        packed = packing.pack_int4(values, dim=dim)
        assert torch.equal(packing.unpack_int4(packed, dim=dim, length=values.shape[dim]),
                           values.to(torch.int8))


def test_a_dot_accumulator_must_be_an_array_dtype():
    with pytest.raises(InvalidArgument, match="acc_dtype is 'bool': dot returns its accumulator"):
        mb.dot(torch.ones(4), torch.ones(4), acc_dtype="bool")


def test_integer_alpha_and_beta_are_int32():
    a = np.ones((4, 4), np.int8)
    with pytest.raises(InvalidArgument, match=r"alpha is 18446744073709551616 .* int32"):
        mb.matmul(a, a, alpha=2**64)
    with pytest.raises(InvalidArgument, match=r"beta is -2147483649 .* int32"):
        mb.matmul(a, a, np.zeros((4, 4), np.int32), beta=-2**31 - 1)


def test_a_dtype_name_with_stray_characters_is_refused():
    with pytest.raises(InvalidArgument, match="out_dtype is \"float32'\\)>\\)\\)\""):
        mb.explain(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32),
                   out_dtype="float32')>))")
    from multibackend.core import dtypes

    assert dtypes.canonical(np.dtype("float16")) == dtypes.canonical(np.float16) == "float16"


def test_crosscheck_takes_one_name_and_refuses_c_for_a_dot():
    from multibackend.io.request import call_for

    with pytest.raises(InvalidArgument, match="dot: C is given but x is 1-D"):
        call_for(np.ones(4, np.float32), np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(InvalidArgument, match="backend is 'tritonx'"):
        mb.crosscheck(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32),
                      backends="tritonx", time_it=False)


def test_a_crosscheck_where_no_backend_ran_does_not_pass():
    """A report is ok only where some backend ran and every one that ran matched: one where
    each backend refused the problem checked nothing."""
    from multibackend.verify.crosscheck import BackendResult, Report

    refused = [BackendResult("raw_wmma", False, reason="no CUDA GPU visible"),
               BackendResult("cublas", False, reason="no CUDA GPU visible")]
    report = Report("matmul 4x4x4", "k", "TFLOP/s", list(refused))
    assert report.ran == 0 and not report.ok
    assert report.to_dict()["ok"] is False and report.to_dict()["ran"] == 0
    assert "no backend ran" in str(report)
    report.results.append(BackendResult("triton", True, ok=True))
    assert report.ran == 1 and report.ok and "no backend ran" not in str(report)
    report.results.append(BackendResult("cutlass", True, ok=False, detail="wrong"))
    assert report.ran == 2 and not report.ok


@interpreter_only
def test_crosscheck_of_backends_that_cannot_run_here_is_not_ok():
    a = np.ones((4, 4), np.float32)
    report = mb.crosscheck(a, a, backends=("raw_wmma",), time_it=False)
    assert [r.supported for r in report.results] == [False, False]
    assert report.ran == 0 and not report.ok
    assert mb.crosscheck(a, a, backends="triton", time_it=False).ok


def test_patch_names_a_bad_backend_at_once():
    from multibackend import nn

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(InvalidArgument, match="patch: backend is 'magic'"):
        nn.patch(model, backend="magic")
    assert type(model[0]) is torch.nn.Linear


@interpreter_only
def test_arrays_whose_memory_is_not_their_values_are_read_or_refused():
    """Big-endian NumPy data is read as its values; masked elements, a read-only out and a
    sparse tensor are refused by name."""
    a = np.arange(16, dtype=">f4").reshape(4, 4)
    np.testing.assert_array_equal(mb.matmul(a, a, backend="triton"),
                                  a.astype("<f8") @ a.astype("<f8"))
    ones = np.ones((4, 4), np.float32)
    masked = np.ma.masked_array(ones, mask=np.eye(4))
    with pytest.raises(InvalidArgument, match="A is a masked NumPy array with masked elements"):
        mb.matmul(masked, ones)
    np.testing.assert_array_equal(mb.matmul(np.ma.masked_array(ones), ones, backend="triton"),
                                  ones @ ones)
    frozen = np.zeros((4, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InvalidArgument, match="out is a read-only NumPy array"):
        mb.matmul(ones, ones, out=frozen)
    with pytest.raises(InvalidArgument, match="B is a sparse_coo tensor: .* B.to_dense"):
        mb.matmul(torch.ones(4, 4), torch.eye(4).to_sparse())


class _DLPackOnly:
    """An array known only by the DLPack protocol."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@interpreter_only
def test_a_dlpack_a_without_cupy_is_refused_before_any_work():
    """A's kind is the result's, and a DLPack A's result comes back as a CuPy array: without
    CuPy the call says so up front, instead of failing after the product ran. A DLPack B
    with a torch A gives a torch result, CuPy or not."""
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    with pytest.raises(InvalidType, match="A is a _DLPackOnly .* CuPy is not installed"):
        mb.matmul(_DLPackOnly(torch.ones(2, 2)), torch.ones(2, 2))
    d = mb.matmul(torch.ones(2, 2), _DLPackOnly(torch.ones(2, 2)), backend="triton")
    assert torch.equal(d, torch.full((2, 2), 2.0))


def test_explain_of_a_problem_takes_no_options_and_grad_calls_check_the_backend():
    from multibackend.core.problem import synthetic

    with pytest.raises(InvalidArgument, match="A is a Problem, .* so alpha, saturate cannot"):
        mb.explain(synthetic(8, 8, 8, "float16"), alpha=2.0, saturate=True)
    a = torch.ones((4, 4), requires_grad=True)
    with pytest.raises(InvalidArgument, match="backend is 5: not a backend name"):
        mb.matmul(a, torch.ones((4, 4)), backend=5)


@interpreter_only
def test_autotune_on_host_tensors_runs_untimed():
    """First-call autotuning times on the GPU; on host tensors (Triton's interpreter) the
    call runs as it would without it, instead of failing in the timer."""
    a, b = _pair(8, 8, 8, 9)
    for autotune in (True, "graph"):
        assert torch.equal(mb.matmul(a, b, autotune=autotune),
                           a.double().matmul(b.double()).float())


# -- settings and cache files -----------------------------------------------------------------
def test_a_cache_directory_that_cannot_be_made_is_named(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for where in (blocker, blocker / "below"):
        monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(where))
        with pytest.raises(CacheUnusable, match=f"MULTIBACKEND_CACHE_DIR is '{where}'"):
            cache.cache_dir("tuning")


def test_a_cache_directory_without_write_access_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache.os, "access", lambda path, mode: False)  # as for a read-only fs
    with pytest.raises(CacheUnusable, match="is not writable"):
        cache.cache_root()


def test_the_cache_never_lands_in_the_working_directory(monkeypatch, tmp_path):
    """``~`` in MULTIBACKEND_CACHE_DIR is the home directory, a relative path is refused by
    name, and a relative XDG_CACHE_HOME is ignored: none of them puts a cache in the
    directory the process runs in."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", "~/mbcache")
    assert cache.cache_root() == tmp_path / "home" / "mbcache"
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", "mbcache")
    with pytest.raises(CacheUnusable, match="MULTIBACKEND_CACHE_DIR is 'mbcache': a relative "
                                            "path would put the cache under"):
        cache.cache_root()
    monkeypatch.delenv("MULTIBACKEND_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-cache")
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "multibackend"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "multibackend"
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_cache_file_gets_the_mode_a_plain_open_gives(tmp_path, umask):
    before = os.umask(umask)
    try:
        cache.write_checked(tmp_path / "entry.bin", b"data")
        (tmp_path / "plain.bin").write_bytes(b"data")
    finally:
        os.umask(before)
    want = 0o666 & ~umask
    assert (tmp_path / "plain.bin").stat().st_mode & 0o777 == want
    for name in ("entry.bin", "entry.sha256"):
        assert (tmp_path / name).stat().st_mode & 0o777 == want, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin", "entry.sha256",
                                                          "plain.bin"]


@pytest.mark.parametrize("unreadable", ["entry.bin", "entry.sha256"])
def test_a_cache_entry_this_process_may_not_read_is_a_miss(monkeypatch, tmp_path, unreadable):
    """Another account's entry (no read rights: injected, since root reads every file) is
    rebuilt and replaced, not a PermissionError out of the call."""
    path = tmp_path / "entry.bin"
    cache.write_checked(path, b"data")
    assert cache.read_checked(path, lambda d: True) == b"data"
    real = {name: getattr(type(path), name) for name in ("read_bytes", "read_text")}

    def refused(name):
        def read(self, *args, **kwargs):
            if self.name == unreadable:
                raise PermissionError(13, "Permission denied", str(self))
            return real[name](self, *args, **kwargs)
        return read

    for name in real:
        monkeypatch.setattr(type(path), name, refused(name))
    assert cache.read_checked(path, lambda d: True) is None
    assert cache.read_entry(tmp_path / unreadable, lambda d: True) is None
    assert (tmp_path / unreadable).exists()
    cache.write_checked(path, b"new")
    monkeypatch.undo()
    assert cache.read_checked(path, lambda d: True) == b"new"


def test_an_unusable_cache_leaves_the_compiled_front_off_not_every_call_failing(monkeypatch,
                                                                                tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(blocker))
    monkeypatch.setattr(fastcall, "_loaded", {})
    monkeypatch.setattr(fastcall, "_reason", {})
    assert fastcall.load() is None
    assert "MULTIBACKEND_CACHE_DIR" in fastcall.status()


@pytest.mark.parametrize("content, words", [
    (None, "cannot be read as a table file"),
    (b"\xff\xfe\x00junk", "is not valid JSON"),
    (json.dumps({"format": tuning.FORMAT, "entries": {}}).encode(), "no 'environment' object"),
    (json.dumps({"format": tuning.FORMAT, "entries": {}, "environment": "h100"}).encode(),
     "no 'environment' object"),
    (b"", "is not valid JSON"),  # cut short to nothing
    (json.dumps({"format": 7}).encode(), "has format 7: expected a tuning table of format 1"),
])
def test_a_bad_tuning_table_is_named_with_the_variable(monkeypatch, tmp_path, content, words):
    path = tmp_path / "table.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    monkeypatch.setenv(tuning.ENV_TUNING, str(path))
    monkeypatch.setattr(tuning, "_TABLES", tuning.TuningTables())
    with pytest.raises(InvalidArgument, match=f"{tuning.ENV_TUNING} is .*{words}"):
        tuning.status()


# -- the command line --------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["check", "--json", "/nonexistent-folder/x.json"], "the folder /nonexistent-folder does"),
    (["report", "/nonexistent-results"], "path '/nonexistent-results' does not exist"),
    (["tune", "--shape", "8x8x8", "--max-configs", "0", "--out", "t.json"],
     "--max-configs 0: expected at least 1"),
])
def test_the_command_line_words_bad_arguments_without_a_traceback(capsys, argv, words):
    from multibackend import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_an_out_of_another_library_is_written_and_answered_itself():
    a = np.arange(-7, 8, dtype=np.float32).reshape(5, 3)
    b = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    held = np.full((5, 4), np.nan, np.float32)
    out = DLPackOnly(held)
    assert mb.matmul(a, b, backend="triton", out=out) is out
    np.testing.assert_array_equal(held, a @ b)


def test_a_remembered_plan_with_out_leaves_a_call_autograd_records_to_its_rule(monkeypatch):
    """A plan made by torch's own op (cuBLAS's ``produce``) records nothing when it writes a
    given ``out``: once A requires grad, the repeated call gets the full path's error."""
    from multibackend.choose.registry import REGISTRY
    from multibackend.run import plans

    a, b, d = torch.randn(8, 16), torch.randn(16, 4), torch.empty(8, 4)
    name = mb.explain(a, b).backend
    monkeypatch.setattr(type(REGISTRY.get(name)), "produce",
                        lambda self, *args, **kwargs: torch.mm, raising=False)
    plans.forget()
    assert mb.matmul(a, b, out=d) is d
    assert any(plan.produce is torch.mm for plan in plans._PLANS.values())
    a.requires_grad_()
    with pytest.raises(InvalidArgument, match="where the call is recorded"):
        mb.matmul(a, b, out=d)
