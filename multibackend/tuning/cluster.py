"""Tuning spread over several GPUs and machines, on Dask.

:func:`multibackend.tuning.tuner.tune` comes here when a run is spread (``gpus`` above 1, or
``scheduler``); nothing else imports this module, so where Dask is not installed
(``pip install "multibackend[cluster]"`` installs it) nothing imports Dask and the tuner runs
on one GPU. How a run is spread:

- **Workers.** With ``gpus``, :func:`local_cluster` starts a scheduler and one Dask worker per
  GPU of this machine: a process under a Nanny (which starts it again if it dies) pinned to its
  GPU by ``CUDA_VISIBLE_DEVICES``, with one thread. With ``scheduler``, the work goes to the
  workers attached to that scheduler, which should be started the same way: one per GPU,
  pinned, one thread (README, "Tuning"). The cluster, and each worker's tuner process, start
  in a thread of their own (:class:`Startup`) while the candidates are planned.
- **Unit of work: one problem** (:class:`Part`): its candidates, then its final rounds, all on
  one GPU, since timings taken on two GPUs are not comparable. Each worker runs its parts in a
  tuner process of its own (:class:`multibackend.tuning.runner.Child`, kept from part to part, and
  from run to run on a cluster that outlives the run), as the one-GPU run does: a candidate
  that crashes or hangs loses only itself, and a fresh process carries on with the rest.
- **Balance.** Problems go out most candidates first, and a worker takes the next one only
  when it is free, so the GPUs finish close together.
- **Lost workers.** A worker that dies takes its tuner process with it
  (:func:`multibackend.tuning.worker.main` ends with its parent); the scheduler gives its
  problems to other workers, which run them again from the start (up to Dask's
  ``distributed.scheduler.allowed-failures`` times, 3 by default; a part that raises is tried
  :data:`RETRIES` more times). A problem that fails every time has its candidates dropped with
  the reason: every candidate is accounted for.
- **One table.** Before any work, each worker's tuner process reports its environment (GPU,
  driver, CUDA and library versions: :func:`multibackend.core.environment.fingerprint`). The
  workers must all report the same one, on the compute capability the plan was made for here, so
  the winners measured on several machines of one GPU model merge into one table carrying that
  environment; a problem measured on a worker that joined later with another environment is dropped
  with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from multibackend.core.errors import InvalidArgument, MultibackendError
from multibackend.tuning.runner import Child, Plan, Results, Runner
from multibackend.tuning.worker import REASON_CHARS, Job

#: more tries for a part whose task raised (a part whose worker died is retried by Dask's
#: allowed failures)
RETRIES = 2
#: how long to wait for a scheduler's first worker
WORKERS_TIMEOUT_S = 120.0
#: where a local cluster listens: this machine only
LOOPBACK = "127.0.0.1"

#: this worker process's tuner process, and the lock that gives it to one part at a time
_CHILD = Child()
_LOCK = threading.Lock()


@dataclass
class Part:
    """One problem's work for one GPU: the plan of that problem alone, the job its candidates
    run in, and their time limits (as :class:`multibackend.tuning.runner.Runner` takes them)."""

    plan: Plan
    job: Job
    timeout_s: float
    compile_timeout_s: float


def local_cluster(gpus: list[str]) -> Any:
    """A Dask ``SpecCluster`` on this machine, listening on the loopback address only: a
    scheduler (no dashboard) and one worker per entry of ``gpus`` (``CUDA_VISIBLE_DEVICES``
    values), each a process under a Nanny, pinned to that GPU, with one thread and no memory
    limit (the work runs in its tuner process). A worker is given a new problem only when it
    has none left."""
    import dask
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {f"gpu{gpu}": {"cls": Nanny, "options": {
        "host": LOOPBACK, "nthreads": 1, "memory_limit": 0,
        "env": {"CUDA_VISIBLE_DEVICES": gpu}, "silence_logs": logging.ERROR}}
        for gpu in gpus}
    scheduler = {"cls": Scheduler, "options": {"host": LOOPBACK, "dashboard": False}}
    with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
        return SpecCluster(workers=workers, scheduler=scheduler, name="multibackend-tune",
                           silence_logs=logging.ERROR)


@contextlib.contextmanager
def _client(scheduler: str | None, gpus: list[str] | None) -> Iterator[Any]:
    """A client of the scheduler at ``scheduler``, else of a :func:`local_cluster` on
    ``gpus`` (closed at the end), with at least one worker attached."""
    from distributed import Client

    with contextlib.ExitStack() as stack:
        if scheduler is None:
            cluster = stack.enter_context(local_cluster(gpus))
            client = stack.enter_context(Client(cluster, set_as_default=False))
            client.wait_for_workers(len(gpus), timeout=WORKERS_TIMEOUT_S)
        else:
            client = stack.enter_context(Client(scheduler, set_as_default=False))
            try:
                client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
            except TimeoutError:
                raise InvalidArgument(f"tune: scheduler is {scheduler!r}: no Dask worker "
                                      f"joined it within {WORKERS_TIMEOUT_S:g} s") from None
        yield client


def _here() -> str:
    """This worker: its address, and its GPU where it is pinned to one."""
    from distributed import get_worker

    address = get_worker().address
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"{address} (CUDA_VISIBLE_DEVICES={gpu})" if gpu is not None else address


def probe(timeout_s: float) -> tuple[str, dict]:
    """Run on a worker: start its tuner process (given ``timeout_s``) unless it is running;
    this worker's name (:func:`_here`) and the environment its tuner process reported."""
    with _LOCK:
        if _CHILD.proc is None:
            failed = _CHILD.start(timeout_s)
            if failed is not None:
                raise MultibackendError(f"tune: Dask worker {_here()}: its tuning worker did "
                                        f"not start: {failed}")
        return _here(), _CHILD.environment


def run_part(part: Part) -> tuple[Results, str, dict | None]:
    """Run on a worker: the part's candidates and final rounds in this worker's tuner
    process; what they gave, this worker's name, and the environment they were measured in
    (None where the tuner process never started)."""
    with _LOCK:
        results = Runner(part.plan, part.job, part.timeout_s, part.compile_timeout_s,
                         _CHILD).run()
        return results, _here(), _CHILD.environment


def _differences(mine: dict, theirs: dict, me: str, them: str) -> str:
    """The fields in which two environments differ, in words ("" when none)."""
    return "; ".join(f"{key}: {mine.get(key)!r} on {me}, {theirs.get(key)!r} on {them}"
                     for key in sorted(set(mine) | set(theirs))
                     if mine.get(key) != theirs.get(key))


def common_environment(found: dict[str, dict], cc: tuple[int, int] | None) -> dict:
    """The one environment the workers reported (``found``: worker -> fingerprint), checked
    to be the same on every worker and on GPUs of compute capability ``cc`` (what the plan
    was made for); raises :class:`InvalidArgument` naming the workers and fields otherwise."""
    (first, env), *others = found.items()
    for worker, theirs in others:
        diff = _differences(env, theirs, first, worker)
        if diff:
            raise InvalidArgument(f"tune: the workers' environments differ ({diff}): one "
                                  "table holds the winners of one GPU model and software "
                                  "versions; tune on workers that all match")
    theirs = tuple(int(x) for x in env["cc"].split(".")) if env.get("cc") else None
    if theirs != cc:
        raise InvalidArgument(f"tune: the workers' GPU is {env.get('gpu')!r} (cc "
                              f"{env.get('cc')}) but this machine planned the candidates for "
                              f"cc {'.'.join(map(str, cc)) if cc else None}: run tune from a "
                              "machine with the workers' GPU model")
    return env


def _probe(client: Any, timeout_s: float) -> dict[str, dict]:
    """Start every attached worker's tuner process: worker -> the environment it reported."""
    token = uuid.uuid4().hex[:8]
    workers = sorted(client.nthreads())
    futures = [client.submit(probe, timeout_s, key=f"tune-probe-{token}-{i}", workers=[w],
                             allow_other_workers=False, pure=False)
               for i, w in enumerate(workers)]
    return dict(client.gather(futures))


class Startup:
    """The cluster's client and its workers' tuner processes, started in a thread of their
    own as soon as a spread run is asked for, so that starting the scheduler and workers (a
    process each) and the workers' tuner processes (each imports torch and the backends)
    goes on while this process plans the candidates. :meth:`result` waits for them;
    :meth:`close` closes the client (and a local cluster) whatever happened."""

    def __init__(self, scheduler: str | None, gpus: list[str] | None, timeout_s: float):
        self._stack = contextlib.ExitStack()
        self._outcome: tuple[Any, dict] | BaseException | None = None
        self._thread = threading.Thread(target=self._start, args=(scheduler, gpus, timeout_s),
                                        name="multibackend-cluster-startup", daemon=True)
        self._thread.start()

    def _start(self, scheduler: str | None, gpus: list[str] | None, timeout_s: float) -> None:
        try:
            client = self._stack.enter_context(_client(scheduler, gpus))
            self._outcome = (client, _probe(client, timeout_s))
        except BaseException as exc:  # handed to the caller by result()
            self._outcome = exc

    def result(self) -> tuple[Any, dict[str, dict]]:
        """The client and, per worker, the environment its tuner process reported."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def close(self) -> None:
        self._thread.join()
        self._stack.close()


def _order(plan: Plan) -> list[int]:
    """The problems that have candidates, most candidates first (the largest first)."""
    count: dict[int, int] = {}
    for item in plan.items:
        count[item.problem] = count.get(item.problem, 0) + 1
    return sorted(count, key=lambda index: (-count[index], -plan.specs[index].shape.flops))


def run(plan: Plan, job: Job, timeout_s: float, compile_timeout_s: float, bar: Any,
        startup: Startup) -> tuple[Results, dict]:
    """Run ``plan`` (each candidate in ``job``'s settings, with the time limits
    :func:`multibackend.tuning.tuner.tune` takes) spread over the workers ``startup`` started (a
    scheduler's, or a :func:`local_cluster`'s), one problem per task; ``bar`` (a
    :func:`multibackend.tuning.tuner.progress_bar`) advances as problems finish. Returns what the
    workers reported and the environment they measured in."""
    client, found = startup.result()
    env = common_environment(found, plan.cc)
    token = uuid.uuid4().hex[:8]
    order = _order(plan)
    futures = {}
    for rank, index in enumerate(order):
        part = plan.problem(index)
        mine = dataclasses.replace(job, specs=part.specs, items=[], finals={}, screened=[])
        future = client.submit(run_part, Part(part, mine, timeout_s, compile_timeout_s),
                               key=f"tune-problem-{token}-{index}", retries=RETRIES,
                               priority=len(order) - rank, pure=False)
        futures[future] = part
    return _collect(client, futures, env, bar), env


def _collect(client: Any, futures: dict, env: dict, bar: Any) -> Results:
    """Every part's results as it finishes; the candidates of a part that failed on every
    worker it went to, or that was measured in another environment, are dropped with why."""
    from distributed import as_completed

    results = Results()
    for future in as_completed(futures, loop=client.loop):
        part = futures[future]
        where = "the cluster"
        try:
            found, where, measured = future.result()
        except Exception as exc:
            results.drop(part.items, f"lost: the problem failed on every Dask worker it went "
                                     f"to: {type(exc).__name__}: {exc}"[:REASON_CHARS])
        else:
            diff = _differences(env, measured, "the other workers", where) if measured else ""
            if diff:
                results.drop(part.items, f"dropped: measured in another environment ({diff})")
            else:
                results.update(found)
        (spec,) = part.specs.values()
        bar.set_postfix_str(f"{spec.dtype} {spec.shape.label} on {where}", refresh=False)
        bar.update(len(part.items))
    return results
