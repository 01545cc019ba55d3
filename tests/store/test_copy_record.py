"""The copy record: each store has an identity (``mnestoma_store``) and keeps the identities of
the stores whose rows a copy brought in (``mnestoma_copied_stores``), whatever retention
deletes since; ``copy --append`` refuses a source whose rows the target already holds, and
the passings are never counted twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run
from conftest import package_engine
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

import mnestoma
from mnestoma.core.errors import StoresShareRows
from mnestoma.maintenance.copying import copy_store
from mnestoma.schema.models import Mnest

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
COPY_AT = T0 + timedelta(days=2)
# After every event the stores hold, the merge events of a copy at COPY_AT included.
PRUNE_BEFORE = COPY_AT + timedelta(days=30)
EDGE = ("plan", "1", "search", "2")


def one_edge(url: str, *, at: datetime, turn: str | None = None) -> None:
    with mnestoma.Mnestoma(url, clock=lambda: at) as m:
        m.record_passing(*EDGE, turn_id=turn)


def one_edge_each(two_stores: tuple[str, str], *, turns: bool = False) -> tuple[str, str]:
    """The source and the target, each given the edge: the target at T0, the source an hour
    later (each in a turn of its own with ``turns``)."""
    source, target = two_stores
    one_edge(target, at=T0, turn="t-target" if turns else None)
    one_edge(source, at=T0 + timedelta(hours=1), turn="t-source" if turns else None)
    return source, target


def rows(url: str, sql: str) -> list[dict[str, Any]]:
    with package_engine(url) as engine, engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql)).mappings()]


def identity(url: str) -> str:
    [row] = rows(url, "SELECT id, store_id FROM mnestoma_store")
    assert row["id"] == 1
    return str(row["store_id"])


def records(url: str) -> dict[str, dict[str, Any]]:
    found = rows(url, "SELECT * FROM mnestoma_copied_stores")
    return {r["store_id"]: r for r in found}


def edge_uses(url: str) -> list[int]:
    with mnestoma.Mnestoma(url) as m:
        return sorted(e.uses for e in m.edges())


def pruned(url: str) -> None:
    """Every event before :data:`PRUNE_BEFORE` deleted, but what retention keeps."""
    with mnestoma.Mnestoma(url, clock=lambda: PRUNE_BEFORE) as m:
        m.prune_events(PRUNE_BEFORE)


def mnest_ids_known(url: str) -> set[str]:
    """The mnest ids the store knows, as rows or in its events (the check before 0012)."""
    found = rows(url, "SELECT id FROM mnests UNION SELECT mnest_id FROM events")
    return {r["id"] for r in found}


def snapshot(url: str) -> dict[str, Any]:
    """Every row of the store's tables, in order."""
    tables = ("mnests", "events", "canonical_query_log", "ager_runs")
    return {t: rows(url, f"SELECT * FROM {t} ORDER BY 1") for t in tables}


@pytest.mark.parametrize("turns", [False, True], ids=["without-turn-ids", "with-turn-ids"])
def test_appending_a_source_again_after_retention_is_refused_and_no_use_counts_twice(
    two_stores: tuple[str, str], turns: bool
) -> None:
    source, target = one_edge_each(two_stores, turns=turns)
    [source_row] = rows(source, "SELECT id FROM mnests")
    first = copy_store(source, target, append=True, clock=lambda: COPY_AT)
    assert first.merged == 1
    assert edge_uses(target) == [2]
    pruned(target)
    # retention took every trace of the source's row: its merged event, its id
    assert source_row["id"] not in mnest_ids_known(target)
    before = snapshot(target)
    with pytest.raises(StoresShareRows, match="already holds the source's rows"):
        copy_store(source, target, append=True, clock=lambda: COPY_AT + timedelta(days=40))
    assert snapshot(target) == before
    again = run("copy", "--from", source, "--to", target, "--append")
    assert again.exit_code == 1, again.output
    [line] = again.stderr.splitlines()
    assert "share rows" in line and "nothing was copied" in line
    assert snapshot(target) == before
    assert edge_uses(target) == [2]
    assert identity(source) in line
    assert set(records(target)) == {identity(source)}


def test_the_record_names_the_source_and_what_the_copy_took(
    two_stores: tuple[str, str],
) -> None:
    source, target = one_edge_each(two_stores)
    with mnestoma.Mnestoma(source, clock=lambda: T0) as m:
        m.log_canonical_query("q", "q")
    report = copy_store(source, target, append=True, clock=lambda: COPY_AT)
    assert (report.source_store, report.target_store) == (identity(source), identity(target))
    assert report.source_store != report.target_store
    [record] = records(target).values()
    assert str(record.pop("copied_at"))[:10] == COPY_AT.date().isoformat()
    assert record == {
        "store_id": identity(source),
        "via_store_id": None,
        "mnests": 1,
        "events": 1,
        "queries": 1,
        "ager_runs": 0,
    }
    assert records(source) == {}  # the source is read, never written


def test_appending_the_target_back_into_its_source_after_retention_is_refused(
    two_stores: tuple[str, str],
) -> None:
    """A into B, then B into A: B holds A's rows, whatever A and B have pruned since."""
    source, target = one_edge_each(two_stores)
    copy_store(source, target, append=True, clock=lambda: COPY_AT)
    pruned(target)
    pruned(source)
    before = snapshot(source)
    with pytest.raises(StoresShareRows, match="the source already holds the target's rows"):
        copy_store(target, source, append=True, clock=lambda: COPY_AT)
    assert snapshot(source) == before
    assert edge_uses(source) == [1]


def test_the_record_goes_with_the_rows_through_every_later_copy(
    two_stores: tuple[str, str], tmp_path: Path
) -> None:
    """C into A, A copied whole into a new store D: D holds C's rows, through A. Appending C
    (or A) into D, or D into C, is refused after retention everywhere; so is appending A
    into B once C went into B too."""
    a, b = two_stores
    c = f"sqlite:///{tmp_path / 'c.sqlite'}"
    d = f"sqlite:///{tmp_path / 'd.sqlite'}"
    for url, hours in ((a, 0), (b, 1), (c, 2)):
        one_edge(url, at=T0 + timedelta(hours=hours))
    copy_store(c, a, append=True, clock=lambda: COPY_AT)
    copy_store(a, d, clock=lambda: COPY_AT)  # a new store: its own identity
    assert identity(d) not in (identity(a), identity(c))
    held = records(d)
    assert set(held) == {identity(a), identity(c)}
    assert held[identity(a)]["via_store_id"] is None
    assert held[identity(c)]["via_store_id"] == identity(a)
    for url in (a, c, d):
        pruned(url)
    for source, target, match in (
        (c, d, "already holds the source's rows"),
        (a, d, "already holds the source's rows"),
        (d, c, "the source already holds the target's rows"),
    ):
        with pytest.raises(StoresShareRows, match=match):
            copy_store(source, target, append=True, clock=lambda: COPY_AT)
    copy_store(c, b, append=True, clock=lambda: COPY_AT)
    pruned(b)
    with pytest.raises(StoresShareRows, match=f"both hold the rows of store {identity(c)}"):
        copy_store(a, b, append=True, clock=lambda: COPY_AT)
    assert edge_uses(b) == [2]


def test_two_stores_that_share_nothing_append_and_the_record_grows(tmp_path: Path) -> None:
    """Three stores appended one after the other into a fourth: each is taken once."""
    urls = [f"sqlite:///{tmp_path / f's{i}.sqlite'}" for i in range(4)]
    for i, url in enumerate(urls):
        one_edge(url, at=T0 + timedelta(hours=i))
    for url in urls[1:]:
        copy_store(url, urls[0], append=True, clock=lambda: COPY_AT)
    assert len({identity(u) for u in urls}) == 4
    assert set(records(urls[0])) == {identity(u) for u in urls[1:]}
    assert edge_uses(urls[0]) == [4]


def test_a_store_without_its_identity_row_is_given_one_and_known_again(
    two_stores: tuple[str, str],
) -> None:
    """A source whose identity row is gone (deleted, or tables built by ``create_all``) is
    given one before the copy reads it: appending it again after retention is refused."""
    source, target = one_edge_each(two_stores)
    with package_engine(source) as engine, engine.begin() as conn:
        conn.execute(text("DELETE FROM mnestoma_store"))
    report = copy_store(source, target, append=True, clock=lambda: COPY_AT)
    assert report.source_store == identity(source)
    pruned(target)
    with pytest.raises(StoresShareRows):
        copy_store(source, target, append=True, clock=lambda: COPY_AT)
    assert edge_uses(target) == [2]


def test_a_copy_into_an_empty_target_forgets_the_records_of_rows_it_no_longer_holds(
    two_stores: tuple[str, str],
) -> None:
    """A target emptied since a copy holds none of that source's rows: a copy into it (not
    an append) is taken, and the record says what it holds now."""
    source, target = two_stores
    one_edge(source, at=T0)
    copy_store(source, target, clock=lambda: COPY_AT)
    with package_engine(target) as engine, engine.begin() as conn:
        for table in ("events", "mnests"):
            conn.execute(text(f"DELETE FROM {table}"))
    copy_store(source, target, clock=lambda: COPY_AT + timedelta(days=1))
    [record] = records(target).values()
    assert record["store_id"] == identity(source) and record["mnests"] == 1
    assert str(record["copied_at"])[:10] == (COPY_AT + timedelta(days=1)).date().isoformat()
    assert edge_uses(target) == [1]


def test_a_copied_store_file_is_the_same_store(tmp_path: Path) -> None:
    """A SQLite file copied whole (cp, a restored backup) keeps its identity: appending one
    into the other is refused even once neither knows the other's rows any more."""
    first = tmp_path / "first.sqlite"
    one_edge(f"sqlite:///{first}", at=T0)
    second = tmp_path / "second.sqlite"
    second.write_bytes(first.read_bytes())
    one_edge(f"sqlite:///{second}", at=T0 + timedelta(hours=1))
    with pytest.raises(StoresShareRows, match="one store"):
        copy_store(f"sqlite:///{second}", f"sqlite:///{first}", append=True)


def test_the_identity_is_made_once_and_kept(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0011")
    with pytest.raises(DBAPIError):  # no such table before 0012
        identity(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    made = identity(empty_db_url)
    assert len(made) == 32 and int(made, 16) >= 0
    one_edge(empty_db_url, at=T0)
    pruned(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    assert identity(empty_db_url) == made
    assert rows(empty_db_url, "SELECT count(*) AS n FROM mnestoma_store") == [{"n": 1}]


def test_the_copy_report_names_both_stores_in_json(two_stores: tuple[str, str]) -> None:
    source, target = two_stores
    one_edge(source, at=T0)
    result = run("copy", "--from", source, "--to", target, "--append", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["source_store"], report["target_store"]) == (identity(source), identity(target))


def test_the_models_know_the_copy_tables() -> None:
    assert {"mnestoma_store", "mnestoma_copied_stores"} <= set(Mnest.metadata.tables)
