"""The sieve's statement (contract §11): every link of a proposed chain in one query.

The links are a small table of bound values (link index, source executor and version,
destination executor and version, a version NULL where the step gives none). For each link
a correlated subquery picks the id of its best row among the rows of ``a → b`` in every
state, through the edge indexes; the row is then read by its primary key, with its
effective weight now by the decay expression every reader uses. One statement per chain
length, built once and bound per call: vetting a chain is one statement whatever its length
or versions, and its text stays short enough for the drivers' statement caches.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    String,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    union_all,
)

from ..sqlrules import decayed, now_param
from .tables import MNESTS as M
from .tables import is_active

__all__ = ["VET_COLUMNS", "VET_SHAPES", "step_params", "vet_statement"]

# The columns of a row of :func:`vet_statement`, in order.
VET_COLUMNS: tuple[str, ...] = (
    "idx",
    "id",
    "state",
    "effective",
    "uses",
    "ok_count",
    "error_count",
    "ts_last",
)
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
    return (
        select(
            lk.idx,
            M.c.id,
            M.c.state,
            eff.label("effective"),
            M.c.uses,
            M.c.ok_count,
            M.c.error_count,
            M.c.ts_last,
        )
        .select_from(links)
        .join(M, M.c.id == best_id)
        .order_by(lk.idx)
    )
