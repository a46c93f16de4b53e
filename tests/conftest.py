"""Shared test fixtures: the GPU marker's skip, random operands and poisoned outputs.

GPU tests carry ``@pytest.mark.gpu``; where no CUDA device is visible they are skipped with
that reason. With ``MULTIBACKEND_STRICT_GPU=1`` (a GPU machine that has every backend: CUTLASS
installed, an sm_90a device) any skip under ``tests/gpu`` fails instead, its reason given, so
a green GPU tier cannot hide a backend that did not run. Random operands are never zeros;
outputs are filled with NaN (floats) or a sentinel (integers) before a kernel runs, so an
element the kernel did not write fails.
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


STRICT_GPU = "MULTIBACKEND_STRICT_GPU"


def _strict_gpu(path: str) -> bool:
    return os.environ.get(STRICT_GPU, "") not in ("", "0") and f"{os.sep}gpu{os.sep}" in path


def _fail_skip(report) -> None:
    """A skip turned into a failure that names the skip's reason."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"skipped where {STRICT_GPU} is set: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.skipped and _strict_gpu(str(item.fspath)) and not hasattr(report, "wasxfail"):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()
    if report.skipped and _strict_gpu(str(getattr(collector, "fspath", ""))):
        _fail_skip(report)
