"""PostgreSQL: the partitions of ``events`` for the coming months, made before a write
needs them (contract §12).

Partitions are made in short transactions of their own, never inside a write: a write's
locks are never held while ``events`` is locked to attach one, and a turn's lock order is
the same as on a store whose events are one table.

- Before a write takes its locks (:func:`upkeep_before_write`), on a connection that is in
  no transaction (or one of the engine's own when the caller's session is in none): the
  partitions of the current month (the system's time) and of
  :data:`~mnestoma.rules.EVENT_PARTITIONS_AHEAD` months after it. Per engine the months
  made are remembered: nothing is run unless the time comes within
  :data:`~mnestoma.rules.EVENT_PARTITION_MARGIN` of their end.
- A write notes the clock's now it writes at (:func:`note_written`, no statement): a month
  not known made is made right after the write's commit (:func:`upkeep_after_commit`), or
  before the next write. Meanwhile the default partition holds its rows; making the month
  moves them into its partition.

Making a month is ``mnestoma_events_partitions`` (revision 0011): an instant's exclusive
lock on ``events`` per month made, waited for
:data:`~mnestoma.rules.PARTITION_UPKEEP_LOCK_TIMEOUT_S` at most; when that runs out it is
tried again :data:`~mnestoma.rules.PARTITION_UPKEEP_RETRY_S` later, and the write goes on.
No month past the last the store holds (:data:`~mnestoma.core.types.INSTANTS_END`) is made.
A store whose ``events`` is not partitioned (a PostgreSQL store not yet at 0011) is looked
at again after :data:`~mnestoma.rules.PARTITIONS_RECHECK_S`; SQLite has nothing of this.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from mnestoma.core.clock import utc_now
from mnestoma.core.errors import MnestomaError, is_lock_not_available, translate_errors
from mnestoma.core.rules import (
    EVENT_PARTITION_MARGIN,
    EVENT_PARTITIONS_AHEAD,
    PARTITION_SWAP_LOCK_TIMEOUT_S,
    PARTITION_SWAP_PAUSE_S,
    PARTITION_SWAP_TRIES,
    PARTITION_UPKEEP_LOCK_TIMEOUT_S,
    PARTITION_UPKEEP_RETRY_S,
    PARTITIONS_RECHECK_S,
)
from mnestoma.core.types import INSTANTS_END
from mnestoma.engines.backend import BY_NAME, backend_of
from mnestoma.engines.partman import knows_partman_months, makes_months
from mnestoma.schema.sql import partitions as sq
from mnestoma.schema.sql.partitions import ENSURE_PARTITIONS, HAS_PARTITIONS, PARTITION_BOUNDS

__all__ = [
    "FIRST_TURN_EDGE",
    "Dropped",
    "TurnEdgeKey",
    "drop_old_partitions",
    "forget_partitions",
    "month_start",
    "months_made_ahead",
    "note_written",
    "upkeep",
    "upkeep_after_commit",
    "upkeep_before_write",
    "upkeep_due_after_commit",
]

logger = logging.getLogger("mnestoma.partitions")  # the logger's public name

# The ranges of months remembered per engine (the oldest forgotten first).
_RANGES_KEPT = 16
_LAST_MONTH = INSTANTS_END.year * 12 + INSTANTS_END.month - 1


@dataclass(slots=True)
class _Upkeep:
    """What is known of one engine's store: whether its events are partitioned (None: not
    looked at yet; ``checked``: when, monotonic), the ranges [start, end) of months known
    made, the months written at that are not known made, and when a failed try may be
    made again (monotonic)."""

    partitioned: bool | None = None
    checked: float = 0.0
    made: list[tuple[datetime, datetime]] = field(default_factory=list)
    pending: set[datetime] = field(default_factory=set)
    retry_after: float = 0.0

    def covers(self, at: datetime) -> bool:
        """True when ``at``'s month is made and the end of the months made is not within
        the margin of ``at`` (or is the end of what the store holds)."""
        return any(
            start <= at and (end >= INSTANTS_END or at < end - EVENT_PARTITION_MARGIN)
            for start, end in self.made
        )


_state: WeakKeyDictionary[Engine, _Upkeep] = WeakKeyDictionary()
_lock = threading.Lock()


def month_start(at: datetime) -> datetime:
    """The first instant of ``at``'s month, in UTC."""
    u = at.astimezone(UTC)
    return datetime(u.year, u.month, 1, tzinfo=UTC)


def months_made_ahead(month: datetime) -> int:
    """How many months after ``month`` are made with it: :data:`EVENT_PARTITIONS_AHEAD`,
    fewer where they would pass the last month the store holds."""
    return max(0, min(EVENT_PARTITIONS_AHEAD, _LAST_MONTH - (month.year * 12 + month.month - 1)))


def forget_partitions(engine: Engine | None = None) -> None:
    """Forget what was made sure of (for one engine, or all): the next write asks again."""
    with _lock:
        if engine is None:
            _state.clear()
        else:
            _state.pop(engine, None)


def _of(engine: Engine) -> _Upkeep:
    """The engine's state (the caller holds ``_lock``)."""
    state = _state.get(engine)
    if state is None:
        state = _state[engine] = _Upkeep()
    return state


def note_written(conn: Connection, at: datetime) -> None:
    """A write on ``conn`` writes events at ``at`` (its clock's now): when ``at``'s month
    is not known made, it is made after the commit. No statement; nothing off PostgreSQL."""
    if not BY_NAME[conn.dialect.name].partitioned:  # on every write: no call
        return
    with _lock:
        state = _of(conn.engine)
        if state.partitioned is not False and not state.covers(at):
            state.pending.add(month_start(at))


def _due(engine: Engine, now: datetime | None) -> list[datetime] | None:
    """The months to make on ``engine`` (with ``now``: the system's time's too), an empty
    list when only whether its events are partitioned must be looked at; None: nothing."""
    with _lock:
        state = _of(engine)
        clock = time.monotonic()
        if clock < state.retry_after:
            return None
        if state.partitioned is False:
            return [] if clock - state.checked >= PARTITIONS_RECHECK_S else None
        months = set(state.pending)
        if now is not None and not state.covers(now):
            months.add(month_start(now))
        if not months and state.partitioned is not None:
            return None
        return sorted(months)


def _run(conn: Connection, months: list[datetime]) -> None:
    """Make ``months`` (and those ahead of each) on ``conn``, in a transaction of its own."""
    engine = conn.engine
    with _lock:
        known = _of(engine).partitioned
    made: list[tuple[datetime, datetime]] = []
    try:
        with translate_errors():
            transaction = conn.begin()
            try:
                conn.execute(
                    sq.LOCAL_LOCK_TIMEOUT,
                    {"t": f"{max(1, round(PARTITION_UPKEEP_LOCK_TIMEOUT_S * 1000))}ms"},
                )
                partitioned = known or bool(conn.execute(HAS_PARTITIONS).scalar_one())
                changed = False
                for month in months if partitioned else ():
                    if any(start <= month < end for start, end in made):
                        continue
                    ahead = months_made_ahead(month)
                    params = {"at": month, "ahead": ahead, "cap": INSTANTS_END}
                    end, changed_now = conn.execute(ENSURE_PARTITIONS, params).one()
                    made.append((month, end))
                    changed = changed or bool(changed_now)
            except BaseException:
                transaction.rollback()
                raise
            # Committed only when a partition was made: a look that found every month made
            # commits nothing (a dry run stays one transaction rolled back).
            if changed:
                transaction.commit()
            else:
                transaction.rollback()
    except MnestomaError as err:
        with _lock:
            state = _of(engine)
            state.retry_after = time.monotonic() + PARTITION_UPKEEP_RETRY_S
            if not is_lock_not_available(err):
                state.partitioned = None  # looked at again (a store downgraded meanwhile?)
                raise
        logger.debug("partitions of events not made yet (a lock was busy): tried again soon")
        return
    with _lock:
        state = _of(engine)
        state.partitioned, state.checked = partitioned, time.monotonic()
        if not partitioned:
            state.made.clear()
            state.pending.clear()
            return
        state.made = [*state.made, *made][-_RANGES_KEPT:]
        state.pending = {m for m in state.pending if not state.covers(m)}


def upkeep(target: Engine | Connection, *, now: datetime | None = None) -> None:
    """Make the months due on ``target``'s store (noted by writes; with ``now``, the
    current one too): on ``target`` if it is an idle connection, else on a connection of
    its own if ``target`` is an engine; nothing on a connection in a transaction, nor off
    PostgreSQL, nor when nothing is due (no statement then)."""
    engine = target if isinstance(target, Engine) else target.engine
    if not backend_of(engine).partitioned:
        return
    months = _due(engine, now)
    if months is None or makes_months(target):  # pg_partman's premake makes the months
        return
    if isinstance(target, Connection):
        if not target.in_transaction():
            _run(target, months)
        return
    with translate_errors(), target.connect() as conn:
        _run(conn, months)


def _bind_of(session: Any) -> Engine | Connection | None:
    """What ``session`` (a Connection, or a Session in no transaction) would write through."""
    if isinstance(session, Connection):
        return session
    if session.in_transaction():
        return None
    try:
        bind = session.get_bind()
    except Exception:  # an unbound session: its first statement will say so
        return None
    return bind if isinstance(bind, Engine | Connection) else None


def upkeep_before_write(session: Any) -> None:
    """Before a write on ``session`` (a Connection or Session) takes its locks: the months
    due, the current one's among them, made where ``session`` is in no transaction yet."""
    bind = _bind_of(session)
    if bind is None or not BY_NAME[bind.dialect.name].partitioned:
        return  # before the clock is read: every SQLite write passes here
    try:
        upkeep(bind, now=utc_now())
    except MnestomaError as err:  # the write goes on: the default partition takes its rows
        logger.warning("partitions of events not made before a write, tried again later: %s", err)


def upkeep_after_commit(session: Any) -> None:
    """After a commit on ``session``: the months its writes reached that are not made yet.
    Never raises (the write is committed): a failure is logged and tried again later."""
    bind = _bind_of(session)
    if bind is None:
        return
    try:
        upkeep(bind)
    except MnestomaError as err:
        logger.warning("partitions of events not made after a commit, tried again later: %s", err)


def upkeep_due_after_commit(session: Any) -> bool:
    """Would :func:`upkeep_after_commit` on ``session`` run a statement? No statement: an
    async door asks before it enters the session's greenlet for nothing."""
    bind = _bind_of(session)
    if bind is None or not backend_of(bind).partitioned:
        return False
    engine = bind if isinstance(bind, Engine) else bind.engine
    return _due(engine, None) is not None and not knows_partman_months(engine)


# --- retention: whole months dropped ---------------------------------------------------------


# A row of event_turn_edges in retention's order: (ts, turn_id, mnest_id, occurrence).
TurnEdgeKey = tuple[datetime, str, str, int]
# Before every row of event_turn_edges.
FIRST_TURN_EDGE: TurnEdgeKey = (datetime(1000, 1, 1, tzinfo=UTC), "", "", 0)


@dataclass(frozen=True, slots=True)
class Dropped:
    """What dropping the partitions before a prune's cutoff did: how many events went with
    them, the tables detached (to drop once the swap is committed), and the instant every
    event before which lay in them (None when no partition was whole before the cutoff)."""

    deleted: int = 0
    detached: tuple[str, ...] = ()
    end: datetime | None = None


def drop_old_partitions(conn: Connection, before: datetime) -> Dropped:
    """Detach every partition of ``events`` whose months all lie before ``before``, in
    ``conn``'s transaction (its caller commits, then drops the tables detached).

    Writes into those partitions are held off (``SHARE``) while the ``created`` events of
    the mnests still stored are copied from them, and from the default partition's rows
    before their end, into a new table beside ``events``, checked and indexed there; then,
    under :data:`~mnestoma.rules.PARTITION_SWAP_LOCK_TIMEOUT_S` tried again up to
    :data:`~mnestoma.rules.PARTITION_SWAP_TRIES` times, catalogue changes only: the old
    partitions detached, the new table attached as ``events_to_<end>`` (every ts before
    ``end``; its CHECK spares the scan). Writers of the current months wait for that swap
    at most."""
    if not backend_of(conn).partitioned or not conn.execute(HAS_PARTITIONS).scalar_one():
        return Dropped()
    whole = [(str(n), up) for n, up in conn.execute(PARTITION_BOUNDS, {"before": before})]
    if not whole:
        return Dropped()
    end = max(up for _, up in whole)
    names = [n for n, _ in whole]
    final = f"events_to_{end.astimezone(UTC):%Y%m}"
    keep = f"events_keep_{end.astimezone(UTC):%Y%m}"
    conn.execute(sq.drop_table(keep))
    for name in [*names, sq.DEFAULT_PARTITION]:
        conn.execute(sq.lock_old(name))
    total = sum(int(conn.execute(sq.count_rows(n)).scalar_one()) for n in names)
    total += int(
        conn.execute(
            sq.count_rows(sq.DEFAULT_PARTITION, before_end=True), {"end": end}
        ).scalar_one()
    )
    conn.execute(sq.create_keep(keep))
    for name in names:
        conn.execute(sq.copy_kept(keep, name))
    conn.execute(sq.copy_kept(keep, sq.DEFAULT_PARTITION, before_end=True), {"end": end})
    for statement in sq.finish_keep(keep, end):
        conn.execute(statement)
    kept = int(conn.execute(sq.count_table(keep)).scalar_one())
    detached = [f"{n}_dropped" if n == final else n for n in names]
    for attempt in range(PARTITION_SWAP_TRIES):
        savepoint = conn.begin_nested()
        try:
            conn.execute(
                sq.LOCAL_LOCK_TIMEOUT,
                {"t": f"{max(1, round(PARTITION_SWAP_LOCK_TIMEOUT_S * 1000))}ms"},
            )
            conn.execute(sq.LOCK_EVENTS)
            for name, gone in zip(names, detached, strict=True):
                conn.execute(sq.detach(name))
                if gone != name:
                    conn.execute(sq.rename(name, gone))
            conn.execute(sq.DELETE_DEFAULT_BEFORE_END, {"end": end})
            conn.execute(sq.rename(keep, final))
            conn.execute(sq.attach_keep(final, end))
            conn.execute(sq.drop_bound(final, keep))
        except DBAPIError as err:
            savepoint.rollback()
            if not is_lock_not_available(err) or attempt + 1 == PARTITION_SWAP_TRIES:
                raise
            time.sleep(min(PARTITION_SWAP_PAUSE_S * (attempt + 1), 0.2))
            continue
        savepoint.commit()
        break
    conn.execute(sq.turn_edges_of(final))  # those of the default's rows kept
    return Dropped(total - kept, tuple(detached), end)
