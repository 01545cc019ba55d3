"""``mnestoma db ...`` and ``mnestoma status``: migrations from the command line, honest facts."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from cli_kit import STATUS_KEYS, refuses_missing_store, run, run_ok
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import alembic_config
from mnestoma.maintenance.status import FEEDING_STATEMENT


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


HEAD = mnestoma.head_revision()


# --- db -------------------------------------------------------------------------------------


def test_db_upgrade_creates_the_schema_and_current_shows_head(empty_db_url: str) -> None:
    out = run_ok("db", "upgrade", "--database-url", empty_db_url).stdout
    assert f"upgraded from empty to {HEAD} (head)" in out
    assert {"mnests", "events", "canonical_query_log"} <= tables(empty_db_url)
    assert run_ok("db", "current", "--database-url", empty_db_url).stdout == f"{HEAD} (head)\n"
    again = run_ok("db", "upgrade", "--database-url", empty_db_url).stdout
    assert f"already at revision {HEAD} (head)" in again


def test_db_downgrade_and_upgrade_round_trip(empty_db_url: str) -> None:
    url = empty_db_url
    run_ok("db", "upgrade", "--database-url", url)
    with mnestoma.Mnestoma(url) as m:
        m.record_passing("a", "1", "b", "2")
    out = run_ok("db", "downgrade", "0001", "--database-url", url).stdout
    assert f"downgraded from {HEAD} to 0001" in out
    assert run_ok("db", "current", "--database-url", url).stdout == "0001\n"
    run_ok("db", "upgrade", "--database-url", url)
    assert run_ok("db", "current", "--database-url", url).stdout == f"{HEAD} (head)\n"
    with mnestoma.Mnestoma(url) as m:
        assert m.find("a", "1", "b", "2") is not None  # the row survived both ways
    run_ok("db", "downgrade", "base", "--database-url", url)
    assert "mnests" not in tables(url)
    current = run_ok("db", "current", "--database-url", url)
    assert current.stdout == f"none (no mnestoma schema here; head is {HEAD})\n"
    assert current.stderr == ""


def _revision_lines(stderr: str) -> list[str]:
    """The revisions ``db upgrade``/``downgrade`` named on stderr, as "0001 -> 0002"."""
    found = re.findall(r"^ *[0-9.]+ s  Running (?:up|down)grade (\w+) -> (\w+), ", stderr, re.M)
    return [f"{a} -> {b}" for a, b in found]


def test_db_upgrade_and_downgrade_name_each_revision_on_stderr(empty_db_url: str) -> None:
    script = ScriptDirectory.from_config(alembic_config())
    ups = [f"{r.down_revision or 'base'} -> {r.revision}" for r in script.walk_revisions()][::-1]
    result = run_ok("db", "upgrade", "--database-url", empty_db_url)
    assert _revision_lines(result.stderr) == ups
    assert len(result.stderr.splitlines()) == len(ups)  # one line each, nothing else
    assert result.stdout.endswith(f"upgraded from empty to {HEAD} (head)\n")  # stdout as before
    down = run_ok("db", "downgrade", "0006", "--database-url", empty_db_url)
    downs = [" -> ".join(u.split(" -> ")[::-1]) for u in ups[::-1]]  # "0011 -> 0010", ...
    after = len(ups) - 6  # the revisions after 0006 (ups[5] is "0005 -> 0006")
    assert _revision_lines(down.stderr) == downs[:after]
    again = run_ok("db", "upgrade", "--database-url", empty_db_url)
    assert _revision_lines(again.stderr) == ups[-after:]
    assert run_ok("db", "upgrade", "--database-url", empty_db_url).stderr == ""  # at head


def test_db_upgrade_names_a_revision_before_it_fails(tmp_path: Path) -> None:
    """Each revision is said as it begins, not once the upgrade is done: the revision that
    fails is the last one named."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    run_ok("db", "upgrade", "0002", "--database-url", url)
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE ager_runs (id INTEGER PRIMARY KEY)")  # 0003 makes it
    engine.dispose()
    result = run("db", "upgrade", "--database-url", url)
    assert result.exit_code == 1
    assert _revision_lines(result.stderr) == ["0002 -> 0003"]
    assert result.stderr.splitlines()[-1].startswith("Error: ")
    assert run_ok("db", "current", "--database-url", url).stdout == "0002\n"


def test_db_upgrade_to_a_chosen_revision(empty_db_url: str) -> None:
    run_ok("db", "upgrade", "0001", "--database-url", empty_db_url)
    assert run_ok("db", "current", "--database-url", empty_db_url).stdout == "0001\n"


def test_db_unknown_revision_exits_2_and_migrates_nothing(empty_db_url: str) -> None:
    result = run("db", "upgrade", "zz99", "--database-url", empty_db_url)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "zz99" in result.stderr
    assert "mnests" not in tables(empty_db_url)


def test_db_downgrade_needs_a_revision() -> None:
    result = run("db", "downgrade")
    assert result.exit_code == 2 and "REVISION" in result.stderr


def test_db_history_lists_revisions_newest_first() -> None:
    lines = run_ok("db", "history").stdout.splitlines()
    before_head = ScriptDirectory.from_config(alembic_config()).get_revision(HEAD).down_revision
    assert lines[0].startswith(f"{before_head} -> {HEAD} (head)")
    assert lines[-1].startswith("<base> -> 0001")


def test_db_history_prints_each_revisions_first_paragraph_as_plain_text() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    lines = run_ok("db", "history").stdout.splitlines()
    assert not any("``" in line for line in lines)
    outcomes = next(line for line in lines if line.startswith("0007 -> 0008"))
    paragraph = (script.get_revision("0008").doc or "").split("\n\n")[0]
    assert outcomes.endswith(" ".join(paragraph.split()).replace("``", ""))
    assert "\n" not in outcomes and "ok_count" in outcomes


def test_db_history_can_mark_the_current_revision(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0001")
    out = run_ok("db", "history", "--indicate-current", "--database-url", empty_db_url).stdout
    assert "<base> -> 0001 (current)" in out


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_db_sql_prints_create_table_for_each_dialect(dialect: str) -> None:
    out = run_ok("db", "sql", "--dialect", dialect).stdout
    assert "CREATE TABLE mnests" in out and "CREATE TABLE events" in out
    assert "CREATE VIEW v_mnestoma" in out
    assert ("TIMESTAMP WITH TIME ZONE" in out) == (dialect == "postgresql")


def test_db_sql_range_prints_only_that_step() -> None:
    out = run_ok("db", "sql", "--dialect", "postgresql", "0001:0002").stdout
    assert "Running upgrade 0001 -> 0002" in out
    assert "CREATE TABLE mnests" not in out
    assert "ADD COLUMN ts_weight" in out


def test_db_sql_uses_the_dialect_of_the_database_url_and_never_connects() -> None:
    url = "postgresql://alice:pa55-w0rd-XYZ@127.0.0.1:1/store"
    out = run_ok("db", "sql", "--database-url", url).stdout
    assert "TIMESTAMP WITH TIME ZONE" in out and "pa55-w0rd-XYZ" not in out


def test_db_sql_with_unknown_dialect_exits_2() -> None:
    assert run("db", "sql", "--dialect", "oracle").exit_code == 2


def test_db_current_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "store.sqlite"
    result = run_ok("db", "current", "--database-url", f"sqlite:///{path}")
    assert result.stdout.startswith("none (no database file at ") and result.stderr == ""
    assert not path.parent.exists()


# --- status ---------------------------------------------------------------------------------


def test_status_on_an_empty_store_says_it_is_empty(store_url: str) -> None:
    out = run_ok("status", "--database-url", store_url).stdout
    assert f"revision {HEAD} (head)" in out
    assert "the store is empty" in out
    assert FEEDING_STATEMENT in out
    data = json.loads(run_ok("status", "--json", "--database-url", store_url).stdout)
    assert list(data) == STATUS_KEYS
    assert (data["empty"], data["at_head"], data["mnests"], data["events"]) == (True, True, 0, 0)
    assert data["last_turn_passing"] is None


def test_status_on_a_populated_store_reports_the_facts(store_url: str, engine_name: str) -> None:
    t0 = datetime.now(UTC) - timedelta(hours=3)
    ticks = iter(t0 + timedelta(minutes=i) for i in range(100))
    with mnestoma.Mnestoma(store_url, clock=lambda: next(ticks)) as m:
        m.record_passing("a", "1", "b", "2")  # no turn
        for turn in ("t1", "t2", "t3"):
            m.record_turn(turn, [("a", "1", "b", "2"), ("b", "2", "pdf", None, False)])
        m.log_canonical_query("raw", "canon")
    data = json.loads(run_ok("status", "--json", "--database-url", store_url).stdout)
    assert data["dialect"] == engine_name
    assert data["empty"] is False
    assert data["mnests_by_state"] == {"active": 1, "proto": 1, "decaying": 0, "superseded": 0}
    assert data["events"] == 7 and data["events_by_kind"]["reinforced"] == 5
    assert (data["passings"], data["passings_with_turn"]) == (7, 6)
    last = datetime.fromisoformat(data["last_turn_passing"])
    assert t0 < last < t0 + timedelta(minutes=10)
    assert data["query_log"] == 1
    assert [p["dst_executor"] for p in data["recurring_protos"]] == ["pdf"]
    text = run_ok("status", "--database-url", store_url).stdout
    assert "6 with a turn_id" in text and "b@2 -> pdf" in text


def test_status_hides_the_password(pg_store_url: str) -> None:
    url = make_url(pg_store_url).set(password="pa55-w0rd-XYZ")  # trust auth ignores it
    result = run("status", "--database-url", url.render_as_string(hide_password=False))
    assert result.exit_code == 0
    assert "pa55-w0rd-XYZ" not in result.output and "***" in result.stdout


def test_status_on_a_database_behind_head_says_so_and_migrates_nothing(
    empty_db_url: str,
) -> None:
    mnestoma.upgrade(empty_db_url, "0001")
    out = run_ok("status", "--database-url", empty_db_url).stdout
    assert f"revision 0001, head {HEAD}" in out
    assert "run `mnestoma db upgrade`" in out
    data = json.loads(run_ok("status", "--json", "--database-url", empty_db_url).stdout)
    assert (data["schema"], data["at_head"], data["revision"]) == ("behind", False, "0001")
    assert mnestoma.current_revision(empty_db_url) == "0001"


def test_status_on_a_database_without_schema_creates_nothing(
    empty_db_url: str, engine_name: str
) -> None:
    if engine_name == "sqlite":
        Path(make_url(empty_db_url).database or "").touch()  # an empty file, no schema
    out = run_ok("status", "--database-url", empty_db_url).stdout
    assert "no mnestoma schema" in out
    assert tables(empty_db_url) == set()


def test_status_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ws" / ".mnestoma" / "mnest.sqlite"
    result = run_ok("status", "--json", "--database-url", f"sqlite:///{path}")
    assert json.loads(result.stdout)["schema"] == "missing"
    assert not path.parent.parent.exists()


def test_commands_on_postgresql_behind_head_exit_1_and_say_what_to_run(
    pg_empty_db_url: str,
) -> None:
    result = run("edges", "--database-url", pg_empty_db_url)
    assert result.exit_code == 1
    assert "mnestoma db upgrade" in result.stderr
    assert tables(pg_empty_db_url) == set()


def test_a_writing_command_on_a_fresh_sqlite_file_migrates_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    run_ok("record", "a@1", "b@1", "--database-url", url)
    assert mnestoma.current_revision(url) == HEAD
    assert len(json.loads(run_ok("edges", "--json", "--database-url", url).stdout)) == 1


def test_a_reading_command_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    refuses_missing_store(tmp_path / "fresh.sqlite", "edges", "--json")


def test_status_says_when_no_passing_carries_a_turn_id(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        m.record_passing("a", "1", "b", "2")
    text = run_ok("status", "--database-url", store_url).stdout
    assert "0 with a turn_id" in text
    assert "no caller has recorded a turn here" in text
