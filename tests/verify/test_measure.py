"""CPU tier for the one measuring routine's decision (:mod:`multibackend.verify.measure`): a lead
read from runs paired round by round, so a drifting host neither hides a real lead nor makes
one up, and a winner timed once more against cuBLAS before it is kept."""
from __future__ import annotations

import statistics

import pytest

from multibackend.core.names import BASELINE
from multibackend.gpu.timing import Timing
from multibackend.verify import measure


def _timing(samples: list[float]) -> Timing:
    """A figure of these runs, in the order they ran."""
    ordered = sorted(samples)
    deciles = statistics.quantiles(ordered, n=10, method="inclusive")
    return Timing(statistics.median(ordered), ordered[0], deciles[1], deciles[7], len(samples),
                  tuple(samples))


#: a host drifting over the rounds: each round runs 0% to 60% slower than the first
DRIFT = [1.0 + 0.6 * i / 19 for i in range(20)]


def test_a_real_lead_under_drift_wins_where_each_figures_spread_hid_it():
    """Triton runs 12% faster than cuBLAS in every round while the host drifts by 60%: each
    figure's own spread is about 28%, which the rule without pairing asks a lead to pass; the
    paired ratio is 1.136 in every round (no spread), so the lead must pass only the floor."""
    base = _timing([1.0 * d for d in DRIFT])
    rival = _timing([0.88 * d for d in DRIFT])
    assert measure.spread(base) > 0.25 and measure.spread(rival) > 0.25
    assert measure.lead_needed("eager", measure.spread(base), measure.spread(rival)) > 0.25
    chosen, lead = measure.winner({BASELINE: base, "triton": rival}, "eager")
    assert chosen == "triton" and lead == pytest.approx(0.03)
    paired = measure.paired_lead(rival, base)
    assert paired.ratio == pytest.approx(1 / 0.88) and paired.spread == pytest.approx(0.0)


def test_a_lead_that_comes_and_goes_round_by_round_is_noise():
    """The rival's median is 13% below cuBLAS's, but it ran 10% slower in 9 of 20 rounds:
    its paired ratios spread by more than its lead."""
    base = _timing([1.0] * 20)
    rival = _timing([0.87] * 11 + [1.1] * 9)
    assert rival.median_ms == pytest.approx(0.87)
    chosen, lead = measure.winner({BASELINE: base, "triton": rival}, "eager")
    assert chosen == BASELINE and lead > 0.2


def test_too_few_paired_runs_fall_back_to_each_figures_spread():
    base = _timing([1.0, 1.0, 1.0])
    rival = _timing([0.9, 0.9, 0.9])
    assert measure.paired_lead(rival, base) is None
    assert measure.winner({BASELINE: base, "triton": rival}, "eager") == ("triton", 0.03)


def _fake_time(*figures: dict):
    """A stand-in for :func:`measure.timed` answering each call with the next of ``figures``
    (name -> runs), for the names it is asked about."""
    answers = iter(figures)
    asked = []

    def time(runs, mode, *, reps, max_seconds):
        asked.append(sorted(runs))
        answer = next(answers)
        return {name: [_timing(answer[name])] for name in runs}

    return time, asked


def test_a_winner_is_kept_only_if_it_wins_again_against_cublas_alone():
    calls = {BASELINE: lambda: None, "triton": lambda: None, "cutlass": lambda: None}
    first = {BASELINE: [1.0] * 10, "triton": [0.8] * 10, "cutlass": [0.9] * 10}
    lost = {BASELINE: [1.0] * 10, "triton": [1.01] * 10}
    time, asked = _fake_time(first, lost)
    choice = measure.choose(calls, "graph", reps=10, max_seconds=1.0, time=time)
    assert asked == [sorted(calls), sorted([BASELINE, "triton"])]
    assert choice.winner == BASELINE
    assert choice.confirmed["triton"].median_ms == pytest.approx(1.01)
    held = {BASELINE: [1.0] * 10, "triton": [0.81] * 10}
    time, _ = _fake_time(first, held)
    choice = measure.choose(calls, "graph", reps=10, max_seconds=1.0, time=time)
    assert choice.winner == "triton" and choice.timings["cutlass"].median_ms == 0.9


def test_cublas_winning_the_first_timing_is_not_timed_again():
    calls = {BASELINE: lambda: None, "triton": lambda: None}
    time, asked = _fake_time({BASELINE: [1.0] * 10, "triton": [1.2] * 10})
    choice = measure.choose(calls, "eager", reps=10, max_seconds=1.0, time=time)
    assert choice.winner == BASELINE and choice.confirmed is None and len(asked) == 1
