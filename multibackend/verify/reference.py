"""The float64 reference and the error bounds every check uses: one place for both.

The reference computes ``alpha * A @ B + beta * C`` (or ``x . y``) in float64 from the very
values the backend was given, on the GPU through CuPy when the operands are there, else with
NumPy, together with each element's scale ``|alpha| |A| @ |B| + |beta| |C|`` (for dot
``sum |x_i y_i|``): the size of the terms summed, to which rounding errors are proportional.
Integer results (int8, uint8, int4, uint4, b1 popcounts) must match exactly. A float result
must pass two tests, both built from the rounding the arithmetic itself must commit:

- the output's rounding (``u_out``: half an ulp of D's dtype, relative),
- the operands' rounding inside the tensor core (tf32 keeps 10 mantissa bits: ``2**-11``),
- the accumulation's error growing like ``u_acc * sqrt(K)`` for random-sign data,

times a safety factor of 4:

- norm-wise, ``|D - ref|_F / |ref|_F`` within :func:`error_bound` (a dot's error is measured
  against its scale, which cancellation can leave far above the result; a product's against
  ``|scale|_F / sqrt(K)`` where that is larger, the size a random sum of its terms has):
  tight, it catches an error spread over the whole result;
- element-wise, every ``|D_ij - ref_ij|`` within ``4 (u_out (|ref_ij| + scale_ij) + (u_in +
  u_acc sqrt(K)) scale_ij + s_out)``, ``s_out`` half the spacing of D's subnormals (its rounding
  below the normal range is absolute; :func:`element_bounds`): it catches one wrong element, whose
  share of a large result's norm is too small for the first test. D's rounding is measured against
  the scale too: a correct library may round ``alpha A @ B`` to D's dtype before adding ``beta C``
  (torch's addmm on float16 does: bit for bit ``A @ B + C``, two roundings), or round partial sums
  to it (cuBLAS's reduced-precision split-K), and where C or the sum cancels, D's element is far
  smaller than what was rounded.

NaN and Inf must sit exactly where the reference has them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy

from multibackend.core import dtypes
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import Problem

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


def _roundoffs(problem: Problem) -> tuple[float, float]:
    """(``u_out``, ``u_in + u_acc * sqrt(K)``) of a float result: the parts of a correct
    kernel's relative error measured against the result and against the terms summed."""
    u_out = UNIT_ROUNDOFF[problem.d_dtype]
    u_acc = UNIT_ROUNDOFF[problem.acc]
    if problem.in_dtype.startswith("float8"):
        u_acc = max(u_acc, FP8_ACCUMULATION_ROUNDOFF)
    u_in = 0.0
    if problem.in_dtype == "float32" and problem.precision == "tf32":
        u_in = UNIT_ROUNDOFF["tf32"]
    elif problem.in_dtype == "float32" and problem.precision == "tf32x3":
        u_in = 2.0**-21  # three tf32 products recover about 21 bits of each operand
    return u_out, u_in + u_acc * math.sqrt(max(problem.k, 1))


def error_bound(problem: Problem) -> float:
    """The largest norm-wise relative error a correct kernel may show on random data
    (0.0 for integer results, which must be exact)."""
    if dtypes.get(problem.d_dtype).is_integer:
        return 0.0
    return SAFETY * sum(_roundoffs(problem))


def element_bounds(problem: Problem, ref: Any, scale: Any) -> Any:
    """The largest error a correct kernel may commit at each element of a float result, from
    the elements' exact values ``ref`` and their scales (arrays of one array module)."""
    u_out, u_sum = _roundoffs(problem)
    info = _torch().finfo(dtypes.torch_dtype(problem.d_dtype))
    half_subnormal = info.tiny * info.eps / 2  # D's rounding below its normal range
    return SAFETY * (u_out * (abs(ref) + scale) + u_sum * scale + half_subnormal)


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
    return numpy, t64.cpu().numpy()


def _torch():
    import torch

    return torch


@dataclass(frozen=True)
class Reference:
    """A float64 result and each element's scale (the sum of the absolute values of the
    terms that make it), arrays of one shape and one array module."""

    value: Any
    scale: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


def dequantized(problem: Problem, operands: Any) -> tuple[Any, Any]:
    """A and B of a scaled fp8 product (batch of one) in float64, each element multiplied by
    the scale that covers it: the operands whose exact product the scaled product
    approximates."""
    from multibackend.core import scales

    torch = _torch()
    kinds = problem.scales
    a = operands.a[0].to(torch.float64) * scales.expanded(
        operands.scale_a.to(torch.float64), kinds[0], "A", problem.m, problem.k)
    b = operands.b[0].to(torch.float64) * scales.expanded(
        operands.scale_b.to(torch.float64), kinds[1], "B", problem.k, problem.n)
    return a.unsqueeze(0), b.unsqueeze(0)


def reference_matmul(a: Any, b: Any, c: Any = None, alpha: float = 1.0,
                     beta: float = 0.0) -> Reference:
    """``alpha * A @ B + beta * C`` in float64 for (batch, rows, cols) torch tensors, and its
    scale ``|alpha| |A| @ |B| + |beta| |C|``, in the operands' array module (CuPy on the GPU,
    NumPy on the host)."""
    xp, a64 = _xp(a)
    _, b64 = _xp(b)
    value = xp.matmul(a64, b64)
    scale = xp.matmul(xp.abs(a64), xp.abs(b64))
    if alpha != 1:
        value = value * float(alpha)
        scale = scale * abs(float(alpha))
    if c is not None and beta != 0:
        _, c64 = _xp(c)
        value = value + float(beta) * c64
        scale = scale + abs(float(beta)) * xp.abs(c64)
    return Reference(value, scale)


def reference_dot(x: Any, y: Any) -> Reference:
    """``x . y`` in float64 for 1-D torch tensors (a 1-element array), with its scale
    ``sum |x_i y_i|``. A dot's rounding error is relative to the scale, not to the result,
    which cancellation can make arbitrarily small."""
    xp, x64 = _xp(x)
    _, y64 = _xp(y)
    return Reference(xp.dot(x64, y64).reshape(1), xp.abs(x64 * y64).sum().reshape(1))


def compare(problem: Problem, out, ref: Reference | Any) -> Comparison:
    """Compare a backend's output tensor ``out`` with the float64 reference: a
    :class:`Reference`, or for an integer result (which must be exact) a bare array."""
    xp, got = _xp(out)
    bound = error_bound(problem)
    exact = bound == 0.0
    value = ref.value if isinstance(ref, Reference) else xp.asarray(ref, dtype=xp.float64)
    if value.size != got.size:
        raise InvalidArgument(f"compare: the reference holds {value.size} elements but out "
                              f"{tuple(got.shape)} holds {got.size}: they must match")
    if isinstance(ref, Reference):
        ref, scale = value.reshape(got.shape), ref.scale.reshape(got.shape)
    elif exact:
        ref, scale = value.reshape(got.shape), abs(value.reshape(got.shape))
    else:
        raise InvalidArgument(f"compare: ref is a bare {type(ref).__name__} for a "
                              f"{problem.d_dtype} result: a Reference (reference_matmul, "
                              "reference_dot) is required, it holds the scales the "
                              "element-wise bound needs")
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
    ref_finite = xp.where(finite, ref, 0.0)
    max_abs = float(xp.abs(diff).max()) if diff.size else 0.0
    ref_norm = float(xp.linalg.norm(ref_finite.ravel()))
    err_norm = float(xp.linalg.norm(diff.ravel()))
    if problem.op == "dot":
        denominator = max(ref_norm, float(scale.max()))
    else:  # a result cancelled far below its terms is held to the terms' size: the bound's
        # sqrt(K) already relates a random sum to its terms (see _roundoffs)
        scale_norm = float(xp.linalg.norm(xp.where(finite, scale, 0.0).ravel()))
        denominator = max(ref_norm, scale_norm / math.sqrt(max(problem.k, 1)))
    rel = err_norm / denominator if denominator > 0 else err_norm
    if exact:
        wrong = int((diff != 0).sum())
        return Comparison(rel, max_abs, 0.0, True, wrong == 0,
                          f"{wrong} of {diff.size} elements differ" if wrong else "exact")
    if rel > bound:
        return Comparison(rel, max_abs, bound, False, False,
                          f"relative error {rel:.3e} exceeds bound {bound:.3e}")
    detail = _outside(problem, got, diff, ref_finite, xp.where(finite, scale, 0.0))
    return Comparison(rel, max_abs, bound, False, not detail, detail)


def _outside(problem: Problem, got, diff, ref, scale) -> str:
    """The element-wise half of :func:`compare` for a float result within its norm bound
    (``diff`` and ``ref`` zero where the reference is not finite): "" where every element
    is within :func:`element_bounds`, else which ones are not."""
    limits = element_bounds(problem, ref, scale)
    excess = abs(diff) - limits
    outside = int((excess > 0).sum())
    if not outside:
        return ""
    worst = tuple(int(i) for i in numpy.unravel_index(int(excess.argmax()), excess.shape))
    return (f"{outside} of {excess.size} elements outside their element-wise bound; worst at "
            f"{worst}: {float(got[worst]):.6g} where the reference is {float(ref[worst]):.6g} "
            f"(allowed {float(limits[worst]):.3g}, scale {float(scale[worst]):.3g})")
