"""Revision 0013 on a populated store (contract §13): existing passings become occurrence 1,
a retry of an old turn's edge stays a no-op, a second occurrence now counts; the downgrade
keeps every event."""

from __future__ import annotations

from datetime import UTC, datetime

from schema_kit import insert_old_mnests
from sqlalchemy import text

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance.migration import current_revision, head_revision
from mnestoma.testing.clock import MovableClock

EDGE = ("plan", "1", "search", "1")
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
_OLD_EVENT = text(
    "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_after, state_after, recorder)"
    " VALUES ('mn_oldpassing00001', 'created', :ts, 'old-turn', 0.3, 'active', 'call')"
)


def test_0013_makes_old_passings_occurrence_1_and_counts_a_second_one(
    empty_db_url: str,
) -> None:
    engine = make_engine(empty_db_url)
    try:
        mnestoma.upgrade(engine, "0012")
        with engine.begin() as conn:
            row = {"id": "mn_oldpassing00001", "dst": "search", "uses": 1, "first": T0, "last": T0}
            insert_old_mnests(conn, [row | {"lam": 0.018, "weight": 0.3}])
            conn.execute(_OLD_EVENT, {"ts": T0.isoformat(" ")})
        mnestoma.upgrade(engine)  # through 0013 to the head
        assert current_revision(engine) == head_revision()
        with mnestoma.Mnestoma(engine, clock=MovableClock(T0)) as m:
            [old] = m.events(turn_id="old-turn")
            assert old.occurrence == 1
            assert m.record_passing(*EDGE, turn_id="old-turn").uses == 1  # a retry: no-op
            assert m.record_turn("old-turn", [EDGE]) and m.get("mn_oldpassing00001").uses == 1  # type: ignore[union-attr]
            assert m.record_passing(*EDGE, turn_id="old-turn", occurrence=2).uses == 2
            m.record_turn("old-turn", [EDGE, EDGE, EDGE])  # occurrence 3 only is new
            assert m.get("mn_oldpassing00001").uses == 3  # type: ignore[union-attr]
        mnestoma.downgrade(engine, "0012")
        with engine.connect() as conn:
            kept = conn.execute(
                text("SELECT turn_id FROM events WHERE mnest_id = 'mn_oldpassing00001' ORDER BY id")
            ).scalars()
            # every event kept; the later occurrences no longer claim the turn
            assert list(kept) == ["old-turn", None, None]
        mnestoma.upgrade(engine)
        with mnestoma.Mnestoma(engine, clock=MovableClock(T0)) as m:
            assert m.record_passing(*EDGE, turn_id="old-turn").uses == 3  # still a no-op
    finally:
        engine.dispose()
        forget_partitions()
