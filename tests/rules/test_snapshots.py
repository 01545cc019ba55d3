"""Snapshots built by the package are the objects SQLAlchemy's public API would build."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.orm import make_transient_to_detached

from mnestoma.errors import StoreError
from mnestoma.schema import snapshots
from mnestoma.schema.models import CanonicalQuery, Event, Mnest
from mnestoma.schema.sql.tables import EVENT_COLUMNS, MNEST_COLUMNS, QUERY_COLUMNS

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
MNEST = {
    "id": "m-1",
    "src_executor": "search",
    "src_version": "1",
    "dst_executor": "read",
    "dst_version": "2",
    "weight": 0.45,
    "uses": 2,
    "ts_first": NOW,
    "ts_last": NOW,
    "ts_weight": NOW,
    "decay_lambda": 0.018,
    "state": "active",
    "tags": {"k": [1, 2]},
    "desired_sig": None,
    "ok_count": 1,
    "error_count": 0,
    "decayed_uses": 1.75,
}


def _textbook(cls: type[Any], values: dict[str, Any]) -> Any:
    obj = cls(**values)
    make_transient_to_detached(obj)
    return obj


def _same_state(ours: Any, textbook: Any, columns: tuple[str, ...]) -> None:
    a, b = inspect(ours), inspect(textbook)
    assert a.detached and b.detached
    assert a.key == b.key
    assert not a.modified and not b.modified
    assert a.unloaded == b.unloaded == set()
    assert not a.expired_attributes
    for name in columns:
        assert getattr(ours, name) == getattr(textbook, name)
        assert a.attrs[name].history.unchanged == b.attrs[name].history.unchanged


def test_a_mnest_snapshot_equals_the_one_make_transient_to_detached_builds() -> None:
    ours = snapshots.mnest([MNEST[k] for k in MNEST_COLUMNS])
    _same_state(ours, _textbook(Mnest, MNEST), MNEST_COLUMNS)


def test_event_and_query_snapshots_equal_the_textbook_ones() -> None:
    event = {k: None for k in EVENT_COLUMNS} | {
        "id": 7,
        "mnest_id": "m-1",
        "kind": "created",
        "ts": NOW,
        "recorder": "call",
    }
    _same_state(
        snapshots.event([event[k] for k in EVENT_COLUMNS]), _textbook(Event, event), EVENT_COLUMNS
    )
    query = {
        "id": 3,
        "ts": NOW,
        "turn_id": None,
        "raw_query": "Find X",
        "canonical_query": "find x",
        "canonical_hash": "h",
    }
    _same_state(snapshots.query_from(query), _textbook(CanonicalQuery, query), QUERY_COLUMNS)


def test_a_snapshot_can_be_merged_into_a_session_without_a_query() -> None:
    """A detached instance with an identity key is what Session.merge(load=False) takes."""
    from sqlalchemy.orm import Session

    ours = snapshots.mnest([MNEST[k] for k in MNEST_COLUMNS])
    with Session() as session:
        merged = session.merge(ours, load=False)
        # persistent in the session at once, with no database: nothing had to be loaded
        assert inspect(merged).persistent
        assert merged.weight == 0.45 and not session.dirty


def test_the_identity_key_is_the_mappers_own() -> None:
    ours = snapshots.mnest([MNEST[k] for k in MNEST_COLUMNS])
    assert inspect(ours).key == inspect(Mnest).identity_key_from_primary_key(["m-1"])


def test_a_row_with_extra_trailing_values_gives_the_tables_columns_only() -> None:
    # a lookup under the lock returns the row and a flag after its columns
    ours = snapshots.mnest([*(MNEST[k] for k in MNEST_COLUMNS), True])
    _same_state(ours, _textbook(Mnest, MNEST), MNEST_COLUMNS)
    assert {k for k in vars(ours) if not k.startswith("_sa_")} == set(MNEST_COLUMNS)


def test_a_row_short_of_the_tables_columns_is_the_packages_error() -> None:
    with pytest.raises(StoreError, match="16 values for the 17 columns of Mnest"):
        snapshots.mnest([MNEST[k] for k in MNEST_COLUMNS[:-1]])


def test_mnests_built_in_one_loop_equal_the_textbook_ones_row_by_row() -> None:
    second = MNEST | {"id": "m-2", "weight": 0.3, "tags": None}
    rows = [
        [MNEST[k] for k in MNEST_COLUMNS],
        [*(second[k] for k in MNEST_COLUMNS), True],  # a flag after the columns is left out
    ]
    built = snapshots.mnests(rows)
    assert [m.id for m in built] == ["m-1", "m-2"]
    _same_state(built[0], _textbook(Mnest, MNEST), MNEST_COLUMNS)
    _same_state(built[1], _textbook(Mnest, second), MNEST_COLUMNS)
    assert {k for k in vars(built[1]) if not k.startswith("_sa_")} == set(MNEST_COLUMNS)
    assert inspect(built[1]).key == inspect(Mnest).identity_key_from_primary_key(["m-2"])
    assert snapshots.mnests([]) == []
    with pytest.raises(StoreError, match="16 values for the 17 columns of Mnest"):
        snapshots.mnests([rows[0], rows[0][:-1]])
