"""How long each call holds the write lock, timed alike for the package and the baselines.

The hold is what several writers on one edge queue for: on SQLite from the moment
``BEGIN IMMEDIATE`` returns (the lock is held) to the moment ``COMMIT`` returns (it is
released); on PostgreSQL from the moment the ``SELECT ... FOR UPDATE`` returns (the row is
locked) to the moment ``COMMIT`` returns. The baselines mark both moments in their own code;
the package is timed from outside, at the same two moments, by wrapping the functions that
take and release the lock for the length of a block (:func:`timing_lock_holds`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["HoldTimes", "timing_lock_holds"]

_now = time.perf_counter
_thread = threading.get_ident


class HoldTimes:
    """The hold of each call, in seconds, per thread (the writers may be threads)."""

    def __init__(self) -> None:
        self.holds: list[float] = []
        self._since: dict[int, float] = {}

    def taken(self) -> None:
        """The lock is held from now (a second mark in the same transaction is ignored)."""
        self._since.setdefault(_thread(), _now())

    def released(self) -> None:
        """The lock was released now: one hold more."""
        since = self._since.pop(_thread(), None)
        if since is not None:
            self.holds.append(_now() - since)


@contextmanager
def timing_lock_holds(impl: str, store: Any = None) -> Iterator[HoldTimes]:
    """Time the lock holds of ``impl`` for the block. A baseline ``store`` marks them itself
    (its ``holds``); the package is timed by wrapping, for the block, the function that
    returns once SQLite's ``BEGIN IMMEDIATE`` has the lock and the one that notes the end of
    a write right after ``COMMIT`` returns (SQLite), or the statement runner and the
    dialect's commit and rollback (PostgreSQL)."""
    times = HoldTimes()
    if impl in ("baseline", "baseline-pg"):
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


@contextmanager
def _package_postgresql(times: HoldTimes) -> Iterator[None]:
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    from mnestoma.schema.runner import DriverRunner

    at_driver = DriverRunner._at_driver
    had = {name: name in PGDialect_psycopg.__dict__ for name in ("do_commit", "do_rollback")}
    commit, rollback = PGDialect_psycopg.do_commit, PGDialect_psycopg.do_rollback

    def timed_at_driver(
        self: DriverRunner, dbapi: Any, prepared: Any, data: Any, many: bool
    ) -> list[tuple[Any, ...]]:
        rows = at_driver(self, dbapi, prepared, data, many)
        if rows and "FOR UPDATE" in prepared.sql:
            times.taken()
        return rows

    def timed_commit(self: Any, dbapi_connection: Any) -> None:
        commit(self, dbapi_connection)
        times.released()

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
