"""Every passing counts (contract §13): exactly once per (turn, edge, occurrence), on both
engines and through every door."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import package_engine
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

import mnestoma
from mnestoma import InvalidInput, Passing
from mnestoma.core.rules import INITIAL_WEIGHT, REINFORCEMENT
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.maintenance.copying import copy_store
from mnestoma.schema.models import Event, Mnest
from mnestoma.testing.clock import MovableClock

A = ("plan", "1", "search", "2")
B = ("search", "2", "read", "1")


def passings_of(m: Any, turn_id: str) -> list[tuple[str, int]]:
    """(kind, occurrence) of the turn's passing events, oldest first."""
    return [
        (e.kind, e.occurrence)
        for e in m.events(turn_id=turn_id)
        if e.kind in ("created", "reinforced")
    ]


def test_an_edge_repeated_in_a_turn_counts_each_occurrence(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    rows = store.record_turn("t", [A, B, A, A])
    row = store.find(*A)
    assert row is not None and row.uses == 3
    assert [r.id for r in rows] == [row.id, store.find(*B).id, row.id, row.id]  # type: ignore[union-attr]
    # created at 0.30, then reinforced twice at the same instant (no decay between)
    assert row.weight == pytest.approx(INITIAL_WEIGHT + 2 * REINFORCEMENT)
    assert row.decayed_uses == pytest.approx(3.0)
    assert [(e.kind, e.occurrence) for e in store.events(mnest_id=row.id)] == [
        ("created", 1),
        ("reinforced", 2),
        ("reinforced", 3),
    ]
    # on a row that exists: each occurrence reinforces it, the first one decays it first
    clock.advance(days=1)
    store.record_turn("u", [A, A])
    again = store.find(*A)
    assert again is not None and again.uses == 5
    first = (INITIAL_WEIGHT + 2 * REINFORCEMENT) * math.exp(-0.018) + REINFORCEMENT
    assert again.weight == pytest.approx(first + REINFORCEMENT)
    assert again.decayed_uses == pytest.approx(3.0 * math.exp(-0.018) + 2.0)
    assert passings_of(store, "u") == [("reinforced", 1), ("reinforced", 2)]


def test_a_retried_turn_with_repeats_adds_nothing(store: mnestoma.Mnestoma) -> None:
    turn = [A, B, A, Passing(*B, outcome="ok"), A]
    first = store.record_turn("t", turn)
    retry = store.record_turn("t", turn)
    assert [m.as_dict() for m in retry] == [m.as_dict() for m in first]
    assert (store.find(*A).uses, store.find(*B).uses) == (3, 2)  # type: ignore[union-attr]
    assert len(passings_of(store, "t")) == 5


def test_a_turn_continued_with_one_more_occurrence_counts_only_that_one(
    store: mnestoma.Mnestoma,
) -> None:
    store.record_turn("t", [A, A])
    store.record_turn("t", [A, A, A])  # the same turn, seen further: occurrence 3 is new
    assert store.find(*A).uses == 3  # type: ignore[union-attr]
    assert passings_of(store, "t") == [("created", 1), ("reinforced", 2), ("reinforced", 3)]


def test_record_passing_counts_each_occurrence_once(store: mnestoma.Mnestoma) -> None:
    first = store.record_passing(*A, turn_id="t")
    assert store.record_passing(*A, turn_id="t", occurrence=1).as_dict() == first.as_dict()
    second = store.record_passing(*A, turn_id="t", occurrence=2)
    assert second.uses == 2
    assert store.record_passing(*A, turn_id="t", occurrence=2).as_dict() == second.as_dict()
    retried = store.record_turn("t", [A, A])  # both already counted
    assert [r.as_dict() for r in retried] == [second.as_dict()] * 2
    assert passings_of(store, "t") == [("created", 1), ("reinforced", 2)]
    proto = store.record_proto("plan", "1", "ocr", turn_id="t", occurrence=2)
    assert proto.uses == 1 and passings_of(store, "t")[-1] == ("created", 2)
    assert store.record_proto("plan", "1", "ocr", turn_id="t", occurrence=2).uses == 1


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, "2", None, 2**31])
def test_a_bad_occurrence_is_invalid_input_and_writes_nothing(
    store: mnestoma.Mnestoma, bad: Any
) -> None:
    with pytest.raises(InvalidInput, match="occurrence"):
        store.record_passing(*A, turn_id="t", occurrence=bad)
    assert store.edges() == [] and store.events() == []


def test_an_occurrence_without_a_turn_is_invalid_input(store: mnestoma.Mnestoma) -> None:
    with pytest.raises(InvalidInput, match="turn_id"):
        store.record_passing(*A, occurrence=2)
    assert store.edges() == []
    assert store.record_passing(*A, occurrence=1).uses == 1  # the default, said aloud


def test_the_database_refuses_the_same_turn_edge_and_occurrence_twice(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        row = m.record_passing(*A, turn_id="t")
    base = {"mnest_id": row.id, "kind": "reinforced", "ts": row.ts_last, "turn_id": "t"}
    with package_engine(store_url) as engine:
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(Event), [base | {"occurrence": 1}])
        with engine.begin() as conn:  # another occurrence is another passing
            conn.execute(insert(Event), [base | {"occurrence": 2}])
            n = conn.execute(select(func.count()).select_from(Event)).scalar_one()
        assert n == 2


def test_the_async_door_numbers_occurrences_and_ignores_retries(
    store_url: str, clock: MovableClock
) -> None:
    async def main() -> tuple[int, int, int]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            rows = await am.record_turn("t", [A, A, B])
            await am.record_turn("t", [A, A, B])  # a retry
            once = await am.record_passing(*A, turn_id="t", occurrence=2)
            third = await am.record_passing(*A, turn_id="t", occurrence=3)
            with pytest.raises(InvalidInput):
                await am.record_passing(*A, turn_id="t", occurrence=0)
            return rows[0].uses, once.uses, third.uses

    assert asyncio.run(main()) == (2, 2, 3)


def test_units_of_work_take_the_occurrence(store_url: str) -> None:
    with package_engine(store_url) as engine:
        with mnestoma.UnitOfWork(mnestoma.make_session_factory(engine)) as uow:
            uow.mnests.record_passing(*A, turn_id="t")
            uow.mnests.record_passing(*A, turn_id="t", occurrence=2)
            uow.mnests.record_passing(*A, turn_id="t", occurrence=2)
            uow.commit()
        with engine.connect() as conn:
            assert conn.execute(select(Mnest.uses)).scalar_one() == 2


def _store_with_repeats(url: str, turn_id: str, clock: MovableClock) -> None:
    mnestoma.upgrade(url)
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn(turn_id, [A, A, B])


def test_copy_keeps_occurrences(store_url: str, tmp_path: Path, clock: MovableClock) -> None:
    _store_with_repeats(store_url, "t", clock)
    target = f"sqlite:///{tmp_path / 'copy.sqlite'}"
    copy_store(store_url, target, clock=clock)
    with mnestoma.Mnestoma(target, clock=clock) as m:
        assert passings_of(m, "t") == [("created", 1), ("reinforced", 2), ("created", 1)]
        m.record_turn("t", [A, A, B])  # a retry on the copy: still a no-op
        assert m.find(*A).uses == 2  # type: ignore[union-attr]
        m.record_turn("t", [A, A, A])
        assert m.find(*A).uses == 3  # type: ignore[union-attr]


def test_copy_append_counts_a_shared_occurrence_once_and_a_new_one_again(
    store_url: str, tmp_path: Path, clock: MovableClock
) -> None:
    """The same turn recorded in both stores: occurrences both counted count once, an
    occurrence only the source counted is added."""
    target = f"sqlite:///{tmp_path / 'target.sqlite'}"
    mnestoma.upgrade(target)
    with mnestoma.Mnestoma(target, clock=clock) as m:
        m.record_turn("shared", [A])
    _store_with_repeats(store_url, "shared", clock)  # A twice, B once
    copy_store(store_url, target, append=True, clock=clock)
    with mnestoma.Mnestoma(target, clock=clock) as m:
        row = m.find(*A)
        assert row is not None and row.uses == 2  # occurrence 1 once, occurrence 2 added
        on_row = [(e.kind, e.occurrence) for e in m.events(mnest_id=row.id)]
        assert [p for p in on_row if p[0] in ("created", "reinforced")] == [
            ("created", 1),
            ("reinforced", 2),
        ]
        m.record_turn("shared", [A, A])  # both occurrences counted on the merged row
        assert m.find(*A).uses == 2  # type: ignore[union-attr]
