"""pytest fixtures for suites that use mnestoma (contract §7).

Every test runs inside one outer transaction on one connection, and ``mnestoma_session``
joins it with ``join_transaction_mode="create_savepoint"`` (SQLAlchemy's "joining a
session into an external transaction" recipe): ``session.commit()`` only releases a
SAVEPOINT, and the outer transaction is rolled back after the test, so nothing a test
writes survives it, even where the code under test commits.

Under pytest-xdist each worker gets a database of its own: a test holds its row locks until
it ends and the ager locks whole tables, so workers sharing one database would wait on and
deadlock with each other. Without xdist the database of ``MNESTOMA_TEST_DATABASE_URL`` is
used as it is (no CREATEDB needed, and a service's own tables in it stay visible).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from mnestoma.core.errors import InvalidInput, StoreError
from mnestoma.core.settings import Settings
from mnestoma.engines import (
    backend_of,
    is_memory_sqlite,
    make_engine,
    redact_text,
    redact_url,
    resolve_database_url,
)
from mnestoma.maintenance.migration import upgrade
from mnestoma.store.repository import MnestRepository
from mnestoma.store.uow import UnitOfWork
from mnestoma.testing.clock import MovableClock
from mnestoma.testing.factories import bind_factories

__all__ = [
    "ENV_TEST_DATABASE_URL",
    "WorkerDatabaseError",
    "mnestoma_clock",
    "mnestoma_engine",
    "mnestoma_repository",
    "mnestoma_session",
    "mnestoma_uow",
]

ENV_TEST_DATABASE_URL = "MNESTOMA_TEST_DATABASE_URL"


# PostgreSQL's longest identifier, in bytes.
PG_NAME_BYTES = 63
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


class WorkerDatabaseError(StoreError):
    """A pytest-xdist worker's own database could not be created or dropped."""


def xdist_worker(config: pytest.Config) -> str | None:
    """The pytest-xdist worker this process is (``gw0``, ``gw1``...), or None outside xdist.

    Read from the worker's configuration, as xdist's ``worker_id`` fixture does, not from
    ``PYTEST_XDIST_WORKER``: a pytest run started by a test of an xdist run inherits it.
    """
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput["workerid"])


def worker_database_name(database: str, worker: str) -> str:
    """``<database>_<worker>``; a name too long for PostgreSQL keeps its start and a hash
    of the whole, so that two long names never meet."""
    name = f"{database}_{worker}"
    if len(name.encode()) <= PG_NAME_BYTES:
        return name
    tail = f"_{hashlib.sha256(database.encode()).hexdigest()[:8]}_{worker}"
    head = database.encode()[: PG_NAME_BYTES - len(tail.encode())].decode(errors="ignore")
    return head + tail


@contextmanager
def postgresql_worker_database(url: URL, worker: str) -> Iterator[URL]:
    """The URL of a new empty database for ``worker`` beside ``url``'s, dropped on exit.

    A leftover of the same name (an interrupted run) is dropped first. It is created through
    a connection to ``url``'s own database (named ``mnestoma_test_<worker>`` when the URL
    names none), so the role needs CREATEDB.
    """
    name = worker_database_name(url.database or "mnestoma_test", worker)
    admin = make_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        _refuse_a_database_in_use(admin, url, name)
        _admin_run(admin, url, name, "drop the leftover", f"DROP DATABASE IF EXISTS {quoted}")
        _admin_run(admin, url, name, "create", f"CREATE DATABASE {quoted}")
        try:
            yield url.set(database=name)
        finally:
            # connections a test left open (an engine of its own) would block the drop
            _admin_run(admin, url, name, "end the sessions on", _TERMINATE_SESSIONS)
            _admin_run(admin, url, name, "drop", f"DROP DATABASE IF EXISTS {quoted}")
    finally:
        admin.dispose()


_TERMINATE_SESSIONS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = :name AND pid <> pg_backend_pid()"
)
_PG_OBJECT_IN_USE = "55006"
_IN_USE_HINT = " (is another test run using the same URL?)"


def _refuse_a_database_in_use(admin: Engine, url: URL, name: str) -> None:
    """Stop before dropping a leftover that a session still uses (another run's worker): it
    is not ours to end, and DROP DATABASE would wait five seconds before saying so."""
    sessions = _admin_run(
        admin,
        url,
        name,
        "look for sessions on",
        "SELECT pid FROM pg_stat_activity WHERE datname = :name",
    )
    if sessions:
        raise WorkerDatabaseError(
            f"mnestoma.testing could not drop the leftover database {name!r} on "
            f"{redact_url(url)}: {sessions} session(s) use it{_IN_USE_HINT}"
        )


def _admin_run(admin: Engine, url: URL, name: str, what: str, statement: str) -> int:
    """Run one statement on the admin connection and count the rows it returns; a failure
    says which database, where and what the role needs, with every secret hidden."""
    try:
        with admin.connect() as conn:
            result = conn.execute(text(statement), {"name": name})
            return len(result.all()) if result.returns_rows else 0
    except DBAPIError as err:
        lines = str(err.orig if err.orig is not None else err).strip().splitlines()
        reason = redact_text(lines[0] if lines else type(err).__name__)
        in_use = getattr(err.orig, "sqlstate", None) == _PG_OBJECT_IN_USE
        raise WorkerDatabaseError(
            f"mnestoma.testing could not {what} the database {name!r} on {redact_url(url)}: "
            f"{reason}. Under pytest-xdist each worker gets a database of its own, created "
            f"and dropped through {ENV_TEST_DATABASE_URL}, whose role needs CREATEDB"
            + (_IN_USE_HINT if in_use else "")
        ) from None


@contextmanager
def sqlite_worker_file(url: URL, worker: str) -> Iterator[URL]:
    """The URL of ``<stem>_<worker><suffix>`` beside ``url``'s SQLite file, removed (with
    its journal files) before and after; an in-memory database is already the process's own."""
    database = url.database or ""
    if is_memory_sqlite(url):
        yield url
        return
    prefix = "file:" if database.startswith("file:") else ""
    location, sep, query = database.partition("?") if prefix else (database, "", "")
    path = Path(location.removeprefix(prefix))
    own = path.with_name(f"{path.stem}_{worker}{path.suffix}")
    _remove_sqlite_file(own)
    try:
        yield url.set(database=f"{prefix}{own}{sep}{query}")
    finally:
        _remove_sqlite_file(own)


def _remove_sqlite_file(path: Path) -> None:
    for each in (path, *(path.with_name(path.name + side) for side in SQLITE_SIDE_FILES)):
        each.unlink(missing_ok=True)


@contextmanager
def _test_database_url(
    config: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[URL]:
    """The URL the session's tests use: ``MNESTOMA_TEST_DATABASE_URL``, or a temporary
    SQLite file; under pytest-xdist, a database of this worker's own derived from it. Set
    but empty (an unset shell variable expanded) is :class:`InvalidInput` naming it: the
    tests would otherwise run on SQLite where PostgreSQL was meant."""
    given = os.environ.get(ENV_TEST_DATABASE_URL)
    if given is not None and not given.strip():
        raise InvalidInput(
            f"{ENV_TEST_DATABASE_URL} is set but empty (an unset shell variable?): give it a "
            "URL, or unset it for a temporary SQLite file"
        )
    if given is None:
        # pytest's temporary directory is already per worker under xdist
        path = tmp_path_factory.mktemp("mnestoma") / "mnestoma.sqlite"
        yield URL.create("sqlite+pysqlite", database=str(path))
        return
    url = resolve_database_url(given.strip())
    worker = xdist_worker(config)
    if worker is None:
        yield url
    elif backend_of(url).server:
        with postgresql_worker_database(url, worker) as own:
            yield own
    else:  # a file store: one file per worker
        with sqlite_worker_file(url, worker) as own:
            yield own


@pytest.fixture(scope="session")
def mnestoma_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """The test database, migrated to head once per session.

    ``MNESTOMA_TEST_DATABASE_URL`` when set (any URL ``mnestoma.make_engine`` accepts, e.g.
    PostgreSQL), else a SQLite file in pytest's temporary directory; tests leave nothing
    in it because each one is rolled back. Under pytest-xdist each worker gets its own,
    created here and dropped at the end of the session: ``<database>_<worker>``
    (``myservice_test_gw0``), or ``<stem>_<worker>.sqlite`` beside a SQLite URL's file.

    Yields:
        The Engine, for the whole session (fixture).

    Raises:
        InvalidInput: ``MNESTOMA_TEST_DATABASE_URL`` is set but empty, or not a database URL.
        SchemaError: the test database is at a revision this release does not know.
        StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
            be reached).
    """
    try:
        with _test_database_url(request.config, tmp_path_factory) as url:
            engine = make_engine(url)
            try:
                upgrade(engine)
                yield engine
            finally:
                engine.dispose()
    except WorkerDatabaseError as err:
        # no traceback: its locals would show the URL with its secrets under --showlocals
        pytest.fail(str(err), pytrace=False)


@pytest.fixture
def mnestoma_session(mnestoma_engine: Engine) -> Iterator[Session]:
    """A Session in a transaction rolled back after the test, whatever the test commits.

    Objects stay readable after ``commit()`` (``expire_on_commit=False``, as the sessions
    of ``mnestoma.make_session_factory``). On SQLite the outer transaction holds the write
    lock for the whole test: code that opens its own connections to the same file (the
    ``Mnestoma`` facade, another engine) would wait for it; drive such code through this
    session instead.

    Yields:
        The Session of the test (fixture).
    """
    connection = mnestoma_engine.connect()
    outer = connection.begin()
    session = Session(
        bind=connection, join_transaction_mode="create_savepoint", expire_on_commit=False
    )
    try:
        yield session
    finally:
        session.close()
        if outer.is_active:
            outer.rollback()
        connection.close()


@pytest.fixture
def mnestoma_clock() -> MovableClock:
    """The clock of the test, starting at 2026-01-01 12:00 UTC; move it with ``advance()``.

    The factories and ``mnestoma_uow`` read "now" from it. Override this fixture to start
    elsewhere.

    Returns:
        A new :class:`~mnestoma.testing.MovableClock` (fixture).
    """
    return MovableClock()


@pytest.fixture
def mnestoma_uow(mnestoma_session: Session, mnestoma_clock: MovableClock) -> Iterator[UnitOfWork]:
    """A :class:`~mnestoma.UnitOfWork` already entered, on ``mnestoma_session``, driven by
    ``mnestoma_clock``.

    It behaves like the one a service opens: ``uow.commit()`` commits ``mnestoma_session``
    (which only releases its SAVEPOINT: rolled back after the test all the same),
    ``uow.rollback()`` drops the work since the last commit, factory rows included.
    ``uow.mnests`` and ``uow.queries`` see what the factories flushed.

    Yields:
        The entered unit of work (fixture).
    """
    factory = cast("sessionmaker[Session]", lambda: mnestoma_session)
    with UnitOfWork(factory, settings=Settings(clock=mnestoma_clock)) as uow:
        yield uow


@pytest.fixture
def mnestoma_repository(mnestoma_session: Session, mnestoma_clock: MovableClock) -> MnestRepository:
    """A :class:`~mnestoma.MnestRepository` on ``mnestoma_session`` with ``mnestoma_clock``.

    Returns:
        The repository (fixture).
    """
    return MnestRepository(mnestoma_session, settings=Settings(clock=mnestoma_clock))


@pytest.fixture(autouse=True)
def _mnestoma_factories(
    request: pytest.FixtureRequest, mnestoma_clock: MovableClock
) -> Iterator[None]:
    """Bind the factories to this test: its clock, and ``mnestoma_session`` on first use.

    The session is asked for lazily, so a test that never creates a row opens no database.
    A suite that overrides ``mnestoma_engine`` with a parametrised fixture must request
    ``mnestoma_session`` in the test itself (pytest cannot parametrise a fixture asked for late).
    """
    with bind_factories(lambda: request.getfixturevalue("mnestoma_session"), clock=mnestoma_clock):
        yield
