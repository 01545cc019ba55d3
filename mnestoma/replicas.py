"""Read replicas (contract §12): which of a facade's reads may go to a PostgreSQL standby.

One :class:`ReplicaSet` per facade holds its replicas' engines, what each last said of
itself (replay position, lag, when), which are skipped until when, the highest WAL position
the facade's own writes reached, and the counters of ``replica_stats()``. Both doors use it:
the sync facade with sync engines, the async one with the sync side of its async engines
(:meth:`ReplicaSet.attempt` runs on a sync ``Connection``, ``run_sync`` gives it one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from .config import (
    ENV_REPLICA_URLS,
    is_sqlite,
    redact_url,
    refuse_memory_sqlite,
    resolve_database_url,
)
from .errors import ConflictError, InvalidInput, MnestomaError, StoreError, translate_errors
from .rules import REPLICA_CHECK_S, REPLICA_CONFIRM_S, REPLICA_CONNECT_TIMEOUT_S
from .settings import Settings
from .sql.replication import REPLICA_PROBE, WAL_POSITION

__all__ = [
    "NOT_READY",
    "ReplicaSet",
    "ReplicaState",
    "lsn_of",
    "replica_urls",
    "wal_position",
]

logger = logging.getLogger("mnestoma.replicas")

T = TypeVar("T")


class _NotReady:
    """What :meth:`ReplicaSet.attempt` returns when the replica cannot serve this read."""

    __slots__ = ()


NOT_READY: Final = _NotReady()


def lsn_of(text: str | None) -> int:
    """A WAL position as PostgreSQL writes it ('16/B374D848') as a number (-1 for none)."""
    if not text:
        return -1
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def wal_position(conn: Connection | Session) -> int:
    """The primary's WAL position, read on ``conn`` after a commit (in a transaction the
    caller ends)."""
    with translate_errors():
        return lsn_of(conn.execute(WAL_POSITION).scalar_one())


def replica_urls(
    primary: URL, replicas: Sequence[str | URL] | str | None, *, from_env: bool = False
) -> list[URL]:
    """The replicas' URLs, checked: a sequence of URLs (None or empty: none). SQLite has no
    replicas: a SQLite primary with replicas, or a SQLite replica, is :class:`InvalidInput`."""
    if replicas is None:
        return []
    if isinstance(replicas, str | URL):
        raise InvalidInput("replicas must be a list of URLs, not one URL")
    urls: list[URL] = []
    for given in replicas:
        if not isinstance(given, str | URL) or (isinstance(given, str) and not given.strip()):
            raise InvalidInput(f"a replica must be a database URL, got {given!r}")
        url = resolve_database_url(given.strip() if isinstance(given, str) else given)
        refuse_memory_sqlite(url)
        urls.append(url)
    where = f" ({ENV_REPLICA_URLS})" if from_env else ""
    if urls and is_sqlite(primary):
        raise InvalidInput(
            f"a SQLite store has no read replicas{where}: replicas are PostgreSQL standbys "
            "fed by streaming replication"
        )
    for url in urls:
        if is_sqlite(url):
            raise InvalidInput(
                f"a read replica must be a PostgreSQL standby, got {redact_url(url)}{where}"
            )
    return urls


@dataclass
class ReplicaState:
    """What one replica last said of itself, and whether it is being skipped."""

    database: str  # its URL, redacted
    replayed: int = -1  # the WAL position it had replayed, when last asked
    lag_s: float | None = None
    checked: float = -1e18  # time.monotonic() of that answer
    skipped_until: float = 0.0
    reason: str | None = None  # why it was last skipped
    lagging_since: float | None = None  # a lag past the bound seen, not yet confirmed
    lagging_received: int = -1  # the WAL position it had received then
    reads: int = 0
    skips: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``replica_stats()``."""
        return {
            "database": self.database,
            "reads": self.reads,
            "skips": self.skips,
            "lag_s": self.lag_s,
            "skipped": self.skipped_until > time.monotonic(),
            "reason": self.reason,
        }


@dataclass
class _Counts:
    primary_reads: int = 0  # reads the primary served while replicas are configured
    not_caught_up: int = 0  # of those, because no replica had replayed this facade's writes
    fallbacks: int = 0  # reads a replica failed and the primary then served
    extra: dict[str, int] = field(default_factory=dict)


class ReplicaSet:
    """The replicas of one facade, and the state that routes its reads (thread-safe)."""

    def __init__(self, engines: Sequence[Any], urls: Sequence[URL], settings: Settings) -> None:
        self.engines = list(engines)
        self.settings = settings
        self.states = [ReplicaState(redact_url(u)) for u in urls]
        self.written = -1  # the highest WAL position this facade's writes reached
        # A write whose position could not be read (the primary's connection lost after the
        # commit) sends every read to the primary until a position read after it is noted.
        self._notes = 0
        self._unknown_since: int | None = None
        self._lock = threading.Lock()
        self._next = 0
        self._counts = _Counts()

    # --- what the facade tells it ---------------------------------------------------------

    def note_write(self, conn: Connection | Session) -> None:
        """After a commit on the primary's ``conn``: note the WAL position it reached. Never
        raises (the write is committed): a position it cannot read sends this facade's reads
        to the primary until a later write's is noted."""
        with self._lock:
            self._notes += 1
            started = self._notes
        try:
            position = wal_position(conn)
        except MnestomaError:
            with self._lock:
                self._notes += 1
                self._unknown_since = self._notes
            return
        with self._lock:
            self.written = max(self.written, position)
            if self._unknown_since is not None and started > self._unknown_since:
                self._unknown_since = None

    def _caught_up(self, state: ReplicaState) -> bool:
        """True when replica ``state`` has replayed every write this facade noted (call
        with the lock held)."""
        return self._unknown_since is None and state.replayed >= self.written

    def order(self) -> Iterator[int]:
        """The replicas to try for one read, round robin, without those being skipped."""
        now = time.monotonic()
        with self._lock:
            first = self._next
            self._next = (self._next + 1) % len(self.states)
            ready = [
                i
                for i in (*range(first, len(self.states)), *range(first))
                if self.states[i].skipped_until <= now
            ]
        yield from ready

    def primary_read(self) -> None:
        """A read went to the primary (no replica could serve it)."""
        with self._lock:
            self._counts.primary_reads += 1

    # --- one read on one replica ----------------------------------------------------------

    def attempt(self, conn: Connection, i: int, work: Callable[[Connection], T]) -> T | _NotReady:
        """``work`` on replica ``i``'s connection ``conn`` when that replica can serve this
        facade's read: a standby, lagging within the bound, which has replayed the facade's
        writes; else :data:`NOT_READY` (a replica found failing or lagging is skipped).
        A failure of the replica (an error of the database) skips it and says NOT_READY;
        bad input raises as it would on the primary."""
        state = self.states[i]
        try:
            lagging = state.lagging_since
            if lagging is not None and time.monotonic() - lagging < REPLICA_CONFIRM_S:
                return NOT_READY  # to be confirmed: the primary meanwhile
            if not self._fresh(state):
                with translate_errors():
                    standby, replayed, received, lag = conn.execute(REPLICA_PROBE).one()
                if not standby:
                    self.skip(i, "it is not a standby (promoted, or not a replica)")
                    return NOT_READY
                with self._lock:
                    state.replayed = lsn_of(replayed)
                    state.lag_s = None if lag is None else float(lag)
                    state.checked = time.monotonic()
                if state.lag_s is not None and state.lag_s > self.settings.replica_max_lag:
                    if state.lagging_since is None:
                        state.lagging_since = time.monotonic()
                        state.lagging_received = lsn_of(received)
                        state.checked = -1e18
                        return NOT_READY
                    if state.replayed < state.lagging_received:
                        self.skip(
                            i,
                            f"it lags {state.lag_s:.1f} s, more than "
                            f"{self.settings.replica_max_lag:g} s",
                        )
                        return NOT_READY
                    # it has replayed what it had received: it goes on, the lag was only the
                    # time since the last commit it replayed (an idle primary)
                state.lagging_since = None
                with self._lock:
                    behind = not self._caught_up(state)
                    if behind:
                        self._counts.not_caught_up += 1
                if behind:
                    return NOT_READY
            result = work(conn)
        except (StoreError, ConflictError) as err:
            self.skip(i, str(err))
            with self._lock:
                self._counts.fallbacks += 1
            return NOT_READY
        with self._lock:
            state.reads += 1
        return result

    def _fresh(self, state: ReplicaState) -> bool:
        """True when what the replica said is recent and covers this facade's writes."""
        with self._lock:
            recent = time.monotonic() - state.checked < REPLICA_CHECK_S
            return recent and self._caught_up(state)

    def skip(self, i: int, reason: str) -> None:
        """Leave replica ``i`` alone for ``settings.replica_skip`` seconds; one warning."""
        state = self.states[i]
        with self._lock:
            now = time.monotonic()
            if state.skipped_until > now:
                return  # another read found it first: one warning
            state.skipped_until = now + self.settings.replica_skip
            state.checked = -1e18
            state.lagging_since = None
            state.reason = reason
            state.skips += 1
        logger.warning(
            "read replica %s skipped for %g s: %s; its reads go to the primary",
            state.database,
            self.settings.replica_skip,
            reason,
        )

    def connection_failed(self, i: int, err: MnestomaError) -> None:
        """Replica ``i`` could not be connected to (or failed outside ``attempt``)."""
        self.skip(i, str(err))
        with self._lock:
            self._counts.fallbacks += 1

    def stats(self) -> dict[str, Any]:
        """The counters of this facade's routing: each replica's reads, skips, last lag and
        whether it is skipped now; the reads the primary served (and why)."""
        with self._lock:
            return {
                "replicas": [s.as_dict() for s in self.states],
                "primary_reads": self._counts.primary_reads,
                "not_caught_up": self._counts.not_caught_up,
                "fallbacks": self._counts.fallbacks,
            }


def replica_connect_args(url: URL) -> dict[str, Any]:
    """Connection options of a replica's engine: give up connecting after
    :data:`~mnestoma.rules.REPLICA_CONNECT_TIMEOUT_S` (a host that does not answer must not
    hold a read that the primary can serve), unless the URL says otherwise."""
    if "connect_timeout" in url.query:
        return {}
    return {"connect_timeout": str(REPLICA_CONNECT_TIMEOUT_S)}
