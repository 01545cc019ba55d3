"""A passing's numbers are the pure rules' bit for bit, through the facade on each engine:
the returned snapshot, the stored row and the event, on generated rows and clocks (clamps
at 1, exp's underflow, gaps of years and millennia, a clock stepping back); on SQLite, a row
whose instants another tool wrote in another text form, and the statements a passing runs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, text, update

import mnestoma
from mnestoma.core import rules
from mnestoma.core.clock import MovableClock
from mnestoma.core.types import EARLIEST_CLOCK, EARLIEST_INSTANT, INSTANTS_END
from mnestoma.schema.sql.tables import MNESTS

# 80 examples an engine, beside the explicit cases below: test_passing_in_sql.py draws runs
# of passings on one edge the same way, bit for bit, so the two share the search.
SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LAST_INSTANT = INSTANTS_END - timedelta(microseconds=1)
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

instants = st.datetimes(
    min_value=EARLIEST_CLOCK.replace(tzinfo=None),
    max_value=LAST_INSTANT.replace(tzinfo=None),
).map(lambda d: d.replace(tzinfo=UTC))
# Gaps from a microsecond to millennia, either way (a clock stepping back).
gaps = st.one_of(
    st.integers(-(10**6), 10**6).map(lambda us: timedelta(microseconds=us)),
    st.integers(-400, 400).map(lambda d: timedelta(days=d)),
    st.builds(
        lambda y, us: timedelta(days=365 * y, microseconds=us),
        st.integers(-9000, 9000),
        st.integers(0, 86_400 * 10**6 - 1),
    ),
)
weights = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 5e-324, 1e-310, 0.85, math.nextafter(0.85, 1.0), 0.9, 1.0]),
)
lambdas = st.one_of(
    st.floats(0.0, 1e300),
    st.floats(0.0, 1e-6),
    st.sampled_from([0.0, 5e-324, 1e-9, rules.DEFAULT_DECAY_LAMBDA, 50.0, 1e300]),
)
counts = st.one_of(st.floats(0.0, 1e6), st.sampled_from([0.0, 1.0, 5e-324]))


def _within(when: datetime) -> bool:
    return EARLIEST_CLOCK <= when < INSTANTS_END


@pytest.fixture(scope="module")
def clock() -> MovableClock:
    return MovableClock(T0)


@pytest.fixture(scope="module")
def store(module_store_url: str, clock: MovableClock) -> Iterator[Any]:
    m = mnestoma.Mnestoma(module_store_url, clock=clock)
    yield m
    m.close()


@pytest.fixture
def sqlite_store(tmp_path: Path, clock: MovableClock) -> Iterator[mnestoma.Mnestoma]:
    """A SQLite store only: its text instants and its statements are SQLite's own."""
    url = f"sqlite:///{tmp_path / 'sqlite-only.sqlite'}"
    mnestoma.upgrade(url)
    with mnestoma.Mnestoma(url, clock=clock) as store:
        yield store


_names = itertools.count()


def _seeded(store: Any, clock: MovableClock, **values: Any) -> tuple[str, ...]:
    """A new edge whose row then holds ``values`` (written as the package writes them)."""
    key = (f"s{next(_names)}", "1", "d", "1")
    clock.set(T0)
    row = store.record_passing(*key)
    with store.engine.begin() as conn:
        conn.execute(
            update(MNESTS).where(MNESTS.c.id == row.id).values(ts_first=EARLIEST_INSTANT, **values)
        )
    return key


def _bits(x: float) -> str:
    return x.hex() if not math.isnan(x) else "nan"


def _expected(
    weight: float, lam: float, ts_weight: datetime, ts_last: datetime, count: float, now: datetime
) -> dict[str, Any]:
    """What Python's rules make of one more passing at ``now`` (MnestRepository's arithmetic)."""
    last = rules.advance(ts_last, now)
    anchor = rules.advance(ts_weight, now)
    before = rules.decayed_weight(weight, lam, ts_weight, anchor)
    return {
        "before": before,
        "after": rules.reinforce(before),
        "ts_last": last,
        "ts_weight": anchor,
        "count": rules.counted_passing(count, lam, ts_last, last),
    }


def _check_passing(
    store: Any,
    clock: MovableClock,
    weight: float,
    lam: float,
    ts_weight: datetime,
    ts_last: datetime,
    count: float,
    now: datetime,
) -> None:
    key = _seeded(
        store,
        clock,
        weight=weight,
        decay_lambda=lam,
        ts_weight=ts_weight,
        ts_last=ts_last,
        decayed_uses=count,
    )
    want = _expected(weight, lam, ts_weight, ts_last, count, now)
    clock.set(now)
    got = store.record_passing(*key, turn_id=f"turn-{key[0]}", outcome="ok")
    stored = store.get(got.id)
    (ev,) = [e for e in store.events(mnest_id=got.id) if e.kind == "reinforced"]
    for seen in (got, stored):
        assert _bits(seen.weight) == _bits(want["after"])
        assert _bits(seen.decayed_uses) == _bits(want["count"])
        assert seen.ts_last == want["ts_last"]
        assert seen.ts_weight == want["ts_weight"]
        assert (seen.uses, seen.ok_count, seen.error_count) == (2, 1, 0)
    assert _bits(ev.weight_before) == _bits(want["before"])
    assert _bits(ev.weight_after) == _bits(want["after"])
    assert ev.ts == want["ts_last"]


@SETTINGS
@given(
    weight=weights,
    lam=lambdas,
    ts_weight=instants,
    last_gap=gaps,
    now_gap=gaps,
    count=counts,
)
@example(weight=0.9, lam=0.0, ts_weight=T0, last_gap=timedelta(0), now_gap=timedelta(1), count=1.0)
@example(  # the weight's decay underflows to a subnormal, then to 0
    weight=1.0,
    lam=50.0,
    ts_weight=T0,
    last_gap=timedelta(0),
    now_gap=timedelta(days=14.9),
    count=1.0,
)
@example(  # a gap past 2**53 microseconds, a slow decay: the last bit of the day count shows
    weight=0.5,
    lam=1e-7,
    ts_weight=datetime(1100, 1, 1, tzinfo=UTC),
    last_gap=timedelta(0),
    now_gap=timedelta(days=365 * 3000, microseconds=123_457),
    count=7.0,
)
@example(  # ts_last 2,480 years back, now a moment before ts_weight
    weight=0.0,
    lam=7.219178396661042e-08,
    ts_weight=datetime(3482, 1, 1, tzinfo=UTC),
    last_gap=timedelta(days=-905930),
    now_gap=timedelta(microseconds=-28710),
    count=1.0,
)
def test_a_passing_is_the_rules_passing_bit_for_bit(
    store: Any,
    clock: MovableClock,
    weight: float,
    lam: float,
    ts_weight: datetime,
    last_gap: timedelta,
    now_gap: timedelta,
    count: float,
) -> None:
    try:
        ts_last, now = ts_weight + last_gap, ts_weight + now_gap
    except OverflowError:
        assume(False)
    assume(_within(ts_last) and _within(now))
    _check_passing(store, clock, weight, lam, ts_weight, ts_last, count, now)


@pytest.mark.parametrize("years", [1, 2, 10, 284, 285, 286, 1000, 8000])
@pytest.mark.parametrize("lam", [rules.DEFAULT_DECAY_LAMBDA, 1e-7, 0.0])
def test_gaps_of_years_decay_as_python_decays_them(
    store: Any, clock: MovableClock, years: int, lam: float
) -> None:
    then = datetime(1001, 2, 3, 4, 5, 6, 789_012, tzinfo=UTC)
    now = then + timedelta(days=365.2425 * years, microseconds=345_679)
    _check_passing(store, clock, 0.7, lam, then, then, 3.5, now)


def test_instants_another_tool_wrote_in_another_text_form_are_read_right(
    sqlite_store: Any, clock: MovableClock
) -> None:
    store = sqlite_store
    key = _seeded(store, clock, weight=0.5)
    with store.engine.begin() as conn:  # as another tool may write them
        conn.execute(
            text("UPDATE mnests SET ts_weight = '2026-03-01 09:00:00Z' WHERE src_executor = :s"),
            {"s": key[0]},
        )
    now = T0 + timedelta(days=3, seconds=7)
    clock.set(now)
    got = store.record_passing(*key)
    want = rules.reinforce(rules.decayed_weight(0.5, rules.DEFAULT_DECAY_LAMBDA, T0, now))
    assert _bits(got.weight) == _bits(want)
    assert got.ts_weight == now and got.uses == 2


def test_a_passing_is_a_lookup_and_two_writes_with_a_turn_or_without(
    sqlite_store: Any, clock: MovableClock
) -> None:
    store = sqlite_store
    seen: list[str] = []

    def listener(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(" ".join(statement.split()[:2]))

    key = (f"s{next(_names)}", "1", "d", "1")
    clock.set(T0)
    calls: list[list[str]] = []
    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        for turn in (None, None, "t", "t"):
            seen.clear()
            store.record_passing(*key, turn_id=turn)
            calls.append(list(seen))
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    created, reinforced, in_turn, counted = calls
    assert created == ["SELECT mnests.id,", "INSERT INTO", "INSERT INTO"]
    assert reinforced == in_turn == ["SELECT mnests.id,", "UPDATE mnests", "INSERT INTO"]
    assert counted == ["SELECT mnests.id,"]  # the turn counted it: nothing written
    assert store.find(*key).uses == 3
