"""``mnestoma status``: who feeds the store and whether the ager runs, from facts (§6, §8)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_kit import STATUS_KEYS, run_ok
from sqlalchemy import event
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.core.rules import AgerReport
from mnestoma.maintenance.status import (
    FEEDING_STATEMENT,
    READING_STATEMENT,
    collect_status,
    render_status,
)
from mnestoma.recording.tracing import executor, turn, wish
from mnestoma.schema.sql.tables import AGER_RUNS
from mnestoma.testing.clock import MovableClock

RECORDERS = ["call", "tracer", "otel", "ager", "cli"]
NEW_KEYS = STATUS_KEYS[STATUS_KEYS.index("passings_by_recorder") :]


def status_and_scans(url: str, clock: MovableClock) -> tuple[Any, list[str]]:
    """The status of the store at ``url`` and every statement it ran that scans the passings."""
    engine = mnestoma.make_engine(url)
    scans: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if re.search(r"\bkind IN \(", statement, re.IGNORECASE):
            scans.append(statement)

    try:
        return collect_status(engine, clock=clock), scans
    finally:
        engine.dispose()


def status_json(url: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(run_ok("status", "--json", "--database-url", url).stdout)
    return data


@executor("fs.search", "1.2")
def search(pattern: str) -> list[str]:
    return [f"/reports/{pattern}-2026.pdf", f"/reports/{pattern}-2025.pdf"]


@executor("fs.read", "2.0")
def read(path: str) -> bytes:
    return f"%PDF contents of {path}".encode()


def traced_turn(store: mnestoma.Mnestoma, turn_id: str) -> None:
    """fs.search -> fs.read, and a wish for pdf.to_text: two passings and a proto."""
    with turn(store, turn_id, strict=True):
        body = read(search("annual")[0])
        wish("pdf.to_text", consumed=body, desired_sig={"summary": "PDF to text"})


# --- who recorded the passings --------------------------------------------------------------


def test_a_store_fed_only_by_calls_says_it_is_not_fed_automatically(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2")
    store.record_turn("t1", [("a", "1", "b", "2")])
    st = collect_status(store_url, clock=clock)
    assert st.fed_automatically is False
    assert st.passings_by_recorder is not None
    assert st.passings_by_recorder["call"].passings == 2
    assert st.passings_by_recorder["call"].last == clock.now
    assert st.automatic == {}
    assert st.feeding().startswith(FEEDING_STATEMENT)
    assert "calls of the API (2)" in st.feeding()
    text = run_ok("status", "--database-url", store_url).stdout
    assert "not fed automatically here" in text and "fed automatically:" not in text
    assert "recorders  call 2 (last 2026-01-01 12:00:00Z)" in text


def test_an_empty_store_is_not_fed_and_says_no_more(store_url: str) -> None:
    data = status_json(store_url)
    assert data["fed_automatically"] is False
    assert data["feeding"] == FEEDING_STATEMENT
    assert data["passings_by_recorder"] == {
        r: {"passings": 0, "last": None, "ok": 0, "error": 0} for r in RECORDERS
    }
    assert (data["outcomes_reported"], data["outcomes"]) == (False, None)


def test_tracer_passings_say_fed_by_the_tracer_with_the_count_and_last_instant(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    traced_turn(store, "t1")
    clock.advance(hours=2)
    traced_turn(store, "t2")
    last = clock.now
    clock.advance(days=3)
    st = collect_status(store_url, clock=clock)
    assert st.fed_automatically is True
    assert st.automatic == {"tracer": st.passings_by_recorder["tracer"]}  # type: ignore[index]
    assert (st.automatic["tracer"].passings, st.automatic["tracer"].last) == (4, last)
    assert st.feeding() == (
        "fed automatically: 4 passings by the in-process tracer (mnestoma.tracing), "
        "last at 2026-01-01 14:00:00Z (3 days ago); "
        "none by the OpenTelemetry processor (mnestoma.otel)."
    )
    data = status_json(store_url)
    assert data["fed_automatically"] is True
    # fs.read returned after fs.search each time; the wish for pdf.to_text has no outcome
    assert data["passings_by_recorder"]["tracer"] == {
        "passings": 4,
        "last": "2026-01-01T14:00:00Z",
        "ok": 2,
        "error": 0,
    }
    assert data["outcomes"] == (
        "reported by the in-process tracer (mnestoma.tracing): 2 of 4 passings (2 ok, 0 error)"
    )
    assert data["passings_by_recorder"]["call"]["passings"] == 0
    assert "fed automatically: 4 passings by the in-process tracer" in render_status(st)


def test_otel_passings_say_fed_by_the_opentelemetry_processor(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_turn(
        "0af7651916cd43dd8448eb211c80319c",
        [("web.search", "1", "http.fetch", "1")],
        recorder="otel",
    )
    clock.advance(minutes=5)
    store.record_turn(
        "b7ad6b7169203331b7ad6b7169203331",
        [("web.search", "1", "http.fetch", "1"), ("http.fetch", "1", "text.summarise", "1")],
        recorder="otel",
    )
    traced_turn(store, "t-tracer")
    st = collect_status(store_url, clock=clock)
    assert st.fed_automatically is True
    assert set(st.automatic) == {"tracer", "otel"}
    assert st.automatic["otel"].passings == 3 and st.automatic["otel"].last == clock.now
    feeding = st.feeding()
    assert "2 passings by the in-process tracer (mnestoma.tracing)" in feeding
    assert "3 passings by the OpenTelemetry processor (mnestoma.otel)" in feeding
    assert "last at 2026-01-01 12:05:00Z (now)" in feeding
    assert "recorders  tracer 2 (last 2026-01-01 12:05:00Z), otel 3" in render_status(st)


def test_other_recorders_alone_never_count_as_automatic(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_turn("t1", [("a", "1", "b", "2")], recorder="cli")
    store.record_passing("a", "1", "c", "2", recorder="ager")
    st = collect_status(store_url, clock=clock)
    assert st.fed_automatically is False
    assert "the command line (1)" in st.feeding() and "the ager (1)" in st.feeding()


def test_the_passings_are_read_in_one_scan_and_totalled_across_recorders(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2")  # by a call, without a turn
    clock.advance(hours=1)
    store.record_turn("t1", [("a", "1", "c", "1")], recorder="tracer")
    clock.advance(hours=1)
    store.record_passing("a", "1", "b", "2")  # reinforced, without a turn
    st, scans = status_and_scans(store_url, clock)
    assert len(scans) == 1, scans
    assert (st.passings, st.passings_with_turn) == (3, 1)
    assert (st.last_passing, st.last_turn_passing) == (clock.now, clock.now - timedelta(hours=1))
    assert st.passings_by_recorder is not None
    assert st.passings_by_recorder["call"].passings == 2
    assert st.passings_by_recorder["tracer"].passings == 1


# --- outcomes (contract §11) ----------------------------------------------------------------


def test_status_counts_the_outcomes_each_recorder_reported(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2", outcome="ok")
    store.record_passing("a", "1", "b", "2", outcome="error")
    store.record_passing("a", "1", "c", "2")
    store.record_turn("t1", [("a", "1", "b", "2")], recorder="cli")
    st = collect_status(store_url, clock=clock)
    assert st.passings_by_recorder is not None
    call = st.passings_by_recorder["call"]
    assert (call.passings, call.ok, call.error, call.with_outcome) == (3, 1, 1, 2)
    assert (st.passings_by_recorder["cli"].ok, st.passings_by_recorder["cli"].error) == (0, 0)
    assert st.outcomes_reported is True and set(st.reporting_outcomes) == {"call"}
    assert st.outcomes() == "reported by calls of the API: 2 of 3 passings (1 ok, 1 error)"
    text = run_ok("status", "--database-url", store_url).stdout
    assert "outcomes   reported by calls of the API: 2 of 3 passings (1 ok, 1 error)" in text
    data = status_json(store_url)
    assert data["passings_by_recorder"]["call"] == {
        "passings": 3,
        "last": "2026-01-01T12:00:00Z",
        "ok": 1,
        "error": 1,
    }
    assert data["outcomes_reported"] is True and data["outcomes"] == st.outcomes()


def test_passings_without_outcomes_say_none_was_reported(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2")
    store.record_turn("t1", [("a", "1", "b", "2"), ("b", "2", "c", "1")], recorder="otel")
    st = collect_status(store_url, clock=clock)
    assert st.outcomes_reported is False and st.reporting_outcomes == {}
    text = run_ok("status", "--database-url", store_url).stdout
    assert "outcomes   none reported: no passing here says whether" in text
    assert "reported by" not in text
    data = status_json(store_url)
    assert data["outcomes_reported"] is False
    assert data["outcomes"].startswith("none reported")
    assert {v["ok"] + v["error"] for v in data["passings_by_recorder"].values()} == {0}


def test_the_outcomes_are_counted_in_the_same_one_scan_of_the_passings(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2", outcome="error")
    st, scans = status_and_scans(store_url, clock)
    assert len(scans) == 1 and "outcome" in scans[0], scans
    assert st.passings_by_recorder is not None
    assert st.passings_by_recorder["call"].error == 1


def test_a_store_before_outcomes_claims_none_and_says_they_are_not_known(
    empty_db_url: str,
) -> None:
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url, clock=MovableClock()) as m:
        m.record_passing("a", "1", "b", "2")
    mnestoma.downgrade(empty_db_url, "0007")  # no events.outcome
    st = collect_status(empty_db_url)
    assert st.outcomes_recorded is False and st.outcomes_reported is None
    assert st.passings_by_recorder is not None
    assert (st.passings_by_recorder["call"].ok, st.passings_by_recorder["call"].error) == (
        None,
        None,
    )
    data = status_json(empty_db_url)
    assert data["outcomes_reported"] is None
    assert data["passings_by_recorder"]["call"] == {
        "passings": 1,
        "last": "2026-01-01T12:00:00Z",
        "ok": None,
        "error": None,
    }
    text = run_ok("status", "--database-url", empty_db_url).stdout
    assert "outcomes   not known: revision 0007 has no events.outcome" in text


# --- the ager's runs ------------------------------------------------------------------------


def test_the_ager_has_never_run_here_when_ager_runs_is_empty(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "2")
    store.apply_ager(dry_run=True)  # a dry run is not a run
    st = collect_status(store_url, clock=clock)
    assert (st.ager_runs, st.ager_runs_recent, st.last_ager_run) == (0, 0, None)
    assert "the ager has never run here" in render_status(st)
    assert status_json(store_url)["ager_runs"] == {
        "total": 0,
        "last_30_days": 0,
        "last": None,
        "unfinished": [],
    }


def test_each_counter_of_the_ager_report_is_a_column_of_ager_runs() -> None:
    """A run's row, the status and its JSON take the counters from ``AgerReport``'s fields:
    a new counter is a field there and its column here, nothing else."""
    counters = {f.name for f in fields(AgerReport)}
    assert set(AGER_RUNS.c.keys()) - counters == {"id", "ts", "duration_s"}


def test_ager_runs_are_counted_in_the_last_30_days_as_the_clock_moves(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    start = clock.now
    store.record_passing("a", "1", "b", "2")
    store.apply_ager()
    clock.advance(days=10)
    store.apply_ager()
    clock.advance(days=35)  # start + 45 days: the edge has decayed below 0.20
    report = store.apply_ager()
    last_run = clock.now
    clock.advance(days=5)  # start + 50: only the last run is in the window
    st = collect_status(store_url, clock=clock)
    assert (st.ager_runs, st.ager_runs_recent) == (3, 1)
    assert st.last_ager_run is not None and st.last_ager_run.ts == last_run
    assert st.last_ager_run.report == report  # read back as the run's AgerReport
    assert st.last_ager_run.counters() == asdict(report)
    assert report.to_decaying == 1
    assert st.last_ager_run.duration_s >= 0
    text = render_status(st)
    assert (
        "ager       3 runs, 1 in the last 30 days; last at 2026-02-15 12:00:00Z (5 days ago)"
        in text
    )
    assert f"decayed {report.decayed}, to_decaying 1, merged 0, protos_pruned 0," in text
    clock.set(start + timedelta(days=25))  # runs at 0 and 10 days are within 30 days; 45 is ahead
    assert collect_status(store_url, clock=clock).ager_runs_recent == 2
    clock.set(start + timedelta(days=100))
    assert collect_status(store_url, clock=clock).ager_runs_recent == 0


# --- the command line's own writes ------------------------------------------------------------


def test_command_line_writes_are_recorded_as_cli_and_the_ager_as_ager(
    store_url: str,
) -> None:
    run_ok("record", "a@1", "b@2", "--database-url", store_url)
    proto = json.loads(
        run_ok("record", "a@1", "pdf", "--proto", "--json", "--database-url", store_url).stdout
    )
    edge = json.loads(run_ok("record", "a@1", "c@1", "--json", "--database-url", store_url).stdout)
    run_ok("promote", proto["id"], "1.0", "--database-url", store_url)
    run_ok("transition", edge["id"], "decaying", "--database-url", store_url)
    run_ok("transition", edge["id"], "active", "--database-url", store_url)
    with mnestoma.Mnestoma(store_url) as m:
        events = m.events()
    assert [(e.kind, e.recorder) for e in events] == [
        ("created", "cli"),
        ("created", "cli"),
        ("created", "cli"),
        ("promoted", "cli"),
        ("transition", "cli"),
        ("transition", "cli"),
    ]
    data = status_json(store_url)
    assert data["passings_by_recorder"]["cli"]["passings"] == 3
    assert data["fed_automatically"] is False


def test_mnestoma_age_writes_ager_events(store_url: str) -> None:
    old = MovableClock()
    with mnestoma.Mnestoma(store_url, clock=old) as m:
        m.record_passing("a", "1", "b", "2")  # decays below 0.20 by the real now
    run_ok("age", "--database-url", store_url)
    with mnestoma.Mnestoma(store_url) as m:
        events = m.events()
    assert [(e.kind, e.recorder) for e in events] == [("created", "call"), ("transition", "ager")]
    assert status_json(store_url)["ager_runs"]["total"] == 1


# --- the JSON and the rules of reading ------------------------------------------------------------


def test_status_json_carries_the_same_facts_under_documented_keys(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    traced_turn(store, "t1")
    store.apply_ager()
    data = status_json(store_url)
    assert list(data)[-len(NEW_KEYS) :] == NEW_KEYS
    assert list(data["passings_by_recorder"]) == RECORDERS
    assert list(data["ager_runs"]) == ["total", "last_30_days", "last", "unfinished"]
    assert data["ager_runs"]["unfinished"] == []
    assert list(data["ager_runs"]["last"]) == [
        "ts",
        "duration_s",
        "decayed",
        "to_decaying",
        "merged",
        "protos_pruned",
        "archive_candidates",
    ]
    assert data["ager_runs"]["last"]["ts"] == "2026-01-01T12:00:00Z"
    assert data["ager_runs"]["total"] == 1
    assert data["feeding"].startswith("fed automatically: 2 passings by the in-process tracer")
    assert data["reading"] == READING_STATEMENT
    text = run_ok("status", "--database-url", store_url).stdout
    assert data["feeding"] in text and READING_STATEMENT in text


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file of a folder and the SHA-256 of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_status_changes_no_byte_of_a_sqlite_store_and_creates_no_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    clock = MovableClock()
    with mnestoma.Mnestoma(url, clock=clock) as m:
        traced_turn(m, "t1")
        m.record_passing("a", "1", "b", "2")
        m.apply_ager()
    before = _snapshot(tmp_path)
    # the ager's run lock and the file on which waiting writers say so stay beside the
    # store (empty: only their flocks matter)
    assert list(before) == ["store.sqlite", "store.sqlite-ager.lock", "store.sqlite-writers.lock"]
    run_ok("status", "--database-url", url)
    run_ok("status", "--json", "--database-url", url)
    collect_status(url, clock=clock)
    assert _snapshot(tmp_path) == before


def test_a_store_behind_head_says_upgrade_and_claims_nothing_about_recorders(
    empty_db_url: str,
) -> None:
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url, clock=MovableClock()) as m:
        m.record_turn("t1", [("a", "1", "b", "2")], recorder="tracer")
    mnestoma.downgrade(empty_db_url, "0002")  # no events.recorder, no ager_runs
    data = status_json(empty_db_url)
    assert (data["schema"], data["passings"]) == ("behind", 1)
    assert data["passings_by_recorder"] is None and data["ager_runs"] is None
    assert data["fed_automatically"] is None
    assert "who recorded these passings is not known" in data["feeding"]
    text = run_ok("status", "--database-url", empty_db_url).stdout
    assert "run `mnestoma db upgrade`" in text
    assert "fed automatically" not in text and "recorders  not known" in text
    assert mnestoma.current_revision(empty_db_url) == "0002"


@pytest.mark.parametrize("schema", ["missing", "none"])
def test_a_store_without_schema_is_not_fed_automatically(schema: str, tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    if schema == "none":
        path.touch()
    url = make_url(f"sqlite:///{path}")
    st = collect_status(url)
    assert st.schema == schema
    assert (st.fed_automatically, st.passings_by_recorder, st.ager_runs) == (False, None, None)
    assert st.feeding() == FEEDING_STATEMENT
    assert "ager " not in render_status(st)


# --- the planner's chains ---------------------------------------------------------------------


def test_status_counts_the_planners_chains_in_text_and_json(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    store.record_turn("t1", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("c", "1", "d", "1")])
    store.record_turn("t2", [("x", "1", "b", "1"), ("b", "1", "c", "1")])
    st = collect_status(store_url)
    assert (st.chains, st.chains_estimated) == (3, False)
    assert "chains     3 (pairs of consecutive links of recorded turns" in render_status(st)
    data = status_json(store_url)
    assert (data["chains"], data["chains_estimated"]) == (3, False)


def test_a_store_before_chains_says_nothing_of_them(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url, clock=MovableClock()) as m:
        m.record_turn("t1", [("a", "1", "b", "1"), ("b", "1", "c", "1")])
    mnestoma.downgrade(empty_db_url, "0013")  # no mnest_chains
    st = collect_status(empty_db_url)
    assert (st.schema, st.chains, st.chains_estimated) == ("behind", None, False)
    assert "chains " not in render_status(st)
    assert status_json(empty_db_url)["chains"] is None
