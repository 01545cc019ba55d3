"""The SQL twins (mnestoma.core.sqlrules) and the ager's SQL agree with the pure rules, on both
engines: the same numbers, the same decisions at the thresholds, the same rows after a run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import PG_ADMIN_URL, require_postgresql
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_kit import built_then_migrated
from sqlalchemy import Engine, Float, bindparam, create_engine, inspect, select, text, type_coerce

from mnestoma import Mnestoma
from mnestoma.core import rules, sqlrules
from mnestoma.core.rules import AgerRow, MnestState
from mnestoma.core.types import UTCDateTime
from mnestoma.engines import make_engine
from mnestoma.schema.models import Mnest

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY_MS = 86_400_000
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# SQLite reads timestamps to the millisecond and its julianday() is a double of ~2.46e6 days
# (a 40 µs step): instants are drawn on whole milliseconds, day counts compared to 2e-9.
DAYS_ABS = 2e-9
# Weights: 1e-9 relative; below e^-200 (the SQL's underflow guard, sqlrules.MAX_EXPONENT)
# the SQL says 0 where Python keeps a subnormal.
WEIGHT_REL, WEIGHT_ABS = 1e-9, 1e-80


def _days_and_ms(days: st.SearchStrategy[int]) -> st.SearchStrategy[timedelta]:
    """Whole days and milliseconds drawn apart: one integer of milliseconds would be drawn
    mostly within a few seconds of zero."""
    return st.builds(
        lambda d, ms: timedelta(days=d, milliseconds=ms), days, st.integers(0, DAY_MS - 1)
    )


instants = _days_and_ms(st.integers(-400, 400)).map(lambda dt: NOW + dt)
weights = st.floats(0, 1)
lambdas = st.floats(0, 0.5)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine to evaluate expressions on (no table is touched)."""
    if request.param == "postgresql":
        require_postgresql()
        eng = create_engine(PG_ADMIN_URL)
    else:
        eng = create_engine("sqlite://")
    yield eng
    eng.dispose()


def _eval(engine: Engine, build: Any, **params: Any) -> Any:
    """Evaluate ``build(dialect)`` in a SELECT with ``params`` bound."""
    with engine.connect() as conn:
        return conn.execute(select(build(engine.dialect.name)), params).scalar_one()


W = bindparam("w", type_=Float())
LAM = bindparam("lam", type_=Float())
SINCE = bindparam("since", type_=UTCDateTime())
A = bindparam("a", type_=UTCDateTime())
B = bindparam("b", type_=UTCDateTime())
X = bindparam("x", type_=Float())
Y = bindparam("y", type_=Float())


@SETTINGS
@given(since=instants, now=instants)
def test_sql_days_since_is_the_day_count_between_two_instants(
    engine: Engine, since: datetime, now: datetime
) -> None:
    got = _eval(
        engine,
        lambda d: sqlrules.days_since(SINCE, sqlrules.now_param()),
        since=since,
        now=now,
    )
    assert got == pytest.approx((now - since).total_seconds() / rules.SECONDS_PER_DAY, abs=DAYS_ABS)


def _sql_decayed(d: Any) -> Any:
    return sqlrules.decayed(W, LAM, SINCE, sqlrules.now_param())


@SETTINGS
@given(w=weights, lam=lambdas, since=instants, now=instants)
def test_sql_decay_is_the_pure_decayed_weight(
    engine: Engine, w: float, lam: float, since: datetime, now: datetime
) -> None:
    got = _eval(engine, _sql_decayed, w=w, lam=lam, since=since, now=now)
    expected = rules.decayed_weight(w, lam, since, now)
    assert got == pytest.approx(expected, rel=WEIGHT_REL, abs=WEIGHT_ABS)


@SETTINGS
@given(c=st.floats(0, 1e6), lam=lambdas, since=instants, now=instants)
def test_sql_decayed_count_is_the_pure_one(
    engine: Engine, c: float, lam: float, since: datetime, now: datetime
) -> None:
    got = _eval(
        engine,
        lambda d: sqlrules.decayed_count(W, LAM, SINCE, sqlrules.now_param()),
        w=c,
        lam=lam,
        since=since,
        now=now,
    )
    expected = rules.decayed_count(c, lam, since, now)
    assert got == pytest.approx(expected, rel=WEIGHT_REL, abs=WEIGHT_ABS)


C1, C2 = bindparam("c1", type_=Float()), bindparam("c2", type_=Float())
L1, L2 = bindparam("l1", type_=Float()), bindparam("l2", type_=Float())


def _sql_merged(d: Any) -> Any:
    """SQL's decayed count of two rows merged: (c1, l1, a) and (c2, l2, b)."""
    return sqlrules.merged_count((C1, L1, A), (C2, L2, B))


@SETTINGS
@given(c1=st.floats(0, 1e3), c2=st.floats(0, 1e3), l1=lambdas, l2=lambdas, a=instants, b=instants)
def test_sql_merged_count_is_the_pure_one(
    engine: Engine, c1: float, c2: float, l1: float, l2: float, a: datetime, b: datetime
) -> None:
    got = _eval(engine, _sql_merged, c1=c1, c2=c2, l1=l1, l2=l2, a=a, b=b)
    expected, last = rules.merged_count((c1, l1, a), (c2, l2, b))
    assert last == max(a, b)
    assert got == pytest.approx(expected, rel=WEIGHT_REL, abs=WEIGHT_ABS)


@pytest.mark.parametrize(("w", "lam"), [(5e-324, 50.0), (1.0, 50.0), (1e-120, 0.0)])
def test_sql_decay_of_vanishing_weights_is_zero_not_an_underflow(
    engine: Engine, w: float, lam: float
) -> None:
    got = _eval(engine, _sql_decayed, w=w, lam=lam, since=NOW - timedelta(days=400), now=NOW)
    assert got == pytest.approx(rules.decayed_weight(w, lam, NOW - timedelta(days=400), NOW))
    assert 0.0 <= got < 1e-80


@SETTINGS
@given(x=weights, y=weights, a=instants, b=instants)
def test_sql_greatest_and_least_are_max_and_min(
    engine: Engine, x: float, y: float, a: datetime, b: datetime
) -> None:
    def pair(d: str) -> Any:
        return sqlrules.greatest(X, Y) - sqlrules.least(X, Y)

    assert _eval(engine, pair, x=x, y=y) == max(x, y) - min(x, y)
    for fn, py in ((sqlrules.greatest, max), (sqlrules.least, min)):
        got = _eval(engine, lambda d, fn=fn: type_coerce(fn(A, B), UTCDateTime()), a=a, b=b)
        assert got == py(a, b)


@SETTINGS
@given(old=instants, now=instants)
def test_sql_advanced_is_the_pure_timestamp_anchor(
    engine: Engine, old: datetime, now: datetime
) -> None:
    got = _eval(engine, lambda d: sqlrules.advanced(A, sqlrules.now_param()), a=old, now=now)
    assert got == rules.advance(old, now)


_edge = st.sampled_from([-3e-9, -1e-9, -1e-10, 0.0, 1e-10, 1e-9, 3e-9, -0.1, 0.1])


@SETTINGS
@given(
    threshold=st.sampled_from([rules.DECAYING_BELOW, rules.PROTO_PRUNE_BELOW, rules.ARCHIVE_BELOW]),
    delta=_edge,
    nudge=st.sampled_from([-1, 0, 1]),
)
def test_sql_threshold_comparison_decides_like_is_below_at_the_edge(
    engine: Engine, threshold: float, delta: float, nudge: int
) -> None:
    value = threshold + delta
    for _ in range(abs(nudge)):  # one float step either side of the value, the cut included
        value = math.nextafter(value, math.copysign(math.inf, nudge))
    for v in (value, rules.threshold_cut(threshold)):
        got = _eval(engine, lambda d, t=threshold: sqlrules.below(X, t), x=v)
        assert bool(got) is rules.is_below(v, threshold)


@SETTINGS
@given(x=st.floats(0, 1), y=st.floats(0, 1))
def test_sql_safe_product_is_the_product_or_zero_when_it_would_underflow(
    engine: Engine, x: float, y: float
) -> None:
    got = _eval(engine, lambda d: sqlrules.safe_product(X, Y), x=x, y=y)
    assert got == pytest.approx(x * y, rel=1e-15, abs=1e-149)


# --- the CHECK constraints built from the rules are those the migrations write ---------------


def _checks(url: str) -> dict[tuple[str, str], str]:
    engine = make_engine(url)
    try:
        insp = inspect(engine)
        return {
            (table, str(c["name"])): c["sqltext"]
            for table in ("mnests", "events")
            for c in insp.get_check_constraints(table)
        }
    finally:
        engine.dispose()


def test_the_check_constraints_from_the_rules_equal_the_migrated_ones(empty_db_url: str) -> None:
    built, migrated = built_then_migrated(empty_db_url, _checks)
    assert built == migrated
    assert "ck_mnests_state_known" in {name for _, name in built}


# --- the whole ager: the pure model against apply_ager on small random stores ----------------

VERSIONED_KEYS = [("a", "1", "b", "1"), ("a", "1", "b", "2"), ("b", "1", "c", "1")]
PROTO_KEYS = [("a", "1", "wish", None), ("c", "1", "wish", None)]
# before now (negative: after it, as where the clock stepped back), in whole milliseconds;
# half of them at the archive age (90 days) or one millisecond either side of it
_archive_age = timedelta(days=rules.ARCHIVE_AFTER_DAYS)
ago = st.one_of(
    _days_and_ms(st.integers(-2, 200)),
    st.sampled_from([_archive_age + timedelta(milliseconds=ms) for ms in (-1, 0, 1)]),
).map(lambda dt: NOW - dt)


@st.composite
def _rows_of(draw: st.DrawFn, key: tuple[str, str, str, str | None], state: str) -> dict:
    first, last = sorted((draw(ago), draw(ago)))
    return {
        "src_executor": key[0],
        "src_version": key[1],
        "dst_executor": key[2],
        "dst_version": key[3],
        "state": state,
        "weight": draw(weights),
        "uses": draw(st.integers(1, 5)),
        "ts_first": first,
        "ts_last": last,
        "ts_weight": draw(ago),
        "decay_lambda": draw(st.one_of(st.just(rules.DEFAULT_DECAY_LAMBDA), st.floats(0, 0.2))),
        "decayed_uses": draw(st.floats(0, 50)),
    }


@st.composite
def stores(draw: st.DrawFn) -> list[dict]:
    """Rows of a valid store: at most one row per key and state, protos without a version."""
    rows = []
    for keys, states in (
        (VERSIONED_KEYS, [MnestState.ACTIVE, MnestState.DECAYING, MnestState.SUPERSEDED]),
        (PROTO_KEYS, [MnestState.PROTO, MnestState.SUPERSEDED]),
    ):
        for key in keys:
            for state in draw(st.sets(st.sampled_from(states))):
                rows.append(draw(_rows_of(key, state.value)))
    for i, row in enumerate(rows):
        row["id"] = f"mn_twin{i:08d}"
    return rows


def _stored(store: Mnestoma) -> list[AgerRow]:
    return sorted((AgerRow.of(r.as_dict()) for r in store.edges()), key=lambda r: r.id)


def _assert_same_rows(got: list[AgerRow], expected: list[AgerRow]) -> None:
    assert [r.id for r in got] == [r.id for r in expected]
    for g, e in zip(got, expected, strict=True):
        assert (g.state, g.uses, g.ts_first, g.ts_last, g.ts_weight) == (
            e.state,
            e.uses,
            e.ts_first,
            e.ts_last,
            e.ts_weight,
        ), g.id
        assert g.weight == pytest.approx(e.weight, rel=WEIGHT_REL, abs=WEIGHT_ABS), g.id
        assert g.decayed_uses == pytest.approx(e.decayed_uses, rel=WEIGHT_REL, abs=WEIGHT_ABS)


@SETTINGS
@given(rows=stores(), later=_days_and_ms(st.integers(0, 120)))
def test_apply_ager_does_what_the_pure_ager_does(
    store: Mnestoma, clock: Any, rows: list[dict], later: timedelta
) -> None:
    with store.engine.begin() as conn:
        for table in ("events", "ager_runs", "mnests"):
            conn.execute(text(f"DELETE FROM {table}"))
        if rows:
            conn.execute(Mnest.__table__.insert(), rows)
    expected = sorted((AgerRow.of(r) for r in rows), key=lambda r: r.id)
    for now in (NOW, NOW + later):
        clock.set(now)
        report = store.apply_ager()
        expected, expected_report = rules.age(expected, now)
        assert report == expected_report
        _assert_same_rows(_stored(store), expected)
