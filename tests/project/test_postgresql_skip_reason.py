"""The suite's PostgreSQL half needs a database to connect to (``test`` by default): a
server that answers without it gets it created, and a skip says what is missing, never
"unreachable" when the server answers."""

from __future__ import annotations

import secrets

from conftest import PG_ADMIN_URL, drop_pg_database, postgresql_problem, require_postgresql
from sqlalchemy import NullPool, create_engine, text
from sqlalchemy.engine import make_url


def _missing_database_url() -> str:
    name = f"mnestoma_missing_{secrets.token_hex(4)}"
    return make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def _exists(url: str) -> bool:
    name = make_url(url).database
    eng = create_engine(PG_ADMIN_URL, poolclass=NullPool)
    try:
        with eng.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
            return found.first() is not None
    finally:
        eng.dispose()


def test_a_missing_database_is_named_as_missing_not_as_an_unreachable_server() -> None:
    require_postgresql()
    url = _missing_database_url()
    reason = postgresql_problem(url, create=False)
    assert reason is not None
    database = make_url(url).database
    assert f"PostgreSQL answers, but not with the database of {make_url(url)}" in reason
    assert f'database "{database}" does not exist' in reason
    assert f'createdb "{database}"' in reason and "MNESTOMA_TEST_PG_ADMIN_URL" in reason
    assert "does not answer" not in reason and not _exists(url)


def test_a_missing_database_is_created_when_the_server_allows() -> None:
    require_postgresql()
    url = _missing_database_url()
    try:
        assert postgresql_problem(url) is None
        assert _exists(url)
        assert postgresql_problem(url) is None  # there now: nothing more to do
    finally:
        drop_pg_database(make_url(url))


def test_a_server_that_does_not_answer_is_named_so() -> None:
    url = make_url(PG_ADMIN_URL).set(host="127.0.0.1", port=1).render_as_string()
    reason = postgresql_problem(url)
    assert reason is not None and reason.startswith("PostgreSQL does not answer at ")
    assert "refused" in reason.lower()


def test_a_refused_login_is_named_so_with_no_password_shown() -> None:
    require_postgresql()
    user = f"mnestoma_nobody_{secrets.token_hex(4)}"
    url = make_url(PG_ADMIN_URL).set(username=user, password="s3cret-pw")
    reason = postgresql_problem(url.render_as_string(hide_password=False))
    assert reason is not None and reason.startswith("PostgreSQL refuses the login of ")
    assert user in reason and "s3cret-pw" not in reason
