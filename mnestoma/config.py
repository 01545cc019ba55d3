"""Where the database is (contract §3) and how engines and sessions are built."""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from .errors import InvalidInput
from .locking import SNAPSHOT_INFO, is_transaction_control, is_write_statement, take_write_lock

__all__ = [
    "READ_ONLY_OPTION",
    "WRITE_OPTION",
    "default_sqlite_path",
    "make_engine",
    "make_session_factory",
    "redact_url",
    "resolve_database_url",
]

ENV_DATABASE_URL = "MNESTOMA_DATABASE_URL"
ENV_DB_PATH = "MNESTOMA_DB_PATH"
ENV_WORKSPACE = "METNOS_WORKSPACE"
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Execution option: a transaction that only reads begins with a plain (deferred) BEGIN.
READ_ONLY_OPTION = "mnestoma_read_only"  # kept for callers of 0.1; reads never lock now
# Execution option: on SQLite, transactions begin with the write lock whatever they run first
# (for a caller's own read-then-write transactions).
WRITE_OPTION = "mnestoma_write"


def default_sqlite_path() -> Path:
    """The embedded default: ``$METNOS_WORKSPACE/.mnestoma/mnest.sqlite`` or ``./.mnestoma/...``."""
    workspace = os.environ.get(ENV_WORKSPACE)
    base = Path(workspace) if workspace else Path.cwd()
    return base / ".mnestoma" / "mnest.sqlite"


def resolve_database_url(url: str | URL | None = None) -> URL:
    """The database URL by the contract's order: argument, env URL, env path, workspace, cwd."""
    if url is not None and str(url).strip():
        return _parse(url)
    env_url = os.environ.get(ENV_DATABASE_URL, "").strip()
    if env_url:
        return _parse(env_url)
    env_path = os.environ.get(ENV_DB_PATH, "").strip()
    path = Path(env_path).expanduser() if env_path else default_sqlite_path()
    return URL.create("sqlite+pysqlite", database=str(path.absolute()))


def _parse(url: str | URL) -> URL:
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        raise InvalidInput(f"not a database URL: {redact_text(str(url))!r}") from None
    # A bare postgresql:// would pick psycopg2; this package speaks psycopg 3.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "sqlite":
        parsed = parsed.set(drivername="sqlite+pysqlite")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidInput(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql"
        )
    return parsed


def redact_url(url: str | URL) -> str:
    """The URL as text with its password hidden."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except ArgumentError:
        return redact_text(str(url))
    return parsed.render_as_string(hide_password=True)


def redact_text(text: str) -> str:
    """Hide anything that looks like ``user:password@`` inside free text."""
    import re

    return re.sub(r"(://[^:/@\s]*):[^@\s]*@", r"\1:***@", text)


def is_sqlite(url_or_engine: URL | Engine) -> bool:
    """True for a SQLite URL or engine."""
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else url_or_engine
    return url.get_backend_name() == "sqlite"


def is_memory_sqlite(url: URL) -> bool:
    """True for an in-memory SQLite database (which every connection would see empty)."""
    return is_sqlite(url) and (not url.database or url.database == ":memory:")


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An Engine for ``url`` (or the resolved default), configured as contract §3 says.

    SQLite: the parent folder is created (0700), a busy timeout, foreign keys, and every
    write transaction begins with ``BEGIN IMMEDIATE`` (see :mod:`mnestoma.locking`); reads
    take no lock. PostgreSQL: psycopg 3 with pre-ping.
    """
    resolved = resolve_database_url(url)
    if is_sqlite(resolved):
        return _make_sqlite_engine(resolved, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(resolved, **kwargs)


def _make_sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    if not is_memory_sqlite(url) and url.database and not url.database.startswith("file:"):
        parent = Path(url.database).expanduser().absolute().parent
        if not parent.exists():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
    connect_args.setdefault("check_same_thread", False)
    engine = create_engine(url, connect_args=connect_args, **kwargs)
    _configure_sqlite(engine, busy_timeout_ms=int(float(connect_args["timeout"]) * 1000))
    return engine


def _configure_sqlite(engine: Engine, *, busy_timeout_ms: int) -> None:
    """The pysqlite recipe: the driver never begins a transaction itself; this package does.

    A transaction begins at its first statement: with ``BEGIN IMMEDIATE`` (waiting for the
    write lock) when that statement writes or the connection has ``WRITE_OPTION``, else
    with a plain ``BEGIN``: a read snapshot that takes no lock (in WAL mode it never waits
    for a writer). The package's own writes take the lock before they read anything.
    Per-connection settings only: nothing here changes the file (the journal mode is set
    when the package creates or migrates a store).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()
        try:
            dbapi_conn.execute("SELECT exp(0.0)").fetchone()
        except sqlite3.OperationalError:
            # SQLite built without its math functions: the ager's SQL needs exp().
            dbapi_conn.create_function("exp", 1, _safe_exp, deterministic=True)

    @event.listens_for(engine, "before_cursor_execute")
    def _before_execute(conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if not conn.in_transaction():
            return
        dbapi_conn = conn.connection.dbapi_connection
        if dbapi_conn is None:
            return
        if dbapi_conn.in_transaction:
            if is_write_statement(statement):
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


def make_session_factory(engine: Engine, **kwargs: Any) -> sessionmaker[Session]:
    """A ``sessionmaker`` bound to ``engine``; objects stay readable after commit."""
    kwargs.setdefault("expire_on_commit", False)
    return sessionmaker(bind=engine, **kwargs)
