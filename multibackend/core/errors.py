"""The exceptions multibackend raises. Each message names the argument, its value and the rule.

``ValueError``/``TypeError`` subclasses are used so that callers who catch the builtin
families keep working.
"""
from __future__ import annotations


class MultibackendError(Exception):
    """Base of every error multibackend raises on purpose."""


class InvalidArgument(MultibackendError, ValueError):
    """An argument breaks a rule of the call (shape, dtype, device, scalar...)."""


class InvalidType(MultibackendError, TypeError):
    """An argument is not an array (or not a scalar) where one is required."""


class UnsupportedProblem(MultibackendError, ValueError):
    """No backend, or not the backend asked for, can run this problem; lists the reasons."""

    def __init__(self, message: str, reasons: list | None = None):
        super().__init__(message)
        self.reasons = list(reasons or [])


class BackendUnavailable(MultibackendError, RuntimeError):
    """The backend asked for cannot run on this machine (import failed, no GPU, no nvcc...)."""


class CompileError(MultibackendError, RuntimeError):
    """A kernel failed to compile; the message carries the compiler's log and kernel name."""


class KernelRefused(MultibackendError, RuntimeError):
    """A compiled kernel refused the arguments or failed to launch (nothing was written)."""


class CaptureError(MultibackendError, RuntimeError):
    """A call that must plan (validate, dispatch, compile, autotune, allocate caches) was made
    while a CUDA graph is being captured, where none of that can run."""


class CacheUnusable(MultibackendError, OSError):
    """The user cache directory cannot be made or written (a file in its place, no rights, a
    relative ``MULTIBACKEND_CACHE_DIR``)."""
