"""``mnestoma split-history`` on PostgreSQL (contract §12): the partitions of ``events`` in the
old layout that hold rows (the table as it was before 0011, a month that held rows when 0015
ran, what a ``copy --append`` put there) rebuilt into months of the new layout, every event in
its month, the same rows, ``event_turn_edges`` untouched, nothing left behind: after an
upgrade, after ``copy --append``, after a kill at any point, while writers write; retention
then drops those months unread. A new store (or a copy into one) has nothing to split.

The old layout is built as a store gets it: events written at 0010 or 0014, then the store
upgraded to head (0015 leaves a partition that holds rows as it is)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_kit import run, run_ok
from conftest import mnest_row, package_engine
from helpers_proc import run_python
from invariants import wait_for_other_sessions_to_end
from sqlalchemy import Engine, NullPool, create_engine, event, insert, text

import mnestoma
from mnestoma import Mnestoma, Passing, SchemaError
from mnestoma.core.rules import new_mnest_id
from mnestoma.engines import make_engine
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance import retention
from mnestoma.maintenance.copying import copy_store
from mnestoma.maintenance.splitting import old_partitions
from mnestoma.maintenance.status import collect_status, render_status
from mnestoma.schema.sql.tables import MNESTS
from mnestoma.testing.clock import MovableClock

BEFORE_0011 = "0010"
BEFORE_0015 = "0014"
# Every event with its partition, as rows to compare (the partition left out).
EVENT_ROWS = text("SELECT * FROM events ORDER BY id")
TURN_EDGES = text("SELECT * FROM event_turn_edges ORDER BY turn_id, mnest_id, occurrence")
WHERE = text("SELECT id, tableoid::regclass::text, ts, kind FROM events ORDER BY id")
LEFT_BEHIND = text(
    "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p')"
    " AND (relname LIKE 'events\\_split%' OR relname LIKE '%\\_dropped') ORDER BY 1"
)
MIRROR_FUNCTION = text("SELECT to_regprocedure('mnestoma_split_mirrored()') IS NOT NULL")
# The mnests the history's events name (each with a valid id: a test may store some).
SEEDED_MNESTS = [new_mnest_id() for _ in range(9)]
RAW_EVENT = text(
    "INSERT INTO events (mnest_id, kind, ts, turn_id) VALUES (:m, :kind, :ts, :t) RETURNING id"
)


@pytest.fixture(autouse=True)
def _forget_partitions() -> Iterator[None]:
    yield
    forget_partitions()


def _month(ts: datetime) -> str:
    return f"{ts.astimezone(UTC):%Y%m}"


def seed_history(engine: Engine, now: datetime, days: int = 425) -> None:
    """Events on every day of the ``days`` before ``now`` (14 months) of the mnests
    :data:`SEEDED_MNESTS` (not stored): a created event now and then, passings with a turn,
    transitions, written as the store's release before 0011 did."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts, turn_id)"
                " SELECT (CAST(:ids AS text[]))[g % 9 + 1],"
                " CASE WHEN g % 7 = 0 THEN 'created' WHEN g % 5 = 0 THEN 'transition'"
                " ELSE 'reinforced' END,"
                " CAST(:now AS timestamptz) - g * interval '1 day' - interval '1 hour',"
                " CASE WHEN g % 5 = 0 THEN NULL ELSE 't' || g END"
                " FROM generate_series(0, :days) g"
            ),
            {"now": now, "days": days, "ids": SEEDED_MNESTS},
        )


def snapshot(engine: Engine) -> tuple[list[Any], list[Any]]:
    """Every event (every column) and every row of event_turn_edges."""
    with engine.connect() as conn:
        return list(conn.execute(EVENT_ROWS)), list(conn.execute(TURN_EDGES))


def assert_every_event_in_its_month(engine: Engine) -> None:
    """Each event lies in the leaf of its month of the new layout: ``_created`` for a
    created event, ``_rest`` for the others."""
    with engine.connect() as conn:
        rows = conn.execute(WHERE).all()
    wrong = [
        (i, where, ts, kind)
        for i, where, ts, kind in rows
        if where != f"events_{_month(ts)}_{'created' if kind == 'created' else 'rest'}"
    ]
    assert rows and wrong == []


def assert_nothing_left(engine: Engine) -> None:
    """No partition of the old layout holds rows, and no table or function of the split
    is left."""
    with engine.connect() as conn:
        assert old_partitions(conn) == []
        assert conn.execute(LEFT_BEHIND).scalars().all() == []
        assert not conn.execute(MIRROR_FUNCTION).scalar_one()


PARTITIONS = text(
    "SELECT c.relname::text, c.relkind::text FROM mnestoma_events_bounds() b"
    " JOIN pg_class c ON c.oid = b.part ORDER BY b.lower"
)
CATCH_ALL_BOUND = text("SELECT upper FROM mnestoma_events_bounds() WHERE lower = '-infinity'")


def partitions_of_events(engine: Engine) -> dict[str, str]:
    """Each partition of events (but the default) and its kind: ``r`` a plain table (the
    old layout), ``p`` a month of the new one."""
    with engine.connect() as conn:
        return {str(name): str(kind) for name, kind in conn.execute(PARTITIONS)}


def upgraded_history(url: str, now: datetime, *, head: bool = True) -> Engine:
    """A store at 0010 with events over 14 months, upgraded to 0014 (0011 puts them in one
    partition, ``events_to_<bound>``, and makes plain months from that bound on), a few raw
    events in the month at that bound (a plain month that holds rows), then (``head``)
    upgraded to head: 0015 leaves both as they are and converts the empty months after
    them."""
    engine = make_engine(url)
    mnestoma.upgrade(engine, BEFORE_0011)
    seed_history(engine, now)
    mnestoma.upgrade(engine, BEFORE_0015)
    with engine.connect() as conn:
        (bound,) = conn.execute(CATCH_ALL_BOUND).one()
    with engine.begin() as conn:
        for i, kind in enumerate(("created", "reinforced", "reinforced")):
            params = {"m": "mn_next", "kind": kind, "ts": bound + timedelta(days=2), "t": f"n{i}"}
            conn.execute(RAW_EVENT, params)
    if head:
        mnestoma.upgrade(engine)
    return engine


def _old_layout(url: str, *, upgrade: bool = True) -> None:
    """A store at 0014 with an event in its catch-all (the partition of everything before
    the months 0011 made: it holds the current month), then (``upgrade``) at head: 0015
    keeps that partition as it is, since it holds a row."""
    mnestoma.upgrade(url, BEFORE_0015)
    with package_engine(url) as engine, engine.begin() as conn:
        params = {"m": "mn_old", "kind": "created", "ts": datetime.now(UTC) - timedelta(days=40)}
        conn.execute(RAW_EVENT, params | {"t": None})
    if upgrade:
        mnestoma.upgrade(url)


@pytest.fixture
def old_layout_url(pg_empty_db_url: str) -> str:
    """A store at head whose current month's events go to the catch-all of the old layout
    (:func:`_old_layout`)."""
    _old_layout(pg_empty_db_url)
    return pg_empty_db_url


# --- after an upgrade -------------------------------------------------------------------


def test_split_after_an_upgrade_puts_every_event_in_its_month(pg_empty_db_url: str) -> None:
    """14 months in the partition 0011 made of the table, and a month of the old layout
    with rows: both rebuilt (the oldest first), every event in its month, the same rows and
    turn edges, nothing left; status says what waits, then that nothing does."""
    now = datetime.now(UTC)
    engine = upgraded_history(pg_empty_db_url, now)
    try:
        before = snapshot(engine)
        layout = list(partitions_of_events(engine).items())
        assert re.match(r"events_to_\d{6}$", layout[0][0]) and layout[0][1] == "r"
        assert re.match(r"events_\d{6}$", layout[1][0]) and layout[1][1] == "r"
        assert layout[2:] and all(kind == "p" for _, kind in layout[2:])  # 0015 made them
        waiting = collect_status(engine).history_to_split
        assert [p.name for p in waiting or []] == [name for name, _ in layout[:2]]
        assert "history    2 partitions of events in the old layout" in render_status(
            collect_status(engine)
        )
        dry = json.loads(
            run_ok("split-history", "--dry-run", "--json", "--database-url", pg_empty_db_url).stdout
        )
        assert [p["name"] for p in dry["waiting"]] == [p.name for p in waiting]
        assert snapshot(engine) == before  # the dry run changes nothing
        seen: list[tuple[str, int, int, int]] = []
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=37, progress=lambda *a: seen.append(a))
        assert report.partitions == tuple(p.name for p in waiting)
        assert {f"events_{_month(r.ts)}" for r in before[0]} <= set(report.months)
        assert report.copied == len(before[0]) and report.batches == len(seen) - 2
        assert seen[0][0] == waiting[0].name and seen[0][1] == 0
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        after = collect_status(engine)
        assert after.history_to_split == [] and "history    " not in render_status(after)
        assert (
            json.loads(run_ok("status", "--json", "--database-url", pg_empty_db_url).stdout)[
                "history_to_split"
            ]
            == []
        )
        again = run_ok("split-history", "--database-url", pg_empty_db_url).stdout
        assert again.startswith("nothing to split")
        assert all(kind == "p" for kind in partitions_of_events(engine).values())
    finally:
        engine.dispose()


def test_sparse_ids_make_full_batches(pg_empty_db_url: str) -> None:
    """A partition whose ids are far apart (what retention kept of dropped months) is
    copied in batches of the ids it holds, not of the numbers between them."""
    now = datetime.now(UTC)
    with package_engine(pg_empty_db_url) as engine:
        mnestoma.upgrade(engine, BEFORE_0011)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO events (id, mnest_id, kind, ts)"
                    " SELECT g * 1000, 'mn_' || g, 'created',"
                    " CAST(:now AS timestamptz) - g * interval '2 days'"
                    " FROM generate_series(1, 95) g"
                ),
                {"now": now},
            )
            conn.execute(text("SELECT setval('events_id_seq', 100000)"))
        mnestoma.upgrade(engine)
        before = snapshot(engine)
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=10)
        assert report.copied == 95 and report.batches == 10
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)


def _month_shape(conn: Any, month: str) -> dict[str, list[tuple[Any, ...]]]:
    """A month's tables, indexes, constraints, triggers and defaults, its name written X."""
    tree = f"pg_partition_tree('{month}') t JOIN pg_class c ON c.oid = t.relid"
    queries = {
        "tables": f"SELECT c.relname, c.relkind, pg_get_expr(c.relpartbound, c.oid) FROM {tree}",
        "indexes": f"SELECT c.relname, ic.relname, pg_get_indexdef(ic.oid), ip.relname FROM {tree}"
        " JOIN pg_index i ON i.indrelid = t.relid JOIN pg_class ic ON ic.oid = i.indexrelid"
        " LEFT JOIN pg_inherits h ON h.inhrelid = ic.oid"
        " LEFT JOIN pg_class ip ON ip.oid = h.inhparent",
        "constraints": f"SELECT c.relname, con.conname, con.conislocal, con.coninhcount,"
        f" pg_get_constraintdef(con.oid) FROM {tree}"
        " JOIN pg_constraint con ON con.conrelid = t.relid",
        "triggers": f"SELECT c.relname, tg.tgname, pg_get_triggerdef(tg.oid) FROM {tree}"
        " JOIN pg_trigger tg ON tg.tgrelid = t.relid",
        "defaults": f"SELECT c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid) FROM {tree}"
        " JOIN pg_attrdef d ON d.adrelid = t.relid"
        " JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum",
        "columns": f"SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),"
        f" a.attnotnull FROM {tree} JOIN pg_attribute a ON a.attrelid = t.relid"
        " WHERE a.attnum > 0 AND NOT a.attisdropped",
    }
    bounds = re.compile(r"'\d{4}-\d\d-01 00:00:00\+00'")
    return {
        key: sorted(
            tuple(bounds.sub("B", str(v).replace(month, "X")) for v in row)
            for row in conn.execute(text(sql))
        )
        for key, sql in queries.items()
    }


def test_a_split_month_is_the_month_a_store_partitioned_from_the_start_has(
    pg_empty_db_url: str,
) -> None:
    """The months the split attaches (from the catch-all, and in place of a month of the old
    layout, whose names they take) have the tables, indexes, constraints, triggers and
    defaults of a month made under events by the store's function; the attach read none of
    their rows (PostgreSQL says so at DEBUG1)."""
    now = datetime.now(UTC)
    upgraded_history(pg_empty_db_url, now).dispose()
    engine, notices = engine_with_notices(pg_empty_db_url)
    try:
        with Mnestoma(engine) as store:
            report = store.split_history()
        with engine.begin() as conn:
            made = fresh_month_shape(conn)
            for month in (report.months[0], report.months[-1]):  # from the catch-all; renamed
                assert _month_shape(conn, month) == made, month
        assert_attached_unread(notices, report.months)
    finally:
        engine.dispose()


def engine_with_notices(url: str) -> tuple[Engine, list[str]]:
    """An engine whose sessions report at DEBUG1, and the list their notices go to."""
    notices: list[str] = []
    engine = make_engine(url, connect_args={"options": "-c client_min_messages=debug1"})

    @event.listens_for(engine, "connect")
    def listen(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))

    return engine, notices


def fresh_month_shape(conn: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The shape of a month the store's function makes under events now (year 2999)."""
    conn.execute(
        text(
            "SELECT mnestoma_events_month('events', 'events_299901',"
            " '2999-01-01 00:00:00+00', '2999-02-01 00:00:00+00')"
        )
    )
    return _month_shape(conn, "events_299901")


def assert_attached_unread(notices: list[str], months: Sequence[str]) -> None:
    """Each leaf of ``months`` was attached without a scan (PostgreSQL says so at DEBUG1)."""
    for month in months:
        for leaf in ("created", "rest"):
            assert (
                f'partition constraint for table "{month}_{leaf}" is implied by existing '
                "constraints" in notices
            ), (month, leaf)


# --- while writers write ------------------------------------------------------------------


def test_split_while_writers_write_keeps_every_write(pg_empty_db_url: str) -> None:
    """Threads record passings into the current month (in the partition being split) all
    along; during the copy a raw insert into the past (inside the partition's months, and
    before its oldest), a delete of a row not copied yet and of one copied, an update:
    no writer fails, and after the split the store holds exactly what it must."""
    now = datetime.now(UTC)
    engine = upgraded_history(pg_empty_db_url, now)
    stop = threading.Event()
    errors: list[BaseException] = []
    written: list[int] = []
    wrote = threading.Semaphore(0)  # released after each write

    def writer(i: int) -> None:
        with Mnestoma(engine) as store:
            n = 0
            while not stop.is_set():
                try:
                    store.record_turn(f"w{i}-{n}", [Passing("w", "1", f"d{i}", "1")])
                except BaseException as err:  # every failure counts
                    errors.append(err)
                    return
                n += 1
                wrote.release()
            written.append(n)

    with engine.connect() as conn:
        first, last = conn.execute(text("SELECT min(id), max(id) FROM events")).one()
    changed: dict[str, Any] = {}

    def during(partition: str, done: int, total: int, copied: int) -> None:
        if done == 1 and not changed:  # writes between two batches: mirrored, not copied
            while wrote.acquire(blocking=False):
                pass
            for _ in range(3):
                assert wrote.acquire(timeout=30)
        if done != 2 or changed:
            return
        with engine.begin() as conn:
            changed["past"] = conn.execute(
                RAW_EVENT,
                {
                    "m": "mn_past",
                    "kind": "reinforced",
                    "ts": now - timedelta(days=200),
                    "t": "past",
                },
            ).scalar_one()
            changed["far"] = conn.execute(
                RAW_EVENT,
                {"m": "mn_far", "kind": "created", "ts": now - timedelta(days=1500), "t": "far"},
            ).scalar_one()
            conn.execute(
                text("DELETE FROM events WHERE id IN (:a, :b)"), {"a": first, "b": last - 3}
            )
            conn.execute(
                text("UPDATE events SET reason = 'changed' WHERE id = :c"), {"c": last - 5}
            )

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        with engine.connect() as conn:
            expected = {row.id: row for row in conn.execute(EVENT_ROWS)}
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=40, progress=during)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    try:
        assert errors == [] and sum(written) > 0 and changed
        assert "events_" + _month(now - timedelta(days=1500)) in report.months  # the stray's
        events, edges = snapshot(engine)
        by_id = {row.id: row for row in events}
        del expected[first], expected[last - 3]
        assert by_id[last - 5].reason == "changed"
        assert {changed["past"], changed["far"]} <= set(by_id)
        for i, row in expected.items():
            if i != last - 5:
                assert by_id[i] == row
        writes = [
            r for r in events if r.mnest_id != "mn_past" and r.turn_id and r.turn_id.startswith("w")
        ]
        assert len(writes) == sum(written)
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
        passings = {
            (r.turn_id, r.mnest_id, r.occurrence)
            for r in events
            if r.turn_id is not None and r.kind in ("created", "reinforced")
        }
        assert {(e.turn_id, e.mnest_id, e.occurrence) for e in edges} == passings
    finally:
        engine.dispose()


# --- a kill at any point ---------------------------------------------------------------------

_KILLED = """
import os, signal
import mnestoma
from mnestoma.maintenance import splitting

url, where, k, batch = {url!r}, {where!r}, {k!r}, {batch!r}


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def progress(partition, done, total, copied):
    if where == "batches" and done == k:
        die()


if where == "in-batch":
    comment = splitting.sq.comment
    calls = []

    def killing_comment(*args):
        calls.append(1)
        if len(calls) == k:
            die()
        return comment(*args)

    splitting.sq.comment = killing_comment
if where == "after-swap":
    splitting.drop_split_leftover = die
with mnestoma.Mnestoma(url) as store:
    store.split_history(batch_rows=batch, progress=progress)
print("not killed")
"""


@pytest.mark.parametrize(
    ("where", "k"), [("batches", 0), ("batches", 4), ("in-batch", 3), ("after-swap", 0)]
)
def test_a_split_killed_at_any_point_is_completed_by_the_next_run(
    pg_empty_db_url: str, where: str, k: int
) -> None:
    """A process running the split is killed (SIGKILL) once its staging table is made,
    after some batches, inside a batch's transaction, or after the swap before the drop;
    the next run completes it: nothing lost, nothing doubled, nothing left."""
    engine = upgraded_history(pg_empty_db_url, datetime.now(UTC))
    try:
        before = snapshot(engine)
        done = run_python(_KILLED.format(url=pg_empty_db_url, where=where, k=k, batch=30))
        assert done.returncode == -9, done.stderr
        with engine.connect() as conn:
            left = conn.execute(LEFT_BEHIND).scalars().all()
        if where == "after-swap":  # the swap is done: the old table waits to be dropped
            assert len(left) == 1 and re.match(r"^events_to_\d{6}_dropped$", left[0]), left
        else:  # the staging table and its comment say where the copy stands
            assert "events_split" in left and "events_split_default" in left
        assert snapshot(engine) == before
        resumed: list[int] = []
        with Mnestoma(engine) as store:
            store.split_history(batch_rows=30, progress=lambda p, done, *_: resumed.append(done))
        # the batches committed before the kill are not run again
        assert resumed[0] == {"batches": k, "in-batch": k - 2, "after-swap": 0}[where]
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
    finally:
        engine.dispose()


# --- after copy -------------------------------------------------------------------------------


def _sqlite_history(path: str, start: datetime, months: int = 14) -> str:
    """A SQLite store whose passings (turns) and created events span ``months`` months."""
    url = f"sqlite:///{path}"
    clock = MovableClock(start)
    with Mnestoma(url, clock=clock) as store:
        for m in range(months):
            clock.set(start + timedelta(days=31 * m))
            store.record_turn(
                f"t{m}", [Passing("a", "1", f"b{m % 3}", "1"), Passing(f"b{m % 3}", "1", "c", "1")]
            )
            store.record_passing("x", "1", f"y{m}", "1")
    return url


def _where_copied(engine: Engine) -> list[tuple[str, datetime, str]]:
    """Each event's partition as a copy left it (its leaf for a month of the new form)."""
    with engine.connect() as conn:
        return [(where, ts, kind) for _, where, ts, kind in conn.execute(WHERE)]


def _nothing_waits(url: str) -> None:
    """Status, the dry run and a run of split-history all say that nothing waits."""
    with package_engine(url) as engine:
        status = collect_status(engine)
        assert status.history_to_split == [] and "history    " not in render_status(status)
        with Mnestoma(engine) as store:
            assert store.split_history(dry_run=True).waiting == ()
            assert store.split_history().partitions == ()


def test_a_copy_into_a_new_store_needs_no_split(pg_empty_db_url: str, tmp_path: Any) -> None:
    """A new store has no catch-all: a copy makes each event's month in the new form before
    writing it (months years apart included), so every event is in the leaf of its month,
    none in the default partition, and nothing waits for split-history."""
    source = _sqlite_history(str(tmp_path / "source.sqlite"), datetime(2031, 3, 5, tzinfo=UTC))
    with Mnestoma(source, clock=MovableClock(datetime(2040, 6, 1, tzinfo=UTC))) as store:
        store.record_passing("far", "1", "future", "1")  # a month years after the others
    mnestoma.upgrade(pg_empty_db_url)
    with package_engine(pg_empty_db_url) as engine:
        assert all(kind == "p" for kind in partitions_of_events(engine).values())
        with engine.connect() as conn:
            assert conn.execute(CATCH_ALL_BOUND).all() == []
    report = copy_store(source, pg_empty_db_url)
    assert report.rows["events"] > 14 * 3
    with package_engine(pg_empty_db_url) as engine:
        assert all(kind == "p" for kind in partitions_of_events(engine).values())
        assert "events_204006" in partitions_of_events(engine)
        assert_every_event_in_its_month(engine)
    _nothing_waits(pg_empty_db_url)


@pytest.mark.parametrize("upgraded", ["before the copy", "by the copy"])
def test_copy_append_into_a_store_whose_older_months_are_plain(
    pg_empty_db_url: str, tmp_path: Any, upgraded: str
) -> None:
    """A store whose history is in the old layout (a catch-all and a plain month, holding
    rows), at head or at 0014 (the copy upgrades it in its own transaction), takes two
    ``copy --append`` whose events span those partitions' months, months of the new form
    after them and a month years ahead: an event of a plain partition's range goes there,
    every other into the leaf of its month (made by the copy where missing), none into the
    default partition, the merges' events included; split-history then puts every event in
    its month."""
    now = datetime.now(UTC)
    first = _sqlite_history(str(tmp_path / "first.sqlite"), now - timedelta(days=430))
    second = _sqlite_history(str(tmp_path / "second.sqlite"), now - timedelta(days=200), 10)
    with Mnestoma(second, clock=MovableClock(datetime(2040, 6, 1, tzinfo=UTC))) as store:
        store.record_passing("far", "1", "future", "1")
    upgraded_history(pg_empty_db_url, now, head=upgraded == "before the copy").dispose()
    with package_engine(pg_empty_db_url) as engine:
        with engine.connect() as conn:
            (bound,) = conn.execute(CATCH_ALL_BOUND).one()
        catch_all, month = f"events_to_{_month(bound)}", f"events_{_month(bound)}"
        copy_store(first, pg_empty_db_url, append=True)
        assert mnestoma.current_revision(engine) == mnestoma.head_revision()
        assert copy_store(second, pg_empty_db_url, append=True).merged > 0
        layout = partitions_of_events(engine)
        assert [n for n, kind in layout.items() if kind == "r"] == [catch_all, month]
        assert layout["events_204006"] == "p"
        where = _where_copied(engine)
        assert {w for w, ts, _ in where if ts < bound} == {catch_all}
        assert {w for w, ts, _ in where if _month(ts) == _month(bound)} == {month}
        later = [(w, ts, kind) for w, ts, kind in where if ts >= bound and w != month]
        assert later and all(
            w == f"events_{_month(ts)}_{'created' if kind == 'created' else 'rest'}"
            for w, ts, kind in later
        ), later
        assert "merged" in {kind for w, _, kind in where if w == catch_all}
        before = snapshot(engine)
        with Mnestoma(engine) as store:
            report = store.split_history(batch_rows=7)
        assert report.partitions == (catch_all, month)
        assert snapshot(engine) == before
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)
    _nothing_waits(pg_empty_db_url)


# --- retention after a split ------------------------------------------------------------------

READS = text(
    "SELECT relname, seq_scan, seq_tup_read, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0)"
    " FROM pg_stat_user_tables WHERE relname = ANY(:tables)"
)


def _reads(url: str, tables: list[str]) -> dict[str, tuple[int, ...]]:
    """How often each table was read (scans, and the rows they returned), by the statistics
    of the sessions that have ended: every other session of the store is waited for (a
    session reports its statistics as it ends)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            wait_for_other_sessions_to_end(conn)
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            rows = conn.execute(READS, {"tables": tables}).all()
    finally:
        engine.dispose()
    found = {name: tuple(int(n) for n in counts) for name, *counts in rows}
    assert sorted(found) == sorted(tables)
    return found


def test_retention_drops_the_months_a_split_made_unread(
    pg_empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a split, a prune whose cutoff lies months after the oldest event drops each
    month the split made before it without reading its ``_rest`` leaf (its scans and rows
    read unchanged while the detached months wait to be dropped); before the cutoff only
    the ``created`` events of the mnests still stored are left."""
    url = pg_empty_db_url
    now = datetime.now(UTC)
    stored = set(SEEDED_MNESTS[1:3])
    engine = upgraded_history(url, now)
    try:
        with engine.begin() as conn:
            rows = [mnest_row(now, id=i, src_executor=f"s{n}") for n, i in enumerate(stored)]
            conn.execute(insert(MNESTS), rows)
        with Mnestoma(engine) as store:
            report = store.split_history()
        with engine.connect() as conn:
            conn.execute(text("ANALYZE events"))  # the catalogue's counts made exact
            conn.commit()
        events = snapshot(engine)[0]
    finally:
        engine.dispose()
    cutoff = (now - timedelta(days=200)).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    dropped = [m for m in report.months if m < f"events_{_month(cutoff)}"]
    assert len(dropped) >= 6
    rests = [f"{m}_rest" for m in dropped]
    before = _reads(url, rests)
    kept_back: list[str] = []
    real_drop = retention.drop_detached_partition

    def drop_later(bind: Any, name: str) -> None:
        if name.removesuffix("_dropped") in dropped:
            kept_back.append(name)  # their statistics are read first
            return
        real_drop(bind, name)

    monkeypatch.setattr(retention, "drop_detached_partition", drop_later)
    gone = [
        r for r in events if r.ts < cutoff and not (r.kind == "created" and r.mnest_id in stored)
    ]
    with Mnestoma(url) as store:
        assert store.prune_events(cutoff) == len(gone)
    assert sorted(kept_back) == sorted(f"{m}_dropped" for m in dropped)
    assert _reads(url, rests) == before  # never read
    with package_engine(url) as engine, engine.connect() as conn:
        conn.execute(text(f"SELECT count(*) FROM {rests[0]}")).scalar()  # a read is seen
        left = conn.execute(
            text("SELECT DISTINCT mnest_id, kind FROM events WHERE ts < :c"), {"c": cutoff}
        ).all()
    assert sorted(left) == [(m, "created") for m in sorted(stored)]
    assert _reads(url, rests[:1]) != {rests[0]: before[rests[0]]}


# --- the command line -------------------------------------------------------------------------


def test_the_command_splits_and_says_what_it_did(old_layout_url: str) -> None:
    """``mnestoma split-history`` on a store whose current month's events are in the
    partition of the old layout: the text and JSON reports, a bad batch refused."""
    with Mnestoma(old_layout_url) as store:
        store.record_turn("t1", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
    assert run("split-history", "--batch", "0", "--database-url", old_layout_url).exit_code == 2
    dry = run_ok("split-history", "--dry-run", "--database-url", old_layout_url).stdout
    assert dry.startswith("would split 1 partition of events") and "events_to_" in dry
    out = json.loads(
        run_ok("split-history", "--json", "--batch", "1", "--database-url", old_layout_url).stdout
    )
    assert out["partitions"][0].startswith("events_to_") and out["copied"] == 3
    assert out["batches"] >= 1 and out["months"] and out["dry_run"] is False
    with package_engine(old_layout_url) as engine:
        assert_every_event_in_its_month(engine)
    assert run_ok("split-history", "--database-url", old_layout_url).stdout.startswith(
        "nothing to split"
    )


def test_the_async_door_splits_too(old_layout_url: str) -> None:
    """``AsyncMnestoma.split_history`` drives the same steps, each through ``run_sync``."""
    import asyncio

    from mnestoma.aio import AsyncMnestoma

    with Mnestoma(old_layout_url) as store:
        store.record_turn("t1", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])

    async def split() -> Any:
        store = AsyncMnestoma(old_layout_url)
        try:
            waiting = await store.split_history(dry_run=True)
            return waiting, await store.split_history(batch_rows=1)
        finally:
            await store.close()

    waiting, report = asyncio.run(split())
    assert waiting.partitions == report.partitions and report.copied == 3
    with package_engine(old_layout_url) as engine:
        assert_every_event_in_its_month(engine)
        assert_nothing_left(engine)


def test_a_store_at_0014_is_told_to_upgrade(pg_empty_db_url: str) -> None:
    """A store at 0014 (history in its catch-all, no ``mnestoma_events_month`` yet): the
    command, its dry run and the facade refuse it as behind head, saying to run ``mnestoma
    db upgrade``, and change nothing."""
    _old_layout(pg_empty_db_url, upgrade=False)
    with package_engine(pg_empty_db_url) as engine:
        layout = partitions_of_events(engine)
        before = snapshot(engine)
    for args in ([], ["--dry-run"], ["--json"]):
        result = run("split-history", *args, "--database-url", pg_empty_db_url)
        assert result.exit_code == 1, result.output
        assert "behind head" in result.stderr and "mnestoma db upgrade" in result.stderr
    with pytest.raises(SchemaError, match=r"behind head.*mnestoma db upgrade"):
        Mnestoma(pg_empty_db_url).split_history()  # the store is refused as it is opened
    with package_engine(pg_empty_db_url) as engine:
        assert mnestoma.current_revision(engine) == BEFORE_0015
        assert partitions_of_events(engine) == layout and snapshot(engine) == before
        with engine.connect() as conn:
            assert conn.execute(LEFT_BEHIND).all() == []
