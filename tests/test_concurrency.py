"""Concurrent writers, duplicate turns and the ager among writers, on SQLite and PostgreSQL.

Several processes (spawn context), each with its own ``Mnestoma(url)`` shared by several
threads, write at once. Afterwards every passing is counted exactly once, no call failed,
and every invariant of the contract holds.

CI mode is bounded (4 processes x 8 threads x 25 calls). ``MNESTOMA_SOAK=1`` selects the
soak test, which repeats writers, ager and faults for ``MNESTOMA_SOAK_SECONDS`` (300).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
from helpers_proc import (
    HOT_EDGE,
    HOT_PROTO,
    ager_process,
    key_of,
    same_turn_process,
    writer_process,
)
from invariants import check_invariants, plain_engine
from sqlalchemy import text

import mnestoma

CTX = multiprocessing.get_context("spawn")
SOAK = os.environ.get("MNESTOMA_SOAK", "") not in ("", "0")
PROCESSES = 4
THREADS = 8
CALLS = int(os.environ.get("MNESTOMA_SOAK_CALLS", "400")) if SOAK else 25
DEADLINE = 300.0


def run_children(targets: list[tuple[Any, tuple[Any, ...]]], start: Any, out: Any) -> list[dict]:
    """Start every child, release them together, collect one result each, join them."""
    procs = [CTX.Process(target=f, args=args, daemon=True) for f, args in targets]
    for p in procs:
        p.start()
    start.set()
    results = []
    try:
        for _ in procs:
            results.append(out.get(timeout=DEADLINE))
    except queue.Empty:
        pytest.fail(f"only {len(results)} of {len(procs)} children reported in {DEADLINE}s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    return results


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


def deadlocks(url: str) -> int | None:
    """The server's deadlock counter for this database (PostgreSQL), else None."""
    engine = plain_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            return None
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
    finally:
        engine.dispose()


def test_concurrent_writers_count_every_passing_exactly_once(store_url: str) -> None:
    start, out = CTX.Event(), CTX.Queue()
    targets = [
        (writer_process, (store_url, p, THREADS, CALLS, start, out)) for p in range(PROCESSES)
    ]
    results = run_children(targets, start, out)

    errors = [e for r in results for e in r["errors"]]
    assert errors == []
    want = expected_counts(results)
    assert sum(len(r["errors"]) for r in results) == 0
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
    start, stop, out = CTX.Event(), CTX.Event(), CTX.Queue()
    writers = 3
    ager = CTX.Process(target=ager_process, args=(store_url, 60.0, start, stop, out), daemon=True)
    ager.start()
    targets = [
        (writer_process, (store_url, p, THREADS, CALLS, start, out, 7)) for p in range(writers)
    ]
    results = run_children(targets, start, out)
    stop.set()
    ager_result = out.get(timeout=DEADLINE)
    ager.join(timeout=30)
    assert ager.exitcode == 0

    assert [e for r in results for e in r["errors"]] == []
    assert ager_result["errors"] == []
    reports = ager_result["reports"]
    assert len(reports) >= 2
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
    after = deadlocks(store_url)
    if before is not None:
        time.sleep(0.5)  # the server flushes its statistics asynchronously
        after = deadlocks(store_url)
        assert after == before, f"{after - before} deadlocks detected (and retried) by PostgreSQL"


@pytest.mark.soak
@pytest.mark.skipif(not SOAK, reason="soak mode: set MNESTOMA_SOAK=1 (and -m soak)")
def test_soak_writers_ager_and_kills_keep_every_invariant(store_url: str) -> None:
    from test_faults import kill_a_big_turn_at_random

    seconds = float(os.environ.get("MNESTOMA_SOAK_SECONDS", "300"))
    end = time.monotonic() + seconds
    rounds = 0
    want: Counter[str] = Counter()
    while time.monotonic() < end:
        start, stop, out = CTX.Event(), CTX.Event(), CTX.Queue()
        ager = CTX.Process(
            target=ager_process, args=(store_url, 30.0 * (rounds % 4), start, stop, out)
        )
        ager.start()
        targets = [
            (writer_process, (store_url, p, THREADS, 100, start, out, rounds))
            for p in range(PROCESSES)
        ]
        results = run_children(targets, start, out)
        stop.set()
        ager_result = out.get(timeout=DEADLINE)
        ager.join(timeout=30)
        assert [e for r in results for e in r["errors"]] == []
        assert ager_result["errors"] == []
        want.update(expected_counts(results))
        kill_a_big_turn_at_random(store_url, f"soak{rounds}")
        check_invariants(store_url)
        rounds += 1
    with mnestoma.Mnestoma(store_url) as store:
        got = uses_by_key(store)
    for key, n in want.items():
        if "wish" not in key:  # protos may be pruned by the ager, their uses with them
            assert got.get(key, 0) == n
