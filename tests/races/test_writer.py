"""One background writer behind both recorders: the tracer's ``BackgroundWriter`` and the
OpenTelemetry span processor hand their work to the same :class:`mnestoma.recording.writer.Writer`.

Each behaviour runs through both doors: a bounded queue that drops and counts, flush and
close, a forked child's writer starting empty, failures counted and logged, outcomes
carried through, an async store refused, the exit timeout checked, the flush at
interpreter exit; with a store, on both engines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from sqlalchemy import create_engine, text
from test_fork import in_forked_child

import mnestoma
from mnestoma import InvalidInput, Passing
from mnestoma.recording.otel import MnestomaSpanProcessor
from mnestoma.recording.tracing import BackgroundWriter, executor, stats, turn
from mnestoma.recording.writer import Writer

WAIT = 30.0  # seconds any wait of a test may take before it fails
DOORS = ["tracer", "otel"]
fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


class Broken(Exception):
    """What the traced destination raises on a failing turn."""


@executor("search", "1")
def search(query: str) -> list[str]:
    return [f"found/{query}.pdf"]


@executor("read", "1")
def read(path: str, fail: bool = False) -> str:
    if fail:
        raise Broken(path)
    return f"text of {path}"


class FakeStore:
    """Remembers the turns recorded; fails when told; ``gate`` holds writes made in the
    process that built it until the test opens it."""

    def __init__(self, *, fail: Exception | None = None, gated: bool = False) -> None:
        self.turns: list[str] = []
        self.fail = fail
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.gated_pid = os.getpid() if gated else None

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        if os.getpid() == self.gated_pid:
            self.entered.set()
            assert self.gate.wait(WAIT), "the test never opened the gate"
        if self.fail is not None:
            raise self.fail
        self.turns.append(turn_id)
        return []


class Door:
    """One recorder seen the same way by every test: a unit of work is a turn of the tracer
    or a trace of the processor, ``search`` feeding ``read``."""

    logger = ""
    writer: Writer[Any]

    def unit(self, n: int, *, failed: bool = False) -> None:
        """One turn (or trace) in which ``read`` got what ``search`` returned."""
        raise NotImplementedError

    def item(self, n: int) -> None:
        """Exactly one item handed to the writer."""
        raise NotImplementedError

    def flush(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def dropped(self) -> int:
        """The recorder's own count of work a full queue dropped."""
        raise NotImplementedError

    def store_failures(self) -> int:
        """The recorder's own count of failed writes to the store."""
        raise NotImplementedError

    def hold(self) -> tuple[threading.Event, threading.Event]:
        """Hold the writer's thread on its next item: an event set once it is held there,
        and the one the test sets to let it go."""
        raise NotImplementedError


class TracerDoor(Door):
    logger = "mnestoma.tracing"

    def __init__(self, store: Any, *, max_queue: int = 1000) -> None:
        self.store = store
        self.writer = self.background = BackgroundWriter(store, maxsize=max_queue)
        self.before = stats.snapshot()

    def unit(self, n: int, *, failed: bool = False) -> None:
        with turn(None, f"turn-{n}", writer=self.background), contextlib.suppress(Broken):
            read(search(f"q{n}")[0], fail=failed)

    def item(self, n: int) -> None:
        self.background.submit(f"item-{n}", [Passing("search", "1", "read", "1")])

    def flush(self) -> bool:
        return self.background.flush(WAIT)

    def close(self) -> None:
        self.background.close(WAIT)

    def dropped(self) -> int:
        return stats.snapshot()["dropped"] - self.before["dropped"]

    def store_failures(self) -> int:
        return stats.snapshot()["store_failures"] - self.before["store_failures"]

    def hold(self) -> tuple[threading.Event, threading.Event]:
        assert isinstance(self.store, FakeStore) and self.store.gated_pid is not None
        return self.store.entered, self.store.gate


class OtelDoor(Door):
    logger = "mnestoma.otel"

    def __init__(self, store: Any, *, max_queue: int = 10_000) -> None:
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.processor = MnestomaSpanProcessor(
            store, version_of=self._version_of, max_queue=max_queue
        )
        self.writer = self.processor.writer
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("test")
        self.pid = os.getpid()

    def _version_of(self, name: str) -> str:  # runs on the writer's thread
        gate = self.gate
        if gate is not None and os.getpid() == self.pid:
            self.gate = None
            self.entered.set()
            assert gate.wait(WAIT), "the test never opened the gate"
        return "1"

    def _tool(self, name: str, arguments: str, result: str, *, failed: bool = False) -> None:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.arguments": arguments,
            "gen_ai.tool.call.result": result,
        }
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            if failed:
                span.set_status(Status(StatusCode.ERROR, "the tool failed"))

    def unit(self, n: int, *, failed: bool = False) -> None:
        with self.tracer.start_as_current_span("turn"):
            self._tool("search", json.dumps({"query": f"q{n}"}), json.dumps([f"found/q{n}.pdf"]))
            self._tool("read", json.dumps({"path": f"found/q{n}.pdf"}), "text", failed=failed)

    def item(self, n: int) -> None:
        # under a parent of this process that is not recording, a tool span is not a local
        # root: it hands exactly one item to the writer
        parent = SpanContext(0x5CE0E9A56015FEC5AADFA328AE398115, 0x42, False, TraceFlags(1))
        with self.tracer.start_as_current_span(
            "parent", context=set_span_in_context(NonRecordingSpan(parent))
        ):
            self._tool("search", f"query {n}", f"found {n}")

    def flush(self) -> bool:
        return self.processor.force_flush(int(WAIT * 1000))

    def close(self) -> None:
        self.provider.shutdown()

    def dropped(self) -> int:
        return self.processor.stats.queue_overflow

    def store_failures(self) -> int:
        return self.processor.stats.store_failures

    def hold(self) -> tuple[threading.Event, threading.Event]:
        self.entered = threading.Event()
        self.gate = threading.Event()
        return self.entered, self.gate


Doors = Callable[..., Door]


@pytest.fixture(params=DOORS)
def door(request: pytest.FixtureRequest) -> Iterator[Doors]:
    """Build the door of the parameter on a store, closed at the end of the test."""
    made: list[Door] = []

    def make(store: Any, **options: Any) -> Door:
        d = (
            TracerDoor(store, **options)
            if request.param == "tracer"
            else OtelDoor(store, **options)
        )
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def search_to_read(store: mnestoma.Mnestoma) -> tuple[int, int, int]:
    row = store.find("search", "1", "read", "1")
    assert row is not None
    return row.uses, row.ok_count, row.error_count


# ---------------------------------------------------------------------------- one class


def test_the_tracer_and_the_span_processor_share_one_writer_implementation() -> None:
    store = FakeStore()
    tracer, otel = TracerDoor(store), OtelDoor(store)
    try:
        assert isinstance(tracer.writer, Writer) and isinstance(otel.writer, Writer)
        for name in ("put", "flush", "close", "stop", "record", "_run", "_after_fork"):
            assert getattr(type(tracer.writer), name) is getattr(Writer, name), name
            assert getattr(type(otel.writer), name) is getattr(Writer, name), name
        otel.item(0)  # the processor's thread is the writer's, named after its logger
        assert otel.flush()
        names = {t.name for t in threading.enumerate()}
        assert {"mnestoma-tracing-writer", "mnestoma-otel-writer"} <= names
    finally:
        tracer.close()
        otel.close()


# ---------------------------------------------------------------------------- bounded queue


def test_a_full_queue_drops_and_counts_and_warns_once_without_blocking(
    door: Doors, caplog: pytest.LogCaptureFixture
) -> None:
    d = door(FakeStore(gated=True), max_queue=1)
    entered, gate = d.hold()
    d.item(0)  # taken by the thread, held there: the queue is empty again
    assert entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger=d.logger):
        for n in range(1, 4):  # one fits, two do not, and none waits
            d.item(n)
    assert (d.writer.submitted, d.writer.dropped, d.dropped()) == (2, 2, 2)
    warnings = [r for r in caplog.records if "queue full (1)" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].name == d.logger
    gate.set()
    assert d.flush()
    assert (d.writer.written, d.writer.pending) == (2, 0)


# ---------------------------------------------------------------------------- flush, close


def test_flush_waits_until_the_store_has_every_unit_with_its_outcome(
    door: Doors, store: mnestoma.Mnestoma
) -> None:
    d = door(store)
    for n in range(4):
        d.unit(n, failed=n == 2)
    assert d.flush()
    assert d.writer.pending == 0 and d.writer.failures == 0
    assert search_to_read(store) == (4, 3, 1)
    assert d.store_failures() == 0


def test_closing_writes_what_is_queued_then_refuses_more(door: Doors) -> None:
    store = FakeStore(gated=True)
    d = door(store)
    for n in range(3):
        d.unit(n)
    assert store.entered.wait(WAIT)  # the first is being written, the others wait
    store.gate.set()
    d.close()
    assert len(store.turns) == 3 and d.writer.pending == 0 and d.writer.closed
    d.unit(3)  # after the close: not written, never waited for
    assert d.flush()
    assert len(store.turns) == 3


# ---------------------------------------------------------------------------- fork


@fork_only
def test_a_forked_child_starts_with_an_empty_writer_and_leaves_the_parent_s_queue(
    door: Doors,
) -> None:
    store = FakeStore(gated=True)
    d = door(store)
    for n in range(3):  # the first is held in the parent's store, the others wait
        d.unit(n)
    assert store.entered.wait(WAIT)

    def child() -> tuple[int, int, list[str], bool, int]:
        pending, submitted = d.writer.pending, d.writer.submitted
        d.unit(10)
        return pending, submitted, store.turns, d.flush(), d.writer.written

    try:
        pending, submitted, turns, flushed, written = in_forked_child(child)
    finally:
        store.gate.set()
    assert (pending, submitted) == (0, 0)  # the child's writer starts empty, from zero
    assert flushed and written >= 1 and len(turns) == 1  # the child's unit only
    assert d.flush() and len(store.turns) == 3  # the parent's, written by the parent


@fork_only
def test_a_forked_child_s_writer_records_to_the_store(
    door: Doors, store: mnestoma.Mnestoma
) -> None:
    d = door(store)
    d.unit(0)
    assert d.flush()  # the parent's pool now holds a connection

    def child() -> tuple[bool, int]:
        d.unit(1)
        d.unit(2, failed=True)
        return d.flush(), d.store_failures()

    assert in_forked_child(child) == (True, 0)
    d.unit(3)  # the parent's writer goes on
    assert d.flush()
    assert search_to_read(store) == (4, 3, 1)


# ---------------------------------------------------------------------------- failures


def test_a_failing_store_is_counted_and_logged_never_raised(
    door: Doors, caplog: pytest.LogCaptureFixture
) -> None:
    d = door(FakeStore(fail=mnestoma.StoreError("disk full")))
    with caplog.at_level(logging.WARNING, logger=d.logger):
        d.unit(0)
        d.unit(1)
        assert d.flush()
    assert d.store_failures() == 2 and d.writer.failures == 2
    failed = [r for r in caplog.records if "disk full" in r.getMessage()]
    assert len(failed) == 2 and {r.name for r in failed} == {d.logger}


def test_a_store_returning_an_awaitable_is_a_counted_failure(door: Doors) -> None:
    class Deferring:
        async def later(self) -> list[Any]:
            return []

        def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> Any:
            return self.later()  # looks blocking, is not: nothing would await it

    d = door(Deferring())
    d.unit(0)
    assert d.flush()
    assert d.store_failures() == 1 and d.writer.failures == 1


@contextlib.contextmanager
def events_table_gone(url: str) -> Iterator[None]:
    """The database refuses every write of a turn: its events table is renamed away."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE events RENAME TO events_away"))
        try:
            yield
        finally:
            with engine.begin() as conn:
                conn.execute(text("ALTER TABLE events_away RENAME TO events"))
    finally:
        engine.dispose()


def test_a_database_that_refuses_the_write_is_counted(
    door: Doors, store: mnestoma.Mnestoma, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    d = door(store)
    with events_table_gone(store_url), caplog.at_level(logging.WARNING, logger=d.logger):
        d.unit(0)
        assert d.flush()
    assert d.store_failures() == 1 and d.writer.failures == 1
    assert any("background writer failed" in r.getMessage() for r in caplog.records)
    d.unit(1)  # the writer goes on once the database does
    assert d.flush()
    assert search_to_read(store) == (1, 1, 0)


# ---------------------------------------------------------------------------- construction


class AsyncStore:
    """A store whose ``record_turn`` must be awaited."""

    async def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        raise AssertionError("never called")


@pytest.mark.parametrize("build", [BackgroundWriter, MnestomaSpanProcessor])
def test_both_refuse_an_async_store(build: Callable[..., Any]) -> None:
    with pytest.raises(InvalidInput, match="needs a blocking store"):
        build(AsyncStore())


@pytest.mark.parametrize("build", [BackgroundWriter, MnestomaSpanProcessor])
@pytest.mark.parametrize("bad", ["10", None, True, -1, float("nan"), float("inf"), 1e300])
def test_both_refuse_an_exit_timeout_that_is_not_a_finite_number_of_seconds(
    build: Callable[..., Any], bad: Any
) -> None:
    with pytest.raises(InvalidInput, match="exit_timeout"):
        build(FakeStore(), exit_timeout=bad)


EXIT_SCRIPT = """
import json, sys
class S:
    def record_turn(self, turn_id, passings, *, recorder):
        sys.stdout.write(json.dumps([recorder, len(passings)]) + "\\n")
if sys.argv[1] == "tracer":
    from mnestoma.recording.tracing import BackgroundWriter
    w = BackgroundWriter(S())
    for n in range(3):
        w.submit(f"t{n}", [("a", "1", "b", "1")])
else:
    from opentelemetry.sdk.trace import TracerProvider
    from mnestoma.recording.otel import MnestomaSpanProcessor
    provider = TracerProvider(shutdown_on_exit=False)  # nobody shuts the processor down
    provider.add_span_processor(MnestomaSpanProcessor(S()))
    tracer = provider.get_tracer("exit")
    for n in range(3):
        with tracer.start_as_current_span("turn"):
            for name, args, result in (("a", "q", f"out-{n}"), ("b", f"out-{n}", "done")):
                attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                              "gen_ai.tool.call.arguments": args,
                              "gen_ai.tool.call.result": result}
                with tracer.start_as_current_span(name, attributes=attributes):
                    pass
"""


@pytest.mark.parametrize("which", DOORS)
def test_what_is_queued_is_written_at_interpreter_exit(which: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, which],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert [json.loads(line) for line in done.stdout.splitlines()] == [[which, 1]] * 3
