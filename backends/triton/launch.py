"""Launching a Triton kernel again without Triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds every argument, works out its specialization
(each pointer's 16-byte alignment, each integer's divisibility), builds a cache key and looks
the compiled kernel up on every call: tens of microseconds of host time, several times a small
GEMM's GPU time. :class:`Launcher` sends the first launch of each specialization through
Triton as usual and keeps the compiled kernel that launch returns; a later launch under the
same key goes straight to that kernel's own launcher (``compiled[grid](...)``), which is
where ``kernel[grid]`` ends up too, launch hooks (profilers) included. :meth:`Launcher.kept`
hands that launcher out, for a caller that binds it to the arguments of repeated calls.

The caller's key must determine everything Triton specializes on: the kernel's dtypes and
constexprs, each integer argument's value and each pointer's 16-byte alignment. Under the
interpreter every launch goes through Triton, one at a time: the interpreter keeps global
state while it runs a kernel, and concurrent launches from several threads fail there.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Hashable, NamedTuple

#: specializations kept per function (all are dropped when the table is full)
LIMIT = 4096
#: held by a launch under Triton's interpreter, which is not thread-safe
_INTERPRETER = threading.Lock()


class Kept(NamedTuple):
    """A specialization's compiled kernel: its launcher for the grid (``compiled[grid]``),
    the constexpr arguments it takes after the caller's, the compiled kernel and the grid."""

    runner: Callable
    tail: tuple
    compiled: Any
    grid: tuple[int, int, int]


class Launcher:
    """One ``@triton.jit`` function's compiled kernels, by the caller's specialization key."""

    def __init__(self, fn: Any):
        self.fn = fn
        self._runners: dict[Hashable, Kept] = {}

    def __call__(self, key: Hashable, grid: tuple[int, int, int], stream: int, args: tuple,
                 constexprs: Callable[[], dict[str, Any]]) -> None:
        """Launch ``fn[grid](*args, **constexprs())`` on ``stream`` (the current stream);
        ``constexprs`` is called only when ``key`` has no compiled kernel yet."""
        found = self._runners.get(key)
        if found is not None:
            found.runner(*args, *found.tail, stream=stream)
            return
        named = constexprs()
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            with _INTERPRETER:
                self.fn[grid](*args, **named)
            return
        compiled = self.fn[grid](*args, **named)
        if hasattr(compiled, "run"):
            params = list(self.fn.signature.parameters.values())[len(args):]
            tail = tuple(named.get(p.name, p.default) for p in params)
            if len(self._runners) >= LIMIT:
                self._runners.clear()
            self._runners[key] = Kept(compiled[grid], tail, compiled, tuple(grid))

    def kept(self, key: Hashable) -> Kept | None:
        """The compiled kernel kept under ``key``, or None."""
        return self._runners.get(key)


def aligned(*pointers: int) -> tuple[bool, ...]:
    """Each pointer's 16-byte alignment, as Triton specializes pointers."""
    return tuple([p % 16 == 0 for p in pointers])
