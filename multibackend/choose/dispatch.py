"""Choosing the backend (and its configuration) for one Problem.

Resolution order — the one place it is written:

1. ``backend=`` named explicitly by the caller. It must support the problem; if it cannot,
   :class:`~multibackend.core.errors.UnsupportedProblem` is raised with its reason
   (:class:`~multibackend.core.errors.BackendUnavailable` where the backend cannot run on this
   machine at all). An explicit backend never falls back silently.
2. ``MULTIBACKEND_BACKEND`` in the environment, with the same rule as an explicit name.
3. The tuning table (``MULTIBACKEND_TUNING`` or :func:`multibackend.load_tuning`): an exact
   entry for the problem's key, else the nearest tuned bucket (see
   :mod:`multibackend.choose.tables`), when its backend supports the problem here; its config where
   the backend offers a config of that name for this problem and the entry's parameters
   pass the backend's config check (else the backend's own config of that name), else the
   backend's default.
4. First-call autotuning, when asked for (``autotune=`` or ``MULTIBACKEND_AUTOTUNE``, see
   :mod:`multibackend.first_call`): the entry this machine measured before, else a
   measurement now, on the call's operands (:func:`decide` answers with rule "autotune" and
   no backend; the caller measures and asks again).
5. The calibrated rule (:mod:`multibackend.choose.calibration`): a backend that won every
   measurement of this GPU family near the shape against torch.matmul.
6. cuBLAS, as torch calls it: the baseline, which ``auto`` never does worse than.
7. Where cuBLAS cannot run the problem (packed sub-byte operands, saturation, f16
   accumulation, tf32x3...), the first backend in :data:`FALLBACK_ORDER` that is available
   and supports it; last among them ``host``, torch's own CPU product, which takes host
   arrays on a machine without a GPU (Triton's interpreter, when on, comes first).
8. Otherwise an error listing every backend with the reason it was refused.

:func:`decide` returns a :class:`Decision` holding the choice, the rule that made it (with the
figures behind it) and every backend's verdict; ``explain()`` prints it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from multibackend.choose.registry import REGISTRY, Registry
from multibackend.core.capability import Reason
from multibackend.core.config import Config
from multibackend.core.errors import BackendUnavailable, UnsupportedProblem
from multibackend.core.names import BASELINE, ENV_BACKEND
from multibackend.core.problem import Problem

#: where cuBLAS cannot run a problem: Triton (autotuned, compiles in seconds) ahead of raw
#: WMMA, CUTLASS (tens of seconds of nvcc on first use) after; the host backend last (host
#: arrays where no GPU runs them)
FALLBACK_ORDER = ("triton", "raw_wmma", "cutlass", "host")


@dataclass(frozen=True)
class Verdict:
    """One backend's answer for one problem."""

    backend: str
    reason: Reason | None  # None: accepted
    note: str | None = None

    @property
    def accepted(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class Decision:
    """Which backend runs a problem, why, and what every backend said."""

    problem: Problem
    backend: str | None
    config: Config | None
    rule: str
    detail: str
    verdicts: tuple[Verdict, ...]

    def __str__(self) -> str:
        lines = [f"problem: {self.problem.describe()}"]
        if self.backend:
            lines.append(f"chosen:  {self.backend} [{self.config}] by {self.rule}: {self.detail}")
        else:
            lines.append(f"chosen:  none ({self.detail})")
        for v in self.verdicts:
            mark = "accepts" if v.accepted else "rejects"
            text = "" if v.accepted else f": {v.reason.message} (rule: {v.reason.rule})"
            note = f" — note: {v.note}" if v.note else ""
            lines.append(f"  {v.backend:<9} {mark}{text}{note}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "problem": self.problem.describe(),
            "key": self.problem.key,
            "backend": self.backend,
            "config": self.config.as_dict() if self.config else None,
            "rule": self.rule,
            "detail": self.detail,
            "verdicts": [
                {"backend": v.backend, "accepted": v.accepted, "note": v.note,
                 "rule": v.reason.rule if v.reason else None,
                 "reason": v.reason.message if v.reason else None}
                for v in self.verdicts
            ],
        }


def verdict(problem: Problem, name: str, registry: Registry = REGISTRY) -> Verdict:
    """Whether backend ``name`` can run ``problem`` here, with its reason or note."""
    reason = registry.availability(name)
    if reason is not None:
        return Verdict(name, reason)
    backend = registry.get(name)
    reason = backend.supports(problem)
    return Verdict(name, reason, None if reason else backend.note(problem))


def _choose_named(problem: Problem, name: str, rule: str, verdicts: tuple[Verdict, ...],
                  config: Config | None, registry: Registry) -> Decision:
    registry.check_name(name, problem.op, "backend" if rule == "explicit" else ENV_BACKEND)
    chosen = next(v for v in verdicts if v.backend == name)
    if not chosen.accepted:
        source = "backend=" if rule == "explicit" else f"{ENV_BACKEND}="
        text = (f"{problem.op}: {source}{name!r} cannot run {problem.describe()}: "
                f"{chosen.reason.message} (rule: {chosen.reason.rule})")
        if registry.availability(name) is not None:
            raise BackendUnavailable(text)
        raise UnsupportedProblem(text, [chosen.reason])
    backend = registry.get(name)
    config = config or backend.default_config(problem)
    where = "the caller named it" if rule == "explicit" else f"{ENV_BACKEND} names it"
    return Decision(problem, name, config, rule, where, verdicts)


def shape_free(problem: Problem, decision: Decision,
               autotune: str | None) -> tuple[float, ...] | None:
    """Where ``decision`` holds for every problem that differs from ``problem`` only in
    sizes, layouts and alignment: None where it does not, else (elements of A, elements of B, M, N,
    K) such that every such problem whose A or B holds fewer elements, or whose M, N or K is
    smaller, gets the same decision (infinite where no size can change it). That is cuBLAS named
    (explicitly or by the environment), or cuBLAS as the baseline with first-call autotuning off:
    the tuning-table and calibration rules can only pick another backend within a factor of 2 in
    each of M, N and K of an entry that another backend won, so below a quarter of the smallest M*K
    (for A) or K*N (for B), or half the smallest M, N or K, of those entries, for products
    of these dtypes, they cannot."""
    if decision.backend != BASELINE:
        return None
    if decision.rule in ("explicit", "environment"):
        return (math.inf,) * 5
    if decision.rule != "baseline" or autotune is not None:
        return None
    from multibackend.choose import calibration, tables

    prefix = f"{problem.op}:{problem.in_dtype}->{problem.d_dtype}:"
    won = [e for e in tables.status().entries.values() if e.get("backend") != BASELINE]
    won += [m.entry for m in calibration.entries_for(problem.cc)
            if calibration.winner(m.entry) != BASELINE]
    won = [e for e in won if str(e.get("family", "")).startswith(prefix)]
    reach = max(2.0 ** tables.BUCKET_RADIUS, calibration.RADIUS_FACTOR)
    return (min((e["m"] * e["k"] / reach ** 2 for e in won), default=math.inf),
            min((e["k"] * e["n"] / reach ** 2 for e in won), default=math.inf),
            min((e["m"] / reach for e in won), default=math.inf),
            min((e["n"] / reach for e in won), default=math.inf),
            min((e["k"] / reach for e in won), default=math.inf))


def _offered(problem: Problem, name: str, config: Config | None,
             registry: Registry) -> tuple[Config, str]:
    """``config`` where backend ``name`` offers a config of its name for ``problem`` (listed,
    or by :meth:`~multibackend.backends.base.Backend.config_named`) and its parameters pass
    the backend's check; the backend's own config of that name where they
    do not (a table or store edited by hand or written by another version may hold
    parameters no kernel runs whole, which must never launch); else the backend's default.
    Each replacement comes with a note saying so (a config chosen for a neighbouring shape,
    or for a call with other options, may not fit this one)."""
    chosen = registry.get(name)
    if config is None:
        return chosen.default_config(problem), ""
    own = next((c for c in chosen.configs(problem) if c.name == config.name), None)
    if own is None:  # a config the list leaves out but the backend runs, by its name
        own = chosen.config_named(problem, config.name)
    if own is None:
        default = chosen.default_config(problem)
        return default, (f"; {config.name} is not among {name}'s configs for this problem: "
                         f"its default {default.name} runs it")
    fault = chosen.check_config(problem, config)
    if fault is None:
        return config, ""
    return own, (f"; the entry's {config.name} fails {name}'s config check ({fault}): "
                 f"{name}'s own {config.name} runs it")


def decide(problem: Problem, backend: str | None = None, config: Config | None = None,
           registry: Registry = REGISTRY, autotune: str | None = None) -> Decision:
    """Resolve the backend for ``problem`` in the order of this module's docstring;
    ``autotune`` is first-call autotuning's timing mode (None: off)."""
    verdicts = tuple(verdict(problem, name, registry) for name in registry.names)
    if backend not in (None, "auto"):
        return _choose_named(problem, backend, "explicit", verdicts, config, registry)
    env = os.environ.get(ENV_BACKEND, "").strip()
    if env and env != "auto":
        return _choose_named(problem, env, "environment", verdicts, config, registry)
    accepted = {v.backend for v in verdicts if v.accepted}
    from multibackend.choose import calibration, store, tables

    loaded = tables.status()
    hit = tables.lookup(problem, loaded)
    if hit is not None and hit.backend in accepted:
        config, detail = _offered(problem, hit.backend, hit.config, registry)
        return Decision(problem, hit.backend, config, "tuning-table", hit.detail + detail,
                        verdicts)
    if hit is not None:
        aside = f" (tuning table's {hit.backend} cannot run it here)"
    else:  # a table set aside may be why none answered
        aside = (f" (tuning tables set aside: {'; '.join(loaded.rejected)})"
                 if loaded.rejected else "")
    if autotune is not None:
        entry = store.STORE.get(problem, autotune)
        if entry is not None and entry["backend"] in accepted:
            config, detail = _offered(problem, entry["backend"],
                                      Config.from_dict(entry["config"]), registry)
            return Decision(problem, entry["backend"], config, "autotune",
                            store.describe(entry) + detail + aside, verdicts)
        return Decision(problem, None, None, "autotune",
                        f"not measured yet: the first call times every supporting backend "
                        f"in {autotune} mode{aside}", verdicts)
    advice = calibration.advise(problem)
    if advice.backend is not None and advice.backend in accepted:
        chosen = registry.get(advice.backend)
        config = _offered(problem, advice.backend, advice.config, registry)[0]
        if chosen.built(problem, config):
            return Decision(problem, advice.backend, config, "calibrated",
                            advice.detail + aside, verdicts)
        aside += f" ({advice.backend} {config.name} is not built: multibackend tune builds it)"
    if BASELINE in accepted:
        return Decision(problem, BASELINE, registry.get(BASELINE).default_config(problem),
                        "baseline", f"cuBLAS as torch calls it: {advice.detail}{aside}",
                        verdicts)
    for name in FALLBACK_ORDER:
        if name in accepted:
            chosen = registry.get(name)
            detail = (f"cuBLAS cannot run it; first available backend that supports it in "
                      f"{FALLBACK_ORDER}{aside}")
            if name == "host":
                detail = ("no GPU runs these host arrays: torch's own CPU product answers "
                          f"them (TRITON_INTERPRET=1 runs the Triton kernels instead){aside}")
            return Decision(problem, name, config or chosen.default_config(problem),
                            "fallback", detail, verdicts)
    reasons = [v.reason for v in verdicts]
    listing = "; ".join(str(r) for r in reasons)
    raise UnsupportedProblem(f"{problem.op}: no backend can run {problem.describe()}: {listing}",
                             reasons)
