"""The async door (contract §9): the same rules, statements and errors as the sync one, awaited.

Each operation runs the sync repository on the sync proxy of an async connection or session
(``run_sync``), as SQLAlchemy's asyncio extension intends: the driver's I/O is awaited on
the event loop, and the rules, statements, checks and snapshots are the sync door's own.
Needs the extra ``mnestoma[async]`` (greenlet, aiosqlite); PostgreSQL uses psycopg 3 in its
async mode.

>>> async with AsyncMnestoma("sqlite:///store.sqlite") as am:
...     await am.record_passing("search", "1", "read", "2")
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session

from mnestoma.core._sqla_compat import ASYNC_ENGINE_OPTION, greenlet_spawn
from mnestoma.core.clock import Clock
from mnestoma.core.errors import (
    InvalidInput,
    MissingExtra,
    MnestomaError,
    StoreError,
    translate_errors,
)
from mnestoma.core.rules import AgerReport
from mnestoma.core.settings import Settings, settings_of
from mnestoma.doors.shared import (
    AsyncDoor,
    Bind,
    FacadeBase,
    MnestOperations,
    Replicas,
    ensure_schema_handed,
    operation,
    schema_at_head,
    store_url,
)
from mnestoma.engines import (
    async_database_url,
    is_sqlite,
    make_engine,
    own_pool_after_fork,
    redact_url,
)
from mnestoma.engines.locking import (
    LOCK_TIMEOUT_OPTION,
    lock_timeout_of,
    pauses_letting_writers_in,
    saying_it_waits,
    waiting_file,
    write_lock_timeout,
)
from mnestoma.engines.replicas import NOT_READY, replica_urls
from mnestoma.maintenance.ager import BatchProgress, ager_steps
from mnestoma.maintenance.migration import MIGRATION_GATE
from mnestoma.maintenance.retention import PruneProgress
from mnestoma.maintenance.splitting import SplitProgress, SplitReport
from mnestoma.maintenance.steps import OwnConnection, Pause, Read, Step, Write, drive_async
from mnestoma.schema.models import CanonicalQuery
from mnestoma.schema.runner import connection_of
from mnestoma.store.repository import CanonicalQueryRepository, MnestRepository, QueryFrequency
from mnestoma.store.uow import (
    AsyncUnit,
    ConnectionUnitOfWork,
    JoinedUnitOfWork,
    UnitOfWork,
    check_factory,
    made_session,
    retry_pause,
)

try:
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_sessionmaker,
    )
except ImportError as err:  # SQLAlchemy's asyncio extension needs greenlet
    raise MissingExtra(f'the async door needs: pip install "mnestoma[async]" ({err})') from err


__all__ = [
    "AsyncCanonicalQueryRepository",
    "AsyncJoinedUnitOfWork",
    "AsyncMnestRepository",
    "AsyncMnestoma",
    "AsyncUnitOfWork",
    "async_database_url",
    "make_async_engine",
    "make_async_session_factory",
]

T = TypeVar("T")
R = TypeVar("R")


# --- engines ----------------------------------------------------------------------------------


def make_async_engine(url: str | URL | None = None, **kwargs: Any) -> AsyncEngine:
    """An AsyncEngine for ``url`` (or the resolved default), configured as :func:`make_engine`
    configures a sync one: the same SQLite folder, busy timeout, pragmas and transaction
    listeners (registered on its ``sync_engine``), the same PostgreSQL options.

    Returns:
        The configured ``AsyncEngine``.

    Raises:
        InvalidInput: ``url`` is an engine, not a database URL, or names a driver that
            is not async.
        MissingExtra: the async driver is not installed (extra ``mnestoma[async]``).
    """
    if isinstance(url, Engine | AsyncEngine):
        raise InvalidInput("make_async_engine takes a URL; this is already an engine")
    resolved = async_database_url(url)
    try:
        # What create_async_engine does: a sync Engine on the async dialect, wrapped.
        sync_engine = make_engine(resolved, **{ASYNC_ENGINE_OPTION: True}, **kwargs)
    except MissingExtra as err:
        raise MissingExtra(f'{err} (the async door: pip install "mnestoma[async]")') from err
    try:
        return AsyncEngine(sync_engine)
    except ArgumentError as err:  # a driver that is not async after all
        sync_engine.dispose()
        raise InvalidInput(f"{resolved.drivername!r} is not an async driver: {err}") from None


def make_async_session_factory(
    engine: AsyncEngine, **kwargs: Any
) -> async_sessionmaker[AsyncSession]:
    """An ``async_sessionmaker`` bound to ``engine``; objects stay readable after commit.

    Returns:
        The ``async_sessionmaker``.
    """
    kwargs.setdefault("expire_on_commit", False)
    return async_sessionmaker(engine, **kwargs)


# --- one sync operation, awaited ----------------------------------------------------------


class _AsyncDoor(AsyncDoor, Generic[R]):
    """Something that runs an operation of the sync object ``R`` without blocking the loop."""

    async def _call(self, op: Callable[[R], T], *, write: bool) -> T:
        raise NotImplementedError

    @staticmethod
    def _operation_method(bind: Bind, write: bool) -> Callable[..., Any]:
        """An operation (:class:`~mnestoma.doors.shared.operation`) as a coroutine method,
        run through the door's ``_call``."""

        async def method(self: _AsyncDoor[Any], /, *args: Any, **kwargs: Any) -> Any:
            # bound once: a retry replays what the first attempt read
            return await self._call(bind(args, kwargs), write=write)

        return method


def _check_async_session(session: Any, owner: str) -> AsyncSession | AsyncConnection:
    if not isinstance(session, AsyncSession | AsyncConnection):
        hint = ""
        if isinstance(session, Session | Connection):
            hint = f"; a sync one goes to {owner.removeprefix('Async')}"
        raise InvalidInput(
            f"{owner} needs an AsyncSession or AsyncConnection, got {type(session).__name__}" + hint
        )
    return session


class _OnAsyncSession(_AsyncDoor[R]):
    """A sync repository of a caller's async session, rebuilt when the session's sync proxy
    changes; it may flush, it never commits (the unit of work or the caller does)."""

    def __init__(self, session: AsyncSession | AsyncConnection) -> None:
        self._session = _check_async_session(session, type(self).__name__)
        self._sync: R | None = None

    @property
    def session(self) -> AsyncSession | AsyncConnection:
        """The async session (or connection) this repository works in."""
        return self._session

    def _build(self, sync: Session | Connection) -> R:
        raise NotImplementedError

    def _sync_session_of(self, repo: R) -> Any:
        return repo.session  # type: ignore[attr-defined]

    async def _call(self, op: Callable[[R], T], *, write: bool) -> T:
        with translate_errors():
            return await _on_session(self._session, self._session.run_sync(self._apply, op))

    def _apply(self, sync: Session | Connection, op: Callable[[R], T]) -> T:
        repo = self._sync
        if repo is None or self._sync_session_of(repo) is not sync:
            repo = self._sync = self._build(sync)
        return op(repo)

    @classmethod
    def _over(cls, session: AsyncSession, repo: R) -> Self:
        """A door onto an existing sync repository of ``session`` (a joined unit's)."""
        door = cls.__new__(cls)
        _OnAsyncSession.__init__(door, session)
        door._sync = repo
        door.settings = repo.settings  # type: ignore[attr-defined]
        return door


class _MnestOperations(_AsyncDoor[MnestRepository], MnestOperations):
    """The operations that the async repository and the async facade both await as the sync
    repository's, each one call (the facade in a transaction of its own): the shared table
    (:class:`~mnestoma.doors.shared.MnestOperations`), and the query log's entry."""

    log_canonical_query = operation(MnestRepository.log_canonical_query, write=True)


class AsyncMnestRepository(_OnAsyncSession[MnestRepository], _MnestOperations):
    """Every operation of :class:`~mnestoma.MnestRepository` on an ``AsyncSession`` (or
    ``AsyncConnection``), awaited: ``await repo.record_passing(...)``. Flushes, never commits.

    Raises:
        InvalidInput: ``session`` is neither an ``AsyncSession`` nor an
            ``AsyncConnection``, or settings are refused.
    """

    def __init__(
        self,
        session: AsyncSession | AsyncConnection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
    ) -> None:
        super().__init__(session)
        self.settings = settings_of(settings, clock=clock, recorder=recorder)

    def _build(self, sync: Session | Connection) -> MnestRepository:
        return MnestRepository(sync, settings=self.settings)

    # the shared table (_MnestOperations), and the repository's own:
    apply_ager = operation(MnestRepository.apply_ager, write=True)
    prune_events = operation(MnestRepository.prune_events, write=True)


class AsyncCanonicalQueryRepository(_OnAsyncSession[CanonicalQueryRepository]):
    """The query log of :class:`~mnestoma.CanonicalQueryRepository` on an async session.

    Raises:
        InvalidInput: a ``session`` that is not an ``AsyncSession`` or an ``AsyncConnection``;
            refused settings.
    """

    def __init__(
        self,
        session: AsyncSession | AsyncConnection,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(session)
        self.settings = settings_of(settings, clock=clock)

    def _build(self, sync: Session | Connection) -> CanonicalQueryRepository:
        return CanonicalQueryRepository(sync, settings=self.settings)

    def _sync_session_of(self, repo: CanonicalQueryRepository) -> Any:
        return repo._session

    log = operation(CanonicalQueryRepository.log, write=True)
    recent = operation(CanonicalQueryRepository.recent)
    top = operation(CanonicalQueryRepository.top)


# --- units of work ------------------------------------------------------------------------

# Work that went on after its caller was cancelled, kept referenced until it ends.
_ENDING: set[asyncio.Future[Any]] = set()


async def _to_the_end(work: Coroutine[Any, Any, T] | asyncio.Future[T]) -> T:
    """Await ``work``; when the caller is cancelled meanwhile, it stops waiting and the work
    still runs to its end.

    A unit's end (a rollback, a connection given back to the pool) interrupted by a
    cancellation can leave the connection outside the pool, still in its transaction: on
    SQLite, holding the write lock for every process until the garbage collector finds it.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _ENDING.add(task)
        task.add_done_callback(_ended)
        raise


def _ended(task: asyncio.Future[Any]) -> None:
    """Work whose caller was cancelled has ended: its outcome is nobody's to raise."""
    _ENDING.discard(task)
    if not task.cancelled():
        task.exception()


# The latest operation run on each async session (or connection) by a unit or repository.
_LATEST: weakref.WeakKeyDictionary[Any, asyncio.Future[Any]] = weakref.WeakKeyDictionary()


async def _on_session(session: Any, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on ``session`` to its end (:func:`_to_the_end`): a cancellation never
    lands inside a driver call, where SQLite's driver goes on in its thread while SQLAlchemy
    discards the connection as broken, possibly still holding the write lock."""
    task = asyncio.ensure_future(work)
    _LATEST[session] = task
    return await _to_the_end(task)


async def _settled(session: Any) -> None:
    """Wait until the operation a cancelled caller left running on ``session`` has ended,
    so that ending the unit never runs beside it."""
    task = _LATEST.pop(session, None)
    if task is not None and not task.done():
        await asyncio.wait([task])


class _AsyncUnit:
    """What the async units share: each is a sync unit of work (``_unit``) on the sync proxy
    of an ``AsyncSession``, its repositories awaited, its commit, rollback and end run
    through ``run_sync`` to their end (:func:`_on_session`), once the operation a cancelled
    caller left running on the session has ended (:func:`_settled`)."""

    mnests: AsyncMnestRepository
    queries: AsyncCanonicalQueryRepository
    session: AsyncSession
    settings: Settings
    _unit: UnitOfWork | JoinedUnitOfWork

    def _entered(self) -> Self:
        unit = self._unit.__enter__()
        self.mnests = AsyncMnestRepository._over(self.session, unit.mnests)
        self.queries = AsyncCanonicalQueryRepository._over(self.session, unit.queries)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _to_the_end(self._run(lambda: self._unit.__exit__(*exc)))

    async def _run(self, end: Callable[[], None]) -> None:
        await _settled(self.session)
        await _on_session(self.session, self.session.run_sync(lambda _sync: end()))

    async def commit(self) -> None:
        """What the sync unit's ``commit()`` does, awaited.

        Returns:
            None, once committed.

        Raises:
            ConflictError: a constraint of the store broken, or (a whole transaction) lost
                to another writer.
            StoreError: the database failed or could not be reached.
        """
        await self._run(self._unit.commit)

    async def rollback(self) -> None:
        """What the sync unit's ``rollback()`` does, awaited.

        Returns:
            None, once rolled back.

        Raises:
            StoreError: the database failed (:class:`DatabaseUnavailable`: the connection
                was lost, and with it the uncommitted work).
        """
        await self._run(self._unit.rollback)


class AsyncJoinedUnitOfWork(_AsyncUnit):
    """Works in a SAVEPOINT of a caller's ``AsyncSession``; never commits or closes it.

    It is :class:`~mnestoma.JoinedUnitOfWork` on the session's sync proxy: the savepoint is
    taken before the first write (after the write lock on SQLite), ``commit()`` releases it
    into the caller's transaction, leaving without it rolls back to it.

    Raises:
        InvalidInput: ``session`` is not an ``AsyncSession``, or settings are refused.
    """

    def __init__(
        self,
        session: AsyncSession,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
    ) -> None:
        if not isinstance(session, AsyncSession):
            hint = "; UnitOfWork.joining takes a sync one" if isinstance(session, Session) else ""
            raise InvalidInput(
                "AsyncUnitOfWork.joining needs a SQLAlchemy AsyncSession, "
                f"got {type(session).__name__}{hint}"
            )
        self.session = session
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._unit = JoinedUnitOfWork(session.sync_session, settings=self.settings)

    async def __aenter__(self) -> Self:
        return self._entered()


class AsyncUnitOfWork(_AsyncUnit):
    """Opens an ``AsyncSession`` on enter; commits only when asked; rolls back otherwise;
    always closes. The async twin of :class:`~mnestoma.UnitOfWork`:

    >>> async with AsyncUnitOfWork(make_async_session_factory(engine)) as uow:
    ...     await uow.mnests.record_passing("search", "1", "read", "2")
    ...     await uow.commit()

    Raises:
        InvalidInput: ``async_session_factory`` is not an async session factory, or
            (on enter) returned something else than an ``AsyncSession``; or settings are
            refused.
    """

    _unit: UnitOfWork

    def __init__(
        self,
        async_session_factory: async_sessionmaker[AsyncSession] | Callable[[], AsyncSession],
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
    ) -> None:
        check_factory(
            async_session_factory,
            refused=(AsyncEngine, AsyncConnection, AsyncSession, Engine, Session),
            session=AsyncSession,
            owner="AsyncUnitOfWork",
            needs="an async session factory (make_async_session_factory(engine))",
        )
        self._factory = async_session_factory
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._unit = UnitOfWork(lambda: self.session.sync_session, settings=self.settings)

    @property
    def _after_commit(self) -> Callable[[Session], object] | None:
        """Called with the sync session after each commit (read replicas, contract §12)."""
        return self._unit._after_commit

    @_after_commit.setter
    def _after_commit(self, after: Callable[[Session], object] | None) -> None:
        self._unit._after_commit = after

    async def __aenter__(self) -> Self:
        self.session = made_session(self._factory, AsyncSession, "an AsyncUnitOfWork")
        return self._entered()

    # ``AsyncUnitOfWork.joining(session, *, settings=None, clock=None, recorder=None)``: a
    # unit of work inside an ``AsyncSession`` (and transaction) that the caller owns.
    joining = AsyncJoinedUnitOfWork


if TYPE_CHECKING:  # both are an AsyncUnit of the async repositories
    _units: tuple[type[AsyncUnit[AsyncMnestRepository, AsyncCanonicalQueryRepository]], ...] = (
        AsyncUnitOfWork,
        AsyncJoinedUnitOfWork,
    )


# --- the facade -------------------------------------------------------------------------


class AsyncMnestoma(FacadeBase[AsyncEngine], _MnestOperations):
    """The store for async services: every operation of :class:`~mnestoma.Mnestoma`, awaited,
    one transaction per call, with the same retry of transient conflicts.

    A URL (plain or async) or an ``AsyncEngine``. The schema is checked on first use (or on
    ``async with``): a new or empty SQLite store is migrated to head, any other database
    must already be there, else :class:`~mnestoma.SchemaError`. Safe to share between the
    tasks of one event loop.

    Raises:
        InvalidInput: a URL, engine, setting or replica the contract refuses, or an
            in-memory SQLite database (when it is built).
        MissingExtra: the async driver is not installed (extra ``mnestoma[async]``).
        SchemaError: with ``create=False`` there is no SQLite store at its path (when it
            is built); the database is not at head (on first use).
    """

    def _open(
        self, target: str | URL | AsyncEngine | None, create: bool, replicas: Replicas
    ) -> None:
        if isinstance(target, Engine):
            raise InvalidInput(
                "AsyncMnestoma needs an AsyncEngine (make_async_engine) or a URL; "
                "a sync Engine goes to Mnestoma"
            )
        url = target.url if isinstance(target, AsyncEngine) else async_database_url(target)
        urls = [async_database_url(u) for u in replica_urls(store_url(url, create), replicas)]
        if isinstance(target, AsyncEngine):
            self.engine = target
            self._owns_engine = False
            own_pool_after_fork(self.engine.sync_engine)
        else:
            self.engine = make_async_engine(url)
            self._owns_engine = True
        self._dialect = self.engine.dialect.name
        self._bind = self.engine
        if self.settings.lock_timeout is not None:
            self._bind = self.engine.execution_options(
                **{LOCK_TIMEOUT_OPTION: self.settings.lock_timeout}
            )
        self._at_head = False
        self._checking: asyncio.Task[None] | None = None
        # SQLite has one writer at a time: this facade's writes queue here, each woken as
        # soon as the previous one commits, instead of polling SQLite's busy handler.
        self._one_writer = asyncio.Lock() if is_sqlite(url) else None
        self._waiting_file = waiting_file(self.engine.sync_engine.url)
        self._with_replicas(urls, make_async_engine)

    # --- transactions -----------------------------------------------------------------------

    async def _ready(self) -> None:
        """Check (or, for an empty SQLite store, migrate) the schema once.

        Concurrent first callers share one check, which no caller's cancellation interrupts:
        a burst of them holds no connection while it waits (each holding one while the check
        asked the pool for another exhausted it).
        """
        if self._at_head:
            return
        check = self._checking
        if (
            check is None
            or check.get_loop() is not asyncio.get_running_loop()  # a loop since ended
            or (check.done() and (check.cancelled() or check.exception() is not None))
        ):
            check = self._checking = asyncio.ensure_future(self._check_schema())
        await asyncio.shield(check)

    async def _check_schema(self) -> None:
        sync = self.engine.sync_engine
        with translate_errors():
            at_head = await greenlet_spawn(schema_at_head, sync)
        if not at_head:
            # One migration at a time in the process, waited for without blocking the
            # loop: a blocking wait in a greenlet would hold up the loop another door needs.
            async with MIGRATION_GATE.held_async():
                with translate_errors():
                    await greenlet_spawn(ensure_schema_handed, sync)
        self._at_head = True

    async def _call(
        self, op: Callable[[MnestRepository], T], *, write: bool, primary: bool = False
    ) -> T:
        """Run ``op`` in its own transaction: a read (on a replica that can serve it, unless
        ``primary``), or a write retried when transient."""
        await self._ready()
        if not write:
            return await self._unit(op, commit=False, primary=primary)
        attempt = 0
        while True:
            try:
                return await self._unit(op, commit=True)
            except MnestomaError as err:
                pause = retry_pause(attempt, err)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
                attempt += 1

    async def _unit(
        self, op: Callable[[MnestRepository], T], *, commit: bool, primary: bool = False
    ) -> T:
        """One unit of work in a task of its own, which the caller's cancellation does not
        interrupt halfway.

        A cancellation (a request's timeout, a client gone) can land at any await: inside a
        driver call, SQLite's ``BEGIN IMMEDIATE`` may still complete in the driver's thread,
        and a connection interrupted while it returns to the pool can leave it, holding the
        write lock for every process until the garbage collector finds it. So the caller
        stops waiting at once, and the unit goes on to its end: it skips what it has not
        begun, rolls back rather than commits, and gives its connection back.
        """
        cancelled = _Flag()
        try:
            return await _to_the_end(self._guarded(op, commit, cancelled, primary))
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def _guarded(
        self,
        op: Callable[[MnestRepository], T],
        commit: bool,
        cancelled: _Flag,
        primary: bool = False,
    ) -> T:
        replicas = self._replicas
        if not commit and replicas is not None and not (primary or self._on_primary):
            await replicas.sample_async(self.engine)  # the primary's WAL position, when due
            for i in replicas.order():
                if cancelled:
                    raise asyncio.CancelledError
                with replicas.bounded():  # a replica that does not answer in time is cut
                    try:
                        with translate_errors():
                            async with replicas.engines[i].connect() as conn:
                                result = await conn.run_sync(
                                    replicas.attempt, i, functools.partial(self._in_read, op)
                                )
                    except StoreError as err:  # could not connect, lost the connection, cut
                        replicas.connection_failed(i, err)
                        continue
                if result is not NOT_READY:
                    return result  # type: ignore[no-any-return]
            replicas.primary_read()
        if not commit or self._one_writer is None:
            return await self._once(self._bind, op, commit=commit, cancelled=cancelled)
        # One lock timeout in all: the wait for this facade's queue of writers counts in it.
        timeout = lock_timeout_of(self._bind.get_execution_options())
        deadline = time.monotonic() + timeout
        # Queued behind this facade's other writes, a write says that it waits, as it
        # would in SQLite's queue: an ager between two batches lets the queue in.
        queued = self._waiting_file if self._one_writer.locked() else None
        try:
            with saying_it_waits(queued):
                await asyncio.wait_for(self._one_writer.acquire(), timeout)
        except TimeoutError:
            raise write_lock_timeout(timeout) from None
        try:
            left = max(0.0, deadline - time.monotonic())
            engine = self.engine.execution_options(**{LOCK_TIMEOUT_OPTION: left})
            return await self._once(engine, op, commit=commit, cancelled=cancelled)
        finally:
            self._one_writer.release()

    async def _once(
        self,
        engine: AsyncEngine,
        op: Callable[[MnestRepository], T],
        *,
        commit: bool,
        cancelled: _Flag,
    ) -> T:
        """One connection, one transaction; rolled back unless committed."""
        if cancelled:  # the caller gave up while this unit waited for the writers' lock
            raise asyncio.CancelledError
        with translate_errors():
            async with engine.connect() as conn:
                return await conn.run_sync(self._in_unit, op, commit, cancelled)

    def _in_unit(
        self, conn: Connection, op: Callable[[MnestRepository], T], commit: bool, cancelled: _Flag
    ) -> T:
        """The sync side of one call: a connection unit of work, as the sync facade's."""
        with ConnectionUnitOfWork(conn, settings=self.settings) as unit:
            result = op(unit.mnests)
            if commit and not cancelled:
                unit.commit()
                if self._replicas is not None:
                    self._replicas.note_write(conn)
            return result

    def _in_read(self, op: Callable[[MnestRepository], T], conn: Connection) -> T:
        """The sync side of one read on a replica's connection."""
        with ConnectionUnitOfWork(conn, settings=self.settings) as unit:
            return op(unit.mnests)

    # --- the contract's operations: the shared table (_MnestOperations), and these ----------

    async def apply_ager(
        self,
        *,
        dry_run: bool = False,
        batch_rows: int | None = None,
        progress: BatchProgress | None = None,
    ) -> AgerReport:
        """Run the ager at the clock's now in batches, each its own transaction (see
        :meth:`mnestoma.Mnestoma.apply_ager`); ``dry_run`` reports and rolls everything back.

        The run holds one connection throughout, in a task of its own, as every unit of
        this facade (see :meth:`_unit`). A cancelled caller stops waiting at once; the run
        finishes the batch it is in (or, waiting to try one again, stops waiting), stops
        before the next and gives its connection back: it is an interrupted run, which the
        next completes.

        Returns:
            The :class:`~mnestoma.AgerReport` of the run (with ``dry_run``: of what it would do).

        Raises:
            InvalidInput: ``dry_run`` is not a bool, ``batch_rows`` not a positive integer,
                or ``progress`` not callable; nothing is then written.
            SchemaError: on this facade's first use, the database is not at head.
            ConflictError: a batch could not have the write lock within the lock timeout,
                retries spent; the batches before it stay committed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        steps = ager_steps(self.settings, dry_run=dry_run, batch_rows=batch_rows, progress=progress)
        return await drive_async(steps, self._step)

    async def prune_events(
        self, before: datetime, *, dry_run: bool = False, progress: PruneProgress | None = None
    ) -> int:
        """Delete the events older than ``before`` in batches, each its own transaction, with
        ``progress(done, total, deleted)`` as it goes (see
        :meth:`mnestoma.Mnestoma.prune_events`); ``dry_run`` counts them, in one read.

        Returns:
            How many events were deleted (with ``dry_run``: would be, counted exactly); on
            PostgreSQL the months dropped whole count from the catalogue.

        Raises:
            InvalidInput: ``before`` is not an aware datetime the store can hold, ``dry_run``
                not a bool, or ``progress`` not callable; nothing is then deleted.
            SchemaError: on this facade's first use, the database is not at head.
            ConflictError: a batch could not have the write lock within the lock timeout,
                retries spent; the batches before it stay deleted.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        return await drive_async(self._prune_steps(before, dry_run, progress), self._step)

    async def split_history(
        self,
        *,
        batch_rows: int | None = None,
        dry_run: bool = False,
        progress: SplitProgress | None = None,
    ) -> SplitReport:
        """PostgreSQL: rebuild each partition of ``events`` in the old layout that holds
        rows, then the default partition's rows, into months of the new layout, online,
        each batch its own transaction (see
        :meth:`mnestoma.Mnestoma.split_history`); ``dry_run`` lists what waits.

        Returns:
            The :class:`~mnestoma.maintenance.splitting.SplitReport` of the run (with
            ``dry_run``: the partitions that wait).

        Raises:
            InvalidInput: ``batch_rows`` is not a positive integer, ``dry_run`` not a bool,
                or ``progress`` not callable; nothing is then changed.
            SchemaError: on this facade's first use, the database is not at head; or the
                store has no ``mnestoma_events_month``, or a table ``events_split`` that the
                split did not make.
            StoreError: the database failed, or a lock stayed busy through every try; the
                batches before stay copied and the next run goes on from there.
        """
        return await drive_async(self._split_steps(batch_rows, dry_run, progress), self._step)

    async def _step(self, step: Step) -> Any:
        """One step of an operation of several transactions, awaited (see
        :meth:`mnestoma.Mnestoma._step`): each function runs through ``run_sync``."""
        if isinstance(step, Read):
            return await self._call(
                lambda r: step.work(connection_of(r.session)), write=False, primary=True
            )
        if isinstance(step, Write):
            return await self._call(lambda r: step.work(connection_of(r.session)), write=True)
        if isinstance(step, Pause):
            for seconds in pauses_letting_writers_in(self.engine.url, step.seconds):
                await asyncio.sleep(seconds)
            return None
        await self._ready()
        cancelled = _Flag()
        try:
            return await _to_the_end(self._own_connection(step, cancelled))
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def _own_connection(self, step: OwnConnection[T], cancelled: _Flag) -> T:
        """A run on a connection of its own (the batched ager), stopped before its next
        batch once ``cancelled`` is set."""
        if cancelled:
            raise asyncio.CancelledError
        with translate_errors():
            async with self._bind.connect() as conn:
                return await conn.run_sync(
                    lambda sync: self._noted(sync, step.work(sync, lambda: not cancelled))
                )

    async def top_queries(self, *, limit: int = 10) -> list[QueryFrequency]:
        """The most frequent canonical forms.

        Returns:
            At most ``limit`` :class:`~mnestoma.QueryFrequency` items, most frequent first.

        Raises:
            InvalidInput: ``limit`` is not a positive integer up to 100,000.
            SchemaError: on this facade's first use, the database is not at head.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        return await self._call(lambda r: _queries(r).top(limit=limit), write=False)

    async def recent_queries(self, *, limit: int = 20) -> list[CanonicalQuery]:
        """The latest query-log entries, newest first.

        Returns:
            The ``limit`` newest entries at most.

        Raises:
            InvalidInput: a ``limit`` that is not a whole number from 1 to 100,000.
            SchemaError: a database not at head, found on this facade's first use.
            StoreError: the store could not be read.
        """
        return await self._call(lambda r: _queries(r).recent(limit=limit), write=False)

    def unit_of_work(self) -> AsyncUnitOfWork:
        """An async unit of work on this store's engine, clock and recorder; on the primary
        only, reads included (contract §12).

        Returns:
            A new :class:`AsyncUnitOfWork`, not yet entered.
        """
        unit = AsyncUnitOfWork(make_async_session_factory(self._bind), settings=self.settings)
        if self._replicas is not None:
            unit._after_commit = self._replicas.note_write
        return unit

    async def close(self) -> None:
        """Release the connections (the engine too, when this facade created it), once the
        units of cancelled callers have ended.

        Returns:
            None.
        """
        ending = [f for f in _ENDING if f.get_loop() is asyncio.get_running_loop()]
        if ending:
            await asyncio.wait(ending)
        if self._owns_engine:
            await self.engine.dispose()
        if self._replicas is not None and self._owns_replicas:
            for engine in self._replicas.engines:
                await engine.dispose()

    def __repr__(self) -> str:
        return f"AsyncMnestoma({redact_url(self.engine.url)!r})"

    async def __aenter__(self) -> Self:
        try:
            await self._ready()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Flag:
    """Set once, read from the unit's sync side: its caller was cancelled."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def __bool__(self) -> bool:
        return self._set


def _queries(repo: MnestRepository) -> CanonicalQueryRepository:
    return CanonicalQueryRepository(repo.session, settings=repo.settings)
