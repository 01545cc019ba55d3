"""The package's import graph has no cycle, counting every import: those at the top of a
module and those inside a function (which would hide a cycle from a first look), so that
each module can be read, and changed, knowing only the modules below it.

``lint-imports`` (CI) checks the layers of ``pyproject.toml``; this test checks the graph
of every module, the packages' own modules among themselves too.
"""

from __future__ import annotations

import ast
import re
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
    source = "def f():\n    from ..engines import redact_text\n    return redact_text\n"
    modules = {
        "mnestoma.core.errors": PACKAGE / "core" / "errors.py",
        "mnestoma.engines": PACKAGE / "engines" / "__init__.py",
    }
    reached = [
        target
        for node in ast.walk(ast.parse(source))
        for target in _imported(
            "mnestoma.core.errors", modules["mnestoma.core.errors"], modules, node
        )
    ]
    assert reached == ["mnestoma.engines"]
    assert import_graph()["mnestoma.core.rules"] == set()  # the bottom imports nothing of ours


def test_the_import_graph_of_the_package_has_no_cycle() -> None:
    found = cycles(import_graph())
    assert found == [], f"import cycles in mnestoma/: {found}"


def _contract_layers() -> list[list[str]]:
    """The layers of [tool.importlinter] in pyproject.toml, top first, each its rooms."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    [contract] = config["tool"]["importlinter"]["contracts"]
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def room_of(module: str) -> str:
    """The room of a module: the subpackage or top-level module of ``mnestoma`` it is in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rooms() -> dict[str, set[str]]:
    """The package's rooms (its top-level modules and subpackages) and the rooms each imports."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module == "mnestoma":
            continue
        graph.setdefault(room_of(module), set()).update(
            room_of(t) for t in targets if t != "mnestoma" and room_of(t) != room_of(module)
        )
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other, else one above the highest
    floor it imports (the graph has no cycle)."""
    found: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in found:
            found[room] = 1 + max((floor(r) for r in graph[room]), default=0)
        return found[room]

    for room in graph:
        floor(room)
    return found


def test_the_floor_counter_counts_the_longest_climb() -> None:
    assert floors({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    assert cycles(rooms()) == []


def test_the_package_stands_on_at_most_nine_floors() -> None:
    """A newcomer reads the package as a few floors of rooms, each room a concern."""
    found = floors(rooms())
    assert max(found.values()) <= 9, sorted(found.items(), key=lambda kv: kv[1])
    assert found["core"] == 1 and found["__main__"] == max(found.values())


def test_the_import_contract_has_at_most_eight_layers_of_rooms() -> None:
    layers = _contract_layers()
    assert len(layers) <= 8
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages <= {name for layer in layers for name in layer}


def test_every_room_is_in_a_layer_of_the_import_contract() -> None:
    """A new module is placed in the layers (pyproject.toml), else lint-imports says
    nothing about what it may import."""
    named = {name for layer in _contract_layers() for name in layer}
    missing = set(rooms()) - named
    assert missing == set(), f"rooms in no layer of [tool.importlinter]: {missing}"


def _guide_layers() -> list[list[str]]:
    """The rooms of each row of docs/maintainers.md's table of layers, top first."""
    guide = (REPO / "docs" / "maintainers.md").read_text(encoding="utf-8")
    table = guide.split("## The layers", 1)[1].split("\n\n| layer |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines()[1:] if line.startswith("| ")]
    return [re.findall(r"`([\w]+)/?`", row.split("|")[2]) for row in rows]


def test_the_maintainers_guide_shows_the_layers_of_the_import_contract() -> None:
    """The guide's table of layers names the same rooms, in the same layers, in the same
    order as the contract lint-imports checks."""
    assert _guide_layers() == _contract_layers()
