"""``mnestoma split-history`` where there is nothing to split (SQLite keeps events in one
table), its bad input, its help, what it and ``status`` say of what waits, and the names it
writes into its statements (the PostgreSQL runs are in
``tests/migrations/test_history_split.py`` and ``tests/migrations/test_default_split.py``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli_kit import run, run_ok

from mnestoma import Mnestoma
from mnestoma.cli.render import NOTHING_TO_SPLIT_SQLITE, render_split
from mnestoma.core.rules import SPLIT_BATCH_ROWS
from mnestoma.maintenance.splitting import OldPartition, SplitReport
from mnestoma.maintenance.status import StoreStatus, render_status
from mnestoma.schema.sql import splitting as sq
from mnestoma.schema.sql.partitions import is_layout_name

# What waits on a store upgraded from before 0015 whose default partition caught rows too.
CATCH_ALL = OldPartition("events_to_202701", None, (2027, 1), 900)
DEFAULT = OldPartition("events_default", None, None, 40)


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


def _history_line(waiting: list[OldPartition]) -> str:
    status = StoreStatus(
        database="postgresql://h/db",
        dialect="postgresql",
        schema="head",
        revision="x",
        head="x",
        at=datetime(2027, 3, 1, tzinfo=UTC),
        events=1000,
        estimated=True,
        history_to_split=waiting,
    )
    (line,) = [x for x in render_status(status).splitlines() if x.startswith("history ")]
    return line


def test_status_names_the_default_partition_beside_the_old_layout() -> None:
    """The ``history`` line counts the default partition's rows with the old layout's, and
    names it apart from the partitions of the old layout."""
    assert _history_line([CATCH_ALL]).startswith(
        "history    1 partition of events in the old layout holds about 900 events:"
    )
    assert _history_line([DEFAULT]).startswith(
        "history    the default partition of events holds about 40 events:"
    )
    assert _history_line([CATCH_ALL, DEFAULT]).startswith(
        "history    1 partition of events in the old layout and the default partition hold"
        " about 940 events: `mnestoma split-history` puts each event in its month"
    )


def test_the_dry_run_lists_the_default_partition_without_a_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dry run's text and JSON list the default partition last, with no range."""
    report = SplitReport(
        partitions=("events_to_202701", "events_default"),
        dry_run=True,
        waiting=(CATCH_ALL, DEFAULT),
    )
    render_split(report, as_json=False)
    assert capsys.readouterr().out.splitlines() == [
        "would split 2 partitions of events (dry run: nothing changed):",
        "  events_to_202701: from the start to 2027-01, about 900 events",
        "  events_default: the months no partition covers, about 40 events",
    ]
    render_split(report, as_json=True)
    waiting = json.loads(capsys.readouterr().out)["waiting"]
    assert waiting[1] == {"name": "events_default", "from": None, "to": None, "rows": 40}


@pytest.mark.parametrize(
    "name", ["events_to_202701", "events_202701", "events_1000001", "events_default"]
)
def test_a_partition_it_splits_is_written_into_its_statements(name: str) -> None:
    assert sq.old_partition(name) == name
    assert str(sq.drop_leftover(f"{name}_dropped")) == f"DROP TABLE IF EXISTS {name}_dropped"


@pytest.mark.parametrize(
    "name",
    [
        "events",
        "events_default_x",
        "events_defaults",
        "xevents_default",
        "events_default; DROP TABLE mnests",
        "events_split",
        "events_202713",
        "events_p2027_01",
        "events_202701_created",
        "event_turn_edges",
    ],
)
def test_any_other_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a partition of events"):
        sq.old_partition(name)
    with pytest.raises(ValueError):
        sq.drop_leftover(f"{name}_dropped")
    with pytest.raises(ValueError):
        sq.drop_leftover(name)


def test_a_default_partition_a_swap_detached_is_the_stores() -> None:
    """Left behind by a run stopped after its swap, ``events_default_dropped`` is one of the
    store's tables (schema comparisons and ``include_name`` leave it aside)."""
    assert is_layout_name("events_default_dropped")
    assert not is_layout_name("events_default_dropped_x")
