"""At a threshold exactly, both engines and the pure rules decide alike: rounding noise is not
below (0.20 demotion, 0.05 pruning and archive candidates)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from mnestoma import Mnestoma

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _days_to(weight: float, threshold: float) -> timedelta:
    """The time a weight takes to decay exactly to ``threshold`` at the default speed."""
    return timedelta(days=math.log(weight / threshold) / 0.018)


def test_the_pure_rule_treats_rounding_noise_at_a_threshold_as_not_below() -> None:
    from mnestoma.core.rules import THRESHOLD_TOLERANCE, decayed_weight, is_below

    at_edge = decayed_weight(0.30, 0.018, T0, T0 + _days_to(0.30, 0.05))
    assert at_edge == pytest.approx(0.05, abs=1e-14) and at_edge < 0.05  # noise, below
    assert not is_below(at_edge, 0.05)
    assert is_below(0.05 - 2 * THRESHOLD_TOLERANCE, 0.05)
    assert not is_below(0.05, 0.05)


def test_a_proto_decayed_exactly_to_the_prune_threshold_is_kept_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    p = store.record_passing("a", "1", "wish", dst_exists=False)
    clock.set(T0 + _days_to(0.30, 0.05))  # Python: 0.049999999999996506
    report = store.apply_ager()
    assert report.protos_pruned == 0
    assert store.get(p.id) is not None
    clock.advance(hours=1)  # now clearly below
    assert store.apply_ager().protos_pruned == 1
    assert store.get(p.id) is None


def test_an_active_row_decayed_exactly_to_0_20_stays_active_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    row = store.record_passing("a", "1", "b", "1")
    assert row.weight == pytest.approx(0.60)
    clock.set(T0 + _days_to(row.weight, 0.20))  # Python: 0.19999999999999696
    assert store.apply_ager().to_decaying == 0
    assert store.get(row.id).state == "active"
    clock.advance(hours=1)
    assert store.apply_ager().to_decaying == 1
    assert store.get(row.id).state == "decaying"


def test_archive_candidates_at_exactly_0_05_are_not_counted_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    row = store.record_passing("a", "1", "b", "1")
    store.transition_state(row.id, "decaying")
    clock.set(T0 + _days_to(0.30, 0.05))  # 99.5 days: old enough, weight exactly 0.05
    assert store.apply_ager().archive_candidates == 0
    clock.advance(hours=1)
    assert store.apply_ager().archive_candidates == 1
