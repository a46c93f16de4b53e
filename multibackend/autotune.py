"""First-call autotuning: time every backend that can run a new shape once, keep the winner.

Opt-in: ``MULTIBACKEND_AUTOTUNE=1`` (or ``eager``; ``graph`` to time calls replayed from a
CUDA graph), or ``matmul(..., autotune=True)`` / ``autotune="graph"``. The first call of a
shape that no tuning table answers then runs, on the caller's own operands:

1. each supporting backend's shortlist — its default configuration (Triton's default times its
   own tile shortlist first); CUTLASS only where its kernel is already built, since nvcc
   takes tens of seconds a kernel (``multibackend tune`` builds them) — and cuBLAS as torch
   calls it;
2. each candidate once on poisoned output, checked against the float64 reference (a wrong
   one is dropped with its reason): a matmul through the public call into a poisoned
   ``out``; a dot, which takes no ``out``, by the backend into the call's own result,
   poisoned (a result in fresh memory could land where the candidate checked before had just
   written the right answer);
3. the survivors timed against each other through the public call as a repeated call makes
   it (``backend=name``, whose default config is the one checked), their runs alternated
   (:func:`multibackend.timing.time_interleaved`) in the chosen mode.

The fastest wins only if it beats cuBLAS by more than the larger of the two figures' measured
spreads (p20-p80 over the median; at least :data:`MIN_SPREAD` of the mode): a host-bound
candidate whose figure moves with the host's load must lead by more than it moves; else cuBLAS
keeps the shape. The entry, with every figure, is kept in memory and written to the user cache
(``cache_dir("tuning")``, one file per GPU, driver and library versions; written atomically, a
corrupt file rebuilt), so later processes reuse it and never time it again.
"""
from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from multibackend.backends.base import Config

from . import cache, environment
from .dispatch import BASELINE
from .errors import InvalidArgument, UnsupportedProblem
from .problem import Problem

ENV_AUTOTUNE = "MULTIBACKEND_AUTOTUNE"
#: the smallest lead over cuBLAS that counts, whatever the measured spread, by timing mode:
#: in eager mode a host-bound call moves by 2-4% between runs even where the kernel and the
#: path are cuBLAS's both times (validation runs on an H100 and an H200), so a smaller lead
#: there is noise; replayed graphs move by about 1%
MIN_SPREAD = {"eager": 0.03, "graph": 0.01}
REPS = 20
MAX_SECONDS = 2.0
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
        """Keep ``entry`` and write the file again (merged with what other processes wrote)."""
        with self._lock:
            merged = self._read()
            merged.update(self._entries or {})
            merged[f"{mode}|{problem.key}"] = entry
            self._entries = merged
            table = {"format": 1, "environment": environment.fingerprint(), "entries": merged}
            cache.atomic_write(self.path, (json.dumps(table, indent=1, sort_keys=True)
                                           + "\n").encode())


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
    left_out = {**entry.get("skipped", {}), **entry.get("dropped", {})}
    if left_out:
        text += "; left out: " + "; ".join(f"{k}: {v}" for k, v in left_out.items())
    return text


def measure(call: Any, accepted: list[str], mode: str,
            rerun: Callable[[str, Config, Any], Any], registry: Any) -> dict | None:
    """Check ``accepted`` backends' shortlists on ``call``'s operands (a matmul through
    ``rerun``: the public call with ``backend=name, config=config, out=out``; a dot in the
    call's own result), time them through ``rerun`` and return the entry; None for operands
    on the host (Triton's interpreter), where nothing can be timed."""
    from . import reference
    from .arrays import adapt
    from .crosscheck import check_backend, poison, reference_for
    from .timing import time_interleaved

    if call.device.type != "cuda":
        return None
    problem = call.problem
    ref = reference_for(call)
    runs: dict[str, Callable[[], Any]] = {}
    configs: dict[str, Config] = {}
    skipped: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for name in accepted:
        backend = registry.get(name)
        config = backend.default_config(problem)
        if not backend.built(problem, config):
            skipped[name] = f"{config.name} is not built (multibackend tune builds it)"
            continue
        if problem.op == "dot":  # no out to poison: checked in the call's own result
            checked = check_backend(call, name, config, ref, time_it=False)
            if not checked.ok:
                dropped[name] = f"wrong or raised: {checked.detail}"[:300]
                continue
        else:
            try:
                out = _poisoned_out(call, poison)
                result = rerun(name, config, out)
                got = adapt(result, "D", problem.op).tensor
                cmp = reference.compare(problem, got.reshape(call.operands.d.shape), ref)
            except Exception as exc:  # a candidate that raises is left out, never chosen
                dropped[name] = f"raised {type(exc).__name__}: {exc}"[:300]
                continue
            if not cmp.ok:
                dropped[name] = f"wrong: {cmp.detail}"
                continue
        # timed as the call runs once chosen: backend named, its default config implied, so
        # a repeated call takes the same front (compiled, or the plan's) the chosen one will
        runs[name] = (lambda name=name: rerun(name, None, None))
        configs[name] = config
    if not runs:
        raise UnsupportedProblem(f"{problem.op}: autotune found no backend that runs "
                                 f"{problem.describe()} correctly: {dropped or skipped}")
    timings = time_interleaved(runs, mode=mode, reps=REPS, max_seconds=MAX_SECONDS)
    winner, spread = choose(timings, mode)
    base = timings.get(BASELINE)
    return {
        "backend": winner, "config": configs[winner].as_dict(), "mode": mode,
        "m": problem.m, "n": problem.n, "k": problem.k, "batch": problem.batch,
        "dtype": problem.in_dtype,
        "timings_ms": {name: t.median_ms for name, t in timings.items()},
        "baseline_ms": base.median_ms if base is not None else None, "spread": spread,
        "skipped": skipped, "dropped": dropped,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def choose(timings: dict[str, Any], mode: str) -> tuple[str, float]:
    """The winner among ``timings`` (name to :class:`~multibackend.timing.Timing`) and the lead
    over cuBLAS it had to exceed: the fastest, where it beats cuBLAS by more than the larger
    of the two figures' spreads ((p80 - p20) / median) and :data:`MIN_SPREAD` of ``mode``;
    else cuBLAS. Without a cuBLAS figure, the fastest (and the mode's floor)."""
    winner = min(timings, key=lambda name: timings[name].median_ms)
    base = timings.get(BASELINE)
    spread = MIN_SPREAD[mode]
    if base is None:
        return winner, spread
    for figure in (base, timings[winner]):
        spread = max(spread, (figure.p80_ms - figure.p20_ms) / figure.median_ms)
    if timings[winner].median_ms * (1 + spread) > base.median_ms:
        winner = BASELINE
    return winner, spread


def _poisoned_out(call: Any, poison: Callable[[Any], None]) -> Any:
    """A poisoned ``out`` for a matmul's result, in the caller's array kind."""
    from .arrays import on_stream, to_kind

    d = call.operands.d
    with on_stream(call.operands.stream, call.device):
        out = d.new_empty(d.shape[1:] if call.squeeze else d.shape)
        poison(out)
    return to_kind(out, call.kind)
