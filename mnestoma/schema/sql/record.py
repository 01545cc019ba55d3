"""The statements that write: recording passings, changing state, logging queries.

Built once (at import, or once per dialect or shape); callers only bind parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Float,
    Insert,
    Integer,
    Select,
    String,
    TextClause,
    Update,
    bindparam,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    text,
    union_all,
    update,
)

from mnestoma.core import sqlrules
from mnestoma.core.rules import (
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    PASSING_KINDS,
    EventKind,
    MnestState,
)
from mnestoma.schema.sql import tables
from mnestoma.schema.sql.spelling import spelling_of
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNEST_COLUMNS, Key, key_is, kind_in
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import QUERIES as Q

__all__ = [
    "EVENT_ROW",
    "HOLD_OFF_AGER",
    "INSERT_EVENT",
    "INSERT_MNEST_LOCKED",
    "INSERT_QUERY",
    "KEYS_PER_STATEMENT",
    "PASSED_AGAIN",
    "PASSED_COUNTED",
    "PASSED_CREATED",
    "PASSED_REINFORCED",
    "PG_PASSING_PARAMS",
    "PROMOTE",
    "REINFORCE_ROW",
    "SELECT_BY_ID_LOCKED",
    "SELECT_ONE_ACTIVE",
    "SELECT_ONE_PROTO",
    "SET_STATE",
    "TURN_COUNTED",
    "TURN_SEEN",
    "UPDATE_REINFORCE",
    "insert_mnest",
    "key_params",
    "key_taken",
    "pg_passing",
    "select_keys",
    "select_one_counted",
    "shape_size",
]

# A turn's keys are locked and read by statements of at most this many keys each.
KEYS_PER_STATEMENT = 64


def shape_size(n: int) -> int:
    """The number of key slots a statement for ``n`` keys has: the next power of two, so
    that turns of any size share 7 shapes per kind (unused slots bind NULL, which matches
    nothing) instead of one compiled statement per turn size."""
    return 0 if n == 0 else 1 << (n - 1).bit_length()


@functools.cache
def select_keys(n_active: int, n_proto: int) -> Select[Any]:
    """Lock and read the rows of ``n_active`` versioned keys and ``n_proto`` proto keys, in
    id order. An OR of per-key equalities, so that each term can use a unique index (a
    row-value IN list makes SQLite scan every active row). Sizes come from :func:`shape_size`.
    """
    terms = [key_is(M, f"a{i}", proto=False, state=MnestState.ACTIVE) for i in range(n_active)]
    terms += [key_is(M, f"p{j}", proto=True, state=MnestState.PROTO) for j in range(n_proto)]
    return select(M).where(or_(*terms)).order_by(M.c.id).with_for_update()


def key_params(akeys: list[Key], pkeys: list[Key]) -> dict[str, Any]:
    """The parameters of :func:`select_keys` for these keys, padded to the shape's size."""
    params: dict[str, Any] = {}
    for i in range(shape_size(len(akeys))):
        s, sv, d, dv = akeys[i] if i < len(akeys) else (None, None, None, None)
        params[f"sa{i}"], params[f"sva{i}"], params[f"da{i}"], params[f"dva{i}"] = s, sv, d, dv
    for j in range(shape_size(len(pkeys))):
        s, sv, d, _ = pkeys[j] if j < len(pkeys) else (None, None, None, None)
        params[f"sp{j}"], params[f"svp{j}"], params[f"dp{j}"] = s, sv, d
    return params


SELECT_ONE_ACTIVE = (
    select(M).where(key_is(M, proto=False, state=MnestState.ACTIVE)).with_for_update()
)
SELECT_ONE_PROTO = select(M).where(key_is(M, proto=True, state=MnestState.PROTO)).with_for_update()
SELECT_BY_ID_LOCKED = select(M).where(M.c.id == bindparam("id")).with_for_update()

_COUNTED = kind_in(E, PASSING_KINDS)
# Has this turn counted any passing yet? (one index probe; most turns are new)
TURN_SEEN = select(E.c.id).where(E.c.turn_id == bindparam("turn_id"), _COUNTED).limit(1)
# Which occurrences of these rows has the turn already counted? (mnest_id, occurrence)
TURN_COUNTED = select(E.c.mnest_id, E.c.occurrence).where(
    E.c.turn_id == bindparam("turn_id"),
    E.c.mnest_id.in_(bindparam("ids", expanding=True)),
    _COUNTED,
)


@functools.cache
def select_one_counted(proto: bool) -> Select[Any]:
    """SQLite, under the write lock: the live row of a key (a versioned key, or a proto's)
    and, as its last column, whether the turn ``:turn_id`` counted occurrence ``:occ`` of it
    already (one probe of ``ux_events_turn_edge`` in the same statement, instead of
    :data:`TURN_COUNTED_ONE` after it)."""
    state = MnestState.PROTO if proto else MnestState.ACTIVE
    counted = exists(
        select(E.c.id).where(
            E.c.turn_id == bindparam("turn_id"),
            E.c.mnest_id == M.c.id,
            E.c.occurrence == bindparam("occ"),
            _COUNTED,
        )
    )
    return select(M, counted.label("counted")).where(key_is(M, proto=proto, state=state))


# The parameters of UPDATE_REINFORCE, in the order of the tuples the repository builds.
REINFORCE_ROW = (
    "b_id",
    "b_weight",
    "b_ts_last",
    "b_ts_weight",
    "b_tags",
    "b_desired_sig",
    "b_ok",
    "b_error",
    "b_decayed_uses",
)
UPDATE_REINFORCE = (
    update(M)
    .where(M.c.id == bindparam("b_id"))
    .values(
        weight=bindparam("b_weight"),
        uses=M.c.uses + 1,
        ts_last=bindparam("b_ts_last"),
        ts_weight=bindparam("b_ts_weight"),
        tags=bindparam("b_tags"),
        desired_sig=bindparam("b_desired_sig"),
        ok_count=M.c.ok_count + bindparam("b_ok", type_=Integer),
        error_count=M.c.error_count + bindparam("b_error", type_=Integer),
        decayed_uses=bindparam("b_decayed_uses", type_=Float),
    )
)


@functools.cache
def insert_mnest(dialect: str) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING id: a key another transaction created
    meanwhile comes back missing instead of failing the transaction (the dialect's own
    INSERT, :attr:`~mnestoma.schema.sql.spelling.Spelling.insert`)."""
    stmt: Insert = spelling_of(dialect).insert(M).on_conflict_do_nothing().returning(M.c.id)
    return stmt


INSERT_EVENT = insert(E)
# An event's values in the order the repository builds them (the id is generated): the
# columns of the one event-row shape, :class:`~mnestoma.schema.sql.tables.EventRow`. A column added
# to ``events`` is added there on purpose (a test compares the two); a row that leaves a
# column out gets its default, or an error if it has none.
EVENT_ROW: tuple[str, ...] = tables.EVENT_ROW
# SQLite, under the write lock the package takes before any write: no other writer can
# create a key meanwhile, so creations need neither ON CONFLICT nor RETURNING.
INSERT_MNEST_LOCKED = insert(M)

# PostgreSQL: what a turn takes before retrying; it conflicts with the EXCLUSIVE lock of a
# whole run of the ager in one transaction, not with other writers (nor with the ager's
# batches, which lock rows only and never create a key).
HOLD_OFF_AGER: TextClause = text("LOCK TABLE mnests IN ROW EXCLUSIVE MODE")


@functools.cache
def key_taken(proto: bool, state: MnestState) -> Select[Any]:
    """Another row (not ``:own_id``) with this key in this state?"""
    own = M.c.id != bindparam("own_id")
    return select(M.c.id).where(key_is(M, proto=proto, state=state), own).limit(1)


SET_STATE: Update = update(M).where(M.c.id == bindparam("b_id")).values(state=bindparam("b_state"))
PROMOTE: Update = (
    update(M)
    .where(M.c.id == bindparam("b_id"))
    .values(state=bindparam("b_state"), dst_version=bindparam("b_dst_version"), desired_sig=None)
)

INSERT_QUERY = insert(Q).returning(Q.c.id)


# =============================================================================================
# PostgreSQL: a passing in one statement (contract §4: "now" is read once per call, before the
# statement). A data-modifying CTE locks the key's live row, computes the reinforcement with
# the SQL twins of the rules (the same floats as Python), writes it and its event, or creates
# the row and its event when there is none; the turn's exactly-once guard is in it too. So a
# hot row's lock is held for this one statement and the COMMIT after it.
# =============================================================================================

# What the statement's first column says of the row that follows it.
PASSED_REINFORCED = "r"  # reinforced now
PASSED_CREATED = "c"  # created now
PASSED_COUNTED = "n"  # the turn counted this occurrence already: the row as it is
# The row changed after the statement's snapshot was taken (another writer committed while
# this one waited for its lock), so whether the turn counted it cannot be told from that
# snapshot: nothing written, the statement is run again (its lock is held by then).
PASSED_AGAIN = "a"
# Nothing came back: another transaction created the key meanwhile (ON CONFLICT DO NOTHING).

# The parameters besides the key's (:s, :sv, :d, :dv): the clock's now, the new row's id (used
# only when it creates), the passing's tags and desired_sig (NULL: keep the row's), its
# outcome counts, and the event's turn, recorder, outcome and occurrence.
PG_PASSING_PARAMS = (
    "now",
    "new_id",
    "tags",
    "desired_sig",
    "ok",
    "error",
    "turn_id",
    "recorder",
    "outcome",
    "occ",
)


def _param(name: str, column: str, table: Any = M) -> Any:
    """A bound parameter typed as ``table.column``."""
    return bindparam(name, type_=table.c[column].type)


@functools.cache
def pg_passing(proto: bool, turn: bool) -> CompoundSelect[Any]:
    """One passing on PostgreSQL as one statement; its rows: the flag (``PASSED_*``) then
    the row's columns in :data:`~mnestoma.schema.sql.tables.MNEST_COLUMNS` order."""
    state = MnestState.PROTO if proto else MnestState.ACTIVE
    now = sqlrules.now_param()
    xmin: ColumnElement[Any] = literal_column("mnests.xmin")
    ts_last = sqlrules.advanced(M.c.ts_last, now)
    ts_weight = sqlrules.advanced(M.c.ts_weight, now)
    # Computed where the row is locked: on a row another writer changed meanwhile, PostgreSQL
    # computes them again from the version it locks.
    computed = [
        xmin.label("row_xmin"),
        ts_last.label("new_ts_last"),
        ts_weight.label("new_ts_weight"),
        sqlrules.decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, ts_weight, exact=True).label(
            "weight_before"
        ),
        sqlrules.passing_count(M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last, ts_last).label(
            "new_decayed_uses"
        ),
    ]
    if turn:
        counted = exists(
            select(E.c.id).where(
                E.c.turn_id == _param("turn_id", "turn_id", E),
                E.c.mnest_id == M.c.id,
                E.c.occurrence == _param("occ", "occurrence", E),
                _COUNTED,
            )
        )
        computed.append(counted.label("counted"))
    live = key_is(M, proto=proto, state=state)
    locked = select(M, *computed).where(live).with_for_update().cte("locked")
    o = locked.c
    guard: list[Any] = [M.c.id == o.id]
    extra: list[Select[Any]] = []
    if turn:
        # The row as the statement's snapshot sees it, unlocked: another xmin than the locked
        # row's means that a writer committed a change after the snapshot was taken.
        seen = select(M.c.id, xmin.label("row_xmin")).where(live).cte("seen")
        same = exists(select(seen.c.id).where(seen.c.id == o.id, seen.c.row_xmin == o.row_xmin))
        guard += [~o.counted, same]
        as_it_is = [o[c] for c in MNEST_COLUMNS]
        extra = [
            select(literal(PASSED_COUNTED), *as_it_is).where(o.counted),
            select(literal(PASSED_AGAIN), *as_it_is).where(~o.counted, ~same),
        ]
    upd = (
        update(M)
        .where(*guard)
        .values(
            weight=sqlrules.reinforce(o.weight_before),
            uses=M.c.uses + 1,
            ts_last=o.new_ts_last,
            ts_weight=o.new_ts_weight,
            tags=func.coalesce(_param("tags", "tags"), M.c.tags),
            desired_sig=func.coalesce(_param("desired_sig", "desired_sig"), M.c.desired_sig),
            ok_count=M.c.ok_count + bindparam("ok", type_=Integer),
            error_count=M.c.error_count + bindparam("error", type_=Integer),
            decayed_uses=o.new_decayed_uses,
        )
        .returning(*M.c, o.weight_before)
        .cte("reinforced_row")
    )
    new_row = {
        "id": _param("new_id", "id"),
        "src_executor": bindparam("s", type_=M.c.src_executor.type),
        "src_version": bindparam("sv", type_=M.c.src_version.type),
        "dst_executor": bindparam("d", type_=M.c.dst_executor.type),
        "dst_version": null() if proto else bindparam("dv", type_=M.c.dst_version.type),
        "weight": literal(INITIAL_WEIGHT, Float),
        "uses": literal(1, Integer),
        "ts_first": now,
        "ts_last": now,
        "ts_weight": now,
        "decay_lambda": literal(DEFAULT_DECAY_LAMBDA, Float),
        "state": literal_column(f"'{state.value}'", String),
        "tags": _param("tags", "tags"),
        "desired_sig": _param("desired_sig", "desired_sig"),
        "ok_count": bindparam("ok", type_=Integer),
        "error_count": bindparam("error", type_=Integer),
        "decayed_uses": literal(1.0, Float),
    }
    created = (
        spelling_of("postgresql")
        .insert(M)
        .from_select(
            list(MNEST_COLUMNS),
            select(*(new_row[c] for c in MNEST_COLUMNS)).where(~exists(select(o.id))),
        )
        .on_conflict_do_nothing()
        .returning(*M.c)
        .cte("created_row")
    )
    u, c = upd.c, created.c
    turn_id = _param("turn_id", "turn_id", E)
    recorder = _param("recorder", "recorder", E)
    outcome = _param("outcome", "outcome", E)
    occ = _param("occ", "occurrence", E)
    reinforced_event = tables.EventRow(
        mnest_id=u.id,
        kind=literal_column(f"'{EventKind.REINFORCED.value}'", String),
        ts=u.ts_last,
        turn_id=turn_id,
        weight_before=u.weight_before,
        weight_after=u.weight,
        state_before=u.state,
        state_after=u.state,
        recorder=recorder,
        outcome=outcome,
        occurrence=occ,
    )
    created_event = tables.EventRow(
        mnest_id=c.id,
        kind=literal_column(f"'{EventKind.CREATED.value}'", String),
        ts=c.ts_first,
        turn_id=turn_id,
        weight_after=c.weight,
        state_after=c.state,
        recorder=recorder,
        outcome=outcome,
        occurrence=occ,
    )
    events = (
        insert(E)
        .from_select(
            list(EVENT_ROW),
            union_all(
                select(*reinforced_event.select_list()).select_from(upd),
                select(*created_event.select_list()).select_from(created),
            ),
        )
        .cte("written_events")
    )
    rows = union_all(
        select(literal(PASSED_REINFORCED), *(u[n] for n in MNEST_COLUMNS)),
        select(literal(PASSED_CREATED), *(c[n] for n in MNEST_COLUMNS)),
        *extra,
    )
    return rows.add_cte(events)
