"""Tuning: measure every backend and candidate config per shape, and keep the fastest.

:func:`tune` plans, on the CPU, every (problem, backend, config) candidate that the
registry's available backends accept (cuBLAS included: it is the baseline, called as torch's
own GEMM, and ``auto`` may pick it where it is fastest), then runs the candidates in a child
process (:mod:`multibackend.tuning.worker`, a :class:`Child` that serves job after job) on one
GPU, or spreads the problems over several GPUs and machines on Dask
(:mod:`multibackend.tuning.cluster`: one worker per GPU, each with such a child, a problem's
candidates and final rounds all on one GPU). Each is compiled (in parallel where the backend
offers ``prepare_many``), then run the way a user's call runs, through the public call
``matmul(A, B, backend=name, config=config)`` on torch tensors: once into a poisoned ``out``
and once making its own output, each compared with the float64 reference, and timed with
:func:`multibackend.gpu.timing.time_interleaved` in the run's timing mode (``mode``):

- ``"eager"`` (default): back-to-back calls, host time included, what an eager user sees;
- ``"graph"``: the calls captured in a CUDA graph and replayed, kernel time only, what a
  deployment that captures graphs sees.

The candidates within 10% of the fastest, and each backend's fastest (cuBLAS's among them),
are then timed again against each other, their runs interleaved, in
:data:`~multibackend.tuning.worker.FINAL_ROUNDS` rounds in each mode. A candidate that is
wrong, raises, hangs past the timeout or kills the process is dropped with its reason, and a
fresh child carries on with the rest: no candidate can end the run, and a dropped one can
never win. Progress (candidates done, elapsed time, ETA) is a tqdm bar.

The winner is cuBLAS (:data:`BASELINE`) unless the fastest candidate of the final rounds, in
the run's mode, beats it by more than the spread measured there. The final rounds time cuBLAS
beside the candidates, so each candidate's runs pair with cuBLAS's round by round, and what
decides is the ratio of the paired runs (:func:`multibackend.verify.measure.paired_lead`): its
median must lead by more than its own spread, at least the mode's floor
(:data:`multibackend.core.names.MIN_SPREAD`). A smaller lead is within what the same call
moves by between runs and with the GPU's temperature and power state, and can be a loss in the
deployment; the host's drift, which moves both runs of a round alike, cancels instead of
hiding a real lead as it did in each figure's own spread. Figures without paired runs fall
back to the larger of the two figures' spreads (the relative range of the per-round medians
or the median p20-p80 width, whichever is larger).

The result is a tuning table (:func:`multibackend.choose.tables.new_table`) with one entry per
problem key::

    {"backend": "triton", "config": {"name": ..., ...}, "family": ...,
     "m": .., "n": .., "k": .., "batch": .., "dtype": "float16",
     "mode": "eager",                       # the mode the choice was made in
     "timings_ms": {"eager": {"triton:cfg": 0.081, "cublas:default": 0.090, ...},
                    "graph": {"triton:cfg": 0.052, "cublas:default": 0.055, ...}},
     "baseline_ms": {"eager": 0.090, "graph": 0.055},   # cuBLAS's fastest config, or None
     "spread": 0.012,                       # the lead the winner had to exceed, in "mode"
     "screening_ms": {"triton:cfg": 0.083, "triton:other": 0.120, ...},
     "final_dropped": {"eager": {}, "graph": {"raw_wmma:cfg": "raised: ..."}},
     "dropped": {"cutlass:cfg": "wrong: ..."}, "refused": {"cutlass": "..."},
     "measured": "<ISO time>"}

``timings_ms`` holds the final rounds' figures (the median of the rounds' medians) of every
candidate compared there, per mode; ``screening_ms`` every correct candidate's first figure,
timed alone in ``mode``; ``final_dropped`` the finalists that could not be timed in a mode,
with the reason; ``dropped`` the candidates that never ran correctly, ``refused`` the
backends that refused the problem. Keys of candidates are ``"backend:config name"``.
"""
from __future__ import annotations

import importlib.util
import math
import os
import sys
from datetime import datetime, timezone
from typing import IO, Any, Iterable

from multibackend.choose import tables
from multibackend.core import dtypes as dt
from multibackend.core import environment
from multibackend.core.errors import BackendUnavailable, InvalidArgument
from multibackend.core.names import BASELINE, BASELINE_LABEL
from multibackend.core.problem import synthetic
from multibackend.tuning.runner import (
    Child,
    Plan,
    Results,
    Runner,
)
from multibackend.tuning.suites import SUITES, Shape, parse_shape, suite
from multibackend.tuning.worker import (
    LAYOUTS,
    Figure,
    GpuTimer,
    Item,
    Job,
    PublicCall,
    Spec,
    Timer,
    check_mode,
    final_modes,
)
from multibackend.verify.measure import beats, lead_needed, leads

#: the fewest candidates per backend and the timing repetitions of ``quick=True``
QUICK_CONFIGS = 3
QUICK_TIMER = GpuTimer(warmup=2, reps=10, max_seconds=1.0)
def progress_bar(total: int, stream: IO[str] | None, unit: str = "candidates"):
    """A tqdm bar of ``total`` ``unit`` on ``stream`` (None: silent) with the elapsed time and
    the ETA; redrawn in place on a terminal, every few seconds elsewhere (a log)."""
    from tqdm import tqdm

    tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
    return tqdm(total=total, file=stream, disable=stream is None, mininterval=0.2 if tty else 5,
                dynamic_ncols=tty, bar_format="{percentage:3.0f}%|{bar:28}| {n_fmt}/{total_fmt} "
                f"{unit} [{{elapsed}} elapsed, ETA {{remaining}}]{{postfix}}")


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
          device: str, max_configs: int | None, layout: str = "nn") -> Plan:
    cc = environment.compute_capability() if device.startswith("cuda") else None
    plan = Plan(cc=cc)
    where = "cuda:0" if device == "cuda" else device
    for name in names:
        reason = registry.availability(name)
        if reason is not None:
            plan.unavailable[name] = f"{reason.message} (rule: {reason.rule})"
    usable = [n for n in names if n not in plan.unavailable]
    for dtype in dtypes:
        for shape in shapes:
            index = len(plan.specs)
            spec = plan.specs[index] = Spec(shape, dtype, layout)
            a_layout, b_layout = spec.layouts
            problem = synthetic(shape.m, shape.n, shape.k, dtype, batch=shape.batch, cc=cc,
                                device=where, a_layout=a_layout, b_layout=b_layout)
            for name in usable:
                backend = registry.get(name)
                reason = backend.supports(problem)
                if reason is not None:
                    plan.refused.setdefault(index, {})[name] = reason.message
                    continue
                for config in backend.configs(problem)[:max_configs]:
                    plan.items.append(Item(len(plan.items), index, name, config.as_dict()))
    return plan


def _key(item: Item) -> str:
    """A candidate's name in the table: "backend:config name"."""
    return f"{item.backend}:{item.config['name']}"


def _first_figures(items: list[Item], results: Results
                   ) -> tuple[dict[str, float], dict[str, str], dict[str, tuple[str, dict]]]:
    """(each correct candidate's first milliseconds, each dropped one's reason, each correct
    one's (backend, config)), by key."""
    screening, dropped, configs = {}, {}, {}
    for item in items:
        ms, reason = results.first.get(item.id, (None, "not evaluated"))
        if reason is None:
            screening[_key(item)], configs[_key(item)] = ms, (item.backend, item.config)
        else:
            dropped[_key(item)] = reason
    return screening, dropped, configs


def _by_mode(items: list[Item], found: dict[int, dict[str, Any]], modes: tuple[str, ...]
             ) -> dict[str, dict[str, Any]]:
    """What ``found`` holds for the items per mode, by key."""
    return {mode: {_key(item): found[item.id][mode] for item in items
                   if mode in found.get(item.id, {})} for mode in modes}


def _baseline_key(figures: dict[str, float]) -> str | None:
    """The baseline's fastest candidate among ``figures``, or None when it has none."""
    mine = [key for key in figures if key.startswith(BASELINE + ":")]
    return min(mine, key=figures.get) if mine else None


def _spread(final: dict[str, Figure], choice_ms: dict[str, float], mode: str) -> float | None:
    """The lead over the baseline the choice among ``choice_ms`` needs: the larger of the
    baseline's and the fastest candidate's spreads in the final rounds ``final``, at least
    the mode's floor (just that floor where the choice is made from first figures, the final rounds
    having crashed); None where the baseline has no figure."""
    base = _baseline_key(choice_ms)
    if base is None:
        return None
    if not final:
        return lead_needed(mode)
    fastest = final.get(min(choice_ms, key=choice_ms.get))
    return lead_needed(mode, final[base].spread, fastest.spread if fastest else 0.0)


def _winner(figures: dict[str, float], spread: float | None) -> str:
    """The fastest candidate ("backend:config") when it beats the baseline's fastest by more
    than ``spread`` (the baseline takes more than ``1 + spread`` times as long); else the
    baseline's fastest. ``spread`` is None only where the baseline has no figure."""
    fastest = min(figures, key=figures.get)
    base = _baseline_key(figures)
    if base is not None and not beats(figures[fastest], figures[base], spread):
        return base
    return fastest


def _entry(items: list[Item], results: Results, mode: str) -> dict | None:
    """One problem's choice and figures (see the module docstring); None when no candidate
    ran correctly."""
    screening, dropped, configs = _first_figures(items, results)
    if not screening:
        return None
    modes = final_modes(mode)
    figures = _by_mode(items, results.final, modes)
    timings = {m: {key: found.ms for key, found in figures[m].items()} for m in modes}
    choice_ms = timings[mode] or screening  # the first figures where the final rounds crashed
    spread = _spread(figures[mode], choice_ms, mode)
    chosen = _winner(choice_ms, spread)
    fastest = figures[mode].get(min(choice_ms, key=choice_ms.get))
    base = _baseline_key(choice_ms)
    if fastest is not None and fastest.lead is not None and base is not None:
        # runs paired round by round with the baseline's decide (see verify.measure)
        won, spread = leads(fastest.lead, mode)
        chosen = min(choice_ms, key=choice_ms.get) if won else base
    return {"backend": configs[chosen][0], "config": configs[chosen][1], "mode": mode,
            "timings_ms": timings,
            "baseline_ms": {m: timings[m].get(_baseline_key(timings[m])) for m in modes},
            "spread": spread, "screening_ms": screening,
            "final_dropped": _by_mode(items, results.unfit, modes), "dropped": dropped}


def _entries(plan: Plan, results: Results, mode: str) -> dict:
    measured = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entries: dict[str, dict] = {}
    for index, spec in plan.specs.items():
        entry = _entry([item for item in plan.items if item.problem == index], results, mode)
        if entry is None:
            continue
        shape = spec.shape
        a_layout, b_layout = spec.layouts
        problem = synthetic(shape.m, shape.n, shape.k, spec.dtype, batch=shape.batch,
                            cc=plan.cc, a_layout=a_layout, b_layout=b_layout)
        entries[problem.key] = {
            **entry, "family": tables.family(problem), "m": shape.m, "n": shape.n,
            "k": shape.k, "batch": shape.batch, "dtype": spec.dtype, "layout": spec.layout,
            "refused": plan.refused.get(index, {}), "measured": measured}
    return entries


def _winner_ms(entry: dict) -> float:
    """The winner's figure in the entry's mode (its first figure where the final rounds of
    that mode did not time it)."""
    winner = f"{entry['backend']}:{entry['config']['name']}"
    return entry["timings_ms"][entry["mode"]].get(winner, entry["screening_ms"][winner])


def _row(entry: dict) -> tuple[str, float | None]:
    """A summary line for the entry, and its winner's ratio to the baseline (None without
    a baseline figure)."""
    size = f"{entry['batch']}x[{entry['m']}x{entry['n']}x{entry['k']}]" if entry["batch"] > 1 \
        else f"{entry['m']}x{entry['n']}x{entry['k']}"
    winner = f"{entry['backend']}:{entry['config']['name']}"
    best = _winner_ms(entry)
    base = entry["baseline_ms"][entry["mode"]]
    ratio = base / best if base else None
    spread = entry["spread"]
    line = (f"{size:<22} {entry['dtype']:<9} {entry['mode']:<5} {winner[:36]:<36} "
            f"{best:>9.4f} {(f'{ratio:.2f}' if ratio else '-'):>14} "
            f"{(f'{spread * 100:.1f}%' if spread is not None else '-'):>6}")
    return line, ratio


def summary(table: dict) -> str:
    """A readable account of a tuning table: each problem's timing mode, winner, its ratio to
    torch.matmul in that mode and the spread its lead had to exceed; then every dropped
    candidate with its reason."""
    env = table.get("environment", {})
    entries = table.get("entries", {})
    timed = sum(len(e["screening_ms"]) for e in entries.values())
    dropped = [(key, cand, why) for key, e in entries.items()
               for cand, why in e.get("dropped", {}).items()]
    lines = [f"tuned {len(entries)} problems on {env.get('gpu') or 'no GPU'} "
             f"(cc {env.get('cc')}): {timed} candidates timed, {len(dropped)} dropped",
             f"{'problem':<22} {'dtype':<9} {'mode':<5} {'winner':<36} {'ms':>9} "
             f"{'x ' + BASELINE_LABEL:>14} {'spread':>6}"]
    ratios: dict[str, list[float]] = {}
    for e in entries.values():
        line, ratio = _row(e)
        lines.append(line)
        if ratio:
            ratios.setdefault(e["mode"], []).append(ratio)
    for mode, found in ratios.items():
        geo = math.exp(sum(math.log(r) for r in found) / len(found))
        lines.append(f"geometric mean of the winners over {BASELINE_LABEL}, {mode} mode: "
                     f"{geo:.3f}x")
    if dropped:
        lines.append("dropped candidates:")
        lines += [f"  {key} {cand}: {why}" for key, cand, why in dropped]
    return "\n".join(lines)


def _timer(timer: Timer | None, quick: bool, mode: str) -> Timer:
    """The timer of the run, in ``mode``: ``timer``, else the GPU timer (quick's when
    ``quick``)."""
    return (timer or (QUICK_TIMER if quick else GpuTimer())).in_mode(mode)


def _backend_names(backends: Iterable[str] | None, known: tuple[str, ...]) -> tuple[str, ...]:
    """The backends to tune, checked against ``known``, the baseline always among them."""
    names = known if backends is None else tuple(dict.fromkeys(backends))
    for name in names:
        if name not in known:
            raise InvalidArgument(f"tune: backend {name!r}: not a backend name "
                                  f"(known: {', '.join(known)})")
    if BASELINE in known and BASELINE not in names:
        names += (BASELINE,)
    return names


def visible_gpus() -> list[str]:
    """This machine's GPUs that CUDA may use, as ``CUDA_VISIBLE_DEVICES`` values: that
    variable's entries where it is set, else "0", "1", ... for every device torch counts."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()][:count]
    return [str(i) for i in range(count)]


def _dask() -> bool:
    """Whether Dask's distributed scheduler can be imported (without importing it)."""
    return importlib.util.find_spec("distributed") is not None


def _local_gpus(gpus: int | str | None, scheduler: str | None, device: str,
                progress: IO[str] | None) -> list[str] | None:
    """The GPUs of this machine (``CUDA_VISIBLE_DEVICES`` values) to start one Dask worker on
    each, or None where the run stays in one process here (one GPU, a ``scheduler``'s
    cluster, or no Dask and ``gpus`` not asked for). ``gpus`` None means every visible GPU
    where Dask is installed and more than one is visible; with stand-ins (``device`` "cpu"),
    ``gpus=N`` starts N workers all the same."""
    if gpus is not None and scheduler is not None:
        raise InvalidArgument(f"tune: gpus is {gpus!r} and scheduler is {scheduler!r}: give "
                              "one (gpus spreads over this machine's GPUs, scheduler over the "
                              "workers of a Dask cluster, one per GPU)")
    if gpus is not None and gpus != "all" and (
            isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise InvalidArgument(f"tune: gpus is {gpus!r}: expected a number of GPUs (at least "
                              "1) or 'all'")
    if scheduler is not None or gpus == 1:
        return None
    if device.startswith("cuda"):
        visible = visible_gpus()
    elif gpus == "all" or gpus is None:
        visible = []
    else:
        visible = [str(i) for i in range(gpus)]
    if gpus is None:
        if len(visible) > 1 and not _dask() and progress is not None:
            progress.write(f"tune: {len(visible)} GPUs visible, tuning on one: install "
                           "Dask (pip install \"multibackend[cluster]\") to use them all\n")
        return visible if len(visible) > 1 and _dask() else None
    wanted = len(visible) if gpus == "all" else gpus
    if not visible or wanted > len(visible):
        raise InvalidArgument(f"tune: gpus is {gpus!r}: {len(visible)} GPU(s) visible here")
    return visible[:wanted] if wanted > 1 else None


def _run_here(plan: Plan, job: Job, timeout_s: float, compile_timeout_s: float, bar: Any
              ) -> tuple[Results, dict | None]:
    """The plan run in one tuner process here; its results and the environment it measured
    in (None where it never started)."""
    child = Child()
    try:
        results = Runner(plan, job, timeout_s, compile_timeout_s, child, bar).run()
    finally:
        child.close()
    return results, child.environment


def tune(shapes: Iterable[Any], dtypes: Iterable[str] = ("float16",),
         backends: Iterable[str] | None = None, *, mode: str = "eager",
         max_configs: int | None = None, quick: bool = False, timeout_s: float = 120.0,
         compile_timeout_s: float = 900.0, max_workers: int | None = None,
         gpus: int | str | None = None, scheduler: str | None = None,
         progress: IO[str] | None = sys.stderr, registry: Any = None,
         matmul: PublicCall | None = None, timer: Timer | None = None,
         device: str | None = None, seed: int = 0, layout: str = "nn") -> dict:
    """Tune ``shapes`` (suite names, ``"MxNxK"``/``"BxMxNxK"`` strings or tuples) for each of
    ``dtypes`` over ``backends`` (default: every backend; cuBLAS, the baseline, is always
    measured) and return the tuning table (save it with
    :func:`multibackend.choose.tables.save_table`).

    ``mode`` is the timing mode the choice is made in: ``"eager"`` (back-to-back public
    calls, host time included) or ``"graph"`` (the calls captured in a CUDA graph and
    replayed); the final comparison is timed in both, and the table records both.
    ``max_configs`` bounds the candidates per backend (the backend's first, expected best);
    ``quick`` sets it to 3 when unset and times 10 runs instead of 50. ``layout`` gives the
    major orders of A and B, A's letter first ("n" row-major, "t" column-major: "nt" is
    ``x @ W.T``); the table's entries are of that layout's family. A candidate gets
    ``timeout_s`` to run and be timed; starting a tuning worker, setting up a problem,
    compiling a backend's candidates in parallel or a problem's final rounds get
    ``compile_timeout_s``; ``max_workers`` bounds a parallel compile's processes.

    ``gpus`` spreads the problems over this machine's GPUs, one Dask worker each
    (:mod:`multibackend.tuning.cluster`): a number, or ``"all"``; by default every visible GPU
    where Dask is installed and more than one is visible, else one. ``scheduler`` (an address such
    as ``"tcp://host:8786"``) spreads them over the workers of that Dask cluster instead. Each
    problem is measured on one GPU, and the table carries the environment it was measured in. Dask
    starts its workers as spawned processes, which import the calling script again: a script that
    spreads a run keeps its top level under ``if __name__ == "__main__":``.

    ``registry`` (an object with ``names``, ``get`` and ``availability``, picklable) replaces
    multibackend's registry, and then ``matmul`` (the public call's stand-in, routed to that
    registry: :data:`~multibackend.tuning.worker.PublicCall`) must replace
    :func:`multibackend.matmul`; ``timer`` (a picklable
    :class:`~multibackend.tuning.worker.Timer`, put in ``mode``) replaces the GPU timer and
    ``device`` ``"cuda"``. The progress bar and the summary go to ``progress`` (None: silent).
    """
    from multibackend.choose.registry import REGISTRY

    check_mode(mode, "tune")
    if registry is not None and matmul is None:
        raise InvalidArgument("tune: registry is given but matmul is None: candidates are "
                              "timed through the public call, which routes to multibackend's "
                              "own registry; give a matmul that routes to this registry")
    source = REGISTRY if registry is None else registry
    shape_list = _shapes(shapes)
    dtype_list = [dt.canonical(d, what="tune: dtype") for d in dtypes]
    if not shape_list or not dtype_list:
        raise InvalidArgument(f"tune: shapes {list(shapes)!r} and dtypes {dtype_list!r}: "
                              "need at least one of each")
    if layout not in LAYOUTS:
        raise InvalidArgument(f"tune: layout is {layout!r}: expected one of "
                              f"{', '.join(LAYOUTS)} (A's and B's major order, 'n' row-major, "
                              "'t' column-major)")
    names = _backend_names(backends, tuple(source.names))
    if max_configs is not None and max_configs < 1:
        raise InvalidArgument(f"tune: max_configs is {max_configs!r}: must be at least 1")
    if quick and max_configs is None:
        max_configs = QUICK_CONFIGS
    gpu = environment.gpu()
    device = device or ("cuda" if gpu["available"] else "cpu")
    if device == "cpu" and registry is None and scheduler is None:
        raise BackendUnavailable(f"tune: needs a CUDA GPU to time candidates on, and there is "
                                 f"none here ({gpu['reason']}); scheduler= (--scheduler) "
                                 "tunes on the GPUs of a Dask cluster's workers")
    local = _local_gpus(gpus, scheduler, device, progress)
    if (local is not None or scheduler is not None) and not _dask():
        raise InvalidArgument(f"tune: {'scheduler' if scheduler else 'gpus'} is "
                              f"{scheduler or gpus!r}: spreading a run needs Dask, which is "
                              "not installed (pip install \"multibackend[cluster]\")")
    startup = None
    if local is not None or scheduler is not None:  # the workers start while this plans
        from multibackend.tuning import cluster

        startup = cluster.Startup(scheduler, local, compile_timeout_s)
    try:
        plan = _plan(shape_list, dtype_list, names, source, device, max_configs, layout)
        job = Job(plan.specs, [], device, _timer(timer, quick, mode), registry, max_workers,
                  seed, matmul)
        bar = progress_bar(len(plan.items), progress)
        try:
            if startup is None or not plan.items:
                results, measured_in = _run_here(plan, job, timeout_s, compile_timeout_s, bar)
            else:
                results, measured_in = cluster.run(plan, job, timeout_s, compile_timeout_s,
                                                   bar, startup)
        finally:
            bar.close()
    finally:
        if startup is not None:
            startup.close()
    table = {**tables.new_table(_entries(plan, results, mode)),
             "environment": measured_in or environment.fingerprint()}
    if progress is not None:
        for name, why in plan.unavailable.items():
            progress.write(f"{name}: not tuned, unavailable here: {why}\n")
        progress.write(summary(table) + "\n")
        for line in _without_entry(plan, results):
            progress.write(line + "\n")
    return table


def _without_entry(plan: Plan, results: Results) -> list[str]:
    """A line for each problem with candidates of which none ran correctly (so the table has
    no entry for it), with the first candidate's reason."""
    lines = []
    for index, spec in plan.specs.items():
        items = [item for item in plan.items if item.problem == index]
        reasons = [results.first.get(item.id, (None, "not evaluated"))[1] for item in items]
        if items and all(reasons):
            lines.append(f"no entry for {spec.dtype} {spec.shape.label}: all {len(items)} "
                         f"candidates dropped, the first: {reasons[0]}")
    return lines
