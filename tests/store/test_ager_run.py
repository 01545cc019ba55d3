"""How apply_ager runs: what it leaves on the connection, inside callers' transactions, on
big mostly-demoting stores, and against the pure-Python reference of the ager."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from ager_kit import T0, StoppedClock, demoting_store, load
from conftest import mnest_row
from sqlalchemy import Connection, Engine, event, select, text

import mnestoma
import mnestoma.maintenance.ager as ager_module
from mnestoma import AgerReport, Mnestoma, UnitOfWork, make_engine, make_session_factory
from mnestoma.core.errors import MnestomaError
from mnestoma.core.rules import AgerRow, age
from mnestoma.core.settings import Settings
from mnestoma.maintenance.ager import AGER_CACHE_KIB
from mnestoma.schema.models import Mnest
from mnestoma.schema.sql.ager import AgerChange, sqlite_ager_statements
from mnestoma.store.uow import ConnectionUnitOfWork


def table(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every row of ``mnests`` by id, as the ager's reference sees rows."""
    with engine.connect() as conn:
        rows = conn.execute(select(Mnest.__table__)).mappings().all()
    return {m["id"]: dict(m) for m in rows}


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ager.sqlite'}"
    mnestoma.upgrade(url)
    return url


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    yield engine
    engine.dispose()


def cache_size(conn: Connection) -> int:
    return int(conn.exec_driver_sql("PRAGMA cache_size").scalar_one())


def temp_tables(conn: Connection) -> list[str]:
    return list(conn.exec_driver_sql("SELECT name FROM sqlite_temp_master").scalars())


def statements_of(conn: Connection) -> list[str]:
    """A list that fills with the SQL ``conn`` executes from now on."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(args[2])

    event.listen(conn, "before_cursor_execute", record)
    return seen


# --- SQLite: the page cache and the temporary table ------------------------------------------


def test_the_run_raises_the_page_cache_and_sets_it_back(sqlite_engine: Engine) -> None:
    load(sqlite_engine, demoting_store(300, twins=20))
    with sqlite_engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA cache_size = -3000")
        conn.commit()
        seen = statements_of(conn)
        with ConnectionUnitOfWork(conn, settings=Settings(clock=StoppedClock())) as unit:
            report = unit.mnests.apply_ager()
            unit.commit()
        assert report.merged == 20
        assert f"PRAGMA cache_size = {-AGER_CACHE_KIB}" in seen
        assert cache_size(conn) == -3000
        assert temp_tables(conn) == []


def test_a_larger_cache_of_the_caller_is_left_alone(sqlite_engine: Engine) -> None:
    load(sqlite_engine, demoting_store(50))
    with sqlite_engine.connect() as conn:
        conn.exec_driver_sql(f"PRAGMA cache_size = {-2 * AGER_CACHE_KIB}")
        conn.commit()
        seen = statements_of(conn)
        with ConnectionUnitOfWork(conn, settings=Settings(clock=StoppedClock())) as unit:
            unit.mnests.apply_ager()
            unit.commit()
        assert not [s for s in seen if s.startswith("PRAGMA cache_size =")]
        assert cache_size(conn) == -2 * AGER_CACHE_KIB


def test_a_failed_run_sets_the_cache_back_drops_its_table_and_changes_nothing(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    load(sqlite_engine, demoting_store(200, twins=10))
    before = table(sqlite_engine)
    # the run fails after its merges and events, at the demotions
    statements = sqlite_ager_statements()
    broken = AgerChange("demote", text("SELECT no_such_function()"))
    failing = replace(
        statements,
        changes=tuple(broken if c.name == "demote" else c for c in statements.changes),
    )
    monkeypatch.setattr(ager_module, "sqlite_ager_statements", lambda batched=False: failing)
    with sqlite_engine.connect() as conn:
        default = cache_size(conn)
        conn.commit()
        with (
            pytest.raises(MnestomaError),
            ConnectionUnitOfWork(conn, settings=Settings(clock=StoppedClock())) as unit,
        ):
            unit.mnests.apply_ager()
        assert cache_size(conn) == default
        assert temp_tables(conn) == []
    assert table(sqlite_engine) == before


def test_the_ager_runs_inside_a_callers_savepoint_and_leaves_nothing_behind(
    sqlite_engine: Engine,
) -> None:
    load(sqlite_engine, demoting_store(200, twins=10))
    sessions = make_session_factory(sqlite_engine)
    with sessions() as session:
        conn = session.connection()
        default = cache_size(conn)
        with UnitOfWork.joining(session, clock=StoppedClock()) as uow:
            report = uow.mnests.apply_ager()
            uow.commit()
        # still the caller's transaction, on the caller's connection
        assert session.in_transaction()
        assert cache_size(conn) == default
        assert temp_tables(conn) == []
        # and a second run in another savepoint of the same transaction changes nothing
        with UnitOfWork.joining(session, clock=StoppedClock()) as uow:
            again = uow.mnests.apply_ager()
            uow.commit()
        session.commit()
    assert report.merged == 10 and report.to_decaying > 100
    assert again == AgerReport(archive_candidates=report.archive_candidates)


# --- both engines ---------------------------------------------------------------------------


def test_a_joined_unit_that_fails_after_the_ager_keeps_none_of_its_work(store_url: str) -> None:
    engine = make_engine(store_url)
    try:
        load(engine, demoting_store(200, twins=10))
        before = table(engine)
        sessions = make_session_factory(engine)
        with sessions() as session:
            with (
                pytest.raises(RuntimeError),
                UnitOfWork.joining(session, clock=StoppedClock()) as uow,
            ):
                assert uow.mnests.apply_ager().to_decaying > 100
                raise RuntimeError("the caller's next step failed")
            session.commit()
        assert table(engine) == before
    finally:
        engine.dispose()


def test_a_mostly_demoting_store_ages_as_the_reference_says_and_once(store_url: str) -> None:
    """2,000 rows of which about 93 % change state, with merges and rows anchored after now:
    the run leaves the rows and the report the pure-Python ager computes, and running it again
    at the same instant changes nothing."""
    rows = demoting_store(2_000, twins=60)
    clock = StoppedClock()
    with Mnestoma(store_url, clock=clock) as store:
        load(store.engine, rows)
        expected_rows, expected = age(rows, T0)
        report = store.apply_ager()
        after = table(store.engine)
        assert report == expected
        assert report.merged == 60 and report.to_decaying > 1_500
        assert after.keys() == {r.id for r in expected_rows}
        for ref in expected_rows:
            got = AgerRow.of(after[ref.id])
            assert (got.state, got.uses, got.ts_first, got.ts_last, got.ts_weight) == (
                ref.state,
                ref.uses,
                ref.ts_first,
                ref.ts_last,
                ref.ts_weight,
            ), ref.id
            assert got.weight == pytest.approx(ref.weight, rel=1e-9, abs=1e-15), ref.id
        for _ in range(3):
            assert store.apply_ager() == AgerReport(archive_candidates=report.archive_candidates)
        assert table(store.engine) == after


def test_a_mostly_demoting_store_aged_in_steps_ends_as_aged_once(store_url: str) -> None:
    rows = demoting_store(1_000, seed=5, twins=30)
    ends: list[dict[str, tuple[str, int, float]]] = []
    for steps in ([T0 - timedelta(days=20), T0 - timedelta(days=3), T0], [T0]):
        engine = make_engine(store_url)
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM events"))
            conn.execute(text("DELETE FROM mnests"))
        engine.dispose()
        clock = StoppedClock()
        with Mnestoma(store_url, clock=clock) as store:
            load(store.engine, rows)
            for at in steps:
                clock.now = at
                store.apply_ager()
            left = [AgerRow.of(r) for r in table(store.engine).values()]
        ends.append({r.id: (r.state, r.uses, r.effective_weight(T0)) for r in left})
    stepwise, once = ends
    assert stepwise.keys() == once.keys()
    for row_id, (state, uses, weight) in once.items():
        assert stepwise[row_id][:2] == (state, uses), row_id
        assert stepwise[row_id][2] == pytest.approx(weight, rel=1e-9, abs=1e-15), row_id


# --- SQLite: the merge pairs of a hub ----------------------------------------------------------


@pytest.mark.parametrize("analysed", [False, True])
@pytest.mark.parametrize("hub_side", ["src", "dst"])
def test_the_merge_pairs_of_a_hub_cost_the_same_per_pair(
    sqlite_engine: Engine, hub_side: str, analysed: bool
) -> None:
    """2,000 active rows below 0.20 of one executor (source or destination), each with a
    decaying twin: finding the pairs runs a bounded number of SQLite instructions per pair,
    with or without ANALYZE's statistics (reading the hub's edges for each of its rows would
    run tens of millions)."""
    hub = 2_000
    rows = []
    for i in range(hub):
        src, dst = ("hub", f"d{i}") if hub_side == "src" else (f"s{i}", "hub")
        for state in ("active", "decaying"):
            rows.append(mnest_row(T0, src_executor=src, dst_executor=dst, weight=0.1, state=state))
    load(sqlite_engine, rows)
    if analysed:
        with sqlite_engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    def watch(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        pairs = statement.startswith('INSERT INTO "temp".mnestoma_ager_pairs')
        cursor.connection.set_progress_handler(count if pairs else None, 100)

    event.listen(sqlite_engine, "before_cursor_execute", watch)
    clock = StoppedClock(T0 + timedelta(days=1))
    try:
        with (
            sqlite_engine.connect() as conn,
            ConnectionUnitOfWork(conn, settings=Settings(clock=clock)) as unit,
        ):
            report = unit.mnests.apply_ager()
            unit.commit()
    finally:
        event.remove(sqlite_engine, "before_cursor_execute", watch)
    assert report.merged == hub
    assert 0 < steps[0] * 100 < 500 * 2 * hub, steps[0]
