"""The public calls: ``matmul``, ``binary_matmul``, ``dot`` and ``explain``.

The calls run on the eager path (:mod:`multibackend.eager`); under torch.compile and autograd
they go through the registered torch operator (:mod:`multibackend.integrations.torch_op`),
which this module binds for that path.

Semantics every backend shares (and the tests hold them to):

- ``D = alpha * A @ B + beta * C``; A is (M, K) or (batch, M, K), B (K, N) or (batch, K, N),
  a 2-D operand is broadcast over the batch; C is (M, N) or (batch, M, N) of D's dtype.
- M, N, K may be any size >= 1. K = 0 gives ``beta * C`` (zeros without C; saturated where
  asked), M, N or a batch of 0 an empty result; these are answered here without a kernel,
  under the rules a kernel's call keeps (a named backend must be able to run here, options
  must be ones some backend computes).
- Integer inputs give int32 and take integer alpha and beta; fp8 inputs give float32.
- NaN and Inf in the inputs propagate as IEEE arithmetic says (0 * Inf = NaN, Inf - Inf =
  NaN, a NaN anywhere in a row of A or column of B poisons that output), the same in every
  backend. A result that saturates (``saturate=True``, WMMA's satf) maps +-Inf to the largest
  finite value and NaN to +0 instead. As BLAS says, alpha = 0 reads neither A nor B (D is
  ``beta * C``, answered without a kernel) and beta = 0 does not read C.
- Work is ordered on the caller's current stream; nothing synchronizes the device, except
  that a NumPy result, or D for a host ``out``, is copied back to the host. Host operands are
  computed on the GPU where there is one; without one, ``auto`` answers them with torch's own
  CPU product (the ``host`` backend). A call with ``out`` answers the caller's own ``out``
  object.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from multibackend import eager
from multibackend.choose.dispatch import Decision, decide, verdict
from multibackend.choose.registry import REGISTRY
from multibackend.core.errors import BackendUnavailable, InvalidArgument, UnsupportedProblem
from multibackend.core.problem import Problem
from multibackend.eager import binary_matmul, dot, matmul
from multibackend.io.request import dot_call, matmul_call
from multibackend.run.execute import check_trivial, resolve_config

__all__ = ["matmul", "binary_matmul", "dot", "explain"]


def _torch_operator() -> ModuleType:
    """The registered torch operator's module, imported on first use (it imports torch)."""
    from multibackend.integrations import torch_op

    return torch_op


eager.OPERATOR = _torch_operator


def _given(alpha: Any, saturate: Any, **others: Any) -> list[str]:
    """The names of the options given other than their defaults (alpha 1, saturate False,
    the others None)."""
    named = [name for name, value in others.items() if value is not None]
    named += ["alpha"] * (type(alpha) not in (int, float) or alpha != 1)
    return named + ["saturate"] * (saturate is not False)


def explain(A: Any, B: Any = None, C: Any = None, *, backend: str | None = "auto",
            autotune: Any = None, alpha: Any = 1.0, beta: Any = None, out: Any = None,
            out_dtype: Any = None, acc_dtype: Any = None, precision: str | None = None,
            saturate: bool = False, dtype: str | None = None, config: Any = None,
            scale_a: Any = None, scale_b: Any = None) -> Decision:
    """The dispatch decision :func:`matmul` (or :func:`dot`) would make for these arguments,
    which it takes alike: the chosen backend and config, the rule that decided, and every
    backend's accept/reject reason (print it, or ``.to_dict()``).

    With B None, A is taken to be a :class:`~multibackend.core.problem.Problem`. For a 1-D A and
    B the decision is dot's, which takes ``acc_dtype`` only. Where the call would raise
    because no backend (or not the one named) can run the problem here, the decision has no
    backend, rule "none", and that error's words."""
    scale = 1  # alpha, where a matmul's call gives it
    if B is None and isinstance(A, Problem):
        given = _given(alpha, saturate, C=C, beta=beta, out=out, out_dtype=out_dtype,
                       acc_dtype=acc_dtype, precision=precision, dtype=dtype, scale_a=scale_a,
                       scale_b=scale_b)
        if given:
            raise InvalidArgument(f"explain: A is a Problem, which holds every option, so "
                                  f"{', '.join(given)} cannot be given with it")
        problem = A
    elif getattr(A, "ndim", None) == 1:
        extra = _given(alpha, saturate, C=C, beta=beta, out=out, out_dtype=out_dtype,
                       precision=precision, dtype=dtype, scale_a=scale_a, scale_b=scale_b)
        if extra:
            raise InvalidArgument(f"explain: x is 1-D, so this is a dot, which takes no "
                                  f"{', '.join(extra)} (dot takes acc_dtype only)")
        problem = dot_call(A, B, acc_dtype=acc_dtype).problem
    else:
        call = matmul_call(A, B, C, alpha=alpha, beta=beta, out=out, out_dtype=out_dtype,
                           acc_dtype=acc_dtype, precision=precision, saturate=saturate,
                           packed=eager.packed(dtype), scale_a=scale_a, scale_b=scale_b)
        problem, scale = call.problem, call.operands.alpha
    if backend not in (None, "auto"):
        REGISTRY.check_name(backend, problem.op)
    verdicts = tuple(verdict(problem, name) for name in REGISTRY.names)
    mode = eager.autotune_mode(autotune, backend, problem.op)
    if problem.trivial or scale == 0:
        try:
            check_trivial(problem, backend, config)
        except (UnsupportedProblem, BackendUnavailable) as exc:  # the call's error
            return Decision(problem, None, None, "none", str(exc), verdicts)
        why = ("alpha is 0: A and B are not read (as BLAS says), D is beta * C (zeros "
               "without C), answered without a kernel" if scale == 0 else
               "M, N, K or the batch is 0: answered without a kernel (K = 0 gives beta * C, "
               "zeros without C; M, N or the batch 0 an empty result)")
        return Decision(problem, None, None, "trivial", why, verdicts)
    explicit = resolve_config(problem, backend, config)
    try:
        return decide(problem, backend, explicit, autotune=mode)
    except (UnsupportedProblem, BackendUnavailable) as exc:  # the call's error, as the answer
        return Decision(problem, None, None, "none", str(exc), verdicts)
