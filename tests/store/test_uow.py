"""The unit of work owns the transaction; repositories never commit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import package_engine
from sqlalchemy import Engine, func, select, text

from mnestoma import MnestRepository, UnitOfWork, make_session_factory
from mnestoma.core import retrying
from mnestoma.core.errors import ConflictError, InvalidInput, RaceLost
from mnestoma.core.settings import Settings
from mnestoma.schema.models import Mnest
from mnestoma.store.uow import MAX_ATTEMPTS, ConnectionUnitOfWork, with_retries
from mnestoma.testing import MnestFactory, bind_factories


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    with package_engine(store_url) as eng:
        yield eng


def _count(engine: Engine) -> int:
    """Rows committed so far, read without taking SQLite's write lock."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Mnest)).scalar_one()


def test_committed_work_is_kept(engine: Engine, clock) -> None:
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        uow.commit()
    assert _count(engine) == 1


def test_rolls_back_uncommitted_work_by_default(engine: Engine, clock) -> None:
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
    assert _count(engine) == 0


def test_rolls_back_on_error(engine: Engine, clock) -> None:
    with pytest.raises(RuntimeError), UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        raise RuntimeError("boom")
    assert _count(engine) == 0


def test_the_session_is_closed_on_exit(engine: Engine, clock) -> None:
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        session = uow.session
        uow.commit()
    assert not session.in_transaction()
    assert list(session.identity_map.values()) == []


def test_work_after_a_commit_needs_its_own_commit(engine: Engine, clock) -> None:
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        uow.commit()
        uow.mnests.record_passing("c", "1", "d", "1")
    assert _count(engine) == 1


def test_several_operations_in_one_unit_are_atomic(engine: Engine, clock) -> None:
    with UnitOfWork(make_session_factory(engine), clock=clock) as uow:
        a = uow.mnests.record_passing("a", "1", "b", "1")
        uow.mnests.transition_state(a.id, "decaying")
        uow.mnests.record_passing("a", "1", "b", "1")
        uow.queries.log("Find it", "find it")
        assert len(uow.mnests.edges()) == 2
    assert _count(engine) == 0


def test_the_repository_never_commits(engine: Engine, clock) -> None:
    sessions = make_session_factory(engine)
    with sessions() as session:
        repo = MnestRepository(session, clock=clock)
        repo.record_passing("a", "1", "b", "1")
        repo.apply_ager()
        assert session.in_transaction()
        session.rollback()
    assert _count(engine) == 0


def test_joining_a_service_session_commits_with_the_service(engine: Engine, clock) -> None:
    sessions = make_session_factory(engine)
    with sessions() as session:
        session.execute(text("SELECT 1"))
        with UnitOfWork.joining(session, clock=clock) as uow:
            uow.mnests.record_passing("a", "1", "b", "1")
            uow.commit()
        assert session.in_transaction()
        assert _count(engine) == 0  # nothing visible before the service commits
        session.commit()
    assert _count(engine) == 1


def test_joining_never_commits_when_the_service_rolls_back(engine: Engine, clock) -> None:
    sessions = make_session_factory(engine)
    with sessions() as session:
        with UnitOfWork.joining(session, clock=clock) as uow:
            uow.mnests.record_passing("a", "1", "b", "1")
            uow.commit()
        session.rollback()
    assert _count(engine) == 0


def test_a_failed_joined_unit_keeps_the_service_work(engine: Engine, clock) -> None:
    sessions = make_session_factory(engine)
    with sessions() as session:
        with bind_factories(session, clock=clock):
            MnestFactory(id="mn_servicerow0001", src_executor="svc")
        session.flush()
        with pytest.raises(RuntimeError), UnitOfWork.joining(session, clock=clock) as uow:
            uow.mnests.record_passing("a", "1", "b", "1")
            raise RuntimeError("the mnestoma part failed")
        session.commit()
    with engine.connect() as conn:
        assert conn.execute(select(Mnest.src_executor)).scalars().all() == ["svc"]


def test_joining_leaves_the_session_open(engine: Engine, clock) -> None:
    sessions = make_session_factory(engine)
    session = sessions()
    with UnitOfWork.joining(session, clock=clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
    assert session.is_active
    session.execute(text("SELECT 1"))
    session.close()


# --- the connection unit of work (what each facade call runs in) and the retry policy -------


def test_a_connection_unit_keeps_committed_work(engine: Engine, clock) -> None:
    with ConnectionUnitOfWork(engine, settings=Settings(clock=clock)) as unit:
        unit.mnests.record_passing("a", "1", "b", "1")
        unit.commit()
    assert _count(engine) == 1


def test_a_connection_unit_rolls_back_uncommitted_work_by_default(engine: Engine, clock) -> None:
    with ConnectionUnitOfWork(engine, settings=Settings(clock=clock)) as unit:
        unit.mnests.record_passing("a", "1", "b", "1")
    assert _count(engine) == 0


def test_a_connection_unit_rolls_back_on_error_and_returns_its_connection(
    engine: Engine, clock
) -> None:
    with (
        pytest.raises(RuntimeError),
        ConnectionUnitOfWork(engine, settings=Settings(clock=clock)) as unit,
    ):
        unit.mnests.record_passing("a", "1", "b", "1")
        raise RuntimeError("boom")
    assert _count(engine) == 0
    assert unit.connection.closed


def test_a_connection_unit_on_a_callers_connection_leaves_it_open(engine: Engine, clock) -> None:
    with engine.connect() as conn:
        with ConnectionUnitOfWork(conn, settings=Settings(clock=clock)) as unit:
            unit.mnests.record_passing("a", "1", "b", "1")
            unit.commit()
        assert not conn.closed
        assert conn.execute(select(func.count()).select_from(Mnest)).scalar_one() == 1


def test_with_retries_runs_a_transient_failure_again_up_to_max_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retrying.time, "sleep", lambda _: None)
    calls = []

    def always_conflicting() -> None:
        calls.append(1)
        raise RaceLost("the edge changed under us")

    with pytest.raises(RaceLost):
        with_retries(always_conflicting)
    assert len(calls) == MAX_ATTEMPTS

    outcomes = iter([RaceLost("once"), "done"])

    def conflicting_once() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert with_retries(conflicting_once) == "done"


@pytest.mark.parametrize("error", [InvalidInput("no"), ConflictError("the key is taken")])
def test_with_retries_never_runs_a_permanent_failure_twice(error: Exception) -> None:
    calls = []

    def failing() -> None:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        with_retries(failing)
    assert calls == [1]


@pytest.mark.parametrize("door", ["sync", "async"])
def test_a_retried_write_replays_the_items_of_a_generator_it_was_given(
    store, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facades read a generator argument once, before the first attempt: the attempt
    that a transient conflict ends and its retry record the same passings."""
    attempts: list[int] = []
    real = MnestRepository._record_many

    def conflict_once(self, items, turn_id, recorder):  # type: ignore[no-untyped-def]
        attempts.append(len(items))
        if len(attempts) == 1:
            raise RaceLost("another writer created a key meanwhile")
        return real(self, items, turn_id, recorder)

    monkeypatch.setattr(MnestRepository, "_record_many", conflict_once)
    passings = ((f"s{i}", "1", "d", "1") for i in range(3))
    if door == "sync":
        rows = store.record_turn("t1", passings)
    else:
        import asyncio

        from mnestoma.doors.asynchronous import AsyncMnestoma

        async def record() -> list[Mnest]:
            async with AsyncMnestoma(store.engine.url, clock=store.clock) as am:
                return await am.record_turn("t1", passings)

        rows = asyncio.run(record())
    assert attempts == [3, 3]
    assert sorted(m.src_executor for m in rows) == ["s0", "s1", "s2"]
    assert sorted(m.src_executor for m in store.edges(dst_executor="d")) == ["s0", "s1", "s2"]


def test_a_generator_given_as_a_json_value_is_refused_by_every_door(store) -> None:
    """Only collections of items (a turn's passings) are read once by the facades: a
    generator given as tags is refused as the repository refuses it, never stored."""
    with pytest.raises(InvalidInput, match="tags"):
        store.record_passing("a", "1", "b", "1", tags=(t for t in "xy"))
    with store.unit_of_work() as uow, pytest.raises(InvalidInput, match="tags"):
        uow.mnests.record_passing("a", "1", "b", "1", tags=(t for t in "xy"))
    assert store.edges() == []
