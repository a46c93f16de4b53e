"""The cuBLAS fp8 route against ``torch._scaled_mm`` called directly, same run.

Run from the repository root on a machine with an fp8 GPU (sm_89 or later):

    python3 benchmarks/gpu_fp8_cublas.py [--reps 50] [--json out.json]

For each shape (e4m3 operands holding small integers, B column-major, D bfloat16, unit
scales), ``matmul(A, B, out_dtype="bfloat16", backend="cublas")`` and the same product as
``torch._scaled_mm`` are timed with their runs alternated
(:func:`multibackend.gpu.timing.time_interleaved`), in eager mode (back-to-back calls, host
included) and graph mode (captured, replayed). The ratio is torch's time over ours from runs
paired round by round (:func:`multibackend.gpu.timing.paired_ratio`): above 1, ours is faster.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ((64, 64, 64), (16, 8192, 8192), (2048, 8192, 4096), (4096, 4096, 4096),
          (8192, 8192, 8192))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()

    import torch

    import multibackend as mb
    from multibackend.gpu.timing import paired_ratio, time_interleaved

    one = torch.ones((), dtype=torch.float32, device="cuda")
    rows = []
    for m, n, k in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randint(-3, 4, (m, k), generator=gen, device="cuda").float()
        b = torch.randint(-3, 4, (n, k), generator=gen, device="cuda").float()
        a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).T
        calls = {
            "ours": lambda a=a, b=b: mb.matmul(a, b, out_dtype="bfloat16", backend="cublas"),
            "torch": lambda a=a, b=b: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16)}
        assert torch.equal(calls["ours"](), calls["torch"]())
        for mode in ("eager", "graph"):
            timed = time_interleaved(calls, mode=mode, reps=args.reps)
            row = {"m": m, "n": n, "k": k, "mode": mode, "ms": timed["ours"].median_ms,
                   "torch_ms": timed["torch"].median_ms,
                   "paired": paired_ratio(timed["torch"], timed["ours"])}
            rows.append(row)
            print(f"{m}x{n}x{k} {mode:5s} ours {row['ms'] * 1e3:9.1f} us  torch "
                  f"{row['torch_ms'] * 1e3:9.1f} us  torch/ours paired {row['paired']:.3f}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
