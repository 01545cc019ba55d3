"""SQLite's home: everything this package does its own way on a SQLite store, behind the
:class:`~mnestoma.engines.backend.Backend` interface (the mechanics of its write lock and of
the files beside a store are in :mod:`~mnestoma.engines.locking`, its listeners in
:mod:`~mnestoma.engines.listeners`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine
from sqlalchemy.dialects import sqlite as sqlite_dialect

from mnestoma.core.errors import DriverCodes, register_driver_codes
from mnestoma.core.rules import BATCH_PAUSE_S
from mnestoma.engines import locking
from mnestoma.engines.backend import register_backend
from mnestoma.engines.build import make_sqlite_engine
from mnestoma.schema.runner import DriverPath, register_driver_path
from mnestoma.schema.sql.ager import sqlite_ager_statements
from mnestoma.schema.sql.spelling import Spelling, register_spelling

__all__ = ["SQLITE", "SQLiteBackend"]

# What SQLite's driver errors say (read by mnestoma.core.errors).
CODES = DriverCodes(
    busy_messages=("database is locked", "database is busy"),
    busy_explanation=(
        "SQLite could not give this write the write lock: another writer holds it, or "
        "the write runs in a transaction that had already read before it wrote (SQLite "
        "cannot upgrade that read snapshot once another writer committed). Begin the "
        "transaction with its first write: the package's writes do so themselves "
        "(BEGIN IMMEDIATE) unless the caller's transaction is already open."
    ),
    unreachable_messages=("unable to open database", "file is not a database"),
    unique_errornames=frozenset({"SQLITE_CONSTRAINT_UNIQUE"}),
)

# How SQLite's statements are spelled (read by mnestoma.schema.sql).
SPELLING = Spelling(
    insert=sqlite_dialect.insert,
    rowid=True,
    char="char",
    instr="instr",
    bytewise=None,  # SQLite compares text byte by byte
    underflow_raises=False,
    ranks_each_depth=False,
    skips_locked_rows=False,  # the ager holds the one write lock
    ager_statements=sqlite_ager_statements,
)


class SQLiteBackend:
    """A SQLite file: one writer at a time, the lock files beside the store, no partitions,
    no replicas."""

    name = "sqlite"
    sync_driver = "sqlite+pysqlite"
    async_driver = "sqlite+aiosqlite"
    bare_schemes = frozenset({"sqlite"})
    one_writer = True
    server = False
    partitioned = False
    replicas = False
    batch_pause_s = BATCH_PAUSE_S
    codes = CODES
    spelling = SPELLING

    def is_memory(self, url: URL) -> bool:
        """True for a database in memory, however the URL spells it."""
        return locking.memory_database(url)

    def store_files(self, url: URL) -> tuple[str, ...]:
        """The database file, SQLite's journals and this package's lock files."""
        return locking.sqlite_store_files(url)

    def store_missing(self, url: URL) -> bool:
        """True for a file URL whose file does not exist (reading must not create it)."""
        name = url.database
        if not name or name.startswith("file:") or self.is_memory(url):
            return False
        return not Path(name).expanduser().exists()

    def same_database(self, a: URL, b: URL) -> bool:
        """True when both URLs open one file (links followed)."""
        file = locking.beside_store(a, "")
        return file is not None and file == locking.beside_store(b, "")

    def snapshot_reader(self, engine: Engine) -> Engine:
        """``engine``: one read transaction is one snapshot."""
        return engine

    def build_engine(self, url: URL, secrets: Mapping[str, Any], **kwargs: Any) -> Engine:
        """The folder made, the busy timeout, the listeners (pysqlite has no passwords:
        ``secrets`` are ignored)."""
        return make_sqlite_engine(url, **kwargs)

    def missing_driver(self, url: URL, err: ImportError) -> str:
        return f"the driver of {url.drivername!r} is not installed: {err}"

    def take_write_lock(self, conn: Connection) -> None:
        """``BEGIN IMMEDIATE``, waiting for the lock (:func:`locking.take_write_lock`)."""
        locking.take_write_lock(conn)

    def idle_connection_alive(self, dbapi_connection: Any) -> bool:
        """True: a file's connection is not lost while it sits idle."""
        return True

    def lock_for_migration(self, conn: Connection) -> None:
        """The write lock: migrations wait for each other and for the writers."""
        locking.take_write_lock(conn)

    def track_writes(self, engine: Any) -> None:
        """A forked child refuses the writes its parent had in progress."""
        locking.track_writes(engine)

    def note_written(self, conn: Connection, at: datetime) -> None:
        """Nothing: no partitions."""

    def upkeep(self, target: Engine | Connection, *, now: datetime | None = None) -> None:
        """Nothing: no partitions."""

    def prepare_migration(self, conn: Connection) -> None:
        """Nothing: no schemas."""

    def prepare_store(self, engine: Engine) -> None:
        """A file store this package creates or migrates is put in WAL mode."""
        if self.is_memory(engine.url):
            return
        with engine.connect() as conn:
            locking.use_wal(conn)

    def lock_copy_target(self, conn: Connection) -> None:
        """Nothing: the copy's transaction holds the write lock."""

    def after_copy(self, conn: Connection) -> None:
        """Nothing: rowids follow the rows, and SQLite keeps no statistics of its own."""


SQLITE = SQLiteBackend()
register_driver_codes(CODES)
register_spelling(SQLITE.name, SPELLING)
register_driver_path(SQLITE.name, DriverPath(sync_drivers=None, observed_at_driver=True, bare=True))
register_backend(SQLITE)
