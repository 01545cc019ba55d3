"""The operations that span several transactions (the batched ager, the batched prune of
events and the drops of whole months), written once as generators of steps for both doors.

An operation is a generator: it yields a :data:`Step` (a function to run in a transaction of
its own on a sync ``Connection``, a pause, or a run that owns its connection) and is sent the
step's result back; what it returns is the operation's result. :func:`drive` runs one with
a door's sync runner of a step, :func:`drive_async` with an async runner (the async door
runs each function through ``AsyncConnection.run_sync``). How each door runs a step (its
transactions, its retries of transient failures, its replicas, its queue of writers) is the
door's; what the steps are, in which order, with which progress, is said once, here and in
the operations' modules (:mod:`~mnestoma.maintenance.ager`,
:mod:`~mnestoma.maintenance.retention`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from mnestoma.core.errors import translate_errors
from mnestoma.engines.locking import take_write_lock
from mnestoma.engines.partitions import upkeep_before_write
from mnestoma.schema.runner import connection_of, runner_for

__all__ = ["GoOn", "OwnConnection", "Pause", "Read", "Step", "Steps", "Write"]
__all__ += ["drive", "drive_async", "for_write"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# Asked before each batch of a long run: False stops it (an async caller was cancelled).
GoOn = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class Read(Generic[T_co]):
    """``work(conn)`` in a read transaction of its own on the primary, rolled back after."""

    work: Callable[[Connection], T_co]


@dataclass(frozen=True, slots=True)
class Write(Generic[T_co]):
    """``work(conn)`` in a write transaction of its own, committed; retried when transient."""

    work: Callable[[Connection], T_co]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` (on SQLite, writers waiting for the lock take it meanwhile)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class OwnConnection(Generic[T_co]):
    """``work(conn, go_on)`` on a connection of its own that it begins and commits its own
    transactions on (the batched ager); ``go_on`` is None unless its caller may stop it."""

    work: Callable[[Connection, GoOn | None], T_co]


Step = Read[Any] | Write[Any] | Pause | OwnConnection[Any]
Steps = Generator[Step, Any, T]


@dataclass(frozen=True, slots=True)
class _Done(Generic[T_co]):
    """What an operation returned once its last step ran."""

    value: T_co


def _sent(steps: Steps[T], result: Any) -> Step | _Done[T]:
    """The next step of ``steps``, given what the last one gave; or what it returned."""
    try:
        return steps.send(result)
    except StopIteration as end:
        return _Done(end.value)


def drive(steps: Steps[T], run: Callable[[Step], Any]) -> T:
    """The result of the operation ``steps``, each of its steps run by ``run`` in turn."""
    step = _sent(steps, None)
    while not isinstance(step, _Done):
        step = _sent(steps, run(step))
    return step.value


async def drive_async(steps: Steps[T], run: Callable[[Step], Awaitable[Any]]) -> T:
    """:func:`drive`, each step awaited."""
    step = _sent(steps, None)
    while not isinstance(step, _Done):
        step = _sent(steps, await run(step))
    return step.value


def for_write(bind: Session | Connection) -> Connection:
    """The connection of ``bind``, its transaction holding the write lock (SQLite) before
    the step's first statement; on PostgreSQL the months' partitions made before any lock."""
    upkeep_before_write(bind)
    conn = connection_of(bind)
    runner_for(conn).ready()  # SQLAlchemy's transaction begun before the lock
    with translate_errors():
        take_write_lock(conn, maintenance=True)
    return conn
