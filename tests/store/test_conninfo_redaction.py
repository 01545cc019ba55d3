"""A password inside a libpq connection string never shows, however it is written.

libpq reads a whole connection string from ``dbname`` (and the package treats any URL value
that holds one as secret). Its value runs to the next space (a backslash escaping the
character after it), or it is a single-quoted string with ``\\'`` and ``\\\\`` escapes:
``password=ab,Zq9`` is one password, not ``ab`` followed by text. The cases are generated,
each checked by libpq's own parser (``conninfo_to_dict``) to say the password it holds, and
no four running characters of a mark inside every secret may appear where a user could see.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_kit import SUBCOMMANDS, chain_text, every_exception, run, shown
from click.testing import Result
from conftest import require_postgresql
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL, make_url

import mnestoma
from mnestoma import DatabaseUnavailable, InvalidInput
from mnestoma.cli import scrub
from mnestoma.engines import (
    make_engine,
    redact_text,
    redact_url,
    resolve_database_url,
    scrub_exception,
    secrets_of,
)

MARK = "Zq9SECRET"
# The characters that ended the hidden part before, and others libpq or a URL treat apart
NASTY = ",;&)(\"'\\ \t=%+#?@/:*<>|!$`~[]{}é\u00a0"
PIECE = st.text(alphabet=NASTY + "abcXYZ019", max_size=6)
FAST = settings(max_examples=200, deadline=None)
LIVE = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def shows_mark(text: str) -> bool:
    """True when ``text`` holds any four running characters of the mark (of a cut secret)."""
    return any(MARK[i : i + 4] in text for i in range(len(MARK) - 3))


def secret_of(pieces: tuple[str, str, str]) -> str:
    """A secret with the mark after nasty text, and at its end."""
    a, b, c = pieces
    return f"{a}{MARK}{b}{MARK}{c}"


def unquoted(value: str) -> str:
    """libpq's unquoted form: a backslash before a backslash, a space and a leading quote."""
    escaped = "".join(f"\\{ch}" if ch in "\\ \t\n\r\f\v" else ch for ch in value)
    return f"\\{escaped}" if escaped.startswith("'") else escaped


def quoted(value: str) -> str:
    """libpq's quoted form: in single quotes, a backslash before a backslash and a quote."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@st.composite
def conninfos(draw: st.DrawFn) -> tuple[str, str]:
    """A libpq connection string holding a password (its key, spacing and quoting drawn),
    and the password libpq reads from it."""
    secret = secret_of(draw(st.tuples(PIECE, PIECE, PIECE)))
    key = draw(st.sampled_from(["password", "sslpassword"]))
    written = draw(st.sampled_from([unquoted, quoted]))(secret)
    equals = draw(st.sampled_from(["=", " = ", "=  ", "\t=\t"]))
    before = draw(st.sampled_from(["", "dbname=x ", "host=db.example dbname='a b' "]))
    after = draw(st.sampled_from(["", " sslmode=disable", " application_name='x y'"]))
    text = f"{before}{key}{equals}{written}{after}"
    parsed = {k.lower(): v for k, v in conninfo_to_dict(text).items()}
    assert parsed[key.lower()] == secret  # the case is what libpq reads
    return text, secret


def url_holding(conninfo: str, where: str, host: str = "db.example") -> str:
    """A PostgreSQL URL with ``conninfo`` as its database name or in a query value."""
    if where == "database":
        url = URL.create("postgresql+psycopg", username="root", host=host, database=conninfo)
    else:
        url = URL.create(
            "postgresql+psycopg", username="root", host=host, database="x", query={where: conninfo}
        )
    return url.render_as_string(hide_password=False)


WHERE = st.sampled_from(["database", "dbname", "application_name", "options"])


# --- the functions, on many generated cases ---------------------------------------------------


@FAST
@given(conninfos())
@example(("dbname=x password=ab,Zq9SECRET", "ab,Zq9SECRET"))
@example(("password='ab\\' cd Zq9SECRET'", "ab' cd Zq9SECRET"))
def test_redact_text_hides_a_conninfo_password_however_it_is_written(
    case: tuple[str, str],
) -> None:
    conninfo, _secret = case
    for text in (
        conninfo,
        f'FATAL:  database "{conninfo}" does not exist',
        f"could not connect ({conninfo}): refused",
    ):
        assert not shows_mark(redact_text(text)), text


@FAST
@given(conninfos())
def test_a_server_echo_cut_at_its_name_limit_shows_no_part_of_the_password(
    case: tuple[str, str],
) -> None:
    conninfo, _secret = case
    for limit in (31, 47, 63):  # the server truncates a name to 63 bytes
        cut = conninfo.encode()[:limit].decode(errors="ignore")
        assert not shows_mark(redact_text(f'FATAL:  database "{cut}" does not exist')), cut


@FAST
@given(conninfos(), WHERE)
@example(("dbname=x password=ab,Zq9SECRET", "ab,Zq9SECRET"), "dbname")
@example(("dbname=x password=ab&Zq9SECRET", "ab&Zq9SECRET"), "database")
def test_redact_url_and_an_engines_repr_hide_a_conninfo_password(
    case: tuple[str, str], where: str
) -> None:
    conninfo, _secret = case
    url = url_holding(conninfo, where)
    assert not shows_mark(redact_url(url))
    assert not shows_mark(redact_url(make_url(url)))
    engine = make_engine(url)
    try:
        for text in (repr(engine), str(engine.url), engine.url.render_as_string(False)):
            assert not shows_mark(text)
    finally:
        engine.dispose()


@FAST
@given(conninfos())
def test_secrets_of_knows_the_password_as_libpq_reads_it(case: tuple[str, str]) -> None:
    conninfo, secret = case
    known = secrets_of(make_url(url_holding(conninfo, "database")))
    assert secret in known
    err = RuntimeError(f"the server said {secret} and nothing else")
    scrub_exception(err, known)
    assert not shows_mark(str(err))


@FAST
@given(conninfos(), WHERE)
def test_an_unparseable_url_holding_a_conninfo_password_is_refused_without_it(
    case: tuple[str, str], where: str
) -> None:
    conninfo, _secret = case
    url = url_holding(conninfo, where).replace("@db.example/", "@db.example:notaport/")
    with pytest.raises(InvalidInput) as info:
        resolve_database_url(url)
    assert not shows_mark(chain_text(info.value))


@FAST
@given(conninfos())
def test_the_command_lines_scrub_hides_a_conninfo_password(case: tuple[str, str]) -> None:
    conninfo, _secret = case
    assert not shows_mark(scrub(f"Error: {conninfo}"))
    assert not shows_mark(scrub(f'connection failed: database "{conninfo}" does not exist'))


def test_what_is_not_secret_stays_readable() -> None:
    assert redact_text("host=h password=ab,cd dbname=x") == "host=h password=*** dbname=x"
    assert redact_text("host=h password='a b\\'c' dbname=x") == "host=h password=*** dbname=x"
    assert redact_text("db?password=ab,cd&sslmode=require") == "db?password=***&sslmode=require"
    assert redact_url("postgresql://root@h/store?password=x&sslmode=require") == (
        "postgresql://root@h/store?password=***&sslmode=require"
    )


# --- a live server: the error of a failed connection, its chain, every subcommand ----------


@LIVE
@given(conninfos(), st.sampled_from(["database", "dbname"]))
@example(("dbname=x password=ab,Zq9SECRET", "ab,Zq9SECRET"), "database")
@example(  # the server cuts the name inside the quotes: what it echoes is no known secret
    ("host=db.example dbname='a b' password='000Zq9SECRET000 Zq9SECRET'", ""), "database"
)
def test_database_unavailable_and_its_chain_hide_a_conninfo_password(
    case: tuple[str, str], where: str
) -> None:
    require_postgresql()
    conninfo, _secret = case
    with pytest.raises(DatabaseUnavailable) as info:
        mnestoma.Mnestoma(url_holding(conninfo, where, host="127.0.0.1"))
    for exc in every_exception(info.value):
        assert not shows_mark(str(exc)), type(exc)
    assert not shows_mark(chain_text(info.value))


# One password with every character that ended the hidden part before, and spaces: libpq's
# two ways of writing it, as the database name the server echoes back.
HARD_SECRET = f"a,b;c&d)e\"f'g h\\i{MARK}"
HARD_CONNINFOS = {
    "unquoted": f"dbname=x password={unquoted(HARD_SECRET)}",
    "quoted": f"dbname=x password = {quoted(HARD_SECRET)}",
}


@pytest.mark.parametrize("form", sorted(HARD_CONNINFOS))
def test_no_subcommand_shows_a_conninfo_password(form: str, tmp_path: Path) -> None:
    require_postgresql()
    conninfo = HARD_CONNINFOS[form]
    assert conninfo_to_dict(conninfo)["password"] == HARD_SECRET
    url = url_holding(conninfo, "database", host="127.0.0.1")
    target = str(tmp_path / "target.sqlite")
    for template in SUBCOMMANDS:
        args = [a.format(target=target) for a in template]
        for result in (
            run(*args, "--database-url", url),
            run(*args, env={"MNESTOMA_DATABASE_URL": url}),
            run("--debug", *args, "--database-url", url),
        ):
            assert result.exit_code in (1, 2), (args, shown(result))
            assert not shows_mark(shown(result)), (args, shown(result))
    copied_in = run("copy", "--from", f"sqlite:///{target}", "--to", url)
    assert copied_in.exit_code in (1, 2)
    assert not shows_mark(shown(copied_in))


@pytest.mark.parametrize("form", sorted(HARD_CONNINFOS))
def test_a_live_store_and_its_copy_reports_hide_a_conninfo_password(
    form: str, pg_store_url: str, tmp_path: Path, _sqlite_template: Path
) -> None:
    # application_name reaches the server as it is: the store opens, its URL holds the secret
    base = make_url(pg_store_url)
    url = base.update_query_dict({"application_name": HARD_CONNINFOS[form]})
    text = url.render_as_string(hide_password=False)
    with mnestoma.Mnestoma(text) as store:
        store.record_passing("a", "1", "b", "1")
        assert not shows_mark(repr(store) + repr(store.engine))
    source = tmp_path / "source.sqlite"
    shutil.copy(_sqlite_template, source)
    with mnestoma.Mnestoma(f"sqlite:///{source}") as store:
        store.record_passing("c", "1", "d", "1")
    reports: list[Result] = [
        run("copy", "--database-url", text, "--to", f"sqlite:///{tmp_path / 'out.sqlite'}"),
        run("copy", "--from", text, "--to", f"sqlite:///{tmp_path / 'out2.sqlite'}", "--json"),
        run("copy", "--from", f"sqlite:///{source}", "--to", text, "--append", "--json"),
        run("status", "--database-url", text, "--json"),
    ]
    for result in reports:
        assert result.exit_code == 0, shown(result)
        assert not shows_mark(shown(result))
    record: dict[str, Any] = json.loads(reports[1].stdout)
    assert str(base.database) in record["source"]  # what is not secret stays
