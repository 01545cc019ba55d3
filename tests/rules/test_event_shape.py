"""One shape of an event row for every writer of ``events``: the columns the shape names are
the table's, its defaults agree with the table's, and each writer (the repository's tuples,
the ager's inserts on both engines, a copy's merges, the seed repair) writes exactly them.
A column added to ``events`` fails here until the shape takes it, and then every writer does.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from mnestoma.core.rules import EventKind, Recorder
from mnestoma.core.settings import Settings
from mnestoma.maintenance import copying, seed_repair
from mnestoma.schema.sql import ager, record
from mnestoma.schema.sql.tables import EVENT_COLUMNS, EVENT_ROW, EVENTS, EventRow
from mnestoma.store.rows import event_values

T = datetime(2026, 6, 1, tzinfo=UTC)
DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}


def test_the_shape_names_every_column_of_events_but_its_generated_id() -> None:
    assert set(EVENT_ROW) == set(EVENT_COLUMNS) - {"id"}
    assert len(EVENT_ROW) == len(set(EVENT_ROW))
    # the repository's tuples follow the shape's order
    assert record.EVENT_ROW == EVENT_ROW


def test_the_shape_requires_what_the_table_requires_and_defaults_as_it_does() -> None:
    for f in fields(EventRow):
        column = EVENTS.c[f.name]
        if f.default is MISSING:
            # a value every writer must give: the table has no default for it either
            assert not column.nullable and column.default is None, f.name
        elif f.default is None:
            assert column.nullable, f.name
        else:
            assert column.default is not None and column.default.arg == f.default, f.name
    assert EventRow(mnest_id="mn_1", kind="created", ts=T).recorder == Recorder.CALL.value


def test_a_row_has_its_values_in_the_shapes_order() -> None:
    row = EventRow(mnest_id="mn_1", kind=EventKind.MERGED.value, ts=T, related_id="mn_2")
    values = row.as_dict()
    assert tuple(values) == EVENT_ROW
    assert values["related_id"] == "mn_2" and values["outcome"] is None
    assert len(row.select_list()) == len(EVENT_ROW)


def test_the_repository_builds_its_tuples_in_the_shapes_order() -> None:
    values = event_values("mn_1", EventKind.CREATED, T, recorder=Recorder.CALL.value)
    assert len(values) == len(EVENT_ROW)


def _statements(dialect: str, batched: bool) -> list[Any]:
    s = ager.ager_statements(dialect, batched)
    named = [getattr(s, f.name) for f in fields(s) if f.name != "changes"]
    return named + [change.statement for change in s.changes]


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_every_event_the_ager_writes_names_every_column_of_the_shape(
    dialect: str, batched: bool
) -> None:
    inserts = []
    for stmt in _statements(dialect, batched):
        sql = str(stmt.compile(dialect=DIALECTS[dialect]))
        inserts += re.findall(r"INSERT INTO events \(([^)]*)\)", sql)
    # SQLite: the merges' events, the prunes' and demotions'; PostgreSQL: the two sides of
    # a merge, the prunes', the demotions'
    assert len(inserts) == (2 if dialect == "sqlite" else 4)
    for columns in inserts:
        assert tuple(c.strip() for c in columns.split(",")) == EVENT_ROW


def test_a_copys_merged_event_has_every_column() -> None:
    settings = Settings(recorder="cli")
    job = SimpleNamespace(next_event_id=7, pairs={"mn_s": "mn_t"}, now=T, settings=settings)
    row = copying._Job._merged_event(job, "mn_s", "mn_t", 0.4, 0.5, {"state": "active"})
    assert set(row) == set(EVENT_COLUMNS)
    assert (row["id"], row["state_before"], row["related_id"]) == (7, None, "mn_t")
    assert row["recorder"] == "cli" and row["outcome"] is None and row["turn_id"] is None


def test_the_seed_repair_writes_the_shapes_columns_that_revision_0001_has() -> None:
    seed_columns = set(seed_repair._events.c.keys()) - {"id"}
    assert seed_columns <= set(EVENT_ROW)
    # the others are written once revision 0002 has added them: related_id and reason
    # (write_notes), recorder, outcome and occurrence by their columns' defaults
    assert set(EVENT_ROW) - seed_columns == {
        "reason",
        "related_id",
        "recorder",
        "outcome",
        "occurrence",
    }
