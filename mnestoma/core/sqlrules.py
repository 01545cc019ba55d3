"""The SQL twins of :mod:`mnestoma.rules`: the same formulas and comparisons as SQL
expressions (tests evaluate them on both engines against the pure functions).

SQLite and PostgreSQL spell day arithmetic and the two-argument max differently: each
builder returns one expression, and SQLAlchemy's compiler spells it for the dialect it
compiles for (``@compiles`` on the constructs below), so no builder asks which engine.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Float, Integer, bindparam, case, func, literal, or_
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.functions import FunctionElement

from mnestoma.core.rules import (
    MAX_EXPONENT,
    NEGLIGIBLE_RATE,
    REINFORCEMENT,
    SECONDS_PER_DAY,
    VANISHING,
    threshold_cut,
)
from mnestoma.core.types import UTCDateTime

__all__ = [
    "advanced",
    "below",
    "days_since",
    "decayed",
    "decayed_count",
    "exact_days_since",
    "greatest",
    "least",
    "merged_count",
    "now_param",
    "passing_count",
    "reinforce",
    "reinforced_weight",
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


class _ExactDaysSince(FunctionElement[float]):
    """Days from the first argument to the second, as :func:`mnestoma.rules.days_between`
    computes them before its clamp, to the same float: the whole microseconds between the two
    over a day's seconds. SQLite reads them off its text instants
    (``YYYY-MM-DD HH:MM:SS.ffffff``: whole seconds from ``julianday`` of the instants cut
    to the second, microseconds by ``substr``), where ``julianday`` of the whole instants
    would round to the millisecond; PostgreSQL's interval epoch is exact already. Exact for
    instants up to 285 years apart (2**53 microseconds); past that SQLite's count of
    microseconds is rounded to a double before the division, and the day count may differ
    from Python's in its last bit (every decay at the default speed is floored to 0 by then)."""

    type = Float()
    inherit_cache = True


@compiles(_ExactDaysSince)
def _exact_days_since(element: _ExactDaysSince, compiler: SQLCompiler, **kw: Any) -> str:
    earlier, now = element.clauses
    # whole seconds: julianday() of the instants cut to the second, rounded (its error, tens
    # of microseconds, is far from half a second)
    whole = (
        func.julianday(func.substr(now, 1, 19)) - func.julianday(func.substr(earlier, 1, 19))
    ) * literal(SECONDS_PER_DAY, Float)
    seconds = func.round(whole).cast(Integer)
    micros = func.substr(now, 21).cast(Integer) - func.substr(earlier, 21).cast(Integer)
    total = seconds * literal(1_000_000, Integer) + micros
    days = total / literal(1e6, Float) / literal(SECONDS_PER_DAY, Float)
    return compiler.process(days, **kw)


@compiles(_ExactDaysSince, "postgresql")
def _exact_days_since_pg(element: _ExactDaysSince, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(_DaysSince(*element.clauses), **kw)


def exact_days_since(earlier: Any, now: Any) -> ColumnElement[float]:
    """Days from ``earlier`` to ``now``, not clamped, the same float on both engines as in
    Python (the writes compute their numbers with it; the ager's :func:`days_since` is
    cheaper and exact to the millisecond)."""
    return _ExactDaysSince(earlier, now)


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


def decayed(weight: Any, decay_lambda: Any, since: Any, now: Any, *, exact: bool = False) -> Any:
    """``weight × exp(−decay_lambda × max(0, days(now − since)))`` in SQL, floored as
    :func:`mnestoma.rules.decayed_weight` is; ``exact``: the days of
    :func:`exact_days_since`, for the same float as Python's."""
    spell = exact_days_since if exact else days_since
    days = greatest(literal(0.0, Float), spell(since, now))
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


def reinforce(effective: Any) -> ColumnElement[float]:
    """An effective weight after one more passing, twin of :func:`mnestoma.rules.reinforce`
    to the same float: plus REINFORCEMENT, clamped to [0, 1]."""
    raised = effective + literal(REINFORCEMENT, Float)
    clamped: ColumnElement[float] = case(
        (raised < literal(0.0, Float), literal(0.0, Float)),
        (raised > literal(1.0, Float), literal(1.0, Float)),
        else_=raised,
    )
    return clamped


def reinforced_weight(weight: Any, decay_lambda: Any, since: Any, now: Any) -> ColumnElement[float]:
    """The weight after one more passing at ``now``, twin of
    :func:`mnestoma.rules.reinforced_weight` to the same float: the exact decay from ``since``,
    then :func:`reinforce`."""
    return reinforce(decayed(weight, decay_lambda, since, now, exact=True))


def passing_count(count: Any, decay_lambda: Any, ts_last: Any, now: Any) -> ColumnElement[float]:
    """A row's decayed count after one more passing at ``now``, twin of
    :func:`mnestoma.rules.counted_passing` to the same float (``now`` here is the row's new
    ``ts_last``)."""
    added: ColumnElement[float] = decayed(count, decay_lambda, ts_last, now, exact=True) + literal(
        1.0, Float
    )
    return added
