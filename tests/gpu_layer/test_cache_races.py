"""Processes racing on one empty cache: two asking for the same kernel at once both get a whole
cubin, compiled once (the second waits for the first's), and the cache holds one valid entry
(writes are atomic and checked), never a torn one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from multibackend.gpu import nvrtc, toolchain

COMPILE = """
import sys
from multibackend.gpu import nvrtc
from multibackend.raw_wmma import SOURCE_DIR
print("ready", flush=True)
sys.stdin.readline()  # start together
c = nvrtc.compile_cubin(SOURCE_DIR / "dot.cu", "rw_dot_f16_vec", "sm_90", ["RW_ONLY=rw_dot_f16_vec"])
print(c.path, nvrtc.valid_cubin(c.path.read_bytes()), c.built, flush=True)
"""


def test_two_processes_compiling_one_kernel_into_an_empty_cache(tmp_path):
    if toolchain.find_nvcc() is None and not nvrtc.compiler_version().startswith("nvrtc"):
        pytest.skip("neither NVRTC nor nvcc here")
    env = {**os.environ, "MULTIBACKEND_CACHE_DIR": str(tmp_path)}
    racers = [subprocess.Popen([sys.executable, "-c", COMPILE], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE) for _ in range(2)]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready"
    for racer in racers:
        racer.stdin.write("go\n")
        racer.stdin.flush()
    results = [racer.communicate(timeout=300) for racer in racers]
    for racer, (out, err) in zip(racers, results):
        assert racer.returncode == 0, err[-3000:]
        assert out.split()[1] == "True", out
    assert sorted(out.split()[2] for out, _ in results) == ["False", "True"], \
        "one process compiled, the other waited and loaded its cubin"
    cubins = list(tmp_path.rglob("*.cubin"))
    assert len(cubins) == 1 and nvrtc.valid_cubin(cubins[0].read_bytes())
    assert not list(tmp_path.rglob("*.tmp")), "a temporary file was left behind"
