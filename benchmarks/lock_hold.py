"""How long each call holds the write lock, timed alike for the package and the baselines.

The hold is what several writers on one edge queue for. Two figures:

**Client-side** (every engine). On SQLite from the moment ``BEGIN IMMEDIATE`` returns (the
lock is held) to the moment ``COMMIT`` returns (it is released); on PostgreSQL from the
moment a ``SELECT ... FOR UPDATE`` returns (the row is locked) to the moment ``COMMIT``
returns. The hand-written loops mark both moments in their own code; the package is timed
from outside, at the same two moments, by wrapping the functions that take and release the
lock for the length of a block (:func:`timing_lock_holds`). It only sees a lock taken by a
statement that locks and writes nothing: on PostgreSQL, a side that locks the row with the
statement that writes it (lock, compute and write in one statement) has no client-side
figure, since the client cannot tell when, inside that statement, the row was locked.

**Server-side** (PostgreSQL, every side the same way). The server notes two instants on its
own clock, ``clock_timestamp()``: when it hands the hot row to the transaction, and when the
transaction commits. The hold is the second minus the first, for the same transaction id.

- :func:`install_lock_marks` adds to the hot table (``mnests``, or the lean loop's
  ``lean_edges``) a ``BEFORE UPDATE`` row trigger that calls ``bench_mark_lock()``.
  PostgreSQL locks the row before it fires a ``BEFORE UPDATE`` row trigger (and waits there
  for a writer that holds it), so for a statement that locks the row by updating it, the
  mark is the instant the lock was granted. ``bench_mark_lock()`` writes
  ``"<xid> <clock_timestamp() as epoch seconds>"`` into the session setting
  ``bench.locked_at``; only the first mark of a transaction counts. The package's one
  statement locks the row in a ``FOR UPDATE`` CTE and updates it in a later one: its mark
  comes after the lock by what the statement does in between, PostgreSQL's recheck of a
  row another writer changed since the statement began included, so its figure is short
  by that much.
- A row locked earlier by a ``SELECT ... FOR UPDATE`` fires no trigger. The hand-written
  loops therefore call ``bench_mark_lock()`` in the projection of their locking select
  (:func:`marked_select`: ``SELECT ..., bench_mark_lock() FROM (SELECT ... FOR UPDATE)``),
  which PostgreSQL evaluates above the row lock, once the row is granted; their ``UPDATE``
  then fires the trigger, which leaves the first mark alone. The package's statements are
  its own: a plain ``SELECT ... FOR UPDATE`` of the package before its write is not marked,
  so its figure then starts at its ``UPDATE``, late; :class:`HoldTimes` counts such locks
  (``unmarked_locks``) and the report says so.
- The commit mark: :func:`install_lock_marks` also adds a constraint trigger,
  ``AFTER UPDATE ... DEFERRABLE INITIALLY DEFERRED``, which PostgreSQL fires at ``COMMIT``
  (whether sent alone, or in one pipeline with the statement as the package sends it),
  after every statement of the transaction and just before its commit record. It writes
  ``"<xid> <clock_timestamp()>"`` into ``bench.committing_at``; with several rows updated
  the last one, the nearest to the commit, stays. The setting is the session's
  (``set_config(..., false)``), so it outlives the commit it marks.
- Right after ``COMMIT`` returns, the client notes its wall time (``time.time()``) and reads
  both settings in one query on the same connection, outside any transaction (one more round
  trip, after the lock is released). A rolled-back transaction leaves no mark (the settings
  roll back with it); a transaction that locked nothing leaves the previous one's, which is
  not counted twice.

What the server-side hold leaves out: what follows the commit mark, the commit record's
WAL flush and the release of the row to its waiter. That is the same work on every side
(one commit record a call), so the figure compares the sides' windows without the part
they share; where the flush is slow it is most of each side's whole hold, and the ratio of
two server-side holds is then much further from 1 than that of the whole holds (which the
rate of writers on one row follows). Nor does it count the handover to the next writer
(from the release until that writer runs again and takes the row), which comes before
that writer's grant mark. It counts the work under the lock and, for the loops, their
round trips from the locking select to their ``COMMIT``. Every side pays the two triggers
on its ``UPDATE``; the loops pay one mark more in their select.

The same grant mark also gives the earlier figure, kept as ``return_holds``: up to the
client's wall time once ``COMMIT`` returned. It adds the WAL flush, the release, the way
back to the client and the client being scheduled again, so a side that sends its
``COMMIT`` with its statement (the row released before the client reads its results) is
charged for time the row is free. It mixes two clocks (``clock_timestamp()`` and
``time.time()``), so it is meaningful only with the server on the benchmark's own host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "HAND_WRITTEN",
    "MARK_LOCK",
    "HoldTimes",
    "install_lock_marks",
    "marked_select",
    "read_marks",
    "timing_lock_holds",
]

_now = time.perf_counter
_wall = time.time
_thread = threading.get_ident

# The implementations that mark their own lock holds (the hand-written loops).
HAND_WRITTEN = ("baseline", "baseline-pg", "lean-pg")

# Called where the lock is granted: in a trigger, or in a locking select's projection.
MARK_LOCK = "bench_mark_lock()"
_SETTING = "bench.locked_at"
_MARK_FUNCTION = f"""
CREATE OR REPLACE FUNCTION bench_mark_lock() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF split_part(current_setting('{_SETTING}', true), ' ', 1)
     IS DISTINCT FROM pg_current_xact_id()::text THEN
    PERFORM set_config('{_SETTING}', pg_current_xact_id()::text || ' '
      || extract(epoch FROM clock_timestamp())::text, false);
  END IF;
  RETURN NULL;
END $$
"""
_MARK_TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_mark_lock_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM bench_mark_lock();
  RETURN NEW;
END $$
"""
_MARK_TRIGGER = (
    "CREATE TRIGGER bench_lock_marked BEFORE UPDATE ON {table} FOR EACH ROW"
    " EXECUTE FUNCTION bench_mark_lock_on_update()"
)
# Fired at COMMIT, before the commit record: the last instant of the hold on the server.
_COMMIT_SETTING = "bench.committing_at"
_COMMIT_MARK_FUNCTION = f"""
CREATE OR REPLACE FUNCTION bench_mark_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('{_COMMIT_SETTING}', pg_current_xact_id()::text || ' '
    || extract(epoch FROM clock_timestamp())::text, false);
  RETURN NULL;
END $$
"""
_COMMIT_MARK_TRIGGER = (
    "CREATE CONSTRAINT TRIGGER bench_commit_marked AFTER UPDATE ON {table}"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bench_mark_commit()"
)
_READ_MARKS = (
    f"SELECT current_setting('{_SETTING}', true), current_setting('{_COMMIT_SETTING}', true)"
).encode()
_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE

# A server's mark: (transaction id, epoch seconds on the server's clock).
_Mark = tuple[str, float]


def install_lock_marks(conninfo: str, table: str) -> None:
    """Make the server mark when a transaction is granted a row of ``table`` (the function
    ``bench_mark_lock()`` and the ``BEFORE UPDATE`` trigger that calls it) and when a
    transaction that updated one commits (the deferred constraint trigger)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as con:
        con.execute(_MARK_FUNCTION)
        con.execute(_MARK_TRIGGER_FUNCTION)
        con.execute(_MARK_TRIGGER.format(table=table))
        con.execute(_COMMIT_MARK_FUNCTION)
        con.execute(_COMMIT_MARK_TRIGGER.format(table=table))


def marked_select(locking_select: str, columns: str) -> str:
    """``locking_select`` (a ``SELECT ... FOR UPDATE`` of ``columns``) with the server's
    mark evaluated above the row lock: the same rows, and the mark as one more column."""
    return f"SELECT {columns}, {MARK_LOCK} FROM ({locking_select}) AS locked"


def read_marks(pgconn: Any) -> tuple[_Mark | None, _Mark | None]:
    """This session's last grant mark and last commit mark, each as (transaction id, epoch
    seconds), read in one query outside any transaction on the driver's connection (a
    ``psycopg.pq.PGconn``, idle)."""
    result = pgconn.exec_(_READ_MARKS)
    if not result.ntuples:
        return None, None
    return _mark(result.get_value(0, 0)), _mark(result.get_value(0, 1))


def _mark(value: bytes | None) -> _Mark | None:
    """One setting's ``"<xid> <epoch>"`` as a mark (None when unset)."""
    if not value:
        return None
    xid, _, at = bytes(value).decode().partition(" ")
    return xid, float(at)


class HoldTimes:
    """The hold of each call, in seconds, per thread (the writers may be threads): the
    client-side figure (``holds``) and, on PostgreSQL, the server-side one from the grant
    mark to the commit mark (``server_holds``) and from the grant mark to ``COMMIT``'s
    return at the client (``return_holds``)."""

    def __init__(self) -> None:
        self.holds: list[float] = []
        self.server_holds: list[float] = []
        self.return_holds: list[float] = []
        # Locks the package took with a plain SELECT ... FOR UPDATE before its write (the
        # server-side mark is then its UPDATE's, later than the lock).
        self.unmarked_locks = 0
        self._since: dict[int, float] = {}
        self._last_mark: dict[int, str] = {}

    def taken(self) -> None:
        """The lock is held from now (a second mark in the same transaction is ignored)."""
        self._since.setdefault(_thread(), _now())

    def released(self) -> None:
        """The lock was released now: one hold more."""
        since = self._since.pop(_thread(), None)
        if since is not None:
            self.holds.append(_now() - since)

    def committed(self, pgconn: Any, at: float) -> None:
        """``COMMIT`` returned at wall time ``at`` on ``pgconn``: one server-side hold more,
        when the transaction left a grant mark of its own (see the module's docstring); its
        server-to-server figure when its commit mark is of the same transaction."""
        locked, committing = read_marks(pgconn)
        if locked is None:
            return
        xid, locked_at = locked
        if self._last_mark.get(id(pgconn)) == xid:
            return
        self._last_mark[id(pgconn)] = xid
        self.return_holds.append(at - locked_at)
        if committing is not None and committing[0] == xid:
            self.server_holds.append(committing[1] - locked_at)


@contextmanager
def timing_lock_holds(impl: str, store: Any = None) -> Iterator[HoldTimes]:
    """Time the lock holds of ``impl`` for the block. A hand-written loop ``store`` marks
    them itself (its ``holds``); the package is timed by wrapping, for the block, the
    function that returns once SQLite's ``BEGIN IMMEDIATE`` has the lock and the one that
    notes the end of a write right after ``COMMIT`` returns (SQLite), or the statement
    runner and the dialect's commit and rollback (PostgreSQL)."""
    times = HoldTimes()
    if impl in HAND_WRITTEN:
        store.holds = times
        try:
            yield times
        finally:
            store.holds = None
        return
    if impl == "package":
        with _package_sqlite(times):
            yield times
        return
    with _package_postgresql(times):
        yield times


@contextmanager
def _package_sqlite(times: HoldTimes) -> Iterator[None]:
    from mnestoma.engines import locking

    begin, end = locking._begin_immediate, locking._end_write

    def timed_begin(*args: Any, **kwargs: Any) -> None:
        begin(*args, **kwargs)
        times.taken()

    def timed_end(dbapi: Any) -> None:
        times.released()
        end(dbapi)

    locking._begin_immediate = timed_begin  # type: ignore[assignment]
    locking._end_write = timed_end  # type: ignore[assignment]
    try:
        yield
    finally:
        locking._begin_immediate = begin  # type: ignore[assignment]
        locking._end_write = end  # type: ignore[assignment]


def _locks_by_select(sql: str) -> bool:
    """A plain ``SELECT ... FOR UPDATE``: it locks rows and writes none."""
    return "FOR UPDATE" in sql and sql.lstrip().upper().startswith("SELECT")


@contextmanager
def _package_postgresql(times: HoldTimes) -> Iterator[None]:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    from mnestoma.schema.runner import DriverRunner

    at_driver = DriverRunner._at_driver
    had = {name: name in PGDialect_psycopg.__dict__ for name in ("do_commit", "do_rollback")}
    commit, rollback = PGDialect_psycopg.do_commit, PGDialect_psycopg.do_rollback

    def timed_at_driver(
        self: DriverRunner, dbapi: Any, prepared: Any, data: Any, many: bool, commit: bool = False
    ) -> list[tuple[Any, ...]]:
        rows = at_driver(self, dbapi, prepared, data, many, commit)
        if commit:  # the statement and its COMMIT in one pipeline: committed as it returns
            at = _wall()
            times.released()
            times.committed(dbapi.pgconn, at)
            return rows
        if rows and _locks_by_select(prepared.sql):
            if _thread() not in times._since:
                times.unmarked_locks += 1
            times.taken()
        return rows

    def timed_commit(self: Any, dbapi_connection: Any) -> None:
        pgconn = dbapi_connection.pgconn
        in_transaction = pgconn.transaction_status != _IDLE
        commit(self, dbapi_connection)
        at = _wall()
        times.released()
        if in_transaction:
            times.committed(pgconn, at)

    def timed_rollback(self: Any, dbapi_connection: Any) -> None:
        rollback(self, dbapi_connection)
        times.released()

    DriverRunner._at_driver = timed_at_driver  # type: ignore[method-assign]
    PGDialect_psycopg.do_commit = timed_commit  # type: ignore[method-assign]
    PGDialect_psycopg.do_rollback = timed_rollback  # type: ignore[method-assign]
    try:
        yield
    finally:
        DriverRunner._at_driver = at_driver  # type: ignore[method-assign]
        for name, fn in (("do_commit", commit), ("do_rollback", rollback)):
            if had[name]:
                setattr(PGDialect_psycopg, name, fn)
            else:
                delattr(PGDialect_psycopg, name)
