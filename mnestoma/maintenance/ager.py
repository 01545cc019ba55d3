"""The ager: decay, demote, merge, prune and count archive candidates; the whole of it but its
rules (:mod:`mnestoma.rules`) and its statements (:mod:`mnestoma.schema.sql.ager`).

:func:`run_ager` does a whole run in the caller's transaction (a unit of work's, a dry run's).
Both facades run it in batches instead, through :func:`age_in_batches`: the run's lock
(:func:`ager_run_lock`), its loop, each batch (:func:`begin_batched_run`, :func:`age_batch`,
:func:`end_batched_run`) its own transaction retried when transient, a batch that waited for
writers' rows tried again smaller after a pause, the run's progress and its stop. Each batch
covers a range of the table's own order (SQLite rowids, PostgreSQL pages), so a writer waits
for one batch, not the run. While no writer is about a batch grows, step after step, until
one waits for it (:class:`BatchGrowth`); what a run keeps on its connection from batch to
batch is an :class:`AgerSession`.

Why batches add up to the one-transaction run: every step is decided row by row at the
run's ``now`` and none undoes another. A decayed row has ``ts_weight = now`` and is not
decayed again; a demoted, merged or pruned row has left the states the ager changes; a merge
pairs an active row with the one decaying row of its key, which exists or not whatever
batch the two are in. So a batch applied twice (a rerun after a kill, a row visited again
after an update moved it) changes nothing the second time, and a run stopped anywhere is
completed by the next run at the same ``now``.

Each run also forgets the planner's chains (``mnest_chains``) whose decayed count at its
``now`` has faded below :data:`~mnestoma.rules.CHAIN_FORGET_BELOW`
(:func:`forget_faded_chains`): after the edges, in batches of its own by key range, each its
own transaction, writers let in before each as before the edges' batches. On PostgreSQL a
batch skips the chains a writer holds (``FOR UPDATE SKIP LOCKED``) instead of waiting for
them: a writer locks its turn's edges first, then its chains, so a wait for a chain could
close a cycle; a chain being counted has not faded, and the next run forgets it if it has.
Forgetting is decided row by row at the run's ``now`` too: a batch applied twice forgets
nothing more. The chains forgotten are not a counter of the run's report (whose counters
are the columns of ``ager_runs``): they go to the debug log.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection
from sqlalchemy.sql import Executable

from mnestoma.core.clock import utc_now
from mnestoma.core.errors import (
    MnestomaError,
    StoreError,
    is_lock_not_available,
    is_unique_violation,
    translate_errors,
)
from mnestoma.core.retrying import with_retries
from mnestoma.core.rules import (
    AGER_BATCH_GROWN_MAX_S,
    AGER_BATCH_QUIET_TARGET_S,
    AGER_BATCH_ROWS,
    AGER_LOCK_POLL_S,
    AGER_STOP_POLL_S,
    AGER_WAIT_WARN_S,
    AGER_WRITERS_PATIENCE_S,
    AGER_WRITERS_POLL_S,
    AGER_WRITERS_SEEN_S,
    AgerCount,
    AgerReport,
    ager_batch_grows,
    ager_batch_retry_pause,
    ager_batch_target,
    ager_next_step,
    ager_regrown_step,
    ager_shrunk_end,
    ager_wal_checkpoints,
    ager_writers_about,
    archive_cutoff,
)
from mnestoma.core.settings import Settings
from mnestoma.core.validation import check_batch_rows, check_dry_run, check_progress
from mnestoma.engines.backend import backend_of
from mnestoma.engines.locking import (
    MIGRATION_LOCK_KEY,
    WaitingWriters,
    beside_store,
    open_beside_store,
    pause_on,
    try_flock,
)
from mnestoma.engines.partitions import note_written, upkeep_after_commit
from mnestoma.maintenance.steps import GoOn, OwnConnection, Read, Steps, for_write
from mnestoma.schema.runner import StatementRunner, _prepare
from mnestoma.schema.sql import chains as chains_sql
from mnestoma.schema.sql.ager import (
    ADVISORY_HELD,
    ADVISORY_LOCK,
    ADVISORY_TRY_LOCK,
    ADVISORY_UNLOCK,
    PAIRS_STEP,
    PROGRESS_BEGIN,
    PROGRESS_DONE,
    PROGRESS_MOVE,
    AgerChange,
    SQLiteAgerStatements,
    ager_statements,
    cache_size_pragma,
    postgresql_ager_statements,
    sqlite_ager_statements,
    wal_autocheckpoint_pragma,
)
from mnestoma.schema.sql.tables import AGER_RUNS

__all__ = [
    "AGER_CACHE_KIB",
    "AGER_LOCK_KEY",
    "AgerBounds",
    "AgerSession",
    "BatchGrowth",
    "BatchProgress",
    "BatchedRun",
    "GoOn",
    "RunStopped",
    "TableWriters",
    "age_batch",
    "age_in_batches",
    "ager_bounds",
    "ager_run_lock",
    "ager_running",
    "ager_steps",
    "ager_writers",
    "archive_candidates",
    "begin_batched_run",
    "check_ager_call",
    "end_batched_run",
    "forget_chains_batch",
    "forget_faded_chains",
    "run_ager",
    "run_ager_now",
]

logger = logging.getLogger("mnestoma.ager")  # the logger's public name

# The ager's run lock (PostgreSQL advisory lock): the number after the migrations' lock.
AGER_LOCK_KEY = MIGRATION_LOCK_KEY + 1

_INSERT_AGER_RUN = AGER_RUNS.insert()

# SQLite's page cache during a run, at least (KiB): the demotions rewrite index entries all
# over the edge-key and (state, src) indexes, and the default 2 MB cache would read and
# write a page back for most of them. Bounded: the run's memory does not grow with the rows.
AGER_CACHE_KIB = 64 * 1024


def _run(conn: Connection, stmt: Executable, params: Any = None) -> Any:
    """Execute on ``conn`` through the package's executor (driver errors translated)."""
    return StatementRunner(conn).execute(stmt, params)


_ROWCOUNT = {"preserve_rowcount": True}


def _count(conn: Connection, stmt: Executable, params: dict[str, Any]) -> int:
    """Run ``stmt`` and return its row count, compiled once per dialect (the runner's cache
    of prepared statements) and run as the driver's SQL: a run executes the same few large
    statements at every step, and Core's per-execution work on them (their cache key, their
    parameters) cost a fifth of a run of short steps."""
    prepared = _prepare(conn, stmt, ())
    if prepared is None:
        return int(_run(conn, stmt, params).rowcount)
    with translate_errors():
        args = prepared.args(params, {})
        return int(conn.exec_driver_sql(prepared.sql, args, _ROWCOUNT).rowcount)


def run_ager(conn: Connection, now: datetime) -> AgerReport:
    """Run the ager at ``now`` on ``conn``, whose transaction (holding the write lock) the
    caller owns; set-based SQL, so memory does not grow with the number of rows."""
    started = time.perf_counter()
    p = {"now": now, "cutoff": archive_cutoff(now)}
    if backend_of(conn).one_writer:
        with _page_cache(conn, AGER_CACHE_KIB):
            report = _run_sqlite(conn, p)
    else:
        report = _run_postgresql(conn, p)
    # The faded chains, in one statement after the edges (on PostgreSQL the run holds the
    # table lock of mnests: no writer is between its edges and its chains meanwhile).
    forgotten = _count(conn, chains_sql.forget_chains(conn.dialect.name), {"now": now})
    logger.debug("the ager's run at %s forgot %d faded chains", now.isoformat(), forgotten)
    # One row per run, in the run's transaction: it exists exactly when the run commits.
    _record_run(conn, now, time.perf_counter() - started, report)
    return report


def _record_run(conn: Connection, now: datetime, duration_s: float, report: AgerReport) -> None:
    """The ``ager_runs`` row of a completed run."""
    _run(conn, _INSERT_AGER_RUN, {"ts": now, "duration_s": duration_s, **asdict(report)})


class AgerBounds(NamedTuple):
    """What a run in batches covers: positions ``[first, end)`` holding ``rows`` rows; and
    whether its batches must look for merge pairs (``merges``: whether the store held a
    versioned decaying row when they were read)."""

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
    session: AgerSession | None = None,
    growth: BatchGrowth | None = None,
) -> AgerReport:
    """Age the rows of one batch (positions ``[lo, hi)``) at the run's ``now``, in the
    caller's transaction, and move the run's progress row to it (batch ``number``, at
    wall-clock ``at``). The report's ``archive_candidates`` is 0: it is counted once, at the
    end (:func:`archive_candidates`). On PostgreSQL, with ``writers_about``, the batch hands
    the pages it writes out to the disk as it goes; without, it commits without waiting for
    its WAL flush. With ``growth`` the batch goes on past ``hi``, step after step, for as
    long as ``growth`` says (its ``end``: where the batch ended); with ``session``, the run's
    (:class:`AgerSession`), it uses what the session keeps and says whether its commit
    checkpoints."""
    postgresql = not backend_of(conn).one_writer
    if session is not None:
        session.batch_begins()
    if postgresql:
        _batch_settings(conn, flush=writers_about)
    pairs_ready = session is not None and session.pairs_ready
    report = AgerReport()
    if growth is not None:
        growth.begins(hi)
    while True:
        p = {"now": run.now, "lo": lo, "hi": hi}
        took = time.perf_counter()
        if postgresql:
            report += _batch_postgresql(conn, p, merges=run.merges)
        else:
            report += _batch_sqlite(conn, p, merges=run.merges, pairs_ready=pairs_ready)
        if growth is None:
            break
        following = growth.next_end(lo, hi, time.perf_counter() - took)
        if following is None:
            break
        lo, hi = hi, following
    move = {"run_id": run.run_id, "batches": number, "position": hi, "updated": at}
    _count(conn, PROGRESS_MOVE, move)
    if session is not None:
        session.batch_commits(writers_about)
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
    if not backend_of(conn).one_writer:
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


def _run_postgresql(conn: Connection, p: dict[str, Any]) -> AgerReport:
    """A whole run in the caller's transaction. It locks the table (one lock order with
    writers: they wait for the run instead of deadlocking)."""
    s = postgresql_ager_statements(False)
    _run(conn, s.lock)
    return _changed(conn, s.changes, s.archive_count, p, batched=False)


def _batch_settings(conn: Connection, *, flush: bool) -> None:
    """PostgreSQL, at the start of a batch's transaction: its table locks and its row lock
    timeout, and (``flush``) its pages written behind it or (not) its commit not waiting for
    its WAL flush.

    A batch locks only the rows it changes, so writers of other rows go on meanwhile (each
    statement decides row by row on the latest committed version of a row it must wait
    for), and gives up on a row it waited for too long
    (:data:`~mnestoma.rules.AGER_ROW_LOCK_TIMEOUT_S`; the facades try it again)."""
    s = postgresql_ager_statements(True)
    _run(conn, s.table_locks)
    _run(conn, s.row_lock_timeout)
    # While writers are about, a batch commits as any write does, waiting for its WAL to
    # reach the disk: that paces the run by the disk it shares with them. (Committed without
    # waiting, batches left their WAL for the writers' commits to flush, and on a slow disk
    # the writers fell seconds behind.) It also hands the pages it writes out to the disk as
    # it goes (AGER_FLUSH_AFTER_KIB), not in a later burst their commits would queue behind.
    # With none about, it does neither: nobody's commits wait for the disk.
    if flush:
        _run(conn, s.write_behind)
    else:
        _run(conn, s.async_commit)


def _batch_postgresql(conn: Connection, p: dict[str, Any], *, merges: bool) -> AgerReport:
    """One step of a batch (positions ``p["lo"]`` to ``p["hi"]``), no archive count, in the
    caller's transaction (see :func:`_batch_settings`)."""
    s = postgresql_ager_statements(True)
    # A batch of a run that began with no decaying row to merge into skips the merge: the
    # rows the run demotes are the only rows of their keys, and a twin made since (by an
    # operator's transition) fails the batch's demotion, which the run then retries with
    # the merge (see :func:`age_in_batches`).
    return _changed(conn, s.changes, s.archive_count, p, batched=True, merges=merges)


class BatchGrowth:
    """How far one batch of a run goes while no writer is about: step after step of
    positions, each sized to take :data:`~mnestoma.rules.AGER_BATCH_QUIET_TARGET_S` (a
    writer that comes waits for one step), in the batch's one transaction, until a writer
    waits for it (:meth:`~mnestoma.engines.locking.WaitingWriters.waiting_now`), the run's caller
    asks it to stop (``go_on``), :data:`~mnestoma.rules.AGER_BATCH_GROWN_MAX_S` has gone by,
    or the run's positions end (``run_end``). What the next batch starts from: ``step``;
    where the batch ended: ``end``; whether a writer came: ``writers_came``."""

    def __init__(
        self,
        writers: WaitingWriters | TableWriters,
        run_end: int,
        step: int,
        go_on: Callable[[], bool] | None = None,
    ) -> None:
        self._writers = writers
        self._run_end = run_end
        self._go_on = go_on
        self._first_step = step
        self._deadline = 0.0
        self.step = step
        self.end = 0
        self.writers_came = False

    def begins(self, hi: int) -> None:
        """The batch's transaction begins (again, when a first attempt failed), its first
        step ending at ``hi``."""
        self._deadline = time.monotonic() + AGER_BATCH_GROWN_MAX_S
        self.step = self._first_step
        self.end = hi
        self.writers_came = False

    def next_end(self, lo: int, hi: int, took_s: float) -> int | None:
        """After a step ``[lo, hi)`` that took ``took_s`` seconds: the end of the next step
        of this batch, or None when the batch commits now."""
        self.end = hi
        target = AGER_BATCH_QUIET_TARGET_S
        self.step = ager_next_step(hi - lo, took_s, target, target)
        if hi >= self._run_end or time.monotonic() >= self._deadline:
            return None
        if self._writers.waiting_now():
            self.writers_came = True
            return None
        if self._go_on is not None and not self._go_on():
            return None
        return min(hi + self.step, self._run_end)


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
            return self.waiting_now()

    def waiting_now(self) -> bool:
        """Whether writers are in a transaction on ``mnests`` now, asked in the caller's
        transaction (a batch's, between two of its steps)."""
        return bool(_run(self._conn, self._writers_in).scalar_one())

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> TableWriters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ager_writers(conn: Connection) -> WaitingWriters | TableWriters:
    """What a run in batches on ``conn`` sees of the writers between two batches, and lets
    them in by (:class:`~mnestoma.engines.locking.WaitingWriters` on SQLite, :class:`TableWriters`
    on PostgreSQL)."""
    if backend_of(conn).one_writer:
        return WaitingWriters(conn)
    return TableWriters(conn)


def _run_sqlite(conn: Connection, p: dict[str, Any]) -> AgerReport:
    """A whole run in the caller's transaction."""
    s = sqlite_ager_statements(False)
    return _with_pairs(
        conn, s, lambda: _changed(conn, s.changes, s.archive_count, p, batched=False)
    )


def _batch_sqlite(
    conn: Connection, p: dict[str, Any], *, merges: bool, pairs_ready: bool
) -> AgerReport:
    """One step of a batch (rowids ``p["lo"]`` to ``p["hi"]``), no archive count, in the
    caller's transaction; with ``pairs_ready`` in the temporary table of pairs the run's
    session keeps (emptied first: a step that failed may have left some), else in one of
    its own. A run that began with no versioned decaying row skips the merge (see
    :func:`_batch_postgresql`)."""
    s = sqlite_ager_statements(True)

    def changed() -> AgerReport:
        return _changed(conn, s.changes, s.archive_count, p, batched=True, merges=merges)

    if not merges:
        return changed()
    if pairs_ready:
        _count(conn, s.pairs_clear, p)
        return changed()
    return _with_pairs(conn, s, changed)


def _with_pairs(
    conn: Connection, s: SQLiteAgerStatements, changes: Callable[[], AgerReport]
) -> AgerReport:
    """``changes()`` with the temporary table of pairs created for it and dropped after (a
    table the connection kept, from a run in batches stopped before its end, is emptied)."""
    _run(conn, s.pairs_create)
    _run(conn, s.pairs_clear)
    try:
        report = changes()
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
    merges: bool = True,
) -> AgerReport:
    """Run a dialect's changes in their order, each row count added to the report's counts
    the change names; with ``batched``, no archive count (counted once, at the end). The
    steps of the merge are skipped without ``merges``, and on SQLite (after its pairs step)
    when there is no pair to merge."""
    counts = dict.fromkeys(AgerCount, 0)
    for change in changes:
        if change.merging and not merges:
            continue
        changed = _count(conn, change.statement, p)
        if change.name == PAIRS_STEP and not changed:
            merges = False  # no pair: nothing for the other merge steps
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


class AgerSession:
    """What a run in batches keeps on its connection from its first batch to its last
    (SQLite; nothing on PostgreSQL), each set back at its end, also on error:

    - the ager's page cache (:data:`AGER_CACHE_KIB`);
    - the temporary table of merge pairs, created once (each step empties it);
    - the WAL's automatic checkpoints held back: a batch's commit checkpoints (PASSIVE, at
      the connection's own ``wal_autocheckpoint``) only when
      :func:`~mnestoma.rules.ager_wal_checkpoints` says so (writers about, or the WAL at
      :data:`~mnestoma.rules.AGER_WAL_CHECKPOINT_MIB`), and the run's last commit does,
      after :meth:`release`. The WAL's size is read from its index (the ``-shm`` file's
      header, as SQLite's file format documents it); where there is none to read (no such
      file, checkpoints off already), nothing is held back.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._stack = ExitStack()
        self._autocheckpoint = 0  # the connection's own; 0: nothing held back
        self._now = 0  # the setting the connection has now
        self._wal_index = -1
        self._frame_bytes = 0
        self.pairs_ready = False

    def __enter__(self) -> AgerSession:
        if not backend_of(self._conn).one_writer:
            return self
        try:
            self._stack.enter_context(_page_cache(self._conn, AGER_CACHE_KIB))
            self._hold_checkpoints()
            self._create_pairs()
        except BaseException:
            self.close()
            raise
        return self

    def _hold_checkpoints(self) -> None:
        conn, s = self._conn, sqlite_ager_statements(True)
        pages = int(_run(conn, s.wal_autocheckpoint).scalar_one())
        database = conn.engine.url.database
        if pages <= 0 or not database or database.startswith("file:"):
            return
        fd = _wal_index_of(f"{os.path.abspath(database)}-shm")
        if fd < 0:
            return  # not in WAL mode, or the index is not in a file: nothing held back
        self._wal_index = fd
        self._frame_bytes = int(_run(conn, s.page_size).scalar_one()) + _WAL_FRAME_HEADER
        self._autocheckpoint = self._now = pages
        self._set_autocheckpoint(0)

    def _create_pairs(self) -> None:
        _run(self._conn, sqlite_ager_statements(True).pairs_create)
        self._conn.commit()
        self.pairs_ready = True

    def wal_bytes(self) -> int:
        """The bytes the WAL holds now (its last valid frame, from its index's header)."""
        try:
            header = os.pread(self._wal_index, 4, _WAL_INDEX_MX_FRAME)
        except OSError:
            return 0
        if len(header) < 4:
            return 0
        return int(struct.unpack("=I", header)[0]) * self._frame_bytes

    def batch_begins(self) -> None:
        """At the start of a batch's transaction: its commit does not checkpoint (unless
        :meth:`batch_commits` says otherwise)."""
        if self._autocheckpoint:
            self._set_autocheckpoint(0)

    def batch_commits(self, writers_about: bool) -> None:
        """Before a batch's commit: whether it checkpoints the WAL (see the class)."""
        if self._autocheckpoint and ager_wal_checkpoints(self.wal_bytes(), writers_about):
            self._set_autocheckpoint(self._autocheckpoint)

    def release(self) -> None:
        """Before the run's last transaction: the connection's own checkpoints back, so that
        its commit checkpoints the WAL (PASSIVE) as a commit of the connection would."""
        if self._autocheckpoint:
            self._set_autocheckpoint(self._autocheckpoint)
            self._autocheckpoint = 0

    def _set_autocheckpoint(self, pages: int) -> None:
        if pages != self._now:
            _run(self._conn, wal_autocheckpoint_pragma(pages))
            self._now = pages

    def close(self) -> None:
        """Set back what the session changed on the connection (errors here would only hide
        the one that ended the run, if any)."""
        conn = self._conn
        if self.pairs_ready:
            self.pairs_ready = False
            with suppress(Exception):
                if conn.in_transaction():
                    conn.rollback()
                # at the driver, outside a transaction: dropping a temporary table takes
                # no lock of the database, where the package's write would wait for one
                drop = str(sqlite_ager_statements(True).pairs_drop.compile(dialect=conn.dialect))
                cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
                try:
                    cursor.execute(drop)
                finally:
                    cursor.close()
        if self._wal_index >= 0:
            with suppress(Exception):
                self.release()
            self._wal_index = -1  # never closed: see _wal_index_of
        self._stack.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


# The WAL index's header (SQLite's file format, "the WAL-index header"): mxFrame, the WAL's
# last valid frame, a 32-bit integer in the machine's byte order at this offset; each frame
# is a page and a header of this many bytes.
_WAL_INDEX_MX_FRAME = 16
_WAL_FRAME_HEADER = 24

# Descriptors of the WAL indexes this process read, by file (device, inode): kept open for
# the process's life. Closing any descriptor of a file drops every POSIX lock the process
# holds on it, SQLite's own included: the ager's connection would lose its lock on the
# index, and the next process to connect would take itself for the first, reset the index
# under it (the ager then dies of SIGBUS on its commit) or let two views of the WAL meet.
_WAL_INDEXES: dict[tuple[int, int], int] = {}
_WAL_INDEXES_LOCK = threading.Lock()


def _wal_index_of(path: str) -> int:
    """A read-only descriptor of the WAL index at ``path`` (``-1`` when there is none),
    opened once per file and process and never closed (see :data:`_WAL_INDEXES`)."""
    with _WAL_INDEXES_LOCK:
        try:
            known = os.stat(path, follow_symlinks=False)
        except OSError:
            return -1
        fd = _WAL_INDEXES.get((known.st_dev, known.st_ino), -1)
        if fd >= 0:
            return fd
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return -1
        opened = os.fstat(fd)
        # a file put in its place between the two looks is kept under its own key; a
        # descriptor of a file already known stays open all the same (never closed)
        return _WAL_INDEXES.setdefault((opened.st_dev, opened.st_ino), fd)


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


# --- a run in batches, as both facades run it ------------------------------------------------


# Called after each batch of a run of the ager: (batches done, batches in the run).
BatchProgress = Callable[[int, int], object]


def check_ager_call(
    dry_run: object, batch_rows: object, progress: object
) -> tuple[int | None, bool, BatchProgress | None]:
    """The arguments of ``apply_ager`` (both doors), each checked before the run writes
    anything: a bad one found after the first batch would leave an interrupted run."""
    return check_batch_rows(batch_rows), check_dry_run(dry_run), check_progress(progress)


class RunStopped(Exception):
    """A run of the ager stopped before its next batch because its caller asked it to (an
    async caller cancelled): an interrupted run, which the next completes."""


def run_ager_now(conn: Connection, settings: Settings) -> AgerReport:
    """A whole run at the clock's now in the caller's write transaction (``conn`` holding the
    write lock): a repository's ``apply_ager``, and a facade's dry run."""
    return run_ager(conn, _written_at(conn, settings))


def ager_steps(
    settings: Settings, *, dry_run: object, batch_rows: object, progress: object
) -> Steps[AgerReport]:
    """A facade's ``apply_ager``: its arguments checked now, before the run writes anything,
    and its one step: the run in batches on a connection of its own
    (:func:`age_in_batches`), or a dry run, one transaction on the primary, rolled back."""
    rows, dry, report = check_ager_call(dry_run, batch_rows, progress)
    if dry:
        return _dry_run(settings)
    return _batched_run(settings, rows, report)


def _dry_run(settings: Settings) -> Steps[AgerReport]:
    report: AgerReport = yield Read(lambda conn: run_ager_now(for_write(conn), settings))
    return report


def _batched_run(
    settings: Settings, rows: int | None, report: BatchProgress | None
) -> Steps[AgerReport]:
    done: AgerReport = yield OwnConnection(
        lambda conn, go_on: age_in_batches(
            conn, settings=settings, batch_rows=rows, progress=report, go_on=go_on
        )
    )
    return done


def age_in_batches(
    conn: Connection,
    *,
    settings: Settings,
    batch_rows: int | None = None,
    progress: BatchProgress | None = None,
    go_on: GoOn | None = None,
) -> AgerReport:
    """One run of the ager on ``conn``, each batch a transaction of its own (retried when
    transient, :func:`~mnestoma.core.retrying.with_retries`), under the database's ager lock
    (:func:`ager_run_lock`); the report of the whole run. Batches of
    ``batch_rows`` rows (None: the settings' ``ager_batch_rows``; None there too: batches
    sized as the run goes to take about :func:`~mnestoma.rules.ager_batch_target` each while
    writers are about, and growing until a writer waits once none has been seen for a while,
    :class:`BatchGrowth`). ``progress(done, total)`` after each batch (the
    total an estimate while the batches are being sized). ``go_on()`` false stops the run
    before its next batch, and a growing batch at its next step (:class:`RunStopped`).
    What the run keeps on its connection meanwhile: :class:`AgerSession`.

    Before each batch the writers get in first: on SQLite the writes that wait for the lock
    (:class:`~mnestoma.engines.locking.WaitingWriters`), on PostgreSQL, where a batch locks only its
    rows, the writers in a transaction on ``mnests`` (:class:`TableWriters`);
    there a batch that gave up waiting for a row a writer held is tried again, smaller,
    until it gets its rows (:func:`_age_batch_waiting`). The bounds of the run are read
    before its first write, so that no lock is held meanwhile. After the edges' batches,
    the faded chains are forgotten in batches of their own (:func:`forget_faded_chains`;
    ``progress`` counts the edges' batches only).
    """
    started = time.perf_counter()
    if batch_rows is None:
        batch_rows = settings.ager_batch_rows
    write = functools.partial(_written, conn)
    waits = _Waits(conn, go_on)
    with ager_run_lock(conn, go_on), AgerSession(conn) as session, ager_writers(conn) as writers:
        waits.go_on()
        bounds = _read(conn, ager_bounds)
        rows = batch_rows or AGER_BATCH_ROWS
        run = write(
            lambda c: begin_batched_run(c, _written_at(c, settings), rows, utc_now(), bounds)
        )
        report = AgerReport()
        lo, step, number = run.first, run.step, 0
        # none seen yet: the first batch grows unless a writer is about when it begins (a
        # writer that comes meanwhile waits for one step of it)
        writers_seen = time.monotonic() - AGER_WRITERS_SEEN_S
        target = ager_batch_target(0.0)
        while lo < run.end:
            waits.go_on()
            hi = min(lo + step, run.end)
            if writers.let_in():
                writers_seen = time.monotonic()
            since = time.monotonic() - writers_seen
            grows = batch_rows is None and ager_batch_grows(since)
            growth = BatchGrowth(writers, run.end, step, waits.asked) if grows else None
            try:
                batch, hi, took = _age_batch_waiting(
                    write,
                    waits,
                    run=run,
                    lo=lo,
                    hi=hi,
                    number=number + 1,
                    writers_about=ager_writers_about(since),
                    session=session,
                    growth=growth,
                )
            except MnestomaError as err:
                if run.merges or not is_unique_violation(err):
                    raise
                # A twin made since the run began (an operator's transition): this batch,
                # and every one after it, looks for merge pairs again.
                run = replace(run, merges=True)
                continue
            number += 1
            report += batch
            width = hi - lo
            if growth is not None:
                if growth.writers_came:
                    writers_seen = time.monotonic()
                target = ager_batch_target(time.monotonic() - writers_seen)
                step = growth.step
            elif batch_rows is None:
                last = target
                target = ager_batch_target(time.monotonic() - writers_seen)
                step = ager_next_step(width, took, target, last)
                width = step
            else:  # back to the planned batches, at twice a shrunk one at a time
                step = width = ager_regrown_step(width, run.step)
            lo = hi
            if progress is not None:
                progress(number, number + -(-(run.end - lo) // max(1, width)))
        forget_faded_chains(
            write,
            run.now,
            writers=writers,
            session=session,
            batch_rows=batch_rows,
            writers_seen=writers_seen,
            go_on=waits.go_on,
        )
        archive = _read(conn, lambda c: archive_candidates(c, run.now))
        report = replace(report, archive_candidates=archive)
        session.release()  # the last commit checkpoints the WAL
        write(lambda c: end_batched_run(c, run, report, time.perf_counter() - started))
    waits.log_run(run, number)
    return report


# A chain's key (prev, src, dst executor names), and what one batch of forgetting returns:
# how many it forgot, and the last key it covered (None: the end of the table).
ChainKey = tuple[str, str, str]
ChainBatch = tuple[int, ChainKey | None]


def forget_chains_batch(
    conn: Connection, now: datetime, after: ChainKey | None, rows: int
) -> ChainBatch:
    """Forget the faded chains among the next ``rows`` chains in key order (above ``after``,
    the previous batch's last key), in the caller's transaction: how many it forgot, and the
    last key it covered (None: it reached the end of the table). Two reads of the primary
    key bound the batch; the delete visits those rows only."""
    dialect = conn.dialect.name
    p: dict[str, Any] = {"now": now, "skip": max(0, rows - 1)}
    if after is not None:
        p.update(zip(chains_sql.AFTER_KEY, after, strict=True))
    found = _run(conn, chains_sql.chain_batch_end(dialect, after is not None), p).first()
    end: ChainKey | None = None
    if found is not None:
        end = (str(found[0]), str(found[1]), str(found[2]))
        p.update(zip(chains_sql.UPTO_KEY, end, strict=True))
    forget = chains_sql.forget_chains(dialect, after is not None, end is not None)
    return _count(conn, forget, p), end


def forget_faded_chains(
    write: Callable[[Callable[[Connection], ChainBatch]], ChainBatch],
    now: datetime,
    *,
    writers: WaitingWriters | TableWriters,
    session: AgerSession | None = None,
    batch_rows: int | None = None,
    writers_seen: float | None = None,
    go_on: Callable[[], None] | None = None,
) -> int:
    """The chains a run of the ager forgets (faded below
    :data:`~mnestoma.rules.CHAIN_FORGET_BELOW` at ``now``), in batches by key range, each
    written through ``write`` (a transaction of its own); how many it forgot.

    As the edges' batches: the writers let in before each (``writers``), ``go_on()`` asked
    before each (it raises to stop the run), batches of ``batch_rows`` chains when the
    caller fixes them, else sized as the run goes to :func:`~mnestoma.rules.ager_batch_target`
    (``writers_seen``: when the run last saw a writer, :func:`time.monotonic`), starting at
    :data:`~mnestoma.rules.AGER_BATCH_ROWS`; on SQLite the run's ``session`` decides whether
    a batch's commit checkpoints, on PostgreSQL a batch commits as any write does (it
    deletes a few index entries, not the pages an edges' batch rewrites). A batch never
    waits for a chain a writer holds (see :func:`~mnestoma.schema.sql.chains.forget_chains`)."""
    step = batch_rows or AGER_BATCH_ROWS
    seen = time.monotonic() - AGER_WRITERS_SEEN_S if writers_seen is None else writers_seen
    target = ager_batch_target(time.monotonic() - seen)
    after: ChainKey | None = None
    forgotten = 0
    while True:
        if go_on is not None:
            go_on()
        if writers.let_in():
            seen = time.monotonic()
        about = ager_writers_about(time.monotonic() - seen)
        took = time.perf_counter()
        batch = functools.partial(
            _chains_batch, now=now, after=after, rows=step, writers_about=about, session=session
        )
        n, after = write(batch)
        forgotten += n
        if after is None:
            logger.debug("the ager's run at %s forgot %d faded chains", now.isoformat(), forgotten)
            return forgotten
        if batch_rows is None:
            last_target = target
            target = ager_batch_target(time.monotonic() - seen)
            step = ager_next_step(step, time.perf_counter() - took, target, last_target)


def _chains_batch(
    conn: Connection,
    *,
    now: datetime,
    after: ChainKey | None,
    rows: int,
    writers_about: bool,
    session: AgerSession | None,
) -> ChainBatch:
    """One batch of :func:`forget_faded_chains`, in the transaction ``write`` began."""
    if session is not None:
        session.batch_begins()
    result = forget_chains_batch(conn, now, after, rows)
    if session is not None:
        session.batch_commits(writers_about)
    return result


class _Waits:
    """What a run of the ager waited for writers' rows (PostgreSQL): the batches it tried
    again, the longest a batch waited, its smallest batch; said in the log at the run's
    end, and at once by a batch that has waited :data:`~mnestoma.rules.AGER_WAIT_WARN_S`.
    Also where the run asks whether to go on (:meth:`go_on`), before each batch and while it
    waits."""

    def __init__(self, conn: Connection, go_on: GoOn | None) -> None:
        self._conn = conn
        self._go_on = go_on
        self.retries = 0  # attempts that gave up, each tried again
        self.longest_s = 0.0
        self.smallest: int | None = None

    def go_on(self) -> None:
        """Raise :class:`RunStopped` when the run's caller asked it to stop."""
        if not self.asked():
            raise RunStopped("the run of the ager was stopped before its next batch")

    def asked(self) -> bool:
        """False once the run's caller asked it to stop."""
        return self._go_on is None or bool(self._go_on())

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` before a batch is tried again, asking now and then whether to go
        on (a run stopped while it waits stops within :data:`~mnestoma.rules.AGER_STOP_POLL_S`)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            pause_on(self._conn, min(left, AGER_STOP_POLL_S))
            self.go_on()

    def gave_up(self, lo: int, hi: int, waited_s: float, attempts: int) -> None:
        """A batch ``[lo, hi)`` gave up waiting for a row, ``waited_s`` after its first try."""
        self.retries += 1
        self.smallest = hi - lo if self.smallest is None else min(self.smallest, hi - lo)
        if self.longest_s < AGER_WAIT_WARN_S <= waited_s:
            logger.warning(
                "the ager has waited %.1f s for rows that writers hold (positions %d-%d, "
                "%d attempts); it goes on waiting",
                waited_s,
                lo,
                hi,
                attempts,
            )
        self.longest_s = max(self.longest_s, waited_s)

    def got_in(self, waited_s: float) -> None:
        """A batch that had to wait got its rows, ``waited_s`` after its first try."""
        self.longest_s = max(self.longest_s, waited_s)

    def log_run(self, run: BatchedRun, batches: int) -> None:
        """The run's waits, in the log: a warning when a batch waited long, else info."""
        if not self.retries:
            return
        logger.log(
            logging.WARNING if self.longest_s >= AGER_WAIT_WARN_S else logging.INFO,
            "the ager's run at %s waited for rows that writers held: %d times a batch gave "
            "up and was tried again (%d batches in all), a batch waited %.2f s at most, "
            "positions in the smallest batch: %d",
            run.now.isoformat(),
            self.retries,
            batches,
            self.longest_s,
            self.smallest or 0,
        )


def _age_batch(conn: Connection, *, run: BatchedRun, lo: int, hi: int, **batch: Any) -> AgerReport:
    """One attempt at a batch, in the transaction :func:`_written` began on ``conn``."""
    return age_batch(conn, run, lo, hi, at=utc_now(), **batch)


def _age_batch_waiting(
    write: Callable[[Callable[[Connection], AgerReport]], AgerReport],
    waits: _Waits,
    *,
    lo: int,
    hi: int,
    **batch: Any,
) -> tuple[AgerReport, int, float]:
    """One batch (its own transaction, through ``write``), the end of the positions it
    covered and the seconds its last attempt took. A batch that gave up waiting for a row
    lock (PostgreSQL: a writer held a row it wanted, while waiting for one of the batch's, or
    writers queued on it for longer than the batch's lock timeout) rolled back and let the
    writers go on; it is tried again on half its positions (down to one,
    :func:`~mnestoma.rules.ager_shrunk_end`), no longer growing (writers are about), after
    :func:`~mnestoma.rules.ager_batch_retry_pause`, for as long as it takes: a run never
    fails because writers are busy. Other transient failures (a key another transaction
    made a twin of meanwhile) are retried by ``write`` itself."""
    attempt = 0
    first = time.perf_counter()
    while True:
        took = time.perf_counter()
        try:
            report = write(functools.partial(_age_batch, lo=lo, hi=hi, **batch))
        except MnestomaError as err:
            if not is_lock_not_available(err):
                raise
            waits.gave_up(lo, hi, time.perf_counter() - first, attempt + 1)
            waits.pause(ager_batch_retry_pause(attempt))
            hi = ager_shrunk_end(lo, hi)
            batch["growth"] = None
            batch["writers_about"] = True
            attempt += 1
            continue
        done = time.perf_counter()
        if attempt:
            waits.got_in(done - first)
        growth = batch.get("growth")
        return report, hi if growth is None else growth.end, done - took


T = TypeVar("T")


def _read(conn: Connection, read: Callable[[Connection], T]) -> T:
    """``read(conn)`` in a transaction of its own on ``conn``, rolled back after: a read,
    which takes no lock."""
    try:
        return read(conn)
    finally:
        if conn.in_transaction():
            conn.rollback()


def _written_at(conn: Connection, settings: Settings) -> datetime:
    """The clock's now a run writes its events at, read in its first write; on PostgreSQL a
    month whose partition is not known made is made after the commit (contract §12)."""
    now = settings.now()
    note_written(conn, now)
    return now


def _written(conn: Connection, write: Callable[[Connection], T]) -> T:
    """``write(conn)`` in a write transaction of its own on ``conn`` (SQLite: holding the
    write lock from its start, :func:`~mnestoma.engines.locking.take_write_lock`), committed;
    transient failures tried again (:func:`~mnestoma.core.retrying.with_retries`)."""

    def once() -> T:
        try:
            result = write(for_write(conn))
            with translate_errors():
                conn.commit()
            upkeep_after_commit(conn)
            return result
        finally:
            if conn.in_transaction():
                conn.rollback()

    return with_retries(once)


# --- the run's lock: one run at a time per database -----------------------------------------


@contextmanager
def ager_run_lock(conn: Connection, go_on: GoOn | None = None) -> Iterator[None]:
    """Hold the database's ager lock for the block: a second run waits for the first.

    PostgreSQL: a session advisory lock on ``conn`` (the run's own connection, committed
    so that it outlives each batch's transaction); it goes with the session when the run's
    process dies or its connection drops. SQLite: an exclusive ``flock`` on a file beside
    the database (``<file>-ager.lock``), released by the system when the process dies
    (StoreError, before the run begins, when that is not a regular file it can open: see
    :func:`open_beside_store`); an in-memory database, whose runs share one process, a lock
    of this process.

    With ``go_on``, the wait for another run's lock asks it every
    :data:`AGER_LOCK_POLL_S` and ends once it is false (:class:`RunStopped`, the lock not
    taken): a cancelled async run neither keeps its connection waiting nor takes the lock
    when the other run releases it. On PostgreSQL it then tries the lock
    (``pg_try_advisory_lock``) rather than queue on the server, where nothing would end
    the wait but the lock.
    """
    if not backend_of(conn).one_writer:
        _take_advisory(conn, go_on)
        try:
            yield
        finally:
            _release_advisory(conn)
        return
    path = _ager_lock_path(conn)
    if path is None:
        with _memory_ager_lock(conn, go_on):
            yield
        return
    fd = open_beside_store(path, "the ager's lock file")
    try:
        while not try_flock(fd, exclusive=True):
            _stop_waiting_unless(go_on)
            pause_on(conn, AGER_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


def _stop_waiting_unless(go_on: GoOn | None) -> None:
    """Raise :class:`RunStopped` when a run waiting for another's lock was asked to stop."""
    if go_on is not None and not go_on():
        raise RunStopped("the run of the ager was stopped while it waited for another run")


def _take_advisory(conn: Connection, go_on: GoOn | None) -> None:
    """The ager's advisory lock on ``conn`` (PostgreSQL), committed: waited for on the server
    without ``go_on``, else tried every :data:`AGER_LOCK_POLL_S` while ``go_on()`` holds."""
    if go_on is None:
        conn.execute(ADVISORY_LOCK, {"key": AGER_LOCK_KEY})
        conn.commit()
        return
    while True:
        taken = conn.execute(ADVISORY_TRY_LOCK, {"key": AGER_LOCK_KEY}).scalar_one()
        conn.commit()
        if taken:
            return
        _stop_waiting_unless(go_on)
        pause_on(conn, AGER_LOCK_POLL_S)


def ager_running(conn: Connection) -> bool:
    """True while some process holds this database's ager lock (a run is under way)."""
    if not backend_of(conn).one_writer:
        key = {"hi": AGER_LOCK_KEY >> 32, "lo": AGER_LOCK_KEY & 0xFFFFFFFF}
        held = conn.execute(ADVISORY_HELD, key).scalar_one()
        return bool(held)
    path = _ager_lock_path(conn)
    if path is None:
        lock = _MEMORY_AGER_LOCKS.get(_memory_key(conn))
        return lock is not None and lock.locked()
    try:
        fd = open_beside_store(path, "the ager's lock file", create=False)
    except StoreError:
        return False  # no run ever took the lock here (or could: not a file it can lock)
    try:
        return not try_flock(fd, exclusive=False)
    finally:
        os.close(fd)


def _release_advisory(conn: Connection) -> None:
    """End the run's transaction and release its advisory lock; a connection that cannot
    say it released it is thrown away (the lock goes with its session), never pooled."""
    try:
        if conn.in_transaction():
            conn.rollback()
        conn.execute(ADVISORY_UNLOCK, {"key": AGER_LOCK_KEY})
        conn.commit()
    except Exception:
        conn.invalidate()


def _ager_lock_path(conn: Connection) -> str | None:
    """The ager lock file of a SQLite file database, None for an in-memory one."""
    return beside_store(conn.engine.url, "-ager.lock")


_MEMORY_AGER_LOCKS: dict[int, threading.Lock] = {}


def _memory_key(conn: Connection) -> int:
    return id(conn.engine.pool)


@contextmanager
def _memory_ager_lock(conn: Connection, go_on: GoOn | None = None) -> Iterator[None]:
    lock = _MEMORY_AGER_LOCKS.setdefault(_memory_key(conn), threading.Lock())
    if go_on is None:
        lock.acquire()
    else:
        while not lock.acquire(blocking=False):
            _stop_waiting_unless(go_on)
            pause_on(conn, AGER_LOCK_POLL_S)
    try:
        yield
    finally:
        lock.release()
