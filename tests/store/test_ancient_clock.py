"""Instants the store cannot hold are refused before anything is written, on both engines.

SQLite keeps an instant as text that reads back (and sorts) only with a four-digit year, so
a clock before year 1000 once wrote rows that no later read could parse; at year 1 the ager
overflowed. A clock reading, or a datetime a caller stores, outside the store's range is now
:class:`InvalidInput`, and the store stays as it was and readable.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import mnest_row
from sqlalchemy import text

import mnestoma
from mnestoma import InvalidInput, Mnest, UnitOfWork, make_engine, make_session_factory
from mnestoma.core.types import EARLIEST_CLOCK, EARLIEST_INSTANT, INSTANTS_END

NORMAL = datetime(2026, 1, 1, 12, tzinfo=UTC)
OUT_OF_RANGE = {
    "year-999": datetime(999, 6, 1, tzinfo=UTC),
    "year-1": datetime(1, 1, 1, tzinfo=UTC),
    "year-1-east-of-utc": datetime(1, 1, 1, 2, tzinfo=timezone(timedelta(hours=5))),
    "last-day-of-9999": datetime(9999, 12, 31, 12, tzinfo=UTC),
    "last-instant-of-python": datetime.max.replace(tzinfo=UTC),
}


def fixed(when: datetime) -> Callable[[], datetime]:
    return lambda: when


def everything(url: str) -> dict[str, Any]:
    """What the store holds, read by a facade with an ordinary clock."""
    with mnestoma.Mnestoma(url, clock=fixed(NORMAL)) as store:
        return {
            "edges": sorted(tuple(sorted(m.as_dict().items())) for m in store.edges()),
            "events": [(e.kind, e.ts) for e in store.events()],
            "suggest": [(m.id, w) for m, w in store.suggest_next("a")],
        }


@pytest.mark.parametrize("label", sorted(OUT_OF_RANGE))
def test_a_clock_outside_the_stores_years_is_refused_and_writes_nothing(
    store_url: str, label: str
) -> None:
    with mnestoma.Mnestoma(store_url, clock=fixed(NORMAL)) as store:
        store.record_passing("a", "1", "b", "1")
    before = everything(store_url)
    with mnestoma.Mnestoma(store_url, clock=fixed(OUT_OF_RANGE[label])) as store:
        with pytest.raises(InvalidInput, match="clock"):
            store.record_passing("a", "1", "b", "1")
        with pytest.raises(InvalidInput, match="clock"):
            store.record_passing("a", "1", "c", "1")
        with pytest.raises(InvalidInput, match="clock"):
            store.apply_ager()
    assert everything(store_url) == before


def test_the_store_takes_instants_exactly_within_its_years(store_url: str) -> None:
    """The first clock reading it works at and the last instant it holds are written and
    read back (PostgreSQL in a session zone 14 h east of UTC, where the day after would be
    year 10000); a microsecond outside either is refused."""
    last = INSTANTS_END - timedelta(microseconds=1)
    for when in (EARLIEST_CLOCK, last):
        with mnestoma.Mnestoma(store_url, clock=fixed(when)) as store:
            store.apply_ager()
            edge = store.record_passing("a", "1", f"b{when.year}", "1")
            assert edge.ts_first == when
    for when in (EARLIEST_CLOCK - timedelta(microseconds=1), INSTANTS_END):
        with (
            mnestoma.Mnestoma(store_url, clock=fixed(when)) as store,
            pytest.raises(InvalidInput, match="clock"),
        ):
            store.record_passing("a", "1", "b", "1")
    connect_args = (
        {"options": "-c TimeZone=Pacific/Kiritimati"} if "postgresql" in store_url else {}
    )
    engine = make_engine(store_url, connect_args=connect_args)
    try:
        with mnestoma.Mnestoma(engine, clock=fixed(NORMAL)) as store:
            assert sorted(m.ts_last for m in store.edges()) == [EARLIEST_CLOCK, last]
    finally:
        engine.dispose()


def new_row(when: datetime) -> Mnest:
    return Mnest(**mnest_row(when, id="mn_" + secrets.token_urlsafe(12), weight=0.3))


@pytest.mark.parametrize(
    "when",
    [EARLIEST_INSTANT - timedelta(microseconds=1), datetime(1, 1, 1, tzinfo=UTC), INSTANTS_END],
    ids=["year-999", "year-1", "last-day-of-9999"],
)
def test_a_datetime_a_caller_stores_outside_the_stores_years_is_refused(
    store_url: str, when: datetime
) -> None:
    engine = make_engine(store_url)
    try:
        with UnitOfWork(make_session_factory(engine)) as uow:
            uow.session.add(new_row(when))
            with pytest.raises(InvalidInput, match="from 1000-01-01 to 9999-12-30"):
                uow.commit()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM mnests")).scalar() == 0
    finally:
        engine.dispose()
    assert everything(store_url)["edges"] == []


# --- an offset that moves an instant out of the years 1 to 9999 -----------------------------

EAST_OF_YEAR_1 = "0001-01-01T02:00:00+05:00"  # 31 December of year 0 in UTC
WEST_OF_9999 = "9999-12-31T23:00:00-05:00"  # 1 January of year 10000 in UTC
OFFSET_OUT = {
    "year-1-east": datetime.fromisoformat(EAST_OF_YEAR_1),
    "9999-west": datetime.fromisoformat(WEST_OF_9999),
}


@pytest.mark.parametrize("when", [EAST_OF_YEAR_1, WEST_OF_9999], ids=["year-1-east", "9999-west"])
@pytest.mark.parametrize(
    "command",
    [["vet", "a", "b", "--at"], ["graph", "--at"], ["prune-events", "--before"]],
    ids=["vet", "graph", "prune-events"],
)
def test_an_instant_an_offset_moves_out_of_range_is_bad_input_on_the_command_line(
    store_url: str, command: list[str], when: str
) -> None:
    """Exit 2 and one line that names the option, never an OverflowError and exit 1."""
    from click.testing import CliRunner

    from mnestoma.cli import cli

    with mnestoma.Mnestoma(store_url, clock=fixed(NORMAL)) as store:
        store.record_passing("a", "1", "b", "1")
    before = everything(store_url)
    result = CliRunner().invoke(cli, [*command, when, "--database-url", store_url])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Error: {command[-1]} ") and "Overflow" not in line
    assert "outside the years 1 to 9999" in line
    assert everything(store_url) == before


@pytest.mark.parametrize("label", sorted(OFFSET_OUT))
def test_an_instant_an_offset_moves_out_of_range_is_invalid_input_in_python(
    store_url: str, label: str
) -> None:
    when = OFFSET_OUT[label]
    with mnestoma.Mnestoma(store_url, clock=fixed(NORMAL)) as store:
        edge = store.record_passing("a", "1", "b", "1")
        before = everything(store_url)
        for call in (
            lambda: store.prune_events(when),
            lambda: store.prune_events(when, dry_run=True),
            lambda: edge.effective_weight(when),
        ):
            with pytest.raises(InvalidInput, match="outside the years 1 to 9999"):
                call()
    with mnestoma.Mnestoma(store_url, clock=fixed(when)) as store:
        for call in (lambda: store.vet([("a", None), ("b", None)]), store.graph):
            with pytest.raises(InvalidInput, match="clock"):
                call()
    assert everything(store_url) == before


@pytest.mark.parametrize("label", sorted(OFFSET_OUT))
def test_the_async_door_refuses_an_instant_an_offset_moves_out_of_range(
    store_url: str, label: str
) -> None:
    import asyncio

    from mnestoma.doors.asynchronous import AsyncMnestoma

    async def prune() -> None:
        async with AsyncMnestoma(store_url, clock=fixed(NORMAL)) as store:
            await store.prune_events(OFFSET_OUT[label])

    with pytest.raises(InvalidInput, match="outside the years 1 to 9999"):
        asyncio.run(prune())


def test_a_movable_clock_moved_past_the_years_1_to_9999_is_invalid_input() -> None:
    from mnestoma.testing.clock import MovableClock

    clock = MovableClock(datetime(9999, 12, 1, tzinfo=UTC))
    with pytest.raises(InvalidInput, match="years 1 to 9999"):
        clock.advance(days=400)
    with pytest.raises(InvalidInput, match="years 1 to 9999"):
        clock.advance(days=10**12)  # beyond what a timedelta holds
    assert clock() == datetime(9999, 12, 1, tzinfo=UTC)  # unmoved
