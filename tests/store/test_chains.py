"""Chains as context, and a probability with its evidence (contract §13), on both engines and
through every door that records a turn."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest
from conftest import package_engine
from otel_kit import Setup, otel_setup  # noqa: F401  (the setup fixture)
from sqlalchemy import select

import mnestoma
from mnestoma import InvalidInput
from mnestoma.core.rules import (
    CHAIN_DECAY_LAMBDA,
    CHAIN_MIN_SUPPORT,
    UNSEEN_SUCCESSORS,
    ContextUsed,
)
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.recording.otel import MnestomaSpanProcessor
from mnestoma.recording.tracing import executor, turn
from mnestoma.schema.models import MnestChain
from mnestoma.testing.clock import MovableClock

V = "1"


def links(*calls: str) -> list[tuple[str, str, str, str]]:
    """The passings of a turn that called ``calls`` in order, each handing on to the next."""
    return [(a, V, b, V) for a, b in itertools.pairwise(calls)]


def chains_of(url: str) -> dict[tuple[str, str, str], tuple[float, int]]:
    """Every chain of the store: (prev, src, dst) → (decayed_uses, uses)."""
    with package_engine(url) as engine, engine.connect() as conn:
        rows = conn.execute(select(MnestChain.__table__)).all()
    return {
        (r.prev_executor, r.src_executor, r.dst_executor): (r.decayed_uses, r.uses) for r in rows
    }


def total(f: mnestoma.Forecast) -> float:
    return math.fsum([c.p for c in f.candidates] + [f.unseen])


# --- what a turn counts -------------------------------------------------------------------------


def test_each_pair_of_consecutive_links_counts_one_chain(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    store.record_turn("t", links("plan", "search", "read", "search", "read"))
    assert chains_of(store_url) == {
        ("plan", "search", "read"): (1.0, 1),
        ("search", "read", "search"): (1.0, 1),
        ("read", "search", "read"): (1.0, 1),
    }


def test_a_retried_turn_adds_no_chain_and_a_continued_one_only_its_new_chains(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    store.record_turn("t", links("plan", "search", "read"))
    store.record_turn("t", links("plan", "search", "read"))  # a retry
    assert chains_of(store_url) == {("plan", "search", "read"): (1.0, 1)}
    store.record_turn("t", links("plan", "search", "read", "summarise"))  # seen further
    assert chains_of(store_url) == {
        ("plan", "search", "read"): (1.0, 1),
        ("search", "read", "summarise"): (1.0, 1),
    }


def test_repeats_in_a_turn_count_each_chain_as_often(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    store.record_turn("t", links("search", "read", "search", "read", "search", "read"))
    found = chains_of(store_url)
    assert found[("search", "read", "search")] == (2.0, 2)
    assert found[("read", "search", "read")] == (2.0, 2)


def test_a_link_follows_the_latest_link_that_reached_its_source(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    # plan fans out to search and to fetch; fetch's output then goes to read: read's chain
    # comes through plan -> fetch, the link that brought the turn to fetch
    store.record_turn(
        "t",
        [("plan", V, "search", V), ("plan", V, "fetch", V), ("fetch", V, "read", V)],
    )
    assert chains_of(store_url) == {("plan", "fetch", "read"): (1.0, 1)}


def test_links_to_protos_make_no_chain(store: mnestoma.Mnestoma, store_url: str) -> None:
    store.record_turn(
        "t",
        [
            mnestoma.Passing("plan", V, "search", V),
            mnestoma.Passing("search", V, "ocr", None, dst_exists=False),
            mnestoma.Passing("search", V, "read", V),
        ],
    )
    assert chains_of(store_url) == {("plan", "search", "read"): (1.0, 1)}


def test_a_chain_fades_with_the_weights_lambda_and_counts_again(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_turn("t1", links("plan", "search", "read"))
    clock.advance(days=10)
    store.record_turn("t2", links("plan", "search", "read"))
    count, uses = chains_of(store_url)[("plan", "search", "read")]
    assert CHAIN_DECAY_LAMBDA == 0.018
    assert count == pytest.approx(math.exp(-0.018 * 10) + 1.0, rel=1e-9) and uses == 2
    clock.advance(days=5)
    f = store.predict_next(["plan", "search"])
    assert f.support == pytest.approx(count * math.exp(-0.018 * 5), rel=1e-9)


# --- every door that records a turn -------------------------------------------------------------


def test_units_of_work_and_a_joined_session_count_chains(
    store_url: str, clock: MovableClock
) -> None:
    with package_engine(store_url) as engine:
        sessions = mnestoma.make_session_factory(engine)
        with mnestoma.UnitOfWork(sessions, clock=clock) as uow:
            uow.mnests.record_turn("u", links("plan", "search", "read"))
            uow.commit()
        with sessions() as session:
            with mnestoma.UnitOfWork.joining(session, clock=clock) as uow:
                uow.mnests.record_turn("j", links("plan", "search", "read"))
                uow.mnests.record_turn("j", links("plan", "search", "read"))  # a retry
                uow.commit()
            session.commit()
        with mnestoma.UnitOfWork(sessions, clock=clock) as uow:
            uow.mnests.record_turn("rolled back", links("plan", "search", "read"))
            uow.rollback()
    assert chains_of(store_url) == {("plan", "search", "read"): (2.0, 2)}


def test_the_async_door_counts_chains_and_predicts_as_the_sync_one(
    store_url: str, clock: MovableClock
) -> None:
    async def go() -> tuple[mnestoma.Forecast, list[str]]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.record_turn("a1", links("plan", "search", "read"))
            await am.record_turn("a1", links("plan", "search", "read"))  # a retry
            await am.record_turn("a2", links("plan", "search", "fetch"))
            f = await am.predict_next(["plan", "search"])
            ranked = await am.rank("search", ["fetch", "read"], order_by="p", prev="plan")
            return f, [r.executor for r in ranked]

    f, ranked = asyncio.run(go())
    assert chains_of(store_url) == {
        ("plan", "search", "read"): (1.0, 1),
        ("plan", "search", "fetch"): (1.0, 1),
    }
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        assert m.predict_next(["plan", "search"]) == f
    assert f.used is ContextUsed.CHAIN and ranked == ["fetch", "read"]  # equal p: weight's order


@executor("plan", V)
def plan(goal: str) -> list[str]:
    return [f"query for {goal}"]


@executor("search", V)
def search(query: str) -> list[str]:
    return [f"/docs/found-by-{query}.pdf"]


@executor("read", V)
def read(path: str) -> str:
    return f"contents of {path}"


def test_the_tracer_feeds_chains_like_record_turn(store: mnestoma.Mnestoma, store_url: str) -> None:
    for _ in range(2):  # the same turn delivered again adds nothing
        with turn(store, "traced"):
            read(search(plan("a goal")[0])[0])
    assert chains_of(store_url) == {("plan", "search", "read"): (1.0, 1)}
    assert store.predict_next(["plan", "search"]).top.executor == "read"  # type: ignore[union-attr]


def test_the_otel_processor_feeds_chains_like_record_turn(
    setup: Setup, store: mnestoma.Mnestoma, store_url: str
) -> None:
    processor, tracer = setup(store)
    attrs = {"gen_ai.operation.name": "execute_tool"}
    calls = (
        ("fs.search", '{"q": "pdf"}', '["a/report.pdf"]'),
        ("fs.read", '{"path": "a/report.pdf"}', '"the text of the report"'),
        ("pdf.text", '{"text": "the text of the report"}', '"done"'),
    )
    with tracer.start_as_current_span("turn"):
        for name, arguments, result in calls:
            with tracer.start_as_current_span(
                f"execute_tool {name}",
                attributes={
                    **attrs,
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.arguments": arguments,
                    "gen_ai.tool.call.result": result,
                },
            ):
                pass
    assert isinstance(processor, MnestomaSpanProcessor) and processor.force_flush(10_000)
    assert chains_of(store_url) == {("fs.search", "fs.read", "pdf.text"): (1.0, 1)}


# --- the probability -----------------------------------------------------------------------------


def test_the_edge_alone_is_witten_bell_smoothed(store: mnestoma.Mnestoma) -> None:
    for i in range(3):
        store.record_turn(f"r{i}", links("search", "read"))
    store.record_turn("f", links("search", "fetch"))
    f = store.predict_next("search")
    # N = 4 passings, T = 2 distinct successors: read 3/6, fetch 1/6, unseen 2/6
    assert f.used is ContextUsed.EDGE and f.context == ("search",)
    assert [(c.executor, c.uses) for c in f.candidates] == [("read", 3), ("fetch", 1)]
    assert [c.p for c in f.candidates] == pytest.approx([3 / 6, 1 / 6], rel=1e-6)
    assert f.unseen == pytest.approx(2 / 6, rel=1e-6) and f.support == pytest.approx(4.0)
    assert total(f) == pytest.approx(1.0, abs=1e-12)
    assert f.p("never-seen") == pytest.approx(f.unseen / UNSEEN_SUCCESSORS)


def test_the_chain_is_interpolated_with_the_edge(store: mnestoma.Mnestoma) -> None:
    store.record_turn("a", links("plan", "search", "read"))
    store.record_turn("b", links("plan", "search", "read"))
    store.record_turn("c", links("index", "search", "fetch"))
    store.record_turn("d", links("index", "search", "fetch"))
    f = store.predict_next(["plan", "search"])
    # edge: read 2/6, fetch 2/6, unseen 2/6; chain plan->search: read 2, T = 1:
    # read (2 + 1·2/6)/3, fetch (1·2/6)/3, unseen (1·2/6)/3
    assert f.used is ContextUsed.CHAIN and f.context == ("plan", "search")
    assert [c.executor for c in f.candidates] == ["read", "fetch"]
    assert [c.p for c in f.candidates] == pytest.approx([(2 + 1 / 3) / 3, (1 / 3) / 3], rel=1e-6)
    assert [c.support for c in f.candidates] == pytest.approx([2.0, 0.0])
    assert f.unseen == pytest.approx((1 / 3) / 3, rel=1e-6)
    assert total(f) == pytest.approx(1.0, abs=1e-12)
    assert all(0.0 < c.p < 1.0 for c in f.candidates)


def test_a_chain_with_too_little_evidence_falls_back_to_the_edge(
    store: mnestoma.Mnestoma, clock: MovableClock
) -> None:
    store.record_turn("old", links("plan", "search", "fetch"))
    # one passing fades below CHAIN_MIN_SUPPORT after ln(1/0.5)/0.018 ≈ 38.5 days
    clock.advance(days=math.log(1 / CHAIN_MIN_SUPPORT) / CHAIN_DECAY_LAMBDA + 1)
    store.record_turn("new", links("index", "search", "read"))
    f = store.predict_next(["plan", "search"])
    assert f.used is ContextUsed.EDGE and f.context == ("search",)
    assert total(f) == pytest.approx(1.0, abs=1e-12)
    unseen_chain = store.predict_next(["nobody", "search"])
    assert unseen_chain.used is ContextUsed.EDGE
    assert unseen_chain.candidates == f.candidates


def test_nothing_seen_after_the_context_leaves_every_candidate_unseen(
    store: mnestoma.Mnestoma,
) -> None:
    f = store.predict_next(["plan", "search"])
    assert f.used is ContextUsed.NONE and f.candidates == () and f.unseen == 1.0
    assert f.top is None and f.support == 0.0


def test_only_the_last_two_executors_are_read_and_k_cuts_the_list(
    store: mnestoma.Mnestoma,
) -> None:
    store.record_turn("a", links("plan", "search", "read"))
    store.record_turn("b", links("plan", "search", "fetch"))
    store.record_turn("c", links("plan", "search", "fetch"))
    whole = store.predict_next(["start", "goal", "plan", "search"])
    assert whole == store.predict_next(["plan", "search"])
    cut = store.predict_next(["plan", "search"], k=1)
    assert cut.candidates == whole.candidates[:1] and cut.unseen == whole.unseen


def test_a_version_narrows_the_edge_counts(store: mnestoma.Mnestoma) -> None:
    store.record_passing("search", "1", "read", "1")
    store.record_passing("search", "2", "fetch", "1")
    f = store.predict_next("search", src_version="2")
    assert [c.executor for c in f.candidates] == ["fetch"]


@pytest.mark.parametrize(
    ("context", "options"),
    [
        ([], {}),
        ("", {}),
        ([""], {}),
        ([1, "search"], {}),
        (b"search", {}),
        (None, {}),
        (["search"], {"k": 0}),
        (["search"], {"k": "3"}),
        (["search"], {"src_version": ""}),
    ],
)
def test_bad_input_to_predict_next_is_invalid_input(
    store: mnestoma.Mnestoma, context: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInput):
        store.predict_next(context, **options)


# --- rank and vet ---------------------------------------------------------------------------------


def test_rank_by_p_orders_by_the_probability_after_the_chain(store: mnestoma.Mnestoma) -> None:
    store.record_turn("a1", links("plan", "search", "read"))
    store.record_turn("a2", links("plan", "search", "read"))
    for i in range(3):
        store.record_turn(f"b{i}", links("index", "search", "fetch"))
    after_plan = store.rank("search", ["fetch", "read", "ocr"], order_by="p", prev="plan")
    assert [r.executor for r in after_plan] == ["read", "fetch", "ocr"]
    assert {r.context for r in after_plan} == {"chain"}
    forecast = store.predict_next(["plan", "search"])
    assert [r.p for r in after_plan] == [forecast.p("read"), forecast.p("fetch"), forecast.p("ocr")]
    alone = store.rank("search", ["fetch", "read"], order_by="p")
    assert [r.executor for r in alone] == ["fetch", "read"] and alone[0].context == "edge"
    assert store.rank("search", ["fetch"])[0].p is None  # other orders leave p unset
    with pytest.raises(InvalidInput, match="prev"):
        store.rank("search", ["fetch"], prev="plan")


def test_vet_scores_an_unseen_link_low_instead_of_zero(store: mnestoma.Mnestoma) -> None:
    for i in range(4):
        store.record_turn(f"t{i}", links("plan", "search", "read"))
    real = store.vet(["plan", "search", "read"])
    odd = store.vet(["plan", "search", "ocr"])
    assert odd.score == 0.0 and odd.unknown == (1,)  # the seed's score as before
    assert math.isfinite(odd.log_likelihood)
    assert real.log_likelihood > odd.log_likelihood
    first = store.predict_next("plan")
    second = store.predict_next(["plan", "search"])
    assert real.log_likelihood == pytest.approx(
        math.log(first.p("search")) + math.log(second.p("read")), rel=1e-12
    )
    assert [link.p for link in odd.links] == [first.p("search"), second.p("ocr")]


def test_a_clock_that_steps_back_adds_without_decay_and_never_moves_ts_last_back(
    store: mnestoma.Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_turn("t1", links("plan", "search", "read"))
    first = clock.now
    clock.advance(days=-3)
    store.record_turn("t2", links("plan", "search", "read"))
    assert chains_of(store_url)[("plan", "search", "read")] == (2.0, 2)
    clock.advance(days=3 + 400)  # a year and more: the count all but gone, not negative
    f = store.predict_next(["plan", "search"])
    assert f.used is ContextUsed.EDGE  # the chain's 2·e^(−0.018·400) ≈ 0.0015 < 0.5
    with package_engine(store_url) as engine, engine.connect() as conn:
        (ts_last,) = conn.execute(select(MnestChain.ts_last)).one()
    assert ts_last == first
