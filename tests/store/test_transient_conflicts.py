"""A transient conflict with another transaction inside a caller's own unit of work reaches
the caller as ``ConflictError`` on both engines, with nothing of the failed unit kept, and
the same work run again succeeds: SQLite's busy lock as before, PostgreSQL's deadlock and
serialization failure too (they were a plain ``StoreError``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from conftest import package_engine
from sqlalchemy import Engine, text

from mnestoma import MnestRepository, UnitOfWork, make_session_factory
from mnestoma.aio import AsyncUnitOfWork, make_async_engine, make_async_session_factory
from mnestoma.core.errors import (
    TRANSIENT_CONFLICT,
    ConflictError,
    MnestomaError,
    StoreError,
    is_retryable,
)
from mnestoma.engines.backend import backend_of
from mnestoma.testing.clock import MovableClock

FIRST = ("plan", "1", "search", "1")
SECOND = ("search", "1", "read", "1")
# How long the unit that took its first row waits for the other to take its own: on
# SQLite the other cannot (the write lock is the first unit's until it commits).
OTHER_HOLDS_WITHIN_S = 2.0


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    with package_engine(store_url) as eng:
        yield eng


def _uses(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT src_executor, uses FROM mnests")).all()
    return {src: int(uses) for src, uses in rows}


def _opposite_orders(engine: Engine, clock: MovableClock) -> list[BaseException | None]:
    """Two units of work on two threads, each writing both edges, in opposite orders: the
    second unit's first write comes once the first holds its row; the first's second write
    once the second holds its own (or after OTHER_HOLDS_WITHIN_S). What each raised."""
    factory = make_session_factory(engine)
    first_holds, second_holds = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = [None, None]

    def unit(i: int, order: tuple[tuple[str, ...], ...]) -> None:
        try:
            with UnitOfWork(factory, clock=clock) as uow:
                if i == 1:
                    first_holds.wait(10)
                uow.mnests.record_passing(*order[0])
                (first_holds if i == 0 else second_holds).set()
                if i == 0:
                    second_holds.wait(OTHER_HOLDS_WITHIN_S)
                uow.mnests.record_passing(*order[1])
                uow.commit()
        except BaseException as err:  # every failure counts, whatever its kind
            outcome[i] = err
            first_holds.set()

    threads = [
        threading.Thread(target=unit, args=(0, (FIRST, SECOND))),
        threading.Thread(target=unit, args=(1, (SECOND, FIRST))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcome


def test_two_units_writing_two_edges_in_opposite_orders_commit_or_one_gets_conflict_error(
    engine: Engine, clock: MovableClock
) -> None:
    """SQLite: the write lock queues the second unit, both commit. PostgreSQL: each holds
    one row and waits for the other's, the server ends one; that one raises ConflictError
    (retryable), keeps nothing, and run again it succeeds."""
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing(*FIRST)
        uow.mnests.record_passing(*SECOND)
        uow.commit()
    outcome = _opposite_orders(engine, clock)
    if backend_of(engine).one_writer:
        assert outcome == [None, None]
        assert _uses(engine) == {"plan": 3, "search": 3}
        return
    failed = [err for err in outcome if err is not None]
    assert len(failed) == 1, outcome
    err = failed[0]
    assert type(err) is ConflictError and not isinstance(err, StoreError)
    assert str(err).startswith(TRANSIENT_CONFLICT) and "deadlock" in str(err)
    assert is_retryable(err)
    assert _uses(engine) == {"plan": 2, "search": 2}  # the failed unit left nothing
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:  # run again
        uow.mnests.record_passing(*SECOND)
        uow.mnests.record_passing(*FIRST)
        uow.commit()
    assert _uses(engine) == {"plan": 3, "search": 3}


def test_a_serializable_unit_whose_row_changed_since_its_snapshot_gets_conflict_error(
    pg_store_url: str, clock: MovableClock
) -> None:
    """PostgreSQL, a service's SERIALIZABLE transactions: a unit that read before another
    committed a change to the row it then writes fails with a serialization failure, which
    reaches it as ConflictError, nothing kept; the same unit run again succeeds."""
    with package_engine(pg_store_url) as plain:
        with UnitOfWork(make_session_factory(plain), clock=clock) as uow:
            uow.mnests.record_passing(*FIRST)
            uow.commit()
        engine = plain.execution_options(isolation_level="SERIALIZABLE")
        factory = make_session_factory(engine)
        with pytest.raises(MnestomaError) as raised, factory() as session:
            assert len(MnestRepository(session).edges()) == 1  # the snapshot is taken
            with UnitOfWork(make_session_factory(plain), clock=clock) as other:
                other.mnests.record_passing(*FIRST)
                other.commit()
            with UnitOfWork.joining(session, clock=clock) as uow:
                uow.mnests.record_passing(*FIRST)
                uow.commit()
            session.commit()
        assert type(raised.value) is ConflictError
        assert str(raised.value).startswith(TRANSIENT_CONFLICT) and is_retryable(raised.value)
        assert _uses(plain) == {"plan": 2}
        with UnitOfWork(factory, clock=clock) as uow:
            uow.mnests.record_passing(*FIRST)
            uow.commit()
        assert _uses(plain) == {"plan": 3}


def test_an_async_unit_whose_row_changed_since_its_snapshot_gets_conflict_error_too(
    pg_store_url: str, clock: MovableClock
) -> None:
    """The async door translates the same way: a SERIALIZABLE async unit's serialization
    failure is a ConflictError, nothing of the unit kept."""
    with package_engine(pg_store_url) as plain:
        with UnitOfWork(make_session_factory(plain), clock=clock) as uow:
            uow.mnests.record_passing(*FIRST)
            uow.commit()

        async def serializable_unit() -> None:
            engine = make_async_engine(pg_store_url)
            try:
                serializable = engine.execution_options(isolation_level="SERIALIZABLE")
                async with make_async_session_factory(serializable)() as session:
                    await session.execute(text("SELECT count(*) FROM mnests"))  # the snapshot
                    with UnitOfWork(make_session_factory(plain), clock=clock) as other:
                        other.mnests.record_passing(*FIRST)
                        other.commit()
                    async with AsyncUnitOfWork.joining(session, clock=clock) as unit:
                        await unit.mnests.record_passing(*FIRST)
                        await unit.commit()
                    await session.commit()
            finally:
                await engine.dispose()

        with pytest.raises(MnestomaError) as raised:
            asyncio.run(serializable_unit())
        assert type(raised.value) is ConflictError
        assert str(raised.value).startswith(TRANSIENT_CONFLICT) and is_retryable(raised.value)
        assert _uses(plain) == {"plan": 2}
