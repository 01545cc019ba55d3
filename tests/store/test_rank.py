"""The planner's door: rank() and suggest_next() share one ordering (contract §9).

Effective weight first; its ties broken by the ACT-R base-level activation of
:func:`mnestoma.rules.activation`; candidates without an active edge last, in the order given.
"""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from mnestoma import InvalidInput, Mnestoma, Passing, UnitOfWork, make_session_factory
from mnestoma.cli import cli
from mnestoma.core.rules import ACTIVATION_DECAY, ACTIVATION_MIN_AGE_DAYS, activation, success_rate
from mnestoma.planner.ranking import (
    ORDER_BY,
    Ranked,
    check_order_by,
    edge_key,
    normalise_candidates,
    order_edges,
    rank_candidates,
)
from mnestoma.schema.models import Mnest

NOW = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)
PURE = settings(max_examples=300, deadline=None, derandomize=True)


def _ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def _edge(dst: str, *, uses: int, first: float, last: float, ident: str = "") -> Mnest:
    """A transient active edge a@1 → dst@1 whose first and last uses were days ago."""
    return Mnest(
        id=ident or f"mn_{dst}",
        src_executor="a",
        src_version="1",
        dst_executor=dst,
        dst_version="1",
        weight=1.0,
        uses=uses,
        ts_first=_ago(first),
        ts_last=_ago(last),
        ts_weight=_ago(last),
        decay_lambda=0.018,
        state="active",
    )


# --- the activation, a pure function ----------------------------------------------------------


def test_one_use_a_day_ago_has_activation_zero() -> None:
    assert activation(1, _ago(1), _ago(1), NOW) == pytest.approx(0.0, abs=1e-12)


def test_one_use_decays_as_a_power_of_its_age() -> None:
    for days in (0.5, 2.0, 30.0, 400.0):
        got = activation(1, _ago(days), _ago(days), NOW)
        assert got == pytest.approx(-ACTIVATION_DECAY * math.log(days))


def test_uses_at_one_instant_add_ln_n() -> None:
    assert activation(8, _ago(2), _ago(2), NOW) == pytest.approx(
        math.log(8) - ACTIVATION_DECAY * math.log(2)
    )


def test_the_hybrid_formula_in_numbers() -> None:
    # 8 uses over 10 days, the last one a day ago: ln(1 + 7·(√10 − 1)/(0.5·9))
    assert activation(8, _ago(10), _ago(1), NOW) == pytest.approx(
        math.log(1 + 7 * (math.sqrt(10) - 1) / 4.5)
    )


def test_ages_are_floored_at_one_minute() -> None:
    floor = ACTIVATION_MIN_AGE_DAYS
    just_now = activation(3, NOW, NOW, NOW)
    assert just_now == activation(3, _ago(floor / 2), _ago(floor / 2), NOW)
    assert just_now == pytest.approx(math.log(3) - ACTIVATION_DECAY * math.log(floor))
    assert math.isfinite(activation(1, NOW + timedelta(hours=1), NOW + timedelta(hours=1), NOW))


ages = st.floats(min_value=0.0, max_value=3650.0, allow_nan=False)
counts = st.integers(min_value=1, max_value=100_000)


@PURE
@given(uses=counts, a=ages, b=ages)
def test_activation_grows_with_every_use(uses: int, a: float, b: float) -> None:
    first, last = max(a, b), min(a, b)
    assert activation(uses + 1, _ago(first), _ago(last), NOW) > activation(
        uses, _ago(first), _ago(last), NOW
    )


@PURE
@given(uses=counts, first=ages, x=ages, y=ages)
def test_activation_grows_with_a_more_recent_last_use(
    uses: int, first: float, x: float, y: float
) -> None:
    recent, older = sorted((min(x, first), min(y, first)))
    assert activation(uses, _ago(first), _ago(recent), NOW) >= activation(
        uses, _ago(first), _ago(older), NOW
    )


@PURE
@given(uses=counts, a=ages, b=ages, wait=st.floats(min_value=0.0, max_value=3650.0))
def test_activation_fades_as_time_passes(uses: int, a: float, b: float, wait: float) -> None:
    first, last = max(a, b), min(a, b)
    later = NOW + timedelta(days=wait)
    assert activation(uses, _ago(first), _ago(last), later) <= activation(
        uses, _ago(first), _ago(last), NOW
    )


@PURE
@given(uses=st.integers(2, 10_000), last=ages, spread=st.floats(0.0, 1e-6))
def test_activation_is_continuous_where_the_lifetime_shrinks_to_the_last_use(
    uses: int, last: float, spread: float
) -> None:
    r = max(last, ACTIVATION_MIN_AGE_DAYS)
    limit = math.log(uses) - ACTIVATION_DECAY * math.log(r)
    got = activation(uses, _ago(last + spread), _ago(last), NOW)
    assert got == pytest.approx(limit, rel=1e-4, abs=1e-4)


# --- the ordering, a pure function ------------------------------------------------------------

edge_specs = st.tuples(
    st.floats(min_value=0.0, max_value=1.0),  # effective weight
    st.integers(min_value=1, max_value=50),  # uses
    ages,
    ages,
)


def _edges(specs: list[tuple[float, int, float, float]]) -> list[tuple[Mnest, float]]:
    out = []
    for i, (w, uses, a, b) in enumerate(specs):
        out.append((_edge(f"d{i}", uses=uses, first=max(a, b), last=min(a, b)), w))
    return out


@PURE
@given(specs=st.lists(edge_specs, min_size=2, max_size=8))
def test_a_higher_effective_weight_always_ranks_first(specs: list) -> None:
    ordered = order_edges(_edges(specs), NOW)
    weights = [w for _, w in ordered]
    assert weights == sorted(weights, reverse=True)


@PURE
@given(specs=st.lists(edge_specs, min_size=2, max_size=8), w=st.sampled_from([1.0, 0.3]))
def test_equal_weights_go_to_the_higher_activation(specs: list, w: float) -> None:
    ordered = order_edges([(m, w) for m, _ in _edges(specs)], NOW)
    acts = [activation(m.uses, m.ts_first, m.ts_last, NOW) for m, _ in ordered]
    assert acts == sorted(acts, reverse=True)


@PURE
@given(uses=st.lists(st.integers(1, 50), min_size=2, max_size=8, unique=True), a=ages, b=ages)
def test_equal_weight_and_equal_times_put_more_uses_first(
    uses: list[int], a: float, b: float
) -> None:
    """The old tie-break of suggest_next ("more uses first") still holds for equal recency."""
    first, last = max(a, b), min(a, b)
    edges = [(_edge(f"d{n}", uses=n, first=first, last=last), 1.0) for n in uses]
    ordered = order_edges(edges, NOW)
    assert [m.uses for m, _ in ordered] == sorted(uses, reverse=True)


@PURE
@given(
    specs=st.lists(
        st.tuples(st.sampled_from([1.0, 0.5, 0.3]), st.integers(1, 9), ages, ages),
        min_size=1,
        max_size=12,
    )
)
def test_order_edges_is_one_sort_by_edge_key(specs: list) -> None:
    """The shortcut that skips activations where weights differ changes no order."""
    edges = _edges(specs)
    assert order_edges(edges, NOW) == sorted(edges, key=lambda e: edge_key(e[0], e[1], NOW))


def test_the_order_is_total_and_never_depends_on_the_given_order() -> None:
    same = [_edge(d, uses=3, first=5, last=1) for d in ("c", "a", "b")]
    for shuffled in (same, same[::-1], same[1:] + same[:1]):
        assert [m.dst_executor for m, _ in order_edges([(m, 0.5) for m in shuffled], NOW)] == [
            "a",
            "b",
            "c",
        ]


# --- rank on both engines ---------------------------------------------------------------------


def _saturate(store: Mnestoma, dst: str, times: int) -> None:
    for _ in range(times):
        store.record_passing("a", "1", dst, "1")


def test_rank_orders_candidates_by_effective_weight_then_the_rest_as_given(
    store: Mnestoma, clock
) -> None:
    store.record_passing("a", "1", "weak", "1")  # 0.30
    _saturate(store, "strong", 3)  # 0.60
    store.record_passing("a", "1", "wish", dst_exists=False)  # a proto never ranks
    got = store.rank("a", ["zeta", "weak", "wish", "strong", "alpha"])
    assert [r.candidate for r in got] == ["strong", "weak", "zeta", "wish", "alpha"]
    assert [r.score for r in got] == pytest.approx([0.60, 0.30, 0.0, 0.0, 0.0])
    assert [r.mnest is None for r in got] == [False, False, True, True, True]


def test_ranked_says_what_it_scored_and_why(store: Mnestoma, clock) -> None:
    _saturate(store, "b", 2)  # 0.45
    clock.advance(days=3)
    [hit, miss] = store.rank("a", ["b", "c"])
    assert isinstance(hit, Ranked)
    assert hit.weight == hit.score == pytest.approx(0.45 * math.exp(-0.018 * 3))
    assert hit.activation == pytest.approx(
        activation(2, hit.mnest.ts_first, clock.now - timedelta(days=3), clock.now)
    )
    assert hit.mnest.id == hit.mnest_id and hit.mnest.uses == 2
    assert (hit.executor, hit.version) == ("b", "1")
    assert "a@1 -> b@1" in hit.reason and "2 uses" in hit.reason and "3.0 days ago" in hit.reason
    assert (miss.weight, miss.activation, miss.mnest, miss.version) == (0.0, None, None, None)
    assert "no active edge a -> c" in miss.reason
    assert json.loads(json.dumps(hit.as_dict()))["mnest_id"] == hit.mnest_id


def test_saturated_edges_reinforced_in_one_turn_tie_and_more_uses_win(
    store: Mnestoma, clock
) -> None:
    """The common tie: both at 1.0, reinforced at the same instant; the older habit wins."""
    for i in range(10):
        clock.advance(hours=2)
        turn = [Passing("a", "1", "x", "1")]
        if i >= 4:
            turn.append(Passing("a", "1", "y", "1"))
        store.record_turn(f"t{i}", turn)
    clock.advance(days=2)
    x = store.find("a", "1", "x", "1")
    y = store.find("a", "1", "y", "1")
    assert (x.weight, y.weight, x.ts_weight) == (1.0, 1.0, y.ts_weight)
    got = store.rank("a", ["y", "x"])
    assert got[0].score == got[1].score
    assert [r.candidate for r in got] == ["x", "y"]
    assert got[0].activation > got[1].activation
    assert [m.dst_executor for m, _ in store.suggest_next("a")] == ["x", "y"]


def _no_decay(store: Mnestoma) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE mnests SET decay_lambda = 0"))


def test_equal_weights_rank_the_recently_used_edge_first(store: Mnestoma, clock) -> None:
    _saturate(store, "old", 8)  # 1.0, used eight times a month ago
    clock.advance(days=30)
    _saturate(store, "new", 6)  # 1.0, six uses just now
    _no_decay(store)  # weights that never fade: every saturated edge ties at 1.0
    clock.advance(hours=1)
    got = store.rank("a", ["old", "new"])
    assert [r.score for r in got] == [1.0, 1.0]
    assert [r.candidate for r in got] == ["new", "old"]
    # suggest_next breaks the tie the same way, even at the k-th place (SQL alone would
    # have kept "more uses first" and returned "old")
    assert [m.dst_executor for m, _ in store.suggest_next("a", k=1)] == ["new"]


def test_rank_takes_versions_from_pairs_and_the_best_version_for_a_name(
    store: Mnestoma, clock
) -> None:
    store.record_passing("a", "1", "b", "1")  # 0.30
    for _ in range(2):
        store.record_passing("a", "1", "b", "2")  # 0.45
    got = store.rank("a", [("b", "1"), "b", ("b", "9")])
    assert [(r.candidate, r.version) for r in got] == [
        ("b", "2"),
        (("b", "1"), "1"),
        (("b", "9"), "9"),
    ]
    assert got[0].score == pytest.approx(0.45) and got[1].score == pytest.approx(0.30)


def test_rank_reads_only_the_given_source_version(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "2", "c", "1")
    got = store.rank("a", ["b", "c"], src_version="2")
    assert [(r.candidate, r.mnest is not None) for r in got] == [("c", True), ("b", False)]
    assert all(r.mnest is not None for r in store.rank("a", ["b", "c"]))


def test_only_active_edges_rank(store: Mnestoma) -> None:
    store.record_passing("a", "1", "wish", dst_exists=False)
    gone = store.record_passing("a", "1", "gone", "1")
    store.transition_state(gone.id, "superseded")
    fading = store.record_passing("a", "1", "fading", "1")
    store.transition_state(fading.id, "decaying")
    assert all(r.mnest is None for r in store.rank("a", ["wish", "gone", "fading"]))


def test_rank_of_nothing_is_nothing_and_a_generator_is_read_once(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    assert store.rank("a", []) == []
    assert [r.candidate for r in store.rank("a", (c for c in ["x", "b"]))] == ["b", "x"]


def test_rank_reads_a_whole_catalog_in_chunks(store: Mnestoma) -> None:
    store.record_turn("t", [Passing("a", "1", f"tool{i}", "1") for i in (17, 600, 1100)])
    store.record_passing("a", "1", "tool600", "1")
    catalog = [f"tool{i}" for i in range(1200)]
    got = store.rank("a", catalog)
    assert [r.candidate for r in got[:3]] == ["tool600", "tool1100", "tool17"]
    top = {"tool600", "tool1100", "tool17"}
    assert [r.candidate for r in got[3:]] == [c for c in catalog if c not in top]


# --- success: the outcomes of what followed (contract §11) ----------------------------------


def _passings(store: Mnestoma, dst: str, *outcomes: str | None) -> None:
    for outcome in outcomes:
        store.record_passing("a", "1", dst, "1", outcome=outcome)


def test_ranked_carries_the_success_of_its_edges_outcomes(store: Mnestoma) -> None:
    _passings(store, "b", "ok", "ok", "error", "ok", None)
    [hit, miss] = store.rank("a", ["b", "c"])
    assert (hit.mnest.ok_count, hit.mnest.error_count) == (3, 1)  # type: ignore[union-attr]
    assert hit.success == success_rate(3, 1) == pytest.approx(4 / 6)
    assert "3 ok, 1 error: success 0.667" in hit.reason
    assert miss.success == success_rate(0, 0) == 0.5
    data = json.loads(json.dumps(hit.as_dict()))
    assert data["success"] == hit.success
    assert list(data) == [
        "candidate",
        "executor",
        "version",
        "score",
        "weight",
        "activation",
        "success",
        "mnest_id",
        "reason",
        "decayed_uses",
        "p",
        "context",
    ]


def test_an_edge_without_outcomes_has_an_even_success_and_no_word_of_them(
    store: Mnestoma,
) -> None:
    _passings(store, "b", None, None)
    [hit] = store.rank("a", ["b"])
    assert hit.success == 0.5 and " ok" not in hit.reason


def test_outcomes_change_neither_the_weight_nor_the_default_order(store: Mnestoma) -> None:
    _passings(store, "failing", "error", "error", "error")  # 0.60, success 0.2
    _passings(store, "fine", "ok", "ok")  # 0.45, success 0.75
    _passings(store, "plain", None, None)  # 0.45, success 0.5
    got = store.rank("a", ["fine", "plain", "failing"])
    assert [r.candidate for r in got] == ["failing", "fine", "plain"]
    assert [r.weight for r in got] == pytest.approx([0.60, 0.45, 0.45])
    again = store.rank("a", ["fine", "plain", "failing"], order_by="weight")
    assert [r.as_dict() for r in again] == [r.as_dict() for r in got]


def test_rank_by_success_puts_the_likeliest_to_succeed_first_then_the_weights_order(
    store: Mnestoma,
) -> None:
    _passings(store, "failing", "error", "error", "error")  # 0.60, success 0.2
    _passings(store, "fine", "ok", "ok")  # 0.45, success 0.75
    _passings(store, "plain", None, None, None)  # 0.60, success 0.5
    _passings(store, "once", "ok")  # 0.30, success 0.667
    catalog = ["new", "failing", "plain", "once", "fine"]
    by_weight = [r.candidate for r in store.rank("a", catalog)]
    assert by_weight == ["failing", "plain", "fine", "once", "new"]
    got = store.rank("a", catalog, order_by="success")
    # a candidate never seen (success 0.5) ties with "plain" and keeps its place after it
    assert [r.candidate for r in got] == ["fine", "once", "plain", "new", "failing"]
    assert [r.success for r in got] == pytest.approx([0.75, 2 / 3, 0.5, 0.5, 0.2])


def test_rank_candidates_orders_by_success_on_request_only() -> None:
    def edge(dst: str, ok: int, error: int, weight: float) -> tuple[Mnest, float]:
        m = _edge(dst, uses=ok + error, first=1, last=1)
        m.ok_count, m.error_count = ok, error
        return m, weight

    edges = [edge("b", 0, 4, 0.9), edge("c", 4, 0, 0.5), edge("d", 1, 1, 0.7)]
    wanted = normalise_candidates(["b", "c", "d"])
    by_weight = rank_candidates("a", wanted, edges, NOW)
    assert [r.candidate for r in by_weight] == ["b", "d", "c"]
    assert rank_candidates("a", wanted, edges, NOW, order_by="weight") == by_weight
    by_success = rank_candidates("a", wanted, edges, NOW, order_by="success")
    assert [r.candidate for r in by_success] == ["c", "d", "b"]


def test_check_order_by_takes_weight_success_decayed_uses_or_p_only() -> None:
    assert [check_order_by(v) for v in ORDER_BY] == ["weight", "success", "decayed_uses", "p"]
    for bad in ("Weight", "uses", "", None, 1, ("weight",)):
        with pytest.raises(InvalidInput):
            check_order_by(bad)


def test_rank_refuses_an_unknown_order(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    with pytest.raises(InvalidInput, match="unknown order"):
        store.rank("a", ["b"], order_by="uses")


@pytest.mark.parametrize(
    "candidates",
    [
        "b",
        b"b",
        3,
        None,
        [""],
        ["  "],
        ["x\x00"],
        [("b",)],
        [("b", 1)],
        [1],
        ["b", "b"],
        [("b", "1"), ["b", "1"]],
    ],
    ids=repr,
)
def test_rank_refuses_bad_candidates(store: Mnestoma, candidates: Any) -> None:
    with pytest.raises(InvalidInput):
        store.rank("a", candidates)


def test_rank_refuses_a_bad_source(store: Mnestoma) -> None:
    with pytest.raises(InvalidInput):
        store.rank("", ["b"])
    with pytest.raises(InvalidInput):
        store.rank("a", ["b"], src_version="")


def test_the_repository_ranks_in_a_unit_of_work(store: Mnestoma, clock) -> None:
    store.record_passing("a", "1", "b", "1")
    with UnitOfWork(make_session_factory(store.engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "c", "1")
        uow.mnests.record_passing("a", "1", "c", "1")
        got = uow.mnests.rank("a", ["b", "c", "d"])
        assert [r.candidate for r in got] == ["c", "b", "d"]


def test_rank_and_suggest_next_never_disagree(store: Mnestoma, clock) -> None:
    """A seeded random history with many ties: both doors give one order."""
    rng = random.Random(15)
    names = [f"t{i:02d}" for i in range(12)]
    for turn in range(60):
        clock.advance(hours=rng.choice([0, 0, 1, 7, 30]))
        picks = rng.sample(names, rng.randint(1, 4))
        store.record_turn(f"turn{turn}", [Passing("a", "1", d, "1") for d in picks])
    if store.engine.dialect.name == "sqlite":
        _no_decay(store)  # and on one engine, nothing fades: more ties at 1.0
    clock.advance(days=1)
    suggested = [m.dst_executor for m, _ in store.suggest_next("a", k=len(names))]
    shuffled = names[:]
    rng.shuffle(shuffled)
    ranked = [r.candidate for r in store.rank("a", shuffled)]
    assert ranked[: len(suggested)] == suggested
    for k in (1, 3, 5):
        assert [m.dst_executor for m, _ in store.suggest_next("a", k=k)] == suggested[:k]
    weights = [w for _, w in store.suggest_next("a", k=len(names))]
    assert weights == sorted(weights, reverse=True)
    assert len(set(weights)) < len(weights)  # the history did produce ties


# --- the command line -------------------------------------------------------------------------


def test_suggest_shows_the_score_and_the_activation(store_url: str, clock) -> None:
    m = Mnestoma(store_url, clock=clock)
    for _ in range(3):
        m.record_passing("a", "1", "b", "1")
    m.record_passing("a", "1", "c", "1")
    m.close()
    runner = CliRunner()
    table = runner.invoke(cli, ["suggest", "a@1", "--database-url", store_url])
    assert table.exit_code == 0, table.output
    header = table.output.splitlines()[0].split()
    assert header[:4] == ["RANK", "NEXT", "SCORE", "ACTIVATION"]
    out = runner.invoke(cli, ["suggest", "a", "--json", "--database-url", store_url])
    rows = json.loads(out.output)
    assert [r["dst_executor"] for r in rows] == ["b", "c"]
    for r in rows:
        assert r["score"] == r["effective_weight"]
        assert isinstance(r["activation"], float)
    assert rows[0]["uses"] == 3 and rows[1]["uses"] == 1
