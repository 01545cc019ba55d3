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

from sqlalchemy import Select, TextClause, bindparam, func, select, table, text

from mnestoma.core.rules import PASSING, EventKind, Outcome
from mnestoma.schema.sql.tables import AGER_PROGRESS as P
from mnestoma.schema.sql.tables import AGER_RUNS as R
from mnestoma.schema.sql.tables import CHAINS as C
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import QUERIES as Q

__all__ = [
    "AGER_PROGRESS_ROWS",
    "AGER_RUN_COUNTS",
    "CHAIN_COUNT",
    "COLUMN_SHARES",
    "EVENTS_BY_KIND",
    "EVENTS_KEPT_FROM",
    "EVENT_ID_RANGE",
    "LAST_AGER_RUN",
    "MNESTS_BY_STATE",
    "OLDEST_EVENT",
    "PASSINGS",
    "PASSINGS_BY_RECORDER",
    "PASSINGS_BY_RECORDER_WITH_OUTCOMES",
    "QUERY_LOG_COUNT",
    "RECENT_PASSINGS_BY_RECORDER",
    "SAMPLED_KINDS",
    "TABLE_LEAVES",
    "leaf_count",
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
# The planner's chains (revision 0014 on).
CHAIN_COUNT: Final[Select[int]] = select(func.count()).select_from(C)

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


# --- estimates (PostgreSQL, contract §12): the catalogue's, never a scan of ``events`` -------

# The relations that hold a table's rows: the table itself, or (partitioned) its leaf
# partitions, with the planner's estimate of their rows (-1: never analysed).
TABLE_LEAVES: Final[TextClause] = text(
    "WITH RECURSIVE tree(oid) AS ("
    " SELECT to_regclass(:table)::oid"
    " UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)"
    " SELECT n.nspname, c.relname, c.reltuples::float8 FROM tree"
    " JOIN pg_class c ON c.oid = tree.oid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.relkind = 'r'"
)

# The analysed values of some columns of those relations: the most common values and their
# shares (each relation's own statistics, not those of an inheritance tree).
COLUMN_SHARES: Final[TextClause] = text(
    "SELECT schemaname, tablename, attname, null_frac::float8,"
    " most_common_vals::text::text[], most_common_freqs::float8[]"
    " FROM pg_stats WHERE schemaname = ANY(:schemas) AND tablename = ANY(:tables)"
    " AND attname = ANY(:columns) AND NOT inherited"
)


def leaf_count(schema: str, name: str) -> Select[int]:
    """The exact rows of one relation (a leaf never analysed: a young, small one)."""
    return select(func.count()).select_from(table(name, schema=schema))


# The newest events by id (``:n`` of them), per recorder: the passings, the last, those with
# a turn and the last of those, those with each outcome. The shares among passings that the
# estimated status applies to the catalogue's count of passings.
_recent = (
    select(E.c.recorder, E.c.kind, E.c.ts, E.c.turn_id, E.c.outcome)
    .order_by(E.c.id.desc())
    .limit(bindparam("n"))
    .subquery("recent")
)
_recent_passing = _recent.c.kind.in_(PASSING)
_recent_turn = _recent_passing & _recent.c.turn_id.is_not(None)
RECENT_PASSINGS_BY_RECORDER: Final[
    Select[str, int, datetime | None, int, datetime | None, int, int]
] = select(
    _recent.c.recorder,
    func.count().filter(_recent_passing),
    func.max(_recent.c.ts).filter(_recent_passing),
    func.count().filter(_recent_turn),
    func.max(_recent.c.ts).filter(_recent_turn),
    func.count().filter(_recent_passing & (_recent.c.outcome == Outcome.OK.value)),
    func.count().filter(_recent_passing & (_recent.c.outcome == Outcome.ERROR.value)),
).group_by(_recent.c.recorder)

# The oldest event by id (the first kept), without reading the others.
OLDEST_EVENT: Final[Select[datetime]] = select(E.c.ts).order_by(E.c.id).limit(1)


# --- estimates (SQLite): a sample of the ids, never a scan of ``events`` ----------------------

# The lowest and the highest event id, each from one end of the primary key.
EVENT_ID_RANGE: Final[Select[int | None, int | None]] = select(
    select(func.min(E.c.id)).scalar_subquery(), select(func.max(E.c.id)).scalar_subquery()
)

# ``:n`` ids drawn at random in ``[:lo, :lo + :span)``, looked up one by one: the events found,
# per kind. Each id exists with the density of the events over the range (prunes leave
# gaps), so ``span × found / n`` estimates the events and the kinds' shares are those of a
# uniform sample of them.
SAMPLED_KINDS: Final[TextClause] = text(
    "WITH RECURSIVE probe(k, id) AS ("
    " SELECT 1, :lo + abs(random() % :span)"
    " UNION ALL SELECT k + 1, :lo + abs(random() % :span) FROM probe WHERE k < :n)"
    " SELECT e.kind, count(*) FROM probe JOIN events e ON e.id = probe.id GROUP BY e.kind"
)
