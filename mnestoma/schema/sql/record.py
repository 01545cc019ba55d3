"""The statements that write: recording passings, changing state, logging queries.

Built once (at import, or once per dialect or shape); callers only bind parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Float,
    Insert,
    Integer,
    Select,
    TextClause,
    Update,
    bindparam,
    exists,
    insert,
    or_,
    select,
    text,
    update,
)

from mnestoma.core.rules import PASSING_KINDS, MnestState
from mnestoma.schema.sql import tables
from mnestoma.schema.sql.spelling import spelling_of
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import QUERIES as Q
from mnestoma.schema.sql.tables import Key, key_is, kind_in

__all__ = [
    "EVENT_ROW",
    "HOLD_OFF_AGER",
    "INSERT_EVENT",
    "INSERT_MNEST_LOCKED",
    "INSERT_QUERY",
    "KEYS_PER_STATEMENT",
    "PG_REINFORCE_EVENT_PARAMS",
    "PG_REINFORCE_ROW",
    "PG_REINFORCE_WITH_EVENT",
    "PROMOTE",
    "REINFORCE_ROW",
    "SELECT_BY_ID_LOCKED",
    "SELECT_ONE_ACTIVE",
    "SELECT_ONE_PROTO",
    "SET_STATE",
    "TURN_COUNTED",
    "TURN_COUNTED_ONE",
    "TURN_SEEN",
    "UPDATE_REINFORCE",
    "insert_mnest",
    "key_params",
    "key_taken",
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
# Has the turn counted this occurrence of this row?
TURN_COUNTED_ONE = select(E.c.mnest_id).where(
    E.c.turn_id == bindparam("turn_id"),
    E.c.mnest_id == bindparam("mid"),
    E.c.occurrence == bindparam("occ"),
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

# the event columns bound by PG_REINFORCE_WITH_EVENT: its mnest_id is the updated row's id,
# and a reinforcement has no reason and no related row
PG_REINFORCE_EVENT_PARAMS = tuple(
    c for c in EVENT_ROW if c not in ("mnest_id", "reason", "related_id")
)


# PG_REINFORCE_WITH_EVENT's parameters: a REINFORCE_ROW followed by these event values.
PG_REINFORCE_ROW = REINFORCE_ROW + PG_REINFORCE_EVENT_PARAMS


def _reinforce_with_event() -> Insert:
    """PostgreSQL: the reinforcement and its event in one statement (a data-modifying CTE),
    so a hot row's lock is held one round trip shorter."""
    upd = UPDATE_REINFORCE.returning(M.c.id).cte("reinforced_row")
    binds = [bindparam(name, type_=E.c[name].type) for name in PG_REINFORCE_EVENT_PARAMS]
    return insert(E).from_select(["mnest_id", *PG_REINFORCE_EVENT_PARAMS], select(upd.c.id, *binds))


PG_REINFORCE_WITH_EVENT = _reinforce_with_event()

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
