"""The backends' CPU tests: the CUTLASS kernels their slow tests compile, built in one pass.

nvcc takes tens of seconds per CUTLASS 3.x kernel on a 2-core machine. Built together
(:func:`multibackend.backends.cutlass.build.build_many`, one nvcc process: the sm_90a kernels
as one translation unit, the 2.x ones as another), they parse CUTLASS's headers once and share
the templates they instantiate alike. The pass runs once per session, into a cache that the
pytest-xdist workers share: the first worker to need it builds, the others wait on the kernels'
build locks and load what it wrote.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest


def _candidates() -> dict:
    """name -> the CUTLASS candidate of every kernel the slow tests look into."""
    from multibackend.backends.cutlass import backend as backend_module
    from multibackend.core.config import Config
    from multibackend.core.problem import synthetic
    from multibackend.gpu import staging
    from tests.backends.test_cutlass_autotune import FEW_TILES
    from tests.backends.test_cutlass_streamk import CUBE
    from tests.helpers import sliced_problem

    backend = backend_module.create()
    sliced = sliced_problem(4096, 4096, 4096, 4100)  # staged: the aligned kernel on copies
    staged = next(c for c in backend.configs(sliced) if staging.is_staged(c))
    cube = synthetic(*CUBE, "float16", cc=(9, 0))
    stream_k = next(c for c in backend.configs(cube) if c.get("scheduler") == "streamk")
    found = {
        "staged": backend_module.candidate_for(*staging.unwrap(sliced, staged)),
        # 1-element alignment: sm_75's 2.x kernels, retyped for bf16
        "bf16_sm75": backend_module.candidate_for(synthetic(33, 17, 9, "bfloat16"),
                                                  Config.of("64x64x32_s2_sm75")),
        "f16_sm75": backend_module.candidate_for(synthetic(33, 17, 9, "float16"),
                                                 Config.of("64x64x32_s2_sm75")),
        "stream_k": backend_module.candidate_for(cube, stream_k),
    }
    few = synthetic(1000, 1000, 1000, "float16", cc=(9, 0))
    for name in FEW_TILES:
        found[name] = backend_module.candidate_for(few, Config.of(name))
    return found


def _shared_root(tmp_path_factory) -> Path:
    """A directory of this session that every pytest-xdist worker of it sees."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    path = root / "cutlass-kernels"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def cutlass_kernels(tmp_path_factory):
    """The slow tests' CUTLASS kernels, built by nvcc in one pass into a shared cache: a
    namespace of ``root`` (the cache directory), ``caller`` (the working directory the build
    ran in, which must stay empty), ``tempdir`` (``tempfile.tempdir`` before the build) and
    ``kernels``: name -> (candidate, source, library path)."""
    from multibackend.backends.cutlass import build as cutlass_build
    from multibackend.backends.cutlass import emit as cutlass_emit
    from multibackend.gpu import toolchain

    if toolchain.find_nvcc() is None:
        pytest.skip("nvcc not found")
    root = _shared_root(tmp_path_factory)
    caller = Path(tempfile.mkdtemp(prefix="caller-", dir=root))
    candidates = _candidates()
    sources = {name: cutlass_emit.emit(c) for name, c in candidates.items()}
    tempdir = tempfile.tempdir
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MULTIBACKEND_CACHE_DIR", str(root))
        patch.chdir(caller)
        paths = cutlass_build.build_many(
            [(sources[name], c.arch, c.name) for name, c in candidates.items()], 1)
    failed = [p for p in paths if isinstance(p, Exception)]
    assert not failed, failed[0]
    kernels = {name: SimpleNamespace(candidate=c, source=sources[name], path=path)
               for (name, c), path in zip(candidates.items(), paths)}
    return SimpleNamespace(root=root, caller=caller, tempdir=tempdir, kernels=kernels,
                           caller_files=os.listdir(caller))
