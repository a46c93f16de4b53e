"""The backends multibackend dispatches to, one folder each: ``cublas`` (the vendor baseline),
``triton``, ``raw_wmma``, ``cutlass`` and ``host`` (torch's CPU product for host arrays where
no GPU runs them). Adding a backend is one folder holding ``backend.py`` with ``create()``, and
its name here. They are imported lazily by
:mod:`multibackend.choose.registry`; this package is importable only as ``multibackend.backends``.
"""
if __name__ != "multibackend.backends":
    raise ImportError("the backends package is part of multibackend: import multibackend.backends")

BACKEND_MODULES = ("cublas", "triton", "raw_wmma", "cutlass", "host")
