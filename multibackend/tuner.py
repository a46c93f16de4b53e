"""Tuning: measure every backend and candidate config per shape, and keep the fastest.

:func:`tune` plans, on the CPU, every (problem, backend, config) candidate that the
registry's available backends accept (cuBLAS included: it is the baseline, and ``auto`` may
pick it where it is fastest), then runs the candidates in a child process
(:mod:`multibackend.tuner_worker`): each is compiled (in parallel where the backend offers
``prepare_many``), run on poisoned output, compared with the float64 reference and timed with
:func:`multibackend.timing.time_interleaved`; the candidates within 10% of the fastest, and
each backend's fastest, are then timed again against each other, their runs interleaved. A candidate that is wrong, raises, hangs past the
timeout or kills the process is dropped with its reason, and a fresh child carries on with
the rest: no candidate can end the run, and a dropped one can never win.

The result is a tuning table (:func:`multibackend.tuning.new_table`) with one entry per
problem key: the winner (the fastest candidate, or cuBLAS when nothing leads it by more than
:data:`BASELINE_MARGIN`), its config, every timing, the dropped candidates with their reasons
and cuBLAS's time as the baseline.
"""
from __future__ import annotations

import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from typing import IO, Any, Iterable

from . import dtypes as dt
from . import environment, tuning
from .errors import InvalidArgument
from .problem import synthetic
from .suites import SUITES, Shape, parse_shape, suite
from .tuner_worker import GpuTimer, Item, Job, Spec, Timer

BASELINE = "cublas"
#: the lead over the baseline a candidate needs to win: the same kernel's time moves by a few
#: percent between runs and with the GPU's temperature and power state, so a smaller lead
#: measured here can be a loss in the deployment, and the baseline keeps the shape
BASELINE_MARGIN = 0.02
#: the fewest candidates per backend and the timing repetitions of ``quick=True``
QUICK_CONFIGS = 3
QUICK_TIMER = GpuTimer(warmup=2, reps=10, max_seconds=1.0)


@dataclass
class _Plan:
    specs: dict[int, Spec] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)
    refused: dict[int, dict[str, str]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


class Progress:
    """A one-line progress bar with an ETA, redrawn in place on a terminal (a line every few
    seconds elsewhere)."""

    def __init__(self, total: int, stream: IO[str] | None, width: int = 28):
        self.total, self.stream, self.width = max(total, 1), stream, width
        self.done, self.start, self.last = 0, time.monotonic(), 0.0
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())

    def update(self, done: int, label: str) -> None:
        self.done = done
        now = time.monotonic()
        if self.stream is None or (not self.tty and now - self.last < 5 and done < self.total):
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / done * (self.total - done) if done else float("nan")
        filled = int(self.width * done / self.total)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} candidates "
                f"{elapsed:5.0f}s elapsed, ETA {_seconds(eta)}  {label[:40]}")
        self.stream.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _seconds(value: float) -> str:
    return "?" if math.isnan(value) else f"{value:.0f}s"


def _shapes(shapes: Iterable[Any]) -> list[Shape]:
    out: list[Shape] = []
    for s in shapes:
        if isinstance(s, str):
            out.extend(suite(s) if s in SUITES else [parse_shape(s)])
        else:
            dims = tuple(int(x) for x in s)
            if len(dims) not in (3, 4) or min(dims) < 1:
                raise InvalidArgument(f"tune: shape {s!r}: expected (M, N, K) or "
                                      "(batch, M, N, K) of positive integers")
            out.append(Shape(*((1,) * (4 - len(dims)) + dims)))
    return list(dict.fromkeys(out))


def _plan(shapes: list[Shape], dtypes: list[str], names: tuple[str, ...], registry,
          device: str, max_configs: int | None) -> _Plan:
    plan = _Plan()
    cc = environment.compute_capability() if device.startswith("cuda") else None
    where = "cuda:0" if device == "cuda" else device
    for name in names:
        reason = registry.availability(name)
        if reason is not None:
            plan.unavailable[name] = f"{reason.message} (rule: {reason.rule})"
    usable = [n for n in names if n not in plan.unavailable]
    for dtype in dtypes:
        for shape in shapes:
            index = len(plan.specs)
            plan.specs[index] = Spec(shape, dtype)
            problem = synthetic(shape.m, shape.n, shape.k, dtype, batch=shape.batch, cc=cc,
                                device=where)
            for name in usable:
                backend = registry.get(name)
                reason = backend.supports(problem)
                if reason is not None:
                    plan.refused.setdefault(index, {})[name] = reason.message
                    continue
                for config in backend.configs(problem)[:max_configs]:
                    plan.items.append(Item(len(plan.items), index, name, config.as_dict()))
    return plan


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


class _Runner:
    """Runs the plan's candidates in child processes, restarting after each crash."""

    def __init__(self, plan: _Plan, job: Job, timeout_s: float, compile_timeout_s: float,
                 progress: Progress):
        self.plan, self.job, self.progress = plan, job, progress
        self.timeout_s, self.compile_timeout_s = timeout_s, compile_timeout_s
        self.results: dict[int, tuple[float | None, str | None]] = {}

    def run(self) -> dict[int, tuple[float | None, str | None]]:
        pending = list(self.plan.items)
        while pending:
            self._round(pending)
            pending = [item for item in pending if item.id not in self.results]
        return self.results

    def _affected(self, marker: tuple, pending: list[Item]) -> list[Item]:
        left = [item for item in pending if item.id not in self.results]
        if marker[0] == "item":
            return [item for item in left if item.id == marker[1]]
        if marker[0] == "setup":
            return [item for item in left if item.problem == marker[1]]
        if marker[0] == "compile":
            return [item for item in left if (item.problem, item.backend) == marker[1:]]
        if marker[0] == "refine":  # every candidate has its first timing already
            return []
        return left

    def _drop(self, items: list[Item], reason: str) -> None:
        for item in items:
            self.results[item.id] = (None, reason)
        self._tick(items[-1] if items else None)

    def _tick(self, item: Item | None) -> None:
        label = ""
        if item is not None:
            spec = self.plan.specs[item.problem]
            label = f"{spec.dtype} {spec.shape.label} {item.backend}"
        self.progress.update(len(self.results), label)

    def _round(self, pending: list[Item]) -> None:
        self.job.items = pending
        read, write = os.pipe()
        with tempfile.TemporaryDirectory(prefix="multibackend-tune-") as tmp:
            job_path = os.path.join(tmp, "job.pickle")
            log_path = os.path.join(tmp, "worker.log")
            with open(job_path, "wb") as f:
                pickle.dump(self.job, f)
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "multibackend.tuner_worker", job_path, str(write)],
                    pass_fds=(write,), stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True)
            os.close(write)
            conn = Connection(read, writable=False)
            try:
                marker, timed_out, progressed = self._listen(proc, conn)
            finally:
                conn.close()
            code = proc.wait()
            tail = _tail(log_path)
        if timed_out:
            limit = self.timeout_s if marker[0] == "item" else self.compile_timeout_s
            self._drop(self._affected(marker, pending), f"timed out after {limit:g} s"
                                                        f"{_phase(marker)}")
        elif marker is not None:
            self._drop(self._affected(marker, pending),
                       f"crashed: {_describe_exit(code)}{_phase(marker)}{tail}")
        elif not progressed:
            self._drop(self._affected(("all",), pending),
                       f"crashed: the tuning worker ended with {_describe_exit(code)}{tail}")

    def _listen(self, proc: subprocess.Popen, conn: Connection) -> tuple[tuple | None, bool,
                                                                         bool]:
        """Read the worker's reports until it ends or the running step overruns; returns the
        step running at the end (None when between steps), whether it timed out, and whether
        any candidate finished."""
        marker, since, progressed = None, time.monotonic(), False
        while True:
            limit = self.timeout_s if marker and marker[0] == "item" else self.compile_timeout_s
            if conn.poll(0.2):
                try:
                    message = conn.recv()
                except EOFError:
                    return marker, False, progressed
                if message[0] == "begin":
                    marker, since = message[1], time.monotonic()
                elif message[0] == "retimed":
                    _, item_id, ms = message
                    self.results[item_id] = (ms, None)
                    marker, since = None, time.monotonic()
                else:
                    _, item_id, ms, reason = message
                    self.results[item_id] = (ms, reason)
                    marker, since, progressed = None, time.monotonic(), True
                    self._tick(self.plan.items[item_id])
            elif proc.poll() is not None and not conn.poll(0):
                return marker, False, progressed
            elif time.monotonic() - since > limit:
                os.killpg(proc.pid, signal.SIGKILL)
                return marker or ("all",), True, progressed


def _phase(marker: tuple) -> str:
    return {"setup": " while making operands", "compile": " while compiling",
            "all": " (the worker stalled between candidates)"}.get(marker[0], "")


def _tail(log_path: str) -> str:
    try:
        with open(log_path, "rb") as f:
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1].strip()[:200]}" if lines else ""


def _entries(plan: _Plan, results: dict[int, tuple[float | None, str | None]]) -> dict:
    measured = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cc = environment.compute_capability()
    entries: dict[str, dict] = {}
    for index, spec in plan.specs.items():
        shape = spec.shape
        problem = synthetic(shape.m, shape.n, shape.k, spec.dtype, batch=shape.batch, cc=cc)
        timings, dropped, configs = {}, {}, {}
        for item in plan.items:
            if item.problem != index:
                continue
            key = f"{item.backend}:{item.config['name']}"
            ms, reason = results.get(item.id, (None, "not evaluated"))
            if reason is None:
                timings[key], configs[key] = ms, (item.backend, item.config)
            else:
                dropped[key] = reason
        if not timings:
            continue
        best = _winner(timings)
        baseline = [ms for key, ms in timings.items() if key.startswith(BASELINE + ":")]
        entries[problem.key] = {
            "backend": configs[best][0], "config": configs[best][1],
            "family": tuning.family(problem), "m": shape.m, "n": shape.n, "k": shape.k,
            "batch": shape.batch, "dtype": spec.dtype, "timings_ms": timings,
            "dropped": dropped, "refused": plan.refused.get(index, {}),
            "baseline_ms": min(baseline) if baseline else None, "measured": measured,
        }
    return entries


def _winner(timings: dict[str, float]) -> str:
    """The fastest candidate ("backend:config"), unless the baseline's fastest config is
    within BASELINE_MARGIN of it: then that."""
    fastest = min(timings, key=timings.get)
    baseline = [key for key in timings if key.startswith(BASELINE + ":")]
    if baseline:
        base = min(baseline, key=timings.get)
        if timings[base] <= timings[fastest] * (1 + BASELINE_MARGIN):
            return base
    return fastest


def summary(table: dict) -> str:
    """A readable account of a tuning table: each problem's winner against cuBLAS, then every
    dropped candidate with its reason."""
    env = table.get("environment", {})
    entries = table.get("entries", {})
    timed = sum(len(e["timings_ms"]) for e in entries.values())
    dropped = [(key, cand, why) for key, e in entries.items()
               for cand, why in e.get("dropped", {}).items()]
    lines = [f"tuned {len(entries)} problems on {env.get('gpu') or 'no GPU'} "
             f"(cc {env.get('cc')}): {timed} candidates timed, {len(dropped)} dropped",
             f"{'problem':<22} {'dtype':<9} {'winner':<36} {'ms':>9} {'x cuBLAS':>8}"]
    ratios = []
    for e in entries.values():
        best = e["timings_ms"][f"{e['backend']}:{e['config']['name']}"]
        ratio = e["baseline_ms"] / best if e.get("baseline_ms") else None
        if ratio:
            ratios.append(ratio)
        size = f"{e['batch']}x[{e['m']}x{e['n']}x{e['k']}]" if e["batch"] > 1 else \
            f"{e['m']}x{e['n']}x{e['k']}"
        winner = f"{e['backend']}:{e['config']['name']}"
        lines.append(f"{size:<22} {e['dtype']:<9} {winner[:36]:<36} {best:>9.4f} "
                     f"{(f'{ratio:.2f}' if ratio else '-'):>8}")
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"geometric mean of the winners over cuBLAS: {geo:.3f}x")
    if dropped:
        lines.append("dropped candidates:")
        lines += [f"  {key} {cand}: {why}" for key, cand, why in dropped]
    return "\n".join(lines)


def tune(shapes: Iterable[Any], dtypes: Iterable[str] = ("float16",),
         backends: Iterable[str] | None = None, *, max_configs: int | None = None,
         quick: bool = False, timeout_s: float = 120.0, compile_timeout_s: float = 900.0,
         max_workers: int | None = None, progress: IO[str] | None = sys.stderr,
         registry: Any = None, timer: Timer | None = None,
         device: str | None = None, seed: int = 0) -> dict:
    """Tune ``shapes`` (suite names, ``"MxNxK"``/``"BxMxNxK"`` strings or tuples) for each of
    ``dtypes`` over ``backends`` (default: every backend; cuBLAS is always measured) and
    return the tuning table (save it with :func:`multibackend.tuning.save_table`).

    ``max_configs`` bounds the candidates per backend (the backend's first, expected best);
    ``quick`` sets it to 3 when unset and times 10 runs instead of 50. A candidate gets
    ``timeout_s`` to run and be timed; setting up a problem or compiling a backend's
    candidates in parallel gets ``compile_timeout_s``. ``registry`` (an object with ``names``,
    ``get`` and ``availability``, picklable), ``timer`` (a picklable callable: no-argument
    calls by key to each one's milliseconds, timed against each other) and ``device`` replace multibackend's registry, the GPU timer and
    ``"cuda"``; the progress bar and the summary go to ``progress`` (None: silent).
    """
    from .registry import REGISTRY

    source = REGISTRY if registry is None else registry
    shape_list = _shapes(shapes)
    dtype_list = [dt.canonical(d, what="tune: dtype") for d in dtypes]
    if not shape_list or not dtype_list:
        raise InvalidArgument(f"tune: shapes {list(shapes)!r} and dtypes {dtype_list!r}: "
                              "need at least one of each")
    names = tuple(source.names) if backends is None else tuple(dict.fromkeys(backends))
    for name in names:
        if name not in source.names:
            raise InvalidArgument(f"tune: backend {name!r}: not a backend name "
                                  f"(known: {', '.join(source.names)})")
    if BASELINE in source.names and BASELINE not in names:
        names += (BASELINE,)
    if max_configs is not None and max_configs < 1:
        raise InvalidArgument(f"tune: max_configs is {max_configs!r}: must be at least 1")
    if quick and max_configs is None:
        max_configs = QUICK_CONFIGS
    device = device or ("cuda" if environment.gpu()["available"] else "cpu")
    plan = _plan(shape_list, dtype_list, names, source, device, max_configs)
    job = Job(plan.specs, [], device, timer or (QUICK_TIMER if quick else GpuTimer()),
              registry, max_workers, seed)
    bar = Progress(len(plan.items), progress)
    try:
        results = _Runner(plan, job, timeout_s, compile_timeout_s, bar).run()
    finally:
        bar.close()
    table = tuning.new_table(_entries(plan, results))
    if progress is not None:
        for name, why in plan.unavailable.items():
            progress.write(f"{name}: not tuned, unavailable here: {why}\n")
        progress.write(summary(table) + "\n")
    return table
