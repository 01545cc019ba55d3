"""How a write of the package waits for SQLite's write lock: each try takes the lock or
fails at once (no busy timeout), and the write sleeps between its tries, briefly after the
first, then longer while it says that it waits; the lock timeout bounds it all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import make_url

import mnestoma
from mnestoma import WriteLockTimeout
from mnestoma.core import rules
from mnestoma.engines import locking
from mnestoma.engines.doorbell import Doorbell, doorbell
from mnestoma.engines.locking import (
    ENV_LOCK_TIMEOUT,
    bell_file,
    pauses_letting_writers_in,
    saying_it_waits,
    waiting_file,
)
from mnestoma.maintenance.steps import for_write

pytestmark = pytest.mark.parametrize("engine_name", ["sqlite"])  # SQLite's write lock


class Holder:
    """Another connection holding the store's write lock until :meth:`release`."""

    def __init__(self, url: str) -> None:
        self.conn = sqlite3.connect(
            url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
        )
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
) -> list[tuple[float, bool]]:
    """Each pause of a waiting write, on the doorbell or not: (seconds, whether it says that
    it waits); the holder lets the lock go after ``release_after`` of them."""
    pauses: list[tuple[float, bool]] = []

    def noted(seconds: float) -> None:
        pauses.append((seconds, bool(locking._SAYING)))
        if release_after is not None and len(pauses) == release_after:
            holder.release()

    real_pause, real_sleep = locking._pause, Doorbell.sleep

    def pause(dbapi: Any, seconds: float) -> None:
        noted(seconds)
        real_pause(dbapi, seconds)

    def sleep(bell: Doorbell, seconds: float) -> None:
        noted(seconds)
        real_sleep(bell, seconds)

    monkeypatch.setattr(locking, "_pause", pause)
    monkeypatch.setattr(Doorbell, "sleep", sleep)
    return pauses


def record_busy_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The busy timeouts the package gives SQLite connections from now on (ms)."""
    given: list[int] = []
    real = locking._set_busy_timeout

    def set_busy_timeout(dbapi: Any, info: dict[Any, Any], ms: int) -> None:
        given.append(ms)
        real(dbapi, info, ms)

    monkeypatch.setattr(locking, "_set_busy_timeout", set_busy_timeout)
    return given


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
            busy = record_busy_timeouts(monkeypatch)
            done = store.record_passing("a", "1", "b", "1")
        finally:
            holder.close()
        assert done.uses == 2
        first, poll = rules.WRITE_LOCK_FIRST_PAUSE_S, rules.WRITE_LOCK_POLL_S
        assert [p[0] for p in pauses] == [first, poll, poll, poll]
        assert all(saying for _, saying in pauses)
        assert set(busy) <= {0}  # no wait in SQLite's busy handler
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
    assert seconds[0] == rules.WRITE_LOCK_FIRST_PAUSE_S
    assert all(0 < s <= rules.WRITE_LOCK_POLL_S for s in seconds)
    assert sum(seconds) <= 0.025 + 1e-9  # each cut to what was left


# --- a pause between two batches of a prune ---------------------------------------------------


def slept_through(pauses: Iterator[float], then: Any = None) -> list[float]:
    """The sleeps ``pauses`` asks for, each slept; ``then(n)`` after the n-th."""
    slept: list[float] = []
    for seconds in pauses:
        time.sleep(seconds)
        slept.append(seconds)
        if then is not None:
            then(len(slept))
    return slept


def test_a_pause_between_batches_lasts_while_a_write_says_that_it_waits(
    store_url: str,
) -> None:
    """AGER_YIELD_POLL_S at a time, the doorbell rung before each, while some write holds
    its shared flock on the waiting writers' file; once it lets go, no longer than the
    pause's own seconds in all."""
    url = make_url(store_url)
    bell = doorbell(bell_file(url))
    assert bell is not None
    bell.hush()
    waiting = contextlib.ExitStack()
    waiting.enter_context(saying_it_waits(waiting_file(url)))
    rung: list[bool] = []

    def then(n: int) -> None:
        rung.append(bell.rung())  # each sleep followed a ring
        os.read(bell.fd, 64)  # taken: the next sleep's ring is its own
        if n == 8:  # 4 ms: longer than the pause's own 3 ms
            waiting.close()

    started = time.monotonic()
    slept = slept_through(pauses_letting_writers_in(url, rules.BATCH_PAUSE_S), then)
    assert slept[:8] == [rules.AGER_YIELD_POLL_S] * 8 and rung[:8] == [True] * 8
    assert len(slept) <= 9  # it ended as the write let go
    assert time.monotonic() - started < rules.AGER_YIELD_MAX_S


def test_a_pause_leaves_the_bell_rung_while_it_lasts_and_empties_it_at_its_end(
    store_url: str,
) -> None:
    """The ring is a byte left in the bell (every sleeper sees it, not only the first to
    wake); the pause takes it back as it ends, so that writes behind other writes sleep
    long again."""
    url = make_url(store_url)
    bell = doorbell(bell_file(url))
    assert bell is not None
    bell.hush()
    rung: list[bool] = []
    with saying_it_waits(waiting_file(url)):
        pauses = pauses_letting_writers_in(url, rules.BATCH_PAUSE_S)
        for _ in range(3):
            time.sleep(next(pauses))
            rung.append(bell.rung())
    assert rung == [True] * 3
    list(pauses)  # the write let go: what is left of the pause's own seconds, if any
    assert not bell.rung()


def test_a_pause_with_no_write_waiting_lasts_its_own_seconds_without_ringing(
    store_url: str,
) -> None:
    url = make_url(store_url)
    bell = doorbell(bell_file(url))
    assert bell is not None
    bell.hush()
    started = time.monotonic()
    slept = slept_through(pauses_letting_writers_in(url, rules.BATCH_PAUSE_S))
    assert time.monotonic() - started >= rules.BATCH_PAUSE_S
    assert all(0 < s <= rules.AGER_YIELD_POLL_S for s in slept)
    assert not bell.rung()
    with pytest.raises(BlockingIOError):
        os.read(bell.fd, 64)  # nothing rung


def test_a_pause_waits_for_a_write_that_says_it_waits_ager_yield_max_at_most(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(store_url)
    monkeypatch.setattr(locking, "AGER_YIELD_MAX_S", 0.02)
    started = time.monotonic()
    with saying_it_waits(waiting_file(url)):
        slept = slept_through(pauses_letting_writers_in(url, 0.001))
    assert 0.02 <= time.monotonic() - started < 0.5
    assert set(slept) == {rules.AGER_YIELD_POLL_S}


def test_a_pause_of_no_seconds_or_on_a_file_without_flock_is_one_sleep(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = make_url(store_url)
    with saying_it_waits(waiting_file(url)):
        assert list(pauses_letting_writers_in(url, 0.0)) == [0.0]  # PostgreSQL's prune

        def no_flock(fd: int, op: int) -> None:
            raise OSError("no flock here")

        monkeypatch.setattr(fcntl, "flock", no_flock)
        started = time.monotonic()
        slept_through(pauses_letting_writers_in(url, 0.003))
        assert 0.003 <= time.monotonic() - started < 0.5


# --- the doorbell ------------------------------------------------------------------------------


def test_a_write_sleeping_behind_the_lock_wakes_when_the_bell_rings(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that says it waits sleeps on the store's doorbell; a ring (a maintenance run
    between two batches) wakes it long before WRITE_LOCK_POLL_S, and its next try takes
    the lock once free."""
    monkeypatch.setattr(locking, "WRITE_LOCK_POLL_S", 5.0)  # locking's copy is the one read
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
        holder = Holder(store_url)
        bell = doorbell(bell_file(make_url(store_url)))
        assert bell is not None
        sleeps: list[float] = []
        real_sleep = Doorbell.sleep

        def sleep(self: Doorbell, seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) == 2:  # the long one: let go and ring from another thread
                threading.Timer(0.05, lambda: (holder.release(), bell.ring())).start()
            real_sleep(self, seconds)

        monkeypatch.setattr(Doorbell, "sleep", sleep)
        started = time.monotonic()
        try:
            assert store.record_passing("a", "1", "b", "1").uses == 2
        finally:
            holder.close()
            bell.hush()
        assert sleeps == [rules.WRITE_LOCK_FIRST_PAUSE_S, 5.0]
        assert time.monotonic() - started < 2.0


def test_a_ring_wakes_every_write_asleep_on_the_bell(store_url: str) -> None:
    """Two sleepers (two writes of one process; processes alike) both wake at one ring: a
    ring that the first awake took for itself left the other asleep through a batch's
    checkpoint."""
    bell = doorbell(bell_file(make_url(store_url)))
    assert bell is not None
    bell.hush()
    woke: list[float] = []

    def sleeper() -> None:
        started = time.monotonic()
        bell.sleep(5.0)
        woke.append(time.monotonic() - started)

    threads = [threading.Thread(target=sleeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    bell.ring()
    bell.ring()  # a second ring adds nothing: one byte, until hushed
    for thread in threads:
        thread.join(10.0)
    try:
        assert len(woke) == 2 and max(woke) < 2.0
        assert bell.rung()
        assert len(os.read(bell.fd, 64)) == 1
    finally:
        bell.hush()


def test_a_write_that_finds_the_bell_rung_tries_every_first_pause(
    store_url: str, holder: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a maintenance run rings (its batch commits, or its pause lets writes in), a
    write that finds the lock taken tries every WRITE_LOCK_FIRST_PAUSE_S, without sleeping
    on the bell, which would wake it at once."""
    bell = doorbell(bell_file(make_url(store_url)))
    assert bell is not None
    with mnestoma.Mnestoma(store_url) as store:
        bell.ring()
        try:
            pauses = record_pauses(monkeypatch, holder, release_after=4)
            assert store.record_passing("a", "1", "b", "1").uses == 1
        finally:
            bell.hush()
    assert [p[0] for p in pauses] == [rules.WRITE_LOCK_FIRST_PAUSE_S] * 4
    assert all(saying for _, saying in pauses)


def test_a_maintenance_batch_empties_the_bell_and_rings_it_through_its_commit(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of the ager or a prune, once it holds the lock, takes back a ring left by a
    run that died; it rings as it commits (SQLite may checkpoint in the commit, which holds
    no lock a write needs) and empties the bell once the commit is over; a batch rolled
    back does not ring."""
    url = make_url(store_url)
    bell = doorbell(bell_file(url))
    assert bell is not None
    seen: list[bool] = []
    real = locking._commit_prepared

    def commit_prepared(dbapi: Any) -> bool:
        seen.append(bell.rung())
        return real(dbapi)

    monkeypatch.setattr(locking, "_commit_prepared", commit_prepared)
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
        assert seen == [False]  # a write's commit does not ring
        bell.ring()  # left by a run that died
        with store.engine.connect() as conn:
            for_write(conn)
            assert not bell.rung()  # the batch holds the lock
            conn.exec_driver_sql("UPDATE mnests SET weight = weight")
            conn.commit()
        assert seen[1:] == [True] and not bell.rung()
        with store.engine.connect() as conn:
            for_write(conn)
            conn.rollback()
        assert len(seen) == 2 and not bell.rung()


def test_the_doorbell_is_a_fifo_beside_the_store_and_nothing_else_serves(
    store_url: str, tmp_path: Any
) -> None:
    """``<file>-writers.bell`` is made as a FIFO; a regular file or a link in its place is
    not used (writes then try every WRITE_LOCK_FIRST_PAUSE_S), and a write still works."""
    path = bell_file(make_url(store_url))
    assert path is not None and path.endswith("-writers.bell")
    assert doorbell(path) is not None and stat.S_ISFIFO(os.lstat(path).st_mode)
    plain = tmp_path / "plain-writers.bell"
    plain.write_text("")
    assert doorbell(str(plain)) is None
    link = tmp_path / "link-writers.bell"
    link.symlink_to(path)
    assert doorbell(str(link)) is None
    assert doorbell(str(tmp_path / "no-such-folder" / "x-writers.bell")) is None


def test_a_maintenance_batch_makes_no_bell_where_no_write_ever_waited(store_url: str) -> None:
    """The bell is made by the first write that sleeps on it: a batch's commit rings only
    one that is there, and leaves no file beside a store nobody waits for."""
    path = bell_file(make_url(store_url))
    assert path is not None
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
        with store.engine.connect() as conn:
            for_write(conn)
            conn.exec_driver_sql("UPDATE mnests SET weight = weight")
            conn.commit()
        store.apply_ager()
    assert not os.path.lexists(path)
