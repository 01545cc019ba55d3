"""The tables as Core ``Table`` objects (typed), their column orders and the edge key."""

from __future__ import annotations

from typing import cast

from sqlalchemy import ColumnElement, Table, and_, bindparam

from ..models import AgerRun, CanonicalQuery, Event, Mnest
from ..rules import MnestState

__all__ = [
    "AGER_RUNS",
    "EVENTS",
    "EVENT_COLUMNS",
    "MNESTS",
    "MNEST_COLUMNS",
    "QUERIES",
    "QUERY_COLUMNS",
    "Key",
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
