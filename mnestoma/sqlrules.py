"""The SQL twins of :mod:`mnestoma.rules`: the same formulas and comparisons as SQL
expressions (tests evaluate them on both engines against the pure functions).

Builders that take the dialect name do so because SQLite and PostgreSQL spell day
arithmetic and the two-argument max differently.

The ``sqlite_exact_*`` builders are SQLite's bit-for-bit twins, for a passing computed in
its statement: the same IEEE operations in the same order as the pure functions, on the
instants as SQLite stores them (:func:`~mnestoma.types.sqlite_timestamp_text`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    or_,
    type_coerce,
)
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BindParameter

from .rules import REINFORCEMENT, SECONDS_PER_DAY, threshold_cut
from .types import UTCDateTime

__all__ = [
    "advanced",
    "below",
    "days_since",
    "decayed",
    "decayed_count",
    "exact_real",
    "greatest",
    "least",
    "merged_count",
    "now_param",
    "reinforced_sqlite",
    "safe_product",
    "sqlite_exact_counted_passing",
    "sqlite_exact_days_between",
    "sqlite_exact_decayed",
    "sqlite_exact_instant",
    "sqlite_exact_microseconds",
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


def exact_real(value: float) -> ColumnElement[float]:
    """A double written into the statement exactly, as the ratio of two integers (its
    denominator a power of two): not through a bound parameter, nor through the engine's
    parsing of a decimal, which SQLite does not promise to round correctly."""
    numerator, denominator = value.as_integer_ratio()
    real = f"CAST({numerator} AS REAL)"
    text = real if denominator == 1 else f"({real} / {denominator})"
    return literal_column(text, Float)


def reinforced_sqlite(effective: Any) -> ColumnElement[float]:
    """Twin of :func:`mnestoma.rules.reinforce` on SQLite, bit for bit on a weight the store
    holds (at least 0): ``effective + 0.15``, at most 1 (SQLite's two-argument ``min`` and
    ``max`` return one of their arguments as it is, as ``clamp_weight`` does), evaluating
    ``effective`` once."""
    raised = effective + exact_real(REINFORCEMENT)
    clamped: ColumnElement[float] = func.max(exact_real(0.0), func.min(raised, exact_real(1.0)))
    return clamped


# SQLite's exact twins. An instant is stored as text, ``YYYY-MM-DD HH:MM:SS.ffffff`` (UTC):
# its whole seconds since the epoch are exact integers (strftime's %s, read from the text
# without its fraction, which strftime would round to the millisecond), its microseconds
# the last six digits. Text in any other form (written by another tool) is not read here:
# a statement that needs it does nothing, and Python computes instead.
SQLITE_INSTANT_GLOB = "-".join(["[0-9]" * 4, "[0-9]" * 2, "[0-9]" * 2]) + (
    " " + ":".join(["[0-9]" * 2] * 3) + "." + "[0-9]" * 6
)
MICROSECONDS_PER_SECOND = 1_000_000
# A count of microseconds is an exact double up to 2**53 (285.4 years): within this many
# calendar years of each other two instants are less than 285.3 years apart, and their
# count of microseconds divided by 10**6 is rounded once, as Python rounds it.
EXACT_DIVISION_YEARS = 284


def sqlite_exact_instant(ts: Any) -> ColumnElement[bool]:
    """``ts`` is an instant in the one text form this package writes on SQLite (a pattern
    written in: SQLite would prepare the statement again for each bound pattern)."""
    matches: ColumnElement[bool] = ts.op("GLOB")(literal_column(f"'{SQLITE_INSTANT_GLOB}'"))
    return matches


def _int(value: int) -> ColumnElement[int]:
    """An integer written in (a constant of the statement's text, not a parameter)."""
    return literal_column(str(value), Integer)


def _sqlite_whole_seconds(ts: Any) -> ColumnElement[int]:
    return func.strftime(literal_column("'%s'"), func.substr(ts, _int(1), _int(19))).cast(Integer)


def _sqlite_micros_of(ts: Any) -> ColumnElement[int]:
    return func.substr(ts, _int(21), _int(6)).cast(Integer)


def _divided(a: Any, b: Any) -> ColumnElement[Any]:
    """``a / b`` as SQLite divides: integers truncated, else as doubles (SQLAlchemy's ``/``
    would turn an integer division into a true one)."""
    div = operators.truediv
    quotient: ColumnElement[Any] = a.self_group(against=div).op("/")(b.self_group(against=div))
    return quotient


def sqlite_exact_microseconds(earlier: Any, later: Any) -> ColumnElement[int]:
    """The integer count of microseconds from ``earlier`` to ``later`` (negative when
    ``later`` is the earlier), both instants as SQLite stores them: what
    ``(later - earlier) // timedelta(microseconds=1)`` is in Python."""
    seconds = _sqlite_whole_seconds(later) - _sqlite_whole_seconds(earlier)
    micros: ColumnElement[int] = seconds * _int(MICROSECONDS_PER_SECOND) + (
        _sqlite_micros_of(later) - _sqlite_micros_of(earlier)
    )
    return micros


def sqlite_exact_days_between(earlier: Any, later: Any) -> ColumnElement[float]:
    """Twin of :func:`mnestoma.rules.days_between` on SQLite, bit for bit. Python's
    ``timedelta.total_seconds()`` is the exact count of microseconds divided by 10**6,
    rounded once. Within :data:`EXACT_DIVISION_YEARS` years (a comparison of texts) that
    count is an exact double and one division rounds as Python does; further apart, whole
    seconds (exact) plus the fraction (a double within 2**-54 of its value) rounds to the
    same double, since no count of microseconds beyond 2**20 seconds lies that close to a
    midpoint between two doubles. A negative count gives a negative number either way,
    which the clamp makes 0. The count is computed once, in the branch taken."""
    micros = sqlite_exact_microseconds(earlier, later)
    per_second = exact_real(float(MICROSECONDS_PER_SECOND))
    whole = _int(MICROSECONDS_PER_SECOND)
    # The year as text followed by '-': text that is no number, so that a column's numeric
    # affinity (DATETIME) does not turn it into one, which every text would sort after.
    year = func.substr(later, _int(1), _int(4)) - _int(EXACT_DIVISION_YEARS)
    near = earlier > func.printf(literal_column("'%04d-'"), year)
    seconds = case(
        (near, _divided(micros, per_second)),
        else_=_divided(micros, whole) + _divided(micros % whole, per_second),
    )
    days = _divided(seconds, exact_real(SECONDS_PER_DAY))
    clamped: ColumnElement[float] = func.max(exact_real(0.0), days)
    return clamped


def sqlite_exact_decayed(weight: Any, decay_lambda: Any, since: Any, now: Any) -> Any:
    """Twin of :func:`mnestoma.rules.decayed_weight` on SQLite, bit for bit:
    ``weight × exp(−decay_lambda × days)``, with no cap (SQLite's exp, like Python's, returns
    0 or a subnormal where the true value underflows)."""
    return weight * func.exp(-decay_lambda * sqlite_exact_days_between(since, now))


def sqlite_exact_counted_passing(count: Any, decay_lambda: Any, ts_last: Any, now: Any) -> Any:
    """Twin of :func:`mnestoma.rules.counted_passing` on SQLite, bit for bit: the count
    decayed from ``ts_last`` to ``now``, plus one."""
    return sqlite_exact_decayed(count, decay_lambda, ts_last, now) + exact_real(1.0)
