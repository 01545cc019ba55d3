"""A facade's write commits with its last statement, at the driver, so that no step of the
call after it holds the write lock (SQLite) or the row's lock (PostgreSQL: the COMMIT sent
with the one statement, in psycopg's pipeline mode, for no round trip of the client). A
write in a transaction the caller owns never commits it, and a connection whose statements
or commits somebody observes commits through SQLAlchemy, as ever."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

import mnestoma
from mnestoma.engines import locking
from mnestoma.schema import snapshots
from mnestoma.schema.runner import DriverRunner
from mnestoma.store import sqlite_writes

EDGE = ("cl.src", "1", "cl.dst", "1")
NEXT = ("cl.dst", "1", "cl.end", "1")
SELECT_USES = (
    f"SELECT uses FROM mnests WHERE src_executor = '{EDGE[0]}'"
    f" AND dst_executor = '{EDGE[2]}' AND state = 'active'"
)
# The method each engine's facade writes its last statement with.
# The runner's methods that run a write's last statement and its COMMIT: a passing's
# steps on SQLite (writes), a turn's last batch (many_committing), PostgreSQL's statement.
# A SQLite passing's writes run through run_ready, made ready before the lock or not.
COMMITTING = {"sqlite": ("run_ready", "many_committing"), "postgresql": ("first_committing",)}

Probe = Callable[[], "int | None"]


def _sqlite_probe(url: str) -> Iterator[Probe]:
    path = url.removeprefix("sqlite:///")

    def free_uses() -> int | None:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            try:
                other.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return None
            row = other.execute(SELECT_USES).fetchone()
            other.execute("ROLLBACK")
            return None if row is None else int(row[0])
        finally:
            other.close()

    yield free_uses


def _postgresql_probe(url: str) -> Iterator[Probe]:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:

        def free_uses() -> int | None:
            try:
                found = conn.execute(text(SELECT_USES + " FOR UPDATE NOWAIT")).scalar()
            except Exception:  # lock_not_available: another session holds the row
                return None
            return None if found is None else int(found)

        yield free_uses
    engine.dispose()


@pytest.fixture
def free_uses(store_url: str, engine_name: str) -> Iterator[Probe]:
    """The edge's committed uses when another connection can take its lock at once (the
    write lock on SQLite, the row's on PostgreSQL); None while somebody holds it."""
    yield from (_sqlite_probe if engine_name == "sqlite" else _postgresql_probe)(store_url)


@pytest.fixture
def looking(
    engine_name: str, free_uses: Probe, monkeypatch: pytest.MonkeyPatch
) -> list[int | None]:
    """What another connection sees as each write's last statement returns, before the
    facade's own commit runs."""
    seen: list[int | None] = []
    for name in COMMITTING[engine_name]:
        original = getattr(DriverRunner, name)

        def look(self: DriverRunner, *args: Any, _run: Any = original, **kwargs: Any) -> Any:
            found = _run(self, *args, **kwargs)
            seen.append(free_uses())
            return found

        monkeypatch.setattr(DriverRunner, name, look)
    return seen


def test_a_facades_passing_is_committed_and_the_lock_free_when_its_last_statement_returns(
    store_url: str, looking: list[int | None]
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)  # created
        m = store.record_passing(*EDGE)  # reinforced
    assert m.uses == 2
    assert looking == [1, 2]


def test_a_facades_turn_is_committed_and_the_lock_free_when_its_last_statement_returns(
    store_url: str, engine_name: str, looking: list[int | None]
) -> None:
    """SQLite; on PostgreSQL a turn's one statement may run again with its locks held, and
    the unit of work commits it."""
    with mnestoma.Mnestoma(store_url) as store:
        rows = store.record_turn("t1", [EDGE, NEXT])  # its last statement counts a chain
        assert [r.uses for r in rows] == [1, 1]
        rows = store.record_turn("t2", [EDGE, EDGE])  # no chain: the events are the last
        assert [r.uses for r in rows] == [3, 3]
        assert store.record_turn("t2", [EDGE, EDGE])[0].uses == 3  # again: nothing counted
    assert looking == ([1, 3, 3] if engine_name == "sqlite" else [])


@pytest.fixture
def building(free_uses: Probe, monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """What another connection sees of the edge each time a snapshot of a row is built."""
    seen: list[int | None] = []
    one, many = snapshots.mnest, snapshots.mnests

    def look(values: Any) -> Any:
        seen.append(free_uses())
        return one(values)

    def look_at_each(rows: Any) -> Any:
        rows = list(rows)
        seen.extend(free_uses() for _ in rows)
        return many(rows)

    monkeypatch.setattr(snapshots, "mnest", look)
    monkeypatch.setattr(snapshots, "mnests", look_at_each)
    return seen


def test_a_facades_passing_and_turn_build_their_snapshots_once_committed_with_the_lock_free(
    store_url: str, building: list[int | None]
) -> None:
    """Building a snapshot is Python work other writers would wait for: it runs after the
    commit. A turn builds one snapshot per edge, an edge given twice the same one."""
    with mnestoma.Mnestoma(store_url) as store:
        assert store.record_passing(*EDGE).uses == 1
        rows = store.record_turn("t1", [EDGE, NEXT, EDGE])
    assert [r.uses for r in rows] == [3, 1, 3]
    assert rows[0] is rows[2]
    assert building == [1, 3, 3]  # the passing's, then the turn's two edges, all committed


def test_a_passing_in_the_callers_transaction_is_not_committed_by_its_last_statement(
    store_url: str, free_uses: Probe
) -> None:
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
    engine = mnestoma.make_engine(store_url)
    sessions = mnestoma.make_session_factory(engine)
    try:
        with mnestoma.UnitOfWork(sessions) as uow:
            assert uow.mnests.record_passing(*EDGE).uses == 2
            assert uow.mnests.record_turn("t", [EDGE, NEXT])[0].uses == 3
            assert free_uses() is None  # the caller's transaction holds the lock
            uow.rollback()
        assert free_uses() == 1  # nothing of it was committed
    finally:
        engine.dispose()


def _two_passings_observed(url: str, event_name: str, listener: Callable[..., None]) -> None:
    """Two passings on one edge through a facade on an engine with ``listener`` on
    ``event_name``."""
    engine = mnestoma.make_engine(url)
    event.listen(engine, event_name, listener)
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            assert store.record_passing(*EDGE).uses == 2
    finally:
        engine.dispose()


def test_a_facades_passing_whose_statements_are_observed_commits_through_sqlalchemy(
    store_url: str, engine_name: str, free_uses: Probe
) -> None:
    """A statement listener sends every statement through SQLAlchemy: the last one alone,
    then the unit's commit, each seen by the listener."""
    statements: list[str] = []
    _two_passings_observed(store_url, "before_cursor_execute", lambda *a: statements.append(a[2]))
    assert free_uses() == 2
    written = "WITH locked" if engine_name == "postgresql" else "INSERT INTO events"
    assert sum(s.lstrip().startswith(written) for s in statements) == 2


def test_a_facades_passing_whose_commits_are_observed_commits_through_sqlalchemy(
    store_url: str, free_uses: Probe, looking: list[int | None]
) -> None:
    """A ``commit`` listener of the service sees each commit before it happens: the last
    statement leaves the lock held, and the unit's commit, seen by the listener, ends it."""
    commits: list[int | None] = []
    _two_passings_observed(store_url, "commit", lambda conn: commits.append(free_uses()))
    assert looking == [None, None]  # still locked after the last statement
    assert commits == [None, None]  # the listener ran before the commit, as ever
    assert free_uses() == 2


def test_a_commit_that_fails_at_the_driver_raises_the_packages_error_and_leaves_the_store_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite, where the commit at the driver goes through the dialect (PostgreSQL's goes
    in psycopg's pipeline)."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    free_uses = next(_sqlite_probe(url))
    with mnestoma.Mnestoma(url) as store:
        store.record_passing(*EDGE)
        dialect = store.engine.dialect
        original = dialect.do_commit
        failed: list[bool] = []

        def failing(dbapi: Any) -> None:
            if not failed:
                failed.append(True)
                raise sqlite3.OperationalError("disk I/O error")
            original(dbapi)

        monkeypatch.setattr(dialect, "do_commit", failing)
        with pytest.raises(mnestoma.StoreError) as caught:
            store.record_passing(*EDGE)
        assert not isinstance(caught.value.__cause__, sqlite3.Error)  # SQLAlchemy's wrapper
        assert failed == [True]
        assert free_uses() == 1  # rolled back, the lock released
        assert store.record_passing(*EDGE).uses == 2


def test_a_facades_sqlite_write_whose_transactions_are_observed_begins_through_sqlalchemy(
    tmp_path: Path,
) -> None:
    """A facade's SQLite write lives at the driver alone (``BEGIN IMMEDIATE``, then its
    ``COMMIT``), with no SQLAlchemy transaction around it, only while nobody would miss
    one: a service's ``begin`` listener on the engine sees each write's transaction."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    begun: list[bool] = []
    with mnestoma.Mnestoma(url) as store:
        store.record_passing(*EDGE)
        event.listen(store.engine, "begin", lambda conn: begun.append(True))
        store.record_passing(*EDGE)
        assert store.record_passing(*EDGE).uses == 3
    assert begun == [True, True]


def _failing_reinforcement(*args: Any, **kwargs: Any) -> Any:
    raise mnestoma.StoreError("failed under the lock")


def _failing_before_the_lock(*args: Any, **kwargs: Any) -> Any:
    raise mnestoma.StoreError("failed before the lock")


def _fail_under_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reinforcement fails, computed under the lock: the connection keeps no row, which
    would have it computed before the lock (see the test after these)."""
    monkeypatch.setattr(DriverRunner, "kept_rows", lambda self: None)
    monkeypatch.setattr(sqlite_writes, "reinforcement", _failing_reinforcement)


def test_a_failed_sqlite_write_is_rolled_back_where_a_rollback_listener_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    free_uses = next(_sqlite_probe(url))
    engine = mnestoma.make_engine(url)
    rolled_back: list[int | None] = []
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            event.listen(engine, "rollback", lambda conn: rolled_back.append(free_uses()))
            _fail_under_the_lock(monkeypatch)
            with pytest.raises(mnestoma.StoreError, match="failed under the lock"):
                store.record_passing(*EDGE)
    finally:
        engine.dispose()
    assert rolled_back == [None]  # seen before the rollback, the lock still held
    assert free_uses() == 1


def test_a_facades_sqlite_write_that_fails_under_the_lock_rolls_back_in_its_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write run at the driver alone that fails once it holds the write lock is rolled
    back by its unit of work, not left to the pool: on an engine whose pool resets nothing
    on return, the connection would go back to it still holding the lock."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    free_uses = next(_sqlite_probe(url))
    engine = mnestoma.make_engine(url, pool_reset_on_return=None)
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)

            _fail_under_the_lock(monkeypatch)
            with pytest.raises(mnestoma.StoreError, match="failed under the lock"):
                store.record_passing(*EDGE)
            assert free_uses() == 1  # rolled back, the lock released
            monkeypatch.undo()
            assert store.record_passing(*EDGE).uses == 2
    finally:
        engine.dispose()


def test_a_kept_rows_write_that_fails_before_the_lock_takes_no_lock_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the row its connection kept, a passing computes its reinforcement before the
    write lock: failing there, it has taken no lock and written nothing, and the row it
    kept is still good for the next passing."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    free_uses = next(_sqlite_probe(url))
    engine = mnestoma.make_engine(url)
    locked: list[int] = []
    real_begin = locking._begin_immediate
    monkeypatch.setattr(
        locking, "_begin_immediate", lambda *a, **k: (locked.append(1), real_begin(*a, **k))[1]
    )
    try:
        with mnestoma.Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            taken = len(locked)
            with monkeypatch.context() as failing:
                failing.setattr(sqlite_writes, "reinforcement", _failing_before_the_lock)
                with pytest.raises(mnestoma.StoreError, match="failed before the lock"):
                    store.record_passing(*EDGE)
            assert len(locked) == taken  # no lock asked for
            assert free_uses() == 1
            assert store.record_passing(*EDGE).uses == 2
    finally:
        engine.dispose()


def _traced(dbapi: Any, path: Path, work: Callable[[], Any]) -> tuple[list[str], str]:
    """The protocol messages psycopg's connection ``dbapi`` exchanged while ``work`` ran
    (direction and kind), and the whole trace."""
    with path.open("w") as out:
        dbapi.pgconn.trace(out.fileno())
        try:
            work()
        finally:
            dbapi.pgconn.untrace()
    trace = path.read_text()
    messages = []
    for line in trace.splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[1] in ("F", "B"):
            messages.append(f"{parts[1]} {parts[3].split()[0]}")
    return messages, trace


def test_a_facades_passing_on_postgresql_is_one_message_the_server_commits_itself(
    pg_store_url: str, tmp_path: Path
) -> None:
    """Its transaction sends nothing before it, so the statement goes alone, in autocommit:
    no BEGIN, no COMMIT, one Sync, one answer; it is committed when it returns, and the
    connection is out of autocommit again for whatever it runs next."""
    with mnestoma.Mnestoma(pg_store_url) as store:
        store.record_passing(*EDGE)
        dbapi = store._kept._conn.connection.dbapi_connection  # type: ignore[union-attr]
        messages, trace = _traced(dbapi, tmp_path / "trace", lambda: store.record_passing(*EDGE))
        assert dbapi.autocommit is False
        assert '"BEGIN"' not in trace and '"COMMIT"' not in trace, trace
        assert "B CommandComplete" in messages, messages
        assert messages.count("F Sync") == 1, messages
        assert messages.count("B ReadyForQuery") == 1, messages
        with store.unit_of_work() as unit:  # a transaction the caller ends, rolled back
            unit.mnests.record_passing(*EDGE)
        assert store.record_passing(*EDGE).uses == 3  # the rolled-back one not counted


@pytest.mark.parametrize("begun", [False, True], ids=["alone", "after-a-statement"])
def test_a_committing_statement_that_fails_leaves_the_driver_outside_autocommit_and_nothing_written(
    pg_store_url: str, begun: bool
) -> None:
    """At psycopg's driver, a statement that ends its transaction and fails: its error is
    raised, nothing of the transaction is kept, and the connection is left out of
    autocommit and outside any transaction, reusable."""
    import psycopg

    from mnestoma.schema.runner import _committed_with

    url = pg_store_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as dbapi:
        dbapi.execute("CREATE TEMPORARY TABLE kept (n int)")
        dbapi.commit()
        if begun:
            dbapi.execute("INSERT INTO kept VALUES (1)")

        class Fetch:
            @staticmethod
            def fetch(cursor: Any) -> list[tuple[Any, ...]]:
                return list(cursor.fetchall())

        cursor = psycopg.RawCursor(dbapi)
        with pytest.raises(psycopg.errors.DivisionByZero):
            _committed_with(
                dbapi,
                cursor,
                "INSERT INTO kept VALUES (2) RETURNING 1 / $1",
                (0,),
                Fetch(),  # type: ignore[arg-type]
            )
        assert dbapi.autocommit is False
        dbapi.rollback()
        assert dbapi.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert dbapi.execute("SELECT count(*) FROM kept").fetchone() == (0,)
        found = _committed_with(
            dbapi,
            cursor,
            "INSERT INTO kept VALUES (3) RETURNING n",
            None,
            Fetch(),  # type: ignore[arg-type]
        )
        assert found == [(3,)]
        assert dbapi.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    "setting",
    [("isolation_level", "REPEATABLE_READ"), ("read_only", True), ("deferrable", True)],
    ids=["isolation_level", "read_only", "deferrable"],
)
def test_a_committing_statement_keeps_the_transaction_a_connection_asks_for(
    pg_store_url: str, setting: tuple[str, Any]
) -> None:
    """A connection whose transactions begin with an isolation level, read-only or
    deferrable (psycopg says so in its BEGIN): the statement runs in such a transaction, not
    alone in autocommit, and is committed."""
    import psycopg

    from mnestoma.schema.runner import _committed_with

    class Fetch:
        @staticmethod
        def fetch(cursor: Any) -> list[tuple[Any, ...]]:
            return list(cursor.fetchall())

    name, value = setting
    if name == "isolation_level":
        value = psycopg.IsolationLevel[value]
    url = pg_store_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as dbapi:
        setattr(dbapi, name, value)
        found = _committed_with(
            dbapi,
            psycopg.RawCursor(dbapi),
            "SELECT current_setting('transaction_isolation'),"
            " current_setting('transaction_read_only'),"
            " current_setting('transaction_deferrable')",
            None,
            Fetch(),  # type: ignore[arg-type]
        )
        assert dbapi.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert dbapi.autocommit is False
    expected = {
        "isolation_level": ("repeatable read", "off", "off"),
        "read_only": ("read committed", "on", "off"),
        "deferrable": ("read committed", "off", "on"),
    }[name]
    assert found == [expected]


def test_a_facade_on_an_autocommit_engine_leaves_its_connections_in_autocommit(
    pg_store_url: str,
) -> None:
    """A service's engine with ``isolation_level="AUTOCOMMIT"``: its connections stay in
    autocommit after the package's passing, so the service's own statements on them are
    still committed as they run."""
    from sqlalchemy.pool import QueuePool

    engine = create_engine(
        pg_store_url, isolation_level="AUTOCOMMIT", poolclass=QueuePool, pool_size=1
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE TABLE service_rows (n int)"))
        with mnestoma.Mnestoma(engine) as store:
            assert store.record_passing(*EDGE).uses == 1
            assert store.record_passing(*EDGE).uses == 2
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection.autocommit is True  # type: ignore[union-attr]
            conn.execute(text("INSERT INTO service_rows VALUES (1)"))  # no commit: autocommit
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM service_rows")).scalar() == 1
            conn.execute(text("DROP TABLE service_rows"))
    finally:
        engine.dispose()
