"""The fault catalogue (``docs/faults.md``) and the fault suite agree: every test the catalogue
names exists, every test of the fault suite's own modules is named there, and the catalogue
holds at least 60 classes."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "docs" / "faults.md"
#: the modules written as the fault suite: each of their tests is a catalogued class
SUITE = ("tests/api/test_faults.py", "tests/api/test_fault_environment.py",
         "tests/api/test_fault_persistence.py", "tests/gpu/test_faults_gpu.py")
ROW = re.compile(r"^\| (\d+) \| (.+?) \| (.+?) \| `(tests/[\w/]+\.py)::(\w+)` \|$")


def _rows() -> list[tuple[int, str, str, str]]:
    rows = []
    for line in CATALOGUE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            number, fault, _, path, name = match.groups()
            rows.append((int(number), fault, path, name))
        else:
            assert not re.match(r"^\| \d+ \|", line), f"a catalogue row out of form: {line}"
    return rows


def _tests(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_the_catalogue_holds_60_numbered_classes_or_more():
    rows = _rows()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "numbered 1, 2, ... in order"
    assert len(rows) >= 60
    assert len({r[1] for r in rows}) == len(rows), "each class described once"


def test_every_test_the_catalogue_names_exists():
    missing = [f"{path}::{name}" for _, _, path, name in _rows()
               if not (ROOT / path).is_file() or name not in _tests(path)]
    assert not missing, f"named in docs/faults.md but not found: {missing}"


def test_every_test_of_the_fault_suite_is_catalogued():
    named = {(path, name) for _, _, path, name in _rows()}
    unnamed = [f"{path}::{name}" for path in SUITE for name in sorted(_tests(path))
               if (path, name) not in named]
    assert not unnamed, f"fault tests missing from docs/faults.md: {unnamed}"
