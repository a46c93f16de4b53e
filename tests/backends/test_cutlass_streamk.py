"""CPU tier of CUTLASS's stream-K and split-K configs: where they are offered, how they are
named and what they set, the per-stream workspace (allocated once, never per call), and one
real nvcc build of the sm_90a stream-K kernel: HGMMA in its SASS, no local memory (0 spills),
its workspace sizes asked of the compiled library, and a launch refused, not allocated for,
when the workspace given is too small."""
from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("cutlass_library")

from multibackend.backends.cutlass import backend as backend_module
from multibackend.backends.cutlass import build as cutlass_build
from multibackend.backends.cutlass import emit as cutlass_emit
from multibackend.backends.cutlass import launcher
from multibackend.core.config import Config, Operands
from multibackend.core.errors import InvalidArgument
from multibackend.core.problem import synthetic
from multibackend.gpu import toolchain
from tests.helpers import sliced_problem  # noqa: E402

BACKEND = backend_module.create()
SKINNY = (8, 4096, 4096)
CUBE = (1024, 1024, 1024)
SMS = 132


def _names(problem) -> list[str]:
    return [c.name for c in BACKEND.configs(problem)]


def _stream_k(problem) -> list[Config]:
    return [c for c in BACKEND.configs(problem) if c.get("scheduler") == "streamk"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_skinny_product_is_offered_stream_k_and_split_k_right_after_the_default(dtype):
    names = _names(synthetic(*SKINNY, dtype, cc=(9, 0)))
    assert names[:5] == ["128x256x64_2x1x1_cooperative_tma", "autotune",
                         "128x256x64_1x2x1_cooperative_tma_streamk",
                         "128x256x64_1x2x1_cooperative_tma_splitk8",
                         "128x256x64_1x2x1_cooperative_tma_splitk4"]
    assert len(names) == len(set(names))


def test_few_tile_cube_is_offered_stream_k_and_split_k():
    offered = _stream_k(synthetic(*CUBE, "float16", cc=(9, 0)))
    assert [c.name for c in offered] == ["128x256x64_2x1x1_cooperative_tma_streamk",
                                         "128x256x64_2x1x1_cooperative_tma_splitk4",
                                         "128x256x64_2x1x1_cooperative_tma_splitk2"]
    heuristic, split4, split2 = offered
    assert heuristic.get("decomposition") is None and heuristic.get("splits") is None
    assert (split4.get("decomposition"), split4.get("splits")) == ("split_k", 4)
    assert (split2.get("decomposition"), split2.get("splits")) == ("split_k", 2)


@pytest.mark.parametrize("shape, dtype", [
    ((8192, 8192, 8192), "float16"),  # 2048 tiles: the data-parallel scheduler fills the SMs
    ((1024, 1024, 512), "float16"),  # 8 K tiles: stream-K would run data-parallel anyway
    ((1024, 1024, 1024), "float32"),  # stream-K is offered for 16-bit types only
    ((8, 4096, 4096), "int8"),
])
def test_stream_k_is_not_offered_where_it_cannot_help(shape, dtype):
    extra = {"precision": "tf32"} if dtype == "float32" else {}
    if dtype == "int8":
        extra = {"b_layout": "col"}
    assert _stream_k(synthetic(*shape, dtype, cc=(9, 0), **extra)) == []


def test_stream_k_is_not_offered_before_sm90():
    problem = synthetic(*SKINNY, "float16", cc=(8, 0))
    assert _stream_k(problem) == [] and backend_module.stream_k_configs(problem) == []


@pytest.mark.parametrize("shape", [(2048, 2048, 2048), (256, 28672, 4096)])
def test_half_a_wave_or_more_of_tiles_is_also_offered_forced_stream_k(shape):
    """At 66 tiles or more CUTLASS's heuristic stays data-parallel: the forced stream-K
    config is offered beside it; no split count fits one wave."""
    offered = _stream_k(synthetic(*shape, "float16", cc=(9, 0)))
    assert [c.name for c in offered] == ["128x256x64_2x1x1_cooperative_tma_streamk",
                                         "128x256x64_2x1x1_cooperative_tma_streamk_forced"]
    assert offered[1].get("decomposition") == "stream_k"
    assert not _stream_k(synthetic(*CUBE, "float16", cc=(9, 0)))[-1].name.endswith("_forced")


def test_every_stream_k_config_of_a_problem_runs_one_binary():
    for shape in (SKINNY, CUBE, (2048, 2048, 2048)):
        problem = synthetic(*shape, "float16", cc=(9, 0))
        offered = _stream_k(problem)
        kernels = {backend_module.candidate_for(problem, c) for c in offered}
        assert len(kernels) == 1
        kernel = kernels.pop()
        assert kernel.name == offered[0].name and kernel.family == "3x_tma"
        assert "StreamK" in kernel.operation.tile_scheduler.name


def test_skinny_kernel_is_chosen_not_to_pad_the_rows():
    """With 8 rows a 2-CTA cluster along the rows would leave half the CTAs without rows:
    the stream-K kernel is the one that pads the grid least."""
    problem = synthetic(*SKINNY, "float16", cc=(9, 0))
    default = backend_module.candidate_for(problem, BACKEND.default_config(problem))
    kernel = backend_module.candidate_for(problem, _stream_k(problem)[0])
    assert backend_module.output_tiles(problem, default) == 2 * 16
    assert backend_module.output_tiles(problem, kernel) == 16
    assert backend_module.k_tiles(problem, kernel) == 64


def test_tiles_count_the_batch_and_whole_clusters():
    problem = synthetic(300, 600, 2048, "float16", batch=3, cc=(9, 0))
    default = backend_module.candidate_for(problem, BACKEND.default_config(problem))
    assert dict(default.params)["cluster"] == (2, 1, 1)
    assert backend_module.output_tiles(problem, default) == 4 * 3 * 3
    assert _stream_k(problem)  # batched 3.x kernels take every scheduler


@pytest.mark.parametrize("tiles, k_tile_count, expected", [
    (16, 64, [8, 4]), (32, 16, [4, 2]), (4, 17, [4, 2]), (56, 64, [2]), (128, 64, []),
    (16, 8, [2]), (1, 1000, [16, 8])])
def test_split_counts_fill_one_wave_with_enough_k_per_split(tiles, k_tile_count, expected):
    assert backend_module.split_counts(tiles, k_tile_count) == expected


def test_out_dtype_c_and_layouts_keep_their_stream_k_kernels():
    """f32 output, a source C and every layout: the stream-K kernel reads and writes the
    problem's own types."""
    for a_layout, b_layout in (("row", "row"), ("col", "row"), ("row", "col"), ("col", "col")):
        problem = synthetic(*SKINNY, "float16", out_dtype="float32", has_c=True,
                            a_layout=a_layout, b_layout=b_layout, cc=(9, 0))
        offered = _stream_k(problem)
        assert offered, (a_layout, b_layout)
        op = backend_module.candidate_for(problem, offered[0]).operation
        from cutlass_library.library import DataType

        assert op.D.element == DataType.f32 and op.C.element == DataType.f32


def test_misaligned_problem_is_offered_staged_stream_k():
    """A's rows off the grid (a view, rows 4100 elements apart): the staged configs copy A
    onto the grid and run the aligned kernels, stream-K among the first of them."""
    names = _names(sliced_problem(8, 4096, 4096, 4100))
    assert "staged:128x256x64_1x2x1_cooperative_tma_streamk" in names


def test_settings_carry_decomposition_splits_and_the_sm_count(monkeypatch):
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: 114)
    problem = synthetic(*CUBE, "float16", cc=(9, 0))
    by_name = {c.name: c for c in BACKEND.configs(problem)}
    slots = dict(zip(launcher.SETTINGS, backend_module._settings(
        problem, by_name["128x256x64_2x1x1_cooperative_tma_splitk4"])))
    assert slots == {"swizzle": 1, "raster": 0, "decomposition": 2, "splits": 4,
                     "sm_count": 114, "workspace": 0, "workspace_bytes": 0}
    forced = backend_module._settings(
        synthetic(2048, 2048, 2048, "float16", cc=(9, 0)),
        next(c for c in BACKEND.configs(synthetic(2048, 2048, 2048, "float16", cc=(9, 0)))
             if c.name.endswith("_forced")))
    assert forced[:4] == (1, 0, 3, 1)


@pytest.mark.parametrize("params, words", [
    ({"splits": 4}, "only with decomposition 'split_k'"),
    ({"decomposition": "split_k", "splits": 0}, "at least 1"),
    ({"decomposition": "split_k", "splits": 2.5}, "an integer"),
    ({"decomposition": "sliced"}, "decomposition 'sliced'"),
    ({"swizzle": 0}, "swizzle 0 must be an integer of at least 1"),
])
def test_bad_decomposition_settings_are_errors_naming_them(monkeypatch, params, words):
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: SMS)
    problem = synthetic(*CUBE, "float16", cc=(9, 0))
    kernel = _stream_k(problem)[0]
    config = Config.of("bad", **{**dict(kernel.params), **params})
    with pytest.raises(InvalidArgument, match=re.escape(words)):
        backend_module._settings(problem, config)


def test_launcher_never_allocates_and_exports_its_workspace_size():
    """Both launcher families (3.x stream-K here, 2.x sm_75 for 1-element f16)."""
    cube = synthetic(*CUBE, "float16", cc=(9, 0))
    odd = synthetic(33, 17, 9, "float16", cc=(9, 0))
    sources = [cutlass_emit.emit(backend_module.candidate_for(problem, config))
               for problem, config in ((cube, _stream_k(cube)[0]),
                                       (odd, BACKEND.default_config(odd)))]
    for source in sources:
        assert "cudaMalloc" not in source and "cudaFree" not in source
        tag = cutlass_build.split_source(source)[1]
        assert f'extern "C" int64_t mb_workspace_size_{tag}(const int64_t* shape)' in source
        assert "kSwizzle = 12" in source and "kWorkspaceBytes = 18" in source
    assert "cutlass::gemm::StreamKScheduler" in sources[0]
    assert "decltype(scheduler.reduction_mode)::Deterministic" in sources[0]
    assert "DefaultGemmUniversal" in sources[1]


class _Tensor:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class _Library:
    """A stand-in for a loaded kernel library: records the workspace each launch sees."""

    kernel_name = "fake"

    def __init__(self, workspace_bytes: int):
        self.bytes = workspace_bytes
        self.launches: list[tuple[int, int, int]] = []  # (address, workspace, its bytes)
        self.gemm = self._gemm

    def workspace_size(self, shape_address: int) -> int:
        return self.bytes

    def _gemm(self, address, b, a, c, d, alpha, beta, stream) -> int:
        shape = (ctypes.c_int64 * 19).from_address(address)
        self.launches.append((address, shape[backend_module.WORKSPACE],
                              shape[backend_module.WORKSPACE_BYTES]))
        return 0


def _backend_with(monkeypatch, workspace_bytes: int):
    """A backend whose stream-K kernel for the cube is ``_Library(workspace_bytes)``, and the
    list of the workspaces it allocates."""
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: SMS)
    allocated = []

    def allocate(device, nbytes):
        allocated.append((device, nbytes))
        return _Tensor(0x7000_0000 + 0x100_0000 * len(allocated))

    monkeypatch.setattr(backend_module, "allocate_workspace", allocate)
    backend = backend_module.create()
    problem = synthetic(*CUBE, "float16", cc=(9, 0), device="cuda:1")
    config = _stream_k(problem)[1]
    library = _Library(workspace_bytes)
    backend._libraries[backend_module.candidate_for(problem, config)] = library
    return backend, problem, config, library, allocated


def _run(backend, problem, config, stream: int) -> None:
    tensors = [_Tensor(0x1000_0000 * (i + 1)) for i in range(4)]
    backend.run(problem, Operands(*tensors[:2], None, tensors[3], 1.0, 0.0, stream), config)


def test_workspace_is_allocated_once_per_stream_never_per_call(monkeypatch):
    backend, problem, config, library, allocated = _backend_with(monkeypatch, 4096)
    backend.prepare(problem, config)
    assert allocated == []  # sized at prepare, allocated at the first launch
    for _ in range(3):
        _run(backend, problem, config, stream=11)
    assert allocated == [("cuda:1", 4096)]
    first = library.launches[0]
    assert first[1] == 0x7100_0000 and first[2] == 4096
    assert library.launches == [first] * 3  # the same array, the same workspace
    _run(backend, problem, config, stream=22)  # a second stream may overlap: its own
    _run(backend, problem, config, stream=22)
    _run(backend, problem, config, stream=11)
    assert allocated == [("cuda:1", 4096)] * 2
    second = library.launches[3]
    assert second[0] != first[0] and second[1] == 0x7200_0000 and second[2] == 4096
    assert library.launches[3:] == [second, second, first]


def test_first_launches_on_two_streams_from_two_threads_get_one_workspace_each(monkeypatch):
    """Two threads launching the same prepared kernel for the first time, each on its own
    stream, at once (both inside the workspace allocation together, where nothing
    serializes them): each launch sees its own stream's workspace."""
    import threading

    backend, problem, config, library, allocated = _backend_with(monkeypatch, 4096)
    backend.prepare(problem, config)
    both_inside = threading.Barrier(2, timeout=0.5)
    allocate = backend_module.allocate_workspace

    def allocate_together(device, nbytes):
        try:
            both_inside.wait()
        except threading.BrokenBarrierError:  # the other thread waits its turn
            pass
        return allocate(device, nbytes)

    monkeypatch.setattr(backend_module, "allocate_workspace", allocate_together)
    threads = [threading.Thread(target=_run, args=(backend, problem, config, stream))
               for stream in (11, 22)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(allocated) == 2 and len(library.launches) == 2
    assert library.launches[0][0] != library.launches[1][0]
    assert {launch[1] for launch in library.launches} == {0x7100_0000, 0x7200_0000}


def test_kernel_without_workspace_allocates_nothing(monkeypatch):
    backend, problem, config, library, allocated = _backend_with(monkeypatch, 0)
    for stream in (11, 22, 11):
        _run(backend, problem, config, stream)
    assert allocated == []
    assert {launch[1:] for launch in library.launches} == {(0, 0)}


def test_prepared_state_is_kept_per_problem_and_config(monkeypatch):
    backend, problem, config, library, allocated = _backend_with(monkeypatch, 64)
    prepared = backend._prepare(problem, config)
    assert backend._prepare(problem, config) is prepared
    assert prepared.workspace_bytes == 64 and prepared.device == "cuda:1"
    assert tuple(prepared.shape)[:12] == cutlass_emit.kernel_args(problem)


# -- one real build --------------------------------------------------------------------------

def _resources(library_path) -> dict[str, tuple[int, int, int]]:
    if toolchain.find_binary_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found in the CUDA toolkit nor in Triton's wheel")
    return toolchain.resource_usage(library_path)


@pytest.fixture(scope="module")
def built(cutlass_kernels):
    """The cube's stream-K kernel, built by nvcc for sm_90a (with the tier's other 3.x
    kernels: :func:`tests.backends.conftest.cutlass_kernels`)."""
    kernel = cutlass_kernels.kernels["stream_k"]
    problem = synthetic(*CUBE, "float16", cc=(9, 0))
    assert kernel.candidate == backend_module.candidate_for(problem, _stream_k(problem)[0])
    return SimpleNamespace(path=kernel.path, source=kernel.source, candidate=kernel.candidate,
                           problem=problem)


def _library(built):
    try:
        return cutlass_build.load(built.path, built.source)
    except OSError as exc:  # a host without the CUDA driver may not resolve libcuda symbols
        pytest.skip(f"cannot dlopen here: {exc}")


def _shape(problem, config, sm_count: int = SMS):
    """The launch array of ``config`` on ``problem`` for ``sm_count`` SMs, no workspace."""
    settings = list(backend_module._settings(problem, config))
    settings[launcher.SETTINGS.index("sm_count")] = sm_count
    return (ctypes.c_int64 * 19)(*cutlass_emit.kernel_args(problem), *settings)


@pytest.mark.slow
def test_stream_k_kernel_builds_with_hgmma_and_no_spills(built):
    assert built.candidate.arch == "90a"
    sass = toolchain.sass(built.path)
    assert re.search(r"\bHGMMA\.64x\d+x16\.F32\b", sass), sass[:2000]
    found = _resources(built.path)
    kernels = {name: usage for name, usage in found.items() if "stream_k" in name}
    assert kernels, found
    for name, (registers, stack, local) in kernels.items():
        assert stack == 0 and local == 0, f"{name}: stack {stack}, local {local} bytes"
        assert registers <= 168, name  # the cooperative consumers' register budget


@pytest.mark.slow
def test_compiled_library_sizes_the_workspace_on_the_cpu(built, monkeypatch):
    """The compiled library's own sizes, asked with no GPU: split-K keeps a float32 partial
    tile for every output tile (the cube: 32 tiles of 128x256) beside its barriers;
    data-parallel needs nothing; CUTLASS's heuristic keeps 2048^3 (128 tiles, more than half
    a wave) data-parallel, which is why the forced config is offered; forced stream-K on
    8192^3 splits only the last waves' tiles, so its workspace follows the SM count."""
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: SMS)
    library = _library(built)
    heuristic = _stream_k(built.problem)[0]
    assert heuristic.name == "128x256x64_2x1x1_cooperative_tma_streamk"

    def size(shape, sm_count=SMS, **params):
        config = Config.of("x", **{**dict(heuristic.params), **params})
        array = _shape(synthetic(*shape, "float16", cc=(9, 0)), config, sm_count)
        return library.workspace_size(ctypes.addressof(array))

    tile = 128 * 256 * 4
    assert 32 * tile <= size(CUBE, decomposition="split_k", splits=4) < 32 * tile + 4096
    assert size(CUBE, decomposition="split_k", splits=2) == \
        size(CUBE, decomposition="split_k", splits=4)
    assert size(CUBE) > 0 and size(SKINNY) > 0
    assert size(CUBE, decomposition="data_parallel") == 0
    assert size((2048, 2048, 2048)) == 0
    assert 128 * tile <= size((2048, 2048, 2048), decomposition="stream_k") < 128 * tile + 4096
    big = (8192, 8192, 8192)
    forced = size(big, decomposition="stream_k")
    assert 0 < forced < size(big, decomposition="split_k", splits=2)
    assert size(big, 66, decomposition="stream_k") != forced


@pytest.mark.slow
def test_launch_refuses_a_workspace_too_small_instead_of_allocating(built, monkeypatch):
    """With no workspace given, the split-K launch returns kErrorWorkspaceNull before it
    touches the device: the launcher has no allocation to fall back on."""
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: SMS)
    library = _library(built)
    split = next(c for c in _stream_k(built.problem) if c.get("splits") == 4)
    shape = _shape(built.problem, split)
    base = 0x7F00_0000_0000
    status = library.gemm(ctypes.addressof(shape), base, base + 2**24, base + 2**25,
                          base + 2**26, 1.0, 0.0, None)
    assert library.status_string(status) == "Error Workspace Null"


def test_every_offered_config_is_its_typed_records_own():
    """Each config offered (plain, scheduler variants, stream-K, forced stream-K, split-K) is
    made by a KernelConfig whose name is derived from the kernel and its settings: read back
    into its record and made again, it is the same config, name included."""
    from multibackend.backends.cutlass.records import kernel_config

    seen = set()
    for shape in (CUBE, (64, 8192, 8192), (2048, 2048, 2048), (4096, 4096, 4096)):
        for config in BACKEND.configs(synthetic(*shape, "float16", cc=(9, 0))):
            if config.get("staged") or config.name == "autotune":
                continue
            record = kernel_config(config)
            assert record.config() == config and record.name == config.name
            seen.add((record.decomposition, record.raster != "heuristic", record.swizzle > 1))
    assert {d for d, _, _ in seen} >= {"heuristic", "stream_k", "split_k"}
    assert any(raster for _, raster, _ in seen) and any(sw for _, _, sw in seen)
