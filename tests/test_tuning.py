"""CPU tier of tuning: the table's write/read/merge, bucketing, environment mismatch, and the
tuner dropping wrong, raising, crashing and hanging candidates (simulated backends run in the
tuner's real child processes, on CPU operands) with their reasons, never choosing them."""
from __future__ import annotations

import io
import json
import os
import statistics
import time

import pytest

from multibackend import tuning
from multibackend.backends.base import Config
from multibackend.capability import Reason
from multibackend.errors import InvalidArgument
from multibackend.problem import synthetic
from multibackend.suites import SUITES, Shape, parse_shape, suite
from multibackend.tuner import summary, tune

ENV = {"gpu": "NVIDIA H200", "cc": "9.0", "driver": "13000", "cuda": "13.0",
       "triton": "3.6.0", "nvidia-cutlass": "4.2.0.0", "multibackend": "0.1.0"}


def entry(m: int, n: int, k: int, backend: str, dtype: str = "float16", batch: int = 1) -> dict:
    p = synthetic(m, n, k, dtype, batch=batch)
    return p.key, {"backend": backend, "config": {"name": "c1", "BLOCK_M": 128},
                   "family": tuning.family(p), "m": m, "n": n, "k": k, "batch": batch,
                   "dtype": dtype, "timings_ms": {f"{backend}:c1": 1.0},
                   "measured": "2026-11-01T00:00:00+00:00"}


def table(*entries, env=None) -> dict:
    return {"format": tuning.FORMAT, "environment": dict(env or ENV), "entries": dict(entries)}


def tables_with(*entries) -> tuning.TuningTables:
    return tuning.TuningTables(entries=dict(entries))


# -- the table --------------------------------------------------------------------------------

def test_table_write_read_round_trip(tmp_path):
    t = table(entry(4096, 4096, 4096, "triton"))
    path = tuning.save_table(t, tmp_path / "t.json")
    assert tuning.read_table(path) == t
    assert json.loads(path.read_text())["environment"]["gpu"] == "NVIDIA H200"


def test_read_rejects_other_formats(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 99, "entries": {}}))
    with pytest.raises(InvalidArgument, match="format"):
        tuning.read_table(bad)
    with pytest.raises(InvalidArgument, match="does not exist"):
        tuning.read_table(tmp_path / "missing.json")


def test_merge_later_entries_win_and_environments_must_match():
    k1, e1 = entry(1024, 1024, 1024, "triton")
    k2, e2 = entry(2048, 2048, 2048, "cutlass")
    merged = tuning.merge(table((k1, e1)), table((k2, e2)), table(entry(1024, 1024, 1024, "cublas")))
    assert set(merged["entries"]) == {k1, k2}
    assert merged["entries"][k1]["backend"] == "cublas"
    with pytest.raises(InvalidArgument, match="different environments"):
        tuning.merge(table((k1, e1)), table((k2, e2), env={**ENV, "gpu": "NVIDIA H100"}))


# -- bucketing --------------------------------------------------------------------------------

def test_lookup_exact_entry():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"))
    hit = tuning.lookup(synthetic(4096, 4096, 4096), tables)
    assert hit.backend == "cutlass" and "exact" in hit.detail
    assert hit.config == Config.of("c1", BLOCK_M=128)


def test_lookup_nearest_bucket_within_radius():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"), entry(1024, 1024, 1024, "triton"))
    hit = tuning.lookup(synthetic(3000, 5000, 4500), tables)
    assert hit.backend == "cutlass" and "nearest" in hit.detail
    hit = tuning.lookup(synthetic(1500, 900, 1024), tables)
    assert hit.backend == "triton"


def test_lookup_none_outside_radius_or_family():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"))
    assert tuning.lookup(synthetic(1024, 4096, 4096), tables) is None  # factor 4 in M
    assert tuning.lookup(synthetic(4096, 4096, 4096, "bfloat16"), tables) is None
    assert tuning.lookup(synthetic(4096, 4096, 4096, batch=8), tables) is None


def test_table_from_other_environment_is_reported_not_used(tmp_path):
    key, e = entry(512, 512, 512, "raw_wmma")
    path = tuning.save_table(table((key, e), env={**ENV, "gpu": "Some Other GPU"}),
                             tmp_path / "other.json")
    tables = tuning.TuningTables()
    diff = tuning.load_tuning(path, tables=tables)
    assert any(d.startswith("gpu:") for d in diff)
    assert tables.entries == {} and "another environment" in tables.rejected[0]
    assert tuning.lookup(synthetic(512, 512, 512), tables) is None


def test_table_from_this_environment_is_used(tmp_path):
    key, e = entry(512, 512, 512, "raw_wmma")
    path = tuning.save_table(tuning.new_table({key: e}), tmp_path / "here.json")
    tables = tuning.TuningTables()
    assert tuning.load_tuning(path, tables=tables) == []
    assert tuning.lookup(synthetic(512, 512, 512), tables).backend == "raw_wmma"


# -- suites -----------------------------------------------------------------------------------

def test_suites_are_named_and_llm_covers_the_projections():
    assert set(SUITES) == {"square", "llm", "odd", "skinny", "batched"}
    llm = suite("llm")
    assert {s.m for s in llm} == {1, 16, 128, 2048, 8192}
    assert Shape(1, 2048, 28672, 8192) in llm and Shape(1, 16, 1024, 4096) in llm
    assert Shape(1, 4097, 4095, 4096) in suite("odd")
    assert parse_shape("8x64x64x32") == Shape(8, 64, 64, 32)
    with pytest.raises(InvalidArgument, match="shape is '12x0x3'"):
        parse_shape("12x0x3")
    with pytest.raises(InvalidArgument, match="not a suite name"):
        suite("huge")


# -- the tuner with simulated backends --------------------------------------------------------

class FakeBackend:
    """A backend on CPU tensors; ``behaviour`` picks how it runs."""

    def __init__(self, name: str, behaviour: str, configs=("default",), delay_s: float = 0.0):
        self.name, self.behaviour, self.names, self.delay_s = name, behaviour, configs, delay_s

    def available(self):
        return None

    def supports(self, problem):
        if self.behaviour == "refuses":
            return Reason(self.name, "shape", "refuses every shape")
        return None

    def configs(self, problem):
        return [Config.of(n, delay=i) for i, n in enumerate(self.names)]

    def prepare(self, problem, config):
        pass

    def run(self, problem, ops, config):
        import torch

        crash = self.behaviour in CRASHES and problem.batch == 1  # once, on one problem
        if self.behaviour == "raises":
            raise RuntimeError("kernel launch failed")
        if crash and self.behaviour == "exits":
            os._exit(13)
        if crash and self.behaviour == "aborts":
            os.abort()
        if crash and self.behaviour == "hangs":
            time.sleep(600)
        time.sleep(self.delay_s * (1 + config.get("delay")))
        d = torch.matmul(ops.a.float(), ops.b.float())
        if self.behaviour == "wrong":
            d = d + 1
        ops.d.copy_(d.to(ops.d.dtype))


class FakeBatchCompiler(FakeBackend):
    """A backend with a parallel compile that builds only its first config."""

    def prepare_many(self, jobs, max_workers=None):
        return jobs[:1]


class FakeRegistry:
    def __init__(self, backends):
        self.backends = {b.name: b for b in backends}
        self.names = tuple(self.backends)

    def get(self, name):
        return self.backends[name]

    def availability(self, name):
        if name == "offline":
            return Reason(name, "environment", "no such device")
        return None


CRASHES = ("exits", "aborts", "hangs")


def wall_ms(calls: dict) -> dict:
    """Median wall time of a few runs of each call (the CPU stand-in for the GPU timer)."""
    times: dict = {key: [] for key in calls}
    for _ in range(3):
        for key, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[key].append((time.perf_counter() - start) * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}


REGISTRY = FakeRegistry([
    FakeBackend("cublas", "good", delay_s=0.03),
    FakeBackend("good", "good", configs=("fast", "slow"), delay_s=0.008),
    FakeBackend("wrong", "wrong"),
    FakeBackend("raises", "raises"),
    FakeBackend("exits", "exits", delay_s=0.05),
    FakeBackend("aborts", "aborts", delay_s=0.05),
    FakeBackend("hangs", "hangs", delay_s=0.05),
    FakeBackend("refuses", "refuses"),
    FakeBackend("offline", "good"),
    FakeBatchCompiler("batch", "good", configs=("built", "unbuilt"), delay_s=0.05),
])
SHAPES = [(48, 40, 32), (2, 24, 16, 40)]


@pytest.fixture(scope="module")
def tuned():
    out = io.StringIO()
    table = tune(SHAPES, dtypes=["float16"], registry=REGISTRY, timer=wall_ms, device="cpu",
                 timeout_s=3, progress=out)
    return table, out.getvalue()


def entries(table) -> tuple[dict, dict]:
    """(the single problem's entry, the batched problem's entry)"""
    found = sorted(table["entries"].values(), key=lambda e: e["batch"])
    assert [e["batch"] for e in found] == [1, 2]
    return found[0], found[1]


def test_tuner_keeps_the_fastest_correct_candidate(tuned):
    table, _ = tuned
    single, batched = entries(table)
    assert set(single["timings_ms"]) == {"cublas:default", "good:fast", "good:slow",
                                         "batch:built"}
    assert set(batched["timings_ms"]) == set(single["timings_ms"]) | {
        f"{name}:default" for name in CRASHES}
    for e in (single, batched):
        assert (e["backend"], e["config"]["name"]) == ("good", "fast")
        assert e["baseline_ms"] == e["timings_ms"]["cublas:default"]
        assert e["family"] == tuning.family(synthetic(e["m"], e["n"], e["k"],
                                                      batch=e["batch"]))
    assert (batched["m"], batched["n"], batched["k"]) == (24, 16, 40)


def test_tuner_drops_failing_and_crashing_candidates_with_reasons(tuned):
    table, _ = tuned
    single, batched = entries(table)
    dropped = single["dropped"]
    assert set(dropped) == {"wrong:default", "raises:default", "exits:default",
                            "aborts:default", "hangs:default", "batch:unbuilt"}
    assert dropped["wrong:default"].startswith("wrong: rel err")
    assert dropped["raises:default"] == "raised: RuntimeError: kernel launch failed"
    assert dropped["exits:default"].startswith("crashed: exit code 13")
    assert dropped["aborts:default"].startswith("crashed: exit code -6 (SIGABRT)")
    assert dropped["hangs:default"] == "timed out after 3 s"
    assert "compile failed" in dropped["batch:unbuilt"]
    assert set(batched["dropped"]) == {"wrong:default", "raises:default", "batch:unbuilt"}
    for e in (single, batched):
        assert e["refused"] == {"refuses": "refuses every shape"}
        assert not set(e["dropped"]) & set(e["timings_ms"])


def test_tuner_reports_progress_and_summary(tuned):
    table, text = tuned
    assert "candidates" in text and "ETA" in text
    assert "offline: not tuned, unavailable here: no such device" in text
    assert "tuned 2 problems" in text and "dropped candidates:" in text
    assert "crashed: exit code -6 (SIGABRT)" in summary(table)


def test_tuned_table_round_trips_and_drives_lookup(tuned, tmp_path):
    table, _ = tuned
    path = tuning.save_table(table, tmp_path / "tuned.json")
    tables = tuning.TuningTables()
    assert tuning.load_tuning(path, tables=tables) == []
    hit = tuning.lookup(synthetic(48, 40, 32, device="cpu", cc=None), tables)
    assert hit.backend == "good" and hit.config.name == "fast"


def test_tune_rejects_bad_arguments():
    with pytest.raises(InvalidArgument, match="backend 'nope'"):
        tune([(8, 8, 8)], backends=["nope"], registry=REGISTRY, device="cpu", progress=None)
    with pytest.raises(InvalidArgument, match="max_configs is 0"):
        tune([(8, 8, 8)], max_configs=0, registry=REGISTRY, device="cpu", progress=None)
    with pytest.raises(InvalidArgument, match="shape"):
        tune([(8, 0, 8)], registry=REGISTRY, device="cpu", progress=None)


class DriftBackend(FakeBackend):
    """A backend whose run leaves its name behind for :func:`drift_timer`."""

    def run(self, problem, ops, config):
        global LAST_RUN
        LAST_RUN = self.name
        super().run(problem, ops, config)


LAST_RUN = None
TIMER_CALLS = 0
#: true times; each timing runs 8% slower than the one before (a GPU warming up)
TRUE_MS = {"early": 1.0, "late": 0.95, "cublas": 5.0}


def drift_timer(calls: dict) -> dict:
    """Times the calls against each other: all at the drift of this timing."""
    global TIMER_CALLS
    TIMER_CALLS += 1
    found = {}
    for key, fn in calls.items():
        fn()
        found[key] = TRUE_MS[LAST_RUN] * (1 + 0.08 * (TIMER_CALLS - 1))
    return found


def test_tuner_times_close_candidates_again_interleaved():
    """The first candidate, timed while the GPU was cool, looks fastest (1.00 against 1.03);
    timed again against each other (timings 4 to 7, at drift 1.24 to 1.48: median 1.36), the
    truly faster one wins. cuBLAS, far behind, is timed again too (its first timing was at
    drift 1.16)."""
    registry = FakeRegistry([DriftBackend("early", "good"), DriftBackend("late", "good"),
                             DriftBackend("cublas", "good")])
    table = tune([(16, 8, 8)], dtypes=["float16"], registry=registry, timer=drift_timer,
                 device="cpu", progress=None)
    (entry,) = table["entries"].values()
    assert entry["backend"] == "late"
    assert entry["timings_ms"]["early:default"] == pytest.approx(1.36)
    assert entry["timings_ms"]["late:default"] == pytest.approx(0.95 * 1.36)
    assert entry["timings_ms"]["cublas:default"] == pytest.approx(5.0 * 1.36)


def test_rotations_put_every_item_in_every_place_after_every_other_item():
    from multibackend.timing import rotations

    orders = rotations(["a", "b", "c"], 3)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    many = rotations(list("abcd"), 40)
    assert many == rotations(list("abcd"), 40)  # seeded: a rerun times in the same orders
    assert all(sorted(order) == list("abcd") for order in many)
    for start in range(0, 40, 4):  # each block of four rounds puts every item in every place
        block = many[start:start + 4]
        assert all(sorted(order[place] for order in block) == list("abcd") for place in range(4))
    after = {(order[i - 1], order[i]) for order in many for i in range(1, 4)}
    assert len(after) == 12  # every item runs right after every other one
    assert rotations([], 2) == [[], []]


def test_the_baseline_keeps_a_shape_unless_beaten_by_more_than_the_margin():
    from multibackend.tuner import BASELINE_MARGIN, _winner

    assert BASELINE_MARGIN == pytest.approx(0.02)
    close = {"cublas:default": 1.015, "triton:a": 1.0, "cutlass:b": 1.01}
    assert _winner(close) == "cublas:default"
    clear = {"cublas:default": 1.03, "cublas:other": 1.2, "triton:a": 1.0}
    assert _winner(clear) == "triton:a"
    assert _winner({"triton:a": 1.0, "triton:b": 0.99}) == "triton:b"


def test_a_config_read_back_from_json_is_the_same_hashable_config():
    config = Config.of("128x256x64_2x1x1", tile=(128, 256, 64), cluster=(2, 1, 1), swizzle=1)
    again = Config.from_dict(json.loads(json.dumps(config.as_dict())))
    assert again == config and hash(again) == hash(config)
