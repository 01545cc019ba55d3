"""The ``mnestoma`` command line: recording, reading, ageing, errors, demo (contract §6)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_kit import MNEST_KEYS, run, run_json, run_ok
from conftest import package_engine
from sqlalchemy import func, select

import mnestoma
from mnestoma.schema.models import CanonicalQuery, Event, Mnest

EVENT_KEYS = [
    "id",
    "mnest_id",
    "kind",
    "ts",
    "turn_id",
    "weight_before",
    "weight_after",
    "state_before",
    "state_after",
    "reason",
    "related_id",
    "recorder",
    "outcome",
    "occurrence",
]


class Clock:
    """A clock the seeding code sets by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def dump(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, sorted by id: equal dumps mean an unchanged store."""
    with package_engine(url) as engine, engine.connect() as conn:
        return {
            t.name: [dict(r) for r in conn.execute(select(t).order_by(t.c.id)).mappings()]
            for t in (Mnest.__table__, Event.__table__, CanonicalQuery.__table__)
        }


def count(url: str, table: Any) -> int:
    with package_engine(url) as engine, engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.fixture
def seeded(store_url: str) -> Iterator[dict[str, Any]]:
    """A store with a two-edge chain, a recurring proto, a stale edge and a logged query.

    Times are relative to the real clock, because the command line reads the real clock.
    """
    now = datetime.now(UTC)
    clock = Clock(now - timedelta(days=60))
    m = mnestoma.Mnestoma(store_url, clock=clock)
    stale = m.record_passing("search", "1", "translate", "3")  # 0.30, 60 days old
    clock.now = now - timedelta(hours=5)
    for i in range(3):
        clock.now += timedelta(hours=1)
        m.record_turn(
            f"t{i}",
            [
                ("search", "1", "fetch", "2"),
                ("fetch", "2", "summarise", "1") if i < 2 else ("fetch", "2", "summarise", "2"),
                ("fetch", "2", "pdf.to_text", None, False, None, {"summary": "read PDFs"}),
            ],
        )
    m.log_canonical_query("What's new in PG 17?", "postgresql 17 changes", turn_id="t0")
    m.log_canonical_query("pg17 news", "postgresql 17 changes", turn_id="t1")
    m.log_canonical_query("sqlite wal", "sqlite wal", turn_id="t2")
    ids = {
        "stale": stale.id,
        "chain": m.find("search", "1", "fetch", "2").id,
        "proto": m.find("fetch", "2", "pdf.to_text", None, "proto").id,
    }
    m.close()
    yield {"url": store_url, **ids}


# --- help and entry points ------------------------------------------------------------------


def test_help_lists_every_subcommand() -> None:
    out = run_ok("--help").stdout
    for name in (
        "db",
        "status",
        "record",
        "edges",
        "events",
        "walk",
        "suggest",
        "vet",
        "protos",
        "promote",
        "transition",
        "age",
        "queries",
        "demo",
        "copy",
    ):
        assert f"  {name} " in out


def test_every_subcommand_accepts_database_url() -> None:
    for args in (
        ["db", "upgrade"],
        ["db", "downgrade"],
        ["db", "current"],
        ["db", "history"],
        ["db", "sql"],
        ["status"],
        ["record"],
        ["edges"],
        ["events"],
        ["walk"],
        ["suggest"],
        ["vet"],
        ["protos"],
        ["promote"],
        ["transition"],
        ["age"],
        ["queries"],
        ["demo"],
        ["copy"],
    ):
        assert "--database-url" in run_ok(*args, "--help").stdout, args


def test_python_dash_m_mnestoma_shows_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mnestoma", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "status" in proc.stdout


def test_mnestoma_script_runs_the_demo_without_leaving_files(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("mnestoma")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mnestoma"]
    proc = subprocess.run([*cmd, "demo"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pdf.to_text" in proc.stdout
    assert list(tmp_path.iterdir()) == []


# --- record ---------------------------------------------------------------------------------


def test_record_creates_an_active_edge_and_prints_it(store_url: str) -> None:
    out = run_ok("record", "web.search@2.1", "http.fetch@1.4", "--database-url", store_url).stdout
    assert "web.search@2.1" in out and "http.fetch@1.4" in out and "active" in out
    with mnestoma.Mnestoma(store_url) as m:
        row = m.find("web.search", "2.1", "http.fetch", "1.4")
    assert row is not None and row.uses == 1 and row.id in out


def test_record_twice_reinforces_the_same_row(store_url: str) -> None:
    first = run_json("record", "a@1", "b@2", "--database-url", store_url)
    second = run_json("record", "a@1", "b@2", "--database-url", store_url)
    assert second["id"] == first["id"]
    assert second["uses"] == 2
    assert second["weight"] == pytest.approx(0.45, abs=1e-3)


def test_record_proto_keeps_the_summary_as_desired_sig(store_url: str) -> None:
    row = run_json(
        "record", "http.fetch@1.4", "pdf.to_text", "--proto", "--summary", "read PDFs",
        "--database-url", store_url,
    )  # fmt: skip
    assert row["state"] == "proto"
    assert row["dst_version"] is None
    assert row["desired_sig"] == {"summary": "read PDFs"}


def test_record_with_turn_and_tags_stores_both(store_url: str) -> None:
    row = run_json(
        "record", "a@1", "b@2", "--turn", "turn-9", "--tag", "team=search", "--tag", "env=prod",
        "--database-url", store_url,
    )  # fmt: skip
    assert row["tags"] == {"team": "search", "env": "prod"}
    evs = run_json("events", "--turn", "turn-9", "--database-url", store_url)
    assert [e["mnest_id"] for e in evs] == [row["id"]]


def test_record_same_turn_twice_counts_once(store_url: str) -> None:
    run_ok("record", "a@1", "b@2", "--turn", "t1", "--database-url", store_url)
    row = run_json("record", "a@1", "b@2", "--turn", "t1", "--database-url", store_url)
    assert row["uses"] == 1
    assert count(store_url, Event.__table__) == 1


# --- bad input: exit 2, one line, nothing written -------------------------------------------

BAD_INPUTS = [
    ["record", "a", "b@1"],
    ["record", "a@1", "b"],
    ["record", "@1", "b@1"],
    ["record", "a@1", "b@1", "--summary", "x"],
    ["record", "a@1", "b@1", "--proto"],
    ["record", "a@1", "b", "--proto", "--sig", "[not json"],
    ["record", "a@1", "b", "--proto", "--sig", "[1, 2]"],
    ["record", "a@1", "b@1", "--tag", "novalue"],
    ["record", "a@1", "b@1", "--turn", " "],
    ["record", "a@1", "b\x01@1"],
    ["record", "a@1", "b@" + "9" * 300],
    ["record", "a@1"],
    ["record", "a@1", "b@1", "--no-such-option"],
    ["edges", "--state", "bogus"],
    ["walk", "search", "--depth", "0"],
    ["walk", "search", "--depth", "many"],
    ["walk", "search", "--min-weight", "1.5"],
    ["suggest", "search", "-k", "0"],
    ["protos", "--min-uses", "0"],
    ["queries", "--top", "1", "--recent", "1"],
    ["queries", "--recent", "0"],
    ["transition", "{proto}", "bogus"],
    ["promote", "{proto}", " "],
    ["transition", "{chain}", "decaying", "--reason", "  "],
]


@pytest.mark.parametrize("args", BAD_INPUTS, ids=lambda a: " ".join(a)[:40])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    seeded: dict[str, Any], args: list[str]
) -> None:
    url = seeded["url"]
    before = dump(url)
    args = [seeded[a[1:-1]] if a in ("{proto}", "{chain}") else a for a in args]
    result = run(*args, "--database-url", url)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    assert dump(url) == before


def test_unknown_mnest_exits_1(store_url: str) -> None:
    result = run("promote", "mn_doesnotexist000", "1.0", "--database-url", store_url)
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: no mnest with id 'mn_doesnotexist000'"


def test_refused_transition_exits_1_and_changes_nothing(seeded: dict[str, Any]) -> None:
    before = dump(seeded["url"])
    result = run("transition", seeded["proto"], "active", "--database-url", seeded["url"])
    assert result.exit_code == 1
    assert "promote" in result.stderr
    assert dump(seeded["url"]) == before


def test_promoting_an_active_edge_exits_1(seeded: dict[str, Any]) -> None:
    result = run("promote", seeded["chain"], "3", "--database-url", seeded["url"])
    assert result.exit_code == 1
    assert "not a proto" in result.stderr


def test_debug_shows_the_traceback(store_url: str) -> None:
    plain = run("promote", "mn_doesnotexist000", "1", "--database-url", store_url)
    debug = run("--debug", "promote", "mn_doesnotexist000", "1", "--database-url", store_url)
    assert "Traceback" not in plain.output and plain.exit_code == 1
    assert isinstance(debug.exception, mnestoma.NotFound)


def test_password_of_an_unreachable_server_is_never_printed() -> None:
    url = "postgresql://alice:pa55-w0rd-XYZ@127.0.0.1:1/store"
    for args in (
        ["status"],
        ["edges"],
        ["record", "a@1", "b@2"],
        ["db", "current"],
        ["db", "upgrade"],
        ["copy", "--to", "sqlite:///unused.sqlite"],
    ):
        result = run(*args, "--database-url", url)
        assert result.exit_code == 1, (args, result.output)
        assert "pa55-w0rd-XYZ" not in result.output, args
        assert result.stderr.startswith("Error: ") and "Traceback" not in result.output


def test_password_in_environment_url_is_never_printed() -> None:
    env = {"MNESTOMA_DATABASE_URL": "postgresql://alice:pa55-w0rd-XYZ@127.0.0.1:1/store"}
    result = run("status", env=env)
    assert result.exit_code == 1
    assert "pa55-w0rd-XYZ" not in result.output


# --- listings -------------------------------------------------------------------------------


def test_edges_json_is_an_array_keyed_by_column_with_utc_times(seeded: dict[str, Any]) -> None:
    rows = run_json("edges", "--database-url", seeded["url"])
    assert len(rows) == 5
    for row in rows:
        assert list(row) == MNEST_KEYS
        for key in ("ts_first", "ts_last", "ts_weight"):
            assert row[key].endswith("Z")
            assert datetime.fromisoformat(row[key]).utcoffset() == timedelta(0)


def test_edges_table_has_a_header_and_one_line_per_row(seeded: dict[str, Any]) -> None:
    lines = run_ok("edges", "--database-url", seeded["url"]).stdout.splitlines()
    assert lines[0].split() == [
        "ID", "SOURCE", "DESTINATION", "STATE", "WEIGHT", "USES", "OK", "ERROR", "LAST",
    ]  # fmt: skip
    assert len(lines) == 6
    assert any("fetch@2" in line and "pdf.to_text" in line and "proto" in line for line in lines)


def test_edges_show_each_rows_ok_and_error_counts(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        for outcome in ("ok", "error", "error", None):
            m.record_passing("search", "1", "fetch", "2", outcome=outcome)
        m.record_passing("fetch", "2", "summarise", "1")
    [failing, plain] = run_json("edges", "--database-url", store_url)
    assert (failing["uses"], failing["ok_count"], failing["error_count"]) == (4, 1, 2)
    assert (plain["uses"], plain["ok_count"], plain["error_count"]) == (1, 0, 0)
    lines = run_ok("edges", "--database-url", store_url).stdout.splitlines()
    header = lines[0].split()
    by_column = [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]
    # the LAST column's date and time are two words: compare the counts only
    assert [(r["USES"], r["OK"], r["ERROR"]) for r in by_column] == [
        ("4", "1", "2"),
        ("1", "0", "0"),
    ]


def test_edges_filter_by_source_destination_and_states(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    from_fetch = run_json("edges", "--src", "fetch", "--database-url", url)
    assert {r["dst_executor"] for r in from_fetch} == {"summarise", "pdf.to_text"}
    to_fetch = run_json("edges", "--dst", "fetch", "--database-url", url)
    assert [r["id"] for r in to_fetch] == [seeded["chain"]]
    protos_only = run_json("edges", "--state", "proto", "--database-url", url)
    assert [r["id"] for r in protos_only] == [seeded["proto"]]
    two_states = run_json("edges", "--state", "proto", "--state", "active", "--database-url", url)
    assert len(two_states) == 5
    assert run_json("edges", "--state", "decaying", "--database-url", url) == []
    assert run_ok("edges", "--state", "decaying", "--database-url", url).stdout == "(no edge)\n"


def test_events_are_listed_oldest_first_by_mnest_and_turn(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    all_events = run_json("events", "--database-url", url)
    assert all(list(e) == EVENT_KEYS for e in all_events)
    times = [e["ts"] for e in all_events]
    assert times == sorted(times)
    chain = run_json("events", "--mnest", seeded["chain"], "--database-url", url)
    assert [e["kind"] for e in chain] == ["created", "reinforced", "reinforced"]
    t1 = run_json("events", "--turn", "t1", "--database-url", url)
    assert {e["turn_id"] for e in t1} == {"t1"} and len(t1) == 3
    assert "KIND" in run_ok("events", "--database-url", url).stdout


def test_walk_prints_paths_best_score_first(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    paths = run_json("walk", "search", "--database-url", url)
    scores = [p["score"] for p in paths]
    assert scores == sorted(scores, reverse=True)
    assert paths[0]["path"] == "search@1 -> fetch@2"
    assert "search@1 -> fetch@2 -> summarise@1" in {p["path"] for p in paths}
    assert all(list(p) == ["rank", "score", "depth", "path", "mnest_ids", "edges"] for p in paths)
    shallow = run_json("walk", "search", "--depth", "1", "--database-url", url)
    assert {p["depth"] for p in shallow} == {1}
    strong = run_json("walk", "search", "--min-weight", "0.5", "--database-url", url)
    assert [p["path"] for p in strong] == ["search@1 -> fetch@2"]
    assert "search@1 -> fetch@2" in run_ok("walk", "search", "--database-url", url).stdout


def test_suggest_ranks_next_steps_with_or_without_version(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    rows = run_json("suggest", "fetch@2", "--database-url", url)
    assert [(r["dst_executor"], r["dst_version"]) for r in rows] == [
        ("summarise", "1"),
        ("summarise", "2"),
    ]
    assert rows[0]["rank"] == 1 and rows[0]["effective_weight"] > rows[1]["effective_weight"]
    assert len(run_json("suggest", "fetch", "-k", "1", "--database-url", url)) == 1
    assert run_json("suggest", "fetch@9", "--database-url", url) == []
    assert "summarise@1" in run_ok("suggest", "fetch@2", "--database-url", url).stdout


def test_suggest_order_decayed_uses_puts_the_long_habit_before_the_recent_edge(
    store_url: str,
) -> None:
    now = datetime.now(UTC)
    clock = Clock(now - timedelta(days=30, hours=1))
    m = mnestoma.Mnestoma(store_url, clock=clock)
    for _ in range(20):  # a habit: weight clamped at 1, 20 passings, then 30 days of fading
        clock.now += timedelta(seconds=30)
        m.record_passing("plan", "1", "habit", "1")
    clock.now = now - timedelta(minutes=5)
    for _ in range(5):  # recent: weight 0.30 + 4 × 0.15 = 0.90, five passings
        clock.now += timedelta(seconds=30)
        m.record_passing("plan", "1", "fresh", "1")
    m.close()
    by_weight = run_json("suggest", "plan@1", "--database-url", store_url)
    assert [r["dst_executor"] for r in by_weight] == ["fresh", "habit"]
    assert {r["order_by"] for r in by_weight} == {"weight"}
    by_count = run_json("suggest", "plan@1", "--order", "decayed_uses", "--database-url", store_url)
    assert [r["dst_executor"] for r in by_count] == ["habit", "fresh"]
    habit, fresh = by_count
    assert 20 * 0.5 < habit["score"] < 20 and 4.9 < fresh["score"] <= 5
    assert habit["effective_weight"] == pytest.approx(by_weight[1]["effective_weight"], rel=1e-3)
    text = run_ok("suggest", "plan@1", "--order", "decayed_uses", "--database-url", store_url)
    assert "COUNT" in text.stdout and text.stdout.index("habit@1") < text.stdout.index("fresh@1")
    bad = run("suggest", "plan@1", "--order", "uses", "--database-url", store_url)
    assert bad.exit_code == 2 and "decayed_uses" in bad.stderr


def test_protos_lists_recurring_protos_with_their_summary(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    rows = run_json("protos", "--database-url", url)
    assert [r["id"] for r in rows] == [seeded["proto"]]
    assert rows[0]["desired_sig"] == {"summary": "read PDFs"}
    assert "read PDFs" in run_ok("protos", "--database-url", url).stdout
    assert run_json("protos", "--min-uses", "4", "--database-url", url) == []


def test_queries_show_top_forms_and_recent_entries(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    top = run_json("queries", "--database-url", url)
    assert top[0]["canonical_query"] == "postgresql 17 changes" and top[0]["count"] == 2
    assert list(top[0]) == ["canonical_query", "canonical_hash", "count", "last_ts"]
    assert len(run_json("queries", "--top", "1", "--database-url", url)) == 1
    recent = run_json("queries", "--recent", "2", "--database-url", url)
    assert [r["raw_query"] for r in recent] == ["sqlite wal", "pg17 news"]
    assert "postgresql 17 changes" in run_ok("queries", "--database-url", url).stdout


# --- changing state -------------------------------------------------------------------------


def test_promote_makes_the_proto_active(seeded: dict[str, Any]) -> None:
    row = run_json("promote", seeded["proto"], "0.1", "--database-url", seeded["url"])
    assert (row["state"], row["dst_version"], row["desired_sig"]) == ("active", "0.1", None)
    kinds = [e["kind"] for e in run_json("events", "--mnest", seeded["proto"], "--database-url",
                                         seeded["url"])]  # fmt: skip
    assert kinds[-1] == "promoted"


def test_transition_moves_the_state_and_keeps_the_reason(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    row = run_json(
        "transition", seeded["chain"], "superseded", "--reason", "fetch v3", "--database-url", url
    )
    assert row["state"] == "superseded"
    last = run_json("events", "--mnest", seeded["chain"], "--database-url", url)[-1]
    assert (last["kind"], last["reason"], last["state_after"]) == (
        "transition",
        "fetch v3",
        "superseded",
    )


def test_age_dry_run_reports_and_changes_nothing(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    before = dump(url)
    report = run_json("age", "--dry-run", "--database-url", url)
    assert report["dry_run"] is True
    assert report["to_decaying"] == 1  # the 60-day-old edge
    assert dump(url) == before
    assert "nothing changed" in run_ok("age", "--dry-run", "--database-url", url).stdout
    assert dump(url) == before


def test_age_demotes_the_stale_edge(seeded: dict[str, Any]) -> None:
    url = seeded["url"]
    report = run_json("age", "--database-url", url)
    assert (report["dry_run"], report["to_decaying"]) == (False, 1)
    rows = run_json("edges", "--state", "decaying", "--database-url", url)
    assert [r["id"] for r in rows] == [seeded["stale"]]


def test_group_database_url_reaches_subcommands(seeded: dict[str, Any]) -> None:
    rows = json.loads(run_ok("--database-url", seeded["url"], "edges", "--json").stdout)
    assert len(rows) == 5


def test_environment_url_is_used_without_an_option(seeded: dict[str, Any]) -> None:
    result = run("edges", "--json", env={"MNESTOMA_DATABASE_URL": seeded["url"]})
    assert result.exit_code == 0 and len(json.loads(result.stdout)) == 5


# --- demo -----------------------------------------------------------------------------------


def test_demo_shows_edges_walk_suggestions_protos_and_status() -> None:
    out = run_ok("demo").stdout
    lines = out.splitlines()
    for heading in (
        "mnestoma age",
        "mnestoma edges",
        "mnestoma walk web.search",
        "mnestoma suggest http.fetch@1.4",
        "mnestoma protos",
        "mnestoma status",
    ):
        assert any(line.startswith("== ") and line.endswith(heading) for line in lines), heading
    assert "web.search@2.1 -> http.fetch@1.4 -> text.summarise@1.0" in out
    assert "extract the text of a PDF" in out
    assert "decaying" in out  # the one-off edge, 30 days later
    assert "/" not in out.split("== mnestoma status")[1].splitlines()[1]  # no machine path


def test_demo_status_says_the_store_is_fed_by_the_tracer() -> None:
    out = run_ok("demo").stdout
    status = out.split("== mnestoma status")[1]
    assert "recorders  tracer 17 (last 2026-03-03 03:00:00Z)" in status
    assert (
        "fed automatically: 17 passings by the in-process tracer (mnestoma.tracing), "
        "last at 2026-03-03 03:00:00Z (30 days ago); "
        "none by the OpenTelemetry processor (mnestoma.otel)."
    ) in status
    assert "ager       1 run, 1 in the last 30 days; last at 2026-04-02 03:00:00Z (now)" in status
    assert "not fed automatically" not in out
    assert "  turn-005  web.search@2.1 -> http.fetch@1.4 -> text.summarise@1.0; " in out


def test_demo_in_a_given_empty_database_keeps_its_rows(empty_db_url: str) -> None:
    run_ok("demo", "--database-url", empty_db_url)
    assert count(empty_db_url, Mnest.__table__) == 5
    assert mnestoma.current_revision(empty_db_url) == mnestoma.head_revision()


def test_demo_turns_are_recorded_by_the_tracer_not_by_hand(empty_db_url: str) -> None:
    run_ok("demo", "--database-url", empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as m:
        events = m.events()
        protos = m.edges(states=["proto"])
    passings = [e for e in events if e.kind in ("created", "reinforced")]
    assert len(passings) == 17 and {e.recorder for e in passings} == {"tracer"}
    others = [(e.kind, e.recorder) for e in events if e.kind not in ("created", "reinforced")]
    assert others == [("transition", "ager")]  # the one demotion, 30 days later
    assert len({e.turn_id for e in passings}) == 7
    [proto] = protos  # wish(...) with the desired signature, from http.fetch's PDF bytes
    assert (proto.src_executor, proto.dst_executor, proto.uses) == ("http.fetch", "pdf.to_text", 3)
    assert proto.desired_sig["summary"] == "extract the text of a PDF that http.fetch downloaded"
    data = json.loads(run_ok("status", "--json", "--database-url", empty_db_url).stdout)
    assert data["fed_automatically"] is True
    assert data["passings_by_recorder"]["tracer"]["passings"] == 17
    assert data["ager_runs"]["total"] == 1


def test_demo_refuses_a_database_that_holds_rows(seeded: dict[str, Any]) -> None:
    before = dump(seeded["url"])
    result = run("demo", "--database-url", seeded["url"])
    assert result.exit_code == 2
    assert "empty database" in result.stderr
    assert dump(seeded["url"]) == before
