"""The compiled front of a repeated plain ``matmul`` on torch tensors (``fastcall.cpp``).

A repeated ``matmul(A, B)`` whose family plan is torch's own op (:mod:`multibackend.run.plans`)
cost, in Python, about a microsecond more host time than ``torch.matmul``: each read of a tensor's
dtype, rank, device or size from Python goes through torch's attribute machinery, the key is built
and hashed, and ``torch.mm`` then parses its arguments again. On a host-bound problem that is
several percent of the call. The extension reads those from the C++ tensor, finds the family among
those :mod:`~multibackend.run.plans` remembered, and calls ``at::mm`` or ``at::matmul`` (the ops
``torch.mm`` and ``torch.matmul`` run) with no Python argument parsing, so the call costs about
what torch's own does. Where the plan is a kernel of ours (raw WMMA, Triton's pointer kernels,
CUTLASS), the backend describes its launch once (:mod:`multibackend.gpu.native`) and the front
allocates D with ``at::empty`` and launches it on torch's current stream itself: ``cuLaunchKernel``
from a parameter buffer made once, with only the pointers written per call, or the kernel library's
``mb_gemm``. A repeated call naming a backend and one of its configs (``matmul(A, B, backend=name,
config=c)``, as the tuner times its candidates) is served the same way, so that a config's eager
timing is the one a call planned from a tuning table sees. Each of these calls may also give
``out=D`` where D is what the plan would allocate (a plain torch tensor of D's dtype, sizes and
device, row-major contiguous, 16-byte aligned, sharing no byte with A or B): the same plan then
writes D, with ``at::mm_out`` or the kernels' launches, and the call answers D; the same holds for
a CuPy ``out`` where the plan of CuPy arrays is one of launches. The same holds for a repeated
``dot`` of our kernels, and for CuPy callers (``serve_arrays``, ``serve_dot_arrays``: D made by
``cupy.empty``), whose cuBLAS products it launches as ``cublasGemmEx`` itself.

It is built against the installed torch, on first use, with the C++ compiler (``$CXX``, else
``c++``, ``g++``), into the user cache, keyed by its source, torch's version and location,
the flags torch's headers need (:func:`torch_flags`: the C++ standard and libstdc++ ABI torch
says it was built with, so a torch whose headers need C++20 gets ``-std=c++20``) and Python's
version; concurrent processes build it once (a lock), and the library is written atomically,
with a record of the torch version, compiler and flags it was built with beside it
(:func:`build_record`; :func:`status` and ``python -m multibackend info`` say them). A failed
build is recorded beside it with the compiler's output and not retried for that key with that
compiler (:func:`status` says why); an unusable cache directory leaves the front off.

Every plan the front holds is dropped at interpreter exit (the module registers its
``forget`` with :mod:`atexit`), while the Python objects a plan keeps alive can still be
released: the front never releases one from a C++ static destructor, which runs after the
interpreter has finalized. ``MULTIBACKEND_FASTCALL=0``, set before the first
``matmul`` of torch tensors (which picks the front), turns it off. Without it every call takes
the Python path, which gives the same results. Unlike torch's bindings, the front keeps the GIL
through the op (see ``run`` in the source).
"""
from __future__ import annotations

import fcntl
import functools
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from multibackend.core.errors import CacheUnusable
from multibackend.core.names import ENV_FASTCALL
from multibackend.gpu import cache

#: "0" turns the compiled front off (the Python path serves every call)
ENV = ENV_FASTCALL
SOURCE = Path(__file__).with_name("fastcall.cpp")
#: seconds a build may take
BUILD_TIMEOUT_S = 600

_loaded: dict[str, ModuleType | None] = {}
_reason: dict[str, str] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def compiler() -> str | None:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on PATH."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named) or named
    return shutil.which("c++") or shutil.which("g++")


def _torch_dirs() -> tuple[Path, Path]:
    """torch's include and library directories."""
    import torch

    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


#: the C++ standards torch may be built with, by the value of ``__cplusplus`` each defines
STANDARDS = ((202302, "c++23"), (202002, "c++20"), (201703, "c++17"))
#: where ``torch.__config__.show()`` gives the ``__cplusplus`` of torch's own build
_CPLUSPLUS = re.compile(r"C\+\+ Version: (\d+)")
#: the options of every build, beside :func:`torch_flags`
OPTIONS = ("-O2", "-shared", "-fPIC", "-w")


def cxx_standard(config: str) -> str | None:
    """The ``-std=`` value of the C++ standard torch's build used, from its configuration
    (``torch.__config__.show()``, whose "C++ Version" is that build's ``__cplusplus``): the
    newest of :data:`STANDARDS` whose value it reaches; None where the configuration gives
    none, or one older than C++17."""
    found = _CPLUSPLUS.search(config)
    if found is None:
        return None
    return next((flag for least, flag in STANDARDS if int(found[1]) >= least), None)


@functools.cache
def torch_flags() -> tuple[str, ...] | None:
    """The flags torch's headers need, as the installed torch says it was built: its C++
    standard (:func:`cxx_standard` of ``torch.__config__.show()``) and its libstdc++ ABI
    (``torch._C._GLIBCXX_USE_CXX11_ABI``); None where torch names no standard. Read from torch
    itself rather than from ``torch.utils.cpp_extension``, which imports setuptools (absent
    from a plain Python 3.12 environment) and spells its standard as a literal inside its
    build functions (``-std=c++20`` in torch 2.13, which names 202002: the CPU tier checks
    that the two agree)."""
    import torch

    standard = cxx_standard(torch.__config__.show())
    if standard is None:
        return None
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return f"-std={standard}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"


def library_key() -> str:
    """The cache key of the library: its source, torch's version and location, the flags
    torch's headers need, Python's version."""
    import torch

    return cache.digest(SOURCE.read_bytes(), torch.__version__, torch.__file__, sys.version,
                        str(sysconfig.get_config_var("EXT_SUFFIX")),
                        " ".join(torch_flags() or ("(no C++ standard named by torch)",)))


def command(cxx: str, output: Path, flags: tuple[str, ...]) -> list[str]:
    """The compiler's command line building the library into ``output`` with torch's
    ``flags`` (:func:`torch_flags`)."""
    include, lib = _torch_dirs()
    return [cxx, *OPTIONS, *flags,
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-I{sysconfig.get_paths()['include']}", str(SOURCE), f"-L{lib}", "-lc10",
            "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ldl", f"-Wl,-rpath,{lib}", "-o",
            str(output)]


def _paths(key: str) -> tuple[Path, Path, Path]:
    """(the library, its failure record, its lock) for a key."""
    folder = cache.cache_dir("fastcall")
    return folder / f"{key}.so", folder / f"{key}.failed", folder / f"{key}.lock"


def _record_path(library: Path) -> Path:
    """The record of what ``library`` was built with (:func:`build_record`)."""
    return library.with_suffix(".json")


#: the first line of a failure record: the compiler that failed (another one is tried)
FAILED_WITH = "compiler: "


def _failed_with(record: Path) -> str | None:
    """The compiler a failure record names (None for a record that names none)."""
    first = record.read_text(errors="replace").partition("\n")[0]
    return first.removeprefix(FAILED_WITH) if first.startswith(FAILED_WITH) else None


def _whole(library: Path) -> bool:
    """Whether ``library`` is the file its build wrote: a regular file whose bytes hash to the
    digest its record holds. A library cut short (a full disk, a power loss before the data
    reached the disk) would be mapped and crash the process on first use (SIGBUS): it is
    removed instead, with its record (anything else standing at its path too), and built
    again."""
    record = _record_path(library)
    try:
        whole = (library.is_file() and not library.is_symlink()
                 and json.loads(record.read_text()).get("digest")
                 == cache.digest(library.read_bytes()))
    except (OSError, ValueError, AttributeError):
        whole = False
    if not whole:
        for stale in (library, record):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
    return whole


def _build(key: str) -> Path | None:
    """The library's path, built unless cached whole (:func:`_whole`); None (and the reason
    recorded) when it cannot be built."""
    library, failed, lock_path = _paths(key)
    if library.is_file() and _whole(library):
        return library
    import torch

    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (library.exists() or library.is_symlink()) and _whole(library):
                return library
            cxx = compiler()
            if failed.is_file() and _failed_with(failed) == cxx:
                _reason[key] = f"its build with {cxx} failed before (see {failed})"
                return None
            if cxx is None:
                _reason[key] = "no C++ compiler ($CXX, c++ or g++)"
                return None
            flags = torch_flags()
            if flags is None:
                _reason[key] = (f"torch {torch.__version__} names no C++ standard of C++17 or "
                                "later to build against (no 'C++ Version' in "
                                "torch.__config__.show())")
                return None
            partial = library.with_name(f".{library.name}.{os.getpid()}.tmp")
            try:
                proc = subprocess.run(command(cxx, partial, flags), capture_output=True,
                                      text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as exc:
                proc = None
                log = f"{cxx} could not run: {exc}"
            else:
                log = (proc.stderr or proc.stdout)[-6000:]
            if proc is None or proc.returncode != 0:
                partial.unlink(missing_ok=True)
                cache.atomic_write(failed, f"{FAILED_WITH}{cxx}\n{log}".encode())
                _reason[key] = f"its build failed (the compiler's output: {failed})"
                return None
            try:
                data = partial.read_bytes()
                with open(partial, "rb") as written:  # on the disk before it is renamed
                    os.fsync(written.fileno())
                cache.atomic_write(_record_path(library), json.dumps(
                    {"torch": torch.__version__, "compiler": cxx, "flags": [*flags, *OPTIONS],
                     "digest": cache.digest(data)}).encode())
                os.replace(partial, library)
            except OSError:
                partial.unlink(missing_ok=True)
                raise
            return library
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load(build: bool = True) -> ModuleType | None:
    """The compiled module (``build``: building it if need be), or None where it is off or
    cannot be built or loaded (:func:`status` says why). Loads torch."""
    if not enabled():
        return None
    key = library_key()
    if key in _loaded:
        return _loaded[key]
    try:
        library = _build(key) if build else _paths(key)[0]
    except OSError as exc:  # the Python path serves every call; the cache's users say
        _reason[key] = (str(exc) if isinstance(exc, CacheUnusable) else
                        f"its build could not be kept in the cache ({exc})")
        _loaded[key] = None
        return None
    module = None
    # _build checked the library whole; one found without building is checked here
    if library is not None and library.is_file() and (build or _whole(library)):
        try:
            loader = importlib.machinery.ExtensionFileLoader("multibackend._fastcall",
                                                             str(library))
            spec = importlib.util.spec_from_loader("multibackend._fastcall", loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except ImportError as exc:  # a library this torch or Python cannot load: build again
            library.unlink(missing_ok=True)
            _reason[key] = f"{library} did not load ({exc}); it is rebuilt on next use"
            module = None
    elif library is not None:
        _reason[key] = "not built yet"
    if module is not None or build:
        _loaded[key] = module
    return module


def build_record() -> dict | None:
    """What the library serving this process was built with: ``torch`` (its version),
    ``compiler`` and ``flags`` (those of :func:`torch_flags` first); None where the front
    is not in use, or its library has no readable record."""
    key = library_key() if enabled() else None
    if key is None or _loaded.get(key) is None:
        return None
    try:
        record = json.loads(_record_path(_paths(key)[0]).read_text())
    except (OSError, ValueError, CacheUnusable):
        return None
    return record if isinstance(record, dict) else None


def status() -> str:
    """Whether the compiled front serves calls in this process, and if not, why; where it
    does, the torch version, compiler and flags its library was built with."""
    if not enabled():
        return f"off (${ENV}=0)"
    key = library_key()
    module = _loaded.get(key)
    if module is not None:
        record = build_record()
        built = "" if record is None else (
            f", built against torch {record.get('torch')} by {record.get('compiler')} with "
            f"{' '.join(map(str, record.get('flags', ())))}")
        return f"compiled ({_paths(key)[0]}){built}"
    if key not in _loaded:
        return "not loaded yet (it loads, or builds, on the first matmul of torch tensors)"
    return f"not in use: {_reason.get(key, 'unknown')}"
