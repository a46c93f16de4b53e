"""cuBLAS, the vendor baseline every comparison is measured against.

f16, f32 (ieee) and f64 go through CuPy (``cupy.matmul``, cuBLAS GEMM). CuPy has no bfloat16
or fp8 arrays and no cuBLAS path for int8, and its tf32 switch is a process-wide setting read
at import; those go through torch, which calls the same library (cuBLAS / cuBLASLt):
``torch.matmul`` for bf16 and tf32, ``torch._int_mm`` for int8, ``torch._scaled_mm`` for fp8.
Dot: ``cupy.dot`` for f32 and f64 (cuBLAS returns f16/bf16 dots rounded to the input type,
while multibackend's dot returns float32, so those are not offered).

This backend is never chosen by the heuristic: ``backend="cublas"`` names it, and the tuning
table may pick it where it is the fastest.
"""
from __future__ import annotations

import contextlib

from multibackend.backends.base import Backend, Config, Operands
from multibackend.capability import Capability, DtypeRule, Reason
from multibackend.problem import Problem

_CUPY_DTYPES = ("float16", "float32", "float64")


def _int_mm_rule(problem: Problem) -> tuple[str, str] | None:
    if problem.op == "matmul" and problem.in_dtype == "int8":
        if problem.m <= 16 or problem.k % 8 or problem.n % 8:
            return ("shape", f"cuBLASLt int8 GEMM (torch._int_mm) needs M > 16 and K, N "
                             f"multiples of 8; got M={problem.m}, N={problem.n}, K={problem.k}")
    if problem.op == "matmul" and problem.in_dtype.startswith("float8"):
        if problem.m % 16 or problem.n % 16 or problem.k % 16:
            return ("shape", "cuBLASLt fp8 GEMM needs M, N and K multiples of 16")
        if problem.batch > 1:
            return ("batch", "cuBLASLt fp8 GEMM (torch._scaled_mm) is not batched")
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
    return Capability("cublas", rules, extra_checks=(_int_mm_rule,))


@contextlib.contextmanager
def _tf32(enabled: bool):
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


class CublasBackend(Backend):
    name = "cublas"
    ranked = False

    def __init__(self) -> None:
        self._capability = _capability()

    @property
    def capability(self) -> Capability:
        return self._capability

    def available(self) -> Reason | None:
        try:
            import cupy
            import torch
        except Exception as exc:
            return self.unavailable("import", f"cupy/torch not importable: {exc}")
        if not torch.cuda.is_available():
            return self.unavailable("environment", "no CUDA GPU visible")
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return self.unavailable("environment", f"CuPy cannot reach the GPU: {exc}")
        return None

    def versions(self) -> dict[str, str]:
        import cupy

        return {"cupy": cupy.__version__, "cublas": str(cupy.cuda.cublas.getVersion(
            cupy.cuda.device.get_cublas_handle()))}

    def configs(self, problem: Problem) -> list[Config]:
        return [Config.of("default")]

    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        if problem.op == "dot":
            self._dot(operands)
            return
        d = operands.d
        self._product(problem, operands, d)
        if operands.alpha != 1:
            d.mul_(operands.alpha)
        if problem.has_c:
            d.add_(operands.c, alpha=operands.beta)

    def _product(self, problem: Problem, ops: Operands, d) -> None:
        """Write A @ B (batched) into D."""
        import torch

        dtype = problem.in_dtype
        if dtype in _CUPY_DTYPES and problem.precision in (None, "ieee"):
            import cupy

            with cupy.cuda.ExternalStream(ops.stream):
                a, b = cupy.from_dlpack(ops.a), cupy.from_dlpack(ops.b)
                cupy.matmul(a, b, out=cupy.from_dlpack(d))
        elif dtype == "int8":
            for i in range(problem.batch):
                torch._int_mm(ops.a[i], ops.b[i], out=d[i])
        elif dtype.startswith("float8"):
            one = torch.ones((), dtype=torch.float32, device=ops.a.device)
            d[0].copy_(torch._scaled_mm(ops.a[0], ops.b[0], scale_a=one, scale_b=one,
                                        out_dtype=d.dtype))
        else:
            with _tf32(problem.precision == "tf32"):
                torch.matmul(ops.a, ops.b, out=d)

    def _dot(self, ops: Operands) -> None:
        import cupy

        with cupy.cuda.ExternalStream(ops.stream):
            result = cupy.dot(cupy.from_dlpack(ops.a), cupy.from_dlpack(ops.b))
            cupy.from_dlpack(ops.d)[0] = result


def create() -> Backend:
    return CublasBackend()
