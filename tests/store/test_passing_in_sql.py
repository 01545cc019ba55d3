"""What a passing writes is the pure rules' passing, bit for bit, over runs of passings on one
edge through the facade on each engine, its clock moved between them (a microsecond to
years, forward and back, instants to the microsecond, fractions past .9995 of a second
among them): the weight, the decayed count and the instants of the row returned, of the row
stored and of the event; an occurrence of a turn counted once; a clock that steps back moves
no instant back and adds 0.15 without decay. On SQLite, "now" is read once a call, before
the write lock."""

from __future__ import annotations

import itertools
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

import mnestoma
from mnestoma.core import rules
from mnestoma.core.clock import MovableClock
from mnestoma.core.types import EARLIEST_CLOCK, EARLIEST_INSTANT, INSTANTS_END
from mnestoma.engines import partitions
from mnestoma.schema.sql.tables import MNESTS

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
LAST_START = datetime(9000, 1, 1, tzinfo=UTC)

# Instants to the microsecond.
instants = st.datetimes(
    min_value=EARLIEST_CLOCK.replace(tzinfo=None),
    max_value=LAST_START.replace(tzinfo=None),
).map(lambda d: d.replace(tzinfo=UTC))
# The clock's move between two passings: microseconds, days, more than a year; back too.
moves = st.one_of(
    st.integers(-(10**6), 10**6).map(lambda us: timedelta(microseconds=us)),
    st.builds(
        lambda d, us: timedelta(days=d, microseconds=us),
        st.integers(-400, 400),
        st.integers(0, 86_400 * 10**6 - 1),
    ),
    st.builds(
        lambda y, us: timedelta(days=365 * y, microseconds=us),
        st.integers(1, 30),
        st.integers(0, 86_400 * 10**6 - 1),
    ),
)
weights = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 5e-324, 0.85, math.nextafter(0.85, 1.0), 0.9, 1.0]),
)
# Up to decay speeds at which exp(-λ·days) underflows within a microsecond.
lambdas = st.one_of(
    st.floats(0.0, 1e3),
    st.sampled_from([0.0, 1e-9, rules.DEFAULT_DECAY_LAMBDA, 50.0, 1e6, 1e300]),
)
counts = st.one_of(st.floats(0.0, 1e6), st.sampled_from([0.0, 1.0]))
outcomes = st.sampled_from([None, "ok", "error"])
# Each step: the clock's move, the outcome, and whether it is in no turn, in a new turn,
# or the same occurrence of the last turn again (a no-op).
steps = st.lists(
    st.tuples(moves, outcomes, st.sampled_from(["none", "turn", "again"])),
    min_size=1,
    max_size=6,
)


@dataclass(frozen=True)
class Edge:
    """What the rules say the edge's row holds."""

    weight: float
    decay_lambda: float
    ts_weight: datetime
    ts_last: datetime
    decayed_uses: float
    uses: int = 1
    ok_count: int = 0
    error_count: int = 0


def passed(edge: Edge, now: datetime, outcome: str | None) -> tuple[Edge, float]:
    """The edge after one more passing at ``now`` by the pure rules, and the event's
    weight before."""
    last = rules.advance(edge.ts_last, now)
    anchor = rules.advance(edge.ts_weight, now)
    before = rules.decayed_weight(edge.weight, edge.decay_lambda, edge.ts_weight, anchor)
    ok, error = rules.outcome_counts(outcome)
    after = replace(
        edge,
        weight=rules.reinforce(before),
        ts_weight=anchor,
        ts_last=last,
        decayed_uses=rules.counted_passing(
            edge.decayed_uses, edge.decay_lambda, edge.ts_last, last
        ),
        uses=edge.uses + 1,
        ok_count=edge.ok_count + ok,
        error_count=edge.error_count + error,
    )
    return after, before


def _bits(x: float) -> str:
    return x.hex()


def assert_row_is(row: Any, edge: Edge) -> None:
    """``row`` (a snapshot) holds ``edge``, its floats to the bit, its instants to the µs."""
    assert type(row.weight) is type(row.decayed_uses) is float
    assert _bits(row.weight) == _bits(edge.weight)
    assert _bits(row.decayed_uses) == _bits(edge.decayed_uses)
    assert _bits(row.decay_lambda) == _bits(edge.decay_lambda)
    assert (row.ts_weight, row.ts_last) == (edge.ts_weight, edge.ts_last)
    assert (row.uses, row.ok_count, row.error_count) == (
        edge.uses,
        edge.ok_count,
        edge.error_count,
    )
    assert 0.0 <= row.weight <= 1.0
    assert row.ts_last >= row.ts_first


@pytest.fixture(scope="module")
def clock() -> MovableClock:
    return MovableClock(T0)


@pytest.fixture(scope="module")
def store(module_store_url: str, clock: MovableClock) -> Iterator[mnestoma.Mnestoma]:
    # The instants span nine thousand years: on PostgreSQL each passing's month would be
    # made, with three ahead, hundreds of partitions that have nothing to do with the
    # weights. Upkeep is switched off here; the default partition takes those events.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partitions, "_due", lambda engine, now: None)
        m = mnestoma.Mnestoma(module_store_url, clock=clock)
        yield m
        m.close()


_names = itertools.count()


def seeded(store: mnestoma.Mnestoma, clock: MovableClock, edge: Edge) -> tuple[str, ...]:
    """A new edge whose row then holds ``edge`` (written as the package writes its values)."""
    key = (f"p{next(_names)}", "1", "d", "1")
    clock.set(T0)
    row = store.record_passing(*key)
    with store.engine.begin() as conn:
        conn.execute(
            update(MNESTS)
            .where(MNESTS.c.id == row.id)
            .values(
                ts_first=EARLIEST_INSTANT,
                weight=edge.weight,
                decay_lambda=edge.decay_lambda,
                ts_weight=edge.ts_weight,
                ts_last=edge.ts_last,
                decayed_uses=edge.decayed_uses,
            )
        )
    return key


@SETTINGS
@given(
    weight=weights,
    lam=lambdas,
    count=counts,
    ts_weight=instants,
    last_move=moves,
    run=steps,
)
@example(  # fractions of a second past .9995: whole seconds must not be rounded up
    weight=0.3,
    lam=rules.DEFAULT_DECAY_LAMBDA,
    count=1.0,
    ts_weight=datetime(2026, 1, 1, 0, 47, 39, 3_835, tzinfo=UTC),
    last_move=timedelta(0),
    run=[
        (timedelta(hours=1, minutes=14, seconds=6, microseconds=995_788), None, "none"),
        (timedelta(microseconds=1), "ok", "turn"),
        (timedelta(seconds=3, microseconds=999_500 - 999_624), "error", "none"),
    ],
)
@example(  # clamped at 1, then a clock that steps back
    weight=1.0,
    lam=0.0,
    count=1e6,
    ts_weight=T0,
    last_move=timedelta(0),
    run=[(timedelta(days=3), "ok", "turn"), (timedelta(days=-3), None, "again")],
)
@example(  # exp underflows: the weight decays to 0 within a microsecond
    weight=0.7,
    lam=1e300,
    count=3.0,
    ts_weight=T0,
    last_move=timedelta(microseconds=-5),
    run=[(timedelta(microseconds=1), None, "none"), (timedelta(days=800), None, "turn")],
)
def test_a_run_of_passings_writes_what_the_rules_compute_bit_for_bit(
    store: mnestoma.Mnestoma,
    clock: MovableClock,
    weight: float,
    lam: float,
    count: float,
    ts_weight: datetime,
    last_move: timedelta,
    run: list[tuple[timedelta, str | None, str]],
) -> None:
    ts_last = ts_weight + last_move
    assume(EARLIEST_CLOCK <= ts_last < LAST_START)
    edge = Edge(weight, lam, ts_weight, ts_last, count)
    key = seeded(store, clock, edge)
    mnest_id = store.find(*key).id
    now = max(ts_weight, ts_last)
    turn: tuple[str, int] | None = None
    turns = itertools.count(1)
    for move, outcome, kind in run:
        now += move
        assume(EARLIEST_CLOCK <= now < INSTANTS_END)
        clock.set(now)
        events_before = [e.id for e in store.events(mnest_id=mnest_id)]
        if kind == "again" and turn is not None:  # the same occurrence again: a no-op
            got = store.record_passing(*key, turn_id=turn[0], occurrence=turn[1])
            assert_row_is(got, edge)
            assert_row_is(store.get(mnest_id), edge)
            assert sorted(e.id for e in store.events(mnest_id=mnest_id)) == sorted(events_before)
            continue
        if kind == "none":
            turn = None
            got = store.record_passing(*key, outcome=outcome)
        else:
            turn = (f"t{next(_names)}", next(turns) % 3 + 1)
            got = store.record_passing(*key, turn_id=turn[0], occurrence=turn[1], outcome=outcome)
        edge, before = passed(edge, now, outcome)
        assert_row_is(got, edge)
        assert_row_is(store.get(mnest_id), edge)
        new = [e for e in store.events(mnest_id=mnest_id) if e.id not in events_before]
        assert [e.kind for e in new] == ["reinforced"]
        (ev,) = new
        assert _bits(ev.weight_before) == _bits(before)
        assert _bits(ev.weight_after) == _bits(edge.weight)
        assert ev.ts == edge.ts_last
        assert (ev.outcome, ev.turn_id) == (outcome, turn[0] if turn else None)
        assert ev.occurrence == (turn[1] if turn else 1)


@pytest.mark.parametrize("in_turns", [False, True])
def test_a_clock_that_steps_back_moves_no_instant_back_and_adds_without_decay(
    store: mnestoma.Mnestoma, clock: MovableClock, in_turns: bool
) -> None:
    key = (f"back{next(_names)}", "1", "d", "1")
    clock.set(T0)
    store.record_passing(*key)
    latest = T0 + timedelta(days=5, microseconds=999_999)
    clock.set(latest)
    row = store.record_passing(*key)
    weights = [row.weight]
    for k in range(1, 7):  # each further passing earlier than the last: 0.45 up to 1, held
        clock.set(latest - timedelta(days=k, microseconds=k))
        turn = {"turn_id": f"back-turn-{key[0]}-{k}"} if in_turns else {}
        got = store.record_passing(*key, **turn)
        assert (got.ts_last, got.ts_weight) == (latest, latest)
        assert _bits(got.weight) == _bits(rules.clamp_weight(weights[-1] + rules.REINFORCEMENT))
        assert 0.0 <= got.weight <= 1.0
        weights.append(got.weight)
    assert weights[-2:] == [1.0, 1.0]
    got = store.find(*key)
    assert (got.ts_last, got.ts_weight, got.uses) == (latest, latest, 8)
    events = [e for e in store.events(mnest_id=got.id) if e.kind == "reinforced"]
    assert [e.ts for e in events] == [latest] * 7
    assert [e.weight_before for e in events[1:]] == weights[:-1]  # no decay at all


@pytest.fixture
def sqlite_store_path(tmp_path: Path) -> str:
    path = tmp_path / "clock-before-lock.sqlite"
    mnestoma.upgrade(f"sqlite:///{path}")
    return str(path)


def lock_free(path: str) -> bool:
    """Whether SQLite's write lock on the store at ``path`` is free now (taken and given
    back at once by a connection of its own)."""
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return False
    else:
        probe.execute("ROLLBACK")
        return True
    finally:
        probe.close()


@pytest.mark.parametrize("turn_id", [None, "turn-1"])
def test_sqlite_reads_the_clock_once_a_passing_before_its_write_lock(
    sqlite_store_path: str, turn_id: str | None
) -> None:
    free_at_each_read: list[bool] = []

    def clock() -> datetime:
        free_at_each_read.append(lock_free(sqlite_store_path))
        return T0 + timedelta(seconds=len(free_at_each_read))

    with mnestoma.Mnestoma(f"sqlite:///{sqlite_store_path}", clock=clock) as store:
        store.find("warm", "1", "up", "1")
        key = ("a", "1", "b", "1")
        for occurrence in (1, 2, 2):  # created, reinforced, and (in a turn) counted already
            free_at_each_read.clear()
            if turn_id is None:
                store.record_passing(*key)
            else:
                store.record_passing(*key, turn_id=turn_id, occurrence=occurrence)
            assert free_at_each_read == [True]
        assert store.find(*key).uses == (2 if turn_id else 3)
