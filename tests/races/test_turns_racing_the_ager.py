"""Turns that race the ager are retried to success, each (turn, edge) counted once
(PostgreSQL)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from mnestoma import Mnestoma

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_turns_racing_the_ager_all_succeed_and_count_once(pg_store_url: str) -> None:
    """8 writer threads record turns of 5-10 edges from one pool of keys while an ager thread
    moves the clock 100 days and demotes (or merges) every row, again and again: every turn
    succeeds, and each (turn, edge) is counted exactly once."""
    import threading

    from mnestoma.testing.clock import MovableClock

    clock = MovableClock(T0)
    keys = [(f"s{i}", "1", f"d{j}", "1") for i in range(4) for j in range(6)]
    threads_n, turns_n = 8, 30
    errors: list[BaseException] = []
    counted = [0] * threads_n
    done = threading.Event()
    ager_runs = [0]
    with Mnestoma(pg_store_url, clock=clock) as store:

        def writer(n: int) -> None:
            rnd = random.Random(n)
            try:
                t = 0
                # on until the ager has run three times among the writers (bounded): a fast
                # machine's writers could otherwise be done before its third run
                while t < turns_n or (ager_runs[0] < 3 and t < 20 * turns_n):
                    edges = rnd.sample(keys, rnd.randint(5, 10))
                    store.record_turn(f"w{n}-t{t}", edges)
                    counted[n] += len(edges)
                    t += 1
            except BaseException as err:
                errors.append(err)

        def ager() -> None:
            try:
                while not done.is_set():
                    clock.advance(days=100)
                    store.apply_ager()
                    ager_runs[0] += 1
            except BaseException as err:
                errors.append(err)

        workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads_n)]
        aging = threading.Thread(target=ager)
        aging.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        aging.join()
        assert errors == []
        rows = store.edges()
        passings = [e for e in store.events() if e.kind in ("created", "reinforced")]
    assert ager_runs[0] >= 3
    assert len(passings) == sum(counted)
    assert sum(r.uses for r in rows) == sum(counted)
    assert {r.state for r in rows} <= {"active", "decaying"}
