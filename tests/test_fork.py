"""After fork(): the tracer's locks and its background writer work in the child.

A child process gets copies of the parent's locks in whatever state other threads held
them, and none of the parent's threads. Each test forks (multiprocessing's "fork" context)
and waits for the child's answer with a timeout, so that a hang fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import mnestoma
from mnestoma import Passing
from mnestoma.tracing import BackgroundWriter, executor, stats, turn

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="needs fork()"
)

CHILD_TIMEOUT = 20  # seconds a child has to answer before the test fails
SEARCH_TO_READ = ("search", "1", "read", "1")


@executor("search", "1")
def search(pattern: str) -> list[str]:
    return [f"found/{pattern}.pdf", f"found/{pattern}.txt"]


@executor("read", "1")
def read(path: str) -> str:
    return f"text of {path}"


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
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """Hold ``lock`` (a lock or a condition) in another thread for the block's duration."""
    taken = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(CHILD_TIMEOUT)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(CHILD_TIMEOUT)
    try:
        yield
    finally:
        release.set()
        holder.join(CHILD_TIMEOUT)


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

    from mnestoma.otel import MnestomaSpanProcessor

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
