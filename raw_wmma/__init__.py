"""The hand-written WMMA CUDA sources (``*.cu``), shipped as package data of
``multibackend.raw_wmma`` and compiled at run time by :mod:`multibackend.backends.raw_wmma`."""
from pathlib import Path

if __name__ != "multibackend.raw_wmma":
    raise ImportError("the raw_wmma sources are part of multibackend: import multibackend.raw_wmma")

SOURCE_DIR = Path(__file__).resolve().parent


def source_path(name: str) -> Path:
    """The path of one CUDA source file shipped with the package."""
    path = SOURCE_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"raw_wmma source {name!r} is not in {SOURCE_DIR}")
    return path
