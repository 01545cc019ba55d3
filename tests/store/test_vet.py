"""The sieve's door (contract §11): ``vet`` says what the store knows of a proposed chain.

Per link: known (an active edge), the best matching row's effective weight, uses, outcome
counts, success, last use and state; for the chain: score, weakest link, unknown links. A
link never seen is unknown, not wrong.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterator
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run
from conftest import REPO
from sqlalchemy import event, insert

from mnestoma import InvalidInput, Mnestoma, UnitOfWork, make_session_factory
from mnestoma.core.rules import DEFAULT_DECAY_LAMBDA, new_mnest_id, success_rate, unseen_probability
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.planner.vetting import (
    MAX_VET_STEPS,
    MIN_VET_STEPS,
    LinkVerdict,
    Verdict,
    normalise_steps,
    vet_chain,
)
from mnestoma.recording.tracing import executor, turn
from mnestoma.schema.runner import runner_for
from mnestoma.schema.sql.tables import MNESTS
from mnestoma.testing.clock import MovableClock


@pytest.fixture
def statements(store: Mnestoma) -> Iterator[list[str]]:
    """Every statement the store's engine runs while the test does."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", count)


def _reads(statements: list[str]) -> list[str]:
    """The statements that read rows (a transaction's BEGIN and the like left out)."""
    return [s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))]


def _dump(store: Mnestoma) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row and event of the store, as plain values."""
    return [m.as_dict() for m in store.edges()], [e.as_dict() for e in store.events()]


def _effective(store: Mnestoma, mnest_id: str | None, clock: MovableClock) -> float:
    [m] = [m for m in store.edges() if m.id == mnest_id]
    return m.effective_weight(clock())


# --- known and unknown links ----------------------------------------------------------------


def test_a_chain_of_active_edges_is_known_and_scores_the_product_of_effective_weights(
    store: Mnestoma, clock: MovableClock
) -> None:
    ab = store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    bc = store.record_passing("b", "1", "c", "2")
    clock.advance(days=10)
    v = store.vet(["a", "b", "c"])
    assert isinstance(v, Verdict)
    assert [link.known for link in v.links] == [True, True]
    assert [link.mnest_id for link in v.links] == [ab.id, bc.id]
    weights = [_effective(store, ab.id, clock), _effective(store, bc.id, clock)]
    assert [link.weight for link in v.links] == pytest.approx(weights)
    assert weights[0] > weights[1]
    assert v.score == pytest.approx(weights[0] * weights[1])
    assert (v.weakest, v.unknown) == (1, ())
    first = v.links[0]
    assert (first.index, first.src_executor, first.dst_executor) == (0, "a", "b")
    assert (first.uses, first.state, first.last_seen) == (2, "active", clock() - timedelta(10))


def test_a_link_never_seen_is_unknown_with_no_weight_and_an_even_success(
    store: Mnestoma,
) -> None:
    store.record_passing("a", "1", "b", "1")
    v = store.vet(["a", "b", "never"])
    assert v.links[1] == LinkVerdict(
        1, "b", None, "never", None, False, 0.0, 0, 0, 0, success_rate(0, 0), None, None, None,
        p=unseen_probability(1.0),  # nothing ever followed b: all its mass is unseen
    )  # fmt: skip
    assert v.links[1].success == 0.5
    assert (v.score, v.weakest, v.unknown) == (0.0, 1, (1,))


def test_an_empty_store_knows_no_link_and_writes_nothing(store: Mnestoma) -> None:
    v = store.vet(["x", "y", "z"])
    assert v.unknown == (0, 1) and v.score == 0.0 and v.weakest == 0
    assert store.edges() == [] and store.events() == []


def test_a_decaying_link_reports_its_row_but_is_not_known(
    store: Mnestoma, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "1")
    fading = store.record_passing("b", "1", "c", "1")
    store.record_passing("b", "1", "c", "1")
    store.transition_state(fading.id, "decaying")
    clock.advance(days=3)
    v = store.vet(["a", "b", "c"])
    link = v.links[1]
    assert (link.known, link.state, link.mnest_id, link.uses) == (False, "decaying", fading.id, 2)
    # the weight of a row that is not active is its effective weight now, shown as evidence
    assert link.weight == pytest.approx(_effective(store, fading.id, clock))
    assert link.weight > 0
    # ... but it stands for nothing in the chain: score 0, the weakest link
    assert (v.score, v.weakest, v.unknown) == (0.0, 1, (1,))


def test_a_proto_matches_a_step_without_version_only_and_is_not_known(store: Mnestoma) -> None:
    wish = store.record_passing("a", "1", "pdf", dst_exists=False)
    v = store.vet([("a", "1"), "pdf"])
    assert (v.links[0].known, v.links[0].state, v.links[0].mnest_id) == (False, "proto", wish.id)
    assert v.links[0].weight == pytest.approx(0.30)
    versioned = store.vet([("a", "1"), ("pdf", "1")])
    assert (versioned.links[0].state, versioned.links[0].uses) == (None, 0)


def test_a_superseded_row_is_reported_when_nothing_better_matches(store: Mnestoma) -> None:
    old = store.record_passing("a", "1", "b", "1")
    store.transition_state(old.id, "superseded")
    link = store.vet(["a", "b"]).links[0]
    assert (link.known, link.state, link.mnest_id) == (False, "superseded", old.id)


def test_an_active_row_wins_over_a_stronger_row_in_another_state(store: Mnestoma) -> None:
    for _ in range(4):
        strong = store.record_passing("a", "1", "b", "1")
    store.transition_state(strong.id, "decaying")
    fresh = store.record_passing("a", "1", "b", "1")  # a new active row beside it
    assert fresh.id != strong.id and strong.weight > fresh.weight
    link = store.vet(["a", "b"]).links[0]
    assert (link.known, link.mnest_id, link.uses) == (True, fresh.id, 1)
    assert link.weight == pytest.approx(0.30)


# --- versions -------------------------------------------------------------------------------


def test_versions_given_pick_their_rows_and_a_step_without_one_takes_the_best_version(
    store: Mnestoma,
) -> None:
    strong = store.record_passing("a", "1", "b", "1")
    store.record_passing("a", "1", "b", "1")
    other = store.record_passing("a", "2", "b", "1")
    assert store.vet(["a", "b"]).links[0].mnest_id == strong.id
    assert store.vet([("a", "2"), "b"]).links[0].mnest_id == other.id
    assert store.vet([("a", "2"), ("b", "1")]).links[0].mnest_id == other.id
    assert store.vet(["a", ("b", "1")]).links[0].mnest_id == strong.id
    missing = store.vet([("a", "1"), ("b", "2")])
    assert missing.unknown == (0,) and missing.links[0].mnest_id is None
    # a link reports the steps as given: None where a step gives no version
    link = store.vet([("a", "2"), "b"]).links[0]
    assert (link.src_version, link.dst_version) == ("2", None)


def test_a_middle_step_with_a_version_binds_both_of_its_links(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "c", "1")
    store.record_passing("a", "1", "b", "2")
    store.record_passing("b", "2", "c", "1")
    for version in ("1", "2"):
        v = store.vet(["a", ("b", version), "c"])
        assert v.unknown == ()
        assert [m.dst_version for m in store.edges() if m.id == v.links[0].mnest_id] == [version]
        assert [m.src_version for m in store.edges() if m.id == v.links[1].mnest_id] == [version]
    assert store.vet(["a", ("b", "3"), "c"]).unknown == (0, 1)


def test_equal_weights_are_decided_by_more_uses(store: Mnestoma, clock: MovableClock) -> None:
    now = clock()
    rows = [
        {
            "id": new_mnest_id(),
            "src_executor": "a",
            "src_version": version,
            "dst_executor": "b",
            "dst_version": "1",
            "weight": 0.5,
            "uses": uses,
            "ts_first": now,
            "ts_last": now,
            "ts_weight": now,
            "decay_lambda": DEFAULT_DECAY_LAMBDA,
            "state": "active",
        }
        for version, uses in (("1", 2), ("2", 7), ("3", 4))
    ]
    with store.engine.begin() as conn:
        conn.execute(insert(MNESTS), rows)
    link = store.vet(["a", "b"]).links[0]
    assert (link.mnest_id, link.uses, link.weight) == (rows[1]["id"], 7, pytest.approx(0.5))


# --- outcomes -------------------------------------------------------------------------------


def test_success_is_laplaces_rule_over_the_best_rows_outcome_counts(store: Mnestoma) -> None:
    for outcome in ("ok", "ok", "error", "ok", None):
        store.record_passing("a", "1", "b", "1", outcome=outcome)
    for _ in range(5):
        store.record_passing("a", "1", "twin", "1")  # the same passings, no outcome
    v = store.vet(["a", "b"])
    link = v.links[0]
    assert (link.uses, link.ok_count, link.error_count) == (5, 3, 1)
    assert link.success == success_rate(3, 1) == pytest.approx(4 / 6)
    # outcomes never change a weight
    assert link.weight == pytest.approx(store.vet(["a", "twin"]).links[0].weight)
    assert store.vet(["a", "twin"]).links[0].success == 0.5


def test_a_link_that_mostly_failed_is_still_known(store: Mnestoma) -> None:
    for _ in range(3):
        store.record_passing("a", "1", "b", "1", outcome="error")
    link = store.vet(["a", "b"]).links[0]
    assert link.known and link.success == pytest.approx(1 / 5)


@executor("web.search", "2.1")
def _search(query: str) -> list[str]:
    return [f"https://example.org/{query}.pdf"]


@executor("pdf.extract", "0.4")
def _extract(urls: list[str]) -> str:
    raise RuntimeError("encrypted PDF")


def test_a_tool_that_failed_in_a_traced_turn_shows_in_the_verdict(store: Mnestoma) -> None:
    with turn(store, "turn-1"), pytest.raises(RuntimeError):
        _extract(_search("q3"))
    v = store.vet(["web.search", "pdf.extract", "text.summarise"])
    first = v.links[0]
    assert (first.known, first.ok_count, first.error_count) == (True, 0, 1)
    assert first.success == pytest.approx(1 / 3)
    assert v.unknown == (1,) and v.score == 0.0


# --- every door -----------------------------------------------------------------------------


def test_the_async_door_gives_the_same_verdict(
    store: Mnestoma, store_url: str, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "1", outcome="ok")
    store.record_passing("b", "1", "c", "1", outcome="error")
    steps: list[Any] = ["a", ("b", "1"), "c", "d"]

    async def main() -> Verdict:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            return await am.vet(steps)

    assert asyncio.run(main()) == store.vet(steps)

    async def bad() -> None:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            await am.vet(["a"])

    with pytest.raises(InvalidInput):
        asyncio.run(bad())


def test_the_repository_vets_inside_a_unit_of_work_and_sees_its_own_writes(
    store: Mnestoma, clock: MovableClock
) -> None:
    with UnitOfWork(make_session_factory(store.engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1", outcome="ok")
        v = uow.mnests.vet(normalise_steps(["a", "b"]))
        assert v.links[0].known and v.links[0].ok_count == 1
    assert store.vet(["a", "b"]).unknown == (0,)  # never committed


# --- one statement --------------------------------------------------------------------------


@pytest.mark.parametrize("length", [2, 3, 17, MAX_VET_STEPS])
def test_a_chain_is_vetted_in_one_statement_whatever_its_length(
    store: Mnestoma, statements: list[str], length: int
) -> None:
    names = [f"x{i}" for i in range(length)]
    store.record_turn("t1", [(a, "1", b, "1") for a, b in pairwise(names)])
    steps: list[Any] = [(n, "1") if i % 3 == 0 else n for i, n in enumerate(names)]
    statements.clear()
    v = store.vet(steps)
    assert len(_reads(statements)) == 1, statements
    assert v.unknown == () and len(v.links) == length - 1


def test_vet_chain_runs_exactly_one_statement_on_its_connection(
    store: Mnestoma, clock: MovableClock
) -> None:
    store.record_passing("a", "1", "b", "1")
    seen: list[str] = []
    with store.engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", lambda *a: seen.append(a[2]))
        v = vet_chain(runner_for(conn), normalise_steps(["a", "b", "c", "d"]), clock())
    assert len(seen) == 1, seen
    assert v.unknown == (1, 2)


def test_the_statement_is_built_once_per_shape(store: Mnestoma) -> None:
    from mnestoma.schema.sql.vet import vet_statement

    store.vet(["a", "b", "c"])
    before = vet_statement.cache_info()
    store.vet(["d", "e", "f"])
    store.vet(["g", "h", "i"])
    after = vet_statement.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 2


# --- bad input ------------------------------------------------------------------------------

BAD_STEPS: list[Any] = [
    [],
    ["a"],
    "abc",
    b"ab",
    None,
    42,
    ["a", ""],
    ["a", "   "],
    ["a", 3],
    ["a", ("b",)],
    ["a", ("b", "1", "2")],
    ["a", ("b", "")],
    ["a", ("b", 1)],
    ["a", (None, "1")],
    ["a", "b\x00c"],
    ["a", "x" * 1000],
    ["s"] * (MAX_VET_STEPS + 1),
]


@pytest.mark.parametrize("steps", BAD_STEPS, ids=range(len(BAD_STEPS)))
def test_bad_steps_raise_invalid_input_and_write_nothing(store: Mnestoma, steps: Any) -> None:
    store.record_passing("a", "1", "b", "1")
    before = _dump(store)
    with pytest.raises(InvalidInput):
        store.vet(steps)
    assert _dump(store) == before


def test_steps_are_names_or_pairs_and_come_back_as_pairs() -> None:
    given = ["a", ("b", "1"), ["c", None], ("d", None)]
    assert normalise_steps(given) == [("a", None), ("b", "1"), ("c", None), ("d", None)]
    assert normalise_steps(iter(["a", "b"])) == [("a", None), ("b", None)]
    assert len(normalise_steps(["s"] * MAX_VET_STEPS)) == MAX_VET_STEPS
    assert MIN_VET_STEPS == 2
    with pytest.raises(InvalidInput, match="at least 2 steps"):
        normalise_steps(["a"])
    with pytest.raises(InvalidInput, match=f"at most {MAX_VET_STEPS} steps"):
        normalise_steps(["s"] * (MAX_VET_STEPS + 1))


def test_a_chain_may_come_back_to_an_executor(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1")
    store.record_passing("b", "1", "a", "1")
    v = store.vet(["a", "b", "a", "b"])
    assert v.unknown == () and v.links[0].mnest_id == v.links[2].mnest_id


# --- JSON -----------------------------------------------------------------------------------


def test_a_verdict_as_dict_is_json_with_iso_times(store: Mnestoma) -> None:
    store.record_passing("a", "1", "b", "1", outcome="ok")
    data = json.loads(json.dumps(store.vet([("a", "1"), "b", "c"]).as_dict()))
    assert list(data) == ["steps", "links", "score", "weakest", "unknown", "log_likelihood"]
    assert data["steps"] == [
        {"executor": "a", "version": "1"},
        {"executor": "b", "version": None},
        {"executor": "c", "version": None},
    ]
    first, second = data["links"]
    assert first["last_seen"] == "2026-01-01T12:00:00Z"
    assert (first["ok_count"], first["error_count"], first["success"]) == (1, 0, 2 / 3)
    assert list(first) == [
        "index",
        "src_executor",
        "src_version",
        "dst_executor",
        "dst_version",
        "known",
        "weight",
        "uses",
        "ok_count",
        "error_count",
        "success",
        "last_seen",
        "state",
        "mnest_id",
        "p",
    ]
    assert second["last_seen"] is None and second["known"] is False
    assert (data["score"], data["weakest"], data["unknown"]) == (0.0, 1, [1])


# --- the command line -----------------------------------------------------------------------


def test_mnestoma_vet_prints_each_link_and_the_chains_figures(
    store: Mnestoma, store_url: str
) -> None:
    for outcome in ("ok", "ok", "error"):
        store.record_passing("search", "1", "fetch", "2", outcome=outcome)
    result = run("vet", "search", "fetch@2", "summarise", "--database-url", store_url)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "LINK", "SOURCE", "DESTINATION", "KNOWN", "WEIGHT", "USES", "OK", "ERROR", "SUCCESS",
        "LAST", "SEEN", "STATE",
    ]  # fmt: skip
    first = lines[1].split()
    assert first[:3] == ["0", "search", "fetch@2"]
    assert first[3] == "yes" and first[5:9] == ["3", "2", "1", "0.600"]
    assert first[-1] == "active"
    second = lines[2].split()
    assert second[:4] == ["1", "fetch@2", "summarise", "no"]
    assert second[4:9] == ["0.000", "0", "0", "0", "0.500"]
    assert "score    0.000" in result.stdout
    assert "weakest  link 1: fetch@2 -> summarise" in result.stdout
    assert "unknown  link 1: no active edge seen, which is not evidence against it" in (
        result.stdout
    )


def test_mnestoma_vet_json_is_the_verdicts_dict(store: Mnestoma, store_url: str) -> None:
    store.record_passing("search", "1", "fetch", "2", outcome="error")
    store.record_passing("fetch", "2", "summarise", "1")
    result = run("vet", "search@1", "fetch", "summarise@1", "--json", "--database-url", store_url)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    data = json.loads(result.stdout)
    # the command's now is the wall clock's: weights and counts decayed since the test
    # clock's writes, so each seen link's p is lower too (its evidence faded; the unseen
    # mass, which counts distinct successors, did not)
    expected = store.vet([("search", "1"), "fetch", ("summarise", "1")]).as_dict()
    for link, want in zip(data["links"], expected["links"], strict=True):
        assert link["weight"] <= want["weight"]
        assert 0.0 < link["p"] <= want["p"]
        assert {k: v for k, v in link.items() if k not in ("weight", "p")} == {
            k: v for k, v in want.items() if k not in ("weight", "p")
        }
    assert data["steps"] == expected["steps"] and data["unknown"] == [] == expected["unknown"]
    assert math.isclose(data["score"], data["links"][0]["weight"] * data["links"][1]["weight"])


def test_mnestoma_vet_says_every_link_known_when_it_is(store: Mnestoma, store_url: str) -> None:
    store.record_passing("a", "1", "b", "1")
    result = run("vet", "a", "b", "--database-url", store_url)
    assert result.exit_code == 0
    assert "unknown  none: every link has an active edge" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["a"],
        ["a", "b@"],
        ["a", "@1"],
        ["a", ""],
        ["a", "b\x01"],
        ["s"] * (MAX_VET_STEPS + 1),
    ],
    ids=["one-step", "empty-version", "empty-name", "empty-step", "control", "too-many"],
)
def test_mnestoma_vet_exits_2_with_one_line_on_bad_input(store_url: str, args: list[str]) -> None:
    result = run("vet", *args, "--database-url", store_url)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("Error: ")


def test_mnestoma_vet_without_steps_is_a_usage_error() -> None:
    result = run("vet")
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


def test_the_guides_example_is_what_the_command_prints_of_the_demo(tmp_path: Path) -> None:
    guide = REPO / "docs" / "cli.md"
    section = guide.read_text(encoding="utf-8").split("## `mnestoma vet`", 1)[1]
    shown = re.search(
        r"```\n\$ mnestoma demo [^\n]*\n\$ mnestoma (vet [^\n]*)\n(.*?)```", section, re.S
    )
    assert shown is not None
    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    assert run("demo", "--database-url", url).exit_code == 0
    args = shown.group(1).replace("sqlite:///demo.sqlite", url).split()
    result = run(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout == shown.group(2)
