"""The ager in batches, each its own transaction: it adds up to the one-transaction run,
survives being killed anywhere, lets writers in between batches, and runs one at a time."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from ager_kit import T0, StoppedClock, demoting_store, load
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError

import mnestoma
from mnestoma import AgerReport, Mnestoma
from mnestoma.core import rules
from mnestoma.core.errors import InvalidInput, MnestomaError
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines import locking
from mnestoma.engines.locking import WaitingWriters
from mnestoma.maintenance import ager
from mnestoma.maintenance.status import collect_status

ROWS = demoting_store(600, seed=11, twins=40)  # the twins come last: merges across batches
STORE_TABLES = ("events", "ager_runs", "ager_progress", "mnests")


def reset(url: str, rows: list[dict[str, Any]] = ROWS) -> None:
    """The store as ``rows`` (``ROWS``) and nothing else."""
    engine = mnestoma.make_engine(url)
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # the rows from page 0 on, as on SQLite
                conn.execute(text(f"TRUNCATE {', '.join(STORE_TABLES)}"))
            for name in STORE_TABLES:
                conn.execute(text(f"DELETE FROM {name}"))
        load(engine, rows)
    finally:
        engine.dispose()


def snapshot(engine: Engine) -> tuple[dict[str, tuple[Any, ...]], Counter[tuple[Any, ...]]]:
    """The rows by id (weights to 12 digits) and the events as a multiset (ids aside)."""
    with engine.connect() as conn:
        rows = {
            r.id: (r.state, r.uses, str(r.ts_first), str(r.ts_last), str(r.ts_weight),
                   float(f"{r.weight:.12g}"))
            for r in conn.execute(text("SELECT * FROM mnests"))
        }  # fmt: skip
        events = Counter(
            (e.mnest_id, e.kind, str(e.ts), e.state_before, e.state_after, e.related_id,
             None if e.weight_before is None else float(f"{e.weight_before:.12g}"),
             None if e.weight_after is None else float(f"{e.weight_after:.12g}"))
            for e in conn.execute(text("SELECT * FROM events"))
        )  # fmt: skip
    return rows, events


def one_transaction(url: str, rows: list[dict[str, Any]] = ROWS) -> tuple[AgerReport, Any]:
    """The reference: the same run in one transaction (a unit of work's), and what it left."""
    reset(url, rows)
    with Mnestoma(url, clock=StoppedClock()) as store:
        with store.unit_of_work() as unit:
            report = unit.mnests.apply_ager()
            unit.commit()
        return report, snapshot(store.engine)


def count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


@pytest.mark.parametrize("batch_rows", [1, 37, None])
def test_a_run_in_batches_equals_the_run_in_one_transaction(
    store_url: str, batch_rows: int | None
) -> None:
    expected, left = one_transaction(store_url)
    reset(store_url)
    seen: list[tuple[int, int]] = []
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        report = store.apply_ager(batch_rows=batch_rows, progress=lambda d, t: seen.append((d, t)))
        assert report == expected
        assert expected.merged == 40 and expected.to_decaying > 400 and expected.protos_pruned
        assert snapshot(store.engine) == left
        assert count(store.engine, "ager_runs") == 1
        assert count(store.engine, "ager_progress") == 0
    if batch_rows is not None:
        assert len(seen) > 10  # many batches (PostgreSQL's are whole pages)
        assert seen[-1][0] == seen[-1][1] == len(seen)
    assert [d for d, _ in seen] == list(range(1, len(seen) + 1))


def test_a_run_again_at_the_same_instant_changes_nothing(store_url: str) -> None:
    reset(store_url)
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        first = store.apply_ager(batch_rows=50)
        after = snapshot(store.engine)
        again = store.apply_ager(batch_rows=50)
        assert again == AgerReport(archive_candidates=first.archive_candidates)
        assert snapshot(store.engine) == after
        assert count(store.engine, "ager_runs") == 2


def test_a_dry_run_is_one_transaction_rolled_back(store_url: str) -> None:
    expected, _ = one_transaction(store_url)
    reset(store_url)
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        before = snapshot(store.engine)
        commits: list[str] = []
        event.listen(store.engine, "commit", lambda conn: commits.append("commit"))
        assert store.apply_ager(dry_run=True, batch_rows=10) == expected
        assert commits == []
        assert snapshot(store.engine) == before
        assert count(store.engine, "ager_progress") == count(store.engine, "ager_runs") == 0


@pytest.mark.parametrize("bad", [0, -3, 2.5, "100", True])
def test_a_batch_size_that_is_not_a_positive_int_is_refused(store_url: str, bad: Any) -> None:
    reset(store_url)
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        before = snapshot(store.engine)
        with pytest.raises(InvalidInput, match="batch_rows"):
            store.apply_ager(batch_rows=bad)
        assert snapshot(store.engine) == before


@pytest.mark.parametrize("door", ["sync", "async"])
@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("bad", [5, "print"])
def test_a_progress_that_is_not_callable_is_refused_before_any_batch(
    store_url: str, door: str, dry_run: bool, bad: Any
) -> None:
    """``progress`` is checked with the other arguments, before the run writes anything:
    found after the first batch, it left a raw TypeError and an interrupted run."""
    reset(store_url)
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        before = snapshot(store.engine)
        with pytest.raises(InvalidInput, match="progress"):
            if door == "sync":
                store.apply_ager(dry_run=dry_run, batch_rows=50, progress=bad)
            else:
                asyncio.run(async_ager(store_url, dry_run=dry_run, batch_rows=50, progress=bad))
        assert snapshot(store.engine) == before
        assert count(store.engine, "ager_progress") == count(store.engine, "ager_runs") == 0
    assert collect_status(store_url).ager_unfinished == []


async def async_ager(url: str, **kwargs: Any) -> AgerReport:
    """One run of the ager through the async door, at the tests' stopped clock."""
    async with AsyncMnestoma(url, clock=StoppedClock()) as store:
        return await store.apply_ager(**kwargs)


def test_passings_recorded_mid_run_are_kept_and_aged_once(store_url: str) -> None:
    """A writer (one day ahead of the ager's now) reinforces a row the run has aged and
    one it has not reached: both keep their passing; the second is not aged by the run
    (its anchor is after the run's now and stays there)."""
    reset(store_url)
    later = T0 + timedelta(days=1)

    def effective(r: dict[str, Any]) -> float:
        days = (T0 - r["ts_weight"]).total_seconds() / 86400
        return float(r["weight"] * math.exp(-0.018 * days))

    strong = [r for r in ROWS[:560] if r["state"] == "active" and r["ts_weight"] < T0]
    strong = [r for r in strong if effective(r) > 0.25]  # stays active at the run's now
    early, late = strong[0], strong[-1]
    assert ROWS.index(early) < 40 and ROWS.index(late) > 400
    with (
        Mnestoma(store_url, clock=StoppedClock()) as store,
        Mnestoma(store_url, clock=lambda: later) as writer,
    ):

        def progress(done: int, total: int) -> None:
            if done == 2:
                for r in (early, late):
                    writer.record_passing(
                        r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"]
                    )

        store.apply_ager(batch_rows=20, progress=progress)
        for r in (early, late):
            got = store.get(r["id"])
            days = (later - r["ts_weight"]).total_seconds() / 86400
            assert got.uses == r["uses"] + 1
            assert got.ts_weight == later
            assert got.weight == pytest.approx(
                min(1.0, r["weight"] * math.exp(-0.018 * days) + 0.15), rel=1e-9
            )


def test_a_writer_behind_a_batch_gets_in_before_the_run_ends(store_url: str) -> None:
    """The writer starts while a batch holds the lock, and finishes while the run still
    has many batches to go: it waited for a batch, not for the run."""
    reset(store_url)
    done = threading.Event()
    finished_at: list[int] = []
    batches: list[int] = []
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        started = threading.Event()

        def write() -> None:
            store.record_passing("mid", "1", "run", "1")
            done.set()

        def in_batch(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if not statement.startswith("UPDATE mnests"):
                return
            if len(batches) == 3 and not started.is_set():
                started.set()
                threading.Thread(target=write).start()
            if started.is_set() and not done.is_set():
                # each batch holds its locks a while (PostgreSQL has only 16 of them): a
                # writer's thread slow to start under load still starts within the run
                time.sleep(0.01)

        def progress(number: int, total: int) -> None:
            batches.append(number)
            if done.is_set() and not finished_at:
                finished_at.append(number)

        store.record_passing("mid", "1", "run", "1")  # a pooled connection, ready
        event.listen(store.engine, "before_cursor_execute", in_batch)
        store.apply_ager(batch_rows=5, progress=progress)
        done.wait(30)
        assert started.is_set() and done.is_set()
        # started in batch 4; a run in one transaction would let it in after its end
        assert finished_at and finished_at[0] < len(batches) - 3, (finished_at, len(batches))


def test_a_write_waiting_for_the_sqlite_lock_says_so_until_it_has_it(tmp_path: Any) -> None:
    """What the ager sees between two batches: a write of the package that waits for the
    write lock, for as long as it waits, and nothing once it has written."""
    with (
        Mnestoma(f"sqlite:///{tmp_path / 'store.sqlite'}") as store,
        store.engine.connect() as conn,
    ):
        store.record_passing("a", "1", "b", "1")  # migrated, a pooled connection ready
        with WaitingWriters(conn) as writers:
            assert not writers.waiting()
            holder = sqlite3.connect(store.engine.url.database, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            writer = threading.Thread(target=store.record_passing, args=("a", "1", "b", "1"))
            writer.start()
            deadline = time.monotonic() + 10
            while not writers.waiting() and time.monotonic() < deadline:
                time.sleep(0.001)
            assert writers.waiting()
            # a write waits: let_in says writers are about, after waiting its longest for
            # the write to get in (asked while the lock is still held, so that the write
            # cannot have got in before the question, however the threads are scheduled)
            assert writers.let_in()
            assert writers.waiting()
            holder.execute("COMMIT")
            holder.close()
            writer.join(10)
            assert not writer.is_alive()
            assert not writers.waiting()
            assert not writers.let_in()
        assert store.get(store.find("a", "1", "b", "1").id).uses == 2


def test_with_no_writer_waiting_the_ager_pauses_only_now_and_then(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between batches the ager waits for writers only when one waits; otherwise it goes on,
    pausing BATCH_PAUSE_S at most every AGER_YIELD_EVERY_S on SQLite (for writers that
    cannot say they wait), never on PostgreSQL, and it leaves no lock file on PostgreSQL."""
    reset(store_url)
    pauses: list[float] = []
    real_pause = locking.pause_on

    def counted(conn: Any, seconds: float) -> None:
        pauses.append(seconds)
        real_pause(conn, seconds)

    monkeypatch.setattr(locking, "pause_on", counted)
    batches: list[int] = []
    started = time.monotonic()
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        store.apply_ager(batch_rows=10, progress=lambda n, total: batches.append(n))
        sqlite = store.engine.dialect.name == "sqlite"
        database = store.engine.url.database
    took = time.monotonic() - started
    assert len(batches) > 10
    if sqlite:
        assert set(pauses) <= {rules.BATCH_PAUSE_S}
        assert len(pauses) <= took / rules.AGER_YIELD_EVERY_S + 1
        assert len(pauses) < len(batches) - 1
    else:
        assert pauses == []
        assert not os.path.exists(os.path.abspath(f"{database}-writers.lock"))


def test_a_postgresql_batch_locks_the_rows_it_changes_not_the_table(pg_store_url: str) -> None:
    """While a batch is open, another session can lock a row of a page outside it but not a
    row the batch changed; and a batch goes through while a writer holds a row outside it.
    The run sees the writer about while it is in a transaction on ``mnests``."""
    reset(pg_store_url)
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store, store.engine.connect() as conn:
        writers = ager.ager_writers(conn)
        assert isinstance(writers, ager.TableWriters)
        assert not writers.let_in()
        with conn.begin():
            run = ager.begin_batched_run(conn, T0, 10, T0, ager.ager_bounds(conn))
        outside = "SELECT id FROM mnests WHERE ctid >= '(1,0)' LIMIT 1 FOR UPDATE NOWAIT"
        inside = "SELECT id FROM mnests WHERE id = :id FOR UPDATE NOWAIT"
        with store.engine.connect() as writer:
            writer.begin()
            held = writer.execute(text(outside)).scalar_one()  # a row on page 1
            assert writers.let_in()
            with conn.begin():
                report = ager.age_batch(conn, run, run.first, run.first + 1, 1, T0)  # page 0
                changed = (
                    conn.execute(
                        text("SELECT id FROM mnests WHERE ctid < '(1,0)' AND ts_weight = :t"),
                        {"t": T0},
                    )
                    .scalars()
                    .first()
                )
                assert report.decayed and changed is not None
                with (
                    store.engine.connect() as other,
                    pytest.raises(DBAPIError, match="could not obtain lock"),
                ):
                    other.execute(text(inside), {"id": changed})
            writer.rollback()
            with writer.begin():  # once the batch committed, its rows are free again
                assert writer.execute(text(inside), {"id": changed}).scalar_one() == changed
        assert held is not None and not writers.let_in()


def test_a_postgresql_run_lets_the_writers_in_first_before_each_batch(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before a batch the run waits for a writer in a transaction on ``mnests`` to end, and
    says it saw one; for a writer that stays in, no longer than its patience."""
    reset(pg_store_url)
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store, store.engine.connect() as conn:
        writers = ager.ager_writers(conn)
        assert isinstance(writers, ager.TableWriters)
        assert not writers.let_in()
        with store.engine.connect() as writer:
            writer.begin()
            writer.execute(text("SELECT id FROM mnests LIMIT 1 FOR UPDATE"))
            # The writer ends while the run waits for it, at the run's first pause: a timer
            # that ended it 20 ms on could fire before a slow run had looked at all.
            pauses: list[float] = []
            real_pause = ager.pause_on

            def writer_ends(conn: Any, seconds: float) -> None:
                if not pauses:
                    writer.rollback()
                pauses.append(seconds)
                real_pause(conn, seconds)

            monkeypatch.setattr(ager, "pause_on", writer_ends)
            assert writers.let_in()
            assert pauses[:1] == [rules.AGER_WRITERS_POLL_S]  # it waited until the writer ended
            monkeypatch.setattr(ager, "pause_on", real_pause)
            assert not writers.let_in()
            writer.begin()
            writer.execute(text("SELECT id FROM mnests LIMIT 1 FOR UPDATE"))
            began = time.monotonic()
            assert writers.let_in()  # the writer stays in: the run goes on after its patience
            assert time.monotonic() - began >= rules.AGER_WRITERS_PATIENCE_S
            writer.rollback()


def test_a_postgresql_batch_waits_behind_a_table_lock_instead_of_giving_up(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table lock held longer than the batch's row lock timeout (a dry run's, a
    migration's) makes the batch wait, as a writer would, not give up: no batch is tried
    again, and the run completes once the lock goes."""
    _, (left, _) = one_transaction(pg_store_url)
    reset(pg_store_url)
    pauses: list[int] = []
    monkeypatch.setattr(
        mnestoma.maintenance.ager, "ager_batch_retry_pause", lambda a: pauses.append(a) or 0.001
    )
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
        with store.engine.connect() as other:
            other.begin()
            other.execute(text("LOCK TABLE mnests IN SHARE MODE"))  # no row change allowed
            ends = threading.Timer(0.3, other.rollback)
            ends.start()
            try:
                store.apply_ager()
            finally:
                ends.join()
        assert snapshot(store.engine)[0] == left
    assert pauses == []


def test_a_postgresql_reader_in_a_transaction_is_not_a_writer_about(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that only read ``mnests`` (ACCESS SHARE, held until its transaction ends)
    does not hold the run back: only writers' locks count."""
    reset(pg_store_url)
    # A run held back would wait this long: "not held back" is then "well under it", not a
    # bound of 50 ms on one look at pg_locks (a loaded machine can take that).
    monkeypatch.setattr(ager, "AGER_WRITERS_PATIENCE_S", 10.0)
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store, store.engine.connect() as conn:
        writers = ager.ager_writers(conn)
        with store.engine.connect() as reader:
            reader.begin()
            reader.execute(text("SELECT count(*) FROM mnests"))
            began = time.monotonic()
            assert not writers.let_in()
            assert time.monotonic() - began < 5.0
            reader.execute(text("SELECT id FROM mnests LIMIT 1 FOR UPDATE"))
            assert writers.let_in()
            reader.rollback()


def test_a_postgresql_batch_crossing_a_writer_gives_up_and_is_tried_again(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer holds a row late in the batch while the batch holds an early one, then asks
    for that one too: the batch, which waits for the late row, gives up (its row lock
    timeout) and rolls back, the writer gets its row with no error (no deadlock), and the
    batch tried again completes the run to the same result as with no writer about."""
    _, (left, _) = one_transaction(pg_store_url)
    reset(pg_store_url)
    decayed = [
        r
        for r in ROWS
        if r["id"] in left and r["state"] == left[r["id"]][0] and r["ts_weight"] < T0
    ]
    early, late = decayed[0]["id"], decayed[-1]["id"]  # both changed in place, in that order
    pauses: list[float] = []
    monkeypatch.setattr(
        mnestoma.maintenance.ager, "ager_batch_retry_pause", lambda a: pauses.append(a) or 0.005
    )
    bump = "UPDATE mnests SET uses = uses + 1 WHERE id = :id"
    failures: list[BaseException] = []
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
        with store.engine.connect() as writer:
            writer.begin()
            writer.execute(text(bump), {"id": late})

            def age() -> None:
                try:
                    store.apply_ager(batch_rows=len(ROWS) * 2)  # one batch: all the pages
                except BaseException as err:  # reported by the test
                    failures.append(err)

            run = threading.Thread(target=age)
            run.start()
            deadline = time.monotonic() + 30
            while not pauses and time.monotonic() < deadline:
                time.sleep(0.005)
            assert pauses, "the batch never gave up on the writer's row"
            writer.execute(text(bump), {"id": early})  # the batch may hold it: it lets go
            writer.commit()
            run.join(60)
        assert not run.is_alive() and failures == []
        rows, _ = snapshot(store.engine)
    assert rows[early][1] == left[early][1] + 1 and rows[late][1] == left[late][1] + 1
    for changed in (early, late):
        rows[changed] = (rows[changed][0], rows[changed][1] - 1, *rows[changed][2:])
    assert rows == left


HELD_S = 9.0  # longer than the 50 attempts (about 7 s) after which a batch used to give up


def held_row_and_page(url: str, left: dict[str, Any]) -> tuple[str, int]:
    """A row in the middle of the table that the ager changes, and the page it is on."""
    changed = [r["id"] for r in ROWS if r["id"] in left and r["ts_weight"] < T0]
    held = changed[len(changed) // 2]
    engine = mnestoma.make_engine(url)
    try:
        with engine.connect() as conn:
            page = conn.execute(
                text("SELECT (ctid::text::point)[0]::int FROM mnests WHERE id = :id"), {"id": held}
            ).scalar_one()
    finally:
        engine.dispose()
    return held, int(page)


def test_a_postgresql_batch_waits_for_a_row_as_long_as_a_writer_holds_it(
    pg_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer holds a row for longer than the batch's lock timeout times many attempts:
    the batch shrinks to the row's page, the pages before it are done meanwhile, and once
    the row is free the run completes to the result of one run, and says in the log what it
    waited (before, the run failed with a lock timeout after 50 attempts)."""
    _, (left, _) = one_transaction(pg_store_url)
    reset(pg_store_url)
    held, page = held_row_and_page(pg_store_url, left)
    assert page > 0
    caplog.set_level(logging.INFO, logger="mnestoma.ager")
    failures: list[BaseException] = []
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
        with store.engine.connect() as writer, store.engine.connect() as reader:
            writer.begin()
            writer.execute(text("SELECT id FROM mnests WHERE id = :id FOR UPDATE"), {"id": held})

            def age() -> None:
                try:
                    store.apply_ager(batch_rows=len(ROWS) * 2)  # one batch: all the pages
                except BaseException as err:  # reported by the test
                    failures.append(err)

            began = time.monotonic()
            run = threading.Thread(target=age)
            run.start()
            time.sleep(HELD_S - 1.0)
            position = reader.execute(text("SELECT position FROM ager_progress")).scalar_one()
            reader.rollback()
            time.sleep(max(0.0, began + HELD_S - time.monotonic()))
            assert run.is_alive() and failures == []  # still waiting, not failed
            writer.rollback()
            run.join(60)
        assert not run.is_alive() and failures == []
        assert position == page  # every page before the held row's was done meanwhile
        assert snapshot(store.engine)[0] == left
    assert collect_status(pg_store_url).ager_unfinished == []
    [said] = [r.getMessage() for r in caplog.records if r.name == "mnestoma.ager"]
    assert "tried again" in said and "positions in the smallest batch: 1" in said


def test_a_postgresql_batch_waits_for_its_wal_flush_only_while_writers_are_about(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While writers are about a batch commits as any write does (else their commits would
    flush its WAL for it); once none has been seen for AGER_WRITERS_SEEN_S it commits
    without waiting for the flush. The run's result is the same either way."""
    expected, (left, _) = one_transaction(pg_store_url)
    reset(pg_store_url)
    asynchronous = "SET LOCAL synchronous_commit TO OFF"
    seen: list[str] = []
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store:

        def statement(conn: Any, cursor: Any, text_: str, *rest: Any) -> None:
            if text_.startswith(("SET LOCAL synchronous_commit", "UPDATE ager_progress")):
                seen.append(text_)

        event.listen(store.engine, "before_cursor_execute", statement)
        monkeypatch.setattr(rules, "AGER_WRITERS_SEEN_S", 1e9)  # writers about, all the run
        store.apply_ager(batch_rows=20)
        assert len(seen) > 10 and asynchronous not in seen
        reset(pg_store_url)
        seen.clear()
        monkeypatch.setattr(rules, "AGER_WRITERS_SEEN_S", 0.0)  # none about, from the start
        assert store.apply_ager(batch_rows=20) == expected
        assert snapshot(store.engine)[0] == left
    batches = seen.count(next(t for t in seen if t.startswith("UPDATE ager_progress")))
    assert batches > 10 and seen.count(asynchronous) == batches


def test_a_postgresql_batch_writes_its_pages_behind_itself_only_while_writers_are_about(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While writers are about, each batch's server process hands the pages it writes out
    to the disk as it goes (backend_flush_after, AGER_FLUSH_AFTER_KIB), instead of leaving
    them for a burst of the OS's writeback that writers' commits would queue behind; with
    none about it leaves them, as any client does. For the batch's transaction only: the
    pooled connections keep their own setting. The run's result is the same either way."""
    expected, (left, _) = one_transaction(pg_store_url)
    show = "SHOW backend_flush_after"
    inside: list[str] = []

    def statement(conn: Any, cursor: Any, text_: str, *rest: Any) -> None:
        if text_.startswith("UPDATE ager_progress"):
            inside.append(cursor.connection.execute(show).fetchone()[0])

    behind = f"{rules.AGER_FLUSH_AFTER_KIB}kB"
    for seen_s, setting in ((1e9, behind), (0.0, "0")):
        monkeypatch.setattr(rules, "AGER_WRITERS_SEEN_S", seen_s)  # writers about, or none
        reset(pg_store_url)
        inside.clear()
        with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
            event.listen(store.engine, "after_cursor_execute", statement)
            assert store.apply_ager(batch_rows=20) == expected
            event.remove(store.engine, "after_cursor_execute", statement)
            assert snapshot(store.engine)[0] == left
            pooled = [store.engine.connect() for _ in range(store.engine.pool.checkedin())]
            try:
                assert pooled and {c.execute(text(show)).scalar_one() for c in pooled} == {"0"}
            finally:
                for c in pooled:
                    c.close()
        assert len(inside) > 10 and set(inside) == {setting}


def test_a_postgresql_run_that_begins_with_no_decaying_row_skips_the_merge_in_its_batches(
    pg_store_url: str,
) -> None:
    """With no decaying row when the run begins no merge can be needed (the rows the run
    demotes are the only rows of their keys), and its batches do not look for pairs; with
    decaying rows, each batch does. The result equals the one-transaction run either way."""
    pairs: list[str] = []

    def statement(conn: Any, cursor: Any, text_: str, *rest: Any) -> None:
        if text_.startswith(("WITH pairs", "UPDATE ager_progress")):
            pairs.append(text_[:10])

    for rows, merges in ((demoting_store(600, seed=11), False), (ROWS, True)):
        expected, left = one_transaction(pg_store_url, rows)
        reset(pg_store_url, rows)
        pairs.clear()
        with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
            event.listen(store.engine, "before_cursor_execute", statement)
            assert store.apply_ager(batch_rows=20) == expected
            assert snapshot(store.engine) == left
        batches = pairs.count("UPDATE age")
        assert batches > 10 and pairs.count("WITH pairs") == (batches if merges else 0)
        assert expected.merged == (40 if merges else 0) and expected.to_decaying > 400


def test_a_postgresql_twin_made_after_the_run_began_is_merged_by_the_batch_that_meets_it(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that began with no decaying row skips the merge; a twin made since (here: the
    store's 40 twins, hidden from the run's first read) fails the batch's demotion with a
    unique violation, and that batch and every later one look for pairs again: the run
    completes, equal to the one-transaction run."""
    expected, left = one_transaction(pg_store_url)
    reset(pg_store_url)
    real = ager.ager_bounds
    monkeypatch.setattr(ager, "ager_bounds", lambda conn: real(conn)._replace(merges=False))
    violations: list[str] = []

    def failed(context: Any) -> None:
        violations.append(getattr(context.original_exception, "sqlstate", ""))

    with Mnestoma(pg_store_url, clock=StoppedClock()) as store:
        event.listen(store.engine, "handle_error", failed)
        assert store.apply_ager(batch_rows=20) == expected
        assert snapshot(store.engine) == left
        assert count(store.engine, "ager_progress") == 0
    assert violations and set(violations) == {"23505"}


def test_a_postgresql_run_reads_without_parallel_workers_and_sets_them_back(
    pg_store_url: str,
) -> None:
    """The run's whole-table reads take one process (on a 2-core machine parallel workers
    took the writers' core) and write the pages they dirty behind them (a first read after
    a bulk load sets hint bits on every page), for their own transaction only: the
    connection's own settings are back afterwards, also when the transaction fails."""
    reset(pg_store_url)
    show = text("SHOW max_parallel_workers_per_gather")
    flush = text("SHOW backend_flush_after")
    behind = f"{rules.AGER_FLUSH_AFTER_KIB}kB"
    with Mnestoma(pg_store_url, clock=StoppedClock()) as store, store.engine.connect() as conn:
        conn.execute(text("SET max_parallel_workers_per_gather = 3"))
        conn.commit()
        for read in (ager.ager_bounds, lambda c: ager.archive_candidates(c, T0)):
            with conn.begin():
                read(conn)
                assert conn.execute(show).scalar_one() == "0"
                assert conn.execute(flush).scalar_one() == behind  # hint bits written behind
            assert conn.execute(show).scalar_one() == "3"
            assert conn.execute(flush).scalar_one() == "0"
            conn.rollback()
        with pytest.raises(RuntimeError), conn.begin():
            ager.ager_bounds(conn)
            raise RuntimeError("the run failed")
        assert conn.execute(show).scalar_one() == "3"
        conn.rollback()
        conn.execute(text("RESET max_parallel_workers_per_gather"))
        conn.commit()
        default = conn.execute(show).scalar_one()
        assert default != "0"
        store.apply_ager()
        idle = store.engine.pool.checkedin()  # the run's connection among them
        assert idle >= 1
        pooled = [store.engine.connect() for _ in range(idle)]
        try:
            assert [c.execute(show).scalar_one() for c in pooled] == [default] * idle
        finally:
            for c in pooled:
                c.close()


def test_a_process_forked_while_a_write_waits_does_not_go_on_saying_it_waits(
    tmp_path: Any,
) -> None:
    """The child has a copy of the descriptor on which the parent's write says it waits: it
    closes it, else the ager would see a waiting write for as long as the child lives."""
    import multiprocessing

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with Mnestoma(url) as store, store.engine.connect() as conn:
        path = locking.waiting_file(conn.engine.url)
        with WaitingWriters(conn) as writers:
            with locking.saying_it_waits(path):
                assert writers.waiting()
                child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
                child.start()
            try:
                deadline = time.monotonic() + 30  # the child closes its copy once it runs
                while writers.waiting() and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert child.is_alive() and not writers.waiting()
            finally:
                child.terminate()
                child.join()


def test_without_flock_on_the_file_system_writes_and_the_ager_fall_back_to_pauses(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that refuses flock: a write cannot say it waits (and keeps no
    descriptor open), and the ager pauses BATCH_PAUSE_S between every two batches."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with Mnestoma(url) as store, store.engine.connect() as conn:
        path = locking.waiting_file(conn.engine.url)
        with WaitingWriters(conn) as writers:

            def no_flock(fd: int, *, exclusive: bool) -> bool:
                raise OSError(37, "No locks available")

            monkeypatch.setattr(locking, "try_flock", no_flock)
            assert locking._say_waiting(path) == -1 and not locking._SAYING
            pauses: list[float] = []
            monkeypatch.setattr(locking, "pause_on", lambda c, seconds: pauses.append(seconds))
            assert not writers.waiting()
            writers.let_in()
            writers.let_in()
            assert pauses == [rules.BATCH_PAUSE_S] * 2


def test_an_async_write_queued_behind_the_facade_s_writes_says_it_waits(tmp_path: Any) -> None:
    """The async facade's writes queue for its own lock before SQLite's: queued, a write says
    that it waits, so that an ager between two batches lets the queue in."""
    import asyncio

    from mnestoma.doors.asynchronous import AsyncMnestoma

    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with Mnestoma(url) as store:
        store.record_passing("a", "1", "b", "1")

    async def main() -> list[bool]:
        seen = []
        async with AsyncMnestoma(url) as am:
            with Mnestoma(url) as sync, sync.engine.connect() as conn, WaitingWriters(conn) as w:
                await am._one_writer.acquire()  # another write of the facade holds the queue
                write = asyncio.ensure_future(am.record_passing("a", "1", "b", "1"))
                for _ in range(200):
                    await asyncio.sleep(0.005)
                    if w.waiting():
                        break
                seen.append(w.waiting())
                am._one_writer.release()
                await write
                seen.append(w.waiting())
        return seen

    assert asyncio.run(main()) == [True, False]


def test_two_runs_at_once_apply_once(store_url: str) -> None:
    expected, left = one_transaction(store_url)
    reset(store_url)
    reports: list[AgerReport] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)
    with (
        Mnestoma(store_url, clock=StoppedClock()) as a,
        Mnestoma(store_url, clock=StoppedClock()) as b,
    ):

        def run(store: Mnestoma) -> None:
            try:
                barrier.wait()
                reports.append(store.apply_ager(batch_rows=25))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=run, args=(s,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        # one waited for the other, then found nothing left to do at the same instant
        assert sorted(reports, key=lambda r: r.to_decaying) == [
            AgerReport(archive_candidates=expected.archive_candidates),
            expected,
        ]
        assert snapshot(a.engine) == left
        assert count(a.engine, "ager_runs") == 2


# --- killed runs ------------------------------------------------------------------------------

CHILD = """
import sys, time
from datetime import datetime
from sqlalchemy import event
from mnestoma import Mnestoma
url, mode, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
now = datetime.fromisoformat(sys.argv[4])
store = Mnestoma(url, clock=lambda: now)
progress = None
if mode == "between":
    def progress(done, total):
        if done == k:
            print("here", flush=True)
            time.sleep(120)
elif mode == "random":
    print("here", flush=True)  # the parent kills the run k ms from now
else:
    seen = [0]
    @event.listens_for(store.engine, "after_cursor_execute")
    def spy(conn, cursor, statement, *rest):
        if statement.lstrip().upper().startswith(("UPDATE MNESTS", "DELETE FROM MNESTS")):
            seen[0] += 1
            if seen[0] == k:
                print("here", flush=True)
                time.sleep(120)
store.apply_ager(batch_rows=5 if mode == "random" else 40, progress=progress)
print("done", flush=True)
"""


def kill_ager(url: str, mode: str, k: int) -> None:
    """Run the ager in a child process and SIGKILL it at the ``k``-th batch boundary
    (``between``), in the middle of a batch, after its ``k``-th row-changing statement
    (``inside``), or ``k`` ms after it began (``random``: wherever the run then is, maybe
    done)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, mode, str(k), T0.isoformat()],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "here"
        if mode == "random":
            time.sleep(k / 1000)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)


@pytest.mark.parametrize(("mode", "k"), [("between", 3), ("inside", 9), ("inside", 1)])
def test_a_killed_run_is_completed_by_the_next_to_the_same_result(
    store_url: str, mode: str, k: int
) -> None:
    expected, left = one_transaction(store_url)
    reset(store_url)
    kill_ager(store_url, mode, k)
    status = collect_status(store_url)
    assert status.ager_runs == 0
    [interrupted] = status.ager_interrupted
    assert (interrupted.ts, interrupted.running) == (T0, False)
    if mode == "between":
        assert interrupted.batches == k
    else:  # the batch it was in is rolled back, not counted
        assert interrupted.batches < k
    assert "INTERRUPTED" in mnestoma.maintenance.status.render_status(status)
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        report = store.apply_ager()
        assert snapshot(store.engine) == left
        assert report.archive_candidates == expected.archive_candidates
        if interrupted.batches:
            assert report.to_decaying < expected.to_decaying  # the killed run did a part
        else:
            assert report == expected
    status = collect_status(store_url)
    assert (status.ager_runs, status.ager_unfinished) == (1, [])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_run_killed_at_a_random_moment_is_completed_by_the_next(
    store_url: str, seed: int
) -> None:
    _, left = one_transaction(store_url)
    reset(store_url)
    kill_ager(store_url, "random", random.Random(seed).randrange(0, 400))
    status = collect_status(store_url)
    # stopped midway, done, or killed before its first transaction: never running
    assert len(status.ager_interrupted) + (status.ager_runs or 0) <= 1
    assert [r for r in status.ager_unfinished or [] if r.running] == []
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        store.apply_ager()
        assert snapshot(store.engine) == left
    assert collect_status(store_url).ager_unfinished == []


def test_a_run_whose_connection_drops_is_completed_by_the_next(pg_store_url: str) -> None:
    url = pg_store_url
    _, left = one_transaction(url)
    reset(url)
    killer = mnestoma.make_engine(url)
    seen = [0]
    with Mnestoma(url, clock=StoppedClock()) as store:

        def drop(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if statement.startswith("UPDATE mnests"):
                seen[0] += 1
                if seen[0] == 7:
                    pid = conn.connection.dbapi_connection.info.backend_pid
                    with killer.connect() as other:
                        other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})

        event.listen(store.engine, "before_cursor_execute", drop)
        with pytest.raises(MnestomaError):
            store.apply_ager(batch_rows=40)
        event.remove(store.engine, "before_cursor_execute", drop)
        [interrupted] = collect_status(url).ager_interrupted
        assert interrupted.batches >= 1
        store.apply_ager()
        assert snapshot(store.engine) == left
    killer.dispose()
    assert collect_status(url).ager_unfinished == []


def test_status_says_a_run_is_running_while_it_holds_the_lock(store_url: str) -> None:
    reset(store_url)
    seen: list[list[Any]] = []
    with Mnestoma(store_url, clock=StoppedClock()) as store:

        def progress(done: int, total: int) -> None:
            if done == 2:
                st = collect_status(store_url)
                seen.append([(r.running, r.batches) for r in st.ager_unfinished or []])

        store.apply_ager(batch_rows=50, progress=progress)
    assert seen == [[(True, 2)]]


# --- batches that grow while no writer is about --------------------------------------------


def statements_seen(engine: Engine, *heads: str) -> list[str]:
    """The heads (of ``heads``) of the statements run on ``engine`` from now on, in order."""
    seen: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        for head in heads:
            if statement.lstrip().startswith(head):
                seen.append(head)

    event.listen(engine, "before_cursor_execute", spy)
    return seen


def test_with_no_writer_about_a_batch_grows_and_commits_once(store_url: str) -> None:
    """By default, with nobody writing, the run's batch goes on step after step in one
    transaction (one progress move, one progress call) instead of committing every step;
    the result equals the run in one transaction."""
    expected, left = one_transaction(store_url)
    reset(store_url)
    seen: list[tuple[int, int]] = []
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        heads = statements_seen(store.engine, "UPDATE ager_progress", "UPDATE mnests")
        assert store.apply_ager(progress=lambda d, t: seen.append((d, t))) == expected
        assert snapshot(store.engine) == left
    assert seen == [(1, 1)]
    assert heads.count("UPDATE ager_progress") == 1
    assert heads.count("UPDATE mnests") >= 2  # more than one step


def test_a_growing_batch_commits_at_the_step_a_writer_comes(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that comes while a batch grows (SQLite: a write waiting for the lock;
    PostgreSQL: a transaction holding a writer's lock on mnests) ends the batch at the next
    step: the run commits there, lets the writer in, and goes on. (Without the writer this
    run is one batch: its bound is made longer than the run.) On SQLite the writer is in
    once its transaction has ended, which the package notes right after its ``COMMIT``
    (``locking._end_write``): what its call does after that, the snapshot it returns, may
    run after the next batch, as its thread gets the interpreter back."""
    monkeypatch.setattr(ager, "AGER_BATCH_QUIET_TARGET_S", 1e-6)  # steps of a few rows
    monkeypatch.setattr(ager, "AGER_BATCH_GROWN_MAX_S", 600.0)
    monkeypatch.setattr(mnestoma.maintenance.ager, "AGER_BATCH_ROWS", 8)
    expected, _ = one_transaction(store_url)
    reset(store_url)
    batches: list[tuple[int, bool]] = []
    done = threading.Event()
    with Mnestoma(store_url, clock=StoppedClock()) as store:
        store.record_passing("mid", "1", "run", "1")  # a pooled connection, ready
        holder = store.engine.connect() if store.engine.dialect.name != "sqlite" else None
        started: list[bool] = []

        writer: list[int] = []
        end_write = locking._end_write

        def ended(dbapi: Any) -> None:
            end_write(dbapi)
            if threading.get_ident() in writer:
                done.set()  # the writer's transaction has ended: it was let in

        monkeypatch.setattr(locking, "_end_write", ended)

        def write() -> None:
            writer.append(threading.get_ident())
            store.record_passing("mid", "1", "run", "1")
            done.set()

        def in_step(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if started or not statement.startswith("UPDATE mnests"):
                return
            started.append(True)
            if holder is None:
                threading.Thread(target=write).start()
                deadline = time.monotonic() + 10
                with WaitingWriters(conn) as writers:
                    while not writers.waiting() and time.monotonic() < deadline:
                        time.sleep(0.001)
            else:  # a writer in a transaction on mnests, until the first batch is done
                holder.execute(text("SELECT id FROM mnests WHERE src_executor = 'mid' FOR UPDATE"))

        def progress(number: int, total: int) -> None:
            if holder is not None and number == 1:
                holder.rollback()
                done.set()
            batches.append((number, done.is_set()))

        event.listen(store.engine, "before_cursor_execute", in_step)
        assert store.apply_ager(progress=progress) == expected
        if holder is not None:
            holder.close()
    assert started and done.is_set()
    assert len(batches) >= 2
    assert batches[1] == (2, True)  # the writer got in between the first two batches


@pytest.mark.parametrize("when", ["quiet", "writers about", "at the WAL's bound"])
def test_a_sqlite_run_checkpoints_only_with_writers_about_at_its_bound_and_at_its_end(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The connection checkpoints at every commit (``wal_autocheckpoint = 1``): while no
    writer is about the run holds that back, so its WAL grows from batch to batch; with
    writers about, or once the WAL reaches AGER_WAL_CHECKPOINT_MIB, each commit checkpoints.
    The last commit always does, and the connection gets its own setting back."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Mnestoma(url).close()  # migrated
    reset(url)
    if when == "writers about":
        monkeypatch.setattr(mnestoma.maintenance.ager, "ager_writers_about", lambda since: True)
    if when == "at the WAL's bound":
        monkeypatch.setattr(rules, "AGER_WAL_CHECKPOINT_MIB", 1 / 1024 / 1024)
    shm = f"{tmp_path / 'store.sqlite'}-shm"

    def wal() -> tuple[int, int]:
        """(frames in the WAL, frames checkpointed), from the WAL index's header."""
        with open(shm, "rb") as f:
            header = f.read(100)
        return int.from_bytes(header[16:20], sys.byteorder), int.from_bytes(
            header[96:100], sys.byteorder
        )

    seen: list[tuple[int, int]] = []
    with Mnestoma(url, clock=StoppedClock()) as store:

        @event.listens_for(store.engine, "connect")
        def each_commit(dbapi: Any, record: Any) -> None:
            dbapi.execute("PRAGMA wal_autocheckpoint = 1")

        store.engine.dispose()
        store.record_passing("a", "1", "b", "1")
        store.apply_ager(batch_rows=50, progress=lambda d, t: seen.append(wal()))
        after = wal()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1
    assert len(seen) > 5
    checkpointed = [frames == backfilled for frames, backfilled in seen]
    if when == "quiet":
        assert not any(checkpointed)
        assert [f for f, _ in seen] == sorted(f for f, _ in seen)  # the WAL only grew
    else:
        assert all(checkpointed)
    assert after[0] == after[1]  # the last commit checkpointed


def test_a_sqlite_run_makes_its_pairs_table_once_and_skips_the_merge_when_none_can_be(
    tmp_path: Any,
) -> None:
    """The temporary table of merge pairs is created and dropped once per run, not per
    batch; a run that begins with no versioned decaying row looks for no pair at all."""
    sqlite_store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    Mnestoma(sqlite_store_url).close()  # migrated
    for rows, merges in ((demoting_store(600, seed=11), False), (ROWS, True)):
        expected, left = one_transaction(sqlite_store_url, rows)
        reset(sqlite_store_url, rows)
        with Mnestoma(sqlite_store_url, clock=StoppedClock()) as store:
            heads = statements_seen(
                store.engine,
                "CREATE TABLE",
                'INSERT INTO "temp"',
                "UPDATE ager_progress",
            )
            assert store.apply_ager(batch_rows=20) == expected
            assert snapshot(store.engine) == left
        batches = heads.count("UPDATE ager_progress")
        assert batches > 10
        assert heads.count("CREATE TABLE") == 1  # dropped once too, at the driver
        assert heads.count('INSERT INTO "temp"') == (batches if merges else 0)
