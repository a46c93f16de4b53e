"""Scaled fp8 products on every backend against ``torch._scaled_mm`` with the same scales,
same run.

Run from the repository root on a machine with an fp8 GPU (sm_89 or later):

    python3 benchmarks/gpu_fp8.py [--reps 50] [--modes graph eager] [--json out.json]

For each granularity ("tensor", "row": A per token and B per channel, "block": A 1x128 and B
128x128) and shape, e4m3 A (row-major) and B (column-major) are quantized from float32 data by
:func:`multibackend.quantize`; D is bfloat16. The calls are ``matmul(A, B, scale_a=...,
scale_b=..., backend=name)`` for ``auto`` and each backend that takes the scales (a backend
that refuses them is None and left out, with its reason printed), beside
``torch._scaled_mm`` with the same scales where torch has that granularity (tensor- and
row-wise; block-wise rows have ``torch_ms`` null). They are timed with their runs alternated
(:func:`multibackend.gpu.timing.time_interleaved`) in graph mode (captured once, replayed) and,
if asked, eager mode (back-to-back calls, host included). Each result is checked against
``torch._scaled_mm``'s (or, block-wise, against the float32 product of the dequantized
operands) before it is timed. Rows: ``{granularity, mode, m, n, k, backend, ms, torch_ms,
tflops}``, ``torch_ms`` from the same rounds.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ((8192, 8192, 8192), (8192, 28672, 8192), (4096, 4096, 4096), (2048, 8192, 4096),
          (4096, 7168, 16384), (16, 14336, 4096), (64, 14336, 4096))
GRANULARITIES = ("tensor", "row", "block")
BACKENDS = ("auto", "cublas", "triton", "cutlass", "raw_wmma")


def _operands(m: int, n: int, k: int, granularity: str):
    import torch

    import multibackend as mb

    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen, device="cuda")
    w = torch.randn(n, k, generator=gen, device="cuda")
    qa, sa = mb.quantize(x, granularity, operand="A")
    qb, sb = mb.quantize(w.T, granularity, operand="B")
    return qa, qb.T.contiguous().T, sa, sb


def _torch_call(qa, qb, sa, sb, granularity: str):
    """``torch._scaled_mm`` with these scales, or None where torch has no such mode."""
    import torch

    if granularity == "block":
        return None
    if granularity == "row":
        sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
    return lambda: torch._scaled_mm(qa, qb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def _backend_call(name: str, qa, qb, sa, sb):
    """``matmul`` on backend ``name`` with the scales, or None (its reason printed) where the
    backend does not take them here."""
    import multibackend as mb

    decision = mb.explain(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16", backend=name)
    if decision.backend is None:
        print(f"  {name}: {decision.detail}", flush=True)
        return None
    return lambda: mb.matmul(qa, qb, scale_a=sa, scale_b=sb, out_dtype="bfloat16",
                             backend=name)


def _check(name: str, got, expected) -> None:
    error = float((got.float() - expected.float()).norm() / expected.float().norm())
    if error > 1e-2:
        raise SystemExit(f"{name}: relative error {error:.3g} against the reference")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--modes", nargs="+", default=["graph"], choices=["graph", "eager"])
    p.add_argument("--granularities", nargs="+", default=list(GRANULARITIES),
                   choices=GRANULARITIES)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()

    import torch

    from multibackend.core import scales
    from multibackend.gpu.timing import time_interleaved

    rows = []
    for granularity in args.granularities:
        for m, n, k in SHAPES:
            qa, qb, sa, sb = _operands(m, n, k, granularity)
            print(f"{granularity} {m}x{n}x{k}", flush=True)
            calls = {name: _backend_call(name, qa, qb, sa, sb) for name in BACKENDS}
            calls = {name: fn for name, fn in calls.items() if fn is not None}
            torch_call = _torch_call(qa, qb, sa, sb, granularity)
            if torch_call is not None:
                expected = torch_call()
                calls["torch"] = torch_call
            else:
                expected = ((qa.float() * scales.expanded(sa, granularity, "A", m, k))
                            @ (qb.float() * scales.expanded(sb, granularity, "B", k, n)))
            for name, fn in calls.items():
                _check(name, fn(), expected)
            for mode in args.modes:
                timed = time_interleaved(calls, mode=mode, reps=args.reps)
                base = timed["torch"].median_ms if "torch" in timed else None
                for name, t in timed.items():
                    if name == "torch":
                        continue
                    row = {"granularity": granularity, "mode": mode, "m": m, "n": n, "k": k,
                           "backend": name, "ms": t.median_ms, "torch_ms": base,
                           "tflops": 2 * m * n * k / (t.median_ms * 1e-3) / 1e12}
                    rows.append(row)
                    ratio = f"{base / t.median_ms:6.3f}x torch" if base else "(no torch mode)"
                    print(f"  {mode:5s} {name:9s} {t.median_ms * 1e3:10.1f} us "
                          f"{row['tflops']:7.0f} TFLOP/s  {ratio}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
