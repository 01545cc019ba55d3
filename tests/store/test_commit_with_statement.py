"""PostgreSQL: a facade's passing sends its COMMIT with its one statement (psycopg's pipeline
mode), so that the row's lock is held for no round trip of the client; a passing in a
transaction the caller owns never commits it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

import mnestoma
from mnestoma.schema.runner import DriverRunner

EDGE = ("cw.src", "1", "cw.dst", "1")
LOCKED_NOWAIT = text(
    "SELECT uses FROM mnests WHERE src_executor = :s AND dst_executor = :d"
    " AND state = 'active' FOR UPDATE NOWAIT"
)


@pytest.fixture
def observer(pg_store_url: str) -> Iterator[Any]:
    """A connection of another session, in autocommit, to look at the row meanwhile."""
    engine = create_engine(pg_store_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        yield conn
    engine.dispose()


def _uses_if_unlocked(conn: Any) -> int | None:
    """The row's committed uses when another session can lock it at once, else None."""
    try:
        return int(conn.execute(LOCKED_NOWAIT, {"s": EDGE[0], "d": EDGE[2]}).scalar_one())
    except Exception:
        return None


def test_a_facades_passing_is_committed_and_its_row_free_when_its_statement_returns(
    pg_store_url: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int | None] = []
    original = DriverRunner.first_committing

    def looking(self: DriverRunner, *args: Any, **kwargs: Any) -> Any:
        found = original(self, *args, **kwargs)
        seen.append(_uses_if_unlocked(observer))  # before the facade's own commit runs
        return found

    monkeypatch.setattr(DriverRunner, "first_committing", looking)
    with mnestoma.Mnestoma(pg_store_url) as store:
        store.record_passing(*EDGE)
        m = store.record_passing(*EDGE)
    assert m.uses == 2
    assert seen == [1, 2]  # committed, and nobody holds the row, as each statement returns


def test_a_passing_in_the_callers_transaction_is_not_committed_by_its_statement(
    pg_store_url: str, observer: Any
) -> None:
    with mnestoma.Mnestoma(pg_store_url) as store:
        store.record_passing(*EDGE)
    engine = mnestoma.make_engine(pg_store_url)
    sessions = mnestoma.make_session_factory(engine)
    try:
        with mnestoma.UnitOfWork(sessions) as uow:
            assert uow.mnests.record_passing(*EDGE).uses == 2
            assert _uses_if_unlocked(observer) is None  # the caller's transaction holds it
            uow.rollback()
        assert _uses_if_unlocked(observer) == 1  # nothing of it was committed
    finally:
        engine.dispose()


def test_a_facades_passing_with_a_listener_commits_as_ever(
    pg_store_url: str, observer: Any
) -> None:
    """A listener sends every statement through SQLAlchemy: the statement alone, then the
    unit's commit, each seen by the listener."""
    from sqlalchemy import event

    statements: list[str] = []
    engine = mnestoma.make_engine(pg_store_url)
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            assert store.record_passing(*EDGE).uses == 2
    finally:
        engine.dispose()
    assert _uses_if_unlocked(observer) == 2
    assert sum("WITH locked" in s for s in statements) == 2
