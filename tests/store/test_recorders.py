"""Who recorded each event (``events.recorder``) and the ager's own log (``ager_runs``)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

import mnestoma
from mnestoma.core.types import parse_sqlite_timestamp
from mnestoma.testing.clock import MovableClock


def test_api_writes_are_recorded_as_call(store: mnestoma.Mnestoma) -> None:
    edge = store.record_passing("a", "1", "b", "1")
    store.transition_state(edge.id, "decaying")
    assert [e.recorder for e in store.events()] == ["call", "call"]


def test_a_passing_or_turn_names_its_recorder(store: mnestoma.Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1", recorder="tracer")
    store.record_turn("t-1", [("a", "1", "b", "1"), ("b", "1", "c", "1")], recorder="otel")
    assert [(e.kind, e.recorder) for e in store.events()] == [
        ("created", "tracer"),
        ("reinforced", "otel"),
        ("created", "otel"),
    ]


def test_a_facade_has_a_default_recorder(store_url: str, clock: MovableClock) -> None:
    with mnestoma.Mnestoma(store_url, clock=clock, recorder="cli") as store:
        store.record_passing("a", "1", "b", "1")
        assert store.events()[0].recorder == "cli"


@pytest.mark.parametrize("bad", ["", "robot", "CALL ", 3])
def test_an_unknown_recorder_is_invalid_input(store: mnestoma.Mnestoma, bad: object) -> None:
    with pytest.raises(mnestoma.InvalidInput, match="recorder"):
        store.record_passing("a", "1", "b", "1", recorder=bad)  # type: ignore[arg-type]
    assert store.edges() == []


def test_the_ager_records_its_events_as_ager_and_logs_each_committed_run(
    store: mnestoma.Mnestoma, clock: MovableClock, store_url: str
) -> None:
    store.record_passing("a", "1", "b", "1")
    clock.advance(days=60)  # 0.30 × e^(−0.018×60) ≈ 0.10 < 0.20: demoted
    dry = store.apply_ager(dry_run=True)
    assert _ager_runs(store_url) == []  # a dry run is rolled back, its row with it
    report = store.apply_ager()
    assert dry == report
    assert [(e.kind, e.recorder) for e in store.events()][-1] == ("transition", "ager")
    [(ts, duration, decayed, to_decaying)] = _ager_runs(store_url)
    assert ts == clock()
    assert duration >= 0
    assert (decayed, to_decaying) == (report.decayed, report.to_decaying) == (0, 1)
    clock.advance(days=1)
    store.apply_ager()
    assert len(_ager_runs(store_url)) == 2


def _ager_runs(url: str) -> list[tuple[object, ...]]:
    with mnestoma.Mnestoma(url) as store, store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT ts, duration_s, decayed, to_decaying FROM ager_runs ORDER BY id")
        ).all()
    out = []
    for ts, *rest in rows:
        if isinstance(ts, str):  # SQLite: the package's text format, UTC
            ts = parse_sqlite_timestamp(ts)
        out.append((ts, *rest))
    return out


def test_events_written_before_revision_0003_read_as_call(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0002")
    engine = create_engine(empty_db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts) "
                "VALUES ('mn_old000000000001', 'created', '2026-01-01 00:00:00+00:00')"
            )
        )
    engine.dispose()
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as store:
        [event] = store.events()
        assert event.recorder == "call"
        store.record_passing("a", "1", "b", "1", recorder="tracer")
        assert [e.recorder for e in store.events()] == ["call", "tracer"]
