"""A seed-era store (revision 0001) holding what its schema allowed but 0002 forbids (two
protos of one key, a turn that both created and reinforced a row) upgrades to head: the
rows merge with the ager's rule, every event is kept, and the upgrade says what it did."""

from __future__ import annotations

import ast
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

import mnestoma
from mnestoma.core import rules
from mnestoma.engines import make_engine
from mnestoma.maintenance import seed_repair
from mnestoma.maintenance.migration import current_revision, head_revision

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LAMBDA = 0.018


def _ts(engine: Engine, when: datetime) -> object:
    """A timestamp as the seed system wrote it: naive UTC text on SQLite."""
    if engine.dialect.name == "sqlite":
        return when.replace(tzinfo=None).isoformat(" ", "microseconds")
    return when


def _row(
    engine: Engine,
    mid: str,
    key: tuple[str, str, str, str | None],
    *,
    weight: float,
    uses: int,
    first: datetime,
    last: datetime,
    state: str = "proto",
    sig: str | None = None,
) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO mnests (id, src_executor, src_version, dst_executor, dst_version,"
                " weight, uses, ts_first, ts_last, decay_lambda, state, desired_sig)"
                " VALUES (:id, :s, :sv, :d, :dv, :w, :u, :f, :l, :lam, :st, :sig)"
            ),
            {
                "id": mid,
                "s": key[0],
                "sv": key[1],
                "d": key[2],
                "dv": key[3],
                "w": weight,
                "u": uses,
                "f": _ts(engine, first),
                "l": _ts(engine, last),
                "lam": LAMBDA,
                "st": state,
                "sig": sig,
            },
        )


def _event(engine: Engine, mid: str, kind: str, when: datetime, turn: str | None) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO events (mnest_id, kind, ts, turn_id, weight_after, state_after)"
                " VALUES (:m, :k, :ts, :t, 0.3, 'proto')"
            ),
            {"m": mid, "k": kind, "ts": _ts(engine, when), "t": turn},
        )


PROTO_KEY = ("read", "2", "pdf.to_text", None)
P1, P2, P3 = "mn_seedproto000001", "mn_seedproto000002", "mn_seedproto000003"
ACTIVE = "mn_seedactive00001"
SUP1, SUP2 = "mn_seedsuper000001", "mn_seedsuper000002"


def _seed_duplicates(url: str) -> None:
    """A 0001 store as a seed system could leave it."""
    mnestoma.upgrade(url, "0001")
    engine = make_engine(url)
    try:
        day = timedelta(days=1)
        # three protos of one key: the oldest keeps its id
        _row(engine, P2, PROTO_KEY, weight=0.45, uses=2, first=T0 + day, last=T0 + 5 * day)
        _row(engine, P1, PROTO_KEY, weight=0.30, uses=1, first=T0, last=T0 + 2 * day)
        _row(
            engine,
            P3,
            PROTO_KEY,
            weight=0.60,
            uses=3,
            first=T0 + 2 * day,
            last=T0 + 3 * day,
            sig='{"summary": "newest wish"}',
        )
        _event(engine, P1, "created", T0, "t-1")
        _event(engine, P2, "created", T0 + day, "t-2")
        _event(engine, P2, "reinforced", T0 + 5 * day, "t-5")
        _event(engine, P1, "reinforced", T0 + 2 * day, "t-5")  # same turn, after the merge too
        _event(engine, P3, "created", T0 + 2 * day, "t-3")
        # one turn that both created and reinforced a row
        _row(engine, ACTIVE, ("search", "1", "read", "2"), weight=0.45, uses=2, first=T0,
             last=T0, state="active")  # fmt: skip
        _event(engine, ACTIVE, "created", T0, "t-9")
        _event(engine, ACTIVE, "reinforced", T0 + timedelta(seconds=1), "t-9")
        # superseded protos share a key too
        sup_key = ("read", "2", "ocr", None)
        _row(engine, SUP1, sup_key, weight=0.2, uses=1, first=T0, last=T0, state="superseded")
        _row(engine, SUP2, sup_key, weight=0.3, uses=4, first=T0 + day, last=T0 + day,
             state="superseded")  # fmt: skip
    finally:
        engine.dispose()


def _events_of(m: mnestoma.Mnestoma, mid: str) -> list[Any]:
    return m.events(mnest_id=mid)


def test_a_0001_store_with_duplicates_upgrades_to_head(empty_db_url: str) -> None:
    _seed_duplicates(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    with mnestoma.Mnestoma(empty_db_url) as m:
        protos = m.edges(states=["proto"])
        assert [p.id for p in protos] == [P1]
        proto = protos[0]
        assert proto.uses == 6
        assert proto.ts_first == T0
        assert proto.ts_last == proto.ts_weight == T0 + timedelta(days=5)
        # the larger effective weight at the latest ts_last: P3's 0.60 two days before
        assert proto.weight == pytest.approx(max(0.45, 0.60 * math.exp(-LAMBDA * 2)))
        assert proto.desired_sig == {"summary": "newest wish"}  # the most recent one that had one
        superseded = m.edges(states=["superseded"])
        assert [(s.id, s.uses) for s in superseded] == [(SUP1, 5)]


def test_every_event_is_kept_and_the_merge_is_recorded(empty_db_url: str) -> None:
    _seed_duplicates(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as m:
        events = m.events()
        assert len(events) == 7 + 2 * 3  # 7 seeded, a merged event on each side of 3 merges
        kept = _events_of(m, P1)
        assert sorted(e.kind for e in kept if e.kind != "merged") == [
            "created",
            "created",
            "created",
            "reinforced",
            "reinforced",
        ]
        merged_here = [e for e in kept if e.kind == "merged"]
        assert sorted(e.related_id for e in merged_here) == [P2, P3]
        assert all("revision 0001" in (e.reason or "") for e in merged_here)
        for gone in (P2, P3):
            (only,) = _events_of(m, gone)
            assert (only.kind, only.related_id) == ("merged", P1)
            assert m.get(gone) is None
        (sup,) = [e for e in _events_of(m, SUP2) if e.kind == "merged"]
        assert sup.related_id == SUP1


def test_a_turn_counts_a_row_once_after_the_upgrade(empty_db_url: str) -> None:
    _seed_duplicates(empty_db_url)
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as m:
        t9 = m.events(turn_id="t-9")
        assert [(e.kind, e.mnest_id) for e in t9] == [("created", ACTIVE)]
        cleared = [e for e in _events_of(m, ACTIVE) if e.kind == "reinforced"]
        assert [e.turn_id for e in cleared] == [None]
        assert "turn t-9" in (cleared[0].reason or "")
        assert m.get(ACTIVE).uses == 2  # both passings happened; only the turn's count is one
        # t-5 reinforced P2 and P1: after the merge one row, counted once for t-5
        t5 = m.events(turn_id="t-5")
        assert [(e.kind, e.mnest_id) for e in t5] == [("reinforced", P1)]
        # a retried turn is still a no-op after the upgrade
        again = m.record_turn("t-9", [("search", "1", "read", "2")])
        assert again[0].uses == 2


def test_a_legacy_stamped_seed_store_with_duplicates_is_adopted_and_repaired(
    empty_db_url: str,
) -> None:
    """A seed-era store stamped by hand in ``alembic_version``: adopted, then repaired."""
    _seed_duplicates(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            conn.execute(text("INSERT INTO alembic_version VALUES ('0001')"))
            conn.execute(text("DROP TABLE mnestoma_alembic_version"))
    finally:
        engine.dispose()
    mnestoma.upgrade(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    with mnestoma.Mnestoma(empty_db_url) as m:
        assert [p.id for p in m.edges(states=["proto"])] == [P1]


def test_staying_at_0001_changes_nothing(empty_db_url: str) -> None:
    _seed_duplicates(empty_db_url)
    mnestoma.upgrade(empty_db_url, "0001")
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mnests")).scalar_one() == 6
            assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 7
    finally:
        engine.dispose()


def test_a_0001_store_without_duplicates_gets_no_merge_events(empty_db_url: str) -> None:
    mnestoma.upgrade(empty_db_url, "0001")
    engine = make_engine(empty_db_url)
    try:
        _row(engine, P1, PROTO_KEY, weight=0.3, uses=1, first=T0, last=T0)
        _event(engine, P1, "created", T0, "t-1")
    finally:
        engine.dispose()
    mnestoma.upgrade(empty_db_url)
    with mnestoma.Mnestoma(empty_db_url) as m:
        assert [e.kind for e in m.events()] == ["created"]
        assert m.get(P1).uses == 1


def test_the_repair_runs_in_the_upgrade_transaction(empty_db_url: str) -> None:
    """A caller's connection that rolls back the upgrade leaves the seed rows untouched."""
    _seed_duplicates(empty_db_url)
    engine = make_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            mnestoma.upgrade(conn)
            assert conn.execute(text("SELECT count(*) FROM mnests")).scalar_one() == 3
            conn.rollback()
        assert current_revision(engine) == "0001"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mnests")).scalar_one() == 6
    finally:
        engine.dispose()


def test_postgresql_statistics_exist_after_an_upgrade(pg_empty_db_url: str) -> None:
    """The planner is not left guessing after a migration (it built indexes): ANALYZE ran."""
    _seed_duplicates(pg_empty_db_url)
    stats = text("SELECT count(*) FROM pg_stats WHERE tablename = 'mnests'")
    engine = make_engine(pg_empty_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(stats).scalar_one() == 0  # rows, but no statistics yet
        mnestoma.upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(stats).scalar_one() > 0
    finally:
        engine.dispose()


def test_the_seed_repair_imports_nothing_later_revisions_may_change() -> None:
    tree = ast.parse(Path(seed_repair.__file__).read_text())
    own = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mnestoma")
    }
    assert own == {"mnestoma.core.types"}, "the 0001-era repair reaches today's rules or rows"


def test_the_seed_repairs_decay_is_the_rules_decay_of_today() -> None:
    """The frozen copy and the rules agree now; should the rules change, the repair keeps 0001's."""
    since = datetime(2026, 1, 1, tzinfo=UTC)
    for days in (0.0, 0.5, 10.0, 400.0, -3.0):
        now = since + timedelta(days=days)
        assert math.isclose(
            seed_repair._decayed_weight(0.8, 0.018, since, now),
            rules.decayed_weight(0.8, 0.018, since, now),
        )
    assert seed_repair._PASSING == rules.PASSING
