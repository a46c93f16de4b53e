"""multibackend: GPU matmul and dot routed to raw WMMA, Triton or CUTLASS kernels.

    import multibackend as mb
    D = mb.matmul(A, B)                          # backend="auto"
    D = mb.matmul(A, B, C, alpha=2.0, beta=1.0, backend="triton", out_dtype="float32")
    s = mb.dot(x, y)
    print(mb.explain(A, B))                      # every backend: accepted, or why not
    report = mb.crosscheck(A, B)                 # every backend + cuBLAS vs float64

In models: ``mb.patch(model)`` makes every ``torch.nn.Linear`` run through ``matmul``
(``mb.nn.Linear``; ``mb.unpatch(model)`` undoes it); under torch.compile and autograd
``matmul`` goes through the registered torch operator ``multibackend::matmul``.

Importing this package imports no backend and touches no GPU; backends load on first use
(and torch with ``nn``, ``patch`` and ``unpatch``).
"""
from multibackend.api import binary_matmul, dot, explain, matmul
from multibackend.choose.tables import load_tuning
from multibackend.core.errors import (
    BackendUnavailable,
    CaptureError,
    CompileError,
    InvalidArgument,
    InvalidType,
    KernelRefused,
    MultibackendError,
    UnsupportedProblem,
)
from multibackend.core.packing import pack_bits, pack_int4, unpack_bits, unpack_int4
from multibackend.core.problem import Problem
from multibackend.core.scales import quantize
from multibackend.tuning.tuner import tune
from multibackend.verify.crosscheck import Report, crosscheck

__version__ = "0.1.0"

#: loaded on first use (they import torch): name -> (module, attribute or None for the module)
_LAZY = {"nn": ("nn", None), "patch": ("nn", "patch"), "unpatch": ("nn", "unpatch")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    return module if attribute is None else getattr(module, attribute)


__all__ = [
    "matmul", "binary_matmul", "dot", "explain", "crosscheck", "Report", "Problem",
    "load_tuning", "tune", "quantize", "pack_int4", "unpack_int4", "pack_bits", "unpack_bits",
    "MultibackendError", "InvalidArgument", "InvalidType", "UnsupportedProblem",
    "BackendUnavailable", "CaptureError", "CompileError", "KernelRefused", "__version__",
    "nn", "patch", "unpatch",
]
