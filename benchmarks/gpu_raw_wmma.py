"""Raw WMMA backend against cuBLAS on one GPU, same run: every f16 / bf16 GEMM config at 4096^3
and 8192^3 (checked against float64 first; TFLOP/s and ratio to cuBLAS), and the dot at
n = 2^28 against a device-to-device copy (GB/s and ratio to the copy's bandwidth). Random
non-zero data; CUDA events, warm-up, median of many runs (multibackend.gpu.timing).

    python benchmarks/gpu_raw_wmma.py [--sizes 4096 8192] [--json out.json]

Bars: the best fast config >= 0.50x cuBLAS at 8192^3 f16; the f16 dot >= 0.85x the copy.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import multibackend as mb
from multibackend.choose.registry import REGISTRY
from multibackend.gpu.timing import time_gpu
from multibackend.io.request import dot_call, matmul_call
from multibackend.verify import reference

BACKEND = "raw_wmma"


def _rand(shape, dtype):
    return (torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1).to(dtype)


def gemm_rows(size: int, dtype: torch.dtype, generic: bool) -> list[dict]:
    name = str(dtype).removeprefix("torch.")
    a, b = _rand((size, size), dtype), _rand((size, size), dtype)
    d = torch.empty((size, size), device="cuda", dtype=dtype)
    flops = 2 * size ** 3
    base = time_gpu(lambda: torch.matmul(a, b, out=d), reps=30)
    rows = [{"case": f"gemm {size}^3", "dtype": name, "backend": "cublas",
             "config": "torch.matmul", "ms": base.median_ms, "rate": base.tflops(flops),
             "unit": "TFLOP/s", "ratio": 1.0}]
    call = matmul_call(a, b)
    ref = reference.reference_matmul(a, b)
    for config in REGISTRY.get(BACKEND).configs(call.problem):
        if not generic and not config.name.startswith("fast_"):
            continue
        row = {"case": f"gemm {size}^3", "dtype": name, "backend": BACKEND,
               "config": config.name, "unit": "TFLOP/s"}
        try:
            d.fill_(float("nan"))
            mb.matmul(a, b, out=d, backend=BACKEND, config=config)
            cmp = reference.compare(call.problem, d, ref)
            t = time_gpu(lambda config=config: mb.matmul(a, b, out=d, backend=BACKEND,
                                                         config=config), reps=30)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            rows.append({**row, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        rows.append({**row, "ms": t.median_ms, "rate": t.tflops(flops),
                     "ratio": base.median_ms / t.median_ms, "ok": cmp.ok,
                     "rel_err": cmp.rel_err})
    return rows


def dot_rows(n: int) -> list[dict]:
    rows = []
    src = _rand((2 * n,), torch.float16)
    dst = torch.empty_like(src)
    copy = time_gpu(lambda: dst.copy_(src), reps=30)
    copy_bw = copy.gbps(2 * src.numel() * src.element_size())  # bytes read + written
    rows.append({"case": f"copy {2 * n * 2 / 2**30:.1f} GiB", "dtype": "float16",
                 "backend": "copy", "config": "torch copy_", "ms": copy.median_ms,
                 "rate": copy_bw, "unit": "GB/s", "ratio": 1.0})
    del src, dst
    for dtype in (torch.float16, torch.bfloat16):
        x, y = _rand((n,), dtype), _rand((n,), dtype)
        call = dot_call(x, y)
        ref = reference.reference_dot(x, y)
        for config in REGISTRY.get(BACKEND).configs(call.problem):
            got = mb.dot(x, y, backend=BACKEND, config=config).reshape(1)
            cmp = reference.compare(call.problem, got, ref)
            t = time_gpu(lambda config=config: mb.dot(x, y, backend=BACKEND, config=config),
                         reps=30)
            bw = t.gbps(call.problem.bytes_moved)
            rows.append({"case": f"dot n=2^{n.bit_length() - 1}",
                         "dtype": str(dtype).removeprefix("torch."), "backend": BACKEND,
                         "config": config.name, "ms": t.median_ms, "rate": bw, "unit": "GB/s",
                         "ratio": bw / copy_bw, "ok": cmp.ok, "rel_err": cmp.rel_err})
        del x, y
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<16}{'dtype':<10}{'backend':<10}{'config':<22}{'ms':>10}{'rate':>11}"
          f"{'unit':>9}{'ratio':>8}  check")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:<16}{r['dtype']:<10}{r['backend']:<10}{r['config']:<22}  "
                  f"ERROR {r['error']}")
            continue
        check = "" if "ok" not in r else ("ok" if r["ok"] else "WRONG") + \
            f" (rel err {r['rel_err']:.1e})"
        print(f"{r['case']:<16}{r['dtype']:<10}{r['backend']:<10}{r['config']:<22}"
              f"{r['ms']:>10.3f}{r['rate']:>11.1f}{r['unit']:>9}{r['ratio']:>8.3f}  {check}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--dot-log2", type=int, default=28)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    reason = REGISTRY.availability(BACKEND)
    if reason:
        raise SystemExit(f"raw_wmma unavailable: {reason}")
    start = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name()}  backend versions: "
          f"{REGISTRY.get(BACKEND).versions()}")
    rows = []
    for size in args.sizes:
        for dtype in (torch.float16, torch.bfloat16):
            rows += gemm_rows(size, dtype, generic=size == min(args.sizes))
    rows += dot_rows(1 << args.dot_log2)
    print_table(rows)
    for dtype in ("float16", "bfloat16"):
        fast = [r for r in rows if r["dtype"] == dtype and r["backend"] == BACKEND
                and r["case"] == f"gemm {max(args.sizes)}^3" and "ratio" in r]
        if fast:
            best = max(fast, key=lambda r: r["ratio"])
            print(f"best {dtype} at {max(args.sizes)}^3: {best['config']} {best['ratio']:.3f}x "
                  "cuBLAS")
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
