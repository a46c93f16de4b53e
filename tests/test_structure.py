"""The package's import direction is its architecture: each layer imports only the layers below
it (function-level imports included), no import cycle exists anywhere, and the modules stay
small. Parsed from the sources (nothing imported), so a new upward import fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: source folders and the dotted package each one is imported as
PACKAGES = {"multibackend": ROOT / "multibackend", "multibackend.backends": ROOT / "backends",
            "multibackend.raw_wmma": ROOT / "raw_wmma"}
#: bottom to top; a module belongs to the last prefix that names it
LAYERS = (
    ("multibackend.core", "multibackend.raw_wmma", "multibackend.data"),
    ("multibackend.io",),
    ("multibackend.gpu",),
    ("multibackend.backends",),
    ("multibackend.choose",),
    ("multibackend.run",),
    ("multibackend.verify",),
    ("multibackend.eager", "multibackend.first_call"),
    ("multibackend.integrations",),
    ("multibackend.api", "multibackend.nn"),
    ("multibackend.tuning", "multibackend.cli", "multibackend.report", "multibackend",
     "multibackend.__main__"),
)
MAX_LINES = 700
MAX_TOP_MODULES = 12


def modules() -> dict[str, Path]:
    """{dotted name: source path} of every module of the package."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            # a name that is a module is that module; any other is defined in ``base`` itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def layer(name: str) -> int:
    """The index in :data:`LAYERS` of the most specific prefix that names ``name``."""
    best = (-1, -1)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                best = max(best, (len(prefix), index))
    assert best[1] >= 0, f"{name} is in no layer: add its package to LAYERS"
    return best[1]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of two or more modules (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_imports_run_down_the_layers():
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in sorted(graph().items()) for b in sorted(targets)
              if layer(b) > layer(a)]
    assert upward == []


def test_a_backend_imports_no_other_backend():
    def owner(name: str) -> str | None:
        parts = name.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "backends" else None

    crossing = [f"{a} imports {b}" for a, targets in sorted(graph().items()) for b in targets
                if owner(a) and owner(b) and owner(a) != owner(b)]
    assert crossing == []


@pytest.mark.parametrize("name,path", sorted(modules().items()))
def test_module_is_small(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


def test_few_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGES["multibackend"].glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_the_checks_see_an_upward_import_and_a_cycle():
    edges = {"multibackend.core.a": {"multibackend.api"}, "multibackend.api": {"multibackend.core.a"}}
    assert cycles(edges) == [["multibackend.api", "multibackend.core.a"]]
    assert layer("multibackend.core.a") < layer("multibackend.api")
    assert layer("multibackend.backends.triton.kernels") == layer("multibackend.backends.base")


def test_every_backend_keeps_the_contract_and_a_broken_one_is_refused_on_load():
    from multibackend.backends import BACKEND_MODULES
    from multibackend.backends.base import Backend, contract_fault
    from multibackend.choose.registry import Registry

    registry = Registry()
    for name in BACKEND_MODULES:
        assert registry.availability(name) is None or registry.availability(name).rule != \
            "contract", registry.availability(name)

    class Broken(Backend):
        name = "broken"
        capability = None

        def available(self):
            return None

        def configs(self, problem):
            return []

        def run(self, problem, operands, config):
            pass

        def produce(self, problem, config):  # the contract's hook takes alpha, beta, ...
            return None

    fault = contract_fault(Broken())
    assert fault is not None and "Broken.produce takes (self, problem, config)" in fault
    assert "not a multibackend Backend" in contract_fault(object())
