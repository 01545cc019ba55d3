"""Retention on PostgreSQL drops the months in the form of revision 0015 without reading
them (contract §12): their ``created`` leaves kept under the partition of everything before,
the rest dropped with its table, the count from the catalogue and said "about"; plain
partitions from before 0015 still take the path that copies what they keep; every lock it
takes is waited for briefly and tried again.

Each test builds a store of its own (a new database migrated to head): the shared one keeps
the partitions other tests made, and these tests are about which partitions there are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from cli_kit import run
from conftest import mnest_row
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.pool import NullPool

import mnestoma
from mnestoma import ConflictError, Mnestoma
from mnestoma.engines import partitions
from mnestoma.engines.partitions import forget_partitions
from mnestoma.maintenance import retention
from mnestoma.maintenance.migration import is_store_name
from mnestoma.schema.sql.tables import MNESTS
from mnestoma.testing.clock import MovableClock

JAN = datetime(2037, 1, 1, tzinfo=UTC)
FEB = datetime(2037, 2, 1, tzinfo=UTC)
MAR = datetime(2037, 3, 1, tzinfo=UTC)
APR = datetime(2037, 4, 1, tzinfo=UTC)
RAW_EVENTS = (
    "INSERT INTO events (mnest_id, kind, ts, turn_id)"
    " SELECT :m, 'reinforced', :t0 + g * interval '1 minute', :turn || g"
    " FROM generate_series(1, :n) g"
)


@pytest.fixture
def store_at_head(pg_empty_db_url: str) -> Iterator[str]:
    """A new PostgreSQL store at head: no partition of the past, months in 0015's form."""
    mnestoma.upgrade(pg_empty_db_url)
    yield pg_empty_db_url
    forget_partitions()


@pytest.fixture
def admin(store_at_head: str) -> Iterator[Engine]:
    """The test's own engine on the store (no pool: each connection ends when closed)."""
    engine = create_engine(store_at_head, poolclass=NullPool)
    yield engine
    engine.dispose()


def _tree(engine: Engine) -> dict[str, tuple[str, str, str]]:
    """Every table of the partitions of events: its parent, kind and bound."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT t.relid::text, coalesce(t.parentrelid::text, ''), c.relkind::text,"
                " coalesce(pg_get_expr(c.relpartbound, c.oid), '')"
                " FROM pg_partition_tree('events') t JOIN pg_class c ON c.oid = t.relid"
            )
        )
        return {name: (parent, kind, bound) for name, parent, kind, bound in rows}


def _exists(engine: Engine, name: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar())


def _settle(engine: Engine) -> None:
    """The catalogue's counts made exact (ANALYZE reads every row of a small table)."""
    with engine.connect() as conn:
        conn.execute(text("ANALYZE events"))
        conn.commit()


def _quiet(engine: Engine) -> None:
    """Wait until no other session is connected to the store: a session's statistics are
    in the shared ones once it has gone (it reports them as it ends)."""
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ).scalar():
            assert time.monotonic() < deadline, "another session stayed connected"
            time.sleep(0.02)


def _reads(engine: Engine, table: str) -> tuple[int, ...]:
    """How often ``table`` was read (scans, and the rows they returned), by the statistics
    of the sessions that have ended."""
    _quiet(engine)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(
            text(
                "SELECT seq_scan, seq_tup_read, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0)"
                " FROM pg_stat_user_tables WHERE relid = to_regclass(:t)"
            ),
            {"t": table},
        ).one()
        return tuple(int(n) for n in row)


def _january(url: str, admin: Engine) -> tuple[str, str]:
    """A store with a live and a gone edge created in January 2037, 3000 more passings in
    January (with turns), a passing in February and one in March; every row analysed.
    Returns the ids of the live and of the gone edge."""
    clock = MovableClock(JAN + timedelta(days=4))
    with Mnestoma(url, clock=clock) as m:
        live = m.record_passing("a", "1", "b", "1", turn_id="t-live")
        gone = m.record_passing("x", "1", "y", "1", turn_id="t-gone")
        with admin.begin() as conn:
            conn.execute(text("DELETE FROM mnests WHERE id = :id"), {"id": gone.id})
            params = {"m": live.id, "t0": JAN + timedelta(days=5), "turn": "t-jan-", "n": 3000}
            conn.execute(text(RAW_EVENTS), params)
        clock.set(FEB + timedelta(days=9))
        m.record_passing("a", "1", "b", "1", turn_id="t-feb")
        clock.set(MAR + timedelta(days=9))
        m.record_passing("a", "1", "b", "1", turn_id="t-mar")
    _settle(admin)
    return live.id, gone.id


def _kept_events(url: str) -> list[tuple[str, str, str | None]]:
    with Mnestoma(url) as m:
        return sorted((e.mnest_id, e.kind, e.turn_id) for e in m.events())


def test_a_month_is_dropped_unread_its_created_events_kept_and_its_disk_given_back(
    store_at_head: str, admin: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """January 2037 wholly before the cutoff: its ``_rest`` leaf is never read (its scans
    and rows read unchanged while the detached table waits to be dropped), the live edge's
    ``created`` event is kept under ``events_to_203702``, the gone edge's is deleted,
    ``event_turn_edges`` loses the rows of the passings dropped, and the count, from the
    catalogue (analysed: exact), is what a dry run reads."""
    url = store_at_head
    live, _ = _january(url, admin)
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        expected = m.prune_events(FEB + timedelta(days=15), dry_run=True)  # reads every row
    assert expected == 3000 + 1 + 1  # January's passings, the gone edge's created, t-feb's
    before = _reads(admin, "events_203701_rest")
    kept_back: list[str] = []
    real_drop = retention.drop_detached_partition

    def drop_later(bind: Any, name: str) -> None:
        if name == "events_203701_dropped":
            kept_back.append(name)  # its statistics are read first
            return
        real_drop(bind, name)

    monkeypatch.setattr(retention, "drop_detached_partition", drop_later)
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        assert m.prune_events(FEB + timedelta(days=15)) == expected
    assert kept_back == ["events_203701_dropped"]
    assert _reads(admin, "events_203701_rest") == before  # never read
    with admin.connect() as conn:  # the measure sees a read
        conn.execute(text("SELECT count(*) FROM events_203701_rest")).scalar()
    assert _reads(admin, "events_203701_rest") != before

    tree = _tree(admin)
    assert tree["events_to_203702"][:2] == ("events", "p")
    assert tree["events_to_203702"][2] == "FOR VALUES FROM (MINVALUE) TO ('2037-02-01 00:00:00+00')"
    assert tree["events_203701_created"][:2] == ("events_to_203702", "r")
    assert tree["events_to_203702_default"][:2] == ("events_to_203702", "r")
    assert "events_203701" not in tree and "events_203701_rest" not in tree
    assert all(is_store_name(n) for n in tree)
    left = _kept_events(url)
    assert left == [
        (live, "created", "t-live"),
        (live, "reinforced", "t-mar"),
    ]
    with admin.connect() as conn:
        turns = conn.execute(text("SELECT turn_id FROM event_turn_edges ORDER BY turn_id"))
        assert [t for (t,) in turns] == ["t-live", "t-mar"]

    # The detached month a stopped prune left is dropped by the next prune: its disk back.
    monkeypatch.setattr(retention, "drop_detached_partition", real_drop)
    assert _exists(admin, "events_203701_dropped")
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        assert m.prune_events(FEB) == 0
    assert not _exists(admin, "events_203701_dropped")
    assert not _exists(admin, "events_203701_rest")


@pytest.mark.parametrize("temporary", ["allowed", "refused"])
def test_the_created_events_of_gone_mnests_go_whether_or_not_the_role_may_make_a_temp_table(
    store_at_head: str, admin: Engine, monkeypatch: pytest.MonkeyPatch, temporary: str
) -> None:
    """The check of the kept ``created`` events gathers the ids of those to delete in a
    temporary table of the session's own schema (a table of that name elsewhere is left
    alone); a role without the ``TEMPORARY`` privilege gets the same result from the one
    ``DELETE`` it falls back to."""
    from mnestoma.schema.sql import partitions as partitions_sql

    url = store_at_head
    live, gone = _january(url, admin)
    with admin.begin() as conn:
        conn.execute(text("CREATE TABLE public.mnestoma_not_kept (id bigint)"))
        conn.execute(text("INSERT INTO public.mnestoma_not_kept VALUES (1)"))
    if temporary == "refused":
        refused = text(
            "DO $$BEGIN RAISE EXCEPTION 'permission denied to create temporary tables'"
            " USING ERRCODE = 'insufficient_privilege'; END$$"
        )
        monkeypatch.setattr(partitions_sql, "collect_not_kept", lambda kept: refused)
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        assert m.prune_events(FEB + timedelta(days=15)) == 3000 + 1 + 1
    left = _kept_events(url)
    assert (live, "created", "t-live") in left
    assert not [e for e in left if e[0] == gone]
    with admin.connect() as conn:
        kept = conn.execute(text("SELECT id FROM public.mnestoma_not_kept")).scalars().all()
    assert kept == [1]


def test_a_later_prune_nests_the_months_it_drops_under_the_kept_partition(
    store_at_head: str, admin: Engine
) -> None:
    """A second prune moves the kept partition's end on (renamed, its leaves kept), drops
    February and March the same way, and deletes the ``created`` event of an edge gone
    since the first prune: only kept rows are read."""
    url = store_at_head
    live, _ = _january(url, admin)
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        m.prune_events(FEB)
        april = m.record_passing("p", "1", "q", "1")  # created at the cutoff: kept
    with Mnestoma(url, clock=MovableClock(FEB + timedelta(days=20))) as m:
        late = m.record_passing("r", "1", "s", "1", turn_id="t-late")  # created in February
    with admin.begin() as conn:  # the live edge gone since (the ager pruned it, say)
        conn.execute(text("DELETE FROM mnests WHERE id = :id"), {"id": live})
    _settle(admin)
    with Mnestoma(url, clock=MovableClock(APR)) as m:
        expected = m.prune_events(APR, dry_run=True)
        assert expected == 3  # the gone edge's created event, t-feb's and t-mar's passings
        assert m.prune_events(APR) == expected
    tree = _tree(admin)
    assert "events_to_203702" not in tree and "events_to_203702_default" not in tree
    assert tree["events_to_203704"][2] == "FOR VALUES FROM (MINVALUE) TO ('2037-04-01 00:00:00+00')"
    for month in ("203701", "203702", "203703"):
        assert tree[f"events_{month}_created"][0] == "events_to_203704"
        assert f"events_{month}" not in tree and f"events_{month}_rest" not in tree
    assert tree["events_to_203704_default"][0] == "events_to_203704"
    assert _kept_events(url) == sorted(
        [(late.id, "created", "t-late"), (april.id, "created", None)]
    )


def test_the_command_line_says_about_when_it_counted_months_from_the_catalogue(
    store_at_head: str, admin: Engine
) -> None:
    """A cutoff inside a month prunes by batches (an exact count); past whole months, the
    months are counted from the catalogue: "about N", and ``estimated`` in JSON."""
    _january(store_at_head, admin)
    with Mnestoma(store_at_head, clock=MovableClock(APR)) as m:
        m.prune_events(JAN)  # the store's months before 2037 (empty) dropped
    inside = run("prune-events", "--before", "2037-01-10", "--database-url", store_at_head)
    assert inside.exit_code == 0, inside.output
    assert inside.output == "deleted 3001 events before 2037-01-10 00:00:00Z\n"
    whole = run("prune-events", "--before", "2037-02-01", "--json",
                "--database-url", store_at_head)  # fmt: skip
    assert whole.exit_code == 0, whole.output
    assert '"estimated": true' in whole.output
    text_run = run("prune-events", "--before", "2037-03-01", "--database-url", store_at_head)
    assert text_run.output.startswith("deleted about ")


def _legacy_store(url: str) -> tuple[datetime, list[str]]:
    """A store at 0014 with events in its catch-all and in its first month (0015 keeps both
    plain: they hold rows; the months after, empty, take 0015's form), then at head an edge
    created in the second month and passed again in the third. Returns the first month's
    start and the ids of the two mnests from 0014 still stored and of the new edge."""
    live, gone, new = (mnest_row(JAN)["id"] for _ in range(3))
    mnestoma.upgrade(url, "0014")
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            first = conn.execute(
                text(
                    "SELECT lower FROM mnestoma_events_bounds()"
                    " WHERE lower > '-infinity' ORDER BY lower LIMIT 1"
                )
            ).scalar_one()
        with engine.begin() as conn:
            for mnest, kind, ts in (
                (live, "created", first - timedelta(days=40)),  # in the catch-all
                (live, "reinforced", first - timedelta(days=39)),
                (gone, "created", first - timedelta(days=38)),
                (live, "reinforced", first + timedelta(days=3)),  # in the first month
                (new, "created", first + timedelta(days=4)),
            ):
                conn.execute(
                    text("INSERT INTO events (mnest_id, kind, ts) VALUES (:m, :k, :ts)"),
                    {"m": mnest, "k": kind, "ts": ts},
                )
    finally:
        engine.dispose()
    mnestoma.upgrade(url)
    clock = MovableClock(first + timedelta(days=40))
    with Mnestoma(url, clock=clock) as m, m.engine.begin() as conn:
        rows = [mnest_row(first, id=i, src_executor=x) for i, x in ((live, "l"), (new, "n"))]
        conn.execute(insert(MNESTS), rows)
    with Mnestoma(url, clock=clock) as m:
        edge = m.record_passing("a", "1", "b", "1", turn_id="t-second")
        clock.advance(days=30)
        m.record_passing("a", "1", "b", "1", turn_id="t-third")
    return first, [live, new, edge.id]


def test_a_prune_over_plain_partitions_and_months_of_the_new_form_is_correct(
    pg_empty_db_url: str,
) -> None:
    """The plain catch-all and first month (holding rows through 0015) take the path that
    copies what they keep; the months of 0015's form after them are dropped unread and
    nested with the plain table that path made under the kept partition. The events left
    are exactly those the rule keeps: the created events of the mnests still stored."""
    url = pg_empty_db_url
    engine = create_engine(url, poolclass=NullPool)
    try:
        first, (live, new, edge) = _legacy_store(url)
        second = (first + timedelta(days=40)).replace(day=1)
        third = (second + timedelta(days=40)).replace(day=1)
        cutoff = (third + timedelta(days=40)).replace(day=1)
        tree = _tree(engine)
        assert tree[f"events_to_{first:%Y%m}"][1] == "r"  # plain, holding rows
        assert tree[f"events_{first:%Y%m}"][1] == "r"
        assert tree[f"events_{second:%Y%m}"][1] == tree[f"events_{third:%Y%m}"][1] == "p"
        _settle(engine)
        with Mnestoma(url, clock=MovableClock(cutoff)) as m:
            expected = m.prune_events(cutoff, dry_run=True)
            assert expected == 4  # the gone mnest's created event and the three passings
            assert m.prune_events(cutoff) == expected
        assert _kept_events(url) == sorted(
            [(live, "created", None), (new, "created", None), (edge, "created", "t-second")]
        )  # fmt: skip
        tree = _tree(engine)
        final = f"events_to_{cutoff:%Y%m}"
        assert tree[final][:2] == ("events", "p")
        assert tree[f"events_to_{second:%Y%m}"][:2] == (final, "r")  # what the copy kept
        assert tree[f"events_{second:%Y%m}_created"][0] == final
        assert tree[f"events_{third:%Y%m}_created"][0] == final
        gone = (f"events_to_{first:%Y%m}_dropped", f"events_{first:%Y%m}", f"events_{second:%Y%m}")
        assert not any(n in tree or _exists(engine, n) for n in gone)
        with engine.connect() as conn:
            turns = conn.execute(text("SELECT turn_id FROM event_turn_edges")).scalars().all()
        assert turns == ["t-second"]
    finally:
        engine.dispose()
        forget_partitions()


class _Holder:
    """A transaction of another session that holds ``ACCESS SHARE`` on events (a long
    report, say) until released: retention's swap cannot have its exclusive lock."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, poolclass=NullPool)
        self.conn = self.engine.connect()
        self.conn.execute(text("SELECT count(*) FROM events"))

    def release(self) -> None:
        if self.conn.in_transaction():
            self.conn.rollback()

    def close(self) -> None:
        self.release()
        self.conn.close()
        self.engine.dispose()


def _months(admin: Engine) -> set[str]:
    return {n for n, (parent, _, _) in _tree(admin).items() if parent == "events"}


def _pauses(monkeypatch: pytest.MonkeyPatch, then: Callable[[int], None]) -> list[float]:
    """The pauses retention makes between tries, each followed by ``then(n)`` (n: tries
    that failed so far)."""
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        then(len(pauses))

    monkeypatch.setattr(partitions, "time", SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    return pauses


def test_the_swap_waits_briefly_for_a_busy_lock_and_goes_on_once_it_is_free(
    store_at_head: str, admin: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another session holds events: each try of the swap waits its short lock timeout,
    is rolled back and made again after a pause; a writer of the current month is never
    held for longer than one try; once the lock is free the prune completes."""
    _january(store_at_head, admin)
    holder = _Holder(store_at_head)
    writes: list[float] = []

    def then(failed: int) -> None:
        started = time.monotonic()
        with admin.begin() as conn:  # a writer between two tries
            conn.execute(
                text("INSERT INTO events (mnest_id, kind, ts) VALUES ('mn_w', 'reinforced', :t)"),
                {"t": APR + timedelta(days=1)},
            )
        writes.append(time.monotonic() - started)
        if failed == 3:
            holder.release()

    pauses = _pauses(monkeypatch, then)
    try:
        with Mnestoma(store_at_head, clock=MovableClock(APR)) as m:
            assert m.prune_events(FEB) > 0
    finally:
        holder.close()
    assert len(pauses) == 3 and pauses == sorted(pauses)
    assert len(writes) == 3
    assert "events_203701" not in _months(admin) and "events_to_203702" in _months(admin)


def test_a_lock_busy_through_every_try_is_a_conflict_error_and_changes_nothing(
    store_at_head: str, admin: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tries spent, the prune stops with ConflictError: the partitions, the events and
    event_turn_edges are as they were, and the prune run again once the lock is free
    drops the month."""
    _january(store_at_head, admin)
    monkeypatch.setattr(partitions, "RETENTION_LOCK_TRIES", 3)
    pauses = _pauses(monkeypatch, lambda _n: None)
    tree = _tree(admin)
    with admin.connect() as conn:
        counts = conn.execute(
            text("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM event_turn_edges)")
        ).one()
    holder = _Holder(store_at_head)
    busy = pytest.raises(ConflictError, match="lock stayed busy through 3 tries of 50ms")
    try:
        with Mnestoma(store_at_head, clock=MovableClock(APR)) as m, busy:
            m.prune_events(FEB)
    finally:
        holder.close()
    assert len(pauses) == 2
    assert _tree(admin) == tree
    with admin.connect() as conn:
        again = conn.execute(
            text("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM event_turn_edges)")
        ).one()
    assert tuple(again) == tuple(counts)
    with Mnestoma(store_at_head, clock=MovableClock(APR)) as m:
        assert m.prune_events(FEB) > 0
    assert "events_203701" not in _months(admin)


def test_the_copying_path_holds_its_partitions_only_briefly_while_a_writer_holds_them(
    pg_empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain partitions' ``SHARE`` locks (held while their kept rows are copied) are
    waited for briefly and tried again, no longer for as long as the store's lock timeout:
    a writer's open transaction on the catch-all makes the prune pause, and the prune goes
    on once it commits."""
    url = pg_empty_db_url
    try:
        first, _ = _legacy_store(url)
        writer_engine = create_engine(url, poolclass=NullPool)
        writer = writer_engine.connect()
        writer.execute(
            text("INSERT INTO events (mnest_id, kind, ts) VALUES ('mn_w', 'reinforced', :t)"),
            {"t": first - timedelta(days=20)},
        )  # ROW EXCLUSIVE on the catch-all, not committed
        released = threading.Event()

        def then(failed: int) -> None:
            if failed == 2 and not released.is_set():
                writer.commit()
                released.set()

        pauses = _pauses(monkeypatch, then)
        cutoff = (first + timedelta(days=40)).replace(day=1)
        try:
            with Mnestoma(url, clock=MovableClock(cutoff)) as m:
                m.prune_events(cutoff)
        finally:
            writer.close()
            writer_engine.dispose()
        assert released.is_set() and len(pauses) >= 2
        engine = create_engine(url, poolclass=NullPool)
        assert f"events_to_{cutoff:%Y%m}" in _tree(engine)
        engine.dispose()
    finally:
        forget_partitions()
