"""SQLite's hot paths at the driver: statements compiled once, rows converted by hand.

For the batched writes of a turn and the rows read by a turn or a walk, SQLAlchemy's
per-row, per-parameter processing costs more than SQLite's own work. These helpers produce
exactly what the column types (``UTCDateTime``, ``JSONDocument``) would: the same text in
the database, the same aware datetimes and JSON values out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from .models import Mnest
from .types import UTCDateTime, ensure_aware_utc, parse_sqlite_timestamp

M = Mnest.__table__
MNEST_COLUMNS = [c.key for c in M.columns]


def timestamp_text(value: datetime) -> str:
    return f"{ensure_aware_utc(value):%Y-%m-%d %H:%M:%S.%f}"


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


# How the turn path's batched parameters become what the SQLite driver stores: exactly what
# UTCDateTime and JSONDocument produce, without SQLAlchemy's per-row, per-parameter work
# (which costs more than SQLite's own work for these statements).
_SQLITE_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "b_ts_last": timestamp_text,
    "b_ts_weight": timestamp_text,
    "ts": timestamp_text,
    "b_tags": _json_text,
    "b_desired_sig": _json_text,
}
_SQLITE_COMPILED: dict[tuple[int, tuple[str, ...]], Any] = {}


def write_rows(
    conn: Connection, stmt: Any, rows: list[dict[str, Any]]
) -> tuple[str, list[tuple[Any, ...]]]:
    """The statement compiled once for SQLite, and its rows as positional tuples."""
    keys = tuple(rows[0])
    compiled = _SQLITE_COMPILED.get((id(stmt), keys))
    if compiled is None:
        compiled = stmt.compile(dialect=conn.dialect, column_keys=list(keys))
        _SQLITE_COMPILED[(id(stmt), keys)] = compiled
    names = compiled.positiontup
    defaults = compiled.params
    # the rows of one batch share a few instants ("now"): format each one once
    formatted: dict[datetime, str] = {}

    def timestamp(value: datetime) -> str:
        text = formatted.get(value)
        if text is None:
            text = formatted[value] = timestamp_text(value)
        return text

    convert = [
        timestamp if _SQLITE_CONVERTERS.get(n) is timestamp_text else _SQLITE_CONVERTERS.get(n)
        for n in names
    ]
    plan = list(zip(names, convert, strict=True))
    data = [
        tuple(
            (c(r[n]) if c is not None and r[n] is not None else r[n]) if n in r else defaults[n]
            for n, c in plan
        )
        for r in rows
    ]
    return compiled.string, data


_TS_NAMES = tuple(c.key for c in M.columns if isinstance(c.type, UTCDateTime))
_JSON_NAMES = ("tags", "desired_sig")


def mnest_mapping(raw: Sequence[Any]) -> dict[str, Any]:
    """A ``mnests`` row as the SQLite driver returns it (the table's columns in order),
    converted as the column types would, keyed by column name."""
    out = dict(zip(MNEST_COLUMNS, raw, strict=True))
    for name in _TS_NAMES:
        value = out[name]
        if value is not None:
            out[name] = parse_sqlite_timestamp(value)
    for name in _JSON_NAMES:
        value = out[name]
        if value is not None:
            out[name] = json.loads(value)
    return out


def select_args(conn: Connection, stmt: Any, params: dict[str, Any]) -> tuple[str, tuple]:
    """A SELECT compiled once for SQLite, and its parameters as a positional tuple."""
    compiled = _SQLITE_COMPILED.get((id(stmt), ()))
    if compiled is None:
        compiled = stmt.compile(dialect=conn.dialect)
        _SQLITE_COMPILED[(id(stmt), ())] = compiled
    defaults = compiled.params
    args = tuple(params[n] if n in params else defaults[n] for n in compiled.positiontup)
    return compiled.string, args
