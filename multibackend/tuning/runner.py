"""The tuner's parent side: the plan of a tune (problems and candidates), the results the
workers report, and the worker processes themselves (:class:`Child`, one at a time per GPU,
restarted after a candidate kills one; :class:`Runner`, which feeds a plan through them with
time limits). :mod:`multibackend.tuning.tuner` runs a plan here on one machine, and
:mod:`multibackend.tuning.cluster` on the workers of a Dask cluster."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Iterable

from multibackend.gpu.timing import MODES
from multibackend.tuning.worker import (
    Figure,
    Item,
    Job,
    Spec,
    final_modes,
    finalists,
)

#: the worker process's program: :func:`multibackend.tuning.worker.main` under its module's
#: own name (``-m`` would run a second copy as ``__main__``, whose records the parent could
#: not unpickle)
WORKER = "import sys; from multibackend.tuning.worker import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class Plan:
    """What a tune runs: each problem's :class:`~multibackend.tuning.worker.Spec` by index,
    every candidate (:class:`~multibackend.tuning.worker.Item`, ``id`` unique in the plan), the
    backends that refused a problem and why, the backends unavailable here, and the compute
    capability the candidates were chosen for (None: no GPU)."""

    specs: dict[int, Spec] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)
    refused: dict[int, dict[str, str]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    cc: tuple[int, int] | None = None

    def problem(self, index: int) -> "Plan":
        """The part of this plan that is problem ``index``: its spec and its candidates."""
        return Plan({index: self.specs[index]},
                    [item for item in self.items if item.problem == index],
                    {index: self.refused[index]} if index in self.refused else {},
                    self.unavailable, self.cc)


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


@dataclass
class Results:
    """What the workers reported: each candidate's first figure (milliseconds, None) or
    (None, why it was dropped), and each finalist's :class:`Figure` per mode, or why it could
    not be timed in that mode; by candidate id."""

    first: dict[int, tuple[float | None, str | None]] = field(default_factory=dict)
    final: dict[int, dict[str, Figure]] = field(default_factory=dict)
    unfit: dict[int, dict[str, str]] = field(default_factory=dict)

    def update(self, other: "Results") -> None:
        """Add ``other``'s reports (of other candidates: a problem is measured in one place)."""
        self.first.update(other.first)
        self.final.update(other.final)
        self.unfit.update(other.unfit)

    def drop(self, items: Iterable[Item], reason: str) -> None:
        """Record ``items`` as dropped for ``reason``."""
        for item in items:
            self.first[item.id] = (None, reason)


class Child:
    """One tuner process (:func:`multibackend.tuning.worker.main`) that runs jobs one after
    another: started by :meth:`start`, fed by :meth:`send`, its reports read from
    ``reports``; after it dies, :meth:`ended` collects it and the next :meth:`start` makes a
    fresh one. ``environment`` is the fingerprint the last one reported when it started."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.reports: Connection | None = None
        self.environment: dict | None = None
        self._jobs: Connection | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self._tmp.name, "worker.log")

    def start(self, timeout_s: float) -> str | None:
        """Start a process and wait up to ``timeout_s`` for it to report ready; None when it
        did, else why it failed (the process is gone)."""
        jobs_read, jobs_write = os.pipe()
        reports_read, reports_write = os.pipe()
        self._tmp = tempfile.TemporaryDirectory(prefix="multibackend-tune-")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", WORKER, str(jobs_read), str(reports_write)],
                pass_fds=(jobs_read, reports_write), stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True)
        os.close(jobs_read)
        os.close(reports_write)
        self._jobs = Connection(jobs_write, readable=False)
        self.reports = Connection(reports_read, writable=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.reports.poll(0.2):
                try:
                    message = self.reports.recv()
                except EOFError:
                    break
                if message[0] == "ready":
                    self.environment = message[1]
                    return None
            elif self.proc.poll() is not None:
                break
        else:
            self.kill()
            self.ended()
            return f"timed out after {timeout_s:g} s while starting the tuning worker"
        code, tail = self.ended()
        return f"crashed: the tuning worker ended with {describe_exit(code)} while " \
               f"starting{tail}"

    def send(self, job: Job) -> None:
        """Hand the ready process a job (a process that died meanwhile shows at the next
        read of ``reports``)."""
        try:
            self._jobs.send(job)
        except OSError:
            pass

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        """Kill the process and its children (a hung candidate)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def ended(self) -> tuple[int | None, str]:
        """Collect the process that has ended: its exit code and the last line it wrote."""
        code = self.proc.wait()
        line = last_line(self.log_path)
        self.reports.close()
        self._jobs.close()
        self._tmp.cleanup()
        self.proc = self.reports = self._jobs = self._tmp = None
        return code, line

    def close(self, timeout_s: float = 10.0) -> None:
        """Let a running process finish (no more jobs), killing it after ``timeout_s``."""
        if self.proc is None:
            return
        self._jobs.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self.ended()


class Runner:
    """Runs a plan's candidates in a :class:`Child`, starting it again after each crash,
    ticking ``bar`` (a :func:`progress_bar`, or None) as candidates finish."""

    def __init__(self, plan: Plan, job: Job, timeout_s: float, compile_timeout_s: float,
                 child: Child, bar: Any = None):
        self.plan, self.job, self.child, self.bar = plan, job, child, bar
        self.timeout_s, self.compile_timeout_s = timeout_s, compile_timeout_s
        self.items = {item.id: item for item in plan.items}
        self.results = Results()

    def run(self) -> Results:
        """Every candidate on its own, and each problem's finalists against each other once
        its candidates have all run, in as many worker processes as crashes make needed."""
        while True:
            pending = [item for item in self.plan.items if item.id not in self.results.first]
            finals = self._finals_left(pending)
            if not pending and not finals:
                return self.results
            self._round(pending, finals)

    def _finals_left(self, pending: list[Item]) -> dict[int, list[Item]]:
        """The finalists of each problem whose candidates have all run but whose final rounds
        have not (a crash came between them)."""
        waiting = {item.problem for item in pending}
        first_ms: dict[int, dict[int, tuple[str, float]]] = {}
        for item in self.plan.items:
            ms, reason = self.results.first.get(item.id, (None, "pending"))
            if reason is None and item.problem not in waiting:
                first_ms.setdefault(item.problem, {})[item.id] = (item.backend, ms)
        left = {index: [self.items[i] for i in finalists(found)]
                for index, found in first_ms.items()}
        return {index: items for index, items in left.items() if not self._final_done(items)}

    def _final_done(self, items: list[Item]) -> bool:
        """Whether every finalist has a figure, or the reason it has none, in every mode."""
        return all(mode in self.results.final.get(item.id, {})
                   or mode in self.results.unfit.get(item.id, {})
                   for item in items for mode in MODES)

    def _affected(self, marker: tuple, pending: list[Item]) -> list[Item]:
        left = [item for item in pending if item.id not in self.results.first]
        if marker[0] == "item":
            return [item for item in left if item.id == marker[1]]
        if marker[0] == "setup":
            return [item for item in left if item.problem == marker[1]]
        if marker[0] == "compile":
            return [item for item in left if (item.problem, item.backend) == marker[1:]]
        return left

    def _fail(self, marker: tuple, pending: list[Item], finals: dict[int, list[Item]],
              reason: str) -> None:
        """Record what the step ``marker`` left undone (``("all",)``: everything left): its
        candidates are dropped; in the final rounds, its finalists are left untimed in that
        mode and the modes after it."""
        if marker[0] == "final":
            self._untimed(marker[3], marker[2], reason)
            return
        self._drop(self._affected(marker, pending), reason)
        if marker[0] == "all":
            first_mode = final_modes(self.job.timer.mode)[0]
            for items in finals.values():
                self._untimed([item.id for item in items], first_mode, reason)

    def _untimed(self, ids: Iterable[int], mode: str, reason: str) -> None:
        """The finalists ``ids`` got no figure in ``mode`` and the modes after it, for
        ``reason`` (where they got neither a figure nor a reason already)."""
        modes = final_modes(self.job.timer.mode)
        for later in modes[modes.index(mode):]:
            for i in ids:
                if later not in self.results.final.get(i, {}):
                    self.results.unfit.setdefault(i, {}).setdefault(later, reason)

    def _drop(self, items: list[Item], reason: str) -> None:
        self.results.drop(items, reason)
        self._tick(items[-1] if items else None)

    def _tick(self, item: Item | None) -> None:
        if self.bar is None:
            return
        if item is not None:
            spec = self.plan.specs[item.problem]
            self.bar.set_postfix_str(f"{spec.dtype} {spec.shape.label} {item.backend}",
                                     refresh=False)
        self.bar.update(len(self.results.first) - self.bar.n)

    def _round(self, pending: list[Item], finals: dict[int, list[Item]]) -> None:
        """Run a job of the ``pending`` candidates (each problem's followed by its final
        rounds), then the ``finals``' final rounds, on the child (started when it is not
        running), and record what a crash or a hang left undone."""
        self.job.items, self.job.finals = pending, finals
        self.job.screened = [(self.items[i], ms) for i, (ms, reason)
                             in self.results.first.items() if reason is None]
        if self.child.proc is None:
            failed = self.child.start(self.compile_timeout_s)
            if failed is not None:
                self._fail(("all",), pending, finals, failed)
                return
        self.child.send(self.job)
        marker, timed_out, progressed, ended = self._listen()
        if not ended:
            return
        code, tail = self.child.ended()
        if timed_out:
            limit = self.timeout_s if marker[0] == "item" else self.compile_timeout_s
            reason = f"timed out after {limit:g} s{phase(marker)}"
        elif marker is not None:
            reason = f"crashed: {describe_exit(code)}{phase(marker)}{tail}"
        elif not progressed:
            marker = ("all",)
            reason = f"crashed: the tuning worker ended with {describe_exit(code)}{tail}"
        else:
            return
        self._fail(marker, pending, finals, reason)

    def _listen(self) -> tuple[tuple | None, bool, bool, bool]:
        """Read the child's reports until it finishes the job, ends or overruns the running
        step; returns the step running at the end (None when between steps), whether it
        timed out, whether any candidate or final round finished, and whether the child
        ended (it was killed when it timed out)."""
        conn = self.child.reports
        marker, since, progressed = None, time.monotonic(), False
        while True:
            limit = self.timeout_s if marker and marker[0] == "item" else self.compile_timeout_s
            if conn.poll(0.2):
                try:
                    message = conn.recv()
                except EOFError:
                    return marker, False, progressed, True
                since = time.monotonic()
                if message[0] == "idle":
                    return None, False, progressed, False
                if message[0] == "begin":
                    marker = message[1]
                elif message[0] == "done":
                    marker, progressed = None, True
                    self._record_first(*message[1:])
                elif message[0] == "final":
                    marker, progressed = None, True
                    self._record_final(*message[1:])
                else:
                    _, item_id, mode, reason = message
                    self.results.unfit.setdefault(item_id, {})[mode] = reason
            elif self.child.exited() and not conn.poll(0):
                return marker, False, progressed, True
            elif time.monotonic() - since > limit:
                self.child.kill()
                return marker or ("all",), True, progressed, True

    def _record_first(self, item_id: int, ms: float | None, reason: str | None) -> None:
        self.results.first[item_id] = (ms, reason)
        self._tick(self.items[item_id])

    def _record_final(self, mode: str, figures: dict[int, Figure]) -> None:
        for item_id, found in figures.items():
            self.results.final.setdefault(item_id, {})[mode] = found


def phase(marker: tuple) -> str:
    if marker[0] == "final":
        return f" in the {marker[2]}-mode final rounds"
    return {"setup": " while making operands", "compile": " while compiling",
            "all": " (the worker stalled between candidates)"}.get(marker[0], "")


def last_line(log_path: str) -> str:
    try:
        with open(log_path, "rb") as f:
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1].strip()[:200]}" if lines else ""
