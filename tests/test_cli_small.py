"""Small promises of the command line and the suite (contract §6): scripts read stdout,
DBAs review downgrades, help reads as plain text, listings stop early, progress stays on a
terminal, errors name commands, and ``-m "not postgresql"`` leaves PostgreSQL alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import mnestoma
from mnestoma.cli import cli

HEAD = mnestoma.head_revision()


def run(*args: Any) -> Result:
    """Invoke the command line in-process, stdout and stderr kept apart."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def run_ok(*args: Any) -> Result:
    result = run(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


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
