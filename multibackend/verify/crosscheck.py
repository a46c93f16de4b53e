"""Cross-checking every backend against the float64 reference and against torch.matmul's cuBLAS.

For one set of operands, each backend that accepts the problem runs (on poisoned output, so an
unwritten element fails), its result is compared with the float64 reference
(:mod:`multibackend.verify.reference`), and on a GPU it is timed with the shared timing utility and
set beside the baseline's (``cublas``: torch.matmul's cuBLAS path) from the same run, in the
host-hidden ``kernel`` timing mode (:mod:`multibackend.gpu.timing`). Backends that refuse the
problem appear with their reason. The report prints as a table and serializes to JSON.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from multibackend.choose.dispatch import Decision, decide, verdict
from multibackend.choose.registry import REGISTRY, parallel_prepare
from multibackend.core.problem import Problem
from multibackend.io.arrays import on_stream
from multibackend.io.request import Call, call_for
from multibackend.run.execute import execute
from multibackend.verify import reference
from multibackend.verify.checks import poison, reference_for
from multibackend.verify.measure import timed


@dataclass
class BackendResult:
    """One backend's line in a cross-check."""

    backend: str
    supported: bool
    reason: str | None = None
    config: str | None = None
    rel_err: float | None = None
    max_abs_err: float | None = None
    bound: float | None = None
    ok: bool | None = None
    detail: str = ""
    median_ms: float | None = None
    rate: float | None = None  # TFLOP/s (matmul) or GB/s (dot)
    vs_cublas: float | None = None  # cuBLAS time / this time: > 1 is faster than cuBLAS


@dataclass
class Report:
    """A cross-check of one problem across backends."""

    problem: str
    key: str
    unit: str
    results: list[BackendResult] = field(default_factory=list)

    @property
    def ran(self) -> int:
        """How many backends ran the problem and were compared with the reference."""
        return sum(1 for r in self.results if r.supported and r.ok is not None)

    @property
    def ok(self) -> bool:
        """Some backend ran and every one that ran matched the reference: a report where
        every backend refused the problem checked nothing, so it does not pass."""
        return self.ran > 0 and all(r.ok for r in self.results
                                    if r.supported and r.ok is not None)

    def to_dict(self) -> dict:
        return {"problem": self.problem, "key": self.key, "unit": self.unit, "ok": self.ok,
                "ran": self.ran, "results": [asdict(r) for r in self.results]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        head = (f"{'backend':<9} {'config':<22} {'rel err':>9} {'bound':>9} {'ok':>4} "
                f"{'ms':>9} {self.unit:>9} {'x torch':>8}")
        lines = [self.problem, "times: kernel mode (host hidden); x torch: torch.matmul's time "
                               "over this time, same run", head]
        for r in self.results:
            if not r.supported:
                lines.append(f"{r.backend:<9} refused: {r.reason}")
                continue
            lines.append(
                f"{r.backend:<9} {(r.config or '')[:22]:<22} {_num(r.rel_err, '.2e'):>9} "
                f"{_num(r.bound, '.1e'):>9} {('yes' if r.ok else 'NO'):>4} "
                f"{_num(r.median_ms, '.4f'):>9} {_num(r.rate, '.1f'):>9} "
                f"{_num(r.vs_cublas, '.2f'):>8}" + (f"  {r.detail}" if not r.ok else ""))
        if not self.ran:
            lines.append("no backend ran: every one refused the problem, so nothing was checked")
        return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def check_backend(call: Call, name: str, config=None, ref=None) -> BackendResult:
    """Run one backend on the call into its poisoned D and compare with the reference."""
    p, ops = call.problem, call.operands
    v = verdict(p, name)
    if not v.accepted:
        return BackendResult(name, False, reason=f"{v.reason.message} (rule: {v.reason.rule})")
    decision: Decision = decide(p, name, config)
    result = BackendResult(name, True, config=str(decision.config))
    try:
        with on_stream(ops.stream, call.device):
            poison(ops.d)
        execute(call, decision)
        ref = reference_for(call) if ref is None else ref
        cmp = reference.compare(p, ops.d, ref)
        result.rel_err, result.max_abs_err, result.bound = cmp.rel_err, cmp.max_abs_err, cmp.bound
        result.ok, result.detail = cmp.ok, cmp.detail
    except Exception as exc:
        result.ok = False
        result.detail = f"{type(exc).__name__}: {exc}"
    return result


def _time(call: Call, results: list[BackendResult]) -> None:
    """Time the backends that ran correctly against each other, cuBLAS among them, in the
    host-hidden ``kernel`` mode (:mod:`multibackend.verify.measure`), and fill in their
    figures; a timing that raises leaves the figures out and says why."""
    p = call.problem
    runs = {}
    for r in results:
        if r.ok:
            decision = decide(p, r.backend)
            runs[r.backend] = (lambda decision=decision: execute(call, decision))
    if not runs:
        return
    try:
        with on_stream(call.operands.stream, call.device):
            found = timed(runs, "kernel")
    except Exception as exc:
        for r in results:
            if r.backend in runs:
                r.detail = f"{r.detail}; not timed: {type(exc).__name__}: {exc}".lstrip("; ")
        return
    for r in results:
        if r.backend in found:
            timing = found[r.backend][0]
            r.median_ms = timing.median_ms
            r.rate = timing.gbps(p.bytes_moved) if p.op == "dot" else timing.tflops(p.flops)


def prebuild(problems: list[Problem]) -> None:
    """Compile at once each problem's default kernel on every backend that compiles in
    parallel processes (``prepare_many``), before a cross-check of many problems runs them
    one by one: it then waits for one round of parallel builds, not one build after another.
    A build that fails here is left for the cross-check to report."""
    for name in REGISTRY.names:
        backend = REGISTRY.get(name)
        many = None if REGISTRY.availability(name) else parallel_prepare(backend)
        jobs = [(p, backend.default_config(p)) for p in problems
                if many is not None and backend.supports(p) is None]
        if jobs:
            try:
                many(jobs)
            except Exception:  # noqa: BLE001 - each failure is reported by the cross-check
                pass


def crosscheck_call(call: Call, backends: tuple[str, ...] | str | None = None, *,
                    time_it: bool = True) -> Report:
    """Cross-check a validated call on ``backends`` (names, or one name; default: all)
    plus cuBLAS."""
    names = (backends,) if isinstance(backends, str) else tuple(backends or REGISTRY.names)
    for name in names:
        REGISTRY.check_name(name, call.problem.op)
    if "cublas" not in names:
        names = tuple(names) + ("cublas",)
    ref = reference_for(call)
    p = call.problem
    report = Report(p.describe(), p.key, "GB/s" if p.op == "dot" else "TFLOP/s")
    for name in names:
        report.results.append(check_backend(call, name, ref=ref))
    if time_it and call.operands.d.is_cuda:
        _time(call, report.results)
    base = next((r for r in report.results if r.backend == "cublas" and r.median_ms), None)
    if base is not None:
        for r in report.results:
            if r.median_ms:
                r.vs_cublas = base.median_ms / r.median_ms
    return report


def crosscheck(A: Any, B: Any, C: Any = None, *, backends: tuple[str, ...] | str | None = None,
               time_it: bool = True, **kwargs: Any) -> Report:
    """Cross-check ``matmul(A, B, C, **kwargs)`` (or ``dot`` for 1-D A and B) on every
    backend that supports it, against float64 and cuBLAS; returns a :class:`Report`."""
    return crosscheck_call(call_for(A, B, C, **kwargs), backends, time_it=time_it)
