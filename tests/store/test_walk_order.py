"""walk's order is total and the same on both engines and from store to store: best score
first, then the shorter path, then the path as spelled (the source's version, then each
executor and version reached, byte by byte), then the ids. Tied paths used to follow their
random ids, so that the same edges came out in another order in another store."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import mnest_row
from sqlalchemy import insert

import mnestoma
from mnestoma import Mnestoma
from mnestoma.schema.models import Mnest

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# Edges of one weight, written at one instant: every path of one length ties. Their ids run
# against the order of their names, so that an order by id is the reverse of the one wanted.
EDGES = [
    ("a", "1", "b", "1"),
    ("a", "1", "c", "1"),
    ("a", "1", "B", "1"),  # "B" < "b" byte by byte (and after it in many locales)
    ("a", "2", "b", "1"),  # the source's other version
    ("a", "1", "b", "2"),  # another version of b: "b" "1" before "b" "2"
    ("b", "1", "z", "1"),
    ("c", "1", "z", "1"),
    ("b", "2", "y", "1"),
]
WANTED = [
    ["a@1", "B@1"],
    ["a@1", "b@1"],
    ["a@1", "b@2"],
    ["a@1", "c@1"],
    ["a@2", "b@1"],
    ["a@1", "b@1", "z@1"],
    ["a@1", "b@2", "y@1"],
    ["a@1", "c@1", "z@1"],
    ["a@2", "b@1", "z@1"],
]


def _load(url: str, ids: list[str]) -> None:
    rows: list[dict[str, Any]] = []
    for mnest_id, (src, sv, dst, dv) in zip(ids, EDGES, strict=True):
        rows.append(
            mnest_row(
                NOW, id=mnest_id, src_executor=src, src_version=sv, dst_executor=dst, dst_version=dv
            )
        )
    with Mnestoma(url, clock=lambda: NOW) as store, store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), rows)


def _spelled(paths: list[list[Mnest]]) -> list[list[str]]:
    return [
        [f"{p[0].src_executor}@{p[0].src_version}"]
        + [f"{m.dst_executor}@{m.dst_version}" for m in p]
        for p in paths
    ]


@pytest.mark.parametrize("ids_run", ["against the names", "with the names"])
def test_tied_paths_come_out_by_their_spelling_whatever_their_ids(
    store_url: str, ids_run: str
) -> None:
    ids = [f"mn_{i:016d}" for i in range(len(EDGES))]
    if ids_run == "against the names":
        ids.reverse()
    _load(store_url, ids)
    with Mnestoma(store_url, clock=lambda: NOW) as store:
        assert _spelled(store.walk("a")) == WANTED
        for limit in range(1, len(WANTED) + 1):  # the best n are the first n, on each engine
            assert _spelled(store.walk("a", limit=limit)) == WANTED[:limit]


def test_the_same_edges_walk_in_the_same_order_in_two_stores(
    store_url: str, empty_db_url: str
) -> None:
    """What a reader sees when running an example twice: new ids, the same order."""
    mnestoma.upgrade(empty_db_url)
    for url in (store_url, empty_db_url):
        with Mnestoma(url, clock=lambda: NOW) as store:
            for src, sv, dst, dv in EDGES:
                store.record_passing(src, sv, dst, dv)
    with Mnestoma(store_url) as one, Mnestoma(empty_db_url) as other:
        assert _spelled(one.walk("a")) == _spelled(other.walk("a"))
