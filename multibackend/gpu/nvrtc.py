"""Run-time compilation of CUDA sources to cubins, cached on disk.

The raw WMMA backend compiles its ``.cu`` files when a kernel is first asked for. NVRTC (through
``cuda.bindings.nvrtc``) does it with no GPU present; where those bindings or ``libnvrtc`` are
missing, nvcc (found by :mod:`multibackend.gpu.toolchain`) does the same job. Either way the cubin
is stored under ``cache_dir("raw_wmma")`` keyed by the source and every header it may include,
the options, the architecture and the compiler's version, written atomically beside its
SHA-256 (:func:`multibackend.gpu.cache.write_checked`); a later process loads it and compiles
nothing, and an entry that is not a whole ELF file or does not match its SHA-256 is rebuilt.
Processes that ask for the same cubin at once (the ranks of one job) build it once: one
compiles while the others wait, then load what it wrote.
"""
from __future__ import annotations

import functools
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from multibackend.core.errors import CompileError
from multibackend.gpu import cache, toolchain

CACHE_KIND = "raw_wmma"


@dataclass(frozen=True)
class Compiled:
    """One compiled cubin: where it lies and whether this call had to build it."""

    path: Path
    built: bool


def _nvrtc():
    """The ``cuda.bindings.nvrtc`` module with libnvrtc loaded, or None."""
    try:
        from cuda.bindings import nvrtc  # type: ignore[import-not-found]

        err, _, _ = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - a missing module or library means "not available"
        return None
    return nvrtc if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """"nvrtc X.Y", else "nvcc X.Y.Z"; raises when neither compiler is present."""
    nvrtc = _nvrtc()
    if nvrtc is not None:
        _, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc {major}.{minor}"
    version = toolchain.nvcc_version()
    if version is None:
        raise CompileError("no CUDA compiler: cuda.bindings.nvrtc (pip nvidia-cuda-nvrtc) could "
                           "not load libnvrtc and nvcc was not found")
    return f"nvcc {version}"


def include_dir() -> Path:
    """The CUDA include directory (NVRTC has no ``mma.h`` of its own)."""
    inc = toolchain.cuda_include_dir()
    if inc is None:
        raise CompileError("the CUDA include directory holding crt/mma.h was not found: set "
                           "CUDA_HOME to a CUDA toolkit")
    return inc


def valid_cubin(data: bytes) -> bool:
    """Whether ``data`` is a whole 64-bit ELF file (its section table inside the data)."""
    if len(data) < 64 or data[:5] != b"\x7fELF\x02":
        return False
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return shoff > 0 and shoff + shentsize * shnum <= len(data)


def _headers(source: Path) -> list[bytes]:
    """The headers beside ``source`` (``*.cuh``), which it may include: part of the key."""
    return [p.name.encode() + b"\0" + p.read_bytes() for p in sorted(source.parent.glob("*.cuh"))]


def arch(device: int, cc: tuple[int, int] | None = None) -> str:
    """The architecture to compile for ("sm_90"): compute capability ``cc`` where the caller
    knows it, else ``device``'s."""
    if cc is None:
        import torch

        cc = torch.cuda.get_device_capability(device)
    return f"sm_{cc[0]}{cc[1]}"


def compile_cubin(source: Path, kernel: str, arch: str, defines: Sequence[str] = ()) -> Compiled:
    """The cubin of ``source`` built for ``arch`` (e.g. "sm_90") with ``-D`` ``defines``.

    ``kernel`` names the entry point the caller wants (it appears in error messages). Raises
    :class:`CompileError` with the compiler's log when the source does not compile.
    """
    options = [f"--gpu-architecture={arch}", "--std=c++17", f"-I{source.parent}",
               f"-I{include_dir()}", *(f"-D{d}" for d in defines)]
    version = compiler_version()
    key = cache.digest(source.read_bytes(), *_headers(source), "\0".join(options), arch, version)
    path = cache.cache_dir(CACHE_KIND) / f"{source.stem}-{arch}-{key}.cubin"

    def cached() -> Compiled | None:
        found = cache.read_checked(path, valid_cubin) is not None
        return Compiled(path, built=False) if found else None

    def build() -> Compiled:
        if version.startswith("nvrtc"):
            cubin = _compile_nvrtc(source, kernel, arch, options)
        else:
            cubin = _compile_nvcc(source, kernel, arch, options)
        if not valid_cubin(cubin):
            raise CompileError(f"compiling {kernel} ({source.name}) for {arch} produced "
                               f"{len(cubin)} bytes that are not a whole cubin")
        cache.write_checked(path, cubin)
        return Compiled(path, built=True)

    return cache.build_once(path.with_suffix(".lock"), cached, build)


def _check(nvrtc, result, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"NVRTC {what} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")


def _compile_nvrtc(source: Path, kernel: str, arch: str, options: list[str]) -> bytes:
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.read_bytes(), source.name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError(f"NVRTC failed to compile kernel {kernel} ({source.name}) for "
                               f"{arch} with {' '.join(options)}:\n"
                               f"{log.decode(errors='replace').rstrip(chr(0))}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_nvcc(source: Path, kernel: str, arch: str, options: list[str]) -> bytes:
    nvcc = toolchain.require_nvcc()
    flags = [f"-arch={arch}", "-cubin"] + [o for o in options if not o.startswith("--gpu-arch")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernel.cubin"
        proc = subprocess.run([str(nvcc), *flags, "-o", str(out), str(source)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed to compile kernel {kernel} ({source.name}) for "
                               f"{arch}:\n{proc.stderr.strip()}")
        return out.read_bytes()
