"""A facade keeps one connection of its own engine between its writes (no pool checkout or
check-in per call), and replaces it whenever it could not be trusted as it is."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import MovableClock
from sqlalchemy import Engine, event, text

import mnestoma
from mnestoma.errors import InvalidInput
from mnestoma.store.uow import ConnectionUnitOfWork, written

EDGE = ("a", "1", "b", "1")


def _checkouts(engine: Engine) -> list[int]:
    """A list that grows by one at each checkout from ``engine``'s pool (as it is now)."""
    seen: list[int] = []

    def on_checkout(*_: Any) -> None:
        seen.append(1)

    event.listen(engine.pool, "checkout", on_checkout)
    return seen


def test_a_facades_writes_check_one_connection_out_for_all_of_them(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        seen = _checkouts(store.engine)
        for _ in range(5):
            store.record_passing(*EDGE)
        store.record_turn("t1", [EDGE, ("b", "1", "c", "1")])
        assert seen == []
        assert store.record_passing(*EDGE).uses == 8


def test_a_facade_on_a_services_engine_checks_out_per_write_as_the_service_configured(
    store_url: str,
) -> None:
    engine = mnestoma.make_engine(store_url)
    try:
        with mnestoma.Mnestoma(engine) as store:
            seen = _checkouts(engine)
            for _ in range(3):
                store.record_passing(*EDGE)
            assert len(seen) == 3
            assert engine.pool.checkedout() == 0
    finally:
        engine.dispose()


def test_a_failed_write_gives_its_connection_back_and_the_next_write_works(
    store_url: str,
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        assert store.engine.pool.checkedout() == 1  # the kept one
        with pytest.raises(InvalidInput):
            store.record_passing(*EDGE, outcome="maybe")
        assert store.engine.pool.checkedout() == 0  # given back to the pool
        assert store.record_passing(*EDGE).uses == 2
        assert store.engine.pool.checkedout() == 1


@pytest.fixture
def counted(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[mnestoma.Mnestoma, list[ConnectionUnitOfWork]]]:
    """A facade, and every connection unit of work built from its first call on."""
    built: list[ConnectionUnitOfWork] = []
    init = ConnectionUnitOfWork.__init__

    def counting(self: ConnectionUnitOfWork, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    with mnestoma.Mnestoma(store_url) as store:
        monkeypatch.setattr(ConnectionUnitOfWork, "__init__", counting)
        yield store, built


def test_a_facades_writes_on_its_kept_connection_share_one_unit_of_work(
    counted: tuple[mnestoma.Mnestoma, list[ConnectionUnitOfWork]],
) -> None:
    store, built = counted
    for _ in range(5):
        store.record_passing(*EDGE)
    store.record_turn("t1", [EDGE, ("b", "1", "c", "1")])
    assert len(built) == 1  # the kept connection's, built at its first write
    assert store.record_passing(*EDGE).uses == 7
    assert len(built) == 1


def test_a_failed_write_gives_its_kept_unit_up_with_its_connection(
    counted: tuple[mnestoma.Mnestoma, list[ConnectionUnitOfWork]],
) -> None:
    store, built = counted
    store.record_passing(*EDGE)
    with pytest.raises(InvalidInput):
        store.record_passing(*EDGE, outcome="maybe")
    assert store.record_passing(*EDGE).uses == 2
    assert len(built) == 2  # a new connection kept, and a unit of its own
    assert built[1].connection is not built[0].connection
    assert built[0].connection.closed  # the first given back to the pool


def test_a_read_after_the_commit_keeps_the_connection_and_ends_its_transaction(
    store_url: str,
) -> None:
    """A facade with replicas reads the primary's WAL position after each commit, in a
    transaction of its own: it is ended as the unit's block ends, and the connection stays
    kept (given back at each write, it would cost a checkout and a unit of its own)."""
    with mnestoma.Mnestoma(store_url) as store:
        seen: list[Any] = []

        def read_after(conn: Any) -> None:
            conn.execute(text("SELECT 1"))
            seen.append(conn)

        for _ in range(3):
            written(
                store.engine,
                lambda u: u.mnests.record_passing(*EDGE),
                after_commit=read_after,
                kept=store._kept,
            )
        assert len(seen) == 3 and seen[0] is seen[1] is seen[2]  # the one kept connection
        assert not seen[0].in_transaction()
        assert store.engine.pool.checkedout() == 1
        assert store.record_passing(*EDGE).uses == 4


def test_close_returns_the_kept_connection_and_a_primary_view_leaves_it(
    store_url: str,
) -> None:
    store = mnestoma.Mnestoma(store_url)
    store.record_passing(*EDGE)
    view = store.primary
    view.record_passing(*EDGE)
    view.close()  # the engines are the store's
    assert store.engine.pool.checkedout() == 1
    assert store.record_passing(*EDGE).uses == 3
    pool = store.engine.pool
    store.close()
    assert pool.checkedout() == 0


def test_a_listener_added_after_the_first_write_sees_the_next_ones(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        seen: list[str] = []

        def before(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
            seen.append(statement)

        event.listen(store.engine, "before_cursor_execute", before)
        try:
            store.record_passing(*EDGE)
        finally:
            event.remove(store.engine, "before_cursor_execute", before)
        assert any("mnests" in s for s in seen)
        assert any("events" in s for s in seen)


def test_sql_logging_turned_on_after_the_first_write_shows_the_next_ones(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
            store.record_passing(*EDGE)
        logged = " ".join(r.getMessage() for r in caplog.records)
        assert "FROM mnests" in logged
        caplog.clear()
        store.record_passing(*EDGE)  # logging off again: nothing more
        assert "FROM mnests" not in " ".join(r.getMessage() for r in caplog.records)


def _driver_closed(dbapi: Any) -> bool:
    """Whether a driver connection (sqlite3's or psycopg's) is closed."""
    if isinstance(dbapi, sqlite3.Connection):
        try:
            dbapi.execute("SELECT 1")
        except sqlite3.ProgrammingError:
            return True
        return False
    return bool(dbapi.closed)


def test_a_disposed_pool_is_left_for_a_connection_of_the_new_one(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        old = store.engine.pool
        kept = store._kept._conn  # type: ignore[union-attr]
        assert kept is not None
        old_driver = kept.connection.dbapi_connection
        store.engine.dispose()
        assert store.record_passing(*EDGE).uses == 2
        assert store.engine.pool is not old
        assert store.engine.pool.checkedout() == 1
        # the old one is closed, not left open in the disposed pool (a session on the server)
        assert _driver_closed(old_driver)


def test_threads_that_find_the_kept_connection_taken_write_through_the_pool(
    store_url: str, clock: MovableClock
) -> None:
    with mnestoma.Mnestoma(store_url, clock=clock) as store:
        store.record_passing(*EDGE)
        errors: list[BaseException] = []
        start = threading.Barrier(6)

        def writer() -> None:
            start.wait()
            try:
                for _ in range(20):
                    store.record_passing(*EDGE)
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [threading.Thread(target=writer) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.record_passing(*EDGE).uses == 1 + 6 * 20 + 1
        assert store.engine.pool.checkedout() == 1


def test_close_after_a_write_stopped_while_it_held_the_connection_gives_it_back(
    store_url: str,
) -> None:
    """An exception raised into the thread (a KeyboardInterrupt) can stop a write between
    taking the kept connection and the block that puts it back: close() in that thread
    gives it back, where it waited for it forever."""
    store = mnestoma.Mnestoma(store_url)
    store.record_passing(*EDGE)
    kept = store._kept
    assert kept is not None

    def stopped_write_then_close() -> None:
        assert kept.take() is not None  # taken, and never put back
        assert store.record_passing(*EDGE).uses == 2  # through the pool meanwhile
        store.close()

    writer = threading.Thread(target=stopped_write_then_close)
    writer.start()
    writer.join(10)
    assert not writer.is_alive()
    assert store.engine.pool.checkedout() == 0


def test_a_write_inside_a_write_of_the_same_thread_does_not_take_its_connection(
    store_url: str,
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        kept = store._kept
        assert kept is not None
        outer = kept.take()
        assert outer is not None
        assert kept.take() is None  # the pool's, for the inner write
        kept.put_back(outer, failed=False)
        assert kept.take() is outer
        kept.put_back(outer, failed=False)
