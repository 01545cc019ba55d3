"""The planner's formulas (contract §13) as pure functions: Witten-Bell probabilities that
sum to 1 with the unseen mass and never reach 0 or 1, the chain's fall-back, and which
chains a turn makes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnestoma.core import rules
from mnestoma.core.rules import ContextUsed, chain_increments, next_probabilities

names = st.sampled_from(["a", "b", "c", "d", "e", "f"])
counts = st.dictionaries(names, st.floats(1e-6, 1e6), max_size=6)


@given(edge=counts, chain=st.one_of(st.none(), counts))
def test_probabilities_and_the_unseen_mass_sum_to_one_and_none_is_0_or_1(
    edge: dict[str, float], chain: dict[str, float] | None
) -> None:
    got = next_probabilities(edge, chain)
    assert math.fsum([*got.p.values(), got.unseen]) == pytest.approx(1.0, abs=1e-9)
    assert 0.0 < got.unseen <= 1.0
    assert all(0.0 < p < 1.0 for p in got.p.values())
    assert set(got.p) == set(edge) | (
        set(chain or {}) if got.context is ContextUsed.CHAIN else set()
    )


@given(edge=counts, chain=counts)
def test_the_chain_answers_exactly_when_it_has_enough_evidence(
    edge: dict[str, float], chain: dict[str, float]
) -> None:
    got = next_probabilities(edge, chain)
    enough = sum(chain.values()) >= rules.CHAIN_MIN_SUPPORT
    if enough:
        assert got.context is ContextUsed.CHAIN
        assert got.support == pytest.approx(sum(chain.values()))
    else:
        assert got == next_probabilities(edge)


def test_witten_bell_numbers_by_hand() -> None:
    assert rules.CHAIN_SMOOTHING == rules.EDGE_SMOOTHING == 1.0
    assert rules.CHAIN_MIN_SUPPORT == 1.5
    edge = next_probabilities({"read": 3.0, "fetch": 1.0})
    assert edge.p == pytest.approx({"read": 3 / 6, "fetch": 1 / 6})
    assert edge.unseen == pytest.approx(2 / 6) and edge.context is ContextUsed.EDGE
    both = next_probabilities({"read": 3.0, "fetch": 1.0}, {"fetch": 2.0})
    # chain: N = 2, T = 1; fetch (2 + 1·1/6)/3, read (1·3/6)/3, unseen (1·2/6)/3
    assert both.p == pytest.approx({"fetch": (2 + 1 / 6) / 3, "read": (3 / 6) / 3})
    assert both.unseen == pytest.approx((2 / 6) / 3)
    assert next_probabilities({}) == rules.NextProbabilities({}, 1.0, ContextUsed.NONE, 0.0)
    # a chain with less than the minimum support leaves the edge to answer
    assert next_probabilities({"read": 1.0}, {"fetch": 1.49}).context is ContextUsed.EDGE
    assert next_probabilities({"read": 1.0}, {"fetch": 1.5}).context is ContextUsed.CHAIN
    assert rules.unseen_probability(0.5) == pytest.approx(0.5 / rules.UNSEEN_SUCCESSORS)


def test_a_link_chains_on_the_latest_link_that_reached_its_source() -> None:
    turn = [("plan", "search"), ("search", "read"), ("plan", "fetch"), ("read", "plan")]
    turn += [("plan", "search")]
    assert chain_increments(turn, [True] * 5) == {
        ("plan", "search", "read"): 1,
        ("search", "read", "plan"): 1,
        ("read", "plan", "search"): 1,
    }
    # a counted link after one that was not counted (a continued turn) still chains on it
    assert chain_increments(turn[:2], [False, True]) == {("plan", "search", "read"): 1}
    assert chain_increments(turn[:2], [True, False]) == {}
    assert chain_increments([("a", "a"), ("a", "a"), ("a", "a")], [True] * 3) == {
        ("a", "a", "a"): 2
    }
