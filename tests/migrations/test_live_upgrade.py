"""Upgrades of a live PostgreSQL store: one transaction a revision, a lock timeout, retries.

Writers keep writing while the schema moves: a revision that cannot get its lock within the
lock timeout is rolled back (freeing the writers queued behind it) and tried again.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Connection, Engine, event, text

import mnestoma
from mnestoma.cli import cli
from mnestoma.engines import make_engine
from mnestoma.maintenance import migration
from mnestoma.maintenance.migration import current_revision, head_revision, migration_lock_timeout

TIMEOUT = 0.2  # seconds each attempt waits for a lock in these tests
HOLDER_FALLBACK_S = 60.0  # a holder released by a retry lets go after this at the latest
BUSY_SLACK_S = 5.0  # what a loaded machine may add to a step, well below the fallback


@pytest.fixture
def engine(pg_empty_db_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_empty_db_url)
    try:
        yield eng
    finally:
        eng.dispose()


@contextmanager
def holding(engine: Engine, table: str) -> Iterator[Connection]:
    """An open transaction that has read ``table`` (ACCESS SHARE), until the block ends or
    the caller commits it: DDL on the table waits for it."""
    with engine.connect() as conn:
        conn.execute(text(f"SELECT count(*) FROM {table}"))
        try:
            yield conn
        finally:
            if conn.in_transaction():
                conn.rollback()


class RetryLog(logging.Handler):
    """Notes when each retry of a revision was announced."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.at: list[float] = []
        self.second = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "trying it again" in record.getMessage():
            self.at.append(time.monotonic())
            if len(self.at) >= 2:
                self.second.set()


@pytest.fixture
def retry_log() -> Iterator[RetryLog]:
    handler = RetryLog()
    logger = logging.getLogger("mnestoma.migration")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _release_later(conn: Connection, when: threading.Event, fallback_s: float) -> threading.Thread:
    """Commit ``conn``'s transaction from a thread once ``when`` is set (or after the
    fallback, so that a run that never retries still ends)."""

    def release() -> None:
        when.wait(fallback_s)
        conn.commit()

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_each_revision_commits_on_its_own_so_a_later_lock_timeout_keeps_the_earlier_ones(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    mnestoma.upgrade(engine, "0003")
    monkeypatch.setattr(migration, "MIGRATION_LOCK_RETRIES", 2)
    monkeypatch.setenv("MNESTOMA_MIGRATION_LOCK_TIMEOUT", str(TIMEOUT))
    # 0004 needs only mnests; 0005 rebuilds an index of events, held here past every retry
    with holding(engine, "events") as holder:
        gives_up = threading.Event()
        thread = _release_later(holder, gives_up, fallback_s=15)
        try:
            with pytest.raises(mnestoma.ConflictError, match="stays at revision 0004"):
                mnestoma.upgrade(engine)
        finally:
            gives_up.set()
            thread.join()
    assert current_revision(engine) == "0004"
    with engine.connect() as conn:
        check = conn.execute(
            text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :n"),
            {"n": "ck_mnests_decay_lambda_nonneg"},
        ).scalar_one()
    assert "decay_lambda <=" in check  # 0004's upper bound, committed before 0005 failed


def test_a_revision_whose_lock_is_held_waits_the_lock_timeout_retries_and_completes(
    engine: Engine, retry_log: RetryLog
) -> None:
    mnestoma.upgrade(engine, "0004")
    with holding(engine, "events") as holder:
        thread = _release_later(holder, retry_log.second, fallback_s=HOLDER_FALLBACK_S)
        started = time.monotonic()
        try:
            mnestoma.upgrade(engine, lock_timeout=TIMEOUT)
        finally:
            retry_log.second.set()
            thread.join()
    assert current_revision(engine) == head_revision()
    assert len(retry_log.at) >= 2
    # each attempt gave up after the lock timeout, never waited for the holder (whose
    # release comes after the second retry or HOLDER_FALLBACK_S); the slack is for a busy
    # machine, far below the holder's fallback
    assert retry_log.at[0] - started < TIMEOUT + BUSY_SLACK_S
    assert retry_log.at[1] - retry_log.at[0] < (
        TIMEOUT + migration.FIRST_RETRY_PAUSE_S + BUSY_SLACK_S
    )


SECOND_MIGRATOR = """
import logging, sys
import mnestoma
logging.basicConfig(level=logging.WARNING)
mnestoma.upgrade(sys.argv[1], lock_timeout=float(sys.argv[2]))
"""


def test_a_second_upgrade_waits_for_the_first_across_its_revisions_and_both_end_at_head(
    engine: Engine, pg_empty_db_url: str, retry_log: RetryLog
) -> None:
    mnestoma.upgrade(engine, "0004")
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            mnestoma.upgrade(engine, lock_timeout=TIMEOUT)
        except BaseException as err:  # every failure counts, whatever its kind
            errors.append(err)

    with holding(engine, "events") as holder:
        first = threading.Thread(target=migrate)
        first.start()
        # the first has committed nothing past 0004 yet and is between two tries of 0005
        assert retry_log.second.wait(15)
        second = subprocess.Popen(
            [sys.executable, "-c", SECOND_MIGRATOR, pg_empty_db_url, str(TIMEOUT)],
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)  # the second process starts and asks for the migration lock
        holder.commit()
        first.join(30)
        _, stderr = second.communicate(timeout=60)
    assert errors == []
    assert second.returncode == 0, stderr
    assert "trying it again" not in stderr  # it waited for the migration lock, then found head
    assert current_revision(engine) == head_revision()


def _seed_at_0002(engine: Engine, rows: int) -> list[str]:
    """Rows as a release at revision 0002 writes them; their ids."""
    now = datetime.now(UTC)
    ids = [f"mn_live{i:010d}" for i in range(rows)]
    with engine.begin() as conn:
        for i, mid in enumerate(ids):
            conn.execute(
                text(
                    "INSERT INTO mnests (id, src_executor, src_version, dst_executor, "
                    "dst_version, weight, uses, ts_first, ts_last, ts_weight, state) VALUES "
                    "(:id, :src, '1', 'dst', '1', 0.3, 1, :now, :now, :now, 'active')"
                ),
                {"id": mid, "src": f"src{i}", "now": now},
            )
    return ids


class Writers:
    """Threads writing until stopped; each write's duration and any error are kept."""

    def __init__(self, write: Callable[[int], None], count: int, settle: float = 0.2) -> None:
        self.write = write
        self.settle = settle  # how long the writers go on once the block is done
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.longest = 0.0
        self.writes = 0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def _run(self, i: int) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                self.write(i)
            except BaseException as err:  # every failure counts, whatever its kind
                with self._lock:
                    self.errors.append(err)
                return
            with self._lock:
                self.longest = max(self.longest, time.monotonic() - began)
                self.writes += 1

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(self.settle)  # a few writes on the migrated schema too
        self.stop.set()
        for t in self.threads:
            t.join(30)


def _hold_for(engine: Engine, table: str, seconds: float) -> threading.Thread:
    """A reader's transaction that keeps ACCESS SHARE on ``table`` for ``seconds``."""
    ready = threading.Event()

    def hold() -> None:
        with holding(engine, table):
            ready.set()
            time.sleep(seconds)

    thread = threading.Thread(target=hold)
    thread.start()
    ready.wait(10)
    return thread


def upgraded_to_head_beside(
    write: Callable[[int], None], engine: Engine, table: str, seconds: float
) -> Writers:
    """Upgrade the store to head while four threads ``write`` and a reader holds ``table``
    for ``seconds``; every write succeeds and some happen. Returns the writers' record."""
    with Writers(write, 4) as writers:
        reader = _hold_for(engine, table, seconds)
        mnestoma.upgrade(engine, lock_timeout=TIMEOUT)
        reader.join()
    assert current_revision(engine) == head_revision()
    assert writers.errors == []
    assert writers.writes > 0
    return writers


# How the releases before this package's statements reinforced a row, as raw SQL.
REINFORCE_AS_BEFORE = text(
    "UPDATE mnests SET uses = uses + 1, ts_last = :now, ts_weight = :now WHERE id = :id"
)


def test_writers_of_a_previous_release_wait_briefly_and_never_fail_while_0002_goes_to_head(
    engine: Engine,
) -> None:
    mnestoma.upgrade(engine, "0002")
    ids = _seed_at_0002(engine, 4)

    def old_release_write(i: int) -> None:
        with engine.begin() as conn:
            now = datetime.now(UTC)
            conn.execute(REINFORCE_AS_BEFORE, {"id": ids[i], "now": now})
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, weight_before, weight_after, "
                    "state_before, state_after) VALUES (:id, 'reinforced', :now, 0.3, 0.3, "
                    "'active', 'active')"
                ),
                {"id": ids[i], "now": now},
            )

    # a long read of events: 0002 holds mnests while it waits for events behind it
    writers = upgraded_to_head_beside(old_release_write, engine, "events", 2.0)
    # behind a revision's lock request for at most about one lock timeout, not the reader
    assert writers.longest < 1.5


def test_writers_see_no_error_nor_deadlock_while_the_store_goes_to_head_then_the_package_writes(
    engine: Engine,
) -> None:
    """A release writes the columns its revisions add (0008: the outcome counts), so a
    service upgrades the schema before it deploys the release that needs it: while the
    store goes from 0004 to head, the writers are the previous release's, locking the row
    first as the package did (SELECT ... FOR UPDATE, UPDATE, INSERT of its event). 0005
    rebuilds an index of events, 0006 one of mnests, 0008 adds columns and constraints to
    both; then the package's own writers go on."""
    mnestoma.upgrade(engine, "0004")
    ids = _seed_at_0002(engine, 4)
    failures: list[str] = []

    @event.listens_for(engine, "handle_error")
    def note(ctx: Any) -> None:
        failures.append(str(getattr(ctx.original_exception, "sqlstate", None)))

    def previous_release_write(i: int) -> None:
        with engine.begin() as conn:
            now = datetime.now(UTC)
            conn.execute(text("SELECT id FROM mnests WHERE id = :id FOR UPDATE"), {"id": ids[i]})
            conn.execute(REINFORCE_AS_BEFORE, {"id": ids[i], "now": now})
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_before, "
                    "weight_after, state_before, state_after, recorder) VALUES (:id, "
                    "'reinforced', :now, :turn, 0.3, 0.3, 'active', 'active', 'call')"
                ),
                {"id": ids[i], "now": now, "turn": f"t{time.monotonic_ns()}"},
            )

    writers = upgraded_to_head_beside(previous_release_write, engine, "mnests", 1.5)
    assert writers.longest < 1.5

    with mnestoma.Mnestoma(engine) as m:

        def record(i: int) -> None:
            m.record_passing(f"src{i}", "1", "dst", "1", outcome="ok")

        with Writers(record, 4) as package_writers:
            time.sleep(0.3)
        assert package_writers.errors == [] and package_writers.writes > 0
        assert m.find("src0", "1", "dst", "1").ok_count > 0  # type: ignore[union-attr]
    assert "40P01" not in failures  # DeadlockDetected, even one the facade would retry


def test_the_migrating_connection_goes_back_to_the_pool_without_lock_or_lock_timeout(
    pg_empty_db_url: str,
) -> None:
    eng = make_engine(pg_empty_db_url, pool_size=1, max_overflow=0)
    try:
        mnestoma.upgrade(eng, "0005")
        mnestoma.upgrade(eng, lock_timeout=TIMEOUT)
        with eng.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"
            advisory = conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND database = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database())"
                )
            ).scalar_one()
        assert advisory == 0
    finally:
        eng.dispose()


def test_db_upgrade_lock_timeout_option_bounds_each_try_and_says_where_the_store_stays(
    pg_empty_db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    mnestoma.upgrade(engine, "0004")
    monkeypatch.setattr(migration, "MIGRATION_LOCK_RETRIES", 1)
    with holding(engine, "events"):
        started = time.monotonic()
        result = CliRunner().invoke(
            cli,
            ["db", "upgrade", "--database-url", pg_empty_db_url, "--lock-timeout", str(TIMEOUT)],
        )
        took = time.monotonic() - started
    assert result.exit_code != 0
    assert "stays at revision 0004" in result.output + (result.stderr or "")
    assert took < 5
    assert current_revision(engine) == "0004"


def test_db_sql_for_postgresql_opens_each_revision_with_set_lock_timeout() -> None:
    """0006's script: its transaction, its concurrent index statements (outside any
    transaction, under the session's lock_timeout), then the transaction of its stamp."""
    result = CliRunner().invoke(cli, ["db", "sql", "--dialect", "postgresql", "0005:0006"])
    assert result.exit_code == 0, result.output
    assert result.output.count("SET lock_timeout = '3s';") == result.output.count("BEGIN;") == 2
    begin = result.output.index("BEGIN;")
    assert result.output.index("SET lock_timeout", begin) < result.output.index("-- Running")


def test_db_sql_for_postgresql_sets_the_lock_timeout_in_every_revisions_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MNESTOMA_MIGRATION_LOCK_TIMEOUT", "0.25")
    result = CliRunner().invoke(cli, ["db", "sql", "--dialect", "postgresql", "0003:0006"])
    assert result.exit_code == 0, result.output
    out = result.output
    # each revision commits its first transaction before the statements that run outside
    # one (a validation, a concurrent index build), then stamps in a second
    assert out.count("BEGIN;") == out.count("COMMIT;") == 6
    assert out.count("SET lock_timeout = '250ms';") == 6
    given = CliRunner().invoke(
        cli, ["db", "sql", "--dialect", "postgresql", "--lock-timeout", "10", "0005:0006"]
    )
    assert "SET lock_timeout = '10s';" in given.output


def test_db_sql_for_sqlite_sets_no_lock_timeout() -> None:
    result = CliRunner().invoke(cli, ["db", "sql", "--dialect", "sqlite", "0005:0006"])
    assert result.exit_code == 0, result.output
    assert "lock_timeout" not in result.output


def test_the_migration_lock_timeout_comes_from_the_keyword_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MNESTOMA_MIGRATION_LOCK_TIMEOUT", raising=False)
    assert migration_lock_timeout() == migration.DEFAULT_MIGRATION_LOCK_TIMEOUT_S
    monkeypatch.setenv("MNESTOMA_MIGRATION_LOCK_TIMEOUT", "7.5")
    assert migration_lock_timeout() == 7.5
    assert migration_lock_timeout(0.5) == 0.5
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(mnestoma.InvalidInput):
            migration_lock_timeout(bad)
