"""A PostgreSQL connection notes the edges whose live row its passings wrote or found
(``known_edges``): its next passing of such an edge runs the one statement without the branch
that creates the row. Where the row is gone meanwhile, that statement writes nothing and the
whole one follows. What a passing stores and returns is the same with or without the note.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

import mnestoma
from mnestoma import Mnestoma, UnitOfWork, make_engine, make_session_factory
from mnestoma.core import rules
from mnestoma.schema.sql import record
from mnestoma.store import pg_writes
from mnestoma.testing.clock import MovableClock

EDGE = ("planner", "1", "search", "2")
pytestmark = pytest.mark.parametrize("engine_name", ["postgresql"])


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each passing statement run, whether it was the whole one (the branch that creates)."""
    seen: list[bool] = []
    real = record.pg_passing

    def pg_passing(proto: bool, turn: bool, creates: bool = True) -> Any:
        seen.append(creates)
        return real(proto, turn, creates)

    monkeypatch.setattr(record, "pg_passing", pg_passing)
    return seen


def psql(url: str, sql: str) -> None:
    """``sql`` on a connection of its own, committed."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute(sql)


def events_of(url: str) -> list[tuple[Any, ...]]:
    """The store's events by edge key, in order (ids left out)."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return conn.execute(
            "SELECT m.src_executor, m.dst_executor, m.dst_version, m.state, e.kind, e.ts,"
            " e.turn_id, e.weight_before, e.weight_after, e.outcome, e.occurrence"
            " FROM events e JOIN mnests m ON m.id = e.mnest_id ORDER BY e.id"
        ).fetchall()


def test_a_connections_next_passing_of_an_edge_it_wrote_runs_without_the_branch_that_creates(
    store_url: str, statements: list[bool], engine_name: str
) -> None:
    with Mnestoma(store_url) as store:
        first = store.record_passing(*EDGE)
        proto = store.record_proto("planner", "1", "wished")
        for _ in range(3):
            done = store.record_passing(*EDGE, outcome="ok")
        again = store.record_proto("planner", "1", "wished")
    assert statements == [True, True, False, False, False, False]
    assert (first.uses, done.uses, done.ok_count) == (1, 4, 3)
    assert done.weight == pytest.approx(min(1.0, rules.INITIAL_WEIGHT + 3 * 0.15))
    assert (proto.uses, again.uses, again.id) == (1, 2, proto.id)
    kinds = [e[4] for e in events_of(store_url)]
    assert kinds == ["created", "created"] + ["reinforced"] * 4


def test_a_statement_listener_sees_no_insert_of_a_row_for_a_known_edge(
    store_url: str, engine_name: str
) -> None:
    engine = make_engine(store_url)
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    try:
        with Mnestoma(engine) as store:
            store.record_passing(*EDGE)
            created = [s for s in seen if "INSERT INTO mnests" in s]
            seen.clear()
            done = store.record_passing(*EDGE)
        assert len(created) == 1
        assert [s for s in seen if "INSERT INTO mnests" in s] == []
        assert any("UPDATE mnests" in s for s in seen)
        assert done.uses == 2
    finally:
        engine.dispose()


@pytest.mark.parametrize("change", ["demoted", "deleted", "superseded"])
def test_a_known_edge_whose_live_row_went_away_is_created_by_the_whole_statement(
    store_url: str, statements: list[bool], engine_name: str, change: str
) -> None:
    with Mnestoma(store_url) as store:
        old = store.record_passing(*EDGE)
        store.record_passing(*EDGE)
        if change == "deleted":
            psql(
                store_url,
                f"DELETE FROM events WHERE mnest_id = '{old.id}';"
                f" DELETE FROM mnests WHERE id = '{old.id}'",
            )
        else:
            state = "decaying" if change == "demoted" else "superseded"
            psql(store_url, f"UPDATE mnests SET state = '{state}' WHERE id = '{old.id}'")
        del statements[:]
        new = store.record_passing(*EDGE)
        assert statements == [False, True]  # wrote nothing, then the whole statement
        assert (new.uses, new.weight, new.state) == (1, rules.INITIAL_WEIGHT, "active")
        assert new.id != old.id
        del statements[:]
        assert store.record_passing(*EDGE).uses == 2
        assert statements == [False]  # the new row is known in turn
    kinds = [e[4] for e in events_of(store_url) if e[3] == "active"]
    assert kinds == ["created", "reinforced"]


def test_a_creation_rolled_back_leaves_the_next_passing_to_create_the_edge(
    store_url: str, statements: list[bool], engine_name: str
) -> None:
    engine = make_engine(store_url, pool_size=1, max_overflow=0)  # one connection, reused
    factory = make_session_factory(engine)
    try:
        with UnitOfWork(factory) as uow:
            assert uow.mnests.record_passing(*EDGE).uses == 1
            uow.rollback()
        with UnitOfWork(factory) as uow:
            done = uow.mnests.record_passing(*EDGE)
            uow.commit()
        assert statements == [True, False, True]
        assert (done.uses, done.weight) == (1, rules.INITIAL_WEIGHT)
        assert [e[4] for e in events_of(store_url)] == ["created"]
    finally:
        engine.dispose()


def test_a_connection_notes_known_edges_at_most(
    store_url: str, statements: list[bool], engine_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_writes, "WRITTEN_ROWS_KEPT", 3)
    with Mnestoma(store_url) as store:
        for n in range(5):
            store.record_passing("planner", "1", f"tool{n}", "1")
        del statements[:]
        for n in (4, 3, 0):
            assert store.record_passing("planner", "1", f"tool{n}", "1").uses == 2
    # At the fourth edge the note of three was emptied: the fourth and fifth stayed.
    assert statements == [False, False, True]
    assert rules.WRITTEN_ROWS_KEPT == 4096


@pytest.fixture
def plain_url(pg_empty_db_url: str) -> Iterator[str]:
    """A second store at head on PostgreSQL, for a connection that notes nothing."""
    mnestoma.upgrade(pg_empty_db_url)
    yield pg_empty_db_url


@pytest.mark.parametrize("seed", [1, 2])
def test_passings_store_and_return_the_same_with_or_without_known_edges(
    store_url: str, plain_url: str, monkeypatch: pytest.MonkeyPatch, engine_name: str, seed: int
) -> None:
    """Random passings, protos and one-passing turns on three edges (outcomes, documents, a
    clock that moves back and forth by up to a year), with another connection demoting,
    superseding or halving rows in between: every snapshot and every stored row and event
    equal those of a store whose connection notes nothing."""
    rng = random.Random(seed)
    clock, plain_clock = MovableClock(), MovableClock()
    edges = [EDGE, ("planner", "1", "fetch", "1"), ("planner", "1", "wished", None)]
    got: list[list[Any]] = [[], []]
    real = pg_writes.known_edges
    with Mnestoma(store_url, clock=clock) as noted, Mnestoma(plain_url, clock=plain_clock) as plain:
        for step in range(80):
            src, sv, dst, dv = rng.choice(edges)
            kwargs: dict[str, Any] = {}
            if rng.random() < 0.1:
                kwargs["tags"] = {"n": rng.randrange(5)}
            days = rng.choice([0.0, 0.5, 3.0, -2.0, 365.0, -400.0])
            clock.advance(days)
            plain_clock.advance(days)
            turn = rng.random() < 0.2
            outcome = rng.choice([None, "ok", "error"])
            for i, store in enumerate((noted, plain)):
                monkeypatch.setattr(pg_writes, "known_edges", real if i == 0 else lambda ex: {})
                if dv is None:
                    snap = store.record_proto(src, sv, dst, **kwargs)
                elif turn:
                    passing = mnestoma.Passing(src, sv, dst, dv, **kwargs)
                    (snap,) = store.record_turn(f"turn{step}", [passing])
                else:
                    snap = store.record_passing(src, sv, dst, dv, outcome=outcome, **kwargs)
                got[i].append(_without_id(snap))
            roll = rng.random()
            if roll < 0.2:  # another connection's write, on both stores
                state = rng.choice(["decaying", "superseded", None])
                sql = "UPDATE mnests SET weight = weight / 2"
                if state is not None:  # the edge's live row retired, an older one removed
                    gone = (
                        f"SELECT id FROM mnests WHERE state = '{state}' AND dst_executor = '{dst}'"
                    )
                    sql = (
                        f"DELETE FROM events WHERE mnest_id IN ({gone});"
                        f" DELETE FROM mnests WHERE id IN ({gone});"
                        f" UPDATE mnests SET state = '{state}'"
                        f" WHERE state = 'active' AND dst_executor = '{dst}'"
                    )
                for url in (store_url, plain_url):
                    psql(url, sql)
        assert got[0] == got[1]
        assert sorted(map(_without_id, noted.edges())) == sorted(map(_without_id, plain.edges()))
    assert events_of(store_url) == events_of(plain_url)


def _without_id(m: Any) -> tuple[Any, ...]:
    return tuple(
        (k, v) for k, v in sorted(vars(m).items()) if k not in ("id",) and not k.startswith("_")
    )
