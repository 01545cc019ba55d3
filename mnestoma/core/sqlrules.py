"""The SQL twins of :mod:`mnestoma.rules`: the same formulas and comparisons as SQL
expressions (tests evaluate them on both engines against the pure functions).

Builders that take the dialect name do so because SQLite and PostgreSQL spell day
arithmetic and the two-argument max differently.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Float, bindparam, case, func, literal, or_, type_coerce
from sqlalchemy.sql.elements import BindParameter

from mnestoma.core.rules import SECONDS_PER_DAY, threshold_cut
from mnestoma.core.types import UTCDateTime

__all__ = [
    "advanced",
    "below",
    "days_since",
    "decayed",
    "decayed_count",
    "greatest",
    "least",
    "merged_count",
    "now_param",
    "safe_product",
]


def now_param(name: str = "now") -> BindParameter[Any]:
    """A bound ``now`` typed as an aware UTC datetime."""
    return bindparam(name, type_=UTCDateTime())


def greatest(dialect: str, *args: Any) -> ColumnElement[Any]:
    """The larger of the arguments: ``GREATEST`` on PostgreSQL, scalar ``max`` on SQLite."""
    return func.greatest(*args) if dialect == "postgresql" else func.max(*args)


def least(dialect: str, *args: Any) -> ColumnElement[Any]:
    """The smaller of the arguments."""
    return func.least(*args) if dialect == "postgresql" else func.min(*args)


def days_since(dialect: str, earlier: Any, now: Any) -> ColumnElement[float]:
    """Days from ``earlier`` to ``now`` as a float, not clamped."""
    if dialect == "postgresql":
        seconds = func.extract("epoch", now - earlier) / literal(SECONDS_PER_DAY, Float)
        return type_coerce(seconds, Float)  # a float8 already: typed, not cast
    return (func.julianday(now) - func.julianday(earlier)).cast(Float)


def advanced(old: Any, now: Any) -> ColumnElement[Any]:
    """``max(old, now)`` for timestamps, twin of :func:`mnestoma.rules.advance`."""
    return case((old > now, old), else_=now)


def below(effective: Any, threshold: float) -> ColumnElement[bool]:
    """``effective`` below one of the ager's thresholds, twin of
    :func:`mnestoma.rules.is_below`: compared with :func:`~mnestoma.rules.threshold_cut`."""
    cut: ColumnElement[bool] = effective < literal(threshold_cut(threshold), Float)
    return cut


# PostgreSQL raises "value out of range: underflow" where Python quietly returns 0.0:
# exponents are capped and vanishing weights are 0. Below 1e-87 nothing is observable.
MAX_EXPONENT = 200.0
VANISHING = 1e-100
# A decay speed this small decays nothing observable (exp(-x) is 1 for x below 1e-16), and
# its product with a short time could underflow: its exponent is 0.
NEGLIGIBLE_RATE = 1e-150


def decayed(dialect: str, weight: Any, decay_lambda: Any, since: Any, now: Any) -> Any:
    """``weight × exp(−decay_lambda × max(0, days(now − since)))`` in SQL."""
    days = greatest(dialect, literal(0.0, Float), days_since(dialect, since, now))
    exponent = case(
        (decay_lambda < literal(NEGLIGIBLE_RATE, Float), literal(0.0, Float)),
        else_=least(dialect, decay_lambda * days, literal(MAX_EXPONENT, Float)),
    )
    return case(
        (weight < literal(VANISHING, Float), literal(0.0, Float)),
        else_=weight * func.exp(-exponent),
    )


def safe_product(a: Any, b: Any) -> Any:
    """``a × b`` for weights in [0, 1], 0 where the product would underflow."""
    tiny = literal(1e-150, Float)
    return case((or_(a < tiny, b < tiny), literal(0.0, Float)), else_=a * b)


def decayed_count(dialect: str, count: Any, decay_lambda: Any, ts_last: Any, now: Any) -> Any:
    """A row's decayed count of passings at ``now``, twin of
    :func:`mnestoma.rules.decayed_count`: the weight's decay, anchored at ``ts_last``."""
    return decayed(dialect, count, decay_lambda, ts_last, now)


def merged_count(
    dialect: str, a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]
) -> ColumnElement[float]:
    """Two rows' ``(decayed_uses, decay_lambda, ts_last)`` merged, twin of
    :func:`mnestoma.rules.merged_count`: each decayed to the later ``ts_last``, summed."""
    last = greatest(dialect, a[2], b[2])
    total: ColumnElement[float] = decayed_count(dialect, *a[:2], a[2], last) + decayed_count(
        dialect, *b[:2], b[2], last
    )
    return total
