"""The command line: ``python -m multibackend info | check | tune | report``.

``check`` is the main job. On a GPU it cross-checks every backend, plus cuBLAS, over a default
set of shapes and dtypes and prints one table. Without a GPU it says so, runs the Triton
kernels in Triton's interpreter and the host backend on small ragged shapes against a float64
reference, and exits 0 when they all match (1 when any result is wrong, or when no backend ran
at all). ``tune`` needs a GPU (or a Dask cluster's); ``report`` prints its table and figures
without matplotlib, which only its plots need.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

#: (M, N, K) shapes of the GPU cross-check: square, ragged, odd, and large
GPU_SHAPES = ((256, 256, 256), (333, 777, 999), (1000, 1000, 1000), (4097, 4095, 4096),
              (4096, 4096, 4096))
GPU_DTYPES = (("float16", {}), ("bfloat16", {}), ("float32", {"precision": "ieee"}),
              ("float32", {"precision": "tf32"}), ("float64", {}), ("int8", {}),
              ("float8_e4m3fn", {}))
CPU_SHAPES = ((1, 1, 1), (7, 17, 33), (65, 33, 17), (17, 129, 65))
CPU_DTYPES = (("float16", {}), ("bfloat16", {}), ("float32", {"precision": "ieee"}),
              ("float64", {}), ("int8", {}))
DOT_SIZES_GPU = (1 << 20, (1 << 24) + 3)
DOT_SIZES_CPU = (1, 1000, 4099)


def cmd_info(_args: argparse.Namespace) -> int:
    from multibackend.choose.registry import REGISTRY
    from multibackend.core import environment
    from multibackend.run import fastcall

    gpu = environment.gpu()
    if gpu["available"]:
        print(f"GPU: {gpu['name']} (sm_{gpu['cc'].replace('.', '')}), "
              f"{gpu['multiprocessors']} SMs, {gpu['memory_gib']} GiB, CUDA {gpu['cuda_runtime']}, "
              f"driver {gpu.get('driver')}")
    else:
        print(f"GPU: none ({gpu['reason']})")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in environment.versions().items() if v))
    for name in REGISTRY.names:
        reason = REGISTRY.availability(name)
        state = "available" if reason is None else f"unavailable: {reason.message} " \
                                                   f"(rule: {reason.rule})"
        print(f"  {name:<9} {state}")
    fastcall.load()  # built here (once per torch and Python) unless turned off
    print(f"compiled call front: {fastcall.status()}")
    return 0


def _operands(shape, dtype: str, device: str, rng):
    import torch

    from multibackend.core import dtypes as dt

    m, n, k = shape
    tdtype = dt.torch_dtype(dtype)
    if dt.get(dtype).is_integer:
        a = torch.randint(-8, 8, (m, k), generator=rng, dtype=torch.int8)
        b = torch.randint(-8, 8, (k, n), generator=rng, dtype=torch.int8)
    else:
        a = (torch.rand((m, k), generator=rng, dtype=torch.float32) * 2 - 1).to(tdtype)
        b = (torch.rand((k, n), generator=rng, dtype=torch.float32) * 2 - 1).to(tdtype)
    return a.to(device), b.to(device)


def _vectors(n: int, dtype: str, device: str, rng):
    import torch

    from multibackend.core import dtypes as dt

    x = torch.rand((n,), generator=rng, dtype=torch.float32) * 2 - 1
    y = torch.rand((n,), generator=rng, dtype=torch.float32) * 2 - 1
    return x.to(dt.torch_dtype(dtype)).to(device), y.to(dt.torch_dtype(dtype)).to(device)


def run_check(shapes, dtypes, dot_sizes, device: str, time_it: bool, out=None) -> list:
    """Cross-check every (shape, dtype) and dot size; print one table (to ``out``, else
    standard output as it is when called); return the reports."""
    out = sys.stdout if out is None else out
    import torch

    from multibackend.io.request import matmul_call
    from multibackend.verify.crosscheck import crosscheck, prebuild

    rng = torch.Generator().manual_seed(0)
    cases = [(_operands(shape, dtype, device, rng), kwargs) for dtype, kwargs in dtypes
             for shape in shapes]
    if device != "cpu":
        prebuild([matmul_call(a, b, **kwargs).problem for (a, b), kwargs in cases])
    reports = []
    print(HEADER, file=out, flush=True)
    for (a, b), kwargs in cases:
        reports.append(crosscheck(a, b, time_it=time_it, **kwargs))
        print(_rows(reports[-1]), file=out, flush=True)
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        for n in dot_sizes:
            x, y = _vectors(n, dtype, device, rng)
            reports.append(crosscheck(x, y, time_it=time_it))
            print(_rows(reports[-1]), file=out, flush=True)
    return reports


#: the columns of a backend's line in ``check``'s table, under its problem's own line
HEADER = (f"  {'backend':<8} {'config':<34} {'rel err':>9} {'result':<6} {'rate':>17} "
          f"{'x cuBLAS':>8}")


def _rows(report) -> str:
    """A problem's line (whole, never cut), then one line per backend that ran it (a config
    name longer than its column pushes the rest right rather than being cut)."""
    lines = [report.problem]
    for r in report.results:
        if not r.supported:
            continue
        status = "ok" if r.ok else f"FAIL {r.detail}"
        rate = f"{r.rate:9.1f} {report.unit:<7}" if r.rate else " " * 17
        ratio = f"{r.vs_cublas:7.2f}x" if r.vs_cublas else "       -"
        err = f"{r.rel_err:.2e}" if r.rel_err is not None else "-"
        lines.append(f"  {r.backend:<8} {r.config or '-':<34} {err:>9} {status:<6} {rate} "
                     f"{ratio}")
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    from multibackend.core import environment

    gpu = environment.gpu()
    if gpu["available"]:
        print(f"cross-check on {gpu['name']} (sm_{gpu['cc'].replace('.', '')}): every backend "
              "vs float64, time and ratio to cuBLAS from the same run")
        shapes = GPU_SHAPES[: args.shapes] if args.shapes else GPU_SHAPES
        reports = run_check(shapes, GPU_DTYPES, DOT_SIZES_GPU, "cuda", time_it=True)
    else:
        print(f"no GPU here ({gpu['reason']}): cross-checking the Triton kernels in Triton's "
              "interpreter, and the host backend (torch's CPU product, what auto answers "
              "host arrays with here), on small ragged shapes against a float64 reference")
        os.environ["TRITON_INTERPRET"] = "1"
        shapes = CPU_SHAPES[: args.shapes] if args.shapes else CPU_SHAPES
        reports = run_check(shapes, CPU_DTYPES, DOT_SIZES_CPU, "cpu", time_it=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in reports], f, indent=1)
    failed = [r for r in reports if r.ran and not r.ok]
    unchecked = sum(1 for r in reports if not r.ran)
    ran = sum(r.ran for r in reports)
    print(f"{ran} backend runs, {len(failed)} problems with a wrong result"
          + (f", {unchecked} that no backend ran" if unchecked else ""))
    return 1 if failed or not ran else 0


def cmd_tune(args: argparse.Namespace) -> int:
    from multibackend.choose.tables import merge, save_table
    from multibackend.core import environment
    from multibackend.core.errors import InvalidArgument
    from multibackend.tuning.tuner import tune

    shapes = list(args.suite or []) + list(args.shape or [])
    if not shapes:
        print("tune: give --suite and/or --shape", file=sys.stderr)
        return 2
    base = _merge_base(args)
    if base is not None and args.scheduler is None:  # measured here, in this environment
        fault = _other_environment(base, environment.fingerprint(), args.out, "this machine")
        if fault:
            raise InvalidArgument(fault)
    table = tune(shapes, dtypes=args.dtype or ["float16"], backends=args.backends,
                 mode=args.mode, max_configs=args.max_configs, quick=args.quick,
                 timeout_s=args.timeout, max_workers=args.jobs, gpus=args.gpus,
                 scheduler=args.scheduler, layout=args.layout)
    if not table["entries"]:
        print(f"tune: no problem was measured (see above); {args.out} not written",
              file=sys.stderr)
        return 1
    if base is not None:
        fault = _other_environment(base, table["environment"], args.out, "this run")
        if fault:  # the workers' environment, known only once they reported it
            kept = save_table(table, os.path.splitext(args.out)[0] + ".unmerged.json")
            raise InvalidArgument(f"{fault}; this run is written to {kept}")
        table = merge(base, table)
    path = save_table(table, args.out)
    print(f"tuning table: {path} ({len(table['entries'])} entries); use it with "
          f"MULTIBACKEND_TUNING={path} or multibackend.load_tuning({str(path)!r})")
    return 0


def _merge_base(args: argparse.Namespace) -> dict | None:
    """The table in ``--out`` that ``--merge`` adds the run to (None: nothing to merge),
    read before the run, so that a file that is no table fails at once, not after it."""
    from multibackend.choose.tables import read_table
    from multibackend.core.errors import InvalidArgument

    if not (args.merge and os.path.exists(args.out)):
        return None
    try:
        return read_table(args.out)
    except InvalidArgument as exc:
        raise InvalidArgument(f"tune: --merge into --out {args.out!r}: {exc}") from None


def _other_environment(base: dict, env: dict, out: str, other: str) -> str:
    """Why ``--merge`` cannot add a table measured in ``env`` (``other``'s environment) to
    ``base``, the table in ``out`` ('' where it can)."""
    from multibackend.choose.tables import mismatch

    diff = mismatch(base["environment"], env, (out, other))
    if not diff:
        return ""
    return (f"tune: --merge into --out {out!r}: that table was made in another environment "
            f"than {other} ({'; '.join(diff)}): only tables of one environment merge")


def _gpus(text: str) -> int | str:
    """``--gpus``: "all" or a positive number."""
    if text == "all":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: expected a number of GPUs (at least 1) or "
                                     "'all'")


def cmd_report(args: argparse.Namespace) -> int:
    from multibackend.report import report

    text, figures, plots = report(args.paths, None if args.no_plots else args.out_dir)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    print("plots: " + (plots if isinstance(plots, str) else ", ".join(str(p) for p in plots)))
    return 0


def main(argv: list[str] | None = None, prog: str = "multibackend") -> int:
    """The command line; ``prog`` is how help and errors name it (the console script
    ``multibackend``, or ``python -m multibackend``)."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description="GPU matmul/dot across raw WMMA, Triton "
                                                 "and CUTLASS, checked against cuBLAS")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="GPU, versions, each backend's availability, and the "
                              "compiled call front (built here if need be)")
    check = sub.add_parser("check", help="cross-check every backend vs float64 and cuBLAS")
    check.add_argument("--json", help="also write the reports to this JSON file")
    check.add_argument("--shapes", type=int, default=0,
                       help="only the first N default shapes (of the GPU's, or of the "
                            "interpreter's without a GPU)")
    from multibackend.gpu.timing import MODES
    from multibackend.tuning.suites import SUITES
    from multibackend.tuning.worker import LAYOUTS

    tune = sub.add_parser("tune", help="time every backend and config per shape; write a "
                                       "tuning table for backend='auto'")
    tune.add_argument("--suite", action="append", choices=sorted(SUITES),
                      help="shape suite to tune (repeatable)")
    tune.add_argument("--shape", action="append", help="MxNxK or BxMxNxK (repeatable)")
    tune.add_argument("--dtype", action="append", help="input dtype (repeatable; float16)")
    tune.add_argument("--backends", nargs="+", help="backends to tune (default: all; "
                                                    "cuBLAS is always measured)")
    tune.add_argument("--layout", choices=LAYOUTS, default="nn",
                      help="major orders of A and B, A's first: n row-major, t column-major "
                           "(nt: x @ W.T; default nn)")
    tune.add_argument("--mode", choices=MODES, default="eager",
                      help="timing mode the choice is made in: eager (back-to-back calls, "
                           "host time included; the default) or graph (calls captured in a "
                           "CUDA graph and replayed); the table records both")
    tune.add_argument("--out", required=True, help="tuning table JSON to write")
    tune.add_argument("--merge", action="store_true",
                      help="merge into --out when it exists (new entries win); the file "
                           "is checked before the run")
    tune.add_argument("--quick", action="store_true",
                      help="at most 3 configs per backend, 10 timed runs each")
    tune.add_argument("--max-configs", type=int, help="at most N configs per backend")
    tune.add_argument("--timeout", type=float, default=120.0,
                      help="seconds one candidate may take (default 120)")
    tune.add_argument("--jobs", type=int, help="parallel compile processes")
    tune.add_argument("--gpus", type=_gpus,
                      help="spread the problems over this machine's GPUs, one Dask worker "
                           "each: a number or 'all' (default: all of them where Dask is "
                           "installed and more than one is visible, else one)")
    tune.add_argument("--scheduler", metavar="ADDRESS",
                      help="spread the problems over the workers (one per GPU) of the Dask "
                           "scheduler at ADDRESS, e.g. tcp://host:8786")
    report = sub.add_parser("report", help="TFLOP/s, ratio to cuBLAS, plots and bars from "
                                           "saved pytest-benchmark results")
    report.add_argument("paths", nargs="*", default=[".benchmarks"],
                        help="result .json files or directories (default: .benchmarks)")
    report.add_argument("--out-dir", default="benchmark-report", help="where the PNGs go")
    report.add_argument("--json", help="also write the bars' figures to this JSON file")
    report.add_argument("--no-plots", action="store_true",
                        help="print the table and write the JSON only (no matplotlib needed)")
    args = parser.parse_args(argv)
    for option in ("json", "out"):  # a file written at the end: its folder checked first
        target = getattr(args, option, None)
        folder = os.path.dirname(os.path.abspath(target)) if target else None
        if folder and not os.path.isdir(folder):
            parser.error(f"--{option} {target}: the folder {folder} does not exist")
    if args.command == "tune" and args.max_configs is not None and args.max_configs < 1:
        parser.error(f"--max-configs {args.max_configs}: expected at least 1")
    from multibackend.core.errors import MultibackendError

    try:
        return {"info": cmd_info, "check": cmd_check, "tune": cmd_tune,
                "report": cmd_report}[args.command](args)
    except MultibackendError as exc:  # a bad argument or setting: its message, no traceback
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")
