"""The migration door: run the packaged Alembic scripts, read current and head revisions."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from mnestoma.core.errors import (
    ConflictError,
    InvalidInput,
    SchemaError,
    is_lock_not_available,
    translate_errors,
)
from mnestoma.core.validation import check_name
from mnestoma.engines import (
    ENV_DATABASE_URL,
    ENV_DB_PATH,
    ENV_WORKSPACE,
    backend_of,
    make_engine,
    redact_url,
    sync_database_url,
)
from mnestoma.engines.locking import MIGRATION_LOCK_KEY
from mnestoma.maintenance.seed_repair import repair_before_upgrade
from mnestoma.schema.models import VIEW_NAME, Base
from mnestoma.schema.sql.partitions import LAYOUT_NAMES, PARTITION_NAME, is_layout_name
from mnestoma.schema.sql.partman import PARTMAN_NAME

_getcurrent: Callable[[], object] | None
try:  # SQLAlchemy's asyncio support runs on greenlets
    from greenlet import getcurrent as _found  # type: ignore[import-untyped]

    _getcurrent = _found
except ImportError:  # pragma: no cover - no async support
    _getcurrent = None

__all__ = [
    "DEFAULT_MIGRATION_LOCK_TIMEOUT_S",
    "ENV_MIGRATION_LOCK_TIMEOUT",
    "HANDED",
    "LEGACY_VERSION_TABLE",
    "MIGRATION_LOCK_RETRIES",
    "STORE_NAMES",
    "VERSION_TABLE",
    "MigrationReport",
    "adopt_legacy_version",
    "alembic_config",
    "checkout_database_url",
    "compared_objects",
    "current_revision",
    "downgrade",
    "ensure_at_head",
    "handed_connection",
    "head_revision",
    "include_name",
    "include_object",
    "is_lock_not_available",
    "is_store_name",
    "lock_timeout_sql",
    "migration_lock_timeout",
    "migrations_path",
    "missing_sqlite_file",
    "note_left",
    "offline_sql",
    "prepare_for_migration",
    "read_revision",
    "retry_lock_timeouts",
    "revision_session",
    "sqlite_store_missing",
    "sync_database_url",
    "upgrade",
]

# The package's own Alembic version table: a service's alembic_version is not ours.
VERSION_TABLE = "mnestoma_alembic_version"
LEGACY_VERSION_TABLE = "alembic_version"

# PostgreSQL: how long one revision's statement waits for a table lock before its transaction
# gives up (and is tried again); writers queued behind that lock wait at most as long.
ENV_MIGRATION_LOCK_TIMEOUT = "MNESTOMA_MIGRATION_LOCK_TIMEOUT"
DEFAULT_MIGRATION_LOCK_TIMEOUT_S = 3.0
# A revision whose lock times out is tried again this many times, pausing between attempts
# from the first pause, doubling, up to the longest.
MIGRATION_LOCK_RETRIES = 10
FIRST_RETRY_PAUSE_S = 0.1
LONGEST_RETRY_PAUSE_S = 3.0
# How often a migrator waiting for another's migration lock asks for it again (PostgreSQL).
MIGRATION_LOCK_POLL_S = 0.1

logger = logging.getLogger("mnestoma.migration")  # the logger's public name

# Every name the store owns in a database: its tables (from the models, so that a table
# added there is covered), its view and its version table. On PostgreSQL it owns what it
# builds beside them too (see is_store_name).
STORE_NAMES = frozenset(Base.metadata.tables) | {VIEW_NAME, VERSION_TABLE}


def is_store_name(name: str | None) -> bool:
    """True for a table or view of the store's: :data:`STORE_NAMES`, and on PostgreSQL
    ``event_turn_edges``, the partitions of ``events`` at every level (``events_YYYYMM``
    and its leaves ``events_YYYYMM_created`` and ``events_YYYYMM_rest``,
    ``events_to_YYYYMM`` and its leaf ``events_to_YYYYMM_default``, ``events_default``) and
    the tables a prune left behind if it stopped halfway (contract §12)."""
    return name is not None and (name in STORE_NAMES or is_layout_name(name))


def include_name(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
    """Alembic's ``include_name`` hook for a service's own ``env.py``: its autogenerate
    then skips the store's tables (their columns, indexes, constraints), view, version
    table and partitions (:func:`is_store_name`), and still sees everything else."""
    if type_ == "schema":
        return True
    if type_ == "table":
        return not is_store_name(name)
    return not is_store_name(parent_names.get("table_name"))


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic's ``include_object`` hook for a service's own ``env.py``: the same choice as
    :func:`include_name`, made on the objects themselves."""
    if type_ == "table":
        return not is_store_name(name)
    table = getattr(obj, "table", None)
    return not is_store_name(getattr(table, "name", None))


def compared_objects(dialect: str) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """The ``include_object`` hook of a comparison of the models with a store (autogenerate,
    ``compare_metadata``) on ``dialect``: the view is left out (the revisions manage it by
    hand), and so is what exists on one engine only. On PostgreSQL the partitions of
    ``events`` and ``event_turn_edges`` are built beside the models' tables (revision 0011,
    or ``create_all`` through the models' DDL events; a test compares the two), and an
    index or constraint the models give another engine only (``ux_events_turn_edge``,
    SQLite's) is not expected."""
    partition = re.compile(f"{PARTITION_NAME}|{PARTMAN_NAME}")  # pg_partman's months too

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if type_ == "table" and name == VIEW_NAME:
            return False
        layout = name is not None and (name in LAYOUT_NAMES or partition.match(name))
        if type_ == "table" and reflected and layout:
            return False
        ddl_if = getattr(obj, "_ddl_if", None)
        return not (ddl_if is not None and ddl_if.dialect not in (None, dialect))

    return include


def migrations_path() -> Path:
    """Where the Alembic scripts are: inside the installed wheel, else the checkout's."""
    package = Path(__file__).resolve().parent.parent  # mnestoma/, above maintenance/
    packaged = package / "migrations"
    if (packaged / "env.py").is_file():
        return packaged
    checkout = package.parent / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise SchemaError("the migration scripts are missing from this installation")


def alembic_config(
    bind: Engine | Connection | None = None, *, stdout: TextIO | None = None
) -> Config:
    """An Alembic Config for the packaged scripts, optionally handing over a connection."""
    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(migrations_path()))
    cfg.attributes["skip_logging"] = True
    if bind is not None:
        cfg.attributes[HANDED] = bind
    return cfg


# The key of ``Config.attributes`` through which a caller hands env.py what to migrate.
HANDED = "connection"


@contextmanager
def handed_connection(handed: object) -> Iterator[tuple[Connection, bool]]:
    """The Connection to migrate on, from what a caller put in ``config.attributes``, and
    whether env.py owns it (opened it, so commits it): an Engine (owned), a Connection,
    or an object whose ``connect()`` returns a context manager yielding a Connection (a
    wrapper around the caller's connection: the caller's). Anything else is InvalidInput,
    before anything is migrated: what was handed is never swapped for the environment's
    database."""
    if isinstance(handed, Connection):
        yield handed, False
        return
    if isinstance(handed, Engine):
        with handed.connect() as conn:
            yield conn, True
        return
    connect = getattr(handed, "connect", None)
    if not callable(connect):
        raise InvalidInput(_not_connectable(handed, "it has no connect()"))
    opened = connect()
    if not isinstance(opened, AbstractContextManager):
        raise InvalidInput(
            _not_connectable(
                handed,
                "its connect() returns no context manager (an async engine? hand its URL to "
                "mnestoma.upgrade, which migrates through the sync driver)",
            )
        )
    with opened as conn:
        if not isinstance(conn, Connection):
            raise InvalidInput(
                _not_connectable(handed, f"its connect() yields a {type(conn).__name__}")
            )
        yield conn, False


def _not_connectable(handed: object, why: str) -> str:
    return (
        f"config.attributes[{HANDED!r}] is a {type(handed).__name__}, and {why}: hand an "
        "Engine, a Connection, or an object whose connect() yields a Connection. Nothing "
        "was migrated"
    )


def checkout_database_url(x_url: str | None, ini_url: str | None) -> URL:
    """The database ``alembic`` run from a checkout migrates, when nobody handed one: ``-x
    database_url=URL``, else ``sqlalchemy.url``, else MNESTOMA_DATABASE_URL,
    MNESTOMA_DB_PATH or METNOS_WORKSPACE. Never the default ``./.mnestoma`` of the current
    folder: that would build a store inside the checkout, so InvalidInput says what to
    give instead."""
    if x_url is not None:
        return sync_database_url(x_url)
    if ini_url:
        return sync_database_url(ini_url)
    named = (ENV_DATABASE_URL, ENV_DB_PATH, ENV_WORKSPACE)
    if any(os.environ.get(name) is not None for name in named):
        return sync_database_url(None)  # one set but empty: InvalidInput naming it
    raise InvalidInput(
        "no database named: run `alembic -x database_url=URL ...`, set sqlalchemy.url in "
        f"alembic.ini, or set {ENV_DATABASE_URL} (or {ENV_DB_PATH}); alembic never migrates "
        "the default ./.mnestoma of the folder it runs in"
    )


def _scripts_stamp(folder: Path) -> tuple[tuple[str, int], ...]:
    """What the scripts' folder holds: each revision file's name and modification time."""
    versions = folder / "versions"
    with os.scandir(versions) as entries:
        return tuple(
            sorted((e.name, e.stat().st_mtime_ns) for e in entries if e.name.endswith(".py"))
        )


# The revisions the scripts define, per folder and stamp: loading every script takes about
# 30 ms, and every store that opens asks for the head. A script added or changed makes a
# new stamp, so the cache never answers for scripts that are not there any more.
_REVISIONS: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[str, frozenset[str]]] = {}
_REVISIONS_LOCK = threading.Lock()


def _revisions() -> tuple[str, frozenset[str]]:
    """The head and every revision of the package's scripts, loaded once per stamp."""
    folder = migrations_path()
    key = (str(folder), _scripts_stamp(folder))
    found = _REVISIONS.get(key)
    if found is not None:
        return found
    with _REVISIONS_LOCK:
        script = ScriptDirectory.from_config(alembic_config())
        head = script.get_current_head()
        assert head is not None
        found = (head, frozenset(rev.revision for rev in script.walk_revisions()))
        _REVISIONS.clear()
        _REVISIONS[key] = found
    return found


def head_revision() -> str:
    """The revision the package's models describe.

    Returns:
        The revision id.
    """
    return _revisions()[0]


def known_revisions() -> set[str]:
    """Every revision this package's scripts know."""
    return set(_revisions()[1])


@contextmanager
def _engine_for(url_or_engine: str | URL | Engine | None) -> Iterator[Engine]:
    if isinstance(url_or_engine, Engine):
        yield url_or_engine
        return
    engine = make_engine(sync_database_url(url_or_engine))
    try:
        yield engine
    finally:
        engine.dispose()


def read_revision(conn: Connection) -> str | None:
    """The package's revision in this database, reading only: its own version table, else a
    mnestoma revision left in ``alembic_version`` by an older release (adopted by upgrade)."""
    tables = set(inspect(conn).get_table_names())
    if VERSION_TABLE in tables:
        # One row, read as it is: Alembic's context costs a look at the catalog more, which
        # every facade's first call paid. Alembic says what is wrong with several rows.
        rows = conn.execute(_READ_VERSION).scalars().all()
        if len(rows) <= 1:
            return rows[0] if rows else None
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()
    return _legacy_revision(conn, tables)


_READ_VERSION = text(f"SELECT version_num FROM {VERSION_TABLE}")


def _legacy_revision(conn: Connection, tables: set[str]) -> str | None:
    """A mnestoma revision held in ``alembic_version`` beside mnestoma's tables, if any.

    A service's own revision may share the table and look like one of ours (its first is
    often ``0001``): of several such rows, ours is the one the store's schema is at.
    """
    if LEGACY_VERSION_TABLE not in tables or "mnests" not in tables:
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")).scalars()
    known = known_revisions()
    ours = [r for r in rows if r in known]
    if len(ours) > 1:
        built = _legacy_schema_revision(conn, tables)
        ours = [r for r in ours if r == built]
    return ours[0] if len(ours) == 1 else None


def _legacy_schema_revision(conn: Connection, tables: set[str]) -> str:
    """The revision a store stamped in ``alembic_version`` was built to, read from what each
    revision added. Only 0001..0006 were ever stamped there (later ones have the package's
    own version table), so this ladder never grows."""
    insp = inspect(conn)
    if "ts_weight" not in {c["name"] for c in insp.get_columns("mnests")}:
        return "0001"
    if "ager_runs" not in tables:
        return "0002"
    checks = {c["name"]: str(c["sqltext"]) for c in insp.get_check_constraints("mnests")}
    if "<=" not in checks.get("ck_mnests_decay_lambda_nonneg", ""):  # 0004's upper bound
        return "0003"
    turn_index = [i for i in insp.get_indexes("events") if i["name"] == "ix_events_turn_id"]
    options = turn_index[0].get("dialect_options", {}) if turn_index else {}
    if not any(key.endswith("_where") and value is not None for key, value in options.items()):
        return "0004"  # 0005 made ix_events_turn_id partial
    if "ix_mnests_active_src" not in {i["name"] for i in insp.get_indexes("mnests")}:
        return "0005"
    return "0006"


def adopt_legacy_version(conn: Connection) -> str | None:
    """Move a mnestoma revision from ``alembic_version`` to ``mnestoma_alembic_version``.

    Stores written before the package had its own version table (and seed-era stores
    stamped by hand) keep every row; a service's own revisions in ``alembic_version`` stay
    where they are, and the table is dropped only when nothing else is left in it. Returns
    the adopted revision, or None when there was nothing to adopt.
    """
    tables = set(inspect(conn).get_table_names())
    if VERSION_TABLE in tables:
        return None
    revision = _legacy_revision(conn, tables)
    if revision is None:
        return None
    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    ctx.stamp(ScriptDirectory.from_config(alembic_config()), revision)
    conn.execute(
        text(f"DELETE FROM {LEGACY_VERSION_TABLE} WHERE version_num = :rev"), {"rev": revision}
    )
    if conn.execute(text(f"SELECT count(*) FROM {LEGACY_VERSION_TABLE}")).scalar_one() == 0:
        conn.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))
    return revision


# The keys of ``Config.attributes`` where env.py notes the revision a migration found once
# it held the migration lock, and the one it left before letting the lock go: what this
# migration did, not what another one did while it waited (see :class:`MigrationReport`).
FOUND = "mnestoma_found_revision"
LEFT = "mnestoma_left_revision"


def prepare_for_migration(conn: Connection, noted: dict[str, Any] | None = None) -> None:
    """What every online migration does first, inside its transaction: take the migration
    lock, create the schema the URL's ``search_path`` names (PostgreSQL: under the lock, so
    two first migrations never race to create it), adopt a legacy stamp, repair a seed-era
    store at 0001 (:mod:`~mnestoma.maintenance.seed_repair`). In ``noted`` (the Config's
    attributes) the
    revision found under the lock, at the first attempt only (a retry starts from there)."""
    backend = backend_of(conn)
    backend.lock_for_migration(conn)
    backend.prepare_migration(conn)  # PostgreSQL: the search_path's schema, under the lock
    adopt_legacy_version(conn)
    if noted is not None and FOUND not in noted:
        noted[FOUND] = read_revision(conn)
    # a seed-era store at 0001 may hold rows that 0002's unique indexes forbid: merge them
    repair_before_upgrade(conn, read_revision(conn))


def note_left(conn: Connection, noted: dict[str, Any]) -> None:
    """In ``noted`` (the Config's attributes) the revision a migration leaves, read while it
    still holds the migration lock."""
    noted[LEFT] = read_revision(conn)


@dataclass(frozen=True)
class MigrationReport:
    """What one :func:`upgrade` or :func:`downgrade` did, read under the migration lock:
    ``before`` the revision it found once it held the lock (None: no schema), ``after`` the
    one it left, ``applied`` the revisions it ran (an upgrade: oldest first; a downgrade:
    those it undid, newest first). A migration that waited while another brought the
    database to its target applied nothing: ``before == after``, ``applied`` empty."""

    before: str | None
    after: str | None
    applied: tuple[str, ...]

    @property
    def moved(self) -> bool:
        """True when this migration changed the revision."""
        return self.before != self.after


def _report(noted: dict[str, Any], *, down: bool = False) -> MigrationReport:
    """The report of the migration whose revisions env.py noted in ``noted``."""
    before, after = noted.get(FOUND), noted.get(LEFT)
    upper, lower = (before, after) if down else (after, before)
    applied: tuple[str, ...] = ()
    if upper is not None and upper != lower:
        script = ScriptDirectory.from_config(alembic_config())
        ran = [r.revision for r in script.iterate_revisions(upper, lower or "base")]
        applied = tuple(ran if down else reversed(ran))
    return MigrationReport(before, after, applied)


def migration_lock_timeout(value: float | str | None = None) -> float:
    """Seconds a PostgreSQL revision waits for a lock per attempt: ``value``, else
    ``MNESTOMA_MIGRATION_LOCK_TIMEOUT``, else 3; 0 lets it wait as long as it takes."""
    what = "lock_timeout" if value is not None else ENV_MIGRATION_LOCK_TIMEOUT
    if value is None:
        value = os.environ.get(ENV_MIGRATION_LOCK_TIMEOUT, "").strip() or None
    if value is None:
        return DEFAULT_MIGRATION_LOCK_TIMEOUT_S
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{what} must be a number of seconds") from None
    if not 0 <= seconds < 2**31 / 1000:
        raise InvalidInput(f"{what} must be a number of seconds ≥ 0 (0: no timeout)")
    return seconds


def lock_timeout_sql(seconds: float) -> str:
    """PostgreSQL's text for a ``lock_timeout`` of ``seconds`` ('3s', '250ms', '0')."""
    if seconds == 0:
        return "0"
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@contextmanager
def revision_session(conn: Connection, lock_timeout: float) -> Iterator[None]:
    """PostgreSQL, revisions committed one by one: hold the migration lock for the whole
    session (a second migrator waits here, without a timeout, then finds the revisions
    done) and give every revision's statements ``lock_timeout``. At the end the lock is
    released and the session's own ``lock_timeout`` put back; a connection that cannot be
    cleaned so is invalidated (its session, and the lock, end with it).

    The wait polls ``pg_try_advisory_lock`` between short transactions: a migrator blocked
    in ``pg_advisory_lock`` would hold a snapshot, which the first one's ``CREATE INDEX
    CONCURRENTLY`` waits for: a deadlock."""
    key = {"key": MIGRATION_LOCK_KEY}
    old: str | None = None
    try:
        while not conn.execute(text("SELECT pg_try_advisory_lock(:key)"), key).scalar_one():
            conn.rollback()
            time.sleep(MIGRATION_LOCK_POLL_S)
        old = str(conn.execute(text("SELECT current_setting('lock_timeout')")).scalar_one())
        conn.execute(
            text("SELECT set_config('lock_timeout', :t, false)"),
            {"t": lock_timeout_sql(lock_timeout)},
        )
        conn.commit()  # a SET in a transaction rolled back would be undone with it
        yield
    finally:
        try:
            if conn.in_transaction():
                conn.rollback()
            if old is not None:
                conn.execute(text("SELECT set_config('lock_timeout', :t, false)"), {"t": old})
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
            conn.commit()
        except sa_exc.SQLAlchemyError:
            logger.warning("could not release the migration lock: closing its connection")
            conn.invalidate()


def retry_lock_timeouts(
    conn: Connection,
    attempt: Callable[[], None],
    *,
    lock_timeout: float,
    retries: int | None = None,
) -> None:
    """Run ``attempt`` (the revisions still to apply, each committing on its own) again
    while one of them times out waiting for a lock: the failed revision's transaction is
    rolled back, and after a pause (doubling each time) it starts again in a new one, from
    the revision the store is now at. After ``retries`` (default
    :data:`MIGRATION_LOCK_RETRIES`) such retries, ConflictError; the revisions committed
    before stay applied and stamped."""
    retries = MIGRATION_LOCK_RETRIES if retries is None else retries
    pause = FIRST_RETRY_PAUSE_S
    for tried in range(retries + 1):
        try:
            attempt()
            return
        except sa_exc.DBAPIError as err:
            if not is_lock_not_available(err):
                raise
            if conn.in_transaction():
                conn.rollback()
            at = read_revision(conn) or "empty"
            conn.rollback()
            if tried == retries:
                raise ConflictError(
                    f"the revision after {at} waited {lock_timeout:g} s for its locks "
                    f"{retries + 1} times in vain: other transactions hold locks on its "
                    f"tables. The database stays at revision {at}, each revision up to it "
                    f"applied; run the upgrade again, or give it a longer lock timeout "
                    f"(--lock-timeout, lock_timeout= or {ENV_MIGRATION_LOCK_TIMEOUT})"
                ) from err
            logger.warning(
                "the revision after %s waited %g s for a lock (attempt %d of %d): trying "
                "it again in %g s",
                at,
                lock_timeout,
                tried + 1,
                retries + 1,
                pause,
            )
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_RETRY_PAUSE_S)


def sqlite_store_missing(url: URL) -> bool:
    """True for a SQLite file URL whose file does not exist (reading must not create it):
    ``backend_of(url).store_missing(url)``."""
    return backend_of(url).store_missing(url)


def missing_sqlite_file(url: URL) -> Path | None:
    """The path of the SQLite file of ``url`` when it does not exist (no store there; the
    reading tools never create it), else None."""
    return Path(url.database or "").expanduser() if sqlite_store_missing(url) else None


def current_revision(url_or_engine: str | URL | Engine | None = None) -> str | None:
    """The revision stamped in the database, or None for a database never migrated.

    Reads only: a SQLite file that does not exist is not created (there is no store there).

    Returns:
        The revision id, or None.

    Raises:
        InvalidInput: ``url_or_engine`` is not a database URL.
        StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
            be reached).
    """
    if not isinstance(url_or_engine, Engine) and sqlite_store_missing(
        sync_database_url(url_or_engine)
    ):
        return None
    with _engine_for(url_or_engine) as engine, translate_errors(), engine.connect() as conn:
        return read_revision(conn)


@contextmanager
def _revision_errors() -> Iterator[None]:
    """An unknown or unreachable revision is the caller's input error."""
    try:
        yield
    except CommandError as err:
        first_line = str(err).splitlines()[0] if str(err) else "unknown revision"
        raise InvalidInput(f"revision: {first_line}") from None


def _running() -> object:
    """Who runs this code: the greenlet (an async door runs its migration in one of its
    own, inside the event loop's thread), else the thread."""
    return _getcurrent() if _getcurrent is not None else threading.get_ident()


class _MigrationGate:
    """One Alembic command at a time in this process. Alembic keeps the running migration's
    context in module globals (``alembic.context``, ``alembic.op``), so two migrations run
    by threads of one process, or by coroutines of one event loop (the async door runs its
    migration in a greenlet), would each overwrite the other's. The database's migration
    lock serialises processes; this serialises a process's own callers.

    Whoever holds it may enter again (a migration that asks for another); an async holder
    hands it to the greenlet that runs its migration (:meth:`handed_here`). A caller in
    the thread of the holder that is not the holder cannot wait (the holder could only go
    on once it returned): :class:`ConflictError` at once. A holder that can never let it go
    (its event loop closed with the migration pending, or its thread gone) is found by
    those waiting, who take the gate over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._swap = threading.Lock()  # guards a take-over of an abandoned gate
        self._owner: object = None
        self._thread: int | None = None  # the holder's thread
        self._loop: asyncio.AbstractEventLoop | None = None  # an async holder's loop

    def _forked(self) -> None:
        """In a forked child: a gate of its own, free (the thread of the parent that may
        have held it is not in the child, and would never let it go)."""
        self._lock, self._swap = threading.Lock(), threading.Lock()
        self._owner = self._thread = self._loop = None

    def _refuse_in_holders_thread(self) -> None:
        self._take_over_if_abandoned(self._lock)  # (a thread's id is reused once it ends)
        if self._lock.locked() and self._thread == threading.get_ident():
            raise ConflictError(
                "another migration of this process is running in this thread (another "
                "coroutine of this thread's event loop); call again once it has ended"
            )

    def _take(self, blocking: bool) -> threading.Lock | None:
        """The lock, once had (None when ``blocking`` is false and it is taken); an
        abandoned holder's lock is replaced by a free one first."""
        while True:
            lock = self._lock
            if lock.acquire(timeout=MIGRATION_GATE_LOOK_S) if blocking else lock.acquire(False):
                if self._lock is lock:
                    return lock
                lock.release()  # taken over meanwhile: take the new one
                continue
            self._take_over_if_abandoned(lock)
            if not blocking:
                return None
            self._refuse_in_holders_thread()

    def _take_over_if_abandoned(self, lock: threading.Lock) -> None:
        loop, thread = self._loop, self._thread
        gone = (loop is not None and loop.is_closed()) or (
            thread is not None and all(t.ident != thread for t in threading.enumerate())
        )
        if gone:
            with self._swap:
                if self._lock is lock:
                    self._lock = threading.Lock()
                    self._owner = self._thread = self._loop = None

    def _let_go(self, lock: threading.Lock) -> None:
        if self._lock is lock:
            self._owner = self._thread = self._loop = None
        lock.release()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Held for the block, waiting for another thread's migration to end (see the
        class for the holder's own thread)."""
        me = _running()
        if self._owner is not None and self._owner == me:
            yield
            return
        self._refuse_in_holders_thread()
        lock = self._take(blocking=True)
        assert lock is not None
        self._owner, self._thread = me, threading.get_ident()
        try:
            yield
        finally:
            self._let_go(lock)

    @asynccontextmanager
    async def held_async(self) -> AsyncIterator[None]:
        """Held for the block, waiting without blocking the event loop (the holder may be
        another coroutine of the same loop, which needs the loop to finish). The migration
        itself runs in a greenlet the block spawns, under :meth:`handed_here`."""
        while (lock := self._take(blocking=False)) is None:
            await asyncio.sleep(MIGRATION_GATE_POLL_S)
        self._thread, self._loop = threading.get_ident(), asyncio.get_running_loop()
        try:
            yield
        finally:
            self._let_go(lock)

    @contextmanager
    def handed_here(self) -> Iterator[None]:
        """For the block, the gate an async holder took belongs to the greenlet running it."""
        if not self._lock.locked() or self._thread != threading.get_ident():
            raise RuntimeError("the migration gate is handed on only by its async holder")
        before, self._owner = self._owner, _running()
        try:
            yield
        finally:
            self._owner = before


# How often an async caller looks whether another migration of the process has ended.
MIGRATION_GATE_POLL_S = 0.005
# How often a caller waiting in a thread looks whether the holder can still let it go.
MIGRATION_GATE_LOOK_S = 0.5
MIGRATION_GATE = _MigrationGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=MIGRATION_GATE._forked)


def upgrade(
    url_or_engine: str | URL | Engine | Connection | None = None,
    revision: str = "head",
    *,
    lock_timeout: float | None = None,
) -> MigrationReport:
    """Migrate the database up to ``revision`` with the packaged Alembic scripts.

    PostgreSQL, from a URL or Engine: each revision commits in its own transaction, its
    statements waiting at most ``lock_timeout`` seconds for a lock (default
    ``MNESTOMA_MIGRATION_LOCK_TIMEOUT``, else 3; 0: no limit); a revision that times out is
    rolled back and tried again a bounded number of times with growing pauses, so live
    writers wait for one revision's lock for at most about ``lock_timeout``, not for (nor
    in a deadlock with) the whole upgrade. SQLite: one transaction for the whole
    upgrade, holding the write lock. A Connection is migrated in one transaction that the
    caller ends (commit or roll back). Concurrent migrations of one database are serialised:
    each ends at ``revision``, and each reports what it applied itself (one that waited
    while another did the work: nothing). The package's revision lives in
    ``mnestoma_alembic_version``; a service's own ``alembic_version`` is left alone.

    Returns:
        A :class:`MigrationReport`: the revision found once the migration lock was held,
        the one left, and the revisions applied, oldest first.

    Raises:
        InvalidInput: ``revision`` is empty or unknown, or no database is named (the
            URL is empty or not a database URL).
        SchemaError: the database is at a revision this release does not know (written
            by a newer one).
        ConflictError: a revision could not have its locks within ``lock_timeout``,
            retries spent; the revisions before it stay applied.
        StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
            be reached).
    """
    check_name(revision, "revision")
    seconds = migration_lock_timeout(lock_timeout)
    if isinstance(url_or_engine, Connection):
        with translate_errors(), _revision_errors(), MIGRATION_GATE.held():
            _refuse_unknown_stamp(url_or_engine)
            cfg = alembic_config(url_or_engine)
            command.upgrade(cfg, revision)
            report = _report(cfg.attributes)
            _analyze_if_migrated(url_or_engine, report)
        return report
    with _engine_for(url_or_engine) as engine, translate_errors(), _revision_errors():
        with engine.connect() as conn:
            _refuse_unknown_stamp(conn)
        _use_wal(engine)
        cfg = alembic_config(engine)
        cfg.attributes["lock_timeout"] = seconds
        with MIGRATION_GATE.held():
            command.upgrade(cfg, revision)
        report = _report(cfg.attributes)
        with engine.begin() as conn:
            _analyze_if_migrated(conn, report)
    return report


# The package's tables, analysed after a migration on PostgreSQL.
PACKAGE_TABLES = ("mnests", "events", "canonical_query_log", "ager_runs")


def _analyze_if_migrated(conn: Connection, report: MigrationReport) -> None:
    """PostgreSQL: ANALYZE the package's tables when this migration moved the revision. A
    migration builds indexes and rewrites tables; until statistics exist the planner
    guesses, and a guess can turn a linear statement quadratic (the ager's, once, on a
    store with a hub)."""
    if not backend_of(conn).server or not report.moved:  # a server's statistics
        return
    present = set(inspect(conn).get_table_names())
    quote = conn.dialect.identifier_preparer.quote_identifier
    tables = [quote(t) for t in PACKAGE_TABLES if t in present]
    if tables:
        conn.execute(text("ANALYZE " + ", ".join(tables)))


def _refuse_unknown_stamp(conn: Connection) -> None:
    """A database stamped by a newer release: say so, not Alembic's "Can't locate revision"."""
    current = read_revision(conn)
    if current is not None and current not in known_revisions():
        raise SchemaError(_newer_release(redact_url(conn.engine.url), current))


def _newer_release(where: str, current: str) -> str:
    return (
        f"database {where} is at revision {current}, unknown to this version of mnestoma "
        "(written by a newer release?): upgrade the mnestoma package"
    )


def _use_wal(engine: Engine) -> None:
    """Switch a SQLite store to WAL (persistent in the file): only for a store this package
    creates or migrates, never when it merely reads a file."""
    backend_of(engine).prepare_store(engine)


def downgrade(
    url_or_engine: str | URL | Engine | None, revision: str, *, lock_timeout: float | None = None
) -> MigrationReport:
    """Migrate the database down to ``revision`` (on PostgreSQL one revision a transaction,
    under ``lock_timeout`` and retried as :func:`upgrade` does).

    Returns:
        A :class:`MigrationReport`: the revision found once the migration lock was held,
        the one left, and the revisions undone, newest first.

    Raises:
        InvalidInput: ``revision`` is empty or unknown, or the URL is not a database URL.
        SchemaError: the database is at a revision this release does not know (written
            by a newer one).
        ConflictError: a revision could not have its locks within ``lock_timeout``,
            retries spent.
        StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
            be reached).
    """
    check_name(revision, "revision")
    seconds = migration_lock_timeout(lock_timeout)
    with _engine_for(url_or_engine) as engine, translate_errors(), _revision_errors():
        with engine.connect() as conn:
            _refuse_unknown_stamp(conn)
        cfg = alembic_config(engine)
        cfg.attributes["lock_timeout"] = seconds
        with MIGRATION_GATE.held():
            command.downgrade(cfg, revision)
    return _report(cfg.attributes, down=True)


def offline_sql(
    dialect_url: str, revision_range: str = "head", *, lock_timeout: float | None = None
) -> str:
    """The SQL script a DBA reviews before applying it (Alembic's offline mode).

    A range ``START:END`` whose END is below START (``0002:0001``, ``head:base``) is a
    downgrade, and the script is the downgrade's; anything else is an upgrade script. On
    PostgreSQL each revision is its own transaction, opened by ``SET lock_timeout`` (the
    seconds of ``lock_timeout``, default as :func:`upgrade`'s), as ``upgrade`` runs it.
    """
    buf = io.StringIO()
    cfg = Config(output_buffer=buf)
    cfg.set_main_option("script_location", str(migrations_path()))
    cfg.attributes["skip_logging"] = True
    cfg.attributes["lock_timeout"] = migration_lock_timeout(lock_timeout)
    cfg.set_main_option("sqlalchemy.url", dialect_url)
    with _revision_errors(), MIGRATION_GATE.held():
        if _is_downgrade_range(ScriptDirectory.from_config(cfg), revision_range):
            command.downgrade(cfg, revision_range, sql=True)
        else:
            command.upgrade(cfg, revision_range, sql=True)
    return buf.getvalue()


def _is_downgrade_range(script: ScriptDirectory, revision_range: str) -> bool:
    """True for ``START:END`` where END is ``base``, ``-N`` or a strict ancestor of START."""
    start, sep, end = revision_range.partition(":")
    if not sep or not start or not end or start == "base":
        return False
    if end == "base" or end.startswith("-"):
        return True
    try:
        top = script.get_revision(start)
        bottom = script.get_revision(end)
        if top is None or bottom is None or top.revision == bottom.revision:
            return False
        below = {r.revision for r in script.walk_revisions(base="base", head=top.revision)}
    except CommandError:
        return False  # the upgrade command then reports the bad range itself
    return bottom.revision in below


def ensure_at_head(engine: Engine, *, auto_migrate: bool) -> None:
    """Check the schema is at head; migrate it when allowed (the embedded SQLite default).

    A PostgreSQL database is never migrated implicitly: behind head is an error that says
    what to run.
    """
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    where = redact_url(engine.url)
    if current is not None and current not in known_revisions():
        raise SchemaError(_newer_release(where, current))
    if auto_migrate:
        upgrade(engine)
        return
    state = "has no mnestoma schema" if current is None else f"is at revision {current}"
    password = " (with its password in place of ***)" if engine.url.password else ""
    raise SchemaError(
        f"database {where} {state}, behind head {head}: "
        f"run `mnestoma db upgrade --database-url '{where}'`{password}"
    )
