"""What every repository stands on: its session, its statement runners (a write's holds the
write lock), its clock, and results left to be built after the commit.

:class:`StoreBase` is the base of :class:`~mnestoma.MnestRepository` and of the parts it is
composed of (its commands, its queries); the functions here serve
:class:`~mnestoma.CanonicalQueryRepository` too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Executable
from sqlalchemy.orm import Session, scoped_session

from mnestoma.core.errors import InvalidInput, translate_errors
from mnestoma.core.settings import Settings
from mnestoma.core.validation import check_recorder
from mnestoma.engines.locking import take_write_lock
from mnestoma.engines.partitions import note_written, upkeep_before_write
from mnestoma.schema.runner import StatementRunner, connection_of, runner_for

__all__ = [
    "Plans",
    "StoreBase",
    "built",
    "check_session",
    "connection_of",
    "lock_for_write",
    "write_runner",
]

T = TypeVar("T")

# The statements a write will run, per dialect: looked up before it takes the write lock.
Plans = Mapping[str, Sequence[tuple[Executable, tuple[str, ...]]]]


class StoreBase:
    """A repository's session, settings and runners; :class:`~mnestoma.MnestRepository`
    sets them in its constructor (the one door that takes ``clock=`` / ``recorder=``)."""

    _session: Session | Connection
    settings: Settings
    _before_write: Callable[[], None] | None
    _after_commit: bool
    # The transaction is the operation's own, committed right after it: its last statement
    # may commit it (see _commit_with_last_statement).
    _commits_itself: bool = False

    @property
    def session(self) -> Session | Connection:
        """The session (or connection) this repository works in."""
        return self._session

    def _ex(self) -> StatementRunner:
        return runner_for(connection_of(self._session))

    def _write_ex(self, plans: Plans | None = None, *, lock: bool = True) -> StatementRunner:
        return write_runner(
            self._session, self._before_write, plans, own=self._commits_itself, lock=lock
        )

    def _now(self) -> datetime:
        return self.settings.now()

    def _write_now(self, ex: StatementRunner) -> datetime:
        """The clock's now for a write, read once per call (contract §4: a passing on
        PostgreSQL reads it before the one statement that locks its row); on PostgreSQL, a
        month whose partition is not known made is made after the commit."""
        now = self._now()
        note_written(ex.conn, now)
        return now

    def _who(self, recorder: str | None) -> str:
        """Who a call's events say recorded them: the call's ``recorder``, else the settings'."""
        return self.settings.recorder if recorder is None else check_recorder(recorder).value

    def _result(self, build: Callable[[], T]) -> T:
        """The result ``build`` makes: now, or, where the unit of work asked for it
        (:meth:`_build_results_after_commit`), once it has committed, outside the write lock
        (:func:`built`)."""
        if self._after_commit:
            return cast(T, _AfterCommit(build))
        return build()

    def _commit_with_last_statement(self) -> None:
        """Let a write whose transaction is its own (a facade's call: the unit of work
        commits right after it) send the ``COMMIT`` with its last statement, in one round
        trip where the driver can (:meth:`StatementRunner.first_committing`): its row locks
        are then held for no round trip of the client. The unit's own commit finds nothing
        left to commit."""
        self._commits_itself = True

    def _build_results_after_commit(self) -> None:
        """Have the writes that return a snapshot leave it to be built once the unit of work
        has committed (:func:`built`): building it is Python work other writers would wait
        for while the write lock is held. For a unit of work that resolves every result it
        returns; a caller of the repository gets the snapshots themselves."""
        self._after_commit = True


class _AfterCommit:
    """A result to be built once its unit of work has committed (see
    :meth:`StoreBase._build_results_after_commit`)."""

    __slots__ = ("build",)

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build


def built(result: T) -> T:
    """``result`` as the caller gets it: a result left for after the commit, built now."""
    if isinstance(result, _AfterCommit):
        return cast(T, result.build())
    return result


def check_session(session: Any, owner: str) -> Session | Connection:
    """A Session (or scoped_session) or Connection, else InvalidInput naming what was given."""
    if not isinstance(session, Session | Connection | scoped_session):
        raise InvalidInput(
            f"{owner} needs a SQLAlchemy Session or Connection, got {type(session).__name__}"
        )
    return cast(Session | Connection, session)


def write_runner(
    session: Session | Connection,
    before_write: Callable[[], None] | None,
    plans: Plans | None = None,
    *,
    own: bool = False,
    lock: bool = True,
) -> StatementRunner:
    """A statement runner on the connection, in a transaction that holds the write lock
    (SQLite) before the first statement of a write: see :mod:`mnestoma.engines.locking`. What the
    runner's first statement would do (look whether anybody observes the statements, begin
    SQLAlchemy's transaction) and finding the compiled statements of ``plans`` (per
    dialect) are done before the lock is taken: other writers queue for as long as it is
    held. ``own``: the transaction is the write's own, committed right after it (a facade's
    write: see :meth:`StatementRunner.ready`). Without ``lock``, the caller takes it with
    :func:`lock_for_write` once it has made ready what it can before."""
    upkeep_before_write(session)  # PostgreSQL: the months' partitions, before any lock (§12)
    if before_write is not None:
        before_write()
    conn = connection_of(session)
    ex = runner_for(conn)
    ex.ready(own)
    if plans is not None:
        ex.plan_all(plans.get(ex.dialect, ()))
    if lock:
        lock_for_write(ex)
    return ex


def lock_for_write(ex: StatementRunner) -> None:
    """Take the write lock for the runner's transaction (SQLite's ``BEGIN IMMEDIATE``,
    waiting for it; nothing on PostgreSQL): see :func:`write_runner`."""
    with translate_errors():
        take_write_lock(ex.conn)
    ex.lock_held()
