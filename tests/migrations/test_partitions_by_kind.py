"""Revision 0015 on PostgreSQL (contract §12): each month of events partitioned by kind.

On an empty store: no partition of the past, the months from the current one in the new
form. On a store at 0014 with events, while writers of the previous release go on: every
event kept where it was, the partitions holding rows left plain, the empty ones converted,
never a row copied. Stopped anywhere, the next run completes it; the ``db sql`` script
run twice with psql too; the way back down keeps every event.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import package_engine
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.engine import make_url
from test_live_upgrade import Writers

import mnestoma
from mnestoma import Mnestoma, Passing
from mnestoma.engines.partitions import forget_partitions, month_start
from mnestoma.maintenance.migration import current_revision, head_revision, offline_sql
from mnestoma.testing.clock import MovableClock

PASSING_EVENT = (
    "INSERT INTO events (mnest_id, kind, ts, turn_id) VALUES (:m, 'reinforced', :ts, :t)"
)


class Stopped(Exception):
    """The upgrade was interrupted here (as a kill or a dropped connection would)."""


@pytest.fixture
def engine(pg_empty_db_url: str) -> Iterator[Engine]:
    with package_engine(pg_empty_db_url) as eng:
        yield eng
    forget_partitions()


def _partitions(engine: Engine) -> dict[str, tuple[str, int]]:
    """Each partition of events (the tables right under it): its kind (``r`` plain, ``p``
    partitioned) and how many events it holds."""
    with engine.connect() as conn:
        names = conn.execute(
            text(
                "SELECT c.relname, c.relkind::text FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'events'::regclass"
            )
        ).all()
        return {
            name: (kind, int(conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one()))
            for name, kind in names
        }


def _month(at: datetime, months: int = 0) -> str:
    start = month_start(at)
    index = start.year * 12 + start.month - 1 + months
    return f"events_{index // 12}{index % 12 + 1:02d}"


def _first_month(engine: Engine) -> datetime:
    """The start of the first month that has a partition of its own."""
    with engine.connect() as conn:
        first = conn.execute(
            text("SELECT min(lower) FROM mnestoma_events_bounds() WHERE lower > '-infinity'")
        ).scalar_one()
    assert isinstance(first, datetime)
    return first


def assert_in_the_new_form(engine: Engine, name: str) -> None:
    """``name`` is a month in 0015's form: partitioned by list of kind, its two leaves each
    with its key, the created one with the CHECK of the month's bounds, the indexes of
    events on both."""
    with engine.connect() as conn:
        key = conn.execute(
            text("SELECT pg_get_partkeydef(to_regclass(:n))"), {"n": name}
        ).scalar_one()
        leaves = dict(
            conn.execute(
                text(
                    "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
                    " JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = to_regclass(:n) AND c.relkind = 'r'"
                ),
                {"n": name},
            ).all()
        )
        constraints = set(
            conn.execute(
                text(
                    "SELECT conname FROM pg_constraint"
                    " WHERE conrelid IN (to_regclass(:c), to_regclass(:r))"
                ),
                {"c": f"{name}_created", "r": f"{name}_rest"},
            ).scalars()
        )
        indexes = set(
            conn.execute(
                text("SELECT indexname FROM pg_indexes WHERE tablename IN (:c, :r)"),
                {"c": f"{name}_created", "r": f"{name}_rest"},
            ).scalars()
        )
    assert key == "LIST (kind)"
    assert leaves == {f"{name}_created": "FOR VALUES IN ('created')", f"{name}_rest": "DEFAULT"}
    assert {f"{name}_created_pkey", f"{name}_created_bound", f"{name}_rest_pkey"} <= constraints
    assert {f"{name}_created_mnest_id_idx", f"{name}_rest_turn_id_idx"} <= indexes


def test_an_empty_store_has_no_partition_of_the_past_and_its_months_in_the_new_form(
    engine: Engine,
) -> None:
    """0011's catch-all, empty, is dropped; the months from the current one, the three
    after it and those 0011 made from its bound are in the new form; a write lands in the
    leaf of its kind, and a row dated before the first month in the default partition."""
    mnestoma.upgrade(engine)
    parts = _partitions(engine)
    assert not any(n.startswith("events_to_") for n in parts)
    now = datetime.now(UTC)
    months = [n for n in parts if n != "events_default"]
    assert {_month(now, i) for i in range(4)} <= set(months)
    for name in months:
        assert parts[name][0] == "p"
        assert_in_the_new_form(engine, name)
    assert parts["events_default"][0] == "r"
    with Mnestoma(engine) as m:
        m.record_turn("t-1", [Passing("a", "1", "b", "1")])
        m.record_turn("t-2", [Passing("a", "1", "b", "1")])
    with engine.begin() as conn:
        conn.execute(
            text(PASSING_EVENT), {"m": "mn_old", "ts": now - timedelta(days=400), "t": "o"}
        )
        where = conn.execute(
            text("SELECT tableoid::regclass::text, kind FROM events ORDER BY id")
        ).all()
        turns = conn.execute(text("SELECT count(*) FROM event_turn_edges")).scalar_one()
    assert [tuple(r) for r in where] == [
        (f"{_month(now)}_created", "created"),
        (f"{_month(now)}_rest", "reinforced"),
        ("events_default", "reinforced"),
    ]
    assert turns == 3


def test_0015_on_a_populated_store_while_writers_of_the_previous_release_write(
    engine: Engine,
) -> None:
    """A store at 0014 holding events in its catch-all and in its first month, writers
    inserting into both throughout the upgrade: no writer fails, every event is kept where
    it was (its content unchanged), both partitions stay plain, the empty months ahead are
    in the new form, and each passing with a turn still has its row of event_turn_edges."""
    mnestoma.upgrade(engine, "0014")
    first = _first_month(engine)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts, turn_id)"
                " SELECT 'mn_' || g, CASE WHEN g % 3 = 0 THEN 'created' ELSE 'reinforced' END,"
                " CASE WHEN g % 2 = 0 THEN :now - g * interval '1 minute'"
                " ELSE :first + g * interval '1 minute' END, 't' || g"
                " FROM generate_series(1, 3000) g"
            ),
            {"now": now, "first": first},
        )
    digest = (
        "SELECT count(*), md5(string_agg(e::text, ',' ORDER BY id)) FROM events e WHERE id <= 3000"
    )
    with engine.connect() as conn:
        before = tuple(conn.execute(text(digest)).one())
    held = _partitions(engine)
    catch_all, first_name = f"events_to_{first:%Y%m}", f"events_{first:%Y%m}"
    assert held[catch_all] == ("r", 1500) and held[first_name] == ("r", 1500)

    def previous_release_write(i: int) -> None:
        ts = now if i % 2 == 0 else first + timedelta(days=2)  # the catch-all, the first month
        with engine.begin() as conn:
            conn.execute(
                text(PASSING_EVENT),
                {"m": f"mn_w{i}", "ts": ts, "t": f"w{i}-{time.monotonic_ns()}"},
            )

    with Writers(previous_release_write, 4) as writers:
        mnestoma.upgrade(engine, lock_timeout=0.2)
    assert current_revision(engine) == head_revision()
    assert writers.errors == [] and writers.writes > 0
    with engine.connect() as conn:
        assert tuple(conn.execute(text(digest)).one()) == before
        total = conn.execute(text("SELECT count(*) FROM events")).scalar_one()
        turns = conn.execute(text("SELECT count(*) FROM event_turn_edges")).scalar_one()
        passings = conn.execute(
            text("SELECT count(*) FROM events WHERE kind IN ('created', 'reinforced')")
        ).scalar_one()
    assert total == 3000 + writers.writes
    assert turns == passings == total
    after = _partitions(engine)
    assert after[catch_all][0] == "r" and after[first_name][0] == "r"
    assert after[catch_all][1] + after[first_name][1] == total
    for months in (1, 2, 3):
        name = _month(first, months)
        assert after[name] == ("p", 0)
        assert_in_the_new_form(engine, name)


def _stop_at(engine: Engine, pattern: str, nth: int = 1) -> None:
    """Interrupt the upgrade, once, as it is about to run the ``nth`` statement that
    matches ``pattern``."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def stop(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if len(seen) < nth and re.search(pattern, statement):
            seen.append(statement)
            if len(seen) == nth:
                raise Stopped(statement)


def _converted_layout(engine: Engine) -> dict[str, str]:
    """The partitions' names and kinds, once every empty plain one was converted."""
    return {name: kind for name, (kind, _) in _partitions(engine).items()}


# Points after the revision's first transaction (the functions) committed and before its
# stamp did.
STOPS = {
    "before any partition is converted": (r"mnestoma_events_month\('events', r\.part", 1),
    "after one partition was converted": (r"mnestoma_events_month\('events', r\.part", 2),
    "before the current months are made": (r"PERFORM mnestoma_events_partitions\(now\(\)", 1),
    "before the stamp": (r"UPDATE mnestoma_alembic_version", 1),
}


@pytest.mark.parametrize("where", list(STOPS))
def test_0015_stopped_halfway_is_completed_by_the_next_run(
    engine: Engine, pg_empty_db_url: str, where: str
) -> None:
    """Wherever the revision stopped, the store is still at 0014, usable, and the next
    upgrade reaches head with the layout a run without a stop leaves."""
    mnestoma.upgrade(engine, "0014")
    first = _first_month(engine)
    with engine.begin() as conn:  # the first month holds a row: it stays plain
        conn.execute(text(PASSING_EVENT), {"m": "mn_a", "ts": first, "t": "t-a"})
    pattern, nth = STOPS[where]
    _stop_at(engine, pattern, nth)
    with pytest.raises(Stopped):
        mnestoma.upgrade(engine)
    assert current_revision(engine) == "0014"
    with engine.begin() as conn:  # a writer of the previous release goes on meanwhile
        conn.execute(text(PASSING_EVENT), {"m": "mn_b", "ts": first, "t": "t-b"})
    mnestoma.upgrade(engine)
    assert current_revision(engine) == head_revision()
    layout = _converted_layout(engine)
    assert f"events_to_{first:%Y%m}" not in layout  # empty: dropped
    assert layout[f"events_{first:%Y%m}"] == "r"  # holds rows: plain
    for months in (1, 2, 3):
        assert layout[_month(first, months)] == "p"
    assert sum(n for _, n in _partitions(engine).values()) == 2


def test_0015_run_again_over_head_changes_nothing(engine: Engine) -> None:
    """Every step of the revision, run again over a store at head, leaves it as it is."""
    from alembic.script import ScriptDirectory

    from mnestoma.maintenance.migration import alembic_config

    module = ScriptDirectory.from_config(alembic_config()).get_revision("0015").module
    mnestoma.upgrade(engine)
    layout = _converted_layout(engine)
    with engine.begin() as conn:
        for statement in (module.MONTH, module.PARTITIONS, module.convert(), module.MAKE_MONTHS):
            conn.execute(text(statement))
    assert _converted_layout(engine) == layout


def _psql(url: str, sql: str) -> subprocess.CompletedProcess[str]:
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", libpq],
        input=sql, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_0015_script_run_with_psql_twice_reaches_0015(
    engine: Engine, pg_empty_db_url: str
) -> None:
    """The ``db sql`` script of 0015 (every empty partition in one statement) converts them
    and stamps 0015; run again, it changes nothing."""
    mnestoma.upgrade(engine, "0014")
    first = _first_month(engine)
    script = offline_sql("postgresql://", "0014:0015")
    for _ in range(2):
        done = _psql(pg_empty_db_url, script)
        assert done.returncode == 0, done.stderr
        assert current_revision(engine) == "0015"
        layout = _converted_layout(engine)
        assert f"events_to_{first:%Y%m}" not in layout
        assert all(kind == "p" for name, kind in layout.items() if name != "events_default")


def test_the_downgrade_keeps_every_event_in_plain_partitions_and_up_again(
    engine: Engine,
) -> None:
    """Events in months of the new form and in what retention kept of them: down to 0014
    every event is kept (content and turns), every partition plain, one of everything
    before; up again, the same."""
    mnestoma.upgrade(engine)
    clock = MovableClock(datetime(2038, 1, 10, tzinfo=UTC))
    with Mnestoma(engine, clock=clock) as m:
        for month in (1, 2, 3):
            clock.set(datetime(2038, month, 10, tzinfo=UTC))
            m.record_turn(f"t-{month}", [Passing("a", "1", "b", "1"), Passing("b", "1", "c", "1")])
        m.prune_events(datetime(2038, 2, 1, tzinfo=UTC))  # January kept under events_to_203802
    digest = (
        "SELECT count(*), md5(string_agg(e::text, ',' ORDER BY id)),"
        " (SELECT count(*) FROM event_turn_edges) FROM events e"
    )
    with engine.connect() as conn:
        before = tuple(conn.execute(text(digest)).one())
    assert _converted_layout(engine)["events_to_203802"] == "p"
    mnestoma.downgrade(engine, "0014")
    with engine.connect() as conn:
        assert tuple(conn.execute(text(digest)).one()) == before
        month_fn = text("SELECT to_regproc('mnestoma_events_month')")
        assert conn.execute(month_fn).scalar() is None
    layout = _converted_layout(engine)
    assert set(layout.values()) == {"r"}
    assert layout["events_to_203802"] == "r"
    mnestoma.upgrade(engine)
    with engine.connect() as conn:
        assert tuple(conn.execute(text(digest)).one()) == before
