"""CPU tier of tuning spread over Dask workers (:mod:`multibackend.tuning.cluster`): a real
``distributed.LocalCluster`` of two worker processes runs the tuner's problems (simulated
backends behind a stand-in for the public call, scripted timings, each worker's own tuner
process) while one worker is killed mid-run, and every candidate is still accounted for, with
the same table as one process makes; the ``gpus=N`` cluster pins one worker per GPU; crashing
and hanging candidates lose only themselves there too; workers of other environments are
refused; tables of several runs on one GPU model merge; and without Dask nothing imports it.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multibackend import cli
from multibackend.choose import tables
from multibackend.core.errors import InvalidArgument
from multibackend.tuning import runner, tuner
from tests.tuning.test_tuner import FakeRegistry, ScriptedBackend, ScriptedTimer, tune_fake

distributed = pytest.importorskip("distributed", reason="Dask is the cluster extra: "
                                                        "pip install 'multibackend[cluster]'")

#: every problem's candidates, by key ("backend:config")
CANDIDATES = {"cublas:default", "fast:default", "killer:default", "crasher:default"}
SHAPES = [(16, 8, 8), (17, 8, 8), (18, 8, 8), (19, 8, 8), (20, 8, 8), (21, 8, 8)]
#: the problem (its M) on which the killer kills its Dask worker, the first time it runs
KILL_M = 18
#: M -> how the crasher fails there (elsewhere it is a slow, correct candidate)
CRASHES = {16: "exits", 20: "hangs"}


class Recorded(ScriptedBackend):
    """A :class:`ScriptedBackend` that appends, on each run, a line "M pid ppid GPU" to the
    file ``log``: which problem ran in which tuner process, under which Dask worker, pinned to
    which ``CUDA_VISIBLE_DEVICES``."""

    def __init__(self, name: str, ms: dict, log: Path):
        super().__init__(name, ms)
        self.log = log

    def run(self, problem, ops, config):
        with open(self.log, "a") as f:
            f.write(f"{problem.m} {os.getpid()} {os.getppid()} "
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}\n")
        super().run(problem, ops, config)


class WorkerKiller(Recorded):
    """Kills the process that started its tuner process (the Dask worker) the first time it
    runs on problem KILL_M, leaving ``marker`` behind; a correct candidate otherwise."""

    def __init__(self, name: str, ms: dict, log: Path, marker: Path):
        super().__init__(name, ms, log)
        self.marker = marker

    def run(self, problem, ops, config):
        if problem.m == KILL_M and not self.marker.exists():
            self.marker.write_text(str(os.getppid()))
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(30)  # the tuner process ends with its worker
        super().run(problem, ops, config)


class Crasher(Recorded):
    """Crashes its tuner process (CRASHES "exits") or hangs ("hangs") on the problems CRASHES
    names; a correct, slow candidate on the others."""

    def run(self, problem, ops, config):
        crash = CRASHES.get(problem.m)
        if crash == "exits":
            os._exit(13)
        if crash == "hangs":
            time.sleep(600)
        super().run(problem, ops, config)


def registry(tmp: Path, marker: Path) -> FakeRegistry:
    log = tmp / "runs.log"
    return FakeRegistry([
        Recorded("cublas", {"eager": 1.0, "graph": 1.0}, log),
        Recorded("fast", {"eager": 0.5, "graph": 0.6}, log),
        WorkerKiller("killer", {"eager": 0.7, "graph": 0.4}, log, marker),
        Crasher("crasher", {"eager": 2.0, "graph": 2.0}, log)])


def runs(tmp: Path) -> list[tuple[int, int, int, str]]:
    """(M, tuner pid, its parent's pid, CUDA_VISIBLE_DEVICES) of every run logged in tmp."""
    lines = (tmp / "runs.log").read_text().split("\n")
    return [(int(m), int(pid), int(ppid), gpu) for m, pid, ppid, gpu in
            (line.split() for line in lines if line)]


def comparable(table: dict) -> dict:
    """The table's entries without their measuring time."""
    return {key: {k: v for k, v in entry.items() if k != "measured"}
            for key, entry in table["entries"].items()}


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    """The table one tuner process makes (the killer's marker already there: it kills
    nothing)."""
    tmp = tmp_path_factory.mktemp("single")
    marker = tmp / "killed"
    marker.write_text("")
    return tune_fake(registry(tmp, marker), ScriptedTimer(), SHAPES, timeout_s=1)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None, silence_logs=50) as found:
        yield found


def test_the_single_process_table_is_what_the_scripts_say(single):
    """The reference the cluster runs are compared with: 'fast' wins everywhere in eager
    mode; the crasher is dropped where it crashes or hangs and timed elsewhere."""
    entries = sorted(single["entries"].values(), key=lambda e: e["m"])
    assert [e["m"] for e in entries] == [m for m, _, _ in SHAPES]
    for e in entries:
        assert (e["backend"], e["config"]["name"]) == ("fast", "default")
        assert set(e["screening_ms"]) | set(e["dropped"]) == CANDIDATES
    by_m = {e["m"]: e for e in entries}
    assert by_m[16]["dropped"] == {"crasher:default": "crashed: exit code 13"}
    assert by_m[20]["dropped"] == {"crasher:default": "timed out after 1 s"}
    assert by_m[KILL_M]["screening_ms"]["killer:default"] == 0.7


@pytest.fixture(scope="module")
def killed(cluster, tmp_path_factory) -> tuple[dict, str, Path]:
    """The table the cluster makes while the killer kills one worker on problem KILL_M (and
    the crasher crashes one tuner process and hangs another); with the progress text and the
    directory of the run's logs."""
    tmp = tmp_path_factory.mktemp("killed")
    out = io.StringIO()
    table = tune_fake(registry(tmp, tmp / "killed"), ScriptedTimer(), SHAPES, timeout_s=1,
                      scheduler=cluster.scheduler_address, progress=out)
    return table, out.getvalue(), tmp


def test_a_worker_killed_mid_run_loses_no_candidate(killed, single):
    table, text, tmp = killed
    marker = tmp / "killed"
    assert marker.exists(), "the killer never ran: no worker was killed"
    killed_worker = int(marker.read_text())
    workers = {ppid for _, _, ppid, _ in runs(tmp)}
    assert killed_worker in workers and len(workers - {killed_worker}) >= 1
    redone = {ppid for m, _, ppid, _ in runs(tmp) if m == KILL_M} - {killed_worker}
    assert redone, "the killed worker's problem was not run again elsewhere"
    for entry in table["entries"].values():  # every candidate timed or dropped with a reason
        assert set(entry["screening_ms"]) | set(entry["dropped"]) == CANDIDATES
    assert comparable(table) == comparable(single)
    assert table["environment"] == single["environment"]
    assert f"{4 * len(SHAPES)}/{4 * len(SHAPES)} candidates" in text


def test_a_problem_runs_its_candidates_and_final_rounds_on_one_worker(cluster, tmp_path):
    marker = tmp_path / "killed"
    marker.write_text("")
    tune_fake(registry(tmp_path, marker), ScriptedTimer(), SHAPES[2:4] + SHAPES[5:],
              scheduler=cluster.scheduler_address)
    where: dict[int, set[int]] = {}
    for m, _, ppid, _ in runs(tmp_path):
        where.setdefault(m, set()).add(ppid)
    assert sorted(where) == [18, 19, 21]
    assert all(len(workers) == 1 for workers in where.values()), where
    assert len(set().union(*where.values())) == 2  # and the problems went to both workers


def test_gpus_starts_one_worker_pinned_to_each_gpu(single, tmp_path):
    marker = tmp_path / "killed"
    marker.write_text("")
    calm = [shape for shape in SHAPES if shape[0] not in CRASHES]
    table = tune_fake(registry(tmp_path, marker), ScriptedTimer(), calm, gpus=2)
    pinned = {gpu for _, _, _, gpu in runs(tmp_path)}
    assert pinned == {"0", "1"}
    by_worker: dict[int, set[str]] = {}
    for _, _, ppid, gpu in runs(tmp_path):
        by_worker.setdefault(ppid, set()).add(gpu)
    assert all(len(gpus) == 1 for gpus in by_worker.values())  # one GPU per worker
    expected = comparable(single)
    assert comparable(table) == {key: expected[key] for key in table["entries"]}
    assert len(table["entries"]) == len(calm)


def test_workers_of_another_environment_are_refused():
    from multibackend.tuning.cluster import common_environment

    h200 = {"gpu": "NVIDIA H200", "cc": "9.0", "driver": "580.1", "triton": "3.6.0"}
    same = {"tcp://a:1": h200, "tcp://b:1": dict(h200)}
    assert common_environment(same, (9, 0)) == h200
    with pytest.raises(InvalidArgument, match=r"gpu: 'NVIDIA H200' on tcp://a:1, 'NVIDIA "
                                              r"H100' on tcp://b:1"):
        common_environment({"tcp://a:1": h200, "tcp://b:1": {**h200, "gpu": "NVIDIA H100"}},
                           (9, 0))
    with pytest.raises(InvalidArgument, match="driver: '580.1' on tcp://a:1, '575.0'"):
        common_environment({"tcp://a:1": h200, "tcp://b:1": {**h200, "driver": "575.0"}},
                           (9, 0))
    with pytest.raises(InvalidArgument, match=r"planned the candidates for cc 8.0"):
        common_environment(same, (8, 0))


def test_tables_of_several_runs_on_one_gpu_model_merge(single, killed):
    """Two runs of one GPU model (one process here, the cluster there) tuned half the shapes
    each: their tables merge into the table of all the shapes; a table of another GPU model
    is refused."""
    cluster_table = killed[0]
    ms = {entry["m"]: key for key, entry in single["entries"].items()}
    first = {**single, "entries": {ms[m]: single["entries"][ms[m]] for m, _, _ in SHAPES[:3]}}
    second = {**cluster_table, "entries": {ms[m]: cluster_table["entries"][ms[m]]
                                           for m, _, _ in SHAPES[3:]}}
    merged = tables.merge(first, second)
    assert comparable(merged) == comparable(single)
    other = {**second, "environment": {**second["environment"], "gpu": "NVIDIA H100"}}
    with pytest.raises(InvalidArgument, match="different environments.*gpu"):
        tables.merge(first, other)


@pytest.mark.parametrize("gpus, scheduler, message", [
    (2, "tcp://a:1", r"gpus is 2 and scheduler is 'tcp://a:1': give one"),
    (0, None, r"gpus is 0: expected a number of GPUs \(at least 1\) or 'all'"),
    ("many", None, r"gpus is 'many': expected a number"),
    ("all", None, r"gpus is 'all': 0 GPU\(s\) visible here")])
def test_bad_gpus_and_scheduler_are_refused(gpus, scheduler, message):
    with pytest.raises(InvalidArgument, match=message):
        tune_fake(FakeRegistry([Recorded("cublas", {}, Path(os.devnull))]), gpus=gpus,
                  scheduler=scheduler)


def test_by_default_every_visible_gpu_when_dask_is_installed(monkeypatch):
    monkeypatch.setattr(tuner, "visible_gpus", lambda: ["2", "5"])
    assert tuner._local_gpus(None, None, "cuda", None) == ["2", "5"]
    assert tuner._local_gpus("all", None, "cuda", None) == ["2", "5"]
    assert tuner._local_gpus(1, None, "cuda", None) is None
    assert tuner._local_gpus(None, "tcp://a:1", "cuda", None) is None
    with pytest.raises(InvalidArgument, match="gpus is 3: 2 GPU"):
        tuner._local_gpus(3, None, "cuda", None)
    monkeypatch.setattr(tuner, "_dask", lambda: False)
    out = io.StringIO()
    assert tuner._local_gpus(None, None, "cuda", out) is None
    assert "2 GPUs visible, tuning on one: install Dask" in out.getvalue()
    monkeypatch.setattr(tuner, "visible_gpus", lambda: ["0"])
    assert tuner._local_gpus(None, None, "cuda", None) is None


def test_the_cli_passes_gpus_and_scheduler(monkeypatch, tmp_path, capsys):
    seen = []

    def recording(shapes, **kwargs):
        seen.append((kwargs["gpus"], kwargs["scheduler"]))
        return tables.new_table({})

    monkeypatch.setattr(tuner, "tune", recording)
    out = str(tmp_path / "t.json")
    for flags in ([], ["--gpus", "2"], ["--gpus", "all"], ["--scheduler", "tcp://h:8786"]):
        cli.main(["tune", "--shape", "16x8x8", "--out", out, *flags])
    assert seen == [(None, None), (2, None), ("all", None), (None, "tcp://h:8786")]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--shape", "16x8x8", "--out", out, "--gpus", "0"])
    assert exit_info.value.code == 2
    assert "--gpus" in capsys.readouterr().err


#: a run with Dask's modules unimportable: the one-process tuner works, nothing imports Dask,
#: and asking for GPUs says what to install
WITHOUT_DASK = """
import importlib.machinery
import sys
class NoDask(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("dask", "distributed"):
            return None
        return super().find_spec(name, path, target)
sys.meta_path = [NoDask if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from multibackend import InvalidArgument
from tests.tuning.test_tuner import FakeRegistry, ScriptedBackend, ScriptedTimer, tune_fake
registry = FakeRegistry([ScriptedBackend("cublas", {"eager": 1.0, "graph": 1.0}),
                         ScriptedBackend("fast", {"eager": 0.5, "graph": 0.5})])
table = tune_fake(registry, ScriptedTimer())
assert [e["backend"] for e in table["entries"].values()] == ["fast"], table
try:
    tune_fake(registry, ScriptedTimer(), gpus=2)
except InvalidArgument as exc:
    assert 'multibackend[cluster]' in str(exc), exc
else:
    raise AssertionError("gpus=2 without Dask was not refused")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
assert not loaded, loaded
print("ok")
"""


def test_without_dask_nothing_imports_it_and_one_process_tunes():
    tests = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), str(tests.parent)]))
    done = subprocess.run([sys.executable, "-c", WITHOUT_DASK], env=env, cwd=tests,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_problem_whose_candidates_all_failed_is_named_in_the_summary():
    from multibackend.tuning.suites import Shape
    from multibackend.tuning.worker import Item, Spec

    plan = runner.Plan({0: Spec(Shape(1, 16, 8, 8), "float16"),
                        1: Spec(Shape(1, 17, 8, 8), "float16")},
                       [Item(0, 0, "cublas", {"name": "default"}),
                        Item(1, 1, "cublas", {"name": "default"}),
                        Item(2, 1, "fast", {"name": "default"})])
    results = runner.Results({0: (1.0, None), 1: (None, "lost: the problem failed on every "
                                                       "Dask worker it went to: KilledWorker"),
                              2: (None, "wrong: rel err 1")})
    assert tuner._without_entry(plan, results) == [
        "no entry for float16 17x8x8: all 2 candidates dropped, the first: lost: the problem "
        "failed on every Dask worker it went to: KilledWorker"]


def benchmark_script():
    """benchmarks/gpu_tune_cluster.py as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_tune_cluster.py"
    spec = importlib.util.spec_from_file_location("gpu_tune_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_entry(winner: str, spread: float, final: dict, first: dict | None = None) -> dict:
    backend, name = winner.split(":")
    return {"backend": backend, "config": {"name": name}, "mode": "eager", "spread": spread,
            "timings_ms": {"eager": final, "graph": {}}, "screening_ms": first or final}


def test_the_benchmark_counts_differing_winners_beyond_the_spread_as_disagreements():
    compare = benchmark_script().compare
    one = {"entries": {
        "same": bench_entry("cublas:default", 0.01, {"cublas:default": 1.0, "t:a": 1.2}),
        "close": bench_entry("cublas:default", 0.02, {"cublas:default": 1.0, "t:a": 1.015}),
        "apart": bench_entry("cublas:default", 0.01, {"cublas:default": 1.0, "t:a": 1.1}),
        "first": bench_entry("t:a", 0.01, {"t:a": 0.8, "cublas:default": 1.0},
                             {"t:a": 0.8, "cublas:default": 1.0, "t:b": 0.805}),
        "only_one": bench_entry("cublas:default", 0.01, {"cublas:default": 1.0})}}
    many = {"entries": {
        "same": bench_entry("cublas:default", 0.01, {"cublas:default": 1.0}),
        "close": bench_entry("t:a", 0.01, {"cublas:default": 1.0, "t:a": 0.98}),
        "apart": bench_entry("t:a", 0.03, {"cublas:default": 1.0, "t:a": 0.9}),
        "first": bench_entry("t:b", 0.01, {"t:b": 0.8, "cublas:default": 1.0})}}
    found = compare(one, many)
    assert found["counts"] == {"compared": 4, "same": 1, "within_spread": 2, "disagree": 1,
                               "missing": 1}
    rows = {row["problem"]: row for row in found["differing"]}
    assert rows["close"]["verdict"] == "within_spread"  # 1.5% apart, spread 2%
    assert rows["first"]["verdict"] == "within_spread"  # t:b not a finalist: its first figure
    assert rows["apart"] == {"problem": "apart", "verdict": "disagree", "one": "cublas:default",
                             "all": "t:a", "spread": 0.03, "gap_in_one": 0.1,
                             "gap_in_all": 0.1111}
    assert rows["only_one"] == {"problem": "only_one", "verdict": "missing", "missing_in": "all"}


def test_the_benchmark_times_a_warmup_one_gpu_and_all_gpus_and_writes_its_verdict(
        monkeypatch, tmp_path):
    script = benchmark_script()
    import multibackend.tuning.tuner

    monkeypatch.setattr(multibackend.tuning.tuner, "visible_gpus", lambda: ["0", "1"])
    commands = []
    entries = {"p": bench_entry("cublas:default", 0.01, {"cublas:default": 1.0})}

    def fake_run(command, stdout, stderr, timeout):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        table = {**tables.new_table(entries), "environment": {"gpu": "NVIDIA H200"}}
        for entry in table["entries"].values():
            entry["dropped"] = {}
        out.write_text(json.dumps(table))
        time.sleep(0.2 if command[command.index("--gpus") + 1] == "1" else 0.05)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["gpu_tune_cluster.py", "--out-dir", str(tmp_path),
                                      "--limit", "2"])
    assert script.main() == 0
    assert [c[c.index("--gpus") + 1] for c in commands] == ["all", "1", "all"]
    assert commands[0][1:4] == ["-m", "multibackend", "tune"]
    assert commands[0].count("--shape") == 2 and "--quick" in commands[0]
    result = json.loads((tmp_path / "tune_cluster.json").read_text())
    assert result["gpu"] == "NVIDIA H200" and set(result["runs"]) == {"warmup", "one", "all"}
    assert result["ratio"] < 0.6 and result["ok"]
    assert result["winners"]["counts"]["same"] == 1
    assert (tmp_path / "tuning_validation_2gpu.json").exists()
    assert not (tmp_path / "tuning_warmup.json").exists()
    commands.clear()
    monkeypatch.setattr(sys, "argv", ["gpu_tune_cluster.py", "--out-dir", str(tmp_path),
                                      "--limit", "1", "--max-configs", "3", "--skip-warmup"])
    assert script.main() == 0
    assert [c[c.index("--gpus") + 1] for c in commands] == ["1", "all"]
    assert all("--quick" not in c and c[c.index("--max-configs") + 1] == "3"
               for c in commands)
