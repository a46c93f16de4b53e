"""CPU tier of CUTLASS's "autotune" config: which kernels it times for which problems, that its
kernels are built together (and the config counts as built only when all of them are), that
the fastest is picked, kept and run, and the shared timing rule behind it and Triton's
autotuning (:func:`multibackend.gpu.timing.fastest`): ties go to the earlier candidate and one
that fails is left out. The kernels themselves run in the GPU tier."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

pytest.importorskip("cutlass_library")

from multibackend.backends.cutlass import backend as backend_module
from multibackend.backends.cutlass import build as cutlass_build
from multibackend.backends.cutlass import emit as cutlass_emit
from multibackend.core.config import Config, Operands
from multibackend.core.errors import KernelRefused
from multibackend.core.problem import synthetic
from multibackend.gpu import timing, toolchain

AUTOTUNE = backend_module.AUTOTUNE
DEFAULT = "128x256x64_2x1x1_cooperative_tma"
PERSISTENT = [DEFAULT, "256x128x64_1x2x1_cooperative_tma", "128x128x64_1x1x1_cooperative_tma",
              "128x128x64_1x1x1_pingpong_tma", "192x128x64_1x2x1_cooperative_tma"]
FEW_TILES = ["64x128x64_2x1x1_cooperative_tma", "128x64x64_2x1x1_pingpong_tma"]
FORCED = ["128x256x64_2x1x1_cooperative_tma_streamk_forced",
          "128x128x64_1x1x1_cooperative_tma_streamk_forced"]


def _names(configs: list[Config]) -> list[str]:
    return [c.name for c in configs]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_shortlist_of_a_many_tile_product_is_the_default_then_four_tiles_and_stream_k(dtype):
    """512x10240x8192: 160 tiles of 128 x 256, 320 of 128 x 128: no split count fits a wave."""
    problem = synthetic(512, 10240, 8192, dtype, cc=(9, 0))
    shortlist = backend_module.autotune_shortlist(problem)
    assert _names(shortlist) == PERSISTENT + FORCED
    assert {c.get("decomposition") for c in shortlist[5:]} == {"stream_k"}
    names = _names(backend_module.create().configs(problem))
    assert names[:2] == [DEFAULT, "autotune"]


def test_shortlist_splits_k_where_the_small_tiles_leave_sms_idle():
    """8x4096x4096: 32 tiles of 128 x 128 and 64 K tiles: split in 4 (128 CTAs) and 2;
    1024x1024x16384: 64 tiles, split in 2 only (4 would need 256 CTAs). Both leave SMs idle
    in the default's 16 and 32 tiles: the half-size tiles in clusters are timed too."""
    skinny = backend_module.autotune_shortlist(synthetic(8, 4096, 4096, "float16", cc=(9, 0)))
    assert _names(skinny)[9:] == ["128x128x64_1x1x1_cooperative_tma_splitk4",
                                  "128x128x64_1x1x1_cooperative_tma_splitk2"]
    assert [(c.get("decomposition"), c.get("splits")) for c in skinny[9:]] == [
        ("split_k", 4), ("split_k", 2)]
    deep = backend_module.autotune_shortlist(synthetic(1024, 1024, 16384, "float16", cc=(9, 0)))
    assert _names(deep) == (PERSISTENT + FEW_TILES + FORCED
                            + ["128x128x64_1x1x1_cooperative_tma_splitk2"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape, few", [((1000, 1000, 1000), True), ((2048, 2048, 2048), True),
                                        ((2048, 4096, 2048), False), ((4096, 4096, 512), False)])
def test_half_size_tiles_in_clusters_are_timed_only_where_the_default_leaves_sms_idle(
        dtype, shape, few):
    """1000^3: 32 tiles of 128 x 256; 2048^3: 128; 2048x4096: 256 (two waves); 4096^2: 512.
    The half-size tiles come from the generator's larger ones (their tile, cluster, schedule
    and epilogue as named), their M and N in the caller's terms, with the persistent tile
    scheduler only (none of them is a stream-K kernel)."""
    problem = synthetic(*shape, dtype, cc=(9, 0))
    names = _names(backend_module.autotune_shortlist(problem))
    assert backend_module.few_tiles(problem, backend_module.candidate_for(
        problem, Config.of(DEFAULT))) is few
    assert names[:5] == PERSISTENT
    assert (names[5:7] == FEW_TILES) is few
    assert not few or not set(FEW_TILES) & set(names[7:])
    for name in FEW_TILES:
        params = dict(backend_module.candidate_for(problem, Config.of(name)).params)
        rows, cols = (64, 128) if name.startswith("64x") else (128, 64)
        assert params["tile"] == (rows, cols, 64) and params["cluster"] == (2, 1, 1)
        assert params["epilogue"] == "tma" and params["scheduler"] == "persistent"
    half = [c for c in cutlass_emit.candidates(problem) if dict(c.params)["tile"][:2] in
            ((64, 128), (128, 64))]
    assert len(half) >= 30 and {dict(c.params)["scheduler"] for c in half} == {"persistent"}


def test_shortlist_leaves_out_stream_k_at_few_k_tiles():
    """K = 512 is 8 K tiles: stream-K would give every CTA a whole tile (data-parallel)."""
    shortlist = backend_module.autotune_shortlist(synthetic(4096, 4096, 512, "float16",
                                                            cc=(9, 0)))
    assert _names(shortlist) == PERSISTENT


@pytest.mark.parametrize("problem", [
    synthetic(512, 4096, 4096, "float32", precision="tf32", cc=(9, 0)),
    synthetic(512, 4096, 4096, "int8", b_layout="col", cc=(9, 0)),
    synthetic(512, 4096, 4095, "float16", cc=(9, 0)),  # rows of B off the 16-byte grid
    synthetic(512, 4096, 4096, "float16", cc=(8, 0)),  # no 3.x kernels before sm_90
], ids=["tf32", "int8", "misaligned", "sm80"])
def test_no_autotune_config_where_the_shortlist_kernels_cannot_run(problem):
    assert backend_module.autotune_shortlist(problem) == []
    assert "autotune" not in _names(backend_module.create().configs(problem))


def _fake_builds(monkeypatch, fail: str | None = None) -> list[str]:
    """Record the kernels cutlass_build.build_many is asked for; ``fail`` names one whose
    build raises."""
    asked: list[str] = []

    def build_many(builds, max_workers=None):
        asked.extend(name for _, _, name in builds)
        return [RuntimeError(f"nvcc failed on {name}") if name == fail else f"/lib/{name}.so"
                for _, _, name in builds]
    monkeypatch.setattr(cutlass_build, "build_many", build_many)
    return asked


def test_prepare_many_builds_every_kernel_of_autotune_once(monkeypatch):
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    asked = _fake_builds(monkeypatch)
    default = backend_module.create().default_config(problem)
    jobs = [(problem, AUTOTUNE), (problem, default)]
    assert backend_module.prepare_many(jobs) == jobs
    # seven kernels: two stream-K binaries run every stream-K and split-K config; the default
    # is asked for once, though both jobs need it
    assert sorted(asked) == sorted(PERSISTENT + [n.removesuffix("_forced") for n in FORCED])


def test_autotune_is_not_prepared_when_one_of_its_kernels_fails_to_build(monkeypatch):
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    _fake_builds(monkeypatch, fail="128x128x64_1x1x1_pingpong_tma")
    default = backend_module.create().default_config(problem)
    assert backend_module.prepare_many([(problem, AUTOTUNE), (problem, default)]) == [
        (problem, default)]


def test_autotune_counts_as_built_only_when_all_its_kernels_are(monkeypatch):
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    backend = backend_module.create()
    missing = "128x128x64_1x1x1_cooperative_tma"
    names_by_key = {}
    for kernel_problem, config in backend_module.kernel_jobs(problem, AUTOTUNE):
        candidate = backend_module.candidate_for(kernel_problem, config)
        key = cutlass_build.artifact_key(cutlass_emit.emit(candidate), candidate.arch)
        names_by_key[key] = candidate.name
    assert missing in names_by_key.values()
    monkeypatch.setattr(cutlass_build, "cached_library",
                        lambda key: None if names_by_key.get(key) == missing else "/lib/x.so")
    assert backend.built(problem, backend.default_config(problem))
    assert not backend.built(problem, AUTOTUNE)
    monkeypatch.setattr(cutlass_build, "cached_library", lambda key: "/lib/x.so")
    assert backend.built(problem, AUTOTUNE)


def _timed_backend(monkeypatch, ms: dict[str, float], raises: tuple[str, ...] = ()):
    """A CUTLASS backend whose launches are recorded, not run, and timed at ``ms`` per
    config name (those in ``raises`` fail to launch)."""
    backend = backend_module.create()
    launched: list[str] = []

    def run(problem, operands, config):
        if config.name == AUTOTUNE.name:
            config = backend._autotuned(problem, operands)
        if config.name in raises:
            raise KernelRefused(f"{config.name} refused")
        launched.append(config.name)

    def time_gpu(fn, **_):
        fn()
        return SimpleNamespace(median_ms=ms[launched[-1]])

    monkeypatch.setattr(backend, "run", run)
    monkeypatch.setattr(timing, "time_gpu", time_gpu)
    monkeypatch.setattr(backend_module, "prepare_many", lambda jobs, max_workers=None: jobs)
    return backend, launched


def _operands() -> Operands:
    return Operands(None, None, None, None, 1.0, 0.0, 0)


def test_autotune_runs_the_fastest_of_its_shortlist_and_keeps_its_pick(monkeypatch):
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    names = _names(backend_module.autotune_shortlist(problem))
    ms = dict.fromkeys(names, 1.0)
    ms[names[5]] = 0.8  # 128x256 forced into stream-K
    backend, launched = _timed_backend(monkeypatch, ms)
    assert backend.autotuned(problem) is None
    backend.run(problem, _operands(), AUTOTUNE)
    assert backend.autotuned(problem).name == names[5]
    assert set(launched) == set(names)
    assert launched.count(names[5]) == timing.AUTOTUNE_ROUNDS + 1  # timed, then run
    assert launched[-1] == names[5]
    launched.clear()
    backend.run(problem, _operands(), AUTOTUNE)
    assert launched == [names[5]]  # not timed again


def test_prepare_after_the_pick_loads_only_the_picked_kernel(monkeypatch):
    """A call that is not planned prepares on every call: once autotune has picked, that is
    the pick's kernel alone, not the shortlist's builds again."""
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    names = _names(backend_module.autotune_shortlist(problem))
    backend, _ = _timed_backend(monkeypatch, dict.fromkeys(names, 1.0))
    shortlists: list[int] = []
    monkeypatch.setattr(backend_module, "prepare_many",
                        lambda jobs, max_workers=None: shortlists.append(len(jobs)) or jobs)
    prepared: list[str] = []
    monkeypatch.setattr(backend, "_prepare", lambda p, c: prepared.append(c.name))
    backend.prepare(problem, AUTOTUNE)
    assert shortlists == [len(names)] and prepared == []
    backend.run(problem, _operands(), AUTOTUNE)
    shortlists.clear()
    for _ in range(3):
        backend.prepare(problem, AUTOTUNE)
    assert shortlists == [] and prepared == [names[0]]  # kept by the last-run cache


def test_autotune_skips_a_kernel_that_refuses_and_fails_when_all_refuse(monkeypatch):
    problem = synthetic(512, 10240, 8192, "float16", cc=(9, 0))
    names = _names(backend_module.autotune_shortlist(problem))
    ms = {name: 1.0 + i for i, name in enumerate(names)}
    backend, launched = _timed_backend(monkeypatch, ms, raises=(names[0],))
    backend.run(problem, _operands(), AUTOTUNE)
    assert launched[-1] == names[1]
    backend, _ = _timed_backend(monkeypatch, ms, raises=tuple(names))
    with pytest.raises(KernelRefused, match="no kernel of the autotune shortlist"):
        backend.run(problem, _operands(), AUTOTUNE)


def _fastest(monkeypatch, ms: dict[str, float], raises: tuple[str, ...] = ()) -> str | None:
    def time_gpu(fn, **_):
        return SimpleNamespace(median_ms=fn())

    def launch(name):
        if name in raises:
            raise RuntimeError(name)
        return ms[name]
    monkeypatch.setattr(timing, "time_gpu", time_gpu)
    return timing.fastest(list(ms), launch)


def test_fastest_gives_a_tie_to_the_earlier_candidate(monkeypatch):
    assert _fastest(monkeypatch, {"a": 1.0, "b": 0.995, "c": 1.1}) == "a"  # within 1%
    assert _fastest(monkeypatch, {"a": 1.0, "b": 0.98, "c": 1.1}) == "b"


def test_fastest_leaves_out_a_candidate_that_fails(monkeypatch):
    assert _fastest(monkeypatch, {"a": 0.5, "b": 1.0}, raises=("a",)) == "b"
    assert _fastest(monkeypatch, {"a": 0.5}, raises=("a",)) is None


class _EveryWgmmaShape(cutlass_emit.Collector):
    """The generator unpruned, at its level of every WGMMA shape (the last digit of the
    level; the pruning digit, the thousands, at 1)."""

    def get_instantiation_level(self, pruned_level: int = 0, default_level: int = 111,
                                exhaustive_level: int = 9992) -> int:
        return 1000 + super().get_instantiation_level(pruned_level, default_level) // 10 * 10 + 3


def test_narrowed_tiles_are_the_generators_own_kernels():
    """The kernels made by narrowing the generator's tiles (128 x 192 from 128 x 256, 64 x 128
    from 64 x 256, 128 x 64 from 128 x 128) have the names and instance source of kernels
    the generator stamps out when asked for every WGMMA shape, unpruned."""
    from cutlass_library import generator
    from cutlass_library.gemm_operation import EmitGemmUniversal3xInstance

    function = "GenerateSM90_TensorOp_16b_WGMMA_gemm"
    collector = _EveryWgmmaShape(90)
    getattr(generator, function)(collector, cutlass_emit.CUDA_VERSION)
    emit = EmitGemmUniversal3xInstance().emit
    tiles = cutlass_emit.NARROWED_TILES[function].values()
    assert set(tiles) == {(128, 192, 64), (64, 128, 64), (128, 64, 64)}
    for tile in tiles:
        ours = {op.procedural_name(): op for op in cutlass_emit.generated(function, 90)
                if tuple(op.tile_description.threadblock_shape) == tile}
        theirs = {op.procedural_name(): op for op in collector.operations
                  if tuple(op.tile_description.threadblock_shape) == tile}
        assert len(ours) >= 700 and set(ours) <= set(theirs), tile
        assert all(emit(ours[name]) == emit(theirs[name]) for name in ours), tile


@pytest.mark.slow
def test_half_size_tiles_build_with_multicast_loads_and_no_spills(cutlass_kernels):
    """The two kernels :data:`AUTOTUNE_FEW_TILES` adds, built by nvcc for sm_90a (f16, with the
    tier's other 3.x kernels): a warpgroup's WGMMA is 64 x 64 in the cooperative 64 x 128 tile
    (two warpgroups side by side) and 64 x 128 in the ping-pong 128 x 64 one; each loads an
    operand's tiles multicast to its cluster, and keeps everything in registers. The library
    holds the other kernels too, so each is read by its own name."""
    if toolchain.find_binary_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found in the CUDA toolkit nor in Triton's wheel")
    for name, wgmma in zip(FEW_TILES, ("64x64x16", "64x128x16")):
        built = cutlass_kernels.kernels[name]
        assert built.candidate.arch == "90a"
        kernel = built.candidate.operation.procedural_name()
        functions = toolchain.sass(built.path).split("Function : ")[1:]
        sass = "".join(f for f in functions if kernel in f.partition("\n")[0])
        assert sass, kernel
        assert set(re.findall(r"\bHGMMA\.(\d+x\d+x\d+)\.F32\b", sass)) == {wgmma}, kernel
        assert re.search(r"\bUTMALDG\.\dD\.MULTICAST\b", sass), kernel
        usage = {n: u for n, u in toolchain.resource_usage(built.path).items() if kernel in n}
        assert usage, kernel
        assert all(stack == 0 and local == 0 for _, stack, local in usage.values()), usage


def test_fastest_ranks_by_the_median_of_its_rounds(monkeypatch):
    """One disturbed round decides nothing: each candidate is timed in AUTOTUNE_ROUNDS rounds
    of AUTOTUNE_REPS runs (within AUTOTUNE_ROUND_S) and ranked by the median of its rounds
    ("a" wins by median, "b" would by mean)."""
    n = timing.AUTOTUNE_ROUNDS
    rounds = {"a": iter([3.0] + [1.0] * (n - 1)), "b": iter([0.0] + [1.05] * (n - 1))}
    settings: list[dict] = []

    def time_gpu(fn, **kwargs):
        settings.append(kwargs)
        return SimpleNamespace(median_ms=fn())
    monkeypatch.setattr(timing, "time_gpu", time_gpu)
    assert timing.fastest(list(rounds), lambda name: next(rounds[name])) == "a"
    assert len(settings) == 2 * timing.AUTOTUNE_ROUNDS
    assert {(s["reps"], s["max_seconds"]) for s in settings} == {
        (timing.AUTOTUNE_REPS, timing.AUTOTUNE_ROUND_S)}
