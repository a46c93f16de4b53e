"""Settings and files a user's environment may hold in any state: every ``MULTIBACKEND_*``
variable set to garbage, a tuning table of another GPU (broken table files are in
``tests/api/test_contracts.py``), a table writer killed mid-write, and a cache directory that
is relative, a file or under a file. Each gives a clear error of the library's own types naming
the variable or file, or the right answer; none a crash or a wrong answer."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import multibackend as mb
from multibackend.choose import tables
from multibackend.run import plans

A = torch.arange(12.0).reshape(3, 4)
B = torch.arange(8.0).reshape(4, 2)
RIGHT = A @ B


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for name in ("MULTIBACKEND_BACKEND", "MULTIBACKEND_AUTOTUNE", "MULTIBACKEND_TUNING"):
        monkeypatch.delenv(name, raising=False)
    plans.forget()
    yield
    plans.forget()


@pytest.mark.parametrize("variable, value, words", [
    ("MULTIBACKEND_BACKEND", "garbage", "MULTIBACKEND_BACKEND is 'garbage': not a backend name"),
    ("MULTIBACKEND_AUTOTUNE", "maybe", "MULTIBACKEND_AUTOTUNE is 'maybe': expected 1, eager"),
    ("MULTIBACKEND_TUNING", "/nonexistent/t.json", "MULTIBACKEND_TUNING is .* does not exist"),
])
def test_a_garbage_setting_is_named(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(mb.InvalidArgument, match=words):
        mb.matmul(A, B)


@pytest.mark.parametrize("variable, value", [
    ("MULTIBACKEND_BACKEND", ""), ("MULTIBACKEND_BACKEND", "auto"),
    ("MULTIBACKEND_AUTOTUNE", "0"), ("MULTIBACKEND_AUTOTUNE", "off"),
])
def test_an_empty_or_off_setting_answers_as_unset(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    assert torch.allclose(mb.matmul(A, B), RIGHT)


def test_a_table_of_another_gpu_is_set_aside_with_its_reason(tmp_path):
    path = tmp_path / "other.json"
    table = tables.new_table({})
    table["environment"] = {**table["environment"], "gpu": "NVIDIA Z999", "cc": "9.9"}
    path.write_text(__import__("json").dumps(table))
    loaded = tables.TuningTables()
    with pytest.warns(RuntimeWarning, match="made in another environment"):
        tables.load_tuning(path, tables=loaded)
    assert loaded.rejected and "another environment" in loaded.rejected[0]


CACHE_SCRIPT = """
import torch, multibackend as mb
from multibackend.run import fastcall
a, b = torch.arange(12.0).reshape(3, 4), torch.arange(8.0).reshape(4, 2)
for _ in range(3):
    assert torch.equal(mb.matmul(a, b), a @ b)
print(fastcall.status())
"""


@pytest.mark.parametrize("where", ["relative", "a file", "under a file"])
def test_an_unusable_cache_directory_leaves_every_call_right(tmp_path, where):
    """The cache is where compiled kernels and the front live; where it cannot be used the
    calls still answer, and ``status`` says why the front is off."""
    folder = {"relative": "cache/here", "a file": str(tmp_path / "file"),
              "under a file": str(tmp_path / "file" / "cache")}[where]
    (tmp_path / "file").write_text("x")
    env = {**os.environ, "MULTIBACKEND_CACHE_DIR": folder}
    done = subprocess.run([sys.executable, "-c", CACHE_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"not in use: MULTIBACKEND_CACHE_DIR is {folder!r}"), \
        done.stdout


WRITER_SCRIPT = """
import sys
from multibackend.choose import tables
entries = {f"matmul:float16->float16:rr:b1:m{i}:n64:k64": {
    "backend": "triton", "config": {"name": f"tile{i}"}, "family": "matmul:float16->float16:rr",
    "m": i, "n": 64, "k": 64} for i in range(1, 4000)}
table = tables.new_table(entries)
print("writing", flush=True)
while True:
    tables.save_table(table, sys.argv[1])
"""


def test_a_writer_killed_mid_write_leaves_a_whole_table_or_none(tmp_path):
    """A tuner killed with SIGKILL while it saves its table: readers find the last whole
    table (written atomically: a temporary file synced, then renamed), never a torn one."""
    import signal
    import time

    path = tmp_path / "table.json"
    writer = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path)],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    time.sleep(0.5)  # many saves under way
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=60)
    table = tables.read_table(path)  # whole, or this raises naming what is wrong
    assert len(table["entries"]) == 3999
