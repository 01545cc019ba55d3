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
  moves them into its partition under its lock. Making a month reads the default partition
  whole under that lock, so none is made while it is larger than
  :data:`~mnestoma.rules.PARTITION_DEFAULT_MAX_MIB` (revision 0016): its rows wait for
  ``split-history``, it is said once, and the months are asked for again after
  :data:`~mnestoma.rules.PARTITION_WAITING_RECHECK_S`. No writer waits while millions of
  rows are read.

Making a month is ``mnestoma_events_partitions`` (revision 0011; since 0015 each month it
makes is partitioned by kind, ``mnestoma_events_month``): an instant's exclusive lock on
``events`` per month made, waited for
:data:`~mnestoma.rules.PARTITION_UPKEEP_LOCK_TIMEOUT_S` at most; when that runs out it is
tried again :data:`~mnestoma.rules.PARTITION_UPKEEP_RETRY_S` later, and the write goes on.
No month past the last the store holds (:data:`~mnestoma.core.types.INSTANTS_END`) is made.
A store whose ``events`` is not partitioned (a PostgreSQL store not yet at 0011) is looked
at again after :data:`~mnestoma.rules.PARTITIONS_RECHECK_S`; SQLite has nothing of this.

Retention drops whole months (:func:`drop_old_partitions`): a month in 0015's form without
reading a row of it, a plain one (made before 0015, or by pg_partman) by copying what it
keeps; every lock it takes waited for briefly and tried again (:func:`under_short_locks`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from mnestoma.core.clock import utc_now
from mnestoma.core.errors import (
    ConflictError,
    MnestomaError,
    is_lock_not_available,
    translate_errors,
)
from mnestoma.core.rules import (
    EVENT_PARTITION_MARGIN,
    EVENT_PARTITIONS_AHEAD,
    PARTITION_DEFAULT_MAX_MIB,
    PARTITION_UPKEEP_LOCK_TIMEOUT_S,
    PARTITION_UPKEEP_RETRY_S,
    PARTITION_WAITING_RECHECK_S,
    PARTITIONS_RECHECK_S,
    RETENTION_LOCK_PAUSE_MAX_S,
    RETENTION_LOCK_PAUSE_S,
    RETENTION_LOCK_TIMEOUT_S,
    RETENTION_LOCK_TRIES,
)
from mnestoma.core.types import INSTANTS_END
from mnestoma.engines.backend import BY_NAME, backend_of
from mnestoma.engines.partman import knows_partman_months, makes_months
from mnestoma.schema.sql import partitions as sq
from mnestoma.schema.sql.partitions import ENSURE_PARTITIONS, HAS_PARTITIONS

__all__ = [
    "FIRST_TURN_EDGE",
    "Dropped",
    "TurnEdgeKey",
    "drop_old_partitions",
    "forget_partitions",
    "month_start",
    "months_dropped_whole",
    "months_made_ahead",
    "note_written",
    "under_short_locks",
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
    made, the months written at that are not known made, when a failed try may be made
    again (monotonic), and the months not made while the default partition was too large
    to read under a lock (their rows wait for split-history), each with when to ask again
    (monotonic)."""

    partitioned: bool | None = None
    checked: float = 0.0
    made: list[tuple[datetime, datetime]] = field(default_factory=list)
    pending: set[datetime] = field(default_factory=set)
    retry_after: float = 0.0
    left: dict[datetime, float] = field(default_factory=dict)

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
        months = {m for m in months if state.left.get(m, 0.0) <= clock}
        if not months and state.partitioned is not None:
            return None
        return sorted(months)


def _months_after(month: datetime, n: int) -> datetime:
    """The first instant of the month ``n`` months after ``month`` (a first of a month),
    INSTANTS_END at most."""
    index = month.year * 12 + month.month - 1 + n
    if index > _LAST_MONTH:
        return INSTANTS_END
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def _run(conn: Connection, months: list[datetime]) -> None:
    """Make ``months`` (and those ahead of each) on ``conn``, in a transaction of its own."""
    engine = conn.engine
    with _lock:
        known = _of(engine).partitioned
    made: list[tuple[datetime, datetime]] = []
    left: list[datetime] = []
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
                    if end > month:
                        made.append((month, end))
                    if end < _months_after(month, ahead + 1):
                        left.append(max(end, month))  # its rows wait in the default
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
        first_seen = [m for m in left if m not in state.left]  # said once per engine
        for month in left:
            state.left[month] = time.monotonic() + PARTITION_WAITING_RECHECK_S
    if first_seen:
        logger.warning(
            "the partition of events for %s is not made: the default partition is larger "
            "than %d MiB (or a split of it is under way), and making a month reads it under "
            "an exclusive lock on events; the month's writes go to the default partition "
            "meanwhile, and `mnestoma split-history` moves its rows into their months online",
            ", ".join(f"{m:%Y-%m}" for m in first_seen),
            PARTITION_DEFAULT_MAX_MIB,
        )


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

T = TypeVar("T")


def under_short_locks(
    conn: Connection,
    work: Callable[[], T],
    what: str,
    *,
    timeout_s: float | None = None,
    tries: int | None = None,
) -> T:
    """``work()`` on ``conn``, in its transaction, with every lock it takes waited for
    ``timeout_s`` (:data:`~mnestoma.rules.RETENTION_LOCK_TIMEOUT_S`) at most: a try whose
    lock was busy is rolled back (a savepoint) and made again after a short pause, up to
    ``tries`` (:data:`~mnestoma.rules.RETENTION_LOCK_TRIES`) times, so that writers queue
    behind it for one try at most; the transaction's lock timeout as it was after.
    ConflictError (naming ``what``) once the tries are spent: nothing ``work`` did is left."""
    waited = str(conn.execute(sq.CURRENT_LOCK_TIMEOUT).scalar_one())
    timeout_s = RETENTION_LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    tries = RETENTION_LOCK_TRIES if tries is None else tries
    short = f"{max(1, round(timeout_s * 1000))}ms"
    attempt = 0
    while True:
        savepoint = conn.begin_nested()
        try:
            conn.execute(sq.LOCAL_LOCK_TIMEOUT, {"t": short})
            result = work()
        except DBAPIError as err:
            savepoint.rollback()
            if not is_lock_not_available(err):
                raise
            attempt += 1
            if attempt >= tries:
                raise ConflictError(
                    f"{what}: a lock stayed busy through {attempt} tries of {short};"
                    " nothing of it was done, run it again"
                ) from err
            time.sleep(min(RETENTION_LOCK_PAUSE_S * attempt, RETENTION_LOCK_PAUSE_MAX_S))
            continue
        savepoint.commit()
        conn.execute(sq.LOCAL_LOCK_TIMEOUT, {"t": waited})
        return result


@dataclass(frozen=True, slots=True)
class Dropped:
    """What dropping the partitions before a prune's cutoff did: how many events went with
    them (``estimated``: the months in 0015's form counted from the catalogue), the tables
    detached (to drop once the swap is committed), the instant every event before which
    lay in them (None when no partition was whole before the cutoff), and the partition of
    everything before it when it is in 0015's form (``kept``: its rows not kept are deleted
    after, :func:`delete_not_kept`)."""

    deleted: int = 0
    detached: tuple[str, ...] = ()
    end: datetime | None = None
    kept: str | None = None
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class _Part:
    """A partition of events wholly before a cutoff: its name, range (``lower`` None for
    MINVALUE) and form (see :data:`mnestoma.schema.sql.partitions.WHOLE_PARTITIONS`)."""

    name: str
    lower: datetime | None
    upper: datetime
    form: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a prune drops: the partitions that take the copying path (the plain ones, made
    before 0015 or by pg_partman, and every one up to the end of the last of them), then
    the months in 0015's form after them, and the partition in 0015's form of everything
    before (when it is not among the first)."""

    legacy: tuple[_Part, ...] = ()
    months: tuple[_Part, ...] = ()
    kept: _Part | None = None


def _plan(conn: Connection, before: datetime) -> _Plan:
    """The partitions of events wholly before ``before``, sorted into a :class:`_Plan`
    (the catalogue only)."""
    if not backend_of(conn).partitioned or not conn.execute(HAS_PARTITIONS).scalar_one():
        return _Plan()
    whole = [
        _Part(str(name), lower, upper, str(form))
        for name, lower, upper, form in conn.execute(sq.WHOLE_PARTITIONS, {"before": before})
    ]
    legacy_end = max((p.upper for p in whole if p.form == sq.LEGACY_FORM), default=None)
    legacy = tuple(p for p in whole if legacy_end is not None and p.upper <= legacy_end)
    rest = [p for p in whole if p not in legacy]
    kept = next((p for p in rest if p.form == sq.KEPT_FORM), None)
    return _Plan(legacy, tuple(p for p in rest if p.form == sq.MONTH_FORM), kept)


def months_dropped_whole(conn: Connection, before: datetime) -> int:
    """How many months in 0015's form a prune at ``before`` would drop whole, counting
    their events from the catalogue (a read of the catalogue; 0 off PostgreSQL)."""
    return len(_plan(conn, before).months)


def drop_old_partitions(conn: Connection, before: datetime) -> Dropped:
    """Detach every partition of ``events`` whose months all lie before ``before``, in
    ``conn``'s transaction (its caller commits, then drops the tables detached).

    Months in 0015's form are never read (:func:`_drop_months`): a swap of catalogue changes
    keeps their ``_created`` leaves under the partition of everything before, and their
    ``_rest`` leaves go with the tables dropped, their rows counted from the catalogue.
    The plain partitions (made before 0015, or pg_partman's months) and everything up to
    the last of them take the path that reads them (:func:`_drop_legacy`)."""
    plan = _plan(conn, before)
    dropped = Dropped()
    if plan.legacy:
        dropped = _drop_legacy(conn, plan.legacy, nested=bool(plan.months))
    if plan.months:
        return _drop_months(conn, plan, dropped)
    if plan.kept is not None:
        return Dropped(end=plan.kept.upper, kept=plan.kept.name)
    return dropped


def _drop_legacy(conn: Connection, parts: tuple[_Part, ...], *, nested: bool) -> Dropped:
    """The copying path, for the plain partitions (made before 0015, or pg_partman's
    months) and any partition before the last of them.

    Writes into those partitions are held off (``SHARE``) while the ``created`` events of
    the mnests still stored are copied from them, and from the default partition's rows
    before their end, into a new table beside ``events``, checked and indexed there; then,
    in one swap of catalogue changes, the old partitions detached, the new table attached
    as ``events_to_<end>`` (every ts before ``end``; its CHECK spares the scan, and is kept
    when the table will be nested under months in 0015's form: ``nested``). Every lock is
    taken by :func:`under_short_locks`: writers of the current months wait for one try at
    most."""
    names = [p.name for p in parts]
    end = max(p.upper for p in parts)
    final = f"events_to_{end.astimezone(UTC):%Y%m}"
    keep = f"events_keep_{end.astimezone(UTC):%Y%m}"

    def hold() -> None:
        for statement in sq.LOCK_READ:
            conn.execute(statement)
        for name in [*names, sq.DEFAULT_PARTITION]:
            conn.execute(sq.lock_old(name))

    under_short_locks(conn, hold, "the partitions retention drops")
    conn.execute(sq.drop_table(keep))
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

    def swap() -> None:
        conn.execute(sq.LOCK_EVENTS)
        for name, gone in zip(names, detached, strict=True):
            conn.execute(sq.detach(name))
            if gone != name:
                conn.execute(sq.rename(name, gone))
        conn.execute(sq.DELETE_DEFAULT_BEFORE_END, {"end": end})
        conn.execute(sq.rename(keep, final))
        conn.execute(sq.attach_keep(final, end))
        if not nested:
            conn.execute(sq.drop_bound(final, keep))

    under_short_locks(conn, swap, "the swap of the partitions retention drops")
    conn.execute(sq.turn_edges_of(final))  # those of the default's rows kept
    return Dropped(total - kept, tuple(detached), end)


def _drop_months(conn: Connection, plan: _Plan, prior: Dropped) -> Dropped:
    """The months in 0015's form of ``plan`` dropped without a row of theirs read.

    Their events are counted from the catalogue (``reltuples`` of the ``_rest`` leaves).
    Then one swap of catalogue changes under :func:`under_short_locks`: ``events`` locked;
    each month detached, its ``_created`` leaf detached from it and the month renamed
    ``<month>_dropped`` (dropped once the swap is committed, its ``_rest`` leaf with it);
    the partition of everything before detached (or, after :func:`_drop_legacy`, the plain
    table it made nested under a new one; or a new one made, empty, with its default leaf);
    each ``_created`` leaf attached to it for its month (its CHECK spares the scan); the
    default partition's rows before the end moved into it (the ``created`` events of the
    mnests still stored) or deleted; it renamed ``events_to_<end>`` and attached to
    ``events`` for every ts before the end. The rows it holds that are not kept (the
    ``created`` events of mnests gone since) are deleted after, in a step of their own."""
    months = plan.months
    end = max(p.upper for p in months)
    final = f"events_to_{end.astimezone(UTC):%Y%m}"
    rests = [f"{p.name}_rest" for p in months]
    estimate = float(conn.execute(sq.ESTIMATED_ROWS, {"tables": rests}).scalar_one())
    plain = prior.end  # the end of the plain table _drop_legacy attached, if it ran
    plain_name = None if plain is None else f"events_to_{plain.astimezone(UTC):%Y%m}"

    def swap() -> int:
        conn.execute(sq.LOCK_EVENTS)
        for p in months:
            conn.execute(sq.detach(p.name))
            conn.execute(sq.detach_from(p.name, f"{p.name}_created"))
            conn.execute(sq.rename(p.name, f"{p.name}_dropped"))
        if plan.kept is not None:
            conn.execute(sq.detach(plan.kept.name))
            conn.execute(sq.rename(plan.kept.name, final))
            conn.execute(sq.rename(f"{plan.kept.name}_default", f"{final}_default"))
        else:
            for statement in sq.create_kept(final):
                conn.execute(statement)
            if plain is not None and plain_name is not None:
                conn.execute(sq.detach(plain_name))
                conn.execute(sq.attach_range(final, plain_name, None, plain))
        for p in months:
            conn.execute(sq.attach_range(final, f"{p.name}_created", p.lower, p.upper))
        gone = int(conn.execute(sq.move_default_kept(final), {"end": end}).scalar_one())
        conn.execute(sq.attach_keep(final, end))
        return gone

    gone = under_short_locks(conn, swap, "the swap of the months retention drops")
    conn.execute(sq.turn_edges_of(f"{final}_default"))  # those of the default's rows kept
    return Dropped(
        prior.deleted + gone + round(estimate),
        (*prior.detached, *(f"{p.name}_dropped" for p in months)),
        end,
        final,
        estimated=True,
    )
