"""The canonical query log: request-normalisation telemetry that touches no mnest."""

from __future__ import annotations

import hashlib

import pytest

from mnestoma import InvalidInput, Mnestoma


def test_a_logged_query_keeps_raw_canonical_hash_turn_and_time(store: Mnestoma, clock) -> None:
    q = store.log_canonical_query("  Find the PDFs!  ", "find pdf", turn_id="t-7")
    assert (q.raw_query, q.canonical_query, q.turn_id, q.ts) == (
        "  Find the PDFs!  ",
        "find pdf",
        "t-7",
        clock.now,
    )
    assert q.canonical_hash == hashlib.sha256(b"find pdf").hexdigest()
    assert isinstance(q.id, int)


def test_the_query_log_touches_no_mnest_and_no_event(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    before = ([r.as_dict() for r in store.edges()], [e.as_dict() for e in store.events()])
    for i in range(5):
        store.log_canonical_query(f"raw {i}", "a b", turn_id="t-1")
    after = ([r.as_dict() for r in store.edges()], [e.as_dict() for e in store.events()])
    assert after == before
    assert store.events(turn_id="t-1") == []


def test_top_counts_canonical_forms_most_frequent_first(store: Mnestoma, clock) -> None:
    for raw in ("Find PDF", "find pdfs", "FIND PDF"):
        store.log_canonical_query(raw, "find pdf")
        clock.advance(days=0.1)
    store.log_canonical_query("summarise", "summarise")
    top = store.top_queries()
    assert [(t.canonical_query, t.count) for t in top] == [("find pdf", 3), ("summarise", 1)]
    assert top[1].last_ts == clock.now


def test_recent_lists_the_newest_first(store: Mnestoma, clock) -> None:
    for i in range(4):
        store.log_canonical_query(f"q{i}", f"q{i}")
        clock.advance(days=1)
    assert [q.canonical_query for q in store.recent_queries(limit=2)] == ["q3", "q2"]


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [("", "x"), ("x", "   "), (None, "x"), ("x", 3), ("a\x00b", "x"), ("x", "y" * 100_001)],
)
def test_a_bad_query_is_invalid_input_and_nothing_is_logged(
    store: Mnestoma, raw: object, canonical: object
) -> None:
    with pytest.raises(InvalidInput):
        store.log_canonical_query(raw, canonical)  # type: ignore[arg-type]
    assert store.recent_queries() == []


def test_queries_may_span_lines(store: Mnestoma) -> None:
    q = store.log_canonical_query("find\n\tpdf", "find pdf")
    assert q.raw_query == "find\n\tpdf"
