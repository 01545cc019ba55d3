"""``mnestoma copy``: a whole store moved between engines, ids kept, verified, all or nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_kit import run
from click.testing import Result
from invariants import check_invariants
from sqlalchemy import func, insert, inspect, select, text

import mnestoma
import mnestoma.errors
from mnestoma.core.rules import decayed_weight
from mnestoma.engines import make_engine
from mnestoma.maintenance.copying import copy_store
from mnestoma.schema.models import AgerRun, CanonicalQuery, Event, Mnest, MnestChain
from mnestoma.testing.clock import MovableClock

TABLES = (
    Mnest.__table__,
    Event.__table__,
    CanonicalQuery.__table__,
    AgerRun.__table__,
    MnestChain.__table__,
)
CHAIN_KEY = ("prev_executor", "src_executor", "dst_executor")


Dump = dict[str, list[dict[str, Any]]]


def dump(url: str) -> Dump:
    """Every row of every table, sorted by id (the chains by key), values as the ORM types
    return them."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {
                t.name: sorted(
                    (dict(r) for r in conn.execute(select(t)).mappings()),
                    key=lambda r: tuple(r[k] for k in CHAIN_KEY) if "id" not in r else r["id"],
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


def seeded_source(sqlite_url: Callable[[str], str]) -> str:
    """The URL of a seeded SQLite store, ``source.sqlite``, to copy from."""
    source = sqlite_url("source.sqlite")
    seed(source)
    return source


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
    source = seeded_source(sqlite_url)
    result = run("copy", "--database-url", source, "--to", empty_db_url)
    assert result.exit_code == 0, result.output
    assert dump(empty_db_url) == dump(source)


def test_copied_store_takes_new_rows_without_id_collisions(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source = seeded_source(sqlite_url)
    assert run("copy", "--from", source, "--to", empty_db_url).exit_code == 0
    last_event = max(r["id"] for r in dump(empty_db_url)["events"])
    with mnestoma.Mnestoma(empty_db_url) as m:
        m.record_passing("new", "1", "row", "1")
        entry = m.log_canonical_query("new raw", "new canonical")
    assert entry.id == len(dump(source)["canonical_query_log"]) + 1
    assert max(r["id"] for r in dump(empty_db_url)["events"]) == last_event + 1


def refused_copy(source: str, target: str, code: int, *options: str) -> Result:
    """``copy --from source --to target``, which must exit with ``code`` and leave the target
    as it was."""
    before = dump(target)
    result = run("copy", "--from", source, "--to", target, *options)
    assert result.exit_code == code, result.output
    assert dump(target) == before
    return result


def test_copy_into_a_non_empty_target_is_refused_without_append(
    sqlite_url: Callable[[str], str], store_url: str
) -> None:
    source = seeded_source(sqlite_url)
    seed(store_url, prefix="other.")
    result = refused_copy(source, store_url, 2)
    assert "not empty" in result.stderr and "--append" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_copy_with_append_adds_rows_and_shifts_integer_ids(
    sqlite_url: Callable[[str], str], store_url: str
) -> None:
    source = seeded_source(sqlite_url)
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
    source = seeded_source(sqlite_url)
    assert run("copy", "--from", source, "--to", store_url).exit_code == 0
    result = refused_copy(source, store_url, 1, "--append")
    assert "share rows" in result.stderr and "nothing was copied" in result.stderr


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
    source = seeded_source(sqlite_url)
    mnestoma.upgrade(empty_db_url)
    engine = make_engine(empty_db_url)
    with engine.begin() as conn:
        for stmt in CORRUPT[engine_name]:
            conn.execute(text(stmt))
    engine.dispose()
    result = run("copy", "--from", source, "--to", empty_db_url)
    assert result.exit_code == 1
    assert "verification failed on mnests" in result.stderr
    assert counts(empty_db_url) == {
        "mnests": 0,
        "events": 0,
        "canonical_query_log": 0,
        "ager_runs": 0,
        "mnest_chains": 0,
    }


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


@pytest.mark.slow  # seconds by design: out of the quick tier
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
    source = seeded_source(sqlite_url)
    result = run("copy", "--from", source, "--to", "postgresql://bob:pa55-w0rd-XYZ@127.0.0.1:1/x")
    assert result.exit_code == 1
    assert "pa55-w0rd-XYZ" not in result.output
    assert result.stderr.startswith("Error: ")


def test_copy_checksum_ignores_row_order_but_not_content(
    sqlite_url: Callable[[str], str],
) -> None:
    from mnestoma.maintenance.copying import table_checksum

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


# --- copy --append merges the edges both stores hold --------------------------------------

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
COPY_AT = T0 + timedelta(days=42)
SHARED = {
    "active": ("plan", "1", "search", "2"),
    "proto": ("plan", "1", "draft", None),
    "decaying": ("old", "1", "gone", "1"),
}


def fill_target(url: str) -> None:
    """The target's side: the shared edges, one of its own, the shared turn, an ager run."""
    clock = MovableClock(T0)
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn(
            "tgt-1",
            [("plan", "1", "search", "2"), ("plan", "1", "draft", None, False, {"side": "t"})],
        )
        clock.advance(hours=1)
        m.record_turn("shared", [("plan", "1", "search", "2")])
        m.record_passing("old", "1", "gone", "1")
        m.record_passing("tgt", "1", "only", "1", turn_id="shared")
        clock.advance(days=40)
        m.apply_ager()  # old->gone becomes decaying
        m.log_canonical_query("target q", "target")


def fill_source(url: str) -> None:
    """The source's side: the same keys under other ids, the same turn on the active edge."""
    clock = MovableClock(T0 + timedelta(hours=3))
    with mnestoma.Mnestoma(url, clock=clock) as m:
        m.record_turn(
            "src-1",
            [
                ("plan", "1", "search", "2"),
                ("plan", "1", "draft", None, False, None, {"summary": "a draft"}),
            ],
        )
        clock.advance(hours=1)
        m.record_turn("shared", [("plan", "1", "search", "2")])
        m.record_turn("src-2", [("plan", "1", "search", "2")])
        m.record_passing("old", "1", "gone", "1")
        m.record_passing("src", "1", "only", "1")
        clock.advance(days=41)
        m.apply_ager()
        m.log_canonical_query("source q", "source")


def by_key(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        (r["src_executor"], r["src_version"], r["dst_executor"], r["dst_version"], r["state"]): r
        for r in rows
    }


def key_of(state: str) -> tuple[Any, ...]:
    return (*SHARED[state], state)


@pytest.fixture
def merged_stores(two_stores: tuple[str, str]) -> tuple[str, str]:
    source, target = two_stores
    fill_target(target)
    fill_source(source)
    return source, target


def append_dumped(source: str, target: str) -> tuple[Dump, Dump, Any]:
    """Both stores' dumps before ``source`` is appended to ``target``, and the report."""
    before, src = dump(target), dump(source)
    return before, src, copy_store(source, target, append=True, clock=lambda: COPY_AT)


def test_copy_append_merges_an_edge_key_both_stores_hold_with_the_agers_rule(
    merged_stores: tuple[str, str],
) -> None:
    source, target = merged_stores
    before, src, report = append_dumped(source, target)
    assert report.merged == 3 and report.turns_counted_once == 1
    after = by_key(dump(target)["mnests"])
    old, new = by_key(before["mnests"]), by_key(src["mnests"])
    assert len(after) == len(old) + len(new) - 3
    for state in SHARED:
        t, s, m = old[key_of(state)], new[key_of(state)], after[key_of(state)]
        assert m["id"] == t["id"]
        assert m["ts_first"] == min(t["ts_first"], s["ts_first"])
        assert m["ts_last"] == max(t["ts_last"], s["ts_last"])
        assert m["ts_weight"] == COPY_AT
        assert m["decay_lambda"] == t["decay_lambda"]
        weights = [
            decayed_weight(r["weight"], r["decay_lambda"], r["ts_weight"], COPY_AT) for r in (t, s)
        ]
        assert m["weight"] == pytest.approx(max(weights), rel=1e-12)
    # the turn "shared" passed plan@1 -> search@2 in both stores: counted once
    active = (old[key_of("active")], new[key_of("active")], after[key_of("active")])
    assert (active[0]["uses"], active[1]["uses"], active[2]["uses"]) == (2, 3, 4)
    assert after[key_of("decaying")]["uses"] == 2
    proto = after[key_of("proto")]
    assert proto["uses"] == 2
    assert proto["tags"] == {"side": "t"}  # the target's
    assert proto["desired_sig"] == {"summary": "a draft"}  # the source's, the target had none
    # rows held by one store only are copied as they are
    shared = {key_of(state) for state in SHARED}
    for side in (old, new):
        assert all(after[key] == row for key, row in side.items() if key not in shared)


def test_copy_append_keeps_every_event_and_moves_the_merged_rows_history(
    merged_stores: tuple[str, str],
) -> None:
    source, target = merged_stores
    before, src, report = append_dumped(source, target)
    events = dump(target)["events"]
    assert len(events) == len(before["events"]) + len(src["events"]) + 2 * report.merged
    offset = report.id_offsets["events"]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    moved = {e["id"] - offset: e for e in events if offset < e["id"] <= offset + len(src["events"])}
    t_active = by_key(before["mnests"])[key_of("active")]
    s_active = by_key(src["mnests"])[key_of("active")]
    for original in src["events"]:
        copied = moved[original["id"]]
        if original["mnest_id"] == s_active["id"]:
            # the source row's history moved, but for the turn the target had counted
            stays = original["turn_id"] == "shared"
            assert copied["mnest_id"] == (s_active["id"] if stays else t_active["id"])
        for column in ("kind", "ts", "turn_id", "weight_before", "weight_after", "recorder"):
            assert copied[column] == original[column]
    merges = [e for e in events if e["kind"] == "merged" and e["ts"] == COPY_AT]
    assert len(merges) == 6
    on_target = next(e for e in merges if e["mnest_id"] == t_active["id"])
    on_source = next(e for e in merges if e["mnest_id"] == s_active["id"])
    assert on_target["related_id"] == s_active["id"] and on_source["related_id"] == t_active["id"]
    weight = by_key(dump(target)["mnests"])[key_of("active")]["weight"]
    assert on_target["weight_after"] == on_source["weight_after"] == weight
    assert on_target["weight_before"] == pytest.approx(
        decayed_weight(t_active["weight"], t_active["decay_lambda"], t_active["ts_weight"], COPY_AT)
    )
    assert (on_target["state_before"], on_target["state_after"]) == ("active", "active")
    assert (on_source["state_before"], on_source["state_after"]) == (None, "active")
    assert {e["recorder"] for e in merges} == {"call"}
    with mnestoma.Mnestoma(target) as m:
        assert m.get(s_active["id"]) is None
        left = [(e.kind, e.turn_id) for e in m.events(mnest_id=s_active["id"])]
        assert left == [("reinforced", "shared"), ("merged", None)]


def test_copy_append_counts_a_turn_both_stores_recorded_on_an_edge_once(
    merged_stores: tuple[str, str],
) -> None:
    source, target = merged_stores
    copy_store(source, target, append=True, clock=lambda: COPY_AT)
    with mnestoma.Mnestoma(target, clock=lambda: COPY_AT) as m:
        row = m.find(*SHARED["active"])
        assert row is not None and row.uses == 4
        shared = [e for e in m.events(turn_id="shared") if e.mnest_id == row.id]
        assert [(e.kind, e.recorder) for e in shared] == [("reinforced", "call")]
        # the source's passing of that turn stays, unchanged, on the absorbed row's id
        absorbed = [e for e in m.events(turn_id="shared") if m.get(e.mnest_id) is None]
        assert [(e.kind, e.reason) for e in absorbed] == [("reinforced", None)]
        passings = [e for e in m.events(mnest_id=row.id) if e.kind in ("created", "reinforced")]
        assert len(passings) == row.uses and all(e.turn_id is not None for e in passings)
        # idempotency holds on the merged row for the turns of both stores
        for turn in ("shared", "tgt-1", "src-1", "src-2"):
            m.record_turn(turn, [SHARED["active"]])
        again = m.find(*SHARED["active"])
        assert again is not None and again.uses == 4
        m.record_turn("new-turn", [SHARED["active"]])
        latest = m.find(*SHARED["active"])
        assert latest is not None and latest.uses == 5


def test_copy_append_merged_events_say_which_row_absorbed_which(
    merged_stores: tuple[str, str],
) -> None:
    """As in the ager's demotion merge, the absorbing row's merged event keeps its state and
    the absorbed row's does not (it was not in the target: no state before); the package's
    invariant checker reads the active and the decaying pair the same way."""
    source, target = merged_stores
    old, new = by_key(dump(target)["mnests"]), by_key(dump(source)["mnests"])
    copy_store(source, target, append=True, clock=lambda: COPY_AT)
    merges = {e["mnest_id"]: e for e in dump(target)["events"] if e["kind"] == "merged"}
    for state in SHARED:
        kept, absorbed = old[key_of(state)]["id"], new[key_of(state)]["id"]
        on_kept, on_absorbed = merges[kept], merges[absorbed]
        assert (on_kept["state_before"], on_kept["state_after"]) == (state, state)
        assert (on_absorbed["state_before"], on_absorbed["state_after"]) == (None, state)
        assert (on_kept["related_id"], on_absorbed["related_id"]) == (absorbed, kept)
    check_invariants(target)


def test_a_store_merged_by_copies_and_the_ager_passes_the_invariant_checker(
    merged_stores: tuple[str, str], tmp_path: Path
) -> None:
    """Copy merges and demotion merges on the same rows, then the merged store merged again
    into a third store: every history still adds up."""
    source, target = merged_stores
    copy_store(source, target, append=True, clock=lambda: COPY_AT)
    clock = MovableClock(COPY_AT + timedelta(days=1))
    with mnestoma.Mnestoma(target, clock=clock) as m:
        m.record_turn("after", [SHARED["decaying"], SHARED["active"]])
        clock.advance(days=60)
        report = m.apply_ager()  # the new old->gone row merges into the copy's decaying row
    assert report.merged == 1
    check_invariants(target)
    third = f"sqlite:///{tmp_path / 'third.sqlite'}"
    mnestoma.upgrade(third)
    fill_source(third)
    later = COPY_AT + timedelta(days=90)
    # old->gone and src->only are decaying in both (plan->search decayed in the target only,
    # the proto was pruned): each target row brings the rows it had absorbed with it
    assert copy_store(target, third, append=True, clock=lambda: later).merged == 2
    check_invariants(third)


def test_copy_append_through_the_command_line_reports_the_merges(
    merged_stores: tuple[str, str],
) -> None:
    source, target = merged_stores
    result = run("copy", "--from", source, "--to", target, "--append", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["merged"], report["turns_counted_once"], report["verified"]) == (3, 1, True)
    recorders = {e["recorder"] for e in dump(target)["events"] if e["kind"] == "merged"}
    assert "cli" in recorders
    text_run = run("copy", "--from", source, "--to", target, "--append")
    assert text_run.exit_code == 1 and "share rows" in text_run.stderr  # already merged


def test_copy_append_that_fails_after_merging_leaves_the_target_as_it_was(
    merged_stores: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnestoma.maintenance import copying

    source, target = merged_stores
    before = dump(target)
    original = copying._Job._verify

    def verify_then_fail(self: Any, tconn: Any) -> None:
        original(self, tconn)  # every merge and row was written and checked
        raise RuntimeError("disk full")

    monkeypatch.setattr(copying._Job, "_verify", verify_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        copy_store(source, target, append=True, clock=lambda: COPY_AT)
    assert dump(target) == before


def test_copy_help_states_the_merge_rule() -> None:
    result = run("copy", "--help")
    assert result.exit_code == 0
    text_ = " ".join(result.stdout.split())
    for phrase in ("--append", "ager's rule", "counts once", "larger of the two effective"):
        assert phrase in text_


# --- failures leave nothing behind; revisions; statistics ---------------------------------


def test_a_failed_copy_into_a_new_sqlite_file_removes_it_and_its_folders(
    tmp_path: Path, sqlite_url: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnestoma.maintenance import copying

    source = seeded_source(sqlite_url)
    target = tmp_path / "new" / "deeper" / "target.sqlite"

    def fail(self: Any, tconn: Any) -> None:
        raise copying.CopyVerificationError("verification failed on mnests: injected")

    monkeypatch.setattr(copying._Job, "_verify", fail)
    result = run("copy", "--from", source, "--to", f"sqlite:///{target}")
    assert result.exit_code == 1 and "injected" in result.stderr
    assert not (tmp_path / "new").exists()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in left if not n.endswith((".lock", ".bell"))] == ["source.sqlite"]


def test_a_refused_copy_creates_no_target_file_nor_folder(
    tmp_path: Path, sqlite_url: Callable[[str], str]
) -> None:
    source = sqlite_url("old.sqlite")
    mnestoma.upgrade(source, "0001")  # behind head: refused before anything is copied
    target = tmp_path / "new" / "target.sqlite"
    result = run("copy", "--from", source, "--to", f"sqlite:///{target}")
    assert result.exit_code == 1 and "mnestoma db upgrade" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.sqlite"]


def test_a_failed_copy_into_an_existing_sqlite_file_keeps_the_file(
    tmp_path: Path, sqlite_url: Callable[[str], str]
) -> None:
    source, target = sqlite_url("source.sqlite"), sqlite_url("target.sqlite")
    seed(source)
    seed(target, prefix="other.")
    refused_copy(source, target, 2)  # not empty, no --append


def _store_with_deep_json(url: str, levels: int) -> str:
    """A store holding a desired_sig nested ``levels`` deep, written past the package's check
    (as an older release could)."""
    with mnestoma.Mnestoma(url) as m:
        proto = m.record_passing("a", "1", "b", dst_exists=False)
    engine = make_engine(url)
    deep = '{"k": ' * levels + "1" + "}" * levels
    with engine.begin() as conn:
        conn.execute(text("UPDATE mnests SET desired_sig = :d"), {"d": deep})
    engine.dispose()
    return proto.id


def test_a_store_holding_json_600_deep_from_an_older_release_still_copies(
    sqlite_url: Callable[[str], str],
) -> None:
    source, target = sqlite_url("deep.sqlite"), sqlite_url("target.sqlite")
    proto_id = _store_with_deep_json(source, 600)
    assert run("copy", "--from", source, "--to", target).exit_code == 0
    with mnestoma.Mnestoma(target) as m:
        got = m.get(proto_id)
    assert got is not None
    depth, value = 0, got.desired_sig
    while isinstance(value, dict):
        depth, value = depth + 1, value["k"]
    assert depth == 600


def test_a_copy_that_cannot_read_its_source_leaves_no_target_file(
    tmp_path: Path, sqlite_url: Callable[[str], str]
) -> None:
    source = sqlite_url("deep.sqlite")
    _store_with_deep_json(source, 20_000)  # deeper than Python's JSON reader goes
    target = tmp_path / "target.sqlite"
    result = run("copy", "--from", source, "--to", f"sqlite:///{target}")
    assert result.exit_code == 1
    assert "nested too deeply" in result.stderr and "nothing was copied" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.sqlite"]


def _stamp(url: str, revision: str) -> None:
    """Write ``revision`` into the store's version table, as a newer release would."""
    engine = make_engine(url)
    with engine.begin() as conn:
        tables = set(inspect(conn).get_table_names())
        table = (
            "mnestoma_alembic_version"
            if "mnestoma_alembic_version" in tables
            else "alembic_version"
        )
        conn.execute(text(f"UPDATE {table} SET version_num = :r"), {"r": revision})
    engine.dispose()
    assert mnestoma.current_revision(url) == revision


@pytest.mark.parametrize("side", ["source", "target"])
def test_copy_with_a_revision_newer_than_the_package_says_upgrade_the_package(
    side: str, sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source, target = sqlite_url("source.sqlite"), empty_db_url
    seed(source)
    mnestoma.upgrade(target)
    _stamp(source if side == "source" else target, "ffff00000000")
    result = refused_copy(source, target, 1)
    assert "upgrade the mnestoma package" in result.stderr
    assert "db upgrade" not in result.stderr
    assert f"the {side} " in result.stderr


def test_copy_into_postgresql_leaves_planner_statistics(
    sqlite_url: Callable[[str], str], pg_empty_db_url: str
) -> None:
    source = seeded_source(sqlite_url)
    _bulk_events(source, 300)
    assert run("copy", "--from", source, "--to", pg_empty_db_url).exit_code == 0
    engine = make_engine(pg_empty_db_url)
    with engine.connect() as conn:
        reltuples = dict(
            conn.execute(
                text(
                    "SELECT relname, reltuples FROM pg_class WHERE relname IN "
                    "('mnests', 'events', 'canonical_query_log', 'ager_runs')"
                )
            ).all()
        )
        with_stats = {
            name
            for (name,) in conn.execute(
                text("SELECT DISTINCT tablename FROM pg_stats WHERE schemaname = current_schema()")
            )
        }
    engine.dispose()
    assert reltuples["events"] >= 300 and reltuples["mnests"] > 0
    assert {"mnests", "events", "canonical_query_log", "ager_runs"} <= with_stats


def test_json_numbers_that_postgresql_rewrites_still_verify(
    sqlite_url: Callable[[str], str], empty_db_url: str
) -> None:
    source, back = sqlite_url("source.sqlite"), sqlite_url("back.sqlite")
    sig = {"big": 1e16, "huge": 1e300, "tiny": 1.5e-7, "sum": 0.1 + 0.2, "zero": -0.0, "n": 3}
    with mnestoma.Mnestoma(source) as m:
        proto = m.record_passing("a", "1", "b", dst_exists=False, tags=[5.0], desired_sig=sig)
    copy_store(source, empty_db_url)
    copy_store(empty_db_url, back)
    for url in (empty_db_url, back):
        with mnestoma.Mnestoma(url) as m:
            got = m.get(proto.id)
        assert got is not None and got.desired_sig is not None
        assert {k: float(v) for k, v in got.desired_sig.items()} == sig


# --- a copy knows what it already copied -----------------------------------------------------


def _one_edge(url: str, *, turn: str | None, at: datetime) -> None:
    with mnestoma.Mnestoma(url, clock=lambda: at) as m:
        m.record_passing("plan", "1", "search", "2", turn_id=turn)


@pytest.mark.parametrize("turns", [False, True], ids=["without-turn-ids", "with-turn-ids"])
def test_appending_the_same_source_again_is_refused_even_once_all_its_rows_merged(
    two_stores: tuple[str, str], turns: bool
) -> None:
    """The first append merges the source's only row into the target's: that id is no row of
    the target, but the target's events keep it (the absorbed row's merged event), and the
    next append of the same source is refused instead of counting its passings again."""
    source, target = two_stores
    _one_edge(target, turn="t-target" if turns else None, at=T0)
    _one_edge(source, turn="t-source" if turns else None, at=T0 + timedelta(hours=1))
    first = run("copy", "--from", source, "--to", target, "--append", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["merged"] == 1
    after_first = dump(target)
    [edge] = after_first["mnests"]
    assert edge["uses"] == 2
    for _ in range(2):
        again = run("copy", "--from", source, "--to", target, "--append")
        assert again.exit_code == 1, again.output
        [line] = again.stderr.splitlines()
        assert "share rows (was one copied from the other?)" in line
        assert "nothing was copied" in line and "UNIQUE" not in line.upper()
        assert dump(target) == after_first


def test_appending_a_store_back_into_the_one_it_absorbed_is_refused(
    two_stores: tuple[str, str],
) -> None:
    """A into B, then B into A: B's events name A's row, so B's counts already hold A's."""
    source, target = two_stores
    _one_edge(target, turn=None, at=T0)
    _one_edge(source, turn=None, at=T0 + timedelta(hours=1))
    copy_store(source, target, append=True, clock=lambda: COPY_AT)
    before = dump(source)
    with pytest.raises(mnestoma.errors.StoresShareRows, match="share rows"):
        copy_store(target, source, append=True, clock=lambda: COPY_AT)
    assert dump(source) == before


def test_appending_two_stores_that_both_absorbed_a_third_is_refused(
    two_stores: tuple[str, str], tmp_path: Path
) -> None:
    """C appended into A and into B: appending A into B would count C's passings twice."""
    a, b = two_stores
    c = f"sqlite:///{tmp_path / 'third.sqlite'}"
    mnestoma.upgrade(c)
    for url, hours in ((a, 0), (b, 1), (c, 2)):
        _one_edge(url, turn=None, at=T0 + timedelta(hours=hours))
    copy_store(c, a, append=True, clock=lambda: COPY_AT)
    copy_store(c, b, append=True, clock=lambda: COPY_AT)
    before = dump(b)
    with pytest.raises(mnestoma.errors.StoresShareRows):
        copy_store(a, b, append=True, clock=lambda: COPY_AT)
    assert dump(b) == before
