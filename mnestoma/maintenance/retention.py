"""Event retention (contract §10): the prune of events, in one transaction (a repository's)
or in batches (both facades, :func:`prune_steps`), and on PostgreSQL the drops of whole
months of events before it.

The batched prune: on PostgreSQL what a stopped prune left detached dropped first, then the
whole months before the cutoff dropped (the swap one transaction, each drop another; the
rows the partition of everything before does not keep deleted in another; then the rows of
``event_turn_edges`` their passings had, in batches), then the range of ids of the events
left to delete read once, and the events in it deleted in batches of ids, each its own
short write transaction (on SQLite with a pause between them, in which waiting writers take
the lock). Each step takes the connection (or session) of the transaction its door runs it
in; on PostgreSQL every lock of the partitions' steps is waited for briefly and tried
again (:func:`mnestoma.engines.partitions.under_short_locks`).

The count a prune returns is exact, but for the months in 0015's form it drops whole: their
events are counted from the catalogue, never read (``reltuples`` of their ``_rest`` leaves),
and the count is then an estimate (:func:`months_dropped_whole` says beforehand whether a
prune will drop any).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from mnestoma.core.errors import is_insufficient_privilege, translate_errors
from mnestoma.core.rules import EVENT_PRUNE_BATCH, event_batches
from mnestoma.core.types import ensure_instant
from mnestoma.core.validation import check_dry_run, check_progress
from mnestoma.engines import partitions as parts
from mnestoma.engines.backend import backend_of
from mnestoma.engines.partitions import (
    FIRST_TURN_EDGE,
    Dropped,
    TurnEdgeKey,
    drop_old_partitions,
    under_short_locks,
)
from mnestoma.engines.partman import holds_retention
from mnestoma.maintenance.steps import Pause, Read, Steps, Write, for_write
from mnestoma.schema.runner import connection_of, runner_for
from mnestoma.schema.sql import partitions as partitions_sql
from mnestoma.schema.sql import retention as ret

__all__ = [
    "PruneProgress",
    "count_prunable",
    "delete_not_kept",
    "delete_prunable",
    "drop_detached_partition",
    "drop_event_partitions",
    "drop_leftover_partitions",
    "months_dropped_whole",
    "prunable_event_ids",
    "prune_event_batch",
    "prune_steps",
    "prune_turn_edges",
]

Bind = Session | Connection

# Called as a prune of events goes: (batches done, batches in all, events deleted so far).
PruneProgress = Callable[[int, int, int], object]


def _cutoff(before: Any) -> datetime:
    """A prune's cutoff: an aware instant the store can hold, else InvalidInput."""
    return ensure_instant(before, "before")


def count_prunable(bind: Bind, before: datetime) -> int:
    """How many events a prune at ``before`` would delete now (a read)."""
    row = runner_for(connection_of(bind)).first(ret.COUNT_PRUNABLE, {"before": _cutoff(before)})
    return 0 if row is None else int(row[0])


def delete_prunable(conn: Connection, before: datetime) -> int:
    """Delete every event a prune at ``before`` deletes, in the caller's write transaction
    (``conn`` holding the write lock); how many were deleted."""
    params = {"before": _cutoff(before)}
    return int(runner_for(conn).execute(ret.DELETE_PRUNABLE, params).rowcount)


def prunable_event_ids(
    bind: Bind, before: datetime, *, since: datetime | None = None
) -> tuple[int, int] | None:
    """The lowest and highest id of the events a prune at ``before`` would delete now, or
    None when there is none: the range the batches of a prune cover. With ``since``, only
    among the events from then on (what lies before the end of the months retention
    dropped is what it kept). InvalidInput: ``before`` is not an instant the store holds."""
    params = {"before": _cutoff(before)}
    ex = runner_for(connection_of(bind))
    if since is None:
        row = ex.first(ret.PRUNABLE_ID_RANGE, params)
    else:
        row = ex.first(ret.PRUNABLE_ID_RANGE_SINCE, {**params, "since": _cutoff(since)})
    if row is None or row[0] is None or row[1] is None:
        return None
    return int(row[0]), int(row[1])


def prune_event_batch(
    bind: Bind, before: datetime, first: int, last: int, *, since: datetime | None = None
) -> int:
    """Delete the events a prune at ``before`` would, among those whose ids lie in
    ``[first, last]`` (with ``since``: and whose instant is not before it): one batch of a
    prune, in the caller's transaction; how many were deleted."""
    params = {"before": _cutoff(before), "first": int(first), "last": int(last)}
    stmt = ret.DELETE_PRUNABLE_BATCH
    if since is not None:
        stmt, params["since"] = ret.DELETE_PRUNABLE_BATCH_SINCE, _cutoff(since)
    return int(runner_for(for_write(bind)).execute(stmt, params).rowcount)


def drop_event_partitions(bind: Bind, before: datetime) -> Dropped:
    """PostgreSQL, events partitioned: detach the partitions whose months all lie before
    ``before``, keeping the ``created`` events of the rows still stored (see
    :func:`mnestoma.engines.partitions.drop_old_partitions`); nothing elsewhere. The caller
    commits, then drops what was detached (:func:`drop_detached_partition`) and deletes what
    the partition of everything before does not keep (:func:`delete_not_kept`)."""
    cutoff = _cutoff(before)
    conn = for_write(bind)
    with translate_errors():
        if holds_retention(conn):  # pg_partman drops the months: rows are deleted only
            return Dropped()
        return drop_old_partitions(conn, cutoff)


def months_dropped_whole(bind: Bind, before: datetime) -> int:
    """How many months in 0015's form a prune at ``before`` would drop whole now, their
    events counted from the catalogue (the prune's count is then an estimate): a read of the
    catalogue, 0 off PostgreSQL."""
    cutoff = _cutoff(before)
    with translate_errors():
        return parts.months_dropped_whole(connection_of(bind), cutoff)


def drop_detached_partition(bind: Bind, name: str) -> None:
    """Drop a table :func:`drop_event_partitions` detached: its space goes back to the
    operating system (ValueError: ``name`` is not a table retention detached)."""
    stmt = partitions_sql.drop_table(partitions_sql.detached(name))
    conn = for_write(bind)
    with translate_errors():
        under_short_locks(conn, lambda: conn.execute(stmt), f"the drop of {name}")


def drop_leftover_partitions(bind: Bind) -> int:
    """PostgreSQL: drop the months a prune detached and did not drop (it stopped after its
    swap); how many. Nothing elsewhere."""
    conn = for_write(bind)
    if not backend_of(conn).partitioned:
        return 0
    with translate_errors():
        names = [str(n) for n in conn.execute(partitions_sql.LEFTOVERS).scalars()]
        for name in names:
            drop_detached_partition(conn, name)
    return len(names)


def delete_not_kept(bind: Bind, kept: str) -> int:
    """Delete from ``kept`` (the partition of everything before, in 0015's form) every row
    retention does not keep: all but the ``created`` events of the mnests still stored;
    only its rows are read. How many were deleted."""
    collect = partitions_sql.collect_not_kept(kept)
    delete = partitions_sql.delete_collected(kept)
    conn = for_write(bind)

    def work() -> int:
        try:
            with conn.begin_nested():
                found = conn.execute(collect).rowcount
        except DBAPIError as err:
            if not is_insufficient_privilege(err):
                raise
            return int(conn.execute(partitions_sql.delete_not_kept(kept)).rowcount)
        gone = conn.execute(delete).rowcount if found else 0
        conn.execute(partitions_sql.DROP_NOT_KEPT)
        return int(gone)

    with translate_errors():
        return under_short_locks(conn, work, "the rows retention does not keep")


def prune_turn_edges(
    bind: Bind, end: datetime, after: TurnEdgeKey, limit: int
) -> tuple[int, TurnEdgeKey | None]:
    """One batch of the rows of ``event_turn_edges`` before ``end`` after ``after`` (in
    (ts, turn_id, mnest_id, occurrence) order): those whose passing went with a dropped
    partition are deleted. How many were, and the last row looked at (None: none was left)."""
    params = {
        "end": _cutoff(end),
        "ts": after[0],
        "turn": after[1],
        "mnest": after[2],
        "occ": after[3],
        "n": int(limit),
    }
    conn = for_write(bind)
    with translate_errors():
        row = under_short_locks(
            conn,
            lambda: runner_for(conn).first(partitions_sql.PRUNE_TURN_EDGES_BATCH, params),
            "the rows of event_turn_edges retention deletes",
        )
    assert row is not None
    deleted, seen, ts, turn, mnest, occurrence = row
    return int(deleted), (None if not seen else (ts, turn, mnest, occurrence))


# --- the prune in batches, both facades' ---------------------------------------------------


def prune_steps(before: datetime, *, dry_run: object, progress: object, dialect: str) -> Steps[int]:
    """A facade's ``prune_events``: its arguments checked now, before its first batch, and
    its steps: how many events were deleted (with ``dry_run``: would be, counted in one read
    on the primary). ``progress(done, total, deleted)`` once the batches are known (done 0),
    then after each."""
    dry, report = check_dry_run(dry_run), check_progress(progress, "done, total, deleted")
    if dry:
        return _counted(before)
    return _pruned(before, report, dialect)


def _counted(before: datetime) -> Steps[int]:
    count: int = yield Read(functools.partial(count_prunable, before=before))
    return count


def _pruned(before: datetime, report: PruneProgress | None, dialect: str) -> Steps[int]:
    deleted, since = 0, None
    backend = backend_of(dialect)
    if backend.partitioned:
        deleted, since = yield from _drop_partitions(before)
    found = yield Read(functools.partial(prunable_event_ids, before=before, since=since))
    batches = list(event_batches(found))
    if report is not None and (batches or deleted):
        report(0, len(batches), deleted)
    for i, (first, last) in enumerate(batches):
        if i:
            yield Pause(backend.batch_pause_s)
        deleted += yield Write(
            functools.partial(prune_event_batch, before=before, first=first, last=last, since=since)
        )
        if report is not None:
            report(i + 1, len(batches), deleted)
    return deleted


def _drop_partitions(before: datetime) -> Steps[tuple[int, datetime | None]]:
    """PostgreSQL, events partitioned: what a stopped prune left detached dropped; the whole
    months before ``before`` dropped (the swap one transaction, each drop another, then the
    rows the partition of everything before does not keep deleted), then the rows of
    ``event_turn_edges`` their passings had, in batches; how many events went, and the end
    of the months dropped (before it, only what was kept: None when none was)."""
    yield Write(drop_leftover_partitions)
    dropped: Dropped = yield Write(functools.partial(drop_event_partitions, before=before))
    for name in dropped.detached:
        yield Write(functools.partial(drop_detached_partition, name=name))
    deleted = dropped.deleted
    if dropped.kept is not None:
        deleted += yield Write(functools.partial(delete_not_kept, kept=dropped.kept))
    end, after = dropped.end, FIRST_TURN_EDGE
    while end is not None:
        _, last = yield Write(
            functools.partial(prune_turn_edges, end=end, after=after, limit=EVENT_PRUNE_BATCH)
        )
        if last is None:
            break
        after = last
    return deleted, dropped.end
