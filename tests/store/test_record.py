"""record_passing and record_turn: creation, reinforcement, protos, turns (both engines)."""

from __future__ import annotations

import math
from datetime import UTC

import pytest
from sqlalchemy import func, select

from mnestoma import InvalidInput, Mnestoma, Passing
from mnestoma.engines import make_engine
from mnestoma.schema.models import Event, Mnest


def test_a_first_passing_creates_an_active_row_at_030(store: Mnestoma, clock) -> None:
    m = store.record_passing("search", "1", "read", "2")
    assert (m.state, m.weight, m.uses) == ("active", 0.30, 1)
    assert m.ts_first == m.ts_last == m.ts_weight == clock.now
    assert m.decay_lambda == 0.018
    assert m.id.startswith("mn_")
    [ev] = store.events(mnest_id=m.id)
    assert (ev.kind, ev.weight_before, ev.weight_after, ev.state_after) == (
        "created",
        None,
        0.30,
        "active",
    )


def test_a_second_passing_reinforces_by_015_after_decay(store: Mnestoma, clock) -> None:
    first = store.record_passing("search", "1", "read", "2")
    clock.advance(days=5)
    second = store.record_passing("search", "1", "read", "2")
    assert second.id == first.id
    expected = 0.30 * math.exp(-0.018 * 5) + 0.15
    assert second.weight == pytest.approx(expected, rel=1e-12)
    assert second.uses == 2
    assert second.ts_last == second.ts_weight == clock.now
    assert second.ts_first == first.ts_first
    ev = store.events(mnest_id=first.id)[-1]
    assert ev.kind == "reinforced"
    assert ev.weight_before == pytest.approx(0.30 * math.exp(-0.018 * 5))
    assert ev.weight_after == pytest.approx(expected)


def test_reinforcement_is_clamped_at_one(store: Mnestoma) -> None:
    for _ in range(8):
        m = store.record_passing("search", "1", "read", "2")
    assert m.weight == 1.0
    assert m.uses == 8


def test_the_stored_row_equals_the_returned_snapshot(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "b", "1")
    clock.advance(days=1)
    returned = store.record_passing("a", "1", "b", "1", tags={"k": "v"})
    stored = store.get(returned.id)
    assert stored is not None
    assert stored.as_dict() == returned.as_dict()


def test_direction_matters(store: Mnestoma) -> None:
    ab = store.record_passing("a", "1", "b", "1")
    ba = store.record_passing("b", "1", "a", "1")
    assert ab.id != ba.id
    assert len(store.edges()) == 2


def test_a_new_version_of_either_end_is_a_different_row(store: Mnestoma) -> None:
    ids = {
        store.record_passing("a", "1", "b", "1").id,
        store.record_passing("a", "2", "b", "1").id,
        store.record_passing("a", "1", "b", "2").id,
    }
    assert len(ids) == 3


def test_a_proto_is_created_at_030_without_version(store: Mnestoma) -> None:
    sig = {"summary": "turn a PDF into text", "inputs": ["pdf"], "outputs": ["text"]}
    p = store.record_passing("read", "2", "pdf.to_text", dst_exists=False, desired_sig=sig)
    assert (p.state, p.dst_version, p.weight, p.uses, p.desired_sig) == ("proto", None, 0.3, 1, sig)


def test_a_proto_is_reinforced_and_its_desired_sig_replaced(store: Mnestoma, clock) -> None:
    p1 = store.record_passing("read", "2", "pdf", dst_exists=False, desired_sig={"v": 1})
    clock.advance(days=1)
    p2 = store.record_passing("read", "2", "pdf", dst_exists=False)
    assert p2.id == p1.id and p2.uses == 2 and p2.desired_sig == {"v": 1}
    p3 = store.record_passing("read", "2", "pdf", dst_exists=False, desired_sig={"v": 2})
    assert p3.id == p1.id and p3.uses == 3 and p3.desired_sig == {"v": 2}
    assert p2.weight == pytest.approx(0.3 * math.exp(-0.018) + 0.15)
    assert len(store.edges(states=["proto"])) == 1


def test_a_proto_and_an_active_edge_to_the_same_executor_are_distinct(store: Mnestoma) -> None:
    p = store.record_passing("read", "2", "pdf", dst_exists=False)
    a = store.record_passing("read", "2", "pdf", "1")
    assert p.id != a.id


@pytest.mark.parametrize("state", ["decaying", "superseded"])
def test_a_decaying_or_superseded_row_is_never_reactivated(store: Mnestoma, state: str) -> None:
    old = store.record_passing("a", "1", "b", "1")
    store.transition_state(old.id, state)
    new = store.record_passing("a", "1", "b", "1")
    assert new.id != old.id
    assert (new.state, new.weight, new.uses) == ("active", 0.30, 1)
    kept = store.get(old.id)
    assert kept is not None and (kept.state, kept.uses) == (state, 1)


def test_tags_never_change_the_weight(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1", tags={"team": "x"})
    b = store.record_passing("c", "1", "d", "1")
    assert a.weight == b.weight
    a2 = store.record_passing("a", "1", "b", "1", tags=["new", "labels"])
    b2 = store.record_passing("c", "1", "d", "1")
    assert a2.weight == b2.weight and a2.tags == ["new", "labels"]


def test_a_repeated_turn_and_edge_is_a_no_op_returning_the_row(store: Mnestoma, clock) -> None:
    first = store.record_passing("a", "1", "b", "1", turn_id="turn-1")
    clock.advance(days=1)
    again = store.record_passing("a", "1", "b", "1", turn_id="turn-1")
    assert again.as_dict() == first.as_dict()
    assert len(store.events(mnest_id=first.id)) == 1
    other = store.record_passing("a", "1", "b", "1", turn_id="turn-2")
    assert other.uses == 2


def test_a_retried_turn_counts_once(store: Mnestoma) -> None:
    passings = [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("c", "1", "x", None, False)]
    first = store.record_turn("turn-9", passings)
    retry = store.record_turn("turn-9", passings)
    assert [m.as_dict() for m in retry] == [m.as_dict() for m in first]
    assert [m.uses for m in store.edges()] == [1, 1, 1]
    assert len(store.events(turn_id="turn-9")) == 3


def test_record_turn_returns_rows_in_passing_order(store: Mnestoma) -> None:
    rows = store.record_turn(
        "t",
        [
            Passing("a", "1", "b", "1"),
            ("b", "1", "c", "1"),
            Passing("c", "1", "wish", dst_exists=False, desired_sig={"summary": "s"}),
        ],
    )
    assert [(r.src_executor, r.dst_executor, r.state) for r in rows] == [
        ("a", "b", "active"),
        ("b", "c", "active"),
        ("c", "wish", "proto"),
    ]
    assert {e.turn_id for e in store.events()} == {"t"}


def test_the_same_edge_twice_in_one_turn_counts_twice(store: Mnestoma) -> None:
    rows = store.record_turn("t", [("a", "1", "b", "1"), ("a", "1", "b", "1")])
    assert rows[0].id == rows[1].id and rows[0].uses == rows[1].uses == 2
    assert [e.occurrence for e in store.events(turn_id="t")] == [1, 2]


def test_record_turn_mixes_creation_and_reinforcement(store: Mnestoma, clock) -> None:
    existing = store.record_passing("a", "1", "b", "1")
    clock.advance(days=2)
    rows = store.record_turn("t", [("a", "1", "b", "1"), ("b", "1", "c", "1")])
    assert rows[0].id == existing.id and rows[0].uses == 2
    assert rows[0].weight == pytest.approx(0.3 * math.exp(-0.036) + 0.15)
    assert rows[1].uses == 1 and rows[1].weight == 0.3


def test_record_turn_is_all_or_nothing(store: Mnestoma, store_url: str) -> None:
    store.record_passing("a", "1", "b", "1")
    with pytest.raises(InvalidInput):
        store.record_turn("t", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("", "1", "d", "1")])
    rows = store.edges()
    assert [(r.src_executor, r.uses) for r in rows] == [("a", 1)]
    assert len(store.events()) == 1


def test_record_turn_rolls_back_when_the_database_fails_midway(
    store: Mnestoma, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after some statements ran leaves nothing behind."""
    from mnestoma.store import commands, pg_writes

    store.record_passing("a", "1", "b", "1")
    calls = {"n": 0}
    original = commands.creation

    def failing(p, turn_id, now, recorder, occurrence=1):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated crash in the middle of a turn")
        return original(p, turn_id, now, recorder, occurrence)

    monkeypatch.setattr(commands, "creation", failing)
    # PostgreSQL records a turn in one statement: the crash comes once it has run
    ran_statement = pg_writes._turn_once

    def crashing(*args, **kwargs):  # type: ignore[no-untyped-def]
        ran_statement(*args, **kwargs)
        raise RuntimeError("simulated crash after the turn's statement")

    monkeypatch.setattr(pg_writes, "_turn_once", crashing)
    with pytest.raises(RuntimeError):
        store.record_turn("t", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("c", "1", "d", "1")])
    engine = make_engine(store_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(Mnest)).scalar_one() == 1
            assert conn.execute(select(func.count()).select_from(Event)).scalar_one() == 1
            assert conn.execute(select(Mnest.uses)).scalar_one() == 1
    finally:
        engine.dispose()


def test_an_empty_turn_records_nothing(store: Mnestoma) -> None:
    assert store.record_turn("t", []) == []
    assert store.edges() == []


def test_find_and_get(store: Mnestoma) -> None:
    a = store.record_passing("a", "1", "b", "1")
    p = store.record_passing("a", "1", "w", dst_exists=False)
    assert store.find("a", "1", "b", "1").id == a.id
    assert store.find("a", "1", "w", None, state="proto").id == p.id
    assert store.find("a", "1", "b", "2") is None
    assert store.find("a", "1", "b", "1", state="decaying") is None
    assert store.get(a.id).id == a.id
    assert store.get("mn_doesnotexist00") is None


def test_edges_filter_by_source_destination_and_states(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "c", "1")
    store.record_passing("b", "1", "c", "1")
    store.record_passing("a", "1", "w", dst_exists=False)
    assert len(store.edges()) == 4
    assert {e.dst_executor for e in store.edges(src_executor="a")} == {"b", "c", "w"}
    assert {e.src_executor for e in store.edges(dst_executor="c")} == {"a", "b"}
    assert [e.dst_executor for e in store.edges(states=["proto"])] == ["w"]
    assert len(store.edges(src_executor="a", states=["active"])) == 2


def test_events_are_listed_oldest_first(store: Mnestoma, clock) -> None:
    a = store.record_passing("a", "1", "b", "1", turn_id="t1")
    clock.advance(days=1)
    store.record_passing("a", "1", "b", "1", turn_id="t2")
    kinds = [(e.kind, e.turn_id) for e in store.events(mnest_id=a.id)]
    assert kinds == [("created", "t1"), ("reinforced", "t2")]
    assert [e.ts for e in store.events()] == sorted(e.ts for e in store.events())
    assert all(e.ts.tzinfo is UTC or e.ts.utcoffset().total_seconds() == 0 for e in store.events())


def test_returned_objects_are_detached_snapshots(store: Mnestoma) -> None:
    from sqlalchemy import inspect

    m = store.record_passing("a", "1", "b", "1")
    state = inspect(m)
    assert state.detached
    assert not state.unloaded
    got = store.get(m.id)
    assert inspect(got).detached and not inspect(got).unloaded


def test_now_is_never_before_the_last_passing(store: Mnestoma, clock) -> None:
    """A clock that steps back cannot break ts_last >= ts_first."""
    first = store.record_passing("a", "1", "b", "1")
    clock.advance(days=-3)
    again = store.record_passing("a", "1", "b", "1")
    assert again.ts_last == first.ts_last and again.ts_first == first.ts_first
    assert again.weight == pytest.approx(0.45)


@pytest.mark.parametrize(
    "bad",
    [{"k": "a\x00b"}, {"a\x00": 1}, ["\x00"], {1: "x"}, {"x": float("nan")}, {"x": object()}],
)
def test_tags_that_are_not_portable_json_are_invalid_input(store: Mnestoma, bad: object) -> None:
    with pytest.raises(InvalidInput):
        store.record_passing("a", "1", "b", "1", tags=bad)
    with pytest.raises(InvalidInput):
        store.record_passing("a", "1", "w", dst_exists=False, desired_sig=bad)
    assert store.edges() == []


def test_a_turn_finds_its_rows_through_the_unique_indexes(store: Mnestoma) -> None:
    """The lookup of a turn's keys must not scan the table (it did with a row-value IN)."""
    from sqlalchemy import text

    from mnestoma.schema.sql.record import key_params, select_keys

    store.record_turn("bulk", [(f"s{i % 50}", str(i % 7), f"d{i}", "1") for i in range(2000)])
    stmt = select_keys(2, 1)  # shapes come in powers of two: 2 active keys, 1 proto key
    params = key_params([("s1", "1", "d1", "1"), ("s2", "2", "d2", "1")], [("s3", "3", "y", None)])
    with store.engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        compiled = stmt.compile(dialect=conn.dialect)
        values = {**compiled.params, **params}
        if conn.dialect.name == "sqlite":
            args = tuple(values[k] for k in compiled.positiontup)
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", args)
            plan = " ".join(str(r[-1]) for r in rows)
            assert "ux_mnests_edge_key" in plan and "ux_mnests_proto_key" in plan
            assert "SCAN mnests" not in plan
        else:
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}", values))
            assert "Seq Scan" not in plan and "Index" in plan


def test_a_turns_lookup_binds_each_key_in_its_slot_and_null_in_the_unused_ones() -> None:
    from mnestoma.schema.sql.record import key_params, select_keys

    akeys = [(f"s{i}", "1", f"d{i}", "2") for i in range(3)]
    pkeys = [("p", "1", "q", None)]
    params = key_params(akeys, pkeys)
    slots = {b.key for b in select_keys(4, 1).compile().binds.values()}
    assert set(params) == slots  # every slot of the shape bound, no other name
    for i, (s, sv, d, dv) in enumerate(akeys):
        assert (params[f"sa{i}"], params[f"sva{i}"], params[f"da{i}"], params[f"dva{i}"]) == (
            s,
            sv,
            d,
            dv,
        )
    assert (params["sa3"], params["sva3"], params["da3"], params["dva3"]) == (None,) * 4
    assert (params["sp0"], params["svp0"], params["dp0"]) == ("p", "1", "q")
