"""The clock rule (contract §4) through every door that writes, on both engines.

"Now" is read once per call, before the statement that locks the row, so a call can carry
a now earlier than the row's: two writers whose clocks are an hour apart take turns on one
edge. Each call must leave the numbers the pure rules give for the row it found, with its
own now: neither instant moves back, a call from behind adds +0.15 with no decay, the
weight stays in [0, 1], ``ts_last ≥ ts_first``, and the call's event says the same.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from test_concurrency_matrix import DOORS, Door, key

import mnestoma
from mnestoma.core import rules
from mnestoma.core.clock import MovableClock
from mnestoma.schema.models import Mnest

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
APART = timedelta(hours=1)
CALLS = 6
EDGE = "clock-rule"


def _write(door: Door, call: int) -> None:
    if door.is_async:
        asyncio.run(door.awrite(EDGE, call))
    else:
        door.write(EDGE, call)


def _expected(row: Mnest, now: datetime) -> tuple[float, datetime, datetime, float]:
    """What the pure rules make of ``row`` after one passing at ``now``: the weight,
    ``ts_last``, ``ts_weight``, and the event's weight before."""
    ts_weight = rules.advance(row.ts_weight, now)
    before = rules.decayed_weight(row.weight, row.decay_lambda, row.ts_weight, ts_weight)
    return rules.reinforce(before), rules.advance(row.ts_last, now), ts_weight, before


@pytest.mark.parametrize("door_name", list(DOORS))
def test_two_clocks_out_of_order_on_one_edge_never_move_an_instant_back(
    store_url: str, door_name: str
) -> None:
    ahead, behind = MovableClock(START + APART), MovableClock(START)
    doors = [DOORS[door_name](store_url, False, clock) for clock in (ahead, behind)]
    for door in doors:
        door.open()
    checker = mnestoma.Mnestoma(store_url)
    found: list[Mnest] = []
    from_behind = 0
    try:
        for call in range(CALLS):
            # the clock ahead writes first; then they alternate, each moving on by 7 minutes,
            # so that the one behind is always behind the row's instants
            door = doors[call % 2]
            now = (ahead if call % 2 == 0 else behind)()
            _write(door, call)
            row = checker.find(*key(EDGE))
            assert row is not None
            assert 0.0 <= row.weight <= 1.0
            assert row.ts_first <= row.ts_last
            if found:
                prev = found[-1]
                weight, ts_last, ts_weight, before = _expected(prev, now)
                assert (row.weight, row.ts_last, row.ts_weight) == (weight, ts_last, ts_weight)
                assert row.ts_last >= prev.ts_last and row.ts_weight >= prev.ts_weight
                if now < prev.ts_weight:  # from behind: +0.15, no decay, instants kept
                    from_behind += 1
                    assert row.weight == rules.reinforce(prev.weight)
                    assert (row.ts_last, row.ts_weight) == (prev.ts_last, prev.ts_weight)
                event = checker.events(mnest_id=row.id)[-1]
                assert (event.kind, event.ts) == ("reinforced", row.ts_last)
                assert (event.weight_before, event.weight_after) == (before, row.weight)
            found.append(row)
            ahead.advance(minutes=7)
            behind.advance(minutes=7)
    finally:
        for door in doors:
            door.close()
        checker.close()
    assert [r.uses for r in found] == list(range(1, CALLS + 1))
    assert from_behind == CALLS // 2  # every call of the clock behind came from behind
