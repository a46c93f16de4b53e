"""CPU tier of tuning: the table's write/read/merge, bucketing, environment mismatch, and the
tuner (simulated backends behind a stand-in for the public call, run in the tuner's real child
processes on CPU operands, timed by stand-ins for the GPU timer): dropping wrong, raising,
crashing and hanging candidates with their reasons, never choosing them; timing the finalists
in both modes; keeping torch.matmul unless beaten by more than its measured spread; and the
``--mode`` flag."""
from __future__ import annotations

import io
import json
import os
import statistics
import time
from dataclasses import dataclass, replace

import pytest

from multibackend import cli
from multibackend.choose import tables as tuning
from multibackend.core import environment
from multibackend.core.capability import Reason
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from multibackend.core.names import MIN_SPREAD
from multibackend.core.problem import synthetic
from multibackend.gpu.timing import Timing
from multibackend.io.request import matmul_call
from multibackend.tuning import runner, tuner
from multibackend.tuning.suites import SUITES, Shape, parse_shape, suite
from multibackend.tuning.tuner import summary, tune
from multibackend.tuning.worker import GpuTimer, Item, Spec, figure, public_call, random_operands

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


@pytest.mark.parametrize("field", ["backend", "config", "family", "m"])
def test_read_rejects_an_entry_lookup_cannot_use(tmp_path, field):
    key, e = entry(512, 512, 512, "triton")
    del e[field]
    path = tuning.save_table(table((key, e)), tmp_path / "t.json")
    with pytest.raises(InvalidArgument, match=f"entry '{key}' lacks {field}"):
        tuning.read_table(path)


def test_a_bad_tuning_path_in_the_environment_fails_every_call(tmp_path, monkeypatch):
    """Every call fails naming the variable, and no part of it is used meanwhile (a good
    table before the bad one is loaded once, when the whole variable reads)."""
    good_key, good = entry(256, 256, 256, "triton")
    first = tuning.save_table(tuning.new_table({good_key: good}), tmp_path / "first.json")
    monkeypatch.setenv(tuning.ENV_TUNING, os.pathsep.join([str(first),
                                                           str(tmp_path / "missing.json")]))
    tuning.clear()
    for _ in range(2):  # not once and then silently without the table
        with pytest.raises(InvalidArgument, match="MULTIBACKEND_TUNING is .*does not exist"):
            tuning.status()
        assert not tuning._ENV_TABLES.entries and not tuning._ENV_TABLES.sources
    key, e = entry(512, 512, 512, "raw_wmma")
    tuning.save_table(tuning.new_table({key: e}), tmp_path / "missing.json")
    assert tuning.status().entries == {good_key: good, key: e}
    assert tuning.status().sources == [str(first), str(tmp_path / "missing.json")]
    tuning.clear()


def test_merge_later_entries_win_and_environments_must_match():
    k1, e1 = entry(1024, 1024, 1024, "triton")
    k2, e2 = entry(2048, 2048, 2048, "cutlass")
    merged = tuning.merge(table((k1, e1)), table((k2, e2)), table(entry(1024, 1024, 1024, "cublas")))
    assert set(merged["entries"]) == {k1, k2}
    assert merged["entries"][k1]["backend"] == "cublas"
    with pytest.raises(InvalidArgument, match=r"tables\[1\] and tables\[0\] come from different "
                                              r"environments \(gpu: tables\[1\] 'NVIDIA H100', "
                                              r"tables\[0\] 'NVIDIA H200'\)"):
        tuning.merge(table((k1, e1)), table((k2, e2), env={**ENV, "gpu": "NVIDIA H100"}))


@pytest.mark.parametrize("tables, words", [
    ([{"format": tuning.FORMAT, "entries": {}}], r"tables\[0\] has no 'environment' object"),
    ([table(), table(("k", 3))], r"tables\[1\] entry 'k' lacks everything \(it is not an "
                                 r"object\): every entry needs backend"),
    ([table(), "t.json"], r"tables\[1\] has format None: expected a tuning table of format 1"),
    ([table(), {**table(), "entries": []}], r"tables\[1\] has no 'entries' object")])
def test_merge_refuses_a_table_lookup_cannot_use(tables, words):
    with pytest.raises(InvalidArgument, match=f"^merge: {words}"):
        tuning.merge(*tables)


# -- the tables in use ------------------------------------------------------------------------

@pytest.fixture
def no_tables(monkeypatch):
    """No table loaded and no MULTIBACKEND_TUNING, before and after the test."""
    monkeypatch.delenv(tuning.ENV_TUNING, raising=False)
    tuning.clear()
    yield
    tuning.clear()


def saved(tmp_path, name: str, *entries, env=None) -> str:
    """A table of ``entries`` written to ``name``, in this machine's environment unless
    ``env``."""
    made = table(*entries, env=env) if env else tuning.new_table(dict(entries))
    return str(tuning.save_table(made, tmp_path / name))


def test_the_variables_tables_follow_its_value(tmp_path, monkeypatch, no_tables):
    """A changed value replaces the tables of the former one, and an empty one leaves none."""
    (k1, e1), (k2, e2) = entry(512, 512, 512, "triton"), entry(2048, 2048, 2048, "cutlass")
    first, second = saved(tmp_path, "first.json", (k1, e1)), saved(tmp_path, "second.json",
                                                                   (k2, e2))
    p1 = synthetic(512, 512, 512)
    monkeypatch.setenv(tuning.ENV_TUNING, first)
    assert tuning.lookup(p1).backend == "triton"
    before = tuning.generation()
    monkeypatch.setenv(tuning.ENV_TUNING, second)
    assert tuning.status().entries == {k2: e2} and tuning.status().sources == [second]
    assert tuning.lookup(p1) is None and tuning.generation() != before
    monkeypatch.setenv(tuning.ENV_TUNING, "")
    assert tuning.status().entries == {} and tuning.status().sources == []
    assert tuning.lookup(synthetic(2048, 2048, 2048)) is None


def test_a_table_loaded_in_code_wins_over_the_variables(tmp_path, monkeypatch, no_tables):
    """The variable's tables come first, as if loaded at start, even where they are read
    after the program's own load; a changed value keeps the program's table."""
    key, mine = entry(512, 512, 512, "triton")
    monkeypatch.setenv(tuning.ENV_TUNING, saved(tmp_path, "env.json",
                                                entry(512, 512, 512, "raw_wmma")))
    assert tuning.load_tuning(saved(tmp_path, "mine.json", (key, mine))) == []
    assert tuning.lookup(synthetic(512, 512, 512)).backend == "triton"
    monkeypatch.setenv(tuning.ENV_TUNING, saved(tmp_path, "other.json",
                                                entry(512, 512, 512, "cutlass")))
    assert tuning.lookup(synthetic(512, 512, 512)).backend == "triton"
    assert tuning.status().sources == [str(tmp_path / "other.json"), str(tmp_path / "mine.json")]


def test_a_table_set_aside_is_warned_about_and_explained(tmp_path, monkeypatch, no_tables):
    import torch

    from multibackend.choose import dispatch

    h100 = {**ENV, "gpu": "NVIDIA H100"}
    path = saved(tmp_path, "h100.json", entry(64, 48, 32, "triton"), env=h100)
    diff = "; ".join(tuning.mismatch(h100, environment.fingerprint()))
    monkeypatch.setenv(tuning.ENV_TUNING, path)
    with pytest.warns(RuntimeWarning, match=f"tuning table '{path}' is not used: it was made "
                                            "in another environment .*gpu: table 'NVIDIA H100'"):
        assert tuning.status().rejected == [f"{path}: made in another environment ({diff})"]
    problem = matmul_call(torch.ones(64, 32, dtype=torch.float16),
                          torch.ones(32, 48, dtype=torch.float16)).problem
    decision = dispatch.decide(problem)
    assert f"tuning tables set aside: {path}: made in another environment" in decision.detail


def triton_config_with(problem, **params):
    """Triton's first config with tile parameters for ``problem``, and that config with
    ``params`` changed, as an entry's JSON holds it."""
    from multibackend.choose.registry import REGISTRY

    own = next(c for c in REGISTRY.get("triton").configs(problem) if c.params)
    return own, {**own.as_dict(), **params}


@pytest.fixture
def cpu_problem():
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 32, generator=gen).to(torch.float16)
    b = torch.randn(32, 48, generator=gen).to(torch.float16)
    return a, b, matmul_call(a, b).problem


def test_a_table_config_its_backend_refuses_never_runs(tmp_path, no_tables, cpu_problem):
    """An entry's parameters that no kernel runs whole (GROUP_M 0: a division by zero in the
    tile order) are refused as a caller's config=, and triton's own config of that name runs
    instead, saying so."""
    import torch

    import multibackend as mb
    from multibackend.choose import dispatch

    a, b, problem = cpu_problem
    own, bad = triton_config_with(problem, GROUP_M=0)
    with pytest.raises(InvalidArgument, match="GROUP_M is 0"):
        mb.matmul(a, b, backend="triton", config=Config.from_dict(bad))
    tuning.load_tuning(saved(tmp_path, "t.json", (problem.key, {
        "backend": "triton", "config": bad, "family": tuning.family(problem),
        "m": problem.m, "n": problem.n, "k": problem.k})))
    decision = dispatch.decide(problem)
    assert (decision.rule, decision.backend, decision.config) == ("tuning-table", "triton", own)
    assert (f"the entry's {own.name} fails triton's config check (GROUP_M is 0: expected a "
            f"whole number of at least 1): triton's own {own.name} runs it") in decision.detail
    d = torch.as_tensor(mb.matmul(a, b)).float()
    assert torch.allclose(d, a.float() @ b.float(), rtol=1e-2, atol=1e-2)


def test_an_autotuned_config_its_backend_refuses_never_runs(monkeypatch, no_tables,
                                                            cpu_problem):
    from multibackend.choose import dispatch
    from multibackend.choose import store as autotune

    _, _, problem = cpu_problem
    own, bad = triton_config_with(problem, BLOCK_M=24)
    stored = {"backend": "triton", "config": bad, "mode": "eager", "spread": 0.01,
              "timings_ms": {f"triton:{own.name}": 1.0}}
    monkeypatch.setattr(autotune.STORE, "get", lambda p, mode: stored if p == problem else None)
    decision = dispatch.decide(problem, autotune="eager")
    assert (decision.rule, decision.config) == ("autotune", own)
    assert "BLOCK_M is 24: a tile size is a power of two" in decision.detail


# -- bucketing --------------------------------------------------------------------------------

def test_lookup_exact_entry():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"))
    hit = tuning.lookup(synthetic(4096, 4096, 4096), tables)
    assert hit.backend == "cutlass" and "exact" in hit.detail
    assert hit.config == Config.of("c1", BLOCK_M=128)


def test_lookup_nearest_bucket_within_radius():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"), entry(1024, 1024, 1024, "triton"))
    hit = tuning.lookup(synthetic(3000, 5000, 4504), tables)
    assert hit.backend == "cutlass" and "nearest" in hit.detail
    hit = tuning.lookup(synthetic(1500, 904, 1024), tables)
    assert hit.backend == "triton"


def test_lookup_none_outside_radius_or_family():
    tables = tables_with(entry(4096, 4096, 4096, "cutlass"))
    assert tuning.lookup(synthetic(1024, 4096, 4096), tables) is None  # factor 4 in M
    # rows off the 16-byte grid: another family (cuBLAS leaves its fast kernels there)
    assert tuning.lookup(synthetic(4096, 4096, 4095), tables) is None
    assert tuning.lookup(synthetic(4096, 4096, 4096, "bfloat16"), tables) is None
    assert tuning.lookup(synthetic(4096, 4096, 4096, batch=8), tables) is None


def test_table_from_other_environment_is_reported_not_used(tmp_path):
    key, e = entry(512, 512, 512, "raw_wmma")
    path = tuning.save_table(table((key, e), env={**ENV, "gpu": "Some Other GPU"}),
                             tmp_path / "other.json")
    tables = tuning.TuningTables()
    with pytest.warns(RuntimeWarning, match=f"{path}.* another environment .*gpu: table "
                                            "'Some Other GPU'"):
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
    assert set(SUITES) == {"square", "llm", "odd", "skinny", "batched", "validation",
                           "decode", "few_tile", "misaligned", "misaligned_small",
                           "calibration_decode", "calibration_misaligned", "calibration_large",
                           "validation_wide", "validation_types"}
    decode = suite("decode")
    assert {s.m for s in decode} == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
    assert len({(s.n, s.k) for s in decode}) >= 8 and Shape(1, 1, 128256, 4096) in decode
    tiles = [-(-s.m // 128) * -(-s.n // 256) for s in suite("few_tile")]
    assert max(tiles) <= 2 * 132 and sum(t < 132 for t in tiles) > len(tiles) // 2
    assert {Shape(1, c, c, c) for c in (768, 1000, 1024, 1536, 2048, 2560)} <= set(
        suite("few_tile"))
    assert all(synthetic(s.m, s.n, s.k).misaligned for name in
               ("misaligned", "misaligned_small", "calibration_misaligned") for s in suite(name))
    assert not set(suite("calibration_misaligned")) & (
        set(suite("misaligned")) | set(suite("misaligned_small")) | set(suite("validation")))
    assert not set(suite("calibration_decode")) & (
        set(suite("decode")) | set(suite("few_tile")) | set(suite("validation")))
    assert not any(synthetic(s.m, s.n, s.k).misaligned for s in suite("calibration_decode"))
    tuned = (set(suite("calibration_large")) | set(suite("calibration_decode"))
             | set(suite("calibration_misaligned")))
    wide, types = suite("validation_wide"), suite("validation_types")
    assert set(suite("validation")) <= set(wide) and not (set(wide) | set(types)) & tuned
    assert 2 * len(wide) + 4 * len(types) >= 250  # f16 and bf16; int8, fp8, tf32 and f64
    assert {s.n for s in wide} >= {32000, 50257, 128256, 151936}
    assert any(s.k >= 32768 and s.m * s.n <= 65536 for s in wide)
    assert all(s.m % 16 == 0 and s.n % 16 == 0 and s.k % 16 == 0 and s.m > 16 for s in types)
    scored = {Shape(1, 4096, 4096, 4096), Shape(1, 8192, 8192, 8192), Shape(1, 2048, 8192, 4096)}
    assert not set(suite("calibration_large")) & (
        scored | set(suite("square")) | set(suite("llm")) | set(suite("few_tile"))
        | set(suite("validation")))
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

#: the backend that ran last (in the worker process), for the scripted timers, the M of its
#: problem and the time it slept
LAST_RUN = None
LAST_M = 0
LAST_DELAY_S = 0.0


class FakeBackend:
    """A backend on CPU tensors; ``behaviour`` picks how it runs."""

    parallel_builds = False

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

        global LAST_RUN, LAST_M, LAST_DELAY_S
        LAST_RUN, LAST_M = self, problem.m
        LAST_DELAY_S = self.delay_s * (1 + config.get("delay"))
        crash = self.behaviour in CRASHES and problem.batch == 1  # once, on one problem
        if self.behaviour == "raises":
            raise RuntimeError("kernel launch failed")
        if crash and self.behaviour == "exits":
            os._exit(13)
        if crash and self.behaviour == "aborts":
            os.abort()
        if crash and self.behaviour == "hangs":
            time.sleep(600)
        time.sleep(LAST_DELAY_S)
        d = torch.matmul(ops.a.float(), ops.b.float())
        if self.behaviour == "wrong":
            d = d + 1
        ops.d.copy_(d.to(ops.d.dtype))


class FakeBatchCompiler(FakeBackend):
    """A backend with a parallel compile that builds only its first config."""

    parallel_builds = True

    def prepare_many(self, jobs, max_workers=None):
        return jobs[:1]


class ScriptedBackend(FakeBackend):
    """A correct backend whose time :class:`ScriptedTimer` reports: ``ms`` by mode, its
    timed runs ``width`` apart (p20 to p80, relative); ``in_graph`` "raises" or "exits" when
    it is timed in graph mode."""

    def __init__(self, name: str, ms: dict, width: float = 0.0, in_graph: str | None = None):
        super().__init__(name, "good")
        self.ms, self.width, self.in_graph = ms, width, in_graph

    def timing(self, mode: str, m: int) -> Timing:
        return timing_at(self.ms[mode], self.width)


class ShapeScriptedBackend(ScriptedBackend):
    """A :class:`ScriptedBackend` whose time depends on the problem: ``cases`` maps M to
    (milliseconds in every mode, width)."""

    def __init__(self, name: str, cases: dict):
        super().__init__(name, {})
        self.cases = cases

    def timing(self, mode: str, m: int) -> Timing:
        return timing_at(*self.cases[m])


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


@dataclass(frozen=True)
class RegistryMatmul:
    """The public call's stand-in: validates the call as ``multibackend.matmul`` does, then
    runs the named backend of ``registry`` into ``out`` (or a D of its own), and returns D."""

    registry: FakeRegistry

    def __call__(self, A, B, *, backend, config, out=None):
        call = matmul_call(A, B, out=out)
        self.registry.get(backend).run(call.problem, call.operands, config)
        return call.operands.d[0] if call.squeeze else call.operands.d


def test_a_timed_candidate_is_called_as_the_compiled_front_serves_it():
    """Timed, a candidate is ``matmul(A, B, backend=name, config=c)`` with no other keyword
    (the call the compiled front serves once repeated, as it serves one planned from a
    table); checked, it writes into the ``out`` given."""
    seen = []

    def matmul(A, B, **keywords):
        seen.append((A, B, keywords))
        return "D"

    item = Item(0, 0, "triton", {"name": "64x64", "BLOCK_M": 64})
    call = public_call(matmul, item, "A", "B")
    assert call() == "D" and call("out") == "D"
    config = Config.of("64x64", BLOCK_M=64)
    assert seen == [("A", "B", {"backend": "triton", "config": config}),
                    ("A", "B", {"backend": "triton", "config": config, "out": "out"})]


CRASHES = ("exits", "aborts", "hangs")


def timing_at(ms: float, width: float = 0.0) -> Timing:
    """A Timing of median ``ms`` whose p20 and p80 lie ``width`` (relative) apart."""
    low, high = ms * (1 - width / 2), ms * (1 + width / 2)
    return Timing(ms, low, low, high, 3)


@dataclass(frozen=True)
class NominalTimer:
    """The CPU stand-in for the GPU timer: runs each call (so a crash or a hang happens for
    real) and reports the time its :class:`FakeBackend` slept, not the wall clock, which a
    loaded machine stretches (its mode only a label)."""

    mode: str = "eager"

    def __call__(self, calls: dict) -> dict:
        found = {}
        for key, fn in calls.items():
            fn()
            found[key] = timing_at(LAST_DELAY_S * 1e3)
        return found

    def in_mode(self, mode: str) -> "NominalTimer":
        return replace(self, mode=mode)


@dataclass(frozen=True)
class ScriptedTimer:
    """Reports what each call's :class:`ScriptedBackend` says it takes in the timer's mode
    on the call's problem."""

    mode: str = "eager"

    def __call__(self, calls: dict) -> dict:
        found = {}
        for key, fn in calls.items():
            fn()
            backend = LAST_RUN
            if self.mode == "graph" and backend.in_graph == "raises":
                raise RuntimeError("operation not permitted when stream is capturing")
            if self.mode == "graph" and backend.in_graph == "exits":
                os._exit(13)
            found[key] = backend.timing(self.mode, LAST_M)
        return found

    def in_mode(self, mode: str) -> "ScriptedTimer":
        return replace(self, mode=mode)


def tune_fake(registry: FakeRegistry, timer=None, shapes=((16, 8, 8),), **kwargs) -> dict:
    """``tune`` over the simulated backends of ``registry``, on CPU operands."""
    return tune(list(shapes), dtypes=["float16"], registry=registry,
                matmul=RegistryMatmul(registry), timer=timer or ScriptedTimer(), device="cpu",
                progress=kwargs.pop("progress", None), **kwargs)


def only_entry(table: dict) -> dict:
    (found,) = table["entries"].values()
    return found


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
MODES = ("eager", "graph")


@pytest.fixture(scope="module")
def tuned():
    out = io.StringIO()
    table = tune_fake(REGISTRY, NominalTimer(), SHAPES, timeout_s=3, progress=out)
    return table, out.getvalue()


def entries(table) -> tuple[dict, dict]:
    """(the single problem's entry, the batched problem's entry)"""
    found = sorted(table["entries"].values(), key=lambda e: e["batch"])
    assert [e["batch"] for e in found] == [1, 2]
    return found[0], found[1]


def test_tuner_keeps_the_fastest_correct_candidate(tuned):
    table, _ = tuned
    single, batched = entries(table)
    assert set(single["screening_ms"]) == {"cublas:default", "good:fast", "good:slow",
                                           "batch:built"}
    assert set(batched["screening_ms"]) == set(single["screening_ms"]) | {
        f"{name}:default" for name in CRASHES}
    for e in (single, batched):  # each backend's fastest is a finalist (good:slow may be too)
        best_of = {"cublas:default", "good:fast", "batch:built"}
        if e is batched:
            best_of |= {f"{name}:default" for name in CRASHES}
        assert set(e["timings_ms"]["eager"]) == set(e["timings_ms"]["graph"])
        assert best_of <= set(e["timings_ms"]["eager"]) <= best_of | {"good:slow"}
        assert (e["backend"], e["config"]["name"]) == ("good", "fast")
        assert e["mode"] == "eager" and e["spread"] >= MIN_SPREAD["eager"]
        for mode in MODES:
            assert e["baseline_ms"][mode] == e["timings_ms"][mode]["cublas:default"] > 0
        assert e["family"] == tuning.family(synthetic(e["m"], e["n"], e["k"],
                                                      batch=e["batch"]))
    assert (batched["m"], batched["n"], batched["k"]) == (24, 16, 40)


def test_tuner_drops_failing_and_crashing_candidates_with_reasons(tuned):
    table, _ = tuned
    single, batched = entries(table)
    dropped = single["dropped"]
    assert set(dropped) == {"wrong:default", "raises:default", "exits:default",
                            "aborts:default", "hangs:default", "batch:unbuilt"}
    assert dropped["wrong:default"].startswith("wrong: relative error")
    assert dropped["raises:default"] == "raised: RuntimeError: kernel launch failed"
    assert dropped["exits:default"].startswith("crashed: exit code 13")
    assert dropped["aborts:default"].startswith("crashed: exit code -6 (SIGABRT)")
    assert dropped["hangs:default"] == "timed out after 3 s"
    assert "compile failed" in dropped["batch:unbuilt"]
    assert set(batched["dropped"]) == {"wrong:default", "raises:default", "batch:unbuilt"}
    for e in (single, batched):
        assert e["refused"] == {"refuses": "refuses every shape"}
        assert not set(e["dropped"]) & set(e["screening_ms"])
        assert e["final_dropped"] == {"eager": {}, "graph": {}}


def test_tuner_reports_progress_and_summary(tuned):
    table, text = tuned
    assert "candidates" in text and "ETA" in text
    assert "offline: not tuned, unavailable here: no such device" in text
    assert "tuned 2 problems" in text and "dropped candidates:" in text
    assert "crashed: exit code -6 (SIGABRT)" in summary(table)
    assert "x torch.matmul" in text and "cuBLAS" not in text
    assert "geometric mean of the winners over torch.matmul, eager mode:" in text


def test_tuned_table_round_trips_and_drives_lookup(tuned, tmp_path):
    table, _ = tuned
    path = tuning.save_table(table, tmp_path / "tuned.json")
    tables = tuning.TuningTables()
    assert tuning.load_tuning(path, tables=tables) == []
    hit = tuning.lookup(synthetic(48, 40, 32, device="cpu", cc=None), tables)
    assert hit.backend == "good" and hit.config.name == "fast"


def test_a_layout_tunes_operands_in_its_major_orders_into_its_family():
    """``layout="nt"`` (``x @ W.T``): the candidates run on a column-major B, and the entry
    is of the (row, col) family, which a plain A @ B never looks up."""
    registry = FakeRegistry([FakeBackend("cublas", "good", delay_s=0.03),
                             FakeBackend("good", "good", configs=("fast",), delay_s=0.008)])
    table = tune_fake(registry, NominalTimer(), [(48, 40, 32)], timeout_s=3, layout="nt")
    entry = only_entry(table)
    assert entry["layout"] == "nt" and (entry["backend"], entry["config"]["name"]) == (
        "good", "fast")
    assert entry["family"] == tuning.family(synthetic(48, 40, 32, b_layout="col"))
    assert entry["family"] != tuning.family(synthetic(48, 40, 32))
    with pytest.raises(InvalidArgument, match=r"tune: layout is 'nx': expected one of nn, "
                                              r"nt, tn, tt"):
        tune_fake(registry, layout="nx")


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_random_operands_come_in_the_layout_asked(layout):
    torch = pytest.importorskip("torch")
    a, b = random_operands(Spec(Shape(1, 24, 40, 32), "int8", layout), "cpu", seed=1)
    assert tuple(a.shape) == (24, 32) and tuple(b.shape) == (32, 40)
    for t, letter in ((a, layout[0]), (b, layout[1])):
        assert (t.stride(-2) == 1) == (letter == "t") and (t.stride(-1) == 1) == (letter == "n")
        assert t.dtype == torch.int8 and int(t.min()) >= -8 and int(t.max()) < 8
        assert bool((t != 0).any())


def test_tune_rejects_bad_arguments():
    fake = RegistryMatmul(REGISTRY)
    with pytest.raises(InvalidArgument, match="backend 'nope'"):
        tune([(8, 8, 8)], backends=["nope"], registry=REGISTRY, matmul=fake, device="cpu",
             progress=None)
    with pytest.raises(InvalidArgument, match="max_configs is 0"):
        tune([(8, 8, 8)], max_configs=0, registry=REGISTRY, matmul=fake, device="cpu",
             progress=None)
    with pytest.raises(InvalidArgument, match="shape"):
        tune([(8, 0, 8)], registry=REGISTRY, matmul=fake, device="cpu", progress=None)
    with pytest.raises(InvalidArgument, match="registry is given but matmul is None"):
        tune([(8, 8, 8)], registry=REGISTRY, device="cpu", progress=None)


def test_a_bad_mode_is_refused_naming_the_value_and_the_modes():
    with pytest.raises(InvalidArgument, match=r"tune: mode is 'kernel': expected one of "
                                              r"eager, graph"):
        tune([(8, 8, 8)], mode="kernel", registry=REGISTRY, matmul=RegistryMatmul(REGISTRY),
             device="cpu", progress=None)
    with pytest.raises(InvalidArgument, match=r"GpuTimer: mode is 'Eager': expected one of "
                                              r"eager, graph"):
        GpuTimer(mode="Eager")


class RecordingRunner:
    """Stands in for the tuner's runner: keeps the job it was given and runs nothing."""

    jobs: list = []

    def __init__(self, plan, job, *args):
        self.jobs.append(job)

    def run(self):
        return runner.Results()


@pytest.mark.parametrize("quick, expected", [
    (False, GpuTimer(mode="graph")),
    (True, GpuTimer(warmup=2, reps=10, max_seconds=1.0, mode="graph"))])
def test_tune_times_with_the_gpu_timer_in_the_mode_asked(monkeypatch, quick, expected):
    monkeypatch.setattr(tuner, "Runner", RecordingRunner)
    RecordingRunner.jobs.clear()
    tune([(8, 8, 8)], mode="graph", quick=quick, registry=REGISTRY,
         matmul=RegistryMatmul(REGISTRY), device="cpu", progress=None)
    (job,) = RecordingRunner.jobs
    assert job.timer == expected


#: each timing runs 8% slower than the one before (a GPU warming up)
TRUE_MS = {"early": 1.0, "late": 0.95, "cublas": 5.0}
TIMER_CALLS = 0


@dataclass(frozen=True)
class DriftTimer:
    """Times the calls against each other: all at the drift of this timing."""

    mode: str = "eager"

    def __call__(self, calls: dict) -> dict:
        global TIMER_CALLS
        TIMER_CALLS += 1
        found = {}
        for key, fn in calls.items():
            fn()
            found[key] = timing_at(TRUE_MS[LAST_RUN.name] * (1 + 0.08 * (TIMER_CALLS - 1)))
        return found

    def in_mode(self, mode: str) -> "DriftTimer":
        return replace(self, mode=mode)


def test_tuner_times_close_candidates_again_interleaved():
    """The first candidate, timed while the GPU was cool, looks fastest (1.00 against 1.03);
    timed again against each other in the eager rounds (timings 4 to 7, at drift 1.24 to
    1.48: median 1.36), the truly faster one wins. cuBLAS, far behind, is timed again too (its
    first timing was at drift 1.16). The graph rounds follow (timings 8 to 11: median 1.68)."""
    registry = FakeRegistry([FakeBackend("early", "good"), FakeBackend("late", "good"),
                             FakeBackend("cublas", "good")])
    entry = only_entry(tune_fake(registry, DriftTimer()))
    assert entry["backend"] == "late"
    assert entry["screening_ms"]["early:default"] == pytest.approx(1.0)
    for mode, drift in (("eager", 1.36), ("graph", 1.68)):
        assert entry["timings_ms"][mode] == pytest.approx(
            {"early:default": drift, "late:default": 0.95 * drift, "cublas:default": 5 * drift})


def test_the_table_records_both_modes_and_chooses_in_the_mode_asked():
    registry = FakeRegistry([ScriptedBackend("eagerly", {"eager": 1.0, "graph": 3.0}),
                             ScriptedBackend("graphy", {"eager": 3.0, "graph": 1.0}),
                             ScriptedBackend("cublas", {"eager": 2.0, "graph": 2.0})])
    entry = only_entry(tune_fake(registry, mode="graph"))
    assert (entry["mode"], entry["backend"]) == ("graph", "graphy")
    assert entry["timings_ms"] == {
        "eager": {"eagerly:default": 1.0, "graphy:default": 3.0, "cublas:default": 2.0},
        "graph": {"eagerly:default": 3.0, "graphy:default": 1.0, "cublas:default": 2.0}}
    assert entry["baseline_ms"] == {"eager": 2.0, "graph": 2.0}
    assert entry["screening_ms"] == {"eagerly:default": 3.0, "graphy:default": 1.0,
                                     "cublas:default": 2.0}  # timed in the mode asked


def test_a_figure_takes_the_larger_of_the_rounds_range_and_the_p20_p80_width():
    apart = [timing_at(1.0, 0.005), timing_at(1.02, 0.005), timing_at(0.99, 0.005),
             timing_at(1.0, 0.005)]
    assert figure(apart).ms == pytest.approx(1.0)
    assert figure(apart).spread == pytest.approx(0.03)
    wide = [timing_at(2.0, 0.05), timing_at(2.0, 0.04), timing_at(2.02, 0.06)]
    assert figure(wide).spread == pytest.approx(0.05)


def test_the_baseline_keeps_a_shape_unless_beaten_by_more_than_the_spread():
    from multibackend.tuning.tuner import _winner

    assert _winner({"cublas:default": 1.0, "triton:a": 0.995}, 0.02) == "cublas:default"
    assert _winner({"cublas:default": 1.0, "triton:a": 0.95}, 0.02) == "triton:a"
    assert _winner({"cublas:default": 1.0, "cublas:b": 1.2, "triton:a": 0.97},
                   0.02) == "triton:a"
    assert _winner({"triton:a": 1.0, "triton:b": 0.99}, 0.02) == "triton:b"


#: M -> (the rival's milliseconds and width, cuBLAS's width (its are 1.0), the winner, the
#: spread)
SPREAD_CASES = {
    16: (0.995, 0.0, 0.04, "cublas", 0.04),  # 0.5% faster, within cuBLAS's 4% spread
    17: (0.95, 0.0, 0.04, "rival", 0.04),  # 5% faster
    18: (0.985, 0.0, 0.0, "cublas", 0.03),  # no measured spread: eager's 3% floor holds
    19: (0.965, 0.0, 0.0, "rival", 0.03),
    20: (0.95, 0.08, 0.02, "cublas", 0.08),  # 5% faster, within the rival's own 8% spread
    21: (0.90, 0.08, 0.02, "rival", 0.08)}


class DriftingBackend(ScriptedBackend):
    """Runs taking ``ms`` by mode on a host that drifts by 60% over each round's ten runs: every
    call timed in the round sees the same drift, run by run, as interleaved runs do."""

    def timing(self, mode: str, m: int) -> Timing:
        samples = tuple(self.ms[mode] * (1 + 0.6 * i / 9) for i in range(10))
        ordered = sorted(samples)
        return Timing(statistics.median(ordered), ordered[0], ordered[2], ordered[7], 10,
                      samples)


def test_a_lead_the_hosts_drift_hides_in_each_figure_is_found_in_the_paired_runs():
    """The rival runs 12% faster in every round; each figure alone spreads by 26%, which would
    keep cuBLAS, but its runs' ratios to cuBLAS's in the same rounds do not spread at all: only
    the mode's floor is asked of it."""
    registry = FakeRegistry([DriftingBackend("rival", {"eager": 0.88, "graph": 0.88}),
                             DriftingBackend("cublas", {"eager": 1.0, "graph": 1.0})])
    entry = only_entry(tune_fake(registry))
    assert entry["backend"] == "rival"
    assert entry["spread"] == pytest.approx(MIN_SPREAD["eager"])


def test_a_candidate_must_beat_torch_by_more_than_the_measured_spread():
    registry = FakeRegistry([
        ShapeScriptedBackend("rival", {m: (ms, width)
                                       for m, (ms, width, *_) in SPREAD_CASES.items()}),
        ShapeScriptedBackend("cublas", {m: (1.0, width)
                                        for m, (_, _, width, *_) in SPREAD_CASES.items()})])
    table = tune_fake(registry, shapes=[(m, 8, 8) for m in SPREAD_CASES])
    rows = summary(table).splitlines()
    assert "x torch.matmul" in rows[1] and "spread" in rows[1]
    for entry in table["entries"].values():
        rival_ms, _, _, winner, spread = SPREAD_CASES[entry["m"]]
        assert entry["backend"] == winner
        assert entry["spread"] == pytest.approx(spread)
        best = rival_ms if winner == "rival" else 1.0
        (row,) = [line for line in rows if line.startswith(f"{entry['m']}x8x8 ")]
        assert row.split()[2:] == ["eager", f"{winner}:default", f"{best:.4f}",
                                   f"{1.0 / best:.2f}", f"{spread * 100:.1f}%"]


@pytest.mark.parametrize("in_graph, reason", [
    ("raises", "raised: RuntimeError: operation not permitted when stream is capturing"),
    ("exits", "crashed: exit code 13 in the graph-mode final rounds")])
def test_a_finalist_that_fails_in_graph_mode_keeps_its_eager_figures(in_graph, reason):
    registry = FakeRegistry([
        ScriptedBackend("uncaptured", {"eager": 0.5, "graph": 0.5}, in_graph=in_graph),
        ScriptedBackend("other", {"eager": 0.8, "graph": 0.7}),
        ScriptedBackend("cublas", {"eager": 1.0, "graph": 1.0})])
    entry = only_entry(tune_fake(registry))
    assert entry["backend"] == "uncaptured"
    assert entry["timings_ms"]["eager"] == {"uncaptured:default": 0.5, "other:default": 0.8,
                                            "cublas:default": 1.0}
    if in_graph == "raises":  # the others are timed without it
        assert entry["timings_ms"]["graph"] == {"other:default": 0.7, "cublas:default": 1.0}
        assert entry["final_dropped"]["graph"] == {"uncaptured:default": reason}
    else:  # the worker died: none of the graph rounds was timed
        assert entry["timings_ms"]["graph"] == {}
        assert entry["final_dropped"]["graph"] == {key: reason for key in (
            "uncaptured:default", "other:default", "cublas:default")}
    assert entry["final_dropped"]["eager"] == {}


MODE_REGISTRY = FakeRegistry([ScriptedBackend("eagerly", {"eager": 1.0, "graph": 3.0}),
                              ScriptedBackend("graphy", {"eager": 3.0, "graph": 1.0}),
                              ScriptedBackend("cublas", {"eager": 2.0, "graph": 2.0})])


@pytest.mark.parametrize("flags, mode, graphy_first_ms", [
    ([], "eager", 3.0), (["--mode", "graph"], "graph", 1.0)])
def test_the_cli_mode_flag_reaches_the_timer(monkeypatch, tmp_path, flags, mode,
                                             graphy_first_ms):
    real_tune = tuner.tune

    def on_fakes(shapes, **kwargs):
        return real_tune(shapes, registry=MODE_REGISTRY, matmul=RegistryMatmul(MODE_REGISTRY),
                         timer=ScriptedTimer(), device="cpu", **{**kwargs, "progress": None})

    monkeypatch.setattr(tuner, "tune", on_fakes)
    out = tmp_path / "table.json"
    assert cli.main(["tune", "--shape", "16x8x8", "--out", str(out), *flags]) == 0
    entry = only_entry(tuning.read_table(out))
    assert entry["mode"] == mode
    assert entry["screening_ms"]["graphy:default"] == graphy_first_ms  # timed in the mode


def tune_stub(monkeypatch, made: dict | None) -> list:
    """``tuner.tune`` replaced by one that returns ``made`` (None: fails the test), and the
    list of the shapes it was called with."""
    calls = []

    def stub(shapes, **kwargs):
        assert made is not None, "tune ran"
        calls.append(shapes)
        return made

    monkeypatch.setattr(tuner, "tune", stub)
    return calls


@pytest.mark.parametrize("content, words", [
    ("{not json", "is not valid JSON"),
    (json.dumps({"format": tuning.FORMAT, "entries": {}}), "has no 'environment' object")])
def test_tune_merge_refuses_an_out_that_is_no_table_before_the_run(
        monkeypatch, tmp_path, capsys, content, words):
    out = tmp_path / "t.json"
    out.write_text(content)
    tune_stub(monkeypatch, None)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--shape", "16x8x8", "--out", str(out), "--merge"])
    assert exit_info.value.code == 2
    assert f"tune: --merge into --out '{out}': load_tuning: '{out}' {words}" in \
        capsys.readouterr().err
    assert out.read_text() == content


def test_tune_merge_refuses_an_out_of_another_environment_before_the_run(
        monkeypatch, tmp_path, capsys):
    out = tmp_path / "t.json"
    tuning.save_table(table(entry(512, 512, 512, "triton")), out)
    before = out.read_text()
    tune_stub(monkeypatch, None)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--shape", "16x8x8", "--out", str(out), "--merge"])
    assert exit_info.value.code == 2
    here = environment.fingerprint()
    err = capsys.readouterr().err
    assert (f"tune: --merge into --out '{out}': that table was made in another environment "
            f"than this machine (cc: {out} '9.0', this machine {here['cc']!r};") in err
    assert f"gpu: {out} 'NVIDIA H200', this machine {here['gpu']!r}" in err
    assert out.read_text() == before


def test_tune_merge_adds_the_run_to_out(monkeypatch, tmp_path):
    out = tmp_path / "t.json"
    k1, e1 = entry(512, 512, 512, "triton")
    k2, e2 = entry(1024, 1024, 1024, "cutlass")
    tuning.save_table(tuning.new_table({k1: e1, k2: e2}), out)
    k3, e3 = entry(1024, 1024, 1024, "triton")
    calls = tune_stub(monkeypatch, tuning.new_table({k2: e3, k3: e3}))
    assert cli.main(["tune", "--shape", "16x8x8", "--out", str(out), "--merge"]) == 0
    assert calls == [["16x8x8"]]
    assert tuning.read_table(out)["entries"] == {k1: e1, k2: e3}


def test_tune_merge_over_a_scheduler_keeps_a_run_of_another_environment(
        monkeypatch, tmp_path, capsys):
    """The workers' environment is known only once the run starts: a run that cannot merge
    is written beside --out, not thrown away."""
    out = tmp_path / "t.json"
    tuning.save_table(table(entry(512, 512, 512, "triton"), env={**ENV, "gpu": "NVIDIA H100"}),
                      out)
    before = out.read_text()
    run = table(entry(1024, 1024, 1024, "triton"))
    tune_stub(monkeypatch, run)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--shape", "16x8x8", "--out", str(out), "--merge",
                  "--scheduler", "tcp://host:8786"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    kept = tmp_path / "t.unmerged.json"
    assert (f"than this run (gpu: {out} 'NVIDIA H100', this run 'NVIDIA H200'): only tables "
            f"of one environment merge; this run is written to {kept}") in err
    assert tuning.read_table(kept) == run and out.read_text() == before


def test_the_cli_refuses_an_unknown_mode(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["tune", "--shape", "16x8x8", "--out", str(tmp_path / "t.json"),
                  "--mode", "kernel"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--mode" in err and "'kernel'" in err and "'eager'" in err and "'graph'" in err


def test_rotations_put_every_item_in_every_place_after_every_other_item():
    from multibackend.gpu.timing import rotations

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


def _benchmark_module(name: str):
    """A script of benchmarks/ loaded as a module (they are not a package)."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        name, pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_ratio_compares_runs_of_the_same_round():
    import statistics

    from multibackend.gpu.timing import Timing, paired_ratio

    # the host slows over the run: every run of round i takes (1 + i / 10) as long, the
    # second call 3% longer than the first within each round
    slow = [1 + i / 10 for i in range(9)]
    first, second = ([ms * f for f in slow] for ms in (1.0, 1.03))
    late = [*second[1:], second[0] * 9]  # the second call's runs shifted by one round
    def timing(samples):
        return Timing(statistics.median(samples), min(samples), 0, 0, len(samples),
                      tuple(samples))
    assert paired_ratio(timing(second), timing(first)) == pytest.approx(1.03)
    assert paired_ratio(timing(late), timing(first)) != pytest.approx(1.03)  # pairs by round
    with pytest.raises(ValueError, match="expected two timed together"):
        paired_ratio(timing(first), timing(first[:3]))
    validation = _benchmark_module("gpu_validation")
    timed = {"torch": timing(first), "auto": timing([f * 1.01 for f in first]),
             "auto_autotune": timing(second)}
    assert validation.paired_vs_fastest(timed) == pytest.approx(1 / 1.03)
    assert validation.paired_vs_fastest({"torch": timing(first)}) is None
    rows = [{"backend": "auto", "torch_ms": 1.0, "ms": 1.1, "paired": 0.97}]
    assert "min 0.909" in validation.member_lines(rows, "eager")[1]
    by_round = validation.member_lines(rows, "eager", paired=True)
    assert "paired by round" in by_round[0] and "min 0.970" in by_round[1]


def test_benchmark_members_call_as_named_and_leave_out_a_backend_offering_nothing(
        tmp_path, capsys, monkeypatch):
    import multibackend as mb

    validation = _benchmark_module("gpu_validation")
    seen = []
    monkeypatch.setattr(mb, "matmul", lambda a, b, **kwargs: seen.append((a, b, kwargs)))
    names = ["auto", "triton", "cutlass", "cutlass:autotune", "auto_autotune"]
    calls = validation.member_calls(names, "A", "B", "graph", configs={"cutlass": None})
    assert list(calls) == ["torch", "auto", "triton", "cutlass:autotune", "auto_autotune"]
    for name in names:
        calls.get(name, lambda: None)()
    # a backend's default is called with no config at all: the public call's shortest path
    assert seen == [("A", "B", {}), ("A", "B", {"backend": "triton"}),
                    ("A", "B", {"backend": "cutlass", "config": "autotune"}),
                    ("A", "B", {"autotune": "graph"})]
    seen.clear()
    validation.member_calls(["cutlass"], "A", "B", configs={"cutlass": "k"})["cutlass"]()
    assert seen == [("A", "B", {"backend": "cutlass", "config": "k"})]
    seen.clear()
    kind, options = validation.operand_dtype("tf32")
    assert (kind, options) == ("float32", {"precision": "tf32"})
    calls = validation.member_calls(["auto", "triton"], "A", "B", options=options)
    for name in ("auto", "triton"):
        calls[name]()
    assert seen == [("A", "B", {"precision": "tf32"}),
                    ("A", "B", {"backend": "triton", "precision": "tf32"})]
    validation.write_report(tmp_path / "rows.json", [{"ms": 1.5}], ["summary"], ["a note"])
    assert json.loads((tmp_path / "rows.json").read_text()) == [{"ms": 1.5}]
    assert capsys.readouterr().out == "summary\n  note: a note\n"


def test_a_config_read_back_from_json_is_the_same_hashable_config():
    config = Config.of("128x256x64_2x1x1", tile=(128, 256, 64), cluster=(2, 1, 1), swizzle=1)
    again = Config.from_dict(json.loads(json.dumps(config.as_dict())))
    assert again == config and hash(again) == hash(config)
