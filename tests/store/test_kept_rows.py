"""A SQLite connection keeps the rows its own passings wrote (``KeptRows``): its next passing
of an edge skips the lookup under the write lock while SQLite says that nothing else wrote
to the store (``PRAGMA data_version``, ``total_changes``). What a passing stores and
returns is the same with or without them, whatever writes in between.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from mnestoma import Mnestoma, Passing, UnitOfWork, make_engine, make_session_factory
from mnestoma.core import rules
from mnestoma.schema import runner
from mnestoma.schema.runner import DriverRunner, KeptRows
from mnestoma.store import commands
from mnestoma.testing.clock import MovableClock

EDGE = ("planner", "1", "search", "2")


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every lookup a passing makes under the write lock (the runner's bound reads)."""
    seen: list[Any] = []
    real = DriverRunner.first_bound

    def first_bound(self: DriverRunner, bound: Any) -> Any:
        seen.append(bound[0])
        return real(self, bound)

    monkeypatch.setattr(DriverRunner, "first_bound", first_bound)
    return seen


def raw(store_url: str) -> sqlite3.Connection:
    """Another connection to the store's file."""
    return sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)


def write_elsewhere(store_url: str, sql: str) -> None:
    """``sql`` committed by another connection to the store's file."""
    other = raw(store_url)
    try:
        other.execute(sql)
    finally:
        other.close()


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_connections_next_passing_of_an_edge_skips_the_lookup_while_nothing_else_wrote(
    store_url: str, lookups: list[Any]
) -> None:
    with Mnestoma(store_url) as store:
        store.record_passing(*EDGE)  # created: looked up, found nothing
        for _ in range(4):
            done = store.record_passing(*EDGE, outcome="ok")
        assert len(lookups) == 1  # the row it wrote (created, then reinforced), kept
        assert (done.uses, done.ok_count) == (5, 4)
        stored = store.get(done.id)
        assert stored is not None and stored.uses == 5 and stored.weight == done.weight


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_commit_of_another_connection_makes_the_next_passing_look_the_row_up(
    store_url: str, lookups: list[Any]
) -> None:
    with Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        store.record_passing(*EDGE)
        write_elsewhere(store_url, "UPDATE mnests SET weight = 0.9, uses = 40")
        before = len(lookups)
        done = store.record_passing(*EDGE)
        assert len(lookups) == before + 1
        assert done.uses == 41 and done.weight == pytest.approx(1.0)  # 0.9 + 0.15, clamped


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_write_of_another_operation_on_the_same_connection_makes_it_look_the_row_up(
    store_url: str, lookups: list[Any]
) -> None:
    """``total_changes``: a unit of work of a service on the very connection the facade's
    passings use (its own statements, not seen by data_version) makes the next passing read
    the row again."""
    engine = create_engine(store_url, poolclass=StaticPool)
    with Mnestoma(engine) as store:
        store.record_passing(*EDGE)
        store.record_passing(*EDGE)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE mnests SET uses = 70")
        before = len(lookups)
        assert store.record_passing(*EDGE).uses == 71
        assert len(lookups) == before + 1


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_passing_that_gives_documents_makes_the_next_one_look_the_row_up(
    store_url: str, lookups: list[Any]
) -> None:
    """Tags and signatures are stored as the driver wrote them: the next passing reads
    them, and returns them as stored."""
    wish = ("planner", "1", "wished")
    with Mnestoma(store_url) as store:
        store.record_proto(*wish)
        store.record_proto(*wish)
        store.record_proto(*wish, tags={"k": [1, 2]}, desired_sig={"args": ["x"]})
        before = len(lookups)
        done = store.record_proto(*wish)
        assert len(lookups) == before + 1
        assert done.tags == {"k": [1, 2]} and done.desired_sig == {"args": ["x"]}
        again = store.record_proto(*wish)
        assert len(lookups) == before + 1
        assert again.tags == {"k": [1, 2]} and again.uses == 5


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_units_of_work_and_a_one_passing_turns_passings_always_look_the_row_up(
    store_url: str, lookups: list[Any]
) -> None:
    """Only a call's own transaction, committed at the driver with its last statement,
    keeps its row: a unit of work may still roll back, a turn of one passing's lookup also
    asks whether the turn counted the passing."""
    engine = make_engine(store_url)
    factory = make_session_factory(engine)
    with Mnestoma(store_url) as store:
        store.record_passing(*EDGE)
        store.record_passing(*EDGE)
        for i in range(2):
            with UnitOfWork(factory) as u:
                u.mnests.record_passing(*EDGE)
                u.commit()
            store.record_passing(*EDGE, turn_id=f"t{i}")
        assert len(lookups) == 5  # the first passing's, then every one of theirs
        assert store.record_passing(*EDGE).uses == 7
    engine.dispose()


@pytest.fixture
def turn_lookups(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The keys each turn looks up under the write lock."""
    seen: list[list[Any]] = []
    real = commands._lock_keys

    def lock_keys(ex: Any, idents: list[Any]) -> Any:
        seen.append([key[2] for _, key in idents])  # each key's destination
        return real(ex, idents)

    monkeypatch.setattr(commands, "_lock_keys", lock_keys)
    return seen


def _turn(*dsts: str) -> list[Passing]:
    """Passings from the planner to each of ``dsts`` (a proto where the name says so)."""
    return [
        Passing("planner", "1", d, None, dst_exists=False)
        if d.startswith("wish")
        else Passing("planner", "1", d, "1")
        for d in dsts
    ]


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_turn_looks_up_only_the_keys_whose_rows_its_connection_does_not_keep(
    store_url: str, lookups: list[Any], turn_lookups: list[list[Any]]
) -> None:
    with Mnestoma(store_url) as store:
        store.record_turn("t1", _turn("a", "b", "wish"))  # created: every key looked up
        store.record_passing("planner", "1", "c", "1")
        done = store.record_turn("t2", _turn("a", "c", "d", "a", "wish"))
        assert turn_lookups == [["a", "b", "wish"], ["d"]]
        assert [m.uses for m in done] == [3, 2, 1, 3, 2]  # a twice: occurrences 1 and 2
        # the turn's rows, created or reinforced, kept for the next passing and turn
        assert store.record_passing("planner", "1", "d", "1").uses == 2
        assert store.record_proto("planner", "1", "wish").uses == 3
        assert len(lookups) == 1  # only c's creation
        store.record_turn("t3", _turn("a", "b", "c", "d"))
        assert turn_lookups[2:] == []
        assert {m.dst_executor: m.uses for m in store.edges()} == {
            "a": 4,
            "b": 2,
            "c": 3,
            "d": 3,
            "wish": 3,
        }


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_retried_turn_counts_nothing_again_when_its_rows_are_kept(
    store_url: str, turn_lookups: list[list[Any]]
) -> None:
    with Mnestoma(store_url) as store:
        first = store.record_turn("t1", _turn("a", "b", "a"))
        again = store.record_turn("t1", _turn("a", "b", "a", "b"))  # continued: b's 2nd
        assert turn_lookups == [["a", "b"]]
        assert [m.uses for m in first] == [2, 1, 2]
        assert [m.uses for m in again] == [2, 2, 2, 2]
        assert store.record_turn("t1", _turn("a", "b", "a", "b"))[0].uses == 2
        assert len(store.events(turn_id="t1")) == 4  # a twice, b twice: each counted once


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_turn_that_gives_documents_makes_the_next_write_look_those_rows_up(
    store_url: str, turn_lookups: list[list[Any]]
) -> None:
    with Mnestoma(store_url) as store:
        store.record_turn("t1", _turn("a", "b"))
        store.record_turn("t2", [Passing("planner", "1", "a", "1", tags={"k": 1}), *_turn("b")])
        done = store.record_turn("t3", _turn("a", "b"))
        assert turn_lookups == [["a", "b"], ["a"]]
        assert done[0].tags == {"k": 1} and [m.uses for m in done] == [3, 3]


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_another_connections_commit_makes_a_turn_look_every_key_up(
    store_url: str, turn_lookups: list[list[Any]]
) -> None:
    with Mnestoma(store_url) as store:
        store.record_turn("t1", _turn("a", "b"))
        write_elsewhere(store_url, "UPDATE mnests SET uses = 30")
        done = store.record_turn("t2", _turn("a", "b"))
        assert turn_lookups == [["a", "b"], ["a", "b"]]
        assert [m.uses for m in done] == [31, 31]


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_connection_reopened_under_the_same_pool_record_keeps_nothing_of_the_old_one(
    store_url: str, lookups: list[Any]
) -> None:
    """A pool record whose driver connection was replaced (invalidated, then connected
    again) starts with no row kept: the rows were the old connection's (SQLAlchemy empties
    the record's info then, and the rows name the driver connection they are of)."""
    engine = create_engine(store_url, poolclass=StaticPool)
    with Mnestoma(engine) as store:
        store.record_passing(*EDGE)
        store.record_passing(*EDGE)
        with engine.connect() as conn:
            conn.invalidate()
        before = len(lookups)
        assert store.record_passing(*EDGE).uses == 3
        assert len(lookups) == before + 1


@pytest.mark.parametrize("engine_name", ["postgresql"])
def test_on_postgresql_no_row_is_kept(store_url: str) -> None:
    """PostgreSQL's passing is one statement that reads the row where it locks it."""
    with Mnestoma(store_url) as store, store.engine.connect() as conn:
        assert DriverRunner(conn).kept_rows() is None
        for n in range(1, 4):
            assert store.record_passing(*EDGE).uses == n


# --- KeptRows itself, on a bare driver connection ---------------------------------------------


@pytest.fixture
def kept_on(tmp_path: Any) -> Iterator[tuple[KeptRows, sqlite3.Connection, sqlite3.Connection]]:
    path = tmp_path / "k.sqlite"
    own = sqlite3.connect(path, isolation_level=None)
    own.execute("PRAGMA journal_mode = WAL")
    own.execute("CREATE TABLE t (x INTEGER)")
    other = sqlite3.connect(path, isolation_level=None)
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        try:
            yield KeptRows(own, conn), own, other
        finally:
            own.close()
            other.close()
    engine.dispose()


def test_kept_rows_are_good_until_either_connection_writes(
    kept_on: tuple[KeptRows, sqlite3.Connection, sqlite3.Connection],
) -> None:
    kept, own, other = kept_on
    assert kept.of(own) and not kept.of(other)
    assert kept.look("a") is None
    kept.wrote("a", (1,))
    assert kept.look("a") == (1,) and kept.peek("a") == (1,)
    kept.wrote("b", (2,))  # a second write, nothing else between: both good
    assert kept.look("a") == (1,)
    kept.wrote("a", (3,))
    other.execute("INSERT INTO t VALUES (1)")  # another connection commits
    assert kept.look("a") is None and kept.peek("b") is None
    kept.wrote("a", (4,))
    assert kept.look("a") == (4,)
    kept.wrote("a", (4,))
    own.execute("INSERT INTO t VALUES (2)")  # this connection writes something else
    assert kept.look("a") is None


def test_a_write_rolled_back_on_the_same_connection_forgets_the_rows(
    kept_on: tuple[KeptRows, sqlite3.Connection, sqlite3.Connection],
) -> None:
    kept, own, _ = kept_on
    kept.look("a")
    kept.wrote("a", (1,))
    own.execute("BEGIN IMMEDIATE")
    own.execute("INSERT INTO t VALUES (1)")
    own.execute("ROLLBACK")  # total_changes counted it all the same
    assert kept.look("a") is None


def test_a_connection_keeps_written_rows_kept_at_most(
    kept_on: tuple[KeptRows, sqlite3.Connection, sqlite3.Connection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "WRITTEN_ROWS_KEPT", 3)
    kept, _, _ = kept_on
    for key in "abc":
        kept.look(key)
        kept.wrote(key, (key,))
    assert [kept.peek(k) for k in "abc"] == [("a",), ("b",), ("c",)]
    kept.look("d")
    kept.wrote("d", ("d",))  # full: the others go
    assert [kept.peek(k) for k in "abcd"] == [None, None, None, ("d",)]
    assert rules.WRITTEN_ROWS_KEPT == 4096


def test_a_turns_rows_are_kept_together_forgotten_by_key_and_bounded(
    kept_on: tuple[KeptRows, sqlite3.Connection, sqlite3.Connection],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "WRITTEN_ROWS_KEPT", 3)
    kept, _, other = kept_on
    assert kept.look_many("ab") == {}
    kept.wrote_many({"a": (1,), "b": (2,)}, ())
    assert kept.look_many("abc") == {"a": (1,), "b": (2,)}
    kept.wrote_many({"c": (3,)}, ["a"])  # a's row not known here: forgotten
    assert kept.look_many("abc") == {"b": (2,), "c": (3,)}
    kept.wrote_many({"d": (4,), "e": (5,)}, ())  # four rows, over three: the others go
    assert kept.look_many("abcde") == {"d": (4,), "e": (5,)}
    kept.wrote_many({}, ())
    other.execute("INSERT INTO t VALUES (1)")
    assert kept.look_many("de") == {}


# --- the same results with or without kept rows -------------------------------------------------


@pytest.mark.parametrize("engine_name", ["sqlite"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_passings_and_turns_store_and_return_the_same_with_or_without_kept_rows(
    store_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random passings and turns on four edges (outcomes, documents, protos, turns retried,
    a clock that moves back and forth by up to a year), with writes of another connection
    in between: every snapshot and every stored row equal those of a store whose
    connection keeps nothing."""
    plain_url = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    with open(store_url.removeprefix("sqlite:///"), "rb") as src:
        (tmp_path / "plain.sqlite").write_bytes(src.read())
    rng = random.Random(seed)
    clock, plain_clock = MovableClock(), MovableClock()
    edges = [EDGE, ("planner", "1", "fetch", "1"), ("planner", "1", "wished", None)]
    edges.append(("search", "2", "fetch", "1"))  # after EDGE in a turn: a chain
    got: list[list[Any]] = [[], []]
    last_turn = "t0"
    real = DriverRunner.kept_rows
    with Mnestoma(store_url, clock=clock) as kept, Mnestoma(plain_url, clock=plain_clock) as plain:
        for _ in range(120):
            src, sv, dst, dv = rng.choice(edges)
            kwargs: dict[str, Any] = {"outcome": rng.choice([None, "ok", "error"])}
            if rng.random() < 0.1:
                kwargs["tags"] = {"n": rng.randrange(5)}
            tags_of = {"tags": kwargs.get("tags")}
            days = rng.choice([0.0, 0.5, 3.0, -2.0, 365.0, -400.0])
            clock.advance(days)
            plain_clock.advance(days)
            turn: list[Passing] = []
            if rng.random() < 0.3:  # a turn of 2-4 passings, now and then one retried
                turn_id = last_turn if rng.random() < 0.3 else f"t{len(got[0])}"
                last_turn = turn_id
                for e in rng.choices(edges, k=rng.randint(2, 4)):
                    tags = {"t": rng.randrange(3)} if rng.random() < 0.1 else None
                    if e[3] is None:
                        turn.append(Passing(*e, dst_exists=False, tags=tags))
                    else:
                        outcome = rng.choice([None, "ok", "error"])
                        turn.append(Passing(*e, tags=tags, outcome=outcome))
            for i, store in enumerate((kept, plain)):
                monkeypatch.setattr(
                    DriverRunner, "kept_rows", real if i == 0 else lambda self: None
                )
                if turn:
                    got[i].extend(map(_without_id, store.record_turn(turn_id, turn)))
                elif dv is None:
                    got[i].append(_without_id(store.record_proto(src, sv, dst, **tags_of)))
                else:
                    got[i].append(_without_id(store.record_passing(src, sv, dst, dv, **kwargs)))
            if rng.random() < 0.1:  # another connection's write, on both stores
                for url in (store_url, plain_url):
                    write_elsewhere(url, "UPDATE mnests SET weight = weight / 2")
        assert got[0] == got[1]
        assert sorted(map(_without_id, kept.edges())) == sorted(map(_without_id, plain.edges()))
    assert _chains_and_events(store_url) == _chains_and_events(plain_url)


def _chains_and_events(url: str) -> tuple[list[Any], list[Any]]:
    """The store's chains, and its events by edge key (ids left out)."""
    conn = raw(url)
    try:
        chains = conn.execute("SELECT * FROM mnest_chains ORDER BY 1, 2, 3").fetchall()
        events = conn.execute(
            "SELECT m.src_executor, m.dst_executor, m.dst_version, e.kind, e.ts, e.turn_id,"
            " e.outcome, e.occurrence FROM events e JOIN mnests m ON m.id = e.mnest_id"
            " ORDER BY e.id"
        ).fetchall()
    finally:
        conn.close()
    assert chains and events
    return chains, events


def _without_id(m: Any) -> tuple[Any, ...]:
    return tuple(
        (k, v) for k, v in sorted(vars(m).items()) if k not in ("id",) and not k.startswith("_")
    )
