"""Host time per repeated call of a small GEMM through every backend, for torch and CuPy
callers, beside the call each would make instead (torch.matmul, cupy.matmul); and a large
dot's rate beside torch.dot's.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_host_overhead.py [--size 64] [--dtype float16] [--json out.json]

For a problem this small every path is bound by the host, so calls per second measure the
host's cost of one call (:func:`multibackend.gpu.timing.host_calls_per_second`, GPU work queued,
the device synchronized at the end). The paths are measured in ``--rounds`` rounds, their
order rotating, and each figure is the median over the rounds (the host's speed drifts: many
short rounds rather than a few long ones, so a slow stretch of the host counts once).
Every call is the public one as a user writes it; ``autotune='eager'`` is first-call
autotuning's plan, made before the timing. The calls writing into a given ``out`` (each
backend's, beside the caller's own library call with ``out``) are timed as well, and once more
spelling out ``alpha=1.0``: the same plan, run by the Python path (the compiled front leaves
calls with any other keyword to it). The dot (n = ``--dot-n``) is measured
the same way for both callers beside torch.dot and cupy.dot, and timed in eager mode
(back-to-back calls, host included) against torch.dot, alternated.
``--profile`` prints where ``matmul(backend="auto")`` spends its host time, with and without
``out`` (cProfile).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--seconds", type=float, default=0.1, help="per path and round")
    p.add_argument("--dot-n", type=int, default=1 << 20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args()


def _paths(a, b, kind: str) -> dict:
    """Every call of one array kind, without and with a given ``out``: the library's own,
    then multibackend's per backend (and ``auto`` with ``out``)."""
    import multibackend as mb
    from multibackend.choose.registry import REGISTRY

    lib = _library(kind)
    paths = {f"{kind}.matmul": lambda: lib.matmul(a, b)}
    paths |= _per_backend(REGISTRY.names, "matmul(backend={!r})",
                          lambda name: (lambda: mb.matmul(a, b, backend=name)))
    decision = mb.explain(a, b)
    paths[f"matmul(auto) -> {decision.backend} by {decision.rule}"] = lambda: mb.matmul(a, b)
    mb.matmul(a, b, autotune="eager")
    chosen = mb.explain(a, b, autotune="eager").backend
    paths[f"matmul(autotune='eager') -> {chosen}"] = lambda: mb.matmul(a, b, autotune="eager")
    out = mb.matmul(a, b)
    paths[f"{kind}.matmul(out=)"] = lambda: lib.matmul(a, b, out=out)
    paths |= _per_backend((*REGISTRY.names, "auto"), "matmul(backend={!r}, out=)",
                          lambda name: (lambda: mb.matmul(a, b, out=out, backend=name)))
    paths |= _per_backend((*REGISTRY.names, "auto"), "matmul(backend={!r}, out=, alpha=1.0)",
                          lambda name: (lambda: mb.matmul(a, b, out=out, backend=name,
                                                          alpha=1.0)))
    return paths


def _library(kind: str):
    """The module whose own call a caller of this array kind makes instead."""
    if kind == "torch":
        import torch

        return torch
    import cupy

    return cupy


def _per_backend(names, label: str, call_on) -> dict:
    """``call_on(name)`` (a call of no arguments) for each backend name that runs it, keyed
    by ``label`` formatted with the name."""
    import multibackend as mb

    paths = {}
    for name in names:
        call = call_on(name)
        try:
            call()
        except mb.MultibackendError:
            continue
        paths[label.format(name)] = call
    return paths


def _dot_paths(x, y, kind: str) -> dict:
    """Every dot of one array kind: the library's own, then multibackend's per backend."""
    import multibackend as mb

    lib = _library(kind)
    return {f"{kind}.dot": lambda: lib.dot(x, y)} | _per_backend(
        ("auto", "triton", "raw_wmma"), "dot(backend={!r})",
        lambda name: (lambda: mb.dot(x, y, backend=name)))


def _host_rows(paths: dict, rounds: int, seconds: float, sync) -> list[dict]:
    """Host µs per call of each path (keyed (caller, name)): the median over ``rounds``
    rounds, the paths' order rotating, with the spread between rounds."""
    from multibackend.gpu.timing import host_calls_per_second, rotations

    samples: dict = {key: [] for key in paths}
    for order in rotations(list(paths), rounds):
        for key in order:
            samples[key].append(1e6 / host_calls_per_second(paths[key], seconds=seconds,
                                                            sync=sync))
    rows = []
    for (kind, name), values in samples.items():
        us = statistics.median(values)
        rows.append({"caller": kind, "path": name, "host_us": us,
                     "spread_us": max(values) - min(values)})
        print(f"{kind:6s} {name:60s} {us:8.1f}  (spread {max(values) - min(values):.1f})")
    return rows


def main() -> int:
    args = parse()
    import torch

    import multibackend as mb
    from multibackend.core import dtypes
    from multibackend.gpu.timing import time_interleaved

    size, sync = args.size, torch.cuda.synchronize
    gen = torch.Generator(device="cuda").manual_seed(0)
    tdtype = dtypes.torch_dtype(args.dtype)
    a = (torch.rand((size, size), generator=gen, device="cuda") * 2 - 1).to(tdtype)
    b = (torch.rand((size, size), generator=gen, device="cuda") * 2 - 1).to(tdtype)
    kinds = {"torch": (a, b)}
    try:
        import cupy

        kinds["cupy"] = (cupy.from_dlpack(a), cupy.from_dlpack(b))
    except ImportError:
        pass
    paths = {(kind, name): fn for kind, (x, y) in kinds.items()
             for name, fn in _paths(x, y, kind).items()}
    device = torch.cuda.get_device_name()
    print(f"{size}^3 {args.dtype} on {device}: host us per repeated call, median of "
          f"{args.rounds} rounds")
    rows = _host_rows(paths, args.rounds, args.seconds, sync)
    x = (torch.rand(args.dot_n, generator=gen, device="cuda") * 2 - 1).to(tdtype)
    y = (torch.rand(args.dot_n, generator=gen, device="cuda") * 2 - 1).to(tdtype)
    vectors = {"torch": (x, y)}
    if "cupy" in kinds:
        vectors["cupy"] = (cupy.from_dlpack(x), cupy.from_dlpack(y))
    dot_paths = {(kind, name): fn for kind, (u, v) in vectors.items()
                 for name, fn in _dot_paths(u, v, kind).items()}
    print(f"dot n={args.dot_n} {args.dtype}: host us per repeated call, median of "
          f"{args.rounds} rounds")
    dot_host = _host_rows(dot_paths, args.rounds, args.seconds, sync)
    dots = {name: fn for (kind, name), fn in dot_paths.items() if kind == "torch"}
    timed = time_interleaved(dots, mode="eager", reps=30)
    nbytes = 2 * args.dot_n * x.element_size()
    dot_rows = []
    print(f"dot n={args.dot_n} {args.dtype}, eager:")
    for name, t in timed.items():
        dot_rows.append({"path": name, "mode": "eager", "ms": t.median_ms,
                         "gbps": t.gbps(nbytes)})
        print(f"  {name:30s} {t.median_ms * 1e3:8.1f} us  {t.gbps(nbytes):8.1f} GB/s")
    if args.profile:
        out = torch.empty_like(a)
        for title, call in (("matmul(A, B)", lambda: mb.matmul(a, b)),
                            ("matmul(A, B, out=D)", lambda: mb.matmul(a, b, out=out))):
            print(f"profile of {title}:")
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(5000):
                call()
            profile.disable()
            sync()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "dtype": args.dtype,
                                               "device": device, "rows": rows,
                                               "dot": dot_rows, "dot_host": dot_host},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
