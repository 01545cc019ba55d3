"""The pytest plugin under pytest-xdist (contract §7): one database per worker.

Each test holds its transaction (and so its row locks) until it ends, and the ager locks
its tables; workers sharing one database would wait on, and deadlock with, each other.
The end-to-end tests run a small downstream suite with ``-n 4`` in a subprocess and then
look at the server: every test passed, each worker had its own database, none is left. The
subprocess loads only the plugins it needs (xdist, mnestoma.testing): the entry-point
plugins installed beside them would triple each worker's start-up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PG_ADMIN_URL, create_pg_database, drop_pg_database
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from mnestoma.testing.plugin import (
    PG_NAME_BYTES,
    WorkerDatabaseError,
    postgresql_worker_database,
    worker_database_name,
)

DOWNSTREAM_CONFTEST = 'pytest_plugins = ["mnestoma.testing"]\n'

# Every test writes rows, commits them into its transaction, waits a little while holding
# its locks, then runs the ager (which locks the same tables): the testing guide's example test.
DOWNSTREAM_TESTS = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import pytest
    from sqlalchemy import func, select

    from mnestoma import Mnest
    from mnestoma.testing import MnestFactory, ProtoMnestFactory

    SEEN = Path(os.environ["DOWNSTREAM_SEEN"])


    @pytest.fixture(autouse=True)
    def _note_the_database(mnestoma_engine, worker_id):
        (SEEN / worker_id).write_text(str(mnestoma_engine.url.database))
        with mnestoma_engine.connect() as conn:  # nothing left from another run
            assert not mnestoma_engine.dialect.has_table(conn, "leftover")


    @pytest.mark.parametrize("n", range(12))
    def test_planner_prefers_the_strongest_edge(n, mnestoma_uow, mnestoma_clock):
        MnestFactory(src_executor="search", dst_executor="summarise", strong=True)
        MnestFactory(src_executor="search", dst_executor="translate", old=True)
        ProtoMnestFactory(src_executor="search", recurring=True)
        mnestoma_uow.mnests.record_passing("search", "1.0.0", "summarise", "1.0.0")
        mnestoma_uow.commit()
        time.sleep(0.05)  # keep the test's locks while other workers reach their ager
        mnestoma_clock.advance(days=1)
        report = mnestoma_uow.mnests.apply_ager()
        assert report.to_decaying == 1
        [(best, _)] = mnestoma_uow.mnests.suggest_next("search", k=1)
        assert best.dst_executor == "summarise"
        assert len(mnestoma_uow.mnests.recurring_protos()) == 1


    def test_each_test_starts_from_an_empty_store(mnestoma_session):
        assert mnestoma_session.scalar(select(func.count()).select_from(Mnest)) == 0
    """
)
DOWNSTREAM_COUNT = 13


def run_downstream(
    where: Path,
    workers: int,
    database_url: str | None,
    *,
    env_extra: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run the downstream suite with ``-n workers``; its output and each worker's database
    (``master`` without xdist)."""
    suite, seen = where / "suite", where / "seen"
    suite.mkdir()
    seen.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # no configuration from any parent folder
    (suite / "conftest.py").write_text(DOWNSTREAM_CONFTEST)
    (suite / "test_downstream.py").write_text(DOWNSTREAM_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("MNESTOMA_TEST_DATABASE_URL", None)
    if database_url is not None:
        env["MNESTOMA_TEST_DATABASE_URL"] = database_url
    env.update(DOWNSTREAM_SEEN=str(seen), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **(env_extra or {}))
    command = ["-p", "xdist", "-n", str(workers), "-p", "no:cacheprovider", "-q"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *command],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, {p.name: p.read_text() for p in seen.iterdir()}


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stdout + result.stderr)[-4000:]


def assert_all_passed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, _output(result)
    assert f"{DOWNSTREAM_COUNT} passed" in result.stdout, _output(result)


def pg_databases_like(prefix: str) -> list[str]:
    """Names of the server's databases that begin with ``prefix``."""
    admin = create_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            rows = conn.execute(
                text("SELECT datname FROM pg_database WHERE starts_with(datname, :p)"),
                {"p": prefix},
            )
            return sorted(r[0] for r in rows)
    finally:
        admin.dispose()


def pg_run(url: URL | str, statement: str) -> None:
    """One statement in autocommit mode on ``url``'s database."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(statement))
    finally:
        engine.dispose()


@pytest.fixture
def downstream_pg_url() -> Iterator[URL]:
    """A throwaway PostgreSQL database for ``MNESTOMA_TEST_DATABASE_URL``; any worker
    database left beside it is dropped afterwards too. The suite's automatic marks do not
    see through this fixture: its tests carry ``postgresql`` themselves."""
    url = create_pg_database("mnestoma_xdist")
    try:
        yield url
    finally:
        for name in pg_databases_like(f"{url.database}_"):
            drop_pg_database(url.set(database=name), later=True)
        drop_pg_database(url, later=True)


# --- PostgreSQL, end to end -------------------------------------------------------------------


@pytest.mark.postgresql
def test_four_workers_on_postgresql_each_get_a_database_and_every_test_passes(
    tmp_path: Path, downstream_pg_url: URL
) -> None:
    result, seen = run_downstream(
        tmp_path, 4, downstream_pg_url.render_as_string(hide_password=False)
    )

    assert_all_passed(result)
    base = downstream_pg_url.database
    assert seen == {f"gw{i}": f"{base}_gw{i}" for i in range(4)}
    assert pg_databases_like(f"{base}_") == []


@pytest.mark.postgresql
def test_a_worker_database_left_by_an_interrupted_run_is_replaced(
    tmp_path: Path, downstream_pg_url: URL
) -> None:
    leftover = downstream_pg_url.set(database=f"{downstream_pg_url.database}_gw0")
    pg_run(downstream_pg_url, f'CREATE DATABASE "{leftover.database}"')
    pg_run(leftover, "CREATE TABLE leftover (id integer)")

    result, seen = run_downstream(
        tmp_path, 1, downstream_pg_url.render_as_string(hide_password=False)
    )

    assert_all_passed(result)  # each test checks that the table "leftover" is not there
    assert seen == {"gw0": leftover.database}
    assert pg_databases_like(f"{downstream_pg_url.database}_") == []


@pytest.mark.postgresql
def test_without_xdist_the_suite_uses_the_url_database_itself(
    tmp_path: Path, downstream_pg_url: URL
) -> None:
    # a run started by a test of an xdist run inherits PYTEST_XDIST_WORKER: not a worker
    result, seen = run_downstream(
        tmp_path,
        0,
        downstream_pg_url.render_as_string(hide_password=False),
        env_extra={"PYTEST_XDIST_WORKER": "gw7"},
    )

    assert_all_passed(result)
    assert seen == {"master": downstream_pg_url.database}
    assert pg_databases_like(f"{downstream_pg_url.database}_") == []


# --- PostgreSQL, the worker database in this process ------------------------------------------


@pytest.mark.postgresql
def test_worker_database_is_dropped_even_while_a_test_left_a_connection_open(
    downstream_pg_url: URL,
) -> None:
    with postgresql_worker_database(downstream_pg_url, "gw3") as own:
        leaked = create_engine(own)
        leaked.connect()  # a service engine a test forgot to close
        assert pg_databases_like(str(own.database)) == [own.database]
    leaked.dispose()
    assert pg_databases_like(f"{downstream_pg_url.database}_") == []


@pytest.mark.postgresql
def test_a_role_without_createdb_is_told_so_and_no_secret_is_shown(
    downstream_pg_url: URL,
) -> None:
    role = f"{downstream_pg_url.database}_nocreate"
    pg_run(PG_ADMIN_URL, f"CREATE ROLE \"{role}\" LOGIN NOCREATEDB PASSWORD 'pw-in-url-9f2'")
    try:
        url = make_url(
            downstream_pg_url.set(username=role, password="pw-in-url-9f2").render_as_string(
                hide_password=False
            )
            + "?sslpassword=key-pass-4c1"
        )
        with pytest.raises(WorkerDatabaseError) as caught, postgresql_worker_database(url, "gw0"):
            pass
    finally:
        pg_run(PG_ADMIN_URL, f'DROP ROLE "{role}"')

    message = str(caught.value)
    assert "permission denied to create database" in message
    assert "CREATEDB" in message
    assert f"{downstream_pg_url.database}_gw0" in message
    assert "pw-in-url-9f2" not in message
    assert "key-pass-4c1" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.postgresql
def test_a_worker_database_another_run_still_uses_is_left_alone_and_said_so(
    downstream_pg_url: URL,
) -> None:
    busy = downstream_pg_url.set(database=f"{downstream_pg_url.database}_gw0")
    pg_run(downstream_pg_url, f'CREATE DATABASE "{busy.database}"')
    other_run = create_engine(busy)
    try:
        with other_run.connect():
            with (
                pytest.raises(WorkerDatabaseError, match="another test run"),
                postgresql_worker_database(downstream_pg_url, "gw0"),
            ):
                pass
            assert pg_databases_like(str(busy.database)) == [busy.database]
    finally:
        other_run.dispose()


# --- names ------------------------------------------------------------------------------------


def test_worker_database_name_is_the_url_database_and_the_worker() -> None:
    assert worker_database_name("myservice_test", "gw0") == "myservice_test_gw0"


def test_worker_database_names_too_long_for_postgresql_stay_short_and_distinct() -> None:
    first = worker_database_name("x" * 60 + "_a", "gw12")
    second = worker_database_name("x" * 60 + "_b", "gw12")
    assert len(first.encode()) <= PG_NAME_BYTES
    assert len(second.encode()) <= PG_NAME_BYTES
    assert first != second
    assert first.startswith("xxxx") and first.endswith("_gw12")


# --- SQLite -----------------------------------------------------------------------------------


def test_without_a_url_each_worker_gets_its_own_temporary_sqlite_file(tmp_path: Path) -> None:
    result, seen = run_downstream(tmp_path, 2, None)

    assert_all_passed(result)
    assert sorted(seen) == ["gw0", "gw1"]
    assert seen["gw0"] != seen["gw1"]
    assert all(path.endswith(".sqlite") for path in seen.values())


def test_a_sqlite_url_gives_each_worker_a_file_beside_it_removed_afterwards(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "db"
    result, seen = run_downstream(tmp_path, 2, f"sqlite:///{folder / 'store.sqlite'}")

    assert_all_passed(result)
    assert seen == {f"gw{i}": str(folder / f"store_gw{i}.sqlite") for i in range(2)}
    assert list(folder.iterdir()) == []
