"""Every rule in one place: the states and event kinds are spelled only in mnestoma.rules.

Elsewhere in the package they come from ``MnestState``, ``EventKind`` and the tuples and SQL
helpers of the rules, so that adding a state or a kind is a change to ``rules.py`` (and a
migration where a CHECK changes) and nothing else. Docstrings may name them; code may not,
neither as a string of its own (``"active"``) nor quoted inside SQL text (``"... = 'active'"``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import mnestoma
from mnestoma.core.rules import EventKind, MnestState

PACKAGE = Path(mnestoma.__file__).resolve().parent
ROOT = PACKAGE.parent
RULES = PACKAGE / "core" / "rules.py"
FROZEN = PACKAGE / "migrations"  # revisions keep the words they were written with
# The repair of 0001-era stores is frozen history too: it keeps the words of revision 0001.
SEED_REPAIR = PACKAGE / "maintenance" / "seed_repair.py"
WORDS = frozenset(s.value for s in MnestState) | frozenset(k.value for k in EventKind)


def _documentation(tree: ast.AST) -> set[int]:
    """The ids of string constants that stand alone as statements: docstrings of modules,
    classes and functions, and the strings that document an attribute."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def _spelled(value: str) -> str | None:
    """The state or event kind that a string literal spells, if any: the whole string, or
    one quoted as an SQL literal inside it."""
    if value in WORDS:
        return value
    return next((w for w in sorted(WORDS) if f"'{w}'" in value), None)


def offenders(source: str, name: str) -> list[str]:
    """``name:line: 'word'`` for each string literal of ``source`` that spells a state or an
    event kind outside documentation."""
    tree = ast.parse(source, filename=name)
    docs = _documentation(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and (word := _spelled(node.value)) is not None
        ):
            found.append((node.lineno, f"{name}:{node.lineno}: {word!r} in {node.value!r}"))
    return [text for _, text in sorted(found)]


def _modules() -> list[Path]:
    return sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p not in (RULES, SEED_REPAIR) and not p.is_relative_to(FROZEN)
    )


def test_the_detector_finds_literals_and_sql_text_but_not_docstrings() -> None:
    source = '''
"""Module doc: active rows and created events."""


def f(state):
    """Only active rows."""
    if state == "active":
        return text("kind IN ('created', 'reinforced')")
    return f"state = 'proto' AND {state}"


class C:
    mode = "inactive"
    """An attribute's doc: 'decaying' rows."""
'''
    found = offenders(source, "m.py")
    assert [line.split(": ")[0] for line in found] == ["m.py:7", "m.py:8", "m.py:9"]
    assert "'active'" in found[0] and "'created'" in found[1] and "'proto'" in found[2]


def test_the_package_is_scanned() -> None:
    names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
    assert {
        "schema/models.py",
        "core/sqlrules.py",
        "maintenance/ager.py",
        "schema/sql/ager.py",
    } <= names
    assert "core/rules.py" not in names


def test_states_and_event_kinds_are_spelled_only_in_the_rules() -> None:
    found = [
        line
        for path in _modules()
        for line in offenders(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    ]
    assert not found, (
        f"{len(found)} state or event-kind literal(s) outside mnestoma/core/rules.py; use "
        "MnestState, "
        "EventKind, LIVE_STATES, PASSING_KINDS, sql_literal or sql_list instead:\n"
        + "\n".join(found)
    )
