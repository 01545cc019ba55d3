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
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    union_all,
)

from ..rules import CHAIN_DECAY_LAMBDA
from ..sqlrules import decayed, decayed_count, now_param
from .tables import CHAINS as C
from .tables import MNESTS as M
from .tables import is_active

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
            decayed(dialect, x.c.weight, x.c.decay_lambda, x.c.ts_weight, now_param()).desc(),
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
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
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
    parts = [best]
    for i in range(steps - 1):
        parts.append(_edge_summary(dialect, i))
        if i >= 1:
            parts.append(_chain_summary(dialect, i))
    everything = union_all(*parts).subquery("vetted")
    return select(everything).order_by(everything.c.kind, everything.c.idx)


def _summary(kind: int, i: int, total: Any, successors: Any, to_dst: Any) -> Select[Any]:
    """A summary row of link ``i``'s evidence, padded to the statement's columns."""
    return select(
        literal_column(str(kind), Integer).label("kind"),
        literal_column(str(i), Integer).label("idx"),
        cast(null(), String).label("id"),
        cast(null(), String).label("state"),
        cast(null(), Float).label("effective"),
        cast(null(), Integer).label("uses"),
        cast(null(), Integer).label("ok_count"),
        cast(null(), Integer).label("error_count"),
        cast(null(), M.c.ts_last.type).label("ts_last"),
        cast(total, Float).label("total"),
        cast(successors, BigInteger).label("successors"),
        cast(to_dst, Float).label("to_dst"),
    )


def _edge_summary(dialect: str, i: int) -> Select[Any]:
    """Link ``i``'s source's active edges (at its version, when the step gives one): the
    total of their decayed counts now, their distinct successors, the count to the link's
    destination (counts of 0 left out, as ``predict_next`` leaves them)."""
    count = decayed_count(dialect, M.c.decayed_uses, M.c.decay_lambda, M.c.ts_last, now_param())
    dst = bindparam(f"e{i + 1}", type_=String)
    version = bindparam(f"v{i}", type_=String)
    return _summary(
        EDGE_SUMMARY,
        i,
        func.coalesce(func.sum(count), 0.0),
        func.count(M.c.dst_executor.distinct()),
        func.coalesce(func.sum(case((M.c.dst_executor == dst, count), else_=0.0)), 0.0),
    ).where(
        is_active(M),
        M.c.src_executor == bindparam(f"e{i}", type_=String),
        or_(version.is_(None), M.c.src_version == version),
        count > 0,
    )


def _chain_summary(dialect: str, i: int) -> Select[Any]:
    """The chains after link ``i``'s two steps (the step before its source, its source):
    the same three figures."""
    lam = literal(CHAIN_DECAY_LAMBDA, Float)
    count = decayed_count(dialect, C.c.decayed_uses, lam, C.c.ts_last, now_param())
    dst = bindparam(f"e{i + 1}", type_=String)
    return _summary(
        CHAIN_SUMMARY,
        i,
        func.coalesce(func.sum(count), 0.0),
        func.count(),
        func.coalesce(func.sum(case((C.c.dst_executor == dst, count), else_=0.0)), 0.0),
    ).where(
        C.c.prev_executor == bindparam(f"e{i - 1}", type_=String),
        C.c.src_executor == bindparam(f"e{i}", type_=String),
        count > 0,
    )
