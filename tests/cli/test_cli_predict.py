"""``mnestoma predict``: what follows the last one or two executors of a turn, with P(next),
the unseen mass and the context that answered (contract §13), as a table or as
``Forecast.as_dict()``.

The store: a -> b -> c@1 twice and x -> b@2 -> d once, all a minute ago, so that the decayed
counts are the raw ones to 1e-4. By hand (Witten-Bell, each distinct successor standing for
one unseen passing): after b, c 2/5, d 1/5, unseen 2/5; after a -> b the chain saw c twice
(one successor: scale 1/3), so c 2/3 + 2/5 · 1/3 = 4/5, d 1/5 · 1/3 = 1/15, unseen 2/15.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_kit import refuses_missing_store, run, run_json, run_ok
from conftest import mnest_row
from sqlalchemy import insert

import mnestoma
from mnestoma.cli import render
from mnestoma.core.redaction import redact_url
from mnestoma.engines import make_engine
from mnestoma.schema.models import Mnest


@pytest.fixture
def url(store_url: str) -> str:
    """The store of the module's docstring."""
    when = datetime.now(UTC) - timedelta(minutes=1)
    with mnestoma.Mnestoma(store_url, clock=lambda: when) as store:
        for turn in ("t1", "t2"):
            store.record_turn(turn, [("a", "1", "b", "1"), ("b", "1", "c", "1")])
        store.record_turn("t3", [("x", "1", "b", "2"), ("b", "2", "d", "1")])
    return store_url


def _rows(stdout: str) -> list[list[str]]:
    """The table's rows (header left out), split on whitespace."""
    lines = stdout.split("\n\n", 1)[0].splitlines()
    assert lines[0].split() == ["RANK", "NEXT", "P", "SUPPORT", "USES"]
    return [line.split() for line in lines[1:]]


def _footer(stdout: str) -> list[str]:
    """The lines after the table's blank line."""
    return stdout.split("\n\n", 1)[1].splitlines()


def test_the_chain_of_the_last_two_answers_interpolated_with_the_edge(url: str) -> None:
    got = run_json("predict", "a", "b", "--database-url", url)
    assert (got["context"], got["used"]) == (["a", "b"], "chain")
    assert got["support"] == pytest.approx(2.0, abs=1e-3)
    assert [c["executor"] for c in got["candidates"]] == ["c", "d"]
    c, d = got["candidates"]
    assert (c["p"], c["support"], c["uses"]) == (
        pytest.approx(4 / 5, abs=1e-4),
        pytest.approx(2.0, abs=1e-3),
        2,
    )
    assert (d["p"], d["support"], d["uses"]) == (pytest.approx(1 / 15, abs=1e-4), 0.0, 0)
    assert got["unseen"] == pytest.approx(2 / 15, abs=1e-4)
    assert c["p"] + d["p"] + got["unseen"] == pytest.approx(1.0, abs=1e-12)


def test_the_table_has_a_row_a_candidate_then_the_unseen_mass_and_the_context(url: str) -> None:
    out = run_ok("predict", "a", "b", "--database-url", url).stdout
    assert _rows(out) == [["1", "c", "0.800", "2.000", "2"], ["2", "d", "0.067", "0.000", "0"]]
    assert _footer(out) == [
        "unseen   0.133 (every executor never seen after the context, together)",
        "context  a -> b (chain, 2.0 passings)",
    ]


def test_one_executor_is_answered_by_its_edges_alone(url: str) -> None:
    out = run_ok("predict", "b", "--database-url", url).stdout
    assert _rows(out) == [["1", "c", "0.400", "2.000", "2"], ["2", "d", "0.200", "1.000", "1"]]
    assert _footer(out)[0].startswith("unseen   0.400 ")
    assert _footer(out)[1] == "context  b (edge, 3.0 passings)"
    assert run_json("predict", "b", "--database-url", url)["used"] == "edge"


def test_a_pair_never_seen_falls_back_to_the_last_executor_and_says_so(url: str) -> None:
    out = run_ok("predict", "z", "b", "--database-url", url).stdout
    assert [row[1:3] for row in _rows(out)] == [["c", "0.400"], ["d", "0.200"]]
    assert _footer(out)[1] == "context  b (edge, 3.0 passings; z -> b seen too rarely to answer)"
    got = run_json("predict", "z", "b", "--database-url", url)
    assert (got["context"], got["used"]) == (["b"], "edge")


def test_nothing_seen_after_an_executor_leaves_all_the_mass_unseen(url: str) -> None:
    out = run_ok("predict", "a", "c", "--database-url", url).stdout
    assert out.splitlines() == [
        "(no candidate)",
        "",
        "unseen   1.000 (every executor never seen after the context, together)",
        "context  nothing seen after c",
    ]
    got = run_json("predict", "a", "c", "--database-url", url)
    assert got == {
        "context": ["c"],
        "used": "none",
        "support": 0.0,
        "unseen": 1.0,
        "candidates": [],
    }


def test_k_keeps_the_most_likely_and_says_what_the_others_hold(url: str) -> None:
    out = run_ok("predict", "a", "b", "-k", "1", "--database-url", url).stdout
    assert _rows(out) == [["1", "c", "0.800", "2.000", "2"]]
    assert _footer(out)[0] == "others   0.067 (the candidates past the first 1, together)"
    got = run_json("predict", "a", "b", "-k", "1", "--database-url", url)
    assert [c["executor"] for c in got["candidates"]] == ["c"]
    assert got["unseen"] == pytest.approx(2 / 15, abs=1e-4)  # the mass of all, not of the k
    assert "others" not in run_ok("predict", "a", "b", "--database-url", url).stdout


def test_version_narrows_the_last_executors_edges_not_the_chain(url: str) -> None:
    out = run_ok("predict", "b", "--version", "2", "--database-url", url).stdout
    assert _rows(out) == [["1", "d", "0.500", "1.000", "1"]]
    assert _footer(out)[1] == "context  b@2 (edge, 1.0 passings)"
    # b@1: c 2/3, unseen 1/3; the chain a -> b (c twice, scale 1/3): c 2/3 + 2/9, unseen 1/9
    got = run_json("predict", "a", "b", "--version", "1", "--database-url", url)
    assert got["used"] == "chain"
    assert [(c["executor"], c["p"]) for c in got["candidates"]] == [
        ("c", pytest.approx(8 / 9, abs=1e-4))
    ]
    assert got["unseen"] == pytest.approx(1 / 9, abs=1e-4)
    chain = run_ok("predict", "a", "b", "--version", "1", "--database-url", url).stdout
    assert _footer(chain)[1] == "context  a -> b@1 (chain, 2.0 passings)"


@pytest.mark.parametrize(
    "args",
    [
        ["a", "b", "c"],
        ["a", "b", "-k", "0"],
        [" "],
        ["a", "\x01"],
        ["b", "--version", " "],
        ["b", "-k", "many"],
    ],
    ids=lambda a: " ".join(a).encode("unicode_escape").decode(),
)
def test_bad_input_exits_2_with_one_line(url: str, args: list[str]) -> None:
    result = run("predict", *args, "--database-url", url)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""


def test_no_executor_at_all_is_a_usage_error(url: str) -> None:
    assert run("predict", "--database-url", url).exit_code == 2


def test_a_missing_sqlite_store_is_said_and_not_created(tmp_path: Path) -> None:
    refuses_missing_store(tmp_path / "none.sqlite", "predict", "a")


def test_stored_control_characters_are_escaped_in_the_table_and_in_json(store_url: str) -> None:
    """A successor's name written past every check (by other code) is never printed raw."""
    at = datetime.now(UTC) - timedelta(days=30)
    engine = make_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(Mnest.__table__).values(
                    mnest_row(at, src_executor="s", dst_executor="d\x9b\x1b")
                )
            )
    finally:
        engine.dispose()
    out = run_ok("predict", "s", "--database-url", store_url).stdout
    assert "d\\x9b\\x1b" in out and "\x9b" not in out and "\x1b" not in out
    # one passing 30 days ago, faded to e^(-0.018 · 30): two digits, never "0.0"
    assert _footer(out)[1] == "context  s (edge, 0.58 passings)"
    shown = run_ok("predict", "s", "--json", "--database-url", store_url).stdout
    assert "\x9b" not in shown and "\\u009b" in shown
    assert json.loads(shown)["candidates"][0]["executor"] == "d\x9b\x1b"


def test_the_store_is_named_on_a_terminal_after_the_output(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render, "stderr_is_terminal", lambda: True)
    where = redact_url(mnestoma.resolve_database_url(url))
    for extra in ([], ["--json"]):
        result = run("predict", "a", "b", *extra, "--database-url", url)
        assert result.exit_code == 0, result.output
        assert result.stderr.splitlines() == [f"store: {where}"]
        assert "store:" not in result.stdout


def test_the_read_replicas_of_the_environment_are_checked_as_for_every_read(
    tmp_path: Path,
) -> None:
    """predict opens its store as the other reads do: with MNESTOMA_REPLICA_URLS, whose
    replicas a SQLite store cannot have (bad input naming the variable)."""
    sqlite = f"sqlite:///{tmp_path / 's.sqlite'}"
    mnestoma.upgrade(sqlite)
    env: dict[str, str | None] = {"MNESTOMA_REPLICA_URLS": "postgresql+psycopg://u@127.0.0.1:1/x"}
    result = run("predict", "a", "--database-url", sqlite, env=env)
    assert result.exit_code == 2
    assert "MNESTOMA_REPLICA_URLS" in result.stderr


def test_the_answer_is_the_apis(url: str) -> None:
    with mnestoma.Mnestoma(url) as store:
        api = store.predict_next(["a", "b"], k=5).as_dict()
    got: dict[str, Any] = run_json("predict", "a", "b", "--database-url", url)
    assert got["context"] == api["context"] and got["used"] == api["used"]
    assert [c["executor"] for c in got["candidates"]] == [c["executor"] for c in api["candidates"]]
    assert got["unseen"] == pytest.approx(api["unseen"], rel=1e-6)
