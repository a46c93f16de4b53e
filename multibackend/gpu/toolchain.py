"""Finding the CUDA tools on this machine: nvcc, the CUDA include directory, cuobjdump.

One place answers "where is nvcc" for every backend and test. The order is ``CUDA_HOME`` (or
``CUDA_PATH``), then ``PATH``, then ``/usr/local/cuda``. cuobjdump and nvdisasm are also looked
for in Triton's wheel, which ships them when the toolkit does not.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path


def _homes() -> list[Path]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    found = [Path(h) for h in homes if h]
    nvcc = shutil.which("nvcc")
    if nvcc:
        found.append(Path(nvcc).resolve().parent.parent)
    found.append(Path("/usr/local/cuda"))
    return found


@functools.lru_cache(maxsize=None)
def find_nvcc() -> Path | None:
    """nvcc's path, or None."""
    for home in _homes():
        candidate = home / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_nvcc() -> Path:
    """nvcc's path; raises naming where it looked when there is none."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found: set CUDA_HOME to a CUDA toolkit or put nvcc on "
                                "PATH (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, "
                                "/usr/local/cuda/bin)")
    return nvcc


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> Path | None:
    """The toolkit's include directory holding ``crt/mma.h`` (NVRTC needs it passed)."""
    for home in _homes():
        for inc in (home / "include", home / "targets" / "x86_64-linux" / "include"):
            if (inc / "crt" / "mma.h").is_file():
                return inc
    try:
        import nvidia.cuda_runtime  # type: ignore[import-not-found]

        inc = Path(nvidia.cuda_runtime.__path__[0]) / "include"
        if (inc / "crt" / "mma.h").is_file():
            return inc
    except ImportError:
        pass
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str | None:
    """nvcc's release string (e.g. "13.0.88"), or None without nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def find_binary_tool(name: str) -> Path | None:
    """``cuobjdump``/``nvdisasm``/``ptxas``: from the toolkit, else from Triton's wheel."""
    for home in _homes():
        candidate = home / "bin" / name
        if candidate.is_file():
            return candidate
    try:
        import triton  # type: ignore[import-not-found]

        base = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        candidate = base / name
        if candidate.is_file():
            return candidate
    except ImportError:
        pass
    return None


def _cuobjdump(binary: Path, flag: str) -> str:
    tool = find_binary_tool("cuobjdump")
    if tool is None:
        raise FileNotFoundError("cuobjdump not found in the CUDA toolkit nor in Triton's wheel")
    return subprocess.run([str(tool), flag, str(binary)], capture_output=True, text=True,
                          check=True).stdout


def sass(cubin: Path) -> str:
    """The SASS text of a cubin (cuobjdump --dump-sass)."""
    return _cuobjdump(cubin, "--dump-sass")


_RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")


def resource_usage(binary: Path) -> dict[str, tuple[int, int, int]]:
    """Per kernel function of a cubin or library: (registers, stack bytes, local-memory
    bytes), from cuobjdump --dump-resource-usage."""
    return {name: (int(reg), int(stack), int(local)) for name, reg, stack, local
            in _RESOURCES.findall(_cuobjdump(binary, "--dump-resource-usage"))}
