"""GPU tier: a process whose repeated calls of our kernels were served by the compiled front on
threads other than the main one exits with status 0, with work still queued or not.

Each case runs in a child process, since what is checked is how that process ends: worker
threads (1 or 8, each on a stream of its own or on the default stream) call
``matmul(A, B, backend=name, config=...)`` (the backend's first tile, not first-call
autotuning, which would compile and time a shortlist per shape) three times for each of five
ragged shapes in float16 and bfloat16, so that the second call hands the plan's launches to
the compiled front and the third is served by it. Every result is compared with torch.matmul in float32; the child then
lets the interpreter exit. A front that released what its plans hold from a C++ static
destructor, after the interpreter had finalized, ended such a process with SIGSEGV."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from multibackend.choose.registry import REGISTRY  # noqa: E402
from multibackend.run import fastcall  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(fastcall.compiler() is None, reason="no C++ compiler")]

#: the child: argv is (threads, backend, stream "own" or "default", shapes "all" or "one",
#: "synchronized" or "queued"); it prints "served N" (calls the front served) and exits 1
#: naming each wrong result or error
CHILD = r"""
import sys
import threading

import torch

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.io.request import matmul_call
from multibackend.run import plans

threads, backend, stream_kind, shapes, finish = sys.argv[1:]
SHAPES = ((64, 64, 64), (333, 777, 999), (1024, 1024, 512), (17, 4096, 4096), (2048, 512, 128))
SHAPES = SHAPES if shapes == "all" else SHAPES[2:3]
#: float16's and bfloat16's bound on |D - A @ B| relative to |A @ B| + sqrt(K), the size of
#: a sum of K products of standard normal numbers
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
failures = []


def first_tile(a, b):
    # the backend's first config other than first-call autotuning (which would time and
    # compile a shortlist per shape): a call naming it is planned and served all the same
    configs = REGISTRY.get(backend).configs(matmul_call(a, b, None).problem)
    return next(c for c in configs if c.name != "autotune")


def work(index):
    try:
        stream = torch.cuda.Stream() if stream_kind == "own" else torch.cuda.default_stream()
        gen = torch.Generator(device="cuda").manual_seed(index)
        with torch.cuda.stream(stream):
            for dtype, tolerance in TOLERANCE.items():
                for m, n, k in SHAPES:
                    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
                    b = torch.randn(k, n, device="cuda", dtype=dtype, generator=gen)
                    want = torch.matmul(a.float(), b.float())
                    config = first_tile(a, b)
                    for call in range(3):
                        d = mb.matmul(a, b, backend=backend, config=config)
                        excess = ((d.float() - want).abs()
                                  - tolerance * (want.abs() + k ** 0.5)).max().item()
                        if excess > 0:
                            failures.append(f"thread {index}: {m}x{n}x{k} {dtype} call {call}: "
                                            f"{excess:.3g} past the bound")
            if finish == "queued":  # calls left running on the GPU as the process exits
                a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16, generator=gen)
                config = first_tile(a, a)
                for _ in range(30):
                    mb.matmul(a, a, backend=backend, config=config)
    except BaseException as exc:
        failures.append(f"thread {index}: {exc!r}")


workers = [threading.Thread(target=work, args=(i,)) for i in range(int(threads))]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
module = plans._COMPILED[0]
print(f"served {module.stats()[2] if module is not None else 0}", flush=True)
if failures:
    sys.exit("\n".join(failures))
"""


#: seconds a child may take: a few kernels to compile and a few dozen calls; a child that
#: hangs (at exit, or threads waiting on each other) fails here instead of stalling the tier
CHILD_TIMEOUT_S = 150


def _exit_of(*args: str) -> subprocess.CompletedProcess:
    """The child run with ``args``, the compiled front on."""
    env = {k: v for k, v in os.environ.items() if k != fastcall.ENV}
    try:
        return subprocess.run([sys.executable, "-c", CHILD, *args], env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"the child {args} ran past {CHILD_TIMEOUT_S} s (hung?); stderr:\n"
                    f"{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")


def cutlass_jobs(item):
    """The CUTLASS kernels the CUTLASS child runs, for the GPU tier's one parallel build: the
    first tile of its shape in float16 and bfloat16."""
    if item.originalname != "test_a_process_served_cutlass_on_a_thread_exits_cleanly":
        return []
    from multibackend.core.problem import synthetic

    backend = REGISTRY.get("cutlass")
    jobs = []
    for dtype in ("float16", "bfloat16"):
        problem = synthetic(1024, 1024, 512, dtype, cc=torch.cuda.get_device_capability())
        jobs.append((problem, next(c for c in backend.configs(problem) if c.name != "autotune")))
    return jobs


def _available(backend: str) -> None:
    reason = REGISTRY.availability(backend)
    if reason is not None:
        pytest.skip(f"{backend}: {reason.message}")


def _check(proc: subprocess.CompletedProcess) -> None:
    detail = f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{detail}"
    served = [line for line in proc.stdout.splitlines() if line.startswith("served ")]
    assert served and int(served[-1].split()[1]) > 0, f"the front served no call\n{detail}"


@pytest.mark.parametrize("stream", ["own", "default"])
@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize("backend", ["triton", "raw_wmma"])
def test_a_process_served_on_threads_exits_cleanly(backend, threads, stream):
    _available(backend)
    _check(_exit_of(str(threads), backend, stream, "all", "synchronized"))


@pytest.mark.parametrize("backend", ["triton", "raw_wmma"])
def test_a_process_exits_cleanly_with_work_still_queued(backend):
    _available(backend)
    _check(_exit_of("8", backend, "own", "all", "queued"))


@pytest.mark.cutlass
def test_a_process_served_cutlass_on_a_thread_exits_cleanly():
    """One shape only: each CUTLASS kernel takes nvcc 20-26 s to build (the tier builds its
    two before the tests start: :func:`cutlass_jobs`)."""
    _available("cutlass")
    _check(_exit_of("1", "cutlass", "default", "one", "synchronized"))
