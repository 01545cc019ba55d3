"""A variable of the store's order (contract §3) set but empty or blank is bad input in every
door, naming it: never taken as unset, which would switch to the next store of the order
(``./.mnestoma/mnest.sqlite``) and create it, silently."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import mnestoma
from mnestoma import InvalidInput
from mnestoma.cli import cli
from mnestoma.doors.asynchronous import AsyncMnestoma, make_async_engine
from mnestoma.maintenance.migration import checkout_database_url
from mnestoma.maintenance.status import collect_status
from mnestoma.testing.plugin import ENV_TEST_DATABASE_URL, _test_database_url

ORDER = ("MNESTOMA_DATABASE_URL", "MNESTOMA_DB_PATH", "METNOS_WORKSPACE")
BLANKS = ["", "   ", "\t"]


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, no variable of the order set."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    for name in ORDER:
        monkeypatch.delenv(name, raising=False)
    return folder


def _async_facade() -> None:
    async def run() -> None:
        store = AsyncMnestoma()
        await store.close()

    asyncio.run(run())


def _async_engine() -> None:
    async def run() -> None:
        await make_async_engine().dispose()

    asyncio.run(run())


DOORS: dict[str, Callable[[], Any]] = {
    "resolve_database_url": lambda: mnestoma.resolve_database_url(),
    "Mnestoma": lambda: mnestoma.Mnestoma().close(),
    "AsyncMnestoma": _async_facade,
    "make_engine": lambda: mnestoma.make_engine().dispose(),
    "make_async_engine": _async_engine,
    "upgrade": lambda: mnestoma.upgrade(),
    "current_revision": lambda: mnestoma.current_revision(),
    "collect_status": lambda: collect_status(),
}


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("name", ORDER)
@pytest.mark.parametrize("blank", BLANKS, ids=["empty", "spaces", "tab"])
def test_a_blank_variable_is_refused_by_every_door_naming_it_and_creates_nothing(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, door: str, name: str, blank: str
) -> None:
    monkeypatch.setenv(name, blank)
    with pytest.raises(InvalidInput, match=rf"{name}\b.*\bempty"):
        DOORS[door]()
    assert list(cwd.rglob("*")) == []


COMMANDS = [
    ["record", "a@1", "b@1"],
    ["status"],
    ["edges", "--json"],
    ["db", "upgrade"],
    ["db", "current"],
    ["age"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
@pytest.mark.parametrize("name", ORDER)
def test_a_blank_variable_makes_a_command_exit_2_with_one_line_naming_it(
    cwd: Path, name: str, args: list[str]
) -> None:
    result = CliRunner().invoke(cli, args, env={name: " "})
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "empty" in lines[0]
    assert list(cwd.rglob("*")) == []


def test_a_variable_earlier_in_the_order_wins_over_a_blank_one_after_it(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Only the variables the order reaches are read: a blank one after the store named
    is never consulted."""
    monkeypatch.setenv("MNESTOMA_DB_PATH", str(tmp_path / "p.sqlite"))
    monkeypatch.setenv("METNOS_WORKSPACE", "")
    assert mnestoma.resolve_database_url().database == str(tmp_path / "p.sqlite")


def test_a_blank_variable_is_refused_even_when_a_later_one_names_a_store(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", "")
    monkeypatch.setenv("MNESTOMA_DB_PATH", str(tmp_path / "p.sqlite"))
    with pytest.raises(InvalidInput, match=r"MNESTOMA_DATABASE_URL\b.*\bempty"):
        mnestoma.Mnestoma()
    assert not (tmp_path / "p.sqlite").exists()


@pytest.mark.parametrize("name", ORDER)
def test_alembic_from_a_checkout_refuses_a_blank_variable_naming_it(
    cwd: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "")
    with pytest.raises(InvalidInput, match=rf"{name}\b.*\bempty"):
        checkout_database_url(None, None)


@pytest.mark.parametrize("blank", BLANKS, ids=["empty", "spaces", "tab"])
def test_the_pytest_plugin_refuses_a_blank_test_database_url_naming_it(
    monkeypatch: pytest.MonkeyPatch, pytestconfig: pytest.Config, blank: str
) -> None:
    """Set but empty, the plugin's variable would have the suite run on a temporary SQLite
    file where a PostgreSQL database was meant."""
    monkeypatch.setenv(ENV_TEST_DATABASE_URL, blank)
    factory = pytestconfig._tmp_path_factory  # type: ignore[attr-defined]
    opening = _test_database_url(pytestconfig, factory)
    with pytest.raises(InvalidInput, match=rf"{ENV_TEST_DATABASE_URL}\b.*\bempty"):
        opening.__enter__()
