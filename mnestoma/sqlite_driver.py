"""SQLite's hot paths at the driver: statements compiled once, rows converted by hand.

For the batched writes of a turn and the rows read by a turn or a walk, SQLAlchemy's
per-row, per-parameter processing costs more than SQLite's own work. Each parameter is
converted as its bound type (``UTCDateTime``, ``JSONDocument``) would convert it, so the
database holds the same text and the same aware datetimes and JSON values come out.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from .statements import MNEST_COLUMNS, M
from .types import JSONDocument, UTCDateTime, parse_sqlite_timestamp, sqlite_timestamp_text

__all__ = ["execute", "fetch_tuples", "mnest_mapping", "mnest_values"]


def _json_text(value: Any) -> str:
    return json.dumps(value)


def _converter(type_: Any) -> Callable[[Any], Any] | None:
    """How a bound value of this type reaches the driver, as the type's processor would."""
    if isinstance(type_, UTCDateTime):
        return sqlite_timestamp_text
    if isinstance(type_, JSONDocument):
        return _json_text
    return None


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A statement compiled once for SQLite: its text, parameter order, literal values and
    the converter of each parameter (derived from its bound type)."""

    sql: str
    names: tuple[str, ...]
    defaults: dict[str, Any]
    converters: tuple[Callable[[Any], Any] | None, ...]

    def args(self, values: dict[str, Any], seen: dict[datetime, str]) -> tuple[Any, ...]:
        """One row of positional parameters; ``seen`` formats each instant once per batch."""
        out = []
        for name, convert in zip(self.names, self.converters, strict=True):
            value = values[name] if name in values else self.defaults[name]
            if convert is not None and value is not None:
                if convert is sqlite_timestamp_text:
                    text = seen.get(value)
                    if text is None:
                        text = seen[value] = sqlite_timestamp_text(value)
                    value = text
                else:
                    value = convert(value)
            out.append(value)
        return tuple(out)


# Compiled statements, least recently used last out. Each entry holds the statement itself:
# while it is cached its id() cannot be given to another object, and the identity check
# below makes a stale entry impossible even so.
MAX_PREPARED = 512
_PREPARED: OrderedDict[tuple[int, tuple[str, ...]], tuple[Any, _Prepared]] = OrderedDict()
_PREPARED_LOCK = threading.Lock()


def _prepare(conn: Connection, stmt: Any, column_keys: tuple[str, ...] = ()) -> _Prepared:
    key = (id(stmt), column_keys)
    with _PREPARED_LOCK:
        entry = _PREPARED.get(key)
        if entry is not None and entry[0] is stmt:
            _PREPARED.move_to_end(key)
            return entry[1]
    compiled = stmt.compile(dialect=conn.dialect, column_keys=list(column_keys) or None)
    names = tuple(compiled.positiontup)
    prepared = _Prepared(
        compiled.string,
        names,
        dict(compiled.params),
        tuple(_converter(compiled.binds[n].type) for n in names),
    )
    with _PREPARED_LOCK:
        _PREPARED[key] = (stmt, prepared)
        _PREPARED.move_to_end(key)
        while len(_PREPARED) > MAX_PREPARED:
            _PREPARED.popitem(last=False)
    return prepared


def execute(conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> None:
    """Run an INSERT or UPDATE for every row (executemany for several)."""
    prepared = _prepare(conn, stmt, tuple(rows[0]))
    seen: dict[datetime, str] = {}
    data = [prepared.args(r, seen) for r in rows]
    conn.exec_driver_sql(prepared.sql, data if len(data) > 1 else data[0])


def fetch_tuples(conn: Connection, stmt: Any, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a SELECT and return the driver's plain tuples (no Row objects)."""
    prepared = _prepare(conn, stmt)
    result = conn.exec_driver_sql(prepared.sql, prepared.args(params, {}))
    try:
        return result.cursor.fetchall()  # type: ignore[no-any-return]
    finally:
        result.close()


_TS_AT = tuple(i for i, c in enumerate(M.columns) if isinstance(c.type, UTCDateTime))
_JSON_AT = tuple(i for i, c in enumerate(M.columns) if isinstance(c.type, JSONDocument))


def mnest_values(raw: Sequence[Any]) -> list[Any]:
    """A ``mnests`` row as the SQLite driver returns it (the table's columns in order, as
    text), converted as the column types would: aware datetimes, JSON values."""
    values = list(raw)
    for i in _TS_AT:
        if values[i] is not None:
            values[i] = parse_sqlite_timestamp(values[i])
    for i in _JSON_AT:
        if values[i] is not None:
            values[i] = json.loads(values[i])
    return values


def mnest_mapping(raw: Sequence[Any]) -> dict[str, Any]:
    """:func:`mnest_values`, keyed by column name."""
    return dict(zip(MNEST_COLUMNS, mnest_values(raw), strict=True))
