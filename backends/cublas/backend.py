"""cuBLAS as a user reaches it: torch's own GEMM path, the baseline every figure is measured by.

A user who does not use multibackend calls ``torch.matmul``; that is the yardstick, so this
backend calls what it calls — cuBLAS/cuBLASLt through torch's ops, with the heuristics, the
workspace and the host cost they come with:

- f16, bf16, f32 and f64: ``torch.mm`` / ``torch.addmm`` for one matrix, ``torch.bmm`` /
  ``torch.baddbmm`` for a batch, alpha and beta passed to the op (C fused as cuBLAS's beta
  term); float32 runs with torch's cuBLAS TF32 switch set to the problem's precision for the
  call ("ieee" off, "tf32" on) and restored after;
- int8: ``torch._int_mm`` (cuBLASLt int8, int32 out; M > 16 and K, N multiples of 8);
- fp8: ``torch._scaled_mm`` (cuBLASLt fp8) writing D in place, alpha as the scale of A (D
  rounded once), the unit scale for B; a scaled product with the caller's scales, tensor-wise
  (alpha folded into A's) or row-wise (one per row of A and column of B, D bfloat16);
  block-wise scales are not offered;
- dot: ``torch.dot`` for f32 and f64 (its f16/bf16 dots round to the input type, while
  multibackend's dot returns float32, so those are not offered).

Row- and column-major operands and strided views are handed to torch as they are: its ops
take transposed operands without copies (and copy what cuBLAS cannot take, as torch.matmul
would). A remembered call with 2-D arrays launches through :meth:`CublasBackend.produce`:
the call the caller would make itself — torch's op for a torch caller, ``cupy.matmul`` for a
CuPy caller (for matrices, the ``cublasGemmEx`` it ends in, made directly:
:mod:`.cublas_cupy`) — making D as that call does, with nothing in between.

This backend is ``auto``'s baseline: it runs a problem unless a tuning table, first-call
autotuning or the calibrated rule names a backend measured faster there
(:mod:`multibackend.choose.dispatch`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

from multibackend.backends.base import Backend
from multibackend.backends.cublas import cupy_gemm as cublas_cupy
from multibackend.core.capability import Capability, DtypeRule, Reason
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem
from multibackend.io.request import batched

#: the input dtypes torch.mm and friends serve with D of the input's dtype
FLOATS = ("float16", "bfloat16", "float32", "float64")


#: the largest K whose int8 sums stay within int32 whatever the values ((-128)^2 per term)
INT8_EXACT_K = (2**31 - 1) // (128 * 128)


def _int_mm_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.op == "matmul" and problem.in_dtype == "int8":
        if problem.k > INT8_EXACT_K:
            return ("size", f"K={problem.k} lets an int8 sum pass int32's range, where "
                            "cuBLASLt saturates and the library's result wraps (K at most "
                            f"{INT8_EXACT_K})")
        if problem.m <= 16 or problem.k % 8 or problem.n % 8:
            return ("shape", f"cuBLASLt int8 GEMM (torch._int_mm) needs M > 16 and K, N "
                             f"multiples of 8; got M={problem.m}, N={problem.n}, K={problem.k}")
    if problem.op == "matmul" and problem.in_dtype.startswith("float8"):
        if problem.a.dtype == problem.b.dtype == "float8_e5m2":
            return ("dtype", "cuBLASLt fp8 GEMM (torch._scaled_mm) does not multiply e5m2 by "
                             "e5m2: one operand must be e4m3")
        if problem.m % 16 or problem.n % 16 or problem.k % 16:
            return ("shape", "cuBLASLt fp8 GEMM needs M, N and K multiples of 16")
        if problem.batch > 1:
            return ("batch", "cuBLASLt fp8 GEMM (torch._scaled_mm) is not batched")
        if problem.scales == ("row", "row") and problem.d_dtype != "bfloat16":
            return ("scales", "torch._scaled_mm scales rows and columns only into a bfloat16 "
                              f"D, not {problem.d_dtype}")
    return None


def _capability() -> Capability:
    floats = ("float16", "bfloat16", "float32")
    rules = (
        DtypeRule("float16", accs=("float32",), outs=("float16",)),
        DtypeRule("bfloat16", accs=("float32",), outs=("bfloat16",), min_cc=(8, 0)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), precisions=("ieee", "tf32")),
        DtypeRule("float64", accs=("float64",), outs=("float64",)),
        DtypeRule("int8", accs=("int32",), outs=("int32",), min_cc=(7, 5),
                  a_layouts=("row",), b_layouts=("row", "col")),
        DtypeRule("float8_e4m3fn", accs=("float32",), outs=floats, min_cc=(8, 9),
                  a_layouts=("row",), b_layouts=("col",)),
        DtypeRule("float8_e5m2", accs=("float32",), outs=floats, min_cc=(8, 9),
                  a_layouts=("row",), b_layouts=("col",)),
        DtypeRule("float32", accs=("float32",), outs=("float32",), ops=("dot",)),
        DtypeRule("float64", accs=("float64",), outs=("float64",), ops=("dot",)),
    )
    return Capability("cublas", rules, extra_checks=(_int_mm_rule,),
                      scales=(("tensor", "tensor"), ("row", "row")))


@contextlib.contextmanager
def _tf32(allowed: bool):
    """torch's cuBLAS TF32 switch set to ``allowed`` for the body (untouched when it is)."""
    import torch

    before = torch._C._get_cublas_allow_tf32()
    if before == allowed:
        yield
        return
    torch._C._set_cublas_allow_tf32(allowed)
    try:
        yield
    finally:
        torch._C._set_cublas_allow_tf32(before)


class CublasBackend(Backend):
    name = "cublas"
    takes_matrices = True

    def __init__(self) -> None:
        self._capability = _capability()

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        missing = self.torch_missing()
        if missing is not None:
            return missing
        import torch

        if not torch.cuda.is_available():
            return self.unavailable("environment", "no CUDA GPU visible")
        return None

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": torch.__version__, "cublas": str(torch.backends.cuda.cublas_version())
                if hasattr(torch.backends.cuda, "cublas_version") else "unknown"}

    def configs(self, problem: Problem) -> list[Config]:
        return [Config.of("default")]

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if problem.op == "dot":
            import torch

            torch.dot(operands.a, operands.b, out=operands.d.view(()))
            return
        ops = operands
        if problem.in_dtype in FLOATS:
            with _tf32(problem.precision == "tf32"):
                self._float(problem, ops.a, ops.b, ops.c if problem.has_c else None, ops.d,
                            ops.alpha, ops.beta)
            return
        self._lt(problem, ops)

    @staticmethod
    def _float(problem: Problem, a: Any, b: Any, c: Any, d: Any, alpha: float,
               beta: float) -> None:
        """D = alpha * A @ B + beta * C through mm/addmm (matrices) or bmm/baddbmm."""
        import torch

        if problem.batch == 1:  # one matrix each (the planned call gives batches of one)
            a, b, d = _matrix(a), _matrix(b), _matrix(d)
            c = None if c is None else _matrix(c)
        if a.dim() == b.dim() == d.dim() == 2 and (c is None or c.dim() == 2):
            if c is not None:  # a bias broadcast over the rows goes as the vector it is
                torch.addmm(c[0] if row_broadcast(c.stride()) else c, a, b, beta=beta,
                            alpha=alpha, out=d)
            elif alpha != 1:  # beta = 0: torch ignores the input, NaN in D included
                torch.addmm(d, a, b, beta=0, alpha=alpha, out=d)
            else:
                torch.mm(a, b, out=d)
            return
        batch = problem.batch
        a3, b3 = batched(a, batch), batched(b, batch)
        d3 = d if d.dim() == 3 else d.unsqueeze(0)
        if c is not None:
            torch.baddbmm(batched(c, batch), a3, b3, beta=beta, alpha=alpha, out=d3)
        elif alpha != 1:
            torch.baddbmm(d3, a3, b3, beta=0, alpha=alpha, out=d3)
        else:  # a broadcast operand goes as one matrix: torch folds the batch into M
            torch.matmul(a3[0] if a3.stride(0) == 0 else a3,
                         b3[0] if b3.stride(0) == 0 else b3, out=d3)

    @staticmethod
    def _lt(problem: Problem, ops: Operands) -> None:
        """int8 and fp8 through cuBLASLt's torch ops: int8's alpha applied after, fp8's as
        the scale of A; beta * C added after."""
        import torch

        batch = problem.batch
        a, b = batched(ops.a, batch), batched(ops.b, batch)
        d = ops.d if ops.d.dim() == 3 else ops.d.unsqueeze(0)
        if problem.in_dtype == "int8":
            for i in range(batch):
                torch._int_mm(a[i], b[i], out=d[i])
            if ops.alpha != 1:
                d.mul_(ops.alpha)
        elif ops.scale_a is not None:  # the caller's scales, alpha folded into A's
            scale_a = ops.scale_a if ops.alpha == 1 else ops.scale_a * ops.alpha
            torch._scaled_mm(a[0], b[0], scale_a=scale_a, scale_b=ops.scale_b,
                             out_dtype=d.dtype, out=d[0])
        else:  # alpha as the scale of A: applied to the float32 sums, D rounded once
            torch._scaled_mm(a[0], b[0], scale_a=scale(ops.alpha, a.device),
                             scale_b=scale(1.0, a.device), out_dtype=d.dtype, out=d[0])
        if problem.has_c:
            d.add_(batched(ops.c, batch), alpha=ops.beta)

    def produce(self, problem: Problem, config: Config, alpha: float | int, beta: float | int,
                kind: str = "torch", matrices: bool = True
                ) -> Callable[..., Any] | None:
        """The call that makes D for a remembered call — a function of (a, b) for a call
        without C (torch's or CuPy's op itself), of (a, b, c) for one with C; the arrays
        as the caller gave them (``matrices``: A and B 2-D; else either may be 3-D, a batch
        of one broadcast), on the caller's current stream — or None where it takes more
        than one call (integer and fp8 products; float32 for a torch caller, whose TF32
        switch is set around the op; alpha without C; C with a batch).

        ``kind`` is the caller's array kind: a torch caller gets what it would call itself
        (``torch.mm``/``torch.addmm`` for matrices, ``torch.matmul`` for a batch, which folds
        a broadcast B into one GEMM as it does for the user; a C broadcast over the rows
        goes to ``addmm`` as the bias vector it is, as ``torch.nn.functional.linear`` passes
        it, which cuBLASLt adds in its epilogue), a CuPy caller ``cupy.matmul``
        for the dtypes CuPy holds, with no C, float32 only as IEEE float32 (CuPy's own TF32
        switch, ``CUPY_TF32``, off) — for matrices, the cuBLAS call it ends in, made directly
        (:mod:`.cublas_cupy`)."""
        if problem.op != "matmul" or problem.in_dtype not in FLOATS:
            return None
        plain = not problem.has_c and alpha == 1
        if kind == "cupy":
            import os

            import cupy

            if not plain or problem.in_dtype == "bfloat16" or (
                    problem.in_dtype == "float32" and os.environ.get("CUPY_TF32", "0") != "0"):
                return None
            direct = None
            if matrices and problem.cc is not None:
                direct = cublas_cupy.matrices(problem.in_dtype, problem.cc)
            return direct or cupy.matmul
        import torch

        if kind != "torch" or problem.in_dtype == "float32":
            return None
        if plain:
            return torch.mm if matrices else torch.matmul
        if problem.has_c and matrices:
            if row_broadcast(problem.c.strides):  # a bias: torch's fused-bias epilogue
                return lambda a, b, c: torch.addmm(c[0], a, b, beta=beta, alpha=alpha)
            return lambda a, b, c: torch.addmm(c, a, b, beta=beta, alpha=alpha)
        return None


def scale(value: float, device: Any) -> Any:
    """``value`` as the float32 scalar tensor on ``device`` that ``torch._scaled_mm`` takes as a
    scale: made once and kept (a repeated call, or one captured in a CUDA graph after a first
    call, allocates nothing); one first made while a graph is being captured is made for that
    graph alone (its fill is captured, not run), never kept for later calls."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        kept = _SCALES.get((value, str(device)))
        return kept if kept is not None else torch.full((), value, dtype=torch.float32,
                                                        device=device)
    return _kept_scale(value, str(device))


_SCALES: dict[tuple[float, str], Any] = {}


def _kept_scale(value: float, device: str) -> Any:
    import torch

    found = _SCALES.get((value, device))
    if found is None:
        if len(_SCALES) >= 256:
            _SCALES.clear()
        found = _SCALES[(value, device)] = torch.full((), value, dtype=torch.float32,
                                                      device=device)
    return found


def _matrix(x: Any) -> Any:
    """A batch of one as its one matrix (a view); a matrix as itself."""
    return x[0] if x.dim() == 3 else x


def row_broadcast(strides: tuple) -> bool:
    """Whether a C matrix of these strides is one row broadcast over all rows (row stride
    0, unit column stride): torch's addmm fuses it as a bias only when given as a vector."""
    return strides[0] == 0 and strides[1] == 1


def create() -> Backend:
    return CublasBackend()
