"""``mnestoma split-history`` where there is nothing to split (SQLite keeps events in one
table), its bad input, and its help (the PostgreSQL runs are in
``tests/migrations/test_history_split.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_kit import run, run_ok

from mnestoma import Mnestoma
from mnestoma.cli.render import NOTHING_TO_SPLIT_SQLITE
from mnestoma.core.rules import SPLIT_BATCH_ROWS


def test_on_sqlite_there_is_nothing_to_split(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with Mnestoma(store_url) as store:
        store.record_passing("a", "1", "b", "1")
    for args in ([], ["--dry-run"], ["--batch", "10"]):
        out = run_ok("split-history", *args, "--database-url", store_url).stdout
        assert out == NOTHING_TO_SPLIT_SQLITE + "\n"
    report = json.loads(run_ok("split-history", "--json", "--database-url", store_url).stdout)
    assert report == {
        "partitioned": False,
        "dry_run": False,
        "partitions": [],
        "months": [],
        "copied": 0,
        "batches": 0,
        "waiting": [],
    }


def test_a_batch_below_one_is_bad_input(store_url: str) -> None:
    result = run("split-history", "--batch", "0", "--database-url", store_url)
    assert result.exit_code == 2 and "--batch" in result.stderr


def test_the_help_says_what_it_costs_and_that_it_resumes() -> None:
    out = " ".join(run_ok("split-history", "--help").stdout.split())
    assert f"(default {SPLIT_BATCH_ROWS})" in out
    assert "twice over" in out and "completed by the next" in out
