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
- Launching through the driver API: each kernel family's parameter list matches its
  ``extern "C"`` signature; the argument buffer holds every parameter's value, in its C type,
  at the address kernelParams gives for it (2-D and 3-D operands, C, sub-byte, dot); a fake
  driver module records what ``run`` and ``bind`` launch: a buffer built once per kind of
  call, only the pointers rewritten, the primary context pushed only when it is not current,
  a refused launch named with its kernel and CUresult.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import struct
import subprocess
import sys
import textwrap
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from multibackend.backends.raw_wmma import arguments as rw_arguments
from multibackend.backends.raw_wmma import backend as rw
from multibackend.backends.raw_wmma import kernels as rw_kernels
from multibackend.core.config import Config, Operands
from multibackend.core.errors import CompileError, InvalidArgument, KernelRefused
from multibackend.core.problem import Operand, make_operand, synthetic, synthetic_dot
from multibackend.gpu import driver, native, nvrtc, staging, tensormap, toolchain
from multibackend.raw_wmma import SOURCE_DIR

SOURCES = ("wmma_fast.cu", "wmma_generic.cu", "wmma_subbyte.cu", "dot.cu", "ceiling.cu",
           "stage.cu", "mma_kmajor.cu")
ARCHS = ("sm_80", "sm_90")
#: the sources with warpgroup (wgmma) entry points, also built for sm_90a, the one target
#: that has them
WGMMA_ARCH = "sm_90a"
WGMMA_SOURCES = ("mma_kmajor.cu", "ceiling.cu")

needs_nvcc = pytest.mark.skipif(toolchain.find_nvcc() is None, reason="nvcc not found")
needs_cuobjdump = pytest.mark.skipif(toolchain.find_binary_tool("cuobjdump") is None,
                                     reason="cuobjdump not found (toolkit or Triton wheel)")


# ---- building every entry point with nvcc ------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'")
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
    lines: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            name = m.group(1)
            lines[name] = []
        elif name:
            lines[name].append(line)
    return {name: "\n".join(body) + "\n" for name, body in lines.items()}


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
    jobs = [(s, a) for s in SOURCES for a in ARCHS] + [(s, WGMMA_ARCH) for s in WGMMA_SOURCES]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda job: _build(job[0], job[1], out_dir), jobs))
    return {(s, a): (report, sass) for s, a, report, sass in results}


def sm90_only(name: str) -> bool:
    """Whether an entry point's instruction exists only from sm_90 on (the f64 m16n8k*
    mma.sync): built for sm_80 its body traps."""
    return "f64" in name and ("_16x8x" in name or "_m16n8k" in name)


def warpgroup_only(name: str) -> bool:
    """Whether an entry point issues wgmma (the warpgroup GEMM and its ceiling probes): only
    sm_90a has it, and built for any other target its body traps."""
    if name in rw_kernels.REDUCE_KERNELS.values():  # split-K's second pass: any target
        return False
    return (name.startswith(("rw_wgmma_", "rw_tma_"))
            or re.search(r"_64x\d+x\d+$", name) is not None)


def expected_family(name: str) -> str | None:
    """The tensor-core instruction family an entry point must contain (None for the dot,
    the staging copy and split-K's second pass): wgmma's (HGMMA, IGMMA, BGMMA) for the
    warpgroup entries."""
    if name.startswith(("rw_dot", "rw_stage")) or name in rw_kernels.REDUCE_KERNELS.values():
        return None
    parts = name.split("_")
    kind = parts[1] if parts[1].startswith("b1") else parts[2]
    family = {"f16": "HMMA", "bf16": "HMMA", "tf32": "HMMA", "f64": "DMMA", "s8": "IMMA",
              "u8": "IMMA", "s4": "IMMA", "u4": "IMMA", "b1xor": "BMMA", "b1and": "BMMA"}[kind]
    return family[0] + "GMMA" if warpgroup_only(name) else family


#: a tensor-core instruction's family (HMMA, IMMA, DMMA, BMMA and the wgmma ones)
_TENSOR_OPS = re.compile(r"\b([HIBD]G?MMA)\.")


def _all_entries(builds) -> list[tuple[str, str, str]]:
    return [(source, arch, name) for (source, arch), (report, _) in builds.items()
            for name in report]


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_every_instantiation_builds_without_spills_or_stack(builds):
    entries = _all_entries(builds)
    assert len(entries) > 190  # ~114 entry points x 2 architectures
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
        found = set(_TENSOR_OPS.findall(sass))  # every tensor-core family, one pass
        if (sm90_only(name) and arch < "sm_90") or (warpgroup_only(name) and arch != WGMMA_ARCH):
            assert "BPT.TRAP" in sass and not found, name
            continue
        if family and family not in found:
            missing.append(f"{name} {arch}: no {family}")
        if family and found - {family}:
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
        for name, sass in builds[("stage.cu", arch)][1].items():
            if name.startswith("rw_stage_t_"):  # tiles through shared memory
                assert "STS" in sass and "LDS" in sass and "BAR.SYNC" in sass, f"{name} {arch}"
            else:
                assert "STG.E.128" in sass, f"{name} {arch}: no 16-byte stores"
    assert "HFMA2" in builds[("dot.cu", "sm_90")][1]["rw_dot_f16_vec_hfma2"]


#: the SASS instruction each kind of the PTX K-major kernel exists for
MMA_SASS = {"b1and": "BMMA.168{k}.AND.POPC", "s8": "IMMA.16832.S8.S8", "u8": "IMMA.16832.U8.U8",
            "f16": "HMMA.16816.F32 ", "bf16": "HMMA.16816.F32.BF16", "tf32": "HMMA.1688.F32.TF32",
            "f64": "DMMA.16x8x4"}
#: the SASS instruction of each warpgroup kind, {n} its columns
WGMMA_SASS = {"b1and": "BGMMA.64x{n}x256.AND.POPC", "s8": "IGMMA.64x{n}x32.S8.S8",
              "u8": "IGMMA.64x{n}x32.U8.U8", "f16": "HGMMA.64x{n}x16.F32 ",
              "bf16": "HGMMA.64x{n}x16.F32.BF16", "tf32": "HGMMA.64x{n}x8.F32.TF32"}


def _mma_problem(kind: str, **kw):
    kw.setdefault("b_layout", "col")
    if kind == "b1and":
        return synthetic(256, 256, 4096, "bit", bitop="and", **kw)
    dtype = {v: k for k, v in rw_kernels.MMA_KINDS.items()}[kind]
    return synthetic(256, 256, 512, dtype, precision="tf32" if kind == "tf32" else None, **kw)


#: A's and B's major orders ("r" row-, "c" column-major) of the TMA kernels' entry points
TMA_LAYOUTS = {"rc": ("row", "col"), "rr": ("row", "row"), "cc": ("col", "col"),
               "cr": ("col", "row")}


def _tma_offered(problem) -> list[str]:
    """The TMA configs offered for a problem: the backend's choice of tile and splits, then
    the other tiles."""
    chosen = rw_kernels.tma_choice(problem).name
    return [chosen] + [name for name in rw_kernels.TMA_TILES if name != chosen]


def tma_kernels() -> dict[str, tuple[str, str, str]]:
    """Every TMA entry point by name: (kind, layout of A and B, config): each kind's K-major
    ones, and the 16-bit kinds' in the other three orders of A and B."""
    found = {}
    for kind in rw_kernels.WGMMA_KINDS:
        for lay, (a, b) in TMA_LAYOUTS.items():
            if lay != "rc" and kind not in rw_kernels.MN_MAJOR_KINDS:
                continue
            problem = _mma_problem(kind, a_layout=a, b_layout=b, cc=(9, 0))
            for config in rw_kernels.TMA_TILES:
                found[rw_kernels.kernel_for(problem, Config.of(config)).name] = (kind, lay, config)
    return found


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_ptx_mma_kernels_sass(builds):
    """Each PTX K-major kernel issues the mma.sync of its kind and name (and no other tensor
    instruction: none of WMMA's 8x8x128 for b1), loads its fragments with ldmatrix (f64: with
    8-byte shared loads), copies with 16-byte cp.async (zero-filling at the edges) and stores
    D pairwise (f64 built for sm_80 traps: its instruction is sm_90's); tf32 rounds its
    operands (cvt.rna.tf32.f32 is, in SASS, a test of |x| against +INF and an add of half a
    tf32 unit; the HMMA ignores the 13 bits the mask would clear, so ptxas drops the mask)."""
    wgmma = {rw_kernels.kernel_for(_mma_problem(kind), Config.of(name)).name
             for kind in rw_kernels.WGMMA_KINDS for name in rw_kernels.WGMMA_TILES}
    wgmma |= set(tma_kernels())
    reduce = set(rw_kernels.REDUCE_KERNELS.values())
    for arch in ARCHS:
        sass = builds[("mma_kmajor.cu", arch)][1]
        assert set(sass) == wgmma | reduce | {
            rw_kernels.kernel_for(_mma_problem(kind), Config.of(name)).name
            for kind, tiles in rw_kernels.MMA_TILES.items() for name in tiles}
        for name, text in sass.items():
            if name in reduce:
                continue
            kind = name.split("_")[2]
            if (sm90_only(name) and arch < "sm_90") or name in wgmma:
                assert "BPT.TRAP" in text and not re.search(r"[DH]G?MMA", text), f"{name} {arch}"
                continue
            k = re.search(r"m16n8k(\d+)", name).group(1)
            want = MMA_SASS[kind].format(k=k)
            assert want in text, f"{name} {arch}: no {want}"
            assert len(set(re.findall(r"\b[HIBD]MMA\.[\w.]+", text))) == 1, f"{name} {arch}"
            loads, pair = {"f64": ("LDS.64", "STG.E.128"), "f16": ("LDSM.16.M88.4", "STG.E "),
                           "bf16": ("LDSM.16.M88.4", "STG.E ")}.get(kind, ("LDSM.16.M88.4",
                                                                          "STG.E.64"))
            assert loads in text, f"{name} {arch}: fragments not loaded with {loads}"
            assert re.search(r"LDGSTS\.E\.BYPASS\.(LTC128B\.)?128\.ZFILL", text), name
            assert pair in text, f"{name} {arch}: no paired store"
            rounds = re.search(r"FSETP\.GEU\.AND .*\|R\d+\|.*\+INF", text) is not None
            assert rounds == (kind == "tf32"), f"{name} {arch}: rounding"


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_wgmma_kernels_sass(builds):
    """Built for sm_90a, each warpgroup kernel issues its kind's wgmma of the width its tile
    takes (128 columns for s8 / u8, whose instruction stops at 224, and for the 128-column
    tile) and no mma.sync, fences the copies for the async proxy, keeps one wgmma group in
    flight while the next is issued, copies with 16-byte cp.async (zero-filling at the edges)
    and stores D pairwise; 0 spills and no stack."""
    report, sass = builds[("mma_kmajor.cu", WGMMA_ARCH)]
    for kind in rw_kernels.WGMMA_KINDS:
        for config, tile in rw_kernels.WGMMA_TILES.items():
            bn = tile.bn
            name = rw_kernels.kernel_for(_mma_problem(kind, cc=(9, 0)), Config.of(config)).name
            text = sass[name]
            n = 128 if kind in ("s8", "u8") or bn == 128 else 256
            want = WGMMA_SASS[kind].format(n=n)
            assert len(re.findall(re.escape(want), text)) == 4 * bn // n, f"{name}: {want}"
            assert not re.search(r"\b[HIBD]MMA\.", text), f"{name}: an mma.sync"
            for what in ("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FENCE.VIEW.ASYNC.S"):
                assert what in text, f"{name}: no {what}"
            assert re.search(r"LDGSTS\.E\.BYPASS\.(LTC128B\.)?128\.ZFILL", text), name
            _stores_pairwise_without_spills(name, kind, text, report)


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_tma_kernels_sass(builds):
    """Built for sm_90a, each TMA kernel loads its stages with 3-D tensor-map loads (multicast
    when its cluster shares B) completing on mbarriers it waits on, hands registers from the
    producer warpgroup to the consumers, issues whole k-tiles of its kind's wgmma (one group
    kept in flight), every one with the transpose bits of its operands' major orders (an
    M-major A, an N-major B: 16-bit kinds), and no mma.sync, copies nothing through the threads
    (no LDGSTS) and stores D pairwise; cluster kernels meet at cluster barriers; 0 spills and
    no stack."""
    report, sass = builds[("mma_kmajor.cu", WGMMA_ARCH)]
    names = tma_kernels()
    assert {lay for _, lay, _ in names.values()} == set(TMA_LAYOUTS)
    for name, (kind, lay, config) in names.items():
        tile = rw_kernels.TMA_TILES[config]
        bn, cluster = tile.bn, tile.cluster
        text = sass[name]
        n = 128 if kind in ("s8", "u8") else 256
        per_ktile = 4 * bn // n
        count = len(re.findall(re.escape(WGMMA_SASS[kind].format(n=n)), text))
        assert count >= per_ktile and count % per_ktile == 0, f"{name}: {count} wgmma"
        bits = ".tnspA" * (lay[0] == "c") + ".tnspB" * (lay[1] == "r")
        descs = set(re.findall(r"GMMA\.\S+ R\d+, gdesc\[UR\d+\](\S*),", text))
        assert descs == {bits}, f"{name}: descriptors {descs}, want {bits!r}"
        assert not re.search(r"\b[HIBD]MMA\.", text), f"{name}: an mma.sync"
        load = "UTMALDG.3D.MULTICAST" if cluster > 1 else "UTMALDG.3D "
        for what in (load, "SYNCS.ARRIVE.TRANS64 ", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
                     "WARPGROUP.DEPBAR.LE gsb0, 0x1"):
            assert what in text, f"{name}: no {what}"
        # registers move from the producer only to two or more consumer warpgroups
        hands = tile.bm > 64
        assert ("USETMAXREG.DEALLOC" in text) == ("USETMAXREG.TRY" in text) == hands, name
        assert ("UCGABAR_WAIT" in text) == (cluster > 1), f"{name}: cluster barrier"
        assert "LDGSTS" not in text, f"{name}: copies through the threads"
        _stores_pairwise_without_spills(name, kind, text, report)


def _stores_pairwise_without_spills(name: str, kind: str, text: str, report: dict) -> None:
    """A warpgroup kernel's epilogue stores D pairwise (two 16-bit or two 32-bit outputs in
    one store), and ptxas reports no spill and no stack for it."""
    assert ("STG.E " if kind in ("f16", "bf16") else "STG.E.64") in text, name
    r = report[name]
    assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, f"{name}: {r}"


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_splitk_reduce_kernels_sass(builds):
    """Split-K's second pass: a grid-stride loop of plain loads of the partials (no tensor
    instruction, no atomics: the splits are summed in order), 0 spills and no stack, for sm_80
    on as for sm_90a."""
    for arch in (*ARCHS, WGMMA_ARCH):
        report, sass = builds[("mma_kmajor.cu", arch)]
        for name in rw_kernels.REDUCE_KERNELS.values():
            text = sass[name]
            assert "LDG.E" in text and not re.search(r"\b(ATOM|RED)\.", text), f"{name} {arch}"
            assert not re.search(r"[HIBD]G?MMA", text), f"{name} {arch}"
            r = report[name]
            assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, f"{name}: {r}"


@pytest.mark.parametrize("m,n,k,dtype,want", [
    (1, 4096, 4096, "float16", "tma_64x256_c1_k8"),  # 16 tiles: 8 splits of 8 k-tiles
    (16, 1024, 5120, "float16", "tma_64x256_c1_k16"),  # 4 tiles: at most 16 splits
    (64, 37888, 3584, "float16", "tma_64x256_c1"),  # 148 tiles: a wave already
    (65, 4096, 4096, "float16", "tma_128x256_c1_k8"),  # past 64 rows: 128-row tiles
    (257, 4096, 4096, "bfloat16", "tma_128x256_c1_k2"),  # 48 tiles: two splits fill 96
    (3001, 2056, 1552, "float16", "tma_128x256_c1"),
    (4096, 4096, 4096, "float16", "tma_128x256_c1"),
    (8, 256, 128, "float16", "tma_64x256_c1"),  # 2 k-tiles: nothing to split
    (32, 4096, 4096, "int8", "tma_64x256_c1_k8"),  # 32 k-tiles of 128 int8
])
def test_tma_choice_splits_k_where_the_tiles_fill_less_than_half_a_wave(m, n, k, dtype, want):
    problem = synthetic(m, n, k, dtype, b_layout="col")
    assert rw_kernels.tma_choice(problem).name == want
    assert backend.configs(problem)[0].name == want
    kernel = rw_kernels.kernel_for(problem, Config.of(want))
    assert kernel.splits == rw_kernels.tma_tile(want).split
    for bad in ("tma_64x256_c1_k1", "tma_64x256_c1_k17", "tma_96x256_c1_k2"):
        assert rw_kernels.tma_tile(bad) is None
        with pytest.raises(InvalidArgument, match=r"each also split along K .*2 \.\. 16 splits"):
            rw_kernels.kernel_for(problem, Config.of(bad))
    empty = synthetic(0, n, k, dtype, b_layout="col")  # no tiles: a choice all the same
    assert rw_kernels.tma_choice(empty).name.startswith(rw_kernels.TMA_SKINNY)


def test_a_named_tma_config_runs_with_any_splits_the_list_leaves_out():
    """A caller may name any TMA tile with any splits up to MAX_SPLIT, direct or (where the
    list stages the TMA kernel) staged, though the list offers one choice of splits; other
    names are refused naming what is offered."""
    from multibackend.run.execute import resolve_config

    aligned = synthetic(50, 1000, 4096, "float16", cc=(9, 0))
    assert "tma_128x256_c1_k3" not in [c.name for c in backend.configs(aligned)]
    config = resolve_config(aligned, "raw_wmma", "tma_128x256_c1_k3")
    assert config.get("SPLIT_K") == 3 and rw_kernels.kernel_for(aligned, config).splits == 3
    with pytest.raises(InvalidArgument, match=r"'tma_128x256_c1_k17': not a config .*[(]offered: "
                                              r"tma_64x256_c1_k16, tma_128x256_c1"):
        resolve_config(aligned, "raw_wmma", "tma_128x256_c1_k17")
    ints = synthetic(37, 45, 53, "int8", batch=3, cc=(9, 0))  # B row-major: staged K-major
    config = resolve_config(ints, "raw_wmma", "staged:tma_64x256_c1_k2")
    assert staging.is_kmajor(config)
    kernel = rw_kernels.kernel_for(ints, config)
    assert (kernel.name, kernel.splits) == ("rw_tma_s8_64x256_c1", 2)
    with pytest.raises(InvalidArgument, match="not a config"):
        resolve_config(synthetic(64, 64, 64, "float16", cc=(8, 0)), "raw_wmma",
                       "tma_64x256_c1_k2")  # no TMA before sm_90a


def test_splitk_launch_writes_partials_to_the_streams_workspace_then_sums_them(fake_driver,
                                                                             monkeypatch):
    """A split-K config launches the TMA kernel over (tiles, batch, splits) writing its
    partials to a workspace of its own (from torch's allocator, on the call's stream), then
    the second pass over every output with C, alpha and beta; for the compiled front, the
    two passes pinned to the stream whose held workspace they share."""
    fake = FakeTensorMaps()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake.encode, fake.replace))
    monkeypatch.setattr(staging, "_ARENAS", {})
    backend = rw.create()
    fake_driver.current = 0x1000
    m, n, k, batch = 40, 520, 4096, 2
    problem = synthetic(m, n, k, "float16", batch=batch, b_layout="col", has_c=True, cc=(9, 0))
    config = backend.configs(problem)[0]
    assert config.name == "tma_64x256_c1_k16"  # 3 x 2 tiles, 64 k-tiles
    a, b = _tensor((batch, m, k)), _tensor((batch, n, k)).transpose(1, 2)
    c, d = _tensor((batch, m, n)), _tensor((batch, m, n))
    ops = Operands(a, b, c, d, alpha=0.5, beta=2.0, stream=7)
    backend.run(problem, ops, config)
    gemm, second = fake_driver.launches
    assert gemm["kernel"] == "rw_tma_f16_64x256_c1" and gemm["grid"] == (3 * 1, batch, 16)
    assert second["kernel"] == "rw_tma_reduce_f32" and second["block"] == (256, 1, 1)
    assert second["grid"] == (-(-batch * m * n // 256), 1, 1)
    assert gemm["args"]["ws"] == second["args"]["ws"] != 0 and not staging._ARENAS
    assert gemm["args"]["splits"] == second["args"]["splits"] == 16
    assert {key: second["args"][key] for key in ("M", "N", "batch", "c", "d", "alpha", "beta")} \
        == {"M": m, "N": n, "batch": batch, "c": c.data_ptr(), "d": d.data_ptr(), "alpha": 0.5,
            "beta": 2.0}
    flat = synthetic(m, n, k, "float16", b_layout="col", cc=(9, 0))
    ops = Operands(a[0], b[0], None, d[0], stream=7)
    backend.run(flat, ops, config)
    gemm, second = backend.native(flat, config, ops).steps
    workspace = staging._ARENAS[(d.device, 7, "splitk")][-1]
    assert workspace.numel() >= 16 * m * n * 4
    assert gemm.stream == second.stream == 7
    assert _slot_names(gemm, rw_kernels.TMA_PARAMS) == {"a_map": native.A + native.MAP,
                                                        "b_map": native.B + native.MAP,
                                                        "d": native.D}
    assert _slot_names(second, rw_kernels.REDUCE_PARAMS) == {"d": native.D}
    ws_at = [name for name, _ in rw_kernels.TMA_PARAMS].index("ws")
    assert struct.unpack_from("<Q", gemm.params, gemm.offsets[ws_at])[0] == \
        workspace.data_ptr() == _step_values(second, rw_kernels.REDUCE_PARAMS)["ws"]


def test_tma_kernel_reads_16_bit_operands_in_every_major_order():
    """f16 and bf16 products in every major order of A and B take the TMA kernel first, the
    instance built for that order (no staging copy), an MN-major operand loaded in boxes one
    k-tile (64 k's) deep; the other kinds' products in those orders do not (wgmma reads them
    K-major only: all but b1 reach it through K-major staged copies), nor does a strided
    operand."""
    backend = rw.create()
    tma = list(rw_kernels.TMA_TILES)
    for kind in rw_kernels.WGMMA_KINDS:
        for lay, (a, b) in TMA_LAYOUTS.items():
            problem = _mma_problem(kind, a_layout=a, b_layout=b, cc=(9, 0))
            names = [c.name for c in backend.configs(problem)]
            if lay != "rc" and kind not in rw_kernels.MN_MAJOR_KINDS:
                why = rw_kernels.tma_eligible(problem)
                assert f"reads {kind} with A row-major and B column-major" in why
                assert not set(tma) & set(names)
                assert (f"staged:{tma[0]}" in names) == (kind != "b1and")  # b1: no staging
                continue
            offered = _tma_offered(problem)
            assert names[:len(offered)] == offered, (kind, lay)
            for config, tile in rw_kernels.TMA_TILES.items():
                kernel = rw_kernels.kernel_for(problem, Config.of(config))
                suffix = "" if lay == "rc" else f"_{lay}"
                assert kernel.name == f"rw_tma_{kind}_{config.removeprefix('tma_')}{suffix}"
                assert kernel.cluster == tile.cluster
                assert kernel.tma_boxes == (tile.bm if a == "row" else rw_kernels.MN_BOX_ROWS,
                                            tile.bn // tile.cluster if b == "col"
                                            else rw_kernels.MN_BOX_ROWS)
    strided = Operand("float16", 256, 512, "strided", 1024, (1024, 2))
    problem = replace(_mma_problem("f16", cc=(9, 0)), a=strided)
    assert "A is strided: the TMA kernel reads f16 operands row- or column-major" in \
        rw_kernels.tma_eligible(problem)


def test_ptx_mma_kernel_offered_first_for_aligned_kmajor_products_only():
    backend = rw.create()
    wmma = {"b1and": ["wmma_8x8x128"], "s8": [f"wmma_{f}" for f in rw_kernels.FRAGS["int8"]],
            "u8": [f"wmma_{f}" for f in rw_kernels.FRAGS["uint8"]], "tf32": ["wmma_16x16x8"],
            "f64": ["wmma_8x8x4"], "f16": [f"wmma_{f}" for f in rw_kernels.FRAGS["float16"]],
            "bf16": [f"wmma_{f}" for f in rw_kernels.FRAGS["bfloat16"]]}
    for kind, tiles in rw_kernels.MMA_TILES.items():
        wgmma = list(rw_kernels.WGMMA_TILES) if kind in rw_kernels.WGMMA_KINDS else []
        tma = list(rw_kernels.TMA_TILES) if kind in rw_kernels.WGMMA_KINDS else []
        fast = list(rw_kernels.FAST_TILES) if kind in ("f16", "bf16") else []
        if tma:
            tma = _tma_offered(_mma_problem(kind))
        assert [c.name for c in backend.configs(_mma_problem(kind))] == \
            [*tma, *wgmma, *fast, *tiles, *wmma[kind]]
        assert [c.name for c in backend.configs(_mma_problem(kind, cc=(8, 0)))] == \
            [*fast, *(tiles if kind != "f64" else ()), *wmma[kind]]
        if wgmma:
            kernel = rw_kernels.kernel_for(_mma_problem(kind, cc=(9, 0)), Config.of(wgmma[0]))
            tile = rw_kernels.WGMMA_TILES[wgmma[0]]
            bm, bn, stages = tile.bm, tile.bn, tile.stages
            assert kernel.name == f"rw_wgmma_{kind}_{wgmma[0].removeprefix('wgmma_')}"
            assert kernel.threads == bm // 16 * 32 and kernel.arch_suffix == "a"
            assert kernel.smem == rw_kernels.mma_smem_bytes(bm, bn, stages, warpgroup=True)
            assert "sm_90a" in rw_kernels.wgmma_eligible(_mma_problem(kind, cc=(8, 0)))
            kernel = rw_kernels.kernel_for(_mma_problem(kind, cc=(9, 0)), Config.of(tma[0]))
            tile = rw_kernels.tma_tile(tma[0])
            bm, bn, stages, cluster = tile.bm, tile.bn, tile.stages, tile.cluster
            assert kernel.name == f"rw_tma_{kind}_{bm}x{bn}_c{cluster}"
            assert kernel.splits == tile.split
            assert kernel.threads == bm // 16 * 32 + 128 and kernel.arch_suffix == "a"
            assert kernel.smem == rw_kernels.tma_smem_bytes(bm, bn, stages) <= 227 * 1024
            assert kernel.tma_boxes == (bm, bn // cluster) and kernel.params == rw_kernels.TMA_PARAMS
            assert "sm_90a" in rw_kernels.tma_eligible(_mma_problem(kind, cc=(8, 0)))
        first = next(iter(tiles))
        kernel = rw_kernels.kernel_for(_mma_problem(kind), Config.of(first))
        assert kernel.name == f"rw_mma_{kind}_{first.removeprefix('mma_')}"
        tile = tiles[first]
        bm, bn, stages = tile.bm, tile.bn, tile.stages
        assert kernel.threads == tile.warps * 32 and kernel.source == "mma_kmajor.cu"
        assert kernel.tile == (bm, bn) and kernel.smem == rw_kernels.mma_smem_bytes(bm, bn, stages)
    assert "sm_90" in rw_kernels.mma_eligible(_mma_problem("f64", cc=(8, 0)))
    assert rw_kernels.mma_eligible(_mma_problem("f64", cc=(9, 0))) is None
    assert "no f64" in rw_kernels.wgmma_eligible(_mma_problem("f64", cc=(9, 0)))
    assert rw_kernels.kernel_for(_mma_problem("b1and"), Config.of("mma_m16n8k256_128x256_s4")).name == \
        "rw_mma_b1and_m16n8k256_128x256_s4"
    with pytest.raises(InvalidArgument, match="mma_m16n8k32_128x256_s4"):
        rw_kernels.kernel_for(_mma_problem("s8"), Config.of("mma_m16n8k8_128x256_s4"))
    for other, why in ((synthetic(256, 256, 4096, "bit", bitop="xor", b_layout="col"), "AND"),
                       (synthetic(256, 256, 4096, "bit", bitop="and"), "column-major"),
                       (synthetic(256, 256, 4100, "bit", bitop="and", b_layout="col"),
                        "16-byte aligned"),
                       (synthetic(256, 256, 520, "int8", b_layout="col"), "16-byte aligned"),
                       (synthetic(256, 256, 512, "uint8", a_layout="col", b_layout="col"),
                        "column-major"),
                       (synthetic(256, 256, 512, "float32", b_layout="col"), "tf32"),
                       (synthetic(256, 256, 512, "float32", precision="tf32"), "column-major")):
        assert rw_kernels.mma_eligible(other) and why in rw_kernels.mma_eligible(other), other.describe()
        assert not any(c.name.startswith("mma_") for c in backend.configs(other))
        with pytest.raises(InvalidArgument):
            rw_kernels.kernel_for(other, Config.of("mma_m16n8k256_128x256_s4"))
    for kind, layout in (("bit", "row"), ("int8", "row")):
        p = synthetic(256, 256, 4096, kind, bitop="and" if kind == "bit" else None,
                      b_layout=layout)
        note = backend.note(p)
        assert "not the PTX mma.sync one" in note and "column-major" in note, note
    assert "PTX" not in (backend.note(synthetic(256, 256, 4096, "float16", b_layout="col")) or "")


#: each register-only ceiling probe and the instruction it exists for (raw_wmma/ceiling.cu)
CEILING_INSTRUCTIONS = {
    "rw_ceiling_f16_f32_16x16x16": r"HMMA\.16816\.F32 ",
    "rw_ceiling_bf16_f32_16x16x16": r"HMMA\.16816\.F32\.BF16 ",
    "rw_ceiling_tf32_f32_16x16x8": r"HMMA\.1684\.F32\.TF32 ",
    "rw_ceiling_s8_s32_16x16x16": r"IMMA\.16816\.S8\.S8 ",
    "rw_ceiling_f64_f64_8x8x4": r"DMMA\.(884|8x8x4) ",
    "rw_ceiling_b1and_s32_8x8x128": r"BMMA\.88128\.AND\.POPC ",
    "rw_ceiling_b1and_s32_16x8x128": r"BMMA\.168128\.AND\.POPC ",
    "rw_ceiling_b1and_s32_16x8x256": r"BMMA\.168256\.AND\.POPC ",
    "rw_ceiling_s8_s32_16x8x32": r"IMMA\.16832\.S8\.S8 ",
    "rw_ceiling_tf32_f32_16x8x8": r"HMMA\.1688\.F32\.TF32 ",
    "rw_ceiling_f64_f64_16x8x4": r"DMMA\.16x8x4 ",
    "rw_ceiling_f64_f64_16x8x8": r"DMMA\.16x8x8 ",
    "rw_ceiling_f64_f64_16x8x16": r"DMMA\.16x8x16 ",
    "rw_ceiling_f16_f32_16x8x16": r"HMMA\.16816\.F32 ",
    "rw_ceiling_bf16_f32_16x8x16": r"HMMA\.16816\.F32\.BF16 ",
    "rw_ceiling_f16_f32_64x256x16": r"HGMMA\.64x256x16\.F32 ",
    "rw_ceiling_bf16_f32_64x256x16": r"HGMMA\.64x256x16\.F32\.BF16 ",
    "rw_ceiling_tf32_f32_64x256x8": r"HGMMA\.64x256x8\.F32\.TF32 ",
    "rw_ceiling_s8_s32_64x128x32": r"IGMMA\.64x128x32\.S8\.S8 ",
    "rw_ceiling_b1and_s32_64x256x256": r"BGMMA\.64x256x256\.AND\.POPC "}


@pytest.mark.slow
@needs_nvcc
@needs_cuobjdump
def test_ceiling_probes_run_their_instruction_from_registers(builds):
    """Each probe issues its instruction for every one of its 8 accumulator chains inside a
    loop, and reads memory only for its two fragments, before the loop (wgmma, built for
    sm_90a: its tiles, copied into shared memory before the loop, are its operands; built
    for any other target it traps)."""
    for arch in (*ARCHS, WGMMA_ARCH):
        sass = builds[("ceiling.cu", arch)][1]
        assert set(sass) == set(CEILING_INSTRUCTIONS), arch
        for name, pattern in CEILING_INSTRUCTIONS.items():
            text = sass[name]
            if (sm90_only(name) and arch < "sm_90") or (warpgroup_only(name)
                                                        and arch != WGMMA_ARCH):
                assert "BPT.TRAP" in text and not re.search(pattern, text), f"{name} {arch}"
                continue
            assert len(re.findall(pattern, text)) >= 8, f"{name} {arch}: fewer than 8 {pattern}"
            lines = text.splitlines()
            mma = [i for i, line in enumerate(lines) if re.search(pattern, line)]
            loads = [i for i, line in enumerate(lines) if re.search(r"\bLD(G|S|SM)?\.", line)]
            stored = r"\bSTG\." if warpgroup_only(name) else r"\bST(G|S)?\."
            stores = [i for i, line in enumerate(lines) if re.search(stored, line)]
            assert loads and max(loads) < min(mma), f"{name} {arch}: a read among the MMAs"
            assert stores and min(stores) > max(mma), f"{name} {arch}: a store among the MMAs"
            assert any("BRA" in line for line in lines[min(mma):min(stores)]), \
                f"{name} {arch}: no loop around the MMAs"


def test_the_ceiling_benchmark_launches_every_probe_as_its_name_says():
    """benchmarks/gpu_raw_wmma_ceiling.py: one probe per entry point of ceiling.cu, each
    counted with the fragment shape its name carries, and every GEMM dtype it reports has a
    ceiling."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_raw_wmma_ceiling.py"
    spec = importlib.util.spec_from_file_location("gpu_raw_wmma_ceiling", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    entries = set(re.findall(r"^RW_CEILING\((\w+),", (SOURCE_DIR / "ceiling.cu").read_text(),
                             re.M))
    assert set(bench.PROBES) == entries == set(CEILING_INSTRUCTIONS)
    for name, (_, m, n, k, _) in bench.PROBES.items():
        assert name.endswith(f"_{m}x{n}x{k}")
    assert set(bench.SM90_PROBES) == {n for n in bench.PROBES if "f64" in n and "_16x8x" in n}
    assert set(bench.WGMMA_CEILING.values()) == {n for n in bench.PROBES if warpgroup_only(n)}
    assert all(bench.PROBES[probe][0] == dtype for dtype, probe in bench.WGMMA_CEILING.items())
    assert all(bench.PROBES[probe][0] == dtype for (dtype, _), probe in bench.MMA_CEILING.items())
    assert {dtype for dtype, _ in bench.GEMMS} | {"bit"} == set(bench.CEILING_OF)
    assert all(bench.PROBES[probe][0] == dtype for dtype, probe in bench.CEILING_OF.items())
    assert bench.CHAINS == 8 and bench.WARPS_PER_BLOCK * 32 == 256  # ceiling.cu's constants
    text = (SOURCE_DIR / "ceiling.cu").read_text()
    assert "kCeilingThreads = 256" in text and "kChains = 8" in text


def _every_problem_and_config():
    for dtype in rw_kernels.FRAGS:
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
            chosen.add(rw_kernels.kernel_for(p, config).name)
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        p = synthetic_dot(1000, dtype)
        for vec in (True, False):
            chosen.add(rw_kernels.dot_kernel_name(p, vec))
    chosen.add(rw_kernels.dot_kernel_name(synthetic_dot(1000, acc="float16"), True))
    assert chosen <= compiled, sorted(chosen - compiled)
    assert len(chosen) >= 100


@needs_nvcc
def test_fast_and_mma_smem_sizes_match_the_kernels(tmp_path):
    lines = ['#include "wmma_fast.cu"']
    for fast in rw_kernels.FAST_TILES.values():
        bm, bn, bk, wm, wn, st = (fast.bm, fast.bn, fast.bk, fast.warps_m, fast.warps_n,
                                  fast.stages)
        for a_row in (True, False):
            for b_row in (True, False):
                size = rw_kernels.fast_smem_bytes(bm, bn, bk, st, a_row, b_row)
                assert size <= 227 * 1024
                lines.append(f"static_assert(rw::FastGemm<__half, {str(a_row).lower()}, "
                             f"{str(b_row).lower()}, {bm}, {bn}, {bk}, {wm}, {wn}, "
                             f"{st}>::kSmemBytes == {size}, \"smem {bm}x{bn}x{bk} s{st}\");")
    lines.append('#include "mma_kmajor.cu"')
    for kind, tiles in rw_kernels.MMA_TILES.items():
        for t in tiles.values():
            k, bm, bn, wm, wn, st = t.mma_k, t.bm, t.bn, t.warps_m, t.warps_n, t.stages
            size = rw_kernels.mma_smem_bytes(bm, bn, st)
            assert size <= 227 * 1024
            mma = {"b1and": f"rw::MmaB1And<{k}>, 1", "s8": "rw::MmaS8, 1", "u8": "rw::MmaU8, 1",
                   "f16": "rw::MmaF16, 2", "bf16": "rw::MmaBf16, 2", "tf32": "rw::MmaTf32, 4",
                   "f64": "rw::MmaF64<4>, 8"}[kind]
            lines.append(f"static_assert(rw::KMajorGemm<{mma}, {bm}, {bn}, {wm}, {wn}, {st}>::"
                         f"kSmemBytes == {size}, \"{kind} smem {bm}x{bn} s{st}\");")
    for wg in rw_kernels.WGMMA_TILES.values():
        bm, bn, st = wg.bm, wg.bn, wg.stages
        size = rw_kernels.mma_smem_bytes(bm, bn, st, warpgroup=True)
        assert size <= 227 * 1024
        lines.append(f"static_assert(rw::KMajorGemm<rw::WgF16<{bn}>, 2, {bm}, {bn}, {bm // 16}, "
                     f"1, {st}>::kSmemBytes == {size}, \"wgmma smem {bm}x{bn} s{st}\");")
    for tma in rw_kernels.TMA_TILES.values():
        bm, bn, st, cluster = tma.bm, tma.bn, tma.stages, tma.cluster
        size = rw_kernels.tma_smem_bytes(bm, bn, st)
        assert size <= 227 * 1024
        lines.append(f"static_assert(rw::TmaGemm<rw::WgF16<{bn}>, {bm}, {bn}, {st}, {cluster}>::"
                     f"kSmemBytes == {size}, \"tma smem {bm}x{bn} s{st}\");")
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
    code = ("from multibackend.gpu import nvrtc\nfrom multibackend.raw_wmma import SOURCE_DIR\n"
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
    # changed in place, its header and sections still whole: the checksum tells
    changed = bytearray(data)
    changed[-9] ^= 0xFF
    path.write_bytes(bytes(changed))
    assert nvrtc.valid_cubin(bytes(changed))
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


def test_default_config_for_big_f16_and_bf16_is_the_tma_kernel_on_sm90a_else_the_fast_one():
    for dtype in ("float16", "bfloat16"):
        assert backend.configs(synthetic(8192, 8192, 8192, dtype))[0].name == "tma_128x256_c1"
        configs = backend.configs(synthetic(8192, 8192, 8192, dtype, cc=(8, 0)))
        assert configs[0].name == next(iter(rw_kernels.FAST_TILES)) == "fast_128x256x32_s3"
        assert {c.name for c in configs} >= set(rw_kernels.FAST_TILES) | {"wmma_16x16x16",
                                                                   "wmma_32x8x16", "wmma_8x32x16"}
        assert configs[0].get("STAGES") == 3 and configs[0].get("BK") == 32


@pytest.mark.parametrize("dtype,frags", [("float32", ["wmma_16x16x8"]),
                                         ("float64", ["wmma_8x8x4"]),
                                         ("int4", ["wmma_8x8x32"]),
                                         ("int8", ["wmma_16x16x16", "wmma_32x8x16",
                                                   "wmma_8x32x16"])])
def test_configs_per_dtype(dtype, frags):
    """A @ B with B row-major: the K-major kernels on staged copies first (their first two
    configs for A row-major, B column-major; none for int4), then the WMMA kernels."""
    p = synthetic(100, 100, 256, dtype, precision="tf32" if dtype == "float32" else None)
    staged = [c for c in backend.configs(p) if staging.is_staged(c)]
    kmajor = [c.name for c in backend.configs(staging.staged_problem(p, kmajor=True))
              if c.name.startswith(rw_kernels.KMAJOR_PREFIXES)][:rw_kernels.KMAJOR_OFFERED]
    assert [c.name for c in staged] == [f"staged:{name}" for name in kmajor]
    assert all(staging.is_kmajor(c) for c in staged) and (dtype == "int4") == (not staged)
    assert [c.name for c in backend.configs(p)] == [c.name for c in staged] + frags


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


def test_misaligned_rows_take_the_fast_kernel_on_staged_copies_and_say_so():
    p = synthetic(100, 100, 99, "float16", cc=(8, 0))  # ld 99 halves: rows off the grid
    assert rw_kernels.fast_eligible(p) is not None
    names = [c.name for c in backend.configs(p)]
    assert names[0] == "staged:fast_128x256x32_s3" and "wmma_16x16x16" in names
    assert rw_kernels.kernel_for(p, backend.configs(p)[0]).name.startswith("rw_fast")
    # sm_90a: the TMA kernel on the copies (in A's and B's own orders), then the fast one
    hopper = replace(p, cc=(9, 0))
    configs = backend.configs(hopper)
    names = [c.name for c in configs]
    assert names[:2] == ["staged:tma_128x256_c1", "staged:tma_128x256_c2"]
    assert names.index("staged:fast_128x256x32_s3") < names.index("wmma_16x16x16")
    assert rw_kernels.kernel_for(hopper, configs[0]).name == "rw_tma_f16_128x256_c1_rr"
    assert "16-byte aligned" in backend.note(p)
    with pytest.raises(InvalidArgument, match="fast_128x256x32_s3"):
        rw_kernels.kernel_for(p, Config.of("fast_128x256x32_s3"))


def test_sub_byte_layout_transposes_and_emulation_are_explained():
    p = synthetic(64, 64, 256, "bit", bitop="xor", a_layout="col", b_layout="row")
    note = backend.note(p)
    assert "A is col-major" in note and "B is row-major" in note and "XOR is emulated" in note
    assert backend.note(synthetic(64, 64, 256, "bit", bitop="and", b_layout="col")) is None
    assert "emulated on sm_90" in backend.note(synthetic(64, 64, 64, "int4", b_layout="col"))
    assert backend.note(synthetic(64, 64, 64, "int4", b_layout="col", cc=(8, 0))) is None


def test_kernel_names_follow_problem():
    p = synthetic(64, 64, 64, "float16", a_layout="col", b_layout="row", acc="float16")
    assert rw_kernels.kernel_for(p, Config.of("wmma_32x8x16")).name == "rw_gemm_f16_f16_32x8x16_cr"
    p = synthetic(64, 64, 256, "bit", bitop="and")
    assert rw_kernels.kernel_for(p, Config.of("wmma_8x8x128")).name == "rw_gemm_b1and_s32_8x8x128"
    with pytest.raises(InvalidArgument, match="wmma_8x8x128"):
        rw_kernels.kernel_for(p, Config.of("wmma_16x16x16"))
    d = synthetic_dot(1 << 20, "float16", acc="float16")
    assert backend.supports(d) is None
    assert rw_kernels.dot_kernel_name(d, True) == "rw_dot_f16_vec_hfma2"
    assert rw_kernels.dot_kernel_name(synthetic_dot(10, "float32"), False) == "rw_dot_f32_strided"


# ---- launching through the driver API ----------------------------------------------------

_C_TYPES = {"int": driver.INT32, "long long": driver.INT64, "double": driver.FLOAT64,
            "__grid_constant__ rw::TensorMap": driver.TENSOR_MAP}
_SIGNATURES = {("wmma_fast.cu", "RW_FAST"): rw_kernels.GEMM_PARAMS["wmma_fast.cu"],
               ("wmma_generic.cu", "RW_GENERIC"): rw_kernels.GEMM_PARAMS["wmma_generic.cu"],
               ("wmma_subbyte.cu", "RW_SUBBYTE"): rw_kernels.GEMM_PARAMS["wmma_subbyte.cu"],
               ("mma_kmajor.cu", "RW_MMA"): rw_kernels.GEMM_PARAMS["mma_kmajor.cu"],
               ("mma_kmajor.cu", "RW_TMA"): rw_kernels.TMA_PARAMS,
               ("mma_kmajor.cu", "RW_TMA_REDUCE"): rw_kernels.REDUCE_PARAMS,
               ("dot.cu", "RW_DOT"): rw_kernels.DOT_PARAMS,
               ("dot.cu", "RW_DOT_FINAL"): rw_kernels.DOT_FINAL_PARAMS,
               ("stage.cu", "RW_STAGE"): staging.STAGE_PARAMS}


def kernel_signature(source: str, macro: str) -> list[tuple[str, type]]:
    """(name, ctypes type) of each parameter of the entry points ``macro`` defines in
    ``source``, read from the ``extern "C"`` signature in the macro's body."""
    text = (SOURCE_DIR / source).read_text()
    body = re.search(rf"#define {macro}\(.*?\n((?:.*\\\n)*.*)", text).group(1).replace("\\\n", "")
    params = re.search(r"extern \"C\" __global__ void .*?\)\s*NAME\(([^)]*)\)", body).group(1)
    out = []
    for param in params.split(","):
        ctype, name = " ".join(param.split()).rsplit(" ", 1)
        out.append((name, driver.POINTER if ctype.endswith("*") else
                    _C_TYPES[ctype.removeprefix("const ")]))
    return out


@pytest.mark.parametrize("source,macro", list(_SIGNATURES))
def test_parameter_lists_match_the_kernel_signatures(source, macro):
    assert kernel_signature(source, macro) == list(_SIGNATURES[(source, macro)])


def _read(params, kernel_params: int) -> dict[str, int | float]:
    """What cuLaunchKernel reads for each parameter: sizeof(its type) bytes at the address
    ``kernel_params[i]`` holds."""
    pointers = (ctypes.c_void_p * len(params)).from_address(kernel_params)
    out = {}
    for i, (name, ctype) in enumerate(params):
        raw = ctypes.string_at(pointers[i], ctypes.sizeof(ctype))
        if ctype is driver.TENSOR_MAP:
            out[name] = raw
            continue
        fmt = {driver.POINTER: "<Q", driver.INT32: "<i", driver.INT64: "<q",
               driver.FLOAT64: "<d"}[ctype]
        out[name] = struct.unpack(fmt, raw)[0]
    return out


def _slots(args: driver.Arguments) -> dict[str, int | float]:
    return _read(args.params, args.address)


def _tensor(shape, dtype=torch.float16, offset=0):
    flat = torch.zeros(math.prod(shape) + offset, dtype=dtype)
    return flat[offset:].view(shape)


def test_generic_argument_buffer_holds_each_parameter_at_its_pointer():
    m, n, k, batch = 37, 45, 53, 3
    a = _tensor((batch, k + 3, m)).transpose(1, 2)[:, :, :k]  # column-major, batches apart
    b = _tensor((batch, k, n))
    c = _tensor((n, m)).t()[None].expand(batch, m, n)  # broadcast, column-major
    d = _tensor((batch, m, n))
    problem = synthetic(m, n, k, "float16", batch=batch, a_layout="col", has_c=True)
    ops = Operands(a, b, c, d, alpha=0.5, beta=-2.0, stream=7)
    kernel = rw_kernels.kernel_for(problem, Config.of("wmma_32x8x16"))
    assert kernel.name == "rw_gemm_f16_f32_32x8x16_cr"
    args = driver.Arguments(kernel.name, rw_kernels.GEMM_PARAMS[kernel.source],
                            rw_arguments.gemm_arguments(problem, ops, kernel))
    assert _slots(args) == {
        "a": a.data_ptr(), "b": b.data_ptr(), "c": c.data_ptr(), "d": d.data_ptr(),
        "M": m, "N": n, "K": k, "sam": 1, "sak": m, "sbk": n, "sbn": 1,
        "scm": 1, "scn": m, "sba": (k + 3) * m, "sbb": k * n, "sbc": 0, "batch": batch,
        "alpha": 0.5, "beta": -2.0, "c_code": 0, "d_code": 0, "satf": 0}
    assert kernel.tile == (64, 64) and rw_arguments.gemm_grid(problem, kernel) == (1, batch, 1)


def test_fast_and_sub_byte_arguments_from_matrices_as_given():
    m, n, k = 300, 264, 136
    a, b, d = _tensor((m, k)), _tensor((n, k)).t(), _tensor((1, m, n))
    problem = synthetic(m, n, k, "bfloat16", b_layout="col", out_dtype="float32")
    kernel = rw_kernels.kernel_for(problem, Config.of("fast_128x128x64_s3"))
    values = _slots(driver.Arguments(kernel.name, rw_kernels.GEMM_PARAMS[kernel.source],
                                     rw_arguments.gemm_arguments(problem, Operands(a, b, None, d), kernel)))
    assert values == {"a": a.data_ptr(), "b": b.data_ptr(), "c": 0, "d": d.data_ptr(),
                      "M": m, "N": n, "K": k, "lda": k, "ldb": k, "scm": 0, "scn": 0, "sba": 0,
                      "sbb": 0, "sbc": 0, "batch": 1, "alpha": 1.0, "beta": 0.0, "c_code": 2,
                      "d_code": 2, "vec_ok": 0}  # float32 out from bfloat16: no 16-byte stores
    assert rw_arguments.gemm_grid(problem, kernel) == (3 * 3, 1, 1)
    sub = synthetic(64, 40, 256, "bit", bitop="and", b_layout="col")
    ap, bp = _tensor((64, 32), torch.uint8), _tensor((40, 32), torch.uint8).t()
    dp = _tensor((64, 40), torch.int32)
    kernel = rw_kernels.kernel_for(sub, Config.of("wmma_8x8x128"))
    values = rw_arguments.gemm_arguments(sub, Operands(ap, bp, None, dp, alpha=3, beta=0), kernel)
    assert (values["kbytes"], values["sam"], values["sak"], values["sbk"], values["sbn"],
            values["alpha"], values["d_code"]) == (32, 32, 1, 1, 32, 3.0, 4)


def test_dot_arguments_and_blocks():
    x, y = _tensor((5000,), torch.float32), _tensor((10000,), torch.float32)[::2]
    problem = synthetic_dot(5000, "float32")
    ops = Operands(x, y, None, _tensor((1,), torch.float32))
    vec, blocks = rw_arguments.dot_plan(problem, ops, Config.of("dot_8bps"), sms=132)
    assert not vec and blocks == -(-5000 // (rw_kernels.DOT_THREADS * rw_kernels.DOT_UNROLL))
    first, final = rw_arguments.dot_arguments(problem, ops, partial=0x7000, blocks=blocks)
    assert _slots(driver.Arguments("rw_dot_f32_strided", rw_kernels.DOT_PARAMS, first)) == {
        "x": x.data_ptr(), "sx": 1, "y": y.data_ptr(), "sy": 2, "n": 5000, "partial": 0x7000}
    assert _slots(driver.Arguments("rw_dot_final_f64", rw_kernels.DOT_FINAL_PARAMS, final)) == {
        "partial": 0x7000, "count": blocks, "out": ops.d.data_ptr(), "d_code": 2}
    assert rw_kernels.dot_final_name(problem) == "rw_dot_final_f64"  # float64 partials, float32 out
    long = Operands(_tensor((1 << 24,)), _tensor((1 << 24,)), None, _tensor((1,)))
    assert rw_arguments.dot_plan(synthetic_dot(1 << 24), long, Config.of("dot_4bps"), 132) == (True, 528)


def test_arguments_refuse_missing_unknown_and_out_of_range_values():
    params = rw_kernels.DOT_FINAL_PARAMS
    with pytest.raises(ValueError, match=r"rw_dot_final_f32.*\['out'\] missing.*\['extra'\]"):
        driver.Arguments("rw_dot_final_f32", params,
                         {"partial": 1, "count": 2, "d_code": 0, "extra": 1})
    with pytest.raises(OverflowError, match=r"count of rw_dot_final_f32 is 2147483648"):
        driver.Arguments("rw_dot_final_f32", params,
                         {"partial": 1, "count": 2**31, "out": 3, "d_code": 0})
    with pytest.raises(OverflowError, match="partial"):
        driver.Arguments("rw_dot_final_f32", params,
                         {"partial": -1, "count": 1, "out": 3, "d_code": 0})


class _Handle(str):
    """A fake function handle: the kernel's name, and an integer as a real handle converts to."""

    def __int__(self) -> int:
        return 0x1000 + sum(map(ord, self))


class FakeDriver:
    """The part of ``cuda.bindings.driver`` the launch path calls, recording each launch
    with the parameter values the kernel would receive (``signatures``: each kernel's
    parameter list, filled in as kernels are compiled)."""

    def __init__(self, signatures: dict[str, tuple]):
        from cuda.bindings import driver as real

        self.CUresult = real.CUresult
        self.CUfunction_attribute = real.CUfunction_attribute
        self.signatures = signatures
        self.compiled: list[tuple] = []
        self.current = 0
        self.stack: list[int] = []
        self.loaded: list[tuple[str, int]] = []
        self.smem: dict[str, int] = {}
        self.launches: list[dict] = []
        self.result = 0

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, ordinal):
        return (0, ordinal)

    def cuDevicePrimaryCtxRetain(self, device):
        return (0, 0x1000 + device)

    def cuCtxGetCurrent(self):
        return (0, self.current)

    def cuCtxPushCurrent(self, context):
        self.stack.append(self.current)
        self.current = int(context)
        return (0,)

    def cuCtxPopCurrent(self):
        popped, self.current = self.current, self.stack.pop()
        return (0, popped)

    def cuModuleLoadData(self, image):
        return (0, bytes(image))

    def cuModuleGetFunction(self, module, name):
        self.loaded.append((name.decode(), self.current))
        return (0, _Handle(name.decode()))

    def cuFuncSetAttribute(self, function, attribute, value):
        assert attribute == self.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self.smem[function] = value
        return (0,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append({"kernel": f, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "smem": smem, "stream": stream, "context": self.current,
                              "extra": extra, "args": _read(self.signatures[f], params)})
        return (self.result,)

    def cuGetErrorString(self, error):
        return (0, b"invalid argument")


@pytest.fixture
def fake_driver(monkeypatch):
    pytest.importorskip("cuda.bindings.driver")
    signatures = {}
    fake = FakeDriver(signatures)
    monkeypatch.setattr(driver, "bindings", lambda: fake)
    monkeypatch.setattr(driver, "_contexts", {})
    def compile_cubin(source, kernel, arch, defines=()):
        fake.compiled.append((source.name, kernel, arch, tuple(defines)))
        signatures[kernel] = ((rw_kernels.REDUCE_PARAMS if kernel.startswith("rw_tma_reduce")
                               else rw_kernels.TMA_PARAMS if kernel.startswith("rw_tma_")
                               else None)
                              or rw_kernels.GEMM_PARAMS.get(source.name)
                              or (staging.STAGE_PARAMS if source.name == "stage.cu" else None)
                              or (rw_kernels.DOT_FINAL_PARAMS if "final" in kernel else rw_kernels.DOT_PARAMS))
        return nvrtc.Compiled(SOURCE_DIR / source.name, built=True)  # any file: not parsed
    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    return fake


def test_run_launches_with_a_buffer_built_once_and_pointers_rewritten(fake_driver):
    backend = rw.create()
    m, n, k = 200, 264, 136
    problem = synthetic(m, n, k, "float16", cc=(9, 0))
    config = Config.of("fast_128x256x32_s3")
    first = Operands(_tensor((m, k)), _tensor((k, n)), None, _tensor((m, n)), stream=0x55)
    backend.run(problem, first, config)
    name = "rw_fast_f16_128x256x32_s3_rr"
    assert fake_driver.compiled == [("wmma_fast.cu", name, "sm_90", (f"RW_ONLY={name}",))]
    assert fake_driver.loaded == [(name, 0x1000)]  # in the primary context of device 0
    smem = rw_kernels.fast_smem_bytes(128, 256, 32, 3, True, True)
    assert smem > 48 * 1024 and fake_driver.smem == {name: smem}
    assert fake_driver.current == 0 and not fake_driver.stack  # pushed and popped
    launch = fake_driver.launches[-1]
    assert (launch["kernel"], launch["grid"], launch["block"], launch["smem"], launch["stream"],
            launch["context"], launch["extra"]) == (name, (2 * 2, 1, 1), (256, 1, 1), smem,
                                                    0x55, 0x1000, 0)
    assert launch["args"]["a"] == first.a.data_ptr() and launch["args"]["vec_ok"] == 1

    fake_driver.current = 0x1000  # the primary context already current: nothing pushed
    second = Operands(_tensor((m, k), offset=64), _tensor((k, n)), None, _tensor((m, n)),
                      stream=0)
    bound = backend.bind(problem, config, second)
    assert len(backend._launches) == 1  # the same kind of call: the launch run built
    bound(second.a, second.b, None, second.d, 0)
    again = fake_driver.launches[-1]
    assert again["args"] == dict(launch["args"], a=second.a.data_ptr(), b=second.b.data_ptr(),
                                 d=second.d.data_ptr())
    assert again["stream"] == 0 and again["context"] == 0x1000 and not fake_driver.stack
    assert len(fake_driver.compiled) == 1

    fake_driver.result = 1
    with pytest.raises(KernelRefused, match=rf"cuLaunchKernel of {name} .* stream 0x9\) on "
                                            r"device 0 failed: CUDA_ERROR_INVALID_VALUE"):
        bound(second.a, second.b, None, second.d, 9)


class FakeTensorMaps:
    """libcuda's tensor-map calls as :mod:`multibackend.gpu.tensormap` makes them: each encode
    recorded (address, dims, strides, box) and its map filled with a marker and the address;
    each address replacement recorded and written into the map."""

    def __init__(self):
        self.encoded: list[tuple] = []
        self.replaced: list[int] = []

    def encode(self, out, dtype, rank, address, dims, strides, box, steps, interleave, swizzle,
               promotion, fill):
        assert out % tensormap.ALIGN == 0 and rank == 3 and list(steps[:3]) == [1, 1, 1]
        assert (dtype, interleave, swizzle, promotion, fill) == (0, 0, 3, 3, 0)
        self.encoded.append((address, tuple(dims[:3]), tuple(strides[:2]), tuple(box[:3])))
        ctypes.memmove(out, struct.pack("<QQ", 0x7E45, address).ljust(tensormap.SIZE, b"\0"),
                       tensormap.SIZE)
        return 0

    def replace(self, out, address):
        self.replaced.append(address)
        ctypes.memmove(out + 8, struct.pack("<Q", address), 8)
        return 0


def _map_address(raw: bytes) -> int:
    marker, address = struct.unpack_from("<QQ", raw)
    assert marker == 0x7E45
    return address


def test_tma_launch_encodes_its_maps_once_and_repoints_them_per_call(fake_driver, monkeypatch):
    """A TMA kernel's launch: its tensor maps encoded once (A as M rows of K bytes, B as N
    columns, batch entries apart, boxes of the tile's rows, the cluster's share of B's), the
    grid whole clusters along M, and a later call re-pointing only the maps of operands that
    moved; described for the compiled front as the same buffer, its maps' addresses replaced by
    A's and B's (native.MAP), D's pointer written."""
    fake = FakeTensorMaps()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake.encode, fake.replace))
    backend = rw.create()
    fake_driver.current = 0x1000
    m, n, k, batch = 300, 520, 200, 2
    problem = synthetic(m, n, k, "bfloat16", batch=batch, b_layout="col", cc=(9, 0))
    config = Config.of("tma_128x256_c2")
    a = _tensor((batch, m, k), torch.bfloat16)
    b = _tensor((batch, n, k), torch.bfloat16).transpose(1, 2)
    first = Operands(a, b, None, _tensor((batch, m, n), torch.bfloat16), stream=7)
    backend.run(problem, first, config)
    name = "rw_tma_bf16_128x256_c2"
    assert fake_driver.compiled == [("mma_kmajor.cu", name, "sm_90a", (f"RW_ONLY={name}",))]
    assert fake.encoded == [(a.data_ptr(), (2 * k, m, batch), (2 * k, 2 * m * k), (128, 128, 1)),
                            (b.data_ptr(), (2 * k, n, batch), (2 * k, 2 * n * k), (128, 128, 1))]
    launch = fake_driver.launches[-1]
    assert launch["grid"] == (4 * 3, batch, 1)  # 3 row tiles rounded up to 2 clusters of 2
    assert launch["block"] == (384, 1, 1) and launch["smem"] == rw_kernels.tma_smem_bytes(128, 256, 4)
    args = launch["args"]
    assert _map_address(args["a_map"]) == a.data_ptr()
    assert _map_address(args["b_map"]) == b.data_ptr()
    assert {key: args[key] for key in ("M", "N", "kbytes", "batch", "c", "d")} == {
        "M": m, "N": n, "kbytes": 2 * k, "batch": batch, "c": 0, "d": first.d.data_ptr()}

    moved = _tensor((batch, m, k), torch.bfloat16, offset=64)
    d = _tensor((batch, m, n), torch.bfloat16)
    backend.bind(problem, config, first)(moved, b, None, d, 7)
    assert len(fake.encoded) == 2 and fake.replaced == [moved.data_ptr()]
    again = fake_driver.launches[-1]["args"]
    assert _map_address(again["a_map"]) == moved.data_ptr()
    assert again["b_map"] == args["b_map"] and again["d"] == d.data_ptr()
    flat = synthetic(m, n, k, "bfloat16", b_layout="col", cc=(9, 0))
    ops = Operands(a[0], b[0], None, d[0], stream=7)
    backend.run(flat, ops, config)
    step, = backend.native(flat, config, ops).steps
    assert _slot_names(step, rw_kernels.TMA_PARAMS) == {"a_map": native.A + native.MAP,
                                                "b_map": native.B + native.MAP, "d": native.D}
    assert [step.offsets[i] % tensormap.ALIGN for i in (0, 1)] == [0, 0]
    assert _map_address(step.params[step.offsets[0]:]) == a.data_ptr()


def test_tma_launch_maps_mn_major_operands_as_they_lie(fake_driver, monkeypatch):
    """An M-major A and an N-major B (plain ``A.T @ B``-style f16 views, ragged, batched, their
    leading dimensions wider than their rows) go to the TMA kernel built for that order, each
    mapped where it lies as K rows of its M or N elements' bytes, boxes of 128 bytes by 64 k's;
    nothing is copied (one launch, no staging kernel)."""
    fake = FakeTensorMaps()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake.encode, fake.replace))
    backend = rw.create()
    fake_driver.current = 0x1000
    m, n, k, batch, lda, ldb = 300, 520, 200, 2, 304, 528
    config = Config.of("tma_128x256_c1")
    a = _tensor((batch, k, lda))[:, :, :m].transpose(1, 2)
    b = _tensor((batch, k, ldb))[:, :, :n]
    problem = replace(synthetic(m, n, k, "float16", batch=batch, cc=(9, 0)),
                      a=make_operand("float16", m, k, a.stride()[1:], a.stride(0), a.data_ptr()),
                      b=make_operand("float16", k, n, b.stride()[1:], b.stride(0), b.data_ptr()))
    assert (problem.a.layout, problem.b.layout) == ("col", "row")
    backend.run(problem, Operands(a, b, None, _tensor((batch, m, n)), stream=7), config)
    name = "rw_tma_f16_128x256_c1_cr"
    assert [c[1] for c in fake_driver.compiled] == [name]
    assert fake.encoded == [(a.data_ptr(), (2 * m, k, batch), (2 * lda, 2 * k * lda), (128, 64, 1)),
                            (b.data_ptr(), (2 * n, k, batch), (2 * ldb, 2 * k * ldb), (128, 64, 1))]
    launch, = fake_driver.launches
    assert launch["kernel"] == name and launch["grid"] == (3 * 3, batch, 1)
    assert launch["args"]["kbytes"] == 2 * k


def test_tensor_maps_refuse_what_tma_cannot_read(monkeypatch):
    fake = FakeTensorMaps()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake.encode, fake.replace))
    with pytest.raises(InvalidArgument, match="tensor map of A: its row stride is 24 bytes"):
        tensormap.TensorMap("A", 0x1000, 24, 10, 24, 1, 0, 128)
    with pytest.raises(InvalidArgument, match="box_rows is 300"):
        tensormap.TensorMap("B", 0x1000, 32, 10, 32, 1, 0, 300)
    one = tensormap.TensorMap("A", 0x1000, 48, 10, 64, 1, 0, 128)
    assert fake.encoded[-1] == (0x1000, (48, 10, 1), (64, 640), (128, 128, 1))
    tensormap.TensorMap("A", 0x1000, 2, 1, 2, 1, 0, 128)  # one row: its stride is never used
    assert fake.encoded[-1] == (0x1000, (2, 1, 1), (16, 16), (128, 128, 1))
    with pytest.raises(InvalidArgument, match="its address is 0x1008"):
        one.point_at(0x1008)
    assert rw_kernels.tma_eligible(synthetic(256, 256, 512, "float16", b_layout="col", batch=2)) is None


def test_run_with_c_and_the_dot_passes(fake_driver, monkeypatch):
    backend = rw.create()
    fake_driver.current = 0x1000
    problem = synthetic(40, 24, 16, "int8", has_c=True, cc=(8, 0))
    ops = Operands(_tensor((40, 16), torch.int8), _tensor((16, 24), torch.int8),
                   _tensor((40, 24), torch.int32), _tensor((40, 24), torch.int32), 2, -1, 3)
    backend.run(problem, ops, Config.of("wmma_16x16x16"))
    values = fake_driver.launches[-1]["args"]
    assert (values["c"], values["alpha"], values["beta"], values["satf"]) == (
        ops.c.data_ptr(), 2.0, -1.0, 0)
    assert fake_driver.compiled[-1][2] == "sm_80"

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(backend, "_partials", lambda device, stream, sms, wide: 0x9000 + stream)
    dot = synthetic_dot(20000, "float16")
    x, y, d = _tensor((20000,)), _tensor((20000,)), _tensor((1,), torch.float32)
    for stream in (1, 2):
        backend.run(dot, Operands(x, y, None, d, stream=stream), Config.of("dot_8bps"))
    blocks = 3  # 20000 halves, 256 threads each with 4 steps of 8 halves in flight
    first, final = fake_driver.launches[-2:]
    assert (first["kernel"], first["grid"], final["kernel"], final["grid"]) == (
        "rw_dot_f16_vec", (blocks, 1, 1), "rw_dot_final_f32", (1, 1, 1))
    assert first["args"] == {"x": x.data_ptr(), "sx": 1, "y": y.data_ptr(), "sy": 1, "n": 20000,
                             "partial": 0x9002}
    assert final["args"] == {"partial": 0x9002, "count": blocks, "out": d.data_ptr(),
                             "d_code": 2}
    assert fake_driver.launches[-4]["args"]["partial"] == 0x9001  # a buffer per stream
    assert len(backend._launches) == 2


_CODES = {driver.POINTER: "Q", driver.INT32: "i", driver.INT64: "q", driver.FLOAT64: "d"}


def _step_values(step, params) -> dict[str, int | float]:
    """Each parameter's value as a kernel step's packed buffer holds it."""
    return {name: struct.unpack_from(_CODES[ctype], step.params, offset)[0]
            for (name, ctype), offset in zip(params, step.offsets)}


def _slot_names(step, params) -> dict[str, int]:
    names = [name for name, _ in params]
    return {names[step.offsets.index(offset)]: source for offset, source in step.slots}


def _on_cuda(pointer: int, strides: tuple[int, int] = (1, 1)):
    """The part of a CUDA tensor a staging copy reads: device, element size, strides and
    address."""
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda", index=0),
                                 element_size=lambda: 2, stride=lambda: strides,
                                 data_ptr=lambda: pointer)


def test_a_staged_matrix_is_copied_by_a_launch_prepared_once(fake_driver, monkeypatch):
    monkeypatch.setattr(staging, "_LAUNCHES", {})
    monkeypatch.setattr(staging, "_FUNCTIONS", {})
    monkeypatch.setattr(staging, "torch_copies_why", lambda: None)
    monkeypatch.setattr(nvrtc, "arch", lambda device, cc=None: "sm_90")
    m, k = 67, 135
    now = staging.staged_problem(synthetic(m, 40, k, "float16")).a
    for src, dst, stream in ((0x1000, 0x8000, 0x55), (0x3002, 0x9000, 0x66)):
        assert staging._kernel_copy(_on_cuda(src, (k, 1)), _on_cuda(dst), now, stream)
        launch = fake_driver.launches[-1]
        assert (launch["kernel"], launch["stream"], launch["grid"]) == ("rw_stage_b16", stream,
                                                                        (1, m, 1))
        assert launch["args"] == {"src": src, "dst": dst, "lines": m, "length": k,
                                  "ld": now.ld, "src_line": k, "src_pos": 1}
    assert [c[1] for c in fake_driver.compiled] == ["rw_stage_b16"]  # compiled once
    assert len(staging._LAUNCHES) == 1  # prepared once, its two pointers written per call
    monkeypatch.setattr(staging, "torch_copies_why", lambda: "ImportError: no bindings")
    assert not staging._kernel_copy(_on_cuda(0x1000, (k, 1)), _on_cuda(0x8000), now, 0x55)
    assert len(fake_driver.launches) == 2


def test_a_staged_config_is_described_as_its_copies_then_its_kernel_on_them(fake_driver,
                                                                             monkeypatch):
    monkeypatch.setattr(staging, "_ARENAS", {})
    backend = rw.create()
    m, n, k = 67, 40, 135  # A's rows (135 halves) off the grid, B's (40 halves) on it
    problem = synthetic(m, n, k, "float16", cc=(8, 0))
    config = backend.default_config(problem)
    assert staging.is_staged(config)
    ops = Operands(_tensor((m, k)), _tensor((k, n)), None, _tensor((m, n)), stream=0x55)
    backend.run(problem, ops, config)
    plan = backend.native(problem, config, ops)
    copy, gemm = plan.steps
    assert ("stage.cu", "rw_stage_b16") in {c[:2] for c in fake_driver.compiled}
    assert copy.stream == gemm.stream == 0x55  # the copies' buffer is this stream's
    arena = staging._ARENAS[(ops.a.device, 0x55, "a")][-1]
    assert arena.numel() >= m * 192 * 2 and (ops.b.device, 0x55, "b") not in staging._ARENAS
    assert _slot_names(copy, staging.STAGE_PARAMS) == {"src": native.A}
    assert _step_values(copy, staging.STAGE_PARAMS) == {
        "src": 0, "dst": arena.data_ptr(), "lines": m, "length": k, "ld": 192,
        "src_line": k, "src_pos": 1}
    assert copy.grid == (1, m, 1) and copy.block == (staging.STAGE_THREADS, 1, 1)
    params = rw_kernels.GEMM_PARAMS["wmma_fast.cu"]
    assert _slot_names(gemm, params) == {"b": native.B, "d": native.D}
    values = _step_values(gemm, params)
    assert (values["a"], values["lda"], values["ldb"], values["K"]) == (arena.data_ptr(), 192,
                                                                         n, k)
    assert plan.d_sizes == (m, n) and plan.d_dtype == torch.float16
    batch = synthetic(m, n, k, "float16", batch=2, cc=(8, 0))
    batched = Operands(_tensor((2, m, k)), _tensor((2, k, n)), None, _tensor((2, m, n)),
                       stream=0x55)
    assert backend.native(batch, config, batched) is None  # a batch stays on the Python path

    # sm_90a: the TMA kernel reads the copy through a map made once over the arena
    fake = FakeTensorMaps()
    monkeypatch.setattr(tensormap, "_functions", lambda: (fake.encode, fake.replace))
    problem = replace(problem, cc=(9, 0))
    config = backend.default_config(problem)
    assert config.name == "staged:tma_128x256_c1"
    backend.run(problem, ops, config)
    copy, gemm = backend.native(problem, config, ops).steps
    assert _slot_names(gemm, rw_kernels.TMA_PARAMS) == {"b_map": native.B + native.MAP,
                                                        "d": native.D}
    arena = staging._ARENAS[(ops.a.device, 0x55, "a")][-1]
    assert _map_address(gemm.params[gemm.offsets[0]:]) == arena.data_ptr()
    assert fake.encoded[-2][1:] == ((2 * k, m, 1), (2 * 192, 2 * 192 * m), (128, 128, 1))
