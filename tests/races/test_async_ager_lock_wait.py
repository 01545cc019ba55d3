"""A cancelled async ager that waits for another run's lock stops waiting: its connection goes
back to the pool at once, usable, and the lock, released later, is not taken by it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Connection, text

import mnestoma
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.ager import AGER_LOCK_POLL_S, ager_run_lock, ager_running

# How long the run is watched waiting before it is cancelled.
WAITING_S = 0.5
# How soon a cancelled run must have given its connection back (it looks every 50 ms).
PROMPTLY_S = 2.0
# How long after the other run's release the cancelled one is watched not to go on.
AFTER_RELEASE_S = 0.5

# Backends of this database that wait for a lock on the server (the ager's advisory lock).
WAITING_BACKENDS = text(
    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
    " WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted"
)


@contextmanager
def another_run_holds_the_lock(url: str) -> Iterator[Connection]:
    """The ager's lock held as a run in another connection holds it (PostgreSQL: its session
    advisory lock; SQLite: the exclusive flock on ``<file>-ager.lock``); the connection."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn, ager_run_lock(conn):
            yield conn
    finally:
        engine.dispose()


def count(url: str, table: str) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


async def _returned(am: AsyncMnestoma) -> float:
    """Seconds until every connection of ``am``'s pool is back (at most PROMPTLY_S)."""
    pool = am.engine.sync_engine.pool
    start = time.monotonic()
    while pool.checkedout() and time.monotonic() - start < PROMPTLY_S:
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_a_cancelled_async_ager_stops_waiting_for_the_lock_of_the_run_under_way(
    store_url: str, engine_name: str
) -> None:
    async def cancelled_while_waiting(holder: Connection) -> None:
        am = AsyncMnestoma(store_url)
        try:
            await am.record_passing("a", "1", "b", "1")
            task = asyncio.ensure_future(am.apply_ager())
            await asyncio.sleep(WAITING_S)
            assert not task.done(), "the run did not wait for the run under way"
            pool = am.engine.sync_engine.pool
            assert pool.checkedout() == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            took = await _returned(am)
            assert pool.checkedout() == 0, (
                f"the cancelled run still holds its connection after {took:.2f} s"
            )
            assert took < PROMPTLY_S
            if engine_name == "postgresql":
                assert holder.execute(WAITING_BACKENDS).scalar_one() == 0
                holder.rollback()
            # the pooled connection is usable
            assert (await am.record_passing("a", "1", "b", "1")).uses == 2
        finally:
            await asyncio.wait_for(am.close(), PROMPTLY_S)

    with another_run_holds_the_lock(store_url) as holder:
        asyncio.run(cancelled_while_waiting(holder))
    time.sleep(max(AFTER_RELEASE_S, 5 * AGER_LOCK_POLL_S))
    # released, the lock is nobody's: the cancelled run neither took it nor went on
    engine = make_engine(store_url)
    try:
        with engine.connect() as conn:
            assert not ager_running(conn)
    finally:
        engine.dispose()
    assert count(store_url, "ager_runs") == count(store_url, "ager_progress") == 0
    with mnestoma.Mnestoma(store_url) as store:
        store.apply_ager()
    assert count(store_url, "ager_runs") == 1


def test_a_cancelled_async_ager_waiting_for_the_lock_lets_the_facade_close(
    store_url: str,
) -> None:
    """``close()`` waits for the units of cancelled callers: a run still waiting for another's
    lock would keep it waiting for as long as that run lasts."""

    async def cancel_then_close() -> float:
        am = AsyncMnestoma(store_url)
        task = asyncio.ensure_future(am.apply_ager())
        await asyncio.sleep(WAITING_S)
        task.cancel()
        start = time.monotonic()
        try:
            await asyncio.wait_for(am.close(), PROMPTLY_S)
        except TimeoutError:
            pytest.fail(f"close() waited more than {PROMPTLY_S} s for the cancelled run")
        return time.monotonic() - start

    with another_run_holds_the_lock(store_url):
        assert asyncio.run(cancel_then_close()) < PROMPTLY_S
    assert count(store_url, "ager_runs") == 0
