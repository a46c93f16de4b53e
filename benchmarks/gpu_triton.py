"""Triton backend against cuBLAS on one GPU, same run: every GEMM tile at 4096^3 and 8192^3
for f16 and bf16 (TFLOP/s and ratio to cuBLAS), and the f16 dot at n = 2^28 against the
device-to-device copy bandwidth. Random non-zero data; CUDA events, warm-up, median; each
tile's runs interleaved with cuBLAS's (the cuBLAS row is the median over those pairings).

    python benchmarks/gpu_triton.py [--sizes 4096 8192] [--configs NAME ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.gpu.timing import time_gpu, time_interleaved
from multibackend.io.request import dot_call, matmul_call


def gemm_rows(size: int, dtype: torch.dtype, only: list[str] | None = None) -> list[dict]:
    a = (torch.rand((size, size), device="cuda") * 2 - 1).to(dtype)
    b = (torch.rand((size, size), device="cuda") * 2 - 1).to(dtype)
    d = torch.empty((size, size), device="cuda", dtype=dtype)
    flops = 2 * size ** 3
    head = {"shape": f"{size}^3", "dtype": str(dtype)[6:]}

    def cublas() -> None:
        torch.matmul(a, b, out=d)
    rows, cublas_ms = [], []
    call = matmul_call(a, b)
    triton = REGISTRY.get("triton")
    for config in triton.configs(call.problem):
        if only and config.name not in only:
            continue

        def run(config=config):
            mb.matmul(a, b, out=d, backend="triton", config=config)
        try:  # each tile timed against cuBLAS, their runs interleaved
            pair = time_interleaved({"cublas": cublas, "triton": run}, reps=30)
        except Exception as exc:
            rows.append({**head, "backend": "triton", "config": config.name,
                         "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        t, base = pair["triton"], pair["cublas"]
        cublas_ms.append(base.median_ms)
        rows.append({**head, "backend": "triton", "config": config.name, "ms": t.median_ms,
                     "tflops": t.tflops(flops), "cublas_ms": base.median_ms,
                     "ratio": base.median_ms / t.median_ms})
    if cublas_ms:
        ms = statistics.median(cublas_ms)
        rows.insert(0, {**head, "backend": "cublas", "config": "torch.matmul", "ms": ms,
                        "tflops": flops / (ms * 1e-3) / 1e12, "ratio": 1.0})
    return rows


def dot_rows(n: int) -> list[dict]:
    x = (torch.rand((n,), device="cuda") * 2 - 1).half()
    y = (torch.rand((n,), device="cuda") * 2 - 1).half()
    src = torch.rand((n * 2,), device="cuda").half()
    dst = torch.empty_like(src)
    copy = time_gpu(lambda: dst.copy_(src), reps=30)
    copy_bw = copy.gbps(2 * src.numel() * 2)  # bytes read + bytes written
    rows = [{"shape": f"copy {2 * n * 2 / 2**30:.1f} GiB", "dtype": "float16", "backend": "copy",
             "config": "torch copy_", "ms": copy.median_ms, "gbps": copy_bw, "ratio": 1.0}]
    call = dot_call(x, y)
    for name in ("triton", "raw_wmma"):
        if REGISTRY.availability(name) or REGISTRY.get(name).supports(call.problem):
            continue
        t = time_gpu(lambda name=name: mb.dot(x, y, backend=name), reps=30)
        bw = t.gbps(call.problem.bytes_moved)
        rows.append({"shape": f"dot n=2^{n.bit_length() - 1}", "dtype": "float16",
                     "backend": name, "config": "", "ms": t.median_ms, "gbps": bw,
                     "ratio": bw / copy_bw})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--configs", nargs="*", help="only these Triton configs")
    parser.add_argument("--json")
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}")
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for size in args.sizes:
            rows += gemm_rows(size, dtype, args.configs)
    rows += dot_rows(1 << 28)
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:<14} {r['dtype']:<9} {r['backend']:<8} {r['config']:<22} "
                  f"ERROR {r['error']}")
            continue
        rate = f"{r['tflops']:8.1f} TFLOP/s" if "tflops" in r else f"{r['gbps']:8.1f} GB/s   "
        what = "x cuBLAS" if "tflops" in r else "x copy"
        print(f"{r['shape']:<14} {r['dtype']:<9} {r['backend']:<8} {r['config']:<22} "
              f"{r['ms']:9.4f} ms {rate} {r['ratio']:6.3f} {what}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
