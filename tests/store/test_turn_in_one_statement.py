"""PostgreSQL records a turn in one statement (contract §4, §13): the rows' locks, every
occurrence's numbers by the SQL twins of the rules, the new rows, the events, the turn's
exactly-once guard and its chains. Its numbers are the pure rules' to the bit, and the
races it meets (a key created meanwhile, a row changed meanwhile, the same turn twice at
once) end as if the calls had run one after another."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text

import mnestoma
from mnestoma import Mnest, Passing
from mnestoma.core import rules
from mnestoma.engines import make_engine
from mnestoma.schema.sql.tables import CHAINS

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# Later by days, hours and microseconds: the decay runs over an exact, uneven span.
T1 = T0 + timedelta(days=3, hours=7, seconds=13, microseconds=123_457)
T2 = T1 + timedelta(days=1, microseconds=999_999)

PLAN = ("plan", "1", "search", "1")
SEARCH = ("search", "1", "answer", "1")
ANSWER = ("answer", "1", "cite", "1")
WISH = Passing("plan", "1", "wish", None, dst_exists=False)

# What marks the turn's statement among the statements an engine runs.
TURN_STATEMENT = "turn_steps"


def at(instant: datetime) -> Callable[[], datetime]:
    return lambda: instant


def passed(row: dict[str, Any], now: datetime, outcome: str | None = None) -> dict[str, Any]:
    """A row after one more passing at ``now``, by the pure rules (rows.reinforcement)."""
    ts_last = rules.advance(row["ts_last"], now)
    ts_weight = rules.advance(row["ts_weight"], now)
    before = rules.decayed_weight(row["weight"], row["decay_lambda"], row["ts_weight"], ts_weight)
    ok, error = rules.outcome_counts(outcome)
    return {
        **row,
        "weight": rules.reinforce(before),
        "weight_before": before,
        "uses": row["uses"] + 1,
        "ts_last": ts_last,
        "ts_weight": ts_weight,
        "decayed_uses": rules.counted_passing(
            row["decayed_uses"], row["decay_lambda"], row["ts_last"], ts_last
        ),
        "ok_count": row["ok_count"] + ok,
        "error_count": row["error_count"] + error,
    }


def created(now: datetime, outcome: str | None = None) -> dict[str, Any]:
    """A row as its first passing at ``now`` creates it, by the pure rules."""
    ok, error = rules.outcome_counts(outcome)
    return {
        "weight": rules.INITIAL_WEIGHT,
        "weight_before": None,
        "uses": 1,
        "ts_last": now,
        "ts_weight": now,
        "decay_lambda": rules.DEFAULT_DECAY_LAMBDA,
        "decayed_uses": 1.0,
        "ok_count": ok,
        "error_count": error,
    }


NUMBERS = ("weight", "uses", "ts_last", "ts_weight", "decayed_uses", "ok_count", "error_count")


def numbers(m: Mnest) -> dict[str, Any]:
    return {n: getattr(m, n) for n in (*NUMBERS, "decay_lambda")}


def same_numbers(m: Mnest, want: dict[str, Any]) -> None:
    """The row's numbers are the rules' to the bit (floats compared with ==)."""
    got = numbers(m)
    assert {n: got[n] for n in NUMBERS} == {n: want[n] for n in NUMBERS}, m


def chains(store: mnestoma.Mnestoma) -> dict[tuple[str, str, str], tuple[float, int]]:
    c = CHAINS.c
    query = select(c.prev_executor, c.src_executor, c.dst_executor, c.decayed_uses, c.uses)
    with store.engine.connect() as conn:
        return {(p, s, d): (du, u) for p, s, d, du, u in conn.execute(query)}


class TurnStatements:
    """Counts the turn statements an engine runs; with ``hold``, the first waits, once run,
    for the test (its transaction open, its locks held) before anything else happens."""

    def __init__(self, engine: Engine, hold: bool = False) -> None:
        self.ran = 0  # counted as they start: one the database refuses has no end
        self.reached = threading.Event()
        self.go = threading.Event()
        self.hold = hold
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if TURN_STATEMENT in statement:
            self.ran += 1

    def _after(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if self.hold and TURN_STATEMENT in statement and not self.reached.is_set():
            self.reached.set()
            self.go.wait(20)


def wait_for_lock_waiters(url: str, n: int, timeout: float = 10.0) -> None:
    """Wait until ``n`` sessions of this database wait on a lock."""
    engine = make_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            end = time.monotonic() + timeout
            query = text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            while conn.execute(query).scalar_one() < n:
                if time.monotonic() > end:
                    pytest.fail(f"{n} sessions never waited on a lock")
                time.sleep(0.02)
    finally:
        engine.dispose()


def in_thread(fn: Callable[..., Any], *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as err:  # the test reads it
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_a_turn_is_one_statement_between_begin_and_commit(pg_store_url: str) -> None:
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as store:
        store.record_passing(*PLAN)
        seen: list[str] = []
        inside = threading.Event()

        def began(conn: Any) -> None:
            inside.set()

        def committed(conn: Any) -> None:
            inside.clear()

        def statement(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
            if inside.is_set():
                seen.append(sql.split(None, 1)[0].upper())

        event.listen(store.engine, "begin", began)
        event.listen(store.engine, "commit", committed)
        event.listen(store.engine, "before_cursor_execute", statement)
        # an existing edge twice, a new one, a new proto
        store.record_turn("t", [PLAN, SEARCH, PLAN, WISH])
    # the savepoint that would undo an attempt, the turn, the savepoint released
    assert seen == ["SAVEPOINT", "WITH", "RELEASE"]


def test_repeated_new_and_existing_edges_get_the_pure_rules_numbers_to_the_bit(
    pg_store_url: str,
) -> None:
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as before:
        plan0 = before.record_passing(*PLAN, outcome="ok", tags={"was": 0})
        wish0 = before.record_proto("plan", "1", "wish", desired_sig={"sig": 0})
    turn = [
        Passing(*PLAN, outcome="ok"),
        Passing(*SEARCH),
        Passing(*PLAN, tags={"k": 1}, outcome="error"),
        WISH._replace(desired_sig={"sig": 1}),
        Passing(*SEARCH, outcome="ok"),
        Passing(*ANSWER, tags={"new": True}),
        Passing(*PLAN),
        WISH,
    ]
    with mnestoma.Mnestoma(pg_store_url, clock=at(T1)) as store:
        got = store.record_turn("t1", turn)
        events = store.events(turn_id="t1")
        found_chains = chains(store)

    # the rules, passing after passing, each edge's occurrences at the same now
    plan = [{**numbers(plan0)}]
    for outcome in ("ok", "error", None):
        plan.append(passed(plan[-1], T1, outcome))
    search = [created(T1)]
    search.append(passed(search[-1], T1, "ok"))
    answer = [created(T1)]
    wish = [{**numbers(wish0)}]
    wish.append(passed(wish[-1], T1))
    wish.append(passed(wish[-1], T1))

    by_key = {(m.src_executor, m.dst_executor): m for m in got}
    same_numbers(by_key[("plan", "search")], plan[-1])
    same_numbers(by_key[("search", "answer")], search[-1])
    same_numbers(by_key[("answer", "cite")], answer[-1])
    same_numbers(by_key[("plan", "wish")], wish[-1])
    # each passing's row, in the order given
    assert [(m.src_executor, m.dst_executor) for m in got] == [(p[0], p[2]) for p in turn]
    assert len({m.id for m in got}) == 4
    # the last tags or desired_sig given win; none given keeps the row's
    assert by_key[("plan", "search")].tags == {"k": 1}
    assert by_key[("answer", "cite")].tags == {"new": True}
    assert by_key[("search", "answer")].tags is None
    assert by_key[("plan", "wish")].desired_sig == {"sig": 1}

    # one event per passing: its occurrence, its numbers, its outcome
    def of(m: Mnest) -> list[tuple[Any, ...]]:
        return [
            (e.kind, e.occurrence, e.weight_before, e.weight_after, e.outcome, e.ts)
            for e in events
            if e.mnest_id == m.id
        ]

    def expected(
        steps: list[dict[str, Any]], first_created: bool, outcomes: list[Any]
    ) -> list[tuple[Any, ...]]:
        out = []
        mine = steps if first_created else steps[1:]  # a row read before has no event here
        for k, (row, outcome) in enumerate(zip(mine, outcomes, strict=True), 1):
            kind = "created" if first_created and k == 1 else "reinforced"
            out.append((kind, k, row["weight_before"], row["weight"], outcome, row["ts_last"]))
        return out

    assert of(by_key[("plan", "search")]) == expected(plan, False, ["ok", "error", None])
    assert of(by_key[("search", "answer")]) == expected(search, True, [None, "ok"])
    assert of(by_key[("answer", "cite")]) == expected(answer, True, [None])
    assert of(by_key[("plan", "wish")]) == expected(wish, False, [None, None])
    assert len(events) == len(turn)

    # the chains of consecutive links, as the rules count them (proto links left out)
    links = [(p[0], p[2]) for p in turn if Passing(*p).dst_exists]
    want = rules.chain_increments(links, [True] * len(links))
    assert found_chains == {key: (float(n), n) for key, n in want.items()}
    assert found_chains  # the turn has chains: the check above could not pass empty


def test_a_retried_turn_adds_nothing(pg_store_url: str) -> None:
    turn = [PLAN, SEARCH, PLAN, WISH, ANSWER]
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as store:
        store.record_passing(*PLAN)
        first = store.record_turn("t1", turn)
        counted = (len(store.events()), chains(store))
    with mnestoma.Mnestoma(pg_store_url, clock=at(T1)) as later:
        again = later.record_turn("t1", turn)
        assert (len(later.events()), chains(later)) == counted
        assert [m.as_dict() for m in again] == [m.as_dict() for m in first]
        # a longer retry counts only what it adds: the third passing of PLAN
        longer = later.record_turn("t1", [*turn, PLAN])
        plan = next(m for m in longer if m.dst_executor == "search")
        same_numbers(plan, passed(numbers(first[0]), T1))
        assert len(later.events()) == counted[0] + 1


def test_two_turns_racing_on_the_same_new_key_both_count_it(pg_store_url: str) -> None:
    engines = [make_engine(pg_store_url), make_engine(pg_store_url)]
    first_turn = TurnStatements(engines[0], hold=True)
    second_turn = TurnStatements(engines[1])
    stores = [mnestoma.Mnestoma(e, clock=at(T0)) for e in engines]
    try:
        # the first turn creates the key and waits, uncommitted, before its COMMIT
        t1, box1 = in_thread(stores[0].record_turn, "t1", [PLAN, SEARCH])
        assert first_turn.reached.wait(10)
        # the second finds no row for it in its snapshot, and waits on the first's insert
        t2, box2 = in_thread(stores[1].record_turn, "t2", [ANSWER, SEARCH])
        wait_for_lock_waiters(pg_store_url, 1)
        first_turn.go.set()
        t1.join(30)
        t2.join(30)
    finally:
        first_turn.go.set()
        for s in stores:
            s.close()
        for e in engines:
            e.dispose()
    assert "error" not in box1 and "error" not in box2, (box1, box2)
    # the second turn's first attempt lost the key to the first turn and was undone
    assert second_turn.ran == 2
    with mnestoma.Mnestoma(pg_store_url) as store:
        rows = {(m.src_executor, m.dst_executor): m for m in store.edges()}
        search = rows[("search", "answer")]
        assert [(e.kind, e.turn_id) for e in store.events(mnest_id=search.id)] == [
            ("created", "t1"),
            ("reinforced", "t2"),
        ]
        same_numbers(search, passed(created(T0), T0))
        assert (rows[("plan", "search")].uses, rows[("answer", "cite")].uses) == (1, 1)
        assert len(store.events()) == 4


def test_a_turn_whose_row_another_writer_changed_meanwhile_starts_from_its_change(
    pg_store_url: str,
) -> None:
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as setup:
        plan0 = setup.record_passing(*PLAN)
    engine = make_engine(pg_store_url)
    writer_held = threading.Event()
    go = threading.Event()

    def hold(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "mnests" in statement and not writer_held.is_set():
            writer_held.set()
            go.wait(20)

    event.listen(engine, "after_cursor_execute", hold)
    writer = mnestoma.Mnestoma(engine, clock=at(T1))
    turn = mnestoma.Mnestoma(pg_store_url, clock=at(T2))
    try:
        # a passing reinforces the row and waits before its COMMIT
        w, wbox = in_thread(writer.record_passing, *PLAN)
        assert writer_held.wait(10)
        # the turn's snapshot is older than that change; it waits for the row's lock
        t, tbox = in_thread(turn.record_turn, "t", [PLAN, SEARCH, PLAN])
        wait_for_lock_waiters(pg_store_url, 1)
        go.set()
        w.join(30)
        t.join(30)
    finally:
        go.set()
        writer.close()
        turn.close()
        engine.dispose()
    assert "error" not in wbox and "error" not in tbox, (wbox, tbox)
    # the turn computed from the row as the writer left it, not as its snapshot had it
    after_writer = passed(numbers(plan0), T1)
    want = passed(passed(after_writer, T2), T2)
    same_numbers(tbox["result"][0], want)
    assert tbox["result"][0].uses == 4


def test_the_same_turn_recorded_twice_at_once_counts_once(pg_store_url: str) -> None:
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as setup:
        plan0 = setup.record_passing(*PLAN)
        search0 = setup.record_passing(*SEARCH)
    engines = [make_engine(pg_store_url), make_engine(pg_store_url)]
    first_turn = TurnStatements(engines[0], hold=True)
    second_turn = TurnStatements(engines[1])
    stores = [mnestoma.Mnestoma(e, clock=at(T1)) for e in engines]
    turn = [PLAN, SEARCH, PLAN]
    try:
        t1, box1 = in_thread(stores[0].record_turn, "same", turn)
        assert first_turn.reached.wait(10)
        # the second's snapshot does not see the first's events: once it has the rows'
        # locks, the database refuses its events, and its next attempt sees them counted
        t2, box2 = in_thread(stores[1].record_turn, "same", turn)
        wait_for_lock_waiters(pg_store_url, 1)
        first_turn.go.set()
        t1.join(30)
        t2.join(30)
    finally:
        first_turn.go.set()
        for s in stores:
            s.close()
        for e in engines:
            e.dispose()
    assert "error" not in box1 and "error" not in box2, (box1, box2)
    assert second_turn.ran == 2
    plan = passed(passed(numbers(plan0), T1), T1)
    same_numbers(box2["result"][0], plan)
    same_numbers(box2["result"][1], passed(numbers(search0), T1))
    assert [m.as_dict() for m in box2["result"]] == [m.as_dict() for m in box1["result"]]
    with mnestoma.Mnestoma(pg_store_url) as store:
        assert len(store.events(turn_id="same")) == 3


def test_the_chains_of_random_turns_are_the_rules_counts(pg_store_url: str) -> None:
    """Fan-outs, loops back, an executor to itself, repeated links and proto links: the
    statement's chains are what rules.chain_increments counts, turn after turn."""
    import random

    rnd = random.Random(13)
    names = ["a", "b", "c", "d"]
    want: dict[tuple[str, str, str], int] = {}
    with mnestoma.Mnestoma(pg_store_url, clock=at(T0)) as store:
        for t in range(30):
            turn = [
                Passing(rnd.choice(names), "1", rnd.choice(names), "1")
                if rnd.random() < 0.85
                else Passing(rnd.choice(names), "1", "wish", None, dst_exists=False)
                for _ in range(rnd.randint(2, 12))
            ]
            store.record_turn(f"t{t}", turn)
            links = [(p.src_executor, p.dst_executor) for p in turn if p.dst_exists]
            for key, n in rules.chain_increments(links, [True] * len(links)).items():
                want[key] = want.get(key, 0) + n
        found = chains(store)
    # one instant throughout: nothing decays, the counts add up exactly
    assert found == {key: (float(n), n) for key, n in want.items()}
    assert len(found) > 10
