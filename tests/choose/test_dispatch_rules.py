"""CPU tier for untuned ``auto``: the dispatch order around the baseline, the calibrated
rule, first-call autotuning's options and store, and the validation suite's independence."""
from __future__ import annotations

import json
import math

import pytest

from multibackend.choose import calibration, dispatch
from multibackend.choose import store as autotune
from multibackend.choose import tables as tuning
from multibackend.core.capability import Reason
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import synthetic
from multibackend.gpu.timing import Timing
from multibackend.tuning.suites import SUITES, VALIDATION_TOKENS
from multibackend.verify import measure


class _Backend:
    def __init__(self, name, refuse=False, built=True):
        self.name, self.refuse, self._built = name, refuse, built

    def supports(self, problem):
        return Reason(self.name, "dtype", "refused here") if self.refuse else None

    def note(self, problem):
        return None

    def configs(self, problem):
        return [Config.of("default"), Config.of("wide")]

    def default_config(self, problem):
        return self.configs(problem)[0]

    def check_config(self, problem, config):
        return None

    def config_named(self, problem, name):
        return Config.of(name) if name == "unlisted" else None

    def built(self, problem, config):
        return self._built


class _Registry:
    """Every backend available; ``refuse`` names the ones that refuse the problem."""

    def __init__(self, refuse=(), unbuilt=()):
        self.names = ("cublas", "triton", "raw_wmma", "cutlass")
        self.backends = {n: _Backend(n, n in refuse, n not in unbuilt) for n in self.names}

    def check_name(self, name, op="matmul", argument="backend"):
        if name not in self.names:
            raise InvalidArgument(name)

    def get(self, name):
        return self.backends[name]

    def availability(self, name):
        return None


P = synthetic(512, 4096, 4096, "float16", cc=(9, 0))


@pytest.fixture(autouse=True)
def no_tables(monkeypatch):
    monkeypatch.delenv("MULTIBACKEND_TUNING", raising=False)
    monkeypatch.delenv("MULTIBACKEND_BACKEND", raising=False)
    monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    tuning.clear()
    calibration.entries_for.cache_clear()


def _calibration(monkeypatch, *entries, gpu="GPU A"):
    data = tuple(calibration.Measured(gpu, str(i), e) for i, e in enumerate(entries))
    _measured(monkeypatch, data)


def _measured(monkeypatch, data):
    monkeypatch.setattr(calibration, "entries_for", lambda cc: data if cc == (9, 0) else ())


def _entry(backend, m, n, k, problem=P, config="wide"):
    """A tuner's entry won by ``backend`` by 10% in both timing modes."""
    figures = {f"{backend}:{config}": 1.0, "cublas:default": 1.1}
    return {"backend": backend, "config": {"name": config}, "family": tuning.family(problem),
            "m": m, "n": n, "k": k, "timings_ms": {"eager": dict(figures), "graph": figures},
            "mode": "graph"}


def test_untuned_auto_is_cublas_where_nothing_was_measured():
    far = synthetic(8192, 8192, 8192)  # 4x past every committed calibration entry in M
    d = dispatch.decide(far, registry=_Registry())
    assert (d.backend, d.rule) == ("cublas", "baseline")
    assert "no calibration measurement" in d.detail


def test_the_shipped_int8_calibration_gives_large_x_at_w_t_products_to_raw_wmma(monkeypatch):
    """The H200's int8 ``x @ W.T`` entries (cubes from 3072 to 12288 and rectangles between)
    reach 8192^3 and 4096^3, shapes they were not tuned on, on that GPU model; a plain
    int8 A @ B (another family) and a small product stay with cuBLAS."""
    monkeypatch.setattr(calibration.environment, "device_name", lambda device: "NVIDIA H200")
    for m, n, k in ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 4096)):
        advice = calibration.advise(synthetic(m, n, k, "int8", b_layout="col", cc=(9, 0)))
        assert advice.backend == "raw_wmma", advice.detail
        assert advice.config is None  # no entry of this very shape: the backend's default
    assert calibration.advise(synthetic(8192, 8192, 8192, "int8", cc=(9, 0))).backend is None
    small = synthetic(512, 512, 512, "int8", b_layout="col", cc=(9, 0))
    assert calibration.advise(small).backend is None


def test_cublas_refusing_falls_back_in_order():
    d = dispatch.decide(P, registry=_Registry(refuse=("cublas",)))
    assert (d.backend, d.rule) == ("triton", "fallback")
    d = dispatch.decide(P, registry=_Registry(refuse=("cublas", "triton")))
    assert (d.backend, d.rule) == ("raw_wmma", "fallback")


def test_calibration_picks_a_backend_only_where_every_neighbour_agrees(monkeypatch):
    _calibration(monkeypatch, _entry("triton", 400, 4096, 4096), _entry("triton", 700, 5000, 4096))
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.rule) == ("triton", "calibrated")
    assert "all 2 calibration measurement(s)" in d.detail and "1.10x" in d.detail
    # a config measured on a neighbour is not carried over: the backend chooses its own
    assert d.config.name == "default" and "chooses its config for this shape" in d.detail
    _calibration(monkeypatch, _entry("triton", 512, 4096, 4096), _entry("triton", 700, 5000, 4096))
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.config.name) == ("triton", "wide")  # this very shape's entry
    _calibration(monkeypatch, _entry("triton", 400, 4096, 4096), _entry("cublas", 600, 4096, 4096,
                                                                         config="default"))
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.rule) == ("cublas", "baseline") and "won by cublas, triton" in d.detail


def test_calibration_of_this_gpu_model_first_else_every_model_must_agree(monkeypatch):
    """Where the GPU model running the call has entries of the problem's family, only they
    count; elsewhere (another model of the compute capability, or no GPU to name) every
    model's entries count and must agree; a family this model lacks falls back to the
    others'."""
    a, b = _entry("triton", 512, 4096, 4096), _entry("cublas", 512, 4096, 4096, config="default")
    _measured(monkeypatch, (calibration.Measured("GPU A", "a", a),
                            calibration.Measured("GPU B", "b", b)))
    names = {"cuda:0": "GPU A", "cuda:1": "GPU B", "cuda:2": "GPU C"}
    monkeypatch.setattr(calibration.environment, "device_name", names.get)
    on = {dev: synthetic(512, 4096, 4096, "float16", cc=(9, 0), device=dev) for dev in names}
    d = dispatch.decide(on["cuda:0"], registry=_Registry())
    assert (d.backend, d.rule) == ("triton", "calibrated") and "GPU A: a" in d.detail
    d = dispatch.decide(on["cuda:1"], registry=_Registry())
    assert (d.backend, d.rule) == ("cublas", "baseline")
    assert "won by cublas; nearest GPU B: b" in d.detail
    for dev in ("cuda:2", "cpu"):
        problem = on.get(dev) or synthetic(512, 4096, 4096, "float16", cc=(9, 0), device=dev)
        d = dispatch.decide(problem, registry=_Registry())
        assert (d.backend, d.rule) == ("cublas", "baseline")
        assert "won by cublas, triton" in d.detail
    bf16 = synthetic(512, 4096, 4096, "bfloat16", cc=(9, 0), device="cuda:1")
    _measured(monkeypatch, (calibration.Measured("GPU A", "a", _entry("triton", 512, 4096, 4096,
                                                                      problem=bf16)),
                            calibration.Measured("GPU B", "b", b)))
    d = dispatch.decide(bf16, registry=_Registry())  # GPU B measured no bf16
    assert (d.backend, d.rule) == ("triton", "calibrated") and "GPU A: a" in d.detail
    assert "none on GPU B" in calibration.ground(bf16)[1]


def test_a_tuned_config_runs_only_where_its_backend_offers_it(monkeypatch):
    tables = tuning.TuningTables(entries={P.key: _entry("triton", 512, 4096, 4096)})
    monkeypatch.setattr(tuning, "_TABLES", tables)
    monkeypatch.setattr(tuning, "status", lambda: tables)
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.rule, d.config.name) == ("triton", "tuning-table", "wide")
    tables.entries[P.key]["config"] = {"name": "tile-of-another-shape"}
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.rule, d.config.name) == ("triton", "tuning-table", "default")
    assert "tile-of-another-shape is not among triton's configs" in d.detail
    # a config the list leaves out but the backend runs by its name (config_named) is kept
    tables.entries[P.key]["config"] = {"name": "unlisted"}
    d = dispatch.decide(P, registry=_Registry())
    assert (d.backend, d.rule, d.config.name) == ("triton", "tuning-table", "unlisted")


def test_calls_with_other_kernel_options_have_keys_and_families_of_their_own():
    plain = synthetic(256, 256, 256)
    others = [plain.with_(acc="float16"), plain.with_(saturate=True),
              synthetic(64, 64, 256, "bit").with_(bitop="xor"),
              synthetic(64, 64, 256, "bit").with_(bitop="and")]
    assert len({p.key for p in [plain, *others]}) == 5
    assert len({tuning.family(p) for p in [plain, *others[:2]]}) == 3
    assert plain.with_(has_c=True).key == plain.key  # C changes the epilogue, not the kernel
    assert ":acc-float16" in others[0].key and ":satf" in others[1].key


def test_calibration_ignores_far_shapes_other_families_and_unbuilt_kernels(monkeypatch):
    far = _entry("triton", 4096, 4096, 4096)  # M 8x away
    other = _entry("triton", 512, 4096, 4096,
                   problem=synthetic(512, 4096, 4096, "bfloat16", cc=(9, 0)))
    _calibration(monkeypatch, far, other)
    assert dispatch.decide(P, registry=_Registry()).backend == "cublas"
    _calibration(monkeypatch, _entry("cutlass", 512, 4096, 4096))
    d = dispatch.decide(P, registry=_Registry(unbuilt=("cutlass",)))
    assert d.backend == "cublas" and "is not built" in d.detail
    assert dispatch.decide(synthetic(512, 4096, 4096, "float16", cc=(8, 0)),
                           registry=_Registry()).backend == "cublas"


def test_a_calibration_win_counts_only_where_it_holds_in_every_mode(monkeypatch):
    both = _entry("triton", 512, 4096, 4096)
    both["timings_ms"] = {"graph": {"triton:wide": 1.0, "cublas:default": 1.5},
                          "eager": {"triton:wide": 2.0, "cublas:default": 2.2}}
    graph_only = dict(both, timings_ms={"graph": {"triton:wide": 1.0, "cublas:default": 1.5},
                                        "eager": {"triton:wide": 9.0, "cublas:default": 2.2}})
    assert calibration.winner(both) == "triton"
    assert calibration.winner(graph_only) == "cublas"
    _calibration(monkeypatch, graph_only)
    assert dispatch.decide(P, registry=_Registry()).backend == "cublas"
    _calibration(monkeypatch, both)
    assert dispatch.decide(P, registry=_Registry()).backend == "triton"


def test_a_calibration_win_needs_the_figures_of_every_mode(monkeypatch):
    """Missing evidence is no win: flat figures (no mode), a mode without the winner's or
    torch.matmul's figure, or a figure that is not a number leave the entry to cuBLAS."""
    won = _entry("triton", 512, 4096, 4096)
    assert calibration.winner(won) == "triton"
    flat = dict(won, timings_ms={"triton:wide": 1.0, "cublas:default": 0.5})
    eager = won["timings_ms"]["eager"]
    lacking = [flat, dict(won, timings_ms={"graph": won["timings_ms"]["graph"]}),
               dict(won, timings_ms={"graph": won["timings_ms"]["graph"],
                                     "eager": {"triton:wide": 1.0}}),
               dict(won, timings_ms={"graph": won["timings_ms"]["graph"],
                                     "eager": {"cublas:default": 1.1}}),
               dict(won, timings_ms={"graph": won["timings_ms"]["graph"],
                                     "eager": dict(eager, **{"triton:wide": math.nan})}),
               dict(won, timings_ms={})]
    for entry in lacking:
        assert calibration.winner(entry) == "cublas", entry["timings_ms"]
    _calibration(monkeypatch, flat)
    assert dispatch.decide(P, registry=_Registry()).backend == "cublas"


def test_a_calibration_win_within_the_entrys_spread_counts_for_cublas():
    """Beating torch.matmul by less than the noise the entry measured is a tie, in any
    mode: 10% (eager) counts with a spread of 3%, 2% and 2.9% do not."""
    entry = _entry("triton", 512, 4096, 4096)
    entry["spread"] = 0.03
    for eager_ms, expected in ((2.0, "triton"), (2.2 / 1.02, "cublas"), (2.2 / 1.029, "cublas")):
        entry["timings_ms"] = {"graph": {"triton:wide": 1.0, "cublas:default": 1.5},
                               "eager": {"triton:wide": eager_ms, "cublas:default": 2.2}}
        assert calibration.winner(entry) == expected, eager_ms


def test_the_tuners_own_mode_decision_stands_and_the_other_mode_is_held_here():
    """The tuner chose Triton in graph mode from runs paired with cuBLAS's (its medians alone
    lead by only 2%, inside the 3% spread of those figures): that choice stands; eager mode,
    which it did not decide, must still show the lead."""
    entry = _entry("triton", 512, 4096, 4096)
    entry["spread"] = 0.03
    entry["timings_ms"] = {"graph": {"triton:wide": 1.0, "cublas:default": 1.02},
                           "eager": {"triton:wide": 2.0, "cublas:default": 2.2}}
    assert calibration.winner(entry) == "triton"
    entry["timings_ms"]["eager"] = {"triton:wide": 2.0, "cublas:default": 2.04}
    assert calibration.winner(entry) == "cublas"


def test_shape_free_bounds_come_from_the_entries_other_backends_won(monkeypatch):
    registry = _Registry()
    _calibration(monkeypatch)  # none shipped
    decision = dispatch.decide(P, registry=registry)
    assert dispatch.shape_free(P, decision, None) == (math.inf,) * 5
    assert dispatch.shape_free(P, decision, "eager") is None  # autotuning decides per shape
    _calibration(monkeypatch, _entry("triton", 4096, 8192, 2048),
                 _entry("cublas", 64, 64, 64, config="default"))
    small = synthetic(64, 64, 64, "float16", cc=(9, 0))
    decision = dispatch.decide(small, registry=registry)
    assert decision.backend == "cublas"
    # within 2x of the triton entry in every dimension needs M*K >= 4096*2048/4,
    # K*N >= 2048*8192/4, M >= 2048, N >= 4096 and K >= 1024: below any, none can reach it
    assert dispatch.shape_free(small, decision, None) == (4096 * 2048 / 4, 2048 * 8192 / 4,
                                                          2048, 4096, 1024)
    other = synthetic(64, 64, 64, "bfloat16", cc=(9, 0))
    assert dispatch.shape_free(other, dispatch.decide(other, registry=registry), None) == \
        (math.inf,) * 5
    named = dispatch.decide(small, "cublas", registry=registry)
    assert dispatch.shape_free(small, named, None) == (math.inf,) * 5


def test_shipped_h100_calibration_stages_only_large_misaligned_products():
    """The shipped sm_90 data: Triton's staged kernels where cuBLAS is off its fast path and
    the product is large enough to pay for the copies in both modes; cuBLAS elsewhere."""
    if not any("unaligned" in str(m.entry.get("family"))
               for m in calibration.entries_for((9, 0))):
        pytest.skip("no sm_90 calibration of the misaligned path shipped")
    registry = _Registry()
    big = synthetic(5003, 5003, 5003, "float16", cc=(9, 0))
    assert big.misaligned
    decision = dispatch.decide(big, registry=registry)
    assert (decision.backend, decision.rule) == ("triton", "calibrated"), decision.detail
    for problem in (synthetic(5000, 5000, 5000, "float16", cc=(9, 0)),  # aligned
                    synthetic(777, 777, 777, "float16", cc=(9, 0)),  # too small to pay
                    synthetic(16, 4097, 4095, "float16", cc=(9, 0))):  # decode-sized
        assert dispatch.decide(problem, registry=registry).backend == "cublas", problem.key


def test_shipped_calibration_tables_are_well_formed():
    for cc in ((9, 0), (8, 0)):
        for measured in calibration.entries_for(cc):
            assert {"backend", "config", "family", "m", "n", "k"} <= set(measured.entry)


def test_autotune_mode_from_argument_and_environment(monkeypatch):
    assert autotune.mode_of(None) is None
    assert autotune.mode_of(True) == "eager" and autotune.mode_of("graph") == "graph"
    assert autotune.mode_of(False) is None
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "1")
    assert autotune.mode_of(None) == "eager"
    assert autotune.mode_of(False) is None  # the argument wins over the environment
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "graph")
    assert autotune.mode_of(None) == "graph"
    monkeypatch.setenv(autotune.ENV_AUTOTUNE, "sometimes")
    with pytest.raises(InvalidArgument, match="MULTIBACKEND_AUTOTUNE is 'sometimes'"):
        autotune.mode_of(None)
    with pytest.raises(InvalidArgument, match="autotune is 'fast'"):
        autotune.mode_of("fast")


def test_autotune_pending_then_stored_entry_decides(tmp_path):
    store = autotune.Store(tmp_path / "autotune.json")
    original = autotune.STORE
    autotune.STORE = store
    try:
        pending = dispatch.decide(P, registry=_Registry(), autotune="eager")
        assert pending.backend is None and pending.rule == "autotune"
        store.put(P, "eager", {"backend": "triton", "config": {"name": "wide"}, "mode": "eager",
                               "timings_ms": {"triton": 0.9, "cublas": 1.0},
                               "baseline_ms": 1.0, "spread": 0.02})
        d = dispatch.decide(P, registry=_Registry(), autotune="eager")
        assert (d.backend, d.rule, d.config.name) == ("triton", "autotune", "wide")
        assert "1.11x torch.matmul" in d.detail and "2.0%" in d.detail
        assert dispatch.decide(P, registry=_Registry(), autotune="graph").backend is None
        reread = autotune.Store(tmp_path / "autotune.json")  # another process
        assert reread.get(P, "eager")["backend"] == "triton"
        (tmp_path / "autotune.json").write_text("not json")
        assert autotune.Store(tmp_path / "autotune.json").get(P, "eager") is None
        assert not (tmp_path / "autotune.json").exists()  # the corrupt file was removed
    finally:
        autotune.STORE = original


def _timing(ms: float, width: float = 0.0) -> Timing:
    """A Timing of median ``ms`` whose p20 and p80 lie ``width`` (relative) apart."""
    return Timing(ms, ms * (1 - width / 2), ms * (1 - width / 2), ms * (1 + width / 2), 20)


@pytest.mark.parametrize("rival, cublas, mode, winner, spread", [
    (_timing(0.95), _timing(1.0), "eager", "rival", 0.03),  # 5% ahead, the 3% floor
    (_timing(0.98), _timing(1.0), "eager", "cublas", 0.03),
    (_timing(0.98), _timing(1.0), "graph", "rival", 0.01),
    (_timing(0.95), _timing(1.0, 0.06), "eager", "cublas", 0.06),  # within cuBLAS's spread
    (_timing(0.95, 0.10), _timing(1.0), "eager", "cublas", 0.10),  # within its own spread
    (_timing(0.85, 0.10), _timing(1.0, 0.02), "eager", "rival", 0.10),
    (_timing(1.05), _timing(1.0), "eager", "cublas", 0.03)])
def test_autotune_keeps_cublas_unless_beaten_by_more_than_either_spread(rival, cublas, mode,
                                                                        winner, spread):
    chosen, needed = measure.winner({"rival": rival, "cublas": cublas}, mode)
    assert chosen == winner and needed == pytest.approx(spread)


def test_autotune_without_a_cublas_figure_takes_the_fastest():
    assert measure.winner({"a": _timing(1.0), "b": _timing(0.9, 0.5)}, "eager") == ("b", 0.03)


def _stored(backend: str, config: str) -> dict:
    """A whole autotune entry (every field dispatch and explain() read)."""
    return {"backend": backend, "config": {"name": config}, "mode": "eager", "spread": 0.01,
            "timings_ms": {f"{backend}:{config}": 0.01}}


def test_autotune_store_merges_what_other_processes_wrote(tmp_path):
    path = tmp_path / "autotune.json"
    first, second = autotune.Store(path), autotune.Store(path)
    other = synthetic(8, 4096, 4096, "float16", cc=(9, 0))
    first.put(P, "eager", _stored("cublas", "default"))
    second.put(other, "eager", _stored("triton", "autotune"))
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 2
    assert autotune.Store(path).get(other, "eager")["backend"] == "triton"


def test_autotune_store_entry_without_its_config_is_rebuilt_not_read(tmp_path):
    path = tmp_path / "autotune.json"
    path.write_text(json.dumps({"format": 1, "entries": {
        f"eager|{P.key}": {"backend": "triton"}}}))
    assert autotune.Store(path).get(P, "eager") is None  # measured again on the next call
    assert not path.exists()


@pytest.mark.parametrize("lacks", ["timings_ms", "mode", "spread"])
def test_autotune_store_entry_without_what_explain_reads_is_rebuilt(tmp_path, lacks):
    """An entry that names a backend and config but lacks a field dispatch or explain() read
    makes the file unusable: removed (the next call measures again), not failed on at every
    call."""
    path = tmp_path / "autotune.json"
    autotune.Store(path).put(P, "eager", _stored("cublas", "default"))
    assert autotune.Store(path).get(P, "eager")["backend"] == "cublas"
    table = json.loads(path.read_text())
    for entry in table["entries"].values():
        del entry[lacks]
    path.write_text(json.dumps(table))
    assert autotune.Store(path).get(P, "eager") is None
    assert not path.exists()


def test_validation_suite_is_not_the_tuning_suites():
    validation = SUITES["validation"]
    assert len(validation) >= 60
    assert {s.m for s in validation} >= set(VALIDATION_TOKENS)
    assert any(s.batch > 1 for s in validation)
    tuned = {s for name, shapes in SUITES.items() if not name.startswith("validation")
             for s in shapes}
    assert not set(validation) & tuned
    llm_weights = {(s.n, s.k) for s in SUITES["llm"]}
    assert not {(s.n, s.k) for s in validation} & llm_weights
