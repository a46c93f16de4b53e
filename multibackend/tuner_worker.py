"""The tuner's child process: where candidates run, so that one that crashes cannot end a run.

:func:`multibackend.tuner.tune` starts ``python -m multibackend.tuner_worker JOB FD``: ``JOB``
is a pickled :class:`Job` file, ``FD`` a pipe on which this process reports, one message per
step, so the parent always knows what was running when the process died:

- ``("begin", marker)`` before each step; ``marker`` is ``("setup", problem)`` (operands and
  the float64 reference), ``("compile", problem, backend)`` (a backend's parallel compile of
  its candidates) or ``("item", id)`` (one candidate: run on poisoned output, compared with
  the reference, timed);
- ``("done", id, ms, reason)`` for each candidate: ``ms`` when it ran and matched the
  reference, else None and why it was dropped;
- ``("begin", ("refine", problem))`` and then ``("retimed", id, ms)`` for each of a problem's
  candidates close to its fastest, timed again in interleaved rounds (``ms`` replaces the
  first figure).

After a candidate raises on a GPU whose context no longer synchronizes (a poisoned CUDA
context), the process exits, and the parent starts a fresh one for what is left.
"""
from __future__ import annotations

import pickle
import statistics
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Hashable

from multibackend.backends.base import Config

from . import reference
from .arrays import on_stream
from .crosscheck import poison, reference_for
from .registry import parallel_prepare
from .request import Call, matmul_call
from .suites import Shape

REASON_CHARS = 300
#: candidates within this fraction of the fastest (and each backend's fastest) are timed
#: again, against each other
REFINE_WITHIN = 0.10
REFINE_ROUNDS = 4


@dataclass(frozen=True)
class Spec:
    """One problem to tune: a shape and an input dtype."""

    shape: Shape
    dtype: str


@dataclass(frozen=True)
class Item:
    """One candidate: backend ``backend`` with config ``config`` on problem ``problem``."""

    id: int
    problem: int
    backend: str
    config: dict


#: what the tuner's timer does: calls by key -> each one's milliseconds, timed against each
#: other (a single candidate is a dict of one)
Timer = Callable[[dict[Hashable, Callable[[], object]]], dict[Hashable, float]]


@dataclass
class GpuTimer:
    """Median GPU milliseconds of each call, their runs interleaved
    (:func:`multibackend.timing.time_interleaved`)."""

    warmup: int = 5
    reps: int = 50
    max_seconds: float = 10.0

    def __call__(self, calls: dict[Hashable, Callable[[], object]]) -> dict[Hashable, float]:
        from .timing import time_interleaved

        found = time_interleaved(calls, warmup=self.warmup, reps=self.reps,
                                 max_seconds=self.max_seconds)
        return {key: timing.median_ms for key, timing in found.items()}


@dataclass
class Job:
    """What one worker process evaluates. ``registry`` None means multibackend's registry;
    ``timer`` times calls against each other (:data:`Timer`)."""

    specs: dict[int, Spec]
    items: list[Item]
    device: str
    timer: Timer = field(default_factory=GpuTimer)
    registry: Any = None
    max_workers: int | None = None
    seed: int = 0


def random_operands(spec: Spec, device: str, seed: int) -> Call:
    """A call on fresh random non-zero operands of the spec's shape and dtype."""
    import torch

    from . import dtypes

    batch, m, n, k = spec.shape
    lead = (batch,) if batch > 1 else ()
    gen = torch.Generator(device=device).manual_seed(seed)
    tdtype = dtypes.torch_dtype(spec.dtype)

    def one(rows: int, cols: int):
        shape = lead + (rows, cols)
        if dtypes.get(spec.dtype).is_integer:
            return torch.randint(-8, 8, shape, generator=gen, device=device).to(tdtype)
        return (torch.rand(shape, generator=gen, device=device) * 2 - 1).to(tdtype)

    return matmul_call(one(m, k), one(k, n))


def _wrong(cmp) -> str:
    if cmp.rel_err == cmp.rel_err:  # not NaN
        return f"wrong: rel err {cmp.rel_err:.3g} > bound {cmp.bound:.3g}"
    return f"wrong: {cmp.detail}"


def evaluate(backend, config: Config, call: Call, ref, timer: Timer
             ) -> tuple[float | None, str | None, Callable[[], None] | None]:
    """(milliseconds, None, the timed call) for a candidate that matches the reference, else
    (None, why, None)."""
    problem, ops = call.problem, call.operands
    refused = backend.supports(problem)
    if refused is not None:
        return None, f"refused: {refused.message} (rule: {refused.rule})", None

    def once() -> None:
        with on_stream(ops.stream, call.device):
            backend.run(problem, ops, config)

    try:
        with on_stream(ops.stream, call.device):
            poison(ops.d)
            backend.prepare(problem, config)
        once()
        cmp = reference.compare(problem, ops.d, ref)
        if not cmp.ok:
            return None, _wrong(cmp), None
        return float(timer({config.name: once})[config.name]), None, once
    except Exception as exc:
        return None, f"raised: {type(exc).__name__}: {exc}"[:REASON_CHARS], None


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
            from .registry import REGISTRY

            job.registry = REGISTRY

    def send(self, *message) -> None:
        self.conn.send(message)

    def run(self) -> None:
        by_problem: dict[int, list[Item]] = {}
        for item in self.job.items:
            by_problem.setdefault(item.problem, []).append(item)
        for index, items in by_problem.items():
            if not self._problem(index, items):
                return

    def _problem(self, index: int, items: list[Item]) -> bool:
        """Evaluate one problem's candidates; False when the process must stop."""
        self.send("begin", ("setup", index))
        try:
            call = random_operands(self.job.specs[index], self.job.device, self.job.seed)
            ref = reference_for(call)
        except Exception as exc:
            for item in items:
                self.send("done", item.id, None, f"raised while making operands: "
                                                 f"{type(exc).__name__}: {exc}"[:REASON_CHARS])
            return _healthy(self.job.device)
        failed = self._compile(index, call, items)
        timed: dict[int, tuple[str, float, Callable[[], None]]] = {}
        for item in items:
            if item.id in failed:
                self.send("done", item.id, None, failed[item.id])
                continue
            self.send("begin", ("item", item.id))
            backend = self.job.registry.get(item.backend)
            ms, reason, once = evaluate(backend, Config.from_dict(item.config), call, ref,
                                        self.job.timer)
            self.send("done", item.id, ms, reason)
            if once is not None:
                timed[item.id] = (item.backend, ms, once)
            if reason is not None and not _healthy(self.job.device):
                return False
        self._refine(index, timed)
        return True

    def _refine(self, index: int,
                timed: dict[int, tuple[str, float, Callable[[], None]]]) -> None:
        """Time again, against each other, the candidates within REFINE_WITHIN of the fastest
        and every backend's fastest candidate (cuBLAS's among them): REFINE_ROUNDS times,
        their runs interleaved, and report each one's median over those rounds. Timed one
        after another, they ran at different clocks (a GPU at its power limit follows what
        ran in the last milliseconds), which could pick the winner; this is the comparison
        the benchmark groups make, each backend's best beside the others."""
        if not timed:
            return
        fastest = min(ms for _, ms, _ in timed.values())
        close = {i for i, (_, ms, _) in timed.items() if ms <= fastest * (1 + REFINE_WITHIN)}
        best_of: dict[str, int] = {}
        for i, (backend, ms, _) in timed.items():
            if backend not in best_of or ms < timed[best_of[backend]][1]:
                best_of[backend] = i
        close |= set(best_of.values())
        if len(close) < 2:
            return
        self.send("begin", ("refine", index))
        calls = {i: timed[i][2] for i in sorted(close)}
        rounds = [self.job.timer(calls) for _ in range(REFINE_ROUNDS)]
        for i in close:
            self.send("retimed", i, statistics.median(float(r[i]) for r in rounds))

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
                why = f"raised while compiling: {type(exc).__name__}: {exc}"[:REASON_CHARS]
            failed.update({item.id: why for item in mine if item.config["name"] not in built})
        return failed


def main(argv: list[str]) -> int:
    job_path, fd = argv[0], int(argv[1])
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    conn = Connection(fd, readable=False)
    try:
        _Worker(job, conn).run()
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
