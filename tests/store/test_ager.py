"""apply_ager: decay, 0.20 demotion, merges, 0.05 pruning, 90-day archive candidates."""

from __future__ import annotations

import math

import pytest

from mnestoma import AgerReport, Mnestoma

LAMBDA = 0.018


def days_to(weight_from: float, weight_to: float) -> float:
    """Days for a weight to decay from one value to another at λ = 0.018."""
    return math.log(weight_from / weight_to) / LAMBDA


def test_the_ager_brings_weights_to_now(store: Mnestoma, clock) -> None:
    a = store.record_passing("a", "1", "b", "1")
    p = store.record_passing("a", "1", "w", dst_exists=False)
    clock.advance(days=10)
    report = store.apply_ager()
    assert report == AgerReport(decayed=2)
    for row_id in (a.id, p.id):
        row = store.get(row_id)
        assert row.weight == pytest.approx(0.30 * math.exp(-0.18), rel=1e-9)
        assert row.ts_weight == clock.now


def test_an_active_row_just_above_020_stays_active(store: Mnestoma, clock) -> None:
    a = store.record_passing("a", "1", "b", "1")
    clock.advance(days=days_to(0.30, 0.20) - 0.01)
    assert store.apply_ager().to_decaying == 0
    assert store.get(a.id).state == "active"


def test_an_active_row_below_020_becomes_decaying(store: Mnestoma, clock) -> None:
    a = store.record_passing("a", "1", "b", "1")
    clock.advance(days=days_to(0.30, 0.20) + 0.01)
    report = store.apply_ager()
    assert (report.to_decaying, report.merged, report.decayed) == (1, 0, 0)
    row = store.get(a.id)
    assert row.state == "decaying"
    assert row.weight == pytest.approx(0.1999, abs=1e-3)
    ev = store.events(mnest_id=a.id)[-1]
    assert (ev.kind, ev.state_before, ev.state_after) == ("transition", "active", "decaying")


def test_a_demoted_row_merges_into_an_existing_decaying_twin(store: Mnestoma, clock) -> None:
    old = store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")  # uses 2, weight 0.45
    store.transition_state(old.id, "decaying")
    first = clock.now
    clock.advance(days=1)
    new = store.record_passing("a", "1", "b", "1")  # fresh active row, uses 1
    clock.advance(days=days_to(0.30, 0.20) + 1)
    report = store.apply_ager()
    assert (report.merged, report.to_decaying) == (1, 1)
    assert store.get(new.id) is None
    merged = store.get(old.id)
    assert merged.state == "decaying"
    assert merged.uses == 3
    assert merged.ts_first == first
    assert merged.ts_last == new.ts_last
    old_eff = 0.45 * math.exp(-LAMBDA * (days_to(0.30, 0.20) + 2))
    new_eff = 0.30 * math.exp(-LAMBDA * (days_to(0.30, 0.20) + 1))
    assert merged.weight == pytest.approx(max(old_eff, new_eff), rel=1e-9)
    assert merged.ts_weight == clock.now
    kinds = {(e.mnest_id, e.kind, e.related_id) for e in store.events() if e.kind == "merged"}
    assert kinds == {(new.id, "merged", old.id), (old.id, "merged", new.id)}
    # the absorbed row's history stays queryable by its id
    assert [e.kind for e in store.events(mnest_id=new.id)] == ["created", "merged"]


def test_a_proto_below_005_is_pruned_and_its_history_kept(store: Mnestoma, clock) -> None:
    p = store.record_passing("a", "1", "wish", dst_exists=False)
    clock.advance(days=days_to(0.30, 0.05) - 0.01)
    assert store.apply_ager().protos_pruned == 0
    clock.advance(days=0.02)
    assert store.apply_ager().protos_pruned == 1
    assert store.get(p.id) is None
    history = store.events(mnest_id=p.id)
    assert [e.kind for e in history] == ["created", "pruned"]
    assert history[-1].state_before == "proto"


def test_old_weak_decaying_rows_are_counted_as_archive_candidates_not_deleted(
    store: Mnestoma, clock
) -> None:
    a = store.record_passing("a", "1", "b", "1")
    store.transition_state(a.id, "decaying")
    clock.advance(days=89.9)  # weight 0.3·e^(−1.62) ≈ 0.059: not yet below 0.05
    assert store.apply_ager().archive_candidates == 0
    clock.advance(days=10)  # 99.9 days: weight ≈ 0.050 → below 0.05 and ts_last ≥ 90 days old
    clock.advance(days=0.2)
    assert store.apply_ager().archive_candidates == 1
    assert store.get(a.id).state == "decaying"


def test_a_weak_decaying_row_younger_than_90_days_is_not_a_candidate(
    store: Mnestoma, clock
) -> None:
    a = store.record_passing("a", "1", "b", "1")
    store.transition_state(a.id, "decaying")
    for _ in range(200):
        store.record_passing("x", "1", "y", "1")  # unrelated traffic
    clock.advance(days=89)
    # force a very weak row: a decaying row with a high decay speed
    from sqlalchemy import update

    from mnestoma.engines import make_engine
    from mnestoma.schema.models import Mnest

    engine = make_engine(store.engine.url)
    with engine.begin() as conn:
        conn.execute(update(Mnest).where(Mnest.id == a.id).values(decay_lambda=1.0))
    engine.dispose()
    assert store.apply_ager().archive_candidates == 0
    clock.advance(days=1)
    assert store.apply_ager().archive_candidates == 1


def test_stored_weights_of_decaying_rows_are_not_rewritten(store: Mnestoma, clock) -> None:
    a = store.record_passing("a", "1", "b", "1")
    store.transition_state(a.id, "decaying")
    clock.advance(days=30)
    store.apply_ager()
    row = store.get(a.id)
    assert row.weight == 0.30
    assert row.effective_weight(clock.now) == pytest.approx(0.30 * math.exp(-0.54))


def test_running_the_ager_ten_times_at_the_same_instant_changes_nothing(
    store: Mnestoma, clock
) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "w", dst_exists=False)
    clock.advance(days=12)
    store.apply_ager()
    before = [r.as_dict() for r in store.edges()]
    for _ in range(10):
        assert store.apply_ager() == AgerReport(decayed=0)
    assert [r.as_dict() for r in store.edges()] == before


def test_the_ager_is_schedule_free(store: Mnestoma, clock, store_url: str) -> None:
    """Once at t2, or at t1 then t2: the same effective weights and states."""
    start = clock.now
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    store.record_passing("c", "1", "d", "1")
    store.record_passing("e", "1", "w", dst_exists=False)
    snapshot = {(r.src_executor, r.dst_executor): r for r in store.edges()}
    for step in (7.3, 14.1, 25.0, 3.3):
        clock.advance(days=step)
        store.apply_ager()
    t2 = clock.now
    stepwise = {(r.src_executor, r.dst_executor): r for r in store.edges()}
    # the same rows aged once, computed from the snapshot
    for key, row in snapshot.items():
        once = row.effective_weight(t2)
        if key in stepwise:
            assert stepwise[key].effective_weight(t2) == pytest.approx(once, rel=1e-9)
    assert t2 > start


def test_the_dry_run_reports_and_changes_nothing(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "w", dst_exists=False)
    clock.advance(days=200)
    before = [r.as_dict() for r in store.edges()]
    events_before = len(store.events())
    report = store.apply_ager(dry_run=True)
    assert (report.to_decaying, report.protos_pruned) == (1, 1)
    assert [r.as_dict() for r in store.edges()] == before
    assert len(store.events()) == events_before
    assert store.apply_ager() == report


def test_the_report_adds_up(store: Mnestoma, clock) -> None:
    for i in range(5):
        store.record_passing(f"s{i}", "1", "d", "1")
    for i in range(3):
        store.record_passing(f"p{i}", "1", "wish", dst_exists=False)
    store.record_passing("keep", "1", "d", "1")
    clock.advance(days=days_to(0.30, 0.05) + 1)
    store.record_passing("keep", "1", "d", "1")
    store.record_passing("keep", "1", "d", "1")  # ≈ 0.05 + 0.15 + 0.15: stays active
    report = store.apply_ager()
    assert report.to_decaying == 5
    assert report.protos_pruned == 3
    assert report.archive_candidates == 5  # below 0.05, last passing 101 days ago
    assert report.decayed == 0  # "keep" was reinforced at now
    states = [r.state for r in store.edges()]
    assert states.count("decaying") == 5 and states.count("active") == 1


def test_vanishing_weights_and_steep_decay_never_underflow(store: Mnestoma, clock) -> None:
    """PostgreSQL raises on float underflow where Python returns 0.0: both must just work."""
    from sqlalchemy import text

    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "c", "1")
    store.record_passing("a", "1", "w", dst_exists=False)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE mnests SET weight = 5e-324, decay_lambda = 50"))
    clock.advance(days=400)
    assert [w for _, w in store.suggest_next("a")] == [0.0]
    assert len(store.walk("a")) == 2
    report = store.apply_ager()
    assert (report.to_decaying, report.protos_pruned) == (2, 1)


def test_the_ager_runs_the_same_few_statements_whatever_the_row_count(
    store: Mnestoma, clock
) -> None:
    """Set-based: within a batch, the number of statements does not grow with the number of
    rows (both runs here fit in one batch; a run's statements grow with its batches only;
    on SQLite about ten of them set the run's connection up and back)."""
    from sqlalchemy import event

    def statements_for_one_run() -> int:
        seen: list[str] = []

        def count(conn, cursor, statement, params, context, executemany) -> None:  # type: ignore[no-untyped-def]
            # A run that is the first in its month makes the month's partition on PostgreSQL
            # (its lock timeout set, then the upkeep): once a month, not once a row.
            if "lock_timeout', " not in statement and "mnestoma_events_partitions" not in statement:
                seen.append(statement)

        event.listen(store.engine, "before_cursor_execute", count)
        try:
            store.apply_ager()
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
        return len(seen)

    store.record_turn("t", [(f"s{i}", "1", "d", "1") for i in range(5)])
    clock.advance(days=30)
    store.apply_ager()  # demotes them: from here on every run looks for merge pairs
    store.record_turn("v", [(f"r{i}", "1", "d", "1") for i in range(5)])
    clock.advance(days=30)
    few = statements_for_one_run()
    store.record_turn("u", [(f"x{i}", "1", "d", "1") for i in range(300)])
    store.record_turn("w", [(f"p{i}", "1", "wish", None, False) for i in range(100)])
    clock.advance(days=60)
    many = statements_for_one_run()
    assert many == few <= 30
