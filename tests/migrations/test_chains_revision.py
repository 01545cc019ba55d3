"""Revision 0014 (contract §13) on a populated store while writers of the previous release
keep writing: nothing of what was there moves, the chains start empty and count from the
first turn after it, and the downgrade keeps every other row."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from schema_kit import insert_old_mnests
from sqlalchemy import inspect, text

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance.migration import current_revision, head_revision
from mnestoma.testing.clock import MovableClock

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
WRITE_AS_0013 = (
    "UPDATE mnests SET uses = uses + 1, ts_last = :now, ts_weight = :now WHERE id = :id",
    "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_before, weight_after,"
    " state_before, state_after, recorder, occurrence) VALUES (:id, 'reinforced', :now, :turn,"
    " 0.3, 0.45, 'active', 'active', 'call', 1)",
)


def test_0014_on_a_populated_store_with_writers_then_chains_count_from_the_next_turn(
    empty_db_url: str,
) -> None:
    engine = make_engine(empty_db_url)
    stop = threading.Event()
    errors: list[BaseException] = []
    writes = [0]

    def write_as_the_previous_release() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                with engine.begin() as conn:
                    params = {"id": "mn_live0000000001", "now": datetime.now(UTC), "turn": f"w{n}"}
                    for sql in WRITE_AS_0013:
                        conn.execute(text(sql), params)
                writes[0] += 1
            except Exception as err:  # every write must go through
                errors.append(err)
                return

    try:
        mnestoma.upgrade(engine, "0013")
        with engine.begin() as conn:
            row = {"id": "mn_live0000000001", "dst": "search", "uses": 1, "first": T0, "last": T0}
            insert_old_mnests(conn, [row | {"lam": 0.018, "weight": 0.3}])
        writer = threading.Thread(target=write_as_the_previous_release)
        writer.start()
        try:
            while writes[0] < 3 and not errors:
                threading.Event().wait(0.01)
            mnestoma.upgrade(engine, lock_timeout=0.2)
            before = writes[0]
            while writes[0] < before + 3 and not errors:
                threading.Event().wait(0.01)
        finally:
            stop.set()
            writer.join(30)
        assert errors == [] and current_revision(engine) == head_revision()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mnest_chains")).scalar_one() == 0
            uses = conn.execute(text("SELECT uses FROM mnests")).scalar_one()
        assert uses == 1 + writes[0]  # no write lost across the revision
        with mnestoma.Mnestoma(engine, clock=MovableClock(T0)) as m:
            alone = m.predict_next("plan")  # the edge's counts are there, written before 0014
            assert alone.used.value == "edge" and alone.top.executor == "search"  # type: ignore[union-attr]
            for turn in ("t1", "t2"):
                m.record_turn(turn, [("plan", "1", "search", "1"), ("search", "1", "read", "1")])
            assert m.predict_next(["plan", "search"]).used.value == "chain"
        mnestoma.downgrade(engine, "0013")
        assert "mnest_chains" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mnests")).scalar_one() == 2
    finally:
        engine.dispose()
        forget_partitions()
