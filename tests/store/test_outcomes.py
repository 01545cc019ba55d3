"""Outcomes (contract §11): what followed a passing, counted beside ``uses``, never weighed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import package_engine
from invariants import check_invariants
from schema_kit import insert_old_mnests
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, text

import mnestoma
from mnestoma import InvalidInput, Outcome, Passing
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.maintenance.copying import copy_store
from mnestoma.schema.models import Event, Mnest, MnestomaView
from mnestoma.testing.clock import MovableClock

A = ("plan", "1", "search", "2")
B = ("search", "2", "read", "1")
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def counts(m: mnestoma.Mnestoma, key: tuple[str, str, str, str]) -> tuple[int, int, int]:
    row = m.find(*key)
    assert row is not None
    return row.uses, row.ok_count, row.error_count


def outcomes_of(m: mnestoma.Mnestoma, mnest_id: str) -> list[str | None]:
    return [e.outcome for e in m.events(mnest_id=mnest_id) if e.kind in ("created", "reinforced")]


def test_a_passing_counts_its_outcome_and_weighs_as_one_without_it(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    for outcome in ("ok", "error", None, "ok"):
        store.record_passing(*A, outcome=outcome)
        store.record_passing(*B)  # the same passings, no outcome given
        clock.advance(hours=5)
    with_outcomes, without = store.find(*A), store.find(*B)
    assert with_outcomes is not None and without is not None
    assert (with_outcomes.uses, with_outcomes.ok_count, with_outcomes.error_count) == (4, 2, 1)
    assert (without.uses, without.ok_count, without.error_count) == (4, 0, 0)
    assert with_outcomes.weight == without.weight  # §4 exact: 0.30 then +0.15, decayed
    assert with_outcomes.ts_weight == without.ts_weight


def test_a_new_edge_starts_with_the_outcome_of_its_first_passing(
    store: mnestoma.Mnestoma,
) -> None:
    row = store.record_passing(*A, outcome="error")
    assert (row.weight, row.uses, row.ok_count, row.error_count) == (0.30, 1, 0, 1)
    assert counts(store, A) == (1, 0, 1)


def test_the_returned_snapshot_carries_the_counts_it_wrote(store: mnestoma.Mnestoma) -> None:
    store.record_passing(*A, outcome="ok")
    row = store.record_passing(*A, outcome="error")
    assert (row.uses, row.ok_count, row.error_count) == (2, 1, 1)
    assert row.ok_count == store.get(row.id).ok_count  # type: ignore[union-attr]


def test_each_passings_event_records_its_outcome(store: mnestoma.Mnestoma) -> None:
    row = store.record_passing(*A, outcome="ok")
    store.record_passing(*A, outcome="error")
    store.record_passing(*A)
    assert outcomes_of(store, row.id) == ["ok", "error", None]


def test_an_outcome_member_is_stored_as_its_plain_value(store: mnestoma.Mnestoma) -> None:
    row = store.record_passing(*A, outcome=Outcome.ERROR)
    store.record_turn("t-enum", [Passing(*B, outcome=Outcome.OK)])
    assert outcomes_of(store, row.id) == ["error"]
    assert counts(store, B) == (1, 1, 0)


@pytest.mark.parametrize("bad", ["fail", "OK", "", 1, True, b"ok", ["ok"]])
def test_an_unknown_outcome_is_refused_and_nothing_is_written(
    store: mnestoma.Mnestoma, bad: Any
) -> None:
    with pytest.raises(InvalidInput, match="outcome"):
        store.record_passing(*A, outcome=bad)
    with pytest.raises(InvalidInput, match="outcome"):
        store.record_turn("t-bad", [Passing(*B), Passing(*A, outcome=bad)])
    assert store.edges() == [] and store.events() == []


def test_a_proto_passing_has_no_outcome(store: mnestoma.Mnestoma) -> None:
    with pytest.raises(InvalidInput, match="proto"):
        store.record_passing("plan", "1", "pdf.to_text", dst_exists=False, outcome="error")
    with pytest.raises(TypeError):  # no such argument: nothing ran to return or fail
        store.record_proto("plan", "1", "pdf.to_text", outcome="ok")  # type: ignore[call-arg]
    assert store.edges() == []


def test_a_turn_counts_the_outcome_of_each_occurrence_of_an_edge(
    store: mnestoma.Mnestoma,
) -> None:
    store.record_turn(
        "t-1",
        [
            Passing(*A, outcome="ok"),
            Passing(*B, outcome="ok"),
            Passing(*A, outcome="error"),  # the destination was called again and failed
            Passing(*A),  # a third passing whose outcome is unknown
        ],
    )
    assert counts(store, A) == (3, 1, 1)
    assert counts(store, B) == (1, 1, 0)
    assert [e.outcome for e in store.events(turn_id="t-1") if e.mnest_id == store.find(*A).id] == [
        "ok",
        "error",
        None,
    ]
    # tuples carry the outcome as their eighth item
    store.record_turn("t-2", [(*A, True, None, None, "ok"), (*B, True, None, None, None)])
    assert counts(store, A) == (4, 2, 1)
    assert counts(store, B) == (2, 1, 0)


def test_a_one_passing_turn_counts_its_outcome(store: mnestoma.Mnestoma) -> None:
    store.record_turn("t-one", [Passing(*A, outcome="error")])
    assert counts(store, A) == (1, 0, 1)


def test_a_retried_turn_counts_its_outcomes_once(store: mnestoma.Mnestoma) -> None:
    turn = [Passing(*A, outcome="ok"), Passing(*B, outcome="error")]
    for _ in range(3):
        store.record_turn("t-retried", turn)
    store.record_passing(*A, turn_id="t-retried", outcome="error")  # the same (turn, edge)
    assert counts(store, A) == (1, 1, 0)
    assert counts(store, B) == (1, 0, 1)


def test_the_agers_merge_sums_the_outcome_counts(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    first = store.record_passing(*A, outcome="error")
    clock.advance(days=25)  # 0.30 → 0.19: demoted
    assert store.apply_ager().to_decaying == 1
    store.record_passing(*A, outcome="ok")  # a fresh active row beside the decaying one
    store.record_passing(*A, outcome="ok")
    store.record_passing(*A)  # 0.30, 0.45, 0.60
    clock.advance(days=70)  # 0.60 → 0.17
    report = store.apply_ager()
    assert report.merged == 1
    (row,) = store.edges()
    assert row.id == first.id and row.state == "decaying"
    assert (row.uses, row.ok_count, row.error_count) == (4, 2, 1)
    check_invariants(store.engine.url)


def test_the_one_transaction_ager_merges_alike(store_url: str, clock: MovableClock) -> None:
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        m.record_passing(*A, outcome="ok")
        clock.advance(days=25)
        m.apply_ager()
        m.record_passing(*A, outcome="error")
        clock.advance(days=60)
        with m.unit_of_work() as uow:
            assert uow.mnests.apply_ager().merged == 1
            uow.commit()
        (row,) = m.edges()
        assert (row.uses, row.ok_count, row.error_count) == (2, 1, 1)


def _store_with_outcomes(url: str, *, side: str, shared: str) -> None:
    """A store where turn ``"shared"`` passed A with outcome ``shared``, and turns of its own
    passed A with ok (target) or error (source)."""
    clock = MovableClock(T0)
    mnestoma.upgrade(url)
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn("shared", [Passing(*A, outcome=shared)])
        for i in range(2):
            clock.advance(hours=1)
            outcome = "ok" if side == "target" else "error"
            m.record_turn(f"{side}-{i}", [Passing(*A, outcome=outcome)])


def test_copy_keeps_the_outcome_counts_and_the_events_outcomes(
    tmp_path: Path, empty_db_url: str
) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    _store_with_outcomes(source, side="source", shared="ok")
    copy_store(source, empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as m:
        assert counts(m, A) == (3, 1, 2)
        row = m.find(*A)
        assert row is not None
        assert sorted(map(str, outcomes_of(m, row.id))) == ["error", "error", "ok"]


def test_copy_append_sums_the_counts_and_counts_a_shared_turn_once(
    tmp_path: Path, empty_db_url: str
) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    _store_with_outcomes(source, side="source", shared="error")  # uses 3, ok 0, error 3
    _store_with_outcomes(empty_db_url, side="target", shared="ok")  # uses 3, ok 3, error 0
    report = copy_store(source, empty_db_url, append=True, clock=lambda: T0 + timedelta(days=1))
    assert report.merged == 1 and report.turns_counted_once == 1
    with mnestoma.Mnestoma(empty_db_url) as m:
        # turn "shared" counts once, with the target's outcome (ok); the source's two errors
        # of its own turns are added
        assert counts(m, A) == (5, 3, 2)
        check_invariants(empty_db_url)


def test_the_database_refuses_negative_counts_and_unknown_event_outcomes(
    store_url: str, store: mnestoma.Mnestoma
) -> None:
    row = store.record_passing(*A, outcome="ok")
    with package_engine(store_url) as engine:
        with pytest.raises(sa_exc.IntegrityError), engine.begin() as conn:
            conn.execute(text("UPDATE mnests SET error_count = -1 WHERE id = :id"), {"id": row.id})
        with pytest.raises(sa_exc.IntegrityError), engine.begin() as conn:
            conn.execute(text("UPDATE events SET outcome = 'maybe'"))
    assert counts(store, A) == (1, 1, 0)


def test_the_view_shows_the_outcome_counts(store_url: str, store: mnestoma.Mnestoma) -> None:
    store.record_passing(*A, outcome="error")
    with package_engine(store_url) as engine, engine.connect() as conn:
        row = conn.execute(select(MnestomaView.ok_count, MnestomaView.error_count)).one()
    assert tuple(row) == (0, 1)


def test_upgrading_a_store_of_0007_gives_its_rows_zero_counts_and_unknown_outcomes(
    empty_db_url: str,
) -> None:
    mnestoma.upgrade(empty_db_url, "0007")
    with package_engine(empty_db_url) as engine:
        with engine.begin() as conn:
            insert_old_mnests(
                conn,
                [
                    {"id": "mn_old_row_000001", "dst": "search", "dst_version": "2"}
                    | {"uses": 2, "first": T0, "last": T0, "lam": 0.018}
                ],
            )
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, recorder)"
                    " VALUES ('mn_old_row_000001', 'created', :t, 'call')"
                ),
                {"t": T0},
            )
        mnestoma.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(select(Mnest.ok_count, Mnest.error_count)).one() == (0, 0)
            assert conn.execute(select(Event.outcome)).scalar_one() is None
        with mnestoma.Mnestoma(engine, clock=lambda: T0 + timedelta(hours=1)) as m:
            assert counts(m, A) == (2, 0, 0)
            m.record_passing(*A, outcome="ok")
            assert counts(m, A) == (3, 1, 0)
        mnestoma.downgrade(engine, "0007")  # the counts go, every row stays
        with engine.connect() as conn:
            assert conn.execute(text("SELECT uses FROM mnests")).scalar_one() == 3
            assert conn.execute(text("SELECT count(*) FROM v_mnestoma")).scalar_one() == 1


def test_the_async_door_records_outcomes_as_the_sync_one(
    store_url: str, clock: MovableClock
) -> None:
    async def go() -> tuple[int, int, int]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.record_passing(*A, outcome="ok")
            await am.record_turn("t-async", [Passing(*A, outcome="error")])
            row = await am.find(*A)
            assert row is not None
            return row.uses, row.ok_count, row.error_count

    assert asyncio.run(go()) == (2, 1, 1)


def test_a_unit_of_work_records_outcomes(store_url: str, clock: MovableClock) -> None:
    with package_engine(store_url) as engine:
        sessions = mnestoma.make_session_factory(engine)
        with mnestoma.UnitOfWork(sessions, clock=clock) as uow:
            uow.mnests.record_passing(*A, outcome="error")
            uow.commit()
        with mnestoma.Mnestoma(engine, clock=clock) as m:
            assert counts(m, A) == (1, 0, 1)
