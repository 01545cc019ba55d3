"""Events partitioned by month on PostgreSQL (contract §12): the revision under writers, the
partitions made ahead whatever the clock says, exactly once per (turn, edge) across
partitions, retention across partitions, and the way back down. SQLite keeps one table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from conftest import package_engine
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import IntegrityError
from test_live_upgrade import Writers

import mnestoma
from mnestoma import Mnestoma, Passing
from mnestoma.core.types import INSTANTS_END
from mnestoma.engines import make_engine
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance.migration import (
    alembic_config,
    current_revision,
    head_revision,
    is_store_name,
)
from mnestoma.testing.clock import MovableClock


def _before_0011() -> str:
    """The revision 0011 follows."""
    down = ScriptDirectory.from_config(alembic_config()).get_revision("0011").down_revision
    assert isinstance(down, str)
    return down


BEFORE = _before_0011()
PASSING_EVENT = (
    "INSERT INTO events (mnest_id, kind, ts, turn_id) VALUES (:m, 'reinforced', :ts, :t)"
)


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def _partitions(engine: Engine) -> dict[str, str]:
    """Each partition of events and its bound, as PostgreSQL prints it."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'events'::regclass"
            )
        ).all()
    return {name: bound for name, bound in rows}


def _where(engine: Engine) -> list[tuple[str, str]]:
    """(partition of events, mnest_id) of every event, by id: the month (or the partition of
    everything before, or the default) whose leaf holds it."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT (SELECT a.relid::regclass::text FROM pg_partition_ancestors(e.tableoid) a"
                " JOIN pg_inherits i ON i.inhrelid = a.relid"
                " WHERE i.inhparent = 'events'::regclass), e.mnest_id"
                " FROM events e ORDER BY e.id"
            )
        )
        return [(p, m) for p, m in rows]


def settle(engine: Engine) -> None:
    """The catalogue's counts of the partitions' rows made exact (ANALYZE reads every row
    of a small table): a prune counts the months it drops from them."""
    with engine.connect() as conn:
        conn.execute(text("ANALYZE events"))
        conn.commit()


def test_sqlite_keeps_one_table_and_its_unique_index(engine_name: str, engine: Engine) -> None:
    insp = inspect(engine)
    names = set(insp.get_table_names())
    indexes = {i["name"] for i in insp.get_indexes("events")}
    if engine_name == "sqlite":
        assert "event_turn_edges" not in names and "ux_events_turn_edge" in indexes
        assert not any(n.startswith("events_") for n in names)
    else:
        assert "event_turn_edges" in names and "ux_events_turn_edge" not in indexes
        assert "events_default" in _partitions(engine)


def test_a_turn_counts_once_per_edge_across_a_month_boundary(
    store_url: str, engine: Engine
) -> None:
    """The retry of a turn in the next month (the next partition) adds nothing, and a raw
    duplicate written there is refused by the database, on both engines."""
    clock = MovableClock(datetime(2031, 1, 31, 23, 59, 59, tzinfo=UTC))
    with Mnestoma(store_url, clock=clock) as m:
        first = m.record_turn("t-edge", [Passing("a", "1", "b", "1")])[0]
        clock.set(datetime(2031, 2, 1, 0, 0, 1, tzinfo=UTC))
        again = m.record_turn("t-edge", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
        assert again[0].id == first.id and again[0].uses == 1
        assert m.find("b", "1", "c", "1").uses == 1  # type: ignore[union-attr]
    later = datetime(2031, 3, 2, tzinfo=UTC)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(text(PASSING_EVENT), {"m": first.id, "ts": later, "t": "t-edge"})
    with engine.begin() as conn:  # another turn, or no turn, is another matter
        conn.execute(text(PASSING_EVENT), {"m": first.id, "ts": later, "t": "t-other"})
        conn.execute(text(PASSING_EVENT), {"m": first.id, "ts": later, "t": None})


def test_partitions_are_made_ahead_across_a_year_boundary(pg_store_url: str) -> None:
    """Writes whose clock walks from November into the next year find their month's
    partition made before them: never the default one. (The first write's clock jumped
    years past the partitions the store has: its row waits in the default partition until
    its commit has made its month, three ahead with it.)"""
    engine = make_engine(pg_store_url)
    clock = MovableClock(datetime(2033, 11, 20, tzinfo=UTC))
    try:
        with Mnestoma(pg_store_url, clock=clock) as m:
            m.record_passing("a", "1", "b", "1")
            made = _partitions(engine)
            for month in ("203311", "203312", "203401", "203402"):
                assert f"events_{month}" in made
            assert "events_203403" not in made
            for day in (30, 41, 60, 72, 100):  # 2033-12-20 ... 2034-02-28
                clock.set(datetime(2033, 11, 20, tzinfo=UTC) + timedelta(days=day))
                assert f"events_{clock():%Y%m}" in _partitions(engine)  # before the write
                m.record_passing("a", "1", "b", "1")
                assert [p for p, _ in _where(engine)][-1] == f"events_{clock():%Y%m}"
            made = _partitions(engine)
        assert "events_203405" in made  # made when 2034-02-28 came within a week of March
        where = [p for p, _ in _where(engine)]
        months = ("203311", "203312", "203312", "203401", "203401", "203402")
        assert where == [f"events_{m}" for m in months]
    finally:
        engine.dispose()
        forget_partitions()


def test_an_async_unit_of_work_makes_the_month_its_commit_reached(pg_store_url: str) -> None:
    """An async unit of work's clock reaches a month not made: its row waits in the default
    partition only until its commit, which makes the month (and moves the row there),
    as the sync unit of work does."""
    import asyncio

    from mnestoma.doors.asynchronous import (
        AsyncUnitOfWork,
        make_async_engine,
        make_async_session_factory,
    )

    engine = make_engine(pg_store_url)
    clock = MovableClock(datetime(2046, 3, 9, tzinfo=UTC))

    async def write() -> None:
        async_engine = make_async_engine(pg_store_url)
        try:
            factory = make_async_session_factory(async_engine)
            async with AsyncUnitOfWork(factory, clock=clock) as uow:
                await uow.mnests.record_passing("a", "1", "b", "1", turn_id="t-async")
                assert "events_204603" not in _partitions(engine)  # not before the commit
                await uow.commit()
        finally:
            await async_engine.dispose()

    try:
        asyncio.run(write())
        assert "events_204603" in _partitions(engine)
        assert [p for p, _ in _where(engine)] == ["events_204603"]
    finally:
        engine.dispose()
        forget_partitions()


def test_a_write_never_waits_for_a_partition_nor_fails_for_one_missing(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader holds events while a write's clock reaches a month not made: making it
    (an exclusive lock on events, in a transaction of its own after the write's commit)
    gives up after its short lock timeout, the write is done with its row in the default
    partition, and the next write once the reader is gone makes the month and moves it."""
    from mnestoma.engines import partitions

    monkeypatch.setattr(partitions, "PARTITION_UPKEEP_RETRY_S", 0.0)
    engine = make_engine(pg_store_url)
    clock = MovableClock(datetime(2045, 7, 3, tzinfo=UTC))
    try:
        with Mnestoma(pg_store_url, clock=clock) as m:
            reader = engine.connect()
            reader.execute(text("SELECT count(*) FROM events"))  # holds ACCESS SHARE
            started = time.monotonic()
            m.record_turn("t-busy", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
            took = time.monotonic() - started
            assert "events_204507" not in _partitions(engine)
            reader.rollback()
            reader.close()
            assert [p for p, _ in _where(engine)] == ["events_default"] * 2
            clock.advance(days=1)
            m.record_passing("a", "1", "b", "1", turn_id="t-later")
        assert [p for p, _ in _where(engine)] == ["events_204507"] * 3
        assert took < 5.0
        with pytest.raises(IntegrityError), engine.begin() as conn:  # the turn's rule moved too
            conn.execute(
                text(PASSING_EVENT),
                {"m": _where(engine)[0][1], "ts": clock(), "t": "t-busy"},
            )
    finally:
        engine.dispose()
        forget_partitions()


def test_the_stores_last_month_has_its_partition_and_none_past_it(pg_store_url: str) -> None:
    """A clock at the last instant the store holds (9999-12-30, the month's partition
    ending in year 10000): its write lands in that month's partition, no partition of year
    10000 is made, and retention still reads every partition's bounds."""
    engine = make_engine(pg_store_url)
    last = INSTANTS_END - timedelta(microseconds=1)
    try:
        for _ in range(2):  # a second facade (engine) finds it made, and says so
            with Mnestoma(pg_store_url, clock=lambda: last) as m:
                m.record_passing("a", "1", "b", "1")
        made = _partitions(engine)
        assert made["events_999912"].endswith("TO ('10000-01-01 00:00:00+00')")
        assert not any(len(n) > len("events_999912") and n[7].isdigit() for n in made)
        assert [p for p, _ in _where(engine)] == ["events_999912"] * 2
        with Mnestoma(pg_store_url, clock=MovableClock()) as m:
            assert m.prune_events(datetime(2030, 1, 1, tzinfo=UTC)) == 0
            assert len(m.events()) == 2
    finally:
        engine.dispose()
        forget_partitions()


def test_the_revision_partitions_a_store_with_an_event_in_its_last_month(
    pg_empty_db_url: str,
) -> None:
    """An event at 9999-12-30 puts the revision's bound at 10000-01-01: the partition of
    everything before and those made ahead are named with a five-digit year, are the
    store's names, and writes and retention go on."""
    engine = make_engine(pg_empty_db_url)
    far = INSTANTS_END - timedelta(days=1)
    try:
        mnestoma.upgrade(engine, BEFORE)
        with engine.begin() as conn:
            conn.execute(text(PASSING_EVENT), {"m": "mn_far", "ts": far, "t": "t-far"})
        mnestoma.upgrade(engine)
        made = _partitions(engine)
        assert "events_to_1000001" in made and "events_1000001" in made
        assert all(is_store_name(n) for n in made)
        with Mnestoma(engine, clock=lambda: far) as m:
            m.record_passing("a", "1", "b", "1")
        with Mnestoma(engine, clock=MovableClock()) as m:
            assert m.prune_events(datetime(2030, 1, 1, tzinfo=UTC)) == 0
        assert [p for p, _ in _where(engine)] == ["events_to_1000001"] * 2
    finally:
        engine.dispose()
        forget_partitions()


def test_a_row_past_the_partitions_lands_in_the_default_and_moves_out_with_its_month(
    pg_store_url: str,
) -> None:
    """An insert never fails for a missing partition: a raw one years ahead goes to the
    default partition, and moves into its month's partition (with its turn's rule) when a
    write at that time makes it."""
    engine = make_engine(pg_store_url)
    far = datetime(2041, 5, 5, tzinfo=UTC)
    try:
        with engine.begin() as conn:
            conn.execute(text(PASSING_EVENT), {"m": "mn_far", "ts": far, "t": "t-far"})
        assert _where(engine) == [("events_default", "mn_far")]
        with Mnestoma(pg_store_url, clock=MovableClock(far + timedelta(days=1))) as m:
            m.record_passing("a", "1", "b", "1")
        assert ("events_204105", "mn_far") in _where(engine)
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(text(PASSING_EVENT), {"m": "mn_far", "ts": far, "t": "t-far"})
    finally:
        engine.dispose()
        forget_partitions()


BULK_EVENTS = (
    "INSERT INTO events (mnest_id, kind, ts)"
    " SELECT 'mn_bulk', 'reinforced', CAST(:ts AS timestamptz) FROM generate_series(1, :n)"
)


DEFAULT_SIZE = text("SELECT pg_relation_size('events_default')")


def test_no_month_is_made_while_the_default_partition_is_too_large_to_read_under_a_lock(
    pg_store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Making a month reads the default partition whole under an exclusive lock on events:
    a writer's upkeep makes one (moving its rows) while the default partition holds at most
    PARTITION_DEFAULT_MAX_MIB (4 MiB), and none above: the months' writes go to the
    default too, the months after are not made either, it is said once, and not asked for
    again before PARTITION_WAITING_RECHECK_S (60 s)."""
    from sqlalchemy import event

    from mnestoma.core.rules import PARTITION_DEFAULT_MAX_MIB, PARTITION_WAITING_RECHECK_S

    assert (PARTITION_DEFAULT_MAX_MIB, PARTITION_WAITING_RECHECK_S) == (4, 60.0)
    # Months no other test of the module makes (the months made stay with the database).
    moved, left = datetime(2061, 5, 5, tzinfo=UTC), datetime(2063, 5, 5, tzinfo=UTC)
    engine = make_engine(pg_store_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(BULK_EVENTS), {"ts": moved, "n": 1_000})
        with engine.connect() as conn:
            assert (
                0 < conn.execute(DEFAULT_SIZE).scalar_one() <= PARTITION_DEFAULT_MAX_MIB * 1024**2
            )
        with Mnestoma(pg_store_url, clock=MovableClock(moved)) as m:
            m.record_passing("a", "1", "b", "1")
        assert "events_206105" in _partitions(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM events_default")).scalar_one() == 0
        with engine.begin() as conn:
            conn.execute(text(BULK_EVENTS), {"ts": left, "n": 60_000})
        with engine.connect() as conn:
            assert conn.execute(DEFAULT_SIZE).scalar_one() > PARTITION_DEFAULT_MAX_MIB * 1024**2
        clock = MovableClock(left)
        with Mnestoma(pg_store_url, clock=clock) as m:
            asked: list[datetime] = []

            def note(_conn: object, _cur: object, statement: str, params: Any, *_: object) -> None:
                if "ensured" in statement and params["at"].year > 2062:
                    asked.append(params["at"])

            event.listen(m.engine, "before_cursor_execute", note)
            with caplog.at_level("WARNING", logger="mnestoma.partitions"):
                m.record_passing("a", "1", "b", "1")
                clock.advance(seconds=1)
                m.record_passing("a", "1", "b", "1")
                clock.set(datetime(2065, 1, 9, tzinfo=UTC))  # a month with no row anywhere
                m.record_passing("a", "1", "b", "1")
            assert [f"{a:%Y-%m}" for a in asked] == ["2063-05", "2065-01"]
            said = [r.getMessage() for r in caplog.records if "not made" in r.getMessage()]
            assert len(said) == 2 and "2063-05" in said[0] and "split-history" in said[0]
        assert not any(n.startswith(("events_2063", "events_2065")) for n in _partitions(engine))
        with engine.connect() as conn:
            waiting = "SELECT count(*) FROM events_default WHERE ts >= '2063-05-01'"
            assert conn.execute(text(waiting)).scalar_one() == 60_000 + 3
    finally:
        engine.dispose()
        forget_partitions()


def test_pruning_across_partitions_keeps_live_mnests_created_events_and_frees_turns(
    engine_name: str, store_url: str, engine: Engine
) -> None:
    """Events spread over several months: a prune removes those before the cutoff in every
    partition but the created event of each row still stored; a turn whose event went
    counts again."""
    clock = MovableClock(datetime(2032, 1, 10, tzinfo=UTC))
    with Mnestoma(store_url, clock=clock) as m:
        kept = m.record_turn("t-jan", [Passing("a", "1", "b", "1")])[0]
        for month in (2, 3, 4):
            clock.set(datetime(2032, month, 10, tzinfo=UTC))
            m.record_turn(f"t-{month}", [Passing("a", "1", "b", "1")])
        if engine_name == "postgresql":
            settle(engine)  # the months dropped whole are counted from the catalogue
        assert m.prune_events(datetime(2032, 3, 15, tzinfo=UTC)) == 2
        left = [(e.kind, e.turn_id) for e in m.events(mnest_id=kept.id)]
        assert sorted(left) == [("created", "t-jan"), ("reinforced", "t-4")]
        clock.set(datetime(2032, 4, 20, tzinfo=UTC))
        again = m.record_turn("t-2", [Passing("a", "1", "b", "1")])[0]
        assert again.uses == 5  # t-2's event is gone: the replayed turn counts again
        same = m.record_turn("t-jan", [Passing("a", "1", "b", "1")])[0]
        assert same.uses == 5  # t-jan's created event is kept: still counted
    if engine_name == "postgresql":
        with engine.connect() as conn:
            turns = conn.execute(text("SELECT turn_id FROM event_turn_edges ORDER BY turn_id"))
            assert [t for (t,) in turns] == ["t-2", "t-4", "t-jan"]


def test_the_revision_partitions_events_while_writers_write(pg_empty_db_url: str) -> None:
    """From the revision before 0011 to head on a store with events, while writers of the
    previous release insert passings: no writer fails, every event is kept in the
    partitioned table, every passing with a turn has its row in event_turn_edges, and the
    old rule's index is gone."""
    with package_engine(pg_empty_db_url) as engine:
        mnestoma.upgrade(engine, BEFORE)
        now = datetime.now(UTC)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts, turn_id)"
                    " SELECT 'mn_' || g, 'reinforced', :now - g * interval '1 hour', 't' || g"
                    " FROM generate_series(1, 3000) g"
                ),
                {"now": now},
            )

        def previous_release_write(i: int) -> None:
            with engine.begin() as conn:
                conn.execute(
                    text(PASSING_EVENT),
                    {"m": f"mn_w{i}", "ts": datetime.now(UTC), "t": f"w{i}-{time.monotonic_ns()}"},
                )

        with Writers(previous_release_write, 4) as writers:
            mnestoma.upgrade(engine, lock_timeout=0.2)
        assert current_revision(engine) == head_revision()
        assert writers.errors == [] and writers.writes > 0
        with engine.connect() as conn:
            total = conn.execute(text("SELECT count(*) FROM events")).scalar_one()
            turns = conn.execute(text("SELECT count(*) FROM event_turn_edges")).scalar_one()
            kind = conn.execute(
                text("SELECT relkind FROM pg_class WHERE oid = 'events'::regclass")
            ).scalar_one()
        assert total == 3000 + writers.writes == turns
        assert kind == "p"
        made = _partitions(engine)
        assert any(n.startswith("events_to_") for n in made) and "events_default" in made
        assert "ux_events_turn_edge" not in {
            i["name"] for i in inspect(engine).get_indexes("events")
        }


def test_the_revisions_backfill_reads_events_in_batches_of_ids_and_misses_none(
    pg_empty_db_url: str,
) -> None:
    """Passings with a turn at the first, the last and either side of each batch's bound
    of ids (and a batch with none): after 0011 each has its row in event_turn_edges, and
    a passing without a turn or an event that is not a passing has none."""
    span = ScriptDirectory.from_config(alembic_config()).get_revision("0011").module.BACKFILL_SPAN
    with package_engine(pg_empty_db_url) as engine:
        mnestoma.upgrade(engine, BEFORE)
        ids = sorted({1, span - 1, span, span + 1, 2 * span - 1, 2 * span, 4 * span + 7})
        now = datetime.now(UTC)
        with engine.begin() as conn:
            for i in ids:
                conn.execute(
                    text(
                        "INSERT INTO events (id, mnest_id, kind, ts, turn_id)"
                        " VALUES (:id, :m, 'reinforced', :ts, :t)"
                    ),
                    {"id": i, "m": f"mn_{i}", "ts": now, "t": f"t{i}"},
                )
            conn.execute(
                text(
                    "INSERT INTO events (id, mnest_id, kind, ts, turn_id) VALUES"
                    " (:a, 'mn_x', 'reinforced', :ts, NULL), (:b, 'mn_y', 'transition', :ts, 'ty')"
                ),
                {"a": span + 2, "b": span + 3, "ts": now},
            )
            conn.execute(text("SELECT setval('events_id_seq', :n)"), {"n": 5 * span})
        mnestoma.upgrade(engine)
        with engine.connect() as conn:
            found = conn.execute(text("SELECT turn_id, mnest_id FROM event_turn_edges")).all()
        assert sorted(found) == sorted((f"t{i}", f"mn_{i}") for i in ids)


def test_downgrade_below_0011_gives_one_table_back_with_every_event(pg_empty_db_url: str) -> None:
    engine = make_engine(pg_empty_db_url)
    try:
        mnestoma.upgrade(engine)
        with Mnestoma(engine, clock=MovableClock(datetime(2031, 6, 1, tzinfo=UTC))) as m:
            m.record_turn("t-1", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
        mnestoma.downgrade(engine, BEFORE)
        insp = inspect(engine)
        assert "event_turn_edges" not in insp.get_table_names()
        assert "ux_events_turn_edge" in {i["name"] for i in insp.get_indexes("events")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 2
        with pytest.raises(IntegrityError), engine.begin() as conn:
            row = {"mnest_id": "mn_x", "kind": "created", "ts": datetime.now(UTC), "turn_id": "t"}
            columns = "mnest_id, kind, ts, turn_id"  # the table as 0010 left it
            values = ":mnest_id, :kind, :ts, :turn_id"
            conn.execute(text(f"INSERT INTO events ({columns}) VALUES ({values})"), [row, row])
        mnestoma.upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
        forget_partitions()


def test_retention_drops_whole_months_and_gives_their_space_back(pg_store_url: str) -> None:
    """Months wholly before the cutoff are dropped (their tables gone, their space with
    them) after the created events of the rows still stored moved to the partition of
    everything before; the month holding the cutoff is pruned in batches."""
    engine = make_engine(pg_store_url)
    clock = MovableClock(datetime(2035, 1, 5, tzinfo=UTC))

    def size() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('events')"
                    )
                ).scalar_one()
            )

    try:
        baseline = size()  # the partitions other tests left in the shared store
        with Mnestoma(pg_store_url, clock=clock) as m:
            live = m.record_passing("a", "1", "b", "1")
            gone = m.record_passing("x", "1", "y", "1")
            with engine.begin() as conn:
                conn.execute(text("DELETE FROM mnests WHERE id = :id"), {"id": gone.id})
                conn.execute(
                    text(
                        "INSERT INTO events (mnest_id, kind, ts, turn_id)"
                        " SELECT :m, 'reinforced', :t0 + g * interval '1 minute', 't' || g"
                        " FROM generate_series(1, 20000) g"
                    ),
                    {"m": live.id, "t0": datetime(2035, 1, 6, tzinfo=UTC)},
                )
            before_prune = size()
            clock.set(datetime(2035, 3, 10, tzinfo=UTC))
            m.record_passing("a", "1", "b", "1")  # a March event, kept
            settle(engine)  # January's events are counted from the catalogue
            assert m.prune_events(datetime(2035, 2, 15, tzinfo=UTC)) == 20001
            assert sorted(e.kind for e in m.events(mnest_id=live.id)) == ["created", "reinforced"]
            assert m.events(mnest_id=gone.id) == []
        made = _partitions(engine)
        assert "events_203501" not in made and "events_to_203502" in made
        assert size() - baseline < (before_prune - baseline) / 4
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM event_turn_edges")).scalar_one() == 0
            left = conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relname LIKE 'events\\_%dropped'")
            ).scalar_one()
        assert left == 0
    finally:
        engine.dispose()
        forget_partitions()


def _layout(url: str) -> dict[str, object]:
    """What PostgreSQL holds beside the models' tables: partitions, triggers, functions, the
    side table's columns and keys, every index of events and its partitions' parent."""
    with package_engine(url) as engine, engine.connect() as conn:
        return {
            "partitions": _partitions(engine),
            "triggers": sorted(
                conn.execute(
                    text(
                        "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
                        " WHERE tgrelid = 'events'::regclass AND NOT tgisinternal"
                    )
                ).scalars()
            ),
            "functions": sorted(
                conn.execute(
                    text(
                        "SELECT pg_get_functiondef(oid) FROM pg_proc"
                        " WHERE proname LIKE 'mnestoma\\_%'"
                    )
                ).scalars()
            ),
            "indexes": sorted(
                conn.execute(
                    text(
                        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i"
                        " WHERE i.indrelid = 'event_turn_edges'::regclass"
                        " OR i.indrelid IN (SELECT relid FROM pg_partition_tree('events'))"
                    )
                ).scalars()
            ),
            "tree": sorted(
                conn.execute(
                    text(
                        "SELECT t.relid::text, coalesce(t.parentrelid::text, ''), c.relkind::text,"
                        " coalesce(pg_get_expr(c.relpartbound, c.oid), ''),"
                        " coalesce(pg_get_partkeydef(c.oid), '')"
                        " FROM pg_partition_tree('events') t JOIN pg_class c ON c.oid = t.relid"
                    )
                )
            ),
            "constraints": sorted(
                conn.execute(
                    text(
                        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                        " FROM pg_constraint WHERE conrelid IN"
                        " (SELECT relid FROM pg_partition_tree('events'))"
                    )
                )
            ),
            "side": [
                (c["name"], str(c["type"]), c["nullable"])
                for c in inspect(engine).get_columns("event_turn_edges")
            ],
            "keys": inspect(engine).get_pk_constraint("event_turn_edges"),
            "events_key": inspect(engine).get_pk_constraint("events"),
        }


def test_create_all_builds_the_layout_the_revision_builds(pg_empty_db_url: str) -> None:
    """The models' DDL events build on PostgreSQL what the revisions (0011 to 0015) build
    beside the tables, which the schema comparisons leave out (names and definitions alike,
    every level of the partitions: months, their leaves, bounds, keys, CHECKs, indexes)."""
    from conftest import create_pg_database, drop_pg_database

    from mnestoma.schema.models import Base

    mnestoma.upgrade(pg_empty_db_url)
    migrated = _layout(pg_empty_db_url)
    other = create_pg_database("mnestoma_layout")
    try:
        with package_engine(other) as engine:
            Base.metadata.create_all(engine)
        built = _layout(other.render_as_string(hide_password=False))
    finally:
        drop_pg_database(other, later=True)
    assert built == migrated
    assert migrated["events_key"]["constrained_columns"] == []  # each partition has its own
    names = [str(row[0]) for row in migrated["tree"]]  # type: ignore[attr-defined]
    assert not any(n.startswith("events_to_") for n in names)  # no partition of the past
    assert f"events_{datetime.now(UTC):%Y%m}_created" in names
