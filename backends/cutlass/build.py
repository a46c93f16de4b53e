"""Compile emitted CUTLASS sources with nvcc into shared libraries, cache them, load them.

Each kernel is one ``.so`` under ``cache_dir("cutlass")``, named by a digest of its source, the
nvcc flags, nvcc's version, the target arch and nvidia-cutlass's version (its headers), so a
change to any of them builds anew and an unchanged kernel is never built twice: a second
process loads what the first built. nvcc runs
in a private temporary directory under the cache (never the caller's working directory); the
result is checked, then written into place atomically beside a SHA-256 sidecar written last
(:func:`multibackend.gpu.cache.write_checked`). A per-kernel lock file serializes two processes
building the same kernel; a library whose bytes do not match its sidecar (truncated, torn,
changed in place) is deleted and rebuilt.

Several kernels build at once (:func:`build_many`): in parallel nvcc processes, and, where
there are more kernels than processes, several kernels in one process. Kernels that share a
header and an arch compile as one translation unit (their parts, each in its own namespace,
with entry points named by its tag: :mod:`multibackend.backends.cutlass.launcher`), so the
headers are parsed once and the templates the kernels share are instantiated once: on a 2-core
x86 machine, four f16 kernels of the four layouts took 54 CPU-s together against 37 CPU-s each
alone. Each kernel's cache entry is then that library, under its own key (the kernels' bytes
are written once per member). A group whose build fails is built again one kernel at a time,
so that each failure is its own kernel's error.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from multibackend.core.errors import CompileError
from multibackend.gpu import cache, toolchain

ELF_MAGIC = b"\x7fELF"
NVCC_GB = 4.5  # peak resident memory (GiB) of one nvcc building up to GROUP_MAX 3.x kernels
#: the most kernels one nvcc process builds
GROUP_MAX = 4
#: the line that opens a kernel's own part of a source: what comes before it (the includes) is
#: shared by the kernels built together; the line holds the kernel's tag
KERNEL_MARK = "// mb-kernel "


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


def split_source(source: str) -> tuple[str, str]:
    """(header, tag) of an emitted source: the part before the kernel's mark line, and the tag
    its entry points' names end in."""
    header, mark, rest = source.partition("\n" + KERNEL_MARK)
    if not mark:
        raise ValueError(f"a CUTLASS kernel source must hold a line starting {KERNEL_MARK!r} "
                         "before the kernel's own part: this one has none")
    return header + "\n", rest.partition("\n")[0]


def _compile(jobs: list[tuple[str, str, str]]) -> None:
    """Build ``(source, arch, name)`` jobs of one header and arch as one library, written under
    each job's key."""
    nvcc = toolchain.require_nvcc()
    arch, header = jobs[0][1], split_source(jobs[0][0])[0]
    keys = [artifact_key(source, arch) for source, _, _ in jobs]
    names = ", ".join(name for _, _, name in jobs)
    what = f"CUTLASS kernel{'s' if len(jobs) > 1 else ''} {names} for sm_{arch}"
    root = cache.cache_dir("cutlass")
    work = Path(tempfile.mkdtemp(prefix=f".build-{keys[0][:12]}-", dir=root))
    try:
        (work / "kernel.cu").write_text(header + "".join(s[len(header):] for s, _, _ in jobs))
        includes = [f"-I{d}" for d in cutlass_include_dirs()]
        cmd = [str(nvcc), *nvcc_flags(arch), *includes, "-o", "kernel.so", "kernel.cu"]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        out = work / "kernel.so"
        if proc.returncode != 0 or not out.is_file():
            log = (proc.stderr or proc.stdout)[-6000:]
            raise CompileError(f"nvcc failed (exit {proc.returncode}) building {what}:\n{log}")
        data = out.read_bytes()
        if data[:4] != ELF_MAGIC:
            raise CompileError(f"nvcc wrote a file that is not ELF for {what}")
        for (source, _, _), key in zip(jobs, keys):
            path = library_path(key)
            cache.write_checked(path, data)
            cache.atomic_write(path.with_suffix(".cu"), source.encode())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(source: str, arch: str, name: str = "kernel") -> Path:
    """The path of the compiled library for ``source``, building it unless cached."""
    key = artifact_key(source, arch)

    def compile_alone() -> Path:
        _compile([(source, arch, name)])
        return library_path(key)

    return cache.build_once(_lock_path(key), lambda: cached_library(key), compile_alone)


def _lock_path(key: str) -> Path:
    return cache.cache_dir("cutlass") / f"{key}.lock"


@contextlib.contextmanager
def _all_locked(keys: list[str]) -> Iterator[None]:
    """Hold the build locks of ``keys`` (taken in key order, so that two processes building
    overlapping groups cannot wait on each other)."""
    with contextlib.ExitStack() as stack:
        for key in sorted(set(keys)):
            stack.enter_context(cache.locked(_lock_path(key)))
        yield


def _build_group(jobs: list[tuple[str, str, str]]) -> list[Path | Exception]:
    """Build the uncached kernels of ``jobs`` (one header, one arch) in one nvcc process; a
    group that fails is built again one kernel at a time. Each job's path, or its error."""
    if len(jobs) > 1:
        keys = [artifact_key(source, arch) for source, arch, _ in jobs]
        with _all_locked(keys):
            missing = [job for job, key in zip(jobs, keys) if cached_library(key) is None]
            with contextlib.suppress(CompileError):
                if missing:
                    _compile(missing)
    results: list[Path | Exception] = []
    for job in jobs:
        try:
            results.append(build(*job))
        except Exception as exc:  # noqa: BLE001 - handed back as that job's result
            results.append(exc)
    return results


def _groups(jobs: list[tuple[str, str, str]], workers: int) -> list[list[int]]:
    """Indices of ``jobs`` in groups that each build in one nvcc process: jobs of one header
    and arch, neighbours in the order of their kernel parts (kernels of one type and layout
    share the most), as many in one as it takes to keep at most ``workers`` processes busy,
    at most :data:`GROUP_MAX`."""
    size = min(GROUP_MAX, max(1, math.ceil(len(jobs) / max(1, workers))))
    units: dict[tuple[str, str], list[int]] = {}
    for i, (source, arch, _) in enumerate(jobs):
        units.setdefault((arch, split_source(source)[0]), []).append(i)
    groups = []
    for (_, header), members in units.items():
        members.sort(key=lambda i: jobs[i][0][len(header):].partition("\n")[2])
        groups += [members[i:i + size] for i in range(0, len(members), size)]
    return groups


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
    """Build ``(source, arch, name)`` jobs concurrently, in at most ``max_workers`` nvcc
    processes (by default as many as the cores and memory allow), several kernels in one
    where there are more kernels than processes; returns, in order, each library's path or
    the exception its build raised."""
    workers = max(1, max_workers or default_workers())
    results: dict[tuple[str, str], Path | Exception] = {}
    pending: dict[tuple[str, str], tuple[str, str, str]] = {}
    for source, arch, name in jobs:
        if (source, arch) not in results and (source, arch) not in pending:
            found = cached_library(artifact_key(source, arch))
            if found is not None:
                results[source, arch] = found
            else:
                pending[source, arch] = (source, arch, name)
    todo = list(pending.values())
    groups = [[todo[i] for i in group] for group in _groups(todo, workers)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for group, built in zip(groups, pool.map(_build_group, groups)):
            results.update(((source, arch), r) for (source, arch, _), r in zip(group, built))
    return [results[source, arch] for source, arch, _ in jobs]


_loaded: dict[Path, "Library"] = {}
_load_lock = threading.Lock()


class Library:
    """One kernel's entry points in a loaded library (``mb_gemm_<tag>`` and its helpers),
    argtypes set once."""

    def __init__(self, path: Path, tag: str):
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        fn = getattr(self.dll, f"mb_gemm_{tag}")
        ptr = ctypes.c_void_p
        # (shape array, a, b, c, d, alpha, beta, stream): few arguments, since ctypes pays
        # for each one on every call
        fn.argtypes = [ptr] * 5 + [ctypes.c_double] * 2 + [ptr]
        fn.restype = ctypes.c_int
        self.gemm = fn
        self._workspace_size = getattr(self.dll, f"mb_workspace_size_{tag}")
        self._workspace_size.argtypes = [ptr]
        self._workspace_size.restype = ctypes.c_int64
        self._status_string = getattr(self.dll, f"mb_status_string_{tag}")
        self._cuda_error_string = getattr(self.dll, f"mb_cuda_error_string_{tag}")
        kernel_name = getattr(self.dll, f"mb_kernel_name_{tag}")
        for fn in (self._status_string, self._cuda_error_string, kernel_name):
            fn.restype = ctypes.c_char_p
        self.kernel_name = kernel_name().decode()

    def workspace_size(self, shape_address: int) -> int:
        """The device workspace (bytes) ``mb_gemm`` needs for the sizes and settings in the
        shape array at ``shape_address``: host arithmetic, no GPU needed."""
        return int(self._workspace_size(shape_address))

    def status_string(self, status: int) -> str:
        return self._status_string(status).decode()

    def cuda_error_string(self) -> str:
        return self._cuda_error_string().decode()


def load(path: Path, source: str) -> Library:
    """The kernel of ``source`` in the library at ``path`` (loaded once per process)."""
    with _load_lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = Library(path, split_source(source)[1])
        return lib
