"""The shape of ``mnestoma/store/``: modules a reader can hold in mind (at most
:data:`MAX_LINES` lines each), and a ``MnestRepository`` whose public methods are the
operations of contract §5, no internal step among them."""

from __future__ import annotations

import inspect
import re

from conftest import REPO

from mnestoma.schema.sql.tables import MNEST_COLUMNS
from mnestoma.store.repository import MnestRepository
from mnestoma.store.rows import MnestRow

STORE = REPO / "mnestoma" / "store"
CONTRACT = REPO / "docs" / "contract.md"
MAX_LINES = 450

# Operations of contract §5's list that only the facades hold.
FACADE_ONLY = {"top_queries", "recent_queries", "unit_of_work", "close", "split_history"}
# Public attributes a repository keeps besides the operations.
PLUMBING = {"session"}


def test_every_module_of_the_store_is_at_most_450_lines() -> None:
    too_long = {}
    for path in sorted(STORE.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        if n > MAX_LINES:
            too_long[path.name] = n
    assert not too_long, f"store modules over {MAX_LINES} lines: {too_long}"


def _contract_operations() -> set[str]:
    """The operations named in the signatures block of contract §5."""
    text = CONTRACT.read_text(encoding="utf-8")
    section = text.split("## 5.", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```text\n(.*?)```", section, re.S)
    signatures = next(b for b in blocks if "record_passing(" in b)
    names: set[str] = set()
    for line in signatures.splitlines():
        if line and not line[0].isspace():
            names.update(re.findall(r"(?:^|,\s*)([a-z_]\w*)\(", line))
    return names


def test_the_repositorys_public_methods_are_the_contracts_operations() -> None:
    operations = _contract_operations() - FACADE_ONLY
    assert {"record_passing", "record_turn", "graph", "log_canonical_query"} <= operations
    public = {name for name, _ in inspect.getmembers(MnestRepository) if not name.startswith("_")}
    expected = operations | PLUMBING
    assert public == expected, (
        f"not in contract §5: {sorted(public - expected)}; missing: {sorted(expected - public)}"
    )


def test_a_mnest_row_names_the_tables_columns_in_order() -> None:
    assert MnestRow._fields == MNEST_COLUMNS
