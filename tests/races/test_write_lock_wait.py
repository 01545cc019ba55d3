"""How a write of the package waits for SQLite's write lock: each try takes the lock or
fails at once (no busy timeout), and the write sleeps between its tries, briefly after the
first, then longer while it says that it waits; the lock timeout bounds it all.
"""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import make_url

import mnestoma
from mnestoma import WriteLockTimeout
from mnestoma.core import rules
from mnestoma.engines import locking
from mnestoma.engines.locking import (
    ENV_LOCK_TIMEOUT,
    pauses_letting_writers_in,
    saying_it_waits,
    waiting_file,
)

pytestmark = pytest.mark.parametrize("engine_name", ["sqlite"])  # SQLite's write lock


class Holder:
    """Another connection holding the store's write lock until :meth:`release`."""

    def __init__(self, url: str) -> None:
        self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.release()
        self.conn.close()


@pytest.fixture
def holder(store_url: str) -> Iterator[Holder]:
    held = Holder(store_url)
    try:
        yield held
    finally:
        held.close()


def record_pauses(
    monkeypatch: pytest.MonkeyPatch, holder: Holder, release_after: int | None
) -> list[tuple[float, int, bool]]:
    """Each pause of a waiting write: (seconds, the waiting connection's busy timeout then,
    whether it says that it waits); the holder lets the lock go after ``release_after``."""
    pauses: list[tuple[float, int, bool]] = []
    real = locking._pause

    def pause(dbapi: Any, seconds: float) -> None:
        busy = int(dbapi.execute("PRAGMA busy_timeout").fetchone()[0])
        pauses.append((seconds, busy, bool(locking._SAYING)))
        if release_after is not None and len(pauses) == release_after:
            holder.release()
        real(dbapi, seconds)

    monkeypatch.setattr(locking, "_pause", pause)
    return pauses


def test_a_write_behind_the_lock_tries_without_a_busy_timeout_sleeping_short_then_long(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's busy handler is not used: each try fails at once, the write says that it
    waits and sleeps WRITE_LOCK_FIRST_PAUSE_S, then WRITE_LOCK_POLL_S between tries; once
    the lock is free its next try takes it, and the connection's own busy timeout is back
    for the statements that follow."""
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")  # the store's connection ready
        holder = Holder(store_url)
        try:
            pauses = record_pauses(monkeypatch, holder, release_after=4)
            done = store.record_passing("a", "1", "b", "1")
        finally:
            holder.close()
        assert done.uses == 2
        first, poll = rules.WRITE_LOCK_FIRST_PAUSE_S, rules.WRITE_LOCK_POLL_S
        assert [p[0] for p in pauses] == [first, poll, poll, poll]
        assert all(busy == 0 and saying for _, busy, saying in pauses)
        assert not locking._SAYING  # no longer says it waits
        with store.engine.connect() as conn:
            rest = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        assert rest == round(locking.lock_timeout_seconds() * 1000)


def test_a_write_that_cannot_say_it_waits_tries_again_every_first_pause(
    store_url: str, holder: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its lock file (here: refused), a write cannot be seen by a prune or the ager
    between their batches: it tries every WRITE_LOCK_FIRST_PAUSE_S, so that it takes their
    short pauses (BATCH_PAUSE_S)."""
    monkeypatch.setattr(locking, "_say_waiting", lambda _path: -1)
    with mnestoma.Mnestoma(store_url) as store:
        pauses = record_pauses(monkeypatch, holder, release_after=3)
        assert store.record_passing("a", "1", "b", "1").uses == 1
    assert [p[0] for p in pauses] == [rules.WRITE_LOCK_FIRST_PAUSE_S] * 3
    assert rules.WRITE_LOCK_FIRST_PAUSE_S < rules.BATCH_PAUSE_S


def test_the_pauses_of_a_waiting_write_never_outlast_its_lock_timeout(
    store_url: str, holder: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last pause is what is left of the lock timeout: the write gives up on time with
    WriteLockTimeout, having written nothing."""
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "0.025")
    with mnestoma.Mnestoma(store_url) as store:
        pauses = record_pauses(monkeypatch, holder, release_after=None)
        with pytest.raises(WriteLockTimeout):
            store.record_passing("a", "1", "b", "1")
        holder.release()
        assert store.events() == []
    seconds = [p[0] for p in pauses]
    assert seconds[:2] == [rules.WRITE_LOCK_FIRST_PAUSE_S, rules.WRITE_LOCK_POLL_S]
    assert sum(seconds) <= 0.025 + 1e-9
    assert seconds[-1] < rules.WRITE_LOCK_POLL_S  # cut to what was left


# --- a pause between two batches of a prune ---------------------------------------------------


def test_a_pause_between_batches_lasts_while_a_write_says_that_it_waits(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pause's own seconds, then AGER_YIELD_POLL_S at a time while some write holds
    its shared flock on the waiting writers' file, and no more once it lets go."""
    url = make_url(store_url)
    with saying_it_waits(waiting_file(url)):
        pauses = pauses_letting_writers_in(url, rules.BATCH_PAUSE_S)
        assert next(pauses) == rules.BATCH_PAUSE_S
        assert [next(pauses) for _ in range(3)] == [rules.AGER_YIELD_POLL_S] * 3
    assert list(pauses) == []  # the write took the lock: the pause ends
    assert list(pauses_letting_writers_in(url, rules.BATCH_PAUSE_S)) == [rules.BATCH_PAUSE_S]


def test_a_pause_waits_for_a_write_that_says_it_waits_ager_yield_max_at_most(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(store_url)
    monkeypatch.setattr(locking, "AGER_YIELD_MAX_S", 0.02)
    with saying_it_waits(waiting_file(url)):
        pauses = list(pauses_letting_writers_in(url, 0.001))
    assert pauses[0] == 0.001 and len(pauses) > 1
    # pauses are not slept here: the loop ends on the clock alone, within the bound
    assert set(pauses[1:]) == {rules.AGER_YIELD_POLL_S}


def test_a_pause_of_no_seconds_or_on_a_file_without_flock_is_just_that(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(store_url)
    with saying_it_waits(waiting_file(url)):
        assert list(pauses_letting_writers_in(url, 0.0)) == [0.0]  # PostgreSQL's prune

        def no_flock(fd: int, op: int) -> None:
            raise OSError("no flock here")

        monkeypatch.setattr(fcntl, "flock", no_flock)
        assert list(pauses_letting_writers_in(url, 0.003)) == [0.003]
