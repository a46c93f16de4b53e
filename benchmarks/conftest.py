"""The pytest-benchmark suites' switches and the GPU gate.

Every test here is marked ``gpu`` and skipped, with the reason, where no CUDA device is
visible, so CPU CI collects and skips the directory. ``--suite`` and ``--bench-dtype`` choose
what runs (default: every suite of :mod:`multibackend.tuning.suites`, float16)::

    pytest benchmarks --suite llm --suite odd --bench-dtype float16 --bench-dtype bfloat16 \\
        --benchmark-save=h200
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from multibackend.tuning.suites import SUITES


def pytest_addoption(parser):
    group = parser.getgroup("multibackend benchmarks")
    group.addoption("--suite", action="append", choices=sorted(SUITES),
                    help="shape suite to run (repeatable; default: all)")
    group.addoption("--bench-dtype", action="append",
                    help="input dtype to run (repeatable; default: float16)")


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        from bench_cases import cases

        suites = metafunc.config.getoption("suite") or list(SUITES)
        dtypes = metafunc.config.getoption("bench_dtype") or ["float16"]
        found = cases(suites, dtypes)
        metafunc.parametrize("case", found, ids=[c.id for c in found])


@functools.lru_cache(maxsize=None)
def gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return None if torch.cuda.is_available() else "no CUDA GPU visible"


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark this directory's tests (the hook sees every collected test of the session)."""
    reason = gpu_reason()
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"GPU benchmark: {reason}"))
