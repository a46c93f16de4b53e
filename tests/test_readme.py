"""CPU tier for the README a newcomer starts from: at most 150 lines, the two set-up commands
first, and its quickstart (the first ```python block) run as written, unchanged, in a fresh
interpreter of this environment: on a machine without a GPU that exercises the host fallback
(``auto`` answered by the array library, a named GPU backend refused with
``BackendUnavailable``), on one with a GPU the real backends."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150
SETUP = ("bash .ci/setup && .venv/bin/python -m multibackend check",
         "bash .ci/setup && .venv/bin/python -m pytest -n auto --dist loadscope")
#: a fenced block: its language and its body
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    return FENCE.findall(README.read_text(encoding="utf-8"))


def _commands(script: str) -> list[str]:
    """The shell lines of ``script`` without their comments, blank lines left out."""
    lines = (line.split("#", 1)[0].strip() for line in script.splitlines())
    return [line for line in lines if line]


def test_readme_is_at_most_150_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_readme_starts_with_the_two_setup_commands():
    blocks = _blocks()
    assert blocks, "README.md has no fenced block"
    language, body = blocks[0]
    assert language == "bash", f"the README's first block is {language or 'unmarked'}, not bash"
    assert _commands(body)[:2] == list(SETUP)


def test_quickstart_runs_as_written():
    python = [body for language, body in _blocks() if language == "python"]
    assert python, "README.md has no ```python block"
    env = dict(os.environ)
    # as a user runs it: the tests' conftest turns Triton's interpreter on where there is no GPU
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", python[0]], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (
        f"the README's quickstart exited {result.returncode}\n--- stdout\n{result.stdout}"
        f"\n--- stderr\n{result.stderr}")
