"""Concurrent writers, duplicate turns and the ager among writers, on SQLite and PostgreSQL.

Several processes (spawn context), each with its own ``Mnestoma(url)`` shared by several
threads, write at once. Afterwards every passing is counted exactly once, no call failed,
and every invariant of the contract holds.

CI mode is bounded (4 processes x 8 threads x 25 calls). ``pytest -m soak`` runs the soak
test (deselected by default), which repeats writers, ager and faults for
``MNESTOMA_SOAK_SECONDS`` (300); ``MNESTOMA_SOAK=1`` also makes every concurrency test run
longer.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers_proc import (
    HOT_EDGE,
    HOT_PROTO,
    ager_process,
    key_of,
    same_turn_process,
    warm_processes,
    writer_process,
)
from invariants import check_invariants, plain_engine, wait_for_other_sessions_to_end
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.engines import locking, make_engine

CTX = warm_processes()
SOAK = os.environ.get("MNESTOMA_SOAK", "") not in ("", "0")
PROCESSES = 4
THREADS = 8
CALLS = int(os.environ.get("MNESTOMA_SOAK_CALLS", "400")) if SOAK else 25
AGER_RUNS = 1_000_000 if SOAK else 400
BUDGET = 600.0 if SOAK else 20.0  # seconds of writing before a CI test stops calling
DEADLINE = 300.0


def run_children(targets: list[tuple[Any, tuple[Any, ...]]], start: Any, out: Any) -> list[dict]:
    """Start every child, release them together, collect one result each, join them. A
    child that dies without its report (a crash: its stacks are on the worker's stderr,
    see helpers_proc) fails the test at once, with every child's exit code, not after
    :data:`DEADLINE` seconds."""
    procs = [CTX.Process(target=f, args=args, daemon=True) for f, args in targets]
    for p in procs:
        p.start()
    start.set()
    results = []
    deadline = time.monotonic() + DEADLINE
    try:
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=1.0))
                continue
            except queue.Empty:
                pass
            if any(p.exitcode not in (None, 0) for p in procs):
                pytest.fail(
                    f"a child died without its report: exit codes {[p.exitcode for p in procs]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"only {len(results)} of {len(procs)} children reported in {DEADLINE}s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return results


def report_of(proc: Any, out: Any) -> dict:
    """The report ``proc`` puts on ``out``; a child that ends without one fails the test at
    once, with its exit code, instead of after :data:`DEADLINE` seconds."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive():
                break
    try:  # a report put just before the child ended may still be on its way
        return out.get(timeout=5.0)
    except queue.Empty:
        proc.join(timeout=5)
        pytest.fail(f"the child ended without its report (exit code {proc.exitcode})")


def expected_counts(results: list[dict]) -> Counter[str]:
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.get("counts", {}))
    return total


def uses_by_key(store: mnestoma.Mnestoma) -> dict[str, int]:
    """Sum of ``uses`` over every row of each key (active, decaying and proto rows alike)."""
    out: dict[str, int] = defaultdict(int)
    for m in store.edges():
        out[key_of(m.src_executor, m.src_version, m.dst_executor, m.dst_version)] += m.uses
    return dict(out)


DEADLOCKS = text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock'"
)


def deadlocks(url: str) -> int | None:
    """The server's deadlock counter for this database (PostgreSQL), else None."""
    engine = plain_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            return None
        with engine.connect() as conn:
            return int(conn.execute(DEADLOCKS).scalar_one())
    finally:
        engine.dispose()


def new_deadlocks(url: str, before: int | None, timeout: float = 30.0) -> int:
    """Deadlocks PostgreSQL detected (and the package retried) since ``before``; 0 on SQLite.

    A server process reports its pending statistics at the latest as it exits, before it
    leaves ``pg_stat_activity``: the counter is read once no other session of the database
    is left, so that every deadlock of the sessions that wrote is in it.
    """
    if before is None:
        return 0
    engine = plain_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            wait_for_other_sessions_to_end(conn, timeout)
            after = conn.execute(DEADLOCKS).scalar_one()
    finally:
        engine.dispose()
    return int(after) - before


def test_concurrent_writers_count_every_passing_exactly_once(store_url: str) -> None:
    before = deadlocks(store_url)
    start, out = CTX.Event(), CTX.Queue()
    targets = [
        (writer_process, (store_url, p, THREADS, CALLS, start, out, 0, BUDGET))
        for p in range(PROCESSES)
    ]
    results = run_children(targets, start, out)

    assert [e for r in results for e in r["errors"]] == []
    assert new_deadlocks(store_url, before) == 0
    want = expected_counts(results)
    per_thread = sum(3 if i % 4 == 3 else 1 for i in range(CALLS))
    assert sum(want.values()) == PROCESSES * THREADS * per_thread, "a writer ran out of time"
    with mnestoma.Mnestoma(store_url) as store:
        rows = store.edges()
        got = uses_by_key(store)
        counted = [e for e in store.events() if e.kind in ("created", "reinforced")]
    assert got == dict(want)
    assert len(counted) == sum(want.values())
    assert [m.state for m in rows if m.dst_version is None] == ["proto"]
    assert len({(m.src_executor, m.dst_executor, m.dst_version) for m in rows}) == len(rows)
    hot = next(m for m in rows if (m.src_executor, m.dst_executor) == HOT_EDGE[::2])
    assert hot.uses == want[key_of(*HOT_EDGE)] > 0
    assert want[key_of(*HOT_PROTO)] > 0
    check_invariants(store_url)


def test_the_same_turn_recorded_by_two_processes_at_once_counts_once(store_url: str) -> None:
    turns = 40
    start, out = CTX.Event(), CTX.Queue()
    targets = [(same_turn_process, (store_url, p, turns, start, out)) for p in range(2)]
    results = run_children(targets, start, out)

    assert [e for r in results for e in r["errors"]] == []
    with mnestoma.Mnestoma(store_url) as store:
        got = uses_by_key(store)
        events = store.events()
    want: Counter[str] = Counter()
    for n in range(turns):
        want[key_of("a", "1", f"b{n % 5}", "1")] += 1
        want[key_of("a", "1", "hub", "1")] += 1
        want[key_of("a", "1", f"w{n % 3}", None)] += 1
    assert got == dict(want)
    per_turn = Counter(e.turn_id for e in events if e.kind in ("created", "reinforced"))
    assert per_turn == {f"turn-{n}": 3 for n in range(turns)}
    check_invariants(store_url)


def test_the_ager_among_writers_loses_no_reinforcement_and_its_reports_add_up(
    store_url: str,
) -> None:
    before = deadlocks(store_url)
    start, stop, out, ager_out = CTX.Event(), CTX.Event(), CTX.Queue(), CTX.Queue()
    ran = CTX.Event()  # the writers go on until the ager has run twice among them
    writers = 3
    ager = CTX.Process(
        target=ager_process,
        args=(store_url, 60.0, start, stop, ager_out, AGER_RUNS, BUDGET, ran),
        daemon=True,
    )
    ager.start()
    targets = [
        (writer_process, (store_url, p, THREADS, CALLS, start, out, 7, BUDGET, ran))
        for p in range(writers)
    ]
    results = run_children(targets, start, out)
    stop.set()
    ager_result = report_of(ager, ager_out)
    ager.join(timeout=30)
    assert ager.exitcode == 0
    with mnestoma.Mnestoma(
        store_url, clock=lambda: datetime.now(UTC) + timedelta(days=60)
    ) as last:  # one last pass once every writer is done: there is something to demote
        final = last.apply_ager()
    ager_result["reports"].append(dataclasses.asdict(final))

    errors = [e for r in results for e in r["errors"]] + ager_result["errors"]
    found = new_deadlocks(store_url, before)
    assert (errors, found) == ([], 0), (
        f"{len(errors)} failed calls, {found} deadlocks: {errors[:3]}"
    )
    reports = ager_result["reports"]
    assert len(reports) >= 3, "the ager did not run while the writers wrote"
    want = expected_counts(results)
    with mnestoma.Mnestoma(store_url) as store:
        got = uses_by_key(store)
        events = store.events()
    assert got == dict(want), "a reinforcement was lost while the ager ran"
    kinds = Counter(
        (e.kind, e.state_before) for e in events if e.kind in ("transition", "merged", "pruned")
    )
    merged = sum(r["merged"] for r in reports)
    assert merged == kinds[("merged", "active")] == kinds[("merged", "decaying")]
    assert sum(r["to_decaying"] for r in reports) - merged == kinds[("transition", "active")]
    assert sum(r["protos_pruned"] for r in reports) == kinds[("pruned", "proto")]
    assert sum(r["to_decaying"] for r in reports) > 0, "the ager found nothing to demote"
    check_invariants(store_url)


@pytest.mark.soak
def test_soak_writers_ager_and_kills_keep_every_invariant(store_url: str) -> None:
    from test_faults import kill_a_big_turn_at_random

    seconds = float(os.environ.get("MNESTOMA_SOAK_SECONDS", "300"))
    end = time.monotonic() + seconds
    rounds = 0
    want: Counter[str] = Counter()
    while time.monotonic() < end:
        start, stop, out, ager_out = CTX.Event(), CTX.Event(), CTX.Queue(), CTX.Queue()
        ager = CTX.Process(
            target=ager_process, args=(store_url, 30.0 * (rounds % 4), start, stop, ager_out)
        )
        ager.start()
        targets = [
            (writer_process, (store_url, p, THREADS, 100, start, out, rounds))
            for p in range(PROCESSES)
        ]
        results = run_children(targets, start, out)
        stop.set()
        ager_result = report_of(ager, ager_out)
        ager.join(timeout=30)
        assert [e for r in results for e in r["errors"]] == []
        assert ager_result["errors"] == []
        want.update(expected_counts(results))
        kill_a_big_turn_at_random(store_url, f"soak{rounds}")
        check_invariants(store_url)
        rounds += 1
    print(f"soak: {rounds} rounds in {seconds:.0f} s, {sum(want.values())} passings")
    with mnestoma.Mnestoma(store_url) as store:
        got = uses_by_key(store)
    for key, n in want.items():
        if "wish" not in key:  # protos may be pruned by the ager, their uses with them
            assert got.get(key, 0) == n


# --- deterministic lock-order scenarios (threads in this process, gated after a statement) --


class GateAfterStatement:
    """Holds a writer inside its write lock: the first statement of its engine that touches
    ``mnests`` (on PostgreSQL the passing's one statement, which locks the row; on SQLite the
    first once BEGIN IMMEDIATE holds the lock) waits for the test once it has run, before
    the COMMIT."""

    def __init__(self, engine: Any) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.calls = 0
        event.listen(engine, "after_cursor_execute", self._after)

    def _after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "mnests" not in statement:
            return
        self.calls += 1
        if self.calls == 1:
            self.reached.set()
            self.go.wait(20)


def wait_for_lock_waiters(url: str, n: int, timeout: float = 10.0) -> None:
    """Wait until ``n`` sessions of this PostgreSQL database wait on a lock."""
    engine = plain_engine(url)
    try:
        # Statement by statement: a transaction would keep showing its first snapshot.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            end = time.monotonic() + timeout
            while conn.execute(LOCK_WAITERS).scalar_one() < n:
                if time.monotonic() > end:
                    pytest.fail(f"{n} sessions never waited on a lock")
                time.sleep(0.02)
    finally:
        engine.dispose()


def sqlite_lock_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set once a write in this process asks for SQLite's write lock from now on.

    Called while another connection holds the lock, the write that sets it waits: inside
    SQLite's busy handler, which gets what is left of the lock timeout at each attempt.
    """
    waiting = threading.Event()
    begin = locking._begin_immediate

    def observed_begin(dbapi: Any, info: dict[Any, Any], timeout: float, **kw: Any) -> None:
        waiting.set()
        begin(dbapi, info, timeout, **kw)

    monkeypatch.setattr(locking, "_begin_immediate", observed_begin)
    return waiting


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as err:
            box["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_the_ager_waits_for_a_writer_holding_a_row_instead_of_deadlocking(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with mnestoma.Mnestoma(store_url) as plain:
        plain.record_passing(*HOT_EDGE)
    before = deadlocks(store_url)
    on_sqlite = make_url(store_url).get_backend_name() == "sqlite"
    writer_engine = make_engine(store_url)
    gate = GateAfterStatement(writer_engine)
    writer = mnestoma.Mnestoma(writer_engine)
    ager_engine = make_engine(store_url)
    ager = mnestoma.Mnestoma(ager_engine, clock=lambda: datetime.now(UTC) + timedelta(days=60))
    try:
        w_thread, w_box = in_thread(writer.record_passing, *HOT_EDGE)
        assert gate.reached.wait(10), "the writer never reached its locked section"
        sqlite_waits = sqlite_lock_waits(monkeypatch)  # the writer holds the lock by now
        a_thread, a_box = in_thread(ager.apply_ager)
        # the ager now waits for the writer: for its row, or for SQLite's write lock
        if on_sqlite:
            assert sqlite_waits.wait(10), "the ager never waited for the writer's lock"
        else:
            wait_for_lock_waiters(store_url, 1)
        gate.go.set()
        w_thread.join(30)
        a_thread.join(30)
    finally:
        gate.go.set()
        writer.close()
        writer_engine.dispose()
        ager.close()
        ager_engine.dispose()
    assert "error" not in w_box and "error" not in a_box, (w_box, a_box)
    assert new_deadlocks(store_url, before) == 0, "the ager and a writer deadlocked"
    assert w_box["result"].uses == 2
    check_invariants(store_url)


def test_a_turn_that_loses_an_insert_race_does_not_deadlock_with_another_turn(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL only: SQLite runs one writer at a time, the interleaving cannot happen. A
    turn whose one statement finds a key created by another transaction meanwhile undoes the
    attempt, its row locks with it, before it locks that key's row: a turn holding that row
    and waiting for one of the first turn's rows gets it."""
    store_url = pg_store_url
    from mnestoma.store import pg_writes

    # ids decide the lock order of a turn: the cold edge (created by a passing) sorts before
    # the hot one.
    ids = iter(["mn_zzzzzzzzzzzzzzzzhot", "mn_aaaaaaaaaaaaaaaacold"])
    real = pg_writes.new_mnest_id
    monkeypatch.setattr(pg_writes, "new_mnest_id", lambda: next(ids, None) or real())
    cold = ("cold", "1", "c-race", "1")
    before_setup = mnestoma.Mnestoma(store_url)
    before_setup.record_passing(*HOT_EDGE)  # hot exists; cold does not yet
    assert before_setup.find(*HOT_EDGE).id == "mn_zzzzzzzzzzzzzzzzhot"
    before = deadlocks(store_url)
    creator_engine, first_engine = make_engine(store_url), make_engine(store_url)
    creating, first_gate = GateAfterStatement(creator_engine), GateAfterStatement(first_engine)
    creator = mnestoma.Mnestoma(creator_engine)
    first = mnestoma.Mnestoma(first_engine)
    third = mnestoma.Mnestoma(store_url)
    try:
        # 1. a passing creates the cold edge and waits before its COMMIT
        t0, box0 = in_thread(creator.record_passing, *cold)
        assert creating.reached.wait(10)
        # 2. a turn locks the hot edge and waits to insert the cold one
        t1, box1 = in_thread(first.record_turn, "turn-1", [HOT_EDGE, cold])
        wait_for_lock_waiters(store_url, 1)
        # 3. the passing commits: the turn's statement finds the cold key taken, and the
        # turn pauses before it undoes the attempt, the hot edge still locked
        creating.go.set()
        assert first_gate.reached.wait(10)
        t0.join(30)
        # 4. another turn locks the cold edge (lower id first) and waits for the hot one
        t3, box3 = in_thread(third.record_turn, "turn-3", [HOT_EDGE, cold])
        wait_for_lock_waiters(store_url, 1)
        # 5. the first turn undoes its attempt and locks both edges again, in id order
        first_gate.go.set()
        t1.join(30)
        t3.join(30)
    finally:
        creating.go.set()
        first_gate.go.set()
        for s in (creator, first, third, before_setup):
            s.close()
        creator_engine.dispose()
        first_engine.dispose()
    assert "error" not in box0, box0
    assert "error" not in box1 and "error" not in box3, (box1, box3)
    assert new_deadlocks(store_url, before) == 0, "two turns deadlocked (then retried)"
    with mnestoma.Mnestoma(store_url) as store:
        got = uses_by_key(store)
    assert got[key_of(*HOT_EDGE)] == 3
    assert got[key_of(*cold)] == 3
    check_invariants(store_url)


def test_a_turns_passing_that_waited_for_the_same_turns_lock_counts_once(
    pg_store_url: str,
) -> None:
    """PostgreSQL: the second recording of a turn's passing takes its snapshot, then waits
    for the row's lock while the first one commits. From that snapshot it cannot tell that
    the turn counted the passing: it must find out, write nothing and return the row, inside
    a service's own transaction (which a failed statement would abort: no retry there)."""
    store_url = pg_store_url
    with mnestoma.Mnestoma(store_url) as plain:
        plain.record_passing(*HOT_EDGE)
    first_engine = make_engine(store_url)
    gate = GateAfterStatement(first_engine)
    first = mnestoma.Mnestoma(first_engine)
    second_engine = make_engine(store_url)
    sessions = mnestoma.make_session_factory(second_engine)

    def in_the_services_transaction() -> list[Any]:
        with sessions() as session, session.begin():
            uow = mnestoma.UnitOfWork.joining(session)
            with uow:
                return uow.mnests.record_turn("turn-twice", [HOT_EDGE])

    try:
        t1, box1 = in_thread(first.record_turn, "turn-twice", [HOT_EDGE])
        assert gate.reached.wait(10), "the first recording never held the row"
        t2, box2 = in_thread(in_the_services_transaction)
        wait_for_lock_waiters(store_url, 1)  # the second waits for the row, its snapshot taken
        gate.go.set()
        t1.join(30)
        t2.join(30)
    finally:
        gate.go.set()
        first.close()
        first_engine.dispose()
        second_engine.dispose()
    assert "error" not in box1 and "error" not in box2, (box1, box2)
    assert [m.uses for m in box1["result"]] == [2]
    assert [m.uses for m in box2["result"]] == [2]  # the row as the first left it
    with mnestoma.Mnestoma(store_url) as store:
        assert store.find(*HOT_EDGE).uses == 2
        assert len(store.events(turn_id="turn-twice")) == 1
    check_invariants(store_url)
