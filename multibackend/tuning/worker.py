"""The tuner's child process: where candidates run, so that one that crashes cannot end a run.

:func:`multibackend.tuning.tuner.tune` (on a cluster, each Dask worker:
:mod:`multibackend.tuning.cluster`) starts a Python process that calls :func:`main` with ``JOBS
REPORTS``, two pipes. The process first reports ``("ready", fingerprint)``
(:func:`multibackend.core.environment.fingerprint`: the GPU and versions the figures will be
measured with), then runs each :class:`Job` it reads from ``JOBS`` and reports ``("idle",)`` after
each, so that one process serves job after job (its compiled kernels and warm GPU kept) until
``JOBS`` closes or its parent dies. While a job runs it reports one message per step on
``REPORTS``, so the parent always knows what was running when the process died:

- ``("begin", marker)`` before each step; ``marker`` is ``("setup", problem)`` (operands and
  the float64 reference), ``("compile", problem, backend)`` (a backend's parallel compile of
  its candidates), ``("item", id)`` (one candidate: run through the public call on poisoned
  output, compared with the reference, timed alone in the job's mode) or ``("final",
  problem, mode, ids)`` (a problem's finalists, picked by :func:`finalists` from its
  candidates' first figures, timed against each other in ``mode``; the operands are made
  again under the first mode's marker);
- ``("done", id, ms, reason)`` for each candidate: ``ms`` when it ran and matched the
  reference, else None and why it was dropped;
- ``("final", mode, figures)`` after a problem's final rounds in each mode (the order of
  :func:`final_modes`): each candidate's :class:`Figure` by id; before it, ``("unfit", id,
  mode, reason)`` for each one that raised when timed in that mode (a call that cannot be
  captured in a CUDA graph, say).

Every candidate is timed the way a call runs: ``matmul(A, B, backend=name, config=config)``
(:data:`PublicCall`, multibackend's public call unless the job names a stand-in) on torch
tensors, launching on torch's current stream when called, so that the same call also runs
inside a CUDA graph capture.

After a candidate raises on a GPU whose context no longer synchronizes (a poisoned CUDA
context), the process exits, and the parent starts a fresh one for what is left.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Hashable, Protocol

from multibackend.choose.registry import parallel_prepare
from multibackend.core import environment
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from multibackend.core.names import BASELINE
from multibackend.gpu.timing import MODES, Timing, time_interleaved
from multibackend.io.request import Call, matmul_call
from multibackend.tuning.suites import Shape
from multibackend.verify.checks import reference_for, wrong
from multibackend.verify.measure import Lead, paired_lead

REASON_CHARS = 300
#: candidates within this fraction of the fastest (and each backend's fastest) are timed
#: again, against each other, in every mode
FINAL_WITHIN = 0.10
FINAL_ROUNDS = 4


#: the major orders of A and B a tune takes, A's letter first: "n" row-major, "t" column-major
LAYOUTS = ("nn", "nt", "tn", "tt")


@dataclass(frozen=True)
class Spec:
    """One problem to tune: a shape, an input dtype and the major orders of A and B
    (``layout``: "n" row-major, "t" column-major, A's letter first; "nt" is ``x @ W.T``)."""

    shape: Shape
    dtype: str
    layout: str = "nn"

    @property
    def layouts(self) -> tuple[str, str]:
        """(A's, B's) layout as a Problem names them: "row" or "col"."""
        return tuple("col" if letter == "t" else "row" for letter in self.layout)


@dataclass(frozen=True)
class Item:
    """One candidate: backend ``backend`` with config ``config`` on problem ``problem``."""

    id: int
    problem: int
    backend: str
    config: dict


@dataclass(frozen=True)
class Figure:
    """One candidate's time in one mode over the final rounds: ``ms``, the median of its
    rounds' medians, and ``spread``, how far apart its figures lie relative to ``ms`` (the
    larger of the rounds' medians' range and the median p20-p80 width of a round); ``lead``,
    its :class:`~multibackend.verify.measure.Lead` over the baseline from their runs paired
    round by round (None for the baseline itself, or where the runs were not paired)."""

    ms: float
    spread: float
    lead: Lead | None = None


def check_mode(mode: str, where: str) -> str:
    """``mode`` when it is a timing mode tuned in (:data:`multibackend.gpu.timing.MODES`)."""
    if mode not in MODES:
        raise InvalidArgument(f"{where}: mode is {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def final_modes(mode: str) -> tuple[str, ...]:
    """The modes of the final rounds, in the order they run: the choice's mode first."""
    return (mode,) + tuple(m for m in MODES if m != mode)


class Timer(Protocol):
    """What the tuner times with: calls by key -> each one's :class:`Timing`, the calls timed
    against each other (a single candidate is a dict of one) in the timer's ``mode``."""

    mode: str

    def __call__(self, calls: dict[Hashable, Callable[[], object]]
                 ) -> dict[Hashable, Timing]: ...

    def in_mode(self, mode: str) -> "Timer":
        """The same timer in ``mode``."""


#: the public call candidates are timed through: ``call(A, B, backend=name, config=config,
#: out=None)`` -> D, as :func:`multibackend.matmul` takes it
PublicCall = Callable[..., Any]


@dataclass(frozen=True)
class GpuTimer:
    """GPU milliseconds of each call, their runs interleaved, in ``mode`` ("eager":
    back-to-back calls, host included; "graph": calls captured in a CUDA graph and replayed;
    see :func:`multibackend.gpu.timing.time_interleaved`)."""

    warmup: int = 5
    reps: int = 50
    max_seconds: float = 10.0
    mode: str = "eager"

    def __post_init__(self) -> None:
        check_mode(self.mode, "GpuTimer")

    def __call__(self, calls: dict[Hashable, Callable[[], object]]) -> dict[Hashable, Timing]:
        return time_interleaved(calls, warmup=self.warmup, reps=self.reps,
                                max_seconds=self.max_seconds, mode=self.mode)

    def in_mode(self, mode: str) -> "GpuTimer":
        return dataclasses.replace(self, mode=mode)


@dataclass
class Job:
    """What one worker process evaluates: ``items``, each candidate on its own, each problem's
    followed by the final rounds of its finalists (picked among its correct candidates, with
    ``screened``: those of earlier processes and their first milliseconds); then ``finals``,
    the final rounds of problems whose candidates all ran before. ``registry`` None means
    multibackend's registry and ``matmul`` None its public call; ``timer`` times calls
    against each other in the mode the choice is made in (:class:`Timer`)."""

    specs: dict[int, Spec]
    items: list[Item]
    device: str
    timer: Timer = field(default_factory=GpuTimer)
    registry: Any = None
    max_workers: int | None = None
    seed: int = 0
    matmul: PublicCall | None = None
    finals: dict[int, list[Item]] = field(default_factory=dict)
    screened: list[tuple[Item, float]] = field(default_factory=list)


def random_operands(spec: Spec, device: str, seed: int) -> tuple[Any, Any]:
    """Fresh random non-zero torch tensors A and B of the spec's shape, dtype and layouts (a
    column-major one is the transpose of a row-major tensor)."""
    import torch

    from multibackend.core import dtypes

    batch, m, n, k = spec.shape
    lead = (batch,) if batch > 1 else ()
    gen = torch.Generator(device=device).manual_seed(seed)
    tdtype = dtypes.torch_dtype(spec.dtype)

    def one(rows: int, cols: int, layout: str):
        if layout == "col":
            return one(cols, rows, "row").transpose(-2, -1)
        shape = lead + (rows, cols)
        if dtypes.get(spec.dtype).is_integer:
            return torch.randint(-8, 8, shape, generator=gen, device=device).to(tdtype)
        return (torch.rand(shape, generator=gen, device=device) * 2 - 1).to(tdtype)

    a_layout, b_layout = spec.layouts
    return one(m, k, a_layout), one(k, n, b_layout)


def figure(rounds: list[Timing], baseline: list[Timing] | None = None) -> Figure:
    """A candidate's :class:`Figure` from its timings in the final rounds, with its lead over
    the ``baseline``'s timings of the same rounds where given."""
    medians = [t.median_ms for t in rounds]
    ms = statistics.median(medians)
    lead = None
    if baseline is not None and baseline is not rounds:
        lead = paired_lead(_joined(rounds), _joined(baseline))
    if ms <= 0:
        return Figure(ms, 0.0, lead)
    between_rounds = (max(medians) - min(medians)) / ms
    within_a_round = statistics.median(t.p80_ms - t.p20_ms for t in rounds) / ms
    return Figure(ms, max(between_rounds, within_a_round), lead)


def _joined(rounds: list[Timing]) -> Timing:
    """The runs of several rounds as one Timing (only its runs are read: run i of two calls'
    joined timings still comes from the same round)."""
    samples = tuple(ms for t in rounds for ms in t.samples_ms)
    return Timing(0.0, 0.0, 0.0, 0.0, len(samples), samples)


def finalists(first_ms: dict[int, tuple[str, float]]) -> list[int]:
    """The candidates (id -> (backend, first milliseconds)) of the final rounds: those within
    FINAL_WITHIN of the fastest, and every backend's fastest (the baseline's among them)."""
    if not first_ms:
        return []
    fastest = min(ms for _, ms in first_ms.values())
    chosen = {i for i, (_, ms) in first_ms.items() if ms <= fastest * (1 + FINAL_WITHIN)}
    best_of: dict[str, int] = {}
    for i, (backend, ms) in first_ms.items():
        if backend not in best_of or ms < first_ms[best_of[backend]][1]:
            best_of[backend] = i
    return sorted(chosen | set(best_of.values()))


def public_call(matmul: PublicCall, item: Item, a: Any, b: Any) -> Callable[..., object]:
    """The candidate's call as a user makes it: ``matmul(a, b, backend=..., config=...)``
    (into ``out`` when given), launching on torch's current stream when called. Without
    ``out`` it is the call the compiled front serves once repeated, as it serves a call
    planned from a tuning table (:mod:`multibackend.run.fastcall`)."""
    config = Config.from_dict(item.config)

    def call(out: Any = None) -> object:
        if out is None:
            return matmul(a, b, backend=item.backend, config=config)
        return matmul(a, b, backend=item.backend, config=config, out=out)

    return call


def evaluate(timed: Callable[..., object], call: Call, ref: Any, timer: Timer
             ) -> tuple[float | None, str | None]:
    """(milliseconds, None) for a candidate whose call matches the reference, both into a
    poisoned ``out`` and as timed (making D itself), else (None, why). ``timed`` is the
    candidate's :func:`public_call`; ``call`` the validated call of the same operands."""
    fault = wrong(timed, call, ref)
    if fault is not None:
        return None, fault[:REASON_CHARS]
    try:
        return float(timer({None: timed})[None].median_ms), None
    except Exception as exc:
        return None, _raised(exc)


def _raised(exc: Exception, during: str = "") -> str:
    """Why a step that raised ``exc`` failed (``during``: " while ..." where it helps)."""
    return f"raised{during}: {type(exc).__name__}: {exc}"[:REASON_CHARS]


def _refusal(backend: Any, call: Call) -> str | None:
    """Why the backend refuses the call's problem, or None when it supports it."""
    refused = backend.supports(call.problem)
    if refused is None:
        return None
    return f"refused: {refused.message} (rule: {refused.rule})"


def _healthy(device: str) -> bool:
    if not device.startswith("cuda"):
        return True
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


class _Worker:
    def __init__(self, job: Job, conn: Connection):
        self.job, self.conn = job, conn
        if job.registry is None:
            from multibackend.choose.registry import REGISTRY

            job.registry = REGISTRY
        if job.matmul is None:
            from multibackend.api import matmul

            job.matmul = matmul

    def send(self, *message) -> None:
        self.conn.send(message)

    def run(self) -> bool:
        """Each problem's pending candidates and then its final rounds; then the final
        rounds of the problems the job lists. False when the process must stop (its GPU
        context is poisoned), the job left unfinished."""
        by_problem: dict[int, list[Item]] = {}
        for item in self.job.items:
            by_problem.setdefault(item.problem, []).append(item)
        for index, items in by_problem.items():
            if not self._screen(index, items):
                return False
            if not self._final(index, self._finalists(index)):
                return False
        return all(self._final(index, items) for index, items in self.job.finals.items())

    def _finalists(self, index: int) -> list[Item]:
        """The problem's finalists among its correct candidates, this process's and those
        of the processes before it."""
        mine = {item.id: (item, ms) for item, ms in self.job.screened if item.problem == index}
        chosen = finalists({i: (item.backend, ms) for i, (item, ms) in mine.items()})
        return [mine[i][0] for i in chosen]

    def _screen(self, index: int, items: list[Item]) -> bool:
        """Evaluate one problem's candidates, each on its own (the correct ones join the
        job's ``screened``); False when the process must stop."""
        self.send("begin", ("setup", index))
        try:
            a, b = random_operands(self.job.specs[index], self.job.device, self.job.seed)
            call = matmul_call(a, b)
            ref = reference_for(call)
        except Exception as exc:
            for item in items:
                self.send("done", item.id, None, _raised(exc, " while making operands"))
            return _healthy(self.job.device)
        failed = self._compile(index, call, items)
        for item in items:
            if item.id in failed:
                self.send("done", item.id, None, failed[item.id])
                continue
            self.send("begin", ("item", item.id))
            reason = _refusal(self.job.registry.get(item.backend), call)
            ms = None
            if reason is None:
                ms, reason = evaluate(public_call(self.job.matmul, item, a, b), call, ref,
                                      self.job.timer)
            self.send("done", item.id, ms, reason)
            if reason is None:
                self.job.screened.append((item, ms))
            elif not _healthy(self.job.device):
                return False
        return True

    def _final(self, index: int, items: list[Item]) -> bool:
        """Time a problem's finalists against each other in every mode: FINAL_ROUNDS rounds,
        their runs interleaved, and report each one's :class:`Figure`; False when the process
        must stop. Timed one after another, they ran at different clocks (a GPU at its power
        limit follows what ran in the last milliseconds), which could pick the winner; this
        is the comparison the benchmark groups make, each backend's best beside the others."""
        if not items:
            return True
        modes = final_modes(self.job.timer.mode)
        ids = tuple(item.id for item in items)
        self.send("begin", ("final", index, modes[0], ids))
        try:
            a, b = random_operands(self.job.specs[index], self.job.device, self.job.seed)
        except Exception as exc:
            for mode in modes:
                for i in ids:
                    self.send("unfit", i, mode, _raised(exc, " while making operands"))
                self.send("final", mode, {})
            return _healthy(self.job.device)
        calls = {item.id: public_call(self.job.matmul, item, a, b) for item in items}
        baseline = next((item.id for item in items if item.backend == BASELINE), None)
        for mode in modes:
            self.send("begin", ("final", index, mode, ids))
            timings = self._rounds(calls, mode)
            base = timings.get(baseline)
            self.send("final", mode, {i: figure(rounds, base) for i, rounds in timings.items()})
        return True

    def _rounds(self, calls: dict[int, Callable[[], object]], mode: str
                ) -> dict[int, list[Timing]]:
        """Each call's timings in FINAL_ROUNDS interleaved rounds in ``mode``; a call that
        raises when timed in ``mode`` is reported unfit for it and left out."""
        timer = self.job.timer.in_mode(mode)
        try:
            rounds = [timer(calls) for _ in range(FINAL_ROUNDS)]
        except Exception:
            if not _healthy(self.job.device):
                raise
            calls = self._fit(calls, timer)
            rounds = [timer(calls) for _ in range(FINAL_ROUNDS)] if calls else []
        return {i: [found[i] for found in rounds] for i in calls}

    def _fit(self, calls: dict[int, Callable[[], object]], timer: Timer
             ) -> dict[int, Callable[[], object]]:
        """The calls that can be timed alone in the timer's mode; each other one is reported
        unfit with its reason."""
        fit = {}
        for i, fn in calls.items():
            try:
                timer({i: fn})
                fit[i] = fn
            except Exception as exc:
                self.send("unfit", i, timer.mode, _raised(exc))
                if not _healthy(self.job.device):
                    raise
        return fit

    def _compile(self, index: int, call: Call, items: list[Item]) -> dict[int, str]:
        """Compile each backend's candidates at once where it can; the ids that failed."""
        failed: dict[int, str] = {}
        names = dict.fromkeys(item.backend for item in items)
        for name in names:
            compile_many = parallel_prepare(self.job.registry.get(name))
            mine = [item for item in items if item.backend == name]
            if compile_many is None or call.problem.op != "matmul":
                continue
            self.send("begin", ("compile", index, name))
            configs = [Config.from_dict(item.config) for item in mine]
            try:
                built = {c.name for _, c in compile_many([(call.problem, c) for c in configs],
                                                         self.job.max_workers)}
                why = "raised: compile failed in the parallel build"
            except Exception as exc:
                built = set()
                why = _raised(exc, " while compiling")
            failed.update({item.id: why for item in mine if item.config["name"] not in built})
        return failed


def _exit_with_parent(interval_s: float = 0.5) -> None:
    """End this process when the process that started it is gone (a Dask worker that died
    takes its tuner process with it, even one stuck in a hung candidate)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    """Serve jobs: ``argv`` is ``[JOBS, REPORTS]``, the file descriptors of the pipe jobs
    arrive on and of the pipe reports go out on (see the module docstring)."""
    jobs = Connection(int(argv[0]), writable=False)
    conn = Connection(int(argv[1]), readable=False)
    _exit_with_parent()
    try:
        conn.send(("ready", environment.fingerprint()))
        while True:
            try:
                job = jobs.recv()
            except EOFError:
                return 0
            if not _Worker(job, conn).run():
                return 0
            conn.send(("idle",))
    finally:
        conn.close()
        jobs.close()
