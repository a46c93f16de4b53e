"""First-call autotuning's store and switch: which timing mode a call asks for (the
``autotune`` argument or ``MULTIBACKEND_AUTOTUNE``), and the winners this machine measured,
kept in memory and in one JSON file of the user cache (``cache_dir("tuning")``, one file per
GPU, driver and library versions; written atomically, a corrupt file rebuilt), so later
processes reuse them and never time them again. The measuring is
:mod:`multibackend.first_call`'s; dispatch reads the entries here.
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from multibackend.core import environment
from multibackend.core.errors import CacheUnusable, InvalidArgument
from multibackend.core.names import ENV_AUTOTUNE
from multibackend.core.problem import Problem
from multibackend.gpu import cache

_OFF = ("", "0", "off", "false", "no")
_ON = {"1": "eager", "on": "eager", "true": "eager", "yes": "eager", "eager": "eager",
       "graph": "graph"}


def mode_of(autotune: Any, op: str = "matmul") -> str | None:
    """The timing mode first-call autotuning runs in, or None when it is off: the
    ``autotune`` argument (None: ``$MULTIBACKEND_AUTOTUNE`` decides)."""
    if autotune is None:
        value = os.environ.get(ENV_AUTOTUNE, "").strip().lower()
        if value in _OFF:
            return None
        if value in _ON:
            return _ON[value]
        raise InvalidArgument(f"{op}: {ENV_AUTOTUNE} is {value!r}: expected 1, eager, graph "
                              "or 0")
    if isinstance(autotune, (bool, int)) and autotune in (0, 1):
        return "eager" if autotune else None
    if autotune in ("eager", "graph"):
        return autotune
    raise InvalidArgument(f"{op}: autotune is {autotune!r}: expected True, False, 'eager' or "
                          "'graph'")


class Store:
    """The autotuned entries of this machine: in memory, and in one JSON file of the cache."""

    def __init__(self, path: Path | None = None):
        self._path = path
        self._entries: dict[str, dict] | None = None
        self._lock = threading.Lock()
        #: why the last write failed (the entries are kept in memory), else ""
        self.unsaved = ""

    @property
    def path(self) -> Path:
        if self._path is None:
            env = json.dumps(environment.fingerprint(), sort_keys=True)
            self._path = cache.cache_dir("tuning") / f"autotune-{cache.digest(env)}.json"
        return self._path

    def _read(self) -> dict[str, dict]:
        def whole(data: bytes) -> bool:
            try:
                entries = json.loads(data).get("entries")
                return isinstance(entries, dict) and all(map(_entry_whole, entries.values()))
            except (ValueError, AttributeError, KeyError, TypeError):
                return False

        data = cache.read_entry(self.path, whole)
        return json.loads(data)["entries"] if data is not None else {}

    def get(self, problem: Problem, mode: str) -> dict | None:
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            return self._entries.get(f"{mode}|{problem.key}")

    def put(self, problem: Problem, mode: str, entry: dict) -> None:
        """Keep ``entry`` and write the file again (merged with what other processes wrote);
        where the file cannot be written (a full disk), the entry is kept in memory and a
        warning, once, says why."""
        with self._lock:
            merged = self._read()
            merged.update(self._entries or {})
            merged[f"{mode}|{problem.key}"] = entry
            self._entries = merged
            table = {"format": 1, "environment": environment.fingerprint(), "entries": merged}
            try:
                cache.atomic_write(self.path, (json.dumps(table, indent=1, sort_keys=True)
                                               + "\n").encode())
            except CacheUnusable as exc:  # kept for this process; later ones measure again
                if not self.unsaved:
                    warnings.warn(f"first-call autotuning keeps its winners in memory only: "
                                  f"{exc}", RuntimeWarning, stacklevel=2)
                self.unsaved = str(exc)


STORE = Store()


def _entry_whole(entry: Any) -> bool:
    """Whether a stored entry holds every field dispatch and :func:`describe` read: a file
    with one that does not is removed and measured again."""
    timings = entry.get("timings_ms")
    return (isinstance(entry.get("backend"), str) and isinstance(entry["config"]["name"], str)
            and isinstance(entry.get("mode"), str)
            and isinstance(entry.get("spread"), (int, float))
            and isinstance(timings, dict) and bool(timings)
            and all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0
                    for k, v in timings.items()))


def describe(entry: dict) -> str:
    """The figures behind an autotuned choice, for ``explain()``."""
    base = entry.get("baseline_ms")
    parts = []
    for name, ms in sorted(entry["timings_ms"].items(), key=lambda kv: kv[1]):
        ratio = f" ({base / ms:.2f}x torch.matmul)" if base else ""
        parts.append(f"{name} {ms * 1e3:.1f} us{ratio}")
    text = (f"{entry['mode']} timing on the first call: " + ", ".join(parts)
            + f"; a lead must exceed the measured spread {entry['spread'] * 100:.1f}%")
    again = entry.get("confirmed_ms")
    if isinstance(again, dict) and again:
        text += "; timed again against torch.matmul alone: " + ", ".join(
            f"{name} {ms * 1e3:.1f} us" for name, ms in sorted(again.items(), key=lambda kv: kv[1]))
    left_out = {**entry.get("skipped", {}), **entry.get("dropped", {})}
    if left_out:
        text += "; left out: " + "; ".join(f"{k}: {v}" for k, v in left_out.items())
    return text


