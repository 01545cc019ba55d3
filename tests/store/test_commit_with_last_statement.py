"""SQLite: a facade's write commits right after its last statement, at the driver, so that
no step of the call after it holds the write lock; a write in a transaction the caller owns
never commits it, and a connection whose commits somebody observes commits as ever."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

import mnestoma
from mnestoma.schema.runner import DriverRunner

EDGE = ("cl.src", "1", "cl.dst", "1")
NEXT = ("cl.dst", "1", "cl.end", "1")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    return url


def _free_uses(path: str) -> int | None:
    """The edge's committed uses when another connection takes the write lock at once
    (None: the lock is held)."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return None
        row = other.execute(
            "SELECT uses FROM mnests WHERE src_executor = ? AND dst_executor = ?"
            " AND state = 'active'",
            (EDGE[0], EDGE[2]),
        ).fetchone()
        other.execute("ROLLBACK")
        return None if row is None else int(row[0])
    finally:
        other.close()


@pytest.fixture
def looking(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int | None]]:
    """What another connection sees as each write's last statement returns, before the
    facade's own commit runs."""
    path = sqlite_url.removeprefix("sqlite:///")
    seen: list[int | None] = []
    original = DriverRunner.many_committing

    def look(self: DriverRunner, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(_free_uses(path))

    monkeypatch.setattr(DriverRunner, "many_committing", look)
    yield seen


def test_a_facades_passing_is_committed_and_the_lock_free_when_its_last_statement_returns(
    sqlite_url: str, looking: list[int | None]
) -> None:
    with mnestoma.Mnestoma(sqlite_url) as store:
        store.record_passing(*EDGE)  # created
        m = store.record_passing(*EDGE)  # reinforced
    assert m.uses == 2
    assert looking == [1, 2]


def test_a_facades_turn_is_committed_and_the_lock_free_when_its_last_statement_returns(
    sqlite_url: str, looking: list[int | None]
) -> None:
    with mnestoma.Mnestoma(sqlite_url) as store:
        rows = store.record_turn("t1", [EDGE, NEXT])  # its last statement counts a chain
        assert [r.uses for r in rows] == [1, 1]
        rows = store.record_turn("t2", [EDGE, EDGE])  # no chain: the events are the last
        assert [r.uses for r in rows] == [3, 3]
        assert store.record_turn("t2", [EDGE, EDGE])[0].uses == 3  # again: nothing counted
    assert looking == [1, 3, 3]


def test_a_passing_in_the_callers_transaction_is_not_committed_by_its_last_statement(
    sqlite_url: str,
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    with mnestoma.Mnestoma(sqlite_url) as store:
        store.record_passing(*EDGE)
    engine = mnestoma.make_engine(sqlite_url)
    sessions = mnestoma.make_session_factory(engine)
    try:
        with mnestoma.UnitOfWork(sessions) as uow:
            assert uow.mnests.record_passing(*EDGE).uses == 2
            assert uow.mnests.record_turn("t", [EDGE, NEXT])[0].uses == 3
            assert _free_uses(path) is None  # the caller's transaction holds the lock
            uow.rollback()
        assert _free_uses(path) == 1  # nothing of it was committed
    finally:
        engine.dispose()


def test_a_facades_passing_whose_commits_are_observed_commits_through_sqlalchemy(
    sqlite_url: str, looking: list[int | None]
) -> None:
    """A ``commit`` listener of the service sees each commit before it happens: the last
    statement leaves the lock held, and the unit's commit, seen by the listener, ends it."""
    path = sqlite_url.removeprefix("sqlite:///")
    commits: list[int | None] = []
    engine = mnestoma.make_engine(sqlite_url)
    event.listen(engine, "commit", lambda conn: commits.append(_free_uses(path)))
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            assert store.record_passing(*EDGE).uses == 2
    finally:
        engine.dispose()
    assert looking == [None, None]  # still locked after the last statement
    assert commits == [None, None]  # the listener ran before the commit, as ever
    assert _free_uses(path) == 2


def test_a_commit_that_fails_at_the_driver_raises_the_packages_error_and_leaves_the_store_as_it_was(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    with mnestoma.Mnestoma(sqlite_url) as store:
        store.record_passing(*EDGE)
        dialect = store.engine.dialect
        original = dialect.do_commit
        failed: list[bool] = []

        def failing(dbapi: Any) -> None:
            if not failed:
                failed.append(True)
                raise sqlite3.OperationalError("disk I/O error")
            original(dbapi)

        monkeypatch.setattr(dialect, "do_commit", failing)
        with pytest.raises(mnestoma.StoreError) as caught:
            store.record_passing(*EDGE)
        assert not isinstance(caught.value.__cause__, sqlite3.Error)  # SQLAlchemy's wrapper
        assert failed == [True]
        assert _free_uses(path) == 1  # rolled back, the lock released
        assert store.record_passing(*EDGE).uses == 2
