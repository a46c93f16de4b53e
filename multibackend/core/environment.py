"""What this machine is: GPU, compute capability, driver, CUDA and library versions.

One fingerprint serves ``python -m multibackend info``, the cross-check report and the tuning
table's key (a table measured on another GPU or other versions must not be used silently).
"""
from __future__ import annotations

import functools
import importlib.metadata as metadata


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def gpu() -> dict:
    """The current CUDA device's name, compute capability, driver and runtime, or why none."""
    try:
        import torch
    except ImportError as exc:
        return {"available": False, "reason": f"torch is not importable: {exc}"}
    if not torch.cuda.is_available():
        return {"available": False, "reason": "no CUDA GPU visible (torch.cuda.is_available() "
                                              "is False)"}
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info = {
        "available": True,
        "name": props.name,
        "cc": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda_runtime": torch.version.cuda,
    }
    info["driver"] = driver_version()
    return info


@functools.lru_cache(maxsize=None)
def device_name(device: str) -> str | None:
    """The name of CUDA device ``device``, written with its index as a Problem records it
    ("cuda:1"), as torch reports it (e.g. "NVIDIA H200"); None where there is no such GPU or
    no index ("cuda" alone names whichever device is current)."""
    try:
        import torch

        kind, _, index_text = device.partition(":")
        if kind != "cuda" or not index_text or not torch.cuda.is_available():
            return None
        index = int(index_text)
        if index >= torch.cuda.device_count():
            return None
        return torch.cuda.get_device_properties(index).name
    except Exception:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver's version (e.g. "580.159.04") through NVML, else the CUDA version
    the driver supports (e.g. "CUDA 13.0"), else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        import cupy

        api = int(cupy.cuda.runtime.driverGetVersion())
        return f"CUDA {api // 1000}.{api % 1000 // 10}"
    except Exception:
        return None


def compute_capability() -> tuple[int, int] | None:
    info = gpu()
    if not info["available"]:
        return None
    major, minor = info["cc"].split(".")
    return int(major), int(minor)


def versions() -> dict[str, str | None]:
    """Versions of the packages results depend on."""
    names = ("multibackend", "torch", "triton", "cupy-cuda13x", "nvidia-cutlass", "numpy",
             "cuda-bindings")
    return {name: package_version(name) for name in names}


def fingerprint() -> dict:
    """What a tuning table is valid for: the GPU, its driver/CUDA, and the library versions."""
    info = gpu()
    vers = versions()
    return {
        "gpu": info.get("name"),
        "cc": info.get("cc"),
        "driver": info.get("driver"),
        "cuda": info.get("cuda_runtime"),
        "triton": vers["triton"],
        "nvidia-cutlass": vers["nvidia-cutlass"],
        "multibackend": vers["multibackend"],
    }
