"""The tables as Core ``Table`` objects (typed), their column orders and the edge key."""

from __future__ import annotations

from typing import cast

from sqlalchemy import ColumnElement, String, Table, and_, bindparam, literal_column
from sqlalchemy.sql.expression import FromClause

from ..models import AgerRun, CanonicalQuery, Event, Mnest
from ..rules import MnestState, sql_literal

__all__ = [
    "AGER_RUNS",
    "EVENTS",
    "EVENT_COLUMNS",
    "MNESTS",
    "MNEST_COLUMNS",
    "QUERIES",
    "QUERY_COLUMNS",
    "Key",
    "is_active",
    "key_is",
]

MNESTS = cast(Table, Mnest.__table__)
EVENTS = cast(Table, Event.__table__)
QUERIES = cast(Table, CanonicalQuery.__table__)
AGER_RUNS = cast(Table, AgerRun.__table__)

MNEST_COLUMNS: tuple[str, ...] = tuple(c.key for c in MNESTS.columns)
EVENT_COLUMNS: tuple[str, ...] = tuple(c.key for c in EVENTS.columns)
QUERY_COLUMNS: tuple[str, ...] = tuple(c.key for c in QUERIES.columns)

# An edge's key: (src_executor, src_version, dst_executor, dst_version or None for a proto).
Key = tuple[str, str, str, str | None]


def key_is(
    table: Table, suffix: str = "", *, proto: bool, state: MnestState | None = None
) -> ColumnElement[bool]:
    """The edge-key predicate, the one spelling of it: the key bound as ``:s``, ``:sv``,
    ``:d`` (and ``:dv`` unless a proto, whose version is NULL), each name + ``suffix``;
    the state bound as ``:state`` + suffix, or fixed when ``state`` is given."""
    c = table.c
    terms: list[ColumnElement[bool]] = [
        c.src_executor == bindparam("s" + suffix),
        c.src_version == bindparam("sv" + suffix),
        c.dst_executor == bindparam("d" + suffix),
        c.dst_version.is_(None) if proto else c.dst_version == bindparam("dv" + suffix),
        c.state == (bindparam("state" + suffix) if state is None else state.value),
    ]
    return and_(*terms)


def is_active(table: FromClause) -> ColumnElement[bool]:
    """``state = 'active'`` with the state written as a literal, as the predicate of the
    partial index ``ix_mnests_active_src`` says it: with a bound parameter instead, neither
    planner could tell that the index holds every row the statement wants."""
    return table.c.state == literal_column(sql_literal(MnestState.ACTIVE), String)
