"""Listings are the same from one store to another: edges first seen at the same instant
(the passings of one turn) come in edge-key order, whatever ids were drawn."""

from __future__ import annotations

from mnestoma import Mnestoma
from mnestoma.core.clock import MovableClock

TURN = [
    ("web.search", "2.1", "http.fetch", "1.4"),
    ("http.fetch", "1.4", "text.sum", "0.9"),
    ("a.first", "1", "z.last", "1"),
    ("http.fetch", "1.4", "pdf.read", None, False),
]


def test_edges_of_one_turn_are_listed_in_edge_key_order(store_url: str) -> None:
    keys = []
    for _ in range(4):  # new ids each time: the order must not depend on them
        with Mnestoma(store_url, clock=MovableClock()) as m:
            assert m.edges() == []
            m.record_turn("t1", TURN)
            edges = m.edges()
            keys.append([(e.src_executor, e.dst_executor) for e in edges])
            with m.engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM events")
                conn.exec_driver_sql("DELETE FROM mnests")
    assert keys[0] == sorted(keys[0])
    assert all(k == keys[0] for k in keys)
