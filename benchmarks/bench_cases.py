"""The benchmark cases and how each one is measured, shared by the suites' test modules.

One pytest-benchmark group per (dtype, shape); its members are every backend of the registry
(cuBLAS, the baseline, among them) and ``auto``. A backend runs the config that the loaded
tuning table (``MULTIBACKEND_TUNING``) timed fastest for it on this exact shape, else its
default config; ``auto`` runs what dispatch decides.

The number the report uses is ``extra_info["gpu_ms"]``: GPU time by CUDA events from
:func:`multibackend.gpu.timing.time_interleaved` (warm-up, L2 flushed before each run, host launch
time hidden), the timed runs of a group's members alternating (:func:`group_timings`).
pytest-benchmark's own statistics are the wall time of one call followed by a device
synchronize (kept for reference; they include the host's launch time).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import multibackend as mb
from multibackend.choose import tables
from multibackend.choose.registry import REGISTRY
from multibackend.gpu.timing import Timing, time_interleaved
from multibackend.io.request import matmul_call
from multibackend.tuning.suites import SUITES, Shape
from multibackend.verify.crosscheck import poison

AUTO = "auto"
PEDANTIC_ROUNDS = 10
#: timed runs of each member of a group: up to REPS, fewer where the group's members take
#: more than GROUP_SECONDS together (a microsecond kernel's median needs many runs to settle)
REPS = 300
GROUP_SECONDS = 2.0


@dataclass(frozen=True)
class Case:
    suite: str
    shape: Shape
    dtype: str
    member: str

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.dtype}-{self.shape.label}-{self.member}"

    @property
    def group(self) -> str:
        return f"{self.dtype} {self.shape.label}"


def cases(suites: list[str], dtypes: list[str]) -> list[Case]:
    """Every (suite, dtype, shape, member), members of one group adjacent."""
    members = tuple(REGISTRY.names) + (AUTO,)
    return [Case(s, shape, dtype, member) for s in suites for dtype in dtypes
            for shape in SUITES[s] for member in members]


_LAST: dict = {}


def operands(shape: Shape, dtype: str):
    """Random non-zero A, B and an output D for the shape (the last set is reused)."""
    import torch

    from multibackend.core import dtypes as dt

    key = (shape, dtype)
    if key not in _LAST:
        _LAST.clear()
        torch.cuda.empty_cache()
        gen = torch.Generator(device="cuda").manual_seed(0)
        lead = (shape.batch,) if shape.batch > 1 else ()
        tdtype = dt.torch_dtype(dtype)
        a = (torch.rand(lead + (shape.m, shape.k), generator=gen, device="cuda") * 2 - 1)
        b = (torch.rand(lead + (shape.k, shape.n), generator=gen, device="cuda") * 2 - 1)
        a, b = a.to(tdtype), b.to(tdtype)
        d = torch.empty(lead + (shape.m, shape.n), dtype=tdtype, device="cuda")
        _LAST[key] = (a, b, d, torch.matmul(a.float(), b.float()))
    return _LAST[key]


def tuned_config(problem, backend: str) -> str | None:
    """The name of ``backend``'s fastest config in the loaded table for this exact shape."""
    entry = tables.status().entries.get(problem.key)
    if not entry:
        return None
    mine = {k: ms for k, ms in entry.get("screening_ms", {}).items()
            if k.split(":", 1)[0] == backend}
    return min(mine, key=mine.get).split(":", 1)[1] if mine else None


@dataclass(frozen=True)
class Member:
    """How one member runs on one shape: the call, and what it runs."""

    run: Callable[[], None]
    backend: str
    config: str
    rule: str


def member(case: Case) -> Member | str:
    """The member's call on the case's operands, or why it cannot run the shape."""
    a, b, d, _ = operands(case.shape, case.dtype)
    problem = matmul_call(a, b, out=d).problem
    if case.member == AUTO:
        decision = mb.explain(problem)
        if decision.backend is None:
            return f"auto: {decision.detail}"
        backend, config = AUTO, None
        chosen, config_name = decision.backend, str(decision.config)
        rule = f"{decision.rule}: {decision.detail}"
    else:
        reason = REGISTRY.availability(case.member) or REGISTRY.get(case.member).supports(
            problem)
        if reason is not None:
            return f"{case.member}: {reason.message} (rule: {reason.rule})"
        backend, config = case.member, tuned_config(problem, case.member)
        chosen, rule = case.member, "tuned config" if config else "default config"
        config_name = config or REGISTRY.get(case.member).default_config(problem).name

    def run() -> None:
        mb.matmul(a, b, out=d, backend=backend, config=config)

    return Member(run, chosen, config_name, rule)


_GROUP: dict = {}


def group_timings(case: Case) -> dict[str, Timing]:
    """Every runnable member of the case's group timed against the others by
    :func:`multibackend.gpu.timing.time_interleaved` (measured once, when the group's first
    member runs): their timed runs alternate one by one, so a clock or temperature drift
    during the group affects every member alike."""
    key = (case.shape, case.dtype)
    if key not in _GROUP:
        _GROUP.clear()
        runs = {}
        for name in tuple(REGISTRY.names) + (AUTO,):
            found = member(Case(case.suite, case.shape, case.dtype, name))
            if not isinstance(found, str):
                found.run()
                runs[name] = found.run
        _GROUP[key] = time_interleaved(runs, warmup=2, reps=REPS, max_seconds=GROUP_SECONDS)
    return _GROUP[key]


def check_bound(case: Case) -> float:
    """The error a correct member may show against the float32 product the check compares
    with: the problem's own bound against float64, plus the float32 product's."""
    from multibackend.core.problem import synthetic
    from multibackend.verify.reference import error_bound

    shape = case.shape
    return sum(error_bound(synthetic(shape.m, shape.n, shape.k, dtype, batch=shape.batch))
               for dtype in (case.dtype, "float32"))


def measure(benchmark, case: Case) -> None:
    """Benchmark one member on one shape, or skip with the reason it cannot run it."""
    import pytest
    import torch

    found = member(case)
    if isinstance(found, str):
        pytest.skip(found)
    a, b, d, expected = operands(case.shape, case.dtype)
    poison(d)
    found.run()
    err = float((d.float() - expected).norm() / expected.norm())
    bound = check_bound(case)
    assert err <= bound, (f"{case.member} is wrong on {case.group}: rel err {err:.2e}, above "
                          f"{bound:.2e}")
    timing = group_timings(case)[case.member]
    benchmark.group = case.group
    benchmark.extra_info.update({
        "suite": case.suite, "shape": case.shape.label, "batch": case.shape.batch,
        "m": case.shape.m, "n": case.shape.n, "k": case.shape.k, "dtype": case.dtype,
        "member": case.member, "backend": found.backend, "config": found.config,
        "rule": found.rule, "flops": case.shape.flops, "gpu_ms": timing.median_ms,
        "gpu_min_ms": timing.min_ms, "gpu_runs": timing.runs,
        "tflops": timing.tflops(case.shape.flops), "rel_err": err,
        "device": torch.cuda.get_device_name(),
    })
    benchmark.pedantic(lambda: (found.run(), torch.cuda.synchronize()),
                       setup=torch.cuda.synchronize, rounds=PEDANTIC_ROUNDS, iterations=1,
                       warmup_rounds=1)
