"""Running a decision on a validated call: the backend prepared and launched on the caller's
stream, an empty or K = 0 product answered without a kernel under a kernel's rules, and the
result handed back in the caller's array kind (and into the caller's ``out``)."""
from __future__ import annotations

from typing import Any

from multibackend.choose.dispatch import Decision, verdict
from multibackend.choose.registry import REGISTRY
from multibackend.core.config import Config
from multibackend.core.errors import BackendUnavailable, InvalidArgument, UnsupportedProblem
from multibackend.core.problem import Problem
from multibackend.io.arrays import on_stream, to_kind
from multibackend.io.request import Call


def execute(call: Call, decision: Decision) -> None:
    """Prepare and run the decided backend on the call's operands (on the caller's stream)."""
    backend = REGISTRY.get(decision.backend)
    with on_stream(call.operands.stream, call.device):
        backend.prepare(call.problem, decision.config)
        backend.run(call.problem, call.operands, decision.config)


#: capability rules about sizes, layouts and alignment: an empty or K = 0 product, which no
#: kernel runs, is not held to them
SHAPE_RULES = frozenset({"shape", "size", "alignment", "layout", "batch"})


def check_trivial(problem: Problem, backend: str | None, config: Any) -> None:
    """A problem answered without a kernel keeps the rules of a kernel's call but those about
    sizes and layout: a named backend must be able to run here and take its dtypes and
    options, a config must be one it could take, and under ``auto`` some backend must
    compute those dtypes and options at all. Each is checked on the problem with one row,
    column, step of K and batch entry where it has none."""
    probe = problem.with_(m=max(problem.m, 1), n=max(problem.n, 1), k=max(problem.k, 1),
                          batch=max(problem.batch, 1))
    named = backend not in (None, "auto")
    if config is not None and (not named or not isinstance(config, str)):
        resolve_config(probe, backend, config)  # a config's name is not checked: none runs
    if named:
        found = verdict(probe, backend)
        if found.accepted or found.reason.rule in SHAPE_RULES:
            return
        text = (f"{problem.op}: backend={backend!r} cannot run {problem.describe()}: "
                f"{found.reason.message} (rule: {found.reason.rule})")
        if REGISTRY.availability(backend) is not None:
            raise BackendUnavailable(text)
        raise UnsupportedProblem(text, [found.reason])
    refusals = [reason for name in REGISTRY.names
                if (impl := REGISTRY.get(name)) is not None
                and (reason := impl.supports(probe)) is not None
                and reason.rule not in SHAPE_RULES]
    if len(refusals) == len(REGISTRY.names):
        listing = "; ".join(f"{r.backend}: {r.message}" for r in refusals)
        raise UnsupportedProblem(f"{problem.op}: no backend computes {problem.describe()} "
                                 f"at any size: {listing}", refusals)


def answer_trivial(call: Call) -> None:
    """D of an empty or K = 0 problem: ``beta * C`` (zeros without C), saturated where the
    call asks (NaN to 0, +-Inf to the largest finite value)."""
    ops = call.operands
    if not ops.d.numel():
        return
    with on_stream(ops.stream, call.device):
        if ops.c is not None and ops.beta != 0:  # floats scaled in float64, rounded once
            ops.d.copy_(ops.c.double() * ops.beta if ops.c.is_floating_point()
                        else ops.c * ops.beta)
            if call.problem.saturate and ops.d.is_floating_point():
                import torch

                big = torch.finfo(ops.d.dtype).max
                torch.nan_to_num_(ops.d, nan=0.0, posinf=big, neginf=-big)
        else:
            ops.d.zero_()


def finish(call: Call) -> Any:
    d = call.operands.d
    if call.problem.op == "dot":
        d = d.reshape(())
    elif call.own_out is not None:  # D went into a stand-in for the caller's own out
        if call.staged_out is not None:  # a host array: D comes back into it, in order
            with on_stream(call.operands.stream, call.device):
                call.staged_out.copy_(call.out)
        return call.own_out
    elif call.out is not None:
        d = call.out
    elif call.squeeze:
        d = d[0]
    if call.to_host:
        d = d.cpu()
    result = to_kind(d, call.kind)
    if call.user_out is not None and result is not call.user_out:
        import numpy as np

        np.copyto(call.user_out, result)
        return call.user_out
    return result


def resolve_config(problem: Problem, backend: str | None, config: Any) -> Config | None:
    """The Config asked for by ``config`` (a Config or one of the backend's config names)."""
    if config is None:
        return None
    op = problem.op
    if backend in (None, "auto"):
        raise InvalidArgument(f"{op}: config is {config!r} but backend is 'auto': a config "
                              "belongs to one backend, so name the backend too")
    impl = REGISTRY.get(backend)
    if isinstance(config, Config):
        fault = impl.check_config(problem, config) if impl is not None else None
        if fault is not None:
            raise InvalidArgument(f"{op}: config is {config.name!r}: {fault}")
        return config
    if not isinstance(config, str):
        raise InvalidArgument(f"{op}: config is {config!r}: expected a Config or a config name")
    offered = impl.configs(problem) if impl is not None else []
    for candidate in offered:
        if candidate.name == config:
            return candidate
    named = impl.config_named(problem, config) if impl is not None else None
    if named is not None:
        return named
    names = ", ".join(c.name for c in offered) or "none"
    raise InvalidArgument(f"{op}: config is {config!r}: not a config of backend {backend!r} "
                          f"for this problem (offered: {names})")
