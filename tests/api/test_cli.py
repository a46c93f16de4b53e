"""The command line's edges on a machine without a GPU: ``tune`` refuses in one line with
exit status 2, ``report`` gives its table and JSON without matplotlib, ``check`` prints a
header, never cuts a problem's name and honours ``--shapes``, and help names the program as
it was started."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from multibackend import cli
from multibackend.verify.crosscheck import BackendResult, Report

SAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sample"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")


@no_gpu
def test_tune_without_a_gpu_says_so_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["tune", "--shape", "64x64x64", "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("multibackend tune: error: tune: needs a CUDA GPU"), err
    assert not (tmp_path / "t.json").exists()


def test_report_without_plots_prints_its_table_and_json(tmp_path, capsys):
    out = tmp_path / "bars.json"
    assert cli.main(["report", str(SAMPLE), "--no-plots", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plots: not made (--no-plots)" in printed and "geomean" in printed
    assert json.loads(out.read_text())


def test_report_without_matplotlib_says_how_to_get_the_plots(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    assert cli.main(["report", str(SAMPLE), "--out-dir", str(tmp_path / "p")]) == 0
    printed = capsys.readouterr().out
    assert "matplotlib is not installed" in printed and "multibackend[plot]" in printed
    assert "geomean" in printed and not (tmp_path / "p").exists()


def test_check_rows_keep_the_whole_problem_and_config_names():
    long = "matmul 4097x4095x4096 float16 A:row B:col -> float32 (acc float32) +C saturate"
    report = Report(long, "key", "TFLOP/s", [
        BackendResult("cutlass", True, config="128x256x64_2x1x1_warpspecialized_cooperative",
                      rel_err=1e-3, ok=True, rate=500.0, vs_cublas=1.1)])
    rows = cli._rows(report).splitlines()
    assert rows[0] == long
    assert "128x256x64_2x1x1_warpspecialized_cooperative" in rows[1] and "1.10x" in rows[1]
    assert cli.HEADER.split() == ["backend", "config", "rel", "err", "result", "rate",
                                  "x", "cuBLAS"]


@no_gpu
def test_check_honours_shapes_without_a_gpu(capsys):
    cli.main(["check", "--shapes", "1"])
    printed = capsys.readouterr().out
    assert "matmul 1x1x1 " in printed and "matmul 7x17x33 " not in printed
    assert cli.HEADER in printed


@pytest.mark.parametrize("argv, prog", [
    (["-m", "multibackend", "--help"], "usage: python -m multibackend"),
    (["-c", "from multibackend.cli import main; main(['--help'])"], "usage: multibackend"),
])
def test_help_names_the_program_as_started(argv, prog):
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith(prog), done.stdout[:200]
