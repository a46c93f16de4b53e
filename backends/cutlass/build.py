"""Compile emitted CUTLASS sources with nvcc into shared libraries, cache them, load them.

Each kernel is one ``.so`` under ``cache_dir("cutlass")``, named by a digest of its source, the
nvcc flags, nvcc's version, the target arch and nvidia-cutlass's version (its headers), so a
change to any of them builds anew and an unchanged kernel is never built twice: a second
process loads what the first built. nvcc runs
in a private temporary directory under the cache (never the caller's working directory); the
result is checked, then written into place atomically beside a SHA-256 sidecar written last
(:func:`multibackend.gpu.cache.write_checked`). A per-kernel lock file serializes two processes
building the same kernel; a library whose bytes do not match its sidecar (truncated, torn,
changed in place) is deleted and rebuilt. Several kernels build at once in separate nvcc
processes (:func:`build_many`).
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from multibackend.core.errors import CompileError
from multibackend.gpu import cache, toolchain

ELF_MAGIC = b"\x7fELF"
NVCC_GB = 3.5  # peak resident memory (GiB) of one nvcc building one CUTLASS 3.x kernel


def cutlass_include_dirs() -> list[Path]:
    """CUTLASS's include directories, from the installed ``cutlass_library`` package."""
    import cutlass_library

    source = Path(cutlass_library.__file__).parent / "source"
    dirs = [source / "include", source / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise FileNotFoundError(f"CUTLASS headers not found under {dirs[0]} (the nvidia-cutlass "
                                "wheel ships them in cutlass_library/source/include)")
    return dirs


def nvcc_flags(arch: str) -> list[str]:
    """The nvcc flags for one kernel library targeting ``arch`` ("90a", "80"...)."""
    if not arch.rstrip("a").isdigit():
        raise ValueError(f"arch is {arch!r}: expected digits with an optional 'a' suffix, "
                         "e.g. '90a' or '80'")
    return ["-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O3", "-DNDEBUG",
            "--expt-relaxed-constexpr", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
            f"-gencode=arch=compute_{arch},code=sm_{arch}"]


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """The installed nvidia-cutlass version (its headers are what the source includes)."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "unknown"


def artifact_key(source: str, arch: str) -> str:
    """The cache key of a kernel: its source, flags, nvcc version, arch and CUTLASS version."""
    version = toolchain.nvcc_version() or "none"
    return cache.digest(source, " ".join(nvcc_flags(arch)), version, arch, cutlass_version())


def library_path(key: str) -> Path:
    return cache.cache_dir("cutlass") / f"{key}.so"


def cached_library(key: str) -> Path | None:
    """The cached library for ``key`` if it is whole; a torn or truncated one is removed."""
    path = library_path(key)
    found = cache.read_checked(path, lambda data: data[:4] == ELF_MAGIC)
    return path if found is not None else None


def _compile(source: str, arch: str, key: str, name: str) -> Path:
    nvcc = toolchain.require_nvcc()
    root = cache.cache_dir("cutlass")
    work = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=root))
    try:
        (work / "kernel.cu").write_text(source)
        includes = [f"-I{d}" for d in cutlass_include_dirs()]
        cmd = [str(nvcc), *nvcc_flags(arch), *includes, "-o", "kernel.so", "kernel.cu"]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        out = work / "kernel.so"
        if proc.returncode != 0 or not out.is_file():
            log = (proc.stderr or proc.stdout)[-6000:]
            raise CompileError(f"nvcc failed (exit {proc.returncode}) building CUTLASS kernel "
                               f"{name} for sm_{arch}:\n{log}")
        data = out.read_bytes()
        if data[:4] != ELF_MAGIC:
            raise CompileError(f"nvcc wrote a file that is not ELF for CUTLASS kernel {name}")
        path = library_path(key)
        cache.write_checked(path, data)
        cache.atomic_write(path.with_suffix(".cu"), source.encode())
        return path
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(source: str, arch: str, name: str = "kernel") -> Path:
    """The path of the compiled library for ``source``, building it unless cached."""
    key = artifact_key(source, arch)
    return cache.build_once(cache.cache_dir("cutlass") / f"{key}.lock",
                            lambda: cached_library(key),
                            lambda: _compile(source, arch, key, name))


def default_workers() -> int:
    """How many nvcc processes fit: one per core, at most one per NVCC_GB of memory."""
    cores = os.cpu_count() or 1
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        by_memory = int(pages / (NVCC_GB * 2**30))
    except (ValueError, OSError):
        by_memory = cores
    return max(1, min(cores, by_memory))


def build_many(jobs: list[tuple[str, str, str]],
               max_workers: int | None = None) -> list[Path | Exception]:
    """Build ``(source, arch, name)`` jobs concurrently, one nvcc process each; returns, in
    order, each library's path or the exception its build raised."""
    workers = max_workers or default_workers()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(build, source, arch, name) for source, arch, name in jobs]
    return [f.exception() or f.result() for f in futures]


_loaded: dict[Path, "Library"] = {}
_load_lock = threading.Lock()


class Library:
    """One loaded kernel library and its ``mb_gemm`` entry point, argtypes set once."""

    def __init__(self, path: Path):
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        fn = self.dll.mb_gemm
        ptr = ctypes.c_void_p
        # (shape array, a, b, c, d, alpha, beta, stream): few arguments, since ctypes pays
        # for each one on every call
        fn.argtypes = [ptr] * 5 + [ctypes.c_double] * 2 + [ptr]
        fn.restype = ctypes.c_int
        self.gemm = fn
        self.dll.mb_workspace_size.argtypes = [ptr]
        self.dll.mb_workspace_size.restype = ctypes.c_int64
        for name in ("mb_status_string", "mb_cuda_error_string", "mb_kernel_name"):
            getattr(self.dll, name).restype = ctypes.c_char_p
        self.kernel_name = self.dll.mb_kernel_name().decode()

    def workspace_size(self, shape_address: int) -> int:
        """The device workspace (bytes) ``mb_gemm`` needs for the sizes and settings in the
        shape array at ``shape_address``: host arithmetic, no GPU needed."""
        return int(self.dll.mb_workspace_size(shape_address))

    def status_string(self, status: int) -> str:
        return self.dll.mb_status_string(status).decode()

    def cuda_error_string(self) -> str:
        return self.dll.mb_cuda_error_string().decode()


def load(path: Path) -> Library:
    """The loaded library at ``path`` (loaded once per process)."""
    with _load_lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = Library(path)
        return lib
