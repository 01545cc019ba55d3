"""Read replicas (contract §12): which of a facade's reads may go to a PostgreSQL standby.

One :class:`ReplicaSet` per facade holds its replicas' engines, the readings of the
primary's WAL position that their lag is measured against, what each replica last said of
itself (replay position, when, fresh as of when), which are skipped until when, the highest
WAL position the facade's own writes reached, and the counters of ``replica_stats()``. Both
doors use it: the sync facade with sync engines, the async one with the sync side of its
async engines (:meth:`ReplicaSet.attempt` runs on a sync ``Connection``, ``run_sync`` gives
it one).

Every read on a replica runs under a deadline (:meth:`ReplicaSet.bounded`): a watchdog
thread shuts down the sockets of a read past it, so that a standby that stops answering (a
frozen server still has its kernel acknowledge every packet: no TCP timeout fires) fails
the read at once, and the primary serves it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.orm import Session

from mnestoma.core._sqla_compat import replace_dialect_method
from mnestoma.core.errors import (
    ConflictError,
    InvalidInput,
    MnestomaError,
    StoreError,
    translate_errors,
)
from mnestoma.core.rules import (
    REPLICA_CONNECT_TIMEOUT_S,
    REPLICA_STATUS_POLL_S,
    REPLICA_STATUS_WAIT_S,
    replica_behind_since,
    replica_check_interval,
    replica_fresh_as_of,
)
from mnestoma.core.settings import Settings
from mnestoma.engines import (
    ENV_REPLICA_URLS,
    backend_of,
    redact_url,
    refuse_memory_sqlite,
    resolve_database_url,
)
from mnestoma.schema.sql.replication import IDENTITY, REPLICA_POSITION, REPLICA_STATUS, WAL_POSITION

if TYPE_CHECKING:  # the async extra is optional: only its type is needed here
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "NOT_READY",
    "ReadGuard",
    "ReplicaMeasure",
    "ReplicaSet",
    "ReplicaState",
    "bind_to_deadlines",
    "identity_difference",
    "lsn_of",
    "measure_replica",
    "read_deadline",
    "replica_connect_args",
    "replica_urls",
    "server_identity",
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


def server_identity(conn: Connection) -> tuple[str, str]:
    """Which cluster and database the server of ``conn`` is: (system identifier, database)."""
    with translate_errors():
        system, database = conn.execute(IDENTITY).one()
    return str(system), str(database)


def identity_difference(replica: tuple[str, str], primary: tuple[str, str]) -> str | None:
    """Why a server of identity ``replica`` (system identifier, database) is not a replica
    of ``primary``'s store, None when it may be: a standby shares its primary's system
    identifier, and must be the same database."""
    if replica[0] != primary[0]:
        return (
            f"its cluster (system identifier {replica[0]}) is not the primary's "
            f"({primary[0]}): it is no standby of it"
        )
    if replica[1] != primary[1]:
        return f"it is database {replica[1]!r}, the primary's is {primary[1]!r}"
    return None


@dataclass(frozen=True)
class ReplicaMeasure:
    """A replica measured against its primary's WAL position (for the status)."""

    identity: tuple[str, str]  # (system identifier, database)
    standby: bool
    behind_bytes: int  # of the primary's WAL, not replayed at the last look
    lag_s: float | None  # at most this far behind; None: not known
    receiving: bool  # a WAL receiver streams to it from its primary


def measure_replica(conn: Connection, position: int, read_at: float) -> ReplicaMeasure:
    """Measure the replica of ``conn`` against the primary's WAL ``position``, read at
    ``read_at`` (time.monotonic()): looked at again while it is behind it, for
    :data:`~mnestoma.rules.REPLICA_STATUS_WAIT_S` at most. Its lag is 0 when it had
    replayed the position at the first look, else the time it took to, else (still behind:
    lagging, or cut off) the time since the last commit it replayed."""
    identity = server_identity(conn)
    with translate_errors():
        standby, replayed, since_commit, receiving = conn.execute(REPLICA_STATUS).one()
        behind = max(0, position - lsn_of(replayed))
        lag = 0.0 if not behind else None if since_commit is None else float(since_commit)
        while standby and behind and time.monotonic() - read_at < REPLICA_STATUS_WAIT_S:
            time.sleep(REPLICA_STATUS_POLL_S)
            behind = max(0, position - lsn_of(conn.execute(REPLICA_POSITION).one()[1]))
            if not behind:
                lag = time.monotonic() - read_at
    return ReplicaMeasure(identity, bool(standby), behind, lag, bool(receiving))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def replica_urls(primary: URL, replicas: object, *, from_env: bool = False) -> list[URL]:
    """The replicas' URLs, checked: a list (any iterable but a string) of URLs (None or empty:
    none); anything else is :class:`InvalidInput`. SQLite has no replicas: a SQLite primary
    with replicas, or a SQLite replica, is :class:`InvalidInput`. ``from_env``: they come from
    ``MNESTOMA_REPLICA_URLS``, and a URL that cannot be read is named by its place in it,
    never echoed (a fragment of one may hold a password)."""
    if replicas is None:
        return []
    if isinstance(replicas, str | bytes | URL):
        raise InvalidInput("replicas must be a list of URLs, not one URL")
    if not isinstance(replicas, Iterable):
        raise InvalidInput(f"replicas must be a list of URLs, got {type(replicas).__name__}")
    given_all = list(replicas)
    urls: list[URL] = []
    for n, given in enumerate(given_all, 1):
        if not isinstance(given, str | URL):
            raise InvalidInput(f"a replica must be a database URL, got {type(given).__name__}")
        if isinstance(given, str) and not given.strip():
            raise InvalidInput("a replica must be a database URL, got an empty string")
        try:
            url = resolve_database_url(given.strip() if isinstance(given, str) else given)
        except InvalidInput:
            if not from_env:
                raise
            raise InvalidInput(
                f"{ENV_REPLICA_URLS}: its {_ordinal(n)} URL (of {len(given_all)}) is not a "
                "database URL (URLs are separated by spaces)"
            ) from None
        refuse_memory_sqlite(url)
        urls.append(url)
    where = f" ({ENV_REPLICA_URLS})" if from_env else ""
    if urls and not backend_of(primary).replicas:
        raise InvalidInput(
            f"a SQLite store has no read replicas{where}: replicas are PostgreSQL standbys "
            "fed by streaming replication"
        )
    for url in urls:
        if not backend_of(url).replicas:
            raise InvalidInput(
                f"a read replica must be a PostgreSQL standby, got {redact_url(url)}{where}"
            )
    return urls


def replica_connect_args(url: URL) -> dict[str, Any]:
    """Connection options of a replica's engine: give up connecting after
    :data:`~mnestoma.rules.REPLICA_CONNECT_TIMEOUT_S` (a host that does not answer must not
    hold a read that the primary can serve), unless the URL says otherwise."""
    if "connect_timeout" in url.query:
        return {}
    return {"connect_timeout": str(REPLICA_CONNECT_TIMEOUT_S)}


# --- the deadline of a read on a replica ------------------------------------------------------


class ReadGuard:
    """The deadline of one read on a replica: once it passes, the sockets the read uses are
    shut down (the read then fails at once), and the read opens no new connection."""

    __slots__ = ("_sockets", "_watched", "deadline", "expired", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.expired = False
        self._sockets: list[int] = []  # duplicates of the descriptors of the read's sockets
        self._watched: set[int] = set()  # their sockets (inodes: a closed one's number may
        # be reused by the next connection, its socket never while a duplicate holds it)


def _shut(fd: int) -> None:
    """Shut the socket of descriptor ``fd`` down both ways (its reads and writes fail at
    once, whoever waits on it), leaving the descriptor open."""
    with contextlib.suppress(OSError):  # already shut, or never connected
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()


class _Watchdog:
    """One thread for the process that ends the reads on replicas past their deadline.

    Each read holds a duplicate of its socket's descriptor while it is armed: the watchdog
    shuts that socket down, never a descriptor number that the driver may have closed and
    the process reused meanwhile."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._armed: set[ReadGuard] = set()
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None

    def arm(self, guard: ReadGuard) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="mnestoma-replica-deadlines", daemon=True
                )
                self._thread.start()
            self._armed.add(guard)
            if guard.deadline < self._wake_at:
                self._cond.notify()

    def watch(self, guard: ReadGuard, driver_connection: Any) -> None:
        """The read of ``guard`` uses ``driver_connection`` (a psycopg connection): shut its
        socket down when the deadline passes, or at once if it has passed."""
        try:
            fd = int(driver_connection.fileno())
        except Exception:  # closed, or not a connection with a socket: nothing to watch
            return
        with self._cond:
            try:
                duplicate = os.dup(fd)
            except OSError:
                return
            inode = os.fstat(duplicate).st_ino
            if inode in guard._watched:  # the pool's ping watched it already
                os.close(duplicate)
                return
            guard._watched.add(inode)
            guard._sockets.append(duplicate)
            if guard.expired:
                _shut(duplicate)

    def disarm(self, guard: ReadGuard) -> None:
        with self._cond:
            self._armed.discard(guard)
            sockets, guard._sockets = guard._sockets, []
        for duplicate in sockets:
            os.close(duplicate)  # the driver's own descriptor stays open

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for guard in [g for g in self._armed if g.deadline <= now]:
                    guard.expired = True
                    self._armed.discard(guard)
                    for duplicate in guard._sockets:
                        _shut(duplicate)
                self._wake_at = min((g.deadline for g in self._armed), default=math.inf)
                self._cond.wait(None if self._wake_at == math.inf else self._wake_at - now)


_WATCHDOG: Final = _Watchdog()
# A forked child has no watchdog thread, and maybe a lock held by a parent's thread.
os.register_at_fork(after_in_child=_WATCHDOG._reset)

# The deadline of the replica read running in this thread or task (None: none).
_GUARD: contextvars.ContextVar[ReadGuard | None] = contextvars.ContextVar(
    "mnestoma_replica_read", default=None
)


@contextlib.contextmanager
def read_deadline(timeout: float) -> Iterator[ReadGuard]:
    """A deadline ``timeout`` seconds from now for what this thread (or task) reads on the
    engines bound to deadlines (:func:`bind_to_deadlines`) meanwhile: past it, their
    sockets are shut down and no new connection is opened."""
    guard = ReadGuard(timeout)
    _WATCHDOG.arm(guard)
    token = _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(token)
        _WATCHDOG.disarm(guard)


def bind_to_deadlines(engine: Engine | AsyncEngine) -> None:
    """Put the connections of a replica's engine under the deadline of the read in progress:
    the pool's ping of a pooled connection (a frozen server would never answer it), a new
    connection from its first query on, and no new connection once the deadline has passed."""
    sync = engine if isinstance(engine, Engine) else engine.sync_engine
    dialect = sync.dialect
    ping = dialect.do_ping

    def do_ping(dbapi_connection: Any) -> bool:
        _under_the_read(dbapi_connection)
        return ping(dbapi_connection)

    replace_dialect_method(dialect, "do_ping", do_ping)
    event.listen(sync, "do_connect", _refuse_past_deadline)
    # First among the pool's connect listeners: before SQLAlchemy's first connection sets
    # the dialect up with queries of its own (a server that lets the login through and then
    # never answers held those, and the read, for ever).
    event.listen(sync, "connect", lambda dbapi, _record: _under_the_read(dbapi), insert=True)


def _under_the_read(dbapi_connection: Any) -> None:
    """Put ``dbapi_connection`` (SQLAlchemy's, or the driver's) under the deadline of the
    read in progress in this thread or task, if any."""
    guard = _GUARD.get()
    if guard is not None:
        _WATCHDOG.watch(guard, getattr(dbapi_connection, "driver_connection", dbapi_connection))


def _refuse_past_deadline(dialect: Dialect, _record: Any, _cargs: Any, _cparams: Any) -> None:
    """A read past its deadline opens no new connection (the pool would after a failed ping,
    and wait up to the connect timeout for a frozen server)."""
    guard = _GUARD.get()
    if guard is not None and guard.expired:
        raise dialect.loaded_dbapi.OperationalError(
            f"could not connect: the replica did not answer within {guard.timeout:g} s"
        )


# --- the replicas of a facade -----------------------------------------------------------------


@dataclass
class ReplicaState:
    """What one replica last said of itself, and whether it is being skipped."""

    database: str  # its URL, redacted
    replayed: int = -1  # the WAL position it had replayed, when last asked
    lag_s: float | None = None  # how long it had been behind the primary then (0: not)
    checked: float = -1e18  # time.monotonic() of that answer
    fresh_as_of: float | None = None  # it holds every commit made before this time
    verified: bool = False  # its identity matched the primary's
    skipped_until: float = 0.0
    reason: str | None = None  # why it was last skipped
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
    not_fresh: int = 0  # because no replica was known within the lag bound of the primary
    fallbacks: int = 0  # reads a replica failed and the primary then served
    timeouts: int = 0  # of those, because the replica did not answer within the bound
    refused: int = 0  # replicas whose identity differs from the primary's


class ReplicaSet:
    """The replicas of one facade, and the state that routes its reads (thread-safe)."""

    def __init__(
        self, engines: Sequence[Engine | AsyncEngine], urls: Sequence[URL], settings: Settings
    ) -> None:
        self.engines: list[Any] = list(engines)  # Engine (sync door) or AsyncEngine
        for engine in self.engines:
            bind_to_deadlines(engine)
        self.settings = settings
        self.states = [ReplicaState(redact_url(u)) for u in urls]
        self.written = -1  # the highest WAL position this facade's writes reached
        self.identity: tuple[str, str] | None = None  # the primary's, once read
        # Readings of the primary's WAL position, (time.monotonic(), position), oldest first.
        self._readings: deque[tuple[float, int]] = deque()
        self._sampling = False
        self._sample_tried = -math.inf
        self._interval = replica_check_interval(settings.replica_max_lag)
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

    # --- the primary's WAL position, which the replicas' lag is measured against ----------

    def claim_sample(self) -> bool:
        """True when this read is to read the primary's WAL position (the last reading, or
        try, is older than the check interval, and no other read is at it); it then calls
        :meth:`sample_on` and, whatever happens, :meth:`sampled`."""
        now = time.monotonic()
        with self._lock:
            if self._sampling or now - self._sample_tried < self._interval:
                return False
            self._sampling = True
            self._sample_tried = now
            return True

    def sampled(self) -> None:
        """The reading claimed by :meth:`claim_sample` is over (done or failed)."""
        with self._lock:
            self._sampling = False

    def sample_on(self, conn: Connection) -> None:
        """Read the primary's WAL position on its ``conn`` (and, the first time, its
        identity) and note it, with the time it was read from."""
        if self.identity is None:
            self.identity = server_identity(conn)
        at = time.monotonic()
        position = wal_position(conn)
        conn.rollback()
        with self._lock:
            self._note_reading(at, position)

    def sample(self, engine: Engine) -> None:
        """Before a read of the sync door: read the primary's WAL position when due. Never
        raises: a primary that cannot be read leaves the readings as they are (a replica
        serves then only while they prove it within the lag bound)."""
        if not self.claim_sample():
            return
        try:
            with translate_errors(), engine.connect() as conn:
                self.sample_on(conn)
        except MnestomaError:
            pass
        finally:
            self.sampled()

    async def sample_async(self, engine: AsyncEngine) -> None:
        """:meth:`sample` for the async door."""
        if not self.claim_sample():
            return
        try:
            with translate_errors():
                async with engine.connect() as conn:
                    await conn.run_sync(self.sample_on)
        except MnestomaError:
            pass
        finally:
            self.sampled()

    def _note_reading(self, at: float, position: int) -> None:
        """Keep readings spaced by a sixteenth of the lag bound (the newest always), and of
        those older than the bound only the newest (call with the lock held)."""
        readings = self._readings
        max_lag = self.settings.replica_max_lag
        if len(readings) >= 2 and at - readings[-2][0] < max_lag / 16:
            readings[-1] = (at, position)
        else:
            readings.append((at, position))
        while len(readings) >= 2 and readings[1][0] <= at - max_lag:
            readings.popleft()

    # --- one read on one replica ----------------------------------------------------------

    def bounded(self) -> contextlib.AbstractContextManager[ReadGuard]:
        """The deadline of one read on a replica (connecting, the pool's ping, the checks,
        the read and giving the connection back): ``settings.replica_read_timeout`` from now."""
        return read_deadline(self.settings.replica_read_timeout)

    def attempt(self, conn: Connection, i: int, work: Callable[[Connection], T]) -> T | _NotReady:
        """``work`` on replica ``i``'s connection ``conn`` when that replica can serve this
        facade's read: the primary's standby (same cluster and database), fresh within the
        lag bound as measured against the primary's WAL position, which has replayed the
        facade's writes; else :data:`NOT_READY` (a replica found failing, lagging past the
        bound or another database's is skipped). A failure of the replica (an error of the
        database, or no answer within the read's deadline) skips it and says NOT_READY; bad
        input raises as it would on the primary."""
        state = self.states[i]
        _under_the_read(conn.connection.driver_connection)
        try:
            if not state.verified and not self._verify(conn, i):
                return NOT_READY
            if not self._fresh(state) and not self._probe(conn, i):
                return NOT_READY
            result = work(conn)
        except (StoreError, ConflictError) as err:
            self.connection_failed(i, err)
            return NOT_READY
        with self._lock:
            state.reads += 1
        return result

    def _verify(self, conn: Connection, i: int) -> bool:
        """True when replica ``i`` is the primary's cluster and database; one that is not is
        refused for the facade's life (one warning)."""
        primary = self.identity
        if primary is None:  # the primary's not read yet (it could not be reached)
            with self._lock:
                self._counts.not_fresh += 1
            return False
        difference = identity_difference(server_identity(conn), primary)
        if difference is not None:
            self.refuse(i, difference)
            return False
        self.states[i].verified = True
        return True

    def _fresh(self, state: ReplicaState) -> bool:
        """True when what the replica said is recent, proves it within the lag bound now, and
        covers this facade's writes."""
        now = time.monotonic()
        with self._lock:
            return (
                now - state.checked < self._interval
                and state.fresh_as_of is not None
                and now - state.fresh_as_of <= self.settings.replica_max_lag
                and self._caught_up(state)
            )

    def _probe(self, conn: Connection, i: int) -> bool:
        """Ask replica ``i`` where it is, against the readings of the primary's position:
        True when it can serve the read; one that has not replayed what the primary had
        written longer ago than the bound is skipped."""
        state = self.states[i]
        max_lag = self.settings.replica_max_lag
        at = time.monotonic()
        with translate_errors():
            standby, replayed_text = conn.execute(REPLICA_POSITION).one()
        if not standby:
            self.skip(i, "it is not a standby (promoted, or not a replica)")
            return False
        replayed = lsn_of(replayed_text)
        with self._lock:
            readings = list(self._readings)
            fresh = replica_fresh_as_of(readings, replayed)
            behind = replica_behind_since(readings, replayed)
            state.replayed = replayed
            state.checked = at
            state.fresh_as_of = fresh
            if not readings:
                state.lag_s = None
            else:
                state.lag_s = 0.0 if behind is None else max(0.0, at - behind)
        if behind is not None and at - behind > max_lag:
            self.skip(
                i,
                f"it has not replayed what the primary had written {at - behind:.1f} s ago "
                f"(the bound is {max_lag:g} s)",
            )
            return False
        with self._lock:
            if fresh is None or at - fresh > max_lag:
                self._counts.not_fresh += 1  # not proven within the bound: asked again next read
                return False
            if not self._caught_up(state):
                self._counts.not_caught_up += 1
                return False
        return True

    def skip(self, i: int, reason: str) -> None:
        """Leave replica ``i`` alone for ``settings.replica_skip`` seconds; one warning."""
        state = self.states[i]
        with self._lock:
            now = time.monotonic()
            if state.skipped_until > now:
                return  # another read found it first: one warning
            state.skipped_until = now + self.settings.replica_skip
            state.checked = -1e18
            state.verified = False  # it may come back as another server
            state.reason = reason
            state.skips += 1
        logger.warning(
            "read replica %s skipped for %g s: %s; its reads go to the primary",
            state.database,
            self.settings.replica_skip,
            reason,
        )

    def refuse(self, i: int, reason: str) -> None:
        """Never use replica ``i`` again (its identity is not the primary's); one warning."""
        state = self.states[i]
        with self._lock:
            if state.skipped_until == math.inf:
                return
            state.skipped_until = math.inf
            state.reason = reason
            state.skips += 1
            self._counts.refused += 1
        logger.warning(
            "read replica %s is not used: %s; its reads go to the primary", state.database, reason
        )

    def connection_failed(self, i: int, err: MnestomaError) -> None:
        """Replica ``i`` failed this read (it could not be connected to, refused, or did not
        answer within the read's deadline): skipped, and the primary serves the read."""
        guard = _GUARD.get()
        timed_out = guard is not None and guard.expired
        if timed_out:
            reason = f"it did not answer within {self.settings.replica_read_timeout:g} s"
        else:
            reason = str(err)
        self.skip(i, reason)
        with self._lock:
            self._counts.fallbacks += 1
            if timed_out:
                self._counts.timeouts += 1

    def stats(self) -> dict[str, Any]:
        """The counters of this facade's routing: each replica's reads, skips, last lag and
        whether it is skipped now; the reads the primary served (and why)."""
        with self._lock:
            return {
                "replicas": [s.as_dict() for s in self.states],
                "primary_reads": self._counts.primary_reads,
                "not_caught_up": self._counts.not_caught_up,
                "not_fresh": self._counts.not_fresh,
                "fallbacks": self._counts.fallbacks,
                "timeouts": self._counts.timeouts,
                "refused": self._counts.refused,
            }
