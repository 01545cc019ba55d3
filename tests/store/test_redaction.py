"""Secrets never shown: every secret a URL can carry stays out of output, errors and reprs.

libpq reads a password from ``user:password@`` and from the query (``?password=``,
``?sslpassword=``); a service may add keys of its own named like a secret or a token. The
trust-auth test server accepts any password, so the real server is used with one in the
query. Each test looks for the secret in everything a user could see: stdout, stderr, JSON,
``repr`` and the whole exception chain.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_kit import SUBCOMMANDS, chain_text, every_exception, run, shown
from click.testing import Result
from conftest import require_postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import mnestoma
from mnestoma import DatabaseUnavailable, MnestomaError, SchemaError
from mnestoma.cli import scrub
from mnestoma.engines import is_secret_key, make_engine, redact_text, redact_url

SECRET = "hunter2secret"
UNREACHABLE = "postgresql://root@127.0.0.1:1/store"


def with_secret(url: str, key: str = "password") -> str:
    """``url`` with the secret in its query under ``key`` (libpq's ``?password=``)."""
    return make_url(url).update_query_dict({key: SECRET}).render_as_string(hide_password=False)


# --- the one function -----------------------------------------------------------------------

SECRET_URLS = {
    "userinfo": f"postgresql://root:{SECRET}@db.example:5432/store",
    "query-password": f"postgresql://root@db.example:5432/store?password={SECRET}",
    "query-sslpassword": f"postgresql://root@db.example/store?sslmode=require&sslpassword={SECRET}",
    "query-upper-case": f"postgresql://root@db.example/store?PASSWORD={SECRET}",
    "query-token": f"postgresql://root@db.example/store?auth_token={SECRET}",
    "query-secret": f"postgresql://root@db.example/store?client_secret={SECRET}",
    "both": f"postgresql://root:{SECRET}@db.example/store?password={SECRET}x",
    "repeated-key": f"postgresql://root@db.example/store?password={SECRET}&password={SECRET}2",
    "conninfo-in-dbname": f"postgresql:///?dbname=host%3Ddb.example+password%3D{SECRET}",
    "conninfo-as-database": f"postgresql://root@db.example/dbname=x%20password={SECRET}",
    "sqlite-query": f"sqlite:////tmp/store.sqlite?password={SECRET}",
}


@pytest.mark.parametrize("label", sorted(SECRET_URLS))
def test_redact_url_hides_every_secret_a_url_can_carry(label: str) -> None:
    text = redact_url(SECRET_URLS[label])
    assert SECRET not in text
    assert "***" in text
    assert redact_url(make_url(SECRET_URLS[label])) == text  # a URL object alike


def test_redact_url_keeps_what_is_not_secret() -> None:
    url = f"postgresql+psycopg://root@db.example:6543/store?sslmode=require&password={SECRET}"
    assert redact_url(url) == (
        "postgresql+psycopg://root@db.example:6543/store?password=***&sslmode=require"
    )


@pytest.mark.parametrize(
    "key", ["password", "sslpassword", "Password", "db_passwd", "passphrase", "api_token"]
)
def test_secret_query_keys_are_recognised(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["sslmode", "host", "dbname", "application_name", "options"])
def test_ordinary_query_keys_are_not_secret(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize(
    "text",
    [
        f"could not open postgresql://root:{SECRET}@h/db: refused",
        f"could not open 'postgresql://root@h/db?sslmode=disable&password={SECRET}'",
        f"conninfo host=h port=5432 password={SECRET} dbname=x",
        f"conninfo host=h password='{SECRET} with spaces' dbname=x",
        f'settings sslpassword = "{SECRET}"',
    ],
)
def test_redact_text_hides_secrets_inside_free_text(text: str) -> None:
    out = redact_text(text)
    assert SECRET not in out
    assert out.split()[0] == text.split()[0]  # the rest of the message stays readable


def test_scrub_hides_a_query_secret_the_user_gave_even_where_repeated_bare() -> None:
    run("status", "--database-url", with_secret(UNREACHABLE, "sslpassword"))
    # a message that repeats the value without its key: remembered from the URL given
    assert scrub(f"the server said {SECRET}") == "the server said ***"


# --- engines and facades ----------------------------------------------------------------------


def test_an_engine_built_from_a_url_with_a_query_password_does_not_show_it() -> None:
    engine = make_engine(with_secret(UNREACHABLE))
    try:
        for text in (repr(engine), str(engine.url), engine.url.render_as_string(False)):
            assert SECRET not in text
    finally:
        engine.dispose()


def test_the_query_password_still_reaches_the_server(pg_store_url: str) -> None:
    engine = make_engine(with_secret(pg_store_url))
    try:
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            assert dbapi.info.password == SECRET
    finally:
        engine.dispose()


def test_repr_of_a_store_and_its_engine_hide_the_query_password(pg_store_url: str) -> None:
    with mnestoma.Mnestoma(with_secret(pg_store_url)) as store:
        store.record_passing("a", "1", "b", "1")
        for text in (repr(store), repr(store.engine), str(store.engine.url)):
            assert SECRET not in text
        assert str(make_url(pg_store_url).database) in repr(store)


def test_a_sqlite_url_with_a_password_shows_none(tmp_path: Path) -> None:
    with mnestoma.Mnestoma(f"sqlite:///{tmp_path / 's.sqlite'}?password={SECRET}") as store:
        assert SECRET not in repr(store) + repr(store.engine)


def test_the_no_schema_error_hides_the_query_password(pg_empty_db_url: str) -> None:
    with pytest.raises(SchemaError, match="has no mnestoma schema") as info:
        mnestoma.Mnestoma(with_secret(pg_empty_db_url))
    assert SECRET not in chain_text(info.value)


def test_the_no_store_error_hides_the_query_password(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'missing.sqlite'}?password={SECRET}"
    with pytest.raises(SchemaError, match="no mnestoma store") as info:
        mnestoma.Mnestoma(url, create=False)
    assert SECRET not in chain_text(info.value)


@pytest.mark.parametrize("key", ["password", "sslpassword"])
def test_an_unreachable_server_error_hides_the_query_secret(key: str) -> None:
    with pytest.raises(MnestomaError) as info:
        mnestoma.Mnestoma(with_secret(UNREACHABLE, key))
    assert SECRET not in chain_text(info.value)


# --- every subcommand that shows a URL ---------------------------------------------------------


def _ids(result: Result) -> str:
    assert result.exit_code == 0, shown(result)
    record: dict[str, Any] = json.loads(result.stdout)
    return str(record["id"])


def test_no_subcommand_shows_the_query_password_of_a_live_store(
    pg_store_url: str, tmp_path: Path
) -> None:
    url = with_secret(pg_store_url)
    copy_file = tmp_path / "copy.sqlite"
    results: list[tuple[list[str], Result]] = []

    def go(*args: str, code: int | None = 0) -> Result:
        result = run(*args, "--database-url", url)
        results.append((list(args), result))
        assert SECRET not in shown(result), args
        if code is not None:
            assert result.exit_code == code, (args, shown(result))
        return result

    go("db", "current")
    go("db", "upgrade")
    go("db", "history", "--indicate-current")
    go("db", "sql")
    go("status")
    status = json.loads(go("status", "--json").stdout)
    assert make_url(pg_store_url).database in status["database"]
    active = _ids(go("record", "a@1", "b@1", "--json"))
    proto = _ids(go("record", "--proto", "a@1", "wish", "--summary", "s", "--json"))
    for args in (
        ["edges"],
        ["edges", "--json"],
        ["events"],
        ["walk", "a"],
        ["suggest", "a"],
        ["protos", "--min-uses", "1"],
        ["graph"],
        ["queries"],
        ["age", "--dry-run"],
        ["age", "--json"],
    ):
        go(*args)
    go("transition", active, "superseded")
    go("promote", proto, "2")
    copied = go("copy", "--to", f"sqlite:///{copy_file}")
    assert str(make_url(pg_store_url).database) in copied.stdout
    go("copy", "--to", f"sqlite:///{tmp_path / 'copy2.sqlite'}", "--json")
    refused = go("copy", "--from", f"sqlite:///{copy_file}", "--to", url, code=2)
    assert "not empty" in refused.stderr
    go("demo", code=2)  # refuses a store that holds rows, naming it
    go("db", "downgrade", "base")
    go("db", "current")
    assert "no mnestoma schema" in go("edges", code=1).stderr
    go("status")
    go("db", "upgrade")
    assert len(results) > 25


@pytest.mark.parametrize("key", ["password", "sslpassword"])
def test_no_subcommand_shows_the_query_secret_of_an_unreachable_server(
    key: str, tmp_path: Path
) -> None:
    url = with_secret(UNREACHABLE, key)
    target = str(tmp_path / "target.sqlite")
    commands = [
        *([a.format(target=target) for a in args] for args in SUBCOMMANDS),
        ["demo"],
        ["copy", "--from", f"sqlite:///{target}", "--to", url],
    ]
    for args in commands:
        runs = [run(*args, "--database-url", url), run("--database-url", url, *args)]
        if args != ["demo"]:  # the demo's default is a throwaway file, not the environment's
            runs.append(run(*args, env={"MNESTOMA_DATABASE_URL": url}))
        for result in runs:
            assert result.exit_code in (1, 2), (args, shown(result))
            assert SECRET not in shown(result), args
            assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)


def test_copy_reports_hide_the_query_password_of_both_ends(
    pg_store_url: str, tmp_path: Path, _sqlite_template: Path
) -> None:
    source = tmp_path / "source.sqlite"
    shutil.copy(_sqlite_template, source)
    with mnestoma.Mnestoma(f"sqlite:///{source}") as store:
        store.record_passing("a", "1", "b", "1")
    url = with_secret(pg_store_url)
    report = run("copy", "--from", f"sqlite:///{source}?password={SECRET}", "--to", url, "--json")
    assert report.exit_code == 0, shown(report)
    assert SECRET not in shown(report)
    assert make_url(pg_store_url).database in json.loads(report.stdout)["target"]
    again = run("copy", "--from", f"sqlite:///{source}", "--to", url)
    assert again.exit_code == 2 and "not empty" in again.stderr
    assert SECRET not in shown(again)


# --- a connection string inside a query value: the server echoes it ------------------------

# libpq's dbname holding a whole connection string with a password; the server answers that
# no database has that name, repeating it.
CONNINFO_IN_DBNAME = f"postgresql+psycopg://root@127.0.0.1/?dbname=dbname%3Dx%20password%3D{SECRET}"


def test_a_password_in_a_conninfo_dbname_is_not_in_the_database_unavailable_message() -> None:
    require_postgresql()
    with pytest.raises(DatabaseUnavailable) as info:
        mnestoma.Mnestoma(CONNINFO_IN_DBNAME)
    assert SECRET not in str(info.value)
    assert "does not exist" in str(info.value)  # the server's answer, still readable


def test_a_password_in_a_conninfo_dbname_is_in_no_exception_the_error_chains() -> None:
    require_postgresql()
    with pytest.raises(DatabaseUnavailable) as info:
        mnestoma.Mnestoma(CONNINFO_IN_DBNAME)
    chained = every_exception(info.value)
    assert len(chained) >= 3  # the package's error, SQLAlchemy's, the driver's
    for exc in chained:
        assert SECRET not in str(exc), type(exc)
    assert SECRET not in chain_text(info.value)


def test_an_async_store_hides_a_password_in_a_conninfo_dbname_too() -> None:
    require_postgresql()
    from mnestoma.doors.asynchronous import AsyncMnestoma

    async def main() -> None:
        async with AsyncMnestoma(CONNINFO_IN_DBNAME) as am:
            await am.edges()

    with pytest.raises(DatabaseUnavailable) as info:
        asyncio.run(main())
    for exc in every_exception(info.value):
        assert SECRET not in str(exc), type(exc)


def test_debug_output_hides_a_password_in_a_conninfo_dbname() -> None:
    require_postgresql()
    for args in (["edges"], ["status"], ["record", "a@1", "b@1"], ["db", "current"]):
        result = run("--debug", *args, "--database-url", CONNINFO_IN_DBNAME)
        assert result.exit_code != 0, args
        assert result.exception is not None
        assert SECRET not in shown(result), args
        for exc in every_exception(result.exception):
            assert SECRET not in str(exc), (args, type(exc))


def test_an_engines_repr_hides_a_password_in_a_conninfo_dbname() -> None:
    engine = make_engine(CONNINFO_IN_DBNAME)
    try:
        for text in (repr(engine), str(engine.url), engine.url.render_as_string(False)):
            assert SECRET not in text
        assert "dbname" in str(engine.url)  # what is not secret stays
    finally:
        engine.dispose()


def test_an_engines_repr_hides_a_password_in_a_conninfo_database_name() -> None:
    engine = make_engine(f"postgresql+psycopg://root@127.0.0.1/dbname=x%20password={SECRET}")
    try:
        assert SECRET not in repr(engine) + engine.url.render_as_string(False)
    finally:
        engine.dispose()


def test_a_conninfo_value_hidden_from_the_engines_url_still_reaches_the_server(
    pg_store_url: str,
) -> None:
    name = f"app password={SECRET}"
    url = make_url(pg_store_url).update_query_dict({"application_name": name})
    engine = make_engine(url.render_as_string(hide_password=False))
    try:
        assert SECRET not in repr(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW application_name").scalar() == name
    finally:
        engine.dispose()


def test_the_pools_debug_log_hides_a_password_in_a_conninfo_dbname(
    caplog: pytest.LogCaptureFixture,
) -> None:
    require_postgresql()
    engine = make_engine(CONNINFO_IN_DBNAME)
    try:
        with caplog.at_level(logging.DEBUG, logger="sqlalchemy"), pytest.raises(OperationalError):
            engine.connect()
        assert "Error on connect" in caplog.text  # the pool did log the failure
        assert SECRET not in caplog.text
        for record in caplog.records:
            if record.exc_info and record.exc_info[1] is not None:
                assert SECRET not in chain_text(record.exc_info[1])
    finally:
        engine.dispose()
