"""CPU tier of the benchmark report: figures, bars and PNG plots from the synthetic sample
result in benchmarks/results/sample (pytest-benchmark's saved format), and the CLI."""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from multibackend import cli
from multibackend.core.errors import InvalidArgument
from multibackend.report import bars, load, plot, report

SAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sample"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_sample_is_labelled_synthetic():
    data = json.loads((SAMPLE / "0001_synthetic_sample.json").read_text())
    assert "SYNTHETIC" in data["machine_info"]["node"]
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(data)


def test_load_groups_by_shape_with_tflops_and_ratio():
    results = load([SAMPLE])
    assert len(results.groups) == 5
    odd = results.groups["float16 4097x4095x4096"]
    assert set(odd) == {"cublas", "triton", "raw_wmma", "cutlass", "auto"}
    flops = 2 * 4097 * 4095 * 4096
    assert odd["cublas"].tflops == pytest.approx(flops / (odd["cublas"].ms * 1e-3) / 1e12)
    assert odd["cublas"].tflops == pytest.approx(136, rel=1e-3)
    assert results.ratio("float16 4097x4095x4096", "triton") == pytest.approx(240 / 136,
                                                                               rel=1e-3)
    assert results.ratio("float16 4097x4095x4096", "cublas") == 1.0


def test_bars_from_sample():
    figures = bars(load([SAMPLE]))
    assert len(figures["auto_vs_best"]) == 5
    assert figures["auto_vs_best_worst"]["auto_vs_best"] == pytest.approx(0.995, rel=1e-3)
    assert figures["auto_vs_best_ok"] is True
    expected = math.exp(sum(math.log(r) for r in (378.1 / 380, 731.3 / 720, 109.45 / 95,
                                                   701.5 / 700, 238.8 / 136)) / 5)
    assert figures["geomean_auto_over_cublas"] == pytest.approx(expected, rel=1e-2)
    assert figures["host_overhead_us"] == pytest.approx(13.4)
    assert figures["host_overhead_ok"] is True


def test_bars_fail_when_auto_is_slow(tmp_path):
    data = json.loads((SAMPLE / "0001_synthetic_sample.json").read_text())
    slow = copy.deepcopy(data)
    for bench in slow["benchmarks"]:
        if bench["extra_info"].get("member") == "auto" and "gpu_ms" in bench["extra_info"]:
            bench["extra_info"]["gpu_ms"] *= 1.5
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    figures = bars(load([tmp_path / "slow.json"]))
    assert figures["auto_vs_best_ok"] is False and figures["geomean_ok"] is False


def _sample_with(tmp_path, change) -> Path:
    """The sample result with ``change(benchmarks)`` applied, saved as one file."""
    data = json.loads((SAMPLE / "0001_synthetic_sample.json").read_text())
    change(data["benchmarks"])
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(data))
    return path


def _auto_rows(benchmarks) -> list[dict]:
    return [b for b in benchmarks
            if b["extra_info"].get("member") == "auto" and "gpu_ms" in b["extra_info"]]


@pytest.mark.parametrize("where", [0, 2, 4])
def test_a_time_that_is_not_finite_fails_the_bars_it_enters(tmp_path, where):
    """A failed measurement of ``auto`` on any one shape (first, middle or last, which a min
    would skip) fails both bars it enters; one of the host overhead fails that bar."""
    def spoil(benchmarks):
        _auto_rows(benchmarks)[where]["extra_info"]["gpu_ms"] = float("nan")
        for bench in benchmarks:
            if "overhead_us" in bench["extra_info"]:
                benchmarks.append(copy.deepcopy(bench))
                benchmarks[-1]["extra_info"]["overhead_us"] = float("nan")
                break

    figures = bars(load([_sample_with(tmp_path, spoil)]))
    assert figures["auto_vs_best_ok"] is False and math.isnan(
        figures["auto_vs_best_worst"]["auto_vs_best"])
    assert figures["geomean_ok"] is False
    assert figures["host_overhead_ok"] is False


def test_a_benchmark_without_a_time_is_named(tmp_path):
    def untimed(benchmarks):
        bench = next(b for b in benchmarks if "gpu_ms" in b["extra_info"])
        del bench["extra_info"]["gpu_ms"], bench["stats"]

    with pytest.raises(InvalidArgument, match=r"benchmark 'test_matmul\[.*\]' has neither "
                                              "'gpu_ms' in extra_info nor a 'median' in stats"):
        load([_sample_with(tmp_path, untimed)])

    def no_dtype(benchmarks):
        del next(b for b in benchmarks if "gpu_ms" in b["extra_info"])["extra_info"]["dtype"]

    with pytest.raises(InvalidArgument, match="has no 'dtype' in extra_info"):
        load([_sample_with(tmp_path, no_dtype)])


def test_results_of_the_overhead_benchmark_alone_report_without_plots(tmp_path):
    def overhead_only(benchmarks):
        benchmarks[:] = [b for b in benchmarks if "overhead_us" in b["extra_info"]]

    text, figures, plots = report([_sample_with(tmp_path, overhead_only)], tmp_path / "png")
    assert plots == [] and not (tmp_path / "png").exists()
    assert figures["host_overhead_ok"] is True and figures["auto_vs_best_ok"] is None
    assert "not measured" not in text and "13.4 us" in text


def test_plots_are_valid_pngs(tmp_path):
    paths = plot(load([SAMPLE]), tmp_path)
    assert [p.name for p in paths] == ["tflops.png", "ratio_heatmap.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_report_text_and_errors(tmp_path):
    text, figures, _ = report([SAMPLE], tmp_path)
    assert "ratio to cuBLAS" in text and "float16 16x4096x4096" in text
    assert "PASS" in text and figures["geomean_ok"] is True
    with pytest.raises(InvalidArgument, match="does not exist"):
        load([tmp_path / "missing"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidArgument, match="not a pytest-benchmark result"):
        load([tmp_path / "bad.json"])


def test_cli_report_writes_plots_and_figures(tmp_path, capsys):
    out = tmp_path / "figures.json"
    code = cli.main(["report", str(SAMPLE), "--out-dir", str(tmp_path / "png"),
                     "--json", str(out)])
    assert code == 0
    assert "bars:" in capsys.readouterr().out
    assert (tmp_path / "png" / "ratio_heatmap.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads(out.read_text())["host_overhead_ok"] is True


def test_benchmark_gate_marks_only_the_benchmarks():
    """Collected together, the tests keep their own marks: only benchmarks/ is marked gpu."""
    root = SAMPLE.parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not gpu",
         "-p", "no:cacheprovider", "tests/core/test_packing.py", "benchmarks/test_bench_overhead.py"],
        cwd=root, capture_output=True, text=True, timeout=300)
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/core/test_packing.py::") for line in collected)
