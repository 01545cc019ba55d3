"""``mnestoma split-history`` on PostgreSQL (contract §12) for the default partition: the rows
``events_default`` caught (months no partition covers: a clock far off, a raw INSERT, a month
the writers' upkeep left to the command) split into their months online, as a partition of the
old layout is: the same rows, ``event_turn_edges`` and every invariant kept, a new empty
``events_default`` in its place shaped as a new store's; while writers write, after a kill at
any point, when a month of those rows is made meanwhile, and when a prune runs meanwhile.

The rows are written through the facade with a clock in those months (so that every invariant
holds), then put where a store gets them: the months their writes made taken away, and the
rows inserted again through ``events``, which routes them to the default partition."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from cli_kit import run_ok
from conftest import mnest_row
from helpers_proc import run_python
from invariants import check_invariants
from schema_kit import schema_diff
from sqlalchemy import Engine, insert, text
from test_history_split import (
    _KILLED,
    LEFT_BEHIND,
    _month,
    _month_shape,
    assert_attached_unread,
    assert_every_event_in_its_month,
    assert_nothing_left,
    engine_with_notices,
    fresh_month_shape,
    snapshot,
)

import mnestoma
from mnestoma import Mnestoma, Passing
from mnestoma.core.rules import new_mnest_id
from mnestoma.engines import make_engine
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance import splitting
from mnestoma.maintenance.splitting import OldPartition, waiting_history
from mnestoma.maintenance.status import collect_status, render_status
from mnestoma.schema.sql.tables import MNESTS
from mnestoma.testing.clock import MovableClock

# Months counted from the current one that a new store has no partition for: two in the past,
# two years ahead. Their events are the default partition's.
FAR = (-30, -29, 36, 60)
# Months ahead of them all that no partition covers either, written into during a split:
# through the facade (whose upkeep makes the month), and by raw inserts (none makes it).
STRAY = 48
RAW = 56
PARTITION_NAMES = text("SELECT part::text FROM mnestoma_events_bounds()")
IN_DEFAULT = text("SELECT count(*) FROM events_default")
# The default partition: its kind, its bound ('DEFAULT'), and the table it is attached to.
DEFAULT_PARTITION = text(
    "SELECT c.relkind::text, pg_get_expr(c.relpartbound, c.oid), i.inhparent::regclass::text"
    " FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid"
    " WHERE c.oid = to_regclass('events_default')"
)
PARENT = text("SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = to_regclass(:t)")
# A created event as a raw INSERT writes it, for a row inserted beside it.
RAW_CREATED = text(
    "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_after, state_after)"
    " VALUES (:m, 'created', :ts, :t, 0.5, 'active')"
)


@pytest.fixture(autouse=True)
def _forget_partitions() -> Iterator[None]:
    yield
    forget_partitions()


def month_at(now: datetime, k: int, day: int = 10) -> datetime:
    """Noon of ``day`` in the month ``k`` months from ``now``'s (UTC)."""
    years, month = divmod(now.month - 1 + k, 12)
    return datetime(now.year + years, month + 1, day, 12, tzinfo=UTC)


def _move_into_default(engine: Engine, names: list[str]) -> None:
    """The rows of the partitions ``names`` deleted and the partitions dropped, then the rows
    inserted again through events (into the default partition; the turn-edge triggers take
    their rows of event_turn_edges away and put them back)."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE moved ON COMMIT DROP AS SELECT * FROM events LIMIT 0"))
        for name in names:
            conn.execute(text(f"INSERT INTO moved SELECT * FROM {name}"))
            conn.execute(text(f"DELETE FROM {name}"))
            conn.execute(text(f"DROP TABLE {name}"))
        conn.execute(text("INSERT INTO events SELECT * FROM moved"))


def default_history(url: str, now: datetime) -> Engine:
    """A store at head whose events of the :data:`FAR` months (two turns and a passing in
    each, the oldest first) lie in the default partition, with ids of their own (from 1 on),
    then a turn of the current month's."""
    mnestoma.upgrade(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        fresh = set(conn.execute(PARTITION_NAMES).scalars())
    clock = MovableClock(now)
    with Mnestoma(engine, clock=clock) as store:
        for k in FAR:
            for day in (3, 17):
                clock.set(month_at(now, k, day))
                passings = [Passing("a", "1", f"b{k}", "1"), Passing(f"b{k}", "1", "c", "1")]
                store.record_turn(f"t{k}_{day}", passings)
            store.record_passing("x", "1", "y", "1")
    with engine.connect() as conn:
        made = [n for n in conn.execute(PARTITION_NAMES).scalars() if n not in fresh]
    _move_into_default(engine, made)
    forget_partitions()  # the months taken away are made again where a write asks
    with Mnestoma(engine, clock=MovableClock(now)) as store:
        store.record_turn("now", [Passing("n", "1", "m", "1")])
    return engine


def far_months(now: datetime, ks: tuple[int, ...] = FAR) -> tuple[str, ...]:
    return tuple(f"events_{_month(month_at(now, k))}" for k in ks)


def assert_fresh_default(engine: Engine) -> None:
    """events_default is the default partition of events, and empty."""
    with engine.connect() as conn:
        assert conn.execute(DEFAULT_PARTITION).one() == ("r", "DEFAULT", "events")
        assert conn.execute(IN_DEFAULT).scalar_one() == 0


# --- the split ----------------------------------------------------------------------------


def test_rows_the_default_partition_caught_are_split_into_their_months(
    pg_empty_db_url: str,
) -> None:
    """Events of four months no partition covers, in the default partition: status, the dry
    run and its JSON list events_default; the split puts each event in its month (a month
    made for each), the same rows and turn edges, every invariant kept, a new empty
    events_default attached; then nothing waits, nor once a row has passed through it (the
    page it leaves behind is no row)."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    engine = default_history(url, now)
    try:
        before = snapshot(engine)
        with engine.connect() as conn:
            caught = conn.execute(IN_DEFAULT).scalar_one()
        assert caught == len(before[0]) - 1  # all but the current month's
        status = collect_status(engine)
        assert status.history_to_split == [OldPartition("events_default", None, None, caught)]
        assert f"history    the default partition of events holds {caught} events" in render_status(
            status
        )
        dry = run_ok("split-history", "--dry-run", "--database-url", url).stdout
        assert dry.startswith("would split 1 partition of events (dry run: nothing changed)")
        assert "  events_default: the months no partition covers" in dry
        waiting = json.loads(
            run_ok("split-history", "--dry-run", "--json", "--database-url", url).stdout
        )["waiting"]
        assert [(p["name"], p["from"], p["to"]) for p in waiting] == [
            ("events_default", None, None)
        ]
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=4)
        assert report.partitions == ("events_default",)
        assert report.months == far_months(now)
        assert report.copied == caught and report.batches == -(-caught // 4)
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        assert_fresh_default(engine)
        check_invariants(url)
        after = collect_status(engine)
        assert after.history_to_split == [] and "history    " not in render_status(after)
        with Mnestoma(engine) as store:
            assert store.split_history(dry_run=True).waiting == ()
        with engine.begin() as conn:  # a row that passes through leaves a page behind
            conn.execute(RAW_CREATED, {"m": "mn_passing", "ts": month_at(now, 70), "t": None})
            assert [p.name for p in waiting_history(conn) or []] == ["events_default"]
            conn.execute(text("DELETE FROM events_default"))
            assert waiting_history(conn) == []
    finally:
        engine.dispose()


def test_after_the_split_the_default_partition_and_its_months_are_a_new_stores(
    pg_empty_db_url: str,
) -> None:
    """The new events_default has the tables, indexes (named as a new store names them),
    constraints, triggers and defaults of the one a new store made; each month the split
    attached has those of a month made under events by the store's function, attached
    without reading its rows; the schema compares clean against the models."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    default_history(url, now).dispose()
    engine, notices = engine_with_notices(url)
    try:
        with engine.connect() as conn:
            new_store_default = _month_shape(conn, "events_default")
        assert new_store_default["indexes"]  # the pkey and events' indexes
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=5)
        assert report.months == far_months(now)
        with engine.begin() as conn:
            assert _month_shape(conn, "events_default") == new_store_default
            made = fresh_month_shape(conn)
            for month in report.months:
                assert _month_shape(conn, month) == made, month
            assert schema_diff(conn) == []
        assert_attached_unread(notices, report.months)
    finally:
        engine.dispose()


# --- while writers write --------------------------------------------------------------------


def test_writers_during_a_split_of_the_default_partition_lose_nothing(
    pg_empty_db_url: str,
) -> None:
    """Threads record turns into the current month all along; during the copy others record
    turns into a month being split (their upkeep's try at making that month finds it staged,
    and changes nothing) and into a month no partition covers and none staged (made by
    their upkeep), and a raw writer inserts rows into another such month (made by the
    swap for the rows the staging table's default leaf caught); the store's upkeep asked
    for a staged month changes nothing. No writer fails, every write is there, each event
    in its month, the turn edges those of the passings, every invariant kept."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    engine = default_history(url, now)
    stop_now, stop_far = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    written: dict[str, int] = {}
    wrote = {name: threading.Semaphore(0) for name in ("far", "stray", "raw")}

    def writer(name: str, at: datetime | None, stop: threading.Event) -> None:
        clock = None if at is None else MovableClock(at)
        with Mnestoma(engine, clock=clock) as store:
            n = 0
            while not stop.is_set():
                try:
                    store.record_turn(f"w{name}-{n}", [Passing("w", "1", f"d{name}", "1")])
                except BaseException as err:  # every failure counts
                    errors.append(err)
                    return
                n += 1
                if name in wrote:
                    wrote[name].release()
            written[name] = n

    def raw_writer() -> None:
        at, n = month_at(now, RAW), 0
        while not stop_far.is_set():
            try:
                with engine.begin() as conn:
                    mnest = new_mnest_id()
                    conn.execute(insert(MNESTS), [mnest_row(at, id=mnest, src_executor=f"r{n}")])
                    conn.execute(RAW_CREATED, {"m": mnest, "ts": at, "t": f"wraw-{n}"})
            except BaseException as err:
                errors.append(err)
                return
            n += 1
            wrote["raw"].release()
        written["raw"] = n

    far = [
        threading.Thread(target=writer, args=("far", month_at(now, FAR[2], 20), stop_far)),
        threading.Thread(target=writer, args=("stray", month_at(now, STRAY), stop_far)),
        threading.Thread(target=raw_writer),
    ]
    current = [threading.Thread(target=writer, args=(f"now{i}", None, stop_now)) for i in (1, 2)]
    staged = far_months(now, (FAR[2],))[0]
    seen: dict[str, Any] = {}

    def during(partition: str, done: int, total: int, copied: int) -> None:
        if done == 1 and not seen:
            for t in far:
                t.start()
            for name in wrote:  # writes between two batches: mirrored, not copied
                for _ in range(3):
                    assert wrote[name].acquire(timeout=30)
            with engine.begin() as conn:  # the store's upkeep, asked for a staged month
                conn.execute(
                    text("SELECT mnestoma_events_partitions(:at, 0)"),
                    {"at": month_at(now, FAR[2])},
                )
            with engine.connect() as conn:
                seen["parent"] = conn.execute(PARENT, {"t": staged}).scalar()
        if done == total:  # the copy is done: the far writers stop before the swap
            stop_far.set()
            for t in far:
                t.join(60)

    for t in current:
        t.start()
    try:
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=4, progress=during)
    finally:
        stop_now.set()
        stop_far.set()
        for t in current + far:
            t.join(60)
    try:
        assert errors == [] and seen == {"parent": "events_split"}
        assert set(written) == {"far", "stray", "raw", "now1", "now2"}
        assert all(written.values())
        assert staged in report.months and far_months(now, (RAW,))[0] in report.months
        events, edges = snapshot(engine)
        for name, n in written.items():
            assert sum(1 for r in events if (r.turn_id or "").startswith(f"w{name}-")) == n
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        assert_fresh_default(engine)
        passings = {
            (r.turn_id, r.mnest_id, r.occurrence)
            for r in events
            if r.turn_id is not None and r.kind in ("created", "reinforced")
        }
        assert {(e.turn_id, e.mnest_id, e.occurrence) for e in edges} == passings
        check_invariants(url)
    finally:
        engine.dispose()


def test_a_month_of_the_default_made_before_the_start_is_not_staged(
    pg_empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A month of the default partition's rows made (its rows moved into it, as the
    writers' upkeep does) after the split read the months and before its start: the start
    drops the month it staged for it, and the split makes the others; nothing lost."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    engine = default_history(url, now)
    gone = far_months(now, (FAR[1],))[0]
    lo, hi = month_at(now, FAR[1], 1), month_at(now, FAR[1] + 1, 1)
    real_begin = splitting.begin_split

    def made_first(bind: Any, old: OldPartition, months: list[tuple[int, int]]) -> Any:
        assert (lo.year, lo.month) in months
        start, end = f"'{lo:%Y-%m}-01 00:00:00+00'", f"'{hi:%Y-%m}-01 00:00:00+00'"
        with engine.begin() as conn:
            conn.execute(text("LOCK TABLE events IN ACCESS EXCLUSIVE MODE"))
            conn.execute(
                text(
                    "CREATE TEMP TABLE moved ON COMMIT DROP AS SELECT * FROM events_default"
                    f" WHERE ts >= {start} AND ts < {end}"
                )
            )
            conn.execute(text("DELETE FROM events_default WHERE id IN (SELECT id FROM moved)"))
            conn.execute(text(f"SELECT mnestoma_events_month('events', '{gone}', {start}, {end})"))
            conn.execute(text("INSERT INTO events SELECT * FROM moved"))
        return real_begin(bind, old, months)

    monkeypatch.setattr(splitting, "begin_split", made_first)
    staged_twin: list[object] = []

    def started(partition: str, done: int, total: int, copied: int) -> None:
        if done == 0:  # the start is committed: the month it staged for the made one is gone
            with engine.connect() as conn:
                twin = text("SELECT to_regclass(:t)::text")
                staged_twin.append(conn.execute(twin, {"t": f"events_split_{gone[7:]}"}).scalar())

    try:
        before = snapshot(engine)
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=4, progress=started)
        assert staged_twin == [None]
        assert report.partitions == ("events_default",)
        assert report.months == far_months(now, (FAR[0], FAR[2], FAR[3]))
        with engine.connect() as conn:
            assert conn.execute(PARENT, {"t": gone}).scalar() == "events"
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        check_invariants(url)
    finally:
        engine.dispose()


def test_a_prune_during_the_split_takes_the_months_it_covers(pg_empty_db_url: str) -> None:
    """A prune runs between two batches, its cutoff after the default partition's two past
    months, with a month of events wholly before it (dropped whole: its partition of
    everything before then covers those two months): it deletes their rows from the default
    partition but the created events of the mnests stored, which it keeps; the swap drops
    the two staged months (the mirror emptied them) and attaches the others. The rows are
    those the prune left, none lost, none doubled, no table left behind."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    engine = default_history(url, now)
    whole, cutoff = month_at(now, -25, 1), month_at(now, -20, 1).replace(hour=0)
    with engine.begin() as conn:
        lo, hi = (f"'{m:%Y-%m}-01 00:00:00+00'" for m in (whole, month_at(now, -24, 1)))
        name = f"events_{_month(whole)}"
        conn.execute(text(f"SELECT mnestoma_events_month('events', '{name}', {lo}, {hi})"))
        stored = set(conn.execute(text("SELECT id FROM mnests")).scalars())
    before = snapshot(engine)[0]
    kept = [r for r in before if r.ts >= cutoff or (r.kind == "created" and r.mnest_id in stored)]
    pruned: list[int] = []

    def prune(partition: str, done: int, total: int, copied: int) -> None:
        if done == 1 and not pruned:
            with Mnestoma(engine) as store:
                pruned.append(store.prune_events(cutoff))

    try:
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=4, progress=prune)
        assert pruned == [len(before) - len(kept)] and len(kept) < len(before)
        assert report.partitions == ("events_default",)
        assert report.months == far_months(now, FAR[2:])
        with engine.connect() as conn:
            for staged in far_months(now, FAR[:2]):
                assert conn.execute(text("SELECT to_regclass(:t)"), {"t": staged}).scalar() is None
        assert snapshot(engine)[0] == kept
        assert_nothing_left(engine)
        assert_fresh_default(engine)
    finally:
        engine.dispose()


# --- a kill at any point ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "k"), [("batches", 0), ("batches", 3), ("in-batch", 3), ("after-swap", 0)]
)
def test_a_split_of_the_default_partition_killed_anywhere_is_completed_by_the_next_run(
    pg_empty_db_url: str, where: str, k: int
) -> None:
    """A process splitting the default partition is killed (SIGKILL) once its staging table
    is made, after some batches, inside a batch's transaction, or after the swap before the
    detached events_default is dropped; the next run completes it: nothing lost, nothing
    doubled, nothing left, every invariant kept."""
    url, now = pg_empty_db_url, datetime.now(UTC)
    engine = default_history(url, now)
    try:
        before = snapshot(engine)
        done = run_python(_KILLED.format(url=url, where=where, k=k, batch=3))
        assert done.returncode == -9, done.stderr
        with engine.connect() as conn:
            left = conn.execute(LEFT_BEHIND).scalars().all()
        if where == "after-swap":  # the swap is done: the old default waits to be dropped
            assert left == ["events_default_dropped"]
            assert_fresh_default(engine)
        else:  # the staging table and its comment say where the copy stands
            assert "events_split" in left and "events_split_default" in left
        assert snapshot(engine) == before
        resumed: list[int] = []
        with Mnestoma(engine) as store:
            report = store.split_history(
                batch_rows=3, progress=lambda p, done, *_: resumed.append(done)
            )
        # the batches committed before the kill are not run again
        if where == "after-swap":
            assert resumed == [] and report.partitions == ()
        else:
            assert resumed[0] == {"batches": k, "in-batch": k - 2}[where]
            assert report.partitions == ("events_default",)
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        assert_fresh_default(engine)
        check_invariants(url)
    finally:
        engine.dispose()


def test_a_month_the_writers_left_to_the_split_is_made_by_it_and_written_into_after(
    pg_store_url: str,
) -> None:
    """A default partition larger than PARTITION_DEFAULT_MAX_MIB: writers make no month
    (their events join the rest there), split-history makes the month with every one of
    them, and the next writer's events land in it."""
    bulk = 60_000
    at = datetime(2044, 7, 9, tzinfo=UTC)
    engine = make_engine(pg_store_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (mnest_id, kind, ts) SELECT 'mn_bulk', 'reinforced',"
                    " CAST(:ts AS timestamptz) FROM generate_series(1, :n)"
                ),
                {"ts": at, "n": bulk},
            )
        with Mnestoma(pg_store_url, clock=MovableClock(at)) as store:
            store.record_turn("t-left", [Passing("a", "1", "b", "1")])
            with engine.connect() as conn:
                assert "events_204407" not in set(conn.execute(PARTITION_NAMES).scalars())
                assert conn.execute(IN_DEFAULT).scalar_one() == bulk + 1
            report = store.split_history(batch_rows=20_000)
        assert "events_default" in report.partitions and "events_204407" in report.months
        forget_partitions()
        with Mnestoma(pg_store_url, clock=MovableClock(at)) as store:
            store.record_turn("t-after", [Passing("a", "1", "b", "1")])
        with engine.connect() as conn:
            assert conn.execute(IN_DEFAULT).scalar_one() == 0
            in_month = "SELECT count(*) FROM events_204407"
            assert conn.execute(text(in_month)).scalar_one() == bulk + 2
        assert_every_event_in_its_month(engine)
    finally:
        engine.dispose()
