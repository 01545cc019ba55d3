"""PostgreSQL: the partitions of ``events`` for the coming months, made before a write
needs them (contract §12).

Every write, run of the ager and prune goes through :func:`ensure_partitions` with its
clock's now. Per engine it remembers the months it last made sure of; only when now leaves
them, or comes within :data:`~mnestoma.rules.EVENT_PARTITION_MARGIN` of their end, does it
call ``mnestoma_events_partitions`` (revision 0011), in the write's own transaction: that
makes the partitions of now's month and :data:`~mnestoma.rules.EVENT_PARTITIONS_AHEAD`
months after it, those missing (an instant's exclusive lock on ``events`` for each made).
A store whose ``events`` is not partitioned (SQLite, or a PostgreSQL store not yet at 0011)
is looked at again after a minute at most.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .errors import is_lock_not_available, translate_errors
from .rules import (
    EVENT_PARTITION_MARGIN,
    EVENT_PARTITIONS_AHEAD,
    PARTITION_SWAP_LOCK_TIMEOUT_S,
    PARTITION_SWAP_PAUSE_S,
    PARTITION_SWAP_TRIES,
)
from .sql import partitions as sq
from .sql.partitions import ENSURE_PARTITIONS, HAS_PARTITIONS, PARTITION_BOUNDS

__all__ = [
    "FIRST_TURN_EDGE",
    "Dropped",
    "TurnEdgeKey",
    "drop_old_partitions",
    "ensure_partitions",
    "forget_partitions",
    "month_start",
]

# Seconds before a store found without partitions is looked at again.
RECHECK_S = 60.0


@dataclass(frozen=True, slots=True)
class _Known:
    """The months an engine's store was last made sure of: [start, end); None when its
    events were not partitioned at ``checked`` (a monotonic instant)."""

    start: datetime | None
    end: datetime | None
    checked: float


_known: WeakKeyDictionary[Engine, _Known] = WeakKeyDictionary()
_lock = threading.Lock()


def month_start(at: datetime) -> datetime:
    """The first instant of ``at``'s month, in UTC."""
    u = at.astimezone(UTC)
    return datetime(u.year, u.month, 1, tzinfo=UTC)


def forget_partitions(engine: Engine | None = None) -> None:
    """Forget what was made sure of (for one engine, or all): the next write asks again."""
    with _lock:
        if engine is None:
            _known.clear()
        else:
            _known.pop(engine, None)


def ensure_partitions(conn: Connection, now: datetime) -> None:
    """Make sure the partitions of ``now``'s month and the next ones exist before a write
    at ``now`` on ``conn`` (PostgreSQL; nothing elsewhere). Cheap when they do: no
    statement unless ``now`` left the months last made sure of."""
    if conn.dialect.name != "postgresql":
        return
    engine = conn.engine
    with _lock:
        known = _known.get(engine)
    if known is not None:
        if known.end is None or known.start is None:
            if time.monotonic() - known.checked < RECHECK_S:
                return
        elif known.start <= now and now + EVENT_PARTITION_MARGIN < known.end:
            return
    with translate_errors():
        if not conn.execute(HAS_PARTITIONS).scalar_one():
            found = _Known(None, None, time.monotonic())
        else:
            end = conn.execute(
                ENSURE_PARTITIONS, {"at": now, "ahead": EVENT_PARTITIONS_AHEAD}
            ).scalar_one()
            found = _Known(month_start(now), end, time.monotonic())
    with _lock:
        _known[engine] = found


# --- retention: whole months dropped ---------------------------------------------------------


# A row of event_turn_edges in retention's order: (ts, turn_id, mnest_id).
TurnEdgeKey = tuple[datetime, str, str]
# Before every row of event_turn_edges.
FIRST_TURN_EDGE: TurnEdgeKey = (datetime(1000, 1, 1, tzinfo=UTC), "", "")


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
    if conn.dialect.name != "postgresql" or not conn.execute(HAS_PARTITIONS).scalar_one():
        return Dropped()
    whole = [(str(n), up) for n, up in conn.execute(PARTITION_BOUNDS) if up <= before]
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
