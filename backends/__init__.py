"""The backends multibackend dispatches to, one module each: ``cublas`` (the vendor baseline),
``triton``, ``raw_wmma`` and ``cutlass``. They are imported lazily by
:mod:`multibackend.choose.registry`; this package is importable only as ``multibackend.backends``.
"""
if __name__ != "multibackend.backends":
    raise ImportError("the backends package is part of multibackend: import multibackend.backends")

BACKEND_MODULES = ("cublas", "triton", "raw_wmma", "cutlass")
