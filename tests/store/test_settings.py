"""One settings object, carried whole: every door hands the same ``Settings`` on."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import mnestoma
from mnestoma import InvalidInput, Settings, UnitOfWork, WriteLockTimeout
from mnestoma.core.rules import LOCK_TIMEOUT_MAX_S
from mnestoma.doors.asynchronous import AsyncMnestoma, AsyncUnitOfWork, make_async_session_factory
from mnestoma.engines import make_engine, make_session_factory
from mnestoma.engines.locking import take_write_lock
from mnestoma.testing.clock import MovableClock

PACKAGE = Path(mnestoma.__file__).resolve().parent
# The constructors that take settings; inside the package each call hands them whole.
TAKES_SETTINGS = {
    "MnestRepository",
    "CanonicalQueryRepository",
    "UnitOfWork",
    "JoinedUnitOfWork",
    "ConnectionUnitOfWork",
    "AsyncMnestRepository",
    "AsyncCanonicalQueryRepository",
    "AsyncUnitOfWork",
    "AsyncJoinedUnitOfWork",
    "written",
    "age_in_batches",
}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def test_inside_the_package_settings_travel_whole_never_as_clock_or_recorder() -> None:
    """A layer that builds another hands it ``settings=``: no clock or recorder threaded
    through on its own, which is how a setting used to get dropped on the way."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            if _name(call) not in TAKES_SETTINGS:
                continue
            names = {k.arg for k in call.keywords}
            if "settings" not in names or names & {"clock", "recorder"}:
                offenders.append(f"{path.relative_to(PACKAGE)}:{call.lineno} {_name(call)}")
    assert offenders == []


# The doors a user calls with ``clock=`` / ``recorder=`` (contract §5), which fold them into
# the settings once; every other constructor or function takes ``settings=`` alone.
USER_DOORS = {
    "Mnestoma",
    "AsyncMnestoma",
    "FacadeBase",  # the constructor both facades inherit
    "UnitOfWork",
    "JoinedUnitOfWork",
    "AsyncUnitOfWork",
    "AsyncJoinedUnitOfWork",
    "MnestRepository",
    "CanonicalQueryRepository",
    "AsyncMnestRepository",
    "AsyncCanonicalQueryRepository",
    "settings_of",
}


def test_only_the_doors_a_user_calls_take_settings_beside_a_clock_or_recorder() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for owner in tree.body:  # the module's functions and classes (each class's methods)
            if not isinstance(owner, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            functions = [owner] if not isinstance(owner, ast.ClassDef) else owner.body
            for fn in functions:
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                args = fn.args
                names = {a.arg for a in [*args.args, *args.kwonlyargs]}
                door = owner.name if fn.name == "__init__" else fn.name
                if "settings" in names and names & {"clock", "recorder"} and door not in USER_DOORS:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{fn.lineno} {door}")
    assert offenders == []


def test_the_facades_settings_reach_every_unit_and_repository(store_url: str) -> None:
    clock = MovableClock(datetime(2026, 5, 1, tzinfo=UTC))
    settings = Settings(clock=clock, recorder="tracer", ager_batch_rows=7)
    with mnestoma.Mnestoma(store_url, settings=settings) as m:
        assert m.settings is settings
        with m.unit_of_work() as uow:
            assert uow.settings is settings
            assert uow.mnests.settings is settings and uow.queries.settings is settings
        row = m.record_passing("plan", "1", "search", "2")
        assert row.ts_first == clock.now
        assert [e.recorder for e in m.events()] == ["tracer"]


def test_keywords_are_laid_over_the_settings_given(store_url: str) -> None:
    clock = MovableClock()
    base = Settings(recorder="otel", ager_batch_rows=3)
    with mnestoma.Mnestoma(store_url, settings=base, clock=clock) as m:
        assert (m.settings.clock, m.settings.recorder, m.settings.ager_batch_rows) == (
            clock,
            "otel",
            3,
        )
        assert m.clock is clock and m.recorder == "otel"
    assert base.clock is not clock  # the given settings are never changed


def test_a_units_settings_reach_its_repositories(store_url: str) -> None:
    engine = make_engine(store_url)
    settings = Settings(clock=MovableClock(), recorder="cli")
    try:
        sessions = make_session_factory(engine)
        with UnitOfWork(sessions, settings=settings) as uow:
            assert uow.mnests.settings is settings and uow.queries.settings is settings
        with sessions() as session, UnitOfWork.joining(session, settings=settings) as joined:
            assert joined.mnests.settings is settings
    finally:
        engine.dispose()


def test_the_async_doors_carry_the_same_settings(store_url: str) -> None:
    settings = Settings(clock=MovableClock(), recorder="tracer")

    async def go() -> None:
        async with AsyncMnestoma(store_url, settings=settings) as am:
            assert am.settings is settings
            await am.record_passing("plan", "1", "search", "2")
            assert [e.recorder for e in await am.events()] == ["tracer"]
            async with AsyncUnitOfWork(
                make_async_session_factory(am.engine), settings=settings
            ) as uow:
                assert uow.mnests.settings is settings

    asyncio.run(go())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clock", "now"),
        ("recorder", "someone"),
        ("ager_batch_rows", 0),
        ("ager_batch_rows", 2.5),
        ("lock_timeout", -1),
        ("lock_timeout", float("inf")),
        ("lock_timeout", True),
        ("lock_timeout", "3"),
    ],
)
def test_a_bad_setting_is_refused_when_the_settings_are_built(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput):
        Settings(**{field: value})


@pytest.mark.parametrize(
    "seconds",
    [10**400, 10**5000, Fraction(10**400), 1e309, float("inf"), float("nan"), 86400.5, -0.1],
    ids=["10**400", "10**5000", "fraction", "1e309", "inf", "nan", "a-day-and-more", "negative"],
)
def test_a_lock_timeout_beyond_a_day_or_not_finite_is_invalid_input_naming_it(
    seconds: Any,
) -> None:
    """``10**400`` gave a raw OverflowError; the bound is the one every door checks."""
    with pytest.raises(InvalidInput, match="lock_timeout must be a number of seconds from 0"):
        Settings(lock_timeout=seconds)


@pytest.mark.parametrize("seconds", [0, 0.25, 86400, LOCK_TIMEOUT_MAX_S])
def test_a_lock_timeout_from_zero_to_a_day_is_kept_as_float_seconds(seconds: float) -> None:
    kept = Settings(lock_timeout=seconds).lock_timeout
    assert kept == seconds and type(kept) is float


def test_settings_are_frozen_and_changed_only_by_a_checked_copy() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.recorder = "cli"  # type: ignore[misc]
    assert settings.but(recorder="cli").recorder == "cli"
    with pytest.raises(InvalidInput):
        settings.but(recorder="nobody")


def test_something_else_given_as_settings_is_refused(store_url: str) -> None:
    with pytest.raises(InvalidInput, match="Settings"):
        mnestoma.Mnestoma(store_url, settings={"clock": None})  # type: ignore[arg-type]


def test_the_settings_batch_rows_size_the_agers_batches(store_url: str) -> None:
    clock = MovableClock()
    seen: list[tuple[int, int]] = []
    with mnestoma.Mnestoma(store_url, settings=Settings(clock=clock, ager_batch_rows=1)) as m:
        for i in range(3):
            m.record_passing("plan", "1", f"tool{i}", "1")
        clock.advance(days=1)
        m.apply_ager(progress=lambda done, total: seen.append((done, total)))
    # one row a batch: as many batches as the store has rows (SQLite rowids, PostgreSQL
    # pages: a handful of rows share a page there, so at least one batch)
    assert len(seen) >= 1 and seen[-1][0] == seen[-1][1]
    if store_url.startswith("sqlite"):
        assert len(seen) == 3


def test_the_settings_lock_timeout_bounds_a_write_behind_a_held_lock(sqlite_store_url: str) -> None:
    holder = make_engine(sqlite_store_url)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.connect() as conn:
            take_write_lock(conn)
            held.set()
            release.wait(30)
            conn.rollback()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        with mnestoma.Mnestoma(sqlite_store_url, settings=Settings(lock_timeout=0.3)) as m:
            started = time.monotonic()
            with pytest.raises(WriteLockTimeout):
                m.record_passing("plan", "1", "search", "2")
            waited = time.monotonic() - started
        assert 0.25 <= waited < 5.0
    finally:
        release.set()
        thread.join(30)
        holder.dispose()


@pytest.fixture
def sqlite_store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    mnestoma.upgrade(url)
    return url
