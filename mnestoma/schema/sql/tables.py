"""The tables as Core ``Table`` objects (typed), their column orders, the edge key and the
one shape of an event row (:class:`EventRow`), which every writer of ``events`` builds."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeAlias, cast

from sqlalchemy import ColumnElement, String, Table, and_, bindparam, literal, literal_column
from sqlalchemy.sql.expression import FromClause

from mnestoma.core.rules import EventKind, MnestState, Recorder, sql_literal
from mnestoma.schema.models import AgerProgress, AgerRun, CanonicalQuery, Event, Mnest, MnestChain

__all__ = [
    "AGER_PROGRESS",
    "AGER_RUNS",
    "CHAINS",
    "EVENTS",
    "EVENT_COLUMNS",
    "EVENT_ROW",
    "MNESTS",
    "MNEST_COLUMNS",
    "QUERIES",
    "QUERY_COLUMNS",
    "EventRow",
    "Key",
    "is_active",
    "key_is",
    "kind_in",
    "state_is",
]

MNESTS = cast(Table, Mnest.__table__)
EVENTS = cast(Table, Event.__table__)
QUERIES = cast(Table, CanonicalQuery.__table__)
AGER_RUNS = cast(Table, AgerRun.__table__)
AGER_PROGRESS = cast(Table, AgerProgress.__table__)
CHAINS = cast(Table, MnestChain.__table__)

MNEST_COLUMNS: tuple[str, ...] = tuple(c.key for c in MNESTS.columns)
EVENT_COLUMNS: tuple[str, ...] = tuple(c.key for c in EVENTS.columns)
QUERY_COLUMNS: tuple[str, ...] = tuple(c.key for c in QUERIES.columns)

SQL: TypeAlias = ColumnElement[Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    """One row of ``events`` (its generated id aside), the one shape every writer builds: the
    repository (tuples in :data:`EVENT_ROW` order), the ager (``INSERT ... SELECT`` lists,
    each value an SQL expression or a Python value) and a copy's merges.
    A column a writer has nothing for takes its default here, so that a column added to the
    table is added here once and every writer writes it (a test compares the two)."""

    mnest_id: str | SQL
    kind: str | SQL
    ts: datetime | SQL
    turn_id: str | SQL | None = None
    weight_before: float | SQL | None = None
    weight_after: float | SQL | None = None
    state_before: str | SQL | None = None
    state_after: str | SQL | None = None
    reason: str | SQL | None = None
    related_id: str | SQL | None = None
    # the table's own default: an event that does not say who recorded it reads as a call's
    recorder: str | SQL = Recorder.CALL.value
    outcome: str | SQL | None = None
    # which passing of its edge in its turn (contract §13); 1 for any other event
    occurrence: int | SQL = 1

    def as_dict(self) -> dict[str, Any]:
        """The row's values by column name, in :data:`EVENT_ROW` order."""
        return {name: getattr(self, name) for name in EVENT_ROW}

    def select_list(self) -> list[SQL]:
        """The row as the select list of an ``INSERT ... SELECT`` into :data:`EVENT_ROW`:
        SQL expressions as they are, Python values bound with their column's type."""
        return [
            v if isinstance(v, ColumnElement) else literal(v, EVENTS.c[name].type)
            for name, v in self.as_dict().items()
        ]


# An event's columns in the order of :class:`EventRow` (the repository's tuples, the ager's
# inserts): named by the shape rather than taken from the table, so that no writer depends
# on the table's column order.
EVENT_ROW: tuple[str, ...] = tuple(f.name for f in fields(EventRow))

# An edge's key: (src_executor, src_version, dst_executor, dst_version or None for a proto).
Key = tuple[str, str, str, str | None]


def key_is(
    table: Table, suffix: str = "", *, proto: bool, state: MnestState
) -> ColumnElement[bool]:
    """The edge-key predicate, the one spelling of it: the key bound as ``:s``, ``:sv``,
    ``:d`` (and ``:dv`` unless a proto, whose version is NULL), each name + ``suffix``;
    the state written in (see :func:`state_is`): one statement per state."""
    c = table.c
    terms: list[ColumnElement[bool]] = [
        c.src_executor == bindparam("s" + suffix),
        c.src_version == bindparam("sv" + suffix),
        c.dst_executor == bindparam("d" + suffix),
        c.dst_version.is_(None) if proto else c.dst_version == bindparam("dv" + suffix),
        state_is(table, state),
    ]
    return and_(*terms)


def state_is(table: FromClause, state: MnestState) -> ColumnElement[bool]:
    """``state = '<state>'``, the state written as a literal, never a bound parameter.

    The partial index ``ix_mnests_active_src`` names a state (``WHERE state = 'active'``).
    With the state as a parameter, neither planner could tell that it holds the rows a
    statement wants; and SQLite, which compares such a parameter with the index's constant
    while planning, would plan the statement again each time a value is bound to it.
    """
    return table.c.state == literal_column(sql_literal(state), String)


def is_active(table: FromClause) -> ColumnElement[bool]:
    """``state = 'active'`` as :func:`state_is` writes it."""
    return state_is(table, MnestState.ACTIVE)


def kind_in(table: FromClause, kinds: tuple[EventKind, ...]) -> ColumnElement[bool]:
    """``kind IN ('a', 'b')``, the kinds written as literals, as the partial index
    ``ux_events_turn_edge`` names them (see :func:`state_is`); a list of values would also
    be an expanding parameter, which the driver path leaves to SQLAlchemy."""
    return table.c.kind.in_([literal_column(sql_literal(k), String) for k in kinds])
