"""Every CHECK and unique rule of contract §2 is enforced by the database itself."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import mnest_row
from sqlalchemy import Engine, insert, select, text
from sqlalchemy.exc import DataError, IntegrityError, StatementError
from sqlalchemy.orm import Session

from mnestoma import InvalidInput, Mnest, MnestomaView, ReadOnlyError
from mnestoma.core.errors import translate_errors
from mnestoma.engines import make_engine
from mnestoma.schema.models import Event

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = make_engine(store_url)
    yield eng
    eng.dispose()


def _row(**overrides: Any) -> dict[str, Any]:
    return (
        mnest_row(
            T0,
            id="mn_schematest0001",
            src_executor="search",
            dst_executor="read",
            dst_version="2",
            weight=0.3,
            tags=None,
            desired_sig=None,
        )
        | overrides
    )


def _insert(engine: Engine, *rows: dict[str, Any]) -> None:
    with engine.begin() as conn:
        for r in rows:
            conn.execute(insert(Mnest.__table__), r)


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM mnests")).scalar_one()


def test_a_valid_row_is_accepted(engine: Engine) -> None:
    _insert(engine, _row())
    assert _count(engine) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"weight": 1.01}, id="weight-above-1"),
        pytest.param({"weight": -0.01}, id="weight-below-0"),
        pytest.param({"uses": 0}, id="uses-zero"),
        pytest.param({"ts_last": T0 - timedelta(seconds=1)}, id="ts_last-before-ts_first"),
        pytest.param({"decay_lambda": -0.001}, id="negative-decay"),
        pytest.param({"state": "retired"}, id="unknown-state"),
        pytest.param({"state": "proto"}, id="proto-with-version"),
        pytest.param({"dst_version": None}, id="active-without-version"),
        pytest.param({"state": "decaying", "dst_version": None}, id="decaying-without-version"),
        pytest.param({"src_executor": ""}, id="empty-src"),
        pytest.param({"src_executor": "   "}, id="blank-src"),
        pytest.param({"src_version": ""}, id="empty-src-version"),
        pytest.param({"dst_executor": ""}, id="empty-dst"),
        pytest.param({"dst_version": " "}, id="blank-dst-version"),
        pytest.param({"src_executor": "x" * 256}, id="src-over-255"),
        pytest.param({"id": "xx_notamnestid"}, id="id-without-prefix"),
        pytest.param({"id": "mn_short"}, id="id-too-short"),
        pytest.param({"src_executor": None}, id="null-src"),
        pytest.param({"weight": None}, id="null-weight"),
        pytest.param({"ts_weight": None}, id="null-ts_weight"),
    ],
)
def test_a_row_breaking_a_rule_is_rejected_by_the_database(
    engine: Engine, overrides: dict[str, Any]
) -> None:
    # PostgreSQL enforces the 255-character limit through varchar(255): a DataError
    with pytest.raises((IntegrityError, DataError)):
        _insert(engine, _row(**overrides))
    assert _count(engine) == 0


def test_two_active_rows_with_the_same_key_are_rejected(engine: Engine) -> None:
    with pytest.raises(IntegrityError):
        _insert(engine, _row(), _row(id="mn_schematest0002"))


def test_two_protos_with_the_same_key_are_rejected_despite_null_version(engine: Engine) -> None:
    proto = {"dst_version": None, "state": "proto"}
    with pytest.raises(IntegrityError):
        _insert(engine, _row(**proto), _row(id="mn_schematest0002", **proto))
    assert _count(engine) == 0


def test_two_superseded_protos_with_the_same_key_are_rejected(engine: Engine) -> None:
    gone = {"dst_version": None, "state": "superseded"}
    with pytest.raises(IntegrityError):
        _insert(engine, _row(**gone), _row(id="mn_schematest0002", **gone))


def test_the_same_edge_may_exist_once_per_state_and_version(engine: Engine) -> None:
    _insert(
        engine,
        _row(),
        _row(id="mn_schematest0002", state="decaying"),
        _row(id="mn_schematest0003", state="superseded"),
        _row(id="mn_schematest0004", dst_version="3"),
        _row(id="mn_schematest0005", dst_version=None, state="proto"),
        _row(id="mn_schematest0006", src_executor="read", dst_executor="search"),
    )
    assert _count(engine) == 6


def test_one_turn_creates_or_reinforces_a_row_once(engine: Engine) -> None:
    ev = {"mnest_id": "mn_schematest0001", "kind": "reinforced", "ts": T0, "turn_id": "t-1"}
    with engine.begin() as conn:
        conn.execute(insert(Event.__table__), ev)
        # other kinds and other turns are fine
        conn.execute(insert(Event.__table__), {**ev, "kind": "transition"})
        conn.execute(insert(Event.__table__), {**ev, "turn_id": "t-2"})
        conn.execute(insert(Event.__table__), {**ev, "turn_id": None})
        conn.execute(insert(Event.__table__), {**ev, "turn_id": None})
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(Event.__table__), {**ev, "kind": "created"})


def test_an_unknown_event_kind_is_rejected(engine: Engine) -> None:
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(
            insert(Event.__table__),
            {"mnest_id": "mn_x", "kind": "exploded", "ts": T0},
        )


def test_timestamps_come_back_aware_utc(engine: Engine) -> None:
    paris = timezone(timedelta(hours=1))
    local = datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=paris)
    _insert(engine, _row(ts_first=local, ts_last=local, ts_weight=local))
    with Session(engine) as s:
        m = s.scalars(select(Mnest)).one()
        for value in (m.ts_first, m.ts_last, m.ts_weight):
            assert value.tzinfo is not None and value.utcoffset() == timedelta(0)
            assert value == T0.replace(microsecond=123456)


def test_a_naive_datetime_is_refused(engine: Engine) -> None:
    with pytest.raises(StatementError) as caught, engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), _row(ts_first=datetime(2026, 1, 1)))
    assert isinstance(caught.value.orig, InvalidInput)
    with pytest.raises(InvalidInput), translate_errors(), engine.begin() as conn:
        conn.execute(insert(Mnest.__table__), _row(ts_first=datetime(2026, 1, 1)))
    assert _count(engine) == 0


def test_json_columns_round_trip(engine: Engine) -> None:
    sig = {"summary": "turn a PDF into text", "inputs": ["pdf"], "outputs": ["text"]}
    _insert(engine, _row(dst_version=None, state="proto", desired_sig=sig, tags={"team": "a"}))
    with Session(engine) as s:
        m = s.scalars(select(Mnest)).one()
        assert (m.desired_sig, m.tags) == (sig, {"team": "a"})


def test_the_view_shows_only_active_and_proto_rows(engine: Engine) -> None:
    _insert(
        engine,
        _row(),
        _row(id="mn_schematest0002", dst_version=None, state="proto"),
        _row(id="mn_schematest0003", state="decaying"),
        _row(id="mn_schematest0004", state="superseded"),
    )
    with Session(engine) as s:
        rows = s.scalars(select(MnestomaView).order_by(MnestomaView.id)).all()
        assert [r.state for r in rows] == ["active", "proto"]
        assert rows[0].ts_weight == T0


def test_the_session_refuses_to_write_through_the_view(engine: Engine) -> None:
    _insert(engine, _row())
    with Session(engine) as s:
        row = s.scalars(select(MnestomaView)).one()
        row.weight = 0.9
        with pytest.raises(ReadOnlyError):
            s.flush()
        s.rollback()
        s.add(MnestomaView(**{c: getattr(row, c) for c in ("id", "src_executor")}))
        with pytest.raises(ReadOnlyError):
            s.flush()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT weight FROM mnests")).scalar_one() == 0.3
