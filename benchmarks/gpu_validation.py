"""``auto`` on shapes nothing was tuned on, against torch.matmul in the same run.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_validation.py --out-dir benchmarks/results/<GPU> \\
        [--suite validation] [--shape MxNxK ...] [--layout nn] \\
        [--dtype float16 --dtype bfloat16] [--mode eager --mode graph] \\
        [--member auto --member auto_autotune --member triton ...]

For every problem of the suite and of ``--shape`` (random non-zero operands, torch tensors, A
and B in the major orders of ``--layout``: "nt" is ``x @ W.T``) and every mode, the members are
timed against each other with their runs alternated
(:func:`multibackend.gpu.timing.time_interleaved`): ``torch`` (torch's own call for the dtype:
``torch.matmul(A, B)``, ``torch._int_mm(A, B)`` for int8, ``torch._scaled_mm(A, B)`` with unit
scales for fp8, into the library's float32 D; ``--dtype tf32`` is float32 operands with TF32
allowed in torch and ``precision="tf32"`` in every member's call), ``auto``
(``multibackend.matmul(A, B)`` with no tuning table), ``auto_autotune`` (the same call with
first-call autotuning in this mode: its first call, outside the timing, measures and keeps
the winner) and any backend named with ``--member`` (``backend=<name>``, or
``<name>:<config>`` for one of its configs, e.g. ``cutlass:autotune``: left out, with the
reason, where the backend does not offer that config for the problem). Each member's
result is first checked against the float64 reference; a wrong member is reported and left
out of the timing. ``eager`` times back-to-back calls, host included; ``graph`` replays the
calls captured in a CUDA graph.

Writes ``<name>_<mode>.json`` (``--name``, default ``validation``; give runs of other dtypes,
suites or layouts their own) (a list of rows ``{dtype, m, n, k, batch, layout, mode, backend, ms,
torch_ms}``, one per problem, mode and member, ``backend`` "torch" for torch.matmul itself;
``chosen`` and ``why``, for ``auto`` and ``auto_autotune``, the backend the call ran and the
rule and figures that chose it: for first-call autotune, each candidate's first-call timing)
and prints per member the geometric mean of torch_ms / ms, the worst problem and how many
fall below 0.95x; for ``auto_autotune``, the worst ratio to the fastest member of its problem,
twice: from the members' medians, and paired (row field ``paired_vs_fastest``): per member
the median over rounds of its run over auto_autotune's in the same round
(:func:`multibackend.gpu.timing.paired_ratio`), the smallest of them. Eager figures of host-bound
calls move with the host over seconds, so two members running the same call have medians up
to 5% apart; runs of one round are milliseconds apart and the paired figure cancels that.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = "torch"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", help="shape suite (default: validation, unless --shape)")
    p.add_argument("--shape", action="append", default=[], help="MxNxK (repeatable)")
    p.add_argument("--layout", default="nn", help="A's and B's major orders (nn, nt, tn, tt)")
    p.add_argument("--dtype", action="append", dest="dtypes")
    p.add_argument("--mode", action="append", dest="modes")
    p.add_argument("--member", action="append", dest="members")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=3.0, help="per problem and mode")
    p.add_argument("--limit", type=int, default=None, help="only the first N shapes")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--name", default="validation", help="output files' stem: <name>_<mode>.json")
    return p.parse_args()


#: the benchmark's name for float32 operands multiplied in TF32
TF32 = "tf32"


def operand_dtype(name: str) -> tuple[str, dict]:
    """(the operands' dtype, the options of every member's call) of a ``--dtype`` name."""
    return ("float32", {"precision": "tf32"}) if name == TF32 else (name, {})


def torch_call(a, b):
    """torch's own call for A's dtype on these operands: ``torch._int_mm`` for int8,
    ``torch._scaled_mm`` with unit scales into float32 for fp8, else ``torch.matmul``."""
    import torch

    kind = getattr(a, "dtype", None)
    if kind == torch.int8:
        return lambda: torch._int_mm(a, b)
    if kind in (torch.float8_e4m3fn, torch.float8_e5m2):
        one = torch.ones((), device=a.device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
    return lambda: torch.matmul(a, b)


def member_calls(names: list[str], a, b, mode: str = "eager", configs: dict | None = None,
                 options: dict | None = None) -> dict:
    """torch's own call (:func:`torch_call`) as :data:`BASE`, then a call per member, each
    with ``options`` (e.g. ``precision="tf32"``): ``auto`` (no table),
    ``auto_autotune`` (first-call autotuning in ``mode``), a backend's name (its default
    config, or ``configs[name]``: left out where that is None, the backend offering none) or
    ``<name>:<config>`` (that config)."""
    import multibackend as mb

    configs, options = configs or {}, options or {}
    calls = {BASE: torch_call(a, b)}
    for name in names:
        if name == "auto":
            calls[name] = lambda: mb.matmul(a, b, **options)
        elif name == "auto_autotune":
            calls[name] = lambda: mb.matmul(a, b, autotune=mode, **options)
        elif name not in configs or configs[name] is not None:
            backend, _, named = name.partition(":")
            config = configs.get(name, named or None)  # none passed: the shortest call path
            kwargs = {"backend": backend} if config is None else {"backend": backend,
                                                                  "config": config}
            calls[name] = lambda kwargs={**kwargs, **options}: mb.matmul(a, b, **kwargs)
    return calls


def prebuild_cutlass(jobs: list) -> None:
    """Every CUTLASS kernel of the (problem, config) ``jobs``, in one parallel nvcc pass."""
    from multibackend.backends.cutlass.backend import prepare_many

    try:
        prepare_many(jobs)
    except Exception as exc:  # reported; those members are then dropped as failing
        print(f"cutlass prebuild: {type(exc).__name__}: {exc}"[:300], flush=True)


def write_report(path: Path, rows: list[dict], lines: list[str], notes: list[str] = ()) -> None:
    """``rows`` written to ``path`` as JSON; ``lines`` and then ``notes`` printed."""
    path.write_text(json.dumps(rows, indent=1) + "\n")
    for line in lines:
        print(line, flush=True)
    for note in notes:
        print("  note:", note, flush=True)


def _chosen(a, b, mode: str, options: dict) -> dict:
    """Row fields for ``auto`` and ``auto_autotune`` on these operands and options
    (explain()): the backend the call runs, and the rule and figures that chose it."""
    import multibackend as mb

    decisions = {"auto": mb.explain(a, b, **options),
                 "auto_autotune": mb.explain(a, b, autotune=mode, **options)}
    return {name: {"chosen": d.backend, "why": f"{d.rule}: {d.detail}"}
            for name, d in decisions.items()}


def checked(calls: dict, a, b, problem, notes: list) -> dict:
    """The members whose result matches the float64 reference (the first call plans)."""
    from multibackend.verify import reference

    ref = reference.reference_matmul(a, b)
    kept = {}
    for name, fn in calls.items():
        try:
            d = fn()
            cmp = reference.compare(problem, d.reshape(ref.shape), ref)
        except Exception as exc:  # a member that cannot run is reported, not timed
            notes.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
            continue
        if cmp.ok or name == BASE:
            kept[name] = fn
        else:
            notes.append(f"{name}: wrong: {cmp.detail}")
    return kept


def member_lines(rows: list[dict], mode: str, leave_out: tuple = (),
                 paired: bool = False) -> list[str]:
    """Per member (``backend`` of the rows, but those in ``leave_out``): the geometric mean
    of torch_ms / ms, the worst ratio and how many fall below 0.95x; with ``paired``, of
    the rows' ``paired`` figure instead (the median over rounds of torch's run over the
    member's in the same round: see :func:`multibackend.gpu.timing.paired_ratio`)."""
    by_member: dict[str, list[float]] = {}
    for r in rows:
        if r["backend"] not in leave_out:
            ratio = r["paired"] if paired else r["torch_ms"] / r["ms"]
            by_member.setdefault(r["backend"], []).append(ratio)
    how = "paired by round" if paired else "(torch_ms / ms)"
    lines = [f"{mode}: x torch's own call {how}, same run, runs alternated"]
    for name, ratios in by_member.items():
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        below = sum(r < 0.95 for r in ratios)
        lines.append(f"  {name:14s} problems {len(ratios):4d}  geomean {geo:.3f}  "
                     f"min {min(ratios):.3f}  below 0.95x: {below}")
    return lines


def _summary(rows: list[dict], mode: str) -> list[str]:
    lines = member_lines(rows, mode)
    fastest: dict[tuple, float] = {}
    for r in rows:
        key = (r["dtype"], r["m"], r["n"], r["k"], r["batch"])
        fastest[key] = min(fastest.get(key, math.inf), r["ms"])
    tuned = [fastest[(r["dtype"], r["m"], r["n"], r["k"], r["batch"])] / r["ms"]
             for r in rows if r["backend"] == "auto_autotune"]
    if tuned:
        lines.append(f"  auto_autotune vs its problem's fastest member: min {min(tuned):.3f}, "
                     f"below 0.97x: {sum(t < 0.97 for t in tuned)} (medians)")
    paired = [r["paired_vs_fastest"] for r in rows if "paired_vs_fastest" in r]
    if paired:
        lines.append(f"  auto_autotune vs its problem's fastest member: min {min(paired):.3f}, "
                     f"below 0.97x: {sum(t < 0.97 for t in paired)} (paired by round)")
    return lines


def paired_vs_fastest(timed: dict, name: str = "auto_autotune") -> float | None:
    """``name``'s figure against the fastest of the other members, paired by round: the
    smallest over them of the median of (their run / its run) in each round."""
    from multibackend.gpu.timing import paired_ratio

    if name not in timed:
        return None
    return min((paired_ratio(t, timed[name]) for n, t in timed.items() if n != name),
               default=1.0)


def main() -> int:
    args = parse()
    import torch

    from multibackend.core.problem import synthetic
    from multibackend.gpu.timing import check_mode, time_interleaved
    from multibackend.tuning.suites import parse_shape, suite
    from multibackend.tuning.worker import LAYOUTS, Spec, random_operands

    dtypes_ = args.dtypes or ["float16", "bfloat16"]
    modes = [check_mode(m) for m in (args.modes or ["eager", "graph"])]
    members = args.members or ["auto", "auto_autotune"]
    if args.layout not in LAYOUTS:
        raise SystemExit(f"--layout {args.layout}: expected one of {', '.join(LAYOUTS)}")
    if any(d.startswith("float8") for d in dtypes_) and args.layout != "nt":
        raise SystemExit(f"--dtype float8_*: torch._scaled_mm takes A row-major and B "
                         f"column-major: give --layout nt (not {args.layout})")
    named = args.suite or ("validation" if not args.shape else None)
    shapes = ((suite(named) if named else ()) + tuple(map(parse_shape, args.shape)))[:args.limit]
    label = named or "shapes"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    cc = torch.cuda.get_device_capability()
    print(f"{label}: {len(shapes)} shapes x {dtypes_} ({args.layout}) on {device}, modes "
          f"{modes}, members {[BASE] + members}", flush=True)
    start = time.monotonic()
    for mode in modes:
        rows, notes = [], []
        for dtype in dtypes_:
            for i, shape in enumerate(shapes):
                kind, options = operand_dtype(dtype)
                torch.backends.cuda.matmul.allow_tf32 = dtype == TF32
                spec = Spec(shape, kind, args.layout)
                a, b = random_operands(spec, "cuda", seed=i)
                a_layout, b_layout = spec.layouts
                problem = synthetic(shape.m, shape.n, shape.k, kind, batch=shape.batch, cc=cc,
                                    a_layout=a_layout, b_layout=b_layout, **options)
                problem_notes: list = []
                calls = checked(member_calls(members, a, b, mode, options=options), a, b,
                                problem, problem_notes)
                notes += [f"{dtype} {shape.label}: {n}" for n in problem_notes]
                if BASE not in calls:  # torch's own call refused it: nothing to compare to
                    print(f"{mode} {dtype} {shape.label}: skipped ({problem_notes[0]})",
                          flush=True)
                    continue
                timed = time_interleaved(calls, mode=mode, reps=args.reps,
                                         max_seconds=args.max_seconds)
                base = timed[BASE].median_ms
                chosen = _chosen(a, b, mode, options)
                paired = paired_vs_fastest(timed)
                for name, t in timed.items():
                    rows.append({"dtype": dtype, "m": shape.m, "n": shape.n, "k": shape.k,
                                 "batch": shape.batch, "layout": args.layout, "mode": mode,
                                 "backend": name,
                                 "ms": t.median_ms, "torch_ms": base,
                                 **chosen.get(name, {}),
                                 **({"paired_vs_fastest": paired}
                                    if name == "auto_autotune" and paired is not None else {})})
                ratios = "  ".join(f"{n} {base / t.median_ms:.3f}" for n, t in timed.items()
                                   if n != BASE)
                print(f"[{time.monotonic() - start:6.0f}s] {mode} {dtype} {shape.label:22s} "
                      f"torch {base * 1e3:9.1f} us  {ratios}", flush=True)
                del a, b
        write_report(out_dir / f"{args.name}_{mode}.json", rows, _summary(rows, mode), notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
