"""``tune`` spread over every GPU of a machine (Dask, one worker per GPU) against ``tune`` on one
GPU: the wall time of each, and whether they choose the same winners.

Run from the repository root on a machine with two or more GPUs and Dask (offline: install
the wheels of ``benchmarks/cluster-wheels.sh`` first, see the README):

    python3 benchmarks/gpu_tune_cluster.py --out-dir benchmarks/results/<GPU>

Each run is one command, timed whole (Python start, the Dask cluster's start, planning,
tuning, writing the table)::

    python -m multibackend tune --suite validation --dtype float16 --dtype bfloat16 --quick \\
        --gpus G --out TABLE

``--quick``: at most 3 configs per backend, 10 timed runs each (the 64 shapes of the
``validation`` suite in f16 and bf16: 128 problems, about 1300 candidates). With
``--max-configs N`` the runs are ``tune --max-configs N`` instead: the same candidates for N =
3, timed as a default ``tune`` times them (50 runs each), so the fixed costs of starting the
workers weigh less against the work. In order:

1. ``warmup`` (``--gpus all``): compiles every candidate's kernel into the user cache
   (CUTLASS libraries, raw WMMA cubins, Triton's cache), so that the timed runs compile
   nothing (on cold caches both would wait on the same CPU-side compiles); its time is
   recorded, not compared. ``--skip-warmup`` leaves it out where the caches are warm already,
   ``--warmup-only`` runs only it (two commands where one may not last long enough);
2. ``one`` (``--gpus 1``): the one-GPU tuner (no Dask);
3. ``all`` (``--gpus all``).

Writes ``tune_cluster.json`` (after each run, so a run cut short leaves what was measured):
the command, each run's GPUs, wall seconds, exit status and counts, ``ratio`` (``all``'s wall
time over ``one``'s, bound :data:`RATIO_BOUND`), and the comparison of the winners. For each
problem both tables tuned, the winners agree when they are the same candidate; otherwise the
1-GPU table's own figures of the two winners (final rounds in the choice's mode, else first
figures) say whether they differ by more than the spread: the N-GPU winner took more than
``1 + spread`` times the 1-GPU winner's time, ``spread`` the larger of the two entries'
spreads (at least 1%). Those problems, and problems one table lacks, are disagreements; the
N-GPU table's figure of the same pair is recorded beside. ``ok``: ratio within the bound and
no disagreement. The two tables (``tuning_<suite>_1gpu.json``, ``tuning_<suite>_<N>gpu.json``)
and each run's log (``tune_<run>.log``) go to ``--out-dir`` too (the warm-up's table does not).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the N-GPU run's wall time may be at most this fraction of the 1-GPU run's
RATIO_BOUND = 0.6


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=".")
    p.add_argument("--suite", default="validation")
    p.add_argument("--dtype", action="append", dest="dtypes")
    p.add_argument("--limit", type=int, help="only the suite's first N shapes")
    p.add_argument("--max-configs", type=int,
                   help="tune --max-configs N (50 timed runs a candidate) instead of --quick")
    p.add_argument("--deadline-s", type=float, default=540.0,
                   help="seconds all the runs together may take (default 540); a run still "
                        "going then is stopped and recorded as such")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--skip-warmup", action="store_true")
    group.add_argument("--warmup-only", action="store_true")
    return p.parse_args()


def _shape_args(suite_name: str, limit: int | None) -> list[str]:
    from multibackend.tuning.suites import suite

    if limit is None:
        return ["--suite", suite_name]
    return [arg for shape in suite(suite_name)[:limit]
            for arg in ("--shape", f"{shape.batch}x{shape.m}x{shape.n}x{shape.k}")]


def _run(name: str, gpus: str, base: list[str], out_dir: Path, table: Path,
         deadline: float) -> dict:
    """One tune command on ``gpus`` writing ``table``, its output in ``tune_<name>.log``: its
    record."""
    command = base + ["--gpus", gpus, "--out", str(table)]
    record = {"gpus": gpus, "command": " ".join(command[1:]), "table": table.name}
    start = time.monotonic()
    with open(out_dir / f"tune_{name}.log", "w") as log:
        try:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=max(deadline - time.monotonic(), 1.0))
            record["returncode"] = done.returncode
        except subprocess.TimeoutExpired:
            record["returncode"] = None
            record["timed_out"] = True
    record["wall_s"] = round(time.monotonic() - start, 2)
    if table.exists():
        found = json.loads(table.read_text())
        entries = found["entries"].values()
        record.update(environment=found["environment"], problems=len(found["entries"]),
                      timed=sum(len(e["screening_ms"]) for e in entries),
                      dropped=sum(len(e["dropped"]) for e in entries))
    print(f"{name}: --gpus {gpus}: {record['wall_s']:.1f} s, exit {record['returncode']}",
          flush=True)
    return record


def _winner(entry: dict) -> str:
    return f"{entry['backend']}:{entry['config']['name']}"


def _figure(entry: dict, candidate: str) -> float | None:
    """The entry's figure of ``candidate`` in the choice's mode (final rounds, else first)."""
    final = entry["timings_ms"][entry["mode"]]
    return final.get(candidate, entry["screening_ms"].get(candidate))


def compare(one: dict, many: dict) -> dict:
    """The winners of the 1-GPU table ``one`` and the N-GPU table ``many`` per problem (see
    the module docstring)."""
    from multibackend.core.names import MIN_SPREAD

    counts = {"compared": 0, "same": 0, "within_spread": 0, "disagree": 0, "missing": 0}
    rows = []
    for key in sorted(set(one["entries"]) | set(many["entries"])):
        a, b = one["entries"].get(key), many["entries"].get(key)
        if a is None or b is None:
            counts["missing"] += 1
            rows.append({"problem": key, "verdict": "missing",
                         "missing_in": "one" if a is None else "all"})
            continue
        counts["compared"] += 1
        wa, wb = _winner(a), _winner(b)
        if wa == wb:
            counts["same"] += 1
            continue
        floor = MIN_SPREAD[a.get("mode", "eager")]
        spread = max(a["spread"] or floor, b["spread"] or floor)
        ta, tb = _figure(a, wa), _figure(a, wb)
        gap = tb / ta - 1 if tb is not None else None
        ua, ub = _figure(b, wa), _figure(b, wb)
        verdict = "within_spread" if gap is not None and gap <= spread else "disagree"
        counts[verdict] += 1
        rows.append({"problem": key, "verdict": verdict, "one": wa, "all": wb,
                     "spread": round(spread, 4),
                     "gap_in_one": None if gap is None else round(gap, 4),
                     "gap_in_all": None if ua is None or ub is None else round(ua / ub - 1, 4)})
    return {"counts": counts, "differing": rows}


def main() -> int:
    args = parse()
    from multibackend.tuning.tuner import visible_gpus

    deadline = time.monotonic() + args.deadline_s
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpus()
    dtypes = args.dtypes or ["float16", "bfloat16"]
    base = [sys.executable, "-m", "multibackend", "tune",
            *_shape_args(args.suite, args.limit),
            *[arg for d in dtypes for arg in ("--dtype", d)],
            *(["--quick"] if args.max_configs is None
              else ["--max-configs", str(args.max_configs)])]
    result = {"suite": args.suite, "limit": args.limit, "dtypes": dtypes,
              "gpus_visible": len(gpus), "ratio_bound": RATIO_BOUND,
              "command": " ".join(base[1:] + ["--gpus", "{1|all}", "--out", "TABLE"]),
              "runs": {}}
    path = out_dir / "tune_cluster.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1) + "\n")

    if len(gpus) < 2:
        result["error"] = f"{len(gpus)} GPU(s) visible: the comparison needs two or more"
        save()
        print(result["error"], file=sys.stderr)
        return 1
    steps = [("warmup", "all")] if not args.skip_warmup else []
    if not args.warmup_only:
        steps += [("one", "1"), ("all", "all")]
    scratch = tempfile.TemporaryDirectory(prefix="tune-cluster-")
    tables = {"warmup": Path(scratch.name) / "tuning_warmup.json",
              "one": out_dir / f"tuning_{args.suite}_1gpu.json",
              "all": out_dir / f"tuning_{args.suite}_{len(gpus)}gpu.json"}
    for name, count in steps:
        record = _run(name, count, base, out_dir, tables[name], deadline)
        result["runs"][name] = record
        save()
        if record["returncode"] != 0:
            print(f"{name} failed; see {out_dir / f'tune_{name}.log'}", file=sys.stderr)
            return 1
    if args.warmup_only:
        return 0
    one, many = result["runs"]["one"], result["runs"]["all"]
    result["gpu"] = one["environment"]["gpu"]
    ratio = many["wall_s"] / one["wall_s"]
    result["ratio"] = round(ratio, 4)
    result["winners"] = compare(json.loads((out_dir / one["table"]).read_text()),
                                json.loads((out_dir / many["table"]).read_text()))
    counts = result["winners"]["counts"]
    result["ok"] = (ratio <= RATIO_BOUND and counts["disagree"] == 0
                    and counts["missing"] == 0)
    save()
    print(f"{result['gpu']}: 1 GPU {one['wall_s']:.1f} s, {len(gpus)} GPUs "
          f"{many['wall_s']:.1f} s: ratio {ratio:.4f} (bound {RATIO_BOUND}); "
          f"winners: {counts}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
