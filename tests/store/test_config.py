"""Where the database is (contract §3) and how the engines are configured."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import mnestoma
from mnestoma import InvalidInput, make_engine, make_session_factory, resolve_database_url
from mnestoma.core.errors import WriteLockTimeout
from mnestoma.engines import WRITE_OPTION, locking, redact_url
from mnestoma.engines.locking import LOCK_TIMEOUT_OPTION

ENV = ("MNESTOMA_DATABASE_URL", "MNESTOMA_DB_PATH", "METNOS_WORKSPACE")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_an_explicit_url_wins_over_every_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", "sqlite:////env/url.sqlite")
    monkeypatch.setenv("MNESTOMA_DB_PATH", "/env/path.sqlite")
    assert resolve_database_url("sqlite:////explicit.sqlite").database == "/explicit.sqlite"


def test_the_url_variable_comes_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", "postgresql://u@db.example/mn")
    monkeypatch.setenv("MNESTOMA_DB_PATH", "/env/path.sqlite")
    url = resolve_database_url()
    assert (url.drivername, url.host, url.database) == ("postgresql+psycopg", "db.example", "mn")


def test_the_path_variable_comes_third(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MNESTOMA_DB_PATH", str(tmp_path / "p.sqlite"))
    monkeypatch.setenv("METNOS_WORKSPACE", str(tmp_path / "ws"))
    url = resolve_database_url()
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "p.sqlite")


def test_the_workspace_comes_fourth(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("METNOS_WORKSPACE", str(tmp_path / "ws"))
    assert resolve_database_url().database == str(tmp_path / "ws" / ".mnestoma" / "mnest.sqlite")


def test_the_current_directory_is_the_last_resort(tmp_path: Path) -> None:
    assert resolve_database_url().database == str(tmp_path / ".mnestoma" / "mnest.sqlite")


def test_a_bare_postgresql_url_uses_psycopg_3() -> None:
    assert resolve_database_url("postgresql://u@h/db").drivername == "postgresql+psycopg"


@pytest.mark.parametrize("bad", ["not a url", "mysql://u@h/db", "oracle://x"])
def test_a_bad_or_unsupported_url_is_invalid_input(bad: str) -> None:
    with pytest.raises(InvalidInput):
        resolve_database_url(bad)


def test_an_unparsable_url_error_never_shows_its_password() -> None:
    with pytest.raises(InvalidInput) as caught:
        resolve_database_url("mysql://user:hunter2@host/db")
    assert "hunter2" not in str(caught.value)


def test_redacted_urls_hide_the_password() -> None:
    text_ = redact_url("postgresql+psycopg://user:hunter2@host:5432/db")
    assert "hunter2" not in text_ and "user" in text_ and "host" in text_


def test_the_sqlite_parent_folder_is_created_private(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "er" / "mnest.sqlite"
    engine = make_engine(f"sqlite:///{target}")
    try:
        assert target.parent.is_dir()
        assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    finally:
        engine.dispose()


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=["000", "022", "277"])
def test_every_folder_made_for_a_new_store_is_private_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    """Only the last folder was 0700: those above it followed the umask (world-writable
    under 000). A folder that was there already is left as it was."""
    target = tmp_path / "a" / "b" / "c" / "mnest.sqlite"
    tmp_path.chmod(0o755)
    old = os.umask(umask)
    try:
        engine = make_engine(f"sqlite:///{target}")
    finally:
        os.umask(old)
    engine.dispose()
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def test_a_store_folder_another_process_made_meanwhile_is_used_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes opening new stores side by side: the one that finds a folder made
    under its feet goes on in it."""
    from mnestoma.engines import build as engines

    made = tmp_path / "shared"
    real_mkdir = os.mkdir

    def racing_mkdir(path: Any, mode: int = 0o777) -> None:
        if Path(path) == made and not made.exists():
            real_mkdir(path, 0o750)  # the other process, first
        real_mkdir(path, mode)

    monkeypatch.setattr(engines.os, "mkdir", racing_mkdir)
    engine = make_engine(f"sqlite:///{made / 'inner' / 'mnest.sqlite'}")
    engine.dispose()
    assert stat.S_IMODE(made.stat().st_mode) == 0o750
    assert stat.S_IMODE((made / "inner").stat().st_mode) == 0o700


def test_sqlite_connections_have_a_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.sqlite'}")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 5000
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        engine.dispose()


def test_a_store_the_package_migrates_runs_in_wal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.sqlite'}"
    mnestoma.upgrade(url)
    with sqlite3.connect(tmp_path / "w.sqlite") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_switch_to_wal_that_sqlite_refuses_at_once_is_tried_again_until_it_passes(
    tmp_path: Path,
) -> None:
    # Processes opening a new file at once all switch it to WAL; SQLite may refuse one of
    # them at once ("database is locked"), without waiting in its busy handler.
    raw = sqlite3.connect(tmp_path / "r.sqlite", isolation_level=None)

    class RefusingTwice:
        refusals = 2

        def execute(self, sql: str) -> sqlite3.Cursor:
            if sql == "PRAGMA journal_mode = WAL" and self.refusals:
                self.refusals -= 1
                raise sqlite3.OperationalError("database is locked")
            return raw.execute(sql)

        def cursor(self) -> sqlite3.Cursor:
            return raw.cursor()

    dbapi = RefusingTwice()
    locking._execute_waiting(dbapi, {}, "PRAGMA journal_mode = WAL", 5.0)
    assert dbapi.refusals == 0
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_a_switch_to_wal_behind_a_writer_longer_than_the_lock_timeout_fails_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "held.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    engine = make_engine(f"sqlite:///{path}").execution_options(**{LOCK_TIMEOUT_OPTION: 0.3})
    try:
        with engine.connect() as conn, pytest.raises(WriteLockTimeout):
            locking.use_wal(conn)
    finally:
        engine.dispose()
    holder.execute("COMMIT")
    assert holder.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    holder.close()


def test_reading_a_foreign_sqlite_file_leaves_it_byte_for_byte_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "foreign.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    before = path.read_bytes()
    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT count(*) FROM orders")).scalar()
        assert mnestoma.current_revision(engine) is None
    finally:
        engine.dispose()
    assert path.read_bytes() == before
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_a_sqlite_write_takes_the_write_lock_at_its_first_statement(tmp_path: Path) -> None:
    """A second writer waits for the lock (here: a short timeout, so it gives up)."""
    path = tmp_path / "lock.sqlite"
    mnestoma.upgrade(f"sqlite:///{path}")
    engine = make_engine(f"sqlite:///{path}")
    other = make_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05}).execution_options(
        **{LOCK_TIMEOUT_OPTION: 0.2}
    )
    try:
        holder = engine.connect()
        holder.execute(text("CREATE TABLE t (x INTEGER)"))  # BEGIN IMMEDIATE: lock held
        with pytest.raises(WriteLockTimeout, match="write lock"), other.connect() as conn2:
            conn2.execute(text("CREATE TABLE u (x INTEGER)"))
        holder.rollback()
        holder.close()
    finally:
        engine.dispose()
        other.dispose()


def test_a_sqlite_read_never_waits_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "read.sqlite"
    mnestoma.upgrade(f"sqlite:///{path}")
    engine = make_engine(f"sqlite:///{path}")
    reader = make_engine(f"sqlite:///{path}", connect_args={"timeout": 0.05})
    try:
        holder = engine.connect()
        holder.execute(text("CREATE TABLE t (x INTEGER)"))  # the write lock is held
        with reader.connect() as conn2:  # a busy wait would fail after 0.05 s
            assert conn2.execute(text("SELECT count(*) FROM mnests")).scalar() == 0
        sessions = make_session_factory(reader)
        with sessions() as session:
            assert session.execute(text("SELECT count(*) FROM events")).scalar() == 0
        holder.rollback()
        holder.close()
    finally:
        engine.dispose()
        reader.dispose()


def test_sqlite_savepoints_work(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'sp.sqlite'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
        sessions = make_session_factory(engine)
        with sessions() as s:
            s.execute(text("INSERT INTO t VALUES (1)"))
            nested = s.begin_nested()
            s.execute(text("INSERT INTO t VALUES (2)"))
            nested.rollback()
            s.commit()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT x FROM t")).scalars().all() == [1]
    finally:
        engine.dispose()


def test_concurrent_sqlite_read_then_write_transactions_with_the_write_option_lose_nothing(
    tmp_path: Path,
) -> None:
    """WRITE_OPTION: a caller's read-then-write transaction takes the lock at BEGIN."""
    engine = make_engine(f"sqlite:///{tmp_path / 'c.sqlite'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE n (v INTEGER)"))
        conn.execute(text("INSERT INTO n VALUES (0)"))
    writer = engine.execution_options(**{WRITE_OPTION: True})
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(50):
                with writer.begin() as conn:
                    v = conn.execute(text("SELECT v FROM n")).scalar_one()
                    conn.execute(text("UPDATE n SET v = :v"), {"v": v + 1})
        except BaseException as err:  # pragma: no cover - the assertion shows it
            errors.append(err)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT v FROM n")).scalar_one() == 200
    engine.dispose()
    assert errors == []


def test_postgresql_engines_ping_their_connections() -> None:
    engine = make_engine("postgresql://u:pw@127.0.0.1:1/db")
    assert engine.pool._pre_ping is True
    engine.dispose()


def test_no_engine_or_session_is_built_at_import() -> None:
    import mnestoma

    assert not any(
        type(v).__name__ in {"Engine", "Session", "sessionmaker"} for v in vars(mnestoma).values()
    )


def test_a_password_never_reaches_the_engine_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    engine = make_engine("postgresql://u:hunter2@127.0.0.1:1/db", echo=True)
    logging.getLogger("x").info("engine %s", engine)
    engine.dispose()
    assert "hunter2" not in caplog.text
    assert "hunter2" not in repr(engine)
