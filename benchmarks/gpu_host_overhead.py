"""Host time per call of a small GEMM, by layer: the library baselines, each backend's own
``run`` and ``multibackend.matmul`` in front of it.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_host_overhead.py [--size 64] [--dtype float16] [--profile]

For a problem this small every path is bound by the host, so calls per second measure the
host's cost of one call (:func:`multibackend.timing.host_calls_per_second`, GPU work queued,
the device synchronized at the end). Beside them: the kernel's own GPU time
(:func:`multibackend.timing.time_gpu`). ``--profile`` prints where ``matmul(backend="auto")``
spends its host time (cProfile, by internal time).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", help="write the figures here")
    return p.parse_args()


def main() -> int:
    args = parse()
    import torch

    import multibackend as mb
    from multibackend import dtypes
    from multibackend.registry import REGISTRY
    from multibackend.request import matmul_call
    from multibackend.timing import host_calls_per_second, time_gpu

    size, sync = args.size, torch.cuda.synchronize
    gen = torch.Generator(device="cuda").manual_seed(0)
    tdtype = dtypes.torch_dtype(args.dtype)
    a = (torch.rand((size, size), generator=gen, device="cuda") * 2 - 1).to(tdtype)
    b = (torch.rand((size, size), generator=gen, device="cuda") * 2 - 1).to(tdtype)
    d = torch.empty((size, size), dtype=tdtype, device="cuda")
    paths = {"torch.matmul": lambda: torch.matmul(a, b, out=d)}
    try:
        import cupy

        ca, cb = cupy.asarray(a), cupy.asarray(b)
        paths["cupy.matmul"] = lambda: cupy.matmul(ca, cb)
    except ImportError:
        pass
    call = matmul_call(a, b, out=d)
    for name in REGISTRY.names:
        backend = REGISTRY.get(name)
        if backend is None or backend.supports(call.problem) is not None:
            continue
        config = mb.explain(a, b, backend=name).config
        backend.prepare(call.problem, config)
        paths[f"{name}.run [{config}]"] = (
            lambda backend=backend, config=config:
            backend.run(call.problem, call.operands, config))
        paths[f"matmul(backend={name!r})"] = lambda name=name: mb.matmul(a, b, out=d,
                                                                         backend=name)
    decision = mb.explain(a, b)
    paths[f"matmul(auto) -> {decision.backend} [{decision.config}] by {decision.rule}"] = (
        lambda: mb.matmul(a, b, out=d))
    rows = []
    print(f"{size}^3 {args.dtype} on {torch.cuda.get_device_name()}")
    print(f"{'path':70s} {'host us/call':>12s} {'GPU us':>8s}")
    for name, fn in paths.items():
        per_call = 1e6 / host_calls_per_second(fn, sync=sync)
        gpu = time_gpu(fn, flush_l2=False).median_ms * 1e3
        rows.append({"path": name, "host_us": per_call, "gpu_us": gpu})
        print(f"{name:70s} {per_call:12.1f} {gpu:8.2f}", flush=True)
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(5000):
            mb.matmul(a, b, out=d)
        profile.disable()
        sync()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "dtype": args.dtype,
                                               "device": torch.cuda.get_device_name(),
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
