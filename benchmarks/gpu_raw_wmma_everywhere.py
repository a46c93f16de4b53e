"""The raw WMMA backend by name (its own default choice, no config named) on every layout and
size, against torch.matmul in the same run.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_raw_wmma_everywhere.py --out-dir benchmarks/results/<GPU> \\
        [--suite named --suite validation] [--dtype float16 --dtype bfloat16] \\
        [--mode eager --mode graph] [--max-seconds 2] [--name raw_wmma_everywhere]

Suites: ``named`` is 4096³ and 8192³ in each major order of A and B ("nn" plain ``A @ B``,
"nt" ``x @ W.T``, "tn", "tt") and two ``x @ W.T`` shapes few tiles cover (257x4096x4096,
3001x2056x1552); ``validation`` is :func:`multibackend.tuning.suites.suite`'s "validation"
(shapes nothing was tuned on) as plain ``A @ B``. For each problem (random non-zero operands)
``multibackend.matmul(A, B, backend="raw_wmma")`` is checked against the float64 reference,
then timed against ``torch.matmul(A, B)`` with their runs alternated
(:func:`multibackend.gpu.timing.time_interleaved`, median): ``eager`` back-to-back calls, host
included, or ``graph`` (the calls captured in a CUDA graph and replayed).

Writes ``<name>_<mode>.json`` (``--name``, default ``raw_wmma_everywhere``): rows ``{suite,
dtype, m, n, k, batch, layout, backend, config, ms, torch_ms}``, ``backend`` "raw_wmma"
(``config`` the one it chose, from ``explain()``) or "torch"; prints the ratio torch_ms /
ms per problem and, per suite, the geometric mean, the worst problem and the problems with
M <= 64.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_validation import checked  # noqa: E402

#: (shape, layout) of the named suite
NAMED = tuple((f"{s}x{s}x{s}", lay) for s in (4096, 8192) for lay in ("nn", "nt", "tn", "tt")) \
    + (("257x4096x4096", "nt"), ("3001x2056x1552", "nt"))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path("."))
    p.add_argument("--suite", action="append", dest="suites", choices=("named", "validation"))
    p.add_argument("--dtype", action="append", dest="dtypes")
    p.add_argument("--mode", action="append", dest="modes", choices=("eager", "graph"))
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=2.0, help="per problem and mode")
    p.add_argument("--name", default="raw_wmma_everywhere", help="output files' stem")
    return p.parse_args()


def problems(suites: list[str]) -> list[tuple[str, object, str]]:
    """(suite, shape, layout) of every problem of ``suites``."""
    from multibackend.tuning.suites import parse_shape, suite

    found = []
    for name in suites:
        if name == "named":
            found += [(name, parse_shape(shape), lay) for shape, lay in NAMED]
        else:
            found += [(name, shape, "nn") for shape in suite(name)]
    return found


def main() -> int:
    args = parse()
    import torch

    import multibackend as mb
    from multibackend.core.problem import synthetic
    from multibackend.gpu.timing import time_interleaved
    from multibackend.tuning.worker import Spec, random_operands

    todo = problems(args.suites or ["named", "validation"])
    cc = torch.cuda.get_device_capability()
    print(f"{len(todo)} problems x {args.dtypes or ['float16', 'bfloat16']} on "
          f"{torch.cuda.get_device_name()}", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for mode in args.modes or ["eager", "graph"]:
        rows, notes = [], []
        for dtype in args.dtypes or ["float16", "bfloat16"]:
            for i, (suite_name, shape, lay) in enumerate(todo):
                spec = Spec(shape, dtype, lay)
                a, b = random_operands(spec, "cuda", seed=i)
                a_layout, b_layout = spec.layouts
                problem = synthetic(shape.m, shape.n, shape.k, dtype, batch=shape.batch, cc=cc,
                                    a_layout=a_layout, b_layout=b_layout)
                calls = {"torch": lambda a=a, b=b: torch.matmul(a, b),
                         "raw_wmma": lambda a=a, b=b: mb.matmul(a, b, backend="raw_wmma")}
                here: list[str] = []
                calls = checked(calls, a, b, problem, here)
                notes += [f"{dtype} {shape.label} {lay}: {n}" for n in here]
                if "raw_wmma" not in calls:
                    continue
                config = mb.explain(a, b, backend="raw_wmma").config.name
                timed = time_interleaved(calls, mode=mode, reps=args.reps,
                                         max_seconds=args.max_seconds)
                base = timed["torch"].median_ms
                for name, t in timed.items():
                    rows.append({"suite": suite_name, "dtype": dtype, "m": shape.m, "n": shape.n,
                                 "k": shape.k, "batch": shape.batch, "layout": lay,
                                 "backend": name,
                                 "config": config if name == "raw_wmma" else "torch.matmul",
                                 "ms": t.median_ms, "torch_ms": base})
                print(f"{mode} {suite_name:10s} {dtype:8s} {lay} {shape.label:22s} torch "
                      f"{base * 1e3:9.1f} us  raw_wmma {base / timed['raw_wmma'].median_ms:.3f}x"
                      f"  {config}", flush=True)
                del a, b
        (args.out_dir / f"{args.name}_{mode}.json").write_text(
            json.dumps(rows, indent=1) + "\n")
        for line in summary(rows, mode) + [f"  note: {n}" for n in notes]:
            print(line, flush=True)
    return 0


def summary(rows: list[dict], mode: str) -> list[str]:
    """Per suite and dtype: the geometric mean of torch_ms / ms of raw_wmma, its worst
    problem, and the same over the problems with M <= 64."""
    lines = [f"{mode}: raw_wmma x torch.matmul (torch_ms / ms), same run, runs alternated"]
    groups: dict[tuple, list[tuple[float, dict]]] = {}
    for r in rows:
        if r["backend"] == "raw_wmma":
            groups.setdefault((r["suite"], r["dtype"]), []).append((r["torch_ms"] / r["ms"], r))
    for (suite_name, dtype), found in groups.items():
        for label, part in (("all", found), ("M <= 64", [f for f in found if f[1]["m"] <= 64])):
            if part:
                ratios = [x for x, _ in part]
                worst = min(part, key=lambda f: f[0])[1]
                geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
                lines.append(f"  {suite_name:10s} {dtype:8s} {label:7s} problems {len(part):3d} "
                             f"geomean {geo:.3f}  min {min(ratios):.3f} ({worst['m']}x"
                             f"{worst['n']}x{worst['k']} {worst['layout']})")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
