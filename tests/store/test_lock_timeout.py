"""One lock timeout on SQLite: ``MNESTOMA_LOCK_TIMEOUT`` (or the execution option) is how
long a write waits for the write lock in all, on the sync and the async engine alike.

A write of the package tries ``BEGIN IMMEDIATE`` without a busy timeout and sleeps between
its tries within the lock timeout (tests/races/test_write_lock_wait.py). Every other wait of
a connection ``make_engine`` made is SQLite's busy handler, whose busy timeout must be the
lock timeout, never 30 s more or less.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from conftest import package_engine
from sqlalchemy import create_engine, text

import mnestoma
from mnestoma import InvalidInput, Settings, WriteLockTimeout, make_engine
from mnestoma.cli import cli
from mnestoma.core.rules import LOCK_TIMEOUT_MAX_S
from mnestoma.engines.locking import (
    ENV_LOCK_TIMEOUT,
    LOCK_TIMEOUT_OPTION,
    lock_timeout_of,
    lock_timeout_seconds,
)

pytestmark = pytest.mark.parametrize("engine_name", ["sqlite"])  # SQLite's write lock


@pytest.fixture
def held_lock(store_url: str) -> Iterator[str]:
    """The store's URL while another connection holds its write lock (BEGIN IMMEDIATE)."""
    holder = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield store_url
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def seconds_to_fail(write: object) -> float:
    """How long ``write()`` took to give up with WriteLockTimeout."""
    started = time.monotonic()
    with pytest.raises(WriteLockTimeout):
        write()  # type: ignore[operator]
    return time.monotonic() - started


@pytest.mark.slow  # seconds by design: out of the quick tier
def test_a_write_gives_up_after_a_lock_timeout_shorter_than_30_s(
    held_lock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "2")
    with mnestoma.Mnestoma(held_lock) as store:
        waited = seconds_to_fail(lambda: store.record_passing("a", "1", "b", "1"))
    assert 1.5 <= waited < 10  # not SQLite's 30 s (room for a loaded machine's stalls)


@pytest.mark.slow  # seconds by design: out of the quick tier
def test_an_async_write_gives_up_after_a_lock_timeout_shorter_than_30_s(
    held_lock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnestoma.doors.asynchronous import AsyncMnestoma

    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "2")

    async def main() -> float:
        async with AsyncMnestoma(held_lock) as am:
            await am.edges()  # the schema check, before the clock starts
            started = time.monotonic()
            with pytest.raises(WriteLockTimeout):
                await am.record_passing("a", "1", "b", "1")
            return time.monotonic() - started

    assert 1.5 <= asyncio.run(main()) < 10  # not SQLite's 30 s


def test_a_zero_lock_timeout_fails_at_once(held_lock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "0")
    with mnestoma.Mnestoma(held_lock) as store:
        assert seconds_to_fail(lambda: store.record_passing("a", "1", "b", "1")) < 0.5


@pytest.mark.slow  # seconds by design: out of the quick tier
def test_a_longer_busy_timeout_given_by_the_caller_does_not_stretch_the_lock_timeout(
    held_lock: str,
) -> None:
    engine = make_engine(held_lock, connect_args={"timeout": 40}).execution_options(
        **{LOCK_TIMEOUT_OPTION: 1}
    )
    try:
        with mnestoma.Mnestoma(engine) as store:
            waited = seconds_to_fail(lambda: store.record_passing("a", "1", "b", "1"))
        assert 0.8 <= waited < 10  # not the caller's 40 s
    finally:
        engine.dispose()


@pytest.mark.parametrize("seconds", ["45", "31.5"])
def test_sqlites_own_wait_for_the_lock_is_the_lock_timeout_above_30_s_too(
    store_url: str, monkeypatch: pytest.MonkeyPatch, seconds: str
) -> None:
    """What SQLite's busy handler is given between writes is the whole lock timeout: a
    statement behind a long writer waits that long in all, not 30 s first and the timeout
    again after."""
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, seconds)
    with package_engine(store_url) as engine:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM ager_runs"))  # a write: BEGIN IMMEDIATE
            busy_ms = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
        assert busy_ms == round(float(seconds) * 1000)


def first_busy_timeout_ms(url: str) -> int:
    """SQLite's busy timeout on a new connection of the package's engine, from its first
    statement."""
    with package_engine(url) as engine, engine.connect() as conn:
        return int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one())


def test_a_connection_waits_for_sqlites_locks_as_long_as_the_lock_timeout(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads and commits meet SQLite's busy handler too (a store in rollback-journal
    mode): one timeout for every wait, from the connection's first statement."""
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "3")
    assert first_busy_timeout_ms(store_url) == 3000


@pytest.mark.slow  # seconds by design: out of the quick tier
def test_a_write_on_a_callers_own_engine_waits_the_lock_timeout_and_leaves_its_busy_timeout(
    held_lock: str,
) -> None:
    """A service's plain ``create_engine`` keeps its own busy timeout (pysqlite's 5 s here)
    for its own statements; the package's write waits the lock timeout instead."""
    engine = create_engine(held_lock).execution_options(**{LOCK_TIMEOUT_OPTION: 1})
    try:
        with mnestoma.Mnestoma(engine) as store:
            waited = seconds_to_fail(lambda: store.record_passing("a", "1", "b", "1"))
        assert 0.8 <= waited < 4  # not pysqlite's 5 s
        with engine.connect() as conn:  # the pool's one connection, the write's
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        engine.dispose()


# --- one bound on every door: 0 to a day (rules.LOCK_TIMEOUT_MAX_S) ---------------------------

NOT_A_LOCK_TIMEOUT = ["inf", "1e309", "-inf", "nan", "-1", "86400.5", "1" + "0" * 400, "soon"]


@pytest.mark.parametrize(
    "value", NOT_A_LOCK_TIMEOUT, ids=[v if len(v) < 10 else "1e400" for v in NOT_A_LOCK_TIMEOUT]
)
def test_a_lock_timeout_variable_that_is_not_zero_to_a_day_is_refused_when_the_store_opens(
    store_url: str, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``inf`` and ``1e309`` were taken: a write behind a held lock then waited for ever."""
    from mnestoma.doors.asynchronous import AsyncMnestoma

    monkeypatch.setenv(ENV_LOCK_TIMEOUT, value)
    with pytest.raises(InvalidInput, match=ENV_LOCK_TIMEOUT):
        mnestoma.Mnestoma(store_url)
    with pytest.raises(InvalidInput, match=ENV_LOCK_TIMEOUT):
        AsyncMnestoma(store_url)


def test_a_lock_timeout_variable_of_inf_is_exit_2_on_the_command_line(store_url: str) -> None:
    result = CliRunner(env={ENV_LOCK_TIMEOUT: "inf"}).invoke(
        cli, ["record", "plan@1", "search@1", "--database-url", store_url]
    )
    assert result.exit_code == 2, result.output
    assert ENV_LOCK_TIMEOUT in result.stderr and "one day" in result.stderr


def test_a_lock_timeout_of_a_day_is_the_longest_taken(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, f"{LOCK_TIMEOUT_MAX_S:g}")
    assert first_busy_timeout_ms(store_url) == 86_400_000


@pytest.mark.parametrize(
    "value",
    [math.inf, math.nan, -1, 86400.5, 10**400, "inf", True],
    ids=["inf", "nan", "negative", "a-day-and-more", "10**400", "text-inf", "bool"],
)
def test_a_lock_timeout_option_that_is_not_zero_to_a_day_is_refused_and_nothing_written(
    store_url: str, value: object
) -> None:
    """The execution option ``mnestoma_lock_timeout=inf`` was taken: a write waited for ever."""
    engine = make_engine(store_url).execution_options(**{LOCK_TIMEOUT_OPTION: value})
    try:
        with mnestoma.Mnestoma(engine) as store:
            with pytest.raises(InvalidInput, match=LOCK_TIMEOUT_OPTION):
                store.record_passing("a", "1", "b", "1")
            assert store.edges() == []
    finally:
        engine.dispose()


def test_an_async_write_with_a_lock_timeout_option_of_inf_is_refused_and_nothing_written(
    store_url: str,
) -> None:
    from mnestoma.doors.asynchronous import AsyncMnestoma, make_async_engine

    async def main() -> None:
        engine = make_async_engine(store_url)
        try:
            async with AsyncMnestoma(
                engine.execution_options(**{LOCK_TIMEOUT_OPTION: math.inf})
            ) as am:
                with pytest.raises(InvalidInput, match=LOCK_TIMEOUT_OPTION):
                    await am.record_passing("a", "1", "b", "1")
                assert await am.edges() == []
        finally:
            await engine.dispose()

    asyncio.run(main())


@pytest.mark.parametrize("value", [math.inf, 10**400, 86401], ids=["inf", "10**400", "86401"])
def test_the_settings_the_variable_and_the_option_share_one_check(
    engine_name: str, value: float
) -> None:
    """One function says what a lock timeout may be; each door names itself in its error."""
    for door, check in (
        ("lock_timeout", lambda: Settings(lock_timeout=value)),
        (ENV_LOCK_TIMEOUT, lambda: lock_timeout_seconds(str(value))),
        (LOCK_TIMEOUT_OPTION, lambda: lock_timeout_of({LOCK_TIMEOUT_OPTION: value})),
    ):
        with pytest.raises(InvalidInput, match=f"^{door} must be a number of seconds from 0 to"):
            check()


def test_the_lock_timeout_asked_at_each_write_follows_the_environment_and_refuses_each_time(
    engine_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "2")
    assert lock_timeout_of({}) == 2.0
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "3.5")
    assert lock_timeout_of({}) == 3.5
    assert lock_timeout_of({LOCK_TIMEOUT_OPTION: 1}) == 1.0
    for _ in range(2):  # True equals 1, yet is refused, every time
        with pytest.raises(InvalidInput, match=LOCK_TIMEOUT_OPTION):
            lock_timeout_of({LOCK_TIMEOUT_OPTION: True})
        with pytest.raises(InvalidInput, match=LOCK_TIMEOUT_OPTION):
            lock_timeout_of({LOCK_TIMEOUT_OPTION: -1})
        with pytest.raises(InvalidInput, match=LOCK_TIMEOUT_OPTION):
            lock_timeout_of({LOCK_TIMEOUT_OPTION: [1]})
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "soon")
    with pytest.raises(InvalidInput, match=ENV_LOCK_TIMEOUT):
        lock_timeout_of({})
