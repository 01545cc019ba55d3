"""The planner's chains in the store's upkeep (contract §13): the ager forgets the faded ones,
retention and the ager's merges leave them, ``copy`` carries and merges them, the graph
and the invariant checker know them."""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
from datetime import timedelta
from typing import Any

import pytest
from invariants import check_invariants
from sqlalchemy import create_engine, select, text, update
from sqlalchemy.orm import Session

from mnestoma import AgerReport, Mnestoma
from mnestoma.core import rules
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines import make_engine
from mnestoma.maintenance.copying import copy_store
from mnestoma.planner.graph import render
from mnestoma.schema.models import MnestChain
from mnestoma.testing import MnestChainFactory
from mnestoma.testing.clock import MovableClock

CHAINS = MnestChain.__table__
KEY = ("prev_executor", "src_executor", "dst_executor")
# Days for one passing's count (1 at its ts_last) to fade to CHAIN_FORGET_BELOW: about 166.4.
FADES_AFTER = math.log(1 / rules.CHAIN_FORGET_BELOW) / rules.CHAIN_DECAY_LAMBDA


def chains(url: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every chain of the store, by key, as the model's types read it."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(CHAINS)).mappings()
            return {tuple(r[k] for k in KEY): dict(r) for r in rows}  # type: ignore[misc]
    finally:
        engine.dispose()


def turn(store: Mnestoma, turn_id: str, *names: str) -> None:
    """A turn through ``names`` (each at version 1): one chain per three consecutive."""
    links = [(a, "1", b, "1") for a, b in itertools.pairwise(names)]
    store.record_turn(turn_id, links)


# --- the ager ---------------------------------------------------------------------------------


def test_a_chain_faded_below_005_is_forgotten_and_one_above_it_kept(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    turn(store, "old", "a", "b", "c")
    clock.advance(days=1)
    turn(store, "young", "x", "y", "z")
    clock.advance(days=FADES_AFTER - 1.05)  # (a, b, c) 0.05 days before it fades
    store.apply_ager()
    assert set(chains(store_url)) == {("a", "b", "c"), ("x", "y", "z")}
    clock.advance(days=0.1)  # (a, b, c) 0.05 days after; (x, y, z) 0.95 days before
    store.apply_ager()
    assert set(chains(store_url)) == {("x", "y", "z")}


@pytest.mark.parametrize("run", ["batches of one chain", "batches sized by the run", "one unit"])
def test_every_way_of_running_the_ager_forgets_exactly_the_faded_chains(
    store: Mnestoma, store_url: str, clock: MovableClock, run: str
) -> None:
    for i in range(5):  # fading: (p{i}, m, n{i})
        turn(store, f"old-{i}", f"p{i}", "m", f"n{i}")
    clock.advance(days=100)
    for i in range(4):  # kept: (q{i}, m, n{i}), and the old ones' edges live on
        turn(store, f"new-{i}", f"q{i}", "m", f"n{i}")
    clock.advance(days=70)
    if run == "batches of one chain":
        report = store.apply_ager(batch_rows=1)
    elif run == "batches sized by the run":
        report = store.apply_ager()
    else:
        with store.unit_of_work() as unit:
            report = unit.mnests.apply_ager()
            unit.commit()
    assert set(chains(store_url)) == {(f"q{i}", "m", f"n{i}") for i in range(4)}
    assert isinstance(report, AgerReport)  # no counter of its own: ager_runs' columns
    check_invariants(store_url)


def test_a_dry_run_of_the_ager_forgets_no_chain(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    turn(store, "t", "a", "b", "c")
    clock.advance(days=200)
    before = chains(store_url)
    store.apply_ager(dry_run=True)
    assert chains(store_url) == before
    store.apply_ager()
    assert chains(store_url) == {}


def test_running_the_ager_again_at_the_same_instant_forgets_nothing_more(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    turn(store, "old", "a", "b", "c")
    clock.advance(days=170)
    turn(store, "new", "x", "y", "z")
    store.apply_ager()
    after = chains(store_url)
    store.apply_ager(batch_rows=1)
    assert chains(store_url) == after == {("x", "y", "z"): after[("x", "y", "z")]}


def test_the_async_ager_forgets_faded_chains(store_url: str, clock: MovableClock) -> None:
    async def scenario() -> None:
        async with AsyncMnestoma(store_url, clock=clock) as store:
            await store.record_turn("old", [("a", "1", "b", "1"), ("b", "1", "c", "1")])
            clock.advance(days=170)
            await store.record_turn("new", [("x", "1", "y", "1"), ("y", "1", "z", "1")])
            await store.apply_ager(dry_run=True)
            assert set(chains(store_url)) == {("a", "b", "c"), ("x", "y", "z")}
            await store.apply_ager(batch_rows=1)

    asyncio.run(scenario())
    assert set(chains(store_url)) == {("x", "y", "z")}


def test_a_demotion_merge_leaves_the_chains_as_they_were(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    turn(store, "t1", "a", "b", "c")  # chain (a, b, c); edge a -> b
    turn(store, "t2", "b", "a", "b")  # chain (b, a, b), through a -> b again
    (old,) = store.edges(src_executor="a")
    store.transition_state(old.id, "decaying")
    clock.advance(days=1)
    store.record_passing("a", "1", "b", "1")  # a fresh active twin
    clock.advance(days=25)  # 0.30 -> below 0.20: demoted into its decaying twin
    before = chains(store_url)
    assert store.apply_ager().merged == 1
    assert chains(store_url) == before
    assert len(store.edges(src_executor="a")) == 1


def test_the_ager_on_postgresql_never_waits_for_a_chain_a_writer_holds(
    pg_store_url: str,
) -> None:
    clock = MovableClock()
    with Mnestoma(pg_store_url, clock=clock) as store:
        turn(store, "held", "a", "b", "c")
        turn(store, "free", "x", "y", "z")
        clock.advance(days=200)  # both faded
        writer = create_engine(pg_store_url)
        with writer.connect() as conn:
            conn.execute(
                text(
                    "SELECT 1 FROM mnest_chains WHERE prev_executor = 'a' AND src_executor = 'b'"
                    " AND dst_executor = 'c' FOR UPDATE"
                )
            )
            done: list[str] = []

            def run_both_ways() -> None:
                store.apply_ager(batch_rows=1)
                with store.unit_of_work() as unit:
                    unit.mnests.apply_ager()
                    unit.commit()
                done.append("ran")

            ager = threading.Thread(target=run_both_ways)
            ager.start()
            ager.join(timeout=30)
            ended_while_held = not ager.is_alive()
            held_meanwhile = set(chains(pg_store_url))
            conn.rollback()
        ager.join(timeout=30)
        writer.dispose()
        assert ended_while_held and done == ["ran"]
        assert held_meanwhile == {("a", "b", "c")}  # skipped while held, the other forgotten
        store.apply_ager()
    assert chains(pg_store_url) == {}


def test_turns_that_refresh_faded_chains_while_the_ager_forgets_them_keep_them(
    store_url: str,
) -> None:
    """Writers count chains that have faded while a run of the ager forgets them, a chain a
    batch: every chain a writer counted is there after (kept, or counted anew), every other
    faded chain is gone, no call failed."""
    clock = MovableClock()
    with Mnestoma(store_url, clock=clock) as store:
        for i in range(24):
            turn(store, f"old-{i}", f"p{i}", "m", f"n{i}")
    clock.advance(days=170)
    failures: list[BaseException] = []

    def write(first: int) -> None:
        try:
            with Mnestoma(store_url, clock=clock) as writer:
                for i in range(first, 12, 2):
                    turn(writer, f"new-{i}", f"p{i}", "m", f"n{i}")
        except BaseException as err:  # every failure is the test's
            failures.append(err)

    def age() -> None:
        try:
            with Mnestoma(store_url, clock=clock) as ager:
                ager.apply_ager(batch_rows=1)
        except BaseException as err:
            failures.append(err)

    writers = [threading.Thread(target=write, args=(first,)) for first in (0, 1)]
    threads = [threading.Thread(target=age), *writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and failures == []
    with Mnestoma(store_url, clock=clock) as store:
        store.apply_ager()  # what the racing run did not see, this one does
    assert set(chains(store_url)) == {(f"p{i}", "m", f"n{i}") for i in range(12)}
    check_invariants(store_url)


# --- retention --------------------------------------------------------------------------------


def test_pruning_every_event_leaves_the_chains_and_predict_next_as_they_were(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    for i in range(3):
        turn(store, f"t{i}", "a", "b", "c")
        clock.advance(hours=1)
    turn(store, "u", "a", "b", "d")
    clock.advance(days=2)
    before, forecast = chains(store_url), store.predict_next(["a", "b"])
    assert forecast.used.value == "chain"
    assert store.prune_events(clock.now + timedelta(seconds=1)) > 0
    assert [e.kind for e in store.events()] == ["created"] * len(store.edges())
    assert chains(store_url) == before
    assert store.predict_next(["a", "b"]) == forecast


# --- copy ---------------------------------------------------------------------------------------


def _copy_fill(url: str, clock: MovableClock, prefix: str) -> None:
    with Mnestoma(url, clock=clock) as store:
        turn(store, f"{prefix}-1", "a", "b", "c")
        clock.advance(days=10)
        turn(store, f"{prefix}-2", "a", "b", "c")
        turn(store, f"{prefix}-own", f"{prefix}.x", "b", "c")  # a chain of its own


def test_copy_carries_every_chain_as_it_is(two_stores: tuple[str, str]) -> None:
    source, target = two_stores
    _copy_fill(source, MovableClock(), "s")
    report = copy_store(source, target)
    assert chains(target) == chains(source)
    assert report.rows["mnest_chains"] == 2 and report.chains_merged == 0
    at = MovableClock()
    with Mnestoma(source, clock=at) as a, Mnestoma(target, clock=at) as b:
        assert a.predict_next(["a", "b"]) == b.predict_next(["a", "b"])
    check_invariants(target)


def test_copy_append_merges_the_chains_both_stores_hold_and_adds_the_others(
    two_stores: tuple[str, str],
) -> None:
    source, target = two_stores
    clock = MovableClock()
    _copy_fill(target, clock, "t")
    clock.advance(days=30)
    _copy_fill(source, clock, "s")  # (a, b, c) later in the source
    src, dst = chains(source), chains(target)
    report = copy_store(source, target, append=True)
    after = chains(target)
    assert set(after) == {("a", "b", "c"), ("t.x", "b", "c"), ("s.x", "b", "c")}
    assert (report.chains_merged, report.rows["mnest_chains"]) == (1, 2)
    assert after[("t.x", "b", "c")] == dst[("t.x", "b", "c")]
    assert after[("s.x", "b", "c")] == src[("s.x", "b", "c")]
    s, t, merged = src[("a", "b", "c")], dst[("a", "b", "c")], after[("a", "b", "c")]
    lam = rules.CHAIN_DECAY_LAMBDA
    count, last = rules.merged_count(
        (t["decayed_uses"], lam, t["ts_last"]), (s["decayed_uses"], lam, s["ts_last"])
    )
    assert merged["decayed_uses"] == pytest.approx(count, rel=1e-12)
    assert merged["decayed_uses"] == pytest.approx(
        t["decayed_uses"] * math.exp(-lam * 40) + s["decayed_uses"], rel=1e-9
    )
    assert merged["uses"] == s["uses"] + t["uses"] == 4
    assert (
        (merged["ts_first"], merged["ts_last"])
        == (t["ts_first"], last)
        == (
            t["ts_first"],
            s["ts_last"],
        )
    )
    check_invariants(target)


def test_copy_append_counts_a_turn_both_stores_counted_twice_in_its_chains(
    two_stores: tuple[str, str],
) -> None:
    """The edges count a shared turn once; a turn's events keep no order, so its chains
    cannot be told apart and are added twice (docs/operations.md)."""
    source, target = two_stores
    clock = MovableClock()
    for url in (source, target):
        with Mnestoma(url, clock=clock) as store:
            turn(store, "shared", "a", "b", "c")
    report = copy_store(source, target, append=True)
    assert report.turns_counted_once == 2
    with Mnestoma(target) as store:
        assert {e.uses for e in store.edges()} == {1}
    assert chains(target)[("a", "b", "c")]["uses"] == 2


def test_copy_append_into_a_store_without_chains_inserts_them(
    two_stores: tuple[str, str],
) -> None:
    source, target = two_stores
    clock = MovableClock()
    _copy_fill(source, clock, "s")
    with Mnestoma(target, clock=clock) as store:
        store.record_passing("lone", "1", "edge", "1")  # rows, but no chain
    report = copy_store(source, target, append=True)
    assert chains(target) == chains(source) and report.chains_merged == 0


# --- the graph ----------------------------------------------------------------------------------


def test_the_graph_lists_the_chains_whose_two_links_it_shows(
    store: Mnestoma, clock: MovableClock
) -> None:
    turn(store, "t1", "a", "b", "c", "d")
    turn(store, "t2", "a", "b", "c")
    clock.advance(days=10)
    whole = store.graph()
    assert [(c.prev, c.src, c.dst, c.uses) for c in whole.chains] == [
        ("a", "b", "c", 2),
        ("b", "c", "d", 1),
    ]
    assert whole.chains[0].decayed_uses == pytest.approx(2 * math.exp(-0.18), rel=1e-9)
    assert [(c.prev, c.src, c.dst) for c in store.graph("b", depth=2).chains] == [("b", "c", "d")]
    assert store.graph("c", depth=1).chains == ()  # one link shown: no chain
    assert store.graph(states=["decaying"]).chains == ()


def test_the_text_pictures_say_how_many_chains_and_networkx_lists_them(
    store: Mnestoma,
) -> None:
    store.record_passing("lone", "1", "edge", "1")
    assert "chain" not in render(store.graph(), "dot") + render(store.graph(), "mermaid")
    turn(store, "t1", "a", "b", "c")
    graph = store.graph()
    assert "  // 1 chain among these edges" in render(graph, "dot")
    assert "    %% 1 chain among these edges" in render(graph, "mermaid")
    assert "chain" not in render(graph, "json")
    g = store.to_networkx()
    assert [(c["prev"], c["src"], c["dst"], c["uses"]) for c in g.graph["chains"]] == [
        ("a", "b", "c", 1)
    ]
    assert set(g.graph["chains"][0]) == {
        "prev",
        "src",
        "dst",
        "decayed_uses",
        "uses",
        "ts_first",
        "ts_last",
    }


# --- the invariant checker and the testing kit --------------------------------------------------


def test_the_invariant_checker_refuses_a_chain_counted_above_its_uses(
    store: Mnestoma, store_url: str
) -> None:
    turn(store, "t", "a", "b", "c")
    check_invariants(store_url)
    engine = make_engine(store_url)
    with engine.begin() as conn:
        conn.execute(update(CHAINS).values(decayed_uses=5.0))
    engine.dispose()
    with pytest.raises(AssertionError, match=r"chain \('a', 'b', 'c'\): decayed_uses 5.0 above"):
        check_invariants(store_url)


def test_the_chain_factory_makes_chains_the_ager_keeps_or_forgets(
    mnestoma_session: Session, mnestoma_uow: Any
) -> None:
    kept, faded = MnestChainFactory(), MnestChainFactory(faded=True)
    assert kept.uses == 2 and kept.ts_first < kept.ts_last
    assert faded.decayed_uses == 1.0
    mnestoma_session.flush()
    mnestoma_uow.mnests.apply_ager()
    left = mnestoma_session.scalars(select(MnestChain.src_executor)).all()
    assert left == [kept.src_executor]
