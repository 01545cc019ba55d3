"""The sieve's statement (contract §11): every link of a proposed chain in one query.

The links are a small table of bound values (link index, source executor and version,
destination executor and version, a version NULL where the step gives none). For each link
a correlated subquery picks the id of its best row among the rows of ``a → b`` in every
state, through the edge indexes; the row is then read by its primary key, with its
effective weight now by the decay expression every reader uses. One statement per chain
length, built once and bound per call: vetting a chain is one statement whatever its length
or versions, and its text stays short enough for the drivers' statement caches.

The same statement reads the evidence of each link's probability (contract §13): for the
link's source, the total decayed count of its active edges, its distinct successors and the
count to the link's destination; for the chain of the link's two steps (from the second
link on), the same three of the chains. Rows are told apart by ``kind``: 0 a link's best
row, 1 its edges' summary, 2 its chain's summary.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Select,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
    or_,
    select,
    union_all,
)

from mnestoma.core.sqlrules import decayed, decayed_count, now_param
from mnestoma.schema.sql.chains import chain_count
from mnestoma.schema.sql.tables import CHAINS as C
from mnestoma.schema.sql.tables import MNESTS as M
from mnestoma.schema.sql.tables import is_active

__all__ = ["VET_COLUMNS", "VET_SHAPES", "step_params", "vet_statement"]

# The columns of a row of :func:`vet_statement`, in order: the kind of row, then a link's
# best row (kind 0), then the summaries of its probability's evidence (kinds 1 and 2).
VET_COLUMNS: tuple[str, ...] = (
    "kind",
    "idx",
    "id",
    "state",
    "effective",
    "uses",
    "ok_count",
    "error_count",
    "ts_last",
    "total",
    "successors",
    "to_dst",
)
BEST_ROW, EDGE_SUMMARY, CHAIN_SUMMARY = 0, 1, 2
# How many statements are kept built: one per chain length and dialect, so that every
# length the sieve may ask (2 to 64 steps) on both engines stays built.
VET_SHAPES = 128


def step_params(steps: list[tuple[str, str | None]]) -> dict[str, Any]:
    """The parameters that :func:`vet_statement` binds for ``steps`` (``:now`` aside): the
    executor of step i as ``:e<i>`` and its version, or None (any version), as ``:v<i>``."""
    params: dict[str, Any] = {}
    for i, (executor, version) in enumerate(steps):
        params[f"e{i}"] = executor
        params[f"v{i}"] = version
    return params


def _step(name: str, label: str) -> Any:
    return bindparam(name, type_=String).label(label)


@functools.lru_cache(maxsize=VET_SHAPES)
def vet_statement(dialect: str, steps: int) -> Select[Any]:
    """The best row of each link of a chain of ``steps`` steps, one row per link that has
    any, by link index (a link without any row has no row here).

    The best row: an active one before any other state, then the highest effective weight
    at ``:now``, then more uses, then the latest use; versions and id make the choice total.
    """
    if steps < 2:
        raise ValueError("a chain has at least two steps")
    rows = [
        select(
            literal_column(str(i), Integer).label("idx"),
            _step(f"e{i}", "s"),
            _step(f"v{i}", "sv"),
            _step(f"e{i + 1}", "d"),
            _step(f"v{i + 1}", "dv"),
            (_step(f"e{i - 1}", "p") if i else cast(null(), String).label("p")),
        )
        for i in range(steps - 1)
    ]
    links = (rows[0] if len(rows) == 1 else union_all(*rows)).cte("links")
    lk = links.c
    x = M.alias("x")
    best_id = (
        select(x.c.id)
        .where(
            x.c.src_executor == lk.s,
            x.c.dst_executor == lk.d,
            or_(lk.sv.is_(None), x.c.src_version == lk.sv),
            or_(lk.dv.is_(None), x.c.dst_version == lk.dv),
        )
        .order_by(
            case((is_active(x), literal_column("0", Integer)), else_=literal_column("1", Integer)),
            decayed(x.c.weight, x.c.decay_lambda, x.c.ts_weight, now_param()).desc(),
            x.c.uses.desc(),
            x.c.ts_last.desc(),
            x.c.src_version,
            func.coalesce(x.c.dst_version, literal_column("''", String)),
            x.c.id,
        )
        .limit(1)
        .correlate(links)
        .scalar_subquery()
    )
    eff = decayed(M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    best = (
        select(
            literal_column(str(BEST_ROW), Integer).label("kind"),
            lk.idx,
            M.c.id,
            M.c.state,
            eff.label("effective"),
            M.c.uses,
            M.c.ok_count,
            M.c.error_count,
            M.c.ts_last,
            cast(null(), Float).label("total"),
            cast(null(), BigInteger).label("successors"),
            cast(null(), Float).label("to_dst"),
        )
        .select_from(links)
        .join(M, M.c.id == best_id)
    )
    edges = _summaries(dialect, links, EDGE_SUMMARY)
    chains = _summaries(dialect, links, CHAIN_SUMMARY)
    everything = union_all(best, edges, chains).subquery("vetted")
    return select(everything).order_by(everything.c.kind, everything.c.idx)


def _summaries(dialect: str, links: Any, kind: int) -> Select[Any]:
    """Per link, the evidence of its probability, padded to the statement's columns: the
    total decayed count now of its source's active edges (at its version, when the step gives
    one; ``kind`` EDGE_SUMMARY) or of the chains after its two steps (CHAIN_SUMMARY), their
    distinct successors and the count to the link's destination; counts of 0 left out, as
    ``predict_next`` leaves them. A link with none has no row."""
    lk = links.c
    if kind == EDGE_SUMMARY:
        count = decayed_count(M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last, now_param())
        dst = M.c.dst_executor
        on = and_(
            is_active(M),
            M.c.src_executor == lk.s,
            or_(lk.sv.is_(None), M.c.src_version == lk.sv),
        )
        source = links.join(M, on)
    else:
        count = chain_count(dialect)
        dst = C.c.dst_executor
        source = links.join(C, and_(C.c.prev_executor == lk.p, C.c.src_executor == lk.s))
    return (
        select(
            literal_column(str(kind), Integer).label("kind"),
            lk.idx,
            cast(null(), String).label("id"),
            cast(null(), String).label("state"),
            cast(null(), Float).label("effective"),
            cast(null(), Integer).label("uses"),
            cast(null(), Integer).label("ok_count"),
            cast(null(), Integer).label("error_count"),
            cast(null(), M.c.ts_last.type).label("ts_last"),
            cast(func.sum(count), Float).label("total"),
            cast(func.count(dst.distinct()), BigInteger).label("successors"),
            cast(func.sum(case((dst == lk.d, count), else_=0.0)), Float).label("to_dst"),
        )
        .select_from(source)
        .where(count > 0)
        .group_by(lk.idx)
    )
