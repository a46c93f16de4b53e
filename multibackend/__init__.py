"""multibackend: GPU matmul and dot routed to raw WMMA, Triton or CUTLASS kernels.

    import multibackend as mb
    D = mb.matmul(A, B)                          # backend="auto"
    D = mb.matmul(A, B, C, alpha=2.0, beta=1.0, backend="triton", out_dtype="float32")
    s = mb.dot(x, y)
    print(mb.explain(A, B))                      # every backend: accepted, or why not
    report = mb.crosscheck(A, B)                 # every backend + cuBLAS vs float64

Importing this package imports no backend and touches no GPU; backends load on first use.
"""
from .api import binary_matmul, dot, explain, matmul
from .crosscheck import Report, crosscheck
from .errors import (BackendUnavailable, CaptureError, CompileError, InvalidArgument,
                     InvalidType, KernelRefused, MultibackendError, UnsupportedProblem)
from .packing import pack_bits, pack_int4, unpack_bits, unpack_int4
from .problem import Problem
from .tuner import tune
from .tuning import load_tuning

__version__ = "0.1.0"

__all__ = [
    "matmul", "binary_matmul", "dot", "explain", "crosscheck", "Report", "Problem",
    "load_tuning", "tune", "pack_int4", "unpack_int4", "pack_bits", "unpack_bits",
    "MultibackendError", "InvalidArgument", "InvalidType", "UnsupportedProblem",
    "BackendUnavailable", "CaptureError", "CompileError", "KernelRefused", "__version__",
]
