"""Cancelling async writes (a request's timeout, a client gone) leaves no transaction open.

A cancellation can land at any await. Each door is cancelled hundreds of times at random
points, with the garbage collector off so that it cannot close a leaked connection for us;
afterwards another process's writer gets the write lock at once, no connection is left in a
transaction, and every passing the store kept has its event.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.doors.asynchronous import (
    AsyncMnestoma,
    AsyncUnitOfWork,
    make_async_engine,
    make_async_session_factory,
)
from mnestoma.schema.models import Event

CANCELLATIONS = 300
EDGES = [("cx.src", "1", f"cx.dst{i}", "1") for i in range(4)]

Write = Callable[[int], Awaitable[Any]]


def facade_door(store: AsyncMnestoma, sessions: Any) -> Write:
    return lambda n: store.record_passing(*EDGES[n % len(EDGES)])


def unit_door(store: AsyncMnestoma, sessions: Any) -> Write:
    async def write(n: int) -> None:
        async with AsyncUnitOfWork(sessions) as uow:
            await uow.mnests.record_passing(*EDGES[n % len(EDGES)])
            await uow.commit()

    return write


def joined_door(store: AsyncMnestoma, sessions: Any) -> Write:
    async def write(n: int) -> None:
        async with (
            sessions() as session,
            session.begin(),
            AsyncUnitOfWork.joining(session) as uow,
        ):
            await uow.mnests.record_passing(*EDGES[n % len(EDGES)])
            await uow.commit()

    return write


DOORS = {"facade": facade_door, "unit": unit_door, "joined_unit": joined_door}


def open_transactions(url: str) -> int:
    """Other connections of this PostgreSQL database left inside a transaction."""
    engine = create_engine(make_url(url))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


# How long the units that went on after their callers' cancellation may take to end: a bound
# on a hang only (they end in milliseconds on an idle machine).
SETTLE_S = 60.0


async def cancelled_units_ended() -> None:
    """Wait for the units of work that went on after their callers were cancelled: each
    ends in a task of its own on this event loop (a rollback, a connection given back).

    The write lock is looked at only then, and from another thread: a look that blocked
    the loop (a fixed pause, then a probe waiting on SQLite's lock in the loop's own
    thread) kept a unit still ending from giving the lock back, and reported a leak on a
    loaded machine where the pause was too short. A connection truly left in a
    transaction holds the lock whatever the wait (the garbage collector is off)."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=SETTLE_S)


def write_lock_is_free(path: str) -> bool:
    probe = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


@pytest.mark.parametrize("door", list(DOORS))
def test_cancelled_async_writes_leave_no_transaction_open(store_url: str, door: str) -> None:
    rng = random.Random(23)
    leaks: list[int] = []

    async def main() -> None:
        engine = make_async_engine(store_url)
        store = AsyncMnestoma(engine)
        await store.record_passing(*EDGES[0])
        write = DOORS[door](store, make_async_session_factory(engine))
        for n in range(CANCELLATIONS):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(write(n), timeout=rng.uniform(0.0001, 0.004))
            if n % 50 == 49:
                await cancelled_units_ended()
                if store_url.startswith("sqlite") and not await asyncio.to_thread(
                    write_lock_is_free, make_url(store_url).database or ""
                ):
                    leaks.append(n)
        await store.close()
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        await engine.dispose()

    gc.disable()
    try:
        asyncio.run(main())
        if not store_url.startswith("sqlite"):
            assert open_transactions(store_url) == 0
        assert leaks == []
    finally:
        gc.enable()
    with mnestoma.Mnestoma(store_url) as m:
        uses = sum(e.uses for e in m.edges())
        with m.engine.connect() as conn:
            counted = conn.execute(
                select(func.count())
                .select_from(Event)
                .where(Event.kind.in_(["created", "reinforced"]))
            ).scalar_one()
        assert uses == counted >= 1
        m.record_passing(*EDGES[0])  # and the store takes writes at once


def test_async_writes_queued_behind_each_other_give_up_within_one_lock_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes queued in one SQLite facade share the lock timeout, not one each (SQLite's
    write lock only: PostgreSQL writers wait on rows, under the server's own timeouts)."""
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(store_url)
    monkeypatch.setenv("MNESTOMA_LOCK_TIMEOUT", "1")
    holder = sqlite3.connect(tmp_path / "store.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    async def timed(store: AsyncMnestoma, edge: tuple[str, str, str, str]) -> float:
        start = time.monotonic()
        with pytest.raises(mnestoma.WriteLockTimeout):
            await store.record_passing(*edge)
        return time.monotonic() - start

    async def main() -> list[float]:
        async with AsyncMnestoma(store_url) as store:
            return await asyncio.gather(*(timed(store, edge) for edge in EDGES[:3]))

    try:
        waits = asyncio.run(main())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # Each waits the timeout; with one timeout each, queued behind each other, the last would
    # give up a second or two after the first. The spread, not the absolute time, says which:
    # a loaded machine that stalls the process delays all three alike.
    assert min(waits) >= 0.99, waits
    assert max(waits) - min(waits) < 0.6, waits


def test_an_async_store_serves_one_event_loop_after_another(store_url: str) -> None:
    """A store whose schema check ran in an event loop since ended checks nothing again and
    keeps working in the next loop (a test runner's loop per test, a worker's restart)."""
    store = AsyncMnestoma(store_url)

    async def once() -> int:
        return (await store.record_passing(*EDGES[0])).uses

    try:
        assert [asyncio.run(once()) for _ in range(3)] == [1, 2, 3]
    finally:
        asyncio.run(store.close())


RUN_CANCELLATIONS = 100


def run_has_ended(url: str, within: float) -> bool:
    """Within ``within`` seconds, no run of the ager holds its lock, no other connection is
    left in a transaction (PostgreSQL), and another connection gets the write lock (SQLite)."""
    from mnestoma.maintenance.status import collect_status

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        unfinished = collect_status(url).ager_unfinished or []
        if not any(r.running for r in unfinished):
            if url.startswith("sqlite"):
                return write_lock_is_free(make_url(url).database or "")
            return open_transactions(url) == 0
        time.sleep(0.01)
    return False


def test_a_cancelled_async_run_of_the_ager_stops_and_gives_its_connection_back(
    store_url: str,
) -> None:
    """A run of the ager cancelled mid-way (``asyncio.wait_for`` with a tiny timeout) stops
    within a batch: at once its lock is free, another connection writes, and no connection
    is left in a transaction, with the garbage collector off (before, on SQLite, the run's
    connection was left holding a batch's write lock until it ran). The store says the run
    was interrupted, and the next run completes it to the result of one run."""
    from ager_kit import StoppedClock
    from test_ager_batches import one_transaction, reset, snapshot

    from mnestoma.maintenance.status import collect_status

    _, (left, _) = one_transaction(store_url)
    reset(store_url)
    rng = random.Random(36)
    stuck: list[int] = []
    cancelled: list[int] = []

    async def main() -> None:
        engine = make_async_engine(store_url)
        store = AsyncMnestoma(engine, clock=StoppedClock())
        async with store:
            for n in range(RUN_CANCELLATIONS):
                try:
                    await asyncio.wait_for(
                        store.apply_ager(batch_rows=5), timeout=rng.uniform(0.0005, 0.03)
                    )
                except TimeoutError:
                    cancelled.append(n)
                # another thread: the loop goes on, and with it the end of the cancelled run
                if not await asyncio.to_thread(run_has_ended, store_url, 2.0):
                    stuck.append(n)
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        await engine.dispose()

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
    assert stuck == []
    assert len(cancelled) >= RUN_CANCELLATIONS // 2, "the runs ended before their timeout"
    status = collect_status(store_url)
    assert status.ager_interrupted and not any(r.running for r in status.ager_unfinished or [])
    with mnestoma.Mnestoma(store_url, clock=StoppedClock()) as store:
        store.apply_ager()
        assert snapshot(store.engine)[0] == left
    assert collect_status(store_url).ager_unfinished == []


def test_a_postgresql_run_cancelled_while_its_batch_waits_for_a_row_stops_waiting(
    pg_store_url: str,
) -> None:
    """A run whose batch waits for a row a writer holds (it waits as long as that lasts) is
    cancelled: it stops waiting within moments, while the writer still holds the row, gives
    its lock and connection back, and the next run completes it."""
    from ager_kit import StoppedClock
    from test_ager_batches import ROWS, held_row_and_page, one_transaction, reset, snapshot

    from mnestoma.maintenance.status import collect_status

    _, (left, _) = one_transaction(pg_store_url)
    reset(pg_store_url)
    held, _ = held_row_and_page(pg_store_url, left)

    def running() -> bool:
        return any(r.running for r in collect_status(pg_store_url).ager_unfinished or [])

    async def main() -> float:
        engine = make_async_engine(pg_store_url)
        async with AsyncMnestoma(engine, clock=StoppedClock()) as store:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.apply_ager(batch_rows=len(ROWS) * 2), timeout=1.5)
                pytest.fail("the run did not wait for the held row")
            cancelled = time.monotonic()
            while await asyncio.to_thread(running):
                await asyncio.sleep(0.01)
            stopped = time.monotonic() - cancelled
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        await engine.dispose()
        return stopped

    engine = mnestoma.make_engine(pg_store_url)
    with engine.connect() as writer:
        writer.begin()
        writer.execute(text("SELECT id FROM mnests WHERE id = :id FOR UPDATE"), {"id": held})
        stopped = asyncio.run(main())
        assert open_transactions(pg_store_url) == 1  # the writer's, still holding its row
        writer.rollback()
    engine.dispose()
    assert stopped < 1.0
    assert collect_status(pg_store_url).ager_interrupted
    with mnestoma.Mnestoma(pg_store_url, clock=StoppedClock()) as store:
        store.apply_ager()
        assert snapshot(store.engine)[0] == left
