"""The pytest plugin ``mnestoma.testing`` (contract §7): fixtures, clock, isolation.

The downstream-suite tests run a small suite in a subprocess with ``pytester`` and then look
at the database with an engine of their own: whatever the suite committed must be gone.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from helpers_proc import PLUGINS_OFF
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

import mnestoma
from mnestoma import CanonicalQuery, Event, Mnest, MnestomaView, UnitOfWork
from mnestoma.engines import make_engine
from mnestoma.testing import (
    DEFAULT_START,
    DecayingMnestFactory,
    EventFactory,
    MnestFactory,
    MovableClock,
    ProtoMnestFactory,
    bind_factories,
    factory_now,
)

pytest_plugins = ["pytester"]


@pytest.fixture
def mnestoma_engine(store_url: str) -> Iterator[Engine]:
    """The plugin's engine, on each engine of this project's suite (an empty store at head)."""
    engine = make_engine(store_url)
    yield engine
    engine.dispose()


def _count(session: Session, model: type) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


# --- a downstream suite, run in a subprocess ---------------------------------------------

DOWNSTREAM_CONFTEST = 'pytest_plugins = ["mnestoma.testing"]\n'

DOWNSTREAM_TESTS = textwrap.dedent(
    """
    import pytest
    from sqlalchemy import func, select

    from mnestoma import CanonicalQuery, Event, Mnest
    from mnestoma.testing import (
        CanonicalQueryFactory, EventFactory, MnestFactory, ProtoMnestFactory,
    )


    def count(session, model):
        return session.scalar(select(func.count()).select_from(model))


    def test_committed_rows_are_visible_inside_the_test(mnestoma_session, mnestoma_uow):
        MnestFactory.create_batch(3)
        ProtoMnestFactory(recurring=True)
        EventFactory()
        CanonicalQueryFactory()
        mnestoma_session.commit()
        mnestoma_uow.mnests.record_passing("search", "1", "read", "2", turn_id="t-1")
        mnestoma_uow.queries.log("Find  Flights", "find flights", turn_id="t-1")
        mnestoma_uow.commit()
        mnestoma_session.rollback()  # nothing left to drop: everything was committed
        assert count(mnestoma_session, Mnest) == 6
        assert count(mnestoma_session, Event) == 2
        assert count(mnestoma_session, CanonicalQuery) == 2
        assert [p.uses for p in mnestoma_uow.mnests.recurring_protos()] == [4]


    def test_factories_need_no_fixture_and_open_the_session_lazily(request):
        MnestFactory.build()
        assert "mnestoma_session" not in request.fixturenames
        mnest = MnestFactory(strong=True)
        assert "mnestoma_session" in request.fixturenames
        assert mnest.id.startswith("mn_")


    def test_the_clock_drives_factories_and_the_ager(mnestoma_uow, mnestoma_clock):
        MnestFactory(old=True)
        ProtoMnestFactory(old=True)
        mnestoma_clock.advance(days=1)
        report = mnestoma_uow.mnests.apply_ager()
        mnestoma_uow.commit()
        assert (report.to_decaying, report.protos_pruned) == (1, 1)


    def test_a_failing_test_is_rolled_back_too(mnestoma_session):
        MnestFactory()
        mnestoma_session.commit()
        raise AssertionError("deliberate failure after a commit")


    def test_each_test_starts_from_an_empty_store(mnestoma_session):
        for model in (Mnest, Event, CanonicalQuery):
            assert count(mnestoma_session, model) == 0
    """
)


@pytest.fixture
def downstream_url(engine_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database the downstream suite gets through ``MNESTOMA_TEST_DATABASE_URL``.

    SQLite: a file that does not exist yet. PostgreSQL: a throwaway empty database.
    """
    if engine_name == "sqlite":
        return f"sqlite:///{tmp_path / 'downstream' / 'store.sqlite'}"
    return str(request.getfixturevalue("empty_db_url"))


def test_one_line_conftest_isolates_a_downstream_suite_that_commits(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, downstream_url: str
) -> None:
    monkeypatch.setenv("MNESTOMA_TEST_DATABASE_URL", downstream_url)
    pytester.makeconftest(DOWNSTREAM_CONFTEST)
    pytester.makepyfile(test_downstream=DOWNSTREAM_TESTS)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", *PLUGINS_OFF)

    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*deliberate failure after a commit*"])
    engine = make_engine(downstream_url)
    try:
        assert mnestoma.current_revision(engine) == mnestoma.head_revision()
        with Session(engine) as session:
            assert [_count(session, m) for m in (Mnest, Event, CanonicalQuery)] == [0, 0, 0]
    finally:
        engine.dispose()


def test_without_the_env_variable_the_suite_gets_a_temporary_sqlite_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MNESTOMA_TEST_DATABASE_URL", raising=False)
    pytester.makeconftest(DOWNSTREAM_CONFTEST)
    pytester.makepyfile(
        test_where="""
        def test_engine_is_a_migrated_sqlite_file(mnestoma_engine):
            import mnestoma
            assert mnestoma_engine.dialect.name == "sqlite"
            assert mnestoma_engine.url.database.endswith(".sqlite")
            assert mnestoma.current_revision(mnestoma_engine) == mnestoma.head_revision()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", *PLUGINS_OFF)
    result.assert_outcomes(passed=1)


# --- the fixtures, in this process, on both engines ----------------------------------------


def test_session_commit_keeps_rows_visible_for_the_rest_of_the_test(
    mnestoma_session: Session,
) -> None:
    MnestFactory.create_batch(2)
    mnestoma_session.commit()
    MnestFactory()
    mnestoma_session.rollback()
    assert _count(mnestoma_session, Mnest) == 2


def test_uow_reads_now_from_the_test_clock(
    mnestoma_uow: UnitOfWork, mnestoma_clock: MovableClock
) -> None:
    created = mnestoma_uow.mnests.record_passing("search", "1", "read", "2")
    mnestoma_clock.advance(days=3)
    again = mnestoma_uow.mnests.record_passing("search", "1", "read", "2")
    assert created.ts_first == DEFAULT_START
    assert again.ts_last == DEFAULT_START + timedelta(days=3)
    assert again.uses == 2


def test_uow_commits_into_the_test_transaction_more_than_once(
    mnestoma_uow: UnitOfWork, mnestoma_session: Session
) -> None:
    mnestoma_uow.mnests.record_passing("a", "1", "b", "1")
    mnestoma_uow.commit()
    mnestoma_uow.mnests.record_passing("b", "1", "c", "1")
    mnestoma_uow.commit()
    mnestoma_uow.mnests.record_passing("c", "1", "d", "1")
    mnestoma_uow.rollback()
    assert mnestoma_uow.session is mnestoma_session
    assert _count(mnestoma_session, Mnest) == 2


def test_repository_fixture_sees_factory_rows(
    mnestoma_repository: mnestoma.MnestRepository,
) -> None:
    edge = MnestFactory(src_executor="search", dst_executor="read", strong=True)
    [(best, weight)] = mnestoma_repository.suggest_next("search")
    assert best.id == edge.id
    assert weight == pytest.approx(0.9)


def test_a_service_unit_of_work_can_join_the_test_session(
    mnestoma_session: Session, mnestoma_clock: MovableClock
) -> None:
    with UnitOfWork.joining(mnestoma_session, clock=mnestoma_clock) as uow:
        uow.mnests.record_passing("a", "1", "b", "1")
        uow.commit()
    mnestoma_session.commit()
    assert _count(mnestoma_session, Event) == 1


def test_factory_traits_age_as_their_names_say(
    mnestoma_uow: UnitOfWork, mnestoma_clock: MovableClock
) -> None:
    MnestFactory(weak=True)
    MnestFactory(old=True)
    MnestFactory(strong=True)
    ProtoMnestFactory(old=True)
    DecayingMnestFactory(old=True)
    ProtoMnestFactory(recurring=True)
    report = mnestoma_uow.mnests.apply_ager()
    assert (report.to_decaying, report.protos_pruned) == (2, 1)
    # the old decaying row, and the old active row that has just become decaying
    assert report.archive_candidates == 2
    assert len(mnestoma_uow.mnests.recurring_protos()) == 1


def test_factory_rows_show_in_the_read_only_view(mnestoma_session: Session) -> None:
    MnestFactory()
    ProtoMnestFactory()
    DecayingMnestFactory()
    MnestFactory(superseded=True)
    assert _count(mnestoma_session, MnestomaView) == 2


def test_factories_without_a_bound_session_say_how_to_bind_one() -> None:
    with bind_factories(None), pytest.raises(RuntimeError, match="bind_factories"):
        MnestFactory()


def test_bind_factories_restores_the_previous_binding(mnestoma_clock: MovableClock) -> None:
    other = MovableClock(DEFAULT_START + timedelta(days=400))
    with bind_factories(None, clock=other):
        assert factory_now() == other()
    assert factory_now() == mnestoma_clock()


def test_factories_read_now_from_the_test_clock(
    mnestoma_session: Session, mnestoma_clock: MovableClock
) -> None:
    before = MnestFactory(strong=True)
    mnestoma_clock.advance(days=10)
    after = MnestFactory(strong=True)
    proto = ProtoMnestFactory(old=True)
    event = EventFactory(mnest=after)
    assert before.ts_last == DEFAULT_START
    assert after.ts_last == event.ts == DEFAULT_START + timedelta(days=10)
    assert proto.ts_last == mnestoma_clock() - timedelta(days=120)


# --- the clock, no database -----------------------------------------------------------------


def test_clock_returns_aware_utc_and_moves_only_when_told() -> None:
    clock = MovableClock()
    assert clock() == clock() == DEFAULT_START
    assert clock().utcoffset() == timedelta(0)
    assert clock.advance(days=1, hours=2) == DEFAULT_START + timedelta(days=1, hours=2)
    assert clock() == DEFAULT_START + timedelta(days=1, hours=2)


def test_clock_set_refuses_a_naive_datetime() -> None:
    clock = MovableClock()
    with pytest.raises(mnestoma.InvalidInput):
        clock.set(datetime(2026, 5, 1, 12, 0))  # naive on purpose
    assert clock() == DEFAULT_START
