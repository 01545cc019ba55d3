"""The sieve's statement (contract §11): every link of a proposed chain in one query.

One branch per link a→b reads the rows of ``a → b`` (at the versions the steps give, any
version where a step gives none) in every state, with their effective weight now; a window
keeps the best row of each link. Built once per shape (dialect, and which steps give a
version) and bound per call, so that vetting a chain is one statement whatever its length.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    String,
    bindparam,
    case,
    func,
    literal,
    literal_column,
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
# How many statement shapes are kept built: a shape is a chain's length and which of its
# steps give a version; the few a service asks for stay, the rarest are built again.
VET_SHAPES = 256


def _executor(i: int) -> Any:
    return bindparam(f"e{i}", type_=String)


def _version(i: int) -> Any:
    return bindparam(f"v{i}", type_=String)


def step_params(steps: list[tuple[str, str | None]]) -> dict[str, Any]:
    """The parameters that :func:`vet_statement` binds for ``steps`` (``:now`` aside): the
    executor of step i as ``:e<i>``, its version, where given, as ``:v<i>``."""
    params: dict[str, Any] = {}
    for i, (executor, version) in enumerate(steps):
        params[f"e{i}"] = executor
        if version is not None:
            params[f"v{i}"] = version
    return params


def _branch(dialect: str, i: int, versions: tuple[bool, ...]) -> Select[Any]:
    """The rows of link i (step i → step i+1), in every state, with their effective weight
    and their standing (0 active, 1 any other state)."""
    eff = decayed(dialect, M.c.weight, M.c.decay_lambda, M.c.ts_weight, now_param())
    standing = case(
        (is_active(M), literal_column("0", Integer)), else_=literal_column("1", Integer)
    )
    terms: list[ColumnElement[bool]] = [
        M.c.src_executor == _executor(i),
        M.c.dst_executor == _executor(i + 1),
    ]
    if versions[i]:
        terms.append(M.c.src_version == _version(i))
    if versions[i + 1]:
        terms.append(M.c.dst_version == _version(i + 1))
    return select(
        literal_column(str(i), Integer).label("idx"),
        M.c.id,
        M.c.state,
        eff.label("effective"),
        M.c.uses,
        M.c.ok_count,
        M.c.error_count,
        M.c.ts_last,
        M.c.src_version,
        func.coalesce(M.c.dst_version, literal("", String)).label("dst_version"),
        standing.label("standing"),
    ).where(*terms)


@functools.lru_cache(maxsize=VET_SHAPES)
def vet_statement(dialect: str, versions: tuple[bool, ...]) -> Select[Any]:
    """The best row of each link of a chain of ``len(versions)`` steps (``versions[i]``:
    step i gives a version), one row per link that has any, by link index.

    The best row: an active one before any other state, then the highest effective weight
    at ``:now``, then more uses, then the latest use; versions and id make the choice total.
    A link without any row has no row here.
    """
    if len(versions) < 2:
        raise ValueError("a chain has at least two steps")
    branches = [_branch(dialect, i, versions) for i in range(len(versions) - 1)]
    rows = (branches[0] if len(branches) == 1 else union_all(*branches)).subquery("matches")
    c = rows.c
    order = (
        c.standing,
        c.effective.desc(),
        c.uses.desc(),
        c.ts_last.desc(),
        c.src_version,
        c.dst_version,
        c.id,
    )
    best = select(
        *(c[name] for name in VET_COLUMNS),
        func.row_number().over(partition_by=c.idx, order_by=order).label("place"),
    ).subquery("best")
    return (
        select(*(best.c[name] for name in VET_COLUMNS))
        .where(best.c.place == 1)
        .order_by(best.c.idx)
    )
