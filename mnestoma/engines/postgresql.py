"""PostgreSQL's home: everything this package does its own way on a PostgreSQL store,
behind the :class:`~mnestoma.engines.backend.Backend` interface (its month partitions are
in :mod:`~mnestoma.engines.partitions`, its read replicas in :mod:`~mnestoma.engines.replicas`)."""

from __future__ import annotations

import select
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import URL, Connection, Engine, text
from sqlalchemy.dialects import postgresql as pg_dialect

from mnestoma.core._sqla_compat import replace_dialect_method
from mnestoma.core.errors import (
    INSUFFICIENT_PRIVILEGE,
    LOCK_NOT_AVAILABLE,
    UNIQUE_VIOLATION,
    DriverCodes,
    register_driver_codes,
)
from mnestoma.engines import partitions
from mnestoma.engines.backend import register_backend
from mnestoma.engines.build import make_server_engine
from mnestoma.engines.locking import MIGRATION_LOCK_KEY
from mnestoma.schema.runner import DriverPath, register_driver_path
from mnestoma.schema.sql.ager import postgresql_ager_statements
from mnestoma.schema.sql.copying import POSTGRESQL_ANALYZE, POSTGRESQL_LOCK, POSTGRESQL_RESET_IDS
from mnestoma.schema.sql.spelling import Spelling, register_spelling

__all__ = ["POSTGRESQL", "PostgreSQLBackend", "ping_when_stirred"]

# What psycopg's errors carry (read by mnestoma.core.errors): SQLSTATEs, and libpq's words
# for a server that cannot be reached.
CODES = DriverCodes(
    unreachable_messages=(
        "connection refused",
        "could not connect",
        "connection failed",
        "server closed the connection",
        "terminating connection",
        "consuming input failed",
    ),
    # serialization_failure, deadlock_detected, and a unique violation of a concurrent insert
    retryable_sqlstates=frozenset({"40001", "40P01", UNIQUE_VIOLATION}),
    unique_sqlstates=frozenset({UNIQUE_VIOLATION}),
    lock_not_available_sqlstates=frozenset({LOCK_NOT_AVAILABLE}),
    insufficient_privilege_sqlstates=frozenset({INSUFFICIENT_PRIVILEGE}),
)

# How PostgreSQL's statements are spelled (read by mnestoma.schema.sql).
SPELLING = Spelling(
    insert=pg_dialect.insert,
    rowid=False,
    char="chr",
    instr="strpos",
    bytewise="C",  # the database's own collation may order B and a otherwise
    underflow_raises=True,
    ranks_each_depth=True,
    skips_locked_rows=True,
    ager_statements=postgresql_ager_statements,
)


class PostgreSQLBackend:
    """A PostgreSQL server: row locks (no write lock of the store's), advisory locks for
    migrations, events partitioned by month, read replicas."""

    name = "postgresql"
    sync_driver = "postgresql+psycopg"
    async_driver = "postgresql+psycopg"  # psycopg 3's async dialect on an async engine
    bare_schemes = frozenset({"postgresql", "postgres"})  # a bare one would pick psycopg2
    one_writer = False
    server = True
    partitioned = True
    replicas = True
    batch_pause_s = 0.0  # a writer's rows never wait for a prune's batch
    codes = CODES
    spelling = SPELLING

    def is_memory(self, url: URL) -> bool:
        """False: a server's database outlives its connections."""
        return False

    def store_files(self, url: URL) -> tuple[str, ...]:
        """(): the server keeps the files."""
        return ()

    def store_missing(self, url: URL) -> bool:
        """False: only the server can say."""
        return False

    def same_database(self, a: URL, b: URL) -> bool:
        """True when both URLs name one database of one server."""
        keys = ("host", "port", "database")
        return all(getattr(a, k) == getattr(b, k) for k in keys)

    def snapshot_reader(self, engine: Engine) -> Engine:
        """``engine`` reading in one repeatable-read, read-only snapshot across its tables."""
        return engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)

    def build_engine(self, url: URL, secrets: Mapping[str, Any], **kwargs: Any) -> Engine:
        """psycopg 3 with pre-ping (a round trip only for a connection whose socket stirred
        while it was idle, see :func:`ping_when_stirred`), the URL's secrets passed as
        connect_args."""
        engine = make_server_engine(url, secrets, **kwargs)
        ping_when_stirred(engine)
        return engine

    def missing_driver(self, url: URL, err: ImportError) -> str:
        return (
            f"the PostgreSQL driver of {url.drivername!r} is not installed "
            f'({err}): pip install "mnestoma[postgresql]" (psycopg 3)'
        )

    def take_write_lock(self, conn: Connection) -> None:
        """Nothing: row locks do the job."""

    def idle_connection_alive(self, dbapi_connection: Any) -> bool:
        """Idle, healthy and its socket silent (see :func:`ping_when_stirred`)."""
        return _quiet(dbapi_connection)

    def lock_for_migration(self, conn: Connection) -> None:
        """A transaction-scoped advisory lock (the key of the migrations' session lock, so
        either waits for the other)."""
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})

    def track_writes(self, engine: Any) -> None:
        """Nothing: a forked child's own pool is enough."""

    def note_written(self, conn: Connection, at: datetime) -> None:
        """``at``'s month made after the commit when it is not known made."""
        partitions.note_written(conn, at)

    def upkeep(self, target: Engine | Connection, *, now: datetime | None = None) -> None:
        """The months due made (:func:`partitions.upkeep`)."""
        partitions.upkeep(target, now=now)

    def prepare_migration(self, conn: Connection) -> None:
        """``CREATE SCHEMA IF NOT EXISTS`` for the first schema of ``search_path`` (not
        $user), under the migration lock: two first migrations never race to create it."""
        path = conn.execute(text("SHOW search_path")).scalar_one()
        names = [n.strip() for n in str(path).split(",") if n.strip()]
        names = [n for n in names if n not in ('"$user"', "$user")]
        if not names:
            return
        first = names[0]
        schema = first[1:-1].replace('""', '"') if first.startswith('"') else first
        exists = conn.execute(
            text("SELECT 1 FROM pg_namespace WHERE nspname = :n"), {"n": schema}
        ).first()
        if exists is None:
            quoted = conn.dialect.identifier_preparer.quote_identifier(schema)
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted}"))

    def prepare_store(self, engine: Engine) -> None:
        """Nothing: the server's settings are its own."""

    def lock_copy_target(self, conn: Connection) -> None:
        """The target's tables locked against other writers for the copy's transaction."""
        conn.execute(POSTGRESQL_LOCK)

    def after_copy(self, conn: Connection) -> None:
        """Identity sequences past every id; statistics, so that the first ager plans well."""
        for reset in POSTGRESQL_RESET_IDS:
            conn.execute(reset)
        conn.execute(POSTGRESQL_ANALYZE)


# libpq's CONNECTION_OK and PQTRANS_IDLE (psycopg.pq.ConnStatus.OK, TransactionStatus.IDLE).
_CONNECTION_OK = 0
_IDLE = 0


def ping_when_stirred(engine: Engine) -> None:
    """Have the pool's pre-ping send its ``SELECT 1`` only to a connection that may be dead.

    A checked-in connection is idle: the server sends it nothing unless something happened
    (its backend terminated or the server shut down: an error and the end of the stream; a
    notification; a changed setting). So a connection whose libpq status is OK, outside any
    transaction, whose socket has nothing to read and no hang-up, is alive as far as a ping
    could tell without waiting for the network; anything else gets the real ping, and a
    failed one the pool's usual replacement. The round trip saved is most of a short
    write's overhead (docs/performance.md)."""
    dialect = engine.dialect
    replace_dialect_method(dialect, "do_ping", _quiet_or(dialect.do_ping))


def _quiet_or(ping: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def do_ping(dbapi_connection: Any) -> bool:
        return _quiet(dbapi_connection) or ping(dbapi_connection)

    return do_ping


def _quiet(dbapi_connection: Any) -> bool:
    """True when psycopg's connection is idle, healthy and its socket silent (see
    :func:`ping_when_stirred`); False whenever that cannot be told."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is None:
        return False
    try:
        if pgconn.status != _CONNECTION_OK or pgconn.transaction_status != _IDLE:
            return False
        fd = pgconn.socket
    except Exception:  # psycopg's OperationalError: a closed connection has no socket
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


def _native_placeholders() -> tuple[str, Any] | None:
    """``$1`` placeholders, run on psycopg's RawCursor, which sends them as they are (from
    psycopg 3.2); None with an older psycopg, whose cursor rewrites ``%(name)s`` instead."""
    try:
        from psycopg import RawCursor
    except ImportError:  # psycopg missing (an extra), or older than 3.2
        return None
    return "numeric_dollar", RawCursor


POSTGRESQL = PostgreSQLBackend()
register_driver_codes(CODES)
register_spelling(POSTGRESQL.name, SPELLING)
register_driver_path(
    POSTGRESQL.name,
    DriverPath(
        sync_drivers=frozenset({"psycopg"}),
        observed_at_driver=False,
        native=_native_placeholders(),
    ),
)
register_backend(POSTGRESQL)
