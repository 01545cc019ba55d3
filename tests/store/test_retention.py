"""Event retention (contract §10): prune_events deletes the events older than a cutoff, online
and in batches; each mnest still in the store keeps its created event; a dry run changes
nothing; a replayed turn whose events are gone counts again; the command line and the status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cli_kit import run
from sqlalchemy import Engine, event, func, select, text

from mnestoma import InvalidInput, Mnestoma, UnitOfWork, make_engine, make_session_factory
from mnestoma.core import rules
from mnestoma.core.rules import PASSING, EventKind
from mnestoma.doors import asynchronous as async_door
from mnestoma.doors import sync as sync_door
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines.locking import saying_it_waits, waiting_file
from mnestoma.maintenance.retention import prunable_event_ids, prune_event_batch
from mnestoma.maintenance.status import collect_status, render_status
from mnestoma.maintenance.steps import Step, Write
from mnestoma.schema.models import Event
from mnestoma.schema.sql.tables import EVENTS
from mnestoma.testing.clock import MovableClock

DAY = timedelta(days=1)


def history(store: Mnestoma, clock: MovableClock) -> datetime:
    """A store whose events span 121 days: a live edge reinforced early, a proto the ager
    prunes, an active row merged into its decaying twin, a demotion, a late passing.
    Returns the first instant."""
    t0 = clock()
    store.record_passing("a", "1", "b", "1", turn_id="t1")  # created (A)
    store.record_proto("a", "1", "c")  # created (P), pruned by the ager at t0+120
    x = store.record_passing("x", "1", "y", "1")  # created (X)
    store.transition_state(x.id, "decaying")  # transition (X)
    clock.advance(days=1)
    store.record_passing("a", "1", "b", "1", turn_id="t2")  # reinforced (A)
    store.record_passing("x", "1", "y", "1")  # created (X2), merged into X at t0+120
    clock.advance(days=119)
    store.apply_ager()  # A demoted, P pruned, X2 merged into X
    clock.advance(days=1)
    store.record_passing("a", "1", "b", "1", turn_id="t3")  # created (A2)
    settle(store.engine)
    return t0


def settle(engine: Engine) -> None:
    """PostgreSQL: the catalogue's counts of the rows of events made exact (ANALYZE reads
    every row of a small table). A prune counts the events of the months it drops whole
    from them (contract §12), so that its count is the rule's only once they are."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as conn:
        conn.execute(text("ANALYZE events"))
        conn.commit()


def rows(store: Mnestoma) -> list[dict[str, Any]]:
    """Every event, every column."""
    return [e.as_dict() for e in store.events()]


def live_ids(store: Mnestoma) -> set[str]:
    return {m.id for m in store.edges()}


def prunable(events: list[Event], live: set[str], cutoff: datetime) -> set[int]:
    """The ids of the events a prune at ``cutoff`` must delete, from the rule itself."""
    return {
        e.id
        for e in events
        if e.ts < cutoff and not (e.kind == EventKind.CREATED and e.mnest_id in live)
    }


# --- what is deleted ------------------------------------------------------------------------


def test_prune_deletes_the_events_before_the_cutoff_and_returns_how_many(
    store: Mnestoma, clock: MovableClock
) -> None:
    t0 = history(store, clock)
    before = store.events()
    cutoff = t0 + 60 * DAY
    expected = prunable(before, live_ids(store), cutoff)
    # the reinforcement and the demotion of A's first row, P's and X2's created events
    assert len(expected) == 4

    assert store.prune_events(cutoff) == 4

    after = {e.id for e in store.events()}
    assert after == {e.id for e in before} - expected
    assert all(e.ts >= cutoff for e in store.events() if e.kind != EventKind.CREATED)


def test_each_live_mnest_keeps_its_created_event_and_gone_rows_lose_theirs(
    store: Mnestoma, clock: MovableClock
) -> None:
    history(store, clock)
    live = live_ids(store)
    gone = {e.mnest_id for e in store.events()} - live
    assert gone  # the pruned proto and the merged-away active row

    store.prune_events(clock() + DAY)  # every event is older than that

    remaining = store.events()
    assert Counter(e.mnest_id for e in remaining) == Counter(dict.fromkeys(live, 1))
    assert {e.kind for e in remaining} == {EventKind.CREATED}
    assert not gone & {e.mnest_id for e in remaining}


def test_a_second_prune_at_the_same_cutoff_deletes_nothing(
    store: Mnestoma, clock: MovableClock
) -> None:
    t0 = history(store, clock)
    assert store.prune_events(t0 + 60 * DAY) == 4
    assert store.prune_events(t0 + 60 * DAY) == 0


def test_a_dry_run_counts_what_a_prune_would_delete_and_changes_nothing(
    store: Mnestoma, clock: MovableClock
) -> None:
    t0 = history(store, clock)
    before = rows(store)

    assert store.prune_events(t0 + 60 * DAY, dry_run=True) == 4

    assert rows(store) == before
    assert store.prune_events(t0 + 60 * DAY) == 4


def test_a_dry_run_takes_no_write_lock(store: Mnestoma, clock: MovableClock) -> None:
    t0 = history(store, clock)
    writes: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith(("DELETE", "INSERT", "UPDATE")):
            writes.append(statement)

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        store.prune_events(t0 + 60 * DAY, dry_run=True)
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert writes == []


@pytest.mark.parametrize(
    "cutoff", [datetime(2026, 1, 1), "2026-01-01", 1_700_000_000, datetime(999, 1, 1, tzinfo=UTC)]
)
def test_a_cutoff_that_is_not_an_aware_instant_the_store_holds_is_invalid_input(
    store: Mnestoma, clock: MovableClock, cutoff: Any
) -> None:
    history(store, clock)
    before = rows(store)
    with pytest.raises(InvalidInput):
        store.prune_events(cutoff)
    with pytest.raises(InvalidInput):
        store.prune_events(cutoff, dry_run=True)
    assert rows(store) == before


def test_dry_run_must_be_a_bool(store: Mnestoma, clock: MovableClock) -> None:
    with pytest.raises(InvalidInput):
        store.prune_events(clock(), dry_run="yes")  # type: ignore[arg-type]


def test_a_cutoff_in_another_zone_is_the_same_instant(store: Mnestoma, clock: MovableClock) -> None:
    t0 = history(store, clock)
    east = (t0 + 60 * DAY).astimezone(ZoneInfo("Asia/Tokyo"))
    west = (t0 + 60 * DAY).astimezone(ZoneInfo("America/Los_Angeles"))
    assert store.prune_events(east, dry_run=True) == 4
    assert store.prune_events(west) == 4


# --- in a unit of work ----------------------------------------------------------------------


def test_the_repository_prunes_in_the_units_transaction_and_rolls_back_without_commit(
    store: Mnestoma, clock: MovableClock
) -> None:
    t0 = history(store, clock)
    before = rows(store)
    factory = make_session_factory(store.engine)
    with UnitOfWork(factory, clock=clock) as uow:
        assert uow.mnests.prune_events(t0 + 60 * DAY) == 4
    assert rows(store) == before
    with UnitOfWork(factory, clock=clock) as uow:
        assert uow.mnests.prune_events(t0 + 60 * DAY) == 4
        uow.commit()
    assert len(store.events()) == len(before) - 4


# --- batches --------------------------------------------------------------------------------


def test_with_a_small_batch_size_the_prune_commits_batch_after_batch(
    store: Mnestoma, clock: MovableClock, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before each batch's DELETE, another connection already sees the earlier batches'
    deletions: each batch committed before the next began."""
    for i in range(12):
        store.record_passing("a", "1", f"b{i}", "1")
        store.record_passing("a", "1", f"b{i}", "1")  # a reinforcement: prunable
    clock.advance(days=10)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 5)
    beside = make_engine(store_url)
    count = select(func.count()).select_from(EVENTS)
    seen: list[int] = []

    def before_delete(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM EVENTS"):
            with beside.connect() as other:
                seen.append(other.execute(count).scalar_one())

    event.listen(store.engine, "before_cursor_execute", before_delete)
    try:
        assert store.prune_events(clock()) == 12
    finally:
        event.remove(store.engine, "before_cursor_execute", before_delete)
        beside.dispose()
    assert len(seen) == 5  # ids 1..24 (the prunable ones: 2..24) in batches of 5 ids
    assert seen == sorted(seen, reverse=True) and seen[0] > seen[-1]
    assert seen[0] == 24 and len(store.events()) == 12


def _twelve_prunable(store: Mnestoma, clock: MovableClock) -> None:
    for i in range(12):
        store.record_passing("a", "1", f"b{i}", "1")
        store.record_passing("a", "1", f"b{i}", "1")  # a reinforcement: prunable
    clock.advance(days=10)


def test_a_prune_reports_its_progress_batch_by_batch(
    store: Mnestoma, clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(batches done, batches in all, events deleted so far): once the batches are known,
    then after each; the last call's count is what the prune returns."""
    _twelve_prunable(store, clock)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 5)
    calls: list[tuple[int, int, int]] = []
    deleted = store.prune_events(clock(), progress=lambda *a: calls.append(a))
    assert [(done, total) for done, total, _ in calls] == [(i, 5) for i in range(6)]
    counts = [n for _, _, n in calls]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == deleted == 12


def test_the_async_door_reports_a_prunes_progress_too(
    store: Mnestoma, clock: MovableClock, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _twelve_prunable(store, clock)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 5)
    calls: list[tuple[int, int, int]] = []

    async def main() -> int:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            return await am.prune_events(clock(), progress=lambda *a: calls.append(a))

    assert asyncio.run(main()) == 12
    assert calls[0] == (0, 5, 0) and calls[-1] == (5, 5, 12) and len(calls) == 6


def test_a_progress_that_cannot_be_called_is_refused_before_anything_is_deleted(
    store: Mnestoma, clock: MovableClock, store_url: str
) -> None:
    _twelve_prunable(store, clock)
    before = len(store.events())
    with pytest.raises(InvalidInput, match=r"progress must be a function of \(done, total, del"):
        store.prune_events(clock(), progress=5)  # type: ignore[arg-type]

    async def main() -> None:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.prune_events(clock(), progress="bar")  # type: ignore[arg-type]

    with pytest.raises(InvalidInput, match="progress must be a function"):
        asyncio.run(main())
    assert len(store.events()) == before


def test_batches_cover_the_id_range_of_the_prunable_events() -> None:
    assert list(rules.event_batches((3, 14), 5)) == [(3, 7), (8, 12), (13, 14)]
    assert list(rules.event_batches((7, 7), 5)) == [(7, 7)]
    assert list(rules.event_batches(None, 5)) == []
    assert list(rules.event_batches((1, 3))) == [(1, 3)]  # the default size


# --- writers during a prune -----------------------------------------------------------------


def uses_are_explained(store: Mnestoma, pruned_passings: Counter[str]) -> None:
    """Each row's uses are its passing events still here plus those the prune deleted."""
    present = Counter(e.mnest_id for e in store.events() if e.kind in PASSING)
    for m in store.edges():
        assert m.uses == present[m.id] + pruned_passings[m.id], m


def what(e: Event) -> tuple[Any, ...]:
    """An event by what it says (SQLite gives the ids of the newest events pruned again)."""
    return (e.mnest_id, e.kind, e.ts, e.turn_id)


def old_passings(store: Mnestoma, clock: MovableClock, edges: int, rounds: int) -> None:
    for r in range(rounds):
        for i in range(edges):
            store.record_passing("s", "1", f"d{i}", "1", turn_id=f"old{r}")
        clock.advance(hours=1)


def old_store_to_prune(
    store: Mnestoma, clock: MovableClock, *, edges: int, rounds: int
) -> tuple[datetime, list[Event], set[int], Counter[str]]:
    """Old passings on ``edges`` edges, then 5 days: the cutoff (now), the events, the ids
    a prune at the cutoff deletes, and how many passings it deletes per mnest."""
    old_passings(store, clock, edges=edges, rounds=rounds)
    clock.advance(days=5)
    cutoff = clock()
    before = store.events()
    doomed = prunable(before, live_ids(store), cutoff)
    pruned = Counter(e.mnest_id for e in before if e.id in doomed and e.kind in PASSING)
    return cutoff, before, doomed, pruned


def test_passings_recorded_between_batches_are_all_kept(
    store: Mnestoma, clock: MovableClock, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cutoff, before, doomed, pruned = old_store_to_prune(store, clock, edges=6, rounds=5)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 4)
    monkeypatch.setattr(rules, "BATCH_PAUSE_S", 0.0)
    writer = Mnestoma(store_url, clock=clock)
    step = store._step
    written: list[int] = []

    def batch_then_a_writer(s: Step) -> Any:
        n = step(s)
        if isinstance(s, Write) and getattr(s.work, "func", None) is prune_event_batch:
            i = len(written)
            writer.record_passing("s", "1", f"d{i % 6}", "1", turn_id=f"new{i}")
            writer.record_passing("s", "1", f"n{i}", "1")  # a new edge too
            written.append(i)
        return n

    monkeypatch.setattr(store, "_step", batch_then_a_writer)
    try:
        assert store.prune_events(cutoff) == len(doomed)
    finally:
        writer.close()
    assert len(written) > 3
    old = {what(e) for e in store.events() if e.ts < cutoff}
    assert old == {what(e) for e in before if e.id not in doomed}
    new = [e for e in store.events() if e.ts >= cutoff]
    assert len(new) == 2 * len(written)
    uses_are_explained(store, pruned)


def test_a_writer_in_another_thread_loses_nothing_while_a_prune_runs(
    store: Mnestoma, clock: MovableClock, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cutoff, before, doomed, pruned = old_store_to_prune(store, clock, edges=20, rounds=6)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 3)
    done = threading.Event()
    writing = threading.Event()
    recorded: list[str] = []
    failures: list[BaseException] = []

    def write() -> None:
        with Mnestoma(store_url, clock=clock) as writer:
            i = 0
            while not done.is_set() or i < 5:
                try:
                    writer.record_passing("s", "1", f"d{i % 20}", "1", turn_id=f"w{i}")
                except BaseException as err:  # the test fails on any
                    failures.append(err)
                    return
                recorded.append(f"w{i}")
                writing.set()
                i += 1

    at_batches: list[int] = []

    def batch_starts(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM EVENTS"):
            at_batches.append(len(recorded))
            # a PostgreSQL batch takes a few ms on a quiet machine: on a busy one the whole
            # prune could end before the writer's next call, whatever the code does
            time.sleep(0.005)

    event.listen(store.engine, "before_cursor_execute", batch_starts)
    thread = threading.Thread(target=write)
    thread.start()
    try:
        assert writing.wait(30), "the writer never recorded"
        deleted = store.prune_events(cutoff)
    finally:
        done.set()
        thread.join(60)
        event.remove(store.engine, "before_cursor_execute", batch_starts)
    assert not failures
    assert deleted == len(doomed)
    # the writer got in between the batches, not only before or after the prune
    assert at_batches[-1] > at_batches[0], at_batches
    old = {what(e) for e in store.events() if e.ts < cutoff}
    assert old == {what(e) for e in before if e.id not in doomed}
    turns = {e.turn_id for e in store.events() if e.ts >= cutoff}
    assert turns == set(recorded)
    uses_are_explained(store, pruned)


# --- replays --------------------------------------------------------------------------------


def test_a_replayed_turn_whose_events_were_pruned_counts_again(
    store: Mnestoma, clock: MovableClock
) -> None:
    store.record_turn("t1", [("a", "1", "b", "1")])  # creates the edge
    store.record_turn("t2", [("a", "1", "b", "1")])  # reinforces it
    assert store.record_turn("t2", [("a", "1", "b", "1")])[0].uses == 2  # a replay: no-op
    clock.advance(days=30)
    store.prune_events(clock() - DAY)

    assert store.record_turn("t2", [("a", "1", "b", "1")])[0].uses == 3


def test_a_replayed_turn_that_created_a_live_edge_still_counts_once(
    store: Mnestoma, clock: MovableClock
) -> None:
    """The created event (with its turn id) stays while the row lives, and with it the
    turn's once-per-edge rule."""
    store.record_turn("t1", [("a", "1", "b", "1")])
    clock.advance(days=30)
    store.prune_events(clock() - DAY)

    assert store.record_turn("t1", [("a", "1", "b", "1")])[0].uses == 1


# --- the async door -------------------------------------------------------------------------


def test_the_async_door_prunes_in_batches_and_dry_runs(
    store: Mnestoma, clock: MovableClock, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = history(store, clock)
    before = store.events()
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 2)

    async def main() -> tuple[int, int, int]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            dry = await am.prune_events(t0 + 60 * DAY, dry_run=True)
            unchanged = len(await am.events())
            done = await am.prune_events(t0 + 60 * DAY)
            return dry, unchanged, done

    assert asyncio.run(main()) == (4, len(before), 4)
    assert len(store.events()) == len(before) - 4


def test_the_async_repository_prunes_in_its_units_transaction(
    store: Mnestoma, clock: MovableClock, store_url: str
) -> None:
    t0 = history(store, clock)
    before = rows(store)

    async def main() -> tuple[int, int, int]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            async with am.unit_of_work() as uow:
                counted = await uow.mnests.prune_events(t0 + 60 * DAY, dry_run=True)
                dropped = await uow.mnests.prune_events(t0 + 60 * DAY)  # not committed
            async with am.unit_of_work() as uow:
                span = await uow.session.run_sync(prunable_event_ids, t0 + 60 * DAY)
                assert span is not None
                done = await uow.session.run_sync(prune_event_batch, t0 + 60 * DAY, *span)
                await uow.commit()
            return counted, dropped, done

    assert asyncio.run(main()) == (4, 4, 4)
    assert len(rows(store)) == len(before) - 4


def test_the_async_door_refuses_a_naive_cutoff(store_url: str, clock: MovableClock) -> None:
    async def main() -> None:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.prune_events(datetime(2026, 1, 1))

    with pytest.raises(InvalidInput):
        asyncio.run(main())


# --- the command line -----------------------------------------------------------------------


@pytest.fixture
def old_store(store_url: str) -> str:
    """A store whose passings were recorded in 2020 (older than any --older-than here)."""
    clock = MovableClock(datetime(2020, 1, 1, tzinfo=UTC))
    with Mnestoma(store_url, clock=clock) as m:
        for _ in range(3):
            m.record_passing("a", "1", "b", "1")
        clock.advance(days=10)
        m.record_passing("a", "1", "b", "1")
        settle(m.engine)
    return store_url


def event_count(url: str) -> int:
    with Mnestoma(url) as m:
        return len(m.events())


def test_cli_prune_events_before_a_date_deletes_and_says_how_many(old_store: str) -> None:
    result = run("prune-events", "--before", "2020-01-05", "--database-url", old_store)
    assert result.exit_code == 0, result.output
    assert result.output == "deleted 2 events before 2020-01-05 00:00:00Z\n"
    assert event_count(old_store) == 2


def test_cli_before_takes_a_datetime_with_or_without_a_zone(old_store: str) -> None:
    naive = run("prune-events", "--before", "2020-01-05T01:00", "--json", "--dry-run",
                "--database-url", old_store)  # fmt: skip
    zoned = run("prune-events", "--before", "2020-01-05T03:00+02:00", "--json", "--dry-run",
                "--database-url", old_store)  # fmt: skip
    assert json.loads(naive.output)["before"] == "2020-01-05T01:00:00Z"
    assert json.loads(zoned.output)["before"] == "2020-01-05T01:00:00Z"


def test_cli_older_than_counts_back_from_now(old_store: str) -> None:
    result = run("prune-events", "--older-than", "1.5", "--json", "--database-url", old_store)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["events"] == 3 and data["dry_run"] is False
    assert isinstance(data["estimated"], bool)  # PostgreSQL: see test_retention_by_month.py
    before = datetime.fromisoformat(data["before"])
    assert abs(datetime.now(UTC) - timedelta(days=1.5) - before) < timedelta(minutes=5)
    assert event_count(old_store) == 1


def test_cli_dry_run_says_what_it_would_delete_and_deletes_nothing(old_store: str) -> None:
    text = run("prune-events", "--older-than", "30", "--dry-run", "--database-url", old_store)
    assert text.exit_code == 0, text.output
    assert text.output.startswith("would delete 3 events before ")
    assert "dry run: nothing deleted" in text.output
    as_json = run("prune-events", "--older-than", "30", "--dry-run", "--json",
                  "--database-url", old_store)  # fmt: skip
    assert json.loads(as_json.output)["events"] == 3
    assert json.loads(as_json.output)["dry_run"] is True
    assert event_count(old_store) == 4


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--before", "2020-01-05", "--older-than", "3"],
        ["--before", "yesterday"],
        ["--before", "0999-01-01"],
        ["--older-than", "0"],
        ["--older-than", "-2"],
        ["--older-than", "nan"],
        ["--older-than", "inf"],
        ["--older-than", "1e300"],
        ["--older-than", "many"],
    ],
)
def test_cli_bad_input_exits_2_and_deletes_nothing(old_store: str, args: list[str]) -> None:
    result = run("prune-events", *args, "--database-url", old_store)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert event_count(old_store) == 4


def test_cli_prune_events_on_a_terminal_shows_its_batches_and_count_then_clears_them(
    old_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnestoma.cli import progress

    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 1)
    result = run("prune-events", "--before", "2020-01-20", "--database-url", old_store)
    assert result.exit_code == 0, result.output
    assert result.stdout == "deleted 3 events before 2020-01-20 00:00:00Z\n"
    drawn = [part.strip() for part in result.stderr.split("\r") if part.strip()]
    assert drawn[0].startswith("pruning events: batch 0/3, 0 events deleted (")
    assert drawn[-1].startswith("pruning events: batch 3/3, 3 events deleted (")
    assert result.stderr.endswith("\r") and result.stderr.rsplit("\r", 2)[-2].strip() == ""


def test_cli_prune_events_off_a_terminal_draws_nothing(
    old_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnestoma.cli import progress

    monkeypatch.setattr(progress, "SPINNER_DELAY_S", 0.0)  # would draw at once on a terminal
    result = run("prune-events", "--before", "2020-01-20", "--database-url", old_store)
    assert result.exit_code == 0 and result.stderr == ""


def test_cli_prune_events_help_names_its_options() -> None:
    result = run("prune-events", "--help")
    assert result.exit_code == 0
    for option in ("--before", "--older-than", "--dry-run", "--json", "--database-url"):
        assert option in result.output


# --- status ---------------------------------------------------------------------------------


def test_status_says_from_when_every_event_is_kept(
    store: Mnestoma, clock: MovableClock, store_url: str
) -> None:
    t0 = history(store, clock)
    st = collect_status(store_url)
    assert st.oldest_event == t0
    assert st.events_kept_from == t0  # X's demotion, the first event that is not a creation

    store.prune_events(t0 + 60 * DAY)

    st = collect_status(store_url)
    assert st.oldest_event == t0  # the created events of live rows
    assert st.events_kept_from == t0 + 120 * DAY  # the ager's run
    text = render_status(st)
    assert "kept       every event since 2026-05-01 12:00:00Z; before it only created events, " \
        "from 2026-01-01 12:00:00Z" in text  # fmt: skip
    data = json.loads(run("status", "--json", "--database-url", store_url).output)
    assert data["events_kept_from"] == "2026-05-01T12:00:00Z"
    assert data["oldest_event"] == "2026-01-01T12:00:00Z"


def test_status_of_a_store_with_only_created_events_says_so(
    store: Mnestoma, clock: MovableClock, store_url: str
) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    clock.advance(days=3)
    store.prune_events(clock())
    st = collect_status(store_url)
    assert st.events_kept_from is None
    text = render_status(st)
    assert "kept       only created events, the oldest at 2026-01-01 12:00:00Z" in text


def test_a_prunes_batches_from_an_instant_on_leave_the_events_before_it(
    store: Mnestoma, clock: MovableClock, store_url: str
) -> None:
    """What retention runs after dropping whole months: the range and the batches of the
    prunable events from ``since`` on (before it lies only what the drop kept)."""
    cutoff, before, doomed, _ = old_store_to_prune(store, clock, edges=4, rounds=3)
    times = sorted({e.ts for e in before if e.id in doomed})
    since = times[len(times) // 2]
    later = {e.id for e in before if e.id in doomed and e.ts >= since}
    assert later and later != doomed
    engine = make_engine(store_url)
    try:
        with UnitOfWork(make_session_factory(engine)) as uow:
            found = prunable_event_ids(uow.session, cutoff, since=since)
            assert found == (min(later), max(later))
            assert prune_event_batch(uow.session, cutoff, 0, 10**9, since=since) == len(later)
            uow.commit()
    finally:
        engine.dispose()
    left = {e.id for e in store.events()}
    assert left & doomed == doomed - later


# --- writers that wait between two batches ------------------------------------------------


@pytest.mark.parametrize("door", ["sync", "async"])
def test_a_prunes_pause_between_batches_lasts_while_a_write_says_that_it_waits(
    store: Mnestoma,
    clock: MovableClock,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    door: str,
) -> None:
    """SQLite: after each batch the prune pauses BATCH_PAUSE_S in sleeps of
    AGER_YIELD_POLL_S, and for as long as a write of the package says that it waits for
    the lock (it sleeps up to WRITE_LOCK_POLL_S between its tries, longer than the pause,
    unless the prune rings the store's doorbell). PostgreSQL: a pause of nothing, whatever
    waits (a writer's rows never wait for a batch)."""
    _twelve_prunable(store, clock)
    monkeypatch.setattr(rules, "EVENT_PRUNE_BATCH", 5)
    waiting = contextlib.ExitStack()
    waiting.enter_context(saying_it_waits(waiting_file(store.engine.url)))
    slept: list[float] = []
    real_sleep, real_async_sleep = time.sleep, asyncio.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            waiting.close()  # the write has the lock: no longer waits
        real_sleep(seconds)

    async def async_sleep(seconds: float) -> None:
        sleep(seconds)
        await real_async_sleep(0)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(asyncio, "sleep", async_sleep)
    lasted: list[float] = []  # each pause, by the clock (how many sleeps fill it varies)
    for module in (sync_door, async_door):
        monkeypatch.setattr(module, "pauses_letting_writers_in", _timed_pauses(module, lasted))

    async def pruned_async() -> int:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            return await am.prune_events(clock())

    try:
        deleted = store.prune_events(clock()) if door == "sync" else asyncio.run(pruned_async())
    finally:
        waiting.close()
    assert deleted == 12
    assert len(lasted) == 4
    if store.engine.dialect.name == "sqlite":
        poll = rules.AGER_YIELD_POLL_S
        assert slept[:3] == [poll] * 3  # the write said it waits, then took the lock
        assert all(0 < s <= poll for s in slept)
        assert all(seconds >= rules.BATCH_PAUSE_S for seconds in lasted)
    else:
        assert slept == [0.0] * 4


def _timed_pauses(module: Any, lasted: list[float]) -> Any:
    """``module``'s pauses between batches, each one's length by the clock noted in
    ``lasted`` once it is over."""
    real = module.pauses_letting_writers_in

    def timed(url: Any, seconds: float) -> Iterator[float]:
        started = time.monotonic()
        yield from real(url, seconds)
        lasted.append(time.monotonic() - started)

    return timed
