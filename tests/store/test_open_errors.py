"""Opening a store that cannot be used gives one clear, actionable package error.

Never a raw driver exception, never a password: behind head, ahead of this release, not a
database at all, a server that does not answer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers_proc import format_exception
from invariants import plain_engine
from sqlalchemy import make_url, text
from sqlalchemy.exc import SQLAlchemyError

import mnestoma
from mnestoma import MnestomaError, SchemaError

SECRET = "secretpw"


def open_error(url: str) -> MnestomaError:
    """The error ``Mnestoma(url)`` raises, checked to be the package's, clear and secret-free."""
    with pytest.raises(MnestomaError) as info:
        mnestoma.Mnestoma(url).close()
    err = info.value
    assert not isinstance(err, SQLAlchemyError)
    message = str(err)
    assert message and "\n" not in message
    assert SECRET not in message and SECRET not in repr(err)
    assert SECRET not in format_exception(err), "the password leaks through the traceback"
    return err


def test_a_database_behind_head_asks_to_run_db_upgrade(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0001")  # SQLite too: only an empty file is auto-migrated
    err = open_error(empty_db_url)
    assert isinstance(err, SchemaError)
    assert "0001" in str(err)
    assert "mnestoma db upgrade" in str(err)
    suggested = re.search(r"--database-url '([^']+)'`", str(err))
    assert suggested, "the command to run names this database"
    assert make_url(suggested[1]).database == make_url(empty_db_url).database


def test_a_database_with_no_schema_on_postgresql_asks_to_run_db_upgrade(
    pg_empty_db_url: str,
) -> None:
    """(An empty SQLite file is the embedded default: it is migrated on first use.)"""
    err = open_error(pg_empty_db_url)
    assert isinstance(err, SchemaError)
    assert "mnestoma db upgrade" in str(err)


def test_a_database_from_a_newer_release_is_refused_with_a_schema_error(
    empty_db_url: str,
) -> None:
    store_url = empty_db_url
    mnestoma.upgrade(store_url)
    engine = plain_engine(store_url)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE mnestoma_alembic_version SET version_num = 'ffff_from_the_future'")
        )
    engine.dispose()
    err = open_error(store_url)
    assert isinstance(err, SchemaError)
    assert "ffff_from_the_future" in str(err)
    assert "newer" in str(err) or "upgrade the mnestoma package" in str(err)


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    err = open_error(f"sqlite:///{path}")
    assert "not a database" in str(err)
    assert path.read_bytes() == before, "opening a foreign file must not write to it"


def test_a_text_file_in_place_of_the_database_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    path.write_text("these are my notes, not a database\n" * 200)
    err = open_error(f"sqlite:///{path}")
    assert "not a database" in str(err)


def test_a_directory_in_place_of_the_database_gives_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "store.sqlite").mkdir()
    err = open_error(f"sqlite:///{tmp_path / 'store.sqlite'}")
    assert "unable to open" in str(err) or "database" in str(err)


def test_an_unreachable_server_gives_a_clear_error_without_the_password() -> None:
    err = open_error(f"postgresql://user:{SECRET}@127.0.0.1:1/x")
    assert isinstance(err, mnestoma.DatabaseUnavailable)
    assert "127.0.0.1" in str(err) or "connect" in str(err).lower()


def test_a_missing_database_on_a_live_server_gives_a_clear_error_without_the_password() -> None:
    from conftest import PG_ADMIN_URL, require_postgresql
    from sqlalchemy.engine import make_url

    require_postgresql()
    url = make_url(PG_ADMIN_URL).set(password=SECRET, database="mnestoma_does_not_exist")
    err = open_error(url.render_as_string(hide_password=False))
    assert "mnestoma_does_not_exist" in str(err)


@pytest.mark.parametrize(
    "url",
    ["mysql://user:secretpw@localhost/db", "not a url at all", "sqlite:///:memory:"],
    ids=["unsupported-engine", "not-a-url", "in-memory"],
)
def test_an_unusable_url_is_invalid_input(url: str) -> None:
    err = open_error(url)
    assert isinstance(err, mnestoma.InvalidInput)
