"""Every command that opens a store names it (its URL, secrets hidden) on stderr once it is
done, when a person reads stderr (a terminal): stdout stays the table or the JSON, and a log,
a pipe or cron gets no extra line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_kit import run

import mnestoma
from mnestoma.cli import render
from mnestoma.core.redaction import redact_url

# Each command that opens a store and does not name it on stdout; {proto} and {edge} are the
# ids of a proto and of an active edge of the store.
COMMANDS = [
    ["record", "x@1", "y@1"],
    ["edges"],
    ["events"],
    ["walk", "a"],
    ["suggest", "a"],
    ["predict", "a", "b"],
    ["vet", "a@1", "b@1"],
    ["graph"],
    ["protos", "--min-uses", "1", "--min-weight", "0"],
    ["queries"],
    ["promote", "{proto}", "1"],
    ["transition", "{edge}", "superseded"],
    ["age"],
    ["age", "--dry-run"],
    ["prune-events", "--before", "2000-01-01"],
    ["prune-events", "--before", "2000-01-01", "--dry-run"],
    ["split-history", "--dry-run"],
    ["db", "current"],
    ["db", "history", "--indicate-current"],
]
JSON_COMMANDS = {"record", "edges", "events", "walk", "suggest", "predict", "vet", "protos"}
JSON_COMMANDS |= {"queries"}
JSON_COMMANDS |= {"promote", "transition", "age", "prune-events", "split-history"}


def _ids(store_url: str) -> dict[str, str]:
    with mnestoma.Mnestoma(store_url) as store:
        edge = store.record_passing("a", "1", "b", "1")
        proto = store.record_passing("a", "1", "wish", None, dst_exists=False)
        store.log_canonical_query("q", "q")
    return {"edge": edge.id, "proto": proto.id}


def _args(command: list[str], ids: dict[str, str]) -> list[str]:
    return [part.format(**ids) for part in command]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_command_names_its_store_on_a_terminal_after_its_output(
    store_url: str, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "stderr_is_terminal", lambda: True)
    as_json = ["--json"] if command[0] in JSON_COMMANDS else []
    result = run(*_args(command, _ids(store_url)), *as_json, "--database-url", store_url)
    assert result.exit_code == 0, result.output
    where = redact_url(mnestoma.resolve_database_url(store_url))
    assert result.stderr.splitlines() == [f"store: {where}"]
    assert result.stdout and "store:" not in result.stdout
    if as_json:
        json.loads(result.stdout)  # stdout stays pure JSON


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_off_a_terminal_a_command_adds_no_line_to_stderr(
    store_url: str, command: list[str]
) -> None:
    result = run(*_args(command, _ids(store_url)), "--database-url", store_url)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_the_store_named_hides_its_password(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "stderr_is_terminal", lambda: True)
    url = mnestoma.resolve_database_url(pg_store_url).set(password="s3cret-pw")
    monkeypatch.setenv("PGPASSWORD", "")  # trust auth: the password is not checked
    result = run("edges", "--database-url", url.render_as_string(hide_password=False))
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"store: {redact_url(url)}"]
    assert "s3cret-pw" not in result.stderr and "***" in result.stderr


def test_the_default_store_is_named_where_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("MNESTOMA_DATABASE_URL", "MNESTOMA_DB_PATH", "METNOS_WORKSPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(render, "stderr_is_terminal", lambda: True)
    result = run("record", "a@1", "b@1")
    assert result.exit_code == 0, result.output
    default = tmp_path / ".mnestoma" / "mnest.sqlite"
    assert result.stderr == f"store: sqlite+pysqlite:///{default}\n"


def test_a_failed_command_prints_its_one_error_line_only(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "stderr_is_terminal", lambda: True)
    result = run("promote", "mn_nosuchid", "1", "--database-url", store_url)
    assert result.exit_code == 1
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("Error: ")
