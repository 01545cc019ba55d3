"""The canonical query log (contract §5): :class:`CanonicalQueryRepository` appends
normalised requests and reads them back; it never touches ``mnests`` or ``events``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Executable
from sqlalchemy.orm import Session

from mnestoma.core.clock import Clock
from mnestoma.core.settings import Settings, settings_of
from mnestoma.core.validation import check_optional_name, check_positive_int, check_text
from mnestoma.schema import snapshots as snap
from mnestoma.schema.models import CanonicalQuery
from mnestoma.schema.runner import runner_for
from mnestoma.schema.sql import read as rd
from mnestoma.schema.sql import record as rec
from mnestoma.store.plumbing import check_session, connection_of, write_runner

__all__ = ["CanonicalQueryRepository", "QueryFrequency"]


@dataclass(frozen=True, slots=True)
class QueryFrequency:
    """How often one canonical form was logged, and when last."""

    canonical_query: str
    canonical_hash: str
    count: int
    last_ts: datetime


class CanonicalQueryRepository:
    """The request-normalisation log; it never touches ``mnests`` or ``events``.

    Raises:
        InvalidInput: a ``session`` that is not a Session or a Connection; refused settings.
    """

    def __init__(
        self,
        session: Session | Connection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        self._session = check_session(session, type(self).__name__)
        self.settings = settings_of(settings, clock=clock)
        self._before_write = before_write

    def log(
        self, raw_query: str, canonical_query: str, *, turn_id: str | None = None
    ) -> CanonicalQuery:
        """Append one normalised request; the hash is SHA-256 of the canonical form.

        Returns:
            The new entry of the log.

        Raises:
            InvalidInput: an empty or over-long text, or a ``turn_id`` the contract refuses.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        raw = check_text(raw_query, "raw_query")
        canonical = check_text(canonical_query, "canonical_query")
        turn = check_optional_name(turn_id, "turn_id")
        ts = self.settings.now()
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        values = {
            "ts": ts,
            "turn_id": turn,
            "raw_query": raw,
            "canonical_query": canonical,
            "canonical_hash": digest,
        }
        ex = write_runner(self._session, self._before_write)
        new_id = ex.execute(rec.INSERT_QUERY, values).scalar_one()
        return snap.query_from({"id": new_id, **values})

    def recent(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest entries, newest first.

        Returns:
            At most ``limit`` entries, newest first.

        Raises:
            InvalidInput: ``limit`` is not a positive integer up to 100,000.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        return [snap.query(r) for r in self._listed(rd.QUERY_RECENT, limit)]

    def top(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms, most frequent first.

        Returns:
            At most ``limit`` :class:`QueryFrequency` items, most frequent first.

        Raises:
            InvalidInput: ``limit`` is not a positive integer up to 100,000.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        rows = self._listed(rd.QUERY_TOP, limit)
        return [QueryFrequency(r[0], r[1], int(r[2]), r[3]) for r in rows]

    def _listed(self, stmt: Executable, limit: object) -> list[tuple[Any, ...]]:
        """The rows of one of the log's listings, at most ``limit`` (checked: a positive
        integer up to 100,000)."""
        n = check_positive_int(limit, "limit", maximum=100_000)
        return runner_for(connection_of(self._session)).rows(stmt, {"limit": n})
