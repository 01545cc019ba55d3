"""A unit of work whose connection is lost under it ends as the package promises: the
block's own exception goes on (the failed rollback logged, nothing kept), and an explicit
``rollback()`` raises the package's error, never a driver's (contract §5: every error is
a ``MnestomaError``).

The connection is lost the way each engine loses one: on PostgreSQL the server ends the
session (``pg_terminate_backend``); on SQLite the driver's connection is closed under the
unit (what a lost file handle leaves).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest
import sqlalchemy.exc
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncSession

from mnestoma import JoinedUnitOfWork, Mnestoma, MnestomaError, UnitOfWork
from mnestoma.aio import AsyncMnestoma, AsyncUnitOfWork, make_async_engine
from mnestoma.aio import make_async_session_factory as async_factory
from mnestoma.engines import make_engine, make_session_factory


class CallersOwnError(Exception):
    """What the caller's code raised inside the unit."""


def _edges(url: str) -> int:
    with Mnestoma(url) as m:
        return len(m.edges())


def _lose(conn: Connection) -> None:
    """End ``conn``'s connection to the database under it."""
    if conn.dialect.name == "postgresql":
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        admin_engine = make_engine(conn.engine.url)
        try:
            with admin_engine.connect() as admin:
                admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        finally:
            admin_engine.dispose()  # no session left for the next test to wait for
    else:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        dbapi.close()


@contextmanager
def _facade_unit(url: str) -> Iterator[Any]:
    with Mnestoma(url) as m, m.unit_of_work() as uow:
        yield uow


@contextmanager
def _service_unit(url: str) -> Iterator[Any]:
    engine = make_engine(url)
    try:
        with UnitOfWork(make_session_factory(engine)) as uow:
            yield uow
    finally:
        engine.dispose()


@contextmanager
def _joined_unit(url: str) -> Iterator[Any]:
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session, JoinedUnitOfWork(session) as uow:
            yield uow
    finally:
        engine.dispose()


SYNC_UNITS: dict[str, Callable[[str], AbstractContextManager[Any]]] = {
    "facade": _facade_unit,
    "service": _service_unit,
    "joined": _joined_unit,
}


@pytest.mark.parametrize("unit", list(SYNC_UNITS))
def test_a_unit_left_by_an_exception_after_its_connection_was_lost_raises_the_callers_error(
    store_url: str, unit: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mnestoma.uow")
    with pytest.raises(CallersOwnError), SYNC_UNITS[unit](store_url) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        _lose(uow.session.connection())
        raise CallersOwnError
    assert "could not roll back as its block raised" in caplog.text
    assert _edges(store_url) == 0


@pytest.mark.parametrize("unit", list(SYNC_UNITS))
def test_an_explicit_rollback_after_a_lost_connection_raises_the_packages_error(
    store_url: str, unit: str
) -> None:
    with pytest.raises(MnestomaError) as raised, SYNC_UNITS[unit](store_url) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        _lose(uow.session.connection())
        uow.rollback()
    assert not isinstance(raised.value, sqlalchemy.exc.SQLAlchemyError)
    assert _edges(store_url) == 0


async def _lose_async(session: AsyncSession) -> None:
    conn = await session.connection()
    await conn.run_sync(_lose)


@pytest.mark.parametrize("unit", ["facade", "service", "joined"])
@pytest.mark.parametrize("explicit", [False, True], ids=["raised", "rollback"])
def test_an_async_unit_after_a_lost_connection_ends_as_the_sync_one(
    store_url: str, unit: str, explicit: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mnestoma.uow")

    async def work(uow: Any) -> None:
        await uow.mnests.record_passing("a", "1", "b", "1")
        await _lose_async(uow.session)
        if explicit:
            await uow.rollback()
        raise CallersOwnError

    async def main() -> None:
        if unit == "facade":
            async with AsyncMnestoma(store_url) as am, am.unit_of_work() as uow:
                await work(uow)
            return
        engine = make_async_engine(store_url)
        try:
            if unit == "service":
                async with AsyncUnitOfWork(async_factory(engine)) as uow:
                    await work(uow)
            else:
                async with (
                    async_factory(engine)() as session,
                    AsyncUnitOfWork.joining(session) as uow,
                ):
                    await work(uow)
        finally:
            await engine.dispose()

    with pytest.raises((MnestomaError, CallersOwnError)) as raised:
        asyncio.run(main())
    assert not isinstance(raised.value, sqlalchemy.exc.SQLAlchemyError)
    if "postgresql" in store_url:
        # (aiosqlite's adapter rolls a closed connection back without an error: on SQLite
        # only "never a driver's error, nothing kept" is asked)
        assert isinstance(raised.value, MnestomaError if explicit else CallersOwnError)
        if not explicit:
            assert "could not roll back as its block raised" in caplog.text
    assert _edges(store_url) == 0
