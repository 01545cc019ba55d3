"""walk (one recursive query) and suggest_next (both engines)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, text

from mnestoma import InvalidInput, Mnestoma
from mnestoma.schema.sql import read


def _names(paths: list) -> list[list[str]]:
    return [[path[0].src_executor] + [m.dst_executor for m in path] for path in paths]


def test_walk_follows_a_chain_of_two_rows(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "c", "1")
    assert _names(store.walk("a")) == [["a", "b"], ["a", "b", "c"]]


def test_walk_requires_the_next_source_version_to_match(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "2", "c", "1")  # b@2 is not what a fed
    assert _names(store.walk("a")) == [["a", "b"]]


def test_walk_starts_from_any_version_of_the_source(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "2", "c", "1")
    assert sorted(_names(store.walk("a"))) == [["a", "b"], ["a", "c"]]


def test_walk_never_visits_an_executor_twice(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "a", "1")
    store.record_passing("b", "1", "c", "1")
    store.record_passing("c", "1", "b", "1")
    store.record_passing("a", "1", "a", "1")  # a self-loop is never a path
    paths = _names(store.walk("a", max_depth=5))
    assert sorted(paths) == [["a", "b"], ["a", "b", "c"]]
    for p in paths:
        assert len(p) == len(set(p))


def test_walk_respects_max_depth(store: Mnestoma) -> None:
    for src, dst in zip("abcde", "bcdef", strict=True):
        store.record_passing(src, "1", dst, "1")
    assert max(len(p) for p in store.walk("a", max_depth=2)) == 2
    assert max(len(p) for p in store.walk("a", max_depth=4)) == 4
    assert len(store.walk("a", max_depth=10)) == 5


def test_walk_orders_paths_by_score_best_first(store: Mnestoma) -> None:
    for _ in range(3):
        store.record_passing("a", "1", "strong", "1")  # 0.60
    store.record_passing("a", "1", "weak", "1")  # 0.30
    store.record_passing("strong", "1", "z", "1")  # 0.30 → path score 0.18
    paths = store.walk("a")
    scores = [math.prod(m.weight for m in p) for p in paths]
    assert scores == sorted(scores, reverse=True)
    assert _names(paths)[0] == ["a", "strong"]


def test_walk_skips_edges_below_min_weight(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")  # 0.45
    store.record_passing("b", "1", "c", "1")  # 0.30
    assert _names(store.walk("a", min_weight=0.4)) == [["a", "b"]]
    clock.advance(days=30)  # 0.45·e^(−0.54) ≈ 0.26
    assert store.walk("a", min_weight=0.4) == []


def test_walk_without_a_floor_keeps_edges_that_have_faded_to_nothing(
    store: Mnestoma, clock
) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "c", "1")
    clock.advance(days=20_000)  # 0.30·e^(−360): effective weight 0, state still active
    assert _names(store.walk("a")) == [["a", "b"], ["a", "b", "c"]]
    assert _names(store.walk("a", min_weight=0.0)) == [["a", "b"], ["a", "b", "c"]]
    assert store.walk("a", min_weight=1e-9) == []


def test_walk_reads_timestamps_that_another_tool_wrote_with_a_zone(store: Mnestoma) -> None:
    m = store.record_passing("a", "1", "b", "1")
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE mnests SET ts_first = '2026-03-01 09:00:00Z',"
                " ts_last = '2026-03-01T10:00:00+01:00', ts_weight = '2026-03-01T04:00:00-05:00'"
                " WHERE id = :id"
            ),
            {"id": m.id},
        )
    [[edge]] = store.walk("a")
    nine = datetime(2026, 3, 1, 9, tzinfo=UTC)
    for value in (edge.ts_first, edge.ts_last, edge.ts_weight):
        assert value == nine and value.utcoffset() == timedelta(0)


def test_walk_follows_only_active_edges(store: Mnestoma) -> None:
    ab = store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "w", dst_exists=False)
    store.record_passing("b", "1", "c", "1")
    store.transition_state(ab.id, "superseded")
    assert store.walk("a") == []


def test_walk_is_one_query_whatever_the_depth(store: Mnestoma) -> None:
    for src, dst in zip("abcdefg", "bcdefgh", strict=True):
        store.record_passing(src, "1", dst, "1")
    statements: list[str] = []

    def count(conn, cursor, statement, params, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith(("WITH", "SELECT")):
            statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        paths = store.walk("a", max_depth=6)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    assert len(paths) == 6
    recursive = [s for s in statements if "RECURSIVE" in s.upper()]
    assert len(recursive) == 1
    assert len(statements) == 1  # paths and their rows come back together


def test_walk_of_an_unknown_executor_is_empty(store: Mnestoma) -> None:
    assert store.walk("nobody") == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_depth": 0},
        {"max_depth": -1},
        {"max_depth": "3"},
        {"min_weight": float("nan")},
        {"min_weight": -0.1},
        {"min_weight": 1.5},
        {"max_depth": True},
    ],
)
def test_walk_refuses_bad_bounds(store: Mnestoma, kwargs: dict) -> None:
    with pytest.raises(InvalidInput):
        store.walk("a", **kwargs)


def test_suggest_next_orders_by_effective_weight(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "old", "1")
    store.record_passing("a", "1", "old", "1")  # 0.45 at t0
    clock.advance(days=40)  # old: 0.45·e^(−0.72) ≈ 0.219
    store.record_passing("a", "1", "new", "1")  # 0.30
    store.record_passing("a", "1", "w", dst_exists=False)  # protos are not suggested
    got = store.suggest_next("a")
    assert [m.dst_executor for m, _ in got] == ["new", "old"]
    assert got[0][1] == pytest.approx(0.30)
    assert got[1][1] == pytest.approx(0.45 * math.exp(-0.72))


def test_suggest_next_breaks_ties_by_uses(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "x", "1")
    for _ in range(8):
        store.record_passing("a", "1", "y", "1")  # clamps at 1.0 with more uses
    for _ in range(7):
        store.record_passing("a", "1", "z", "1")  # 1.0 too, fewer uses
    got = [(m.dst_executor, m.uses) for m, _ in store.suggest_next("a", k=2)]
    assert got == [("y", 8), ("z", 7)]


def test_suggest_next_filters_by_version_and_limits_to_k(store: Mnestoma) -> None:
    for i in range(7):
        store.record_passing("a", "1", f"d{i}", "1")
    store.record_passing("a", "2", "only-v2", "1")
    assert len(store.suggest_next("a")) == 5
    assert len(store.suggest_next("a", k=3)) == 3
    assert [m.dst_executor for m, _ in store.suggest_next("a", "2")] == ["only-v2"]


def _plan(store: Mnestoma, stmt, params: dict) -> str:
    """EXPLAIN of ``stmt`` with ``params`` bound, as the engine would plan it (PostgreSQL
    with sequential scans off: the tables of a test are too small to need an index)."""
    with store.engine.connect() as conn:
        compiled = stmt.compile(dialect=conn.dialect)
        if conn.dialect.name == "sqlite":
            bound = compiled.construct_params(params)
            args = tuple(
                compiled.binds[n].type.process_bind_param(bound[n], conn.dialect)
                if hasattr(compiled.binds[n].type, "process_bind_param")
                else bound[n]
                for n in compiled.positiontup or ()
            )
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled.string, args)
            return " ".join(str(r[-1]) for r in rows)
        conn.exec_driver_sql("SET enable_seqscan = off")
        rows = conn.exec_driver_sql("EXPLAIN " + compiled.string, compiled.construct_params(params))
        return " ".join(r[0] for r in rows)


def test_suggest_next_uses_the_partial_index_of_active_sources(store: Mnestoma) -> None:
    """EXPLAIN of the very statement suggest_next runs, with its parameters bound: the state
    is written as a literal, so the planner knows ix_mnests_active_src holds the rows."""
    store.record_passing("a", "1", "b", "1")
    stmt = read.suggest_statement(store.engine.dialect.name, False)
    params = {"src": "a", "k": 5, "now": datetime(2026, 1, 2, tzinfo=UTC)}
    assert "ix_mnests_active_src" in _plan(store, stmt, params)


def test_walk_steps_through_the_partial_index_of_active_sources(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "c", "1")
    stmt = read.walk_statement(store.engine.dialect.name, with_floor=False)
    params = {"src": "a", "max_depth": 3, "limit": 10, "now": datetime(2026, 1, 2, tzinfo=UTC)}
    plan = _plan(store, stmt, params)
    # the first edges, and each step's next edges (the recursion's join), both through it
    assert plan.count("ix_mnests_active_src") >= 2, plan


def test_walk_and_suggest_on_a_factory_built_graph(store_url: str, clock) -> None:
    """Rows built by the testing kit, read by the repository in the same transaction."""
    from mnestoma import MnestRepository, make_engine, make_session_factory
    from mnestoma.testing import (
        DecayingMnestFactory,
        MnestFactory,
        ProtoMnestFactory,
        bind_factories,
    )

    engine = make_engine(store_url)
    try:
        with make_session_factory(engine)() as session, bind_factories(session, clock=clock):
            MnestFactory(src_executor="plan", dst_executor="search", dst_version="2", strong=True)
            MnestFactory(src_executor="search", src_version="2", dst_executor="read")
            MnestFactory(src_executor="search", src_version="1", dst_executor="lost")
            MnestFactory(src_executor="plan", dst_executor="guess", weak=True)
            DecayingMnestFactory(src_executor="plan", dst_executor="old")
            ProtoMnestFactory(src_executor="plan", recurring=True)
            repo = MnestRepository(session, clock=clock)
            paths = _names(repo.walk("plan"))
            assert paths[0] == ["plan", "search"]
            assert ["plan", "search", "read"] in paths
            assert all("lost" not in p and "old" not in p for p in paths)
            assert [m.dst_executor for m, _ in repo.suggest_next("plan")] == ["search", "guess"]
            assert len(repo.recurring_protos()) == 1
            session.rollback()
    finally:
        engine.dispose()


def test_walk_builds_paths_when_scores_tie(store: Mnestoma) -> None:
    """Weights of 1.0 give a path and its extension the same score: the shorter comes first."""
    for _ in range(6):
        store.record_turn(
            f"t{_}", [("a", "1", "b", "1"), ("b", "1", "c", "1"), ("c", "1", "d", "1")]
        )
    paths = store.walk("a")
    assert _names(paths) == [["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]]
    assert all(m.weight == 1.0 for p in paths for m in p)
    assert paths[1][0] is paths[0][0]  # one snapshot per edge, shared by the paths


def test_sqlite_walk_orders_and_limits_inside_its_recursive_cte() -> None:
    """SQLite pops the best path first and stops after ``:limit`` (work bounded by the limit,
    not by the number of paths): the ORDER BY and LIMIT stand inside the CTE's compound."""
    from sqlalchemy.dialects import sqlite

    sql = str(read.walk_statement("sqlite", with_floor=False).compile(dialect=sqlite.dialect()))
    cte, outer = sql.split("\n SELECT paths.path", 1)
    assert cte.startswith("WITH RECURSIVE paths(loc, dst_executor, dst_version, depth, score")
    assert " UNION ALL SELECT " in cte and "FROM mnests AS nxt, paths" in cte
    assert cte.rstrip().endswith(" ORDER BY score DESC, depth, spelled, path\n LIMIT ? OFFSET ?)")
    assert "JOIN mnests ON mnests.rowid = paths.loc" in outer


def test_the_read_statements_use_only_public_sqlalchemy() -> None:
    """No private attribute (``_construct``, ``_restates``, ...) is reached for in sql/read.py."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(read))
    private = [
        f"line {node.lineno}: {name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute | ast.keyword)
        and (name := node.attr if isinstance(node, ast.Attribute) else node.arg)
        and name.startswith("_")
        and not name.startswith("__")
    ]
    assert private == []
