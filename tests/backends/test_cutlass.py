"""CPU tier of the CUTLASS backend: kernel choice and emitted source for every accepted
(dtype, layout), capability rejections with their reasons, the build cache, and one real nvcc
build of an sm_90a f16 kernel whose SASS must hold HGMMA (Hopper's warpgroup MMA)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("cutlass_library")

from multibackend.backends.cutlass import backend as backend_module
from multibackend.backends.cutlass import build as cutlass_build
from multibackend.backends.cutlass import emit as cutlass_emit
from multibackend.core.config import Config
from multibackend.core.errors import CompileError
from multibackend.core.problem import Problem, folded_batch, make_operand, synthetic
from multibackend.gpu import staging, toolchain
from tests.helpers import sliced_problem  # noqa: E402

BACKEND = backend_module.create()
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
CASES = [  # (dtype, extra synthetic() arguments)
    ("float16", {}), ("float16", {"out_dtype": "float32"}),
    ("float16", {"acc": "float16"}), ("bfloat16", {}), ("bfloat16", {"out_dtype": "float32"}),
    ("float32", {"precision": "tf32"}), ("float32", {"precision": "tf32x3"}),
    ("float32", {"precision": "ieee"}), ("float64", {}), ("int8", {}), ("uint8", {}),
    ("float8_e4m3fn", {}), ("float8_e5m2", {}), ("float8_e4m3fn", {"out_dtype": "bfloat16"}),
]


def accepted():
    for dtype, extra in CASES:
        for a_layout, b_layout in LAYOUTS:
            for cc in ((9, 0), (8, 0)):
                problem = synthetic(256, 512, 128, dtype, a_layout=a_layout, b_layout=b_layout,
                                    cc=cc, **extra)
                if BACKEND.supports(problem) is None:
                    yield problem


ACCEPTED = list(accepted())


def test_capability_table_accepts_the_main_paths():
    keys = {(p.in_dtype, p.precision, p.a.layout, p.b.layout, p.cc) for p in ACCEPTED}
    for dtype in ("float16", "bfloat16"):
        for a_layout, b_layout in LAYOUTS:
            assert (dtype, None, a_layout, b_layout, (9, 0)) in keys
            assert (dtype, None, a_layout, b_layout, (8, 0)) in keys
    for precision in ("tf32", "tf32x3", "ieee"):
        assert ("float32", precision, "col", "row", (9, 0)) in keys
    assert ("float64", None, "col", "col", (8, 0)) in keys
    assert ("int8", None, "row", "col", (9, 0)) in keys
    assert ("float8_e4m3fn", None, "row", "col", (9, 0)) in keys
    assert ("float8_e5m2", None, "row", "col", (8, 0)) not in keys


def test_every_accepted_problem_emits_complete_distinct_sources():
    sources = {}
    for problem in ACCEPTED:
        configs = BACKEND.configs(problem)
        assert configs, problem.describe()
        candidate = backend_module.candidate_for(problem, configs[0])
        source = cutlass_emit.emit(candidate)
        assert "${" not in source, candidate.name
        tag = cutlass_build.split_source(source)[1]
        assert f'extern "C" int mb_gemm_{tag}(' in source
        name = candidate.operation.procedural_name()
        assert f"struct {name}" in source and f"GemmUniversalAdapter<{name}>" in source
        if problem.cc == (9, 0) and problem.in_dtype != "float64" and \
                problem.precision not in ("tf32x3", "ieee"):
            assert candidate.arch == "90a" and "cutlass::arch::Sm90" in source
            assert "KernelTmaWarpSpecialized" in source
        else:
            assert "DefaultGemmUniversal" in source
        key = (problem.in_dtype, problem.d_dtype, problem.acc, problem.precision,
               problem.a.layout, problem.b.layout, problem.cc)
        artifact = (source, candidate.arch)
        assert artifact not in sources.values(), f"{key} builds the same kernel as another case"
        sources[key] = artifact
    assert len(sources) == len(ACCEPTED) >= 60


def test_default_f16_config_on_sm90_is_a_cooperative_tma_kernel():
    configs = BACKEND.configs(synthetic(8192, 8192, 8192, "float16"))
    default = configs[0]
    assert default.get("schedule") == "cooperative" and default.get("epilogue") == "tma"
    assert default.get("family") == "3x_tma"
    schedules = {c.get("schedule") for c in configs}
    clusters = {c.get("cluster") for c in configs}
    assert {"cooperative", "pingpong"} <= schedules
    assert {(1, 1, 1), (2, 1, 1), (1, 2, 1)} <= clusters
    assert len({c.name for c in configs}) == len(configs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_large_square_default_and_scheduler_variants(dtype):
    """The default for large 16-bit squares is the 128x256 cooperative TMA kernel in a 2x1x1
    cluster; larger clusters are offered, the stream-K scheduler only for few-tile problems
    (a named one still runs); the best kernels come again with other swizzles and raster
    orders, the same binary."""
    problem = synthetic(8192, 8192, 8192, dtype)
    configs = BACKEND.configs(problem)
    assert [c.name for c in configs[:3]] == ["128x256x64_2x1x1_cooperative_tma", "autotune",
                                             "256x128x64_1x2x1_cooperative_tma"]
    configs = [c for c in configs if c != backend_module.AUTOTUNE]  # the kernels
    by_name = {c.name: c for c in configs}
    assert len(by_name) == len(configs)
    clusters = {c.get("cluster") for c in configs}
    assert {(2, 2, 1), (4, 1, 1), (1, 4, 1)} <= clusters
    assert all(c.get("scheduler") == "persistent" for c in configs)
    few_tiles = BACKEND.configs(synthetic(1024, 1024, 1024, dtype))
    streamk = next(c for c in few_tiles if c.name == "128x256x64_2x1x1_cooperative_tma_streamk")
    assert streamk.get("scheduler") == "streamk" and streamk.get("schedule") == "cooperative"
    variant = by_name["128x256x64_2x1x1_cooperative_tma_along_m_sw8"]
    assert variant.get("kernel") == configs[0].name
    assert (variant.get("raster"), variant.get("swizzle")) == ("m", 8)
    assert by_name["128x256x64_2x1x1_cooperative_tma_sw4"].get("raster") == "heuristic"
    variants = BACKEND.variants(problem, streamk)
    assert len(variants) == 11 and {v.get("kernel") for v in variants} == {streamk.name}
    assert len({v.name for v in variants}) == 11
    for config in (configs[0], variant, variants[-1]):  # one binary for all its variants
        assert backend_module.candidate_for(problem, config).name == config.get("kernel")
    source = cutlass_emit.emit(backend_module.candidate_for(problem, streamk))
    assert "StreamKScheduler" in source and "KernelTmaWarpSpecializedCooperative" in source
    assert "mb_set_scheduler(args.scheduler, shape, MbRank<2>{})" in source
    assert "cutlass::epilogue::TmaWarpSpecializedCooperative" in source
    assert BACKEND.variants(synthetic(33, 17, 9, "float16"),
                            BACKEND.configs(synthetic(33, 17, 9, "float16"))[0]) == []


def test_scheduler_settings_reach_the_launcher(monkeypatch):
    """Swizzle, raster order, decomposition, splits and the device's SM count follow the
    sizes; the workspace slots stay empty until a launch allocates one."""
    monkeypatch.setattr(backend_module, "device_sm_count", lambda device: 132)
    problem = synthetic(512, 512, 512, "float16")
    by_name = {c.name: c for c in BACKEND.configs(problem)}
    backend = backend_module.create()
    for name, expected in [("128x256x64_2x1x1_cooperative_tma", (1, 0, 0, 1, 132, 0, 0)),
                           ("128x256x64_2x1x1_cooperative_tma_along_m_sw8",
                            (8, 2, 0, 1, 132, 0, 0)),
                           ("128x256x64_2x1x1_cooperative_tma_along_n_sw2",
                            (2, 1, 0, 1, 132, 0, 0))]:
        config = by_name[name]
        backend._libraries[backend_module.candidate_for(problem, config)] = _FakeLibrary()
        prepared = backend._prepare(problem, config)
        assert tuple(prepared.shape)[12:] == expected
    bad = Config("x", tuple(sorted({**dict(by_name["128x256x64_2x1x1_cooperative_tma"].params),
                                    "raster": "diagonal"}.items())))
    with pytest.raises(ValueError, match="raster"):
        backend._prepare(problem, bad)


class _FakeLibrary:
    gemm = None

    @staticmethod
    def workspace_size(shape_address):
        return 0


@pytest.mark.parametrize("dtype, ld_elems, expected", [
    ("float16", 64, 8), ("float16", 36, 4), ("float16", 34, 2), ("float16", 33, 1),
    ("float32", 64, 4), ("float32", 66, 2), ("int8", 64, 16), ("float64", 8, 2)])
def test_alignment_is_taken_from_the_leading_dimension(dtype, ld_elems, expected):
    problem = synthetic(16, 16, ld_elems, dtype, precision="tf32" if dtype == "float32" else None)
    assert cutlass_emit.operand_alignment(problem.a, 1) == expected


def test_alignment_is_taken_from_the_pointer():
    problem = synthetic(16, 16, 64, "float16")
    a = problem.a.__class__(**{**problem.a.__dict__, "align": 4})
    assert cutlass_emit.operand_alignment(a, 1) == 2


def test_ragged_f16_falls_back_to_smaller_alignment_kernels():
    aligned = BACKEND.configs(synthetic(100, 200, 64, "float16"))
    assert aligned[0].get("family") == "3x_tma"
    four = BACKEND.configs(synthetic(100, 200, 68, "float16", b_layout="col"))
    assert four[0].get("family") == "3x_cpasync"
    one = BACKEND.configs(synthetic(33, 17, 9, "float16"))
    assert one[0].get("family") == "2x" and one[0].get("schedule") == "sm75"
    bf16 = BACKEND.configs(synthetic(33, 17, 9, "bfloat16", a_layout="col"))
    assert bf16[0].get("family") == "2x_retyped" and bf16[0].get("schedule") == "sm75"
    source = cutlass_emit.emit(backend_module.candidate_for(
        synthetic(33, 17, 9, "bfloat16"), bf16[0]))
    assert "half_t" not in source and "cutlass::bfloat16_t" in source


def test_misaligned_problem_is_offered_staged_tma_kernels():
    """A's rows off the 16-byte grid (a view, rows 4100 elements apart): the staged configs
    run the TMA mainloop on the aligned copy. A D off the grid (N = 4095) is not staged: the
    3.x epilogues refuse it at run time; nor is K = 4095, whose copies stay 4095 wide:
    CUTLASS's can_implement refuses a TMA kernel whose alignment does not divide the
    contiguous extent, so only the kernels of the unstaged problem read them."""
    sliced = sliced_problem(4096, 4096, 4096, 4100)
    staged = [c for c in BACKEND.configs(sliced) if staging.is_staged(c)]
    assert staged and all(not c.name.endswith("_tma") for c in BACKEND.configs(sliced)
                          if not staging.is_staged(c))
    candidate = backend_module.candidate_for(*staging.unwrap(sliced, staged[0]))
    assert candidate.family == "3x_tma"
    for no_tma in (synthetic(4095, 4095, 4095, "float16"), synthetic(7, 11008, 4095, "float16"),
                   sliced_problem(4096, 4096, 4095, 4100)):
        configs = BACKEND.configs(no_tma)
        assert configs and not [c for c in configs if staging.is_staged(c)]
        assert all(backend_module.candidate_for(no_tma, c).family != "3x_tma" for c in configs
                   if c.name != "autotune")
    assert BACKEND.variants(sliced, staged[0]) and all(
        staging.is_staged(v) for v in BACKEND.variants(sliced, staged[0]))


def test_alignment_divides_the_contiguous_extent():
    """Rows 4096 elements apart but K = 4095 wide: no vector access of 2 or more elements
    fits CUTLASS's shape check; a column-major A's extent is M."""
    assert cutlass_emit.operand_alignment(sliced_problem(4096, 4096, 4095, 4096).a, 1) == 1
    assert cutlass_emit.operand_alignment(sliced_problem(4096, 4096, 4092, 4096).a, 1) == 4
    col = synthetic(100, 64, 64, "float16", a_layout="col").a
    assert (col.rows, col.ld) == (100, 100) and cutlass_emit.operand_alignment(col, 1) == 4
    wide = col.__class__(**{**col.__dict__, "ld": 128})
    assert cutlass_emit.operand_alignment(wide, 1) == 4


def test_odd_output_width_uses_a_non_tma_epilogue():
    configs = BACKEND.configs(synthetic(128, 129, 64, "float16", b_layout="col"))
    assert configs and all(c.get("epilogue") == "nosmem" for c in configs)


def test_an_out_off_the_16_byte_grid_gets_kernels_that_store_it():
    import torch

    from multibackend.io.request import matmul_call

    x, w = torch.ones(128, 64).half(), torch.ones(64, 128).half()
    out = torch.empty(128 * 128 + 1).half()[1:].view(128, 128)  # 2 bytes past the grid
    problem = matmul_call(x, w, out=out).problem
    assert problem.d_align == 2 and matmul_call(x, w).problem.d_align == 16
    assert cutlass_emit.output_alignment(problem) == 1
    configs = BACKEND.configs(problem)
    assert configs and all(c.get("epilogue") == "nosmem" for c in configs)


@pytest.mark.parametrize("kwargs, rule, words", [
    ({"dtype": "int4", "a_layout": "row", "b_layout": "col"}, "dtype", "16864_TN"),
    ({"dtype": "bit", "a_layout": "row", "b_layout": "col"}, "dtype", "168256"),
    ({"dtype": "int8"}, "layout", "K-major"),
    ({"dtype": "float8_e4m3fn", "a_layout": "row", "b_layout": "col", "cc": (8, 9)},
     "compute-capability", "sm_90"),
    ({"dtype": "float8_e5m2", "a_layout": "row", "b_layout": "col", "k": 30}, "alignment",
     "2-element alignment"),
    ({"dtype": "int8", "a_layout": "row", "b_layout": "col", "k": 30}, "alignment", "int32"),
    ({"dtype": "float16", "acc": "float16", "out_dtype": "float32"}, "alignment", "float16"),
    ({"dtype": "float16", "cc": (7, 0)}, "compute-capability", "sm_75"),
])
def test_rejections_name_the_rule(kwargs, rule, words):
    kwargs = dict(kwargs)
    k = kwargs.pop("k", 64)
    reason = BACKEND.supports(synthetic(64, 64, k, **kwargs))
    assert reason is not None and reason.rule == rule and reason.backend == "cutlass"
    assert words in reason.message


def test_batches_past_the_2x_grid_are_refused_where_only_2x_kernels_fit():
    limit = backend_module.MAX_2X_BATCH
    assert BACKEND.supports(synthetic(8, 8, 8, "float64", batch=limit)) is None
    reason = BACKEND.supports(synthetic(8, 8, 8, "float64", batch=limit + 1))
    assert reason.rule == "batch" and f"batch is {limit + 1}" in reason.message
    assert BACKEND.supports(synthetic(64, 64, 64, "float16", batch=limit + 1)) is None  # 3.x


def test_a_bias_broadcast_over_the_rows_is_refused_saying_so():
    import torch

    from multibackend.io.request import matmul_call

    x, w = torch.ones(64, 64).half(), torch.ones(64, 64).half()
    problem = matmul_call(x, w.mT, torch.ones(64).half().expand(64, 64), beta=1.0).problem
    reason = BACKEND.supports(problem)
    assert reason.rule == "layout" and "C is strided (neither" in reason.message
    assert "row stride 0" in reason.message


def test_strided_operands_are_rejected_or_staged():
    """No kernel reads a strided operand as it lies: a 16-bit one is taken only through
    staged configs (copied row-major onto the grid), any other is refused."""
    for dtype in ("float16", "float32"):
        problem = synthetic(64, 64, 64, dtype)
        strided = problem.with_(a=problem.a.__class__(**{**problem.a.__dict__,
                                                         "layout": "strided"}))
        reason = BACKEND.supports(strided)
        if dtype == "float16":
            assert reason is None
            configs = BACKEND.configs(strided)
            assert configs and all(staging.is_staged(c) for c in configs)
        else:
            assert reason is not None and reason.rule == "layout"


def test_unknown_config_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'nope'"):
        backend_module.candidate_for(synthetic(64, 64, 64), Config.of("nope"))


def test_kernel_args_describe_the_transposed_product():
    problem = synthetic(30, 50, 70, "float16", batch=3, b_layout="col", has_c=True)
    m, n, k, batch, lda, ldb, ldc, ldd, sa, sb, sc, sd = cutlass_emit.kernel_args(problem)
    assert (m, n, k, batch) == (50, 30, 70, 3)
    assert (lda, ldb, ldc, ldd) == (problem.b.ld, problem.a.ld, 50, 50)
    assert (sa, sb, sc, sd) == (70 * 50, 30 * 70, 1500, 1500)


def _broadcast_b(a_strides=(70, 1), a_batch=30 * 70, c=None) -> Problem:
    """A (3 x 30 x 70) times B (70 x 50) broadcast over the batch (batch stride 0)."""
    return Problem(op="matmul", m=30, n=50, k=70, batch=3,
                   a=make_operand("float16", 30, 70, a_strides, a_batch, 0),
                   b=make_operand("float16", 70, 50, (50, 1), 0, 0), c=c,
                   d_dtype="float16", acc="float32", has_c=c is not None)


def test_kernel_args_fold_a_broadcast_b_over_stacked_rows_into_one_product():
    """B broadcast over the batch, A's entries stacked row after row: one product of 3 x 30
    rows, no batch strides; so too with C stacked the same way (its own leading dimension).
    A broadcast C, A column-major or A's entries apart (batch stride past M rows) keep the
    batch (the launcher then runs one launch per entry)."""
    assert cutlass_emit.kernel_args(_broadcast_b()) == (50, 90, 70, 1, 50, 70, 50, 50,
                                                        0, 0, 0, 0)
    stacked_c = make_operand("float16", 30, 50, (64, 1), 30 * 64, 0)
    folded = cutlass_emit.kernel_args(_broadcast_b(c=stacked_c))
    assert folded[:4] == (50, 90, 70, 1) and folded[6] == 64 and folded[8:] == (0, 0, 0, 0)
    kept = [_broadcast_b(c=make_operand("float16", 30, 50, (50, 1), 0, 0)),
            _broadcast_b(a_strides=(1, 30)),
            _broadcast_b(a_batch=31 * 70)]
    for problem in kept:
        assert folded_batch(problem) is None
        args = cutlass_emit.kernel_args(problem)
        assert args[:4] == (50, 30, 70, 3) and args[9] == problem.a.batch_stride


def test_versions_and_availability_never_raise():
    versions = BACKEND.versions()
    assert set(versions) == {"nvidia-cutlass", "nvcc"}
    assert BACKEND.available() is None or BACKEND.available().backend == "cutlass"


def test_cache_keys_depend_on_source_and_arch():
    assert cutlass_build.artifact_key("x", "90a") != cutlass_build.artifact_key("y", "90a")
    assert cutlass_build.artifact_key("x", "90a") != cutlass_build.artifact_key("x", "80")
    with pytest.raises(ValueError, match="arch"):
        cutlass_build.nvcc_flags("sm90")


def test_truncated_artifact_is_discarded(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    key = cutlass_build.artifact_key("fake source", "90a")
    path = cutlass_build.library_path(key)
    data = b"\x7fELF" + b"\0" * 100
    path.write_bytes(data[:50])
    path.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest())
    assert cutlass_build.cached_library(key) is None
    assert not path.exists()
    path.write_bytes(data)
    path.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest())
    assert cutlass_build.cached_library(key) == path


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    with pytest.raises(FileNotFoundError, match="CUDA_HOME"):
        cutlass_build._compile([(_marked("h", "t", "int x;"), "90a", "k")])


def _marked(header: str, tag: str, body: str) -> str:
    """A source in the emitter's form: a header, the kernel's mark line, its part."""
    return f"{header}\n{cutlass_build.KERNEL_MARK}{tag}\n{body}"


def test_a_source_names_its_header_and_tag_or_the_missing_mark():
    source = cutlass_emit.emit(backend_module.candidate_for(
        synthetic(64, 64, 64, "float16", cc=(9, 0)), Config.of("128x256x64_2x1x1_cooperative_tma")))
    header, tag = cutlass_build.split_source(source)
    assert source.startswith(header) and re.fullmatch(r"[0-9a-f]{16}", tag)
    assert f'extern "C" int mb_gemm_{tag}(' in source and "#include" not in source[len(header):]
    with pytest.raises(ValueError, match="mb-kernel"):
        cutlass_build.split_source("int x;")


def test_kernels_are_grouped_by_header_and_arch_as_many_as_keep_the_workers_busy():
    jobs = [(_marked("h1", f"t{i}", f"body {9 - i}"), "90a", f"k{i}") for i in range(6)]
    jobs += [(_marked("h2", "u", "b"), "90a", "other header"), (jobs[0][0], "90", "other arch")]
    groups = cutlass_build._groups(jobs, workers=4)  # 8 kernels in 4 processes: 2 each
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert [len(g) for g in groups] == [2, 2, 2, 1, 1]
    assert groups[0] == [5, 4]  # neighbours in the order of their parts
    assert cutlass_build._groups(jobs, workers=1)[:2] == [[5, 4, 3, 2], [1, 0]]  # GROUP_MAX
    assert all(len(g) == 1 for g in cutlass_build._groups(jobs, workers=8))


def test_a_group_that_fails_is_built_one_kernel_at_a_time(tmp_path, monkeypatch):
    """Each kernel gets its own result: the one whose source does not build its own error."""
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    built = []

    def fake_compile(jobs):
        built.append([name for _, _, name in jobs])
        if any("broken" in source for source, _, _ in jobs):
            raise CompileError(f"nvcc failed building {jobs[0][2]}")
        for source, arch, _ in jobs:
            cutlass_build.cache.write_checked(
                cutlass_build.library_path(cutlass_build.artifact_key(source, arch)),
                b"\x7fELF" + source.encode())

    monkeypatch.setattr(cutlass_build, "_compile", fake_compile)
    jobs = [(_marked("h", f"t{i}", "broken" if i == 1 else f"ok {i}"), "90a", f"k{i}")
            for i in range(3)]
    first, second, third = cutlass_build.build_many(jobs + [jobs[0]], max_workers=1)[:3]
    assert built[0] == ["k1", "k0", "k2"]  # one group (in the order of their parts), then each
    assert sorted(built[1:]) == [["k0"], ["k1"], ["k2"]]
    assert first.read_bytes().endswith(b"ok 0") and third.read_bytes().endswith(b"ok 2")
    assert isinstance(second, CompileError) and "k1" in str(second)
    assert cutlass_build.build_many(jobs[:1]) == [first]  # cached: nothing built
    assert len(built) == 4


SECOND_PROCESS = """
import sys
from pathlib import Path
from multibackend.backends.cutlass import build as cutlass_build

def no_compile(*args):
    raise AssertionError("the second process compiled")

cutlass_build._compile = no_compile
print(cutlass_build.build(Path(sys.argv[1]).read_text(), "90a"), "compiled-nothing")
"""


@pytest.mark.slow
def test_kernels_compile_cache_and_hold_hopper_mma(cutlass_kernels, monkeypatch):
    """An sm_90a 3.x f16 kernel (HGMMA, TMA loads: the aligned kernel a staged problem runs
    on its copies, built in one library with the other 3.x kernels of the tier) and two 2.x
    kernels (HMMA, bf16 and f16: one library, one nvcc); each loads as its own kernel; the
    build wrote nothing in the caller's directory; a second build, in this process and in
    another, compiles nothing."""
    kernels, root = cutlass_kernels.kernels, cutlass_kernels.root
    staged, bf16, f16 = kernels["staged"], kernels["bf16_sm75"], kernels["f16_sm75"]
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(root))
    assert bf16.path != f16.path and bf16.path.read_bytes() == f16.path.read_bytes()
    assert bf16.candidate.arch == "90" and bf16.candidate.family == "2x_retyped"
    assert re.search(r"\bHMMA\.1688\.F32\.BF16\b", toolchain.sass(bf16.path))
    assert re.search(r"\bHMMA\.1688\.F32\b(?!\.BF16)", toolchain.sass(f16.path))
    path, source = staged.path, staged.source
    assert staged.candidate.arch == "90a"
    assert re.search(r"\bUTMALDG\b", toolchain.sass(path))
    assert path.parent == root / "cutlass"
    assert cutlass_build.cached_library(cutlass_build.artifact_key(source, "90a")) == path
    stamp = path.stat().st_mtime_ns
    assert cutlass_build.build(source, staged.candidate.arch, staged.candidate.name) == path
    assert path.stat().st_mtime_ns == stamp  # the second build compiled nothing
    assert not list((root / "cutlass").glob(".build-*"))
    (root / "cutlass" / "kernel.cu").write_text(source)
    second = subprocess.run(
        [sys.executable, "-c", SECOND_PROCESS, str(root / "cutlass" / "kernel.cu")],
        capture_output=True, text=True, cwd=cutlass_kernels.caller, timeout=60,
        env={**os.environ, "MULTIBACKEND_CACHE_DIR": str(root)})
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == [str(path), "compiled-nothing"]
    assert path.stat().st_mtime_ns == stamp
    sass = toolchain.sass(path)
    assert re.search(r"\bHGMMA\.64x\d+x16\.F32\b", sass), sass[:2000]
    try:
        library = cutlass_build.load(path, source)
        bf16_library = cutlass_build.load(bf16.path, bf16.source)
        f16_library = cutlass_build.load(f16.path, f16.source)
    except OSError as exc:  # a host without the CUDA driver cannot resolve libcuda symbols
        pytest.skip(f"cannot dlopen here: {exc}")
    assert library.kernel_name == staged.candidate.operation.procedural_name()
    assert (bf16_library.kernel_name, f16_library.kernel_name) == (
        bf16.candidate.operation.procedural_name(), f16.candidate.operation.procedural_name())
    assert library.status_string(1) == "Error Misaligned Operand"
    assert isinstance(library.gemm, ctypes._CFuncPtr)
    assert cutlass_kernels.caller_files == []
    assert tempfile.tempdir == cutlass_kernels.tempdir


def test_prepare_many_builds_every_pair_at_once_and_returns_those_that_built(monkeypatch):
    calls = []

    def fake_build_many(builds, max_workers=None):
        calls.append((len(builds), max_workers))
        return [tmp for tmp in (f"lib{i}.so" for i in range(len(builds) - 1))] + [
            RuntimeError("nvcc failed")]
    monkeypatch.setattr(cutlass_build, "build_many", fake_build_many)
    f16, bf16 = synthetic(256, 512, 128, "float16"), synthetic(33, 17, 9, "bfloat16")
    jobs = [(f16, BACKEND.default_config(f16)), (bf16, BACKEND.default_config(bf16))]
    assert backend_module.prepare_many(jobs, 3) == jobs[:1]
    assert calls == [(2, 3)]  # one parallel build of both kernels
    with pytest.raises(RuntimeError, match="nvcc failed"):
        backend_module.prepare_many(jobs[1:])


def test_check_prebuilds_every_problem_in_one_parallel_build(monkeypatch):
    import importlib

    crosscheck = importlib.import_module("multibackend.verify.crosscheck")  # the module, not the call
    asked = []

    class Parallel:
        parallel_builds = True

        def default_config(self, problem):
            return Config.of("default")

        def supports(self, problem):
            return None if problem.k > 1 else "refused"

        def prepare_many(self, jobs, max_workers=None):
            asked.append(jobs)
            raise RuntimeError("left for the cross-check to report")

    class Plain:  # builds one at a time: nothing to build ahead
        parallel_builds = False

    class Registry:
        names = ("parallel", "plain")

        def get(self, name):
            return Parallel() if name == "parallel" else Plain()

        def availability(self, name):
            return None

    monkeypatch.setattr(crosscheck, "REGISTRY", Registry())
    problems = [synthetic(8, 8, 8, "float16"), synthetic(8, 8, 1, "float16"),
                synthetic(16, 8, 8, "float16")]
    crosscheck.prebuild(problems)
    assert [[p for p, _ in jobs] for jobs in asked] == [[problems[0], problems[2]]]
