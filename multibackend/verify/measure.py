"""The one routine that measures candidates, for first-call autotuning, ``tune`` and ``check``.

A candidate is a (backend, config) pair run as a closure. Each is checked first on poisoned
output against the float64 reference (:func:`multibackend.verify.checks.wrong`); the right ones
are timed against each other, cuBLAS as torch calls it among them, their runs interleaved
(:func:`multibackend.gpu.timing.time_interleaved`) in one mode — ``eager`` (back-to-back
public calls, host included), ``graph`` (captured once, replayed) or the host-hidden ``kernel``
mode of the cross-check — and a winner other than the baseline must lead it by more than
:func:`lead_needed`.

What decides is the ratio of the two calls' runs paired round by round (:func:`paired_lead`):
runs of one round are milliseconds apart, so what moves a host-bound figure over seconds (the
CPU's clock and load) moves both alike and cancels, where the spread of each figure alone
(p20-p80 over the median) holds that drift and can hide a real lead. The winner must lead by
more than the larger of that ratio's own spread and the mode's floor
(:data:`multibackend.core.names.MIN_SPREAD`). Figures without paired runs (summaries read
back from a file) fall back to the larger of the two figures' spreads.
"""
from __future__ import annotations

import statistics
from typing import Callable, Hashable, NamedTuple

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


#: the fewest paired rounds a ratio's spread is read from
MIN_PAIRS = 5


class Lead(NamedTuple):
    """A candidate against the baseline over runs paired round by round: ``ratio``, the median
    of the baseline's run over the candidate's (above 1: the candidate is faster), and
    ``spread``, how far those ratios lie apart ((p80 - p20) / median)."""

    ratio: float
    spread: float


def paired_lead(candidate: Timing, baseline: Timing) -> Lead | None:
    """The candidate's :class:`Lead` over the baseline from their runs timed together by
    :func:`~multibackend.gpu.timing.time_interleaved` (run i of each from round i); None
    where they hold fewer than MIN_PAIRS paired runs."""
    pairs = len(candidate.samples_ms)
    if pairs < MIN_PAIRS or pairs != len(baseline.samples_ms):
        return None
    ratios = sorted(b / c for b, c in zip(baseline.samples_ms, candidate.samples_ms) if c > 0)
    if len(ratios) < MIN_PAIRS:
        return None
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    median = statistics.median(ratios)
    return Lead(median, (deciles[7] - deciles[1]) / median)  # p80 - p20


def leads(lead: Lead, mode: str) -> tuple[bool, float]:
    """Whether a paired :class:`Lead` beats the baseline, and the lead it had to exceed: the
    larger of the ratio's spread and the mode's floor."""
    needed = lead_needed(mode, lead.spread)
    return lead.ratio > 1 + needed, needed


def winner(timings: dict[str, Timing], mode: str) -> tuple[str, float]:
    """The winner among ``timings`` (backend name to its figure) and the lead it had to
    exceed: the fastest, where it beats :data:`~multibackend.core.names.BASELINE` by more
    than its paired lead's spread (:func:`leads`), or, without paired runs, by more than
    :func:`lead_needed` of the two figures; else the baseline. Without a baseline figure,
    the fastest (and the mode's floor)."""
    fastest = min(timings, key=lambda name: timings[name].median_ms)
    base = timings.get(BASELINE)
    if base is None:
        return fastest, lead_needed(mode)
    if fastest == BASELINE:
        return BASELINE, lead_needed(mode, spread(base))
    paired = paired_lead(timings[fastest], base)
    if paired is not None:
        won, lead = leads(paired, mode)
        return (fastest if won else BASELINE), lead
    lead = lead_needed(mode, spread(base), spread(timings[fastest]))
    return (fastest if beats(timings[fastest].median_ms, base.median_ms, lead) else BASELINE), lead


class Choice(NamedTuple):
    """What :func:`choose` decided: the winner, the lead it had to exceed, every candidate's
    figure, and the winner's and the baseline's figures timed again (None where the
    baseline won the first timing or has no figure)."""

    winner: str
    lead: float
    timings: dict[str, Timing]
    confirmed: dict[str, Timing] | None


def choose(runs: dict[str, Callable[[], object]], mode: str, *, reps: int, max_seconds: float,
           time: Callable[..., dict] = timed) -> Choice:
    """Time ``runs`` (backend name to its call) against each other in ``mode`` and pick the
    :func:`winner`. A winner other than the baseline is timed once more against the baseline
    alone, on the same path and in the same mode, and kept only if it wins again: a lead one
    timing showed and the next does not is noise, and the baseline keeps the shape."""
    timings = {name: found[0] for name, found in
               time(runs, mode, reps=reps, max_seconds=max_seconds).items()}
    chosen, lead = winner(timings, mode)
    if chosen == BASELINE or BASELINE not in runs:
        return Choice(chosen, lead, timings, None)
    pair = {chosen: runs[chosen], BASELINE: runs[BASELINE]}
    again = {name: found[0] for name, found in
             time(pair, mode, reps=reps, max_seconds=max_seconds).items()}
    kept, lead = winner(again, mode)
    return Choice(kept, lead, timings, again)
