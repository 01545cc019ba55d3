"""One background writer: a bounded queue of items worked through by one thread.

The tracer's :class:`mnestoma.tracing.BackgroundWriter` and the OpenTelemetry span processor
(:class:`mnestoma.otel.MnestomaSpanProcessor`) both hand their work to a :class:`Writer`, so
that what happens when the queue is full, how it is flushed and closed, how failures are
counted and logged, and how it restarts after ``fork()`` is written, and tested, once.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import numbers
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

from mnestoma.core.errors import InvalidInput
from mnestoma.core.validation import Passing

__all__ = ["TurnStore", "Writer", "is_async_callable"]

T = TypeVar("T")


class TurnStore(Protocol):
    """What a writer writes to: a :class:`mnestoma.Mnestoma` (or an async facade, where an
    ``await`` is possible: not on a writer's thread)."""

    def record_turn(self, turn_id: str, passings: list[Passing], *, recorder: str) -> Any: ...


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` returns something to await (a coroutine function or an object
    whose ``__call__`` is one)."""
    if fn is None:
        return False
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - a callable object's method
    return call is not None and not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


def _seconds(value: object, name: str) -> float:
    """``value`` as a number of seconds from 0 to the longest wait threading accepts (NaN,
    inf and bools refused): a bad timeout would only fail at interpreter exit, losing the
    queued items."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 <= float(value) <= threading.TIMEOUT_MAX
    ):
        raise InvalidInput(f"{name} must be a finite number of seconds, 0 or more; got {value!r}")
    return float(value)


def _lock_and_condition() -> tuple[threading.Lock, threading.Condition, int]:
    """A lock guarding the queue (taken directly on the hot path: cheaper than the
    condition's own ``with``), a condition on it, and no one waiting."""
    lock = threading.Lock()
    return lock, threading.Condition(lock), 0


def _nothing(*_: object) -> None:
    """The hook that does nothing."""


class Writer(Generic[T]):
    """Hands each queued item to ``handle`` on one daemon thread, in order.

    The queue holds at most ``maxsize`` items; an item that does not fit (or comes after
    :meth:`close`) is dropped and counted, never waited for, and the first drop is logged.
    An item whose ``handle`` raises is logged and counted, and the next one goes on.
    :meth:`flush` waits until the queue is worked through; :meth:`close` (also at
    interpreter exit, and at the end of a multiprocessing child, which skips interpreter
    exit, waiting at most ``exit_timeout`` seconds) flushes, runs ``on_stop`` on the
    thread, and stops.

    Fork-safe: in a forked child the writer starts empty, with a new lock, counters from
    zero and no thread until the child queues its first item; the parent's items stay the
    parent's. ``after_fork`` then resets its owner's state in the child.

    The hooks ``on_drop``, ``on_failure`` (which gets the failed item) and ``on_stop`` count
    and tidy for the owner; ``describe`` names an item in log lines, which go to ``log``
    (the owner's logger, whose name also names the thread).
    """

    def __init__(
        self,
        store: TurnStore,
        handle: Callable[[T], object],
        *,
        log: logging.Logger,
        maxsize: int,
        exit_timeout: float = 10.0,
        describe: Callable[[T], str] = repr,
        on_drop: Callable[[], object] = _nothing,
        on_failure: Callable[[T], object] = _nothing,
        on_stop: Callable[[], object] = _nothing,
        after_fork: Callable[[], object] = _nothing,
    ) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise InvalidInput("maxsize must be a positive integer")
        self.exit_timeout = _seconds(exit_timeout, "exit_timeout")
        if is_async_callable(getattr(store, "record_turn", None)):
            raise InvalidInput(
                f"{log.name} needs a blocking store (Mnestoma): it records from its own "
                "thread, where an async store's record_turn is never awaited"
            )
        self.store = store
        self.maxsize = maxsize
        self.submitted = 0  # items accepted
        self.written = 0  # items handled
        self.failures = 0  # items whose handling raised (the store refused or failed)
        self.dropped = 0  # items refused because the queue was full (or closed)
        self._handle, self._describe, self._log = handle, describe, log
        self._on_drop, self._on_failure, self._on_stop = on_drop, on_failure, on_stop
        self._after_fork_hook = after_fork
        self._queue: deque[T] = deque()
        self._lock, self._cond, self._waiting = _lock_and_condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        with self._lock:
            self._start()
        atexit.register(self._at_exit)
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (method := ref()) and method())

    def _start(self) -> None:
        """Start the thread (under ``_lock``), and have a multiprocessing child, which ends
        without running ``atexit``, close this writer at its end too."""
        name = self._log.name.replace(".", "-") + "-writer"  # mnestoma-tracing-writer
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.parent_process() is not None:
            from multiprocessing import util

            util.Finalize(self, self._at_exit, exitpriority=0)

    def _after_fork(self) -> None:
        """In a forked child: a new lock and an empty queue (the parent's items are the
        parent's), no thread until the child queues an item, then the owner's reset (the
        store's engine gets a pool of its own: :func:`mnestoma.engines.own_pool_after_fork`)."""
        self._lock, self._cond, self._waiting = _lock_and_condition()
        self._queue = deque()
        self._busy = False
        self._thread = None
        self.submitted = self.written = self.failures = self.dropped = 0
        self._after_fork_hook()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(queued={len(self._queue)}, written={self.written}, "
            f"failures={self.failures}, dropped={self.dropped})"
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Items accepted and not handled yet."""
        with self._lock:
            return len(self._queue) + (1 if self._busy else 0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: items are refused from then on."""
        return self._closed

    def put(self, item: T) -> bool:
        """Queue ``item``; False (counted, the first time logged) when full or closed."""
        with self._lock:
            if not self._closed and len(self._queue) < self.maxsize:
                if self._thread is None:  # the first item of a forked child
                    self._start()
                self._queue.append(item)
                self.submitted += 1
                if self._waiting:  # the idle thread, a flush: no cost when nobody waits
                    self._cond.notify_all()
                return True
            self.dropped += 1
            first = self.dropped == 1
            closed = self._closed
        self._on_drop()
        if first:  # one line, not one per dropped item under sustained overload
            self._log.warning(
                "%s: background writer %s; %s dropped (further drops are only counted)",
                self._log.name,
                "closed" if closed else f"queue full ({self.maxsize})",
                self._describe(item),
            )
        return False

    def record(self, turn_id: str, passings: list[Passing], *, recorder: str) -> Any:
        """``store.record_turn`` from the writer's thread; an awaitable it returns (a store
        that only looks blocking) is refused, as nothing here would await it."""
        rows = self.store.record_turn(turn_id, passings, recorder=recorder)
        if inspect.isawaitable(rows):
            if inspect.iscoroutine(rows):
                rows.close()  # never run: no "never awaited" warning on top
            raise InvalidInput("record_turn returned an awaitable: a blocking store is needed")
        return rows

    def _wait(self, timeout: float | None) -> None:
        """Wait (under ``_lock``) until woken or ``timeout``; counted, so that a put wakes
        nobody, at no cost, when nobody waits."""
        self._waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiting -= 1

    def _wake(self) -> None:
        """Wake (under ``_lock``) the thread and any flush waiting for a change."""
        if self._waiting:
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wait(None)
                if not self._queue:
                    break  # closed and drained
                item = self._queue.popleft()
                self._busy = True
            ok = self._work(item)
            with self._lock:
                if ok:
                    self.written += 1
                else:
                    self.failures += 1
                self._busy = False
                self._wake()
        self._stop()

    def _work(self, item: T) -> bool:
        """Handle one item; a failure is logged and counted, never raised."""
        try:
            self._handle(item)
            return True
        except Exception as err:
            self._on_failure(item)
            self._log.warning(
                "%s: background writer failed on %s: %s: %s",
                self._log.name,
                self._describe(item),
                type(err).__name__,
                err,
                exc_info=True,
            )
            return False

    def _stop(self) -> None:
        try:
            self._on_stop()
        except Exception:
            self._log.exception("%s: background writer could not stop cleanly", self._log.name)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every accepted item is handled (or failed); False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._queue or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    return False
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._wait(remaining)
            return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush, stop the thread and refuse further items; True when all was handled.

        ``timeout`` bounds the whole: the flush and the wait for the thread to end."""
        end = None if timeout is None else time.monotonic() + timeout
        done = self.flush(timeout)
        with self._lock:
            first = not self._closed
            self._closed = True
            self._wake()
            thread = self._thread
        if thread is not None:
            thread.join(None if end is None else max(0.0, end - time.monotonic()))
        elif first:  # no thread to run it (a forked child that queued nothing)
            self._stop()
        atexit.unregister(self._at_exit)
        return done

    def stop(self, timeout: float, when: str) -> bool:
        """:meth:`close`, with a warning when items were left unhandled (``when``: "at
        exit", "at shutdown")."""
        done = self.close(timeout)
        if not done:
            self._log.warning(
                "%s: %d queued item(s) not written %s (timeout %.1fs)",
                self._log.name,
                self.pending,
                when,
                timeout,
            )
        return done

    def _at_exit(self) -> None:
        self.stop(self.exit_timeout, "at exit")
