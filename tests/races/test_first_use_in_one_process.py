"""Threads and coroutines of one process making their first call on one store at once.

Processes are serialised by the database's migration lock; callers inside one process also
share Alembic's module-level migration context, so the package lets one migration of the
process run at a time (``MIGRATION_GATE``). Without it, every caller could fail and leave a
new SQLite store with no schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import mnestoma
from mnestoma.aio import AsyncMnestoma
from mnestoma.maintenance.migration import MIGRATION_GATE, head_revision

EDGE = ("first.src", "1", "first.dst", "1")
THREADS = 8


def _at_once(n: int, work: Callable[[int], Any]) -> tuple[list[Any], list[BaseException]]:
    """``work(i)`` in ``n`` threads released together: what each returned, what each raised."""
    start = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            results.append(work(i))
        except BaseException as err:  # every failure is reported
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results, errors


@contextlib.contextmanager
def gate_held_by_another_thread() -> Iterator[threading.Event]:
    """The process's migration gate held by another thread for the block, or until the
    event given to the block is set."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with MIGRATION_GATE.held():
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        yield release
    finally:
        release.set()
        thread.join(10)


def test_threads_opening_a_new_sqlite_store_at_once_all_record_and_none_sees_a_half_made_one(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"

    def first_call(_: int) -> int:
        with mnestoma.Mnestoma(url) as store:
            return store.record_passing(*EDGE).uses

    results, errors = _at_once(THREADS, first_call)
    assert errors == []
    assert sorted(results) == list(range(1, THREADS + 1))
    assert mnestoma.current_revision(url) == head_revision()


def test_threads_upgrading_one_new_database_at_once_all_end_at_head(
    engine_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'new.sqlite'}"
        if engine_name == "sqlite"
        else request.getfixturevalue("pg_empty_db_url")
    )
    results, errors = _at_once(4, lambda _: mnestoma.upgrade(url))
    assert errors == []
    assert all(r.after == head_revision() for r in results)
    assert sum(r.moved for r in results) == 1  # one did the work, three waited
    assert mnestoma.current_revision(url) == head_revision()


def test_async_doors_of_one_loop_opening_a_new_sqlite_store_at_once_all_record(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"

    async def main() -> list[Any]:
        doors = [AsyncMnestoma(url) for _ in range(4)]
        try:
            return await asyncio.gather(
                *(d.record_passing(*EDGE) for d in doors), return_exceptions=True
            )
        finally:
            for d in doors:
                await d.close()

    results = asyncio.run(asyncio.wait_for(main(), 120))
    assert [type(r).__name__ for r in results] == ["Mnest"] * 4
    assert sorted(r.uses for r in results) == [1, 2, 3, 4]


def test_an_async_door_waits_for_a_threads_migration_without_blocking_its_loop(
    tmp_path: Path,
) -> None:
    """While another thread holds the gate, the loop keeps running its other work; the
    door's first call completes once the gate is free."""
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"

    async def main(release: threading.Event) -> tuple[int, int]:
        ticks = 0

        async def ticking() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(ticking())
        door = AsyncMnestoma(url)
        try:
            call = asyncio.ensure_future(door.record_passing(*EDGE))
            await asyncio.sleep(0.3)
            assert not call.done()  # waiting for the gate
            seen = ticks
            release.set()
            return (await asyncio.wait_for(call, 60)).uses, seen
        finally:
            ticker.cancel()
            await door.close()

    started = time.monotonic()
    with gate_held_by_another_thread() as release:
        uses, ticks = asyncio.run(main(release))
    assert uses == 1
    assert ticks >= 10  # the loop ran its other work while the door waited
    assert time.monotonic() - started < 60


def test_a_sync_migration_in_the_loop_thread_of_an_async_holder_is_refused_not_run_alongside(
    tmp_path: Path,
) -> None:
    """A coroutine holds the gate while its migration waits at an ``await``; sync code of
    another coroutine of the same loop cannot wait for it (the loop would stop) and must not
    run its migration alongside (Alembic's context is one per process): ConflictError, and
    the new store is not migrated."""
    url = f"sqlite:///{tmp_path / 'other.sqlite'}"

    async def main() -> None:
        async with MIGRATION_GATE.held_async():
            with pytest.raises(mnestoma.ConflictError, match="event loop"):
                mnestoma.Mnestoma(url)
            with pytest.raises(mnestoma.ConflictError, match="event loop"):
                mnestoma.upgrade(url)
            assert mnestoma.current_revision(url) is None
        with mnestoma.Mnestoma(url) as store:  # once the gate is free, as ever
            assert store.record_passing(*EDGE).uses == 1

    asyncio.run(main())


def test_an_async_door_on_a_store_at_head_does_not_wait_for_the_gate(store_url: str) -> None:
    """Only a store behind head needs the gate: another thread's long migration does not
    hold up an async door whose store is at head."""

    async def main() -> int:
        door = AsyncMnestoma(store_url)
        try:
            return (await asyncio.wait_for(door.record_passing(*EDGE), 20)).uses
        finally:
            await door.close()

    with gate_held_by_another_thread():
        assert asyncio.run(main()) == 1


def test_two_coroutines_migrating_through_run_sync_at_once_do_not_hang(tmp_path: Path) -> None:
    """Two coroutines of one loop each run ``mnestoma.upgrade`` in a greenlet of their own
    (``run_sync``): the second cannot wait for the first in the loop's thread, and gets
    ConflictError at once; the first migrates."""
    from sqlalchemy.ext.asyncio import create_async_engine

    async def one(i: int) -> Any:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / f'rs{i}.sqlite'}")
        try:
            async with engine.begin() as conn:
                return (await conn.run_sync(mnestoma.upgrade)).after
        finally:
            await engine.dispose()

    async def main() -> list[Any]:
        return await asyncio.wait_for(asyncio.gather(one(1), one(2), return_exceptions=True), 60)

    results = asyncio.run(main())
    assert sorted(type(r).__name__ for r in results) == ["ConflictError", "str"]
    assert head_revision() in results


def test_a_migration_left_pending_by_a_closed_event_loop_does_not_hold_up_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event loop closed while its async door was migrating (its task never resumed)
    leaves the gate to the process: the next caller takes it over and migrates."""
    from sqlalchemy.util import await_only

    import mnestoma.doors.shared as shared

    original = shared.ensure_at_head

    def slow(engine: Any, *, auto_migrate: bool) -> None:
        await_only(asyncio.sleep(0.5))
        original(engine, auto_migrate=auto_migrate)

    monkeypatch.setattr(shared, "ensure_at_head", slow)

    def abandoned() -> None:
        loop = asyncio.new_event_loop()
        door = AsyncMnestoma(f"sqlite:///{tmp_path / 'left.sqlite'}")
        with pytest.raises(TimeoutError):
            loop.run_until_complete(asyncio.wait_for(door.record_passing(*EDGE), 0.2))
        loop.close()

    thread = threading.Thread(target=abandoned)
    thread.start()
    thread.join(30)
    monkeypatch.setattr(shared, "ensure_at_head", original)
    results, errors = _at_once(1, lambda _: _first_call(f"sqlite:///{tmp_path / 'next.sqlite'}"))
    assert errors == []
    assert results == [1]


def _first_call(url: str) -> int:
    with mnestoma.Mnestoma(url) as store:
        return store.record_passing(*EDGE).uses
