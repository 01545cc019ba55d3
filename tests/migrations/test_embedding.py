"""Inside a real service: its own engine, its own Alembic history, parallel migrations.

A service builds its engine with plain ``create_engine`` and records passings in its own
transactions; its Alembic history shares the database; replicas and test workers migrate
at once. Every pattern runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from alembic import command
from click.testing import CliRunner
from conftest import create_pg_database, drop_pg_database
from helpers_proc import PLUGINS_OFF, warm_processes
from service_patterns import (
    SERVICE_TABLE,
    migrate_main,
    process_main,
    run_threads,
    service_engine,
)
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import sessionmaker
from test_service_alembic import service_project

import mnestoma
from mnestoma.cli import cli
from mnestoma.engines import make_engine
from mnestoma.maintenance.migration import VERSION_TABLE, alembic_config


def _prepare_service(url: str) -> None:
    engine = service_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS service_log"))  # the PostgreSQL store is shared
        sql = SERVICE_TABLE
        if engine.dialect.name == "postgresql":
            sql = sql.replace("INTEGER PRIMARY KEY", "SERIAL PRIMARY KEY")
        conn.execute(text(sql))
    engine.dispose()


def _uses(url: str) -> dict[str, int]:
    with mnestoma.Mnestoma(url) as store:
        return {f"{e.src_executor}->{e.dst_executor}": e.uses for e in store.edges()}


def _service_rows(url: str) -> int:
    engine = service_engine(url)
    with engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM service_log")).scalar_one()
    engine.dispose()
    return int(n)


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["joined", "repository", "unit_of_work"])
def test_a_services_own_engine_records_8_threads_x_50_turns_without_an_error(
    store_url: str, pattern: str
) -> None:
    _prepare_service(store_url)
    errors = run_threads(store_url, pattern, threads=8, turns=50, prefix=pattern)
    assert errors == []
    assert _uses(store_url) == {"plan->search": 400, "search->read": 400, "read->ocr": 400}
    if pattern != "unit_of_work":
        assert _service_rows(store_url) == 400


@pytest.mark.slow
def test_a_services_own_engine_records_from_4_processes_x_50_turns_without_an_error(
    store_url: str,
) -> None:
    _prepare_service(store_url)
    ctx = warm_processes()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=process_main, args=(store_url, "joined", 1, 50, f"p{i}", out))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in out.get(timeout=600)]
    for p in procs:
        p.join(timeout=60)
    assert errors == []
    assert _uses(store_url) == {"plan->search": 200, "search->read": 200, "read->ocr": 200}
    assert _service_rows(store_url) == 200


def test_a_callers_read_snapshot_that_cannot_be_upgraded_is_a_clear_conflict(
    tmp_path: Path, _sqlite_template: Path
) -> None:
    path = tmp_path / "snap.sqlite"
    path.write_bytes(_sqlite_template.read_bytes())
    url = f"sqlite:///{path}"
    engine = create_engine(url)  # the service's own engine
    sessions = sessionmaker(bind=engine)
    with mnestoma.Mnestoma(url) as other, sessions() as session:
        session.connection().exec_driver_sql("BEGIN")  # the caller's own read transaction
        session.execute(text("SELECT count(*) FROM mnests")).scalar()
        other.record_passing("x", "1", "y", "1")  # another writer commits meanwhile
        with pytest.raises(mnestoma.ConflictError, match="already read"):
            mnestoma.MnestRepository(session).record_passing("a", "1", "b", "1")
        session.rollback()
        assert [e.dst_executor for e in other.edges()] == ["y"]
    engine.dispose()


@pytest.fixture
def held_sqlite_lock(tmp_path: Path, _sqlite_template: Path):  # type: ignore[no-untyped-def]
    """A SQLite store whose write lock another connection holds during the test."""
    path = tmp_path / "held.sqlite"
    path.write_bytes(_sqlite_template.read_bytes())
    url = f"sqlite:///{path}"
    with mnestoma.Mnestoma(url) as store:
        store.record_passing("a", "1", "b", "1")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    yield url
    holder.rollback()
    holder.close()


def test_read_only_units_and_sessions_never_wait_for_a_sqlite_writer(held_sqlite_lock: str) -> None:
    url = held_sqlite_lock
    started = time.monotonic()
    engine = make_engine(url)
    sessions = mnestoma.make_session_factory(engine)
    with mnestoma.UnitOfWork(sessions) as uow:
        assert [e.dst_executor for e in uow.mnests.edges()] == ["b"]
    with sessions() as session:
        assert session.execute(text("SELECT count(*) FROM mnests")).scalar() == 1
    with sessions() as session, mnestoma.UnitOfWork.joining(session) as joined:
        assert joined.mnests.find("a", "1", "b", "1") is not None
    engine.dispose()
    with mnestoma.Mnestoma(url) as store:  # opening checks the revision: a read
        assert store.get(store.edges()[0].id) is not None
        assert store.suggest_next("a")[0][0].dst_executor == "b"
    assert time.monotonic() - started < 5  # a wait would last the 60 s lock timeout


def test_a_write_behind_a_long_writer_fails_with_a_typed_retryable_error(
    held_sqlite_lock: str,
) -> None:
    engine = make_engine(held_sqlite_lock, connect_args={"timeout": 0.05}).execution_options(
        mnestoma_lock_timeout=0.3
    )
    with mnestoma.Mnestoma(engine) as store, pytest.raises(mnestoma.WriteLockTimeout) as caught:
        store.record_passing("a", "1", "c", "1")
    assert "write lock" in str(caught.value)
    engine.dispose()


def test_reading_tools_never_create_a_sqlite_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "store.sqlite"
    url = f"sqlite:///{missing}"
    assert mnestoma.current_revision(url) is None
    with pytest.raises(mnestoma.SchemaError, match="no mnestoma store"):
        mnestoma.Mnestoma(url, create=False)
    assert not missing.exists() and not missing.parent.exists()


# --- migrations: parallel, beside a service's Alembic history, legacy stamps -----------------


@pytest.mark.slow
def test_four_processes_migrating_one_fresh_database_all_end_at_head(empty_db_url: str) -> None:
    ctx = warm_processes()
    # Each child waits at the barrier once it has imported the package; the parent passes it
    # only when all four are there, so they start migrating together.
    start, out = ctx.Barrier(5), ctx.Queue()
    procs = [ctx.Process(target=migrate_main, args=(empty_db_url, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=120)
    except threading.BrokenBarrierError:
        pytest.fail("the four children did not all reach the start within 120 s")
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [("ok", mnestoma.head_revision())] * 4


def _versions(url: str) -> dict[str, list[str]]:
    engine = service_engine(url)
    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        for table in ("alembic_version", VERSION_TABLE):
            if table in tables:
                rows = conn.execute(text(f"SELECT version_num FROM {table}")).scalars()
                out[table] = sorted(rows)
    engine.dispose()
    return out


@pytest.mark.parametrize("service_first", [True, False], ids=["service-first", "mnestoma-first"])
def test_a_services_alembic_history_and_the_store_share_one_database(
    empty_db_url: str, tmp_path: Path, service_first: bool
) -> None:
    service = service_project(tmp_path, empty_db_url)
    if service_first:
        command.upgrade(service, "head")
        # the service's revision is not the store's: no wrong advice, nothing to adopt
        status = CliRunner().invoke(cli, ["status", "--json", "--database-url", empty_db_url])
        assert status.exit_code == 0, status.output
        assert '"revision": null' in status.output
        assert "upgrade the mnestoma package" not in status.output
        mnestoma.upgrade(empty_db_url)
    else:
        mnestoma.upgrade(empty_db_url)
        command.upgrade(service, "head")
    mnestoma.upgrade(empty_db_url)  # again: nothing to do, nothing moved
    command.upgrade(service, "head")
    head = mnestoma.head_revision()
    assert _versions(empty_db_url) == {"alembic_version": ["0001"], VERSION_TABLE: [head]}
    assert mnestoma.current_revision(empty_db_url) == head
    with mnestoma.Mnestoma(empty_db_url) as store:
        store.record_passing("a", "1", "b", "1")
        assert len(store.edges()) == 1


def _move_stamp_to_alembic_version(url: str) -> None:
    """Make the store look like one written before the package had its own version table."""
    engine = service_engine(url)
    with engine.begin() as conn:
        rev = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
        conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:r)"), {"r": rev})
    engine.dispose()


@pytest.mark.parametrize("revision", ["0001", "0002"], ids=["seed-era", "release-0.1"])
def test_a_store_stamped_in_alembic_version_is_adopted_by_upgrade_with_every_row(
    empty_db_url: str, revision: str
) -> None:
    mnestoma.upgrade(empty_db_url, revision)
    engine = service_engine(empty_db_url)
    ts = "2026-01-01 00:00:00+00:00"
    columns = "id, src_executor, src_version, dst_executor, dst_version, weight, uses, "
    columns += "ts_first, ts_last, decay_lambda, state"
    values = f"'mn_legacyrow00001', 'a', '1', 'b', '1', 0.5, 2, '{ts}', '{ts}', 0.018, 'active'"
    if revision == "0002":
        columns += ", ts_weight"
        values += f", '{ts}'"
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO mnests ({columns}) VALUES ({values})"))
    engine.dispose()
    _move_stamp_to_alembic_version(empty_db_url)
    assert mnestoma.current_revision(empty_db_url) == revision  # read as the store's
    mnestoma.upgrade(empty_db_url)
    assert _versions(empty_db_url) == {VERSION_TABLE: [mnestoma.head_revision()]}
    with mnestoma.Mnestoma(empty_db_url) as store:
        row = store.get("mn_legacyrow00001")
        assert row is not None and row.uses == 2 and row.weight == pytest.approx(0.5)


def test_a_postgresql_store_can_live_in_a_schema_of_its_own(tmp_path: Path) -> None:
    base = create_pg_database("mnestoma_schema")
    try:
        plain = base.render_as_string(hide_password=False)
        service = service_project(tmp_path, plain)
        command.upgrade(service, "head")  # the service's history, in public
        url = base.update_query_dict({"options": "-csearch_path=mnestoma_store"})
        store_url = url.render_as_string(hide_password=False)
        mnestoma.upgrade(store_url)
        with mnestoma.Mnestoma(store_url) as store:
            store.record_passing("a", "1", "b", "1")
        engine = create_engine(make_url(plain))
        with engine.connect() as conn:
            insp = inspect(conn)
            assert "mnests" in insp.get_table_names(schema="mnestoma_store")
            assert VERSION_TABLE in insp.get_table_names(schema="mnestoma_store")
            assert "mnests" not in insp.get_table_names(schema="public")
            assert conn.execute(text("SELECT version_num FROM public.alembic_version")).all() == [
                ("0001",)
            ]
            n = conn.execute(text("SELECT count(*) FROM mnestoma_store.mnests")).scalar()
            assert n == 1
        engine.dispose()
        assert mnestoma.current_revision(store_url) == mnestoma.head_revision()
    finally:
        drop_pg_database(base, later=True)


DOWNSTREAM_TESTS = """
import pytest
from mnestoma.testing import MnestFactory


@pytest.mark.parametrize("n", range(8))
def test_factories_write_through_the_kit(n, mnestoma_uow):
    MnestFactory.create_batch(n + 1)
    assert len(mnestoma_uow.mnests.edges()) == n + 1
"""


@pytest.mark.slow
def test_the_testing_kit_under_pytest_xdist_passes_a_downstream_suite(
    engine_name: str, tmp_path: Path
) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["mnestoma.testing"]\n')
    (tmp_path / "test_downstream.py").write_text(DOWNSTREAM_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNESTOMA_")}
    db = create_pg_database("mnestoma_xdist") if engine_name == "postgresql" else None
    if db is not None:
        env["MNESTOMA_TEST_DATABASE_URL"] = db.render_as_string(hide_password=False)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
             *PLUGINS_OFF],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False, env=env,
        )  # fmt: skip
    finally:
        if db is not None:
            drop_pg_database(db, later=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout


@pytest.mark.parametrize(
    "args",
    [["edges"], ["events"], ["walk", "a"], ["suggest", "a"], ["protos"], ["status"], ["age"]],
    ids=lambda a: a[0],
)
def test_reading_commands_never_create_a_sqlite_store(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "no" / "store.sqlite"
    result = CliRunner().invoke(cli, [*args, "--database-url", f"sqlite:///{missing}"])
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output
    assert not missing.exists() and not missing.parent.exists()


def test_recording_from_the_command_line_creates_the_store(tmp_path: Path) -> None:
    target = tmp_path / "new" / "store.sqlite"
    result = CliRunner().invoke(
        cli, ["record", "a@1", "b@1", "--database-url", f"sqlite:///{target}"]
    )
    assert result.exit_code == 0, result.output
    assert target.exists()


def test_alembic_current_reads_a_legacy_store_without_adopting_it(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0002")
    _move_stamp_to_alembic_version(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        command.current(alembic_config(engine))
    finally:
        engine.dispose()
    assert _versions(empty_db_url) == {"alembic_version": ["0002"]}
