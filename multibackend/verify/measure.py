"""The one routine that measures candidates, for first-call autotuning, ``tune`` and ``check``.

A candidate is a (backend, config) pair run as a closure. Each is checked first on poisoned
output against the float64 reference (:func:`multibackend.verify.checks.wrong`); the right ones
are timed against each other, cuBLAS as torch calls it among them, their runs interleaved
(:func:`multibackend.gpu.timing.time_interleaved`) in one mode — ``eager`` (back-to-back
public calls, host included), ``graph`` (captured once, replayed) or the host-hidden ``kernel``
mode of the cross-check — and a winner other than the baseline must lead it by more than
:func:`lead_needed`: the larger of the two figures' measured spreads and the mode's floor
(:data:`multibackend.core.names.MIN_SPREAD`).
"""
from __future__ import annotations

from typing import Callable, Hashable

from multibackend.core.names import BASELINE, MIN_SPREAD
from multibackend.gpu.timing import Timing, time_interleaved


def timed(runs: dict[Hashable, Callable[[], object]], mode: str, *, rounds: int = 1,
          reps: int = 50, max_seconds: float = 10.0, warmup: int = 5
          ) -> dict[Hashable, list[Timing]]:
    """Each run's timings in ``rounds`` rounds, every round timing all of them together,
    their runs interleaved, in ``mode``."""
    found = [time_interleaved(runs, warmup=warmup, reps=reps, max_seconds=max_seconds,
                              mode=mode) for _ in range(rounds)]
    return {name: [round_[name] for round_ in found] for name in runs}


def spread(timing: Timing) -> float:
    """A figure's own spread: (p80 - p20) / median."""
    return (timing.p80_ms - timing.p20_ms) / timing.median_ms if timing.median_ms > 0 else 0.0


def lead_needed(mode: str, *spreads: float) -> float:
    """The relative lead over the baseline a winner must exceed in ``mode``: the largest of
    the figures' spreads and the mode's floor."""
    return max((MIN_SPREAD[mode], *spreads))


def beats(ms: float, baseline_ms: float, lead: float) -> bool:
    """Whether ``ms`` leads ``baseline_ms`` by more than ``lead`` (the baseline takes more
    than ``1 + lead`` times as long)."""
    return ms * (1 + lead) < baseline_ms


def winner(timings: dict[str, Timing], mode: str) -> tuple[str, float]:
    """The winner among ``timings`` (backend name to its figure) and the lead it had to
    exceed: the fastest, where it beats :data:`~multibackend.core.names.BASELINE` by more
    than :func:`lead_needed` of the two figures; else the baseline. Without a baseline
    figure, the fastest (and the mode's floor)."""
    fastest = min(timings, key=lambda name: timings[name].median_ms)
    base = timings.get(BASELINE)
    if base is None:
        return fastest, lead_needed(mode)
    lead = lead_needed(mode, spread(base), spread(timings[fastest]))
    return (fastest if beats(timings[fastest].median_ms, base.median_ms, lead) else BASELINE), lead
