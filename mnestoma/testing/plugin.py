"""pytest fixtures for suites that use mnestoma (contract §7).

Every test runs inside one outer transaction on one connection, and ``mnestoma_session``
joins it with ``join_transaction_mode="create_savepoint"`` (SQLAlchemy's "joining a
session into an external transaction" recipe): ``session.commit()`` only releases a
SAVEPOINT, and the outer transaction is rolled back after the test, so nothing a test
writes survives it, even where the code under test commits.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import cast

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from ..config import make_engine
from ..migration import upgrade
from ..repository import MnestRepository
from ..uow import UnitOfWork
from .clock import MovableClock
from .factories import bind_factories

__all__ = [
    "ENV_TEST_DATABASE_URL",
    "mnestoma_clock",
    "mnestoma_engine",
    "mnestoma_repository",
    "mnestoma_session",
    "mnestoma_uow",
]

ENV_TEST_DATABASE_URL = "MNESTOMA_TEST_DATABASE_URL"


@pytest.fixture(scope="session")
def mnestoma_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The test database, migrated to head once per session.

    ``MNESTOMA_TEST_DATABASE_URL`` when set (any URL ``mnestoma.make_engine`` accepts, e.g.
    PostgreSQL), else a SQLite file in pytest's temporary directory. Its data is never
    deleted: tests leave nothing behind because each one is rolled back.
    """
    url: str | URL = os.environ.get(ENV_TEST_DATABASE_URL, "").strip()
    if not url:
        path = tmp_path_factory.mktemp("mnestoma") / "mnestoma.sqlite"
        url = URL.create("sqlite+pysqlite", database=str(path))
    engine = make_engine(url)
    try:
        upgrade(engine)
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def mnestoma_session(mnestoma_engine: Engine) -> Iterator[Session]:
    """A Session in a transaction rolled back after the test, whatever the test commits.

    Objects stay readable after ``commit()`` (``expire_on_commit=False``, as the sessions
    of ``mnestoma.make_session_factory``). On SQLite the outer transaction holds the write
    lock for the whole test: code that opens its own connections to the same file (the
    ``Mnestoma`` facade, another engine) would wait for it; drive such code through this
    session instead.
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
    """
    factory = cast("sessionmaker[Session]", lambda: mnestoma_session)
    with UnitOfWork(factory, clock=mnestoma_clock) as uow:
        yield uow


@pytest.fixture
def mnestoma_repository(mnestoma_session: Session, mnestoma_clock: MovableClock) -> MnestRepository:
    """A :class:`~mnestoma.MnestRepository` on ``mnestoma_session`` with ``mnestoma_clock``."""
    return MnestRepository(mnestoma_session, clock=mnestoma_clock)


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
