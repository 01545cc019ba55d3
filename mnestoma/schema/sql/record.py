"""The statements that write: recording passings, changing state, logging queries.

Built once (at import, or once per dialect or shape); callers only bind parameters.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    ColumnElement,
    CompoundSelect,
    Float,
    Integer,
    Select,
    String,
    TextClause,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    table,
    text,
    true,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import NullType

from mnestoma.core import sqlrules
from mnestoma.core.rules import (
    DEFAULT_DECAY_LAMBDA,
    INITIAL_WEIGHT,
    PASSING_KINDS,
    EventKind,
    MnestState,
    new_mnest_id,
    outcome_counts,
)
from mnestoma.core.validation import Passing
from mnestoma.schema.sql import chains as chains_sql
from mnestoma.schema.sql import tables
from mnestoma.schema.sql.partitions import SIDE_TABLE_NAME
from mnestoma.schema.sql.spelling import spelling_of
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNEST_COLUMNS, Key, key_is, kind_in, state_is
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import QUERIES as Q

__all__ = [
    "DATA_VERSION",
    "EVENT_ROW",
    "HOLD_OFF_AGER",
    "INSERT_EVENT",
    "INSERT_MNEST_LOCKED",
    "INSERT_QUERY",
    "KEYS_PER_STATEMENT",
    "LATE_AT",
    "LATE_COLUMNS",
    "LATE_RAW",
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
    "key_params",
    "key_taken",
    "late_converter",
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
    """SQLite, under the write lock: lock and read the rows of ``n_active`` versioned keys
    and ``n_proto`` proto keys, in id order, their late columns as stored (:data:`LATE_RAW`).
    An OR of per-key equalities, so that each term can use a unique index (a
    row-value IN list makes SQLite scan every active row). Sizes come from :func:`shape_size`.
    """
    terms = [key_is(M, f"a{i}", proto=False, state=MnestState.ACTIVE) for i in range(n_active)]
    terms += [key_is(M, f"p{j}", proto=True, state=MnestState.PROTO) for j in range(n_proto)]
    return select(*LATE_RAW).where(or_(*terms)).order_by(M.c.id).with_for_update()


@functools.cache
def _key_slots(n_active: int, n_proto: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parameter names of :func:`select_keys`'s slots: four per versioned key, three per
    proto key, in slot order (named once per shape, not at every turn)."""
    active = tuple(f"{p}{i}" for i in range(n_active) for p in ("sa", "sva", "da", "dva"))
    proto = tuple(f"{p}{j}" for j in range(n_proto) for p in ("sp", "svp", "dp"))
    return active, proto


def key_params(akeys: list[Key], pkeys: list[Key]) -> dict[str, Any]:
    """The parameters of :func:`select_keys` for these keys, padded to the shape's size
    (an unused slot binds NULL, which matches nothing)."""
    active, proto = _key_slots(shape_size(len(akeys)), shape_size(len(pkeys)))
    params: dict[str, Any] = dict.fromkeys(active)
    params.update(zip(active, itertools.chain.from_iterable(akeys), strict=False))
    params.update(dict.fromkeys(proto))
    params.update(zip(proto, itertools.chain.from_iterable(k[:3] for k in pkeys), strict=False))
    return params


# The columns of a row a passing's arithmetic does not need: its first instant and its two
# JSON documents. SQLite's passings and turns read them as stored (LATE_RAW) while they hold
# the write lock, and convert them once they have let go (late_converter): a reinforcement
# keeps them (UPDATE_REINFORCE leaves a document the passing does not give as it is).
LATE_COLUMNS = ("ts_first", "tags", "desired_sig")
# Where a row of select(mnests) holds them, in LATE_COLUMNS order.
LATE_AT = tuple(MNEST_COLUMNS.index(name) for name in LATE_COLUMNS)


def _late_raw(name: str) -> ColumnElement[Any]:
    """Column ``name`` of mnests; one of :data:`LATE_COLUMNS` read as stored (no result
    processing), under its own name."""
    if name not in LATE_COLUMNS:
        return M.c[name]
    return type_coerce(M.c[name], NullType()).label(name)


# The columns of mnests in order, the late ones as stored (see LATE_COLUMNS).
LATE_RAW = tuple(_late_raw(name) for name in MNEST_COLUMNS)

# SQLite, under the write lock: the live row of a key, its late columns as stored.
SELECT_ONE_ACTIVE = (
    select(*LATE_RAW).where(key_is(M, proto=False, state=MnestState.ACTIVE)).with_for_update()
)
SELECT_ONE_PROTO = (
    select(*LATE_RAW).where(key_is(M, proto=True, state=MnestState.PROTO)).with_for_update()
)
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
    return select(*LATE_RAW, counted.label("counted")).where(key_is(M, proto=proto, state=state))


_LATE_CONVERTERS: weakref.WeakKeyDictionary[Dialect, Callable[[Sequence[Any]], tuple[Any, ...]]]
_LATE_CONVERTERS = weakref.WeakKeyDictionary()


def late_converter(dialect: Dialect) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """What makes a row read with :data:`LATE_RAW` (the lookups of SQLite's passings and
    turns) the row ``select(mnests)`` reads: its :data:`LATE_COLUMNS` converted by their
    types' result processors for ``dialect`` (its own JSON deserializer included), made
    once per dialect; a value after the columns (a lookup's flag) is left as it is."""
    convert = _LATE_CONVERTERS.get(dialect)
    if convert is not None:
        return convert
    found = (
        (at, M.c[name].type.dialect_impl(dialect).result_processor(dialect, None))
        for at, name in zip(LATE_AT, LATE_COLUMNS, strict=True)
    )
    processors = [(at, process) for at, process in found if process is not None]

    def converted(row: Sequence[Any]) -> tuple[Any, ...]:
        out = list(row)
        for at, process in processors:
            value = out[at]
            if value is not None:
                out[at] = process(value)
        return tuple(out)

    _LATE_CONVERTERS[dialect] = converted
    return converted


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
# SQLite: a number that changes whenever another connection has committed a change to the
# store since this one last read it (its own commits leave it as it is).
DATA_VERSION = "PRAGMA data_version"

UPDATE_REINFORCE = (
    update(M)
    .where(M.c.id == bindparam("b_id"))
    .values(
        weight=bindparam("b_weight"),
        uses=M.c.uses + 1,
        ts_last=bindparam("b_ts_last"),
        ts_weight=bindparam("b_ts_weight"),
        # a document the passing does not give (None) stays as stored
        tags=func.coalesce(bindparam("b_tags", type_=M.c.tags.type), M.c.tags),
        desired_sig=func.coalesce(
            bindparam("b_desired_sig", type_=M.c.desired_sig.type), M.c.desired_sig
        ),
        ok_count=M.c.ok_count + bindparam("b_ok", type_=Integer),
        error_count=M.c.error_count + bindparam("b_error", type_=Integer),
        decayed_uses=bindparam("b_decayed_uses", type_=Float),
    )
)


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
        "state": _text(state.value),
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
    # What both events take from the call: its turn, recorder, outcome and occurrence.
    called = {
        "turn_id": _param("turn_id", "turn_id", E),
        "recorder": _param("recorder", "recorder", E),
        "outcome": _param("outcome", "outcome", E),
        "occurrence": _param("occ", "occurrence", E),
    }
    reinforced_event = tables.EventRow(
        mnest_id=u.id,
        kind=_text(EventKind.REINFORCED.value),
        ts=u.ts_last,
        weight_before=u.weight_before,
        weight_after=u.weight,
        state_before=u.state,
        state_after=u.state,
        **called,
    )
    created_event = tables.EventRow(
        mnest_id=c.id,
        kind=_text(EventKind.CREATED.value),
        ts=c.ts_first,
        weight_after=c.weight,
        state_after=c.state,
        **called,
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


# =============================================================================================
# PostgreSQL: a turn in one statement (contract §4, §13; "now" read once per call, before it).
# A data-modifying CTE locks the live rows of every key of the turn in id order, steps through
# each edge's occurrences with the SQL twins of the rules (a recursive CTE: occurrence k of an
# edge is its own passing, at the same now), skips an occurrence the turn counted already,
# then writes the reinforced rows, the new rows (in key order, ON CONFLICT DO NOTHING), every
# passing's event and the turn's chains (in key order, after the new rows). The caller runs
# it in a savepoint: a key another transaction created meanwhile (a row missing from the
# result), or an occurrence another transaction of the same turn counted after this
# statement's snapshot (the unique key of the turn's edges refuses its event), undoes the
# attempt, locks included, and the next attempt sees what was committed.
# =============================================================================================

__all__ += ["pg_turn", "pg_turn_params"]

# An edge of a turn: whether its destination exists (an active key) or not (a proto's), its key.
Edge = tuple[bool, Key]


def pg_turn_params(
    passings: Mapping[Edge, Sequence[Passing]],
    order: Sequence[Edge],
    new_rows_order: Sequence[Edge],
    now: datetime,
    turn_id: str,
    recorder: str,
) -> dict[str, Any]:
    """The parameters of :func:`pg_turn` for ``passings``, each edge's passings in the order
    given (its occurrences; the edges in the order they first occur), ``order`` each
    passing's edge in the order given, ``new_rows_order`` the order new rows are created in.

    Arrays of one value per edge (edge k is element k): whether its destination exists,
    its key (``e_dv`` NULL for a proto), the id a new row takes, how many times it occurs,
    its rank among new rows. Arrays of one value per passing, in the order given: its edge,
    which occurrence of it, its outcome counts and outcome; its tags and desired_sig as one
    JSON array each (null: keep the row's; the array NULL when no passing gives one). And
    ``now``, ``turn_id``, ``recorder``."""
    number = {edge: k for k, edge in enumerate(passings, 1)}
    rank = {edge: r for r, edge in enumerate(new_rows_order, 1)}
    seen: dict[Edge, int] = {}
    occurrences = []
    for edge in order:
        k = seen[edge] = seen.get(edge, 0) + 1
        occurrences.append((number[edge], k, passings[edge][k - 1]))
    outcomes = [outcome_counts(p.outcome) for _, _, p in occurrences]
    tags = [p.tags for _, _, p in occurrences]
    sigs = [p.desired_sig for _, _, p in occurrences]
    return {
        "e_exists": [exists_ for exists_, _ in passings],
        "e_s": [key[0] for _, key in passings],
        "e_sv": [key[1] for _, key in passings],
        "e_d": [key[2] for _, key in passings],
        "e_dv": [key[3] for _, key in passings],
        "e_new_id": [new_mnest_id() for _ in passings],
        "e_n": [len(given) for given in passings.values()],
        "e_rank": [rank[edge] for edge in passings],
        "p_edge": [n for n, _, _ in occurrences],
        "p_occ": [k for _, k, _ in occurrences],
        "p_ok": [ok for ok, _ in outcomes],
        "p_error": [error for _, error in outcomes],
        "p_outcome": [p.outcome for _, _, p in occurrences],
        # one JSON array each, NULL when no passing gives one (the common case)
        "p_tags": tags if any(t is not None for t in tags) else None,
        "p_sig": sigs if any(s is not None for s in sigs) else None,
        "now": now,
        "turn_id": turn_id,
        "recorder": recorder,
    }


# The passings each turn counted, one row each, kept from events by their triggers
# (mnestoma.schema.sql.partitions): its primary key (turn_id, mnest_id, occurrence) refuses a
# second count.
_TURN_EDGES = table(
    SIDE_TABLE_NAME,
    column("turn_id", String),
    column("mnest_id", String),
    column("occurrence", Integer),
)

# An occurrence's step: created now, reinforced now, or counted by the turn already.
_STEP_CREATED = PASSED_CREATED
_STEP_REINFORCED = PASSED_REINFORCED
_STEP_COUNTED = PASSED_COUNTED


def _array(name: str, item: Any) -> Any:
    """A bound array of ``item`` values (one statement for a turn of any size)."""
    return bindparam(name, type_=ARRAY(item))


def _text(value: str) -> ColumnElement[str]:
    """A string written into the statement, typed as VARCHAR."""
    return literal_column(f"'{value}'", String)


@functools.cache
def pg_turn() -> Select[Any]:
    """A turn on PostgreSQL as one statement; its rows: the flag (``PASSED_*``: reinforced,
    created, or left as it was, every occurrence counted already), the edge's number (1-based,
    as in :func:`pg_turn_params`), then the row after the turn in
    :data:`~mnestoma.schema.sql.tables.MNEST_COLUMNS` order. An edge is missing when another
    transaction created its key meanwhile: the statement's other writes are then to be
    undone (its caller runs it in a savepoint), and its chains are not counted."""
    now = sqlrules.now_param()
    turn_id = _param("turn_id", "turn_id", E)
    edges = select(
        func.unnest(
            _array("e_exists", Boolean),
            _array("e_s", String),
            _array("e_sv", String),
            _array("e_d", String),
            _array("e_dv", String),
            _array("e_new_id", String),
            _array("e_n", Integer),
            _array("e_rank", Integer),
        )
        .table_valued(
            column("dst_exists", Boolean),
            column("s", String),
            column("sv", String),
            column("d", String),
            column("dv", String),
            column("new_id", String),
            column("n", Integer),
            column("rank", Integer),
            with_ordinality="i",
        )
        .render_derived(name="e")
    ).cte("turn_edges")
    unnested = (
        func.unnest(
            _array("p_edge", Integer),
            _array("p_occ", Integer),
            _array("p_ok", Integer),
            _array("p_error", Integer),
            _array("p_outcome", String),
        )
        .table_valued(
            column("edge", Integer),
            column("occ", Integer),
            column("ok", Integer),
            column("error", Integer),
            column("outcome", String),
            with_ordinality="ord",
        )
        .render_derived(name="p")
    )
    at = cast(unnested.c.ord - 1, Integer)
    json_null = literal_column("'null'::jsonb", M.c.tags.type)
    given = select(
        unnested.c.ord,
        unnested.c.edge,
        unnested.c.occ,
        unnested.c.ok,
        unnested.c.error,
        unnested.c.outcome,
        func.nullif(_param("p_tags", "tags")[at], json_null).label("tags"),
        func.nullif(_param("p_sig", "desired_sig")[at], json_null).label("sig"),
    ).cte("turn_passings")
    e, g = edges.c, given.c
    # Each key's live row, locked in id order (the one order every turn locks in): found
    # through the key's unique index (a versioned key's or a proto's, whichever the edge
    # is), then locked by id, its key and state checked on the row itself (so that a row
    # another writer demoted or promoted meanwhile, checked again once locked, drops out).
    versioned, proto = M.alias("versioned"), M.alias("proto_row")
    hit = union_all(
        select(versioned.c.id).where(
            e.dst_exists,
            versioned.c.src_executor == e.s,
            versioned.c.src_version == e.sv,
            versioned.c.dst_executor == e.d,
            versioned.c.dst_version == e.dv,
            state_is(versioned, MnestState.ACTIVE),
        ),
        select(proto.c.id).where(
            ~e.dst_exists,
            proto.c.src_executor == e.s,
            proto.c.src_version == e.sv,
            proto.c.dst_executor == e.d,
            proto.c.dst_version.is_(None),
            state_is(proto, MnestState.PROTO),
        ),
    ).lateral("hit")
    # the state of the key's live row: active, or proto
    live = case((e.dst_exists, _text(MnestState.ACTIVE.value)), else_=_text(MnestState.PROTO.value))
    found = and_(
        M.c.id == hit.c.id,
        M.c.src_executor == e.s,
        M.c.src_version == e.sv,
        M.c.dst_executor == e.d,
        M.c.dst_version.is_not_distinct_from(e.dv),
        M.c.state == live,
    )
    locked = (
        select(e.i.label("edge"), *M.c)
        .select_from(edges.join(hit, true()).join(M, found))
        .order_by(M.c.id)
        .with_for_update(of=M)
        .cte("locked")
    )
    lk = locked.c
    # What the turn counted already (as this statement's snapshot sees it): read once, from
    # the table whose primary key makes each (turn, row, occurrence) count once, where the
    # turn's rows are together (not from every month of events); a handful of rows.
    counted = (
        select(_TURN_EDGES.c.mnest_id, _TURN_EDGES.c.occurrence)
        .where(_TURN_EDGES.c.turn_id == turn_id)
        .cte("counted")
        .prefix_with("MATERIALIZED")
    )
    # Each passing, and whether the turn counted it already (this occurrence of its edge's
    # locked row).
    done = exists(
        select(counted.c.mnest_id).where(counted.c.mnest_id == lk.id, counted.c.occurrence == g.occ)
    )
    occurrences = (
        select(given, done.label("done"))
        .select_from(given.outerjoin(locked, lk.edge == g.edge))
        .cte("turn_occurrences")
    )
    g = occurrences.c
    # Each edge's occurrences one after another, from its locked row (or from no row).
    kinds: dict[str, Any] = {
        "edge": BigInteger,
        "j": Integer,
        "id": String,
        "weight": Float,
        "uses": Integer,
        "ts_first": M.c.ts_first.type,
        "ts_last": M.c.ts_last.type,
        "ts_weight": M.c.ts_weight.type,
        "decay_lambda": Float,
        "state": String,
        "tags": M.c.tags.type,
        "desired_sig": M.c.desired_sig.type,
        "ok_count": Integer,
        "error_count": Integer,
        "decayed_uses": Float,
        "weight_before": Float,
        "step": String,
        "fresh": Boolean,
        "applied": Integer,
    }

    def typed(values: dict[str, Any]) -> list[Any]:
        # Both terms of the recursive CTE typed alike (PostgreSQL compares their types).
        return [cast(values[n], t).label(n) for n, t in kinds.items()]

    start = select(
        *typed(
            {
                "edge": e.i,
                "j": literal(0, Integer),
                **{n: lk[n] for n in MNEST_COLUMNS if n in kinds and n != "state"},
                "state": lk.state,
                "weight_before": null(),
                "step": literal(""),
                "fresh": literal(False),
                "applied": literal(0, Integer),
            }
        )
    ).select_from(edges.outerjoin(locked, lk.edge == e.i))
    steps = start.cte("turn_steps", recursive=True)
    prev = steps.alias("prev")
    pc = prev.c
    ts_last = sqlrules.advanced(pc.ts_last, now)
    ts_weight = sqlrules.advanced(pc.ts_weight, now)
    moved = (
        select(ts_last.label("ts_last"), ts_weight.label("ts_weight"))
        .correlate(prev)
        .lateral("moved")
    )
    decayed = (
        select(
            sqlrules.decayed(
                pc.weight, pc.decay_lambda, pc.ts_weight, moved.c.ts_weight, exact=True
            ).label("weight_before"),
            sqlrules.passing_count(
                pc.decayed_uses, pc.decay_lambda, pc.ts_last, moved.c.ts_last
            ).label("decayed_uses"),
        )
        .correlate(prev, moved)
        .lateral("decayed")
    )
    step = case(
        (pc.id.is_(None), _text(_STEP_CREATED)),
        (g.done, _text(_STEP_COUNTED)),
        else_=_text(_STEP_REINFORCED),
    )
    kind = select(step.label("step")).correlate(prev, occurrences).lateral("kind")
    k = kind.c.step
    created_now, reinforced_now = k == _text(_STEP_CREATED), k == _text(_STEP_REINFORCED)
    counted_now = k == _text(_STEP_COUNTED)

    def by_step(created: Any, reinforced: Any, kept: Any) -> Any:
        return case((created_now, created), (reinforced_now, reinforced), else_=kept)

    following = (
        select(
            *typed(
                {
                    "edge": pc.edge,
                    "j": pc.j + 1,
                    "id": case((created_now, e.new_id), else_=pc.id),
                    "weight": by_step(
                        literal(INITIAL_WEIGHT, Float),
                        sqlrules.reinforce(decayed.c.weight_before),
                        pc.weight,
                    ),
                    "uses": by_step(literal(1, Integer), pc.uses + 1, pc.uses),
                    "ts_first": case((created_now, now), else_=pc.ts_first),
                    "ts_last": by_step(now, moved.c.ts_last, pc.ts_last),
                    "ts_weight": by_step(now, moved.c.ts_weight, pc.ts_weight),
                    "decay_lambda": case(
                        (created_now, literal(DEFAULT_DECAY_LAMBDA, Float)),
                        else_=pc.decay_lambda,
                    ),
                    "state": case((created_now, live), else_=pc.state),
                    "tags": by_step(g.tags, func.coalesce(g.tags, pc.tags), pc.tags),
                    "desired_sig": by_step(
                        g.sig, func.coalesce(g.sig, pc.desired_sig), pc.desired_sig
                    ),
                    "ok_count": by_step(g.ok, pc.ok_count + g.ok, pc.ok_count),
                    "error_count": by_step(g.error, pc.error_count + g.error, pc.error_count),
                    "decayed_uses": by_step(
                        literal(1.0, Float), decayed.c.decayed_uses, pc.decayed_uses
                    ),
                    "weight_before": case((reinforced_now, decayed.c.weight_before), else_=null()),
                    "step": k,
                    "fresh": or_(pc.fresh, created_now),
                    "applied": pc.applied
                    + case((counted_now, literal(0, Integer)), else_=literal(1, Integer)),
                }
            )
        )
        .select_from(prev)
        .join(occurrences, and_(g.edge == pc.edge, g.occ == pc.j + 1))
        .join(edges, e.i == pc.edge)
        .join(moved, true())
        .join(decayed, true())
        .join(kind, true())
    )
    steps = steps.union_all(following)
    st = steps.c
    # Each edge after its last occurrence.
    final = (
        select(steps, e.s, e.sv, e.d, e.dv, e.rank)
        .select_from(steps.join(edges, and_(e.i == st.edge, e.n == st.j)))
        .cte("turn_final")
    )
    f = final.c
    values = {
        "weight": f.weight,
        "uses": f.uses,
        "ts_last": f.ts_last,
        "ts_weight": f.ts_weight,
        "tags": f.tags,
        "desired_sig": f.desired_sig,
        "ok_count": f.ok_count,
        "error_count": f.error_count,
        "decayed_uses": f.decayed_uses,
    }
    reinforced_rows = (
        update(M)
        .where(M.c.id == f.id, ~f.fresh, f.applied > 0)
        .values(**values)
        .returning(M.c.id)
        .cte("turn_reinforced")
    )
    new_row = {
        **{n: f[n] for n in MNEST_COLUMNS if n in kinds},
        "src_executor": f.s,
        "src_version": f.sv,
        "dst_executor": f.d,
        "dst_version": f.dv,
    }
    created_rows = (
        spelling_of("postgresql")
        .insert(M)
        .from_select(
            list(MNEST_COLUMNS),
            select(*(new_row[n] for n in MNEST_COLUMNS)).where(f.fresh).order_by(f.rank),
        )
        .on_conflict_do_nothing()
        .returning(M.c.id)
        .cte("turn_created")
    )
    # Every creation went in (else the attempt is undone and run again).
    all_created = select(func.count()).select_from(created_rows).scalar_subquery() == (
        select(func.count()).select_from(final).where(f.fresh).scalar_subquery()
    )
    # The passings' events, in the order the writes before one statement wrote them: the
    # reinforcements of existing rows edge by edge, then the new rows in key order.
    is_created = st.step == _text(_STEP_CREATED)
    event = tables.EventRow(
        mnest_id=st.id,
        kind=case(
            (is_created, _text(EventKind.CREATED.value)),
            else_=_text(EventKind.REINFORCED.value),
        ),
        ts=st.ts_last,
        turn_id=turn_id,
        weight_before=st.weight_before,
        weight_after=st.weight,
        state_before=case((is_created, null()), else_=st.state),
        state_after=st.state,
        recorder=_param("recorder", "recorder", E),
        outcome=g.outcome,
        occurrence=st.j,
    )
    written_events = (
        insert(E)
        .from_select(
            list(EVENT_ROW),
            select(*event.select_list())
            .select_from(
                steps.join(occurrences, and_(g.edge == st.edge, g.occ == st.j)).join(
                    edges, e.i == st.edge
                )
            )
            .where(st.step.in_([_text(_STEP_CREATED), _text(_STEP_REINFORCED)]))
            .order_by(st.fresh, case((st.fresh, e.rank), else_=e.i), st.j),
        )
        .cte("turn_events")
    )
    chains = _turn_chains(edges, occurrences, steps, all_created, now)
    flag = case(
        (f.fresh, _text(PASSED_CREATED)),
        (f.applied > 0, _text(PASSED_REINFORCED)),
        else_=_text(PASSED_COUNTED),
    )
    row = {**{n: f[n] for n in MNEST_COLUMNS if n in kinds}, **new_row}
    typed_row = [type_coerce(row[n], M.c[n].type).label(n) for n in MNEST_COLUMNS]
    rows = select(flag.label("flag"), f.edge, *typed_row).where(
        or_(~f.fresh, f.id.in_(select(created_rows.c.id)))
    )
    return rows.add_cte(reinforced_rows, written_events, chains)


def _turn_chains(edges: Any, given: Any, steps: Any, all_created: Any, now: Any) -> Any:
    """The turn's chains (contract §13) as ``rules.chain_increments`` counts them: for each
    passing this statement counts to an existing destination (proto links are left out),
    the latest earlier link of the turn that ended at its source is its predecessor. Counted
    in key order, once the turn's new rows are in (so after every row lock of the turn), and
    only when every one of them went in."""
    e, g, st = edges.c, given.c, steps.c
    counts = st.step.in_([_text(_STEP_CREATED), _text(_STEP_REINFORCED)])
    links = (
        select(g.ord, e.s, e.d, counts.label("counts"))
        .select_from(
            given.join(edges, e.i == g.edge).join(steps, and_(st.edge == g.edge, st.j == g.occ))
        )
        .where(e.dst_exists)
        .cte("turn_links")
    )
    # Each link leaves its source and, after that, reaches its destination; at a link's
    # leaving, the latest link that reached its source before is its predecessor (a running
    # maximum per executor: linear in the turn, where a search per link was quadratic).
    ends = union_all(
        select(links.c.s.label("at"), links.c.ord, literal(0, Integer).label("reaches")),
        select(links.c.d.label("at"), links.c.ord, literal(1, Integer).label("reaches")),
    ).subquery("ends")
    latest_arrival = func.max(case((ends.c.reaches == 1, ends.c.ord))).over(
        partition_by=ends.c.at, order_by=[ends.c.ord, ends.c.reaches], rows=(None, 0)
    )
    leaving = select(ends.c.ord, latest_arrival.label("came_by"), ends.c.reaches).subquery(
        "leaving"
    )
    link, before = links.alias("link"), links.alias("came_by")
    added = (
        select(
            before.c.s.label("prev"),
            link.c.s.label("src"),
            link.c.d.label("dst"),
            func.count().label("n"),
        )
        .select_from(
            leaving.join(link, link.c.ord == leaving.c.ord).join(
                before, before.c.ord == leaving.c.came_by
            )
        )
        .where(leaving.c.reaches == 0, link.c.counts)
        .group_by(before.c.s, link.c.s, link.c.d)
        .subquery("added")
    )
    a = added.c
    in_key_order = [a.prev.collate("C"), a.src.collate("C"), a.dst.collate("C")]
    counted = (
        select(a.prev, a.src, a.dst, cast(a.n, Float), cast(a.n, BigInteger), now, now)
        .where(all_created)
        .order_by(*in_key_order)
    )
    return chains_sql.count_chains_from(counted).cte("turn_chains")
