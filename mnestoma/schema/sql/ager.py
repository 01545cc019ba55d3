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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable, DropTable
from sqlalchemy.sql import Executable
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import UserDefinedType

from mnestoma.core.rules import (
    AGER_FLUSH_AFTER_KIB,
    AGER_ROW_LOCK_TIMEOUT_S,
    ARCHIVE_BELOW,
    DECAYING_BELOW,
    PROTO_PRUNE_BELOW,
    SUMMED_ON_MERGE,
    AgerCount,
    EventKind,
    MnestState,
    Recorder,
)
from mnestoma.core.sqlrules import (
    advanced,
    below,
    decayed,
    greatest,
    least,
    merged_count,
    now_param,
)
from mnestoma.core.types import UTCDateTime
from mnestoma.schema.sql.spelling import spelling_of
from mnestoma.schema.sql.tables import AGER_PROGRESS as P
from mnestoma.schema.sql.tables import EVENT_ROW, EventRow
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNESTS as M

if TYPE_CHECKING:
    from sqlalchemy import Insert, Select, TextClause
    from sqlalchemy.sql.compiler import SQLCompiler
    from sqlalchemy.sql.selectable import NamedFromClause

__all__ = [
    "ADVISORY_HELD",
    "ADVISORY_LOCK",
    "ADVISORY_TRY_LOCK",
    "ADVISORY_UNLOCK",
    "MERGE",
    "PAIRS",
    "PAIRS_STEP",
    "PROGRESS_BEGIN",
    "PROGRESS_DONE",
    "PROGRESS_MOVE",
    "PostgreSQLAgerStatements",
    "SQLiteAgerStatements",
    "ager_statements",
    "cache_size_pragma",
    "postgresql_ager_statements",
    "sqlite_ager_statements",
    "wal_autocheckpoint_pragma",
]

# A run's row in ager_progress: inserted when it begins (its id returned), moved on by each
# batch in the batch's transaction, deleted with the rows of the runs before it (which the
# run completed, as it holds the run lock) in the transaction that writes its ager_runs row.
# The ager's run lock on PostgreSQL: a session advisory lock (``key``), and whether some
# session of this database holds it (``hi``, ``lo``: the key's halves, as pg_locks shows it).
ADVISORY_LOCK = text("SELECT pg_advisory_lock(:key)")
# A run that its caller may stop while it waits (async) tries, and looks again, instead.
ADVISORY_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
ADVISORY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")
ADVISORY_HELD = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1"
)
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

# The name of PostgreSQL's merge step, which a batch skips when its run needs no merge.
MERGE = "merge"
# The name of SQLite's first merge step (the pairs into PAIRS): when it finds none, the
# batch skips the other merge steps.
PAIRS_STEP = "pairs"

ACTIVE = MnestState.ACTIVE.value
PROTO = MnestState.PROTO.value
DECAYING = MnestState.DECAYING.value

# SQLite: the run's merge pairs, keyed by the decaying row's rowid (a key has at most one
# active and one decaying row, so either rowid identifies a pair). Created and dropped by
# a run in one transaction, inside it; by a run in batches once, emptied before each step.
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
    Column("a_decayed_uses", Float, nullable=False),
    Column("a_lambda", Float, nullable=False),
    schema="temp",
)


class _Unindexed(FunctionElement[str]):
    """SQLite's ``+state``: the state as an expression no index can serve, so that the
    planner scans the table in its order instead of visiting rows in index order."""

    name = "unindexed"
    type = String()
    inherit_cache = True


@compiles(_Unindexed)
def _compile_unindexed(element: _Unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return "(+ " + compiler.process(element.clauses, **kw) + ")"


def _unindexed(column: ColumnElement[str]) -> ColumnElement[str]:
    """``+column`` (see :class:`_Unindexed`)."""
    return _Unindexed(column)


def _rowid(table: NamedFromClause) -> ColumnElement[int]:
    """SQLite's ``rowid`` of ``table`` (a table or an alias, by its name): not a column the
    table declares, so written as a column of that name."""
    return literal_column(f"{table.name}.rowid", Integer)


def _ctid(table: NamedFromClause) -> ColumnElement[str]:
    """PostgreSQL's ``ctid`` of ``table`` (a table or an alias, by its name)."""
    return literal_column(f"{table.name}.ctid", TID())


def _event(
    ts: Any,
    kind: EventKind,
    mnest_id: Any,
    weights: tuple[Any, Any],
    states: tuple[str, str | None],
    related: Any,
) -> Select[Any]:
    """One event recorded by the ager at ``ts`` (``now``, typed as each engine's statements
    need it), as a select of :data:`EVENT_ROW`: the row's
    weights and states before and after, and the row on the other side of a merge."""
    row = EventRow(
        mnest_id=mnest_id,
        kind=kind.value,
        ts=ts,
        weight_before=weights[0],
        weight_after=weights[1],
        state_before=states[0],
        state_after=states[1],
        related_id=related,
        recorder=Recorder.AGER.value,
    )
    return select(*row.select_list())


def _insert_events(rows: Any) -> Insert:
    """``INSERT INTO events (EVENT_ROW) <rows>``."""
    return insert(E).from_select(EVENT_ROW, rows)


# The pairs of a run: actives below ``DECAYING_BELOW`` whose key has a decaying row, one row
# per pair, with what the merge needs of each. No plan may reach one side through an index on
# part of the key (the (state, src) or the dst_executor index), nor scan one side for each row
# of the other: for a hub, each of its rows would read all the hub's edges, quadratic in its
# degree. SQLite's plan (no statistics) is fixed by the query (:func:`_sqlite_pairs`);
# PostgreSQL's depends on statistics it may not have (after a bulk load), so there the pairs
# come without a join (:func:`_postgresql_pairs`). Batched, the pairs whose active row is in
# the batch (``:lo``, ``:hi``).


def _sqlite_pairs(now: Any, batched: bool) -> Any:
    """From the decaying rows, each active twin looked up by the whole edge key (its state
    compared unindexed, so that the edge-key index is the only one that matches). With
    ``batched``, from the batch's actives (a rowid range) instead, each decaying twin looked
    up by the whole key (its state a literal of that index): linear in the batch."""
    a, d = M.alias("a"), M.alias("d")
    eff_a = decayed(a.c.weight, a.c.decay_lambda, a.c.ts_weight, now)
    eff_d = decayed(d.c.weight, d.c.decay_lambda, d.c.ts_weight, now)
    key = ("src_executor", "src_version", "dst_executor", "dst_version")
    same_key = and_(*(a.c[k] == d.c[k] for k in key))
    active = _unindexed(a.c.state) == ACTIVE
    if batched:
        joined = a.join(d, and_(same_key, d.c.state == DECAYING))
        where = [_rowid_range(a), active, a.c.dst_version.is_not(None)]
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
            a.c.decayed_uses.label("a_decayed_uses"),
            a.c.decay_lambda.label("a_lambda"),
        )
        .select_from(joined)
        .where(*where, below(eff_a, DECAYING_BELOW))
    )


def _postgresql_pairs(now: Any) -> Any:
    """One pass over the candidates (actives below ``DECAYING_BELOW`` and decaying rows)
    grouped by key (a key holds at most one row per state): linear whatever the plan, with or
    without statistics (a join on the key, planned without them, can take the dst_executor or the
    (state, src) index, or scan one side for each row of the other); nothing is read when
    the store holds no versioned decaying row."""
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    active = M.c.state == ACTIVE
    decaying = M.c.state == DECAYING

    def of(which: Any, column: Any) -> Any:
        return func.max(case((which, column)))

    return (
        select(
            of(active, M.c.id).label("a_id"),
            of(decaying, M.c.id).label("d_id"),
            of(active, eff).label("a_eff"),
            of(decaying, eff).label("d_eff"),
            *(of(active, M.c[c]).label(f"a_{c}") for c in SUMMED_ON_MERGE),
            of(active, M.c.ts_first).label("a_first"),
            of(active, M.c.ts_last).label("a_last"),
            of(active, M.c.decayed_uses).label("a_decayed_uses"),
            of(active, M.c.decay_lambda).label("a_lambda"),
        )
        .where(
            _any_versioned_decaying(),
            M.c.dst_version.is_not(None),
            or_(and_(active, below(eff, DECAYING_BELOW)), decaying),
        )
        .group_by(M.c.src_executor, M.c.src_version, M.c.dst_executor, M.c.dst_version)
        .having(and_(of(active, M.c.id).is_not(None), of(decaying, M.c.id).is_not(None)))
    )


def _any_versioned_decaying(table: NamedFromClause = M) -> Any:
    """Whether the store holds a decaying row with a version, the only rows a merge pairs an
    active row with: a scan that stops at the first (the whole table when there is none).
    ``table``: ``mnests`` or an alias of it (inside a query that reads ``mnests`` itself)."""
    t = table.c
    return select(t.id).where(t.state == DECAYING, t.dst_version.is_not(None)).exists()


def _postgresql_batch_pairs(now: Any) -> Any:
    """The merge pairs whose active row is in the batch: the batch's actives below
    ``DECAYING_BELOW``
    (a page range), each decaying twin looked up by the whole edge key (a lateral lookup,
    one probe of the edge-key index per candidate, whatever the statistics say). Both rows
    of a pair are locked as they are read, so the merge works from their latest committed
    values: a batch locks rows, not the table, and a writer may have changed either since
    the statement began (it is then read again, and left out if no longer a pair)."""
    a, d = M.alias("a"), M.alias("d")
    eff_a = decayed(a.c.weight, a.c.decay_lambda, a.c.ts_weight, now)
    eff_d = decayed(d.c.weight, d.c.decay_lambda, d.c.ts_weight, now)
    key = ("src_executor", "src_version", "dst_executor", "dst_version")
    twin = (
        select(d.c.id.label("d_id"), eff_d.label("d_eff"))
        .where(
            *(d.c[k] == a.c[k] for k in key), d.c.state == DECAYING, d.c.dst_version.is_not(None)
        )
        .limit(1)
        .with_for_update()
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
            a.c.decayed_uses.label("a_decayed_uses"),
            a.c.decay_lambda.label("a_lambda"),
        )
        .select_from(a.join(twin, literal(True)))
        .where(
            _page_range(a),
            a.c.state == ACTIVE,
            a.c.dst_version.is_not(None),
            below(eff_a, DECAYING_BELOW),
        )
        .with_for_update(of=a)
    )


def _merged_weight(pairs: Any) -> Any:
    return greatest(pairs.c.a_eff, pairs.c.d_eff)


def _merge_events(ts: Any, pairs: Any) -> tuple[Select[Any], Select[Any]]:
    """The two events of each merge, at ``ts``: the absorbed active row's and its decaying
    twin's."""
    weight = _merged_weight(pairs)
    merged = EventKind.MERGED
    a, d = pairs.c.a_id, pairs.c.d_id
    absorbed = _event(ts, merged, a, (pairs.c.a_eff, weight), (ACTIVE, DECAYING), d)
    target = _event(ts, merged, d, (pairs.c.d_eff, weight), (DECAYING, DECAYING), a)
    return absorbed, target


def _merge_values(now: Any, pairs: Any) -> dict[str, Any]:
    """What a merge writes into the decaying row."""
    return {
        **{c: M.c[c] + pairs.c[f"a_{c}"] for c in SUMMED_ON_MERGE},
        "ts_first": least(M.c.ts_first, pairs.c.a_first),
        "ts_last": greatest(M.c.ts_last, pairs.c.a_last),
        "decayed_uses": merged_count(
            (M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last),
            (pairs.c.a_decayed_uses, pairs.c.a_lambda, pairs.c.a_last),
        ),
        "weight": _merged_weight(pairs),
        "ts_weight": advanced(M.c.ts_weight, now),
    }


def _rowid_range(table: NamedFromClause) -> ColumnElement[bool]:
    """The rows of one batch of a SQLite run: rowids in ``[:lo, :hi)``, a range of the
    table's own order read by a range scan, never through an index."""
    rowid = _rowid(table)
    return and_(rowid >= bindparam("lo", type_=Integer), rowid < bindparam("hi", type_=Integer))


def _page_range(table: NamedFromClause) -> ColumnElement[bool]:
    """The rows of one batch of a PostgreSQL run: pages (``ctid`` blocks) in ``[:lo, :hi)``,
    read by a TID range scan, never through an index."""
    ctid = _ctid(table)
    return and_(ctid >= _tid(bindparam("lo")), ctid < _tid(bindparam("hi")))


class TID(UserDefinedType[str]):
    """PostgreSQL's ``tid``: a row's (page, item) address."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "tid"


def _tid(page: Any) -> Any:
    """The address of item 0 of page ``page`` (an integer), as a ``tid``."""
    return cast(func.concat("(", cast(page, BigInteger), ",0)"), TID())


@dataclass(frozen=True, slots=True)
class AgerChange:
    """One statement of a run that changes rows: its name, and the counts of
    :class:`~mnestoma.rules.AgerReport` that its row count adds to (none: it only writes).
    A run executes its dialect's changes in their order, so that a new step of the ager
    is one more change in the list, read by the run as the others."""

    name: str
    statement: Executable
    counts: tuple[AgerCount, ...] = ()
    merging: bool = False  # a step of the merge: skipped when the run needs no merge


@dataclass(frozen=True, slots=True)
class SQLiteAgerStatements:
    """The ager's statements on SQLite, in the order a run executes them (the merges through
    the temporary :data:`PAIRS`, the events of prunes and demotions in one scan before the
    rows change), and what plans a run: its rowids and rows, the page cache's size."""

    changes: tuple[AgerChange, ...]
    archive_count: Select[int]
    pairs_drop: DropTable
    bounds: Select[int, int, int, bool]  # (first rowid, last rowid + 1, rows, any decaying)
    cache_size: TextClause
    page_size: TextClause
    pairs_create: CreateTable  # IF NOT EXISTS: a run in batches keeps it for the run
    pairs_clear: Executable
    wal_autocheckpoint: TextClause


@dataclass(frozen=True, slots=True)
class PostgreSQLAgerStatements:
    """The ager's statements on PostgreSQL, in the order a run executes them (the merges in
    one statement, prunes and demotions with their events), and what plans a run: its pages
    and rows."""

    lock: TextClause
    table_locks: TextClause
    row_lock_timeout: TextClause
    write_behind: TextClause
    async_commit: TextClause
    serial_reads: TextClause
    writers_in: TextClause
    changes: tuple[AgerChange, ...]
    archive_count: Select[int]
    bounds: Select[int, int, int, bool]  # (first page, last page + 1, rows, any decaying)


def _sqlite(now: Any, batched: bool) -> SQLiteAgerStatements:
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    state = _unindexed(M.c.state)
    in_batch = (_rowid_range(M),) if batched else ()
    p = PAIRS
    absorbed, target = _merge_events(now, p)
    # Reached by rowid from the pairs (an UPDATE ... FROM would scan mnests for them).
    pair = p.alias("pair")
    merge_values = {
        name: select(value).where(pair.c.d_rowid == _rowid(M)).scalar_subquery()
        for name, value in _merge_values(now, pair).items()
    }

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

    moves = EventRow(
        mnest_id=moving.c.id,
        kind=when_proto(literal(EventKind.PRUNED.value), literal(EventKind.TRANSITION.value)),
        ts=now,
        weight_before=moving.c.e,
        weight_after=when_proto(literal(None), moving.c.e),
        state_before=moving.c.state,
        state_after=when_proto(literal(None), literal(DECAYING)),
        recorder=Recorder.AGER.value,
    )
    moves_events = select(*moves.select_list()).where(
        or_(
            and_(is_proto, below(moving.c.e, PROTO_PRUNE_BELOW)),
            and_(~is_proto, below(moving.c.e, DECAYING_BELOW)),
        )
    )
    return SQLiteAgerStatements(
        changes=(
            AgerChange(
                PAIRS_STEP,
                insert(p)
                .from_select([c.name for c in p.columns], _sqlite_pairs(now, batched))
                .execution_options(preserve_rowcount=True),
                merging=True,
            ),
            AgerChange("merge_events", _insert_events(union_all(absorbed, target)), merging=True),
            AgerChange(
                "merge_update",
                update(M).where(_rowid(M).in_(select(p.c.d_rowid))).values(merge_values),
                merging=True,
            ),
            AgerChange(
                "merge_delete",
                delete(M).where(_rowid(M).in_(select(p.c.a_rowid))),
                counts=(AgerCount.MERGED, AgerCount.TO_DECAYING),
                merging=True,
            ),
            AgerChange("moves_events", _insert_events(moves_events)),
            AgerChange(
                "prune",
                delete(M).where(state == PROTO, below(eff, PROTO_PRUNE_BELOW), *in_batch),
                counts=(AgerCount.PROTOS_PRUNED,),
            ),
            # Demoted and decayed rows are written by two statements: a statement that sets
            # ``state`` rewrites the entries of every index holding it, for each row it
            # touches.
            AgerChange(
                "demote",
                update(M)
                .where(state == ACTIVE, below(eff, DECAYING_BELOW), *in_batch)
                .values(state=DECAYING, weight=eff, ts_weight=advanced(M.c.ts_weight, now)),
                counts=(AgerCount.TO_DECAYING,),
            ),
            AgerChange(
                "decay",
                update(M)
                .where(state.in_([ACTIVE, PROTO]), M.c.ts_weight < now, *in_batch)
                .values(weight=eff, ts_weight=now),
                counts=(AgerCount.DECAYED,),
            ),
        ),
        archive_count=_archive_count(now, state),
        pairs_drop=DropTable(p, if_exists=True),
        # The run's rowids (those the table has when it begins), its rows, and whether a
        # merge can be needed (a versioned decaying row: see _any_versioned_decaying).
        bounds=select(
            func.min(_rowid(M)),
            func.max(_rowid(M)) + 1,
            func.count(),
            _any_versioned_decaying(M.alias("dec")),
        ).select_from(M),
        cache_size=text("PRAGMA cache_size"),
        page_size=text("PRAGMA page_size"),
        pairs_create=CreateTable(p, if_not_exists=True),
        pairs_clear=delete(p),
        wal_autocheckpoint=text("PRAGMA wal_autocheckpoint"),
    )


def _archive_count(now: Any, state: Any) -> Select[int]:
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    return select(func.count()).where(
        state == DECAYING,
        M.c.ts_last <= bindparam("cutoff", type_=UTCDateTime()),
        below(eff, ARCHIVE_BELOW),
    )


def _postgresql(now: Any, batched: bool) -> PostgreSQLAgerStatements:
    # PostgreSQL types a bare parameter in a select list as text: the events' ts is cast.
    ts = now.cast(UTCDateTime())
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    in_batch = (_page_range(M),) if batched else ()

    # The merges, one statement: the pairs once, their events, the decaying rows updated,
    # the active rows deleted (its row count).
    pairs = (
        (_postgresql_batch_pairs(now) if batched else _postgresql_pairs(now))
        .cte("pairs")
        .prefix_with("MATERIALIZED")
    )
    absorbed, target = _merge_events(ts, pairs)
    merge_absorbed = _insert_events(absorbed).cte("merge_absorbed")
    merge_target = _insert_events(target).cte("merge_target")
    merge_update = (
        update(M)
        .where(M.c.id == pairs.c.d_id)
        .values(_merge_values(now, pairs))
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
    pruned = _event(ts, EventKind.PRUNED, gone.c.id, (gone.c.e, None), (PROTO, None), None)
    # (an INSERT's row count is read after the statement only when asked to keep it)
    prune = _insert_events(pruned).execution_options(preserve_rowcount=True)
    moved = (
        update(M)
        .where(M.c.state == ACTIVE, below(eff, DECAYING_BELOW), *in_batch)
        .values(state=DECAYING, weight=eff, ts_weight=advanced(M.c.ts_weight, now))
        .returning(M.c.id, M.c.weight)
        .cte("moved")
    )
    weights = (moved.c.weight, moved.c.weight)
    demoted = _event(ts, EventKind.TRANSITION, moved.c.id, weights, (ACTIVE, DECAYING), None)
    demote = _insert_events(demoted).execution_options(preserve_rowcount=True)
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
    return PostgreSQLAgerStatements(
        # A whole run in one transaction locks the table. EXCLUSIVE also conflicts with the
        # ROW SHARE lock of a writer's SELECT ... FOR UPDATE: the run waits for writers that
        # hold row locks, never the reverse.
        lock=text("LOCK TABLE mnests IN EXCLUSIVE MODE"),
        # A batch takes the tables' ROW EXCLUSIVE locks first, before its lock timeout, so
        # that it waits as any writer does for a table lock held a while (a dry run's, a
        # migration's) instead of giving up on it again and again. ROW EXCLUSIVE conflicts
        # with no writer.
        table_locks=text("LOCK TABLE mnests, events, ager_progress IN ROW EXCLUSIVE MODE"),
        # Then it locks only the rows it changes, as it changes them, in its own order while
        # writers lock theirs in id order: where the two cross, the batch gives up after
        # this long (lock_not_available) and is tried again, normally long before the
        # server's deadlock check (1 s after a writer began to wait) could end the writer's
        # transaction instead.
        row_lock_timeout=text(
            f"SET LOCAL lock_timeout = '{max(1, round(AGER_ROW_LOCK_TIMEOUT_S * 1000))}ms'"
        ),
        # The pages a batch (or a run's whole-table read, setting hint bits) writes out of
        # the server's buffers go to the disk as it goes, a little at a time, not later in
        # one burst that every commit's WAL flush would queue behind.
        write_behind=text(f"SET LOCAL backend_flush_after = '{AGER_FLUSH_AFTER_KIB}kB'"),
        # A batch while no writer is about commits without waiting for its WAL to reach the
        # disk: a crash may lose the last batches, which (like a killed run's) the next run
        # redoes; the run's last transaction (its ager_runs row) is durable, and with it
        # every batch before. While writers are about a batch waits for its flush: else
        # their commits would flush its WAL for it.
        async_commit=text("SET LOCAL synchronous_commit TO OFF"),
        # The reads of a run in batches (its bounds, its archive count) scan the whole table
        # without parallel workers, for the rest of their own transaction: they take one
        # core, and leave the others to the writers.
        serial_reads=text("SET LOCAL max_parallel_workers_per_gather = 0"),
        # Other sessions holding a writer's lock on mnests now (a writer in a transaction:
        # ROW SHARE for SELECT ... FOR UPDATE, ROW EXCLUSIVE for a write; not a reader's
        # ACCESS SHARE, nor (auto)vacuum's SHARE UPDATE EXCLUSIVE): whether writers are
        # about, which the run lets in first. Of this database only: pg_locks shows the
        # whole server's, and a database made from the same template has its tables under
        # the same oids.
        writers_in=text(
            "SELECT count(*) FROM pg_locks"
            " WHERE relation = 'mnests'::regclass AND pid <> pg_backend_pid() AND granted"
            " AND mode IN ('RowShareLock', 'RowExclusiveLock')"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ),
        changes=(
            AgerChange(
                MERGE, merge, counts=(AgerCount.MERGED, AgerCount.TO_DECAYING), merging=True
            ),
            AgerChange("prune", prune, counts=(AgerCount.PROTOS_PRUNED,)),
            AgerChange("decay", decay, counts=(AgerCount.DECAYED,)),
            AgerChange("demote", demote, counts=(AgerCount.TO_DECAYING,)),
        ),
        archive_count=_archive_count(now, M.c.state),
        # The run's pages (those the table has when it begins) and its rows, for the batch
        # size in pages.
        bounds=select(
            literal(0, BigInteger),
            func.pg_relation_size(text("'mnests'::regclass"))
            / func.current_setting("block_size").cast(BigInteger),
            select(func.count()).select_from(M).scalar_subquery(),
            _any_versioned_decaying(),
        ),
    )


def wal_autocheckpoint_pragma(pages: int) -> TextClause:
    """``PRAGMA wal_autocheckpoint = pages`` (SQLite; 0: none)."""
    return text(f"PRAGMA wal_autocheckpoint = {int(pages)}")


def cache_size_pragma(value: int) -> TextClause:
    """``PRAGMA cache_size = value`` (SQLite; negative: KiB, positive: pages)."""
    return text(f"PRAGMA cache_size = {int(value)}")


def sqlite_ager_statements(batched: bool = False) -> SQLiteAgerStatements:
    """The ager's statements on SQLite; with ``batched``, those that change rows take one
    batch's rowid range (``:lo``, ``:hi``). Built once per value of ``batched``, however it
    is spelled."""
    return _sqlite_statements(bool(batched))


def postgresql_ager_statements(batched: bool = False) -> PostgreSQLAgerStatements:
    """The ager's statements on PostgreSQL; with ``batched``, those that change rows take one
    batch's page range (``:lo``, ``:hi``). Built once per value of ``batched``, however it
    is spelled."""
    return _postgresql_statements(bool(batched))


def ager_statements(
    dialect: str, batched: bool = False
) -> SQLiteAgerStatements | PostgreSQLAgerStatements:
    """The ager's statements for ``dialect``, for the callers that need only what both have
    (``bounds``, ``archive_count``, ``prune``, ``decay``, ``demote``): the ones its engine's
    home chose (``backend_of(conn).spelling.ager_statements``)."""
    chosen: SQLiteAgerStatements | PostgreSQLAgerStatements
    chosen = spelling_of(dialect).ager_statements(batched)
    return chosen


@functools.cache
def _sqlite_statements(batched: bool) -> SQLiteAgerStatements:
    return _sqlite(now_param(), batched)


@functools.cache
def _postgresql_statements(batched: bool) -> PostgreSQLAgerStatements:
    return _postgresql(now_param(), batched)
