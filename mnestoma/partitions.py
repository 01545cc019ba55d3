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

from .errors import translate_errors
from .rules import EVENT_PARTITION_MARGIN, EVENT_PARTITIONS_AHEAD
from .sql.partitions import ENSURE_PARTITIONS, HAS_PARTITIONS

__all__ = ["ensure_partitions", "forget_partitions", "month_start"]

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
