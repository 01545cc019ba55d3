"""The planner benchmark (``python -m benchmarks.planner``) on a small fixture in the BFCL
multi-turn format, so that the suite needs neither ``bfcl-eval`` nor a download. No timing
is asserted: only that it runs, that its references and drift count what they say, and that
a missing ``bfcl-eval`` is one clear line."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from conftest import REPO

if str(REPO) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
    sys.path.insert(0, str(REPO))

from benchmarks import planner

FIXTURE = REPO / "tests" / "fixtures" / "BFCL_v4_multi_turn_sample.json"


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
    assert planner.main(["--data", str(FIXTURE), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["conversations"], report["train"], report["test"]) == (30, 24, 6)
    names = set(report["prediction"])
    for order in ("weight", "success", "decayed_uses"):
        assert f"rank order_by={order}" in names
    assert {"suggest_next order_by=weight", "suggest_next order_by=decayed_uses"} <= names
    assert {"reference: popularity", "reference: undecayed successor count"} <= names
    for hits in report["prediction"].values():
        assert hits["n"] == report["held_out_calls"] > 0
        assert 0.0 <= hits["hit@1"] <= hits["hit@3"] <= 1.0
    for kind in ("one step replaced", "two steps swapped"):
        for unit in ("", ", a turn's calls"):
            vet = report["vet"][kind + unit]
            assert vet["pairs"] > 0 and 0.0 <= vet["separation"] <= 1.0
        vet = report["vet"][kind]
        assert vet["pairs"] > 0 and 0.0 <= vet["separation"] <= 1.0
    drift = report["drift"]
    needed = drift["passings_needed"]
    # the undecayed count needs one passing more than the old successor had
    assert needed["reference: undecayed successor count"] == drift["old_passings_before_change"] + 1
    assert needed["rank order_by=weight"] is not None
    assert needed["rank order_by=weight"] < needed["reference: undecayed successor count"]
    assert set(report["latency"]) == {
        "suggest_next order_by=weight",
        "suggest_next order_by=decayed_uses",
        "rank order_by=weight",
        "rank order_by=success",
        "rank order_by=decayed_uses",
    }


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
