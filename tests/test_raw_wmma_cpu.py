"""CPU tier of the raw WMMA backend (no GPU needed).

- Every entry point of every ``raw_wmma/*.cu`` file is built by nvcc for sm_80 and sm_90 (one
  nvcc call per file and architecture, run in parallel) with ``-Xptxas -v``: no spill bytes,
  no stack frame, and SASS holding the intended tensor-core instruction (HMMA for f16 / bf16 /
  tf32, IMMA for s8 / u8 / s4 / u4, DMMA for f64, BMMA for b1), cp.async + ldmatrix for the
  fast GEMM, 128-bit loads for the vectorized dot.
- Every kernel the backend can choose exists among those entry points, and the fast kernel's
  shared-memory size as Python computes it equals the kernel's own constant.
- NVRTC: cubins land in the cache, a second process compiles nothing, a corrupt entry is
  rebuilt, a compile error carries the log and the kernel's name; nvcc stands in without NVRTC.
- The capability table, configs and explain() notes.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from multibackend import nvrtc, toolchain
from multibackend.backends import raw_wmma as rw
from multibackend.backends.base import Config
from multibackend.errors import CompileError, InvalidArgument
from multibackend.problem import synthetic, synthetic_dot
from multibackend.raw_wmma import SOURCE_DIR

SOURCES = ("wmma_fast.cu", "wmma_generic.cu", "wmma_subbyte.cu", "dot.cu")
ARCHS = ("sm_80", "sm_90")

needs_nvcc = pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not found")
needs_cuobjdump = pytest.mark.skipif(toolchain.find_binary_tool("cuobjdump") is None,
                                     reason="cuobjdump not found (toolkit or Triton wheel)")


# ---- building every entry point with nvcc ------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """Per entry point: stack frame, spill stores, spill loads and registers from -Xptxas -v."""
    report: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            report[current] = {}
        elif current and (m := _PROPS.search(line)):
            report[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                   spill_loads=int(m.group(3)))
        elif current and (m := _USED.search(line)):
            report[current]["registers"] = int(m.group(1))
    return report


def split_sass(text: str) -> dict[str, str]:
    """Per function: its SASS text from cuobjdump --dump-sass."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def _build(source: str, arch: str, out_dir: Path) -> tuple[str, str, dict, dict]:
    cubin = out_dir / f"{Path(source).stem}-{arch}.cubin"
    cmd = [str(toolchain.require_nvcc()), f"-arch={arch}", "-cubin", "-Xptxas", "-v",
           "-o", str(cubin), str(SOURCE_DIR / source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"nvcc failed on {source} for {arch}:\n{proc.stderr[-4000:]}")
    return source, arch, parse_ptxas(proc.stderr), split_sass(toolchain.sass(cubin))


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{(source, arch): (ptxas report, SASS per function)} for every source and arch."""
    if toolchain.find_nvcc() is None or toolchain.find_binary_tool("cuobjdump") is None:
        pytest.skip("nvcc or cuobjdump not found")
    out_dir = tmp_path_factory.mktemp("raw_wmma_cubins")
    jobs = [(s, a) for s in SOURCES for a in ARCHS]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda job: _build(job[0], job[1], out_dir), jobs))
    return {(s, a): (report, sass) for s, a, report, sass in results}


def expected_family(name: str) -> str | None:
    """The tensor-core instruction family an entry point must contain (None for dot)."""
    if name.startswith("rw_dot"):
        return None
    kind = name.split("_")[2]
    return {"f16": "HMMA", "bf16": "HMMA", "tf32": "HMMA", "f64": "DMMA", "s8": "IMMA",
            "u8": "IMMA", "s4": "IMMA", "u4": "IMMA", "b1xor": "BMMA", "b1and": "BMMA"}[kind]


def _all_entries(builds) -> list[tuple[str, str, str]]:
    return [(source, arch, name) for (source, arch), (report, _) in builds.items()
            for name in report]


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_every_instantiation_builds_without_spills_or_stack(builds):
    entries = _all_entries(builds)
    assert len(entries) > 180  # ~106 entry points x 2 architectures
    bad = []
    for source, arch, name in entries:
        r = builds[(source, arch)][0][name]
        if r.get("spill_stores", -1) or r.get("spill_loads", -1) or r.get("stack", -1):
            bad.append(f"{name} {arch}: {r}")
    assert not bad, "spills or local-memory stack:\n" + "\n".join(bad)


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_every_instantiation_uses_its_tensor_instruction(builds):
    missing = []
    for source, arch, name in _all_entries(builds):
        family = expected_family(name)
        sass = builds[(source, arch)][1].get(name, "")
        if family and not re.search(rf"\b{family}\.", sass):
            missing.append(f"{name} {arch}: no {family}")
        others = {"HMMA", "IMMA", "DMMA", "BMMA"} - {family}
        if family and any(re.search(rf"\b{o}\.", sass) for o in others):
            missing.append(f"{name} {arch}: a tensor instruction other than {family}")
    assert not missing, "\n".join(missing)


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_sass_details(builds):
    sub80, sub90 = (builds[("wmma_subbyte.cu", a)][1] for a in ARCHS)
    # native on sm_80; on sm_90 s4 runs on IMMA.8816 and XOR is built from AND
    assert "IMMA.8832.S4.S4" in sub80["rw_gemm_s4_s32_8x8x32"]
    assert "BMMA.88128.XOR.POPC" in sub80["rw_gemm_b1xor_s32_8x8x128"]
    assert "BMMA.88128.AND.POPC" in sub80["rw_gemm_b1and_s32_8x8x128"]
    assert "IMMA.8816" in sub90["rw_gemm_s4_s32_8x8x32"]
    assert "BMMA.88128.AND.POPC" in sub90["rw_gemm_b1xor_s32_8x8x128"]
    gen90 = builds[("wmma_generic.cu", "sm_90")][1]
    assert "DMMA.8x8x4" in gen90["rw_gemm_f64_f64_8x8x4_rr"]
    assert "HMMA.1684.F32.TF32" in gen90["rw_gemm_tf32_f32_16x16x8_rr"]
    assert "HMMA.16816.F32.BF16" in gen90["rw_gemm_bf16_f32_16x16x16_rc"]
    assert "HMMA.16816.F16" in gen90["rw_gemm_f16_f16_16x16x16_cc"]
    for arch in ARCHS:
        fast = builds[("wmma_fast.cu", arch)][1]
        for name, sass in fast.items():
            assert re.search(r"LDGSTS\.E\.BYPASS\.(LTC128B\.)?128", sass), \
                f"{name} {arch}: no 16-byte cp.async"
            assert "LDSM" in sass, f"{name} {arch}: fragments not loaded with ldmatrix"
            assert not re.search(r"\bLD\.E", sass), f"{name} {arch}: generic fragment loads"
            assert "STG.E.128" in sass, f"{name} {arch}: no 16-byte epilogue store"
        dot = builds[("dot.cu", arch)][1]
        for name, sass in dot.items():
            if "_vec" in name:
                assert "LDG.E.128" in sass, f"{name} {arch}: no 16-byte loads"
    assert "HFMA2" in builds[("dot.cu", "sm_90")][1]["rw_dot_f16_vec_hfma2"]


def _every_problem_and_config():
    for dtype in rw.FRAGS:
        packed = dtype in ("int4", "uint4", "bit")
        for a_lay in ("row", "col", "strided"):
            for b_lay in ("row", "col"):
                if a_lay == "strided" and packed:
                    continue
                accs = ("float32", "float16") if dtype == "float16" else (None,)
                ops = ("xor", "and") if dtype == "bit" else (None,)
                for acc in accs:
                    for op in ops:
                        k = 256 if packed else 64
                        p = synthetic(64, 64, k, dtype, a_layout="row" if a_lay == "strided"
                                      else a_lay, b_layout=b_lay, acc=acc, bitop=op,
                                      precision="tf32" if dtype == "float32" else None)
                        if a_lay == "strided":
                            p = p.with_(a=replace(p.a, layout="strided"))
                        yield p


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_every_kernel_the_backend_chooses_exists(builds):
    compiled = {name for (report, _) in builds.values() for name in report}
    backend = rw.create()
    chosen = set()
    for p in _every_problem_and_config():
        assert backend.supports(p) is None, p.describe()
        for config in backend.configs(p):
            chosen.add(rw.kernel_for(p, config).name)
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        p = synthetic_dot(1000, dtype)
        for vec in (True, False):
            chosen.add(rw.dot_kernel_name(p, vec))
    chosen.add(rw.dot_kernel_name(synthetic_dot(1000, acc="float16"), True))
    assert chosen <= compiled, sorted(chosen - compiled)
    assert len(chosen) >= 100


@needs_nvcc
def test_fast_smem_size_matches_the_kernel(tmp_path):
    lines = ['#include "wmma_fast.cu"']
    for bm, bn, bk, wm, wn, st in rw.FAST_TILES.values():
        for a_row in (True, False):
            for b_row in (True, False):
                size = rw.fast_smem_bytes(bm, bn, bk, st, a_row, b_row)
                assert size <= 227 * 1024
                lines.append(f"static_assert(rw::FastGemm<__half, {str(a_row).lower()}, "
                             f"{str(b_row).lower()}, {bm}, {bn}, {bk}, {wm}, {wn}, "
                             f"{st}>::kSmemBytes == {size}, \"smem {bm}x{bn}x{bk} s{st}\");")
    src = tmp_path / "smem_check.cu"
    src.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([str(toolchain.require_nvcc()), "-arch=sm_90", "-cubin",
                           "-DRW_ONLY=none", f"-I{SOURCE_DIR}", "-o", str(tmp_path / "x.cubin"),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_ptxas_parser_reads_spills():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function 'k1' for 'sm_90'
        ptxas info    : Function properties for k1
            8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 40 registers, used 1 barriers
        ptxas info    : Compiling entry function 'k2' for 'sm_90'
        ptxas info    : Function properties for k2
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 128 registers
        """)
    report = parse_ptxas(log)
    assert report["k1"] == {"stack": 8, "spill_stores": 4, "spill_loads": 12, "registers": 40}
    assert report["k2"]["spill_stores"] == 0 and report["k2"]["registers"] == 128


# ---- NVRTC compile and cache --------------------------------------------------------------

needs_nvrtc = pytest.mark.skipif(nvrtc._nvrtc() is None,
                                 reason="libnvrtc not loadable (pip install nvidia-cuda-nvrtc)")
DOT_KERNEL = "rw_dot_f16_vec"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / nvrtc.CACHE_KIND


def _compile(arch: str = "sm_90", name: str = DOT_KERNEL) -> nvrtc.Compiled:
    return nvrtc.compile_cubin(SOURCE_DIR / "dot.cu", name, arch, [f"RW_ONLY={name}"])


@needs_nvrtc
def test_nvrtc_builds_once_and_a_second_process_compiles_nothing(cache_dir):
    first = _compile()
    assert first.built and first.path.parent == cache_dir and nvrtc.valid_cubin(
        first.path.read_bytes())
    assert _compile() == nvrtc.Compiled(first.path, built=False)
    code = ("from multibackend import nvrtc\nfrom multibackend.raw_wmma import SOURCE_DIR\n"
            f"c = nvrtc.compile_cubin(SOURCE_DIR / 'dot.cu', '{DOT_KERNEL}', 'sm_90', "
            f"['RW_ONLY={DOT_KERNEL}'])\nprint(c.built, c.path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout.split()
    assert out == ["False", str(first.path)]


@needs_nvrtc
def test_nvrtc_key_covers_arch_and_defines(cache_dir):
    a = _compile("sm_90")
    b = _compile("sm_80")
    c = _compile("sm_90", "rw_dot_f64_vec")
    assert len({a.path, b.path, c.path}) == 3


@needs_nvrtc
def test_nvrtc_output_holds_the_kernel(cache_dir):
    sass = split_sass(toolchain.sass(_compile().path)) if toolchain.find_binary_tool(
        "cuobjdump") else None
    if sass is not None:
        assert "LDG.E.128" in sass[DOT_KERNEL]


@needs_nvrtc
def test_corrupt_cache_entry_is_rebuilt(cache_dir):
    path = _compile().path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    again = _compile()
    assert again.built and again.path.read_bytes() == data


def test_valid_cubin_rejects_torn_files():
    assert not nvrtc.valid_cubin(b"")
    assert not nvrtc.valid_cubin(b"\x7fELF\x02" + b"\0" * 100)
    assert not nvrtc.valid_cubin(b"not an elf file at all" * 10)


@needs_nvrtc
def test_compile_error_names_kernel_and_carries_log(cache_dir, tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void rw_broken(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cubin(bad, "rw_broken", "sm_90")
    text = str(info.value)
    assert "rw_broken" in text and "undefined_name" in text and "sm_90" in text


@needs_nvcc
def test_nvcc_stands_in_without_nvrtc(cache_dir, monkeypatch):
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: None)
    nvrtc.compiler_version.cache_clear()
    try:
        assert nvrtc.compiler_version().startswith("nvcc")
        compiled = _compile()
        assert compiled.built and nvrtc.valid_cubin(compiled.path.read_bytes())
        bad = cache_dir.parent / "broken.cu"
        bad.write_text('extern "C" __global__ void rw_broken() { nope; }\n')
        with pytest.raises(CompileError, match="rw_broken"):
            nvrtc.compile_cubin(bad, "rw_broken", "sm_90")
    finally:
        nvrtc.compiler_version.cache_clear()


# ---- capability, configs, notes -----------------------------------------------------------

backend = rw.create()


def test_available_never_raises():
    reason = backend.available()
    assert reason is None or reason.backend == "raw_wmma"


def test_default_config_for_big_f16_and_bf16_is_the_fast_kernel():
    for dtype in ("float16", "bfloat16"):
        configs = backend.configs(synthetic(8192, 8192, 8192, dtype))
        assert configs[0].name == next(iter(rw.FAST_TILES)) == "fast_128x256x32_s3"
        assert {c.name for c in configs} >= set(rw.FAST_TILES) | {"wmma_16x16x16",
                                                                   "wmma_32x8x16", "wmma_8x32x16"}
        assert configs[0].get("STAGES") == 3 and configs[0].get("BK") == 32


@pytest.mark.parametrize("dtype,frags", [("float32", ["wmma_16x16x8"]),
                                         ("float64", ["wmma_8x8x4"]),
                                         ("int4", ["wmma_8x8x32"]),
                                         ("int8", ["wmma_16x16x16", "wmma_32x8x16",
                                                   "wmma_8x32x16"])])
def test_configs_per_dtype(dtype, frags):
    p = synthetic(100, 100, 256, dtype, precision="tf32" if dtype == "float32" else None)
    assert [c.name for c in backend.configs(p)] == frags


def test_f32_needs_tf32_precision():
    for precision in ("ieee", "tf32x3"):
        reason = backend.supports(synthetic(16, 16, 16, "float32", precision=precision))
        assert reason.rule == "precision" and "tf32" in reason.message
    assert backend.supports(synthetic(16, 16, 16, "float32", precision="tf32")) is None


def test_saturate_only_for_f16_output():
    ok = synthetic(16, 16, 16, "float16", saturate=True)
    assert backend.supports(ok) is None
    assert "satf" in backend.note(ok) and "65504" in backend.note(ok)
    bad = synthetic(16, 16, 16, "bfloat16", saturate=True)
    assert backend.supports(bad).rule == "saturate"
    assert [c.name for c in backend.configs(ok)][0] == "wmma_16x16x16"  # fast kernel: no satf


def test_old_gpus_are_refused_by_rule():
    reason = backend.supports(synthetic(16, 16, 16, "float16", cc=(7, 5)))
    assert reason.rule == "compute-capability"


def test_misaligned_rows_take_the_generic_kernel_and_say_so():
    p = synthetic(100, 100, 99, "float16")  # ld 99 halves: rows not 16-byte aligned
    assert rw.fast_eligible(p) is not None
    assert [c.name for c in backend.configs(p)][0] == "wmma_16x16x16"
    assert "16-byte aligned" in backend.note(p)
    with pytest.raises(InvalidArgument, match="fast_128x256x32_s3"):
        rw.kernel_for(p, Config.of("fast_128x256x32_s3"))


def test_sub_byte_layout_transposes_and_emulation_are_explained():
    p = synthetic(64, 64, 256, "bit", bitop="xor", a_layout="col", b_layout="row")
    note = backend.note(p)
    assert "A is col-major" in note and "B is row-major" in note and "XOR is emulated" in note
    assert backend.note(synthetic(64, 64, 256, "bit", bitop="and", b_layout="col")) is None
    assert "emulated on sm_90" in backend.note(synthetic(64, 64, 64, "int4", b_layout="col"))
    assert backend.note(synthetic(64, 64, 64, "int4", b_layout="col", cc=(8, 0))) is None


def test_kernel_names_follow_problem():
    p = synthetic(64, 64, 64, "float16", a_layout="col", b_layout="row", acc="float16")
    assert rw.kernel_for(p, Config.of("wmma_32x8x16")).name == "rw_gemm_f16_f16_32x8x16_cr"
    p = synthetic(64, 64, 256, "bit", bitop="and")
    assert rw.kernel_for(p, Config.of("wmma_8x8x128")).name == "rw_gemm_b1and_s32_8x8x128"
    with pytest.raises(InvalidArgument, match="wmma_8x8x128"):
        rw.kernel_for(p, Config.of("wmma_16x16x16"))
    d = synthetic_dot(1 << 20, "float16", acc="float16")
    assert backend.supports(d) is None
    assert rw.dot_kernel_name(d, True) == "rw_dot_f16_vec_hfma2"
    assert rw.dot_kernel_name(synthetic_dot(10, "float32"), False) == "rw_dot_f32_strided"
