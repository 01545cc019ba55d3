"""The driver path's statement cache never runs the SQL of another statement or of another
dialect, and stays bounded."""

from __future__ import annotations

import functools
import gc
from pathlib import Path

import pytest
from sqlalchemy import literal, select

import mnestoma
from mnestoma.schema import runner
from mnestoma.schema.sql import record


def test_a_freed_statement_never_lends_its_cached_sql_to_a_new_one(tmp_path: Path) -> None:
    engine = mnestoma.make_engine(f"sqlite:///{tmp_path / 'cache.sqlite'}")
    gc.freeze()  # each collection below walks the round's objects, not the whole suite's
    try:
        with engine.connect() as conn:
            for i in range(40):
                stmt = select(literal(i).label("n"))  # freed at the end of each round
                assert runner.DriverRunner(conn).rows(stmt) == [(i,)]
                del stmt
                gc.collect()
    finally:
        gc.unfreeze()
        engine.dispose()


def test_the_compiled_statement_cache_is_bounded(tmp_path: Path) -> None:
    engine = mnestoma.make_engine(f"sqlite:///{tmp_path / 'cache.sqlite'}")
    try:
        with engine.connect() as conn:
            kept = [select(literal(i).label("n")) for i in range(runner.MAX_PREPARED + 50)]
            for stmt in kept:
                runner.DriverRunner(conn).rows(stmt)
        assert len(runner._PREPARED) <= runner.MAX_PREPARED
    finally:
        engine.dispose()


@pytest.mark.slow  # seconds by design: out of the quick tier
def test_turns_of_more_shapes_than_the_caches_hold_all_succeed(
    store: mnestoma.Mnestoma, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small caches, so that statements are evicted and freed while the turns go on.
    monkeypatch.setattr(runner, "MAX_PREPARED", 4)
    small = functools.lru_cache(maxsize=3)(record.select_keys.__wrapped__)
    monkeypatch.setattr(record, "select_keys", small)
    shapes = [(a, p) for a in range(7) for p in range(7) if a + p >= 2]
    for round_ in range(2):
        for a, p in shapes:
            turn = [("s", "1", f"d{i}", "1") for i in range(a)]
            turn += [("s", "1", f"w{j}", None, False) for j in range(p)]
            recorded = store.record_turn(f"t{round_}-{a}-{p}", turn)
            assert len(recorded) == a + p
        gc.collect()
    # every edge was recorded once per turn that named it
    rounds_with = {f"d{i}": sum(2 for a, _ in shapes if a > i) for i in range(6)}
    for edge in store.edges(states=["active"]):
        assert edge.uses == rounds_with[edge.dst_executor]


def test_one_statement_runs_with_its_own_sql_on_sqlite_and_on_postgresql(
    tmp_path: Path, pg_store_url: str
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'both.sqlite'}"
    mnestoma.upgrade(sqlite_url)
    engines = [mnestoma.make_engine(sqlite_url), mnestoma.make_engine(pg_store_url)]
    try:
        for _ in range(2):  # each compiled once, then both taken from the cache
            for engine in engines:
                with engine.connect() as conn:
                    ex = runner.runner_for(conn)
                    assert ex.rows(record.SELECT_BY_ID_LOCKED, {"id": "mn_none"}) == []
    finally:
        for engine in engines:
            engine.dispose()
