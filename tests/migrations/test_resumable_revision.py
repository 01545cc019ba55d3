"""A PostgreSQL revision that commits part of its work before it is stamped (0008: its
columns, then each validation in a transaction of its own) is completed by the next run,
whatever the point it stopped at: the package's own retry, a second ``db upgrade``, and
the ``mnestoma db sql`` script run again with psql all reach head.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import PG_ADMIN_URL, create_pg_database, drop_pg_database
from schema_kit import schema_diff
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url

import mnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance import migration
from mnestoma.maintenance.migration import current_revision, head_revision, offline_sql

TIMEOUT = 0.2  # seconds a statement waits for a lock in these tests
CHECKS = ("ck_mnests_outcome_counts_nonneg", "ck_events_outcome_known")


class Stopped(Exception):
    """The upgrade was interrupted here (as a kill or a dropped connection would)."""


def add_a_row_at_0007(conn: Connection) -> None:
    """One edge and its event, as a store at 0007 holds them."""
    conn.execute(
        text(
            "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version,"
            " weight, uses, ts_first, ts_last, ts_weight, state) VALUES ('mn_resume0000001',"
            " 'search', '1', 'read', '2', 0.3, 1, now(), now(), now(), 'active')"
        )
    )
    conn.execute(
        text(
            "INSERT INTO events (mnest_id, kind, ts, weight_after, state_after)"
            " VALUES ('mn_resume0000001', 'created', now(), 0.3, 'active')"
        )
    )


@pytest.fixture
def at_0007(pg_empty_db_url: str) -> Iterator[Engine]:
    """A PostgreSQL store at 0007 with a row and its event."""
    engine = make_engine(pg_empty_db_url)
    mnestoma.upgrade(engine, "0007")
    with engine.begin() as conn:
        add_a_row_at_0007(conn)
    try:
        yield engine
    finally:
        engine.dispose()


def _columns_of_0008(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT column_name FROM information_schema.columns"
                " WHERE column_name IN ('ok_count', 'error_count', 'outcome')"
            )
        )
        return {r[0] for r in rows}


def assert_complete_at_head(engine: Engine) -> None:
    """At head, the schema the models describe, both CHECKs there and validated, rows kept."""
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert schema_diff(conn) == []
        checks = dict(
            conn.execute(
                text("SELECT conname, convalidated FROM pg_constraint WHERE conname = ANY(:n)"),
                {"n": list(CHECKS)},
            ).all()
        )
        assert checks == dict.fromkeys(CHECKS, True)
        row = conn.execute(text("SELECT uses, ok_count, error_count FROM mnests")).one()
        assert tuple(row) == (1, 0, 0)
        assert conn.execute(text("SELECT ok_count FROM v_mnestoma")).scalar_one() == 0


def _stop_before(engine: Engine, pattern: str) -> None:
    """Interrupt the upgrade, the first time only, as it is about to run a statement that
    matches ``pattern``."""
    fired: list[bool] = []

    @event.listens_for(engine, "before_cursor_execute")
    def stop(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and re.search(pattern, statement):
            fired.append(True)
            raise Stopped(statement)


# Every point after 0008's first transaction committed and before its stamp did.
STOPS = {
    "before the first validation": r"VALIDATE CONSTRAINT ck_mnests",
    "before the second validation": r"VALIDATE CONSTRAINT ck_events",
    "before the stamp": r"UPDATE mnestoma_alembic_version",
}


@pytest.mark.parametrize("where", list(STOPS))
def test_an_upgrade_stopped_after_0008s_columns_committed_is_completed_by_the_next(
    at_0007: Engine, where: str
) -> None:
    _stop_before(at_0007, STOPS[where])
    with pytest.raises(Stopped):
        mnestoma.upgrade(at_0007)
    assert current_revision(at_0007) == "0007"
    assert _columns_of_0008(at_0007) == {"ok_count", "error_count", "outcome"}
    mnestoma.upgrade(at_0007)
    assert_complete_at_head(at_0007)


@pytest.fixture
def validation_held(at_0007: Engine) -> Iterator[threading.Event]:
    """From the moment 0008 first asks to validate, another session holds the lock a
    validation needs (SHARE UPDATE EXCLUSIVE on mnests, as an ANALYZE, a VACUUM or a CREATE
    INDEX CONCURRENTLY does) until the event returned is set."""
    release = threading.Event()
    taken = threading.Event()
    holder = make_engine(at_0007.url)

    def hold() -> None:
        with holder.connect() as conn:
            conn.execute(text("LOCK TABLE mnests IN SHARE UPDATE EXCLUSIVE MODE"))
            taken.set()
            release.wait(60)
            conn.rollback()

    thread = threading.Thread(target=hold)

    @event.listens_for(at_0007, "before_cursor_execute")
    def take(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if "VALIDATE CONSTRAINT ck_mnests" in statement and thread.ident is None:
            thread.start()
            assert taken.wait(10)

    try:
        yield release
    finally:
        release.set()
        if thread.is_alive():
            thread.join()
        holder.dispose()


def test_a_validation_whose_lock_times_out_is_retried_by_the_upgrade_to_head(
    at_0007: Engine, validation_held: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    def release_on_retry(*args: Any) -> None:
        validation_held.set()  # the lock goes once the first attempt has timed out

    monkeypatch.setattr(migration.time, "sleep", release_on_retry)
    mnestoma.upgrade(at_0007, lock_timeout=TIMEOUT)
    assert_complete_at_head(at_0007)


def test_a_validation_that_timed_out_past_every_retry_is_completed_by_the_next_upgrade(
    at_0007: Engine, validation_held: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration, "MIGRATION_LOCK_RETRIES", 1)
    monkeypatch.setattr(migration, "FIRST_RETRY_PAUSE_S", 0.0)
    with pytest.raises(mnestoma.ConflictError, match="stays at revision 0007"):
        mnestoma.upgrade(at_0007, lock_timeout=TIMEOUT)
    assert _columns_of_0008(at_0007) == {"ok_count", "error_count", "outcome"}
    validation_held.set()
    mnestoma.upgrade(at_0007, lock_timeout=TIMEOUT)
    assert_complete_at_head(at_0007)


# --- the offline script, run with psql ------------------------------------------------------


def _psql(
    url: str, sql: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", libpq],
        input=sql, capture_output=True, text=True, timeout=120, check=False,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


def _statement_ends(script: str) -> list[int]:
    """The offsets just past each statement of an offline script (each ends ';' + newline)."""
    return [m.end() for m in re.finditer(r";\n", script)]


@pytest.fixture(scope="module")
def template_0007() -> Iterator[URL]:
    """A database at 0007 with a row, copied for each stop point (CREATE DATABASE TEMPLATE)."""
    url = create_pg_database("mnestoma_tpl0007")
    engine = make_engine(url)
    try:
        mnestoma.upgrade(engine, "0007")
        with engine.begin() as conn:
            add_a_row_at_0007(conn)
    finally:
        engine.dispose()
    yield url
    drop_pg_database(url, later=True)


def _copy_of(template: URL, name: str) -> URL:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template.database}"'))
    finally:
        admin.dispose()
    return template.set(database=name)


def test_the_0008_script_run_again_with_psql_after_a_stop_anywhere_reaches_0008(
    template_0007: URL,
) -> None:
    script = offline_sql("postgresql://", "0007:0008", lock_timeout=TIMEOUT)
    stops = _statement_ends(script)[:-1]  # every proper prefix: the whole script is no stop
    assert len(stops) > 15
    for i, stop in enumerate(stops):
        url = _copy_of(template_0007, f"{template_0007.database}_{i}")
        try:
            rendered = url.render_as_string(hide_password=False)
            _psql(rendered, script[:stop])  # psql ends there; an open transaction rolls back
            again = _psql(rendered, script)
            assert again.returncode == 0, f"stopped after {script[:stop][-120:]!r}: {again}"
            assert current_revision(rendered) == "0008"
            engine = make_engine(rendered)
            try:
                with engine.connect() as conn:
                    checks = conn.execute(
                        text("SELECT count(*) FROM pg_constraint WHERE conname = ANY(:n)"
                             " AND convalidated"),
                        {"n": list(CHECKS)},
                    ).scalar_one()  # fmt: skip
                assert checks == 2
            finally:
                engine.dispose()
        finally:
            drop_pg_database(url, later=True)


def test_the_0008_script_whose_validation_timed_out_reaches_0008_when_run_again(
    template_0007: URL,
) -> None:
    url = _copy_of(template_0007, f"{template_0007.database}_timeout")
    rendered = url.render_as_string(hide_password=False)
    holder = make_engine(rendered)
    try:
        script = offline_sql("postgresql://", "0007:0008", lock_timeout=TIMEOUT)
        first_validation = script.index("-- Idempotent: run again")
        assert _psql(rendered, script[:first_validation]).returncode == 0
        with holder.connect() as conn:  # an ANALYZE's lock, as the validation comes
            conn.execute(text("LOCK TABLE mnests IN SHARE UPDATE EXCLUSIVE MODE"))
            # the rest of the script, in a session whose lock_timeout its first part set
            stopped = _psql(
                rendered, script[first_validation:], {"PGOPTIONS": "-c lock_timeout=200ms"}
            )
            conn.rollback()
        assert stopped.returncode != 0
        assert "lock timeout" in stopped.stderr
        assert current_revision(rendered) == "0007"
        again = _psql(rendered, script)
        assert again.returncode == 0, again.stderr
        assert current_revision(rendered) == "0008"
    finally:
        holder.dispose()
        drop_pg_database(url, later=True)
