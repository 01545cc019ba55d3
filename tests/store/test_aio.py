"""The async door (contract §9): the sync suite's behaviours through ``AsyncMnestoma``, the
async units of work, concurrency on one hot edge, a FastAPI service and the tracer, on both
engines.

The sync suite's tests imported below run here a second time with this module's ``store``
fixture: an ``AsyncMnestoma`` behind the sync facade's interface (each awaited call runs to
its end on one event loop). Same tests, same expectations, the other door.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import json
import re
import sqlite3
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from conftest import REPO
from fastapi import Depends, FastAPI, HTTPException, Request
from helpers_proc import run_python
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session
from test_ager import (  # noqa: F401
    test_a_demoted_row_merges_into_an_existing_decaying_twin,
    test_a_proto_below_005_is_pruned_and_its_history_kept,
    test_a_weak_decaying_row_younger_than_90_days_is_not_a_candidate,
    test_an_active_row_below_020_becomes_decaying,
    test_an_active_row_just_above_020_stays_active,
    test_old_weak_decaying_rows_are_counted_as_archive_candidates_not_deleted,
    test_running_the_ager_ten_times_at_the_same_instant_changes_nothing,
    test_stored_weights_of_decaying_rows_are_not_rewritten,
    test_the_ager_brings_weights_to_now,
    test_the_ager_is_schedule_free,
    test_the_dry_run_reports_and_changes_nothing,
    test_the_report_adds_up,
    test_vanishing_weights_and_steep_decay_never_underflow,
)
from test_query_log import (  # noqa: F401
    test_a_bad_query_is_invalid_input_and_nothing_is_logged,
    test_a_logged_query_keeps_raw_canonical_hash_turn_and_time,
    test_recent_lists_the_newest_first,
    test_the_query_log_touches_no_mnest_and_no_event,
    test_top_counts_canonical_forms_most_frequent_first,
)
from test_rank import (  # noqa: F401
    test_equal_weights_rank_the_recently_used_edge_first,
    test_only_active_edges_rank,
    test_rank_and_suggest_next_never_disagree,
    test_rank_of_nothing_is_nothing_and_a_generator_is_read_once,
    test_rank_refuses_a_bad_source,
    test_rank_refuses_bad_candidates,
    test_ranked_says_what_it_scored_and_why,
    test_saturated_edges_reinforced_in_one_turn_tie_and_more_uses_win,
)
from test_record import (  # noqa: F401
    test_a_decaying_or_superseded_row_is_never_reactivated,
    test_a_first_passing_creates_an_active_row_at_030,
    test_a_new_version_of_either_end_is_a_different_row,
    test_a_proto_and_an_active_edge_to_the_same_executor_are_distinct,
    test_a_proto_is_created_at_030_without_version,
    test_a_proto_is_reinforced_and_its_desired_sig_replaced,
    test_a_repeated_turn_and_edge_is_a_no_op_returning_the_row,
    test_a_retried_turn_counts_once,
    test_a_second_passing_reinforces_by_015_after_decay,
    test_an_empty_turn_records_nothing,
    test_direction_matters,
    test_edges_filter_by_source_destination_and_states,
    test_events_are_listed_oldest_first,
    test_find_and_get,
    test_now_is_never_before_the_last_passing,
    test_record_turn_is_all_or_nothing,
    test_record_turn_mixes_creation_and_reinforcement,
    test_record_turn_returns_rows_in_passing_order,
    test_record_turn_rolls_back_when_the_database_fails_midway,
    test_reinforcement_is_clamped_at_one,
    test_returned_objects_are_detached_snapshots,
    test_tags_never_change_the_weight,
    test_tags_that_are_not_portable_json_are_invalid_input,
    test_the_same_edge_twice_in_one_turn_counts_twice,
    test_the_stored_row_equals_the_returned_snapshot,
)
from test_record_proto import (  # noqa: F401
    test_a_missing_version_on_an_existing_executor_is_still_invalid_input,
    test_record_proto_creates_a_proto_at_0_30,
    test_record_proto_refuses_bad_input_and_writes_nothing,
    test_record_proto_with_a_turn_counts_the_turn_once,
)
from test_transitions import (  # noqa: F401
    test_a_proto_can_be_superseded,
    test_a_proto_cannot_become_active_or_decaying,
    test_a_transition_changes_the_state_and_records_an_event,
    test_a_transition_onto_a_taken_key_is_a_conflict,
    test_a_versioned_row_cannot_become_a_proto,
    test_an_unknown_id_is_not_found,
    test_an_unknown_state_is_invalid_input,
    test_promoting_onto_an_existing_active_edge_is_a_conflict,
    test_promoting_what_is_not_a_proto_is_an_invalid_transition,
    test_promotion_needs_a_valid_version,
    test_promotion_sets_the_version_and_clears_the_signature,
    test_recurring_protos_ignore_active_rows,
    test_recurring_protos_need_three_uses_and_weight_030,
    test_the_same_state_again_changes_nothing_and_records_nothing,
)
from test_walk import (  # noqa: F401
    test_suggest_next_breaks_ties_by_uses,
    test_suggest_next_filters_by_version_and_limits_to_k,
    test_suggest_next_orders_by_effective_weight,
    test_walk_builds_paths_when_scores_tie,
    test_walk_follows_a_chain_of_two_rows,
    test_walk_follows_only_active_edges,
    test_walk_never_visits_an_executor_twice,
    test_walk_of_an_unknown_executor_is_empty,
    test_walk_orders_paths_by_score_best_first,
    test_walk_reads_timestamps_that_another_tool_wrote_with_a_zone,
    test_walk_refuses_bad_bounds,
    test_walk_requires_the_next_source_version_to_match,
    test_walk_skips_edges_below_min_weight,
    test_walk_starts_from_any_version_of_the_source,
)
from traced_tools import aread, asearch

import mnestoma
from mnestoma import (
    ConflictError,
    DatabaseUnavailable,
    InvalidInput,
    Mnestoma,
    MnestRepository,
    SchemaError,
    WriteLockTimeout,
)
from mnestoma.core.errors import MissingExtra
from mnestoma.doors.asynchronous import (
    AsyncMnestoma,
    AsyncMnestRepository,
    AsyncUnitOfWork,
    async_database_url,
    make_async_engine,
    make_async_session_factory,
)
from mnestoma.doors.shared import MnestOperations, operation
from mnestoma.engines import make_engine
from mnestoma.engines.locking import busy_timeout_ms, lock_timeout_seconds
from mnestoma.recording.tracing import turn
from mnestoma.testing.clock import MovableClock

# --- the sync suite through the async door --------------------------------------------------


class BlockingDoor:
    """An ``AsyncMnestoma`` with the sync facade's look: each coroutine method runs to its
    end on one event loop (the same loop for every call, as in a service). ``engine`` is a
    sync engine on the same database, for the SQL some tests run beside the store."""

    def __init__(self, store: AsyncMnestoma, runner: asyncio.Runner, engine: Engine) -> None:
        self.async_store = store
        self.engine = engine
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.async_store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        @functools.wraps(attr)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(attr(*args, **kwargs))

        return blocking


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for the test."""
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture
def async_store(
    store_url: str, clock: MovableClock, runner: asyncio.Runner
) -> Iterator[AsyncMnestoma]:
    """The async facade on an empty store at head, driven by ``clock``."""
    am = AsyncMnestoma(store_url, clock=clock)
    yield am
    runner.run(am.close())


@pytest.fixture
def store(
    async_store: AsyncMnestoma, runner: asyncio.Runner, store_url: str
) -> Iterator[BlockingDoor]:
    """Overrides conftest's ``store``: the imported sync tests drive the async door."""
    beside = make_engine(store_url)
    yield BlockingDoor(async_store, runner, beside)
    beside.dispose()


def test_the_imported_sync_tests_drive_the_async_door(
    store: BlockingDoor, engine_name: str
) -> None:
    dialect = store.async_store.engine.dialect
    assert dialect.is_async
    assert dialect.driver == {"sqlite": "aiosqlite", "postgresql": "psycopg"}[engine_name]
    assert store.record_passing("a", "1", "b", "1").uses == 1


# --- one door, the same operations ------------------------------------------------------------

SYNC_ONLY = {"engine", "clock", "recorder"}


def _public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, callable)
        if not name.startswith("_") and name not in SYNC_ONLY
    }


def test_every_operation_of_the_sync_facade_is_awaited_with_the_same_parameters() -> None:
    sync_ops = _public_methods(Mnestoma)
    async_ops = _public_methods(AsyncMnestoma)
    assert set(sync_ops) <= set(async_ops)
    for name, fn in sync_ops.items():
        if name == "unit_of_work":
            continue  # returns the async unit of work, used with `async with`
        if name == "replica_stats":  # counters in memory, no I/O: the same plain method
            assert inspect.signature(async_ops[name]) == inspect.signature(fn)
            continue
        assert inspect.iscoroutinefunction(async_ops[name]), name
        assert inspect.signature(async_ops[name]).parameters == inspect.signature(fn).parameters


def test_every_operation_of_the_sync_repository_is_awaited_with_the_same_parameters() -> None:
    sync_ops = _public_methods(MnestRepository)
    async_ops = _public_methods(AsyncMnestRepository)
    assert set(sync_ops) == set(async_ops)
    for name, fn in sync_ops.items():
        assert inspect.iscoroutinefunction(async_ops[name]), name
        assert inspect.signature(async_ops[name]).parameters == inspect.signature(fn).parameters


def test_the_shared_table_becomes_plain_methods_of_each_door() -> None:
    """Both doors make their methods from one table when their classes are made: a call
    goes to a plain function (no descriptor runs on it), with the repository's signature."""
    table = {name for name, value in vars(MnestOperations).items() if isinstance(value, operation)}
    assert "record_passing" in table
    for door in (Mnestoma, AsyncMnestoma, AsyncMnestRepository):
        for name in table:
            method = inspect.getattr_static(door, name)
            assert inspect.isfunction(method), (door, name)
            assert inspect.iscoroutinefunction(method) is (door is not Mnestoma), (door, name)
            assert method.__doc__ == getattr(MnestRepository, name).__doc__
            assert method.__wrapped__ is getattr(MnestRepository, name)
    with pytest.raises(TypeError, match="not a door"):
        MnestOperations().record_passing  # noqa: B018


# --- engines ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("sqlite:///{tmp}/a.sqlite", "aiosqlite"),
        ("sqlite+pysqlite:///{tmp}/a.sqlite", "aiosqlite"),
        ("sqlite+aiosqlite:///{tmp}/a.sqlite", "aiosqlite"),
        ("postgresql://u@127.0.0.1:1/db", "psycopg"),
        ("postgresql+psycopg://u@127.0.0.1:1/db", "psycopg"),
        ("postgresql+psycopg_async://u@127.0.0.1:1/db", "psycopg"),
    ],
)
def test_a_plain_url_picks_the_async_driver_and_an_async_one_is_kept(
    given: str, driver: str, tmp_path: Path
) -> None:
    engine = make_async_engine(given.format(tmp=tmp_path))
    try:
        assert engine.dialect.is_async
        assert engine.dialect.driver == driver
    finally:
        asyncio.run(engine.dispose())


def test_the_async_door_resolves_the_database_as_the_sync_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MNESTOMA_DATABASE_URL", raising=False)
    monkeypatch.setenv("MNESTOMA_DB_PATH", str(tmp_path / "env.sqlite"))
    url = async_database_url()
    assert (url.drivername, url.database) == ("sqlite+aiosqlite", str(tmp_path / "env.sqlite"))
    monkeypatch.setenv("MNESTOMA_DATABASE_URL", "postgresql://u@db.example/x")
    assert async_database_url().render_as_string() == "postgresql+psycopg://u@db.example/x"


def _pragmas(conn: Any) -> tuple[Any, ...]:
    return tuple(
        conn.exec_driver_sql(f"PRAGMA {name}").scalar()
        for name in ("busy_timeout", "foreign_keys", "synchronous")
    )


def test_the_async_sqlite_engine_is_configured_as_the_sync_one(tmp_path: Path) -> None:
    path = tmp_path / "new" / "folder" / "store.sqlite"

    async def main() -> tuple[Any, ...]:
        engine = make_async_engine(f"sqlite:///{path}")
        try:
            async with engine.connect() as conn:
                return await conn.run_sync(_pragmas)
        finally:
            await engine.dispose()

    got = asyncio.run(main())
    assert path.parent.is_dir()  # the folder was created, as for the sync engine
    sync = make_engine(f"sqlite:///{path}")
    try:
        with sync.connect() as conn:
            # SQLite's busy timeout is the lock timeout (MNESTOMA_LOCK_TIMEOUT, 60 s)
            expected = (busy_timeout_ms(lock_timeout_seconds()), 1, 1)
            assert got == _pragmas(conn) == expected
    finally:
        sync.dispose()


@pytest.mark.parametrize("engine_name", ["sqlite"])  # SQLite's write lock
def test_a_sqlite_write_waits_for_the_write_lock_and_a_read_never_waits(store_url: str) -> None:
    holder = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)

    async def main() -> tuple[list[Any], int]:
        async with AsyncMnestoma(store_url) as am:
            holder.execute("BEGIN IMMEDIATE")
            write = asyncio.create_task(am.record_passing("a", "1", "b", "1"))
            seen = await am.edges()  # while the lock is held: a read does not wait
            assert not write.done()
            holder.execute("ROLLBACK")
            return seen, (await write).uses

    try:
        assert asyncio.run(main()) == ([], 1)
    finally:
        holder.close()


@pytest.mark.parametrize("engine_name", ["sqlite"])  # SQLite's write lock
def test_a_write_that_cannot_get_the_sqlite_lock_in_time_is_a_write_lock_timeout(
    store_url: str,
) -> None:
    """Past the lock timeout the write gives up with a ConflictError and changes nothing;
    meanwhile the event loop keeps serving other tasks."""
    holder = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)

    async def main() -> int:
        engine = make_async_engine(store_url, connect_args={"timeout": 0.02})
        short = engine.execution_options(mnestoma_lock_timeout=0.2)
        try:
            async with AsyncMnestoma(short) as am:
                holder.execute("BEGIN IMMEDIATE")
                write = asyncio.create_task(am.record_passing("a", "1", "b", "1"))
                reads = 0
                while not write.done():
                    assert await am.edges() == []
                    reads += 1
                with pytest.raises(WriteLockTimeout) as caught:
                    await write
                assert isinstance(caught.value, ConflictError)
                holder.execute("ROLLBACK")
                assert await am.edges() == []
                return reads
        finally:
            await engine.dispose()

    try:
        assert asyncio.run(main()) >= 1
    finally:
        holder.close()


# --- concurrency ------------------------------------------------------------------------------


def test_fifty_concurrent_tasks_on_one_hot_edge_lose_nothing(store_url: str) -> None:
    async def main() -> tuple[int, int, float]:
        async with AsyncMnestoma(store_url) as am:
            first = await am.record_passing("hot", "1", "edge", "1")
            tasks: list[Awaitable[Any]] = [
                am.record_passing("hot", "1", "edge", "1") for _ in range(25)
            ]
            tasks += [am.record_turn(f"turn-{i}", [("hot", "1", "edge", "1")]) for i in range(25)]
            await asyncio.gather(*tasks)
            row = await am.get(first.id)
            assert row is not None
            return row.uses, len(await am.events(mnest_id=first.id)), row.weight

    assert asyncio.run(main()) == (51, 51, 1.0)


# --- units of work ----------------------------------------------------------------------------


def _passing_count(url: str) -> int:
    with Mnestoma(url) as m:
        return len(m.edges())


def test_an_async_unit_of_work_rolls_back_uncommitted_work_by_default(store_url: str) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        async with AsyncUnitOfWork(make_async_session_factory(engine)) as uow:
            await uow.mnests.record_passing("a", "1", "b", "1")
        await engine.dispose()

    asyncio.run(main())
    assert _passing_count(store_url) == 0


def test_an_async_unit_of_work_rolls_back_on_error(store_url: str) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        try:
            async with AsyncUnitOfWork(make_async_session_factory(engine)) as uow:
                await uow.mnests.record_passing("a", "1", "b", "1")
                await uow.mnests.record_passing("", "1", "b", "1")
                await uow.commit()
        finally:
            await engine.dispose()

    with pytest.raises(InvalidInput):
        asyncio.run(main())
    assert _passing_count(store_url) == 0


def test_an_async_unit_of_work_commits_several_operations_at_once(
    store_url: str, clock: MovableClock
) -> None:
    async def main() -> None:
        async with AsyncMnestoma(store_url, clock=clock) as am, am.unit_of_work() as uow:
            a = await uow.mnests.record_passing("a", "1", "b", "1", turn_id="t")
            await uow.mnests.transition_state(a.id, "superseded")
            await uow.queries.log("Find A", "find a", turn_id="t")
            await uow.commit()

    asyncio.run(main())
    with Mnestoma(store_url) as m:
        assert [e.state for e in m.edges()] == ["superseded"]
        assert [q.canonical_query for q in m.recent_queries()] == ["find a"]


def test_a_joined_async_unit_never_commits_the_callers_session(store_url: str) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        async with make_async_session_factory(engine)() as session:
            async with AsyncUnitOfWork.joining(session) as uow:
                await uow.mnests.record_passing("a", "1", "b", "1")
                await uow.commit()  # into the caller's transaction, not the database
            assert session.in_transaction()
            await session.rollback()  # the caller decides
        await engine.dispose()

    asyncio.run(main())
    assert _passing_count(store_url) == 0


def test_leaving_a_joined_async_unit_without_commit_keeps_the_callers_own_work(
    store_url: str,
) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        async with make_async_session_factory(engine)() as session:
            async with AsyncUnitOfWork.joining(session) as kept:
                await kept.queries.log("Find A", "find a")
                await kept.commit()
            async with AsyncUnitOfWork.joining(session) as dropped:
                await dropped.mnests.record_passing("a", "1", "b", "1")
            await session.commit()
        await engine.dispose()

    asyncio.run(main())
    with Mnestoma(store_url) as m:
        assert m.edges() == []
        assert [q.raw_query for q in m.recent_queries()] == ["Find A"]


def test_the_async_repository_works_on_an_async_connection(store_url: str) -> None:
    async def main() -> None:
        engine = make_async_engine(store_url)
        async with engine.connect() as conn:
            repo = AsyncMnestRepository(conn)
            await repo.record_passing("a", "1", "b", "1")
            again = await repo.record_passing("a", "1", "b", "1")
            assert again.uses == 2
            await conn.commit()
        await engine.dispose()

    asyncio.run(main())
    assert _passing_count(store_url) == 1


@pytest.mark.parametrize(
    ("make", "error"),
    [  # wrong on purpose: what a type checker would refuse, the doors refuse at run time
        (lambda url: AsyncMnestoma(make_engine(url)), "a sync Engine goes to Mnestoma"),  # type: ignore[arg-type]
        (lambda url: AsyncMnestoma("sqlite://"), "in-memory"),
        (lambda url: make_async_engine(make_engine(url)), "already an engine"),  # type: ignore[arg-type]
        (lambda url: AsyncMnestoma(url, clock=3), "clock"),  # type: ignore[arg-type]
        (lambda url: AsyncUnitOfWork(_async_session(url)), "joining(session)"),  # type: ignore[arg-type]
        (lambda url: AsyncUnitOfWork(make_engine(url)), "async session factory"),  # type: ignore[arg-type]
        (lambda url: AsyncUnitOfWork.joining(Session()), "UnitOfWork.joining takes a sync"),  # type: ignore[arg-type]
        (lambda url: AsyncMnestRepository(Session()), "a sync one goes to MnestRepository"),  # type: ignore[arg-type]
    ],
    ids=["sync-engine", "memory", "engine-as-url", "clock", "session-as-factory",
         "engine-as-factory", "sync-join", "sync-repo"],
)  # fmt: skip
def test_a_wrong_argument_is_invalid_input_saying_which_door_takes_it(
    make: Callable[[str], Any], error: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(error)):
        make(f"sqlite:///{tmp_path / 'x.sqlite'}")


def test_a_missing_async_driver_names_the_extra_that_brings_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "aiosqlite", None)  # as if it were not installed
    with pytest.raises(MissingExtra, match=re.escape('pip install "mnestoma[async]"')):
        make_async_engine(f"sqlite:///{tmp_path / 'x.sqlite'}")


def _async_session(url: str) -> AsyncSession:
    return AsyncSession(create_async_engine(url.replace("sqlite:", "sqlite+aiosqlite:")))


# --- the schema, the database -----------------------------------------------------------------


def test_the_schema_is_checked_on_first_use_as_by_the_sync_door(
    empty_db_url: str, engine_name: str
) -> None:
    """An empty SQLite store is migrated to head (through the async driver's connection,
    whose coroutines every revision awaits); an empty PostgreSQL database is refused."""

    async def main() -> int:
        async with AsyncMnestoma(empty_db_url) as am:
            await am.record_passing("a", "1", "b", "1")
            return len(await am.edges())

    if engine_name == "sqlite":
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert asyncio.run(main()) == 1
            gc.collect()
        assert [str(w.message) for w in seen if "never awaited" in str(w.message)] == []
        assert mnestoma.current_revision(empty_db_url) == mnestoma.head_revision()
    else:
        with pytest.raises(SchemaError, match="mnestoma db upgrade"):
            asyncio.run(main())


def test_create_false_never_creates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.sqlite"
    with pytest.raises(SchemaError, match="no mnestoma store"):
        AsyncMnestoma(f"sqlite:///{path}", create=False)
    assert not path.exists()


def test_an_unreachable_database_is_database_unavailable_with_the_password_hidden() -> None:
    am = AsyncMnestoma("postgresql://u:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in repr(am)

    async def main() -> None:
        try:
            await am.get("mn_doesnotexist00")
        finally:
            await am.close()

    with pytest.raises(DatabaseUnavailable) as caught:
        asyncio.run(main())
    assert "s3cret" not in str(caught.value)


def _plain(value: Any) -> Any:
    """A value with its snapshots as dicts (ORM objects compare by identity)."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def test_graph_rank_and_the_query_log_read_the_same_as_through_the_sync_door(
    store_url: str, clock: MovableClock
) -> None:
    with Mnestoma(store_url, clock=clock) as m:
        m.record_turn("t", [("a", "1", "b", "1"), ("b", "1", "c", "1")])
        m.record_proto("a", "1", "w")
        m.log_canonical_query("Find A", "find a")
        expected = [m.graph("a", depth=2), m.rank("a", ["c", "b"]), m.top_queries()]

    async def main() -> list[Any]:
        async with AsyncMnestoma(store_url, clock=clock) as am:
            graph = await am.graph("a", depth=2)
            return [graph, await am.rank("a", ["c", "b"]), await am.top_queries()]

    got = asyncio.run(main())
    assert _plain(got) == _plain(expected)
    assert [e.target for e in got[0].edges] == ["b@1", "w", "c@1"]


# --- the tracer -------------------------------------------------------------------------------


def test_the_tracer_records_an_async_turn_through_the_async_store(store_url: str) -> None:
    async def main() -> None:
        async with AsyncMnestoma(store_url) as am:
            for _ in range(2):  # a repeated turn id counts once
                async with turn(am, "turn-1", strict=True) as t:
                    files = await asearch("q")
                    await aread(files[0])
                assert [m.uses for m in t.mnests] == [1]

    asyncio.run(main())
    with Mnestoma(store_url) as m:
        [edge] = m.edges()
        assert (edge.src_executor, edge.dst_executor, edge.uses) == ("asearch", "aread", 1)
        assert [(e.kind, e.turn_id, e.recorder) for e in m.events()] == [
            ("created", "turn-1", "tracer")
        ]


# --- a FastAPI service with its own AsyncSession ----------------------------------------------


class PassingIn(BaseModel):
    src: str
    src_version: str
    dst: str
    dst_version: str
    turn_id: str | None = None


async def request_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The service's own session per request, from its own ``async_sessionmaker``."""
    async with request.app.state.sessions() as session:
        yield session


RequestSession = Annotated[AsyncSession, Depends(request_session)]


def service_app(sessions: async_sessionmaker[AsyncSession]) -> FastAPI:
    """A service that records a passing inside its own request transaction."""
    app = FastAPI()
    app.state.sessions = sessions

    @app.post("/passings")
    async def record(
        body: PassingIn, session: RequestSession, fail: bool = False
    ) -> dict[str, Any]:
        async with AsyncUnitOfWork.joining(session) as uow:
            m = await uow.mnests.record_passing(
                body.src, body.src_version, body.dst, body.dst_version, turn_id=body.turn_id
            )
            await uow.commit()
        if fail:  # the service's own work failed after recording: nothing is kept
            raise HTTPException(status_code=409, detail="refused")
        await session.commit()
        return {"id": m.id, "uses": m.uses}

    return app


@pytest.mark.parametrize("built_by", ["make_async_engine", "the service"])
def test_a_fastapi_service_records_through_its_own_async_session(
    store_url: str, built_by: str
) -> None:
    def engine_of_the_service() -> Any:
        if built_by == "make_async_engine":
            return make_async_engine(store_url)
        return create_async_engine(async_database_url(store_url))  # plain, no mnestoma set-up

    async def main() -> list[httpx.Response]:
        engine = engine_of_the_service()
        app = service_app(async_sessionmaker(engine, expire_on_commit=False))
        body = {"src": "search", "src_version": "1", "dst": "read", "dst_version": "2"}
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as c:
                first = await c.post("/passings", json={**body, "turn_id": "t0"})
                refused = await c.post("/passings", params={"fail": "true"}, json=body)
                burst = await asyncio.gather(
                    *(c.post("/passings", json={**body, "turn_id": f"t{i}"}) for i in range(1, 21))
                )
                return [first, refused, *burst]
        finally:
            await engine.dispose()

    first, refused, *burst = asyncio.run(main())
    assert (first.status_code, first.json()["uses"]) == (200, 1)
    assert refused.status_code == 409
    assert all(r.status_code == 200 for r in burst)
    assert sorted(r.json()["uses"] for r in burst) == list(range(2, 22))
    with Mnestoma(store_url) as m:
        [edge] = m.edges()
        assert edge.uses == 21
        assert len(m.events(mnest_id=edge.id)) == 21


# --- the benchmark --------------------------------------------------------------------------


def test_the_async_door_benchmark_runs_quick_and_loses_nothing(tmp_path: Path) -> None:
    """No timing asserted: the quick run completes, reports both doors, loses no update."""
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.async_door", "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [sqlite_figures] = json.loads(out.read_text())
    assert sqlite_figures["concurrent_lost"] == {"sync": 0, "async": 0, "to_thread": 0}
    assert set(sqlite_figures["record_passing_us"]) == {"sync", "async", "to_thread"}


# --- the services guide ------------------------------------------------------------------------

SERVICES_GUIDE = REPO / "docs" / "services.md"


@pytest.mark.parametrize(
    ("marker", "printed"),
    [("make_async_session_factory(engine)", ["10", "1.0", "2", "0.45"]), ("FastAPI()", ["20"])],
)
def test_the_guide_async_examples_print_what_their_comments_say(
    marker: str, printed: list[str], tmp_path: Path
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", SERVICES_GUIDE.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if "mnestoma.aio" in b and marker in b]
    done = run_python(block, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == printed
