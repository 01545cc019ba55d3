"""walk's ``limit``: the best paths only, a default of a thousand, a bounded search on a
dense graph, and the command line's ``--limit`` (both engines)."""

from __future__ import annotations

import itertools
import math
import random
import tracemalloc
from datetime import UTC, datetime

import pytest
from conftest import mnest_row
from sqlalchemy import insert

import mnestoma
from mnestoma import Mnestoma
from mnestoma.schema.models import Mnest
from mnestoma.store.repository import WALK_LIMIT

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
