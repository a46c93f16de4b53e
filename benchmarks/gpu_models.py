"""A GPT-2-small-sized model with every Linear patched by multibackend, against the same model
in torch: logits, time in eager, compiled and CUDA-graph modes, and one training step's
gradients.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_models.py --out-dir benchmarks/results/<GPU> [--backend auto]

The model is GPT-2 small's shape in pure torch (12 blocks, d = 768, 12 heads, MLP 3072,
vocabulary 50257, T = 1024, tied embedding and head), random weights (seeded), float16, one
sequence (``--batch``). The patched model is a copy with :func:`multibackend.patch` applied
(every ``torch.nn.Linear``, the tied head included, through ``multibackend.matmul`` on
``--backend``). What is measured, under ``torch.no_grad()``:

- logits: relative error ``||patched - torch|| / ||torch||`` (Frobenius, in float64) of the
  eager and of the compiled models, bound 1e-2;
- time, ``x torch`` = torch's median / the patched model's, the two runs alternated
  (:func:`multibackend.gpu.timing.time_interleaved`): ``eager`` (the eager models, back-to-back
  forwards, host included), ``compiled`` (both models through ``torch.compile(fullgraph=True)``,
  timed in eager mode), ``graph`` (the eager models captured in a CUDA graph and replayed)
  and ``compiled_graph`` (the compiled models captured and replayed); target 0.98x;
- one training step (cross-entropy on random targets, backward) in float16 and bfloat16 from
  the same weights, against the same step in float32 (torch, TF32 off) as the reference: for
  every parameter, ``err = ||grad - grad_f32|| / ||grad_f32||``. The bound: the patched
  model's error is at most twice torch's own in that dtype plus two units of its rounding
  (``2 * err_torch + 2 * eps``; eps = 2^-11 for float16, 2^-8 for bfloat16). float16's loss
  is scaled by 1024 (and its gradients unscaled in float32) so that they do not underflow.

Writes ``gpt2_small.json`` into ``--out-dir`` and prints a summary.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LOGITS_BOUND = 1e-2
TARGET_X_TORCH = 0.98
#: unit roundoff of each training dtype, and the loss scale that keeps its gradients normal
ROUNDING = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
LOSS_SCALE = {torch.float16: 1024.0, torch.bfloat16: 1.0}


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 12
    d: int = 768
    heads: int = 12
    mlp: int = 3072
    vocab: int = 50257
    positions: int = 1024


class Attention(torch.nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = torch.nn.Linear(cfg.d, 3 * cfg.d)
        self.c_proj = torch.nn.Linear(cfg.d, cfg.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.c_attn(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(cfg.d)
        self.attn = Attention(cfg)
        self.ln_2 = torch.nn.LayerNorm(cfg.d)
        self.c_fc = torch.nn.Linear(cfg.d, cfg.mlp)
        self.c_proj = torch.nn.Linear(cfg.mlp, cfg.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    """GPT-2's architecture: token and position embeddings, pre-norm blocks, final norm, and a
    head tied to the token embedding."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = torch.nn.Embedding(cfg.vocab, cfg.d)
        self.wpe = torch.nn.Embedding(cfg.positions, cfg.d)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = torch.nn.LayerNorm(cfg.d)
        self.lm_head = torch.nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build(cfg: GPTConfig, dtype: torch.dtype, device: str, seed: int = 0) -> GPT:
    """The model with random weights: N(0, 0.02) everywhere (biases included, so that a bias
    left out would show), norm scales 1 + N(0, 0.02)."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.02)
            if name.split(".")[-2].startswith("ln") and name.endswith("weight"):
                p.add_(1.0)
    return model.to(device=device, dtype=dtype)


def tokens(cfg: GPTConfig, batch: int, seq: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch, seq), generator=gen).to(device)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def gradients(model: torch.nn.Module, idx: torch.Tensor, targets: torch.Tensor,
              scale: float) -> dict[str, torch.Tensor]:
    """Every parameter's gradient (float32, unscaled) after one step on ``idx``."""
    model.zero_grad(set_to_none=True)
    logits = model(idx)
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    (loss * scale).backward()
    return {name: p.grad.float() / scale for name, p in model.named_parameters()}


def gradient_check(reference: dict, theirs: dict, ours: dict, dtype: torch.dtype) -> dict:
    """Per parameter, torch's and the patched model's errors against the float32 step and
    the bound (see the module docstring)."""
    eps = ROUNDING[dtype]
    rows = []
    for name, ref in reference.items():
        err_torch, err_mb = rel_err(theirs[name], ref), rel_err(ours[name], ref)
        limit = 2 * err_torch + 2 * eps
        rows.append({"param": name, "err_torch": err_torch, "err_multibackend": err_mb,
                     "diff_to_torch": rel_err(ours[name], theirs[name]), "bound": limit,
                     "ok": err_mb <= limit})
    worst = max(rows, key=lambda r: r["err_multibackend"] / r["bound"])
    return {"ok": all(r["ok"] for r in rows), "worst": worst, "params": rows}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", required=True)
    p.add_argument("--backend", default="auto")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    # an eager forward is host-bound, and the host's pace drifts (on the H100 machine the
    # 20th and 80th percentiles of 30 runs lay 30% apart): many interleaved runs
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=12.0, help="per timing comparison")
    return p.parse_args()


def _timed(label: str, calls: dict, mode: str, args: argparse.Namespace) -> dict:
    from multibackend.gpu.timing import time_interleaved

    t = time_interleaved(calls, mode=mode, reps=args.reps, max_seconds=args.max_seconds)
    torch_t, mb_t = t["torch"], t["multibackend"]
    row = {"mode": mode, "torch_ms": torch_t.median_ms, "multibackend_ms": mb_t.median_ms,
           "torch_p20_p80_ms": [torch_t.p20_ms, torch_t.p80_ms],
           "multibackend_p20_p80_ms": [mb_t.p20_ms, mb_t.p80_ms], "runs": mb_t.runs,
           "x_torch": torch_t.median_ms / mb_t.median_ms}
    print(f"{label:15s} ({mode:5s}) torch {torch_t.median_ms:8.3f} ms  multibackend "
          f"{mb_t.median_ms:8.3f} ms  x torch {row['x_torch']:.3f}", flush=True)
    return row


def _decisions(model: torch.nn.Module, idx: torch.Tensor) -> dict:
    """multibackend's decision for each distinct Linear product of the patched model."""
    import multibackend as mb

    seen: dict = {}

    def record(module, inputs, _output):
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        c = None if module.bias is None else module.bias.expand(x.shape[0], -1)
        decision = mb.explain(x, module.weight.mT, c, backend=module.backend)
        seen.setdefault(decision.problem.describe(), f"{decision.backend} by {decision.rule}")

    hooks = [m.register_forward_hook(record) for m in model.modules()
             if isinstance(m, mb.nn.Linear)]
    model(idx)
    for hook in hooks:
        hook.remove()
    return seen


def main() -> int:
    args = parse()
    import multibackend as mb

    start = time.monotonic()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = GPTConfig(layers=args.layers)
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    reference = build(cfg, torch.float16, device).eval()
    patched = mb.patch(copy.deepcopy(reference), backend=args.backend)
    idx = tokens(cfg, args.batch, args.seq, device, seed=1)
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "model": asdict(cfg), "batch": args.batch, "seq": args.seq,
                    "dtype": "float16", "backend": args.backend,
                    "target_x_torch": TARGET_X_TORCH, "logits_bound": LOGITS_BOUND}
    print(f"GPT-2-small-sized model ({cfg.layers} blocks, d={cfg.d}, T={args.seq}, batch "
          f"{args.batch}, float16) on {result['device']}; patched with backend "
          f"{args.backend!r}", flush=True)

    with torch.no_grad():
        expected = reference(idx)
        result["logits"] = {"eager_rel_err": rel_err(patched(idx), expected)}
        result["decisions"] = _decisions(patched, idx)
        for problem, choice in result["decisions"].items():
            print(f"  {problem}: {choice}", flush=True)
        timing = {"eager": _timed("eager", {"torch": lambda: reference(idx),
                                            "multibackend": lambda: patched(idx)},
                                  "eager", args),
                  "graph": _timed("eager models", {"torch": lambda: reference(idx),
                                                   "multibackend": lambda: patched(idx)},
                                  "graph", args)}
        compiled_ref = torch.compile(reference, fullgraph=True)
        compiled_mb = torch.compile(patched, fullgraph=True)
        compile_start = time.monotonic()
        compiled_ref(idx)
        result["logits"]["compiled_rel_err"] = rel_err(compiled_mb(idx), expected)
        print(f"compiled both in {time.monotonic() - compile_start:.0f} s", flush=True)
        calls = {"torch": lambda: compiled_ref(idx), "multibackend": lambda: compiled_mb(idx)}
        timing["compiled"] = _timed("compiled", calls, "eager", args)
        timing["compiled_graph"] = _timed("compiled", calls, "graph", args)
    result["timing"] = timing
    worst_logits = max(result["logits"].values())
    result["logits"]["ok"] = worst_logits <= LOGITS_BOUND
    print(f"logits: relative error eager {result['logits']['eager_rel_err']:.2e}, compiled "
          f"{result['logits']['compiled_rel_err']:.2e} (bound {LOGITS_BOUND})", flush=True)
    del compiled_ref, compiled_mb
    torch._dynamo.reset()

    training = {}
    targets = tokens(cfg, args.batch, args.seq, device, seed=2)
    ref32 = gradients(reference.float().train(), idx, targets, 1.0)
    for dtype in (torch.float16, torch.bfloat16):
        scale = LOSS_SCALE[dtype]
        theirs = gradients(reference.to(dtype), idx, targets, scale)
        ours = gradients(patched.to(dtype).train(), idx, targets, scale)
        check = gradient_check(ref32, theirs, ours, dtype)
        name = str(dtype).replace("torch.", "")
        training[name] = {"loss_scale": scale, **check}
        w = check["worst"]
        print(f"training step {name}: {'ok' if check['ok'] else 'OUT OF BOUND'}; worst "
              f"{w['param']}: err {w['err_multibackend']:.2e} (torch {w['err_torch']:.2e}, "
              f"bound {w['bound']:.2e})", flush=True)
    result["training"] = training
    result["ok"] = {"logits": result["logits"]["ok"],
                    "training": all(t["ok"] for t in training.values()),
                    **{f"x_torch_{mode}": row["x_torch"] >= TARGET_X_TORCH
                       for mode, row in timing.items()}}
    result["elapsed_s"] = time.monotonic() - start
    path = out_dir / "gpt2_small.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path} in {result['elapsed_s']:.0f} s; "
          f"{'all ok' if all(result['ok'].values()) else result['ok']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
