"""Lazy discovery of the backends, with every failure recorded instead of raised.

A backend module is imported the first time anything asks for it; if the import (or the
module's ``create()``) fails, the failure becomes a :class:`~multibackend.core.capability.Reason`
that ``info`` and ``explain`` show. Importing multibackend never imports a backend.
"""
from __future__ import annotations

import importlib
import threading
from typing import Callable

from multibackend.backends import BACKEND_MODULES
from multibackend.backends.base import Backend, contract_fault
from multibackend.core.capability import Reason
from multibackend.core.errors import InvalidArgument


class Registry:
    """The backends by name: created once, availability checked once."""

    def __init__(self, names: tuple[str, ...] = BACKEND_MODULES):
        self.names = tuple(names)
        self._backends: dict[str, object] = {}
        self._failures: dict[str, Reason] = {}
        self._available: dict[str, Reason | None] = {}
        self._lock = threading.Lock()

    def _load(self, name: str) -> None:
        if name in self._backends or name in self._failures:
            return
        try:
            module = importlib.import_module(f"multibackend.backends.{name}.backend")
            backend = module.create()
            fault = contract_fault(backend)
            if fault is not None:
                self._failures[name] = Reason(name, "contract", fault)
                return
            self._backends[name] = backend
        except Exception as exc:  # any failure is recorded, never raised at discovery
            self._failures[name] = Reason(name, "import", f"{type(exc).__name__}: {exc}")

    def check_name(self, name: str, op: str = "matmul", argument: str = "backend") -> None:
        """Raise InvalidArgument unless ``name`` (given as ``argument``) names a backend."""
        if name not in self.names:
            raise InvalidArgument(f"{op}: {argument} is {name!r}: not a backend name "
                                  f"(known: {', '.join(self.names)}, or 'auto')")

    def get(self, name: str):
        """The backend object, or None when it failed to load (see :meth:`availability`)."""
        self.check_name(name)
        with self._lock:
            self._load(name)
        return self._backends.get(name)

    def availability(self, name: str) -> Reason | None:
        """None when ``name`` can run here, else the recorded reason."""
        backend = self.get(name)
        if backend is None:
            return self._failures[name]
        if name not in self._available:
            try:
                self._available[name] = backend.available()
            except Exception as exc:
                self._available[name] = Reason(name, "environment",
                                               f"{type(exc).__name__}: {exc}")
        return self._available[name]


def parallel_prepare(backend: Backend) -> Callable | None:
    """The backend's parallel build (:meth:`~multibackend.backends.base.Backend.prepare_many`,
    ``prepare_many([(problem, config), ...], max_workers)`` -> the pairs that built) where
    its builds run in parallel; None where it has none."""
    return backend.prepare_many if backend.parallel_builds else None


REGISTRY = Registry()
