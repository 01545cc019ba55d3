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
from mnestoma.core.rules import AgerReport
from mnestoma.core.settings import Settings, settings_of
from mnestoma.core.types import ensure_instant
from mnestoma.core.validation import check_dry_run
from mnestoma.maintenance import retention
from mnestoma.maintenance.ager import run_ager_now
from mnestoma.planner.graph import GraphReads
from mnestoma.schema.models import CanonicalQuery
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
        self._commits_itself = False

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
        return run_ager_now(self._write_ex().conn, self.settings)

    # --- retention --------------------------------------------------------------------

    def prune_events(self, before: datetime, *, dry_run: bool = False) -> int:
        """Delete the events older than ``before``, except the ``created`` event of each row
        still in ``mnests``; how many were (with ``dry_run``: would be, nothing deleted).

        All in this unit's transaction; the facades delete in batches instead, each its own
        transaction (:func:`mnestoma.maintenance.retention.prune_steps`).

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
        cutoff = _cutoff(before)
        if check_dry_run(dry_run):
            return retention.count_prunable(self._ex().conn, cutoff)
        return retention.delete_prunable(self._write_ex().conn, cutoff)

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
