"""The statements that read: by id, by key, listings, the walk, suggestions, ranking, the
recurring protos and the query log. Built once (at import, or once per dialect or shape);
callers only bind parameters.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    FromClause,
    Integer,
    Select,
    Text,
    bindparam,
    column,
    func,
    literal,
    literal_column,
    select,
    table,
)
from sqlalchemy.sql.selectable import NamedFromClause

from mnestoma.core.rules import MnestState
from mnestoma.core.sqlrules import decayed, decayed_count, now_param, safe_product
from mnestoma.schema.sql.spelling import Spelling, spelling_of
from mnestoma.schema.sql.tables import EVENTS as E
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import QUERIES as Q
from mnestoma.schema.sql.tables import is_active, key_is, state_is

__all__ = [
    "QUERY_RECENT",
    "QUERY_TOP",
    "SELECT_BY_ID",
    "edges_statement",
    "events_statement",
    "find_statement",
    "out_of_source",
    "rank_statement",
    "recurring_protos_statement",
    "suggest_statement",
    "walk_statement",
]

SELECT_BY_ID = select(M).where(M.c.id == bindparam("id"))


@functools.cache
def find_statement(proto: bool, state: MnestState) -> Select[Any]:
    """The row with the key bound as ``:s :sv :d :dv`` and this state (one statement per
    state: see :func:`~mnestoma.schema.sql.tables.state_is`)."""
    return select(M).where(key_is(M, proto=proto, state=state))


@functools.cache
def edges_statement(by_src: bool, by_dst: bool, by_states: bool, limited: bool) -> Select[Any]:
    """Rows filtered by ``:src``, ``:dst``, ``:states`` (expanding), oldest first (then by
    edge key), at most ``:limit``: one statement per combination of the filters given."""
    stmt = select(M)
    if by_src:
        stmt = stmt.where(M.c.src_executor == bindparam("src"))
    if by_dst:
        stmt = stmt.where(M.c.dst_executor == bindparam("dst"))
    if by_states:
        stmt = stmt.where(M.c.state.in_(bindparam("states", expanding=True)))
    # ties (the edges of one turn share their first instant) in edge-key order, so that a
    # listing is the same from one store to its copy, whatever the ids drawn
    key = (M.c.src_executor, M.c.src_version, M.c.dst_executor, M.c.dst_version, M.c.state)
    stmt = stmt.order_by(M.c.ts_first, *key, M.c.id)
    return stmt.limit(bindparam("limit")) if limited else stmt


@functools.cache
def events_statement(by_mnest: bool, by_turn: bool, limited: bool) -> Select[Any]:
    """Events of ``:mnest_id`` and/or ``:turn_id``, oldest first, at most ``:limit``."""
    stmt = select(E)
    if by_mnest:
        stmt = stmt.where(E.c.mnest_id == bindparam("mnest_id"))
    if by_turn:
        stmt = stmt.where(E.c.turn_id == bindparam("turn_id"))
    stmt = stmt.order_by(E.c.ts, E.c.id)
    return stmt.limit(bindparam("limit")) if limited else stmt


@functools.cache
def recurring_protos_statement(dialect: str) -> Select[Any]:
    """Protos with at least ``:uses`` uses and effective weight ≥ ``:floor`` at ``:now``,
    most used first. ``dst_version IS NULL`` is implied by the state (a proto has no
    version: the table's CHECK) and lets the planner read only the partial index of rows
    without one, not every edge."""
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    return (
        select(M)
        .where(
            state_is(M, MnestState.PROTO),
            M.c.dst_version.is_(None),
            M.c.uses >= bindparam("uses"),
            eff >= bindparam("floor"),
        )
        .order_by(M.c.uses.desc(), eff.desc(), M.c.id)
    )


QUERY_RECENT = select(Q).order_by(Q.c.ts.desc(), Q.c.id.desc()).limit(bindparam("limit"))
_COUNT = func.count().label("count")
_LAST = func.max(Q.c.ts).label("last_ts")
QUERY_TOP = (
    select(Q.c.canonical_query, Q.c.canonical_hash, _COUNT, _LAST)
    .group_by(Q.c.canonical_hash, Q.c.canonical_query)
    .order_by(_COUNT.desc(), _LAST.desc())
    .limit(bindparam("limit"))
)


# --- the walk, suggestions and ranking: built once per dialect ------------------------------


def _row_locator(spelling: Spelling, source: NamedFromClause) -> ColumnElement[Any]:
    """What finds a row again fastest: SQLite's rowid (one b-tree lookup, not two), else id."""
    if spelling.rowid:
        return literal_column(f"{source.name}.rowid", Integer)
    return source.c.id


@functools.cache
def walk_statement(dialect: str, *, with_floor: bool) -> Select[Any]:
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

    The order is total, the same on both engines and from store to store: best score first,
    then the shorter path, then the path as it is spelled (the source's version, then each
    executor and version it reaches, compared byte by byte), then its ids. Each depth's
    ranking on PostgreSQL follows the same order, so that the paths kept are the ones it
    puts first.
    """
    now = now_param()
    spelling = spelling_of(dialect)
    ranked = spelling.ranks_each_depth
    char, instr = getattr(func, spelling.char), getattr(func, spelling.instr)
    sep = char(1)
    between = char(2)  # an executor and its version
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now)
    first_path = M.c.id.cast(Text)
    first_spelled = (
        M.c.src_version + sep + M.c.dst_executor + between + func.coalesce(M.c.dst_version, "")
    ).cast(Text)
    first_columns = [
        _row_locator(spelling, M).label("loc"),
        M.c.dst_executor.label("dst_executor"),
        M.c.dst_version.label("dst_version"),
        literal(1).label("depth"),
        eff.label("score"),
        first_path.label("path"),
        (sep + M.c.src_executor + sep + M.c.dst_executor + sep).cast(Text).label("seen"),
        first_spelled.label("spelled"),
    ]
    if ranked:
        first_columns.append(
            func.row_number()
            .over(
                order_by=(
                    eff.desc(),
                    _bytewise(first_spelled, spelling),
                    _bytewise(first_path, spelling),
                )
            )
            .label("rank")
        )
    first = select(*first_columns).where(
        is_active(M),
        M.c.src_executor == bindparam("src"),
        M.c.dst_executor != M.c.src_executor,
        *([eff >= bindparam("min_weight")] if with_floor else []),
    )
    # The recursive term reads the CTE by its name: a table of the first term's columns,
    # so that the compound can take ORDER BY and LIMIT before it becomes the CTE.
    start = table("paths", *(column(k, c.type) for k, c in first.selected_columns.items()))
    nxt = M.alias("nxt")
    eff_n = decayed(nxt.c.weight, nxt.c.decay_lambda, nxt.c.ts_weight, now)
    # PostgreSQL raises on float underflow, hence its guard (0 below 1e-150, far under any
    # weight that matters); SQLite's product just underflows towards 0, with no error.
    score = (
        safe_product(start.c.score, eff_n) if spelling.underflow_raises else start.c.score * eff_n
    )
    path = (start.c.path + literal(",") + nxt.c.id).cast(Text)
    spelled = (
        start.c.spelled + sep + nxt.c.dst_executor + between + func.coalesce(nxt.c.dst_version, "")
    ).cast(Text)
    step_columns = [
        _row_locator(spelling, nxt),
        nxt.c.dst_executor,
        nxt.c.dst_version,
        start.c.depth + 1,
        score,
        path,
        (start.c.seen + nxt.c.dst_executor + sep).cast(Text),
        spelled,
    ]
    if ranked:
        step_columns.append(
            func.row_number().over(
                order_by=(score.desc(), _bytewise(spelled, spelling), _bytewise(path, spelling))
            )
        )
    step = select(*step_columns).where(
        is_active(nxt),
        nxt.c.src_executor == start.c.dst_executor,
        nxt.c.src_version == start.c.dst_version,
        start.c.depth < bindparam("max_depth"),
        instr(start.c.seen, sep + nxt.c.dst_executor + sep) == 0,
        *([eff_n >= bindparam("min_weight")] if with_floor else []),
        *([start.c.rank <= bindparam("limit")] if ranked else []),
    )
    compound = first.union_all(step)
    if not ranked:
        best = compound.selected_columns
        compound = compound.order_by(best.score.desc(), best.depth, best.spelled, best.path)
        compound = compound.limit(bindparam("limit"))
    paths = compound.cte("paths", recursive=True)
    stmt = (
        select(paths.c.path, *M.c)
        .join_from(paths, M, _row_locator(spelling, M) == paths.c.loc)
        .order_by(
            paths.c.score.desc(),
            paths.c.depth,
            _bytewise(paths.c.spelled, spelling),
            _bytewise(paths.c.path, spelling),
        )
        .limit(bindparam("limit"))
    )
    return stmt


def _bytewise(text_: ColumnElement[Any], spelling: Spelling) -> ColumnElement[Any]:
    """``text_`` compared byte by byte, as SQLite compares text: PostgreSQL's ``C``
    collation (its database's own may order ``B`` and ``a`` otherwise, or skip the
    separators)."""
    return text_ if spelling.bytewise is None else text_.collate(spelling.bytewise)


def out_of_source(table: FromClause, with_version: bool) -> list[ColumnElement[bool]]:
    """The active edges out of ``:src`` (and ``:sv`` when the version is given)."""
    terms = [is_active(table), table.c.src_executor == bindparam("src")]
    if with_version:
        terms.append(table.c.src_version == bindparam("sv"))
    return terms


@functools.cache
def suggest_statement(
    dialect: str, with_version: bool, *, ties: bool = False, by_count: bool = False
) -> Select[Any]:
    """The candidates of ``suggest_next``, with their effective weight.

    Plain: the ``:k`` strongest active edges out of the source. With ``ties``: every one at
    least as strong as ``:floor``, asked for when the k-th and the next one tie, so that
    Python can break the tie with the activation (:mod:`mnestoma.ranking`). With
    ``by_count``, each row ends with the edge's decayed count of passings as well, and
    "strongest" means the highest count (then the highest effective weight).
    """
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    if by_count:
        count = decayed_count(M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last, now_param())
        stmt = select(M, eff.label("effective"), count.label("counted"))
        stmt = stmt.where(*out_of_source(M, with_version))
        stmt = stmt.order_by(count.desc(), eff.desc(), M.c.uses.desc(), M.c.id)
        return stmt.where(count >= bindparam("floor")) if ties else stmt.limit(bindparam("k"))
    stmt = select(M, eff.label("effective")).where(*out_of_source(M, with_version))
    stmt = stmt.order_by(eff.desc(), M.c.uses.desc(), M.c.id)
    stmt = stmt.where(eff >= bindparam("floor")) if ties else stmt.limit(bindparam("k"))
    return stmt


@functools.cache
def rank_statement(dialect: str, with_version: bool) -> Select[Any]:
    """The active edges out of the source to ``:names`` (expanding), with effective weight."""
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    stmt = select(M, eff.label("effective")).where(
        *out_of_source(M, with_version),
        M.c.dst_executor.in_(bindparam("names", expanding=True)),
    )
    return stmt
