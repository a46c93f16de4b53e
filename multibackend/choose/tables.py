"""The tuning table: the measured winner per problem shape, shipped to a deployment.

A table is JSON::

    {"format": 1,
     "environment": {"gpu": ..., "cc": ..., "driver": ..., "cuda": ...,
                     "triton": ..., "nvidia-cutlass": ..., "multibackend": ...},
     "entries": {"<problem key>": {"backend": ..., "config": {...}, "family": ...,
                                   "m": .., "n": .., "k": .., "mode": "eager",
                                   "timings_ms": {"eager": {...}, "graph": {...}},
                                   "baseline_ms": {"eager": .., "graph": ..},
                                   "spread": .., "measured": "<ISO time>"}}}

Lookup reads ``backend``, ``config``, ``family``, ``m``, ``n``, ``k``; the rest are the tuner's
figures: ``mode`` the timing mode the choice was made in, ``timings_ms`` the final interleaved
rounds per mode ("backend:config" -> ms), ``baseline_ms`` torch.matmul's figure per mode,
``spread`` the lead over torch.matmul the winner had to exceed (at least the mode's floor,
:data:`multibackend.core.names.MIN_SPREAD`); the tuner
(:mod:`multibackend.tuning.tuner`) documents the rest.

Tables come from ``$MULTIBACKEND_TUNING`` (paths separated by ``os.pathsep``) and from
:func:`load_tuning`; several tables merge, later entries winning. The variable's tables come
first, as if loaded when the program started, so a table the program loads itself overrides
them; they are kept apart and read again whenever the variable's value changes, so that a
table it no longer names is no longer used. A table whose environment differs from this
machine's is kept aside, reported (:func:`status`, a warning naming the file and the fields
that differ) and never used.

Lookup (step 3 of the dispatch order): an exact entry for ``problem.key``; else the nearest
bucket: among entries of the same *family* (op, dtypes, precision, layouts, batched or not),
the one closest in ``max(|log2 m - log2 m'|, |log2 n - log2 n'|, |log2 k - log2 k'|)``,
provided that distance is at most :data:`BUCKET_RADIUS` (each dimension within a factor of 2).
"""
from __future__ import annotations

import json
import math
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from multibackend.core import environment
from multibackend.core.config import Config
from multibackend.core.errors import InvalidArgument
from multibackend.core.names import ENV_TUNING
from multibackend.core.problem import Problem
from multibackend.gpu.cache import atomic_write

FORMAT = 1
BUCKET_RADIUS = 1.0


def family(problem: Problem) -> str:
    """The problem's key without its sizes: what must match for a bucket to apply."""
    lay = problem.a.layout[0] + problem.b.layout[0]
    return (f"{problem.op}:{problem.in_dtype}->{problem.d_dtype}:{problem.precision}:"
            f"{problem.acc}{problem.variant}:{lay}:{'batched' if problem.batch > 1 else 'single'}"
            f"{':unaligned' if problem.misaligned else ''}")


@dataclass(frozen=True)
class Hit:
    """A tuning-table answer for one problem."""

    backend: str
    config: Config
    detail: str


@dataclass
class TuningTables:
    """Tables loaded in this process: the usable entries, the files they came from, and the
    files set aside; ``env_loaded`` is the value of ``$MULTIBACKEND_TUNING`` they were read
    for, where they are the variable's."""

    entries: dict[str, dict] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    env_loaded: str | None = None


#: the tables loaded with :func:`load_tuning`
_TABLES = TuningTables()
#: the tables ``$MULTIBACKEND_TUNING`` names, for its value ``env_loaded``
_ENV_TABLES = TuningTables()
_LOCK = threading.Lock()
_ENV_LOCK = threading.Lock()
_GENERATION = [0]


def generation() -> int:
    """A number that changes whenever the loaded tables change (plans keyed on it)."""
    return _GENERATION[0]


def generation_counter() -> list[int]:
    """The one-element list holding :func:`generation`, for a hot path to read directly."""
    return _GENERATION


def new_table(entries: dict[str, dict]) -> dict:
    return {"format": FORMAT, "environment": environment.fingerprint(), "entries": entries}


def save_table(table: dict, path: str | os.PathLike) -> Path:
    """Write a table atomically."""
    path = Path(path)
    atomic_write(path, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode())
    return path


def read_table(path: str | os.PathLike) -> dict:
    """Read and validate one table file."""
    try:
        table = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"load_tuning: path {str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"load_tuning: {str(path)!r} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise InvalidArgument(f"load_tuning: {str(path)!r} cannot be read as a table file: "
                              f"{exc.strerror or exc}") from None
    check_table(table, f"load_tuning: {str(path)!r}")
    return table


def check_table(table: object, where: str) -> None:
    """Raise InvalidArgument, its message starting with ``where`` (the call and the argument
    or file), where ``table`` is not one that lookup and :func:`merge` can use whole: a file
    or a table built in code is refused at once, not at the first lookup it breaks."""
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        raise InvalidArgument(f"{where} has format "
                              f"{table.get('format') if isinstance(table, dict) else None!r}: "
                              f"expected a tuning table of format {FORMAT}")
    if not isinstance(table.get("entries"), dict):
        raise InvalidArgument(f"{where} has no 'entries' object")
    if not isinstance(table.get("environment"), dict):
        raise InvalidArgument(f"{where} has no 'environment' object: a table says where it "
                              "was measured (GPU, versions), and is used only there")
    for key, entry in table["entries"].items():
        missing = _missing_fields(entry)
        if missing:
            raise InvalidArgument(f"{where} entry {key!r} lacks {missing}: every entry needs "
                                  "backend, config (with a name), family, and m, n, k of at "
                                  "least 1")


def _missing_fields(entry: object) -> str:
    """The fields lookup reads that ``entry`` lacks or holds wrongly, in words ('' if none)."""
    if not isinstance(entry, dict):
        return "everything (it is not an object)"
    wrong = [name for name in ("backend", "family") if not isinstance(entry.get(name), str)]
    config = entry.get("config")
    if not (isinstance(config, dict) and isinstance(config.get("name"), str)):
        wrong.append("config")
    wrong += [d for d in "mnk" if not (isinstance(entry.get(d), int) and entry[d] >= 1)]
    return ", ".join(wrong)


def mismatch(table_env: dict, here: dict,
             names: tuple[str, str] = ("table", "here")) -> list[str]:
    """The fields in which a table's environment differs from ``here``, each value labelled
    by ``names`` (the table's, then here's)."""
    first, second = names
    return [f"{k}: {first} {table_env.get(k)!r}, {second} {here.get(k)!r}"
            for k in sorted(set(table_env) | set(here)) if table_env.get(k) != here.get(k)]


def merge(*tables: dict) -> dict:
    """One table from several made in the same environment (later entries win)."""
    if not tables:
        raise InvalidArgument("merge: no tables given")
    for i, table in enumerate(tables):
        check_table(table, f"merge: tables[{i}]")
    env = tables[0]["environment"]
    entries: dict[str, dict] = {}
    for i, table in enumerate(tables):
        diff = mismatch(table["environment"], env, (f"tables[{i}]", "tables[0]"))
        if diff:
            raise InvalidArgument(f"merge: tables[{i}] and tables[0] come from different "
                                  f"environments ({'; '.join(diff)}): only tables of one "
                                  "environment merge")
        entries.update(table["entries"])
    return {"format": FORMAT, "environment": env, "entries": entries}


def load_tuning(path: str | os.PathLike, *, tables: TuningTables | None = None) -> list[str]:
    """Load a table for ``backend="auto"``; returns the reasons it was set aside (empty when
    it is used). A table set aside is also warned about as it loads, since a deployment
    that ships one for another GPU or other versions would otherwise run untuned unnoticed."""
    tables = tables or _TABLES
    table = read_table(path)
    diff = mismatch(table["environment"], environment.fingerprint())
    with _LOCK:
        if diff:
            tables.rejected.append(f"{path}: made in another environment ({'; '.join(diff)})")
        else:
            tables.entries.update(table["entries"])
            tables.sources.append(str(path))
            _GENERATION[0] += 1
    if diff:
        warnings.warn(f"tuning table {str(path)!r} is not used: it was made in another "
                      f"environment ({'; '.join(diff)})", RuntimeWarning, stacklevel=2)
    return diff


def _load_env_tables() -> None:
    """Read the tables ``$MULTIBACKEND_TUNING`` names where its value is not the one they
    were read for, replacing those of the former value."""
    global _ENV_TABLES
    spec = os.environ.get(ENV_TUNING, "")
    if spec == (_ENV_TABLES.env_loaded or ""):
        return
    with _ENV_LOCK:  # one thread loads; the others wait for the tables
        if spec == (_ENV_TABLES.env_loaded or ""):
            return
        staged = TuningTables(env_loaded=spec)  # every part read before any is used
        for part in filter(None, spec.split(os.pathsep)):
            try:
                load_tuning(part, tables=staged)
            except InvalidArgument as exc:
                raise InvalidArgument(f"{ENV_TUNING} is {spec!r}: {exc}") from None
        with _LOCK:
            _ENV_TABLES = staged
            _GENERATION[0] += 1


def status() -> TuningTables:
    """Every table in use and set aside: those ``$MULTIBACKEND_TUNING`` names (read again
    when its value has changed) first, then those loaded with :func:`load_tuning`, whose
    entries win."""
    _load_env_tables()
    with _LOCK:  # not while a load adds to them
        named, loaded = _ENV_TABLES, _TABLES
        if not (named.sources or named.rejected):  # the common case: nothing to combine
            return loaded
        return TuningTables({**named.entries, **loaded.entries}, named.sources + loaded.sources,
                            named.rejected + loaded.rejected, named.env_loaded)


def clear() -> None:
    """Forget every loaded table (the variable's are read again at the next lookup)."""
    global _TABLES, _ENV_TABLES
    with _LOCK:
        _TABLES = TuningTables()
        _ENV_TABLES = TuningTables()
        _GENERATION[0] += 1


def lead_text(entry: dict) -> str:
    """An entry's winner against torch.matmul in words: its time, the baseline's, the ratio,
    per timing mode where the entry records modes (a tuner's table records both)."""
    timings = entry.get("timings_ms", {})
    by_mode = timings if timings and all(isinstance(v, dict) for v in timings.values()) \
        else {entry.get("mode", "kernel"): timings}
    winner = f"{entry['backend']}:{entry['config']['name']}"
    parts = []
    for mode, figures in by_mode.items():
        base = [ms for key, ms in figures.items() if key.startswith("cublas:")]
        if winner in figures and base:
            parts.append(f"{mode} {winner} {figures[winner] * 1e3:.1f} us vs torch.matmul "
                         f"{min(base) * 1e3:.1f} us ({min(base) / figures[winner]:.2f}x)")
    spread = entry.get("spread")
    if spread is not None:
        parts.append(f"spread {spread * 100:.1f}%")
    return ", ".join(parts) or f"winner {winner}"


def distance(problem: Problem, entry: dict) -> float:
    """How far ``entry``'s shape lies from ``problem``'s: the largest |log2| ratio of M, N and
    K (a size of 0 counts as 1)."""
    return max(abs(math.log2(max(a, 1)) - math.log2(max(b, 1)))
               for a, b in ((problem.m, entry["m"]), (problem.n, entry["n"]),
                            (problem.k, entry["k"])))


def lookup(problem: Problem, tables: TuningTables | None = None) -> Hit | None:
    """The tuned choice for ``problem``: exact entry, else nearest bucket, else None."""
    if tables is None:
        tables = status()
    if not tables.entries:
        return None
    entry = tables.entries.get(problem.key)
    if entry is not None:
        return Hit(entry["backend"], Config.from_dict(entry["config"]),
                   f"exact tuning-table entry {problem.key}")
    fam = family(problem)
    best = None
    for key, candidate in tables.entries.items():
        if candidate.get("family") != fam:
            continue
        dist = distance(problem, candidate)
        if dist <= BUCKET_RADIUS and (best is None or dist < best[0]):
            best = (dist, key, candidate)
    if best is None:
        return None
    dist, key, candidate = best
    return Hit(candidate["backend"], Config.from_dict(candidate["config"]),
               f"nearest tuning-table bucket {key} (log2 distance {dist:.2f})")
