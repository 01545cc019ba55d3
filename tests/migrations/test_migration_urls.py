"""The migration door takes the URL the async door takes: Alembic migrates through the sync
driver of the same database."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma.cli import cli
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.maintenance.migration import sync_database_url


def _async_url(url: str, driver: str) -> str:
    return make_url(url).set(drivername=driver).render_as_string(hide_password=False)


ASYNC_DRIVER = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg_async"}


def test_upgrade_migrates_the_database_an_async_url_names(
    empty_db_url: str, engine_name: str
) -> None:
    url = _async_url(empty_db_url, ASYNC_DRIVER[engine_name])
    mnestoma.upgrade(url, "0005")
    assert mnestoma.current_revision(url) == "0005"
    mnestoma.upgrade(url)
    mnestoma.downgrade(url, "0005")
    mnestoma.upgrade(url)
    assert mnestoma.current_revision(empty_db_url) == mnestoma.head_revision()

    async def record() -> int:
        async with AsyncMnestoma(url) as store:
            await store.record_passing("a", "1", "b", "1")
            return len(await store.edges())

    assert asyncio.run(record()) == 1


def test_the_command_line_migrates_through_an_async_url(
    empty_db_url: str, engine_name: str
) -> None:
    url = _async_url(empty_db_url, ASYNC_DRIVER[engine_name])
    result = CliRunner().invoke(cli, ["db", "upgrade", "--database-url", url])
    assert result.exit_code == 0, result.output
    current = CliRunner().invoke(cli, ["db", "current", "--database-url", url])
    assert current.output.strip() == f"{mnestoma.head_revision()} (head)"


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("sqlite+aiosqlite:///x.db", "sqlite+pysqlite"),
        ("postgresql+psycopg_async://u:pw@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql+asyncpg://u:pw@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql+psycopg://u:pw@h/db?sslmode=require", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite+pysqlite"),
    ],
)
def test_each_url_the_async_door_accepts_has_a_sync_twin_for_migrating(
    given: str, driver: str
) -> None:
    synced = sync_database_url(given)
    assert synced.drivername == driver
    assert synced.set(drivername="x") == make_url(given).set(drivername="x")  # nothing else
