"""The benchmark of ``predict_next``'s cost on a big store (``python -m
benchmarks.planner_latency``), at its ``--quick`` size: it builds the store it says, times
every call it says, and each kind of context is answered by the context it is meant to
exercise. No figure is asserted against a target."""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import REPO

if str(REPO) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
    sys.path.insert(0, str(REPO))

import mnestoma
from benchmarks import planner_latency as pl
from benchmarks.data import NOW, FixedClock


def test_the_quick_run_builds_the_store_and_times_every_call(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert pl.main(["--quick", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    shape = pl.QUICK
    assert (report["edges"], report["sources"], report["calls"]) == (
        shape.edges, shape.sources, shape.calls
    )  # fmt: skip
    assert report["chains"] == shape.edges * shape.chains_per_edge
    assert sum(report["answered_by"].values()) == shape.calls
    by_context = report["by_context"]
    assert sum(f["calls"] for f in by_context.values()) == shape.calls
    # a pair of the graph has chains: it answers; a pair never seen and one executor: the edge
    assert report["answered_by"]["chain"] == by_context["pair"]["calls"] > 0
    assert report["answered_by"]["edge"] == shape.calls - by_context["pair"]["calls"]
    for figures in (report["predict_next"], report["suggest_next"], *by_context.values()):
        assert 0 < figures["median_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert report["ratio"] > 0
    assert list(tmp_path.iterdir()) == [out]  # the store is gone


def test_the_store_holds_the_graph_and_the_chains_of_each_edge(tmp_path: Path) -> None:
    shape = pl.Shape(edges=300, sources=30, chains_per_edge=2, calls=1)
    path = tmp_path / "store.sqlite"
    succ, chains, _ = pl.build(path, shape)
    assert [len(t) for t in succ] == [10] * 30
    assert all(e not in t and len(set(t)) == len(t) for e, t in enumerate(succ))
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT count(*) FROM mnests WHERE state = 'active'").fetchone() == (
            300,
        )
        assert chains == con.execute("SELECT count(*) FROM mnest_chains").fetchone()[0] == 600
        wrong = con.execute(
            "SELECT count(*) FROM mnest_chains c WHERE NOT EXISTS (SELECT 1 FROM mnests m"
            " WHERE m.src_executor = c.prev_executor AND m.dst_executor = c.src_executor)"
            " OR NOT EXISTS (SELECT 1 FROM mnests m"
            " WHERE m.src_executor = c.src_executor AND m.dst_executor = c.dst_executor)"
        ).fetchone()
        assert wrong == (0,)  # every chain follows two edges of the graph
    finally:
        con.close()
    w = random.Random(1).randrange(30)
    x = succ[w][0]
    with mnestoma.Mnestoma(f"sqlite:///{path}", clock=FixedClock(NOW)) as store:
        forecast = store.predict_next([f"e{w}", f"e{x}"])
        alone = store.predict_next(f"e{x}")
    assert forecast.used.value == "chain" and len(forecast.candidates) == 10
    assert alone.used.value == "edge"
    assert {c.executor for c in alone.candidates} == {f"e{y}" for y in succ[x]}
    assert (
        sum(c.p for c in forecast.candidates) + forecast.unseen == 1.0
        or abs(sum(c.p for c in forecast.candidates) + forecast.unseen - 1.0) < 1e-9
    )


@pytest.mark.parametrize("args", [["--calls", "0"], ["--edges", "-1"], ["--sources", "1"]])
def test_a_size_below_one_is_refused_in_one_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert pl.main(["--quick", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
