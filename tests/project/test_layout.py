"""The suite's layout: every test file sits in a folder that says what it needs, never
directly in ``tests/``, and the maintainers' guide describes each folder.

The helpers (``conftest.py``, ``helpers_proc.py``, ``cli_kit.py``, ...) stay at the top:
``tests/`` is on ``sys.path``, so every folder imports them by name. The folders have no
``__init__.py``, so pytest imports each test file by its bare name: a name is used once.
"""

from __future__ import annotations

import ast
from collections import Counter

from conftest import REPO

TESTS = REPO / "tests"
# Each folder, and what its tests need.
FOLDERS = {
    "rules": "pure rules and tables, no database",
    "store": "a store on one engine at a time: SQLite, then PostgreSQL",
    "races": "threads, processes, faults, fork, servers of their own, soak",
    "migrations": "the revisions, Alembic and a service's own schema",
    "cli": "the command line",
    "project": "the README and guides, packaging, the pytest plugin, benchmarks, the layout",
}


def test_no_test_file_sits_directly_in_tests() -> None:
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert flat == [], f"move {flat} into the folder that says what they need: {FOLDERS}"


def test_every_test_file_is_in_a_known_folder_under_a_name_of_its_own() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50
    places = {p.relative_to(TESTS).parent.as_posix() for p in files}
    assert places <= set(FOLDERS), places - set(FOLDERS)
    again = [name for name, n in Counter(p.name for p in files).items() if n > 1]
    assert again == []
    assert not list(TESTS.rglob("__init__.py"))


def test_the_maintainers_guide_describes_every_folder() -> None:
    guide = (REPO / "docs" / "maintainers.md").read_text(encoding="utf-8")
    for folder in FOLDERS:
        assert f"`tests/{folder}/`" in guide, folder


def test_a_test_file_imports_test_modules_of_its_own_folder_only() -> None:
    """pytest puts a test file's own folder on ``sys.path``; what tests of other folders
    share belongs in a helper at the top of ``tests/``."""
    files = sorted(TESTS.rglob("test_*.py"))
    folder_of = {p.stem: p.parent for p in files}
    crossing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            crossing += [
                (path.name, name)
                for name in names
                if name in folder_of and folder_of[name] != path.parent
            ]
    assert crossing == []
