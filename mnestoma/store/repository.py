"""Repositories: every operation of contract §4 on a caller's session.

A repository takes a session, may flush, and never commits: the unit of work (or the
calling service) owns the transaction. :class:`MnestRepository` is composed of its
commands (:mod:`~mnestoma.store.commands`, :mod:`~mnestoma.store.transitions`), its
queries (:mod:`~mnestoma.store.queries`) and the graph's reads, on the plumbing of
:mod:`~mnestoma.store.plumbing`; the query log is :mod:`~mnestoma.store.query_log`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from mnestoma.core.clock import Clock
from mnestoma.core.errors import translate_errors
from mnestoma.core.rules import AgerReport
from mnestoma.core.settings import Settings, settings_of
from mnestoma.core.types import ensure_instant
from mnestoma.core.validation import check_dry_run
from mnestoma.engines.partitions import Dropped, TurnEdgeKey, drop_old_partitions
from mnestoma.maintenance.ager import run_ager
from mnestoma.planner.graph import GraphReads
from mnestoma.schema.models import CanonicalQuery
from mnestoma.schema.sql import partitions as partitions_sql
from mnestoma.schema.sql import retention as ret
from mnestoma.store.commands import RecordCommands
from mnestoma.store.plumbing import built, check_session
from mnestoma.store.queries import MAX_WALK_LIMIT, WALK_LIMIT, Queries
from mnestoma.store.query_log import CanonicalQueryRepository, QueryFrequency
from mnestoma.store.transitions import StateCommands

__all__ = [
    "MAX_WALK_LIMIT",
    "WALK_LIMIT",
    "CanonicalQueryRepository",
    "MnestRepository",
    "QueryFrequency",
    "built",
]


class MnestRepository(RecordCommands, StateCommands, Queries, GraphReads):
    """Every rule of contract §4 on one session; flushes, never commits.

    A bare ``Connection`` is accepted too (the facade's connection units use one: a Session
    adds nothing to Core statements but its own bookkeeping).

    Raises:
        InvalidInput: ``session`` is neither a Session nor a Connection, or settings are refused.
    """

    def __init__(
        self,
        session: Session | Connection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = check_session(session, type(self).__name__)
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._before_write = before_write
        self._after_commit = False

    # --- ageing -----------------------------------------------------------------------

    def apply_ager(self) -> AgerReport:
        """Decay, demote, merge, prune and count archive candidates, in set-based SQL, all
        in this unit's transaction; the facades run it in batches instead, each its own
        transaction (:func:`mnestoma.maintenance.ager.age_in_batches`).

        Returns:
            The :class:`~mnestoma.AgerReport`: how many rows each step changed.

        Raises:
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        ex = self._write_ex()
        return run_ager(ex.conn, self._write_now(ex))

    # --- retention --------------------------------------------------------------------

    def prune_events(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete the events older than ``before``, except the ``created`` event of each row
        still in ``mnests``; how many were (with ``dry_run``: would be, nothing deleted).

        All in this unit's transaction; the facades delete in batches instead, each its own
        transaction (:meth:`prunable_event_ids`, :meth:`prune_event_batch`).

        Returns:
            How many events were deleted (with ``dry_run``: would be).

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold, or
                ``dry_run`` not a bool.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params = {"before": _cutoff(before)}
        if check_dry_run(dry_run):
            row = self._ex().first(ret.COUNT_PRUNABLE, params)
            return 0 if row is None else int(row[0])
        return int(self._write_ex().execute(ret.DELETE_PRUNABLE, params).rowcount)

    def prunable_event_ids(
        self, before: datetime, *, since: datetime | None = None
    ) -> tuple[int, int] | None:
        """The lowest and highest id of the events a prune at ``before`` would delete now,
        or None when there is none: the range the batches of a prune cover. With
        ``since``, only among the events from then on (what lies before the end of the
        months retention dropped is what it kept).

        Returns:
            The pair (lowest id, highest id), or None when there is nothing to delete.

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params = {"before": _cutoff(before)}
        if since is None:
            row = self._ex().first(ret.PRUNABLE_ID_RANGE, params)
        else:
            row = self._ex().first(ret.PRUNABLE_ID_RANGE_SINCE, {**params, "since": _cutoff(since)})
        if row is None or row[0] is None or row[1] is None:
            return None
        return int(row[0]), int(row[1])

    def prune_event_batch(
        self, before: datetime, first: int, last: int, *, since: datetime | None = None
    ) -> int:
        """Delete the events :meth:`prune_events` would, among those whose ids lie in
        ``[first, last]`` (with ``since``: and whose instant is not before it): one batch
        of a prune; how many were deleted.

        Returns:
            How many events were deleted.

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params = {"before": _cutoff(before), "first": int(first), "last": int(last)}
        stmt = ret.DELETE_PRUNABLE_BATCH
        if since is not None:
            stmt, params["since"] = ret.DELETE_PRUNABLE_BATCH_SINCE, _cutoff(since)
        return int(self._write_ex().execute(stmt, params).rowcount)

    def drop_event_partitions(self, before: datetime) -> Dropped:
        """PostgreSQL, events partitioned: detach the partitions whose months all lie before
        ``before``, keeping the ``created`` events of the rows still stored (see
        :func:`mnestoma.engines.partitions.drop_old_partitions`); nothing elsewhere. The caller
        commits, then drops what was detached (:meth:`drop_detached_partition`).

        Returns:
            A :class:`~mnestoma.engines.partitions.Dropped`: how many events went, the tables
            detached, and the instant before which every event lay in them.

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or a lock it needed stayed busy.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        conn = self._write_ex().conn
        with translate_errors():
            return drop_old_partitions(conn, _cutoff(before))

    def drop_detached_partition(self, name: str) -> None:
        """Drop a table :meth:`drop_event_partitions` detached: its space goes back to the
        operating system.

        Returns:
            None.

        Raises:
            ValueError: ``name`` is not a table retention detached.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or a lock it needed stayed busy.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        self._write_ex().execute(partitions_sql.drop_table(partitions_sql.detached(name)))

    def prune_turn_edges(
        self, end: datetime, after: TurnEdgeKey, limit: int
    ) -> tuple[int, TurnEdgeKey | None]:
        """One batch of the rows of ``event_turn_edges`` before ``end`` after ``after`` (in
        (ts, turn_id, mnest_id, occurrence) order): those whose passing went with a dropped
        partition are deleted.

        Returns:
            How many were deleted, and the last row looked at (None: none was left).

        Raises:
            InvalidInput: ``end`` is not an aware datetime the store can hold.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or a lock it needed stayed busy.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        params = {
            "end": _cutoff(end),
            "ts": after[0],
            "turn": after[1],
            "mnest": after[2],
            "occ": after[3],
            "n": int(limit),
        }
        row = self._write_ex().first(partitions_sql.PRUNE_TURN_EDGES_BATCH, params)
        assert row is not None
        deleted, seen, ts, turn, mnest, occurrence = row
        return int(deleted), (None if not seen else (ts, turn, mnest, occurrence))

    # --- query log --------------------------------------------------------------------

    def log_canonical_query(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append to the canonical query log (touches no mnest), as
        :meth:`CanonicalQueryRepository.log` does, in this repository's transaction.

        Returns:
            The log's new entry.

        Raises:
            InvalidInput: an empty or too long text, or a turn id that is refused.
            ConflictError: no write lock within the lock timeout, or rows kept changing.
            StoreError: the database failed or was unreachable.
        """
        return CanonicalQueryRepository(
            self._session, settings=self.settings, before_write=self._before_write
        ).log(raw_query, canonical_query, turn_id=turn_id)


def _cutoff(before: Any) -> datetime:
    """A prune's cutoff: an aware instant the store can hold, else InvalidInput."""
    return ensure_instant(before, "before")
