"""``mnestoma copy``: a whole store moved between engines, ids kept, verified, all or nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, insert, select, text

import mnestoma
from mnestoma.cli import cli
from mnestoma.config import make_engine
from mnestoma.copying import copy_store
from mnestoma.models import CanonicalQuery, Event, Mnest

TABLES = (Mnest.__table__, Event.__table__, CanonicalQuery.__table__)


def run(*args: Any) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


def dump(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table, sorted by id, values as the ORM types return them."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {
                t.name: sorted(
                    (dict(r) for r in conn.execute(select(t)).mappings()),
                    key=lambda r: r["id"],
                )
                for t in TABLES
            }
    finally:
        engine.dispose()


def counts(url: str) -> dict[str, int]:
    return {name: len(rows) for name, rows in dump(url).items()}


def seed(url: str, *, prefix: str = "", start: datetime | None = None) -> None:
    """A varied store: chains, versions, a proto with a JSON signature, tags, ageing, queries."""
    now = [start or datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)]
    with mnestoma.Mnestoma(url, clock=lambda: now[0]) as m:
        for i in range(4):
            now[0] += timedelta(hours=1, microseconds=7)
            m.record_turn(
                f"{prefix}turn-{i}",
                [
                    (f"{prefix}search", "2.1", f"{prefix}fetch", "1.4", True, {"i": i, "ü": "✓"}),
                    (f"{prefix}fetch", "1.4", "summarise", "1.0" if i < 2 else "1.1"),
                    (
                        f"{prefix}fetch",
                        "1.4",
                        "pdf.to_text",
                        None,
                        False,
                        None,
                        {"summary": "read PDFs", "inputs": [1.5, None, True]},
                    ),
                ],
            )
            m.log_canonical_query(f"q {i}", "canonical", turn_id=f"{prefix}turn-{i}")
        once = m.record_passing(f"{prefix}search", "2.1", "translate", "3")
        now[0] += timedelta(days=45)
        m.apply_ager()  # the one-off edge becomes decaying; weights rewritten
        m.transition_state(once.id, "superseded", reason="translate v4")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Callable[[str], str]:
    return lambda name: f"sqlite:///{tmp_path / name}"


def test_copy_sqlite_to_other_engine_and_back_keeps_identical_content(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source, back = sqlite_url("source.sqlite"), sqlite_url("back.sqlite")
    seed(source)
    original = dump(source)
    assert len(original["events"]) > 10
    first = run("copy", "--from", source, "--to", empty_db_url)
    assert first.exit_code == 0, first.output
    assert "verified" in first.stdout
    assert dump(empty_db_url) == original
    second = run("copy", "--from", empty_db_url, "--to", back, "--json")
    assert second.exit_code == 0, second.output
    report = json.loads(second.stdout)
    assert report["verified"] is True
    assert report["rows"] == {name: len(rows) for name, rows in original.items()}
    assert dump(back) == original
    assert mnestoma.current_revision(back) == mnestoma.head_revision()


def test_copy_defaults_the_source_to_database_url(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    result = run("copy", "--database-url", source, "--to", empty_db_url)
    assert result.exit_code == 0, result.output
    assert dump(empty_db_url) == dump(source)


def test_copied_store_takes_new_rows_without_id_collisions(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    assert run("copy", "--from", source, "--to", empty_db_url).exit_code == 0
    last_event = max(r["id"] for r in dump(empty_db_url)["events"])
    with mnestoma.Mnestoma(empty_db_url) as m:
        m.record_passing("new", "1", "row", "1")
        entry = m.log_canonical_query("new raw", "new canonical")
    assert entry.id == len(dump(source)["canonical_query_log"]) + 1
    assert max(r["id"] for r in dump(empty_db_url)["events"]) == last_event + 1


def test_copy_into_a_non_empty_target_is_refused_without_append(
    sqlite_url: Callable[[str], str], store_url: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    seed(store_url, prefix="other.")
    before = dump(store_url)
    result = run("copy", "--from", source, "--to", store_url)
    assert result.exit_code == 2
    assert "not empty" in result.stderr and "--append" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert dump(store_url) == before


def test_copy_with_append_adds_rows_and_shifts_integer_ids(
    sqlite_url: Callable[[str], str], store_url: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    seed(store_url, prefix="other.")
    before, src = dump(store_url), dump(source)
    result = run("copy", "--from", source, "--to", store_url, "--append", "--json")
    assert result.exit_code == 0, result.output
    after = dump(store_url)
    offset = max(r["id"] for r in before["events"])
    assert json.loads(result.stdout)["id_offsets"]["events"] == offset
    assert after["mnests"] == sorted(before["mnests"] + src["mnests"], key=lambda r: r["id"])
    shifted = [{**r, "id": r["id"] + offset} for r in src["events"]]
    assert after["events"] == before["events"] + shifted
    assert len(after["canonical_query_log"]) == 8
    with mnestoma.Mnestoma(store_url) as m:
        m.record_passing("after", "1", "append", "1")  # the sequence is past every id


def test_copying_the_same_store_twice_with_append_fails_and_keeps_the_target(
    sqlite_url: Callable[[str], str], store_url: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    assert run("copy", "--from", source, "--to", store_url).exit_code == 0
    before = dump(store_url)
    result = run("copy", "--from", source, "--to", store_url, "--append")
    assert result.exit_code == 1
    assert "nothing was copied" in result.stderr
    assert dump(store_url) == before


CORRUPT = {
    "sqlite": [
        "CREATE TRIGGER corrupt AFTER INSERT ON mnests BEGIN "
        "UPDATE mnests SET uses = uses + 1 WHERE id = NEW.id; END"
    ],
    "postgresql": [
        "CREATE FUNCTION corrupt() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN NEW.uses := NEW.uses + 1; RETURN NEW; END $$",
        "CREATE TRIGGER corrupt BEFORE INSERT ON mnests FOR EACH ROW EXECUTE FUNCTION corrupt()",
    ],
}


def test_copy_that_fails_verification_rolls_back_and_exits_1(
    sqlite_url: Callable[[str], str], empty_db_url: str, engine_name: str
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    mnestoma.upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    with engine.begin() as conn:
        for stmt in CORRUPT[engine_name]:
            conn.execute(text(stmt))
    engine.dispose()
    result = run("copy", "--from", source, "--to", empty_db_url)
    assert result.exit_code == 1
    assert "verification failed on mnests" in result.stderr
    assert counts(empty_db_url) == {"mnests": 0, "events": 0, "canonical_query_log": 0}


def _bulk_events(url: str, n: int) -> None:
    engine = make_engine(url)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        {
            "mnest_id": f"mn_bulk{i:012d}",
            "kind": "created",
            "ts": t0 + timedelta(seconds=i),
            "turn_id": f"bulk-{i}",
            "weight_before": None,
            "weight_after": 0.3,
            "state_before": None,
            "state_after": "active",
        }
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(insert(Event.__table__), rows)
    engine.dispose()


def test_copy_of_a_large_store_shows_progress_and_copies_in_chunks(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source = sqlite_url("large.sqlite")
    mnestoma.upgrade(source)
    _bulk_events(source, 12_001)
    result = run("copy", "--from", source, "--to", empty_db_url)
    assert result.exit_code == 0, result.output
    assert "copying rows" in result.stderr
    assert counts(empty_db_url)["events"] == 12_001
    assert dump(empty_db_url)["events"] == dump(source)["events"]


def test_copy_store_sends_every_chunk_and_reports_progress(
    sqlite_url: Callable[[str], str],
) -> None:
    source, target = sqlite_url("source.sqlite"), sqlite_url("target.sqlite")
    seed(source)
    seen: list[int] = []
    totals: list[int] = []

    @contextmanager
    def progress(total: int) -> Iterator[Callable[[int], None]]:
        totals.append(total)
        yield seen.append

    report = copy_store(source, target, chunk_size=3, progress=progress)
    assert sum(seen) == totals[0] == report.total
    assert max(seen) == 3 and len(seen) > 5
    assert dump(target) == dump(source)


def test_copy_from_a_missing_sqlite_file_exits_2_and_creates_nothing(
    tmp_path: Path, sqlite_url: Callable[[str], str]
) -> None:
    missing = tmp_path / "nope" / "store.sqlite"
    target = tmp_path / "target.sqlite"
    result = run("copy", "--from", f"sqlite:///{missing}", "--to", f"sqlite:///{target}")
    assert result.exit_code == 2
    assert not missing.parent.exists() and not target.exists()


def test_copy_onto_itself_is_refused(sqlite_url: Callable[[str], str]) -> None:
    url = sqlite_url("same.sqlite")
    seed(url)
    result = run("copy", "--from", url, "--to", url)
    assert result.exit_code == 2 and "same database" in result.stderr


def test_copy_from_a_source_behind_head_exits_1(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source = sqlite_url("old.sqlite")
    mnestoma.upgrade(source, "0001")
    result = run("copy", "--from", source, "--to", empty_db_url)
    assert result.exit_code == 1 and "mnestoma db upgrade" in result.stderr


def test_copy_to_an_unreachable_target_never_prints_its_password(
    sqlite_url: Callable[[str], str],
) -> None:
    source = sqlite_url("source.sqlite")
    seed(source)
    result = run("copy", "--from", source, "--to", "postgresql://bob:pa55-w0rd-XYZ@127.0.0.1:1/x")
    assert result.exit_code == 1
    assert "pa55-w0rd-XYZ" not in result.output
    assert result.stderr.startswith("Error: ")


def test_copy_checksum_ignores_row_order_but_not_content(
    sqlite_url: Callable[[str], str],
) -> None:
    from mnestoma.copying import table_checksum

    a, b = sqlite_url("a.sqlite"), sqlite_url("b.sqlite")
    seed(a)
    copy_store(a, b)
    ea, eb = make_engine(a), make_engine(b)
    with ea.connect() as ca, eb.begin() as cb:
        table = Mnest.__table__
        assert table_checksum(ca, table) == table_checksum(cb, table)
        cb.execute(table.update().where(table.c.uses == 1).values(weight=table.c.weight / 2))
        assert table_checksum(ca, table) != table_checksum(cb, table)
        assert cb.execute(select(func.count()).select_from(table)).scalar_one() > 0
    ea.dispose()
    eb.dispose()
