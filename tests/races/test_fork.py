"""After fork(): the tracer's locks and its background writer work in the child.

A child process gets copies of the parent's locks in whatever state other threads held
them, and none of the parent's threads. Each test forks (multiprocessing's "fork" context)
and waits for the child's answer with a timeout, so that a hang fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine
from sqlalchemy.orm import sessionmaker
from traced_tools import read, search

import mnestoma
from mnestoma import Passing
from mnestoma.engines import locking
from mnestoma.recording.tracing import BackgroundWriter, stats, turn

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="needs fork()"
)

CHILD_TIMEOUT = 20  # seconds a child has to answer before the test fails
SEARCH_TO_READ = ("search", "1", "read", "1")


class FakeStore:
    """Remembers the turns it was given; holds writes made in ``blocking_pid`` at a gate."""

    def __init__(self, blocking_pid: int | None = None) -> None:
        self.turns: list[str] = []
        self.blocking_pid = blocking_pid
        self.gate = threading.Event()
        self.entered = threading.Event()

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        if os.getpid() == self.blocking_pid:
            self.entered.set()
            assert self.gate.wait(CHILD_TIMEOUT), "the test never opened the gate"
        self.turns.append(turn_id)
        return []


def _answer(work: Callable[[], Any], conn: Any) -> None:
    try:
        conn.send((True, work()))
    except BaseException:  # the child reports every failure, then ends
        conn.send((False, traceback.format_exc()))


def in_forked_child(work: Callable[[], Any]) -> Any:
    """Run ``work`` in a forked child and return its result; fail if it does not answer."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_answer, args=(work, send), daemon=True)
    child.start()
    send.close()
    answered = receive.poll(CHILD_TIMEOUT)
    if answered:
        ok, value = receive.recv()
        child.join(CHILD_TIMEOUT)
    if child.is_alive():
        child.kill()
        child.join()
    if not answered:
        pytest.fail(f"the forked child did not answer within {CHILD_TIMEOUT} s (a hang)")
    assert ok, value
    assert child.exitcode == 0
    return value


@contextlib.contextmanager
def another_thread(body: Callable[[threading.Event, threading.Event], None]) -> Iterator[None]:
    """Run ``body(inside, release)`` in another thread for the block: the block begins once
    the thread has set ``inside``; at its end ``release`` is set and the thread joined."""
    inside = threading.Event()
    release = threading.Event()
    thread = threading.Thread(target=body, args=(inside, release), daemon=True)
    thread.start()
    assert inside.wait(CHILD_TIMEOUT)
    try:
        yield
    finally:
        release.set()
        thread.join(CHILD_TIMEOUT)


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """Hold ``lock`` (a lock or a condition) in another thread for the block's duration."""

    def hold(taken: threading.Event, release: threading.Event) -> None:
        with lock:
            taken.set()
            release.wait(CHILD_TIMEOUT)

    with another_thread(hold):
        yield


def traced_turns(store: FakeStore, n: int = 3) -> tuple[list[str], list[list[Passing]]]:
    passings = []
    for k in range(n):
        with turn(store, f"child-{k}") as t:
            read(search(f"q{k}")[0])
        passings.append(t.passings)
    return store.turns, passings


# ---------------------------------------------------------------------------- tracer locks


def test_a_child_forked_while_another_thread_holds_the_counter_lock_runs_traced_turns() -> None:
    store = FakeStore()
    with held_by_another_thread(stats._lock):
        turns, passings = in_forked_child(lambda: traced_turns(store))
    assert turns == ["child-0", "child-1", "child-2"]
    assert passings == [[Passing(*SEARCH_TO_READ, outcome="ok")]] * 3


def test_a_child_forked_inside_a_turn_whose_lock_another_thread_holds_can_go_on() -> None:
    store = FakeStore()
    with turn(store, "shared") as t:
        first = search("q")
        with held_by_another_thread(t._lock):

            def go_on() -> list[Passing]:
                read(first[0])  # the child goes on in the turn it was forked in
                return t.passings

            passings = in_forked_child(go_on)
    assert passings == [Passing(*SEARCH_TO_READ, outcome="ok")]


# ---------------------------------------------------------------------------- background writer


def test_a_child_of_a_process_with_a_background_writer_writes_its_turns() -> None:
    store = FakeStore()
    with BackgroundWriter(store) as writer:
        writer.submit("parent-0", [Passing(*SEARCH_TO_READ)])
        assert writer.flush(timeout=CHILD_TIMEOUT)

        def child() -> tuple[list[str], bool, int]:
            for k in range(3):
                with turn(None, f"child-{k}", writer=writer):
                    read(search(f"q{k}")[0])
            return store.turns, writer.flush(timeout=CHILD_TIMEOUT), writer.written

        turns, flushed, written = in_forked_child(child)
    assert flushed and written == 3
    assert turns == ["parent-0", "child-0", "child-1", "child-2"]  # the parent's, inherited
    assert store.turns == ["parent-0"]


def test_a_child_forked_while_another_thread_holds_the_writer_s_lock_writes_its_turns() -> None:
    store = FakeStore()
    with BackgroundWriter(store) as writer, held_by_another_thread(writer._cond):

        def child() -> tuple[list[str], bool]:
            with turn(None, "child-0", writer=writer):
                read(search("q")[0])
            return store.turns, writer.flush(timeout=CHILD_TIMEOUT)

        turns, flushed = in_forked_child(child)
    assert flushed and turns == ["child-0"]


def test_turns_the_parent_queued_are_not_written_by_the_child() -> None:
    store = FakeStore(blocking_pid=os.getpid())
    writer = BackgroundWriter(store)
    try:
        for k in range(3):  # parent-0 is being written, parent-1 and parent-2 wait
            assert writer.submit(f"parent-{k}", [Passing(*SEARCH_TO_READ)])
        assert store.entered.wait(CHILD_TIMEOUT)

        def child() -> tuple[list[str], int, bool]:
            before = writer.pending
            writer.submit("child-0", [Passing(*SEARCH_TO_READ)])
            return store.turns, before, writer.flush(timeout=CHILD_TIMEOUT)

        turns, pending_at_start, flushed = in_forked_child(child)
    finally:
        store.gate.set()
        assert writer.close(timeout=CHILD_TIMEOUT)
    assert flushed and turns == ["child-0"] and pending_at_start == 0
    assert store.turns == ["parent-0", "parent-1", "parent-2"]


class ReportingStore:
    """A store whose ``record_turn`` sends the turn's id down a pipe (from a forked child)."""

    def __init__(self, send: Any) -> None:
        self.send = send

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        self.send.send(turn_id)
        return []


def run_child(ctx: Any, child: Any, receive: Any, send: Any) -> tuple[int | None, list[str]]:
    """Run ``child`` in a process of ``ctx``; its exit code and what it sent down the pipe
    (``receive``, ``send``), in order."""
    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    proc.join(CHILD_TIMEOUT)
    if proc.is_alive():
        proc.kill()
        pytest.fail("the forked child did not end")
    send.close()
    written = []
    with contextlib.suppress(EOFError):  # the end of what the child wrote
        while receive.poll(CHILD_TIMEOUT):
            written.append(receive.recv())
    return proc.exitcode, written


def test_a_child_writes_what_it_queued_when_it_ends_without_flushing() -> None:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    writer = BackgroundWriter(ReportingStore(send))
    try:

        def child() -> None:
            for k in range(3):
                with turn(None, f"child-{k}", writer=writer):
                    read(search(f"q{k}")[0])
            # no flush, no close: the child's end must write them

        exitcode, written = run_child(ctx, child, receive, send)
    finally:
        writer.close(timeout=CHILD_TIMEOUT)
    assert exitcode == 0
    assert written == ["child-0", "child-1", "child-2"]


def test_a_writer_built_in_a_multiprocessing_child_is_flushed_at_the_child_s_end() -> None:
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        writer = BackgroundWriter(ReportingStore(send))  # the child's own, never closed by it
        for k in range(3):
            writer.submit(f"child-{k}", [Passing(*SEARCH_TO_READ)])

    exitcode, written = run_child(ctx, child, receive, send)
    assert exitcode == 0
    assert written == ["child-0", "child-1", "child-2"]


# ---------------------------------------------------------------------------- real store


def test_a_child_s_background_writer_writes_its_turns_to_the_store(
    store: mnestoma.Mnestoma,
) -> None:
    with BackgroundWriter(store) as writer:
        with turn(None, "parent-0", writer=writer):
            read(search("q")[0])
        assert writer.flush(timeout=CHILD_TIMEOUT)  # the parent's pool now holds a connection

        def child() -> bool:
            for k in range(3):
                with turn(None, f"child-{k}", writer=writer):
                    read(search(f"q{k}")[0])
            return writer.flush(timeout=CHILD_TIMEOUT) and writer.written == 3

        assert in_forked_child(child)
        with turn(None, "parent-1", writer=writer):  # the parent's connection still works
            read(search("q")[0])
    (row,) = store.edges()
    assert row.uses == 5
    for turn_id in ("parent-0", "child-0", "child-1", "child-2", "parent-1"):
        assert [e.recorder for e in store.events(turn_id=turn_id)] == ["tracer"]


def test_a_child_s_writer_does_not_reuse_the_parent_s_pooled_connection(
    store: mnestoma.Mnestoma,
) -> None:
    with store.engine.connect() as conn:  # back in the pool after the block
        parent = conn.connection.dbapi_connection

    def reuses_parent_s() -> bool:
        with store.engine.connect() as conn:
            return conn.connection.dbapi_connection is parent

    with BackgroundWriter(store):
        assert not in_forked_child(reuses_parent_s)


def test_a_forked_worker_s_span_processor_records_over_connections_of_its_own(
    store: mnestoma.Mnestoma,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from mnestoma.recording.otel import MnestomaSpanProcessor

    processor = MnestomaSpanProcessor(store, version_of={"search": "1", "read": "1"})
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    with store.engine.connect() as conn:
        parent = conn.connection.dbapi_connection

    def tool(name: str, arguments: str, result: str) -> None:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.arguments": arguments,
            "gen_ai.tool.call.result": result,
        }
        with tracer.start_as_current_span(name, attributes=attributes):
            pass

    def child() -> tuple[int, bool]:
        with tracer.start_as_current_span("turn"):
            tool("search", '{"q": "pdf"}', '["a/report.pdf"]')
            tool("read", '{"path": "a/report.pdf"}', "the text")
        assert processor.force_flush(CHILD_TIMEOUT * 1000)
        with store.engine.connect() as conn:
            reused = conn.connection.dbapi_connection is parent
        return processor.stats.passings_recorded, reused

    try:
        recorded, reused = in_forked_child(child)
    finally:
        provider.shutdown()
    assert (recorded, reused) == (1, False)
    (row,) = store.edges()
    assert (row.src_executor, row.dst_executor, row.uses) == ("search", "read", 1)


def test_a_forked_child_s_store_does_not_reuse_the_parent_s_pooled_connection(
    store: mnestoma.Mnestoma,
) -> None:
    """A store built before the fork (a preloaded app) gets connections of its own in the
    child, and both processes keep writing."""
    store.record_passing("search", "1", "read", "1")
    with store.engine.connect() as conn:  # back in the pool after the block
        parent = conn.connection.dbapi_connection

    def child() -> bool:
        store.record_passing("search", "1", "read", "1")
        with store.engine.connect() as conn:
            return conn.connection.dbapi_connection is parent

    assert not in_forked_child(child)
    row = store.record_passing("search", "1", "read", "1")
    assert row.uses == 3


@contextlib.contextmanager
def _kept_connection(store: mnestoma.Mnestoma) -> Iterator[Connection]:
    """The connection the facade keeps between its writes, taken as a write takes it (and
    put back as a write that did not fail puts it back)."""
    kept = store._kept
    assert kept is not None
    conn = kept.take()
    assert conn is not None
    try:
        yield conn
    finally:
        kept.put_back(conn, failed=False)


def test_a_forked_child_leaves_the_connection_its_parent_kept_to_the_parent(
    store: mnestoma.Mnestoma,
) -> None:
    """The connection the store keeps between its writes (see KeptConnection) is the
    parent's: the child's writes keep one of their own, and the parent goes on with its."""

    def kept_driver() -> Any:
        with _kept_connection(store) as conn:
            return conn.connection.dbapi_connection

    store.record_passing("search", "1", "read", "1")
    parent = kept_driver()

    def child() -> bool:
        store.record_passing("search", "1", "read", "1")
        return kept_driver() is parent

    assert not in_forked_child(child)
    assert kept_driver() is parent
    assert store.record_passing("search", "1", "read", "1").uses == 3


def test_a_child_forked_while_another_thread_has_the_kept_connection_writes_and_closes(
    store: mnestoma.Mnestoma,
) -> None:
    """The thread that had the kept connection does not exist in the child: the child's
    writes keep a connection of their own, and its close() does not wait for that thread."""
    store.record_passing("search", "1", "read", "1")

    def hold(inside: threading.Event, release: threading.Event) -> None:
        with _kept_connection(store):
            inside.set()
            release.wait(CHILD_TIMEOUT)

    def child() -> int:
        uses = store.record_passing("search", "1", "read", "1").uses
        store.close()
        return uses

    with another_thread(hold):
        assert in_forked_child(child) == 2
    assert store.record_passing("search", "1", "read", "1").uses == 3


def test_a_store_on_the_caller_s_own_engine_gets_its_own_pool_in_a_forked_child(
    store_url: str,
) -> None:
    """An engine a service built with plain create_engine and handed to the store is given
    a pool of its own in the child, as the package's engines are."""
    from sqlalchemy import create_engine

    engine = create_engine(store_url)
    try:
        with mnestoma.Mnestoma(engine) as own:
            own.record_passing("search", "1", "read", "1")
            with engine.connect() as conn:
                parent = conn.connection.dbapi_connection

            def child() -> bool:
                own.record_passing("search", "1", "read", "1")
                with engine.connect() as conn:
                    return conn.connection.dbapi_connection is parent

            assert not in_forked_child(child)
            assert own.record_passing("search", "1", "read", "1").uses == 3
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------- a write at the fork
#
# SQLite's in-process state says which connection of the process holds a file's write lock;
# a child forked while a thread was inside a write would inherit "held" for good. The fork
# waits for the writes in progress (FORK_WAIT_S at most) so that the child gets a store it
# can write to; where it cannot (the wait ran out, the forking thread itself was writing),
# the child's writes to that store are refused at once, not after the lock timeout.

LONG_LOCK_TIMEOUT = 30.0  # a child that waited for the lock would fail the quickness check
QUICK_S = 5.0  # what "at once" allows on a loaded machine, well under the lock timeout
# A fork that waited would wait this long: "it did not wait" is then "it took under half of
# it", a bound no loaded machine reaches (5 s, halved, was a wall-clock bound on a fork).
LONG_FORK_WAIT_S = 16.0


def fork_and_answer(child: Callable[[], Any]) -> Any:
    """``os.fork()``; the child runs ``child`` and sends back its result (or its traceback)
    before ``os._exit``. Fails, killing the child, when it does not answer in time."""
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            send.send((True, child()))
        except BaseException:
            send.send((False, traceback.format_exc()))
        finally:
            os._exit(0)
    send.close()
    return _answer_of(pid, receive)


def _answer_of(pid: int, receive: Any) -> Any:
    answered = receive.poll(CHILD_TIMEOUT)
    ok, value = receive.recv() if answered else (False, None)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    if not answered:
        pytest.fail(f"the forked child did not answer within {CHILD_TIMEOUT} s (a hang)")
    assert ok, value
    return value


@contextlib.contextmanager
def write_in_another_thread(store: mnestoma.Mnestoma, hold_s: float) -> Iterator[None]:
    """Another thread inside a write of the store (a unit of work that has written) for the
    block, committing ``hold_s`` seconds after the block began (or at its end, if sooner)."""
    failed: list[BaseException] = []

    def write(inside: threading.Event, done: threading.Event) -> None:
        try:
            with store.unit_of_work() as uow:
                uow.mnests.record_passing("parent", "1", "thread", "1")
                inside.set()
                done.wait(hold_s)
                uow.commit()
        except BaseException as err:  # reported by the test
            failed.append(err)
            inside.set()

    with another_thread(write):
        yield
    assert not failed, failed


def timed_write(store: mnestoma.Mnestoma, src: str = "child") -> tuple[str, float]:
    """A write of the store: what came of it (ok, or the error's type and message) and how
    long it took."""
    began = time.monotonic()
    try:
        store.record_passing(src, "1", "written", "1")
        outcome = "ok"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    return outcome, time.monotonic() - began


def _lock_timeout_store(url: str) -> mnestoma.Mnestoma:
    return mnestoma.Mnestoma(url, settings=mnestoma.Settings(lock_timeout=LONG_LOCK_TIMEOUT))


def test_a_child_forked_while_another_thread_writes_can_write(store_url: str) -> None:
    """The fork waits for the thread's write to end: the child's store works, and its
    write is in the store beside the parent's."""
    with _lock_timeout_store(store_url) as store:
        store.record_passing("warm", "1", "pool", "1")
        with write_in_another_thread(store, hold_s=0.3):
            outcome, took = fork_and_answer(lambda: timed_write(store))
        assert outcome == "ok" and took < QUICK_S, (outcome, took)
        assert {e.src_executor for e in store.edges()} == {"warm", "parent", "child"}
        assert store.record_passing("parent", "1", "after", "1").uses == 1


def test_a_multiprocessing_fork_child_of_a_writing_process_can_write(store_url: str) -> None:
    with _lock_timeout_store(store_url) as store, write_in_another_thread(store, hold_s=0.3):
        outcome, took = in_forked_child(lambda: timed_write(store))
    assert outcome == "ok" and took < QUICK_S, (outcome, took)
    with mnestoma.Mnestoma(store_url) as store:
        assert {e.src_executor for e in store.edges()} == {"parent", "child"}


@pytest.fixture
def sqlite_store_url(tmp_path: Path, _sqlite_template: Path) -> str:
    """A store at head on SQLite only: PostgreSQL has no in-process lock state to inherit."""
    path = tmp_path / "store.sqlite"
    shutil.copy(_sqlite_template, path)
    return f"sqlite:///{path}"


def test_a_child_forked_while_a_write_outlasts_the_wait_is_refused_at_once(
    sqlite_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(locking, "FORK_WAIT_S", 0.2)
    with _lock_timeout_store(sqlite_store_url) as store:
        with write_in_another_thread(store, hold_s=CHILD_TIMEOUT):
            outcome, took = in_forked_child(lambda: timed_write(store))
            reads = in_forked_child(lambda: len(store.edges()))
        assert outcome.startswith("StoreError: this process was forked while a write to")
        assert "spawn or forkserver" in outcome and took < QUICK_S, (outcome, took)
        assert reads == 0  # reading works (the thread's write is not committed at the fork)
        assert store.record_passing("parent", "1", "after", "1").uses == 1  # the parent writes


def test_a_fork_does_not_wait_for_a_write_whose_thread_has_ended(
    sqlite_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write left open by a thread that has ended will not end by waiting: the fork goes
    on at once (not after FORK_WAIT_S), and the child refuses its writes to that store."""
    monkeypatch.setattr(locking, "FORK_WAIT_S", LONG_FORK_WAIT_S)
    with _lock_timeout_store(sqlite_store_url) as store:
        left_open: list[Any] = []

        def begin_and_leave() -> None:
            unit = store.unit_of_work()
            unit.__enter__()
            unit.mnests.record_passing("left", "1", "open", "1")
            left_open.append(unit)

        thread = threading.Thread(target=begin_and_leave)
        thread.start()
        thread.join()
        assert left_open  # the write is still in progress, its thread gone
        began = time.monotonic()
        outcome, took = in_forked_child(lambda: timed_write(store))
        forked_in = time.monotonic() - began
        assert forked_in < locking.FORK_WAIT_S / 2, forked_in
        assert outcome.startswith("StoreError: this process was forked while a write to")
        assert took < QUICK_S, (outcome, took)
        left_open[0].__exit__(None, None, None)  # rolls back in the parent
        assert store.record_passing("parent", "1", "after", "1").uses == 1


def test_a_child_of_a_process_that_wrote_through_its_own_engine_can_write(
    sqlite_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit of work on the caller's own ``create_engine`` engine (never handed to a store)
    ends its write at its commit: a child forked afterwards writes, at once."""
    monkeypatch.setattr(locking, "FORK_WAIT_S", LONG_FORK_WAIT_S)
    engine = create_engine(sqlite_store_url)
    try:
        with mnestoma.UnitOfWork(sessionmaker(engine)) as uow:
            uow.mnests.record_passing("parent", "1", "own-engine", "1")
            uow.commit()
        began = time.monotonic()
        outcome, took = in_forked_child(lambda: timed_write(_lock_timeout_store(sqlite_store_url)))
        assert time.monotonic() - began < locking.FORK_WAIT_S / 2
        assert outcome == "ok" and took < QUICK_S, (outcome, took)
    finally:
        engine.dispose()
    with mnestoma.Mnestoma(sqlite_store_url) as store:
        assert {e.src_executor for e in store.edges()} == {"parent", "child"}


def test_a_child_forked_by_a_thread_inside_a_write_is_refused_at_once(
    sqlite_store_url: str,
) -> None:
    """The forking thread's own write cannot be waited for. The child refuses its writes
    to the store and never commits the write it inherited; the parent's commits as usual."""
    with _lock_timeout_store(sqlite_store_url) as store:
        store.record_passing("warm", "1", "pool", "1")
        receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)
        pid = -1
        try:
            with store.unit_of_work() as uow:
                uow.mnests.record_passing("parent", "1", "unit", "1")
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child
                    send.send(timed_write(store))
                uow.commit()  # the child's commit of the inherited write is refused
        except mnestoma.StoreError as err:
            if pid != 0:
                raise
            send.send(str(err))
        finally:
            if pid == 0:  # pragma: no cover - the child
                os._exit(0)
        send.close()
        outcome, took = _answer_of_two(pid, receive)
        assert outcome[0].startswith("StoreError: this process was forked while a write")
        assert outcome[1] < QUICK_S, outcome
        assert took.startswith("this process was forked while a write")  # the commit
        assert {e.src_executor for e in store.edges()} == {"warm", "parent"}
        assert store.record_passing("parent", "1", "unit", "1").uses == 2
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def _answer_of_two(pid: int, receive: Any) -> tuple[Any, Any]:
    """The child's two messages (its write's outcome, its commit's refusal)."""
    values = []
    for _ in range(2):
        if not receive.poll(CHILD_TIMEOUT):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child did not answer within {CHILD_TIMEOUT} s (a hang)")
        values.append(receive.recv())
    os.waitpid(pid, 0)
    return values[0], values[1]


def test_a_write_that_begins_while_the_fork_waits_waits_for_the_fork(
    sqlite_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second thread that starts a long write while the fork waits for the first does not
    keep the fork waiting (nor leave the child a store held by it): it waits for the fork."""
    monkeypatch.setattr(locking, "FORK_WAIT_S", 2.0)
    with _lock_timeout_store(sqlite_store_url) as store:
        store.record_passing("warm", "1", "pool", "1")

        def late_long_write() -> None:
            # once the fork waits for the first write (a fixed pause here let a slow fork
            # on a loaded machine wait for this write too, in vain, and the child was refused)
            deadline = time.monotonic() + CHILD_TIMEOUT
            while locking._forking is None and time.monotonic() < deadline:
                time.sleep(0.001)
            with store.unit_of_work() as uow:
                uow.mnests.record_passing("late", "1", "long", "1")
                time.sleep(3.0)  # longer than the fork would wait
                uow.commit()

        late = threading.Thread(target=late_long_write, daemon=True)
        with write_in_another_thread(store, hold_s=0.5):
            late.start()
            # had the late write begun during the wait, the fork would have waited for it
            # in vain, and the child would be refused
            outcome, took = fork_and_answer(lambda: timed_write(store))
        late.join(CHILD_TIMEOUT)
        assert outcome == "ok" and took < QUICK_S, (outcome, took)
        assert {e.src_executor for e in store.edges()} == {"warm", "parent", "child", "late"}


def test_a_child_forked_while_an_async_store_writes_in_another_thread_can_write(
    store_url: str,
) -> None:
    """The async door's writes (aiosqlite's own thread runs them) are waited for alike."""
    from mnestoma.doors.asynchronous import AsyncMnestoma

    inside = threading.Event()
    done = threading.Event()

    async def write() -> None:
        async with AsyncMnestoma(store_url) as am, am.unit_of_work() as uow:
            await uow.mnests.record_passing("parent", "1", "async", "1")
            inside.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait, 0.3)
            await uow.commit()

    writer = threading.Thread(target=asyncio.run, args=(write(),), daemon=True)
    writer.start()
    assert inside.wait(CHILD_TIMEOUT)
    try:
        with _lock_timeout_store(store_url) as store:
            outcome, took = fork_and_answer(lambda: timed_write(store))
    finally:
        done.set()
        writer.join(CHILD_TIMEOUT)
    assert outcome == "ok" and took < QUICK_S, (outcome, took)
    with mnestoma.Mnestoma(store_url) as store:
        assert {e.src_executor for e in store.edges()} == {"parent", "child"}


def test_a_child_forked_while_another_thread_holds_the_migration_gate_opens_a_new_store(
    tmp_path: Path,
) -> None:
    """The thread of the parent that held the process's migration gate is not in the
    child: the child's first call on a new store migrates it, not waits for ever."""
    from mnestoma.maintenance.migration import MIGRATION_GATE

    url = f"sqlite:///{tmp_path / 'new.sqlite'}"

    def hold(inside: threading.Event, release: threading.Event) -> None:
        with MIGRATION_GATE.held():
            inside.set()
            release.wait(CHILD_TIMEOUT)

    def child() -> int:
        with mnestoma.Mnestoma(url) as store:
            return store.record_passing("search", "1", "read", "1").uses

    with another_thread(hold):
        assert in_forked_child(child) == 1
