"""The SQL twins of :mod:`mnestoma.rules`: the same formulas and comparisons as SQL
expressions (tests evaluate them on both engines against the pure functions).

SQLite and PostgreSQL spell day arithmetic and the two-argument max differently: each
builder returns one expression, and SQLAlchemy's compiler spells it for the dialect it
compiles for (``@compiles`` on the constructs below), so no builder asks which engine.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Float, bindparam, case, func, literal, or_
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.functions import FunctionElement

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


def _function_spelled(
    name: str, doc: str, default: str, postgresql: str
) -> type[FunctionElement[Any]]:
    """A function construct SQLAlchemy compiles as ``postgresql`` on PostgreSQL and as
    ``default`` elsewhere, with the same arguments."""
    construct: type[FunctionElement[Any]] = type(
        name, (FunctionElement,), {"__doc__": doc, "inherit_cache": True}
    )

    def spell(function: str) -> Any:
        def compile_(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
            return compiler.process(getattr(func, function)(*element.clauses), **kw)

        return compile_

    compiles(construct)(spell(default))
    compiles(construct, "postgresql")(spell(postgresql))
    return construct


_Greatest = _function_spelled(
    "_Greatest", "The larger of the arguments: GREATEST, or scalar max.", "max", "greatest"
)
_Least = _function_spelled(
    "_Least", "The smaller of the arguments: LEAST, or scalar min.", "min", "least"
)


class _DaysSince(FunctionElement[float]):
    """Days from the first argument to the second, as a float: the epoch of the interval
    over a day's seconds on PostgreSQL, the difference of Julian days elsewhere."""

    type = Float()
    inherit_cache = True


@compiles(_DaysSince)
def _days_since(element: _DaysSince, compiler: SQLCompiler, **kw: Any) -> str:
    earlier, now = element.clauses
    days = (func.julianday(now) - func.julianday(earlier)).cast(Float)
    return compiler.process(days, **kw)


@compiles(_DaysSince, "postgresql")
def _days_since_pg(element: _DaysSince, compiler: SQLCompiler, **kw: Any) -> str:
    earlier, now = element.clauses
    seconds = func.extract("epoch", now - earlier) / literal(SECONDS_PER_DAY, Float)
    return compiler.process(seconds, **kw)  # a float8 already: typed, not cast


def greatest(*args: Any) -> ColumnElement[Any]:
    """The larger of the arguments: ``GREATEST`` on PostgreSQL, scalar ``max`` on SQLite."""
    return _Greatest(*args)


def least(*args: Any) -> ColumnElement[Any]:
    """The smaller of the arguments."""
    return _Least(*args)


def days_since(earlier: Any, now: Any) -> ColumnElement[float]:
    """Days from ``earlier`` to ``now`` as a float, not clamped."""
    return _DaysSince(earlier, now)


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


def decayed(weight: Any, decay_lambda: Any, since: Any, now: Any) -> Any:
    """``weight × exp(−decay_lambda × max(0, days(now − since)))`` in SQL."""
    days = greatest(literal(0.0, Float), days_since(since, now))
    exponent = case(
        (decay_lambda < literal(NEGLIGIBLE_RATE, Float), literal(0.0, Float)),
        else_=least(decay_lambda * days, literal(MAX_EXPONENT, Float)),
    )
    return case(
        (weight < literal(VANISHING, Float), literal(0.0, Float)),
        else_=weight * func.exp(-exponent),
    )


def safe_product(a: Any, b: Any) -> Any:
    """``a × b`` for weights in [0, 1], 0 where the product would underflow."""
    tiny = literal(1e-150, Float)
    return case((or_(a < tiny, b < tiny), literal(0.0, Float)), else_=a * b)


def decayed_count(count: Any, decay_lambda: Any, ts_last: Any, now: Any) -> Any:
    """A row's decayed count of passings at ``now``, twin of
    :func:`mnestoma.rules.decayed_count`: the weight's decay, anchored at ``ts_last``."""
    return decayed(count, decay_lambda, ts_last, now)


def merged_count(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> ColumnElement[float]:
    """Two rows' ``(decayed_uses, decay_lambda, ts_last)`` merged, twin of
    :func:`mnestoma.rules.merged_count`: each decayed to the later ``ts_last``, summed."""
    last = greatest(a[2], b[2])
    total: ColumnElement[float] = decayed_count(*a[:2], a[2], last) + decayed_count(
        *b[:2], b[2], last
    )
    return total
