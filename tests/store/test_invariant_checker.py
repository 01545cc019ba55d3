"""The suite's invariant checker (``invariants.check_invariants``) reads merges both ways they
are written and still reports the defects it exists to catch."""

from __future__ import annotations

from typing import Any

import pytest
from invariants import check_invariants
from sqlalchemy import insert

from mnestoma import Mnestoma
from mnestoma.engines import make_engine
from mnestoma.schema.models import Event
from mnestoma.testing.clock import MovableClock

ABSENT = "mn_absorbedrow0001"  # a row id that is not in the store


def merged(
    mnest_id: str, related_id: str, before: str | None, after: str, at: Any
) -> dict[str, Any]:
    return {
        "mnest_id": mnest_id,
        "kind": "merged",
        "ts": at,
        "weight_before": 0.3,
        "weight_after": 0.3,
        "state_before": before,
        "state_after": after,
        "related_id": related_id,
    }


def created(mnest_id: str, turn_id: str, at: Any) -> dict[str, Any]:
    return {
        "mnest_id": mnest_id,
        "kind": "created",
        "ts": at,
        "turn_id": turn_id,
        "weight_after": 0.3,
        "state_after": "active",
    }


def add_events(url: str, *events: dict[str, Any]) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for event in events:
                conn.execute(insert(Event.__table__), event)
    finally:
        engine.dispose()


def test_the_checker_reports_a_row_a_copy_merged_away_yet_present(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    """The absorbed side of a copy's merge has no state before: its row must be gone."""
    row = store.record_passing("a", "1", "b", "1")
    add_events(store_url, merged(row.id, ABSENT, None, "active", clock()))
    with pytest.raises(AssertionError, match="merged away, yet still present"):
        check_invariants(store_url)


def test_the_checker_reports_two_rows_absorbing_each_other_as_a_merge_cycle(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    """Reported as a broken rule, not a crash of the checker."""
    one = store.record_passing("a", "1", "b", "1")
    other = store.record_passing("c", "1", "d", "1")
    for row in (one, other):
        store.transition_state(row.id, "decaying")
    add_events(
        store_url,
        merged(one.id, other.id, "decaying", "decaying", clock()),
        merged(other.id, one.id, "decaying", "decaying", clock()),
    )
    with pytest.raises(AssertionError, match="merge cycle through"):
        check_invariants(store_url)


def test_the_checker_counts_a_passing_a_copy_left_on_the_absorbed_row(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    """A copy moves the absorbed row's passings to the row that absorbs it, but for turns that
    row already counted: a passing of another turn left behind is a uses mismatch."""
    row = store.record_passing("a", "1", "b", "1", turn_id="t-1")
    add_events(
        store_url,
        created(ABSENT, "t-2", clock()),
        merged(row.id, ABSENT, "active", "active", clock()),
        merged(ABSENT, row.id, None, "active", clock()),
    )
    with pytest.raises(AssertionError, match=f"{row.id}: uses 1 but"):
        check_invariants(store_url)
