"""Where compiled kernels and tuning tables live, and how they are written.

Everything goes under the user cache directory (``$MULTIBACKEND_CACHE_DIR``, else
``$XDG_CACHE_HOME/multibackend``, else ``~/.cache/multibackend``), never the working directory:
``~`` in ``$MULTIBACKEND_CACHE_DIR`` is expanded and a relative path refused, and a relative
``$XDG_CACHE_HOME`` is ignored, as the XDG rules say. Writes are atomic (a temporary file in
the same directory, then ``os.replace``), so two processes writing the same entry cannot leave
a torn file, and a written file gets the mode a plain ``open()`` gives it (0o666 less the
umask), so a file made for another account can be read there. A reader that finds an entry it
cannot use deletes it and rebuilds; one it may not read (another account's) is a miss, rebuilt
and replaced.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from multibackend.core.errors import CacheUnusable
from multibackend.core.names import ENV_CACHE_DIR

T = TypeVar("T")


def cache_root() -> Path:
    """The root cache directory (created on first use); raises
    :class:`~multibackend.core.errors.CacheUnusable`, naming where it comes from, where it cannot
    be made or ``$MULTIBACKEND_CACHE_DIR`` is relative."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        root, source = Path(env).expanduser(), f"MULTIBACKEND_CACHE_DIR is {env!r}"
        if not root.is_absolute():
            raise CacheUnusable(f"{source}: a relative path would put the cache under whichever "
                                "directory the process runs in; give an absolute path (or one "
                                "that starts with ~)")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(base) / "multibackend"
        source = f"the user cache directory is {str(root)!r}"
    return _made(root, source)


def cache_dir(kind: str) -> Path:
    """A sub-directory of the cache for one kind of artifact (``"raw_wmma"``, ``"cutlass"``...)."""
    root = cache_root()
    return _made(root / kind, f"the cache directory {str(root)!r} holds {kind!r}")


def _made(path: Path, source: str) -> Path:
    """``path``, a directory made if need be; CacheUnusable naming ``source`` where not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheUnusable(f"{source}: the cache cannot be made there ({exc.strerror or exc}: "
                            f"{exc.filename or path}); point MULTIBACKEND_CACHE_DIR at a "
                            "writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheUnusable(f"{source}: {str(path)!r} is not writable; point "
                            "MULTIBACKEND_CACHE_DIR at a writable directory")
    return path


def digest(*parts: bytes | str) -> str:
    """A stable hex key over the given parts (source, options, arch, tool versions...)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:32]


def checksum_path(path: Path) -> Path:
    """Where the SHA-256 of a checked entry's bytes is kept (written after the entry)."""
    return path.with_suffix(".sha256")


def read_checked(path: Path, validate: Callable[[bytes], bool]) -> bytes | None:
    """The bytes of an entry written by :func:`write_checked`, if ``validate(data)`` holds and
    they match the SHA-256 beside them; an entry torn, truncated or changed in place is
    removed with its checksum (so the caller rebuilds it) and None returned."""
    try:
        expected = checksum_path(path).read_text().strip()
    except (FileNotFoundError, PermissionError):
        return None
    data = read_entry(path, lambda d: validate(d) and hashlib.sha256(d).hexdigest() == expected)
    if data is None:
        checksum_path(path).unlink(missing_ok=True)
    return data


def write_checked(path: Path, data: bytes) -> None:
    """Write an entry atomically, then its SHA-256 (:func:`read_checked` reads both)."""
    atomic_write(path, data)
    atomic_write(checksum_path(path), hashlib.sha256(data).hexdigest().encode())


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one;
    a write that fails (a full disk, a read-only one) leaves the old file and no temporary
    one, and raises :class:`~multibackend.core.errors.CacheUnusable` naming the directory.
    The temporary file is made with mode 0o666, which the kernel reduces by the umask as for
    a plain ``open()`` (``tempfile.mkstemp`` would make it 0o600: a tuning table saved for
    another account could not be read there)."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        if isinstance(exc, CacheUnusable):
            raise
        raise CacheUnusable(f"writing {path.name} in {str(path.parent)!r} failed "
                            f"({exc.strerror or exc}); the file there is unchanged. Free space "
                            "there, or write elsewhere (MULTIBACKEND_CACHE_DIR moves the "
                            "cache)") from exc


def read_entry(path: Path, validate) -> bytes | None:
    """The entry's bytes if it exists and ``validate(data)`` is true; a corrupt entry is
    removed (so the caller rebuilds it) and None returned. One this process may not read
    (another account's) is a miss too: the caller rebuilds it, and its write replaces it."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, PermissionError):
        return None
    if validate(data):
        return data
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    return None


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (the file made if need be). One another account
    made is locked through a read-only handle; where the file can be neither made nor opened
    (a full disk, a directory that became read-only) :class:`CacheUnusable` names it."""
    try:
        lock = open(lock_path, "a")
    except PermissionError:
        try:
            lock = open(lock_path, "r")
        except OSError as exc:
            raise _unusable_lock(lock_path, exc) from exc
    except OSError as exc:
        raise _unusable_lock(lock_path, exc) from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unusable_lock(lock_path: Path, exc: OSError) -> CacheUnusable:
    return CacheUnusable(f"the lock file {lock_path.name} in {str(lock_path.parent)!r} cannot be "
                         f"made or opened ({exc.strerror or exc}); free space there, or point "
                         "MULTIBACKEND_CACHE_DIR at a writable directory")


def build_once(lock_path: Path, find: Callable[[], T | None], make: Callable[[], T]) -> T:
    """What ``find()`` returns from the cache, else what ``make()`` builds, made by one process
    at a time: the others (ranks of one job, test workers) wait on an exclusive lock on
    ``lock_path`` (:func:`locked`), then find the entry the first one wrote instead of building
    it again."""
    found = find()
    if found is not None:
        return found
    with locked(lock_path):
        found = find()
        return found if found is not None else make()
