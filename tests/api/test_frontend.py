"""CPU tier for the front end: the request model, capability rules, dispatch order, errors
and the command line. Runs without a GPU (NumPy/torch-CPU operands, Triton's interpreter)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

import multibackend as mb
from multibackend.choose.dispatch import FALLBACK_ORDER, decide
from multibackend.core import dtypes
from multibackend.core.capability import Capability, DtypeRule
from multibackend.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvalidType,
    UnsupportedProblem,
)
from multibackend.core.problem import classify_layout, pointer_alignment, synthetic, synthetic_dot
from multibackend.io.request import matmul_call


def f16(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float16)


# -- request model ------------------------------------------------------------------------
def test_problem_records_layouts_strides_and_alignment():
    a = torch.randn(40, 24).to(torch.float16)
    b = torch.randn(16, 24).to(torch.float16).T  # column-major view of (24, 16)
    p = matmul_call(a, b).problem
    assert (p.m, p.n, p.k, p.batch) == (40, 16, 24, 1)
    assert (p.a.layout, p.a.ld) == ("row", 24)
    assert (p.b.layout, p.b.ld) == ("col", 24)
    assert p.a.dtype == p.b.dtype == p.d_dtype == "float16" and p.acc == "float32"
    assert p.precision is None and p.cc is None
    assert p.a.align >= 16


def test_layout_classification_and_alignment_rules():
    assert classify_layout(4, 8, (8, 1)) == ("row", 8)
    assert classify_layout(4, 8, (1, 4)) == ("col", 4)
    assert classify_layout(4, 8, (16, 2))[0] == "strided"
    assert classify_layout(1, 8, (8, 1))[0] == "row"
    assert classify_layout(8, 1, (1, 1)) == ("col", 8)  # a contiguous column
    assert classify_layout(8, 1, (1, 16)) == ("col", 8)
    assert classify_layout(8, 1, (16, 1)) == ("row", 16)
    assert classify_layout(1, 1, (1, 16))[0] == "col"
    assert classify_layout(1, 1, (16, 1))[0] == "row"
    assert classify_layout(1, 1, (1, 1))[0] == "row"
    assert pointer_alignment(0x1000) == 256 and pointer_alignment(0x1002) == 2


def test_problem_is_frozen_and_keyed():
    p = synthetic(128, 256, 64, "bfloat16", b_layout="col")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.m = 3
    assert p.key == "matmul:bfloat16->bfloat16:rc:b1:m128:n256:k64"
    assert synthetic(8, 8, 8, "float32").precision == "ieee"
    assert synthetic(8, 8, 8, "int8").d_dtype == "int32"
    assert synthetic(8, 8, 256, "bit").a.cols == 32  # packed 8 per byte along K


def test_autotune_picks_are_made_once_per_problem_and_found_by_identity_or_equality():
    from multibackend.backends.base import AutotunePicks
    from multibackend.core.config import Config

    picks, made = AutotunePicks(), []

    def choose(name):
        def make():
            made.append(name)
            return Config.of(name)
        return make

    problem, twin = synthetic(64, 64, 64), synthetic(64, 64, 64)
    assert problem == twin and problem is not twin
    assert picks.get(problem) is None
    first = picks.pick(problem, choose("first"))
    assert picks.pick(problem, choose("again")) is first and picks.get(twin) is first
    other = synthetic(64, 64, 128)
    assert picks.pick(other, choose("other")).name == "other"
    assert picks.get(problem) is first and made == ["first", "other"]


def test_batched_broadcast_and_c():
    a = torch.randn(3, 5, 7)
    b = torch.randn(7, 2)
    c = torch.randn(5, 2)
    call = matmul_call(a, b, c, alpha=2, beta=0.5)
    p, ops = call.problem, call.operands
    assert p.batch == 3 and p.b.batch_stride == 0 and p.has_c
    assert ops.c.shape == (3, 5, 2) and ops.d.shape == (3, 5, 2)
    assert isinstance(ops.alpha, float) and ops.beta == 0.5


def test_dtype_names_and_defaults():
    assert dtypes.canonical(torch.bfloat16) == "bfloat16"
    assert dtypes.canonical(np.dtype("float16")) == "float16"
    assert dtypes.canonical("e4m3") == "float8_e4m3fn"
    assert dtypes.default_output("float8_e5m2", "float8_e5m2") == "float32"
    with pytest.raises(ValueError, match="not a dtype"):
        dtypes.canonical("complex64")


# -- capability and dispatch ----------------------------------------------------------------
def test_capability_names_the_failing_rule():
    cap = Capability("demo", (DtypeRule("float16", accs=("float32",), outs=("float16",),
                                        min_cc=(8, 0), a_layouts=("row",)),))
    assert cap.check(synthetic(16, 16, 16, "float16")) is None
    reason = cap.check(synthetic(16, 16, 16, "bfloat16"))
    assert reason.rule == "dtype" and "bfloat16" in reason.message
    assert cap.check(synthetic(16, 16, 16, "float16", a_layout="col")).rule == "layout"
    assert cap.check(synthetic(16, 16, 16, "float16", cc=(7, 5))).rule == "compute-capability"
    assert cap.check(synthetic(16, 16, 16, "float16", acc="float16",
                               out_dtype="float16")).rule == "accumulator"


def test_explicit_backend_never_falls_back(monkeypatch):
    p = synthetic(64, 64, 64, "float16", cc=None)
    # no GPU here: cuBLAS cannot run on this machine at all
    with pytest.raises(BackendUnavailable, match="backend='cublas'"):
        decide(p, "cublas")
    # Triton runs here, but not this problem
    with pytest.raises(UnsupportedProblem, match="backend='triton'.*float8_e4m3fn"):
        decide(synthetic(64, 64, 64, "float8_e4m3fn", cc=(7, 0)), "triton")
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "cublas")
    with pytest.raises(BackendUnavailable, match="MULTIBACKEND_BACKEND="):
        decide(p)
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "bogus")
    with pytest.raises(InvalidArgument, match="MULTIBACKEND_BACKEND is 'bogus': not a backend"):
        decide(p)


def test_auto_without_cublas_falls_back_in_order_and_explains():
    p = synthetic(64, 64, 64, "float16", cc=None)  # no GPU here: cuBLAS is unavailable
    decision = decide(p)
    assert decision.backend == "triton" and decision.rule == "fallback"
    text = str(mb.explain(p))
    for name in ("cublas", "triton", "raw_wmma", "cutlass"):
        assert name in text
    assert FALLBACK_ORDER[0] == "triton"
    assert decision.to_dict()["verdicts"][0]["backend"] == "cublas"


def test_no_backend_error_lists_every_reason():
    p = synthetic(64, 64, 64, "float8_e4m3fn", cc=(7, 0))
    with pytest.raises(UnsupportedProblem) as info:
        decide(p)
    assert [r.backend for r in info.value.reasons] == ["cublas", "triton", "raw_wmma", "cutlass",
                                                      "host"]
    assert "sm_89+" in str(info.value)
    assert mb.explain(p).backend is None


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("make,pattern", [
    (lambda: torch.ones((8, 8), dtype=torch.bool), r"A is \(8, 8\) bool: not a dtype"),
    (lambda: np.ones((8, 8), dtype=np.bool_), r"A is \(8, 8\) bool: not a dtype"),
    (lambda: torch.ones((8, 8), dtype=torch.int16), r"A is \(8, 8\) int16: not a dtype"),
    (lambda: torch.ones((8, 8), dtype=torch.int64), r"A is \(8, 8\) int64: not a dtype"),
    (lambda: torch.ones((8, 8), dtype=torch.complex64), r"complex64: not a dtype"),
    (lambda: np.ones((8, 8), dtype=np.uint16), r"A is \(8, 8\) uint16: not a dtype"),
    (lambda: torch.ones((8, 8), dtype=torch.int32), "int32: not an input dtype of matmul"),
])
def test_unserved_dtypes_are_invalid_arguments_naming_the_dtype(make, pattern):
    with pytest.raises(InvalidArgument, match=pattern):
        mb.matmul(make(), make())
    with pytest.raises(InvalidArgument, match="pack_bits and binary_matmul|int32"):
        mb.matmul(make(), make(), backend="cublas")


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32])
def test_dot_refuses_dtypes_it_does_not_serve(dtype):
    x = torch.ones(16, dtype=dtype)
    with pytest.raises(InvalidArgument, match=f"x is \\(16,\\) {str(dtype)[6:]}"):
        mb.dot(x, x)


@pytest.mark.parametrize("call,pattern", [
    (lambda: mb.matmul(f16(128, 64), f16(65, 32)),
     r"A is \(128, 64\) float16 but B is \(65, 32\) float16: inner dimensions differ"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8).astype(np.float32)), "must have the same dtype"),
    (lambda: mb.matmul(f16(2, 8, 4), f16(3, 4, 8)), "batch dimensions differ"),
    (lambda: mb.matmul(f16(8), f16(8, 2)), "rank 1, but matmul takes 2-D or 3-D"),
    (lambda: mb.matmul(f16(2, 2, 2, 2), f16(2, 2)), "rank 4"),
    (lambda: mb.dot(f16(8, 1), f16(8, 1)), "dot takes 1-D vectors"),
    (lambda: mb.dot(f16(8), f16(9)), "lengths differ"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), out=np.empty((8, 9), np.float16)),
     r"out is \(8, 9\) but the result is \(8, 8\)"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), out=np.empty((8, 8), np.float32)),
     "out is float32 but the result is float16"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), alpha=np.ones(2)), "alpha has shape"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), backend="magic"), "not a backend name"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), beta=1.0), "beta scales C"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), precision="tf32"), "float32 operands only"),
    (lambda: mb.matmul(np.ones((4, 4), np.int8), np.ones((4, 4), np.int8), alpha=0.5),
     "integer outputs take integer alpha"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), np.ones((8, 8), np.float32)),
     "C must have the output's dtype"),
    (lambda: mb.matmul(f16(8, 4), f16(4, 8), config="x"), "name the backend too"),
])
def test_bad_input_names_argument_value_and_rule(call, pattern):
    with pytest.raises(InvalidArgument, match=pattern):
        call()


def test_non_array_and_mixed_devices():
    with pytest.raises(InvalidType, match="A is a list"):
        mb.matmul([[1.0]], f16(1, 1))
    with pytest.raises(InvalidType, match="alpha is 'x'"):
        mb.matmul(f16(2, 2), f16(2, 2), alpha="x")
    meta = torch.empty((2, 2), dtype=torch.float16, device="meta")
    with pytest.raises(InvalidArgument, match="B is on the meta device"):
        mb.matmul(torch.ones((2, 2), dtype=torch.float16), meta)


def test_explain_takes_matmuls_keywords_and_refuses_what_dot_does_not_take():
    a, b = f16(8, 4), f16(4, 8)
    assert mb.explain(a, b, out_dtype="float32").problem.d_dtype == "float32"
    assert mb.explain(np.ones((8, 2), np.uint8), np.ones((2, 8), np.uint8),
                      dtype="int4").problem.in_dtype == "int4"
    with pytest.raises(InvalidArgument, match="dtype is 'int2'"):
        mb.explain(a, b, dtype="int2")
    with pytest.raises(InvalidArgument, match="a dot, which takes no C, alpha"):
        mb.explain(f16(8), f16(8), f16(1), alpha=2.0)
    with pytest.raises(TypeError, match="bitop"):
        mb.explain(a, b, bitop="nand")
    with pytest.raises(InvalidArgument, match="backend is 'magic'"):
        mb.explain(np.empty((0, 4), np.float16), b, backend="magic")
    for empty in (mb.explain(np.empty((0, 4), np.float16), b),
                  mb.explain(np.empty((8, 0), np.float16), np.empty((0, 8), np.float16))):
        assert (empty.backend, empty.rule) == (None, "trivial") and "without a kernel" in str(empty)


def test_an_unknown_keyword_is_named_under_the_public_name():
    with pytest.raises(TypeError, match=r"matmul\(\) got an unexpected keyword argument "
                                        r"'outdtype' \(it takes alpha, beta, out, out_dtype"):
        mb.matmul(f16(8, 4), f16(4, 8), outdtype="float32")
    with pytest.raises(TypeError, match=r"dot\(\) got an unexpected keyword argument 'alpha'"):
        mb.dot(f16(8), f16(8), alpha=2.0)
    with pytest.raises(InvalidType, match="A is a list"):  # other TypeErrors pass unchanged
        mb.matmul([[1.0]], f16(1, 1), alpha=1.0)


@pytest.mark.parametrize("kwargs,pattern", [
    ({"out_dtype": "int4"}, "out_dtype is 'int4': D must be an array dtype"),
    ({"out_dtype": "bit"}, "out_dtype is 'bit': D must be an array dtype"),
    ({"out_dtype": "float7"}, "out_dtype is 'float7': not a dtype"),
    ({"acc_dtype": "float7"}, "acc_dtype is 'float7': not a dtype"),
    ({"saturate": "yes"}, "saturate is 'yes': expected True or False"),
    ({"saturate": 1}, "saturate is 1: expected True or False"),
])
def test_bad_options_name_argument_value_and_rule(kwargs, pattern):
    with pytest.raises(InvalidArgument, match=pattern):
        mb.matmul(f16(8, 4), f16(4, 8), **kwargs)


def test_trivial_sizes_answered_without_a_kernel():
    c = np.full((3, 4), 2.0, np.float16)
    d = mb.matmul(np.empty((3, 0), np.float16), np.empty((0, 4), np.float16), c, beta=1.5)
    assert (d == 3.0).all()
    assert mb.matmul(np.empty((0, 5), np.float16), f16(5, 2)).shape == (0, 2)
    assert float(mb.dot(np.empty(0, np.float32), np.empty(0, np.float32))) == 0.0


def test_nan_and_inf_propagate():
    a = np.ones((8, 8), np.float32)
    a[2, 3] = np.nan
    a[5, 0] = np.inf
    d = mb.matmul(a, np.ones((8, 8), np.float32), backend="triton")
    assert np.isnan(d[2]).all() and np.isinf(d[5]).all() and np.isfinite(d[0]).all()


# -- command line ------------------------------------------------------------------------------
def test_cli_info_and_check_without_gpu():
    info = subprocess.run([sys.executable, "-m", "multibackend", "info"], capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0 and "triton" in info.stdout and "cublas" in info.stdout
    check = subprocess.run([sys.executable, "-m", "multibackend", "check"],
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert "no GPU here" in check.stdout and "0 problems with a wrong result" in check.stdout


def test_synthetic_dot_problem():
    p = synthetic_dot(1 << 20, "float16")
    assert p.op == "dot" and p.bytes_moved == 2 * 2 * (1 << 20) and p.d_dtype == "float32"


# -- remembered plans ---------------------------------------------------------------------------
def test_repeated_calls_reuse_the_plan_and_stay_correct(monkeypatch):
    from multibackend.run import plans

    plans.forget()
    gen = torch.Generator().manual_seed(5)
    a = torch.rand((17, 33), generator=gen).half()
    b = torch.rand((33, 9), generator=gen).half()
    c = torch.rand((17, 9), generator=gen).half()
    first = mb.matmul(a, b, c, alpha=2.0, beta=0.5)
    assert len(plans._PLANS) == 1
    again = mb.matmul(a, b, c, alpha=2.0, beta=0.5)
    assert torch.equal(first, again) and len(plans._PLANS) == 1
    expected = 2.0 * a.double() @ b.double() + 0.5 * c.double()
    assert (again.double() - expected).abs().max() < 1e-2
    other_alpha = mb.matmul(a, b, c, alpha=-1.0, beta=0.5)
    assert len(plans._PLANS) == 2
    assert (other_alpha.double() - (-a.double() @ b.double() + 0.5 * c.double())).abs().max() < 1e-2
    monkeypatch.setenv("MULTIBACKEND_BACKEND", "cublas")
    with pytest.raises(BackendUnavailable, match="MULTIBACKEND_BACKEND"):
        mb.matmul(a, b, c, alpha=2.0, beta=0.5)


def test_plans_never_key_on_array_valued_scalars():
    from multibackend.run import plans

    plans.forget()
    a, b = torch.ones((4, 4)), torch.ones((4, 4))
    alpha = torch.tensor(3.0)
    assert float(mb.matmul(a, b, alpha=alpha)[0, 0]) == 12.0
    alpha.fill_(5.0)
    assert float(mb.matmul(a, b, alpha=alpha)[0, 0]) == 20.0
    assert len(plans._PLANS) == 0


def test_remembered_plan_for_batched_broadcast_operands():
    from multibackend.run import plans

    plans.forget()
    gen = torch.Generator().manual_seed(6)
    a = torch.rand((3, 9, 17), generator=gen)
    b = torch.rand((17, 5), generator=gen)
    c = torch.rand((9, 5), generator=gen)
    expected = a.double() @ b.double() - c.double()
    for _ in range(2):
        d = mb.matmul(a, b, c, beta=-1.0)
        assert d.shape == (3, 9, 5) and (d.double() - expected).abs().max() < 1e-4
    assert len(plans._PLANS) == 1


@pytest.mark.parametrize("rank_a, rank_b, rank_c, out_rank", [
    (2, 2, None, None), (2, 2, 2, 2), (3, 2, 3, None), (2, 3, 2, 3), (3, 3, None, 3)])
def test_remembered_plan_hands_matrices_as_given_to_backends_that_take_them(
        monkeypatch, rank_a, rank_b, rank_c, out_rank):
    from multibackend.choose.registry import REGISTRY
    from multibackend.run import plans

    triton = REGISTRY.get("triton")
    assert triton.takes_matrices
    seen: list = []
    run = triton.run

    def spy(problem, ops, config):
        seen.append((ops.a.dim(), ops.b.dim(), None if ops.c is None else ops.c.dim(),
                     ops.d.dim()))
        run(problem, ops, config)
    monkeypatch.setattr(triton, "run", spy)
    plans.forget()
    gen = torch.Generator().manual_seed(8)

    def rand(rows, cols, rank):
        x = torch.rand((rows, cols), generator=gen) * 2 - 1
        return x if rank == 2 else x[None]
    a = rand(19, 13, rank_a)
    b = rand(11, 13, rank_b).transpose(-1, -2)  # column-major B
    c = rand(19, 11, rank_c) if rank_c else None
    out = torch.full((1, 19, 11)[3 - out_rank:], float("nan")) if out_rank else None
    expected = a.double() @ b.double() + (c.double() if c is not None else 0)
    for call in range(2):  # the full path (3-D views), then the plan (the arrays as given)
        if out is not None:
            out.fill_(float("nan"))
        d = mb.matmul(a, b, c, out=out, backend="triton")
        assert d.shape == torch.broadcast_shapes(a.shape[:-1] + (11,), b.shape[:-2] + (1, 1))
        assert out is None or d is out
        assert (d.double() - expected.reshape(d.shape)).abs().max() < 1e-5
    assert len(plans._PLANS) == 1
    assert seen[0][::3] == (3, 3)
    assert seen[1] == (rank_a, rank_b, rank_c, out_rank or max(rank_a, rank_b))


def test_remembered_plan_launches_through_the_backends_bound_launch(monkeypatch):
    from multibackend.choose.registry import REGISTRY
    from multibackend.run import plans

    triton = REGISTRY.get("triton")
    asked, bound_calls = [], []
    run = triton.run

    def bind(problem, config, ops):
        asked.append(ops.a.dim())

        def launch(a, b, c, d, stream):
            bound_calls.append((a, b, c, d))
            run(problem, plans.Operands(a, b, c, d, ops.alpha, ops.beta, stream), config)
        return launch
    monkeypatch.setattr(triton, "bind", bind)
    plans.forget()
    gen = torch.Generator().manual_seed(10)
    a, b = torch.rand((6, 4), generator=gen), torch.rand((4, 3), generator=gen)
    results = [mb.matmul(a, b, backend="triton") for _ in range(4)]
    # the full path, the plan's first run (then bound), and two bound launches
    assert asked == [2] and len(bound_calls) == 2
    assert bound_calls[0][0] is a and bound_calls[0][2] is None
    for d in results:
        assert (d.double() - a.double() @ b.double()).abs().max() < 1e-5


def test_batch_of_one_is_broadcast_like_a_matrix():
    gen = torch.Generator().manual_seed(7)
    a = torch.rand((1, 5, 7), generator=gen)
    b = torch.rand((4, 7, 6), generator=gen)
    for _ in range(2):  # the full path, then the remembered plan
        d = mb.matmul(a, b, backend="triton")
        assert d.shape == (4, 5, 6)
        assert (d.double() - a.double() @ b.double()).abs().max() < 1e-5
    assert matmul_call(a, b).problem.a.batch_stride == 0


def test_review_edge_cases_of_scalars_strides_and_aliasing():
    ones = torch.ones((4, 4))
    assert torch.equal(mb.matmul(ones, ones, alpha=1), torch.full((4, 4), 4.0))  # int alpha
    with pytest.raises(InvalidType, match="alpha is True"):
        mb.matmul(ones, ones, alpha=True)
    with pytest.raises(InvalidArgument, match="finite integer alpha"):
        mb.matmul(np.ones((4, 4), np.int8), np.ones((4, 4), np.int8), alpha=float("inf"))
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(mb.matmul(a[::-1], a), a[::-1] @ a, rtol=1e-6)
    c = torch.rand((4, 4))
    with pytest.raises(InvalidArgument, match="out shares memory with C"):
        mb.matmul(ones, ones, c, out=c)
    with pytest.raises(InvalidArgument, match="out shares memory with A"):
        mb.matmul(ones, ones, out=ones)


def test_strided_layout_is_named_plainly():
    from multibackend.core.capability import Capability, DtypeRule

    cap = Capability("demo", (DtypeRule("float32", accs=("float32",), outs=("float32",),
                                        precisions=("ieee",), a_layouts=("row",)),))
    a = torch.ones((8, 16))[:, ::2]
    reason = cap.check(matmul_call(a, torch.ones((8, 4))).problem)
    assert reason.rule == "layout" and "A is strided (neither row- nor column-major)" in \
        reason.message and "takes A row-major" in reason.message


def test_calls_with_the_same_metadata_share_one_problem_object():
    """Backends key their per-problem caches on the Problem and find it by identity."""
    from multibackend.io.request import matmul_call

    a, b = torch.ones((6, 4), dtype=torch.float32), torch.ones((4, 5), dtype=torch.float32)
    first = matmul_call(a, b).problem
    again = matmul_call(a, b).problem
    other = matmul_call(a, b, torch.ones((6, 5)), beta=1.0).problem
    assert first is again
    assert other is not first and other != first


def test_host_tensors_never_get_a_shape_free_plan():
    """A shape-free plan runs the caller's own op, which for host tensors would compute on
    the host: host tensors are keyed in full instead."""
    from multibackend.run import plans

    a, b = torch.ones((4, 4)), torch.ones((4, 4))
    assert plans.family_key(("matmul:plain", "auto"), a, b) is None


def test_first_call_autotune_times_each_backend_by_the_call_that_runs_once_it_is_chosen(
        monkeypatch):
    """The candidates of a plain autotuned call are timed as ``matmul(A, B, backend=name)``
    (``dot(x, y, backend=name)``): the call the chosen backend then serves, by the compiled
    front once repeated; a candidate's check into a poisoned ``out`` keeps every keyword."""
    from multibackend import eager, first_call

    reruns = []

    def captured(call, accepted, mode, rerun, registry):
        reruns.append(rerun)
        raise InvalidArgument("captured")

    monkeypatch.setattr(first_call, "measure", captured)
    monkeypatch.setattr(eager, "decide", lambda *args, **kw: mb.choose.dispatch.Decision(
        args[0], None, None, "autotune", "not measured yet", ()))
    a, b = torch.ones(4, 8), torch.ones(8, 2)
    for make in (lambda: mb.matmul(a, b, autotune="eager"),
                 lambda: mb.dot(a[0], a[1], autotune="eager")):
        with pytest.raises(InvalidArgument, match="captured"):
            make()
    calls = []
    monkeypatch.setattr(eager, "matmul", lambda *args, **kw: calls.append((args, kw)))
    monkeypatch.setattr(eager, "dot", lambda *args, **kw: calls.append((args, kw)))
    for rerun in reruns:
        rerun("triton", None, None)
    reruns[0]("triton", "cfg", "out")
    assert calls[0] == ((a, b, None), {"backend": "triton"})
    assert calls[1][1] == {"backend": "triton"} and len(calls[1][0]) == 2
    assert calls[2][1]["config"] == "cfg" and calls[2][1]["out"] == "out"
    assert set(calls[2][1]) >= {"alpha", "beta", "out_dtype", "acc_dtype", "precision"}


def test_cupy_callers_stream_is_cupys_current_stream_on_the_arrays_device(monkeypatch):
    """CuPy keeps a current stream per device: a CuPy caller's work is ordered on the one of
    the device its arrays are on, whichever device is current (a stand-in CuPy module: no
    GPU here)."""
    import sys
    import types

    from multibackend.io import arrays

    current = {"device": 0}
    streams = {0: 0x1000, 1: 0x2000}

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            self.before, current["device"] = current["device"], self.index

        def __exit__(self, *exc):
            current["device"] = self.before

    class Stream:
        def __init__(self, device):
            self.ptr = streams[device]
            self.device = device

        def is_capturing(self):
            return self.device == current["device"] == 1

    cuda = types.SimpleNamespace(Device=Device,
                                 get_current_stream=lambda: Stream(current["device"]))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    second = torch.device("cuda", 1)
    assert arrays.caller_stream("cupy", second) == 0x2000
    assert arrays.caller_stream("cupy", torch.device("cuda", 0)) == 0x1000
    assert arrays.capturing("cupy", second) and current["device"] == 0
    assert arrays.caller_stream("cupy", torch.device("cpu")) == 0
