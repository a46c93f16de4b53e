"""Fault injection, CPU tier: what the disk does to the cache. A cache directory on a full
disk: every write of the cache (``cache.atomic_write``) ends in ``fsync``, where a full disk
or an exceeded quota reports ENOSPC; the tests make ``fsync`` say so and check that nothing is
torn or lost and that each writer either answers right or names the directory. A compiled
kernel whose bytes changed in place after it was written is rebuilt, never loaded."""
from __future__ import annotations

import errno
import json
import os
import sys
import warnings

import pytest

import multibackend as mb
from multibackend.choose import store as autotune
from multibackend.core.errors import CacheUnusable
from multibackend.core.problem import synthetic
from multibackend.gpu import cache
from multibackend.run import fastcall

torch = pytest.importorskip("torch")


@pytest.fixture
def full_disk(monkeypatch):
    """From here on every ``fsync`` fails as on a full disk."""
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)


def test_a_write_on_a_full_disk_keeps_the_old_entry_and_names_the_directory(tmp_path,
                                                                             full_disk):
    entry = tmp_path / "table.json"
    entry.write_text("old")
    with pytest.raises(CacheUnusable, match="No space left on device") as raised:
        cache.atomic_write(entry, b"new")
    assert str(tmp_path) in str(raised.value) and "MULTIBACKEND_CACHE_DIR" in str(raised.value)
    assert entry.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]  # no temporary file left


def test_first_call_winners_on_a_full_disk_are_kept_in_memory_with_one_warning(tmp_path,
                                                                               full_disk):
    path = tmp_path / "autotune.json"
    store = autotune.Store(path)
    problem = synthetic(64, 64, 64, "float16", cc=(9, 0))
    entry = {"backend": "triton", "config": {"name": "wide"}, "mode": "eager", "spread": 0.01,
             "timings_ms": {"triton:wide": 0.01}}
    with pytest.warns(RuntimeWarning, match="in memory only.*No space left"):
        store.put(problem, "eager", entry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not on every winner
        store.put(problem, "graph", dict(entry, mode="graph"))
    assert store.get(problem, "eager")["backend"] == "triton"
    assert "No space left" in store.unsaved
    assert not path.exists() and not list(tmp_path.iterdir())


def test_a_compiled_front_that_cannot_be_kept_leaves_calls_on_the_python_path(
        tmp_path, monkeypatch, full_disk):
    """The library is written (a stand-in compiler makes it in no time), but the disk fills
    before it is on it: no library and no temporary file stay, ``status`` says why, and
    calls are answered by the Python front."""
    monkeypatch.setenv("MULTIBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fastcall, "compiler", lambda: "c++")
    monkeypatch.setattr(fastcall, "command", lambda cxx, output, flags: [
        sys.executable, "-c", f"open({str(output)!r}, 'wb').write(b'library')"])
    monkeypatch.setattr(fastcall, "_loaded", {})
    assert fastcall.load() is None
    assert "could not be kept in the cache" in fastcall.status()
    assert "No space left" in fastcall.status()
    library = fastcall._paths(fastcall.library_key())[0]
    assert not [p for p in library.parent.iterdir() if ".so" in p.name]
    a = torch.randint(-3, 4, (16, 24)).float()
    b = torch.randint(-3, 4, (24, 8)).float()
    assert torch.equal(mb.matmul(a, b), a @ b)


def test_a_tuning_table_saved_on_a_full_disk_is_named_and_the_old_one_kept(tmp_path,
                                                                           full_disk):
    from multibackend.choose import tables

    path = tmp_path / "table.json"
    path.write_text(json.dumps({"old": True}))
    with pytest.raises(CacheUnusable, match="No space left on device"):
        tables.save_table(tables.new_table({}), path)
    assert json.loads(path.read_text()) == {"old": True}


@pytest.mark.parametrize("damage", ["flipped", "cut short", "grown"])
def test_a_compiled_kernel_changed_on_disk_is_removed_and_rebuilt(tmp_path, damage):
    """Cubins and CUTLASS libraries are checked against the SHA-256 written beside them:
    one garbled, truncated or appended to is removed (with its checksum), so the caller
    builds it again instead of loading it."""
    path = tmp_path / "kernel.cubin"
    data = b"\x7fELF" + bytes(range(256)) * 4
    cache.write_checked(path, data)
    assert cache.read_checked(path, lambda d: d[:4] == b"\x7fELF") == data
    changed = {"flipped": data[:100] + b"\x00" + data[101:], "cut short": data[:512],
               "grown": data + b"\x00"}[damage]
    path.write_bytes(changed)
    assert cache.read_checked(path, lambda d: d[:4] == b"\x7fELF") is None
    assert not path.exists() and not cache.checksum_path(path).exists()


def _open_failing(monkeypatch, failing_mode: str, error: int):
    """``open`` in the cache module raising ``error`` for ``failing_mode``, as the OS would."""
    real = open

    def fake(path, mode="r", *args, **kwargs):
        if mode == failing_mode:  # OSError picks the subclass (EACCES: PermissionError)
            raise OSError(error, os.strerror(error), str(path))
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(cache, "open", fake, raising=False)


def test_a_build_lock_that_cannot_be_made_names_the_directory(tmp_path, monkeypatch):
    """A kernel build whose lock file cannot be made (a full disk) raises CacheUnusable
    naming the file and the directory, and builds nothing."""
    _open_failing(monkeypatch, "a", errno.ENOSPC)
    built = []
    with pytest.raises(CacheUnusable, match="No space left on device") as raised:
        cache.build_once(tmp_path / "kernel.lock", lambda: None, lambda: built.append(1))
    assert "kernel.lock" in str(raised.value) and str(tmp_path) in str(raised.value)
    assert built == []


def test_another_accounts_build_lock_is_taken_read_only(tmp_path, monkeypatch):
    """A lock file this process may not write (another account's in a shared cache) is still
    a lock: taken through a read-only handle, and the build runs under it."""
    (tmp_path / "kernel.lock").touch()
    _open_failing(monkeypatch, "a", errno.EACCES)
    assert cache.build_once(tmp_path / "kernel.lock", lambda: None, lambda: "built") == "built"
