"""The float64 reference and the error bounds every check uses: one place for both.

The reference computes ``alpha * A @ B + beta * C`` (or ``x . y``) in float64 from the very
values the backend was given (for dot also the scale ``sum |x_i y_i|`` its error is measured
against), on the GPU through CuPy when the operands are there, else with
NumPy. Integer results (int8, uint8, int4, uint4, b1 popcounts) must match exactly. A float
result passes when its norm-wise relative error ``|D - ref|_F / |ref|_F`` is within
:func:`error_bound`, which adds the rounding the arithmetic itself must commit:

- the output's rounding (``u_out``: half an ulp of D's dtype, relative),
- the operands' rounding inside the tensor core (tf32 keeps 10 mantissa bits: ``2**-11``),
- the accumulation's error growing like ``u_acc * sqrt(K)`` for random-sign data,

times a safety factor of 4. NaN and Inf must sit exactly where the reference has them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from . import dtypes
from .problem import Problem

#: unit roundoff (half an ulp, relative) of each float format
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "tf32": 2.0**-11,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}
SAFETY = 4.0
#: Hopper's fp8 tensor-core instructions keep only about 14 bits of the running sum inside
#: the accumulator (measured and reported for H800/H100 GEMMs), far less than float32's 24
FP8_ACCUMULATION_ROUNDOFF = 2.0**-14


def error_bound(problem: Problem) -> float:
    """The largest norm-wise relative error a correct kernel may show on random data
    (0.0 for integer results, which must be exact)."""
    if dtypes.get(problem.d_dtype).is_integer:
        return 0.0
    u_out = UNIT_ROUNDOFF[problem.d_dtype]
    u_acc = UNIT_ROUNDOFF[problem.acc]
    if problem.in_dtype.startswith("float8"):
        u_acc = max(u_acc, FP8_ACCUMULATION_ROUNDOFF)
    u_in = 0.0
    if problem.in_dtype == "float32" and problem.precision == "tf32":
        u_in = UNIT_ROUNDOFF["tf32"]
    elif problem.in_dtype == "float32" and problem.precision == "tf32x3":
        u_in = 2.0**-21  # three tf32 products recover about 21 bits of each operand
    k = max(problem.k, 1)
    return SAFETY * (u_out + u_in + u_acc * math.sqrt(k))


@dataclass(frozen=True)
class Comparison:
    """How one result compares with the reference."""

    rel_err: float
    max_abs_err: float
    bound: float
    exact: bool
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _xp(tensor):
    """(array module, float64 array) for a torch tensor: CuPy on the GPU, NumPy on the host."""
    t64 = tensor.detach().to(dtype=_torch().float64)
    if t64.is_cuda:
        import cupy

        return cupy, cupy.from_dlpack(t64)
    return __import__("numpy"), t64.cpu().numpy()


def _torch():
    import torch

    return torch


def reference_matmul(a: Any, b: Any, c: Any = None, alpha: float = 1.0,
                     beta: float = 0.0) -> Any:
    """``alpha * A @ B + beta * C`` in float64 for (batch, rows, cols) torch tensors; returns
    an array of the operands' array module (CuPy on the GPU, NumPy on the host)."""
    xp, a64 = _xp(a)
    _, b64 = _xp(b)
    out = xp.matmul(a64, b64)
    if alpha != 1:
        out = out * float(alpha)
    if c is not None and beta != 0:
        _, c64 = _xp(c)
        out = out + float(beta) * c64
    return out


def reference_dot(x: Any, y: Any) -> Any:
    """``x . y`` in float64 for 1-D torch tensors, with its scale: a 2-element array
    ``[x . y, sum |x_i y_i|]``. A dot's rounding error is relative to the scale, not to the
    result, which cancellation can make arbitrarily small."""
    xp, x64 = _xp(x)
    _, y64 = _xp(y)
    return xp.stack([xp.dot(x64, y64), xp.abs(x64 * y64).sum()])


def compare(problem: Problem, out, ref) -> Comparison:
    """Compare a backend's output tensor ``out`` with the float64 ``ref`` array."""
    xp, got = _xp(out)
    ref = xp.asarray(ref, dtype=xp.float64)
    scale = 0.0
    if problem.op == "dot":
        ref, scale = ref[:1], float(ref[1])
    ref = ref.reshape(got.shape)
    bound = error_bound(problem)
    exact = bound == 0.0
    nan_ref, nan_got = xp.isnan(ref), xp.isnan(got)
    inf_ref, inf_got = xp.isinf(ref), xp.isinf(got)
    finite = ~(nan_ref | inf_ref)
    if bool((nan_ref != nan_got).any()):
        return Comparison(math.nan, math.nan, bound, exact, False,
                          f"NaN at {int((nan_ref != nan_got).sum())} elements where the "
                          "reference has none (or missing where it has one)")
    if bool((inf_ref != inf_got).any()) or bool((ref[inf_ref] != got[inf_ref]).any()):
        differing = int(((inf_ref != inf_got) | (inf_ref & (ref != got))).sum())
        return Comparison(math.nan, math.nan, bound, exact, False,
                          f"Inf differs from the reference at {differing} elements")
    diff = xp.where(finite, got - ref, 0.0)
    max_abs = float(xp.abs(diff).max()) if diff.size else 0.0
    ref_norm = float(xp.linalg.norm(xp.where(finite, ref, 0.0).ravel()))
    err_norm = float(xp.linalg.norm(diff.ravel()))
    denominator = max(ref_norm, scale)
    rel = err_norm / denominator if denominator > 0 else err_norm
    if exact:
        wrong = int((diff != 0).sum())
        return Comparison(rel, max_abs, 0.0, True, wrong == 0,
                          f"{wrong} of {diff.size} elements differ" if wrong else "exact")
    ok = rel <= bound
    return Comparison(rel, max_abs, bound, False, ok,
                      "" if ok else f"relative error {rel:.3e} exceeds bound {bound:.3e}")
