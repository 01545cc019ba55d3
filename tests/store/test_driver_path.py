"""The hot paths run at the driver while nobody observes the statements, and go back through
SQLAlchemy as soon as somebody does; a driver error there is still the package's error."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy import exc as sa_exc

import mnestoma
from mnestoma.core.errors import ConflictError, DatabaseUnavailable, StoreError
from mnestoma.core.rules import EventKind, MnestState, Recorder
from mnestoma.engines import locking
from mnestoma.schema import runner
from mnestoma.schema.sql import record, tables

EDGE = ("plan", "1", "search", "2")


@pytest.fixture
def sqlalchemy_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement SQLAlchemy's Connection is asked to run (by patching, which is not an
    event listener, so it does not count as observing the statements)."""
    seen: list[str] = []
    execute, driver_sql = Connection.execute, Connection.exec_driver_sql

    def note(statement: str) -> None:
        # Not the test kit's own housekeeping: another module's database may be dropped
        # in the middle of a test, when its store is collected.
        if not statement.lstrip().upper().startswith(("CREATE DATABASE", "DROP DATABASE")):
            seen.append(statement)

    def counting_execute(self: Connection, statement: Any, *args: Any, **kw: Any) -> Any:
        note(str(statement))
        return execute(self, statement, *args, **kw)

    def counting_driver_sql(self: Connection, statement: str, *args: Any, **kw: Any) -> Any:
        note(statement)
        return driver_sql(self, statement, *args, **kw)

    monkeypatch.setattr(Connection, "execute", counting_execute)
    monkeypatch.setattr(Connection, "exec_driver_sql", counting_driver_sql)
    yield seen


def test_a_reinforcement_runs_at_the_driver_when_nobody_listens(
    store: mnestoma.Mnestoma, sqlalchemy_calls: list[str]
) -> None:
    store.record_passing(*EDGE)
    sqlalchemy_calls.clear()
    m = store.record_passing(*EDGE)
    assert m.uses == 2
    assert sqlalchemy_calls == []


def test_a_services_statement_listener_sees_every_statement_of_a_passing(
    store: mnestoma.Mnestoma,
) -> None:
    seen: list[str] = []

    def listener(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        store.record_passing(*EDGE)
        store.record_passing(*EDGE)
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    # the edge is looked up on both passings (on PostgreSQL inside the one statement that
    # writes the passing: WITH locked AS (SELECT ... FROM mnests ... FOR UPDATE) ...)
    reads = [s for s in seen if "FROM mnests" in s]
    writes = [s for s in seen if "INSERT INTO events" in s]
    assert len(reads) >= 2
    assert len(writes) == 2  # created, then reinforced
    seen.clear()
    store.record_passing(*EDGE)
    assert seen == []  # removed: the listener no longer runs, and nothing else needs it
    assert store.find(*EDGE).uses == 3


def test_an_error_hook_of_the_service_turns_the_driver_path_off(
    store: mnestoma.Mnestoma, sqlalchemy_calls: list[str]
) -> None:
    def hook(_context: Any) -> None:
        return None

    store.record_passing(*EDGE)
    event.listen(store.engine, "handle_error", hook)
    try:
        sqlalchemy_calls.clear()
        store.record_passing(*EDGE)
        assert sqlalchemy_calls  # the hook is consulted only for statements SQLAlchemy runs
    finally:
        event.remove(store.engine, "handle_error", hook)


def test_sql_logging_shows_the_statements_of_a_passing(
    store: mnestoma.Mnestoma, caplog: pytest.LogCaptureFixture
) -> None:
    store.record_passing(*EDGE)
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
        store.record_passing(*EDGE)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "FROM mnests" in logged
    assert "events" in logged


def test_a_driver_error_at_the_driver_is_the_packages_error_and_changes_nothing(
    store: mnestoma.Mnestoma,
) -> None:
    first = store.record_passing(*EDGE)
    again = {c: getattr(first, c) for c in tables.MNEST_COLUMNS}  # the same primary key
    again["dst_executor"] = "elsewhere"
    with store.engine.connect() as conn:
        conn.begin()
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("SELECT 1")  # the package's listener begins the transaction
        ex = runner.runner_for(conn)
        assert isinstance(ex, runner.DriverRunner)
        assert ex._driver() is not None  # this statement does run at the driver
        ex.many(record.INSERT_EVENT, [_event(first.id)])  # a write that the error undoes
        with pytest.raises(ConflictError) as caught:
            ex.many(record.INSERT_MNEST_LOCKED, [again])
        assert isinstance(caught.value.__cause__, sa_exc.IntegrityError)
        conn.rollback()
    assert [m.dst_executor for m in store.edges()] == ["search"]
    assert len(store.events(mnest_id=first.id)) == 1


def _event(mnest_id: str) -> dict[str, Any]:
    return {
        "mnest_id": mnest_id,
        "kind": EventKind.REINFORCED.value,
        "ts": datetime(2026, 1, 1, tzinfo=UTC),
        "turn_id": None,
        "weight_before": None,
        "weight_after": 0.3,
        "state_before": None,
        "state_after": MnestState.ACTIVE.value,
        "recorder": Recorder.CALL.value,
    }


def test_a_lost_postgresql_connection_at_the_driver_is_invalidated(pg_store_url: str) -> None:
    engine = mnestoma.make_engine(pg_store_url)
    admin = create_engine(pg_store_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.begin()
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            with admin.connect() as a:
                a.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            ex = runner.runner_for(conn)
            with pytest.raises(DatabaseUnavailable):
                ex.rows(record.SELECT_BY_ID_LOCKED, {"id": "mn_any"})
            assert conn.invalidated
        with mnestoma.Mnestoma(engine) as m:  # the pool hands out a working connection
            assert m.record_passing(*EDGE).uses == 1
    finally:
        engine.dispose()
        admin.dispose()


def test_a_listener_on_a_callers_own_connection_sees_the_repositorys_statements(
    store_url: str,
) -> None:
    engine = mnestoma.make_engine(store_url)
    seen: list[str] = []

    def listener(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    try:
        with engine.connect() as conn:
            event.listen(conn, "before_cursor_execute", listener)
            repo = mnestoma.MnestRepository(conn)
            repo.record_passing(*EDGE)
            assert repo.record_passing(*EDGE).uses == 2
            conn.commit()
        assert sum("INSERT INTO events" in s for s in seen) == 2
    finally:
        engine.dispose()


def test_a_schema_translate_map_on_the_connection_is_honoured(store_url: str) -> None:
    # The map sends the package's tables to a schema that does not exist: a statement that
    # honours it fails; one run as compiled, without the renaming, would succeed.
    engine = mnestoma.make_engine(store_url)
    try:
        with engine.connect() as plain:
            mnestoma.MnestRepository(plain).record_passing(*EDGE)
            plain.commit()
        with engine.connect() as conn:
            renamed = conn.execution_options(schema_translate_map={None: "nowhere"})
            with pytest.raises(mnestoma.MnestomaError):
                mnestoma.MnestRepository(renamed).find(*EDGE)
    finally:
        engine.dispose()


def test_reads_run_at_the_driver_in_one_snapshot_of_their_own(
    store_url: str, sqlalchemy_calls: list[str]
) -> None:
    # A read unit's statements run at the driver, and (SQLite: the package's listener
    # begins a read snapshot before the first one) see one state of the store, while a
    # writer commits between them.
    engine = mnestoma.make_engine(store_url)
    factory = mnestoma.make_session_factory(engine)
    other = mnestoma.Mnestoma(engine)
    try:
        other.record_passing(*EDGE)
        sqlalchemy_calls.clear()
        with mnestoma.UnitOfWork(factory) as reader:
            first = reader.mnests.find(*EDGE)
            other.record_passing(*EDGE)  # commits while the read unit is open
            again = reader.mnests.find(*EDGE)
        assert sqlalchemy_calls == []
        assert first is not None and again is not None
        if engine.dialect.name == "sqlite":
            assert again.uses == first.uses == 1  # one snapshot for the whole unit
        else:
            assert (first.uses, again.uses) == (1, 2)  # READ COMMITTED, as documented
    finally:
        other.close()
        engine.dispose()


def test_sqlite_plans_the_hot_statements_once_not_at_each_call(tmp_path) -> None:
    """SQLite re-plans a cached statement each time a value is bound to a parameter that its
    planner compared with a partial index's constant (a state, an event kind). The hot
    statements write such values as literals: once warm, recording, looking up and walking
    prepare nothing. SQLite calls the authorizer only while it prepares a statement."""
    store = mnestoma.Mnestoma(f"sqlite:///{tmp_path / 'plans.sqlite'}")
    prepared: list[tuple[Any, ...]] = []

    def authorizer(action: int, *args: Any) -> int:
        # BEGIN, COMMIT and ROLLBACK are prepared afresh each time by Python's driver, and
        # so is the PRAGMA that gives a write's wait for the lock its busy timeout (set
        # before BEGIN IMMEDIATE and back after it: nothing is planned there)
        busy = action == sqlite3.SQLITE_PRAGMA and args[:1] == ("busy_timeout",)
        if action != sqlite3.SQLITE_TRANSACTION and not busy:
            prepared.append((action, *args))
        return sqlite3.SQLITE_OK

    def calls(n: int) -> None:
        store.record_passing(*EDGE, turn_id=f"turn-{n}")
        store.record_passing(*EDGE)
        store.record_proto("plan", "1", "summarise", turn_id=f"turn-{n}")
        store.record_turn(f"batch-{n}", [EDGE, ("search", "2", "read", "1")])
        store.find(*EDGE)
        store.suggest_next("plan")
        store.walk("plan")
        store.edges(src_executor="plan", states=["active"])
        store.edges(states=["decaying", "active"], limit=10)

    try:
        calls(0)
        raw = store.engine.raw_connection()  # the pool's one connection, used by every call
        try:
            raw.driver_connection.set_authorizer(authorizer)
        finally:
            raw.close()
        calls(1)  # setting an authorizer expires every prepared statement: prepared again
        assert prepared, "the authorizer sees each preparation"
        prepared.clear()
        for n in range(2, 6):
            calls(n)
        assert prepared == []
    finally:
        store.close()


def _event_rows(store: mnestoma.Mnestoma, mnest_id: str) -> list[tuple[Any, ...]]:
    return [
        (e.kind, e.ts, e.turn_id, e.weight_before, e.weight_after, e.state_after, e.recorder)
        for e in store.events(mnest_id=mnest_id)
    ]


@pytest.mark.parametrize("observed", [False, True], ids=["at-the-driver", "through-sqlalchemy"])
def test_rows_given_as_tuples_in_any_column_order_write_what_mappings_write(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    first = store.record_passing(*EDGE)
    mapping = _event(first.id)
    columns = tuple(reversed(mapping))  # not the statement's own order
    listener = lambda *_args: None  # noqa: E731 - a service's statement listener
    if observed:
        event.listen(store.engine, "before_cursor_execute", listener)
    try:
        with store.engine.begin() as conn:
            ex = runner.runner_for(conn)
            ex.many(record.INSERT_EVENT, [mapping])
            ex.many(record.INSERT_EVENT, [tuple(mapping[c] for c in columns)] * 2, columns)
    finally:
        if observed:
            event.remove(store.engine, "before_cursor_execute", listener)
    written = [e for e in _event_rows(store, first.id) if e[0] != EventKind.CREATED.value]
    assert len(written) == 3
    assert written[0] == written[1] == written[2]
    assert written[0][0] == EventKind.REINFORCED.value and written[0][4] == 0.3


def test_a_parameter_missing_from_tuple_rows_keeps_its_compiled_value(
    store: mnestoma.Mnestoma,
) -> None:
    m = store.record_passing(*EDGE)
    stmt = record.SET_STATE.values(state=MnestState.DECAYING.value)  # state as a literal bind
    with store.engine.begin() as conn:
        ex = runner.runner_for(conn)
        ex.many(stmt, [(m.id,)], ("b_id",))
    assert store.get(m.id).state == MnestState.DECAYING.value


def test_an_event_tuple_puts_each_value_in_the_column_event_row_names() -> None:
    from mnestoma.store.rows import event_values

    values = event_values(
        "mn_1",
        EventKind.TRANSITION,
        datetime(2026, 1, 1, tzinfo=UTC),
        turn_id="t-1",
        weight_before=0.4,
        weight_after=0.1,
        state_before="active",
        state_after="decaying",
        reason="why",
        related_id="mn_2",
        recorder=Recorder.AGER.value,
    )
    by_column = dict(zip(record.EVENT_ROW, values, strict=True))
    assert by_column["mnest_id"] == "mn_1" and by_column["related_id"] == "mn_2"
    assert by_column["kind"] == EventKind.TRANSITION.value and by_column["turn_id"] == "t-1"
    assert (by_column["weight_before"], by_column["weight_after"]) == (0.4, 0.1)
    assert (by_column["state_before"], by_column["state_after"]) == ("active", "decaying")
    assert by_column["reason"] == "why" and by_column["recorder"] == Recorder.AGER.value
    # every column but the generated id is named: a new column must be placed on purpose
    assert set(record.EVENT_ROW) == set(tables.EVENT_COLUMNS) - {"id"}


OBSERVED = pytest.mark.parametrize(
    "observed", [False, True], ids=["at-the-driver", "through-sqlalchemy"]
)


@contextmanager
def _observed_if(store: mnestoma.Mnestoma, observed: bool) -> Iterator[None]:
    """A service's statement listener on the engine while the block runs, if ``observed``."""

    def listener(*_args: Any) -> None:
        return None

    if observed:
        event.listen(store.engine, "before_cursor_execute", listener)
    try:
        yield
    finally:
        if observed:
            event.remove(store.engine, "before_cursor_execute", listener)


@OBSERVED
def test_a_misspelt_column_of_tuple_rows_is_refused_and_writes_nothing(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    m = store.record_passing(*EDGE, tags={"keep": 1})
    columns = tuple("b_tag" if c == "b_tags" else c for c in record.REINFORCE_ROW)
    row = (m.id, 0.9, m.ts_last, m.ts_weight, None, None)
    with _observed_if(store, observed), pytest.raises(StoreError), store.engine.begin() as conn:
        runner.runner_for(conn).many(record.UPDATE_REINFORCE, [row], columns)
    after = store.get(m.id)
    assert (after.weight, after.tags, after.uses) == (m.weight, {"keep": 1}, 1)


def test_a_key_the_statement_lacks_is_refused_at_the_driver_and_writes_nothing(
    store: mnestoma.Mnestoma,
) -> None:
    m = store.record_passing(*EDGE)
    # meant for PROMOTE: SET_STATE would change the state and drop the version silently
    misspelt = {"b_id": m.id, "b_state": MnestState.DECAYING.value, "b_dst_version": "3"}
    with pytest.raises(StoreError), store.engine.begin() as conn:
        runner.runner_for(conn).many(record.SET_STATE, [misspelt])
    assert store.get(m.id).state == MnestState.ACTIVE.value


@OBSERVED
def test_a_tuple_row_of_the_wrong_length_is_the_packages_error(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    m = store.record_passing(*EDGE)
    short = (m.id, 0.9, m.ts_last, m.ts_weight, None)
    with _observed_if(store, observed), pytest.raises(StoreError), store.engine.begin() as conn:
        runner.runner_for(conn).many(record.UPDATE_REINFORCE, [short], record.REINFORCE_ROW)
    assert store.get(m.id).weight == m.weight


@OBSERVED
def test_a_column_left_out_of_tuple_rows_gets_its_constant_default(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    m = store.record_passing(*EDGE)
    mapping = _event(m.id)
    del mapping["recorder"]  # the model's default: "call"
    columns = tuple(mapping)
    with _observed_if(store, observed), store.engine.begin() as conn:
        runner.runner_for(conn).many(record.INSERT_EVENT, [tuple(mapping.values())], columns)
    written = [e for e in store.events(mnest_id=m.id) if e.kind == EventKind.REINFORCED.value]
    assert [e.recorder for e in written] == [Recorder.CALL.value]


def test_a_reinforcement_writes_ts_last_and_ts_weight_each_in_its_column(
    store: mnestoma.Mnestoma, clock: Any
) -> None:
    start = clock()
    m = store.record_passing(*EDGE)
    clock.advance(days=10)
    store.apply_ager()  # decays the row: ts_weight moves to start + 10 days
    clock.set(start + timedelta(days=1))  # the clock steps back
    again = store.record_passing(*EDGE)
    stored = store.get(m.id)
    for seen in (again, stored):
        assert seen.ts_last == start + timedelta(days=1)
        assert seen.ts_weight == start + timedelta(days=10)  # never moved back
    (reinforced,) = [e for e in store.events(mnest_id=m.id) if e.kind == "reinforced"]
    assert reinforced.ts == start + timedelta(days=1)


def _reinforce_and_event(m: Any) -> tuple[runner.WriteStep, runner.WriteStep]:
    """A passing's two steps for the edge ``m``: its row to weight 0.9, and an event."""
    from mnestoma.store.rows import event_values

    row = (m.id, 0.9, m.ts_last, m.ts_weight, None, None, 0, 0, 1.0)
    ev = event_values(m.id, EventKind.REINFORCED, m.ts_last, weight_after=0.9, recorder="call")
    return (record.UPDATE_REINFORCE, row, record.REINFORCE_ROW), (
        record.INSERT_EVENT,
        ev,
        record.EVENT_ROW,
    )


@OBSERVED
def test_a_writes_steps_run_in_order_and_commit_with_the_last_when_asked(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    m = store.record_passing(*EDGE)
    with _observed_if(store, observed), store.engine.connect() as conn:
        conn.begin()
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("SELECT 1")  # the package's listener begins the transaction
        ex = runner.runner_for(conn)
        ex.writes(_reinforce_and_event(m))
        assert store.get(m.id).weight == m.weight  # not committed: another connection
        conn.rollback()
        assert store.get(m.id).weight == m.weight
        ex = runner.runner_for(conn)
        ex.ready(own=True)
        ex.writes(_reinforce_and_event(m), commit=True)
        # committed by the last step where nobody observes the commits, else by its owner
        conn.commit()
    assert store.get(m.id).weight == 0.9
    assert [e[0] for e in _event_rows(store, m.id)] == [
        EventKind.CREATED.value,
        EventKind.REINFORCED.value,
    ]


def test_a_writes_later_wrong_row_is_refused_before_its_first_step_runs(tmp_path) -> None:
    """At SQLite's driver, every row is converted before the first statement runs: the
    first step has not run when the second step's row is refused, in the same transaction
    (elsewhere the steps run one at a time, and the transaction undoes them)."""
    with mnestoma.Mnestoma(f"sqlite:///{tmp_path / 'store.db'}") as store:
        m = store.record_passing(*EDGE)
        update, (stmt, ev, columns) = _reinforce_and_event(m)
        with store.engine.connect() as conn:
            conn.begin()
            conn.exec_driver_sql("SELECT 1")  # the package's listener begins the transaction
            ex = runner.runner_for(conn)
            assert ex._driver() is not None  # these statements run at the driver
            with pytest.raises(StoreError):
                ex.writes((update, (stmt, ev[:-1], columns)))
            weight = conn.exec_driver_sql("SELECT weight FROM mnests WHERE id = ?", (m.id,))
            assert weight.scalar() == m.weight
            conn.rollback()


@pytest.mark.parametrize("observed", [False, True], ids=["at-the-driver", "through-sqlalchemy"])
def test_a_read_made_ready_before_the_lock_finds_what_first_finds(
    store: mnestoma.Mnestoma, observed: bool
) -> None:
    m = store.record_passing(*EDGE)
    found = {"s": "plan", "sv": "1", "d": "search", "dv": "2"}
    missing = {**found, "d": "nowhere"}
    with _observed_if(store, observed), store.engine.connect() as conn:
        ex = runner.runner_for(conn)
        ready = ex.bind(record.SELECT_ONE_ACTIVE, found)
        row = ex.first_bound(ready)
        assert row is not None
        assert row == ex.first(record.SELECT_ONE_ACTIVE, found)
        assert row[0] == m.id
        assert row[tables.MNEST_COLUMNS.index("ts_last")] == m.ts_last  # converted back
        assert ex.first_bound(ex.bind(record.SELECT_ONE_ACTIVE, missing)) is None
        conn.rollback()


def _watch_write_lock(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A flag, ``[True]`` from the moment a write has SQLite's write lock (``BEGIN
    IMMEDIATE`` returned) to the moment its transaction ends, for the rest of the test."""
    held = [False]
    begin, end = locking._begin_immediate, locking._end_write

    def timed_begin(*a: Any, **kw: Any) -> None:
        begin(*a, **kw)
        held[0] = True

    def timed_end(dbapi: Any) -> None:
        held[0] = False
        end(dbapi)

    monkeypatch.setattr(locking, "_begin_immediate", timed_begin)
    monkeypatch.setattr(locking, "_end_write", timed_end)
    return held


@pytest.mark.parametrize("turn", [None, "turn-1"], ids=["alone", "in-a-turn"])
def test_a_sqlite_passing_converts_its_parameters_before_it_takes_the_write_lock(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, turn: str | None
) -> None:
    """Other writers queue for SQLite's write lock: the lookup's parameters and the instant
    "now" (bound three times by the writes) are converted before ``BEGIN IMMEDIATE``, and
    nothing inside converts an instant or a lookup's parameters again."""
    from mnestoma.core import types

    inside: list[str] = []
    to_text, args = types.sqlite_timestamp_text, runner._Prepared.args

    def noting_text(value: Any) -> Any:
        if held[0]:
            inside.append("instant")
        return to_text(value)

    def noting_args(self: Any, *a: Any) -> Any:
        if held[0]:
            inside.append(f"args of {self.sql[:30]}")
        return args(self, *a)

    with mnestoma.Mnestoma(f"sqlite:///{tmp_path / 'store.db'}") as store:
        store.record_passing(*EDGE)  # warm: the statements compiled
        held = _watch_write_lock(monkeypatch)
        monkeypatch.setattr(types, "sqlite_timestamp_text", noting_text)
        monkeypatch.setattr(runner._Prepared, "args", noting_args)
        reinforced = store.record_passing(*EDGE, turn_id=turn)
        created = store.record_passing("plan", "1", "write", "1", turn_id=turn)
        proto = store.record_proto("plan", "1", "summarise", turn_id=turn)
        assert not held[0]  # every write's lock was taken and let go
        assert (reinforced.uses, created.uses, proto.uses) == (2, 1, 1)
        assert inside == []
        # a turn of several passings: its now too (its keys' lookup is built for the turn)
        rows = store.record_turn(f"batch-{turn}", [EDGE, ("plan", "1", "read", "1"), EDGE])
        assert [m.uses for m in rows] == [4, 1, 4]
        assert "instant" not in inside


TAGS = {"team": "search", "labels": ["a", "b"]}
SIG = {"summary": "a draft", "inputs": ["text"]}


@pytest.mark.parametrize("observed", [False, True], ids=["at-the-driver", "through-sqlalchemy"])
@pytest.mark.parametrize("turn", [None, "turn-1"], ids=["alone", "in-a-turn"])
def test_a_sqlite_reinforcement_leaves_the_rows_documents_and_first_instant_for_after_the_lock(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, turn: str | None, observed: bool
) -> None:
    """The row's tags, desired_sig and ts_first play no part in a reinforcement: SQLite's
    passing reads them as stored, the UPDATE keeps what the passing does not give, and the
    snapshot converts them once the write lock is let go. Under the lock no JSON document is
    decoded or encoded, and only the two instants the arithmetic needs are parsed."""
    import json

    from mnestoma.core import types

    held = [False]
    inside: list[str] = []
    parse = types.parse_sqlite_timestamp

    def loads(text_: str) -> Any:
        if held[0]:
            inside.append("decoded")
        return json.loads(text_)

    def dumps(value: Any) -> str:
        if held[0]:
            inside.append("encoded")
        return json.dumps(value)

    def noting_parse(value: Any) -> Any:
        if held[0]:
            inside.append("instant parsed")
        return parse(value)

    engine = mnestoma.make_engine(
        f"sqlite:///{tmp_path / 'store.db'}", json_serializer=dumps, json_deserializer=loads
    )
    with mnestoma.Mnestoma(engine) as store, _observed_if(store, observed):
        first = store.record_passing(*EDGE, tags=TAGS)
        wish = store.record_proto("plan", "1", "summarise", desired_sig=SIG, tags=TAGS)
        held = _watch_write_lock(monkeypatch)
        monkeypatch.setattr(types, "parse_sqlite_timestamp", noting_parse)
        again = store.record_passing(*EDGE, turn_id=turn)
        wish_again = store.record_proto("plan", "1", "summarise", turn_id=turn)
        assert not held[0]
        assert inside == ["instant parsed"] * 4  # ts_last and ts_weight, of each row
        assert (again.tags, again.ts_first, again.uses) == (TAGS, first.ts_first, 2)
        assert (wish_again.desired_sig, wish_again.tags) == (SIG, TAGS)
        assert wish_again.ts_first == wish.ts_first
        # a turn of several passings, each edge twice, one new edge: the same
        inside.clear()
        several = store.record_turn(
            f"several-{turn}",
            [EDGE, ("plan", "1", "summarise", None, False), ("plan", "1", "read", "1"), EDGE],
        )
        # where the two passings before it kept their rows (their own transactions, at
        # the driver: KeptRows), the turn reads neither, and parses nothing
        kept = turn is None and not observed
        assert inside == ([] if kept else ["instant parsed"] * 4)
        assert [m.uses for m in several] == [4, 3, 1, 4]
        assert [m.tags for m in several] == [TAGS, TAGS, None, TAGS]
        assert several[1].desired_sig == SIG
        assert (several[0].ts_first, several[1].ts_first) == (first.ts_first, wish.ts_first)
        again, wish_again = several[0], several[1]
        # each snapshot is its row as stored
        with store.engine.connect() as conn:
            for m in (again, wish_again):
                where = tables.MNESTS.c.id == m.id
                stored = conn.execute(tables.MNESTS.select().where(where)).one()
                assert tuple(stored) == tuple(getattr(m, c) for c in tables.MNEST_COLUMNS)
        # documents given replace the row's
        retagged = store.record_passing(*EDGE, tags={"team": "b"}, turn_id=turn and "turn-2")
        assert retagged.tags == {"team": "b"}
        if turn is not None:  # the turn counted this occurrence already: the row as it is
            assert store.record_passing(*EDGE, turn_id="turn-2").tags == {"team": "b"}


def test_a_turn_keeps_the_rows_documents_unless_a_passing_gives_them(store_url: str) -> None:
    """A turn's reinforcements keep the tags a passing does not give; the last given win,
    in the snapshot as in the row."""
    with mnestoma.Mnestoma(store_url) as store:
        store.record_passing(*EDGE, tags=TAGS)
        kept, given = (
            store.record_turn(
                "turn-docs",
                [EDGE, ("plan", "1", "read", "1")],
            ),
            store.record_turn(
                "turn-docs-2",
                [(*EDGE, True, {"team": "c"}), EDGE],
            ),
        )
        assert kept[0].tags == TAGS
        assert [m.tags for m in given] == [{"team": "c"}, {"team": "c"}]
        read = store.get(given[0].id)
        assert read is not None and read.tags == {"team": "c"}
        # the turn again (counted already): its rows as they are, documents and all
        retried = store.record_turn("turn-docs-2", [(*EDGE, True, {"team": "d"}), EDGE])
        assert [(m.uses, m.tags) for m in retried] == [(given[0].uses, {"team": "c"})] * 2
        assert retried[0].ts_first == kept[0].ts_first


def _listed_then_converted(prepared: Any, row: tuple[Any, ...]) -> Any:
    """A row listed in the statement's parameter order (its literal where the row has no
    such column), then converted: what ``fused`` must give."""
    where = {name: i for i, name in enumerate(prepared.columns)}
    out = [row[where[n]] if n in where else prepared.defaults[n] for n in prepared.names]
    return prepared.converted(out, {})


def _plain(args: Any) -> Any:
    """Parameters as comparable values: psycopg's JSON wrappers compare by identity."""
    if isinstance(args, dict):
        return {k: getattr(v, "obj", v) for k, v in args.items()}
    return tuple(getattr(v, "obj", v) for v in args)


@pytest.mark.parametrize("native", [True, False], ids=["native", "driver-placeholders"])
def test_a_row_listed_and_converted_in_one_step_is_what_the_two_steps_give(
    store: mnestoma.Mnestoma, native: bool
) -> None:
    from mnestoma.schema.sql import chains

    now = datetime(2026, 7, 1, 12, 30, 0, 123456, tzinfo=UTC)
    later = now + timedelta(days=3)
    cases = [
        (record.INSERT_EVENT, record.EVENT_ROW, ("mn_a", "reinforced", now, "t", 0.3, 0.45)),
        (record.INSERT_EVENT, record.EVENT_ROW, ("mn_b", "created", later, None, None, 1)),
        (record.UPDATE_REINFORCE, record.REINFORCE_ROW, ("mn_a", 0.5, now, later, {"k": [1]})),
        (record.UPDATE_REINFORCE, record.REINFORCE_ROW, ("mn_a", 1, None, now, None, "s")),
        (chains.count_chains(store.engine.dialect.name), chains.CHAIN_ROW, ("a", "b", "c", 2)),
    ]
    with store.engine.connect() as conn:
        for stmt, columns, head in cases:
            prepared = runner._prepare(conn, stmt, columns, native=native)
            assert prepared is not None
            row = (*head, *([None] * (len(columns) - len(head))))
            if columns is chains.CHAIN_ROW:
                row = (*head, now)
            fused = prepared.fused()
            assert _plain(fused(row, {})) == _plain(_listed_then_converted(prepared, row))
            seen: dict[datetime, Any] = {}
            fused(row, seen)
            if now in row:
                assert now in seen  # each instant converted once per operation
            with pytest.raises(StoreError, match="values for its"):
                fused(row[:-1], {})


def _driver_in_a_write(
    path: str, isolation_level: str | None, cls: type = sqlite3.Connection
) -> Any:
    """A sqlite3 connection to ``path`` (a table ``t``) with a row inserted, uncommitted."""
    driver = sqlite3.connect(path, isolation_level=isolation_level, factory=cls)
    driver.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    if driver.in_transaction:
        driver.commit()
    if isolation_level is None:
        driver.execute("BEGIN IMMEDIATE")
    driver.execute("INSERT INTO t VALUES (1)")
    assert driver.in_transaction
    return driver


def _rows_seen_elsewhere(path: str) -> int:
    other = sqlite3.connect(path)
    try:
        return int(other.execute("SELECT count(*) FROM t").fetchone()[0])
    finally:
        other.close()


def test_sqlite_commits_with_the_drivers_prepared_commit_only_where_statements_control_it(
    tmp_path,
) -> None:
    """A transaction the connection controls by statements (``isolation_level`` None, as
    make_engine sets it) is committed by the ``COMMIT`` statement the driver keeps prepared;
    the driver's own transaction control, a subclass of the driver's connection (its own
    ``commit`` may do more) and a connection outside any transaction are left to
    ``commit()``: nothing is done to them."""
    path = str(tmp_path / "commit.sqlite")
    driver = _driver_in_a_write(path, None)
    assert locking._commit_prepared(driver) is True
    assert not driver.in_transaction
    assert _rows_seen_elsewhere(path) == 1
    assert locking._commit_prepared(driver) is False  # no transaction: nothing to commit
    driver.close()

    class OwnCommit(sqlite3.Connection):
        pass

    for isolation, cls in (("DEFERRED", sqlite3.Connection), (None, OwnCommit)):
        driver = _driver_in_a_write(path, isolation, cls)
        assert locking._commit_prepared(driver) is False
        assert driver.in_transaction  # left to the dialect's commit
        driver.rollback()
        driver.close()
    assert _rows_seen_elsewhere(path) == 1


def test_a_sqlite_write_commits_with_the_drivers_prepared_commit_through_every_door(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A facade's passing and turn (committed at the driver right after the last statement)
    and a unit of work's commit (through SQLAlchemy) all commit by the prepared statement,
    and what they wrote is committed."""
    prepared = locking._commit_prepared
    results: list[bool] = []

    def noting(dbapi: Any) -> bool:
        results.append(prepared(dbapi))
        return results[-1]

    monkeypatch.setattr(locking, "_commit_prepared", noting)
    url = f"sqlite:///{tmp_path / 'doors.sqlite'}"
    mnestoma.upgrade(url)
    with mnestoma.Mnestoma(url) as store:
        results.clear()
        store.record_passing(*EDGE)
        store.record_turn("t1", [EDGE, ("search", "2", "answer", "1")])
        assert results == [True, True]
    engine = mnestoma.make_engine(url)
    try:
        with mnestoma.UnitOfWork(mnestoma.make_session_factory(engine)) as unit:
            unit.mnests.record_passing(*EDGE)
            unit.commit()
        assert results[-1] is True
    finally:
        engine.dispose()
    with mnestoma.Mnestoma(url) as again:
        found = again.find(*EDGE)
        assert found is not None and found.uses == 3
