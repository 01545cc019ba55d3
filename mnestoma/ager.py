"""The ager: decay, demote, merge, prune and count archive candidates.

:func:`run_ager` does a whole run in the caller's transaction (a unit of work's, a dry run's).
The facades run it in batches instead (:func:`begin_batched_run`, :func:`age_batch`,
:func:`end_batched_run`): each batch covers a range of the table's own order (SQLite rowids,
PostgreSQL pages) and is its own transaction, so a writer waits for one batch, not the run.

Why batches add up to the one-transaction run: every step is decided row by row at the
run's ``now`` and none undoes another. A decayed row has ``ts_weight = now`` and is not
decayed again; a demoted, merged or pruned row has left the states the ager changes; a merge
pairs an active row with the one decaying row of its key, which exists or not whatever
batch the two are in. So a batch applied twice (a rerun after a kill, a row visited again
after an update moved it) changes nothing the second time, and a run stopped anywhere is
completed by the next run at the same ``now``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

from .locking import WaitingWriters, pause_on
from .rules import (
    AGER_WRITERS_PATIENCE_S,
    AGER_WRITERS_POLL_S,
    AgerCount,
    AgerReport,
    archive_cutoff,
)
from .runner import StatementRunner
from .sql.ager import (
    MERGE,
    PROGRESS_BEGIN,
    PROGRESS_DONE,
    PROGRESS_MOVE,
    AgerChange,
    ager_statements,
    cache_size_pragma,
    postgresql_ager_statements,
    sqlite_ager_statements,
)
from .sql.tables import AGER_RUNS

__all__ = [
    "AGER_CACHE_KIB",
    "AgerBounds",
    "BatchedRun",
    "TableWriters",
    "age_batch",
    "ager_bounds",
    "ager_page_cache",
    "ager_writers",
    "archive_candidates",
    "begin_batched_run",
    "end_batched_run",
    "run_ager",
]

_INSERT_AGER_RUN = AGER_RUNS.insert()

# SQLite's page cache during a run, at least (KiB): the demotions rewrite index entries all
# over the edge-key and (state, src) indexes, and the default 2 MB cache would read and
# write a page back for most of them. Bounded: the run's memory does not grow with the rows.
AGER_CACHE_KIB = 64 * 1024


def _run(conn: Connection, stmt: Executable, params: Any = None) -> Any:
    """Execute on ``conn`` through the package's executor (driver errors translated)."""
    return StatementRunner(conn).execute(stmt, params)


def run_ager(conn: Connection, now: datetime) -> AgerReport:
    """Run the ager at ``now`` on ``conn``, whose transaction (holding the write lock) the
    caller owns; set-based SQL, so memory does not grow with the number of rows."""
    started = time.perf_counter()
    p = {"now": now, "cutoff": archive_cutoff(now)}
    if conn.dialect.name == "postgresql":
        report = _run_postgresql(conn, p, batched=False)
    else:
        with _page_cache(conn, AGER_CACHE_KIB):
            report = _run_sqlite(conn, p, batched=False)
    # One row per run, in the run's transaction: it exists exactly when the run commits.
    _record_run(conn, now, time.perf_counter() - started, report)
    return report


def _record_run(conn: Connection, now: datetime, duration_s: float, report: AgerReport) -> None:
    """The ``ager_runs`` row of a completed run."""
    _run(conn, _INSERT_AGER_RUN, {"ts": now, "duration_s": duration_s, **asdict(report)})


class AgerBounds(NamedTuple):
    """What a run in batches covers: positions ``[first, end)`` holding ``rows`` rows; and
    whether its batches must look for merge pairs (``merges``: on PostgreSQL, whether the
    store held a versioned decaying row when they were read; always on SQLite)."""

    first: int
    end: int
    rows: int
    merges: bool = True


@dataclass(frozen=True, slots=True)
class BatchedRun:
    """A run of the ager in batches: its id in ``ager_progress``, its ``now``, the positions
    its batches cover (``[first, end)``) and how many the first batch takes (``step``)."""

    run_id: int
    now: datetime
    first: int
    end: int
    step: int
    merges: bool = True


def ager_bounds(conn: Connection) -> AgerBounds:
    """The positions the table's rows hold now (SQLite rowids, PostgreSQL pages) and how
    many rows it holds: what a run in batches covers (rows added later are newer than its
    ``now``). A read, done before the run's first write so that it holds no lock; on
    PostgreSQL as :func:`_whole_table_read` says."""
    _whole_table_read(conn)
    first, end, rows, merges = _run(conn, ager_statements(conn.dialect.name, True).bounds).one()
    return AgerBounds(int(first or 0), int(end or 0), int(rows or 0), bool(merges))


def begin_batched_run(
    conn: Connection, now: datetime, batch_rows: int, started: datetime, bounds: AgerBounds
) -> BatchedRun:
    """Plan a run at ``now`` in batches of about ``batch_rows`` rows over ``bounds``
    (:func:`ager_bounds`), and note it in ``ager_progress``."""
    first, end, rows, merges = bounds
    span = max(0, end - first)
    step = max(1, -(-batch_rows * span // max(rows, 1)))  # positions holding batch_rows rows
    run_id = _run(
        conn,
        PROGRESS_BEGIN,
        {
            "ts": now,
            "started": started,
            "updated": started,
            "batches": 0,
            "position": first,
            "end_position": end,
        },
    ).scalar_one()
    return BatchedRun(int(run_id), now, first, end, step, merges)


def age_batch(
    conn: Connection,
    run: BatchedRun,
    lo: int,
    hi: int,
    number: int,
    at: datetime,
    *,
    writers_about: bool = True,
) -> AgerReport:
    """Age the rows of one batch (positions ``[lo, hi)``) at the run's ``now``, in the
    caller's transaction, and move the run's progress row to it (batch ``number``, at
    wall-clock ``at``). The report's ``archive_candidates`` is 0: it is counted once, at the
    end (:func:`archive_candidates`). On PostgreSQL, with ``writers_about``, the batch hands
    the pages it writes out to the disk as it goes; without, it commits without waiting for
    its WAL flush."""
    p = {"now": run.now, "lo": lo, "hi": hi}
    if conn.dialect.name == "postgresql":
        report = _run_postgresql(conn, p, batched=True, flush=writers_about, merges=run.merges)
    else:
        report = _run_sqlite(conn, p, batched=True)
    move = {"run_id": run.run_id, "batches": number, "position": hi, "updated": at}
    _run(conn, PROGRESS_MOVE, move)
    return report


def archive_candidates(conn: Connection, now: datetime) -> int:
    """The decaying rows the ager counts as archive candidates at ``now`` (a read; on
    PostgreSQL as :func:`_whole_table_read` says)."""
    count = ager_statements(conn.dialect.name, True).archive_count
    p = {"now": now, "cutoff": archive_cutoff(now)}
    _whole_table_read(conn)
    return int(_run(conn, count, p).scalar_one())


def _whole_table_read(conn: Connection) -> None:
    """PostgreSQL: no parallel workers for the rest of the caller's transaction, and the
    pages it writes out handed to the disk as it goes. A run's reads of the whole table
    then take one core and leave the others to the writers (on a 2-core machine, writers'
    calls took up to 300 ms while the archive count ran with two parallel workers); and the
    first read after a bulk load, which sets hint bits on every page (180 MB written at a
    million rows), leaves no burst of dirty pages for the OS to write out later. The
    session's own settings come back with the transaction's end."""
    if conn.dialect.name == "postgresql":
        s = postgresql_ager_statements(True)
        _run(conn, s.serial_reads)
        _run(conn, s.write_behind)


def end_batched_run(
    conn: Connection, run: BatchedRun, report: AgerReport, duration_s: float
) -> None:
    """Write the run's ``ager_runs`` row and clear its progress row (with those of the
    interrupted runs before it, which it completed), in the caller's transaction."""
    _record_run(conn, run.now, duration_s, report)
    _run(conn, PROGRESS_DONE, {"run_id": run.run_id})


def _run_postgresql(
    conn: Connection, p: dict[str, Any], *, batched: bool, flush: bool = True, merges: bool = True
) -> AgerReport:
    """A whole run, or with ``batched`` one batch (no archive count), in the caller's
    transaction (a batch with ``flush`` false commits without waiting for its WAL flush).
    A whole run locks the table; a batch locks only the rows it changes, so
    writers of other rows go on meanwhile (each statement decides row by row on the latest
    committed version of a row it must wait for), and gives up on a row it waited for too
    long (:data:`~mnestoma.rules.AGER_ROW_LOCK_TIMEOUT_S`; the facades try it again). A
    batch with ``flush`` also hands the pages it writes out to the disk as it goes
    (:data:`~mnestoma.rules.AGER_FLUSH_AFTER_KIB`)."""
    s = postgresql_ager_statements(batched)
    if batched:
        _run(conn, s.table_locks)
        _run(conn, s.row_lock_timeout)
        # While writers are about, a batch commits as any write does, waiting for its WAL
        # to reach the disk: that paces the run by the disk it shares with them. (Committed
        # without waiting, batches left their WAL for the writers' commits to flush, and on
        # a slow disk the writers fell seconds behind.) It also hands the pages it writes
        # out to the disk as it goes, not in a later burst their commits would queue
        # behind. With none about, it does neither: nobody's commits wait for the disk.
        if flush:
            _run(conn, s.write_behind)
        else:
            _run(conn, s.async_commit)
    else:
        # One lock order with writers: they wait for the run instead of deadlocking.
        _run(conn, s.lock)
    # A batch of a run that began with no decaying row to merge into skips the merge: the
    # rows the run demotes are the only rows of their keys, and a twin made since (by an
    # operator's transition) fails the batch's demotion, which the run then retries with
    # the merge (see mnestoma.facade.age_in_batches).
    changes = s.changes if merges else tuple(c for c in s.changes if c.name != MERGE)
    return _changed(conn, changes, s.archive_count, p, batched=batched)


class TableWriters:
    """What the ager on PostgreSQL sees of the writers: the other sessions holding a writer's
    lock on ``mnests``. A batch locks only its own rows, so writers of other rows never
    queue behind it; but writers and the ager share the machine (its cores, its disk), and
    writers that fell behind would stay behind while the ager went on at full speed. So
    before each batch the run lets the writers in first: :meth:`let_in` waits until none is
    in, up to :data:`~mnestoma.rules.AGER_WRITERS_PATIENCE_S`."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._writers_in = postgresql_ager_statements(True).writers_in

    def let_in(self) -> bool:
        """Before a batch: wait for the writers in a transaction on ``mnests`` to end (up to
        the patience); True when there were any."""
        deadline = time.monotonic() + AGER_WRITERS_PATIENCE_S
        seen = False
        while self._writers_about():
            seen = True
            if time.monotonic() >= deadline:
                break
            pause_on(self._conn, AGER_WRITERS_POLL_S)
        return seen

    def _writers_about(self) -> bool:
        with self._conn.begin():
            return bool(_run(self._conn, self._writers_in).scalar_one())

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> TableWriters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ager_writers(conn: Connection) -> WaitingWriters | TableWriters:
    """What a run in batches on ``conn`` sees of the writers between two batches, and lets
    them in by (:class:`~mnestoma.locking.WaitingWriters` on SQLite, :class:`TableWriters`
    on PostgreSQL)."""
    if conn.dialect.name == "postgresql":
        return TableWriters(conn)
    return WaitingWriters(conn)


def _run_sqlite(conn: Connection, p: dict[str, Any], *, batched: bool) -> AgerReport:
    """A whole run, or with ``batched`` one batch (no archive count), in the caller's
    transaction."""
    s = sqlite_ager_statements(batched)
    _run(conn, s.pairs_create)
    try:
        report = _changed(conn, s.changes, s.archive_count, p, batched=batched)
    except BaseException:
        _cleanup(conn, s.pairs_drop)
        raise
    _run(conn, s.pairs_drop)
    return report


def _changed(
    conn: Connection,
    changes: tuple[AgerChange, ...],
    archive_count: Executable,
    p: dict[str, Any],
    *,
    batched: bool,
) -> AgerReport:
    """Run a dialect's changes in their order, each row count added to the report's counts
    the change names; with ``batched``, no archive count (counted once, at the end)."""
    counts = dict.fromkeys(AgerCount, 0)
    for change in changes:
        changed = _run(conn, change.statement, p).rowcount
        for name in change.counts:
            counts[name] += changed
    if not batched:
        counts[AgerCount.ARCHIVE_CANDIDATES] += int(_run(conn, archive_count, p).scalar_one())
    return AgerReport(**{name.value: n for name, n in counts.items()})


def _cleanup(conn: Connection, stmt: Executable) -> None:
    """Undo the run's temporary state after a failure; a second failure here would only
    hide the first, which is the one the caller needs to see."""
    with suppress(Exception):
        conn.execute(stmt)


@contextmanager
def ager_page_cache(conn: Connection) -> Iterator[None]:
    """SQLite: the ager's page cache (:data:`AGER_CACHE_KIB`) on ``conn`` for a whole run in
    batches, set back afterwards; nothing on PostgreSQL."""
    if conn.dialect.name != "sqlite":
        yield
        return
    with _page_cache(conn, AGER_CACHE_KIB):
        yield


@contextmanager
def _page_cache(conn: Connection, at_least_kib: int) -> Iterator[None]:
    """SQLite's page cache at ``at_least_kib`` or more for the block, set back afterwards,
    also on error (``PRAGMA cache_size`` belongs to the connection, not the transaction)."""
    s = sqlite_ager_statements()
    before = int(_run(conn, s.cache_size).scalar_one())
    # negative: KiB; positive: pages
    kib = -before if before < 0 else before * int(_run(conn, s.page_size).scalar_one()) // 1024
    if kib >= at_least_kib:
        yield
        return
    _run(conn, cache_size_pragma(-at_least_kib))
    try:
        yield
    except BaseException:
        _cleanup(conn, cache_size_pragma(before))
        raise
    _run(conn, cache_size_pragma(before))
