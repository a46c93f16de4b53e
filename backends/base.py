"""The interface every backend implements, and the two small records it passes around.

A backend is discovered lazily (see :mod:`multibackend.choose.registry`); nothing here imports a
GPU library. The contract:

- ``available()``: None, or the :class:`Reason` the backend cannot run here at all (import
  failed, no GPU, no nvcc...). Never raises.
- ``supports(problem)``: None, or the Reason this problem is refused. Pure: decided from the
  :class:`~multibackend.core.problem.Problem` alone, on the CPU.
- ``configs(problem)``: the candidate configurations (tile shapes, stages, warps, schedules),
  the default first.
- ``prepare(problem, config)``: compile or load from the persistent cache.
- ``run(problem, operands, config)``: launch on ``operands.stream`` and write every element of
  ``operands.d``; never synchronize the device.
- ``bind(problem, config, operands)`` (optional): the same launch with the per-call work done
  once, for the calls a remembered plan repeats.
- ``native(problem, config, operands)`` (optional): that launch described for the compiled
  front (:mod:`multibackend.gpu.native`), which then makes repeated calls without Python.
- ``prepare_many(jobs, max_workers)`` (optional, with ``parallel_builds``): many builds at once.
- ``produce(problem, config, alpha, beta, kind, matrices)`` (optional): the one call that makes
  D for a remembered call, given the caller's arrays as they are.
- ``config_named(problem, name)`` (optional): a config a caller names that ``configs`` does not
  list for the problem but the backend runs (e.g. a tile with K split some other way).

The optional hooks have defaults here; a backend that overrides one must keep its parameters,
which the registry checks when it loads the backend (:func:`contract_fault`).
"""
from __future__ import annotations

import abc
from typing import Any, Callable

from multibackend.core.capability import Capability, Reason
from multibackend.core.config import Config, Operands
from multibackend.core.problem import Problem
from multibackend.gpu.native import Native


class AutotunePicks:
    """What a backend's "autotune" config picked, per problem, in this process: the problem
    asked about last is found by identity, so a repeated call does not hash its Problem."""

    def __init__(self) -> None:
        self._by_problem: dict[Problem, Config] = {}
        self._last: tuple = (None, None)  # (problem, its pick) of the last lookup

    def get(self, problem: Problem) -> Config | None:
        """The pick for ``problem``, None before one is made."""
        if self._last[0] is problem:
            return self._last[1]
        picked = self._by_problem.get(problem)
        if picked is not None:
            self._last = (problem, picked)
        return picked

    def pick(self, problem: Problem, choose: Callable[[], Config]) -> Config:
        """The pick for ``problem``, made by ``choose()`` (which times the candidates) the
        first time and remembered."""
        picked = self.get(problem)
        if picked is None:
            picked = choose()
            self._by_problem[problem] = picked
            self._last = (problem, picked)
        return picked


class Backend(abc.ABC):
    """One way of running matmul/dot. Subclasses fill in ``name`` and ``capability``."""

    name: str = ""
    #: whether ``run`` takes 2-D operands for a matmul of batch 1 (see :class:`Operands`):
    #: a remembered call then launches on the caller's arrays without making 3-D views
    takes_matrices: bool = False

    @abc.abstractmethod
    def available(self) -> Reason | None:
        """None when the backend can run on this machine, else why not."""

    @property
    @abc.abstractmethod
    def capability(self) -> Capability:
        """The backend's support table."""

    def supports(self, problem: Problem) -> Reason | None:
        return self.capability.check(problem)

    def note(self, problem: Problem) -> str | None:
        """A fact worth showing in ``explain()`` when the backend accepts ``problem``."""
        return self.capability.note(problem)

    @abc.abstractmethod
    def configs(self, problem: Problem) -> list[Config]:
        """Candidate configurations for ``problem``, the default first."""

    def default_config(self, problem: Problem) -> Config:
        return self.configs(problem)[0]

    def check_config(self, problem: Problem, config: Config) -> str | None:
        """Why ``config``, a Config the caller handed in, cannot run ``problem`` (the
        parameter, its value and the rule), or None where it can. The default accepts it:
        a backend whose kernels take a caller's own parameters checks them here, so that a
        config no kernel can run whole is refused before anything is launched."""
        return None

    def config_named(self, problem: Problem, name: str) -> Config | None:
        """The config called ``name`` that :meth:`configs` leaves out of its list for
        ``problem`` but whose kernel runs it (a family of configs too large to list), or None:
        the default, where every config the backend runs is listed."""
        return None

    def autotuned(self, problem: Problem) -> Config | None:
        """The config an "autotune" config picked for ``problem`` in this process, None where
        none has (or the backend has no such config)."""
        return None

    def prepare(self, problem: Problem, config: Config) -> None:
        """Compile or load what ``run`` needs; a no-op by default."""

    def built(self, problem: Problem, config: Config) -> bool:
        """Whether :meth:`prepare` takes seconds at most (nothing to build, or a build found
        in the cache): first-call autotuning leaves out candidates that would take longer."""
        return True

    @abc.abstractmethod
    def run(self, problem: Problem, operands: Operands, config: Config) -> None:
        """Launch on ``operands.stream``, writing all of ``operands.d``."""

    def bind(self, problem: Problem, config: Config,
             operands: Operands) -> Callable[[Any, Any, Any, Any, int], None] | None:
        """``run`` with its per-call work done once: a function of (a, b, c, d, stream) that
        launches ``problem`` with ``config`` on arrays like ``operands``' (the same dtypes,
        ranks, shapes, strides and pointer alignment, C present or not) with the same alpha
        and beta, as a remembered plan guarantees. Called after ``run`` ran on ``operands``;
        None (the default) where there is nothing to save."""
        return None

    def native(self, problem: Problem, config: Config, operands: Operands) -> Native | None:
        """What a repeated 2-D call without C, like ``operands`` (no ``out``), launches, for
        the compiled front (:mod:`multibackend.gpu.native`): asked for right after :meth:`bind`;
        None (the default) where the backend's launches cannot be described so."""
        return None

    #: whether :meth:`prepare_many` builds in parallel (nvcc processes): callers then hand it
    #: every pair they will run at once, ahead of running them
    parallel_builds: bool = False

    def prepare_many(self, jobs: list[tuple[Problem, Config]],
                     max_workers: int | None = None) -> list[tuple[Problem, Config]]:
        """Prepare every (problem, config) of ``jobs`` (at most ``max_workers`` builds at
        once) and return the pairs that built. The default prepares them one after another;
        a backend whose builds run in parallel overrides it and sets :attr:`parallel_builds`."""
        built = []
        for problem, config in jobs:
            try:
                self.prepare(problem, config)
            except Exception:  # noqa: BLE001 - the pair is left out; running it says why
                continue
            built.append((problem, config))
        return built

    def produce(self, problem: Problem, config: Config, alpha: float | int, beta: float | int,
                kind: str = "torch", matrices: bool = True) -> Callable[..., Any] | None:
        """The one call that makes D for a remembered call of ``kind`` arrays (A and B 2-D
        where ``matrices``), given the caller's arrays as they are: a function of (a, b), or
        (a, b, c) with C; None (the default) where the backend has none."""
        return None

    def versions(self) -> dict[str, str]:
        """Versions of the libraries the backend's results depend on (for tuning tables)."""
        return {}

    def unavailable(self, rule: str, message: str) -> Reason:
        return Reason(self.name, rule, message)

    def torch_missing(self) -> Reason | None:
        """Why torch cannot be imported here (every backend's operands are torch tensors), or
        None where it can."""
        try:
            import torch  # noqa: F401
        except Exception as exc:
            return self.unavailable("import", f"torch not importable: {exc}")
        return None


#: the hooks a backend may override, each checked against the contract's parameters on load
HOOKS = ("bind", "native", "prepare_many", "produce", "config_named")


def contract_fault(backend: object) -> str | None:
    """Why ``backend`` (what a backend module's ``create()`` made) breaks the contract: not a
    :class:`Backend`, or an overridden hook whose parameters differ from the contract's; None
    where it keeps it."""
    import inspect

    if not isinstance(backend, Backend):
        return f"create() made a {type(backend).__name__}, not a multibackend Backend"
    for hook in HOOKS:
        theirs = list(inspect.signature(getattr(Backend, hook)).parameters)
        mine = list(inspect.signature(getattr(type(backend), hook)).parameters)
        if mine != theirs:
            return (f"{type(backend).__name__}.{hook} takes ({', '.join(mine)}), not the "
                    f"contract's ({', '.join(theirs)})")
    return None
