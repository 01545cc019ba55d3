"""The statements ``mnestoma status`` runs, built once: counts per state and kind, the
passings (with and without a turn) in one scan, the recorders, and the ager's runs.

Except :data:`PASSINGS_BY_RECORDER` (revision 0003 on),
:data:`PASSINGS_BY_RECORDER_WITH_OUTCOMES` (revision 0008 on) and the ager's statements
(once ``ager_runs`` exists), they read only columns that every known revision has, so that a
store behind head is described too.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import Select, bindparam, func, select

from ..rules import PASSING, EventKind, Outcome
from .tables import AGER_PROGRESS as P
from .tables import AGER_RUNS as R
from .tables import EVENTS as E
from .tables import MNESTS as M
from .tables import QUERIES as Q

__all__ = [
    "AGER_PROGRESS_ROWS",
    "AGER_RUN_COUNTS",
    "EVENTS_BY_KIND",
    "EVENTS_KEPT_FROM",
    "LAST_AGER_RUN",
    "MNESTS_BY_STATE",
    "PASSINGS",
    "PASSINGS_BY_RECORDER",
    "PASSINGS_BY_RECORDER_WITH_OUTCOMES",
    "QUERY_LOG_COUNT",
]

_passing = E.c.kind.in_(PASSING)
_with_turn = E.c.turn_id.is_not(None)

MNESTS_BY_STATE: Final[Select[str, int]] = select(M.c.state, func.count()).group_by(M.c.state)
EVENTS_BY_KIND: Final[Select[str, int]] = select(E.c.kind, func.count()).group_by(E.c.kind)

# What the status says of the passing events, read in one scan of them: how many, the
# last, how many with a turn_id, the last of those.
_passings = (
    func.count(),
    func.max(E.c.ts),
    func.count().filter(_with_turn),
    func.max(E.c.ts).filter(_with_turn),
)
PASSINGS: Final[Select[int, datetime | None, int, datetime | None]] = (
    select(*_passings).select_from(E).where(_passing)
)

# From when events are kept: the oldest event other than a ``created`` one (a prune deletes
# every such event before its cutoff, and keeps the created event of each live row), and
# the oldest event of all.
EVENTS_KEPT_FROM: Final[Select[datetime | None, datetime | None]] = select(
    func.min(E.c.ts).filter(E.c.kind != EventKind.CREATED.value), func.min(E.c.ts)
).select_from(E)

QUERY_LOG_COUNT: Final[Select[int]] = select(func.count()).select_from(Q)

# The same per ``events.recorder`` (revision 0003 on), which the totals are the sums of.
PASSINGS_BY_RECORDER: Final[Select[str, int, datetime | None, int, datetime | None]] = (
    select(E.c.recorder, *_passings).where(_passing).group_by(E.c.recorder)
)

# The same with how many of each recorder's passings carry each outcome (revision 0008 on):
# a passing without one (NULL) is counted in neither.
PASSINGS_BY_RECORDER_WITH_OUTCOMES: Final[
    Select[str, int, datetime | None, int, datetime | None, int, int]
] = (
    select(
        E.c.recorder,
        *_passings,
        func.count().filter(E.c.outcome == Outcome.OK.value),
        func.count().filter(E.c.outcome == Outcome.ERROR.value),
    )
    .where(_passing)
    .group_by(E.c.recorder)
)

# Runs of the ager in all, and those between ``:since`` and ``:at``.
AGER_RUN_COUNTS: Final[Select[int, int]] = select(
    func.count(),
    func.count().filter(
        R.c.ts >= bindparam("since", type_=R.c.ts.type),
        R.c.ts <= bindparam("at", type_=R.c.ts.type),
    ),
).select_from(R)

LAST_AGER_RUN: Final[Select[Any]] = select(R).order_by(R.c.ts.desc(), R.c.id.desc()).limit(1)
# The runs of the ager begun and not completed (revision 0007 on), oldest first.
AGER_PROGRESS_ROWS: Final[Select[Any]] = select(P).order_by(P.c.id)
