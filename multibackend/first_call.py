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
   (:func:`multibackend.gpu.timing.time_interleaved`) in the chosen mode.

The fastest wins only if it beats cuBLAS by more than the spread of its runs' ratios to
cuBLAS's, paired round by round (at least :data:`MIN_SPREAD` of the mode: see
:mod:`multibackend.verify.measure`): drift of the host moves both runs of a round alike and
cancels, where it would widen each figure's own spread and hide a real lead. A winner other
than cuBLAS is then timed once more against cuBLAS alone, on the same path and in the same
mode, and kept only if it wins again; else cuBLAS keeps the shape. The entry, with every figure, goes to the store (:mod:`multibackend.choose.store`), so later
processes reuse it and never time it again.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from multibackend.core.config import Config
from multibackend.core.errors import UnsupportedProblem
from multibackend.core.names import BASELINE

REPS = 20
MAX_SECONDS = 2.0


def measure(call: Any, accepted: list[str], mode: str,
            rerun: Callable[[str, Config, Any], Any], registry: Any) -> dict | None:
    """Check ``accepted`` backends' shortlists on ``call``'s operands (a matmul through
    ``rerun``: the public call with ``backend=name, config=config, out=out``; a dot in the
    call's own result), time them through ``rerun`` and return the entry; None for operands
    on the host (Triton's interpreter), where nothing can be timed."""
    from multibackend.verify.checks import reference_for, wrong
    from multibackend.verify.crosscheck import check_backend
    from multibackend.verify.measure import choose

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
            checked = check_backend(call, name, config, ref)
            if not checked.ok:
                dropped[name] = f"wrong or raised: {checked.detail}"[:300]
                continue
        else:
            fault = wrong(lambda out=None: rerun(name, config, out), call, ref, fresh=False)
            if fault is not None:
                dropped[name] = fault[:300]
                continue
        # timed as the call runs once chosen: backend named, its default config implied, so
        # a repeated call takes the same front (compiled, or the plan's) the chosen one will
        runs[name] = (lambda name=name: rerun(name, None, None))
        configs[name] = config
    if not runs:
        raise UnsupportedProblem(f"{problem.op}: autotune found no backend that runs "
                                 f"{problem.describe()} correctly: {dropped or skipped}")
    choice = choose(runs, mode, reps=REPS, max_seconds=MAX_SECONDS)
    base = choice.timings.get(BASELINE)
    return {
        "backend": choice.winner, "config": configs[choice.winner].as_dict(), "mode": mode,
        "m": problem.m, "n": problem.n, "k": problem.k, "batch": problem.batch,
        "dtype": problem.in_dtype,
        "timings_ms": {name: t.median_ms for name, t in choice.timings.items()},
        "baseline_ms": base.median_ms if base is not None else None, "spread": choice.lead,
        "confirmed_ms": ({name: t.median_ms for name, t in choice.confirmed.items()}
                         if choice.confirmed is not None else None),
        "skipped": skipped, "dropped": dropped,
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
