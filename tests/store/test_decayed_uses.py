"""The decayed count of passings (contract §12, "Orders for a planner"): ``decayed_uses``
kept by every door that records a passing, merged by the ager and by ``copy --append``,
filled for older rows by revision 0010, and the order of ``rank`` and ``suggest_next`` that
reads it. The weight of §4 never depends on it."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import package_engine
from opentelemetry.trace import Tracer
from otel_kit import Setup, otel_setup  # noqa: F401  (the setup fixture)
from schema_kit import insert_old_mnests
from sqlalchemy import select, text

import mnestoma
from mnestoma import InvalidInput, Passing
from mnestoma.core import rules
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.maintenance.copying import copy_store
from mnestoma.recording.tracing import executor, turn
from mnestoma.schema.models import Mnest, MnestomaView
from mnestoma.testing.clock import MovableClock

A = ("plan", "1", "search", "2")
LAMBDA = rules.DEFAULT_DECAY_LAMBDA
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def fade(days: float) -> float:
    """What one passing ``days`` old counts for."""
    return math.exp(-LAMBDA * days)


def count_of(m: mnestoma.Mnestoma, key: tuple[str, str, str, str] = A) -> float:
    row = m.find(*key)
    assert row is not None
    return row.decayed_uses


# --- the rule -------------------------------------------------------------------------------


def test_each_passing_adds_one_to_the_count_decayed_since_the_last(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    first = store.record_passing(*A)
    assert first.decayed_uses == 1.0
    clock.advance(days=2)
    store.record_passing(*A)
    clock.advance(days=3)
    row = store.record_passing(*A)
    expected = (1.0 * fade(2) + 1.0) * fade(3) + 1.0
    assert row.decayed_uses == pytest.approx(expected, rel=1e-12)
    assert count_of(store) == pytest.approx(expected, rel=1e-12)
    assert row.decayed_uses_at(clock.now + timedelta(days=10)) == pytest.approx(
        expected * fade(10), rel=1e-12
    )


def test_the_count_is_never_clamped_and_the_weight_stays_the_seeds(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    start = clock.now
    weights = []
    for _ in range(12):
        row = store.record_passing(*A)
        weights.append(row.weight)
        clock.advance(minutes=1)
    assert weights[0] == rules.INITIAL_WEIGHT  # §4's numbers, untouched
    then = start + timedelta(minutes=1)
    assert weights[1] == rules.reinforced_weight(rules.INITIAL_WEIGHT, LAMBDA, start, then)
    assert row.weight == 1.0  # §4: clamped after five quick passings
    assert row.decayed_uses == pytest.approx(12.0, rel=1e-3)  # the count is not


def test_a_clock_stepping_back_adds_one_without_decay(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    store.record_passing(*A)
    clock.advance(days=-3)
    assert store.record_passing(*A).decayed_uses == 2.0


def test_a_repeated_turn_counts_once(store: mnestoma.Mnestoma, clock: MovableClock) -> None:
    store.record_passing(*A, turn_id="t1")
    clock.advance(hours=1)
    store.record_passing(*A, turn_id="t1")
    store.record_turn("t1", [A, ("search", "2", "read", "1")])
    assert count_of(store) == 1.0


def test_a_proto_counts_its_passings_too(store: mnestoma.Mnestoma, clock: MovableClock) -> None:
    store.record_passing("plan", "1", "ocr", None, dst_exists=False)
    clock.advance(days=1)
    row = store.record_passing("plan", "1", "ocr", None, dst_exists=False)
    assert row.decayed_uses == pytest.approx(fade(1) + 1.0, rel=1e-12)


def test_the_database_refuses_a_negative_count(store_url: str, store: mnestoma.Mnestoma) -> None:
    from sqlalchemy import exc as sa_exc

    row = store.record_passing(*A)
    with package_engine(store_url) as engine:
        with pytest.raises(sa_exc.IntegrityError), engine.begin() as conn:
            conn.execute(text("UPDATE mnests SET decayed_uses = -1 WHERE id = :id"), {"id": row.id})
        with engine.connect() as conn:
            assert conn.execute(select(MnestomaView.decayed_uses)).scalar_one() == 1.0


# --- every door that records a passing ---------------------------------------------------------


def _twice_a_day_apart(record: Any, clock: MovableClock) -> None:
    record(1)
    clock.advance(days=1)
    record(2)


EXPECTED = fade(1) + 1.0


def test_record_turn_counts_each_occurrence_of_an_edge(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    B = ("search", "2", "read", "1")
    _twice_a_day_apart(lambda i: store.record_turn(f"t{i}", [A, B, Passing(*A)]), clock)
    assert count_of(store) == pytest.approx(2 * fade(1) + 2.0, rel=1e-12)  # A twice a turn
    assert count_of(store, B) == pytest.approx(EXPECTED, rel=1e-12)


def test_units_of_work_and_a_joined_session_count_alike(
    store_url: str, clock: MovableClock
) -> None:
    with package_engine(store_url) as engine:
        sessions = mnestoma.make_session_factory(engine)

        def in_unit(i: int) -> None:
            with mnestoma.UnitOfWork(sessions, clock=clock) as uow:
                uow.mnests.record_passing(*A, turn_id=f"u{i}")
                uow.commit()

        def joined(i: int) -> None:
            with sessions() as session:
                with mnestoma.UnitOfWork.joining(session, clock=clock) as uow:
                    uow.mnests.record_turn(f"j{i}", [("search", "2", "read", "1")])
                    uow.commit()  # the savepoint
                session.commit()  # the service's transaction

        _twice_a_day_apart(in_unit, clock)
        _twice_a_day_apart(joined, clock)
        with mnestoma.Mnestoma(engine, clock=clock) as m:
            assert count_of(m) == pytest.approx(EXPECTED, rel=1e-12)
            assert count_of(m, ("search", "2", "read", "1")) == pytest.approx(EXPECTED, rel=1e-12)


def test_the_async_door_counts_and_orders_as_the_sync_one(
    store_url: str, clock: MovableClock
) -> None:
    async def go() -> tuple[float, list[str], list[str]]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.record_passing(*A)
            clock.advance(days=1)
            await am.record_turn("t-async", [A])
            await am.record_passing("plan", "1", "fetch", "1")
            row = await am.find(*A)
            assert row is not None
            suggested = await am.suggest_next("plan", order_by="decayed_uses")
            ranked = await am.rank("plan", ["fetch", "search"], order_by="decayed_uses")
            return (
                row.decayed_uses,
                [m.dst_executor for m, _ in suggested],
                [r.executor for r in ranked],
            )

    count, suggested, ranked = asyncio.run(go())
    assert count == pytest.approx(EXPECTED, rel=1e-12)
    assert suggested == ranked == ["search", "fetch"]


@executor("fs.search", "1.2")
def search(pattern: str) -> list[str]:
    return [f"reports/{pattern}-2026.pdf"]


@executor("fs.read", "2.0")
def read(path: str) -> str:
    return f"the text of {path}"


def test_the_tracer_counts_its_turns(store: mnestoma.Mnestoma, clock: MovableClock) -> None:
    def traced(i: int) -> None:
        with turn(store, f"traced-{i}"):
            read(search("budget")[0])

    _twice_a_day_apart(traced, clock)
    (row,) = store.edges()
    assert (row.src_executor, row.dst_executor, row.uses) == ("fs.search", "fs.read", 2)
    assert row.decayed_uses == pytest.approx(EXPECTED, rel=1e-12)


def _tool(tracer: Tracer, name: str, arguments: Any, result: Any) -> None:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.arguments": json.dumps(arguments),
        "gen_ai.tool.call.result": json.dumps(result),
    }
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes):
        pass


def test_the_otel_processor_counts_its_traces(
    setup: Setup, store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    processor, tracer = setup(store)

    def traced(i: int) -> None:
        with tracer.start_as_current_span("turn"):
            _tool(tracer, "fs.search", {"pattern": "*.pdf"}, [f"a/report-{i}.pdf"])
            _tool(tracer, "fs.read", {"path": f"a/report-{i}.pdf"}, "Revenue grew")
        assert processor.force_flush(10_000)

    _twice_a_day_apart(traced, clock)
    (row,) = store.edges()
    assert row.dst_executor == "fs.read" and row.uses == 2
    assert row.decayed_uses == pytest.approx(EXPECTED, rel=1e-12)


# --- merges: the ager's and a copy's ------------------------------------------------------------


@pytest.mark.parametrize("run", ["batched", "one_transaction"])
def test_the_agers_merge_sums_the_counts_at_the_later_last_passing(
    store: mnestoma.Mnestoma, clock: MovableClock, run: str
) -> None:
    start = clock.now
    first = store.record_passing(*A)
    clock.advance(days=25)  # 0.30 → 0.19: demoted, its count kept
    assert store.apply_ager().to_decaying == 1
    assert store.get(first.id).decayed_uses == 1.0  # type: ignore[union-attr]
    later = clock.now
    for _ in range(3):
        store.record_passing(*A)  # a fresh active row beside the decaying one: count 3
    clock.advance(days=70)  # 0.60 → 0.17: demoted into the decaying row
    if run == "batched":
        assert store.apply_ager().merged == 1
    else:
        with store.unit_of_work() as uow:
            assert uow.mnests.apply_ager().merged == 1
            uow.commit()
    (row,) = store.edges()
    assert row.id == first.id and row.ts_last == later
    assert row.decayed_uses == pytest.approx(3.0 + fade(25), rel=1e-9)
    assert row.decayed_uses == pytest.approx(
        rules.merged_count((1.0, LAMBDA, start), (3.0, LAMBDA, later))[0], rel=1e-12
    )


def _store_of(url: str, *, side: str) -> None:
    """Turn ``shared`` at T0, then two turns of the store's own, an hour apart each."""
    clock = MovableClock(T0)
    mnestoma.upgrade(url)
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn("shared", [A])
        for i in range(2):
            clock.advance(hours=1)
            m.record_turn(f"{side}-{i}", [A])


def test_copy_keeps_the_count(tmp_path: Path, empty_db_url: str) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    _store_of(source, side="source")
    copy_store(source, empty_db_url)
    with mnestoma.Mnestoma(source) as s, mnestoma.Mnestoma(empty_db_url) as t:
        assert count_of(t) == count_of(s)


def test_copy_append_sums_the_counts_and_counts_a_shared_turn_once(
    tmp_path: Path, empty_db_url: str
) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    _store_of(source, side="source")
    _store_of(empty_db_url, side="target")
    report = copy_store(source, empty_db_url, append=True, clock=lambda: T0 + timedelta(days=1))
    assert report.merged == 1 and report.turns_counted_once == 1
    hour = 1 / 24
    # five passings: the shared turn's at T0 once, the two stores' own at T0+1h and T0+2h
    expected = fade(2 * hour) + 2 * fade(hour) + 2
    with mnestoma.Mnestoma(empty_db_url) as m:
        assert m.find(*A).uses == 5  # type: ignore[union-attr]
        assert count_of(m) == pytest.approx(expected, rel=1e-9)


# --- the order ----------------------------------------------------------------------------------


def _habits(store: mnestoma.Mnestoma, clock: MovableClock) -> None:
    """plan → old: 30 passings a month ago; plan → new: 3 passings now (weight 0.60, where
    the old edge's 1.0 has decayed to 0.58)."""
    for _ in range(30):
        store.record_passing("plan", "1", "old", "1")
        clock.advance(minutes=10)
    clock.advance(days=30)
    for _ in range(3):
        store.record_passing("plan", "1", "new", "1")
        clock.advance(minutes=10)


def test_rank_by_decayed_uses_keeps_frequency_where_the_weight_sees_recency(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    _habits(store, clock)
    by_weight = store.rank("plan", ["old", "new", "none"])
    assert [r.executor for r in by_weight] == ["new", "old", "none"]
    by_count = store.rank("plan", ["old", "new", "none"], order_by="decayed_uses")
    assert [r.executor for r in by_count] == ["old", "new", "none"]
    old, new, none = by_count
    assert old.decayed_uses == pytest.approx(30 * fade(30), rel=1e-2)
    assert new.decayed_uses == pytest.approx(3.0, rel=1e-3)
    assert none.decayed_uses == 0.0 and none.mnest is None
    assert old.score == old.weight  # the score stays the effective weight
    assert old.reason.startswith("decayed count ")


def test_suggest_next_by_decayed_uses_returns_the_counts(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    _habits(store, clock)
    (first, second) = store.suggest_next("plan", order_by="decayed_uses")
    assert (first[0].dst_executor, second[0].dst_executor) == ("old", "new")
    assert first[1] == pytest.approx(first[0].decayed_uses_at(clock.now), rel=1e-9)
    assert [m.dst_executor for m, _ in store.suggest_next("plan", k=1)] == ["new"]
    assert [
        m.dst_executor for m, _ in store.suggest_next("plan", k=1, order_by="decayed_uses")
    ] == ["old"]


def test_equal_counts_fall_back_on_the_weights_order(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    for dst in ("c", "b", "a"):
        store.record_passing("plan", "1", dst, "1")  # equal counts, equal weights
    store.record_passing("plan", "1", "b", "1", dst_exists=True)  # b: 2
    weight_order = [m.dst_executor for m, _ in store.suggest_next("plan", k=3)]
    count_order = [
        m.dst_executor for m, _ in store.suggest_next("plan", k=3, order_by="decayed_uses")
    ]
    assert count_order == weight_order == ["b", "a", "c"]
    cut = [m.dst_executor for m, _ in store.suggest_next("plan", k=2, order_by="decayed_uses")]
    assert cut == ["b", "a"]  # the tie across the second place broken as the weight's


@pytest.mark.parametrize("bad", ["success", "uses", "", None, 1])
def test_suggest_next_refuses_an_order_it_does_not_have(store: mnestoma.Mnestoma, bad: Any) -> None:
    with pytest.raises(InvalidInput, match="unknown order"):
        store.suggest_next("plan", order_by=bad)


# --- revision 0010 ------------------------------------------------------------------------------


def test_upgrading_a_store_of_0009_fills_the_counts_from_uses(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0009")
    rows = [
        # (id, uses, days between first and last passing, decay_lambda)
        ("mn_filled_one_0001", 1, 0.0, LAMBDA),
        ("mn_filled_steady01", 4, 30.0, LAMBDA),
        ("mn_filled_burst001", 50, 0.0, LAMBDA),
        ("mn_filled_nodecay1", 7, 90.0, 0.0),
        ("mn_filled_fast0001", 3, 400.0, 5.0),
    ]
    rows += [(f"mn_filled_many{i:05d}", 1 + i % 9, i % 40, LAMBDA) for i in range(4500)]
    with package_engine(empty_db_url) as engine:
        with engine.begin() as conn:
            insert_old_mnests(
                conn,
                [
                    {
                        "id": rid,
                        "dst": rid,
                        "uses": uses,
                        "first": T0 - timedelta(days=days),
                        "last": T0,
                        "lam": lam,
                    }
                    for rid, uses, days, lam in rows
                ],
            )
        mnestoma.upgrade(engine)
        with engine.connect() as conn:
            got = dict(conn.execute(select(Mnest.id, Mnest.decayed_uses)).all())
        for rid, uses, days, lam in rows:
            want = rules.spread_count(uses, lam, T0 - timedelta(days=days), T0)
            assert got[rid] == pytest.approx(want, rel=1e-9), rid
        assert got["mn_filled_one_0001"] == 1.0 and got["mn_filled_burst001"] == 50.0
        assert got["mn_filled_nodecay1"] == 7.0
        assert got["mn_filled_steady01"] == pytest.approx(sum(fade(10 * j) for j in range(4)))
        assert got["mn_filled_fast0001"] == pytest.approx(1.0, abs=1e-9)
        with mnestoma.Mnestoma(engine, clock=lambda: T0 + timedelta(days=1)) as m:
            row = m.record_passing("plan", "1", "mn_filled_steady01", "1")
            assert row.decayed_uses == pytest.approx(got["mn_filled_steady01"] * fade(1) + 1)
        mnestoma.downgrade(engine, "0009")  # the count goes, every row stays
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM v_mnestoma")).scalar_one() == len(rows)
        mnestoma.upgrade(engine)
