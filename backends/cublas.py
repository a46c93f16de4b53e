"""cuBLAS, the vendor baseline every comparison is measured against.

f16, bf16, f32 (ieee and tf32) and f64 call ``cublasGemmStridedBatchedEx`` through CuPy's
cuBLAS bindings on CuPy's cuBLAS handle, with tensor-core compute types (32F for 16-bit
inputs, 32F_FAST_TF32 for tf32, 32F for ieee float32, 64F for float64) — not ``cupy.matmul``,
whose float16 path does not reach the tensor cores. Row-major D = A @ B is computed as the
column-major D^T = B^T A^T, so row- and column-major A and B run without copies; C is copied
into D first and scaled by beta inside the GEMM. int8 and fp8 need cuBLASLt, which CuPy does
not bind: they go through torch (``torch._int_mm``, ``torch._scaled_mm``), which calls it.
Dot: ``cupy.dot`` for f32 and f64 (cuBLAS returns f16/bf16 dots rounded to the input type,
while multibackend's dot returns float32, so those are not offered).

This backend is never chosen by the heuristic: ``backend="cublas"`` names it, and the tuning
table may pick it where it is the fastest.
"""
from __future__ import annotations

from multibackend.arrays import cupy_stream
from multibackend.backends.base import Backend, Config, Operands
from multibackend.capability import Capability, DtypeRule, Reason
from multibackend.problem import Problem

#: cudaDataType and cublasComputeType numbers for the GEMMs called through CuPy
_DATA_TYPE = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1}
_COMPUTE = {"float16": 68, "bfloat16": 68, "float64": 70}
_COMPUTE_F32 = {"ieee": 68, "tf32": 77}
_SCALAR = {"float16": "float32", "bfloat16": "float32", "float32": "float32", "float64": "float64"}
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1


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


_RC = ("row", "col")


def _capability() -> Capability:
    floats = ("float16", "bfloat16", "float32")
    rules = (
        DtypeRule("float16", accs=("float32",), outs=("float16",), a_layouts=_RC, b_layouts=_RC),
        DtypeRule("bfloat16", accs=("float32",), outs=("bfloat16",), min_cc=(8, 0),
                  a_layouts=_RC, b_layouts=_RC),
        DtypeRule("float32", accs=("float32",), outs=("float32",), precisions=("ieee", "tf32"),
                  a_layouts=_RC, b_layouts=_RC),
        DtypeRule("float64", accs=("float64",), outs=("float64",), a_layouts=_RC,
                  b_layouts=_RC),
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
        self._product(problem, operands, operands.d)

    def _gemm(self, problem: Problem, ops: Operands, d) -> None:
        """D = alpha * A @ B (+ beta * D, D holding C) through cublasGemmStridedBatchedEx."""
        import numpy as np
        from cupy.cuda import cublas, device

        dtype = problem.in_dtype
        scalar = _SCALAR[dtype]
        alpha = np.array(ops.alpha, dtype=scalar)
        beta = np.array(ops.beta if problem.has_c else 0, dtype=scalar)
        compute = (_COMPUTE_F32[problem.precision] if dtype == "float32" else _COMPUTE[dtype])
        a, b = problem.a, problem.b
        handle = device.get_cublas_handle()
        kind = _DATA_TYPE[dtype]
        previous = cublas.getStream(handle)
        cublas.setStream(handle, ops.stream)
        try:
            cublas.gemmStridedBatchedEx(
                handle, _OP_N if b.layout == "row" else _OP_T,
                _OP_N if a.layout == "row" else _OP_T,
                problem.n, problem.m, problem.k, alpha.ctypes.data,
                ops.b.data_ptr(), kind, b.ld, b.batch_stride,
                ops.a.data_ptr(), kind, a.ld, a.batch_stride,
                beta.ctypes.data, d.data_ptr(), kind, problem.n, problem.m * problem.n,
                problem.batch, compute, _GEMM_DEFAULT)
        finally:
            cublas.setStream(handle, previous)

    def _product(self, problem: Problem, ops: Operands, d) -> None:
        """Write alpha * A @ B + beta * C into D."""
        import torch

        dtype = problem.in_dtype
        if dtype in _DATA_TYPE:
            if problem.has_c:
                d.copy_(ops.c)
            self._gemm(problem, ops, d)
            return
        if dtype == "int8":
            for i in range(problem.batch):
                torch._int_mm(ops.a[i], ops.b[i], out=d[i])
        else:
            one = torch.ones((), dtype=torch.float32, device=ops.a.device)
            d[0].copy_(torch._scaled_mm(ops.a[0], ops.b[0], scale_a=one, scale_b=one,
                                        out_dtype=d.dtype))
        if ops.alpha != 1:
            d.mul_(ops.alpha)
        if problem.has_c:
            d.add_(ops.c, alpha=ops.beta)

    def _dot(self, ops: Operands) -> None:
        import cupy

        with cupy_stream(ops.stream, ops.a.device.index):
            result = cupy.dot(cupy.from_dlpack(ops.a), cupy.from_dlpack(ops.b))
            cupy.from_dlpack(ops.d)[0] = result


def create() -> Backend:
    return CublasBackend()
