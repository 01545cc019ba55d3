"""The concurrency matrix: every door that writes, on both engines and both statement paths,
under three races.

Doors: the facade, ``UnitOfWork`` (own and joined), ``record_turn`` (a joined one-passing
turn, and a facade's two-passing turn), the async facade and the async units (own and
joined), the tracer's ``turn`` and the OpenTelemetry processor. Each runs with and without a
``before_cursor_execute`` listener on its engine (a listener sends every statement through
SQLAlchemy's Core instead of the driver), under:

- ``first_callers``: many callers at once on an edge that does not exist yet, round after
  round (the async doors with more callers than the pool has connections);
- ``hot_edge``: many writers reinforcing one existing edge;
- ``ager``: writers on new and existing edges while the ager runs again and again, the
  clock jumping ahead so that it demotes and merges what they write.

Every other call of a door carries an outcome of "error" (the tracer's destination raises,
the OpenTelemetry destination span ends with status ERROR), the others "ok"; the second
link of a two-passing turn (on from the first one's destination, so that the turn makes a
chain) carries none. Each asserts: no call failed; the ``uses`` of every key (summed over
its rows, whatever their state) equal the calls made on it, and its ``ok_count`` and
``error_count`` the calls that carried each outcome; one ``created`` or ``reinforced``
event per counted passing; the ``uses`` of every chain (contract §13) the turns that made
it (at most, where the ager may forget faded chains); every pooled connection back in its
pool.

The default sizes keep the suite fast; ``MNESTOMA_SOAK=1`` makes every race longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

import mnestoma
from mnestoma import Passing, UnitOfWork, make_engine, make_session_factory
from mnestoma.core.clock import MovableClock
from mnestoma.core.rules import chain_increments
from mnestoma.doors.asynchronous import (
    AsyncMnestoma,
    AsyncUnitOfWork,
    make_async_engine,
    make_async_session_factory,
)
from mnestoma.recording.otel import MnestomaSpanProcessor
from mnestoma.recording.tracing import executor, turn
from mnestoma.schema.models import Event, MnestChain

SOAK = os.environ.get("MNESTOMA_SOAK", "") not in ("", "0")
THREADS = 16 if SOAK else 8
# More async callers at once than the pool's 5 + 10 connections: a unit that needed a
# second connection while holding its first would wait for the pool's timeout.
ASYNC_CALLERS = 40 if SOAK else 16
FIRST_CALL_ROUNDS = 12 if SOAK else 2
HOT_CALLS = 25 if SOAK else 3
AGER_WRITERS = 4
AGER_CALLS = 40 if SOAK else 4
AGER_JUMP_DAYS = 60  # enough for an edge left alone for two runs to fall below 0.20
POOL_TIMEOUT = 10  # seconds: pool exhaustion fails a race quickly instead of after 30 s
DEADLINE = 120.0

SRC = ("mx.src", "1")
Key = tuple[str, str, str, str]
Counted = tuple[Key, str | None]  # a passing a call counted, and its outcome


def key(edge: str) -> Key:
    return (*SRC, f"mx.{edge}", "1")


def onward(edge: str) -> Key:
    """The second link of a two-passing turn: on from the first one's destination."""
    return (f"mx.{edge}", "1", "mx.common", "1")


def outcome_of(call: int) -> str:
    """The outcome a call's passing carries: every other call fails."""
    return "error" if call % 2 else "ok"


def _noop_listener(*_args: Any) -> None:
    """A listener that does nothing: its presence alone changes the statement path."""


class Door:
    """One way into the store; ``write(edge, call)`` records one call and returns the keys
    it counted a passing on, each with its outcome."""

    is_async = False

    def __init__(self, url: str, listener: bool, clock: MovableClock) -> None:
        self.url = url
        self.clock = clock
        self.listener = listener

    def open(self) -> None:
        raise NotImplementedError

    def write(self, edge: str, call: int) -> list[Counted]:
        raise NotImplementedError

    async def awrite(self, edge: str, call: int) -> list[Counted]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def checked_out(self) -> int:
        """Connections of this door's pool still checked out."""
        raise NotImplementedError


class SyncDoor(Door):
    """A door on a sync engine of its own (with the listener when asked)."""

    def open(self) -> None:
        self.engine = make_engine(self.url, pool_timeout=POOL_TIMEOUT)
        if self.listener:
            event.listen(self.engine, "before_cursor_execute", _noop_listener)
        self.store = mnestoma.Mnestoma(self.engine, clock=self.clock)
        self.sessions = make_session_factory(self.engine)
        self.setup()

    def setup(self) -> None:
        """Anything a door builds once on its store."""

    def close(self) -> None:
        self.teardown()
        self.store.close()
        self.engine.dispose()

    def teardown(self) -> None:
        """Anything a door flushes or ends before its store closes."""

    def checked_out(self) -> int:
        return int(self.engine.pool.checkedout())  # type: ignore[attr-defined]


class FacadeDoor(SyncDoor):
    def write(self, edge: str, call: int) -> list[Counted]:
        self.store.record_passing(*key(edge), outcome=outcome_of(call))
        return [(key(edge), outcome_of(call))]


class UnitDoor(SyncDoor):
    """A passing in a unit of work of its own."""

    def unit(self) -> contextlib.AbstractContextManager[UnitOfWork]:
        """The unit of work a write runs in."""
        return UnitOfWork(self.sessions, clock=self.clock)

    def write(self, edge: str, call: int) -> list[Counted]:
        with self.unit() as uow:
            uow.mnests.record_passing(*key(edge), outcome=outcome_of(call))
            uow.commit()
        return [(key(edge), outcome_of(call))]


class JoinedUnitDoor(UnitDoor):
    """A passing in a service's own transaction."""

    @contextlib.contextmanager
    def unit(self) -> Iterator[UnitOfWork]:
        """A unit of work that joins a session's own transaction, as a service's code does."""
        with (
            self.sessions() as session,
            session.begin(),
            UnitOfWork.joining(session, clock=self.clock) as uow,
        ):
            yield uow


class JoinedTurnDoor(JoinedUnitDoor):
    """A one-passing turn in a service's own transaction (the repository's one-row path)."""

    def write(self, edge: str, call: int) -> list[Counted]:
        with self.unit() as uow:
            passing = Passing(*key(edge), outcome=outcome_of(call))
            uow.mnests.record_turn(f"turn-{uuid.uuid4().hex}", [passing])
            uow.commit()
        return [(key(edge), outcome_of(call))]


class FacadeTurnDoor(SyncDoor):
    """A two-passing turn through the facade (the repository's many-row path)."""

    def write(self, edge: str, call: int) -> list[Counted]:
        passing = Passing(*key(edge), outcome=outcome_of(call))
        self.store.record_turn(f"turn-{uuid.uuid4().hex}", [passing, onward(edge)])
        return [(key(edge), outcome_of(call)), (onward(edge), None)]


class TracerDoor(SyncDoor):
    """A traced turn in which the destination receives what the source returned (and
    raises, on the calls whose outcome is an error)."""

    def setup(self) -> None:
        self.source = executor(*SRC)(lambda call: f"output of call {call}")
        self.destinations: dict[str, Callable[[str, bool], str]] = {}
        self.lock = threading.Lock()

    def destination(self, edge: str) -> Callable[[str, bool], str]:
        def run(value: str, fail: bool) -> str:
            if fail:
                raise LookupError(value)
            return value.upper()

        with self.lock:
            if edge not in self.destinations:
                self.destinations[edge] = executor(f"mx.{edge}", "1")(run)
            return self.destinations[edge]

    def write(self, edge: str, call: int) -> list[Counted]:
        dst = self.destination(edge)
        with (
            turn(self.store, f"turn-{uuid.uuid4().hex}", strict=True),
            contextlib.suppress(LookupError),  # the traced code's own failure, inside the turn
        ):
            dst(self.source(call), outcome_of(call) == "error")
        return [(key(edge), outcome_of(call))]


class OtelDoor(SyncDoor):
    """Two GenAI tool spans of one trace, the second given what the first returned."""

    def setup(self) -> None:
        self.processor = MnestomaSpanProcessor(self.store, version_of=lambda _name: "1")
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("matrix")

    def tool(self, name: str, arguments: str, result: str, failed: bool = False) -> None:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.arguments": arguments,
            "gen_ai.tool.call.result": result,
        }
        with self.tracer.start_as_current_span(
            f"execute_tool {name}", attributes=attributes
        ) as span:
            if failed:
                span.set_status(Status(StatusCode.ERROR, "the tool failed"))

    def write(self, edge: str, call: int) -> list[Counted]:
        output = f"output of call {call} {uuid.uuid4().hex}"
        with self.tracer.start_as_current_span("turn"):
            self.tool(SRC[0], f"question {call}", output)
            self.tool(f"mx.{edge}", output, "done", failed=outcome_of(call) == "error")
        # the processor writes on its own thread: wait for it, so that the call is the write
        assert self.processor.force_flush(60_000)
        return [(key(edge), outcome_of(call))]

    def teardown(self) -> None:
        assert self.processor.force_flush(60_000)
        stats = self.processor.stats
        self.provider.shutdown()
        assert (stats.store_failures, stats.errors) == (0, 0), stats


class AsyncDoor(Door):
    """A door on an async engine of its own (the listener on its sync engine when asked)."""

    is_async = True

    def open(self) -> None:
        self.engine: AsyncEngine = make_async_engine(self.url, pool_timeout=POOL_TIMEOUT)
        if self.listener:
            event.listen(self.engine.sync_engine, "before_cursor_execute", _noop_listener)
        self.store = AsyncMnestoma(self.engine, clock=self.clock)
        self.sessions = make_async_session_factory(self.engine)

    def close(self) -> None:
        asyncio.run(self._close())

    async def _close(self) -> None:
        await self.store.close()
        await self.engine.dispose()

    def checked_out(self) -> int:
        return int(self.engine.sync_engine.pool.checkedout())  # type: ignore[attr-defined]


class AsyncFacadeDoor(AsyncDoor):
    async def awrite(self, edge: str, call: int) -> list[Counted]:
        await self.store.record_passing(*key(edge), outcome=outcome_of(call))
        return [(key(edge), outcome_of(call))]


class AsyncFacadeTurnDoor(AsyncDoor):
    """A two-passing turn through the async facade."""

    async def awrite(self, edge: str, call: int) -> list[Counted]:
        passing = Passing(*key(edge), outcome=outcome_of(call))
        await self.store.record_turn(f"turn-{uuid.uuid4().hex}", [passing, onward(edge)])
        return [(key(edge), outcome_of(call)), (onward(edge), None)]


class AsyncUnitDoor(AsyncDoor):
    """A passing in an async unit of work of its own."""

    def unit(self) -> contextlib.AbstractAsyncContextManager[AsyncUnitOfWork]:
        """The unit of work a write runs in."""
        return AsyncUnitOfWork(self.sessions, clock=self.clock)

    async def awrite(self, edge: str, call: int) -> list[Counted]:
        async with self.unit() as uow:
            await uow.mnests.record_passing(*key(edge), outcome=outcome_of(call))
            await uow.commit()
        return [(key(edge), outcome_of(call))]


class AsyncJoinedUnitDoor(AsyncUnitDoor):
    """A passing in a service's own async transaction."""

    @contextlib.asynccontextmanager
    async def unit(self) -> AsyncIterator[AsyncUnitOfWork]:
        """An async unit of work that joins a session's own transaction."""
        async with (
            self.sessions() as session,
            session.begin(),
            AsyncUnitOfWork.joining(session, clock=self.clock) as uow,
        ):
            yield uow


DOORS: dict[str, type[Door]] = {
    "facade": FacadeDoor,
    "unit": UnitDoor,
    "joined_unit": JoinedUnitDoor,
    "joined_turn": JoinedTurnDoor,
    "facade_turn": FacadeTurnDoor,
    "async_facade": AsyncFacadeDoor,
    "async_facade_turn": AsyncFacadeTurnDoor,
    "async_unit": AsyncUnitDoor,
    "async_joined_unit": AsyncJoinedUnitDoor,
    "tracer": TracerDoor,
    "otel": OtelDoor,
}


class Race:
    """What one race's callers did: the passings counted per key (and per key and outcome),
    and every failure."""

    def __init__(self) -> None:
        self.counted: Counter[Key] = Counter()
        self.outcomes: Counter[tuple[Key, str]] = Counter()
        self.chains: Counter[tuple[str, str, str]] = Counter()
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def done(self, passings: list[Counted]) -> None:
        """One call's passings, in its turn's order."""
        made = chain_increments([(k[0], k[2]) for k, _ in passings], [True] * len(passings))
        with self.lock:
            self.counted.update(k for k, _ in passings)
            self.outcomes.update((k, o) for k, o in passings if o is not None)
            self.chains.update(made)

    def failed(self, err: BaseException) -> None:
        with self.lock:
            self.errors.append(err)


def run_threads(workers: list[Callable[[], None]]) -> None:
    """Run each worker in a thread of its own, all at once, and wait for them (bounded)."""
    threads = [threading.Thread(target=w, daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), "a caller is still running: a hang"


# Waits for the ager to have run more times than the count it is given; returns the count.
Pace = Callable[[int], int]


def sync_calls(
    door: Door, race: Race, plan: list[list[str]], barrier: Any = None, pace: Pace | None = None
) -> None:
    """One thread per plan entry, each calling its edges in order (in step when a barrier;
    each call after ``pace`` returns, when given)."""

    def worker(edges: list[str], first: int) -> Callable[[], None]:
        def run() -> None:
            seen = 0
            for n, edge in enumerate(edges):
                if barrier is not None:
                    barrier.wait(DEADLINE)
                if pace is not None:
                    seen = pace(seen)
                try:
                    race.done(door.write(edge, first + n))
                except Exception as err:
                    race.failed(err)

        return run

    run_threads([worker(edges, 1000 * i) for i, edges in enumerate(plan)])


def async_calls(
    door: Door, race: Race, plan: list[list[str]], in_step: bool, pace: Pace | None = None
) -> None:
    """One task per plan entry in one event loop, each calling its edges in order."""

    async def main() -> None:
        barrier = asyncio.Barrier(len(plan)) if in_step else None

        async def task(edges: list[str], first: int) -> None:
            seen = 0
            for n, edge in enumerate(edges):
                if barrier is not None:
                    await barrier.wait()
                if pace is not None:
                    seen = await asyncio.to_thread(pace, seen)
                try:
                    race.done(await door.awrite(edge, first + n))
                except Exception as err:
                    race.failed(err)

        await asyncio.wait_for(
            asyncio.gather(*(task(edges, 1000 * i) for i, edges in enumerate(plan))), DEADLINE
        )

    asyncio.run(main())


def run_calls(
    door: Door, race: Race, plan: list[list[str]], *, in_step: bool, pace: Pace | None = None
) -> None:
    if door.is_async:
        async_calls(door, race, plan, in_step, pace)
    else:
        sync_calls(door, race, plan, threading.Barrier(len(plan)) if in_step else None, pace)


def first_callers(door: Door, race: Race, ager: Callable[[], None]) -> None:
    """Every caller at once on a new edge, round after round."""
    callers = ASYNC_CALLERS if door.is_async else THREADS
    rounds = [f"new{r}" for r in range(FIRST_CALL_ROUNDS)]
    run_calls(door, race, [rounds] * callers, in_step=True)


def hot_edge(door: Door, race: Race, ager: Callable[[], None]) -> None:
    """One edge created first, then reinforced by every caller at once."""
    run_calls(door, race, [["hot"]], in_step=False)
    callers = ASYNC_CALLERS if door.is_async else THREADS
    run_calls(door, race, [["hot"] * HOT_CALLS] * callers, in_step=False)


def with_ager(door: Door, race: Race, ager: Callable[[], None]) -> None:
    """Writers on a hot edge and on new ones while the ager runs, the clock jumping ahead.

    Each call waits for one more run of the ager than its writer's previous call saw, so
    that an edge a writer created is aged (and demoted) before that writer comes back to it,
    whatever the machine's speed: the ager demotes, and merges, among the writers.
    """
    stop = threading.Event()
    ager_errors: list[BaseException] = []
    runs = threading.Condition()
    done = [0]

    def keep_ageing() -> None:
        while not stop.is_set():
            try:
                ager()
            except Exception as err:
                ager_errors.append(err)
                return
            finally:
                with runs:
                    done[0] += 1
                    runs.notify_all()

    def pace(seen: int) -> int:
        with runs:
            runs.wait_for(lambda: done[0] > seen or bool(ager_errors), DEADLINE)
            return done[0]

    thread = threading.Thread(target=keep_ageing, daemon=True)
    thread.start()
    try:
        plan = [
            [("hot" if n % 2 else f"w{w}") for n in range(AGER_CALLS)] for w in range(AGER_WRITERS)
        ]
        run_calls(door, race, plan, in_step=False, pace=pace)
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert not ager_errors, ager_errors[:3]


RACES: dict[str, Callable[[Door, Race, Callable[[], None]], None]] = {
    "first_callers": first_callers,
    "hot_edge": hot_edge,
    "ager": with_ager,
}


def stored_counts(
    store: mnestoma.Mnestoma,
) -> tuple[Counter[Key], Counter[tuple[Key, str]], int]:
    """Uses per key and outcome counts per key and outcome, summed over every row of the
    key, and the events that count a passing."""
    uses: Counter[Key] = Counter()
    outcomes: Counter[tuple[Key, str]] = Counter()
    for m in store.edges():
        k = (m.src_executor, m.src_version, m.dst_executor, m.dst_version or "")
        uses[k] += m.uses
        outcomes[(k, "ok")] += m.ok_count
        outcomes[(k, "error")] += m.error_count
    with store.engine.connect() as conn:
        counted = conn.execute(
            select(func.count()).select_from(Event).where(Event.kind.in_(["created", "reinforced"]))
        ).scalar_one()
    return uses, +outcomes, int(counted)


def stored_chains(store: mnestoma.Mnestoma) -> Counter[tuple[str, str, str]]:
    """The uses of every chain of the store."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(
                MnestChain.prev_executor,
                MnestChain.src_executor,
                MnestChain.dst_executor,
                MnestChain.uses,
            )
        ).all()
    return Counter({(a, b, c): int(n) for a, b, c, n in rows})


@pytest.fixture
def matrix_store(store_url: str) -> Iterator[tuple[str, MovableClock, mnestoma.Mnestoma]]:
    """The store's URL, the clock every door and the ager share, and a facade to check with."""
    clock = MovableClock()
    checker = mnestoma.Mnestoma(store_url, clock=clock)
    yield store_url, clock, checker
    checker.close()


@pytest.mark.parametrize("race_name", list(RACES))
@pytest.mark.parametrize("listener", [False, True], ids=["driver", "listener"])
@pytest.mark.parametrize("door_name", list(DOORS))
def test_every_door_counts_every_call_under_races(
    matrix_store: tuple[str, MovableClock, mnestoma.Mnestoma],
    door_name: str,
    listener: bool,
    race_name: str,
) -> None:
    url, clock, checker = matrix_store
    door = DOORS[door_name](url, listener, clock)
    door.open()
    race = Race()

    def ager() -> None:
        clock.advance(days=AGER_JUMP_DAYS)
        checker.apply_ager()

    try:
        RACES[race_name](door, race, ager)
    finally:
        door.close()
    assert not race.errors, f"{len(race.errors)} calls failed: {race.errors[:3]!r}"
    assert door.checked_out() == 0
    uses, outcomes, events = stored_counts(checker)
    assert uses == race.counted
    assert outcomes == race.outcomes
    assert events == sum(race.counted.values())
    chains = stored_chains(checker)
    if race_name == "ager":  # the ager forgets a chain faded below 0.05 (166 days)
        assert all(chains[c] <= race.chains[c] for c in chains), (chains, race.chains)
    else:
        assert chains == race.chains
    if race_name == "ager":
        assert checker.edges(states=["decaying"]), "the ager demoted nothing: no race with it"


def test_a_burst_of_async_first_callers_needs_one_connection_each(store_url: str) -> None:
    """More first callers than the pool has connections all pass, and quickly."""
    clock = MovableClock()

    async def main() -> list[Any]:
        engine = make_async_engine(store_url, pool_size=2, max_overflow=0, pool_timeout=5)
        store = AsyncMnestoma(engine, clock=clock)
        try:
            calls: list[Awaitable[Any]] = [store.record_passing(*key("burst")) for _ in range(12)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
        finally:
            await store.close()
            await engine.dispose()

    results = asyncio.run(main())
    assert [r for r in results if isinstance(r, BaseException)] == []
    with mnestoma.Mnestoma(store_url, clock=clock) as m:
        found = m.find(*key("burst"))
    assert found is not None and found.uses == 12
