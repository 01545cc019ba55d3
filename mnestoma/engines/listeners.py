"""The listeners of a SQLite engine: how each transaction begins (the write lock before a
write, a read snapshot before a read) and each connection's settings."""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from sqlalchemy import Connection, Engine, event

from mnestoma.engines.locking import (
    RESTS_AT_STATEMENTS,
    SNAPSHOT_INFO,
    driver_in_transaction,
    is_transaction_control,
    is_write_statement,
    rest_before_statement,
    rest_busy_timeout,
    take_write_lock,
    write_begins,
)
from mnestoma.schema.runner import own_listener

__all__ = ["WRITE_OPTION", "configure_sqlite"]

# Execution option: on SQLite, transactions begin with the write lock whatever they run first
# (for a caller's own read-then-write transactions).
WRITE_OPTION = "mnestoma_write"


def configure_sqlite(engine: Engine, *, busy_timeout_ms: int) -> None:
    """The pysqlite recipe: the driver never begins a transaction itself; this package does.

    A transaction begins at its first statement: with ``BEGIN IMMEDIATE`` (waiting for the
    write lock) when that statement writes or the connection has ``WRITE_OPTION``, else
    with a plain ``BEGIN``: a read snapshot that takes no lock (in WAL mode it never waits
    for a writer). The package's own writes take the lock before they read anything.
    Per-connection settings only: nothing here changes the file (the journal mode is set
    when the package creates or migrates a store).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()
        rest_busy_timeout(record.info, busy_timeout_ms)
        try:
            dbapi_conn.execute("SELECT exp(0.0)").fetchone()
        except sqlite3.OperationalError:
            # SQLite built without its math functions: the ager's SQL needs exp().
            dbapi_conn.create_function("exp", 1, _safe_exp, deterministic=True)

    @own_listener
    def _before_execute(
        conn: Connection, _cursor: Any, statement: str, parameters: Any, *_args: Any
    ) -> tuple[str, Any]:
        _begin_for(conn, statement)
        return statement, parameters

    # retval=True keeps the function itself in the listener list, where the statement runner
    # recognises it as the package's own (see runner.unobserved)
    event.listen(engine, "before_cursor_execute", _before_execute, retval=True)
    setattr(engine.dialect, RESTS_AT_STATEMENTS, True)  # see _begin_for


def _begin_for(conn: Connection, statement: str) -> None:
    """Begin SQLite's transaction the way ``statement`` needs: the write lock before a write,
    a read snapshot before a read (see :mod:`mnestoma.engines.locking`)."""
    dbapi_conn = conn.connection.dbapi_connection
    if dbapi_conn is None:
        return
    # A write of the package's that held the lock left its busy timeout of 0: every other
    # statement waits the lock timeout (the write's own statements do not come here).
    rest_before_statement(dbapi_conn, conn.connection.info)
    if not conn.in_transaction():
        return
    if driver_in_transaction(dbapi_conn):
        if is_write_statement(statement):
            write_begins(dbapi_conn, conn)  # at once when its write is already noted
            conn.connection.info.pop(SNAPSHOT_INFO, None)  # no longer read-only
        return
    if is_write_statement(statement) or conn.get_execution_options().get(WRITE_OPTION):
        take_write_lock(conn)
    elif not is_transaction_control(statement):
        dbapi_conn.execute("BEGIN")
        conn.connection.info[SNAPSHOT_INFO] = True


def _safe_exp(x: float | None) -> float | None:
    if x is None:
        return None
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf
