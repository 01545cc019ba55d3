"""A unit of work records events under the recorder its store (or its caller) names."""

from __future__ import annotations

import asyncio

import pytest

import mnestoma
from mnestoma import UnitOfWork, make_engine, make_session_factory
from mnestoma.doors.asynchronous import (
    AsyncMnestoma,
    AsyncUnitOfWork,
    make_async_engine,
    make_async_session_factory,
)

EDGE = ("fs.search", "1.2", "fs.read", "2.0")


def recorders(url: str) -> list[str]:
    with mnestoma.Mnestoma(url) as m:
        return [e.recorder for e in m.events()]


def test_a_facades_unit_of_work_keeps_its_recorder(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url, recorder="tracer") as m, m.unit_of_work() as uow:
        uow.mnests.record_passing(*EDGE)
        uow.mnests.record_turn("t1", [EDGE])
        uow.commit()
    assert recorders(store_url) == ["tracer", "tracer"]


def test_an_async_facades_unit_of_work_keeps_its_recorder(store_url: str) -> None:
    async def main() -> None:
        async with (
            AsyncMnestoma(store_url, recorder="otel") as am,
            am.unit_of_work() as uow,
        ):
            await uow.mnests.record_passing(*EDGE)
            await uow.commit()

    asyncio.run(main())
    assert recorders(store_url) == ["otel"]


def test_units_and_joined_units_take_a_recorder(store_url: str) -> None:
    engine = make_engine(store_url)
    try:
        sessions = make_session_factory(engine)
        with UnitOfWork(sessions, recorder="cli") as uow:
            uow.mnests.record_passing(*EDGE)
            uow.commit()
        with (
            sessions() as session,
            session.begin(),
            UnitOfWork.joining(session, recorder="tracer") as joined,
        ):
            joined.mnests.record_passing(*EDGE)
            joined.commit()
    finally:
        engine.dispose()
    assert recorders(store_url) == ["cli", "tracer"]


def test_async_units_and_joined_units_take_a_recorder(store_url: str) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        try:
            sessions = make_async_session_factory(engine)
            async with AsyncUnitOfWork(sessions, recorder="cli") as uow:
                await uow.mnests.record_passing(*EDGE)
                await uow.commit()
            async with (
                sessions() as session,
                session.begin(),
                AsyncUnitOfWork.joining(session, recorder="otel") as joined,
            ):
                await joined.mnests.record_passing(*EDGE)
                await joined.commit()
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert recorders(store_url) == ["cli", "otel"]


def test_a_unit_refuses_an_unknown_recorder(store_url: str) -> None:
    engine = make_engine(store_url)
    try:
        with pytest.raises(mnestoma.InvalidInput):
            UnitOfWork(make_session_factory(engine), recorder="somebody")
    finally:
        engine.dispose()
