"""The statements of event retention (contract §10), built once: which events a prune may
delete, how many there are, the range of their ids, and the deletes (all, or one batch).

An event is prunable when it is older than ``:before`` and is not the ``created`` event of
a row still in ``mnests`` (the history of pruned or merged-away rows may go).
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Delete,
    Select,
    String,
    and_,
    bindparam,
    delete,
    func,
    literal_column,
    not_,
    select,
)

from mnestoma.core.rules import EventKind, sql_literal
from mnestoma.core.types import UTCDateTime
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNESTS as M

__all__ = [
    "COUNT_PRUNABLE",
    "DELETE_PRUNABLE",
    "DELETE_PRUNABLE_BATCH",
    "DELETE_PRUNABLE_BATCH_SINCE",
    "PRUNABLE_ID_RANGE",
    "PRUNABLE_ID_RANGE_SINCE",
]

_created = E.c.kind == literal_column(sql_literal(EventKind.CREATED), String)
# The created event of a row that exists: kept whatever its age (correlated to ``events``).
_kept = and_(_created, select(literal_column("1")).where(M.c.id == E.c.mnest_id).exists())
_prunable: ColumnElement[bool] = and_(
    E.c.ts < bindparam("before", type_=UTCDateTime()), not_(_kept)
)

# How many events a prune at ``:before`` would delete now (a dry run).
COUNT_PRUNABLE: Final[Select[Any]] = select(func.count()).select_from(E).where(_prunable)
# The lowest and highest id of those events (both NULL when there is none).
PRUNABLE_ID_RANGE: Final[Select[Any]] = select(func.min(E.c.id), func.max(E.c.id)).where(_prunable)
# Every prunable event, in one statement (a caller's own transaction).
DELETE_PRUNABLE: Final[Delete] = delete(E).where(_prunable)
# The prunable events whose ids lie in ``[:first, :last]``: one batch, whose work (and
# locks) the id range bounds, since the primary key reaches the range without a scan.
DELETE_PRUNABLE_BATCH: Final[Delete] = delete(E).where(
    E.c.id.between(bindparam("first", type_=E.c.id.type), bindparam("last", type_=E.c.id.type)),
    _prunable,
)
# Both from ``:since`` on: after retention dropped whole months, what lies before their
# end is what it kept, which the batches need not read again.
_since = E.c.ts >= bindparam("since", type_=UTCDateTime())
PRUNABLE_ID_RANGE_SINCE: Final[Select[Any]] = PRUNABLE_ID_RANGE.where(_since)
DELETE_PRUNABLE_BATCH_SINCE: Final[Delete] = DELETE_PRUNABLE_BATCH.where(_since)
