"""The benchmark report: TFLOP/s and ratio to cuBLAS per shape and backend, plots, and bars.

Reads pytest-benchmark result files (``--benchmark-save`` writes them under ``.benchmarks/``)
written by the suites in ``benchmarks/``. Each benchmark carries in ``extra_info`` its
member (a backend, ``cublas`` or ``auto``), shape, dtype, ``flops`` and ``gpu_ms``, the median
GPU time by CUDA events; that is the time used here (``stats.median``, the wall time of a
synchronized call, only where ``gpu_ms`` is missing). One group is one (dtype, shape). A time
that is not finite and positive is a failed measurement: a figure made from it is NaN, which
fails the bar it enters (a NaN would otherwise drop out of the min or max that bar reads).

Figures: each group's TFLOP/s per member and ratio to cuBLAS (cuBLAS time / member time: > 1
is faster), two PNG plots (TFLOP/s against problem size per member, per suite and dtype; a
heat-map of the ratio to cuBLAS over shape x member), and the bars: ``auto`` against the best
single member per shape, the geometric mean of ``auto`` over cuBLAS, and the host overhead of
``auto`` on a 64^3 float16 matmul.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from multibackend.core.errors import InvalidArgument
from multibackend.core.names import BASELINE

AUTO = "auto"
AUTO_VS_BEST_BAR = 0.97
GEOMEAN_BAR = 1.0
OVERHEAD_BAR_US = 20.0


@dataclass(frozen=True)
class Row:
    """One member's measurement on one shape."""

    group: str
    suite: str
    dtype: str
    shape: str
    flops: float
    member: str
    backend: str
    config: str
    ms: float

    @property
    def tflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e12


@dataclass
class Results:
    """Every row by group and member, the host-overhead measurements, and the sources."""

    groups: dict[str, dict[str, Row]] = field(default_factory=dict)
    overhead: list[dict] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    machines: list[str] = field(default_factory=list)

    def ratio(self, group: str, member: str) -> float | None:
        """cuBLAS time / the member's time on ``group`` (None without both)."""
        rows = self.groups[group]
        if BASELINE not in rows or member not in rows:
            return None
        if not (_timed(rows[BASELINE].ms) and _timed(rows[member].ms)):
            return math.nan
        return rows[BASELINE].ms / rows[member].ms

    @property
    def members(self) -> list[str]:
        seen = dict.fromkeys(m for rows in self.groups.values() for m in rows)
        return sorted(seen, key=lambda m: (m == AUTO, m == BASELINE, m))


def result_files(paths: list[str | os.PathLike]) -> list[Path]:
    """The JSON files named, or found under the directories named (sorted)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files.extend(sorted(path.rglob("*.json")))
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidArgument(f"report: path {str(path)!r} does not exist: give "
                                  "pytest-benchmark result files or directories holding them")
    if not files:
        raise InvalidArgument(f"report: paths {[str(p) for p in paths]!r} hold no .json "
                              "result files")
    return files


def load(paths: list[str | os.PathLike]) -> Results:
    """Read saved pytest-benchmark results (later files win for the same group and member)."""
    results = Results()
    for path in result_files(paths):
        try:
            data = json.loads(path.read_text())
            benchmarks = data["benchmarks"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"report: {str(path)!r} is not a pytest-benchmark result "
                                  f"file: {type(exc).__name__}: {exc}") from None
        results.sources.append(str(path))
        machine = data.get("machine_info", {})
        results.machines.append(machine.get("gpu") or machine.get("node") or "?")
        for bench in benchmarks:
            _add(results, bench, path)
    return results


def _add(results: Results, bench: dict, path: Path) -> None:
    info = bench.get("extra_info") or {}
    if "overhead_us" in info:
        results.overhead.append(info)
        return
    if "member" not in info or not info.get("flops"):
        return
    entry = f"report: {str(path)!r}: benchmark {bench.get('name')!r}"
    for name in ("dtype", "shape"):
        if name not in info:
            raise InvalidArgument(f"{entry} has no {name!r} in extra_info: each row of a "
                                  "member needs its dtype and shape")
    ms = info.get("gpu_ms")
    if ms is None:
        median = (bench.get("stats") or {}).get("median")
        if median is None:
            raise InvalidArgument(f"{entry} has neither 'gpu_ms' in extra_info nor a 'median' "
                                  "in stats: each row of a member needs a time")
        ms = median * 1e3
    row = Row(bench.get("group") or f"{info['dtype']} {info['shape']}", info.get("suite", ""),
              info["dtype"], info["shape"], float(info["flops"]), info["member"],
              info.get("backend", info["member"]), str(info.get("config", "")), float(ms))
    results.groups.setdefault(row.group, {})[row.member] = row


def _timed(ms: float) -> bool:
    """Whether ``ms`` is a measured time (finite and positive), not a failed measurement."""
    return math.isfinite(ms) and ms > 0


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def bars(results: Results) -> dict:
    """The three bars' figures where the data allow (None where they do not)."""
    per_shape = []
    for group, rows in results.groups.items():
        singles = {m: r for m, r in rows.items() if m != AUTO}
        if AUTO not in rows or not singles:
            continue
        best = min(singles.values(), key=lambda r: r.ms if _timed(r.ms) else math.inf)
        timed = all(_timed(r.ms) for r in rows.values())
        per_shape.append({"group": group, "best": best.member,
                          "auto_vs_best": best.ms / rows[AUTO].ms if timed else math.nan})
    ratios = [r for g in results.groups if (r := results.ratio(g, AUTO)) is not None]
    worst = min(per_shape, key=lambda s: (not math.isnan(s["auto_vs_best"]), s["auto_vs_best"]),
                default=None)
    geo = _geomean(ratios)
    overhead = max((o["overhead_us"] for o in results.overhead),
                   key=lambda us: (not math.isfinite(us), us), default=None)
    return {
        "auto_vs_best": per_shape,
        "auto_vs_best_worst": worst,
        "auto_vs_best_ok": worst["auto_vs_best"] >= AUTO_VS_BEST_BAR if worst else None,
        "geomean_auto_over_cublas": geo,
        "geomean_ok": geo >= GEOMEAN_BAR if geo is not None else None,
        "host_overhead_us": overhead,
        "host_overhead_ok": overhead <= OVERHEAD_BAR_US if overhead is not None else None,
    }


def table(results: Results) -> str:
    """Per group, each member's TFLOP/s and ratio to cuBLAS."""
    members = results.members
    head = f"{'dtype shape':<30}" + "".join(f"{m:>18}" for m in members)
    lines = ["TFLOP/s (ratio to cuBLAS) per shape and member; GPU time by CUDA events", head]
    for group, rows in results.groups.items():
        cells = []
        for m in members:
            if m not in rows:
                cells.append(f"{'-':>18}")
                continue
            ratio = results.ratio(group, m)
            text = f"{rows[m].tflops:.1f}" + (f" ({ratio:.2f}x)" if ratio else "")
            cells.append(f"{text:>18}")
        lines.append(f"{group[:30]:<30}" + "".join(cells))
    return "\n".join(lines)


def describe_bars(figures: dict) -> str:
    def mark(ok: bool | None) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[ok]

    worst = figures["auto_vs_best_worst"]
    geo = figures["geomean_auto_over_cublas"]
    over = figures["host_overhead_us"]
    lines = ["bars:"]
    lines.append(f"  auto >= {AUTO_VS_BEST_BAR}x the best single member on every shape: "
                 f"{mark(figures['auto_vs_best_ok'])}" + (
                     f" (worst {worst['auto_vs_best']:.3f}x on {worst['group']}, best there: "
                     f"{worst['best']})" if worst else " (no shape has auto and another member)"))
    lines.append(f"  geomean auto / cuBLAS >= {GEOMEAN_BAR}x: {mark(figures['geomean_ok'])}"
                 + (f" ({geo:.3f}x)" if geo is not None else " (no shape has both)"))
    lines.append(f"  auto host overhead on 64^3 float16 <= {OVERHEAD_BAR_US} us: "
                 f"{mark(figures['host_overhead_ok'])}"
                 + (f" ({over:.1f} us)" if over is not None else " (not measured)"))
    return "\n".join(lines)


def plot(results: Results, out_dir: str | os.PathLike) -> list[Path]:
    """Write ``tflops.png`` and ``ratio_heatmap.png`` into ``out_dir``; returns their paths
    (none where no shape was measured: results of the host-overhead benchmark alone)."""
    if not results.groups:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    members = results.members
    panels: dict[tuple[str, str], list[Row]] = {}
    for rows in results.groups.values():
        for row in rows.values():
            panels.setdefault((row.suite, row.dtype), []).append(row)
    cols = min(3, max(1, len(panels)))
    nrows = math.ceil(max(1, len(panels)) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    for ax, ((suite, dtype), rows) in zip(axes.flat, sorted(panels.items())):
        for member in members:
            mine = sorted((r for r in rows if r.member == member), key=lambda r: r.flops)
            if mine:
                ax.plot([r.flops / 1e9 for r in mine], [r.tflops for r in mine], marker="o",
                        label=member, linestyle="--" if member == BASELINE else "-")
        ax.set_xscale("log")
        ax.set_xlabel("problem size (GFLOP per call)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{suite or 'shapes'} {dtype}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    lines_png = out / "tflops.png"
    fig.savefig(lines_png, dpi=110)
    plt.close(fig)

    groups = list(results.groups)
    shown = [m for m in members if m != BASELINE] or members
    grid = np.array([[results.ratio(g, m) or np.nan for m in shown] for g in groups])
    fig, ax = plt.subplots(figsize=(1.3 * len(shown) + 3.5, 0.32 * len(groups) + 1.8))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.5, vmax=1.5,
                      aspect="auto")
    ax.set_xticks(range(len(shown)), shown)
    ax.set_yticks(range(len(groups)), groups, fontsize=7)
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
    ax.set_title("ratio to cuBLAS (cuBLAS time / member time)")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    heat_png = out / "ratio_heatmap.png"
    fig.savefig(heat_png, dpi=110)
    plt.close(fig)
    return [lines_png, heat_png]


def report(paths: list[str | os.PathLike], out_dir: str | os.PathLike | None
           ) -> tuple[str, dict, list[Path] | str]:
    """Load results, and return the printed report, the bars' figures and the plots made in
    ``out_dir`` — or, where none are made (``out_dir`` None, or matplotlib not installed),
    why not."""
    results = load(paths)
    if not results.groups and not results.overhead:
        raise InvalidArgument(f"report: {results.sources!r} hold no multibackend benchmarks "
                              "(extra_info with 'member' and 'flops')")
    figures = bars(results)
    text = "\n".join([f"results: {', '.join(results.sources)}", table(results),
                      describe_bars(figures)])
    if out_dir is None:
        return text, figures, "not made (--no-plots)"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return text, figures, ("not made: matplotlib is not installed (pip install "
                               "\"multibackend[plot]\"; --no-plots leaves them out)")
    return text, figures, plot(results, out_dir)
