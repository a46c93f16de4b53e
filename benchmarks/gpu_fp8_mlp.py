"""A Llama-shaped MLP block in fp8 through multibackend against the same block in torch
bfloat16, same run.

Run from the repository root on a machine with an fp8 GPU (sm_89 or later):

    python3 benchmarks/gpu_fp8_mlp.py [--tokens 1 16 64 512 4096 8192] [--fp8 row block] \\
        [--modes graph eager] [--reps 30] [--json out.json]

The block is Llama-3-8B's MLP: hidden 4096, intermediate 14336, ``down(silu(gate(x)) *
up(x))``, no biases, random weights (seeded, std 0.02), bfloat16. Each fp8 model is a copy
with :func:`multibackend.patch` (``fp8="row"``: inputs per token, weights per channel;
``"block"``: 1x128 and 128x128 blocks), its weights quantized once before timing. For each
token count, under ``torch.no_grad()``:

- error: ``||y - y_ref|| / ||y_ref||`` (Frobenius, float64) of torch bfloat16 and of each fp8
  model, ``y_ref`` the block in float32 from the same weights (TF32 off);
- time, calls alternated (:func:`multibackend.gpu.timing.time_interleaved`) in graph mode
  (each model's forward captured once and replayed) and eager mode (back-to-back forwards,
  host included): ``x_bf16`` = torch bfloat16's median / the model's.

Rows: ``{tokens, mode, model, ms, bf16_ms, x_bf16, error}``, ``model`` "bf16" for torch
itself.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN, INTERMEDIATE = 4096, 14336


class MLP(torch.nn.Module):
    """Llama's gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down = torch.nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64, 512, 4096, 8192])
    p.add_argument("--fp8", nargs="+", default=["row", "block"])
    p.add_argument("--modes", nargs="+", default=["graph", "eager"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json")
    args = p.parse_args()

    import multibackend as mb
    from multibackend.gpu.timing import check_mode, time_interleaved

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    reference = MLP().cuda()
    for weight in reference.parameters():
        torch.nn.init.normal_(weight, std=0.02)
    models = {"bf16": copy.deepcopy(reference).bfloat16()}
    for kind in args.fp8:
        models[f"fp8_{kind}"] = mb.patch(copy.deepcopy(models["bf16"]), fp8=kind)
    device = torch.cuda.get_device_name()
    print(f"{device}: Llama MLP {HIDDEN} -> {INTERMEDIATE}, models {list(models)}", flush=True)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for tokens in args.tokens:
            x = torch.randn(tokens, HIDDEN, generator=gen, device="cuda")
            ref = reference(x)
            xb = x.bfloat16()
            errors = {name: _error(model(xb), ref) for name, model in models.items()}
            calls = {name: (lambda model=model, xb=xb: model(xb)) for name, model in models.items()}
            for mode in map(check_mode, args.modes):
                timed = time_interleaved(calls, mode=mode, reps=args.reps, max_seconds=20)
                base = timed["bf16"].median_ms
                line = []
                for name, t in timed.items():
                    rows.append({"tokens": tokens, "mode": mode, "model": name,
                                 "ms": t.median_ms, "bf16_ms": base,
                                 "x_bf16": base / t.median_ms, "error": errors[name]})
                    line.append(f"{name} {t.median_ms * 1e3:8.1f} us x{base / t.median_ms:.3f}"
                                f" err {errors[name]:.2e}")
                print(f"{mode:5s} {tokens:5d} tokens  " + "  ".join(line), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
