"""The rules as pure functions, checked without a database."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnestoma import rules
from mnestoma.rules import MnestState, check_transition, decayed_weight, reinforced_weight

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_contract_numbers() -> None:
    assert rules.INITIAL_WEIGHT == 0.30
    assert rules.REINFORCEMENT == 0.15
    assert rules.DEFAULT_DECAY_LAMBDA == 0.018
    assert rules.DECAYING_BELOW == 0.20
    assert rules.PROTO_PRUNE_BELOW == 0.05
    assert rules.ARCHIVE_BELOW == 0.05
    assert rules.ARCHIVE_AFTER_DAYS == 90
    assert rules.RECURRING_MIN_USES == 3
    assert rules.RECURRING_MIN_WEIGHT == 0.30


def test_decay_follows_exp_of_minus_lambda_days() -> None:
    assert decayed_weight(0.5, 0.018, T0, T0 + timedelta(days=10)) == pytest.approx(
        0.5 * math.exp(-0.18)
    )


def test_decay_counts_fractions_of_a_day() -> None:
    assert decayed_weight(1.0, 0.018, T0, T0 + timedelta(hours=12)) == pytest.approx(
        math.exp(-0.009)
    )


def test_a_clock_that_steps_back_decays_nothing() -> None:
    assert decayed_weight(0.4, 0.018, T0, T0 - timedelta(days=3)) == 0.4


def test_reinforcement_adds_015_to_the_decayed_weight() -> None:
    assert reinforced_weight(0.3, 0.018, T0, T0 + timedelta(days=2)) == pytest.approx(
        0.3 * math.exp(-0.036) + 0.15
    )


def test_reinforcement_is_clamped_to_one() -> None:
    assert reinforced_weight(0.95, 0.018, T0, T0) == 1.0


def test_a_new_id_is_mn_and_a_long_url_safe_token() -> None:
    ident = rules.new_mnest_id()
    assert ident.startswith("mn_")
    token = ident[3:]
    assert len(token) >= 12
    assert all(c.isalnum() or c in "-_" for c in token)
    assert rules.new_mnest_id() != ident


@given(
    w=st.floats(0, 1),
    lam=st.floats(0, 1),
    d1=st.floats(0, 400),
    d2=st.floats(0, 400),
)
def test_decay_in_two_steps_equals_decay_in_one(w: float, lam: float, d1: float, d2: float) -> None:
    t1 = T0 + timedelta(days=d1)
    t2 = t1 + timedelta(days=d2)
    once = decayed_weight(w, lam, T0, t2)
    twice = decayed_weight(decayed_weight(w, lam, T0, t1), lam, t1, t2)
    assert twice == pytest.approx(once, rel=1e-9, abs=1e-15)


@given(w=st.floats(0, 1), lam=st.floats(0, 5), d=st.floats(0, 10_000))
def test_weights_stay_in_zero_one(w: float, lam: float, d: float) -> None:
    now = T0 + timedelta(days=d)
    assert 0.0 <= decayed_weight(w, lam, T0, now) <= w
    assert 0.0 <= reinforced_weight(w, lam, T0, now) <= 1.0


@pytest.mark.parametrize(
    ("current", "target", "has_version", "allowed"),
    [
        (MnestState.ACTIVE, MnestState.DECAYING, True, True),
        (MnestState.ACTIVE, MnestState.SUPERSEDED, True, True),
        (MnestState.DECAYING, MnestState.ACTIVE, True, True),
        (MnestState.SUPERSEDED, MnestState.ACTIVE, True, True),
        (MnestState.PROTO, MnestState.SUPERSEDED, False, True),
        (MnestState.ACTIVE, MnestState.ACTIVE, True, True),
        (MnestState.PROTO, MnestState.ACTIVE, False, False),
        (MnestState.PROTO, MnestState.DECAYING, False, False),
        (MnestState.ACTIVE, MnestState.PROTO, True, False),
        (MnestState.DECAYING, MnestState.PROTO, True, False),
        (MnestState.SUPERSEDED, MnestState.PROTO, True, False),
        (MnestState.SUPERSEDED, MnestState.ACTIVE, False, False),
    ],
)
def test_the_transition_table(
    current: MnestState, target: MnestState, has_version: bool, allowed: bool
) -> None:
    assert (check_transition(current, target, has_version=has_version) is None) is allowed
