"""One way to run the package's statements: ``rows``, ``first``, ``scalars``, ``many``.

:func:`runner_for` chooses the implementation once per connection. :class:`StatementRunner`
lets SQLAlchemy Core run and convert everything. :class:`DriverRunner` (SQLite, and
PostgreSQL on psycopg) runs the same prebuilt statements at the driver: each is compiled
once (an LRU keyed by the statement object itself, so two statements can never share an
entry), and values are converted by the processors of their own column types
(``TypeEngine.dialect_impl(...).bind_processor`` and ``result_processor``), so a new typed
column is converted like any other. Statements with expanding parameters (``IN`` lists) go
through Core.

Where nobody observes the connection's statements (no engine or connection listener but
the package's own, no SQL logging), a statement runs on the driver's cursor directly, after
the package's own listener (SQLite's, which begins the transaction the statement needs):
SQLAlchemy's per-statement context and result set-up cost more than the database's own
work on the hot paths. As soon as a service adds a listener (its
tracing, its statement counter) or turns SQL logging on, every statement goes through
SQLAlchemy again and is seen there (SQLite: ``exec_driver_sql``; PostgreSQL: Core).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, cast

from sqlalchemy import ColumnDefault, Connection, CursorResult, Executable
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement
from sqlalchemy.types import TypeEngine

from mnestoma.core._sqla_compat import (
    dialect_error_hooks,
    listened,
    listeners_of,
    prefetch_columns,
)
from mnestoma.core.errors import StoreError, translate, translate_errors
from mnestoma.core.rules import WRITTEN_ROWS_KEPT
from mnestoma.core.types import UTCDateTime
from mnestoma.schema.sql.record import DATA_VERSION

__all__ = [
    "MAX_PREPARED",
    "DriverPath",
    "DriverRunner",
    "KeptRows",
    "StatementRunner",
    "as_mappings",
    "connection_of",
    "end_at_driver",
    "own_listener",
    "register_driver_path",
    "runner_for",
    "unobserved",
]

Processor = Callable[[Any], Any]
Params = Mapping[str, Any]
# The parameter sets of an executemany: mappings, or with ``Columns``, tuples in their order.
ParamRows = Sequence[Params] | Sequence[Sequence[Any]]
Columns = tuple[str, ...] | None
# One statement of a write, for its one row: (statement, the row's values, their columns).
WriteStep = tuple[Executable, Sequence[Any], tuple[str, ...]]
# Write steps converted as the driver takes them: (SQL, parameters) each.
ReadyWrites = list[tuple[str, "tuple[Any, ...] | dict[str, Any]"]]
# A read made ready before the write lock (StatementRunner.bind): the statement and its
# parameters, and at the driver its compiled form and the parameters as the driver takes them.
Bound = tuple[Executable, "Params | None", "_Prepared | None", Any]


@dataclass(frozen=True, slots=True)
class DriverPath:
    """Which connections of a dialect run the package's statements at the driver
    (:class:`DriverRunner`), as the engine's home registers it: this module names no engine."""

    # The drivers whose sync connections do; None: every driver of the dialect, async too.
    sync_drivers: frozenset[str] | None
    # Statements observed by a listener go at the driver too (else through Core: there,
    # exec_driver_sql would save nothing).
    observed_at_driver: bool
    # The server's own placeholders and a cursor that takes them as they are (psycopg's
    # RawCursor and ``$1``): a statement compiled so runs at the driver without the driver
    # rewriting its text at each execution (psycopg caches that rewriting only for texts of
    # at most 4,096 characters and 50 parameters, which a passing's one statement exceeds).
    native: tuple[str, Callable[[Any], Any]] | None = None
    # The driver's connection holds a transaction by itself (SQLite's ``BEGIN IMMEDIATE``,
    # sent by the write lock): an operation whose transaction is its own may run there
    # without SQLAlchemy's transaction around it (see :meth:`DriverRunner.ready`).
    bare: bool = False


_DRIVER_PATHS: dict[str, DriverPath] = {}


def register_driver_path(dialect: str, path: DriverPath) -> None:
    """Have :func:`runner_for` read ``path`` for ``dialect`` (done by its engine's home)."""
    _DRIVER_PATHS[dialect] = path


class StatementRunner:
    """Runs statements through SQLAlchemy Core on one connection; driver errors become the
    package's (:func:`~mnestoma.errors.translate_errors`)."""

    __slots__ = ("conn", "dialect")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.dialect: str = conn.dialect.name

    def ready(self, own: bool = False) -> None:
        """Do now what the first statement would do before running (nothing here); ``own``:
        the transaction is the operation's own, committed right after it."""

    def lock_held(self) -> None:
        """The operation's transaction holds the write lock from now on (nothing here)."""

    def plan(self, stmt: Executable, columns: tuple[str, ...] = ()) -> None:
        """Compile ``stmt`` now for the rows this runner will give it (``columns``: tuples in
        that order; () for a read or mappings): nothing to do here."""

    def plan_all(self, plans: Sequence[tuple[Executable, tuple[str, ...]]]) -> None:
        """:meth:`plan` each (statement, columns) of ``plans``."""
        for stmt, columns in plans:
            self.plan(stmt, columns)

    def bind(self, stmt: Executable, params: Params | None = None) -> Bound:
        """A read made ready now, to run later with :meth:`first_bound`: at the driver its
        parameters are converted now, before the write takes its lock (here, nothing)."""
        return (stmt, params, None, None)

    def first_bound(self, bound: Bound) -> tuple[Any, ...] | None:
        """:meth:`first` of a read :meth:`bind` made ready."""
        return self.first(bound[0], bound[1])

    def convert_instant(self, when: datetime, stmt: Executable, columns: tuple[str, ...]) -> None:
        """Convert ``when`` now as ``stmt`` binds its instants, for the statements that bind
        it later in this operation (before the write lock: a passing binds its "now" three
        times, inside it). Nothing here."""

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

    def first_committing(
        self, stmt: Executable, params: Params | None = None
    ) -> tuple[Any, ...] | None:
        """:meth:`first`, for a statement that ends its transaction: where it runs at
        psycopg's driver and nobody observes the connection's commits, the ``COMMIT`` is
        sent with it, in one round trip (pipeline mode),
        so that the row locks it takes are held for the statement and the commit only, and
        for no round trip of the client. Here, and wherever the statement does not run at
        the driver, the statement alone: the transaction's owner commits as ever (its commit
        finds the transaction already committed otherwise, and does nothing)."""
        return self.first(stmt, params)

    def many_committing(self, stmt: Executable, rows: ParamRows, columns: Columns = None) -> None:
        """:meth:`many`, for the last statement of a transaction that is the operation's
        own: where it runs at the driver and nobody observes the connection's commits, the
        ``COMMIT`` follows it there at once (through the dialect, as SQLAlchemy commits),
        so that the write lock is held for no step of the operation after its last
        statement. Elsewhere the statement alone: the transaction's owner commits as ever
        (its commit finds nothing left to commit otherwise)."""
        self.many(stmt, rows, columns)

    def stored_instant(self, when: datetime) -> Any:
        """``when`` as the operation's statements bound it at the driver (as SQLite stores
        it, and a lookup reads a late column), or None (not bound so: here)."""
        return None

    def kept_rows(self) -> KeptRows | None:
        """The rows this connection's own passings wrote (:class:`KeptRows`), for a write
        that commits at SQLite's driver with its last statement; None elsewhere (here)."""
        return None

    def ready_writes(self, steps: Sequence[WriteStep]) -> ReadyWrites | None:
        """The statements and rows of :meth:`writes` converted now, as the driver takes
        them, to be run later by :meth:`run_ready` (a write made ready before it takes the
        lock); None where :meth:`writes` would not run them at SQLite's driver (here)."""
        return None

    def run_ready(self, ready: ReadyWrites, *, commit: bool = False) -> None:
        """Run what :meth:`ready_writes` made ready, as :meth:`writes` would have."""
        raise NotImplementedError("only a write made ready at the driver runs so")

    def writes(self, steps: Sequence[WriteStep], *, commit: bool = False) -> None:
        """Run each step's statement once, for its one row (a tuple in its columns' order),
        in order: a write of several statements of one row each, such as a passing's row
        and its event. With ``commit`` the last is run as :meth:`many_committing` runs it."""
        for i, (stmt, row, columns) in enumerate(steps):
            if commit and i == len(steps) - 1:
                self.many_committing(stmt, [row], columns)
            else:
                self.many(stmt, [row], columns)

    def scalars(self, stmt: Executable, params: Params | None = None) -> list[Any]:
        """The first column of every row."""
        return [r[0] for r in self.rows(stmt, params)]

    def many(self, stmt: Executable, rows: ParamRows, columns: Columns = None) -> None:
        """Run an INSERT or UPDATE once per parameter set (executemany); no result. Each
        set is a mapping, or with ``columns``, a tuple of values in that order."""
        if not rows:
            return
        params = (
            as_mappings(columns, cast(Sequence[Sequence[Any]], rows))
            if columns is not None
            else list(cast(Sequence[Params], rows))
        )
        with translate_errors():
            self.conn.execute(stmt, params)


def _wrong_width(row: Sequence[Any], width: int) -> NoReturn:
    """Refuse a row given as a tuple whose length is not its columns' number."""
    raise StoreError(f"a row of {len(row)} values for its {width} columns")


def as_mappings(columns: tuple[str, ...], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """Rows given as tuples in ``columns`` order, as the mappings SQLAlchemy takes (the
    package's error for a row of the wrong length)."""
    if any(len(r) != len(columns) for r in rows):
        raise StoreError(f"a row whose number of values is not that of its {len(columns)} columns")
    return [dict(zip(columns, r, strict=True)) for r in rows]


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A statement compiled once for the driver: its text, its parameters in order with
    their literal values and processors, and the types of its result columns."""

    sql: str
    names: tuple[str, ...]
    defaults: dict[str, Any]
    # (position, bind processor, whether the parameter is an instant: a UTCDateTime, whose
    # processor gives the same for the same instant, in any statement of one dialect)
    converting: tuple[tuple[int, Processor, bool], ...]
    result_types: tuple[TypeEngine[Any], ...]
    dialect: Dialect
    named: bool  # the driver takes a dict (psycopg's ``%(name)s``), else a tuple
    # Parameters a row must give: bound without a value, or a column default SQLAlchemy
    # would compute at execution (a function); constant defaults are in ``defaults``.
    needed: frozenset[str]
    # The column order this statement was compiled for (empty for reads): rows given as
    # tuples come in this order.
    columns: tuple[str, ...]
    # The result processors, found from the driver's description of the first result: some
    # dialects (psycopg's numerics) choose a processor by the column's database type, which
    # one statement's text always gives the same. psycopg builds an object per column each
    # time its description is read, so it is read once.
    resolved: list[tuple[tuple[int, Processor], ...]] = field(default_factory=list)
    # What converts the rows of a result, written once from those processors (see
    # :meth:`converter`); None where no column needs converting.
    converters: list[Callable[[list[Any]], list[tuple[Any, ...]]] | None] = field(
        default_factory=list
    )
    # For rows given as tuples in ``columns`` order: what lists them in parameter order
    # and converts them, in one step (see :meth:`fused`).
    fusion: list[Callable[[Sequence[Any], dict[datetime, Any]], Any]] = field(default_factory=list)
    # The cursor the statement runs on, when compiled with the server's own placeholders
    # (see DriverPath.native); else the connection's.
    cursor: Callable[[Any], Any] | None = None

    def args(self, values: Params, seen: dict[datetime, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """One row of parameters as the driver takes them; ``seen`` converts each instant
        once (per operation)."""
        defaults = self.defaults
        return self.converted([values[n] if n in values else defaults[n] for n in self.names], seen)

    def check_columns(self, keys: Iterable[str]) -> None:
        """Refuse, before anything runs, rows that lack a parameter the statement needs
        (the driver would bind NULL where SQLAlchemy refuses) or that name one it does not
        have (a misspelt name would be silently left out)."""
        given = set(keys)
        missing = sorted(self.needed - given)
        unknown = sorted(given - set(self.names))
        if missing or unknown:
            raise StoreError(
                f"parameters do not fit the statement: missing {missing}, unknown {unknown}"
            )

    def fused(self) -> Callable[[Sequence[Any], dict[datetime, Any]], Any]:
        """For rows given as tuples in :attr:`columns` order: a row's values listed in
        parameter order and converted as :meth:`converted` converts them, by one function
        written once for this statement (each parameter read from its place in the row, or
        the statement's literal, and converted where its type converts it), as
        ``namedtuple`` and ``dataclasses`` write theirs. A passing's two rows and a turn's
        batches go through it: a third of the time of listing, then converting (0.5–0.7 µs
        against 1.6 for a passing's two rows)."""
        if self.fusion:
            return self.fusion[0]
        where = {name: i for i, name in enumerate(self.columns)}
        converting = {k: (convert, instant) for k, convert, instant in self.converting}
        scope: dict[str, Any] = {
            "_datetime": datetime,
            "_names": self.names,
            "_wrong": _wrong_width,
            "_width": len(self.columns),
        }
        body = ["    if len(row) != _width:", "        _wrong(row, _width)"]
        values = []
        for k, name in enumerate(self.names):
            if name in where:
                source = f"row[{where[name]}]"
            else:  # the statement's own literal, converted as a value of the row would be
                scope[f"_c{k}"] = self.defaults[name]
                source = f"_c{k}"
            if k not in converting:
                values.append(source)
                continue
            convert, instant = converting[k]
            scope[f"_f{k}"] = convert
            body.append(f"    x{k} = {source}")
            if instant:
                body += [
                    f"    if x{k} is not None:",
                    f"        if isinstance(x{k}, _datetime):",
                    f"            d = seen.get(x{k})",
                    "            if d is None:",
                    f"                d = seen[x{k}] = _f{k}(x{k})",
                    f"            x{k} = d",
                    "        else:",
                    f"            x{k} = _f{k}(x{k})",
                ]
            else:
                body.append(f"    if x{k} is not None:\n        x{k} = _f{k}(x{k})")
            values.append(f"x{k}")
        listed = "(" + "".join(f"{v}, " for v in values) + ")"
        body.append(
            f"    return dict(zip(_names, {listed}))" if self.named else f"    return {listed}"
        )
        source = "def fused(row, seen):\n" + "\n".join(body) + "\n"
        exec(compile(source, f"<row of {self.sql[:40]!r}>", "exec"), scope)
        made: Callable[[Sequence[Any], dict[datetime, Any]], Any] = scope["fused"]
        self.fusion[:] = [made]
        return made

    def converted(
        self, out: list[Any], seen: dict[datetime, Any]
    ) -> tuple[Any, ...] | dict[str, Any]:
        """Parameters in statement order, converted by their types' bind processors, as the
        driver takes them; ``seen`` converts each instant once (per operation)."""
        for i, convert, instant in self.converting:
            value = out[i]
            if value is None:
                continue
            if instant and isinstance(value, datetime):
                done = seen.get(value)
                if done is None:
                    done = seen[value] = convert(value)
                out[i] = done
            else:
                out[i] = convert(value)
        return dict(zip(self.names, out, strict=True)) if self.named else tuple(out)

    def results(self, cursor: Any) -> tuple[tuple[int, Processor], ...]:
        """The (column, result processor) pairs for this statement's rows."""
        if self.resolved:
            return self.resolved[0]
        codes = [d[1] for d in cursor.description or ()]
        pairs = []
        for i, (type_, code) in enumerate(zip(self.result_types, codes, strict=False)):
            process = type_.dialect_impl(self.dialect).result_processor(self.dialect, code)
            if process is not None:
                pairs.append((i, process))
        found = tuple(pairs)
        if codes:
            self.resolved[:] = [found]
        return found

    def fetch(self, cursor: Any) -> list[tuple[Any, ...]]:
        """The rows of an executed cursor, converted as their column types would be."""
        if not self.result_types and not cursor.description:
            return []  # no result set (a write without RETURNING)
        raw = cursor.fetchall()
        convert = self.converter(cursor)
        if convert is None:
            return cast(list[tuple[Any, ...]], raw)
        return convert(raw)

    def converter(self, cursor: Any) -> Callable[[list[Any]], list[tuple[Any, ...]]] | None:
        """What converts this statement's rows, each column that has a result processor
        through it (None left as it is), written once as one comprehension over the rows
        (as :meth:`fused` writes its rows): a third less than converting each row's list
        in a loop (a turn reads 50 rows of three instants each). None: no column needs it."""
        if self.converters:
            return self.converters[0]
        results = dict(self.results(cursor))
        width = len(cursor.description or ())
        if not results:
            made = None
        else:
            scope: dict[str, Any] = {f"_p{i}": process for i, process in results.items()}
            values = [
                f"(None if (v{i} := r[{i}]) is None else _p{i}(v{i}))"
                if i in results
                else f"r[{i}]"
                for i in range(width)
            ]
            source = "def convert(raw):\n    return [(" + ", ".join(values) + ",) for r in raw]\n"
            exec(compile(source, f"<rows of {self.sql[:40]!r}>", "exec"), scope)
            made = scope["convert"]
        if width:
            self.converters[:] = [made]
        return made


# Compiled statements, least recently used first out. Each entry holds its statement: while
# cached, its id() cannot be reused by another object, and the identity check makes a stale
# entry impossible even so.
MAX_PREPARED = 512
_PREPARED: OrderedDict[tuple[Any, ...], tuple[Executable, _Prepared | None]] = OrderedDict()
_PREPARED_LOCK = threading.Lock()


# The compiled statements of each sequence given to DriverRunner.plan_all, per kind of
# dialect and server; each entry holds its sequence (its id() stays its own while cached).
_PLAN_SETS: dict[
    tuple[Any, ...], tuple[Sequence[Any], dict[tuple[int, tuple[str, ...]], _Prepared | None]]
] = {}


# Each engine's dialect, copied once per placeholder style; a copy goes with its dialect
# (keyed by the object, not its id(), which a later engine's dialect could take over).
_NATIVE_DIALECTS: weakref.WeakKeyDictionary[Dialect, dict[str, Dialect]] = (
    weakref.WeakKeyDictionary()
)


def _natively(dialect: Dialect, paramstyle: str) -> Dialect:
    """``dialect`` compiling the server's own positional placeholders (a copy, made once)."""
    copies = _NATIVE_DIALECTS.setdefault(dialect, {})
    found = copies.get(paramstyle)
    if found is None:
        found = copy.copy(dialect)
        found.paramstyle = paramstyle
        found.positional = True
        copies[paramstyle] = found
    return found


def _compile(
    stmt: Executable, dialect: Dialect, column_keys: tuple[str, ...], native: bool
) -> _Prepared | None:
    """Compile for the driver; None when the statement needs Core (expanding parameters).
    ``native``: with the server's own placeholders where the dialect's driver path has them
    (run on its cursor for them); else as SQLAlchemy's cursor takes it (``exec_driver_sql``)."""
    path = _DRIVER_PATHS.get(dialect.name)
    cursor = None
    if native and path is not None and path.native is not None and not dialect.is_async:
        paramstyle, cursor = path.native
        dialect = _natively(dialect, paramstyle)
    element = cast(ClauseElement, stmt)
    compiled = cast(
        SQLCompiler, element.compile(dialect=dialect, column_keys=list(column_keys) or None)
    )
    binds = compiled.binds
    if any(b.expanding for b in binds.values()) or compiled.escaped_bind_names:
        return None
    named = compiled.positiontup is None
    names = tuple(compiled.params) if named else tuple(compiled.positiontup or ())
    result_types = tuple(c.type for c in getattr(stmt, "exported_columns", ()))
    converting = []
    for i, name in enumerate(names):
        type_ = binds[name].type
        process = type_.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            converting.append((i, process, isinstance(type_, UTCDateTime)))
    # Columns whose Python-side default SQLAlchemy computes at execution: a constant is
    # written in like a literal; any other default must be given by the rows.
    defaults = dict(compiled.params)
    computed = set()
    inserted, updated = prefetch_columns(compiled)
    for column in (*inserted, *updated):
        default = column.default if column in inserted else column.onupdate
        if isinstance(default, ColumnDefault) and default.is_scalar:
            defaults[column.key] = default.arg
        else:
            computed.add(column.key)
    needed = frozenset(n for n in names if binds[n].required or n in computed)
    prepared = _Prepared(
        compiled.string,
        names,
        defaults,
        tuple(converting),
        result_types,
        dialect,
        named,
        needed,
        column_keys,
        cursor=cursor,
    )
    if column_keys:  # a write: its rows give these names (as mapping keys or tuple columns)
        prepared.check_columns(column_keys)
    return prepared


def _prepare(
    conn: Connection, stmt: Executable, column_keys: tuple[str, ...], *, native: bool = False
) -> _Prepared | None:
    """``stmt`` compiled for the driver, from the cache; ``native``: for the driver runner's
    own cursor (see :func:`_compile`)."""
    dialect = conn.dialect
    # the same statement compiles differently for another dialect, driver or server
    key = (
        id(stmt),
        column_keys,
        type(dialect),
        dialect.paramstyle,
        dialect.server_version_info,
        native,
    )
    # A hit takes no lock (each OrderedDict call is atomic); an entry another thread evicted
    # meanwhile is still the right one to use.
    entry = _PREPARED.get(key)
    if entry is not None and entry[0] is stmt:
        with contextlib.suppress(KeyError):
            _PREPARED.move_to_end(key)
        return entry[1]
    prepared = _compile(stmt, conn.dialect, column_keys, native)
    with _PREPARED_LOCK:
        _PREPARED[key] = (stmt, prepared)
        _PREPARED.move_to_end(key)
        while len(_PREPARED) > MAX_PREPARED:
            _PREPARED.popitem(last=False)
    return prepared


# The package's own statement listeners (SQLite's write-lock listener): they do not count as
# somebody observing the statements. Registered with ``retval=True``, so that SQLAlchemy
# keeps the function itself in the engine's listener list.
_OWN_LISTENERS: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
_DRIVER_CONNECTIONS: tuple[type, ...] = (sqlite3.Connection,)
# The driver connections that can run a statement and its COMMIT in one round trip.
_PIPELINES: tuple[type, ...] = ()
_IDLE: Any = None  # psycopg's transaction status of a connection outside any transaction
try:
    import psycopg
except ImportError:  # pragma: no cover - PostgreSQL is an extra
    pass
else:
    _DRIVER_CONNECTIONS += (psycopg.Connection,)
    _PIPELINES += (psycopg.Connection,)
    _IDLE = psycopg.pq.TransactionStatus.IDLE


def own_listener(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as the package's own statement listener (see :func:`unobserved`)."""
    _OWN_LISTENERS.add(fn)
    return fn


# The events whose listeners watch a connection's statements (besides before_cursor_execute,
# where the package's own listener may be).
_STATEMENT_EVENTS = ("before_execute", "after_execute", "after_cursor_execute")


def unobserved(conn: Connection) -> bool:
    """True when nobody but the package watches this connection's statements: no engine
    or connection event listener of a service, no ``handle_error`` hook, no SQL logging."""
    if listened(conn, _STATEMENT_EVENTS):
        return False
    for fn in listeners_of(conn, "before_cursor_execute"):
        if fn not in _OWN_LISTENERS:
            return False
    if dialect_error_hooks(conn):
        return False
    return not conn.engine.logger.isEnabledFor(logging.INFO)


class DriverRunner(StatementRunner):
    """The same statements, compiled once and run at the driver, because on the hot paths
    (a passing, a turn's batched writes, the rows a turn or a walk reads) SQLAlchemy's
    per-statement and per-row processing costs more than the database's own work."""

    __slots__ = (
        "_bare",
        "_commits_here",
        "_core_fallback",
        "_dbapi",
        "_instants",
        "_locked",
        "_own",
        "_plans",
        "_unobserved",
    )

    def __init__(self, conn: Connection) -> None:
        super().__init__(conn)
        # Observed PostgreSQL statements go through Core: exec_driver_sql saves nothing there.
        self._core_fallback = not _DRIVER_PATHS[self.dialect].observed_at_driver
        # Asked once per runner, that is once per repository operation: SQLAlchemy's
        # listener collections are slow to inspect, and an operation's statements are
        # either all observed or none.
        self._unobserved: bool | None = None
        self._dbapi: Any = None
        self._commits_here: Any = None
        self._own: tuple[Callable[..., Any], ...] = ()
        self._locked = False
        self._bare = False
        # Each instant bound by the operation's statements, converted once: a passing binds
        # its now three times (ts_last, ts_weight, the event's ts).
        self._instants: dict[datetime, Any] = {}
        # Statements compiled (found in the cache) before the write lock was taken.
        self._plans: dict[tuple[int, tuple[str, ...]], _Prepared | None] = {}

    def plan(self, stmt: Executable, columns: tuple[str, ...] = ()) -> None:
        """Find ``stmt`` compiled (or compile it) now, for rows in ``columns`` order (() for a
        read, or mappings named as the statement's first row names them): a write looks its
        statements up before it takes the lock."""
        self._plans[(id(stmt), columns)] = _prepare(self.conn, stmt, columns, native=True)

    def plan_all(self, plans: Sequence[tuple[Executable, tuple[str, ...]]]) -> None:
        """:meth:`plan` each of ``plans`` (a write's statements, looked up at every write):
        the compiled statements of one such sequence are found once per kind of dialect and
        server, and held with it."""
        dialect = self.conn.dialect
        key = (id(plans), type(dialect), dialect.paramstyle, dialect.server_version_info)
        entry = _PLAN_SETS.get(key)
        if entry is None or entry[0] is not plans:
            found = {
                (id(stmt), cols): _prepare(self.conn, stmt, cols, native=True)
                for stmt, cols in plans
            }
            entry = (plans, found)
            with _PREPARED_LOCK:
                if len(_PLAN_SETS) >= MAX_PREPARED:
                    _PLAN_SETS.clear()
                _PLAN_SETS[key] = entry
        self._plans.update(entry[1])

    def _planned(self, stmt: Executable, columns: tuple[str, ...]) -> _Prepared | None:
        plans = self._plans
        key = (id(stmt), columns)
        if key in plans:
            return plans[key]
        return _prepare(self.conn, stmt, columns, native=True)

    def ready(self, own: bool = False) -> None:
        """Look now whether a statement may run at the driver, and begin SQLAlchemy's
        transaction: before a write takes its lock, so that none of it is done while other
        writers wait. With ``own`` (the transaction is the operation's own, a facade's
        write), where the driver holds a transaction by itself (:attr:`DriverPath.bare`) and
        nobody observes the connection's transactions, SQLAlchemy's is not begun: the
        transaction lives at the driver alone, begun by the write lock, committed by
        :meth:`many_committing` (else by its unit of work, :func:`end_at_driver`). SQLAlchemy's
        begin and commit around it were a few per cent of a passing's time."""
        self._bare = own and _DRIVER_PATHS[self.dialect].bare
        self._driver()

    def lock_held(self) -> None:
        """The transaction holds the write lock (``BEGIN IMMEDIATE`` on SQLite, see
        :func:`~mnestoma.engines.locking.take_write_lock`): the package's own listeners, which only
        begin the transaction a statement needs and note the write, have nothing left to do
        for the statements of this operation, and are no longer run before each."""
        self._own = ()
        self._locked = True

    def _driver(self) -> Any:
        """The driver's connection when a statement may run on it directly, else None."""
        if self._dbapi is not None:
            return self._dbapi
        conn = self.conn
        dbapi = conn.connection.dbapi_connection
        if not isinstance(dbapi, _DRIVER_CONNECTIONS):
            return None
        if self._unobserved is None:
            self._unobserved = unobserved(conn)
        if not self._unobserved:
            return None
        commits_seen = listened(conn, ("commit",))
        began = conn.in_transaction()
        # A transaction at the driver alone only where nobody would miss SQLAlchemy's: no
        # listener of its begin, commit or rollback, and none begun already.
        if self._bare and (began or commits_seen or listened(conn, ("begin", "rollback"))):
            self._bare = False
        if not self._bare:
            # Only the package's own listeners are left (SQLite's, which begins the
            # driver's transaction the way each statement needs): they run before each
            # statement here, as SQLAlchemy would run them, until the write lock is held (a
            # bare write takes it before its first statement).
            if not self._locked:
                self._own = tuple(listeners_of(conn, "before_cursor_execute"))
            if not began:
                with translate_errors():
                    conn.begin()  # what the first statement would do: commit() must see it
        # Where nobody observes the connection's commits, :meth:`first_committing` and
        # :meth:`many_committing` commit at the driver (the pool's proxy of the driver's
        # connection, looked up now, before any lock); else SQLAlchemy commits, after the
        # listeners.
        if not commits_seen:
            self._commits_here = conn.connection
        # An operation never ends its transaction midway: the rest of its statements can
        # run here too.
        self._dbapi = dbapi
        return dbapi

    def _at_driver(
        self, dbapi: Any, prepared: _Prepared, data: Any, many: bool, commit: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run ``prepared`` on a driver cursor, after the package's own listeners, as
        SQLAlchemy would run them; its rows (none for a write without RETURNING); with
        ``commit``, committed with it in one round trip (psycopg only,
        :func:`_committed_with`). A driver
        error is raised as the package's error, chained to SQLAlchemy's wrapper of it (as
        for the statements SQLAlchemy runs); a lost connection is invalidated."""
        sql = prepared.sql
        try:
            cursor = dbapi.cursor() if prepared.cursor is None else prepared.cursor(dbapi)
            try:
                for listener in self._own:
                    listener(self.conn, cursor, sql, data, None, many)
                if many:
                    cursor.executemany(sql, data)
                    return []
                if commit:
                    return _committed_with(dbapi, cursor, sql, data, prepared)
                cursor.execute(sql, data)
                return prepared.fetch(cursor)
            finally:
                cursor.close()
        except dbapi_errors(self.conn) as err:
            _raise_translated(self.conn, sql, data, err, dbapi)

    def rows(self, stmt: Executable, params: Params | None = None) -> list[tuple[Any, ...]]:
        prepared = self._planned(stmt, ())
        if prepared is None:
            return super().rows(stmt, params)
        return self._rows_of(stmt, params, prepared, None)

    def bind(self, stmt: Executable, params: Params | None = None) -> Bound:
        prepared = self._planned(stmt, ())
        if prepared is None:
            return (stmt, params, None, None)
        return (stmt, params, prepared, prepared.args(params or {}, self._instants))

    def first_bound(self, bound: Bound) -> tuple[Any, ...] | None:
        stmt, params, prepared, args = bound
        if prepared is None:
            return super().first(stmt, params)
        found = self._rows_of(stmt, params, prepared, args)
        return found[0] if found else None

    def convert_instant(self, when: datetime, stmt: Executable, columns: tuple[str, ...]) -> None:
        prepared = self._planned(stmt, columns)
        if prepared is None or when in self._instants:
            return
        for _, convert, instant in prepared.converting:
            if instant:
                self._instants[when] = convert(when)
                return

    def _rows_of(
        self, stmt: Executable, params: Params | None, prepared: _Prepared, args: Any
    ) -> list[tuple[Any, ...]]:
        """The rows of ``stmt`` compiled as ``prepared``, with ``args`` (its parameters as
        the driver takes them; None: converted now)."""
        dbapi = self._driver()
        if dbapi is None and self._core_fallback:
            return super().rows(stmt, params)
        if args is None:
            args = prepared.args(params or {}, self._instants)
        if dbapi is not None:
            return self._at_driver(dbapi, prepared, args, False)
        with translate_errors():
            result = self.conn.exec_driver_sql(prepared.sql, args)
            try:
                return prepared.fetch(result.cursor) if result.cursor else []
            finally:
                result.close()

    def first_committing(
        self, stmt: Executable, params: Params | None = None
    ) -> tuple[Any, ...] | None:
        prepared = self._planned(stmt, ())
        dbapi = None if prepared is None else self._driver()
        if (
            prepared is None
            or dbapi is None
            or self._commits_here is None  # a listener observes the commits
            or not isinstance(dbapi, _PIPELINES)
        ):
            return self.first(stmt, params)
        found = self._at_driver(
            dbapi, prepared, prepared.args(params or {}, self._instants), False, True
        )
        return found[0] if found else None

    def many_committing(self, stmt: Executable, rows: ParamRows, columns: Columns = None) -> None:
        self.many(stmt, rows, columns)
        self._commit_at_driver()

    def _commit_at_driver(self) -> None:
        """Commit at the driver, through the dialect as SQLAlchemy commits, where nobody
        observes the connection's commits (else the transaction's owner commits)."""
        fairy = self._commits_here
        if fairy is not None:
            conn = self.conn
            try:
                conn.dialect.do_commit(fairy)
            except dbapi_errors(conn) as err:
                _raise_translated(self.conn, "COMMIT", None, err, self._dbapi)

    def stored_instant(self, when: datetime) -> Any:
        return self._instants.get(when)

    def kept_rows(self) -> KeptRows | None:
        dbapi = self._driver()
        if type(dbapi) is not sqlite3.Connection or self._commits_here is None:
            return None  # observed, another driver, or committed by the transaction's owner
        info = self.conn.connection.info
        kept = info.get(_KEPT_ROWS_INFO)
        if kept is None or not kept.of(dbapi):  # none yet, or the record's connection is new
            kept = info[_KEPT_ROWS_INFO] = KeptRows(dbapi, self.conn)
        else:
            kept.conn = self.conn
        return cast(KeptRows, kept)

    def writes(self, steps: Sequence[WriteStep], *, commit: bool = False) -> None:
        """The steps on one driver cursor, each row converted before the first runs (a
        wrong row is refused with nothing run): the same statements as :meth:`many` for
        each, without its per-statement lookups, which timed at about 10 µs of a passing's
        105 (interleaved blocks, one process). Elsewhere (a statement Core must run, or
        not at SQLite's driver), as the base class runs them."""
        ready = self.ready_writes(steps)
        if ready is None:
            super().writes(steps, commit=commit)
            return
        self.run_ready(ready, commit=commit)

    def ready_writes(self, steps: Sequence[WriteStep]) -> ReadyWrites | None:
        dbapi = self._driver()
        if dbapi is None or not isinstance(dbapi, sqlite3.Connection):
            return None
        seen = self._instants
        ready: list[tuple[str, tuple[Any, ...] | dict[str, Any]]] = []
        for stmt, row, columns in steps:
            prepared = self._planned(stmt, columns)
            if prepared is None:
                return None
            ready.append((prepared.sql, prepared.fused()(row, seen)))
        return ready

    def run_ready(self, ready: ReadyWrites, *, commit: bool = False) -> None:
        dbapi = self._dbapi
        sql, data = "", None
        try:
            cursor = dbapi.cursor()
            try:
                for sql, data in ready:
                    for listener in self._own:
                        listener(self.conn, cursor, sql, data, None, False)
                    cursor.execute(sql, data)
            finally:
                cursor.close()
        except dbapi_errors(self.conn) as err:
            _raise_translated(self.conn, sql, data, err, dbapi)
        if commit:
            self._commit_at_driver()

    def many(self, stmt: Executable, rows: ParamRows, columns: Columns = None) -> None:
        if not rows:
            return
        keys = columns if columns is not None else tuple(cast(Params, rows[0]))
        prepared = self._planned(stmt, keys)
        dbapi = None if prepared is None else self._driver()
        if prepared is None or (dbapi is None and self._core_fallback):
            super().many(stmt, rows, columns)
            return
        seen = self._instants
        if columns is not None:
            fused = prepared.fused()
            data = [fused(r, seen) for r in cast(Sequence[Sequence[Any]], rows)]
        else:
            data = [prepared.args(r, seen) for r in cast(Sequence[Params], rows)]
        batch = data if len(data) > 1 else data[0]
        if dbapi is not None:
            self._at_driver(dbapi, prepared, batch, len(data) > 1)
            return
        with translate_errors():
            self.conn.exec_driver_sql(prepared.sql, batch)


# Connection info key: the connection's KeptRows.
_KEPT_ROWS_INFO = "mnestoma_kept_rows"


class KeptRows:
    """The rows a SQLite connection's own passings wrote and committed at the driver, by
    edge key, as the passing's lookup reads them; good only while SQLite says that nothing
    else has written to the store since: no other connection committed (``PRAGMA
    data_version``, read under the write lock, is unchanged) and this one changed no other
    row (its ``total_changes`` are what they were after that commit). A passing that finds
    its edge's row here needs no lookup while it holds the write lock: under eight writers
    on one edge, the process that let the lock go took it again for 92 % of the calls
    (measured), its row unchanged. A write that failed changed ``total_changes`` if it ran
    any statement, which forgets every row; one that ran none changed nothing."""

    __slots__ = ("_cursor", "_dbapi", "_rows", "_stamp", "_version", "conn")

    def __init__(self, dbapi: sqlite3.Connection, conn: Connection) -> None:
        self._dbapi = dbapi
        self._cursor = dbapi.cursor()  # kept: one cursor less to make under the lock
        self.conn = conn  # the operation's, for its errors
        self._rows: dict[Any, tuple[Any, ...]] = {}
        self._stamp: tuple[int, int] | None = None  # (data_version, total_changes)
        self._version: int | None = None

    def of(self, dbapi: Any) -> bool:
        """Whether these rows are those of the driver connection ``dbapi``."""
        return self._dbapi is dbapi

    def peek(self, key: Any) -> tuple[Any, ...] | None:
        """``key``'s row as kept, before the write lock: a guess, which :meth:`look` under the
        lock confirms or not."""
        return self._rows.get(key)

    def look(self, key: Any) -> tuple[Any, ...] | None:
        """Under the write lock: ``key``'s row as its lookup would read it now, or None
        (not kept, or the store changed since: every row is then forgotten)."""
        return self._rows.get(key) if self._unchanged() else None

    def look_many(self, keys: Iterable[Any]) -> dict[Any, tuple[Any, ...]]:
        """Under the write lock, for a write of several rows (a turn): those of ``keys`` kept,
        as their lookups would read them now (none where the store changed since)."""
        if not self._unchanged():
            return {}
        rows = self._rows
        return {key: row for key in keys if (row := rows.get(key)) is not None}

    def _unchanged(self) -> bool:
        """Under the write lock: whether nothing has written to the store since this
        connection's last kept write (else every row is forgotten). Notes SQLite's
        ``data_version`` for :meth:`wrote`."""
        dbapi = self._dbapi
        try:
            version = self._cursor.execute(DATA_VERSION).fetchone()[0]
        except sqlite3.Error as err:
            _raise_translated(self.conn, DATA_VERSION, (), err, dbapi)
        self._version = version
        if self._stamp != (version, dbapi.total_changes):
            self._stamp = None
            self._rows.clear()
            return False
        return True

    def wrote(self, key: Any, row: tuple[Any, ...] | None) -> None:
        """After the write that :meth:`look` began has committed at the driver: ``row`` is
        ``key``'s row as its lookup would read it now (None: not known here)."""
        if row is None:
            self.wrote_many({}, (key,))
        else:
            self.wrote_many({key: row}, ())

    def wrote_many(self, rows: dict[Any, tuple[Any, ...]], forgotten: Iterable[Any]) -> None:
        """After the write that :meth:`look` or :meth:`look_many` began has committed at the
        driver: ``rows`` by key as their lookups would read them now, and the keys whose
        rows are not known here (``forgotten``). Over ``WRITTEN_ROWS_KEPT`` rows, the others
        go."""
        version, self._version = self._version, None
        if version is None:
            return
        kept = self._rows
        for key in forgotten:
            kept.pop(key, None)
        kept.update(rows)
        if len(kept) > WRITTEN_ROWS_KEPT:
            kept.clear()
            if len(rows) <= WRITTEN_ROWS_KEPT:
                kept.update(rows)
        self._stamp = (version, self._dbapi.total_changes)


def _committed_with(
    dbapi: Any, cursor: Any, sql: str, data: Any, prepared: _Prepared
) -> list[tuple[Any, ...]]:
    """Run a statement that ends its transaction on psycopg's ``dbapi`` and commit it, in
    one round trip; its rows. When the transaction has sent nothing yet, the statement is
    sent alone in autocommit: the server runs it as a transaction of its own and commits
    it, with no ``BEGIN`` before it and no ``COMMIT`` after (one message, about half the
    client's time of a pipeline, measured). Otherwise the ``COMMIT`` follows it in one
    pipeline, as it does where the connection asks its transactions for an isolation level,
    read-only or deferrable (psycopg says so in the ``BEGIN``, which autocommit would leave
    out). A connection already in autocommit (an engine's ``AUTOCOMMIT`` isolation level)
    runs it as it is and stays so; one whose autocommit cannot be turned off again is
    closed, so that its pool never hands it out in autocommit."""
    if dbapi.autocommit:
        cursor.execute(sql, data)
        return prepared.fetch(cursor)
    if (
        dbapi.info.transaction_status != _IDLE
        or dbapi.isolation_level is not None
        or dbapi.read_only is not None
        or dbapi.deferrable is not None
    ):
        with dbapi.pipeline():
            cursor.execute(sql, data)
            dbapi.commit()
            return prepared.fetch(cursor)
    dbapi.autocommit = True
    try:
        cursor.execute(sql, data)
        return prepared.fetch(cursor)
    finally:
        try:
            dbapi.autocommit = False
        except Exception:  # a lost connection: its own error is the one raised
            dbapi.close()


def end_at_driver(conn: Connection, *, commit: bool) -> None:
    """Commit (or roll back) a transaction the driver holds that SQLAlchemy's ``conn`` does
    not know of (a write run bare, see :meth:`DriverRunner.ready`), through the dialect as
    SQLAlchemy ends one (the write's bookkeeping with it); nothing when there is none.
    Driver errors become the package's."""
    if conn.closed or conn.invalidated or conn.in_transaction():
        return
    fairy = conn.connection
    dbapi = fairy.dbapi_connection
    # only sqlite3's connections run bare (DriverPath.bare)
    if not isinstance(dbapi, sqlite3.Connection) or not dbapi.in_transaction:
        return
    dialect = conn.dialect
    try:
        (dialect.do_commit if commit else dialect.do_rollback)(fairy)
    except dbapi_errors(conn) as err:
        _raise_translated(conn, "COMMIT" if commit else "ROLLBACK", None, err, dbapi)


def _raise_translated(
    conn: Connection, sql: str, data: Any, err: Exception, dbapi: Any
) -> NoReturn:
    """Raise the driver error ``err`` (of ``conn``'s driver connection ``dbapi``) as the
    package's error, chained to SQLAlchemy's wrapper of it (as for the statements
    SQLAlchemy runs); a lost connection is invalidated."""
    dialect = conn.dialect
    wrapped = sa_exc.DBAPIError.instance(
        sql,
        data,
        err,
        dialect.loaded_dbapi.Error,
        connection_invalidated=dialect.is_disconnect(cast(Any, err), dbapi, None),
        dialect=dialect,
    )
    if isinstance(wrapped, sa_exc.DBAPIError) and wrapped.connection_invalidated:
        conn.invalidate(err)
    raise translate(wrapped) from wrapped


def dbapi_errors(conn: Connection) -> type[Exception]:
    """The base class of the connection's driver errors."""
    return cast(type[Exception], conn.dialect.loaded_dbapi.Error)


def connection_of(bind: Session | Connection) -> Connection:
    """The connection of ``bind``'s current transaction, a Session's pending ORM changes
    flushed first (returns at once when nothing is pending: no scan of the session)."""
    if isinstance(bind, Connection):
        return bind
    with translate_errors():
        bind.flush()
        return bind.connection()


def runner_for(conn: Connection) -> StatementRunner:
    """The statement runner for this connection's dialect and driver. A connection that renames
    schemas at execution (``schema_translate_map``) gets Core: the driver path runs the SQL
    as compiled once, without the renaming."""
    dialect = conn.dialect
    if conn.get_execution_options().get("schema_translate_map"):
        return StatementRunner(conn)
    path = _DRIVER_PATHS.get(dialect.name)
    if path is not None and (
        path.sync_drivers is None or (dialect.driver in path.sync_drivers and not dialect.is_async)
    ):
        return DriverRunner(conn)
    return StatementRunner(conn)
