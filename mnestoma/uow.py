"""The unit of work: owns one transaction; repositories work inside it."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Self

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from .errors import InvalidInput, translate_errors
from .locking import take_write_lock
from .repository import CanonicalQueryRepository, MnestRepository
from .validation import Clock

__all__ = ["JoinedUnitOfWork", "UnitOfWork"]


class UnitOfWork:
    """Opens a session on enter; commits only when asked; rolls back otherwise; always closes.

    >>> with UnitOfWork(session_factory) as uow:
    ...     uow.mnests.record_passing("search", "1", "read", "2")
    ...     uow.commit()
    """

    mnests: MnestRepository
    queries: CanonicalQueryRepository
    session: Session

    def __init__(
        self,
        session_factory: sessionmaker[Session] | Callable[[], Session],
        *,
        clock: Clock | None = None,
    ):
        if isinstance(session_factory, Engine | Connection | Session) or not callable(
            session_factory
        ):
            given = type(session_factory).__name__
            if isinstance(session_factory, Session):
                given += "; UnitOfWork.joining(session) works in a session"
            raise InvalidInput(
                f"UnitOfWork needs a session factory (make_session_factory(engine)), got {given}"
            )
        self._factory = session_factory
        self._clock = clock

    def __enter__(self) -> Self:
        session = self._factory()
        if not isinstance(session, Session):
            raise InvalidInput(
                f"the session factory of a UnitOfWork returned {type(session).__name__}, "
                "not a Session"
            )
        self.session = session
        self.mnests = MnestRepository(self.session, clock=self._clock)
        self.queries = CanonicalQueryRepository(self.session, clock=self._clock)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.session.rollback()
        finally:
            self.session.close()

    def commit(self) -> None:
        """Commit the work done so far; a later operation starts a new transaction."""
        with translate_errors():
            self.session.commit()

    def rollback(self) -> None:
        """Throw away the work done since the last commit."""
        self.session.rollback()

    @classmethod
    def joining(cls, session: Session, *, clock: Clock | None = None) -> JoinedUnitOfWork:
        """A unit of work inside a session (and transaction) that the caller owns."""
        return JoinedUnitOfWork(session, clock=clock)


class JoinedUnitOfWork:
    """Works in a SAVEPOINT of a caller's session; never commits or closes that session.

    The savepoint is taken before the unit's first write (after the write lock on SQLite),
    so a unit that only reads takes no lock and never waits for a writer. ``commit()``
    releases the savepoint: the work becomes part of the caller's transaction, which the
    caller commits or rolls back. Leaving without ``commit()``, or by an exception, rolls
    back to the savepoint and leaves the caller's own work untouched.
    """

    mnests: MnestRepository
    queries: CanonicalQueryRepository

    def __init__(self, session: Session, *, clock: Clock | None = None):
        if not isinstance(session, Session):
            raise InvalidInput(
                f"UnitOfWork.joining needs a SQLAlchemy Session, got {type(session).__name__}"
            )
        self.session = session
        self._clock = clock
        self._savepoint: SessionTransaction | None = None

    def __enter__(self) -> Self:
        self.mnests = MnestRepository(
            self.session, clock=self._clock, before_write=self._open_savepoint
        )
        self.queries = CanonicalQueryRepository(
            self.session, clock=self._clock, before_write=self._open_savepoint
        )
        return self

    def _open_savepoint(self) -> None:
        """Before a write: the write lock for the caller's transaction, then the savepoint."""
        if self._savepoint is not None and self._savepoint.is_active:
            return
        with translate_errors():
            take_write_lock(self.session.connection())
            self._savepoint = self.session.begin_nested()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.rollback()

    def commit(self) -> None:
        """Release the savepoint into the caller's transaction (nothing to do after reads)."""
        if self._savepoint is not None and self._savepoint.is_active:
            with translate_errors():
                self._savepoint.commit()
        self._savepoint = None

    def rollback(self) -> None:
        """Roll back to the savepoint taken before the first write."""
        if self._savepoint is not None and self._savepoint.is_active:
            self._savepoint.rollback()
        self._savepoint = None
