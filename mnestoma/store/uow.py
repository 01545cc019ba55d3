"""The units of work, the package's only transaction owners, and its one retry policy.

- :class:`UnitOfWork`: a session of the caller's factory, one transaction, for services;
- :class:`JoinedUnitOfWork`: a savepoint inside a caller's own session;
- :class:`ConnectionUnitOfWork`: one transaction on one Core connection, what the facade
  (and the async door) run each call in, because a Session adds only bookkeeping to Core
  statements;
- :class:`Unit` (and :class:`AsyncUnit`, its awaited twin): what each of them is;
- :func:`with_retries` (from :mod:`mnestoma.core.retrying`): a write retried when it failed
  transiently, bounded.

Repositories never commit; these do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from mnestoma.core.clock import Clock
from mnestoma.core.errors import InvalidInput, MnestomaError, translate_errors
from mnestoma.core.retrying import MAX_ATTEMPTS, retry_pause, with_retries
from mnestoma.core.settings import Settings, settings_of
from mnestoma.engines.locking import take_write_lock
from mnestoma.engines.partitions import upkeep_after_commit
from mnestoma.schema.runner import end_at_driver
from mnestoma.store.kept import KeptConnection
from mnestoma.store.repository import CanonicalQueryRepository, MnestRepository, built

__all__ = [
    "MAX_ATTEMPTS",
    "AsyncUnit",
    "ConnectionUnitOfWork",
    "JoinedUnitOfWork",
    "KeptConnection",
    "Unit",
    "UnitOfWork",
    "check_factory",
    "made_session",
    "retry_pause",
    "with_retries",
    "written",
]

T = TypeVar("T")
M_co = TypeVar("M_co", covariant=True)
Q_co = TypeVar("Q_co", covariant=True)


class Unit(Protocol[M_co, Q_co]):
    """What every unit of work is: its repositories (``mnests``, ``queries``) in one
    transaction, ``commit()`` and ``rollback()``, and a context manager that rolls back what
    was not committed when it is left. :class:`UnitOfWork`, :class:`JoinedUnitOfWork` and
    :class:`ConnectionUnitOfWork` are one, of the sync repositories."""

    @property
    def mnests(self) -> M_co: ...

    @property
    def queries(self) -> Q_co: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class AsyncUnit(Protocol[M_co, Q_co]):
    """:class:`Unit`, awaited: ``commit()``, ``rollback()`` and the context manager are
    coroutines (the async door's ``AsyncUnitOfWork`` and its joined twin)."""

    @property
    def mnests(self) -> M_co: ...

    @property
    def queries(self) -> Q_co: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


class _Repositories:
    """What the sync units share: the settings, and their two repositories on one bind."""

    mnests: MnestRepository
    queries: CanonicalQueryRepository
    settings: Settings

    def _open(self, bind: Session | Connection, before_write: Callable[[], None] | None) -> None:
        self.mnests = MnestRepository(bind, settings=self.settings, before_write=before_write)
        self.queries = CanonicalQueryRepository(
            bind, settings=self.settings, before_write=before_write
        )

    def __exit__(self, *exc: object) -> None:
        ended(self.rollback, exc[1] if len(exc) > 1 else None)

    def rollback(self) -> None:
        raise NotImplementedError


logger = logging.getLogger("mnestoma.uow")  # the logger's public name


def ended(rollback: Callable[[], None], in_flight: object) -> None:
    """Run a unit's closing ``rollback`` (each unit's own raises the package's errors).
    When the block is leaving by an exception (``in_flight``), that exception goes on and a
    failed rollback is only logged: it fails when the connection is lost, and the database
    then discards the transaction itself; the caller's own error says more."""
    try:
        rollback()
    except MnestomaError as err:
        if in_flight is None:
            raise
        logger.warning("the unit of work could not roll back as its block raised: %s", err)


def check_factory(
    factory: object, *, refused: tuple[type, ...], session: type, owner: str, needs: str
) -> None:
    """InvalidInput unless ``factory`` is a session factory: not one of the ``refused``
    things (an engine, a connection, a ``session``), and callable."""
    if isinstance(factory, refused) or not callable(factory):
        given = type(factory).__name__
        if isinstance(factory, session):
            given += f"; {owner}.joining(session) works in a session"
        raise InvalidInput(f"{owner} needs {needs}, got {given}")


def made_session(factory: Callable[[], Any], kind: type[T], owner: str) -> T:
    """The session ``factory`` made for the unit ``owner``, InvalidInput unless a ``kind``."""
    session = factory()
    if not isinstance(session, kind):
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise InvalidInput(
            f"the session factory of {owner} returned {type(session).__name__}, "
            f"not {article} {kind.__name__}"
        )
    return session


class JoinedUnitOfWork(_Repositories):
    """Works in a SAVEPOINT of a caller's session; never commits or closes that session.

    The savepoint is taken before the unit's first write (after the write lock on SQLite),
    so a unit that only reads takes no lock and never waits for a writer. ``commit()``
    releases the savepoint: the work becomes part of the caller's transaction, which the
    caller commits or rolls back. Leaving without ``commit()``, or by an exception, rolls
    back to the savepoint and leaves the caller's own work untouched.

    Raises:
        InvalidInput: ``session`` is not a SQLAlchemy Session, or settings are refused.
    """

    mnests: MnestRepository
    queries: CanonicalQueryRepository

    def __init__(
        self,
        session: Session,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
    ):
        if not isinstance(session, Session):
            raise InvalidInput(
                f"UnitOfWork.joining needs a SQLAlchemy Session, got {type(session).__name__}"
            )
        self.session = session
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._savepoint: SessionTransaction | None = None

    def __enter__(self) -> Self:
        self._open(self.session, self._open_savepoint)
        return self

    def _open_savepoint(self) -> None:
        """Before a write: the write lock for the caller's transaction, then the savepoint."""
        if self._savepoint is not None and self._savepoint.is_active:
            return
        with translate_errors():
            take_write_lock(self.session.connection())
            self._savepoint = self.session.begin_nested()

    def commit(self) -> None:
        """Release the savepoint into the caller's transaction (nothing to do after reads).

        Returns:
            None.

        Raises:
            ConflictError: releasing the savepoint broke a constraint of the store.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        if self._savepoint is not None and self._savepoint.is_active:
            with translate_errors():
                self._savepoint.commit()
        self._savepoint = None

    def rollback(self) -> None:
        """Roll back to the savepoint taken before the first write.

        Returns:
            None.

        Raises:
            StoreError: the database failed (:class:`DatabaseUnavailable`: the connection
                was lost, and with it the caller's transaction).
        """
        savepoint, self._savepoint = self._savepoint, None
        if savepoint is not None and savepoint.is_active:
            with translate_errors():
                savepoint.rollback()


class UnitOfWork(_Repositories):
    """Opens a session on enter; commits only when asked; rolls back otherwise; always closes.

    >>> with UnitOfWork(session_factory) as uow:
    ...     uow.mnests.record_passing("search", "1", "read", "2")
    ...     uow.commit()

    Raises:
        InvalidInput: ``session_factory`` is not a session factory (an Engine, a
            Connection or a Session was given), or (on enter) returned something else than a
            Session; or settings are refused.
    """

    mnests: MnestRepository
    queries: CanonicalQueryRepository
    session: Session

    def __init__(
        self,
        session_factory: sessionmaker[Session] | Callable[[], Session],
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
    ):
        check_factory(
            session_factory,
            refused=(Engine, Connection, Session),
            session=Session,
            owner="UnitOfWork",
            needs="a session factory (make_session_factory(engine))",
        )
        self._factory = session_factory
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        # Called with the session's connection after each commit (a facade with read
        # replicas notes the WAL position its writes reached, contract §12).
        self._after_commit: Callable[[Session], object] | None = None

    def __enter__(self) -> Self:
        self.session = made_session(self._factory, Session, "a UnitOfWork")
        self._open(self.session, None)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self.session.close()

    def commit(self) -> None:
        """Commit the work done so far; a later operation starts a new transaction.

        Returns:
            None.

        Raises:
            ConflictError: the commit broke a constraint of the store, or lost to another
                writer.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        with translate_errors():
            self.session.commit()
        if self._after_commit is not None:
            self._after_commit(self.session)
            self.rollback()
        upkeep_after_commit(self.session)  # PostgreSQL: months its writes reached (§12)

    def rollback(self) -> None:
        """Throw away the work done since the last commit.

        Returns:
            None.

        Raises:
            StoreError: the database failed (:class:`DatabaseUnavailable`: the connection
                was lost, and with it the uncommitted work).
        """
        with translate_errors():
            self.session.rollback()

    # ``UnitOfWork.joining(session, *, settings=None, clock=None, recorder=None)``: a unit of
    # work inside a session (and transaction) that the caller owns.
    joining = JoinedUnitOfWork


class ConnectionUnitOfWork(_Repositories):
    """One transaction on one Core connection; rolled back unless committed.

    Given an Engine, it checks a connection out on enter and returns it on exit; given a
    Connection (the async door's), it works in that connection's transaction and leaves the
    connection open.
    """

    mnests: MnestRepository
    queries: CanonicalQueryRepository

    def __init__(
        self,
        bind: Engine | Connection,
        *,
        settings: Settings | None = None,
    ) -> None:
        self._bind = bind
        self.settings = settings_of(settings)

    def __enter__(self) -> Self:
        if isinstance(self._bind, Engine):
            with translate_errors():
                self.connection = self._bind.connect()
        else:
            self.connection = self._bind
        # not through _open: every call of a facade enters one of these
        self.mnests = MnestRepository(self.connection, settings=self.settings)
        self.queries = CanonicalQueryRepository(self.connection, settings=self.settings)
        return self

    def commit(self) -> None:
        """Commit the work done so far (then, on PostgreSQL, make the partitions of the
        months its writes reached that were not made: contract §12). A write run at the
        driver alone (a facade's, see :meth:`~mnestoma.schema.runner.DriverRunner.ready`) is
        committed there, if its last statement did not commit it already."""
        with translate_errors():
            self.connection.commit()
        end_at_driver(self.connection, commit=True)
        upkeep_after_commit(self.connection)

    def rollback(self) -> None:
        """Throw away the work done since the last commit (the package's errors, as
        :meth:`UnitOfWork.rollback`), a write run at the driver alone included."""
        if self.connection.in_transaction():
            with translate_errors():
                self.connection.rollback()
        end_at_driver(self.connection, commit=False)

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if isinstance(self._bind, Engine):
                self.connection.close()


def written(
    bind: Engine | Connection,
    work: Callable[[ConnectionUnitOfWork], T],
    *,
    settings: Settings | None = None,
    after_commit: Callable[[Connection], object] | None = None,
    kept: KeptConnection | None = None,
) -> T:
    """Run ``work`` in a connection unit of work of its own on ``bind`` and commit it, as
    one write transaction; transient failures retried (:func:`with_retries`).
    ``after_commit(connection)`` runs after the commit, on the same connection. With
    ``kept``, on its connection when it is free (:class:`KeptConnection`)."""

    def run(unit: ConnectionUnitOfWork) -> T:
        result = work(unit)
        unit.commit()
        if after_commit is not None:  # must not raise: the write is committed
            after_commit(unit.connection)
        return result

    def in_unit(on: Engine | Connection) -> T:
        with ConnectionUnitOfWork(on, settings=settings) as unit:
            result = run(_facade_unit(unit))
        return built(result)  # a snapshot is built outside the write lock

    def once() -> T:
        conn = None if kept is None else kept.take()
        if kept is None or conn is None:
            return in_unit(bind)
        try:
            # the kept connection's unit, built once for it (as the one above, entered)
            unit = kept.unit(conn, settings, _kept_unit)
            try:
                result = run(unit)
            except BaseException as err:
                ended(unit.rollback, err)  # what leaving the unit's block would do
                raise
            if unit.connection.in_transaction():  # what after_commit read: ended, as on exit
                ended(unit.rollback, None)
        except BaseException:
            kept.put_back(conn, failed=True)
            raise
        kept.put_back(conn, failed=False)
        return built(result)

    return with_retries(once)


def _facade_unit(unit: ConnectionUnitOfWork) -> ConnectionUnitOfWork:
    """``unit`` as a facade's write uses it: its writes leave their snapshots to be built
    after the commit, and their last statement commits (the transaction is the call's own)."""
    unit.mnests._build_results_after_commit()
    unit.mnests._commit_with_last_statement()
    return unit


def _kept_unit(conn: Connection, settings: Settings | None) -> ConnectionUnitOfWork:
    """A facade's unit on its kept connection, entered (a unit given a Connection leaves it
    open on exit, and holds nothing of one call for the next): :meth:`KeptConnection.unit`
    keeps it while it keeps the connection. Building a unit and its two repositories at
    every write cost about 7 µs of a passing's 105 (interleaved blocks, one process)."""
    return _facade_unit(ConnectionUnitOfWork(conn, settings=settings).__enter__())


if TYPE_CHECKING:  # each unit is a Unit of the sync repositories
    _units: tuple[type[Unit[MnestRepository, CanonicalQueryRepository]], ...] = (
        UnitOfWork,
        JoinedUnitOfWork,
        ConnectionUnitOfWork,
    )
