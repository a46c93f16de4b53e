"""Raw WMMA on products whose A is not row-major or whose B is not column-major (plain
``A @ B``), against torch in the same run: the K-major kernels on staged copies
(``staged:tma_*`` on sm_90a, ``staged:mma_*`` elsewhere and for f64, see
:mod:`multibackend.gpu.staging`) beside the fast f16/bf16 kernel, which reads the layouts as they
are.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_kmajor_layouts.py --out-dir benchmarks/results/<GPU> \\
        [--mode eager --mode graph]

Problems: f16 and bf16 4096³ and 8192³, s8 and tf32 8192³, f64 4096³ (the sizes of the raw
WMMA bars) and four shapes no choice was made on, every operand random, A row-major and B
row-major. Members, each checked against the float64 reference first, then timed with their
runs alternated (:func:`multibackend.gpu.timing.time_interleaved`, median): ``torch``
(``torch.matmul``; ``torch._int_mm`` for s8; TF32 allowed for tf32), ``raw_wmma`` under its
first K-major staged config, and for f16/bf16 ``fast`` (``fast_128x256x32_s3``). Every
staged figure includes its copy.

Writes ``kmajor_layouts_<mode>.json``: rows ``{dtype, m, n, k, mode, backend, config, ms,
torch_ms}``, and prints each member's ratio torch_ms / ms.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (dtype, m, n, k): the bars' sizes, then shapes no choice was made on
PROBLEMS = (("float16", 4096, 4096, 4096), ("float16", 8192, 8192, 8192),
            ("bfloat16", 4096, 4096, 4096), ("bfloat16", 8192, 8192, 8192),
            ("int8", 8192, 8192, 8192), ("float32", 8192, 8192, 8192),
            ("float64", 4096, 4096, 4096), ("float16", 3001, 2056, 1552),
            ("bfloat16", 1000, 5000, 2000), ("int8", 3001, 2056, 1552),
            ("float32", 1000, 5000, 2000))
FAST = "fast_128x256x32_s3"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path("."))
    p.add_argument("--mode", action="append", choices=("eager", "graph"))
    return p.parse_args()


def members(dtype: str, m: int, n: int, k: int) -> tuple[dict, dict[str, str]]:
    """The calls to time (torch's first) and each raw WMMA member's config, every result
    checked against float64."""
    import torch

    import multibackend as mb
    from multibackend.choose.registry import REGISTRY
    from multibackend.core.problem import synthetic
    from multibackend.gpu import staging
    from multibackend.verify import reference

    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    if dtype == "int8":
        a = torch.randint(-8, 8, (m, k), generator=gen, device="cuda", dtype=torch.int8)
        b = torch.randint(-8, 8, (k, n), generator=gen, device="cuda", dtype=torch.int8)
    else:
        dt = getattr(torch, dtype)
        a = (torch.rand(m, k, generator=gen, device="cuda") * 2 - 1).to(dt)
        b = (torch.rand(k, n, generator=gen, device="cuda") * 2 - 1).to(dt)
    options = {"precision": "tf32"} if dtype == "float32" else {}
    theirs = torch._int_mm if dtype == "int8" else torch.matmul
    calls = {"torch": lambda: theirs(a, b)}
    offered = mb.explain(a, b, backend="raw_wmma", **options)
    configs = [c.name for c in REGISTRY.get("raw_wmma").configs(offered.problem)
               if staging.is_staged(c) and staging.is_kmajor(c)]
    chosen = {"raw_wmma": configs[0]}
    if dtype in ("float16", "bfloat16"):
        chosen["fast"] = FAST
    problem = synthetic(m, n, k, dtype, **options)
    want = reference.reference_matmul(a, b)
    for name, config in chosen.items():
        def call(config=config):
            return mb.matmul(a, b, backend="raw_wmma", config=config, **options)
        cmp = reference.compare(problem, call(), want)
        if not cmp.ok:
            raise SystemExit(f"raw_wmma {config} {dtype} {m}x{n}x{k} is wrong: {cmp.detail}")
        calls[name] = call
    return calls, chosen


def main() -> int:
    args = parse()
    import torch

    from multibackend.gpu.timing import time_interleaved

    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    for mode in args.mode or ["eager", "graph"]:
        rows = []
        for dtype, m, n, k in PROBLEMS:
            calls, chosen = members(dtype, m, n, k)
            timed = time_interleaved(calls, mode=mode, reps=10 if m * n * k >= 8192 ** 3 else 25)
            torch_ms = timed["torch"].median_ms
            line = [f"{dtype:8s} {m}x{n}x{k} {mode}: torch {torch_ms:.3f} ms"]
            for name in calls:
                config = chosen.get(name, "torch._int_mm" if dtype == "int8" else "torch.matmul")
                rows.append({"dtype": dtype, "m": m, "n": n, "k": k, "mode": mode,
                             "backend": "torch" if name == "torch" else "raw_wmma",
                             "config": config, "ms": timed[name].median_ms,
                             "torch_ms": torch_ms})
                if name != "torch":
                    line.append(f"{config} {torch_ms / timed[name].median_ms:.3f}x")
            print("  ".join(line), flush=True)
        out = args.out_dir / f"kmajor_layouts_{mode}.json"
        out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
