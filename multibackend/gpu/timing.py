"""The one timing utility every benchmark, cross-check and tuning run uses.

GPU time is measured with CUDA events, after warm-up runs, and summarized by the median of
many runs. Calls compared with each other (a backend and its baseline) are timed by
:func:`time_interleaved`, their runs alternating, so drift treats them alike. Three modes say
what a figure includes:

- ``eager``: back-to-back calls, host included — what an eager user sees. Each sample times a
  burst of consecutive calls between two events (the GPU idle at its start), per call; calls
  timed against each other burst alike (as many calls, about 2 ms for the slowest).
  Inputs are not flushed from L2 between the calls of a burst, as in a real loop.
- ``graph``: the calls captured in a CUDA graph once (after warm-up) and the graph replayed —
  what a deployment that captures graphs sees: kernel time only. The calls must launch on
  torch's current stream when called (the public ``matmul`` does).
- ``kernel``: the call run directly, its host time hidden: the GPU is held busy (a spin kernel
  lasting well beyond one call's host time) while the host queues the start event, the call
  and the end event. For internal ranking of raw launches that are not captured (autotuning,
  the cross-check).

In ``graph`` and ``kernel`` modes the L2 cache is flushed before each timed run by writing a
buffer larger than it (outside the timed region), so small problems are not flattered by
operands left in cache. Host overhead (calls per second of the Python entry point) is measured
with :func:`host_calls_per_second`.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Hashable

_FLUSH = {}
#: seconds the spin kernel outlasts three host calls by
SPIN_MARGIN_S = 50e-6
#: the modes reported figures are in (see the module docstring), and the internal one
MODES = ("eager", "graph")
ALL_MODES = MODES + ("kernel",)
#: an eager sample is a burst of back-to-back calls lasting about this long (at least 5 calls)
EAGER_BURST_S = 2e-3


@dataclass(frozen=True)
class Timing:
    """Summary of repeated GPU timings, in milliseconds."""

    median_ms: float
    min_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    #: each timed run, in the order they ran (for :func:`time_interleaved`, run i of every
    #: call timed together is from the same round: see :func:`paired_ratio`)
    samples_ms: tuple[float, ...] = ()

    def tflops(self, flops: float) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12

    def gbps(self, nbytes: float) -> float:
        return nbytes / (self.median_ms * 1e-3) / 1e9


def _flush_buffer(device):
    import torch

    buf = _FLUSH.get(device)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        buf = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        _FLUSH[device] = buf
    return buf


def _clock_hz(device) -> float:
    import torch

    rate_khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
    return rate_khz * 1e3


def _host_seconds(fn, stream) -> float:
    """Host time of one call (the GPU work it queues not awaited), the fastest of three."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    stream.synchronize()
    return best


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_gpu(fn: Callable[[], object], *, warmup: int = 5, reps: int = 50,
             flush_l2: bool = True, max_seconds: float = 10.0, mode: str = "kernel") -> Timing:
    """Time ``fn`` (which launches GPU work on torch's current stream) with CUDA events.

    ``warmup`` untimed runs, then up to ``reps`` timed runs (fewer if they would exceed
    ``max_seconds``), each preceded by an L2 flush when ``flush_l2`` (not in eager mode).
    """
    return time_interleaved({None: fn}, warmup=warmup, reps=reps, flush_l2=flush_l2,
                            max_seconds=max_seconds, mode=mode)[None]


def check_mode(mode: str) -> str:
    if mode not in ALL_MODES:
        raise ValueError(f"timing mode is {mode!r}: expected one of {', '.join(ALL_MODES)}")
    return mode


def _capture(fn: Callable[[], object]):
    """A CUDA graph of one call of ``fn`` (warmed up already), ready to replay."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_interleaved(fns: dict[Hashable, Callable[[], object]], *, warmup: int = 5,
                     reps: int = 50, flush_l2: bool = True, max_seconds: float = 10.0,
                     mode: str = "kernel") -> dict[Hashable, Timing]:
    """Time several calls against each other: :func:`time_gpu` for each, with their timed
    runs interleaved one by one (every round runs each call once, in the orders of
    :func:`rotations`), so all of them see the same clock and temperature. On a GPU at
    its power limit the clock follows what ran in the last milliseconds; calls timed one
    after another would each be timed at a different clock.

    ``reps`` timed runs of each (fewer if all of them together would exceed
    ``max_seconds``), in ``mode`` (see the module docstring)."""
    import torch

    check_mode(mode)
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream()
    names = list(fns)
    spins, longest, total_single = {}, {}, 0.0
    runs = dict(fns)
    for name in names:
        fn = fns[name]
        for _ in range(warmup):
            fn()
        stream.synchronize()
        start_probe = time.perf_counter()
        fn()
        stream.synchronize()
        single = time.perf_counter() - start_probe
        if mode == "graph":
            runs[name] = _capture(fn)
        host = _host_seconds(runs[name], stream)
        longest[name] = max(single, host, 1e-7)
        total_single += single
        # the fastest of three host calls, with room for a slower one: a spin that ends
        # before the host has queued the call would time the host's launch as GPU work
        spins[name] = int((3 * host + SPIN_MARGIN_S) * _clock_hz(device))
    # eager: enough calls that a burst outlasts the start event's latency many times over,
    # as many for every call (a longer burst runs hotter on a GPU at its power limit)
    burst = max(5, int(EAGER_BURST_S / max(longest.values(), default=1.0))) \
        if mode == "eager" else 1
    reps = max(3, min(reps, int(max_seconds / max(total_single * burst, 1e-6))))
    flush = _flush_buffer(device) if flush_l2 and mode != "eager" else None
    events: dict[Hashable, list] = {name: [] for name in names}
    for order in rotations(names, reps):
        for name in order:
            if flush is not None:
                flush.fill_(reps)
            if mode == "eager":
                stream.synchronize()  # the burst starts on an idle GPU, as a user's loop does
            else:
                torch.cuda._sleep(spins[name])
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            run = runs[name]
            start.record(stream)
            for _ in range(burst):
                run()
            end.record(stream)
            events[name].append((start, end, burst))
    stream.synchronize()
    timings = {}
    for name, triples in events.items():
        times = [s.elapsed_time(e) / n for s, e, n in triples]
        timings[name] = Timing(statistics.median(times), min(times), _quantile(times, 0.2),
                               _quantile(times, 0.8), len(times), tuple(times))
    return timings


def paired_ratio(first: Timing, second: Timing) -> float:
    """The median over rounds of ``first``'s run over ``second``'s in the same round, for two
    calls timed together by :func:`time_interleaved`. Runs of one round are milliseconds
    apart, so what moves a host-bound figure over seconds (the CPU's clock and load) moves
    both alike and cancels; two identical calls compare within about 1% where their separate
    medians of 100 eager runs differ by up to 5% (validation runs on an H100)."""
    if not first.samples_ms or len(first.samples_ms) != len(second.samples_ms):
        raise ValueError(f"paired_ratio: timings of {len(first.samples_ms)} and "
                         f"{len(second.samples_ms)} runs: expected two timed together")
    return statistics.median(a / b for a, b in zip(first.samples_ms, second.samples_ms))


def rotations(items: list, rounds: int, seed: int = 0) -> list[list]:
    """``rounds`` orderings of ``items`` for interleaved timing: each starts one item further
    on round a cycle, so that every item takes every place in turn (a GPU's clock falls as it
    heats within a round), and after every ``len(items)`` rounds the cycle is shuffled
    (seeded), so that no item always runs right after the same other one (on a GPU at its
    power limit a run is faster after a run that drew less power)."""
    if not items:
        return [[] for _ in range(rounds)]
    rng = random.Random(seed)
    cycle, orders = list(items), []
    for r in range(rounds):
        shift = r % len(cycle)
        if r and not shift:
            rng.shuffle(cycle)
        orders.append(cycle[shift:] + cycle[:shift])
    return orders


#: a backend's first-call autotuning (:func:`fastest`): interleaved rounds per candidate, and
#: the lead a later candidate needs over an earlier one. On an H100 (f16 and bf16, 14 decode
#: products, same run) kernel-mode figures ranked TMA split-K tiles as graph mode did, within
#: 1-2%; with a 3% tie, 256x1024x4096's 2-slice tile, offered first and 4.5% slower in both
#: modes, won 2 of 5 tries (and 4x4096x4096's, 5% slower, won in a benchmark run). A 1% tie
#: ran the validation suite as the 3% one did (Triton, graph: 1.024 and 1.025 against 1.023).
#: Each round times a candidate AUTOTUNE_REPS times (fewer where that passes
#: AUTOTUNE_ROUND_S): with 3 rounds of 7 runs, the decode picks that later ran below 0.95x were
#: within 1-2% of the next candidate, about what a 7-run median moves by.
AUTOTUNE_ROUNDS = 5
AUTOTUNE_TIE = 0.01
AUTOTUNE_REPS = 25
AUTOTUNE_ROUND_S = 0.5


def fastest(candidates: list, launch: Callable[[object], object], *,
            rounds: int = AUTOTUNE_ROUNDS, tie: float = AUTOTUNE_TIE) -> object | None:
    """The fastest of ``candidates`` as ``launch(candidate)`` runs them, for a backend's
    first-call autotuning: each is timed (``kernel`` mode, AUTOTUNE_REPS runs) in ``rounds``
    rounds ordered by :func:`rotations` and ranked by the median of its rounds, so that a
    clock or temperature drift while they are timed favours none; one within ``tie`` of the
    fastest wins if it comes earlier in ``candidates`` (the expected best first). A candidate
    whose launch raises is dropped; None when every one did."""
    times: dict = {}
    for order in rotations(list(candidates), rounds):
        for candidate in order:
            if candidate in times and not times[candidate]:
                continue
            samples = times.setdefault(candidate, [])
            try:
                samples.append(time_gpu(lambda: launch(candidate), warmup=2, reps=AUTOTUNE_REPS,
                                        max_seconds=AUTOTUNE_ROUND_S).median_ms)
            except Exception:  # noqa: BLE001 - a candidate that cannot run is left out
                samples.clear()
    ranked = [(statistics.median(v), c) for c, v in times.items() if v]
    if not ranked:
        return None
    best_ms = min(ms for ms, _ in ranked)
    return next(c for ms, c in ranked if ms <= best_ms * (1 + tie))


def host_calls_per_second(fn: Callable[[], object], *, seconds: float = 1.0,
                          sync: Callable[[], object] | None = None) -> float:
    """How many times per second the host can call ``fn`` (GPU work queued, not awaited)."""
    for _ in range(10):
        fn()
    if sync:
        sync()
    calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            fn()
        calls += 100
    elapsed = time.perf_counter() - start
    if sync:
        sync()
    return calls / elapsed
