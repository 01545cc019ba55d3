"""The ager's statements, built once per dialect.

Rows are visited in table order by full scans (most rows match, and an index on the state
would visit them in random order: one page read per row), and each effective weight is
computed once per statement that needs it. Merges go through their pairs, whose cost stays
linear whatever the plan: SQLite keeps them in a temporary table and reaches rows by rowid;
PostgreSQL merges in one statement. On PostgreSQL, prune and demote write their events in
the statement that changes the rows (``WITH ... RETURNING``).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.schema import CreateTable, DropTable
from sqlalchemy.sql.elements import ColumnClause, TextClause, UnaryExpression
from sqlalchemy.sql.operators import custom_op
from sqlalchemy.types import UserDefinedType

from ..rules import (
    ARCHIVE_BELOW,
    DECAYING_BELOW,
    PROTO_PRUNE_BELOW,
    SUMMED_ON_MERGE,
    EventKind,
    MnestState,
    Recorder,
)
from ..sqlrules import advanced, below, decayed, greatest, least, now_param
from ..types import UTCDateTime
from .tables import AGER_PROGRESS as P
from .tables import EVENTS as E
from .tables import MNESTS as M

__all__ = [
    "PAIRS",
    "PROGRESS_BEGIN",
    "PROGRESS_DONE",
    "PROGRESS_MOVE",
    "ager_statements",
    "cache_size_pragma",
]

# A run's row in ager_progress: inserted when it begins (its id returned), moved on by each
# batch in the batch's transaction, deleted with the rows of the runs before it (which the
# run completed, as it holds the run lock) in the transaction that writes its ager_runs row.
PROGRESS_BEGIN = insert(P).returning(P.c.id)
PROGRESS_MOVE = (
    update(P)
    .where(P.c.id == bindparam("run_id"))
    .values(
        batches=bindparam("batches"),
        position=bindparam("position"),
        updated=bindparam("updated"),
    )
)
PROGRESS_DONE = delete(P).where(P.c.id <= bindparam("run_id"))

ACTIVE = MnestState.ACTIVE.value
PROTO = MnestState.PROTO.value
DECAYING = MnestState.DECAYING.value

EVENT_COLUMNS = [
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

# SQLite: the run's merge pairs, keyed by the decaying row's rowid (a key has at most one
# active and one decaying row, so either rowid identifies a pair). Created and dropped by
# each run, inside its transaction.
PAIRS = Table(
    "mnestoma_ager_pairs",
    MetaData(),
    Column("d_rowid", Integer, primary_key=True),
    Column("a_rowid", Integer, nullable=False),
    Column("a_id", String(64), nullable=False),
    Column("d_id", String(64), nullable=False),
    Column("a_eff", Float, nullable=False),
    Column("d_eff", Float, nullable=False),
    *(Column(f"a_{c}", Integer, nullable=False) for c in SUMMED_ON_MERGE),
    Column("a_first", UTCDateTime, nullable=False),
    Column("a_last", UTCDateTime, nullable=False),
    schema="temp",
)


def _unindexed(column: Any) -> ColumnElement[Any]:
    """SQLite's ``+column``: an expression no index can serve, so that the planner scans
    the table in its order instead of visiting rows in index order."""
    return UnaryExpression(column, operator=custom_op("+"), type_=column.type)


def _rowid(table: Any) -> ColumnClause[int]:
    """SQLite's ``rowid`` of ``table`` (a table or an alias)."""
    return ColumnClause("rowid", Integer(), _selectable=table)


def _event(dialect: str, now: Any, *values: Any) -> list[Any]:
    """One event's select list, in :data:`EVENT_COLUMNS` order, recorded by the ager:
    ``mnest_id, kind, weight_before, weight_after, state_before, state_after, related_id``."""
    mnest_id, kind, before, after, state_before, state_after, related = values
    ts = now.cast(UTCDateTime()) if dialect == "postgresql" else now

    def lit(value: Any) -> Any:
        return literal(value) if value is None or isinstance(value, str) else value

    return [
        mnest_id,
        literal(kind),
        ts,
        before,
        lit(after),
        lit(state_before),
        lit(state_after),
        lit(related),
        literal(Recorder.AGER.value),
    ]


def _pairs_select(dialect: str, now: Any, batched: bool = False) -> Any:
    """Actives below 0.20 whose key has a decaying row: one row per pair, with what the
    merge needs of each. No plan may reach one side through an index on part of the key
    (the (state, src) or the dst_executor index), nor scan one side for each row of the
    other: for a hub, each of its rows would read all the hub's edges, quadratic in its
    degree. SQLite's plan (no statistics) is fixed by the query; PostgreSQL's depends on
    statistics it may not have (after a bulk load), so there the pairs come without a
    join. With ``batched``, the pairs whose active row is in the batch (``:lo``, ``:hi``)."""
    if dialect == "sqlite":
        return _sqlite_pairs(now, batched)
    return _postgresql_batch_pairs(now) if batched else _postgresql_pairs(now)


def _sqlite_pairs(now: Any, batched: bool) -> Any:
    """From the decaying rows, each active twin looked up by the whole edge key (its state
    compared unindexed, so that the edge-key index is the only one that matches). With
    ``batched``, from the batch's actives (a rowid range) instead, each decaying twin looked
    up by the whole key (its state a literal of that index): linear in the batch."""
    a, d = M.alias("a"), M.alias("d")
    eff_a = decayed("sqlite", a.c.weight, a.c.decay_lambda, a.c.ts_weight, now)
    eff_d = decayed("sqlite", d.c.weight, d.c.decay_lambda, d.c.ts_weight, now)
    key = ("src_executor", "src_version", "dst_executor", "dst_version")
    same_key = and_(*(a.c[k] == d.c[k] for k in key))
    active = _unindexed(a.c.state) == ACTIVE
    if batched:
        joined = a.join(d, and_(same_key, d.c.state == DECAYING))
        where = [_in_batch("sqlite", a), active, a.c.dst_version.is_not(None)]
    else:
        joined = d.join(a, and_(same_key, active))
        where = [d.c.state == DECAYING, d.c.dst_version.is_not(None)]
    return (
        select(
            _rowid(d).label("d_rowid"),
            _rowid(a).label("a_rowid"),
            a.c.id.label("a_id"),
            d.c.id.label("d_id"),
            eff_a.label("a_eff"),
            eff_d.label("d_eff"),
            *(a.c[c].label(f"a_{c}") for c in SUMMED_ON_MERGE),
            a.c.ts_first.label("a_first"),
            a.c.ts_last.label("a_last"),
        )
        .select_from(joined)
        .where(*where, below(eff_a, DECAYING_BELOW))
    )


def _postgresql_pairs(now: Any) -> Any:
    """One pass over the candidates (actives below 0.20 and decaying rows) grouped by key (a
    key holds at most one row per state): linear whatever the plan, with or without
    statistics (a join on the key, planned without them, can take the dst_executor or the
    (state, src) index, or scan one side for each row of the other); nothing is read when
    the store holds no versioned decaying row."""
    eff = decayed("postgresql", M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    active = M.c.state == ACTIVE
    decaying = M.c.state == DECAYING

    def of(which: Any, column: Any) -> Any:
        return func.max(case((which, column)))

    any_decaying = select(M.c.id).where(decaying, M.c.dst_version.is_not(None)).exists()
    return (
        select(
            of(active, M.c.id).label("a_id"),
            of(decaying, M.c.id).label("d_id"),
            of(active, eff).label("a_eff"),
            of(decaying, eff).label("d_eff"),
            *(of(active, M.c[c]).label(f"a_{c}") for c in SUMMED_ON_MERGE),
            of(active, M.c.ts_first).label("a_first"),
            of(active, M.c.ts_last).label("a_last"),
        )
        .where(
            any_decaying,
            M.c.dst_version.is_not(None),
            or_(and_(active, below(eff, DECAYING_BELOW)), decaying),
        )
        .group_by(M.c.src_executor, M.c.src_version, M.c.dst_executor, M.c.dst_version)
        .having(and_(of(active, M.c.id).is_not(None), of(decaying, M.c.id).is_not(None)))
    )


def _postgresql_batch_pairs(now: Any) -> Any:
    """The merge pairs whose active row is in the batch: the batch's actives below 0.20
    (a page range), each decaying twin looked up by the whole edge key (a lateral lookup,
    one probe of the edge-key index per candidate, whatever the statistics say)."""
    pg = "postgresql"
    a, d = M.alias("a"), M.alias("d")
    eff_a = decayed(pg, a.c.weight, a.c.decay_lambda, a.c.ts_weight, now)
    eff_d = decayed(pg, d.c.weight, d.c.decay_lambda, d.c.ts_weight, now)
    key = ("src_executor", "src_version", "dst_executor", "dst_version")
    twin = (
        select(d.c.id.label("d_id"), eff_d.label("d_eff"))
        .where(
            *(d.c[k] == a.c[k] for k in key), d.c.state == DECAYING, d.c.dst_version.is_not(None)
        )
        .limit(1)
        .lateral("twin")
    )
    return (
        select(
            a.c.id.label("a_id"),
            twin.c.d_id,
            eff_a.label("a_eff"),
            twin.c.d_eff,
            *(a.c[c].label(f"a_{c}") for c in SUMMED_ON_MERGE),
            a.c.ts_first.label("a_first"),
            a.c.ts_last.label("a_last"),
        )
        .select_from(a.join(twin, literal(True)))
        .where(
            _in_batch(pg, a),
            a.c.state == ACTIVE,
            a.c.dst_version.is_not(None),
            below(eff_a, DECAYING_BELOW),
        )
    )


def _merged_weight(dialect: str, pairs: Any) -> Any:
    return greatest(dialect, pairs.c.a_eff, pairs.c.d_eff)


def _merge_events(dialect: str, now: Any, pairs: Any) -> tuple[Any, Any]:
    """The two events of each merge: the absorbed active row's and its decaying twin's."""
    weight = _merged_weight(dialect, pairs)
    merged = EventKind.MERGED.value
    absorbed = _event(
        dialect, now, pairs.c.a_id, merged, pairs.c.a_eff, weight, ACTIVE, DECAYING, pairs.c.d_id
    )
    target = _event(
        dialect, now, pairs.c.d_id, merged, pairs.c.d_eff, weight, DECAYING, DECAYING, pairs.c.a_id
    )
    return select(*absorbed), select(*target)


def _merge_values(dialect: str, now: Any, pairs: Any) -> dict[str, Any]:
    """What a merge writes into the decaying row."""
    return {
        **{c: M.c[c] + pairs.c[f"a_{c}"] for c in SUMMED_ON_MERGE},
        "ts_first": least(dialect, M.c.ts_first, pairs.c.a_first),
        "ts_last": greatest(dialect, M.c.ts_last, pairs.c.a_last),
        "weight": _merged_weight(dialect, pairs),
        "ts_weight": advanced(M.c.ts_weight, now),
    }


def _in_batch(dialect: str, table: Any) -> ColumnElement[bool]:
    """The rows of one batch of a run: SQLite rowids in ``[:lo, :hi)``, PostgreSQL pages
    (``ctid`` blocks) in ``[:lo, :hi)``. Either is a range of the table's own order, read
    by a range scan (SQLite's rowid, PostgreSQL's TID range scan), never through an index."""
    if dialect == "sqlite":
        rowid = _rowid(table)
        return and_(rowid >= bindparam("lo", type_=Integer), rowid < bindparam("hi", type_=Integer))
    ctid = ColumnClause("ctid", TID(), _selectable=table)
    return and_(ctid >= _tid(bindparam("lo")), ctid < _tid(bindparam("hi")))


class TID(UserDefinedType[str]):
    """PostgreSQL's ``tid``: a row's (page, item) address."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "tid"


def _tid(page: Any) -> Any:
    """The address of item 0 of page ``page`` (an integer), as a ``tid``."""
    return cast(func.concat("(", cast(page, BigInteger), ",0)"), TID())


def _sqlite(now: Any, batched: bool) -> dict[str, Any]:
    eff = decayed("sqlite", M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    state = _unindexed(M.c.state)
    in_batch = (_in_batch("sqlite", M),) if batched else ()
    p = PAIRS
    pairs = _pairs_select("sqlite", now, batched)
    stmts: dict[str, Any] = {
        "pairs_create": CreateTable(p),
        "pairs": insert(p).from_select([c.name for c in p.columns], pairs),
    }
    absorbed, target = _merge_events("sqlite", now, p)
    stmts["merge_events"] = insert(E).from_select(EVENT_COLUMNS, union_all(absorbed, target))
    # Reached by rowid from the pairs (an UPDATE ... FROM would scan mnests for them).
    pair = p.alias("pair")
    merge_values = {
        name: select(value).where(pair.c.d_rowid == _rowid(M)).scalar_subquery()
        for name, value in _merge_values("sqlite", now, pair).items()
    }
    stmts["merge_update"] = update(M).where(_rowid(M).in_(select(p.c.d_rowid))).values(merge_values)
    stmts["merge_delete"] = delete(M).where(_rowid(M).in_(select(p.c.a_rowid)))

    # One scan writes the events of every proto pruned and every active demoted below,
    # each weight computed once (the LIMIT keeps SQLite from copying the expression out of
    # the subquery into each place that uses it).
    moving = (
        select(M.c.id, M.c.state, eff.label("e"))
        .where(state.in_([ACTIVE, PROTO]), *in_batch)
        .limit(-1)
        .subquery("moving")
    )
    is_proto = moving.c.state == PROTO

    def when_proto(then: Any, otherwise: Any) -> Any:
        return case((is_proto, then), else_=otherwise)

    moves = [
        moving.c.id,
        when_proto(literal(EventKind.PRUNED.value), literal(EventKind.TRANSITION.value)),
        now,
        moving.c.e,
        when_proto(literal(None), moving.c.e),
        moving.c.state,
        when_proto(literal(None), literal(DECAYING)),
        literal(None),
        literal(Recorder.AGER.value),
    ]
    stmts["moves_events"] = insert(E).from_select(
        EVENT_COLUMNS,
        select(*moves).where(
            or_(
                and_(is_proto, below(moving.c.e, PROTO_PRUNE_BELOW)),
                and_(~is_proto, below(moving.c.e, DECAYING_BELOW)),
            )
        ),
    )
    stmts["prune"] = delete(M).where(state == PROTO, below(eff, PROTO_PRUNE_BELOW), *in_batch)
    # Demoted and decayed rows are written by two statements: a statement that sets
    # ``state`` rewrites the entries of every index holding it, for each row it touches.
    stmts["demote"] = (
        update(M)
        .where(state == ACTIVE, below(eff, DECAYING_BELOW), *in_batch)
        .values(state=DECAYING, weight=eff, ts_weight=advanced(M.c.ts_weight, now))
    )
    stmts["decay"] = (
        update(M)
        .where(state.in_([ACTIVE, PROTO]), M.c.ts_weight < now, *in_batch)
        .values(weight=eff, ts_weight=now)
    )
    stmts["archive_count"] = _archive_count("sqlite", now, state)
    stmts["pairs_drop"] = DropTable(p, if_exists=True)
    # The run's rowids (those the table has when it begins) and its rows.
    stmts["bounds"] = select(func.min(_rowid(M)), func.max(_rowid(M)) + 1, func.count())
    stmts["cache_size"] = text("PRAGMA cache_size")
    stmts["page_size"] = text("PRAGMA page_size")
    return stmts


def _archive_count(dialect: str, now: Any, state: Any) -> Any:
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    return select(func.count()).where(
        state == DECAYING,
        M.c.ts_last <= bindparam("cutoff", type_=UTCDateTime()),
        below(eff, ARCHIVE_BELOW),
    )


def _postgresql(now: Any, batched: bool) -> dict[str, Any]:
    pg = "postgresql"
    eff = decayed(pg, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    in_batch = (_in_batch(pg, M),) if batched else ()

    # The merges, one statement: the pairs once, their events, the decaying rows updated,
    # the active rows deleted (its row count).
    pairs = _pairs_select(pg, now, batched).cte("pairs").prefix_with("MATERIALIZED")
    absorbed, target = _merge_events(pg, now, pairs)
    merge_absorbed = insert(E).from_select(EVENT_COLUMNS, absorbed).cte("merge_absorbed")
    merge_target = insert(E).from_select(EVENT_COLUMNS, target).cte("merge_target")
    merge_update = (
        update(M)
        .where(M.c.id == pairs.c.d_id)
        .values(_merge_values(pg, now, pairs))
        .cte("merge_update")
    )
    merge = (
        delete(M)
        .where(M.c.id.in_(select(pairs.c.a_id)))
        .add_cte(merge_absorbed, merge_target, merge_update)
    )

    # Prune and demote write their events from the rows they change (RETURNING): the
    # effective weight is computed by the statement that changes the row, and only there.
    gone = (
        delete(M)
        .where(M.c.state == PROTO, below(eff, PROTO_PRUNE_BELOW), *in_batch)
        .returning(M.c.id, eff.label("e"))
        .cte("gone")
    )
    pruned = _event(pg, now, gone.c.id, EventKind.PRUNED.value, gone.c.e, None, PROTO, None, None)
    # (an INSERT's row count is read after the statement only when asked to keep it)
    prune = insert(E).from_select(EVENT_COLUMNS, select(*pruned))
    prune = prune.execution_options(preserve_rowcount=True)
    moved = (
        update(M)
        .where(M.c.state == ACTIVE, below(eff, DECAYING_BELOW), *in_batch)
        .values(state=DECAYING, weight=eff, ts_weight=advanced(M.c.ts_weight, now))
        .returning(M.c.id, M.c.weight)
        .cte("moved")
    )
    transition = EventKind.TRANSITION.value
    demoted = _event(
        pg, now, moved.c.id, transition, moved.c.weight, moved.c.weight, ACTIVE, DECAYING, None
    )
    demote = insert(E).from_select(EVENT_COLUMNS, select(*demoted))
    demote = demote.execution_options(preserve_rowcount=True)
    # The rows that stay are decayed before the others are demoted: an update that changes
    # no indexed column can stay on its page (HOT, no index entry written) where the page
    # has room, and the demotions (which change ``state``) would take that room first.
    stays = or_(
        and_(M.c.state == PROTO, ~below(eff, PROTO_PRUNE_BELOW)),
        and_(M.c.state == ACTIVE, ~below(eff, DECAYING_BELOW)),
    )
    decay = (
        update(M)
        .where(M.c.state.in_([ACTIVE, PROTO]), M.c.ts_weight < now, stays, *in_batch)
        .values(weight=eff, ts_weight=now)
    )
    return {
        # EXCLUSIVE also conflicts with the ROW SHARE lock of a writer's SELECT ... FOR
        # UPDATE: the ager waits for writers that hold row locks, never the reverse.
        "lock": text("LOCK TABLE mnests IN EXCLUSIVE MODE"),
        # A batch's commit does not wait for its WAL to reach the disk: a crash may lose the
        # last batches, which (like a killed run's) the next run redoes; the run's last
        # transaction (its ager_runs row) is durable, and with it every batch before.
        "async_commit": text("SET LOCAL synchronous_commit TO OFF"),
        # Other sessions holding a lock on mnests now (writers in a transaction).
        "writers_in": text(
            "SELECT count(*) FROM pg_locks"
            " WHERE relation = 'mnests'::regclass AND pid <> pg_backend_pid()"
        ),
        "merge": merge,
        "prune": prune,
        "decay": decay,
        "demote": demote,
        "archive_count": _archive_count(pg, now, M.c.state),
        # The run's pages (those the table has when it begins) and its rows, for the batch
        # size in pages.
        "bounds": select(
            literal(0, BigInteger),
            func.pg_relation_size(text("'mnests'::regclass"))
            / func.current_setting("block_size").cast(BigInteger),
            select(func.count()).select_from(M).scalar_subquery(),
        ),
    }


def cache_size_pragma(value: int) -> TextClause:
    """``PRAGMA cache_size = value`` (SQLite; negative: KiB, positive: pages)."""
    return text(f"PRAGMA cache_size = {int(value)}")


def ager_statements(dialect: str, batched: bool = False) -> dict[str, Any]:
    """The ager's statements for ``dialect`` (``sqlite`` or ``postgresql``), by name; with
    ``batched``, those that change rows take one batch's range (``:lo``, ``:hi``). Built
    once per (dialect, batched), however the arguments are spelled."""
    return _statements(dialect, bool(batched))


@functools.cache
def _statements(dialect: str, batched: bool) -> dict[str, Any]:
    now = now_param()
    return _postgresql(now, batched) if dialect == "postgresql" else _sqlite(now, batched)
