"""GPU tier: the CUTLASS kernels of the selected tests are built once per session, all at once,
while the tests of the other backends run.

nvcc needs 20-26 s and about 2 GB per CUTLASS kernel, so a cold run of the tier is bound by
those builds. Tests that run CUTLASS kernels carry the ``cutlass`` mark, and their module names
the kernels each of them runs: ``cutlass_jobs(item)`` returns (problem, config) pairs computed
from numbers alone.

- After collection, every pytest process of the session (the only one, or each pytest-xdist
  worker) turns the selected ``cutlass`` tests' pairs into kernel sources. The first process
  to take the CUTLASS cache's prebuild lock hands the lock and the sources to a child process,
  which builds them all in parallel nvcc processes (``cutlass_build.build_many``: as many as
  the cores and memory allow; a kernel already cached is not rebuilt) and holds the lock until
  it is done. The other processes find the lock taken and build nothing, so no kernel is built
  twice and the number of nvcc processes stays within what the machine holds.
- ``cutlass`` tests are moved to the end of the run, so that the GPU runs the other tests
  while the kernels build. Before its first ``cutlass`` test, a process waits for the lock to
  be released; each such test then loads its own kernels from the cache, building any that is
  missing (one whose build failed is built again there and its error fails that test).

The tier is bound by the machine's cores, so each pytest-xdist worker takes only its share:
torch's CPU ops run on ``cores / workers`` threads, and a thread waiting for the GPU (a
synchronize, a copy to the host) sleeps instead of spinning on a core (the primary context's
blocking-sync flag, set before any context exists). The workers keep the builds' CPU priority:
run below it, they left the Triton compiles of their tests starved while nvcc held every core,
and the tier took longer (4 min 17 s against 3 min 41 s on an H200).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PREBUILD_LOCK = "prebuild.lock"
PREBUILD_LOG = "prebuild.log"
#: the child process: reads [[source, arch, name], ...] on stdin and builds them
BUILDER = """
import json, resource, sys, time
from multibackend.backends.cutlass import build as cutlass_build
jobs = [tuple(job) for job in json.load(sys.stdin)]
start = time.monotonic()
workers = cutlass_build.default_workers()
results = cutlass_build.build_many(jobs, workers)
failed = [(job[2], r) for job, r in zip(jobs, results) if isinstance(r, Exception)]
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{len(jobs)} CUTLASS kernels ready in {time.monotonic() - start:.0f} s with {workers} "
      f"nvcc processes at most ({used.ru_utime + used.ru_stime:.0f} CPU-s); {len(failed)} failed",
      file=sys.stderr)
for name, error in failed:
    print(f"{name}: {str(error)[:2000]}", file=sys.stderr)
"""

#: CU_CTX_SCHED_BLOCKING_SYNC: a thread waiting for the GPU sleeps on a semaphore
BLOCKING_SYNC = 0x4

_jobs: dict[str, list[tuple[str, str, str]]] = {}  # test node id -> (source, arch, name) jobs
_errors: dict[str, BaseException] = {}  # test node id -> why its jobs could not be listed
_builder: subprocess.Popen | None = None
_waited = False


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
        _sleep_while_waiting_for_the_gpu()


def _sleep_while_waiting_for_the_gpu() -> None:
    """Set the blocking-sync flag on every device's primary context, before torch, CuPy or
    the driver calls of the library create it. Without a driver nothing is set (the GPU
    tests skip there); where the driver refuses, waits spin as by default (only slower)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
            cuda.cuDevicePrimaryCtxSetFlags_v2(device, ctypes.c_uint(BLOCKING_SYNC))


@functools.lru_cache(maxsize=None)
def _cutlass_ready() -> bool:
    """A GPU, and the CUTLASS backend able to build and run there."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        from multibackend.choose.registry import REGISTRY

        return REGISTRY.availability("cutlass") is None
    except Exception:  # noqa: BLE001 - no GPU or no CUTLASS: its tests say why themselves
        return False


def _lock_path() -> Path:
    from multibackend.gpu import cache

    return cache.cache_dir("cutlass") / PREBUILD_LOCK


@pytest.hookimpl(tryfirst=True)  # the mark is there when ``-m`` selects
def pytest_collection_modifyitems(config, items):
    """The ``cutlass`` tests last (keeping the order otherwise): they wait for the builds. A
    test parametrized over backends is one in its ``cutlass`` case."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "cutlass":
            item.add_marker(pytest.mark.cutlass)
    items.sort(key=lambda item: item.get_closest_marker("cutlass") is not None)


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    _start_prebuild(session)


def _start_prebuild(session) -> None:
    global _builder
    selected = [item for item in session.items if item.get_closest_marker("cutlass")]
    if not selected or not _cutlass_ready():
        return
    from multibackend.backends.cutlass import backend as backend_module
    from multibackend.backends.cutlass import emit as cutlass_emit
    from multibackend.gpu import staging

    sources: dict = {}  # candidate -> its source (candidates are shared between problems)
    unique: dict[tuple[str, str], str] = {}
    for item in selected:
        listing = getattr(item.module, "cutlass_jobs", None)
        if listing is None:
            continue
        try:
            jobs = []
            for problem, config in listing(item):
                candidate = backend_module.candidate_for(*staging.unwrap(problem, config))
                source = sources.get(candidate)
                if source is None:
                    source = sources[candidate] = cutlass_emit.emit(candidate)
                jobs.append((source, candidate.arch, candidate.name))
                unique[source, candidate.arch] = candidate.name
        except Exception as exc:  # noqa: BLE001 - reported by the test it concerns
            _errors[item.nodeid] = exc
            continue
        _jobs[item.nodeid] = jobs
    if unique:
        # Hopper's 3.x kernels (sm_90a) take longest to build: first, so that the builds
        # still running at the end, with cores to spare, are short 2.x ones
        ordered = sorted(((s, a, n) for (s, a), n in unique.items()),
                         key=lambda job: not job[1].endswith("a"))
        _builder = _start_builder(ordered)


def _start_builder(jobs: list[tuple[str, str, str]]) -> subprocess.Popen | None:
    """Start the child that builds ``jobs`` if no other process of the session has: the child
    inherits the lock, held until it exits. None when another process holds the lock."""
    import multibackend

    path = _lock_path()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(multibackend.__file__).resolve().parent.parent)]
            + [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p])
        with open(path.with_name(PREBUILD_LOG), "ab") as log:
            proc = subprocess.Popen([sys.executable, "-c", BUILDER], stdin=subprocess.PIPE,
                                    stdout=log, stderr=log, env=env, pass_fds=(fd,),
                                    start_new_session=True)
        try:
            proc.stdin.write(json.dumps(jobs).encode())
            proc.stdin.close()
        except OSError:
            pass  # the child died: the tests build what they need themselves
        return proc
    finally:
        os.close(fd)  # the child's copy keeps the lock until it exits


def _wait_for_prebuild() -> None:
    """Block until no process holds the prebuild lock (once per process)."""
    global _waited
    if _waited:
        return
    with open(_lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_UN)
    _waited = True


@pytest.fixture(autouse=True)
def cutlass_kernels(request):
    """For a ``cutlass`` test: wait for the session's builds, then load (or build) its own."""
    node = request.node
    if node.get_closest_marker("cutlass") is None or not _cutlass_ready():
        return
    if node.nodeid in _errors:
        raise _errors[node.nodeid]
    _wait_for_prebuild()
    jobs = _jobs.get(node.nodeid)
    if not jobs:
        return
    from multibackend.backends.cutlass import build as cutlass_build

    results = cutlass_build.build_many(jobs)
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of {len(results)} kernels failed to build: {failed[0]}"


def pytest_sessionfinish(session, exitstatus):
    """Stop a build still running, its nvcc processes too, when the session ends early: when
    this is the only process, or on an interrupt. A pytest-xdist worker runs out of tests while
    the others still run theirs, so a worker's finished session leaves its build running for
    them (it ends by itself)."""
    if _builder is None or _builder.poll() is not None:
        return
    if hasattr(session.config, "workerinput") and exitstatus != pytest.ExitCode.INTERRUPTED:
        return
    _stop_group(_builder)


def _stop_group(proc: subprocess.Popen) -> None:
    """End ``proc`` and its nvcc processes (its own process group): SIGTERM, then SIGKILL to
    whatever is left after a few seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)  # raises once no process of the group is left
            except ProcessLookupError:
                return
            time.sleep(0.1)
