"""Decode-sized and few-tile products against torch.matmul, in the same run.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_skinny.py --out-dir benchmarks/results/<GPU> \\
        [--suite decode --suite few_tile] [--dtype float16 --dtype bfloat16] \\
        [--mode eager --mode graph]

Problems: the ``decode`` suite (M from 1 to 512 times eight LLM projections, the
128256-word vocabulary head among them) and the ``few_tile`` suite (cubes from 768 to 2560
and deep-K products: at most two waves of 128x256 output tiles, most under one). Members,
each checked against the float64 reference first and then timed with their runs alternated
(:func:`multibackend.gpu.timing.time_interleaved`):
``torch`` (``torch.matmul``), ``triton`` (its default config: first-call autotune over its
shortlist, split-K candidates included), ``cutlass`` (its "autotune" config: first-call
autotune over its shortlist of persistent, stream-K and split-K kernels, built beforehand in
one parallel nvcc pass; its default kernel where no shortlist is offered) and ``auto`` (no
table).

Each dtype's problems are checked first, then timed in one pass per mode, graph mode first:
the GPU's clock follows the power drawn in the last second or so, and eager mode's bursts of
back-to-back calls (2 ms each) drive an H100 to its power limit. Timed right after them, in
the same process, graph mode saw a throttled GPU on which the ratios moved (bf16
256x10240x8192: Triton's 128x192 tile 1.08x torch.matmul alone, 0.97x-1.00x right after the
eager timing of the same product, 1.09x after two seconds idle), so each pass after the
first starts after PASS_IDLE_S seconds idle. Within a pass a light product timed right after
the heaviest one (512x128256x4096, 832 us a call) inherits its clock too (bf16 1x10240x8192:
Triton's 16x256x64 tile 0.94x-1.00x right after it, 1.02x-1.03x after 0.5 s idle or 2 s), so
every product's timing starts after PRODUCT_IDLE_S seconds idle.

Writes ``skinny_<mode>.json``: rows ``{dtype, m, n, k, batch, mode, backend, ms,
torch_ms}`` (``backend`` "torch" for torch.matmul itself; ``config``, for Triton and
CUTLASS, the config their first-call autotuning picked), and prints per member the
geometric mean of torch_ms / ms, the worst ratio, how many fall below 0.95x, and the same
for the best of Triton and CUTLASS per problem.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_validation import (  # noqa: E402
    BASE,
    checked,
    member_calls,
    member_lines,
    prebuild_cutlass,
    write_report,
)

MEMBERS = ("triton", "cutlass", "auto")
#: seconds the GPU idles before each timing pass after the first (its clock recovers from
#: the pass before: see the module docstring)
PASS_IDLE_S = 2.0
#: seconds the GPU idles before each product's timing (the one before it may have throttled it)
PRODUCT_IDLE_S = 0.5
#: the members whose best per problem the bars are about
KERNELS = ("triton", "cutlass")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", action="append", dest="suites")
    p.add_argument("--dtype", action="append", dest="dtypes")
    p.add_argument("--mode", action="append", dest="modes")
    p.add_argument("--member", action="append", dest="members")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=1.0, help="per problem and mode")
    p.add_argument("--out-dir", default=".")
    return p.parse_args()


def _cutlass_config(problem):
    """CUTLASS's "autotune" config for the problem, else its default (None where it cannot
    run it)."""
    from multibackend.backends.cutlass.backend import AUTOTUNE
    from multibackend.choose.registry import REGISTRY

    backend = REGISTRY.get("cutlass")
    if backend.available() is not None or backend.supports(problem) is not None:
        return None
    configs = backend.configs(problem)
    return AUTOTUNE if AUTOTUNE in configs else backend.default_config(problem)


def _picks(problem) -> dict[str, str]:
    """The config each of :data:`KERNELS` picked by first-call autotuning for the problem
    (those that picked one)."""
    from multibackend.choose.registry import REGISTRY

    backends = {name: REGISTRY.get(name) for name in KERNELS}  # None: failed to load
    found = {name: b.autotuned(problem) for name, b in backends.items() if b is not None}
    return {name: config.name for name, config in found.items() if config is not None}


def best_lines(rows: list[dict], mode: str) -> list[str]:
    """The best of :data:`KERNELS` per problem, as :func:`member_lines` words a member."""
    best: dict[tuple, dict] = {}
    for r in rows:
        if r["backend"] in KERNELS:
            key = (r["dtype"], r["m"], r["n"], r["k"], r["batch"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = dict(r, backend="best of " + "/".join(KERNELS))
    return member_lines(list(best.values()), mode)[1:]


def main() -> int:
    args = parse()
    import torch

    from multibackend.core import dtypes as mb_dtypes
    from multibackend.gpu.timing import check_mode, time_interleaved
    from multibackend.io.request import matmul_call
    from multibackend.tuning.suites import suite

    suites = args.suites or ["decode", "few_tile"]
    dtypes_ = args.dtypes or ["float16", "bfloat16"]
    modes = [check_mode(m) for m in (args.modes or ["graph", "eager"])]
    members = args.members or list(MEMBERS)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"skinny on {torch.cuda.get_device_name()}: {suites} x {dtypes_}, modes {modes}, "
          f"members {[BASE] + members}", flush=True)
    start = time.monotonic()
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    notes: list[str] = []
    passes = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [s for name in suites for s in suite(name)]
    for dtype in dtypes_:
        torch_dtype = mb_dtypes.torch_dtype(dtype)
        cases = []
        for shape in shapes:
            a = (torch.rand((shape.m, shape.k), generator=gen, device="cuda") * 2 - 1
                 ).to(torch_dtype)
            b = (torch.rand((shape.k, shape.n), generator=gen, device="cuda") * 2 - 1
                 ).to(torch_dtype)
            problem = matmul_call(a, b, None).problem
            cases.append((a, b, problem, _cutlass_config(problem) if "cutlass" in members
                          else None))
        prebuild_cutlass([(p, c) for _, _, p, c in cases if c is not None])
        checked_cases = []
        for a, b, problem, cutlass_config in cases:
            calls = member_calls(members, a, b, configs={"cutlass": cutlass_config})
            problem_notes: list[str] = []
            kept = checked(calls, a, b, problem, problem_notes)
            label = f"{problem.m}x{problem.n}x{problem.k}"
            notes += [f"{dtype} {label}: {n}" for n in problem_notes]
            picks = _picks(problem)
            print(f"        {dtype} {label} picked: "
                  + ", ".join(f"{n} {c}" for n, c in picks.items()), flush=True)
            checked_cases.append((problem, label, kept, picks))
        for mode in modes:  # one pass per mode: see the module docstring
            if passes:
                time.sleep(PASS_IDLE_S)
            passes += 1
            for problem, label, kept, picks in checked_cases:
                time.sleep(PRODUCT_IDLE_S)
                timed = time_interleaved(kept, mode=mode, reps=args.reps,
                                         max_seconds=args.max_seconds)
                base = timed[BASE].median_ms
                for name, t in timed.items():
                    rows[mode].append({"dtype": dtype, "m": problem.m, "n": problem.n,
                                       "k": problem.k, "batch": 1, "mode": mode,
                                       "backend": name, "ms": t.median_ms, "torch_ms": base,
                                       **({"config": picks[name]} if name in picks else {})})
                text = "  ".join(f"{n} {base / t.median_ms:.2f}x" for n, t in timed.items()
                                 if n != BASE)
                tflops = problem.flops / (base * 1e-3) / 1e12
                print(f"[{time.monotonic() - start:5.0f}s] {mode:5s} {dtype:8s} {label:20s} "
                      f"torch {base * 1e3:8.1f} us {tflops:6.1f} TF/s  {text}", flush=True)
        del cases, checked_cases
        torch.cuda.empty_cache()
    for i, mode in enumerate(modes):
        write_report(out_dir / f"skinny_{mode}.json", rows[mode],
                     member_lines(rows[mode], mode, leave_out=(BASE,))
                     + best_lines(rows[mode], mode), notes if i == len(modes) - 1 else ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
