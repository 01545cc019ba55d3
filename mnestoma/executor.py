"""One way to run the package's statements: ``rows``, ``first``, ``scalars``, ``many``.

:func:`executor_for` chooses the implementation once per connection. :class:`Executor`
lets SQLAlchemy Core run and convert everything. :class:`SQLiteExecutor` runs the same
prebuilt statements at the driver: each is compiled once (an LRU keyed by the statement
object itself, so two statements can never share an entry), and values are converted by
the processors of their own column types (``TypeEngine.dialect_impl(...).bind_processor``
and ``result_processor``), so a new typed column is converted like any other. Statements
with expanding parameters (``IN`` lists) go through Core on both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, Executable
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from .errors import translate_errors

__all__ = ["MAX_PREPARED", "Executor", "SQLiteExecutor", "executor_for"]

Processor = Callable[[Any], Any]
Params = Mapping[str, Any]


class Executor:
    """Runs statements through SQLAlchemy Core on one connection; driver errors become the
    package's (:func:`~mnestoma.errors.translate_errors`)."""

    __slots__ = ("conn", "dialect")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.dialect: str = conn.dialect.name

    def execute(
        self, stmt: Executable, params: Params | Sequence[Params] | None = None
    ) -> CursorResult[Any]:
        """Run one statement (once per parameter set when given a list) and return its
        result: rowcount, RETURNING rows."""
        with translate_errors():
            if params is None:
                return self.conn.execute(stmt)
            return self.conn.execute(stmt, params)

    def rows(self, stmt: Executable, params: Params | None = None) -> list[tuple[Any, ...]]:
        """Every row, as plain tuples of converted values in the statement's column order."""
        with translate_errors():
            result = (
                self.conn.execute(stmt, params) if params is not None else self.conn.execute(stmt)
            )
            return [tuple(r) for r in result]

    def first(self, stmt: Executable, params: Params | None = None) -> tuple[Any, ...] | None:
        """The first row, or None."""
        found = self.rows(stmt, params)
        return found[0] if found else None

    def scalars(self, stmt: Executable, params: Params | None = None) -> list[Any]:
        """The first column of every row."""
        return [r[0] for r in self.rows(stmt, params)]

    def many(self, stmt: Executable, rows: Sequence[Params]) -> None:
        """Run an INSERT or UPDATE once per parameter set (executemany); no result."""
        if not rows:
            return
        with translate_errors():
            self.conn.execute(stmt, list(rows))


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A statement compiled once for SQLite: its text, its parameters in order with their
    literal values and processors, and the processors of its result columns."""

    sql: str
    names: tuple[str, ...]
    defaults: dict[str, Any]
    converting: tuple[tuple[int, Processor], ...]  # (position, bind processor)
    results: tuple[tuple[int, Processor], ...]  # (column, result processor)

    def args(self, values: Params, seen: dict[datetime, Any]) -> tuple[Any, ...]:
        """One row of positional parameters; ``seen`` converts each instant once per batch."""
        defaults = self.defaults
        out = [values[n] if n in values else defaults[n] for n in self.names]
        for i, convert in self.converting:
            value = out[i]
            if value is None:
                continue
            if isinstance(value, datetime):
                done = seen.get(value)
                if done is None:
                    done = seen[value] = convert(value)
                out[i] = done
            else:
                out[i] = convert(value)
        return tuple(out)

    def convert(self, raw: list[Any]) -> list[tuple[Any, ...]]:
        """Rows as the driver returned them, converted as their column types would be."""
        if not self.results:
            return raw
        out = []
        for r in raw:
            values = list(r)
            for i, process in self.results:
                if values[i] is not None:
                    values[i] = process(values[i])
            out.append(tuple(values))
        return out


# Compiled statements, least recently used first out. Each entry holds its statement: while
# cached, its id() cannot be reused by another object, and the identity check makes a stale
# entry impossible even so.
MAX_PREPARED = 512
_PREPARED: OrderedDict[tuple[int, tuple[str, ...]], tuple[Executable, _Prepared | None]] = (
    OrderedDict()
)
_PREPARED_LOCK = threading.Lock()


def _compile(stmt: Executable, dialect: Dialect, column_keys: tuple[str, ...]) -> _Prepared | None:
    """Compile for the driver; None when the statement needs Core (expanding parameters)."""
    element = cast(ClauseElement, stmt)
    compiled = cast(
        SQLCompiler, element.compile(dialect=dialect, column_keys=list(column_keys) or None)
    )
    binds = compiled.binds
    if any(b.expanding for b in binds.values()):
        return None
    names = tuple(compiled.positiontup or ())
    columns = getattr(stmt, "exported_columns", ())
    results = []
    for i, column in enumerate(columns):
        process = column.type.dialect_impl(dialect).result_processor(dialect, None)
        if process is not None:
            results.append((i, process))
    converting = []
    for i, name in enumerate(names):
        process = binds[name].type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            converting.append((i, process))
    return _Prepared(
        compiled.string, names, dict(compiled.params), tuple(converting), tuple(results)
    )


def _prepare(conn: Connection, stmt: Executable, column_keys: tuple[str, ...]) -> _Prepared | None:
    key = (id(stmt), column_keys)
    with _PREPARED_LOCK:
        entry = _PREPARED.get(key)
        if entry is not None and entry[0] is stmt:
            _PREPARED.move_to_end(key)
            return entry[1]
    prepared = _compile(stmt, conn.dialect, column_keys)
    with _PREPARED_LOCK:
        _PREPARED[key] = (stmt, prepared)
        _PREPARED.move_to_end(key)
        while len(_PREPARED) > MAX_PREPARED:
            _PREPARED.popitem(last=False)
    return prepared


class SQLiteExecutor(Executor):
    """SQLite: the same statements, compiled once and run at the driver, because for a
    turn's batched writes and the rows a turn or a walk reads, SQLAlchemy's per-row and
    per-parameter processing costs more than SQLite's own work."""

    __slots__ = ()

    def rows(self, stmt: Executable, params: Params | None = None) -> list[tuple[Any, ...]]:
        prepared = _prepare(self.conn, stmt, ())
        if prepared is None:
            return super().rows(stmt, params)
        with translate_errors():
            result = self.conn.exec_driver_sql(prepared.sql, prepared.args(params or {}, {}))
            try:
                raw = cast(list[Any], result.cursor.fetchall()) if result.cursor else []
            finally:
                result.close()
        return prepared.convert(raw)

    def many(self, stmt: Executable, rows: Sequence[Params]) -> None:
        if not rows:
            return
        prepared = _prepare(self.conn, stmt, tuple(rows[0]))
        if prepared is None:
            super().many(stmt, rows)
            return
        seen: dict[datetime, Any] = {}
        data = [prepared.args(r, seen) for r in rows]
        with translate_errors():
            self.conn.exec_driver_sql(prepared.sql, data if len(data) > 1 else data[0])


def executor_for(conn: Connection) -> Executor:
    """The executor for this connection's dialect."""
    return SQLiteExecutor(conn) if conn.dialect.name == "sqlite" else Executor(conn)
