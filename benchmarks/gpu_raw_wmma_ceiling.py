"""Raw WMMA against its own ceiling and against torch, same run: the register-only rate of each
tensor-core instruction family (``raw_wmma/ceiling.cu``), then the raw WMMA backend's GEMMs
beside torch's on the sizes its bars name, each as a fraction of its family's ceiling.

Run from the repository root on a machine with a GPU:

    python3 benchmarks/gpu_raw_wmma_ceiling.py [--json raw_wmma_ceiling.json]

Probes: each launch fills every SM (``--blocks-per-sm`` blocks of 8 warps), each warp issuing
``iterations`` rounds of 8 independent instructions from registers (wgmma, sm_90a only: each
warpgroup issuing rounds of 8 instructions on tiles it copied into shared memory once);
iterations are scaled until a launch takes about ``--probe-ms``. Kernel mode timing (CUDA
events, the GPU held busy while the host queues; no L2 flush, the probes read 2 fragments),
median of ``--reps`` runs.

GEMMs (random non-zero operands, checked against float64 before they are timed, torch's call
timed alternately with ours in eager mode: back-to-back public calls, host included): f16 and
bf16 at 4096^3 and 8192^3 against torch.matmul, s8 at 8192^3 against torch._int_mm, tf32 at
8192^3 against torch.matmul with TF32 allowed and f64 at 4096^3 against torch.matmul (ours
given B column-major, the layout of the PTX K-major kernels, torch given B row- and
column-major: the faster is the yardstick), and the b1 AND GEMM at 8192 x 8192 x 65536 bits
(``binary_matmul(op="and")``, no torch equivalent; B column-major) under each PTX config and
the WMMA 8x8x128 kernel. Each of our rows is set against the ceiling of the instruction its
kernel issues (WMMA's for ``wmma_*`` and ``fast_*`` configs, the PTX mma.sync one's for
``mma_*``, wgmma's for ``wgmma_*`` and ``tma_*``) and also against the WMMA ceiling of its
dtype (``wmma_ceiling_fraction``); b1 rows are also set against the mma.sync m16n8k256 ceiling
(``mma_sync_ceiling_fraction``).

Writes a JSON list of rows ``{dtype, m, n, k, backend, config, ms, torch_ms, tops,
ceiling_fraction}``: ``backend`` "ceiling" for a probe (m, n, k its fragment shape, config its
entry point, ceiling_fraction 1), "raw_wmma" for our kernel (config the one the backend
chose), "torch" for the yardstick (config the call: torch_ms is the faster one's); dtype as
torch spells it ("bit" for b1); GEMM rows also name their probe (``ceiling``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: entry point of raw_wmma/ceiling.cu -> (dtype as torch spells it, fragment m, n, k, the
#: element type its operands are filled with)
PROBES = {
    "rw_ceiling_f16_f32_16x16x16": ("float16", 16, 16, 16, "float16"),
    "rw_ceiling_bf16_f32_16x16x16": ("bfloat16", 16, 16, 16, "bfloat16"),
    "rw_ceiling_tf32_f32_16x16x8": ("float32", 16, 16, 8, "float32"),
    "rw_ceiling_s8_s32_16x16x16": ("int8", 16, 16, 16, "int8"),
    "rw_ceiling_f64_f64_8x8x4": ("float64", 8, 8, 4, "float64"),
    "rw_ceiling_b1and_s32_8x8x128": ("bit", 8, 8, 128, "int32"),
    "rw_ceiling_b1and_s32_16x8x128": ("bit", 16, 8, 128, "int32"),
    "rw_ceiling_b1and_s32_16x8x256": ("bit", 16, 8, 256, "int32"),
    "rw_ceiling_s8_s32_16x8x32": ("int8", 16, 8, 32, "int8"),
    "rw_ceiling_tf32_f32_16x8x8": ("float32", 16, 8, 8, "float32"),
    "rw_ceiling_f16_f32_16x8x16": ("float16", 16, 8, 16, "float16"),
    "rw_ceiling_bf16_f32_16x8x16": ("bfloat16", 16, 8, 16, "bfloat16"),
    "rw_ceiling_f16_f32_64x256x16": ("float16", 64, 256, 16, "float16"),
    "rw_ceiling_bf16_f32_64x256x16": ("bfloat16", 64, 256, 16, "bfloat16"),
    "rw_ceiling_tf32_f32_64x256x8": ("float32", 64, 256, 8, "float32"),
    "rw_ceiling_s8_s32_64x128x32": ("int8", 64, 128, 32, "int8"),
    "rw_ceiling_b1and_s32_64x256x256": ("bit", 64, 256, 256, "int32"),
    "rw_ceiling_f64_f64_16x8x4": ("float64", 16, 8, 4, "float64"),
    "rw_ceiling_f64_f64_16x8x8": ("float64", 16, 8, 8, "float64"),
    "rw_ceiling_f64_f64_16x8x16": ("float64", 16, 8, 16, "float64"),
}
#: probes of instructions that exist from sm_90 on (skipped on older GPUs)
SM90_PROBES = ("rw_ceiling_f64_f64_16x8x4", "rw_ceiling_f64_f64_16x8x8",
               "rw_ceiling_f64_f64_16x8x16")
#: the warpgroup (wgmma) probes, by GEMM dtype: sm_90a only, built for that target; one
#: instruction is shared by the 4 warps of a warpgroup
WGMMA_CEILING = {"float16": "rw_ceiling_f16_f32_64x256x16",
                 "bfloat16": "rw_ceiling_bf16_f32_64x256x16",
                 "float32": "rw_ceiling_tf32_f32_64x256x8", "int8": "rw_ceiling_s8_s32_64x128x32",
                 "bit": "rw_ceiling_b1and_s32_64x256x256"}
WARPS_PER_WARPGROUP = 4
#: the probe each GEMM dtype's WMMA kernels are measured against (b1: the 8x8x128 kernel's)
CEILING_OF = {"float16": "rw_ceiling_f16_f32_16x16x16",
              "bfloat16": "rw_ceiling_bf16_f32_16x16x16",
              "float32": "rw_ceiling_tf32_f32_16x16x8", "int8": "rw_ceiling_s8_s32_16x16x16",
              "float64": "rw_ceiling_f64_f64_8x8x4", "bit": "rw_ceiling_b1and_s32_8x8x128"}
#: (dtype, size) of each GEMM row: the sizes the bars name
GEMMS = (("float16", 4096), ("float16", 8192), ("bfloat16", 4096), ("bfloat16", 8192),
         ("int8", 8192), ("float32", 8192), ("float64", 4096))
#: the probe of each PTX K-major (``mma_*``) config's instruction, by dtype and the
#: instruction's K
MMA_CEILING = {("bit", 128): "rw_ceiling_b1and_s32_16x8x128",
               ("bit", 256): "rw_ceiling_b1and_s32_16x8x256",
               ("int8", 32): "rw_ceiling_s8_s32_16x8x32",
               ("float16", 16): "rw_ceiling_f16_f32_16x8x16",
               ("bfloat16", 16): "rw_ceiling_bf16_f32_16x8x16",
               ("float32", 8): "rw_ceiling_tf32_f32_16x8x8",
               ("float64", 4): "rw_ceiling_f64_f64_16x8x4"}
#: the b1 instruction every b1 row is also set against (the bar's)
MMA_SYNC_B1 = "rw_ceiling_b1and_s32_16x8x256"
WARPS_PER_BLOCK = 8
CHAINS = 8


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks-per-sm", type=int, default=4)
    p.add_argument("--probe-ms", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--bits-k", type=int, default=65536, help="K of the b1 GEMM, in bits")
    p.add_argument("--json", help="write the rows here")
    return p.parse_args()


def _filled(dtype: str, count: int, device: str):
    """``count`` random non-zero-mean values of ``dtype`` (small integers for int8)."""
    import torch

    if dtype == "int8":
        return torch.randint(-8, 8, (count,), dtype=torch.int8, device=device)
    if dtype == "int32":
        return torch.randint(-2**31, 2**31 - 1, (count,), dtype=torch.int32, device=device)
    return (torch.rand(count, device=device) * 2 - 1).to(getattr(torch, dtype))


def probe_rows(blocks_per_sm: int, probe_ms: float, reps: int) -> dict[str, dict]:
    """Each probe's row: its rate in tera-operations per second."""
    import torch

    from multibackend.backends.raw_wmma.kernels import WGMMA_CC
    from multibackend.gpu import driver, nvrtc
    from multibackend.gpu.timing import time_gpu
    from multibackend.raw_wmma import source_path

    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    grid = sms * blocks_per_sm
    warps = grid * WARPS_PER_BLOCK
    rows = {}
    for name, (dtype, m, n, k, fill) in PROBES.items():
        wgmma = name in WGMMA_CEILING.values()
        if (name in SM90_PROBES and major < 9) or (wgmma and (major, minor) != WGMMA_CC):
            continue
        compiled = nvrtc.compile_cubin(source_path("ceiling.cu"), name,
                                       f"sm_{major}{minor}{'a' if wgmma else ''}",
                                       [f"RW_ONLY={name}"])
        function = driver.load(compiled.path.read_bytes(), name, device)
        a, b = _filled(fill, 32 * 16 * 16, "cuda"), _filled(fill, 32 * 16 * 16, "cuda")
        out = torch.empty(warps * m * n * 8, dtype=torch.uint8, device="cuda")
        params = [("a", driver.POINTER), ("b", driver.POINTER), ("out", driver.POINTER),
                  ("iterations", driver.INT32)]
        args = driver.Arguments(name, params, {"a": a.data_ptr(), "b": b.data_ptr(),
                                               "out": out.data_ptr(), "iterations": 64})
        launch = driver.Launch(function, (grid, 1, 1), (32 * WARPS_PER_BLOCK, 1, 1), 0, args)

        def run() -> None:
            launch.launch(torch.cuda.current_stream().cuda_stream)

        while True:  # iterations until one launch lasts about probe_ms
            t = time_gpu(run, warmup=1, reps=3, flush_l2=False)
            if t.median_ms >= probe_ms / 2 or args.values.iterations >= 1 << 22:
                break
            args.values.iterations = min(1 << 22, args.values.iterations * 4)
        t = time_gpu(run, warmup=2, reps=reps, flush_l2=False)
        ops = (warps * args.values.iterations * CHAINS * 2 * m * n * k
               // (WARPS_PER_WARPGROUP if wgmma else 1))
        rows[name] = {"dtype": dtype, "m": m, "n": n, "k": k, "backend": "ceiling",
                      "config": name, "ms": t.median_ms, "torch_ms": None,
                      "tops": ops / t.median_ms / 1e9, "ceiling_fraction": 1.0}
        print(f"{name:34s} {rows[name]['tops']:9.1f} TOPS  ({args.values.iterations} "
              f"iterations, {t.median_ms:.2f} ms)", flush=True)
    return rows


def gemm_rows(dtype: str, size: int, ceiling: dict) -> list[dict]:
    """Our kernel's row, then torch's calls', on one square problem, alternated; our kernel
    checked first."""
    import torch

    import multibackend as mb
    from multibackend.core.problem import synthetic
    from multibackend.gpu.timing import time_interleaved
    from multibackend.verify import reference

    a, b = _filled(dtype, size * size, "cuda"), _filled(dtype, size * size, "cuda")
    a, b = a.view(size, size), b.view(size, size)
    # the PTX kernel takes B column-major (the x @ W.T layout, and the one cuBLASLt's int8
    # kernels want): ours gets that layout, torch both, and the faster torch call is the
    # yardstick
    b_col = b.t().contiguous().t()
    fn, what = ((torch._int_mm, "torch._int_mm") if dtype == "int8"
                else (torch.matmul, "torch.matmul"))
    theirs = {f"{what} (B row-major)": lambda: fn(a, b),
              f"{what} (B column-major)": lambda: fn(a, b_col)}
    b = b_col
    options = {"precision": "tf32"} if dtype == "float32" else {}
    problem = synthetic(size, size, size, dtype, cc=torch.cuda.get_device_capability(),
                        **options)
    chosen = mb.explain(a, b, backend="raw_wmma", **options).config.name
    probe = _probe_of(dtype, chosen)
    call = (lambda: mb.matmul(a, b, backend="raw_wmma", **options))
    cmp = reference.compare(problem, call(), reference.reference_matmul(a, b))
    if not cmp.ok:
        raise SystemExit(f"raw_wmma {dtype} {size}^3 is wrong: {cmp.detail}")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "float32"
    try:
        timed = time_interleaved({**theirs, "raw_wmma": call}, mode="eager", reps=20)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    ops = 2 * size ** 3
    torch_ms = min(timed[name].median_ms for name in theirs)  # the faster call torch offers
    rows = []
    for name, backend, config in (("raw_wmma", "raw_wmma", chosen),
                                  *((name, "torch", name) for name in theirs)):
        tops = ops / timed[name].median_ms / 1e9
        rows.append({"dtype": dtype, "m": size, "n": size, "k": size, "backend": backend,
                     "config": config, "ms": timed[name].median_ms, "torch_ms": torch_ms,
                     "tops": tops, "ceiling": probe,
                     "ceiling_fraction": tops / ceiling[probe]["tops"],
                     "wmma_ceiling_fraction": tops / ceiling[CEILING_OF[dtype]]["tops"]})
    return rows


def _probe_of(dtype: str, config: str) -> str:
    """The probe of the instruction ``config``'s kernel issues."""
    if config.startswith(("wgmma_", "tma_")):
        return WGMMA_CEILING[dtype]
    if config.startswith("mma_"):
        return MMA_CEILING[dtype, int(config.split("_")[1].removeprefix("m16n8k"))]
    return CEILING_OF[dtype]


def bit_rows(bits_k: int, ceiling: dict) -> list[dict]:
    """The b1 AND GEMM at 8192 x 8192 x ``bits_k`` bits under every PTX config and the WMMA
    8x8x128 kernel (our kernels only: torch has none), each checked on rows and columns at
    both ends against popcounts, then timed (eager, alternated) and set against the ceiling
    of its own instruction."""
    import torch

    import multibackend as mb
    from multibackend.backends.raw_wmma.backend import MMA_TILES
    from multibackend.backends.raw_wmma.kernels import TMA_TILES, WGMMA_CC, WGMMA_TILES
    from multibackend.gpu.timing import time_interleaved

    size, nbytes = 8192, bits_k // 8
    a = torch.randint(0, 256, (size, nbytes), dtype=torch.uint8, device="cuda")
    b = torch.randint(0, 256, (size, nbytes), dtype=torch.uint8, device="cuda").T  # col-major
    bits = torch.tensor([bin(v).count("1") for v in range(256)], device="cuda")
    ends = torch.tensor([0, 1, size - 2, size - 1], device="cuda")
    want = bits[(a[ends, :, None] & b[None, :, ends]).long()].sum(dim=1).int()
    wgmma = torch.cuda.get_device_capability() == WGMMA_CC
    names = [*(TMA_TILES if wgmma else ()), *(WGMMA_TILES if wgmma else ()),
             *MMA_TILES["b1and"], "wmma_8x8x128"]
    configs = {name: _probe_of("bit", name) for name in names}
    calls = {}
    for name in configs:
        def call(name=name):
            return mb.binary_matmul(a, b, op="and", backend="raw_wmma", config=name)
        if not torch.equal(call()[ends][:, ends], want):
            raise SystemExit(f"raw_wmma b1 AND GEMM ({name}) is wrong at the matrix's ends")
        calls[name] = call
    timed = time_interleaved(calls, mode="eager", reps=10)
    rows = []
    for name, probe in configs.items():
        ms = timed[name].median_ms
        tops = 2 * size * size * bits_k / ms / 1e9
        rows.append({"dtype": "bit", "m": size, "n": size, "k": bits_k, "backend": "raw_wmma",
                     "config": name, "ms": ms, "torch_ms": None, "tops": tops,
                     "ceiling": probe, "ceiling_fraction": tops / ceiling[probe]["tops"],
                     "mma_sync_ceiling_fraction": tops / ceiling[MMA_SYNC_B1]["tops"]})
    return rows


def main() -> int:
    args = parse()
    import torch

    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    ceiling = probe_rows(args.blocks_per_sm, args.probe_ms, args.reps)
    rows = list(ceiling.values())
    for dtype, size in GEMMS:
        mine, *theirs = gemm_rows(dtype, size, ceiling)
        rows += [mine, *theirs]
        yardsticks = "  ".join(f"{r['config']} {r['tops']:8.1f}" for r in theirs)
        print(f"{dtype:9s} {size}^3  raw_wmma {mine['tops']:8.1f}  {yardsticks} TOPS  "
              f"{mine['torch_ms'] / mine['ms']:.3f}x  "
              f"{mine['ceiling_fraction']:.3f} of its ceiling, "
              f"{mine['wmma_ceiling_fraction']:.3f} of WMMA's", flush=True)
    for row in bit_rows(args.bits_k, ceiling):
        rows.append(row)
        print(f"bit       8192x8192x{args.bits_k}  {row['config']:26s} {row['tops']:8.1f} TOPS  "
              f"{row['ceiling_fraction']:.3f} of {row['ceiling']}, "
              f"{row['mma_sync_ceiling_fraction']:.3f} of {MMA_SYNC_B1}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
