"""Property tests: invariants under any sequence, a schedule-free ager, SQL == pure rules."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from mnestoma import Mnestoma
from mnestoma.core.rules import (
    DECAYING_BELOW,
    PROTO_PRUNE_BELOW,
    decayed_weight,
    reinforced_weight,
)

EDGES = [
    ("a", "1", "b", "1"),
    ("a", "1", "b", "2"),
    ("b", "1", "a", "1"),
    ("b", "1", "c", "1"),
    ("a", "1", "wish", None),
    ("c", "1", "wish", None),
]
SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _reset(store: Mnestoma) -> None:
    with store.engine.begin() as conn:
        for table in ("events", "canonical_query_log", "mnests"):
            conn.execute(text(f"DELETE FROM {table}"))


def _record(store: Mnestoma, edge: tuple, turn: str | None = None) -> None:
    s, sv, d, dv = edge
    store.record_passing(s, sv, d, dv, dst_exists=dv is not None, turn_id=turn)


step = st.one_of(
    st.tuples(
        st.just("pass"), st.sampled_from(range(len(EDGES))), st.sampled_from([None, "t1", "t2"])
    ),
    st.tuples(st.just("wait"), st.floats(0, 60)),
    st.tuples(st.just("age")),
)


@SETTINGS
@given(steps=st.lists(step, min_size=1, max_size=30))
def test_invariants_hold_whatever_the_sequence(store: Mnestoma, clock, steps: list) -> None:
    _reset(store)
    clock.set(datetime(2026, 1, 1, tzinfo=clock.now.tzinfo))
    seen_turn_edges: set[tuple] = set()
    counted = 0
    for item in steps:
        if item[0] == "pass":
            _, idx, turn = item
            before = store.find(*EDGES[idx], state="proto" if EDGES[idx][3] is None else "active")
            key = (turn, before.id) if (turn and before) else None
            _record(store, EDGES[idx], turn)
            if key is None or key not in seen_turn_edges:
                counted += 1
            after = store.find(*EDGES[idx], state="proto" if EDGES[idx][3] is None else "active")
            if turn:
                seen_turn_edges.add((turn, after.id))
        elif item[0] == "wait":
            clock.advance(days=item[1])
        else:
            store.apply_ager()
    rows = store.edges()
    events = store.events()
    for r in rows:
        assert 0.0 <= r.weight <= 1.0
        assert r.uses >= 1
        assert r.ts_last >= r.ts_first
        assert (r.dst_version is None) == (r.state == "proto")
    passings = [e for e in events if e.kind in ("created", "reinforced")]
    assert len(passings) == counted
    pruned_ids = {e.mnest_id for e in events if e.kind == "pruned"}
    lost = sum(1 for e in passings if e.mnest_id in pruned_ids)
    assert sum(r.uses for r in rows) == counted - lost
    keys = Counter(
        (r.src_executor, r.src_version, r.dst_executor, r.dst_version, r.state) for r in rows
    )
    assert all(n == 1 for n in keys.values())


def _reference_age(rows: list[dict[str, Any]], now: datetime) -> dict[tuple, tuple[int, float]]:
    """The contract's ager applied once, in plain Python: key+state -> (uses, weight at now)."""
    out: dict[tuple, dict[str, Any]] = {}

    def eff(r: dict[str, Any]) -> float:
        return decayed_weight(r["weight"], r["decay_lambda"], r["ts_weight"], now)

    for r in rows:
        key = (r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"])
        if r["state"] == "decaying":
            out[(*key, "decaying")] = {"uses": r["uses"], "w": eff(r)}
    for r in rows:
        key = (r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"])
        w = eff(r)
        if r["state"] == "proto" and w < PROTO_PRUNE_BELOW:
            continue
        if r["state"] == "active" and w < DECAYING_BELOW:
            twin = out.get((*key, "decaying"))
            if twin is not None:
                twin["uses"] += r["uses"]
                twin["w"] = max(twin["w"], w)
            else:
                out[(*key, "decaying")] = {"uses": r["uses"], "w": w}
            continue
        if r["state"] != "decaying":
            out[(*key, r["state"])] = {"uses": r["uses"], "w": w}
    return {k: (v["uses"], v["w"]) for k, v in out.items()}


@SETTINGS
@given(
    passings=st.lists(
        st.tuples(st.sampled_from(range(len(EDGES))), st.floats(0, 20)), min_size=1, max_size=20
    ),
    demote=st.sets(st.sampled_from(range(len(EDGES)))),
    later=st.lists(st.sampled_from(range(4)), max_size=6),
    stops=st.lists(st.floats(0, 80), max_size=6),
    final=st.floats(0, 150),
)
def test_the_ager_at_any_intermediate_instants_equals_once_at_the_end(
    store: Mnestoma, clock, passings: list, demote: set, later: list, stops: list, final: float
) -> None:
    _reset(store)
    for idx, gap in passings:
        clock.advance(days=gap)
        _record(store, EDGES[idx])
    for idx in demote:  # decaying rows, so that later passings create twins that merge
        row = store.find(*EDGES[idx], state="active")
        if row is not None:
            store.transition_state(row.id, "decaying")
    for idx in later:
        _record(store, EDGES[idx])
    snapshot = [r.as_dict() for r in store.edges()]
    for gap in stops:
        clock.advance(days=gap)
        store.apply_ager()
    clock.advance(days=final)
    store.apply_ager()
    expected = _reference_age(snapshot, clock.now)
    got = {
        (r.src_executor, r.src_version, r.dst_executor, r.dst_version, r.state): (
            r.uses,
            r.effective_weight(clock.now),
        )
        for r in store.edges()
    }
    assert got.keys() == expected.keys()
    for key, (uses, weight) in expected.items():
        assert got[key][0] == uses
        assert got[key][1] == pytest.approx(weight, rel=1e-6, abs=1e-12)


@SETTINGS
@given(
    weight=st.floats(0, 1),
    lam=st.floats(0, 0.5),
    age_days=st.floats(0, 400),
)
# a subnormal decay speed times half a day is 0 in float: PostgreSQL called it an underflow
@example(weight=1.0, lam=5e-324, age_days=0.5)
@example(weight=1.0, lam=1e-160, age_days=1e-6)
def test_sql_decay_agrees_with_the_pure_function(
    store: Mnestoma, clock, weight: float, lam: float, age_days: float
) -> None:
    _reset(store)
    start = clock.now
    row = store.record_passing("a", "1", "b", "1")
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE mnests SET weight = :w, decay_lambda = :l WHERE id = :id"),
            {"w": weight, "l": lam, "id": row.id},
        )
    now = start + timedelta(days=age_days)
    clock.set(now)
    [(_row, eff_sql)] = store.suggest_next("a")
    eff_py = decayed_weight(weight, lam, start, now)
    assert eff_sql == pytest.approx(eff_py, rel=1e-7, abs=1e-12)
    store.apply_ager()
    aged = store.get(row.id)
    assert aged.effective_weight(now) == pytest.approx(eff_py, rel=1e-7, abs=1e-12)
    if aged.state == "active":
        again = store.record_passing("a", "1", "b", "1")
        assert again.weight == pytest.approx(
            reinforced_weight(weight, lam, start, now), rel=1e-7, abs=1e-12
        )
    clock.set(start)
