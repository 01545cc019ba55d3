"""The statements of the repository, built once: at import, or once per dialect or shape.

Hot paths only bind parameters to these; nothing here runs a statement.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Integer,
    Text,
    and_,
    bindparam,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.sql.selectable import CTE

from .models import CanonicalQuery, Event, Mnest
from .sqlrules import decayed, now_param, safe_product

M = Mnest.__table__
E = Event.__table__
Q = CanonicalQuery.__table__
Key = tuple[str, str, str, str | None]
MNEST_COLUMNS = [c.key for c in M.columns]
EVENT_COLUMNS = [c.key for c in E.columns]
QUERY_COLUMNS = [c.key for c in Q.columns]

KEYS_PER_STATEMENT = 64


@functools.lru_cache(maxsize=512)
def select_keys(n_active: int, n_proto: int) -> Any:
    """Lock the rows of ``n_active`` versioned keys and ``n_proto`` proto keys, in id order.

    An OR of per-key equalities, so that each term can use a unique index (a row-value IN
    list makes SQLite scan every active row); one statement per shape, built once.
    """
    terms = [
        and_(
            M.c.state == "active",
            M.c.src_executor == bindparam(f"as{i}"),
            M.c.src_version == bindparam(f"av{i}"),
            M.c.dst_executor == bindparam(f"ad{i}"),
            M.c.dst_version == bindparam(f"aw{i}"),
        )
        for i in range(n_active)
    ] + [
        and_(
            M.c.state == "proto",
            M.c.dst_version.is_(None),
            M.c.src_executor == bindparam(f"ps{j}"),
            M.c.src_version == bindparam(f"pv{j}"),
            M.c.dst_executor == bindparam(f"pd{j}"),
        )
        for j in range(n_proto)
    ]
    return select(M).where(or_(*terms)).order_by(M.c.id).with_for_update()


def key_params(akeys: list[Key], pkeys: list[Key]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for i, (s, sv, d, dv) in enumerate(akeys):
        params[f"as{i}"], params[f"av{i}"], params[f"ad{i}"], params[f"aw{i}"] = s, sv, d, dv
    for j, (s, sv, d, _) in enumerate(pkeys):
        params[f"ps{j}"], params[f"pv{j}"], params[f"pd{j}"] = s, sv, d
    return params


SEL_ONE_ACTIVE = (
    select(M)
    .where(
        M.c.src_executor == bindparam("s"),
        M.c.src_version == bindparam("sv"),
        M.c.dst_executor == bindparam("d"),
        M.c.dst_version == bindparam("dv"),
        M.c.state == "active",
    )
    .with_for_update()
)
SEL_ONE_PROTO = (
    select(M)
    .where(
        M.c.src_executor == bindparam("s"),
        M.c.src_version == bindparam("sv"),
        M.c.dst_executor == bindparam("d"),
        M.c.dst_version.is_(None),
        M.c.state == "proto",
    )
    .with_for_update()
)
SEL_TURN_DONE = select(E.c.mnest_id).where(
    E.c.turn_id == bindparam("turn_id"),
    E.c.mnest_id.in_(bindparam("ids", expanding=True)),
    E.c.kind.in_(["created", "reinforced"]),
)
SEL_TURN_SEEN = (
    select(E.c.id)
    .where(E.c.turn_id == bindparam("turn_id"), E.c.kind.in_(["created", "reinforced"]))
    .limit(1)
)
SEL_TURN_DONE_ONE = select(E.c.mnest_id).where(
    E.c.turn_id == bindparam("turn_id"),
    E.c.mnest_id == bindparam("mid"),
    E.c.kind.in_(["created", "reinforced"]),
)
UPD_REINFORCE = (
    update(M)
    .where(M.c.id == bindparam("b_id"))
    .values(
        weight=bindparam("b_weight"),
        uses=M.c.uses + 1,
        ts_last=bindparam("b_ts_last"),
        ts_weight=bindparam("b_ts_weight"),
        tags=bindparam("b_tags"),
        desired_sig=bindparam("b_desired_sig"),
    )
)
INSERT_MNEST = {
    "sqlite": sqlite_dialect.insert(M).on_conflict_do_nothing().returning(M.c.id),
    "postgresql": pg_dialect.insert(M).on_conflict_do_nothing().returning(M.c.id),
}
INSERT_EVENT = insert(E)


# the event columns bound by PG_REINFORCE_WITH_EVENT (its mnest_id is the updated row's id)
PG_REINFORCE_EVENT_PARAMS = (
    "kind",
    "ts",
    "turn_id",
    "weight_before",
    "weight_after",
    "state_before",
    "state_after",
    "recorder",
)


def _reinforce_with_event() -> Any:
    """PostgreSQL: the reinforcement and its event in one statement (a data-modifying CTE),
    so a hot row's lock is held one round trip shorter."""
    upd = UPD_REINFORCE.returning(M.c.id).cte("reinforced")
    binds = [bindparam(name, type_=E.c[name].type) for name in PG_REINFORCE_EVENT_PARAMS]
    return insert(E).from_select(["mnest_id", *PG_REINFORCE_EVENT_PARAMS], select(upd.c.id, *binds))


PG_REINFORCE_WITH_EVENT = _reinforce_with_event()
SEL_BY_ID = select(M).where(M.c.id == bindparam("id"))
SEL_BY_ID_LOCK = SEL_BY_ID.with_for_update()


# --- statements that depend on the dialect, built once per dialect ------------------------

_CACHE: dict[tuple[str, str], Any] = {}


def _row_locator(dialect: str, table: Any) -> Any:
    """What finds a row again fastest: SQLite's rowid (one b-tree lookup, not two), else id."""
    if dialect == "sqlite":
        return literal_column(f"{table.name}.rowid", Integer)
    return table.c.id


def walk_statement(dialect: str, *, with_floor: bool) -> Any:
    """The recursive walk: rows of (path of ids, *the columns of the path's last edge), the
    ``:limit`` best paths only.

    The CTE carries only what the recursion needs; each path's last edge is read once at
    the end, through its row locator. Without a floor (``min_weight`` ≤ 0, which every
    effective weight meets) the weight test is left out rather than computed for nothing.

    The work is bounded by ``:limit``, not by the number of paths. A path never scores more
    than its prefix (weights are ≤ 1, and a tie goes to the shorter), so the best ``n`` paths
    are closed under prefixes: SQLite extracts paths from the recursion's queue best first
    and stops after ``n`` (ORDER BY and LIMIT of a recursive CTE); PostgreSQL, which allows
    neither in the recursive term, ranks each depth's paths and extends only the first
    ``n`` of them, which keeps every path of the best ``n``.
    """
    key = ("walk" + ("_floor" if with_floor else ""), dialect)
    if key in _CACHE:
        return _CACHE[key]
    now = now_param()
    pg = dialect == "postgresql"
    sep = func.chr(1) if pg else func.char(1)
    instr = func.strpos if pg else func.instr
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    first_path = M.c.id.cast(Text)
    first_columns = [
        _row_locator(dialect, M).label("loc"),
        M.c.dst_executor.label("dst_executor"),
        M.c.dst_version.label("dst_version"),
        literal(1).label("depth"),
        eff.label("score"),
        first_path.label("path"),
        (sep + M.c.src_executor + sep + M.c.dst_executor + sep).cast(Text).label("seen"),
    ]
    if pg:
        first_columns.append(
            func.row_number().over(order_by=(eff.desc(), first_path)).label("rank")
        )
    start = (
        select(*first_columns)
        .where(
            M.c.state == "active",
            M.c.src_executor == bindparam("src"),
            M.c.dst_executor != M.c.src_executor,
            *([eff >= bindparam("min_weight")] if with_floor else []),
        )
        .cte("paths", recursive=True)
    )
    nxt = M.alias("nxt")
    eff_n = decayed(dialect, nxt.c.weight, nxt.c.decay_lambda, nxt.c.ts_weight, now)
    # PostgreSQL raises on float underflow, hence its guard (0 below 1e-150, far under any
    # weight that matters); SQLite's product just underflows towards 0, with no error.
    score = safe_product(start.c.score, eff_n) if pg else start.c.score * eff_n
    path = (start.c.path + literal(",") + nxt.c.id).cast(Text)
    step_columns = [
        _row_locator(dialect, nxt),
        nxt.c.dst_executor,
        nxt.c.dst_version,
        start.c.depth + 1,
        score,
        path,
        (start.c.seen + nxt.c.dst_executor + sep).cast(Text),
    ]
    if pg:
        step_columns.append(func.row_number().over(order_by=(score.desc(), path)))
    step = select(*step_columns).where(
        nxt.c.state == "active",
        nxt.c.src_executor == start.c.dst_executor,
        nxt.c.src_version == start.c.dst_version,
        start.c.depth < bindparam("max_depth"),
        instr(start.c.seen, sep + nxt.c.dst_executor + sep) == 0,
        *([eff_n >= bindparam("min_weight")] if with_floor else []),
        *([start.c.rank <= bindparam("limit")] if pg else []),
    )
    if pg:
        paths = start.union_all(step)
    else:
        best_first: list[Any] = [
            literal_column("score").desc(),
            literal_column("depth"),
            literal_column("path"),
        ]
        first: Any = start.element
        # SQLAlchemy has no public spelling of ORDER BY / LIMIT on a recursive CTE's
        # compound: build it as CTE.union_all does, with both added.
        paths = CTE._construct(
            first.union_all(step).order_by(*best_first).limit(bindparam("limit")),
            name=start.name,
            recursive=True,
            _restates=start,
        )
    stmt = (
        select(paths.c.path, *M.c)
        .join_from(paths, M, _row_locator(dialect, M) == paths.c.loc)
        .order_by(paths.c.score.desc(), paths.c.depth, paths.c.path)
        .limit(bindparam("limit"))
    )
    _CACHE[key] = stmt
    return stmt


def _out_of_source(table: Any, with_version: bool) -> list[Any]:
    """The active edges out of ``:src`` (and ``:sv`` when the version is given)."""
    terms = [table.c.state == "active", table.c.src_executor == bindparam("src")]
    if with_version:
        terms.append(table.c.src_version == bindparam("sv"))
    return terms


def suggest_statement(dialect: str, with_version: bool, *, ties: bool = False) -> Any:
    """The candidates of ``suggest_next``, with their effective weight.

    Plain: the ``:k`` strongest active edges out of the source. With ``ties``: every one at
    least as strong as ``:floor``, asked for when the k-th and the next one tie, so that
    Python can break the tie with the activation (:mod:`mnestoma.ranking`).
    """
    key = ("suggest" + ("_v" if with_version else "") + ("_ties" if ties else ""), dialect)
    if key in _CACHE:
        return _CACHE[key]
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    stmt = select(M, eff.label("effective")).where(*_out_of_source(M, with_version))
    stmt = stmt.order_by(eff.desc(), M.c.uses.desc(), M.c.id)
    stmt = stmt.where(eff >= bindparam("floor")) if ties else stmt.limit(bindparam("k"))
    _CACHE[key] = stmt
    return stmt


def rank_statement(dialect: str, with_version: bool) -> Any:
    """The active edges out of the source to ``:names`` (expanding), with effective weight."""
    key = ("rank" + ("_v" if with_version else ""), dialect)
    if key in _CACHE:
        return _CACHE[key]
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    stmt = select(M, eff.label("effective")).where(
        *_out_of_source(M, with_version),
        M.c.dst_executor.in_(bindparam("names", expanding=True)),
    )
    _CACHE[key] = stmt
    return stmt


# PostgreSQL: what a turn takes before retrying; it conflicts with the ager's EXCLUSIVE lock
# (below), not with other writers.
HOLD_OFF_AGER = text("LOCK TABLE mnests IN ROW EXCLUSIVE MODE")
