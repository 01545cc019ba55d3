"""The planner benchmark (``python -m benchmarks.planner``) on a small fixture in the BFCL
multi-turn format, so that the suite needs neither ``bfcl-eval`` nor a download. No timing
is asserted: only that it runs, that its references and drift count what they say, and that
a missing ``bfcl-eval`` is one clear line. Its ScienceWorld part (``benchmarks.scienceworld``)
runs on a hand-written fixture in the format of AutoTool's logs, and its predictors' figures
on one held-out task are checked against the ones computed by hand."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO

if str(REPO) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
    sys.path.insert(0, str(REPO))

import mnestoma
from benchmarks import planner, scienceworld
from mnestoma.planner.ranking import ORDER_BY, SUGGEST_ORDER_BY
from mnestoma.testing.clock import MovableClock

FIXTURE = REPO / "tests" / "fixtures" / "BFCL_v4_multi_turn_sample.json"
AUTOTOOL = REPO / "tests" / "fixtures" / "autotool_scienceworld"


def test_calls_are_read_as_function_names_turn_by_turn() -> None:
    convs = planner.load_conversations([FIXTURE])
    assert len(convs) == 30
    first = convs[0]
    assert first.id == "multi_turn_base_0" and first.group == "0"
    assert first.turns[0] == ("cd", "mkdir", "mv")
    assert planner.function_name("  send_message(receiver_id='u2', message='a(b)')") == (
        "send_message"
    )


def test_the_split_keeps_a_conversations_variants_together_and_follows_its_seed(
    tmp_path: Path,
) -> None:
    lines = FIXTURE.read_text().splitlines()
    variant = tmp_path / "BFCL_v4_multi_turn_variant.json"
    variant.write_text(
        "\n".join(line.replace("multi_turn_base_", "multi_turn_miss_func_") for line in lines)
    )
    convs = planner.load_conversations([FIXTURE, variant])
    train, test = planner.split(convs, 40)
    assert len(train) + len(test) == 60
    assert {c.group for c in train}.isdisjoint({c.group for c in test})
    assert len(test) == 12  # 20 % of the 30 groups, both variants of each
    again, _ = planner.split(convs, 40)
    assert [c.id for c in again] == [c.id for c in train]
    assert [c.id for c in planner.split(convs, 41)[0]] != [c.id for c in train]


def test_the_benchmark_runs_on_the_fixture_and_reports_every_order(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert (
        planner.main(["--data", str(FIXTURE), "--autotool", str(AUTOTOOL), "--json", str(out)]) == 0
    )
    report = json.loads(out.read_text())
    world = report["scienceworld"]  # beside the BFCL figures
    assert (world["trajectories"], world["folds"], world["held_out_calls"]) == (7, 3, 34)
    assert list(world["prediction"]) == list(scienceworld.PREDICTORS)
    assert {h["n"] for h in world["prediction"].values()} == {34}
    assert set(world["calibration"]) == {
        name for name in scienceworld.PREDICTORS if not name.startswith("suggest_next")
    }
    assert (report["conversations"], report["train"], report["test"]) == (30, 24, 6)
    names = set(report["prediction"])
    for order in ("weight", "success", "decayed_uses"):
        assert f"rank order_by={order}" in names
    assert {"suggest_next order_by=weight", "suggest_next order_by=decayed_uses"} <= names
    assert {"reference: popularity", "reference: undecayed successor count"} <= names
    assert planner.PREDICT_NEXT in names
    for hits in report["prediction"].values():
        assert hits["n"] == report["held_out_calls"] > 0
        assert 0.0 <= hits["hit@1"] <= hits["hit@3"] <= 1.0
    for kind in ("one step replaced", "two steps swapped"):
        for unit in ("", ", a turn's calls"):
            vet = report["vet"][kind + unit]
            assert vet["pairs"] > 0 and 0.0 <= vet["separation"] <= 1.0
            assert 0.0 <= vet["separation_log_likelihood"] <= 1.0
        vet = report["vet"][kind]
        assert vet["pairs"] > 0 and 0.0 <= vet["separation"] <= 1.0
    drift = report["drift"]
    needed = drift["passings_needed"]
    # the undecayed count needs one passing more than the old successor had
    assert needed["reference: undecayed successor count"] == drift["old_passings_before_change"] + 1
    assert needed["rank order_by=weight"] is not None
    assert needed["rank order_by=weight"] < needed["reference: undecayed successor count"]
    assert set(report["latency"]) == {
        *(f"suggest_next order_by={order}" for order in SUGGEST_ORDER_BY),
        *(f"rank order_by={order}" for order in ORDER_BY),
        planner.PREDICT_NEXT,
    }
    for name, t in report["latency"].items():
        assert 0 < t["median_ms"] <= t["p99_ms"] and t["ratio"] > 0, name
    for door in ("suggest_next", "rank"):
        assert report["latency"][f"{door} order_by=weight"]["ratio"] == 1.0
    text = planner.format_report(planner.PlannerReport(**{**report, "scienceworld": None}))
    assert f"| {planner.PREDICT_NEXT} | " in text
    assert "| call | median ms | p99 ms |" in text


def _conversation(name: str, *turns: str) -> planner.Conversation:
    return planner.Conversation(name, name, tuple(tuple(t.split()) for t in turns))


@pytest.mark.parametrize("split_at_b", [False, True], ids=["one turn", "a turn ends at b"])
def test_predict_next_answers_from_the_last_two_calls_where_the_last_one_is_ambiguous(
    tmp_path: Path, split_at_b: bool
) -> None:
    """Training a b c twice and x b d three times; held out a b c. After b alone, d (3)
    beats c (2); after a -> b only c was seen, twice (more than rules.CHAIN_MIN_SUPPORT). By
    hand (Witten-Bell): the edge b gives c 2/7, d 3/7; the chain (a, b) saw c twice (scale
    1/3): c (2 + 2/7)/3 = 16/21 against d 1/7, so predict_next ranks c first where the
    successor count ranks it second: hit@1 2 of 2 (a -> b, then c) against 1 of 2, MRR 1
    against 3/4 (the turns an hour apart fade the counts by a few thousandths).

    When the training's turn ends at b (a b, then c), the passing b -> c opens the next turn
    and no chain a -> b -> c is counted: the edge answers, as the count does."""
    first = ("a b", "c") if split_at_b else ("a b c",)
    train = [
        _conversation("t0", *first),
        _conversation("t1", *first),
        _conversation("t2", "x b d"),
        _conversation("t3", "x b d"),
        _conversation("t4", "x b d"),
    ]
    test = [_conversation("h0", "a b c")]
    assert planner.contexts_of(test[0]) == [(("a",), "b"), (("a", "b"), "c")]
    url = f"sqlite:///{tmp_path / 'planner.sqlite'}"
    mnestoma.upgrade(url)
    clock = MovableClock(planner.T0)
    with mnestoma.Mnestoma(url, clock=clock) as store:
        planner.replay(store, clock, train)
        forecast = store.predict_next(["a", "b"])
        prediction, n = planner.predict(store, train, test)
    assert n == 2
    reference = prediction["reference: undecayed successor count"]
    assert (reference["hit@1"], reference["hit@3"], reference["mrr"]) == (0.5, 1.0, 0.75)
    got = prediction[planner.PREDICT_NEXT]
    if split_at_b:
        assert forecast.used.value == "edge"
        assert (got["hit@1"], got["mrr"]) == (0.5, 0.75)
    else:
        assert forecast.used.value == "chain"
        assert forecast.p("c") == pytest.approx(16 / 21, abs=5e-3)
        assert forecast.p("d") == pytest.approx(1 / 7, abs=5e-3)
        assert (got["hit@1"], got["hit@3"], got["mrr"], got["n"]) == (1.0, 1.0, 1.0, 2)


def test_a_missing_bfcl_eval_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert planner.main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert "bfcl-eval is not installed" in lines[0] and "mnestoma[planner]" in lines[0]


def test_data_that_is_not_there_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert planner.main(["--data", str(tmp_path / "nothing.json")]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


# --- ScienceWorld: AutoTool's logs -----------------------------------------------------------


def _fixture_trajectories() -> list[scienceworld.Trajectory]:
    return scienceworld.load_trajectories(scienceworld.autotool_files(str(AUTOTOOL)))


def test_autotool_logs_are_read_as_its_markov_py_reads_them(tmp_path: Path) -> None:
    trajs = _fixture_trajectories()
    # 4 tasks x 2 runs; one run of task 3 has only unparsed actions and is left out
    assert len(trajs) == 7
    (task2,) = [t for t in trajs if t.run.endswith("20260105_090000") and t.task == "2"]
    assert task2.calls == ("look_around", "go_to", "pick_up", "use", "wait")  # "unknown" out
    assert len({t.task for t in trajs}) == 4 and len({t.goal for t in trajs}) == 3
    # a clone of the repository, its trajectories folder, or one file
    clone = tmp_path / "AutoTool" / scienceworld.AUTOTOOL_FOLDER
    clone.mkdir(parents=True)
    for f in AUTOTOOL.iterdir():
        (clone / f.name).write_bytes(f.read_bytes())
    assert [f.name for f in scienceworld.autotool_files(str(tmp_path / "AutoTool"))] == sorted(
        f.name for f in AUTOTOOL.iterdir()
    )
    one = next(clone.iterdir())
    assert scienceworld.autotool_files(str(one)) == [one]


def test_entropies_are_those_of_autotools_markov_py() -> None:
    # a a b: H0 = 0.918; after a: {a, b} (1 bit) weighted by P(a) = 2/3; after (a, a): b only
    h0, h1, h2 = scienceworld.entropies([["a", "a", "b"]])
    assert h0 == pytest.approx(0.9183, abs=1e-4)
    assert (h1, h2) == (pytest.approx(2 / 3), 0.0)
    # a b a c: H0 = 1.5; after a: {b, c} (1 bit) x P(a) = 1/2; after b: a (0); pairs: 0
    assert scienceworld.entropies([["a", "b", "a", "c"]]) == (1.5, 0.5, 0.0)


def test_the_folds_hold_out_every_run_of_a_task_and_of_its_goal_together_once() -> None:
    trajs = _fixture_trajectories()
    split = scienceworld.folds(trajs, 5, 40)
    assert len(split) == 3  # at most one fold a goal
    held = [t for _, test in split for t in test]
    assert sorted(held, key=repr) == sorted(trajs, key=repr)  # each held out exactly once
    for train, test in split:
        assert {t.goal for t in train}.isdisjoint({t.goal for t in test})
        assert {t.task for t in test} in ({"0", "3"}, {"1"}, {"2"})  # tasks 0 and 3: one goal
    again = scienceworld.folds(trajs, 5, 40)
    assert [[t.run + t.task for t in train] for train, _ in again] == [
        [t.run + t.task for t in train] for train, _ in split
    ]


def test_each_predictor_scores_the_hand_computed_hits_on_a_held_out_task(tmp_path: Path) -> None:
    """Task 2 held out: L G P U W and L G A U W (look_around, go_to, pick_up, use, wait,
    look_at); the training has L G (P G)x4 P U, L G P U twice, L G A F M and L G A F M W.

    Previous call → truth, and the first choice of the count of successors (every
    occurrence): L→G (G), G→P (P: 7 against A 2), P→U (G: 4 against U 3, the long trajectory's
    repeats), U→W (U ends every training trajectory: popularity, G); L→G (G), G→A (P), A→U
    (F), U→W (G): 3 of 8; U is second after P, A second after G: 5 of 8 within three.
    The store counts every occurrence too (contract §13), by either order: 3. Counted once a
    trajectory, P→U wins (U in 3 trajectories, G in 1): 4.
    The last two: (G, P) → G 4 against U 3: 3. AutoTool's first match in each distinct path:
    (G, P) → G once, U in L G P U (twice): 4.
    predict_next (Witten-Bell, each distinct successor one unseen passing; the chain, when
    seen, interpolated with the edge at T₂ / (N₂ + T₂)): after L, G 5/6; after (L, G), P 3,
    A 2 on the edge's P 7/11: P (3 + 2·7/11) / 7; after (G, P), G 4, U 3 on G 4/9: G
    (4 + 2·4/9) / 9; after (G, A), F (2 + 2/3) / 3; nothing after U. The same first choices
    and ranks as the count of the last call's successors: 3, 5 and the same MRR."""
    trajs = _fixture_trajectories()
    test = [t for t in trajs if t.task == "2"]
    train = [t for t in trajs if t.task != "2"]
    url = f"sqlite:///{tmp_path / 'fold.sqlite'}"
    mnestoma.upgrade(url)
    clock = MovableClock(planner.T0)
    with mnestoma.Mnestoma(url, clock=clock) as store:
        scienceworld.record(store, clock, train)
        hits, answers = scienceworld.evaluate(store, train, test)
    got = {name: (h.n, h.at1, h.at3) for name, h in hits.items()}
    assert got == {
        "suggest_next order_by=weight": (8, 3, 5),
        "suggest_next order_by=decayed_uses": (8, 3, 5),
        "count: successors of the last call": (8, 3, 5),
        "count: successors of the last call, once a trajectory": (8, 4, 5),
        "count: successors of the last two, else of the last": (8, 3, 5),
        "AutoTool: ToolGraph frequency score": (8, 4, 5),
        "predict_next: P(next | the last two), else the last": (8, 3, 5),
    }
    predicted = answers["predict_next: P(next | the last two), else the last"]
    assert [p for p, _ in predicted] == pytest.approx(
        [
            5 / 6,
            (3 + 14 / 11) / 7,
            (4 + 8 / 9) / 9,
            0.0,
            5 / 6,
            (3 + 14 / 11) / 7,
            (8 / 3) / 3,
            0.0,
        ],
        abs=2e-3,  # decayed counts: the trajectories were recorded an hour apart
    )
    assert [right for _, right in predicted] == [
        True,
        True,
        False,
        False,
        True,
        False,
        False,
        False,
    ]
    assert hits["predict_next: P(next | the last two), else the last"].as_dict()["mrr"] == (
        pytest.approx(hits["count: successors of the last call"].as_dict()["mrr"])
    )
    # ranks 1, 1, 2, 8 and 1, 2, 5, 8 (W, seen once, is the last of the 8 tools by popularity)
    assert hits["count: successors of the last call"].as_dict()["mrr"] == pytest.approx(
        (1 + 1 + 1 / 2 + 1 / 8 + 1 + 1 / 2 + 1 / 5 + 1 / 8) / 8
    )
    # add-0.5 smoothing over the 8 tools: (count + 0.5) / (total + 4)
    k = scienceworld.ADD_K
    assert [p for p, _ in answers["count: successors of the last call"][:4]] == pytest.approx(
        [(5 + k) / (5 + 8 * k), (7 + k) / (9 + 8 * k), (4 + k) / (7 + 8 * k), k / (8 * k)]
    )
    # AutoTool's score after L: 5 paths, all to G, times its confidence 1 - 1.1^-5
    assert answers["AutoTool: ToolGraph frequency score"][0] == (pytest.approx(1 - 1.1**-5), True)


def test_calibration_gives_coverage_at_precision_and_the_expected_calibration_error() -> None:
    got = scienceworld.calibration([(0.9, True), (0.9, False), (0.6, True), (0.2, False)])
    coverage = {c["tau"]: (c["share"], c["precision"]) for c in got["coverage"]}
    assert list(coverage) == [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    assert coverage[0.5] == coverage[0.6] == (0.75, pytest.approx(2 / 3))
    assert coverage[0.65] == coverage[0.9] == (0.5, 0.5)
    assert coverage[0.95] == (0.0, None)
    # bins 0.9 (right 1 of 2), 0.6 (1 of 1), 0.2 (0 of 1): (|1 - 1.8| + |1 - 0.6| + 0.2) / 4
    assert got["ece"] == pytest.approx(0.35)


def test_the_store_counts_what_the_report_says_it_counts(tmp_path: Path) -> None:
    report = scienceworld.run(autotool=str(AUTOTOOL), n_folds=3, workdir=str(tmp_path))
    # each trajectory trains in 2 of the 3 folds: 2 x 34 passings, 2 x 27 distinct in a turn
    assert (report.passings_given, report.passings_once_a_turn) == (68, 54)
    assert report.passings_counted in (68, 54)  # every passing, or once per (turn, edge)
    text = scienceworld.format_report(report)
    rule = "a turn counts an edge once" if report.passings_counted == 54 else "every passing"
    assert rule in text
    assert "NOT the same" in text  # the fixture is not AutoTool's data


def test_missing_autotool_logs_are_one_line_saying_how_to_get_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ([], ["--autotool", str(tmp_path)]):
        assert scienceworld.main(argv) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "git clone https://github.com/jiajingyyyyyy/AutoTool" in lines[0]
    # said before the BFCL part runs
    assert planner.main(["--data", str(FIXTURE), "--autotool", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1
    assert "--autotool" in captured.err
