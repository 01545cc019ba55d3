"""Reliability, round two: bounded walks, finite decay speeds, thresholds both engines decide
alike, turns that race the ager, a merge whose cost does not depend on statistics, and ORM
bulk statements refused on the read-only view."""

from __future__ import annotations

import itertools
import math
import random
import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest
from conftest import mnest_row
from sqlalchemy import column, insert, table, text

import mnestoma
from mnestoma import Mnestoma
from mnestoma.models import Mnest
from mnestoma.repository import WALK_LIMIT

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _dense_graph(store: Mnestoma, n: int, *, seed: int = 7) -> dict[str, tuple[str, str, float]]:
    """Every ordered pair of ``n`` executors joined by an active edge with a random weight
    (weights refer to T0, the clock's start). Returns id -> (src, dst, weight)."""
    rnd = random.Random(seed)
    names = [f"x{i:02d}" for i in range(n)]
    rows = [
        mnest_row(T0, src_executor=a, dst_executor=b, weight=round(rnd.uniform(0.3, 1.0), 9))
        for a, b in itertools.permutations(names, 2)
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), rows)
    return {r["id"]: (r["src_executor"], r["dst_executor"], r["weight"]) for r in rows}


def _all_paths_best_first(
    edges: dict[str, tuple[str, str, float]], src: str, max_depth: int
) -> list[list[str]]:
    """Every simple path from ``src`` by brute force, as lists of ids, best score first."""
    out_of: dict[str, list[str]] = {}
    for eid, (a, _, _) in edges.items():
        out_of.setdefault(a, []).append(eid)
    found: list[tuple[float, int, list[str]]] = []

    def extend(path: list[str], seen: set[str], score: float) -> None:
        last = edges[path[-1]][1]
        found.append((score, len(path), path))
        if len(path) == max_depth:
            return
        for eid in out_of.get(last, []):
            dst = edges[eid][1]
            if dst not in seen:
                extend([*path, eid], seen | {dst}, score * edges[eid][2])

    for eid in out_of.get(src, []):
        extend([eid], {src, edges[eid][1]}, edges[eid][2])
    found.sort(key=lambda f: (-f[0], f[1]))
    return [p for _, _, p in found]


# --- 16.11 (a): walk computes the best `limit` paths only ------------------------------------


def test_walk_returns_the_best_limit_paths_exactly(store: Mnestoma) -> None:
    edges = _dense_graph(store, 6)  # 30 edges, 325 simple paths from one executor
    everything = _all_paths_best_first(edges, "x00", 5)
    assert len(everything) == 325
    for limit in (1, 7, 50, 324, 325, 1000):
        got = [[m.id for m in p] for p in store.walk("x00", max_depth=5, limit=limit)]
        assert got == everything[:limit]


def test_walk_has_a_default_limit_of_a_thousand_paths(store: Mnestoma) -> None:
    _dense_graph(store, 8)  # 13,699 simple paths from one executor at depth 7
    paths = store.walk("x00", max_depth=7)
    assert len(paths) == WALK_LIMIT == 1000
    scores = [math.prod(m.weight for m in p) for p in paths]
    assert scores == sorted(scores, reverse=True)


def test_a_deep_walk_on_a_dense_graph_stays_within_its_limit(store: Mnestoma) -> None:
    """11 executors, 110 edges, depth 16: ~9.9M simple paths; only the best 1000 are built
    (before the limit existed this took minutes and gigabytes)."""
    edges = _dense_graph(store, 11)
    assert len(edges) == 110
    tracemalloc.start()
    try:
        paths = store.walk("x00", max_depth=16, limit=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(paths) == 1000
    assert peak < 50_000_000
    scores = [math.prod(m.weight for m in p) for p in paths]
    assert scores == sorted(scores, reverse=True)
    # the best path is at least as good as the best single edge's greedy continuation
    best_edge = max(w for (a, _, w) in edges.values() if a == "x00")
    assert scores[0] == pytest.approx(best_edge)
    for p in paths:  # simple paths, chained
        names = [p[0].src_executor] + [m.dst_executor for m in p]
        assert len(names) == len(set(names))


@pytest.mark.parametrize("bad", [0, -1, 100_001, 2**70, 1.5, "10", True, None])
def test_walk_limit_must_be_a_sensible_positive_integer(store: Mnestoma, bad: object) -> None:
    with pytest.raises(mnestoma.InvalidInput):
        store.walk("x00", limit=bad)  # type: ignore[arg-type]


def test_cli_walk_limit_prints_that_many_paths(store_url: str) -> None:
    import json

    from click.testing import CliRunner

    from mnestoma.cli import cli

    with Mnestoma(store_url) as m:
        for dst in "bcdef":
            m.record_passing("a", "1", dst, "1")
            m.record_passing(dst, "1", "z", "1")
    runner = CliRunner()
    out = runner.invoke(cli, ["walk", "a", "--limit", "3", "--json", "--database-url", store_url])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)) == 3
    out = runner.invoke(cli, ["walk", "a", "--json", "--database-url", store_url])
    assert len(json.loads(out.output)) == 10
    out = runner.invoke(cli, ["walk", "a", "--limit", "0", "--database-url", store_url])
    assert out.exit_code == 2


# --- 16.7: ORM bulk statements cannot write through the read-only view ----------------------


def _view_session(store: Mnestoma):  # type: ignore[no-untyped-def]
    from mnestoma import make_session_factory

    return make_session_factory(store.engine)()


@pytest.mark.parametrize(
    "statement",
    ["orm_update", "orm_delete", "orm_insert", "core_update", "core_delete", "bulk_by_pk"],
)
def test_bulk_writes_through_the_view_are_refused(store: Mnestoma, statement: str) -> None:
    from sqlalchemy import delete, update

    from mnestoma.models import MnestomaView, ReadOnlyError

    m = store.record_passing("a", "1", "b", "1")
    view = MnestomaView.__table__
    statements = {
        "orm_update": (update(MnestomaView).where(MnestomaView.id == m.id).values(weight=0.9),),
        "orm_delete": (delete(MnestomaView).where(MnestomaView.id == m.id),),
        "orm_insert": (
            insert(MnestomaView).values(**mnest_row(T0, src_executor="x", dst_executor="y")),
        ),
        "core_update": (update(view).where(view.c.id == m.id).values(uses=99),),
        "core_delete": (delete(view),),
        "bulk_by_pk": (update(MnestomaView), [{"id": m.id, "weight": 0.9}]),
    }
    with _view_session(store) as session:
        with pytest.raises(ReadOnlyError, match="read-only"):
            session.execute(*statements[statement])
        session.rollback()
        assert session.get(MnestomaView, m.id) is not None  # reading the view still works
    after = store.edges()
    assert [(r.id, r.weight, r.uses) for r in after] == [(m.id, m.weight, m.uses)]
    assert [e.kind for e in store.events()] == ["created"]


def test_bulk_writes_to_mnests_itself_are_not_refused(store: Mnestoma) -> None:
    from sqlalchemy import update

    m = store.record_passing("a", "1", "b", "1")
    with _view_session(store) as session:
        session.execute(update(Mnest).where(Mnest.id == m.id).values(tags={"k": "v"}))
        session.commit()
    assert store.get(m.id).tags == {"k": "v"}


# --- 16.4: turns that race the ager are retried to success (PostgreSQL) ---------------------


def test_turns_racing_the_ager_all_succeed_and_count_once(pg_store_url: str) -> None:
    """8 writer threads record turns of 5-10 edges from one pool of keys while an ager thread
    moves the clock 100 days and demotes (or merges) every row, again and again: every turn
    succeeds, and each (turn, edge) is counted exactly once."""
    import threading

    from mnestoma.testing.clock import MovableClock

    clock = MovableClock(T0)
    keys = [(f"s{i}", "1", f"d{j}", "1") for i in range(4) for j in range(6)]
    threads_n, turns_n = 8, 30
    errors: list[BaseException] = []
    counted = [0] * threads_n
    done = threading.Event()
    ager_runs = [0]
    with Mnestoma(pg_store_url, clock=clock) as store:

        def writer(n: int) -> None:
            rnd = random.Random(n)
            try:
                for t in range(turns_n):
                    edges = rnd.sample(keys, rnd.randint(5, 10))
                    store.record_turn(f"w{n}-t{t}", edges)
                    counted[n] += len(edges)
            except BaseException as err:
                errors.append(err)

        def ager() -> None:
            try:
                while not done.is_set():
                    clock.advance(days=100)
                    store.apply_ager()
                    ager_runs[0] += 1
            except BaseException as err:
                errors.append(err)

        workers = [threading.Thread(target=writer, args=(n,)) for n in range(threads_n)]
        aging = threading.Thread(target=ager)
        aging.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        aging.join()
        assert errors == []
        rows = store.edges()
        passings = [e for e in store.events() if e.kind in ("created", "reinforced")]
    assert ager_runs[0] >= 3
    assert len(passings) == sum(counted)
    assert sum(r.uses for r in rows) == sum(counted)
    assert {r.state for r in rows} <= {"active", "decaying"}


# --- 16.11 (c): at a threshold exactly, both engines (and Python) decide alike -----------------


def _days_to(weight: float, threshold: float) -> timedelta:
    """The time a weight takes to decay exactly to ``threshold`` at the default speed."""
    return timedelta(days=math.log(weight / threshold) / 0.018)


def test_the_pure_rule_treats_rounding_noise_at_a_threshold_as_not_below() -> None:
    from mnestoma.rules import THRESHOLD_TOLERANCE, decayed_weight, is_below

    at_edge = decayed_weight(0.30, 0.018, T0, T0 + _days_to(0.30, 0.05))
    assert at_edge == pytest.approx(0.05, abs=1e-14) and at_edge < 0.05  # noise, below
    assert not is_below(at_edge, 0.05)
    assert is_below(0.05 - 2 * THRESHOLD_TOLERANCE, 0.05)
    assert not is_below(0.05, 0.05)


def test_a_proto_decayed_exactly_to_the_prune_threshold_is_kept_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    p = store.record_passing("a", "1", "wish", dst_exists=False)
    clock.set(T0 + _days_to(0.30, 0.05))  # Python: 0.049999999999996506
    report = store.apply_ager()
    assert report.protos_pruned == 0
    assert store.get(p.id) is not None
    clock.advance(hours=1)  # now clearly below
    assert store.apply_ager().protos_pruned == 1
    assert store.get(p.id) is None


def test_an_active_row_decayed_exactly_to_0_20_stays_active_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    row = store.record_passing("a", "1", "b", "1")
    assert row.weight == pytest.approx(0.60)
    clock.set(T0 + _days_to(row.weight, 0.20))  # Python: 0.19999999999999696
    assert store.apply_ager().to_decaying == 0
    assert store.get(row.id).state == "active"
    clock.advance(hours=1)
    assert store.apply_ager().to_decaying == 1
    assert store.get(row.id).state == "decaying"


def test_archive_candidates_at_exactly_0_05_are_not_counted_on_every_engine(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    row = store.record_passing("a", "1", "b", "1")
    store.transition_state(row.id, "decaying")
    clock.set(T0 + _days_to(0.30, 0.05))  # 99.5 days: old enough, weight exactly 0.05
    assert store.apply_ager().archive_candidates == 0
    clock.advance(hours=1)
    assert store.apply_ager().archive_candidates == 1


# --- 16.6: the ager's merge costs the same whatever the plan (PostgreSQL, no statistics) -----


def _plan_work(node: dict) -> int:
    """Rows a plan node and its children produced or threw away, times their loops: the work
    an EXPLAIN ANALYZE plan did, independent of the machine's speed."""
    rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    rows += node.get("Rows Removed by Join Filter", 0) + node.get(
        "Rows Removed by Index Recheck", 0
    )
    own = int(rows * node.get("Actual Loops", 1))
    return own + sum(_plan_work(child) for child in node.get("Plans", []))


@pytest.mark.parametrize("hub_side", ["src", "dst"])
def test_the_merge_of_a_hub_is_linear_on_a_database_without_statistics(
    pg_empty_db_url: str, hub_side: str
) -> None:
    """One executor with 2,000 active rows below 0.20 (as their source, or as their
    destination), each with a decaying twin, loaded after the last ANALYZE: a plan that
    reached one side through the (state, src) or the dst_executor index read every twin of
    the hub for each row (quadratic, millions of rows); the merge statement does a bounded
    amount of work per row, and merges every pair."""
    from mnestoma.sql import ager as stm

    hub = 2_000

    def ends(i: int) -> dict[str, str]:
        if hub_side == "src":
            return {"src_executor": "hub", "dst_executor": f"d{i}"}
        return {"src_executor": f"s{i}", "dst_executor": "hub"}

    mnestoma.upgrade(pg_empty_db_url)
    with Mnestoma(pg_empty_db_url) as store:
        with store.engine.begin() as conn:
            for table in ("mnests", "events"):
                conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
            conn.execute(text("SELECT pg_stat_reset()"))
            conn.execute(
                insert(Mnest.__table__),
                [
                    mnest_row(T0, **ends(i), weight=0.1, state=state)
                    for i in range(hub)
                    for state in ("active", "decaying")
                ],
            )
        with store.engine.connect() as conn:
            # the rows came after the last ANALYZE (upgrade's, on empty tables): no column
            # statistics, as after a bulk load or a copy
            column_stats = "SELECT count(*) FROM pg_stats WHERE tablename = 'mnests'"
            assert conn.execute(text(column_stats)).scalar_one() == 0
            changes = stm.postgresql_ager_statements().changes
            [merge] = [c.statement for c in changes if c.name == "merge"]
            params = {"now": T0 + timedelta(days=1), "cutoff": T0 - timedelta(days=89)}
            compiled = merge.compile(dialect=conn.dialect)
            plan = conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string,
                {**compiled.params, **params},
            ).scalar_one()
            work = _plan_work(plan[0]["Plan"])
            left = conn.execute(text("SELECT state, count(*) FROM mnests GROUP BY state")).all()
            merged = conn.execute(text("SELECT count(*) FROM events WHERE kind = 'merged'"))
            merged_events = merged.scalar_one()
            conn.rollback()
    assert dict(left) == {"decaying": hub}  # the statement did merge every pair
    assert merged_events == 2 * hub
    assert work < 20 * 2 * hub, work  # quadratic: ~hub² = 4,000,000


# --- 16.11 (b): decay speeds and weights are finite numbers in the database ------------------


def _raw_row(**overrides: object) -> dict[str, object]:
    return mnest_row(T0, **overrides)


@pytest.mark.parametrize(
    "column, value",
    [
        ("decay_lambda", math.inf),
        ("decay_lambda", math.nan),
        ("decay_lambda", -math.inf),
        ("decay_lambda", 1e301),
        ("weight", math.inf),
        ("weight", math.nan),
    ],
)
def test_the_database_refuses_non_finite_decay_speeds_and_weights(
    store: Mnestoma, column: str, value: float
) -> None:
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), [_raw_row(**{column: value})])
    assert store.edges() == []


def test_the_largest_finite_decay_speed_is_accepted_and_decays_at_once(
    store: Mnestoma, clock
) -> None:
    clock.set(T0)
    with store.engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), [_raw_row(decay_lambda=1e300)])
    clock.advance(seconds=1)
    assert store.suggest_next("a")[0][1] < 1e-80  # the SQL caps the exponent at 200
    assert store.apply_ager().to_decaying == 1


def test_upgrading_to_0004_mends_non_finite_decay_speeds(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0003")
    bad = {"mn_infinitespeed01": math.inf}
    engine = mnestoma.make_engine(empty_db_url)
    try:
        if engine.dialect.name == "postgresql":
            bad["mn_notanumberspeed"] = math.nan
        with engine.begin() as conn:
            for i, (mid, speed) in enumerate(bad.items()):
                row = _raw_row(id=mid, dst_executor=f"b{i}", decay_lambda=speed)
                # the columns 0003 has, without the model's defaults for later ones
                at_0003 = table("mnests", *(column(k) for k in row))
                conn.execute(insert(at_0003), [row])
    finally:
        engine.dispose()
    mnestoma.upgrade(empty_db_url)
    with Mnestoma(empty_db_url) as m:
        assert m.get("mn_infinitespeed01").decay_lambda == 1e300
        if "mn_notanumberspeed" in bad:
            assert m.get("mn_notanumberspeed").decay_lambda == 0.018
        assert math.isfinite(m.suggest_next("a")[0][1])
