"""Small promises of the command line and the suite (contract §6): scripts read stdout,
DBAs review downgrades, help reads as plain text, listings stop early, progress stays on a
terminal, errors name commands, and ``-m "not postgresql"`` leaves PostgreSQL alone."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from cli_kit import run, run_ok
from conftest import REPO
from sqlalchemy import Engine, event

import mnestoma
import mnestoma.cli.progress as progress
from mnestoma import UnitOfWork, make_engine, make_session_factory
from mnestoma.cli import cli
from mnestoma.testing.clock import MovableClock

HEAD = mnestoma.head_revision()


# --- db current: one line on stdout, always -----------------------------------------------


def test_db_current_on_an_empty_database_prints_none_on_stdout(empty_db_url: str) -> None:
    if empty_db_url.startswith("sqlite:"):
        with sqlite3.connect(empty_db_url.removeprefix("sqlite:///")) as conn:
            conn.execute("CREATE TABLE service_table (id INTEGER)")  # a database, not ours
    result = run_ok("db", "current", "--database-url", empty_db_url)
    assert result.stdout == f"none (no mnestoma schema here; head is {HEAD})\n"
    assert result.stderr == ""


def test_db_current_on_a_missing_file_prints_none_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "store.sqlite"
    result = run_ok("db", "current", "--database-url", f"sqlite:///{path}")
    assert result.stdout.splitlines() == [f"none (no database file at {path}; head is {HEAD})"]
    assert result.stderr == "" and not path.parent.exists()


def test_db_current_at_head_still_prints_the_revision(store_url: str) -> None:
    assert run_ok("db", "current", "--database-url", store_url).stdout == f"{HEAD} (head)\n"


# --- db sql: a downward range is the downgrade script -------------------------------------


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_db_sql_of_a_downward_range_prints_the_downgrade(dialect: str) -> None:
    out = run_ok("db", "sql", "--dialect", dialect, "0002:0001").stdout
    assert "Running downgrade 0002 -> 0001" in out
    assert "Running upgrade" not in out
    assert "DROP INDEX ux_mnests_edge_key" in out
    assert "version_num='0001'" in out  # the stamp goes back down too


def test_db_sql_down_to_base_drops_every_table() -> None:
    out = run_ok("db", "sql", "--dialect", "postgresql", "head:base").stdout
    assert f"Running downgrade {HEAD} ->" in out and "Running downgrade 0001 -> " in out
    assert "DROP TABLE mnests" in out


def test_db_sql_of_a_relative_downward_range_prints_one_step_down() -> None:
    out = run_ok("db", "sql", "--dialect", "postgresql", "0002:-1").stdout
    assert "Running downgrade 0002 -> 0001" in out and "Running upgrade" not in out


def test_db_sql_of_an_upward_range_is_still_the_upgrade() -> None:
    out = run_ok("db", "sql", "--dialect", "postgresql", "0001:0002").stdout
    assert "Running upgrade 0001 -> 0002" in out and "downgrade" not in out


def test_db_sql_of_an_unknown_range_end_exits_2() -> None:
    result = run("db", "sql", "--dialect", "sqlite", "0002:zz99")
    assert result.exit_code == 2 and "zz99" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- help texts: plain text, every option explained -----------------------------------------


def _every_command() -> list[tuple[list[str], click.Command]]:
    found: list[tuple[list[str], click.Command]] = []

    def visit(cmd: click.Command, path: list[str]) -> None:
        found.append((path, cmd))
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                visit(sub, [*path, name])

    visit(cli, [])
    return found


REST_MARKUP = ("``", ":class:", ":func:", ":meth:", ":attr:", ".. ")


@pytest.mark.parametrize(
    "path", [p for p, _ in _every_command()], ids=lambda p: " ".join(p) or "mnestoma"
)
def test_help_text_is_plain_text(path: list[str]) -> None:
    out = run_ok(*path, "--help").stdout
    assert out.startswith("Usage: ")
    for markup in REST_MARKUP:
        assert markup not in out, (path, markup)


def test_every_option_has_a_help_text() -> None:
    missing = [
        (" ".join(path), param.name)
        for path, cmd in _every_command()
        for param in cmd.params
        if isinstance(param, click.Option) and not param.help
    ]
    assert missing == []


def test_protos_help_explains_its_thresholds() -> None:
    out = run_ok("protos", "--help").stdout
    assert "at least N times" in out and "[default: 3]" in out
    assert "effective weight" in out and "[default: 0.3]" in out


def test_db_sql_help_says_a_downward_range_is_a_downgrade() -> None:
    out = " ".join(run_ok("db", "sql", "--help").stdout.split())
    assert "START:END with END below START" in out and "downgrade script" in out


# --- --limit: read no more than asked -------------------------------------------------------


def _chain_store(url: str, n: int, clock: MovableClock) -> None:
    """``n`` edges created one minute apart, e0 oldest, then one more event on e0."""
    with mnestoma.Mnestoma(url, clock=clock) as m:
        for i in range(n):
            m.record_passing(f"e{i}", "1", "sink", "1")
            clock.advance(minutes=1)
        m.record_passing("e0", "1", "sink", "1")


def _statements(engine: Engine) -> list[str]:
    seen: list[str] = []

    def remember(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", remember)
    return seen


def test_edges_limit_returns_the_oldest_rows_and_puts_limit_in_the_sql(
    store_url: str, clock: MovableClock
) -> None:
    _chain_store(store_url, 5, clock)
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        seen = _statements(m.engine)
        rows = m.edges(limit=2)
        assert [r.src_executor for r in rows] == ["e0", "e1"]
        assert any("LIMIT" in s for s in seen if "FROM mnests" in s)
        assert len(m.edges(limit=99)) == 5
        assert [r.src_executor for r in m.edges(states=["active"], limit=1)] == ["e0"]


def test_events_limit_returns_the_oldest_events(store_url: str, clock: MovableClock) -> None:
    _chain_store(store_url, 4, clock)
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        every = m.events()
        assert len(every) == 5
        assert [e.id for e in m.events(limit=3)] == [e.id for e in every[:3]]
        first = every[0].mnest_id
        assert [e.kind for e in m.events(mnest_id=first, limit=1)] == ["created"]


def test_the_repository_takes_the_limit_too(store_url: str, clock: MovableClock) -> None:
    _chain_store(store_url, 3, clock)
    engine = make_engine(store_url)
    try:
        with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
            assert len(uow.mnests.edges(limit=2)) == 2
            assert len(uow.mnests.events(limit=1)) == 1
    finally:
        engine.dispose()


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 2**31])
def test_a_bad_limit_is_invalid_input(store_url: str, bad: Any) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        with pytest.raises(mnestoma.InvalidInput, match="limit"):
            m.edges(limit=bad)
        with pytest.raises(mnestoma.InvalidInput, match="limit"):
            m.events(limit=bad)


def test_cli_limit_on_edges_and_events(store_url: str, clock: MovableClock) -> None:
    _chain_store(store_url, 4, clock)
    out = run_ok("edges", "--limit", "2", "--json", "--database-url", store_url).stdout
    assert [r["src_executor"] for r in json.loads(out)] == ["e0", "e1"]
    table = run_ok("edges", "--limit", "1", "--database-url", store_url).stdout.splitlines()
    assert len(table) == 2 and "e0@1" in table[1]
    out = run_ok("events", "--limit", "3", "--json", "--database-url", store_url).stdout
    assert len(json.loads(out)) == 3


def test_cli_limit_on_walk_and_protos(store_url: str, clock: MovableClock) -> None:
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        m.record_turn("t", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("a", "1", "d", "1")])
        for i in range(3):
            m.record_turn(f"p{i}", [("a", "1", "x", None, False), ("a", "1", "y", None, False)])

    def listing(*args: str) -> Any:
        return json.loads(run_ok(*args, "--json", "--database-url", store_url).stdout)

    paths = listing("walk", "a")
    assert len(paths) == 3
    two = listing("walk", "a", "--limit", "2")
    assert [p["path"] for p in two] == [p["path"] for p in paths[:2]]
    protos = listing("protos", "--min-weight", "0")
    one = listing("protos", "--min-weight", "0", "--limit", "1")
    assert len(protos) == 2 and [p["id"] for p in one] == [protos[0]["id"]]


@pytest.mark.parametrize("command", ["edges", "events", "walk a", "protos"])
def test_cli_limit_zero_exits_2(store_url: str, command: str) -> None:
    result = run(*command.split(), "--limit", "0", "--database-url", store_url)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and "limit" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_edges_into_a_closed_pipe_stops_quietly(tmp_path: Path, clock: MovableClock) -> None:
    url = f"sqlite:///{tmp_path / 'big.sqlite'}"
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn("t", [(f"src.{i:05d}", "1", "dst", "1") for i in range(3000)])
    # `mnestoma edges | head -1`: the reader goes away long before the table is written
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnestoma", "edges", "--database-url", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"ID ")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert err == "", err


# --- age: progress for people on a terminal, silence for pipes and logs ---------------------


def test_age_shows_no_progress_when_stderr_is_not_a_terminal(
    store_url: str, clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_store(store_url, 3, clock)
    monkeypatch.setattr(progress, "SPINNER_DELAY_S", 0.0)  # would draw at once on a TTY
    result = run_ok("age", "--database-url", store_url)
    assert result.stderr == ""
    assert result.stdout.startswith("ager at ")


def test_age_shows_its_progress_by_batch_on_a_terminal_and_clears_it(
    store_url: str, clock: MovableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _chain_store(store_url, 3, clock)
    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    result = run_ok("age", "--json", "--batch-rows", "1", "--database-url", store_url)
    assert result.stderr.startswith("\r") and "ageing: batch 1/" in result.stderr
    last = result.stderr.rsplit("\r", 2)[-2]
    assert last.strip() == "" and len(last) >= len("ageing")  # blanked before the report
    assert json.loads(result.stdout)["dry_run"] is False  # stdout stays machine-readable


def test_age_refuses_a_batch_of_no_rows(store_url: str) -> None:
    result = run("age", "--batch-rows", "0", "--database-url", store_url)
    assert result.exit_code == 2 and "--batch-rows" in result.stderr


def test_a_quick_age_on_a_terminal_draws_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(progress, "SPINNER_DELAY_S", 3600.0)
    result = run_ok("age", "--dry-run", "--database-url", store_url)
    assert result.stderr == ""


# --- errors name commands, not API methods --------------------------------------------------


def test_age_help_says_a_dry_run_waits_for_writers_and_they_for_it() -> None:
    out = " ".join(run_ok("age", "--help").stdout.split())
    for phrase in ("rolled back", "waits for writers", "MNESTOMA_LOCK_TIMEOUT", "lock_timeout"):
        assert phrase in out, phrase


def test_a_dry_run_behind_a_writer_waits_for_the_lock_then_exits_1(
    store_url: str, engine_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the help says: the dry run takes the run's locks, bounded as it says."""
    with mnestoma.Mnestoma(store_url) as m:
        m.record_passing("a", "1", "b", "1")
    monkeypatch.setenv("MNESTOMA_LOCK_TIMEOUT", "0.3")
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=300")
    writer = make_engine(store_url)
    try:
        with writer.connect() as conn:
            if engine_name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock
            else:
                conn.exec_driver_sql("UPDATE mnests SET uses = uses")  # row locks, held
            result = run("age", "--dry-run", "--database-url", store_url)
            conn.rollback()
    finally:
        writer.dispose()
    assert result.exit_code == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert "lock" in line
    assert run_ok("age", "--dry-run", "--database-url", store_url).stdout  # writer gone


def test_transition_of_a_proto_to_active_names_the_promote_command(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        proto = m.record_passing("a", "1", "b", None, dst_exists=False)
    before = run_ok("events", "--json", "--database-url", store_url).stdout
    result = run("transition", proto.id, "active", "--database-url", store_url)
    assert result.stderr == (
        "Error: a proto cannot become active; once the executor exists, "
        f"use 'mnestoma promote {proto.id} VERSION'\n"
    )
    assert "promote_proto_to_active" not in result.output
    assert run_ok("events", "--json", "--database-url", store_url).stdout == before


def test_the_api_keeps_naming_the_method(store_url: str) -> None:
    with mnestoma.Mnestoma(store_url) as m:
        proto = m.record_passing("a", "1", "b", None, dst_exists=False)
        with pytest.raises(mnestoma.InvalidTransition, match="use promote_proto_to_active"):
            m.transition_state(proto.id, "decaying")


# --- exit status: 2 for bad input, 1 for a refusal of the store -----------------------------


def _refusals(url: str) -> dict[str, tuple[list[str], int]]:
    """One command per kind of error, with the exit status the command-line guide promises."""
    with mnestoma.Mnestoma(url) as m:
        m.record_passing("a", "1", "b", "2")
        proto = m.record_passing("a", "1", "b", None, dst_exists=False)
    return {
        "InvalidInput": (["record", "a@1", " @2"], 2),
        "usage": (["edges", "--colour"], 2),
        "NotFound": (["promote", "mn_doesnotexist000", "1"], 1),
        "InvalidTransition": (["transition", proto.id, "decaying"], 1),
        "ConflictError": (["promote", proto.id, "2"], 1),  # the active a@1 -> b@2 exists
    }


@pytest.mark.parametrize(
    "kind", ["InvalidInput", "usage", "NotFound", "InvalidTransition", "ConflictError"]
)
def test_exit_status_is_2_for_bad_input_and_1_for_refusals(store_url: str, kind: str) -> None:
    args, status = _refusals(store_url)[kind]
    before = run_ok("events", "--json", "--database-url", store_url).stdout
    result = run(*args, "--database-url", store_url)
    assert result.exit_code == status, (kind, result.output)
    assert result.stderr.startswith("Error: ") and len(result.stderr.splitlines()) == 1
    assert run_ok("events", "--json", "--database-url", store_url).stdout == before
    if kind != "usage":  # the error behind the status is the one named
        debug = run("--debug", *args, "--database-url", store_url)
        assert isinstance(debug.exception, getattr(mnestoma, kind))


def test_the_guide_states_one_exit_status_per_error() -> None:
    root = REPO
    guide = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip(): line
        for line in guide.splitlines()
        if line.startswith("| 0 |") or line.startswith("| 1 |") or line.startswith("| 2 |")
    }
    for name in ("NotFound", "InvalidTransition", "ConflictError"):
        assert name in rows["1"] and name not in rows["2"]
    assert "InvalidInput" in rows["2"] and "InvalidInput" not in rows["1"]
    for page in (root / "README.md", *(root / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert "exits 2 with one line" not in text  # the old, contradicting sentence


def test_help_states_the_exit_statuses() -> None:
    out = " ".join(run_ok("--help").stdout.split())
    assert "Exit status: 0 success; 2 bad input" in out and "1 any other failure" in out


# --- markers: -m "not postgresql" and -m "not slow" mean what they say ----------------------


_MARKS_PLUGIN = """
import json, os


def pytest_collection_finish(session):
    with open(os.environ["MARKS_OUT"], "w") as out:
        marks = {i.nodeid: sorted({m.name for m in i.iter_markers()}) for i in session.items}
        json.dump(marks, out)
"""
_THE_SERVER = ("tests/store/test_record.py", "tests/store/test_bad_input.py")
_THE_SERVER += ("tests/store/test_open_errors.py",)
_RENDERING = "tests/cli/test_cli_conventions.py"
_SPAWNING = ("tests/project/test_packaging.py", "tests/races/test_faults.py")
_SPAWNING += ("tests/project/test_readme.py",)


@pytest.fixture(scope="module")
def marks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Each test of the files below and the marks the suite gives it, as a fresh pytest
    collects them (one process for all, as xdist's workers would each collect the same
    again); ``-m EXPR`` selects by these marks."""
    folder = tmp_path_factory.mktemp("marks")
    (folder / "marks_plugin.py").write_text(_MARKS_PLUGIN)
    out = folder / "marks.json"
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "MARKS_OUT": str(out), "PYTHONPATH": path}
    files = (*_THE_SERVER, _RENDERING, *_SPAWNING)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "marks_plugin", "-n", "0", *files],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return {test: set(names) for test, names in json.loads(out.read_text()).items()}


def _selected(
    marks: dict[str, set[str]], files: tuple[str, ...], mark: str, *, has: bool
) -> list[str]:
    """What ``-m "MARK"`` (``has``) or ``-m "not MARK"`` selects of ``files``."""
    return [t for t, names in marks.items() if t.startswith(files) and (mark in names) == has]


def test_not_postgresql_deselects_every_test_that_needs_the_server(
    marks: dict[str, set[str]],
) -> None:
    kept = _selected(marks, _THE_SERVER, "postgresql", has=False)
    on_pg = _selected(marks, _THE_SERVER, "postgresql", has=True)
    assert kept and on_pg and not set(kept) & set(on_pg)
    assert [i for i in kept if "postgresql" in i] == []  # engine_name, the module fixture
    assert any("missing_database_on_a_live_server" in i for i in on_pg)  # require_postgresql()
    assert sum("[sqlite" in i for i in kept) == sum("[postgresql" in i for i in on_pg)


def test_rendering_postgresql_sql_needs_no_server_and_stays_selected(
    marks: dict[str, set[str]],
) -> None:
    kept = _selected(marks, (_RENDERING,), "postgresql", has=False)
    assert f"{_RENDERING}::test_db_sql_of_a_downward_range_prints_the_downgrade[postgresql]" in kept


def test_not_slow_deselects_tests_that_spawn_processes_or_build_wheels(
    marks: dict[str, set[str]],
) -> None:
    slow = _selected(marks, _SPAWNING, "slow", has=True)
    assert any("installed_wheel" in i for i in slow)  # builds a wheel
    assert any("killed_after_any_statement" in i for i in slow)  # through a helper
    assert any("test_a_readme_example_runs" in i for i in slow)  # subprocess.run
    fast = _selected(marks, _SPAWNING, "slow", has=False)
    assert not set(fast) & set(slow)
    assert "tests/project/test_readme.py::test_the_readme_has_python_examples" in fast


def test_the_m_option_selects_by_the_marks_the_suite_gives(marks: dict[str, set[str]]) -> None:
    """One real ``-m`` run agrees with the selection read from the marks."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-n", "0", "-m", "not postgresql", *_THE_SERVER],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    listed = [line for line in done.stdout.splitlines() if "::" in line]
    assert sorted(listed) == sorted(_selected(marks, _THE_SERVER, "postgresql", has=False))
