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
from mnestoma.aio import (
    AsyncMnestoma,
    AsyncUnitOfWork,
    make_async_engine,
    make_async_session_factory,
)
from mnestoma.models import Event

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
                await asyncio.sleep(0.02)
                if store_url.startswith("sqlite") and not write_lock_is_free(
                    make_url(store_url).database or ""
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
    assert max(waits) < 1.9, waits


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
