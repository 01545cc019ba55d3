"""The clock rule (contract §4), on the pure rules: "now" read once per call, before the row
is locked, so calls may reach a row out of their clocks' order. A row's instants never move
back (``max(old, now)``) and the decay runs from the later of the two.

In clock order this is exactly the rule of old, when now was read once the row was locked:
``ts_last = ts_weight = now`` and the decay from the stored ``ts_weight`` to now. Out of
order, every number stays within the rules' clamps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from mnestoma.core import rules
from mnestoma.core.validation import Passing
from mnestoma.store.rows import MnestRow, creation, reinforced_row, reinforcement

START = datetime(2026, 1, 1, tzinfo=UTC)
gaps = st.lists(
    st.integers(-400 * 86_400_000_000, 400 * 86_400_000_000).map(
        lambda us: timedelta(microseconds=us)
    ),
    min_size=1,
    max_size=12,
)
lambdas = st.sampled_from([rules.DEFAULT_DECAY_LAMBDA, 0.0, 0.5, 50.0, 1e-160])


def _calls(row: MnestRow, nows: list[datetime]) -> list[MnestRow]:
    """The row after each call, as the package computes them."""
    p = Passing("a", "1", "b", "1")
    out = []
    for now in nows:
        values, _event = reinforcement(row, p, None, now, "call")
        row = reinforced_row(row, values)
        out.append(row)
    return out


def _created(lam: float) -> MnestRow:
    row, _event = creation(Passing("a", "1", "b", "1"), None, START, "call")
    return row._replace(decay_lambda=lam)


@settings(max_examples=200, deadline=None)
@given(steps=gaps, lam=lambdas)
def test_in_clock_order_the_rule_is_the_rule_of_a_clock_read_under_the_lock(
    steps: list[timedelta], lam: float
) -> None:
    nows, now = [], START
    for step in steps:
        now += abs(step)
        nows.append(now)
    row = _created(lam)
    for got, now in zip(_calls(row, nows), nows, strict=True):
        # the rule as it read when now was read under the lock, in clock order
        weight = rules.clamp_weight(
            rules.decayed_weight(row.weight, row.decay_lambda, row.ts_weight, now)
            + rules.REINFORCEMENT
        )
        count = rules.decayed_count(row.decayed_uses, row.decay_lambda, row.ts_last, now) + 1
        assert (got.weight, got.ts_last, got.ts_weight) == (weight, now, now)
        assert got.decayed_uses == count
        row = got


@settings(max_examples=200, deadline=None)
@given(steps=gaps, lam=lambdas)
def test_out_of_order_no_instant_moves_back_and_every_number_stays_in_its_clamps(
    steps: list[timedelta], lam: float
) -> None:
    nows = [START + step for step in steps]
    row = _created(lam)
    for got, now in zip(_calls(row, nows), nows, strict=True):
        assert 0.0 <= got.weight <= 1.0
        assert got.ts_first <= got.ts_last
        assert (got.ts_last, got.ts_weight) == (max(row.ts_last, now), max(row.ts_weight, now))
        assert 0.0 < got.decayed_uses <= got.uses
        if now <= row.ts_weight:  # behind the row: +0.15 with no decay
            assert got.weight == rules.reinforce(row.weight)
        row = got
