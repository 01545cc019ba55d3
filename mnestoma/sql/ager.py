"""The ager's statements, built once per dialect: prune, merge, demote, decay, archive count."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)

from ..models import Event, Mnest
from ..rules import ARCHIVE_BELOW, DECAYING_BELOW, PROTO_PRUNE_BELOW, Recorder, threshold_cut
from ..sqlrules import decayed, greatest, least, now_param
from ..types import UTCDateTime

M = Mnest.__table__
E = Event.__table__

# The ager's thresholds as it compares them (see rules.THRESHOLD_TOLERANCE).
PRUNE_CUT = threshold_cut(PROTO_PRUNE_BELOW)
DECAYING_CUT = threshold_cut(DECAYING_BELOW)
ARCHIVE_CUT = threshold_cut(ARCHIVE_BELOW)


def _merge_pairs(dialect: str, now: Any) -> Any:
    """The ager's merge pairs, one row per key that has both an active row below 0.20 and a
    decaying row: their ids, and what the merge needs of each. A subquery, not a CTE: each
    statement then starts with its verb, and SQLite's driver reports its rowcount."""
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    active = M.c.state == "active"
    decaying = M.c.state == "decaying"

    def of(which: Any, column: Any) -> Any:
        return func.max(case((which, column)))

    return (
        select(
            of(active, M.c.id).label("a_id"),
            of(decaying, M.c.id).label("d_id"),
            of(active, M.c.uses).label("a_uses"),
            of(active, M.c.ts_first).label("a_first"),
            of(active, M.c.ts_last).label("a_last"),
            of(active, eff).label("a_eff"),
            of(decaying, eff).label("d_eff"),
        )
        .where(
            M.c.dst_version.is_not(None),
            or_(and_(active, eff < DECAYING_CUT), decaying),
        )
        .group_by(M.c.src_executor, M.c.src_version, M.c.dst_executor, M.c.dst_version)
        .having(and_(of(active, M.c.id).is_not(None), of(decaying, M.c.id).is_not(None)))
        .subquery("merge_pairs")
    )


@functools.cache
def ager_statements(dialect: str) -> dict[str, Any]:
    """The ager's statements for ``dialect``, in the order the ager runs them."""
    now = now_param()

    def eff(t: Any) -> Any:
        return decayed(dialect, t.c.weight, t.c.decay_lambda, t.c.ts_weight, now)

    anchor = case((M.c.ts_weight > now, M.c.ts_weight), else_=now)
    ev_cols = [
        "mnest_id",
        "kind",
        "ts",
        "weight_before",
        "weight_after",
        "state_before",
        "state_after",
        "related_id",
        "recorder",
    ]
    now_ts = now.cast(UTCDateTime()) if dialect == "postgresql" else now

    # protos whose weight fell below 0.05 are deleted, their history kept.
    proto_dying = and_(M.c.state == "proto", eff(M) < PRUNE_CUT)
    prune_events = insert(E).from_select(
        ev_cols,
        select(
            M.c.id,
            literal("pruned"),
            now_ts,
            eff(M),
            literal(None),
            literal("proto"),
            literal(None),
            literal(None),
            literal(Recorder.AGER.value),
        ).where(proto_dying),
    )
    prune = delete(M).where(proto_dying)

    # Actives below 0.20 whose key already has a decaying row merge into it. The pairs come
    # from one pass over the candidates grouped by key (a key holds at most one active and
    # one decaying row), and the rows are then reached by id: whatever plan the database
    # picks, with or without statistics, the cost stays linear. A join on the key could be
    # planned through the (state, src) index instead, quadratic in a hub's out-degree.
    pairs = _merge_pairs(dialect, now)
    merged_weight = greatest(dialect, pairs.c.a_eff, pairs.c.d_eff)
    merge_events_absorbed = insert(E).from_select(
        ev_cols,
        select(
            pairs.c.a_id,
            literal("merged"),
            now_ts,
            pairs.c.a_eff,
            merged_weight,
            literal("active"),
            literal("decaying"),
            pairs.c.d_id,
            literal(Recorder.AGER.value),
        ),
    )
    merge_events_target = insert(E).from_select(
        ev_cols,
        select(
            pairs.c.d_id,
            literal("merged"),
            now_ts,
            pairs.c.d_eff,
            merged_weight,
            literal("decaying"),
            literal("decaying"),
            pairs.c.a_id,
            literal(Recorder.AGER.value),
        ),
    )
    merge_update = (
        update(M)
        .where(M.c.id == pairs.c.d_id)
        .values(
            uses=M.c.uses + pairs.c.a_uses,
            ts_first=least(dialect, M.c.ts_first, pairs.c.a_first),
            ts_last=greatest(dialect, M.c.ts_last, pairs.c.a_last),
            weight=merged_weight,
            ts_weight=anchor,
        )
    )
    merge_delete = delete(M).where(M.c.id.in_(select(pairs.c.a_id)))

    # the other actives below 0.20 become decaying.
    demoting = and_(M.c.state == "active", eff(M) < DECAYING_CUT)
    demote_events = insert(E).from_select(
        ev_cols,
        select(
            M.c.id,
            literal("transition"),
            now_ts,
            eff(M),
            eff(M),
            literal("active"),
            literal("decaying"),
            literal(None),
            literal(Recorder.AGER.value),
        ).where(demoting),
    )
    demote = update(M).where(demoting).values(state="decaying", weight=eff(M), ts_weight=anchor)

    # every remaining active and proto row: weight brought to now.
    decay = (
        update(M)
        .where(M.c.state.in_(["active", "proto"]), M.c.ts_weight < now)
        .values(weight=eff(M), ts_weight=now)
    )
    archive_count = select(func.count()).where(
        M.c.state == "decaying",
        eff(M) < ARCHIVE_CUT,
        M.c.ts_last <= bindparam("cutoff", type_=UTCDateTime()),
    )
    stmts = {
        "prune_events": prune_events,
        "prune": prune,
        "merge_events_absorbed": merge_events_absorbed,
        "merge_events_target": merge_events_target,
        "merge_update": merge_update,
        "merge_delete": merge_delete,
        "demote_events": demote_events,
        "demote": demote,
        "decay": decay,
        "archive_count": archive_count,
    }
    if dialect == "postgresql":
        # EXCLUSIVE also conflicts with the ROW SHARE lock of a writer's SELECT ... FOR
        # UPDATE: the ager waits for writers that hold row locks, never the reverse.
        stmts["lock"] = text("LOCK TABLE mnests IN EXCLUSIVE MODE")
    return stmts
