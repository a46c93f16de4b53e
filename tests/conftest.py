"""Shared test fixtures: the GPU marker's skip, random operands and poisoned outputs.

GPU tests carry ``@pytest.mark.gpu``; where no CUDA device is visible they are skipped with
that reason. Random operands are never zeros; outputs are filled with NaN (floats) or a
sentinel (integers) before a kernel runs, so an element the kernel did not write fails.
"""
from __future__ import annotations

import functools
import os

import pytest


@functools.lru_cache(maxsize=None)
def gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    return None


def pytest_configure(config):
    """Without a GPU, Triton kernels run in Triton's interpreter: the switch must be set before
    any kernel is defined, so it is set here, before the test modules are imported."""
    config.addinivalue_line("markers", "cutlass: runs CUTLASS kernels, which "
                                       "tests/gpu/conftest.py builds before the tests run")
    if gpu_reason() is not None:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    reason = gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
