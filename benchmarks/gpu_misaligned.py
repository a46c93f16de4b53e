"""Misaligned products (rows off the 16-byte grid) against torch.matmul and their aligned
neighbours, in the same run.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_misaligned.py --out-dir benchmarks/results/<GPU> \\
        [--dtype float16 --dtype bfloat16] [--mode eager --mode graph]

Problems: the ``misaligned`` suite (contiguous operands whose K or N is not a multiple of 8)
and a 4096x4096x4096 product on views sliced from 4096x4100 matrices (row stride 4100, every
row 8 bytes off the grid), plus the ``misaligned_small`` suite, where staging cannot pay and
``auto`` must simply not lose. Members, each checked against the float64 reference first and
then timed with their runs alternated (:func:`multibackend.gpu.timing.time_interleaved`):
``torch`` (``torch.matmul``), ``triton`` (its default config: first-call autotune over its
shortlist, staged TMA tiles included), ``cutlass`` (its first staged kernel, built beforehand
in one parallel nvcc pass), ``raw_wmma`` (its default: the fast kernel on staged copies), ``auto`` (no table: the calibrated rule), and ``aligned`` — ``torch.matmul`` on the
aligned neighbour (every side rounded up to a multiple of 64, contiguous) — for the fraction
of aligned speed. Every figure of a staged member includes its copies.

Writes ``misaligned_<mode>.json``: rows ``{dtype, m, n, k, batch, lda, ldb, mode, backend,
ms, torch_ms, paired, tflops}`` (``backend`` "torch" for torch.matmul itself, "aligned" for
the neighbour, whose m, n, k are the problem's; ``paired`` the median over rounds of
torch's run over the member's in the same round), and prints per member the geometric mean
of torch_ms / ms and of ``paired``, and each problem's TFLOP/s as a fraction of its aligned
neighbour's.
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

MEMBERS = ("triton", "cutlass", "raw_wmma", "auto")
NEIGHBOUR = "aligned"
#: the sliced case: a 4096^3 product on views of 4096 x SLICED_LD matrices
SLICED_LD = 4100


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", action="append", dest="dtypes")
    p.add_argument("--mode", action="append", dest="modes")
    p.add_argument("--member", action="append", dest="members")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=2.0, help="per problem and mode")
    p.add_argument("--out-dir", default=".")
    return p.parse_args()


def _rand(shape, dtype, gen):
    import torch

    return (torch.rand(shape, generator=gen, device="cuda") * 2 - 1).to(dtype)


def _cases(dtype):
    """(label, A, B) for every problem: the suites' contiguous operands, then the views."""
    import torch

    from multibackend.tuning.suites import suite

    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in suite("misaligned") + suite("misaligned_small"):
        yield shape.label, _rand((shape.m, shape.k), dtype, gen), \
            _rand((shape.k, shape.n), dtype, gen)
    a = _rand((4096, SLICED_LD), dtype, gen)[:, :4096]
    b = _rand((4096, SLICED_LD), dtype, gen)[:, :4096]
    yield f"4096x4096x4096 ld {SLICED_LD}", a, b


def _neighbour(a, b, gen):
    import torch

    m, k = a.shape
    n = b.shape[1]
    up = [-(-x // 64) * 64 for x in (m, n, k)]
    a2 = _rand((up[0], up[2]), a.dtype, gen)
    b2 = _rand((up[2], up[1]), b.dtype, gen)
    return lambda: torch.matmul(a2, b2)


def _cutlass_config(a, b):
    """CUTLASS's first staged config for the product (None where it offers none)."""
    from multibackend.choose.registry import REGISTRY
    from multibackend.gpu import staging
    from multibackend.io.request import matmul_call

    backend = REGISTRY.get("cutlass")
    problem = matmul_call(a, b, None).problem
    if backend.supports(problem) is not None:
        return None
    return next((c for c in backend.configs(problem) if staging.is_staged(c)), None)


def _prebuild(cases, members):
    """Every CUTLASS kernel the members will run, in one parallel nvcc pass."""
    if "cutlass" not in members:
        return
    from multibackend.io.request import matmul_call

    jobs = [(matmul_call(a, b, None).problem, config) for _, a, b in cases
            if (config := _cutlass_config(a, b)) is not None]
    prebuild_cutlass(jobs)


def main() -> int:
    args = parse()
    import torch

    from multibackend.core import dtypes as mb_dtypes
    from multibackend.gpu.timing import check_mode, paired_ratio, time_interleaved
    from multibackend.io.request import matmul_call

    dtypes_ = args.dtypes or ["float16", "bfloat16"]
    modes = [check_mode(m) for m in (args.modes or ["eager", "graph"])]
    members = args.members or list(MEMBERS)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"misaligned on {torch.cuda.get_device_name()}: {dtypes_}, modes {modes}, members "
          f"{[BASE] + members + [NEIGHBOUR]}", flush=True)
    start = time.monotonic()
    rows: dict[str, list[dict]] = {mode: [] for mode in modes}
    notes: list[str] = []
    for dtype in dtypes_:
        cases = list(_cases(mb_dtypes.torch_dtype(dtype)))
        _prebuild(cases, members)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for label, a, b in cases:
            problem = matmul_call(a, b, None).problem
            configs = {"cutlass": _cutlass_config(a, b)} if "cutlass" in members else {}
            calls = member_calls(members, a, b, configs=configs)
            problem_notes: list[str] = []
            kept = checked(calls, a, b, problem, problem_notes)
            notes += [f"{dtype} {label}: {n}" for n in problem_notes]
            kept[NEIGHBOUR] = _neighbour(a, b, gen)
            flops = problem.flops
            up = [-(-x // 64) * 64 for x in (problem.m, problem.n, problem.k)]
            neighbour_flops = 2 * up[0] * up[1] * up[2]
            for mode in modes:
                timed = time_interleaved(kept, mode=mode, reps=args.reps,
                                         max_seconds=args.max_seconds)
                base = timed[BASE].median_ms
                rate = {name: (neighbour_flops if name == NEIGHBOUR else flops)
                        / (t.median_ms * 1e-3) / 1e12 for name, t in timed.items()}
                for name, t in timed.items():
                    rows[mode].append({
                        "dtype": dtype, "m": problem.m, "n": problem.n, "k": problem.k,
                        "batch": 1, "lda": a.stride(0), "ldb": b.stride(0), "mode": mode,
                        "backend": name, "ms": t.median_ms, "torch_ms": base,
                        "paired": paired_ratio(timed[BASE], t), "tflops": rate[name]})
                text = "  ".join(f"{n} {base / t.median_ms:.2f}x "
                                 f"({rate[n] / rate[NEIGHBOUR]:.0%})"
                                 for n, t in timed.items() if n not in (BASE, NEIGHBOUR))
                print(f"[{time.monotonic() - start:5.0f}s] {mode:5s} {dtype:8s} {label:28s} "
                      f"torch {rate[BASE]:6.1f} TF/s  aligned {rate[NEIGHBOUR]:6.1f}  {text}",
                      flush=True)
            del a, b, kept, calls
            torch.cuda.empty_cache()
    for i, mode in enumerate(modes):
        write_report(out_dir / f"misaligned_{mode}.json", rows[mode],
                     [line for paired in (False, True)
                      for line in member_lines(rows[mode], mode, (BASE, NEIGHBOUR), paired)],
                     notes if i == len(modes) - 1 else ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
