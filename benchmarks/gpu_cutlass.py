"""CUTLASS backend on a GPU: build cost, cache reuse, launch cost and speed against cuBLAS.

Run from the repository root on a machine with a GPU, nvcc and nvidia-cutlass:

    python3 benchmarks/gpu_cutlass.py [--candidates 8] [--sizes 4096 8192] [--json out.json]

It reports, in one run: the first call of the default f16 kernel (emit, compile, load) and the
wall time to build the other candidates (in parallel nvcc processes), into a fresh cache
unless ``--cache-dir`` is given; the time a second Python process takes to
load the default kernel from that cache (it must compile nothing); calls per second of a 64^3
f16 GEMM through the backend beside cupy.matmul and torch.matmul; and TFLOP/s at each size
for f16 and bf16, the default candidate and the best, with the ratio to cuBLAS (torch.matmul),
timed by multibackend.gpu.timing (CUDA events, warm-up, L2 flushed, median of many runs) on random
non-zero data: each candidate's runs alternate with cuBLAS's, and its ratio is to the cuBLAS
runs beside it (the cuBLAS column is the median over those pairings). Every compiled 3.x kernel is also timed with the tile scheduler's runtime
variants (CTA swizzle 1/2/4/8, raster order heuristic / along m / along n), which need no
build; ``--variants`` limits them to the best few kernels of the first size.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: tried after the default, in the caller's terms (rows x cols x K of the CTA tile, cluster)
PREFERRED = ["256x128x64_1x2x1_cooperative_tma", "128x256x64_2x1x1_cooperative_tma_streamk",
             "256x128x64_1x2x1_cooperative_tma_streamk", "128x256x64_2x2x1_cooperative_tma",
             "256x128x64_2x2x1_cooperative_tma", "128x256x64_4x1x1_cooperative_tma",
             "256x128x64_1x4x1_cooperative_tma", "128x256x64_1x2x1_cooperative_tma",
             "128x128x64_2x1x1_pingpong_tma", "256x64x64_1x2x1_pingpong_tma"]

SECOND_PROCESS = r"""
import json, sys, time
t0 = time.perf_counter()
from multibackend.backends.cutlass import backend as cutlass
from multibackend.backends.cutlass import build as cutlass_build
from multibackend.backends.cutlass import emit as cutlass_emit
from multibackend.core.problem import synthetic
t1 = time.perf_counter()
backend = cutlass.create()
problem = synthetic(8192, 8192, 8192, "float16", cc=tuple(json.loads(sys.argv[1])))
config = backend.default_config(problem)
candidate = cutlass.candidate_for(problem, config)
key = cutlass_build.artifact_key(cutlass_emit.emit(candidate), candidate.arch)
cached = cutlass_build.cached_library(key) is not None
t2 = time.perf_counter()
backend.prepare(problem, config)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "prepare_s": t3 - t2, "was_cached": cached}))
"""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--candidates", type=int, default=8,
                   help="kernels per dtype, the default included (default 8)")
    p.add_argument("--variants", type=int, default=None,
                   help="time the scheduler variants of only this many kernels per dtype, the "
                        "fastest at the first size (default: every compiled 3.x kernel)")
    p.add_argument("--workers", type=int, default=None, help="parallel nvcc processes")
    p.add_argument("--cache-dir", default=None,
                   help="kernel cache to use (default: a fresh temporary directory)")
    p.add_argument("--runs", type=int, default=30, help="timed runs per measurement")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def pick_configs(backend, problem, count: int):
    configs = backend.configs(problem)
    by_name = {c.name: c for c in configs}
    chosen = [configs[0]]
    for name in PREFERRED:
        if len(chosen) >= count:
            break
        if name in by_name and by_name[name] not in chosen:
            chosen.append(by_name[name])
    for config in configs:
        if len(chosen) >= count:
            break
        if config not in chosen:
            chosen.append(config)
    return chosen


def main() -> int:
    args = parse()
    sys.path.insert(0, str(ROOT))
    import torch

    from multibackend.backends.cutlass import backend as cutlass
    from multibackend.backends.cutlass import build as cutlass_build
    from multibackend.backends.cutlass import emit as cutlass_emit
    from multibackend.core.config import Operands
    from multibackend.core.problem import synthetic
    from multibackend.gpu.timing import host_calls_per_second, time_interleaved

    try:
        import cupy
    except ImportError:
        cupy = None
    backend = cutlass.create()
    reason = backend.available()
    if reason is not None:
        print(f"CUTLASS backend unavailable: {reason}")
        return 1
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="mb-cutlass-bench-")
    os.environ["MULTIBACKEND_CACHE_DIR"] = cache_dir
    cc = torch.cuda.get_device_capability()
    results: dict = {"device": torch.cuda.get_device_name(), "versions": backend.versions(),
                     "cache_dir": cache_dir}
    print(f"device {results['device']} sm_{cc[0]}{cc[1]}; {backend.versions()}; cache {cache_dir}")

    # 1. build every candidate at once
    plan = {}
    for dtype in ("float16", "bfloat16"):
        problem = synthetic(max(args.sizes), max(args.sizes), max(args.sizes), dtype, cc=cc)
        plan[dtype] = (problem, pick_configs(backend, problem, args.candidates))
    jobs, labels = [], []
    for dtype, (problem, configs) in plan.items():
        for config in configs:
            cand = cutlass.candidate_for(problem, config)
            jobs.append((cutlass_emit.emit(cand), cand.arch, cand.name))
            labels.append((dtype, config.name))
    f16_problem, f16_configs = plan["float16"]
    t0 = time.perf_counter()
    backend.prepare(f16_problem, f16_configs[0])
    first_s = time.perf_counter() - t0
    print(f"\nfirst call of the default f16 kernel (emit, nvcc, load): {first_s:.1f} s")
    t0 = time.perf_counter()
    built = cutlass_build.build_many(jobs, args.workers)
    build_s = time.perf_counter() - t0
    failures = [(label, r) for label, r in zip(labels, built) if isinstance(r, Exception)]
    results["build"] = {"first_call_s": first_s, "kernels": len(jobs), "wall_s": build_s,
                        "failed": len(failures),
                        "workers": args.workers or cutlass_build.default_workers()}
    print(f"built the other {len(jobs) - 1 - len(failures)}/{len(jobs) - 1} candidates in "
          f"{build_s:.1f} s ({results['build']['workers']} parallel nvcc)")
    for (dtype, name), exc in failures:
        print(f"  FAILED {dtype} {name}: {str(exc)[:2000]}")

    # 2. a second process loads from the cache
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SECOND_PROCESS, json.dumps(list(cc))],
                          capture_output=True, text=True, cwd=tempfile.gettempdir(),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    total = time.perf_counter() - t0
    if proc.returncode == 0:
        second = json.loads(proc.stdout.strip().splitlines()[-1])
        second["process_s"] = total
        print(f"second process: whole run {total:.2f} s, imports {second['import_s']:.2f} s, "
              f"prepare (load from cache) {second['prepare_s'] * 1e3:.1f} ms, "
              f"found in cache: {second['was_cached']}")
    else:
        second = {"error": proc.stderr[-3000:]}
        print(f"second process failed:\n{proc.stderr[-3000:]}")
    results["second_process"] = second

    # 3. launch cost: calls per second of a 64^3 f16 GEMM
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((1, 64, 64), device="cuda", generator=gen).half() + 0.1
    b = torch.rand((1, 64, 64), device="cuda", generator=gen).half() + 0.1
    d = torch.empty((1, 64, 64), device="cuda", dtype=torch.float16)
    small = synthetic(64, 64, 64, "float16", cc=cc)
    config = backend.default_config(small)
    backend.prepare(small, config)
    ops = Operands(a, b, None, d, 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
    sync = torch.cuda.synchronize
    rates = {"cutlass": host_calls_per_second(lambda: backend.run(small, ops, config), sync=sync),
             "torch.matmul": host_calls_per_second(lambda: torch.matmul(a, b, out=d), sync=sync)}
    if cupy is not None:
        ca, cb = cupy.from_dlpack(a[0]), cupy.from_dlpack(b[0])
        rates["cupy.matmul"] = host_calls_per_second(lambda: cupy.matmul(ca, cb), sync=sync)
    results["calls_per_s_64"] = rates
    print("\n64^3 f16 calls per second (host time per call):")
    for name, rate in rates.items():
        print(f"  {name:14s} {rate:10.0f}/s  {1e6 / rate:6.1f} us")

    # 4. speed against cuBLAS
    print(f"\n{'dtype':9s} {'size':>5s} {'cuBLAS':>8s} {'default':>8s} {'ratio':>6s} "
          f"{'best':>8s} {'ratio':>6s}  best config")
    rows = []
    fastest: dict[str, list[str]] = {}  # kernels by speed at the first size, per dtype
    for dtype, (_, configs) in plan.items():
        tdtype = getattr(torch, dtype)
        ok = [c for c in configs if (dtype, c.name) not in dict(failures)]
        for size in args.sizes:
            a = (torch.randn((1, size, size), device="cuda", generator=gen) * 0.5).to(tdtype)
            b = (torch.randn((1, size, size), device="cuda", generator=gen) * 0.5).to(tdtype)
            d = torch.empty((1, size, size), device="cuda", dtype=tdtype)
            flops = 2.0 * size ** 3
            ref = torch.matmul(a, b).float()
            problem = synthetic(size, size, size, dtype, cc=cc)
            ops = Operands(a, b, None, d, 1.0, 0.0, torch.cuda.current_stream().cuda_stream)
            variant_of = ok
            if args.variants is not None and dtype in fastest:
                variant_of = [c for c in ok if c.name in fastest[dtype][:args.variants]]
            variants = [v for c in variant_of for v in backend.variants(problem, c)]
            timings, cublas = {}, {}  # ms of each candidate, and of cuBLAS beside it
            for config in ok + variants:
                try:
                    backend.prepare(problem, config)
                    d.fill_(float("nan"))
                    backend.run(problem, ops, config)
                    torch.cuda.synchronize()
                    err = ((d.float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        print(f"  {config.name}: wrong result (relative error {err:.3g})")
                        continue
                    pair = time_interleaved(  # runs alternating with cuBLAS's
                        {"cublas": lambda: torch.matmul(a, b, out=d),
                         "cutlass": lambda: backend.run(problem, ops, config)}, reps=args.runs)
                    timings[config.name] = pair["cutlass"].median_ms
                    cublas[config.name] = pair["cublas"].median_ms
                except Exception as exc:  # report and go on with the other candidates
                    print(f"  {config.name}: {type(exc).__name__}: {str(exc)[:300]}")
            if not timings:
                continue
            kernels = sorted((ms, n) for n, ms in timings.items() if n in {c.name for c in ok})
            fastest.setdefault(dtype, [n for _, n in kernels])
            ratio = {k: cublas[k] / ms for k, ms in timings.items()}
            default = configs[0].name
            best = max(ratio, key=ratio.get)
            row = {"dtype": dtype, "size": size,
                   "cublas_tflops": flops / statistics.median(cublas.values()) / 1e9,
                   "default_tflops": flops / timings.get(default, float("nan")) / 1e9,
                   "default_ratio": ratio.get(default, float("nan")),
                   "best_tflops": flops / timings[best] / 1e9, "best": best,
                   "best_ratio": ratio[best], "default": default,
                   "all_tflops": {k: flops / v / 1e9 for k, v in timings.items()},
                   "all_ratios": ratio}
            rows.append(row)
            print(f"{dtype:9s} {size:5d} {row['cublas_tflops']:8.1f} {row['default_tflops']:8.1f} "
                  f"{row['default_ratio']:6.3f} {row['best_tflops']:8.1f} {row['best_ratio']:6.3f}"
                  f"  {best}")
    results["speed"] = rows
    print("\nall candidates (TFLOP/s):")
    for row in rows:
        listing = ", ".join(f"{k} {v:.0f}" for k, v in sorted(
            row["all_tflops"].items(), key=lambda kv: -kv[1]))
        print(f"  {row['dtype']} {row['size']}: {listing}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
