"""The package's import graph has no cycle, counting every import: those at the top of a
module and those inside a function (which would hide a cycle from a first look), so that
each module can be read, and changed, knowing only the modules below it.

``lint-imports`` (CI) checks the layers of ``pyproject.toml``; this test checks the graph
of every module, the packages' own modules among themselves too.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from conftest import REPO

import mnestoma

PACKAGE = Path(mnestoma.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["mnestoma", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path], node: ast.AST) -> list[str]:
    """The package's modules that one import statement of ``module`` reaches."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = module.split(".")
        if path.name != "__init__.py":
            base.pop()
        if node.level:
            base = base[: len(base) - (node.level - 1)]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        targets = [
            f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names
        ]
    else:
        return []
    reached = []
    for target in targets:
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != module:
            reached.append(target)
    return reached


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports, anywhere."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            graph[module].update(_imported(module, path, modules, node))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_closed_inside_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_function_level_import_is_part_of_the_graph() -> None:
    source = "def f():\n    from .config import redact_text\n    return redact_text\n"
    modules = {"mnestoma.core.errors": PACKAGE / "errors.py", "mnestoma.engines": PACKAGE / "config.py"}
    reached = [
        target
        for node in ast.walk(ast.parse(source))
        for target in _imported("mnestoma.core.errors", modules["mnestoma.core.errors"], modules, node)
    ]
    assert reached == ["mnestoma.engines"]
    assert import_graph()["mnestoma.core.rules"] == set()  # the bottom imports nothing of ours


def test_the_import_graph_of_the_package_has_no_cycle() -> None:
    found = cycles(import_graph())
    assert found == [], f"import cycles in mnestoma/: {found}"


def test_every_module_is_in_a_layer_of_the_import_contract() -> None:
    """A new module is placed in the layers (pyproject.toml), else lint-imports says
    nothing about what it may import."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    [contract] = config["tool"]["importlinter"]["contracts"]
    named = {
        f"mnestoma.{name.strip()}" for layer in contract["layers"] for name in layer.split("|")
    }
    top = {m.split(".")[0] + "." + m.split(".")[1] for m in import_graph() if m.count(".") >= 1}
    assert top - named == set(), f"modules in no layer of [tool.importlinter]: {top - named}"
