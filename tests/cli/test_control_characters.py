"""Control characters and the terminal: free text refuses C1 controls as it refuses C0 ones,
and whatever a row holds (written before, or by other code) is printed escaped, in tables
and in JSON, never raw (U+009B is an 8-bit CSI to xterm and its kin)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from cli_kit import run, run_ok
from conftest import mnest_row
from sqlalchemy import insert

import mnestoma
from mnestoma.core.errors import InvalidInput
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines import make_engine
from mnestoma.schema.models import CanonicalQuery, Event, Mnest

# The C1 controls a terminal may act on (CSI, OSC, NEL), DEL and ESC.
C1_TEXTS = {"csi": "red \x9b31m text", "osc": "a\x9d0;title\x9c", "nel": "a\x85b"}
RAW = ("\x9b", "\x9d", "\x9c", "\x85", "\x1b", "\x7f")
# What a row written by other code holds: an 8-bit CSI, ESC, DEL, a carriage return.
STORED = "q \x9b31m red\x1b[0m \x7f\rend"
AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _no_raw_controls(text: str) -> None:
    found = sorted({hex(ord(c)) for c in text if c in RAW or c == "\r"})
    assert found == [], f"raw control characters on stdout: {found}"


def _facade_refusals(store: Any, mnest_id: str, bad: str) -> list[str]:
    """The free-text arguments that refused ``bad`` through the sync facade."""
    refused = []
    for what, call in (
        ("raw_query", lambda: store.log_canonical_query(bad, "q")),
        ("canonical_query", lambda: store.log_canonical_query("q", bad)),
        ("reason", lambda: store.transition_state(mnest_id, "superseded", reason=bad)),
    ):
        with pytest.raises(InvalidInput, match="control characters"):
            call()
        refused.append(what)
    return refused


@pytest.mark.parametrize("bad", list(C1_TEXTS.values()), ids=list(C1_TEXTS))
def test_free_text_with_a_c1_control_is_refused_through_the_sync_door(
    store_url: str, bad: str
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        edge = store.record_passing("a", "1", "b", "1")
        events = [e.as_dict() for e in store.events()]
        assert _facade_refusals(store, edge.id, bad) == ["raw_query", "canonical_query", "reason"]
        assert store.recent_queries() == []
        assert [e.as_dict() for e in store.events()] == events
        assert store.get(edge.id).state == "active"  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", list(C1_TEXTS.values()), ids=list(C1_TEXTS))
def test_free_text_with_a_c1_control_is_refused_through_the_async_door(
    store_url: str, bad: str
) -> None:
    async def go() -> None:
        async with AsyncMnestoma(store_url) as store:
            edge = await store.record_passing("a", "1", "b", "1")
            for call in (
                store.log_canonical_query(bad, "q"),
                store.log_canonical_query("q", bad),
                store.transition_state(edge.id, "superseded", reason=bad),
            ):
                with pytest.raises(InvalidInput, match="control characters"):
                    await call
            assert await store.recent_queries() == []
            assert [e.kind for e in await store.events()] == ["created"]

    asyncio.run(go())


def test_a_transition_reason_with_a_c1_control_is_bad_input_on_the_command_line(
    store_url: str,
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        edge = store.record_passing("a", "1", "b", "1")
    result = run(
        "transition", edge.id, "superseded", "--reason", "x\x9b2J", "--database-url", store_url
    )
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "control characters" in result.stderr
    _no_raw_controls(result.stdout + result.stderr)
    with mnestoma.Mnestoma(store_url) as store:
        assert store.get(edge.id).state == "active"  # type: ignore[union-attr]


def test_newlines_and_tabs_in_free_text_are_still_taken(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        assert (
            store.log_canonical_query("find\n\tpdf\r\n", "find pdf").raw_query == "find\n\tpdf\r\n"
        )
        assert store.log_canonical_query("café \xa0 naïve", "café").raw_query == "café \xa0 naïve"


def _stored_raw(url: str) -> str:
    """Rows holding :data:`STORED` written past every check, as other code could: a logged
    query (raw and canonical), an event (its reason and turn), and an edge whose names hold
    it. The edge's id."""
    row = mnest_row(AT, src_executor="src" + STORED, dst_executor="dst\x9b")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(Mnest.__table__).values(row))
            conn.execute(
                insert(Event.__table__).values(
                    mnest_id=row["id"], kind="created", ts=AT, turn_id="t\x9b", reason=STORED
                )
            )
            conn.execute(
                insert(CanonicalQuery.__table__).values(
                    ts=AT, raw_query=STORED, canonical_query=STORED, canonical_hash="0" * 64
                )
            )
    finally:
        engine.dispose()
    return str(row["id"])


def _strings(value: Any) -> set[str]:
    """Every string a JSON value holds, keys aside."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(set(), *(_strings(v) for v in value))
    return set()


@pytest.mark.parametrize(
    "args",
    [
        ["queries"],
        ["queries", "--recent", "5"],
        ["events"],
        ["edges"],
        ["graph"],
        ["graph", "--format", "mermaid"],
    ],
    ids="-".join,
)
def test_stored_control_characters_reach_a_table_escaped(store_url: str, args: list[str]) -> None:
    _stored_raw(store_url)
    result = run_ok(*args, "--database-url", store_url)
    _no_raw_controls(result.stdout)
    assert "\\x9b" in result.stdout


@pytest.mark.parametrize(
    "args",
    [["queries"], ["queries", "--recent", "5"], ["events"], ["edges"], ["graph"]],
    ids="-".join,
)
def test_stored_control_characters_reach_json_escaped_and_read_back_whole(
    store_url: str, args: list[str]
) -> None:
    _stored_raw(store_url)
    result = run_ok(*args, "--json", "--database-url", store_url)
    _no_raw_controls(result.stdout)
    assert "\\u009b" in result.stdout
    held = _strings(json.loads(result.stdout))
    assert STORED in held or "src" + STORED in held, held


def test_a_query_table_escapes_every_control_the_row_holds(store_url: str) -> None:
    _stored_raw(store_url)
    out = run_ok("queries", "--recent", "5", "--database-url", store_url).stdout
    assert "q \\x9b31m red\\x1b[0m \\x7f\\rend" in out
    assert len(out.splitlines()) == 2  # the header and the row: its text on one line
