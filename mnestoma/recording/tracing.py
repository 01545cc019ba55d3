"""In-process tracing: record which executor's output each traced call received (contract §8).

Decorate executors with :func:`executor`, run a turn inside :func:`turn`, and the tracer
records ``A → B`` whenever B received (by identity or by content) what A returned earlier in
the same turn; at the end of the turn the passings go to ``store.record_turn`` once, with
``recorder="tracer"``. Outside a turn a decorated executor is a plain call.

Lineage rule, exactly:

* What an output remembers: the returned value and, breadth-first down to :data:`MAX_DEPTH`
  levels, the elements of lists, tuples, sets, the values of dicts and the fields of
  dataclass instances, and the items of a JSON text (a ``str`` starting with ``{`` or ``[``,
  up to :data:`JSON_TEXT_LIMIT` characters); at most :data:`MAX_NODES` values per output.
  Each value is remembered by identity (a reference held until the turn ends or the output
  is forgotten), and each ``str``/``bytes``/``int``/``float`` leaf also by a content key:
  a 64-bit digest (Python's per-process keyed SipHash of the text, a canonical hash of the
  number) that lives in memory for the turn only. Text matches its UTF-8 bytes; ``3.0``
  matches ``3``; ``"1234"`` does not match ``1234``.
* What an argument offers: every positional and keyword argument, and the same elements
  (dataclass fields excepted: a method's ``self`` would make false edges) to the same
  bounds. A value matches the output that most recently returned it by identity, else
  the one whose content key it shares.
* Trivial values never link: ``None``, booleans, numbers from -1024 to 1024, non-finite
  floats, ``str``/``bytes`` shorter than 4 characters, and empty containers.

Occurrences (contract §13): each call of B that received A's output is a passing of its
own, listed in the order the calls were made, so that an edge passed three times in a turn
is handed to the store three times and counted as occurrences 1, 2 and 3 (a turn recorded
again adds nothing).

Outcomes (contract §11): each passing ``A → B`` carries what the call of B that received A's
output did: ``"ok"`` when it returned, ``"error"`` when it raised an ``Exception``.
Cancellation, ``KeyboardInterrupt``
and ``SystemExit`` come from outside B and say nothing of it: they leave the outcome as it
was (None, unknown, when no other call finished). A proto from :func:`wish` has no outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from mnestoma.core import rules
from mnestoma.core.errors import InvalidInput, MnestomaError, StoreError
from mnestoma.core.types import ensure_json
from mnestoma.core.validation import Passing, check_name
from mnestoma.recording.writer import TurnStore, Writer, is_async_callable

__all__ = [
    "DEFAULT_MAX_OUTPUTS",
    "JSON_TEXT_LIMIT",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_PASSINGS",
    "BackgroundWriter",
    "TracerStats",
    "Turn",
    "current_turn",
    "executor",
    "propagate",
    "stats",
    "turn",
    "wish",
]

logger = logging.getLogger("mnestoma.tracing")

DEFAULT_MAX_OUTPUTS = 1024  # outputs remembered per turn; past it the oldest are forgotten
MAX_DEPTH = 3  # levels of elements walked below a returned value or an argument
MAX_NODES = 256  # values walked per output, and per call's arguments
JSON_TEXT_LIMIT = 65_536  # longest str parsed as JSON text to reach its items
TRIVIAL_NUMBER = rules.TRIVIAL_NUMBER  # numbers in [-1024, 1024] never link
MIN_TEXT = rules.MIN_EVIDENCE_CHARS  # str / bytes shorter than this never link
MAX_PASSINGS = 10_000  # passings per turn; past it new ones are counted, not kept

RECORDER = "tracer"
_OK = rules.Outcome.OK.value  # the call of the destination returned
_ERROR = rules.Outcome.ERROR.value  # the call of the destination raised

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])
Executor = tuple[str, str]  # (name, version)
PassingAt = int  # a passing's place in its turn's list


# ---------------------------------------------------------------------------- statistics


@dataclass
class TracerStats:
    """Process-wide counters of the tracer, for health checks and tests."""

    turns: int = 0  # turns ended
    passings: int = 0  # passings handed to a store or a background writer
    store_failures: int = 0  # record_turn calls that raised (turns and background writes)
    forgotten: int = 0  # outputs forgotten because a turn reached its cap
    dropped: int = 0  # turns a full background writer could not take
    tracer_errors: int = 0  # values the tracer could not inspect (the call went on)
    unrecorded: int = 0  # new edges of a turn that already held MAX_PASSINGS
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def add(self, **counts: int) -> None:
        """Add to some counters at once, under the lock.

        Returns:
            None.
        """
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        """The counters as a plain dict.

        Returns:
            The counters by name.
        """
        with self._lock:
            return {name: getattr(self, name) for name in _COUNTERS}

    def reset(self) -> None:
        """Set every counter back to zero.

        Returns:
            None.
        """
        with self._lock:
            for name in _COUNTERS:
                setattr(self, name, 0)

    def _after_fork(self) -> None:
        """In a forked child: a new lock, since another thread may have held this one."""
        self._lock = threading.Lock()


_COUNTERS = tuple(f.name for f in dataclasses.fields(TracerStats) if f.name != "_lock")
stats = TracerStats()

# ---------------------------------------------------------------------------- values

_TRIVIAL, _LEAF, _CONTAINER, _RECORD, _OBJECT = range(5)
_NOT_A_LINK: tuple[int, Any] = (_TRIVIAL, None)
_JSON_START = ("{", "[")  # how json.dumps begins an object or an array
_EXACT_INT = sys.hash_info.modulus  # ints below it in size hash without collisions


def _number_key(v: int) -> int:
    if -_EXACT_INT < v < _EXACT_INT:
        return hash(("n", v))
    return hash(("N", format(v, "x")))


def _bytes_key(v: bytes | bytearray) -> int:
    try:
        return hash(bytes(v).decode("utf-8"))  # the same key as the text it encodes
    except UnicodeDecodeError:
        return hash(("b", bytes(v)))


def _classify(v: Any) -> tuple[int, Any]:
    """What kind of value ``v`` is for lineage, with its content key or its children."""
    t = type(v)
    if t is str:  # the common cases first, by exact type
        return (_LEAF, hash(v)) if len(v) >= MIN_TEXT else _NOT_A_LINK
    if t is list or t is tuple:
        return (_CONTAINER, v) if v else _NOT_A_LINK
    if t is dict:
        return (_CONTAINER, v.values()) if v else _NOT_A_LINK
    if v is None or v is True or v is False:
        return _NOT_A_LINK
    if isinstance(v, str):
        return (_LEAF, hash(str.__str__(v))) if len(v) >= MIN_TEXT else _NOT_A_LINK
    if isinstance(v, bytes | bytearray):
        return (_LEAF, _bytes_key(v)) if len(v) >= MIN_TEXT else _NOT_A_LINK
    if isinstance(v, int):
        if -TRIVIAL_NUMBER <= v <= TRIVIAL_NUMBER:
            return _NOT_A_LINK
        return _LEAF, _number_key(int(v))
    if isinstance(v, float):
        if not math.isfinite(v) or -TRIVIAL_NUMBER <= v <= TRIVIAL_NUMBER:
            return _NOT_A_LINK
        if v.is_integer():
            return _LEAF, _number_key(int(v))
        return _LEAF, hash(("f", float(v)))
    if isinstance(v, dict):
        return (_CONTAINER, v.values()) if v else _NOT_A_LINK
    if isinstance(v, list | tuple | set | frozenset):
        return (_CONTAINER, v) if v else _NOT_A_LINK
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _RECORD, v
    return _OBJECT, None


def _json_items(text: str) -> Iterable[Any] | None:
    """The items of the JSON array or the values of the JSON object ``text`` holds, if any."""
    if len(text) > JSON_TEXT_LIMIT:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if isinstance(parsed, dict):
        return parsed.values()
    return parsed if isinstance(parsed, list) else None


def _below(below: list[Any], items: Iterable[Any], room: int) -> None:
    """Queue ``items`` for the next level, at most ``room`` of them."""
    if room > 0:
        if isinstance(items, list | tuple) and len(items) <= room:
            below.extend(items)
        else:
            below.extend(itertools.islice(items, room))


def _levels(first: Iterable[Any]) -> Iterator[tuple[Iterable[Any], list[Any], bool]]:
    """Breadth first from ``first``, down to :data:`MAX_DEPTH`: each level, with the list the
    walker fills with the next one and whether a next one is walked; ends after a level that
    queued nothing. Shared by what an output is remembered by and what an argument holds."""
    level = first
    for depth in range(MAX_DEPTH + 1):
        below: list[Any] = []
        yield level, below, depth < MAX_DEPTH
        if not below:
            return
        level = below


def _record_fields(v: Any) -> list[Any]:
    return [getattr(v, f.name) for f in dataclasses.fields(v)]


# One remembered return value: (its producer, the objects held, the content keys). A plain
# tuple: it is built on every traced call, and compared by identity only.
_Output = tuple[Executor, list[Any], list[int]]


def _index(value: Any) -> tuple[list[Any], list[int]]:
    """The objects (by identity) and content keys an output is remembered by."""
    if type(value) is str and len(value) >= MIN_TEXT and value[0] not in _JSON_START:
        return [value], [hash(value)]  # the most common output: one plain text
    objs: list[Any] = []
    keys: list[int] = []
    budget = MAX_NODES
    for level, below, deeper in _levels((value,)):
        for v in level:
            if budget <= 0:
                return objs, keys
            budget -= 1
            kind, extra = _classify(v)
            if kind == _TRIVIAL:
                continue
            objs.append(v)
            if kind == _LEAF:
                keys.append(extra)
                if deeper and type(v) is str and v[0] in _JSON_START:
                    items = _json_items(v)
                    if items is not None:
                        _below(below, items, budget - len(below))
            elif kind == _CONTAINER:
                if deeper:
                    _below(below, extra, budget - len(below))
            elif kind == _RECORD and deeper:
                _below(below, _record_fields(v), budget - len(below))
    return objs, keys


# ---------------------------------------------------------------------------- the turn

_CURRENT: ContextVar[Turn | None] = ContextVar("mnestoma_tracing_turn", default=None)


def current_turn() -> Turn | None:
    """The turn the calling code runs in, or None.

    Returns:
        The current :class:`Turn`, or None outside a turn.
    """
    return _CURRENT.get()


def _after_fork_in_child() -> None:
    """New locks for what the forked child can still use: the process-wide counters and the
    turns the forking code runs in (a lock another thread held at the fork stays held)."""
    stats._after_fork()
    current: Any = _CURRENT.get()
    while isinstance(current, Turn):
        current._lock = threading.Lock()
        token = current._token
        current = token.old_value if token is not None else None  # the enclosing turn


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Turn:
    """One traced turn: its lineage memory while it runs, its passings when it ends.

    Made by ``turn(store, turn_id)`` (``turn`` is this class); use it once, as
    ``with turn(store, id) as t:`` or ``async with``. At its end (normal or by an
    exception, which propagates unchanged) its passings go to
    ``store.record_turn(turn_id, passings, recorder="tracer")`` once, or to ``writer``.
    A store failure is logged on ``mnestoma.tracing`` and counted, and raised only with
    ``strict=True`` when the traced code itself did not raise.

    Raises:
        InvalidInput: ``turn_id`` or ``max_outputs`` is refused, or neither a store nor
            a writer is given (or a writer with another store).
    """

    def __init__(
        self,
        store: TurnStore | None,
        turn_id: str,
        *,
        strict: bool = False,
        max_outputs: int = DEFAULT_MAX_OUTPUTS,
        writer: BackgroundWriter | None = None,
    ) -> None:
        self.turn_id = check_name(turn_id, "turn_id")
        if isinstance(max_outputs, bool) or not isinstance(max_outputs, int) or max_outputs < 1:
            raise InvalidInput("max_outputs must be a positive integer")
        if writer is not None and store is not None and store is not writer.store:
            raise InvalidInput("a turn with a writer records to the writer's store")
        if writer is None and store is None:
            raise InvalidInput("a turn needs a store or a writer")
        self.store = writer.store if writer is not None else store
        self.writer = writer
        self.strict = strict
        self.max_outputs = max_outputs
        self.forgotten = 0  # outputs forgotten because the cap was reached
        self.store_failures = 0  # 1 when writing this turn's passings failed
        self.dropped = 0  # 1 when the background writer's queue was full
        self.tracer_errors = 0  # values that could not be inspected
        self.unrecorded = 0  # passings past MAX_PASSINGS, not recorded
        self.error: Exception | None = None  # the store's failure, if any
        self.mnests: list[Any] = []  # what the store returned (empty with a writer)
        self._lock = threading.Lock()
        self._passings: list[Passing] = []
        self._outputs: deque[_Output] = deque()
        self._by_id: dict[int, _Output] = {}
        self._by_key: dict[int, _Output] = {}
        self._state = "new"
        self._token: contextvars.Token[Turn | None] | None = None

    def __repr__(self) -> str:
        return (
            f"Turn({self.turn_id!r}, {self._state}, passings={len(self._passings)}, "
            f"outputs={len(self._outputs)}, forgotten={self.forgotten})"
        )

    @property
    def passings(self) -> list[Passing]:
        """The passings recorded so far, in the order seen: an edge as often as a call of its
        destination received its source's output; a passing's ``outcome`` is None until that
        call has finished."""
        with self._lock:
            return list(self._passings)

    @property
    def remembered(self) -> int:
        """How many outputs the turn remembers now (at most ``max_outputs``)."""
        return len(self._outputs)

    # -- lineage ------------------------------------------------------------------------

    def _producers(self, values: Iterable[Any]) -> list[Executor]:
        """The executors whose remembered outputs ``values`` hold (identity, then content)."""
        by_id = self._by_id
        by_key = self._by_key
        found: list[Executor] = []
        budget = MAX_NODES
        for level, below, deeper in _levels(values):
            for v in level:
                if budget <= 0:
                    return found
                budget -= 1
                hit = by_id.get(id(v))
                if hit is None:
                    kind, extra = _classify(v)
                    if kind == _LEAF:
                        hit = by_key.get(extra)
                        if hit is None:
                            if deeper and type(v) is str and v[0] in _JSON_START:
                                items = _json_items(v)
                                if items is not None:
                                    _below(below, items, budget - len(below))
                            continue
                    elif kind == _CONTAINER:  # a dataclass argument is not walked: `self`
                        if deeper:
                            _below(below, extra, budget - len(below))
                        continue
                    else:
                        continue
                if hit[0] not in found:
                    found.append(hit[0])
        return found

    def _received(
        self, dst: Executor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[PassingAt, ...]:
        """A call of ``dst`` starts: record a passing from each producer of its arguments.

        Returns the edges the call received along, for :meth:`_finished` to give them the
        call's outcome."""
        if self._state != "open" or not self._by_id:
            return ()
        try:
            sources = self._producers(args + tuple(kwargs.values()) if kwargs else args)
        except Exception:
            self._tracer_error("an argument")
            return ()
        if not sources:
            return ()
        keys: list[PassingAt] = []
        with self._lock:
            if self._state != "open":
                return ()
            passings = self._passings
            for src in sources:
                if len(passings) >= MAX_PASSINGS:
                    self.unrecorded += 1
                    continue
                keys.append(len(passings))
                passings.append(Passing(src[0], src[1], dst[0], dst[1]))
        return tuple(keys)

    def _finished(self, keys: tuple[PassingAt, ...], outcome: str) -> None:
        """A call that received along ``keys`` returned (OK) or raised (ERROR): its
        passings take its outcome."""
        if not keys:
            return
        with self._lock:
            if self._state != "open":
                return  # the turn ended while the call ran: its passings are gone
            passings = self._passings
            for key in keys:
                passings[key] = passings[key]._replace(outcome=outcome)

    def _returned(self, producer: Executor, received: tuple[PassingAt, ...], value: Any) -> Any:
        """A call of ``producer`` that received along ``received`` returned ``value``: those
        edges take OK, and ``value`` is remembered, forgetting the oldest output; returns
        ``value``, for the traced call to return."""
        if received:
            self._finished(received, _OK)
        if self._state != "open":
            return value
        try:
            objs, keys = _index(value)
        except Exception:
            self._tracer_error("a returned value")
            return value
        if not objs:
            return value
        out: _Output = (producer, objs, keys)
        by_id = self._by_id
        by_key = self._by_key
        outputs = self._outputs
        with self._lock:
            if self._state != "open":
                return value
            outputs.append(out)
            for o in objs:
                by_id[id(o)] = out
            for k in keys:
                by_key[k] = out
            while len(outputs) > self.max_outputs:
                old = outputs.popleft()
                for o in old[1]:
                    if by_id.get(id(o)) is old:
                        del by_id[id(o)]
                for k in old[2]:
                    if by_key.get(k) is old:
                        del by_key[k]
                self.forgotten += 1
        return value

    def _wished(self, name: str, consumed: Any, desired_sig: Any) -> list[Passing]:
        """Record a proto from each producer of ``consumed`` to the missing ``name``."""
        if self._state != "open":
            return []
        try:
            sources = self._producers((consumed,))
        except Exception:
            self._tracer_error("a wished-for value")
            return []
        made: list[Passing] = []
        with self._lock:
            if self._state != "open":
                return []
            passings = self._passings
            for src in sources:
                if len(passings) >= MAX_PASSINGS:
                    self.unrecorded += 1
                    continue
                p = Passing(src[0], src[1], name, None, False, None, desired_sig)
                passings.append(p)
                made.append(p)
        return made

    def _tracer_error(self, what: str) -> None:
        with self._lock:
            self.tracer_errors += 1
        stats.add(tracer_errors=1)
        logger.warning("mnestoma.tracing: could not inspect %s; the call went on", what)

    # -- context ------------------------------------------------------------------------

    def _open(self) -> None:
        if self._state != "new":
            raise InvalidInput("a turn object is entered once; call turn(...) again to retry")
        self._state = "open"
        self._token = _CURRENT.set(self)

    def _close(self) -> list[Passing]:
        with self._lock:
            self._state = "closed"
            passings = list(self._passings)
            # drop the references now: the values belong to the caller again
            self._outputs.clear()
            self._by_id.clear()
            self._by_key.clear()
        if self._token is not None:
            # ValueError: left in another context than the one it was entered in
            with contextlib.suppress(ValueError):
                _CURRENT.reset(self._token)
            self._token = None
        stats.add(
            turns=1,
            passings=len(passings),
            forgotten=self.forgotten,
            unrecorded=self.unrecorded,
        )
        if self.unrecorded:
            logger.warning(
                "mnestoma.tracing: turn %r held %d passings; %d more were not recorded",
                self.turn_id,
                MAX_PASSINGS,
                self.unrecorded,
            )
        return passings

    def __enter__(self) -> Turn:
        if self.writer is None and is_async_callable(getattr(self.store, "record_turn", None)):
            raise InvalidInput("this store is asynchronous: use `async with turn(...)`")
        self._open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        body_failed = exc_type is not None
        passings = self._end(body_failed)
        if not passings:
            return
        assert self.store is not None
        try:
            self.mnests = list(self.store.record_turn(self.turn_id, passings, recorder=RECORDER))
        except Exception as err:
            self._store_failed(err, body_failed)

    async def __aenter__(self) -> Turn:
        self._open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        body_failed = exc_type is not None
        passings = self._end(body_failed)
        if not passings:
            return
        assert self.store is not None
        record = self.store.record_turn
        try:
            if is_async_callable(record):
                result = await cast(Callable[..., Awaitable[Any]], record)(
                    self.turn_id, passings, recorder=RECORDER
                )
            else:  # a blocking store runs off the event loop
                result = await asyncio.to_thread(record, self.turn_id, passings, recorder=RECORDER)
            self.mnests = list(result)
        except Exception as err:
            self._store_failed(err, body_failed)

    def _end(self, body_failed: bool) -> list[Passing]:
        """End the turn and hand its passings to the writer, if it has one; what is left
        for the caller to record to the store now (nothing with a writer)."""
        passings = self._close()
        if passings and self.writer is not None:
            self._to_writer(passings, body_failed)
            return []
        return passings

    def _to_writer(self, passings: list[Passing], body_failed: bool) -> None:
        assert self.writer is not None
        if self.writer.submit(self.turn_id, passings):
            return
        self.dropped += 1
        if self.strict and not body_failed:
            raise StoreError(
                f"turn {self.turn_id!r} not recorded: the background writer's queue is full"
            )

    def _store_failed(self, err: Exception, body_failed: bool) -> None:
        self.store_failures += 1
        self.error = err
        stats.add(store_failures=1)
        logger.warning(
            "mnestoma.tracing: recording turn %r failed: %s: %s",
            self.turn_id,
            type(err).__name__,
            err,
        )
        # the traced code's own exception always wins over the store's
        if self.strict and not body_failed:
            if isinstance(err, MnestomaError):
                raise err
            raise StoreError(f"recording turn {self.turn_id!r} failed: {err}") from err


turn = Turn  # the name a turn is opened by: ``with turn(store, turn_id) as t:``


# ---------------------------------------------------------------------------- executors


def executor(name: str, version: str) -> Callable[[F], F]:
    """Mark a callable as the executor ``name@version`` (sync or async, function or method).

    Inside a turn each call records a passing from every executor whose output it received,
    with the call's outcome ("ok" if it returned, "error" if it raised); its return value is
    remembered for later calls. Outside a turn it is a plain call.

    Returns:
        A decorator that returns the callable wrapped (the same kind: sync or async,
        function or method).

    Raises:
        InvalidInput: ``name`` or ``version`` is refused, or what is decorated is not
            callable.
    """
    ident: Executor = (check_name(name, "executor name"), check_name(version, "executor version"))

    def decorate(fn: F) -> F:
        if isinstance(fn, staticmethod):
            return cast(F, staticmethod(decorate(fn.__func__)))
        if isinstance(fn, classmethod):
            return cast(F, classmethod(decorate(fn.__func__)))
        if not callable(fn):
            raise InvalidInput(f"executor {name!r} must wrap a callable")
        wrapper: Callable[..., Any]
        if is_async_callable(fn):

            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                t = _CURRENT.get()
                if t is None:
                    return await fn(*args, **kwargs)
                keys = t._received(ident, args, kwargs)
                try:
                    result = await fn(*args, **kwargs)
                except Exception:  # cancellation and interrupts leave the outcome unknown
                    t._finished(keys, _ERROR)
                    raise
                return t._returned(ident, keys, result)

            wrapper = traced_async
        else:

            def traced(*args: Any, **kwargs: Any) -> Any:
                t = _CURRENT.get()
                if t is None:
                    return fn(*args, **kwargs)
                keys = t._received(ident, args, kwargs)
                try:
                    result = fn(*args, **kwargs)
                except Exception:  # interrupts leave the outcome unknown
                    t._finished(keys, _ERROR)
                    raise
                return t._returned(ident, keys, result)

            wrapper = traced
        functools.update_wrapper(wrapper, fn, updated=())
        setattr(wrapper, "__mnestoma_executor__", ident)  # noqa: B010 - for introspection
        return cast(F, wrapper)

    return decorate


def wish(name: str, consumed: Any, *, desired_sig: Any = None) -> list[Passing]:
    """Record that a missing executor ``name`` was looked for to process ``consumed``.

    A proto passing (``dst_exists=False``, no outcome: nothing ran) goes from each executor
    that produced ``consumed`` to ``name``; ``desired_sig`` says what the missing executor
    should do.
    Outside a turn, or when no traced call produced ``consumed``, nothing is recorded.

    Returns:
        The proto passings recorded (an empty list when none was).

    Raises:
        InvalidInput: ``name`` is refused, or ``desired_sig`` is not JSON; the
            ``consumed`` value itself is never refused.
    """
    dst = check_name(name, "wished executor name")
    sig = ensure_json(desired_sig, "desired_sig")
    t = _CURRENT.get()
    if t is None:
        return []
    if sig is not None:
        sig = json.loads(json.dumps(sig))  # our own copy: later changes by the caller don't leak
    return t._wished(dst, consumed, sig)


def propagate(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` bound to the caller's context, for thread pools that do not copy it.

    Call it where the turn is current: ``pool.submit(propagate(fn), x)`` or
    ``pool.map(propagate(fn), xs)``. Each call runs in its own copy of that context, so
    one propagated function may run in several threads at once.

    Returns:
        ``fn`` wrapped: the same signature and result.
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def in_context(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.copy().run(fn, *args, **kwargs)

    return in_context


# ---------------------------------------------------------------------------- background

_Queued = tuple[str, list[Passing]]  # a turn waiting for the background writer


class BackgroundWriter(Writer[_Queued]):
    """Writes ended turns to ``store`` from one thread, off the traced code's latency.

    The queue holds at most ``maxsize`` turns; a turn that does not fit is dropped and
    counted, never waited for. ``flush()`` waits until the queue is written; ``close()``
    (also at the end of a ``with`` block, at interpreter exit and at the end of a
    multiprocessing child, which skips interpreter exit) flushes and stops, waiting at most
    ``exit_timeout`` seconds at exit.

    Fork-safe: in a forked child (``gunicorn --preload``, multiprocessing's "fork") the
    writer starts empty, with a new lock, new counters and a thread of its own started when
    the child queues its first turn; turns the parent had queued stay the parent's to write.
    The store gets a connection pool of its own in the child.

    The thread, queue and counters are :class:`mnestoma.recording.writer.Writer`'s, which the
    OpenTelemetry span processor uses too; this class adds turns and the tracer's counters.

    Raises:
        InvalidInput: ``maxsize`` or ``exit_timeout`` is refused, or ``store`` is async
            (the writer records from a thread of its own).
    """

    def __init__(
        self, store: TurnStore, *, maxsize: int = 1000, exit_timeout: float = 10.0
    ) -> None:
        super().__init__(
            store,
            self._write,
            log=logger,
            maxsize=maxsize,
            exit_timeout=exit_timeout,
            describe=lambda queued: f"turn {queued[0]!r}",
            on_drop=lambda: stats.add(dropped=1),
            on_failure=lambda _queued: stats.add(store_failures=1),
        )

    def submit(self, turn_id: str, passings: Iterable[Passing]) -> bool:
        """Queue a turn's passings; False (and counted) when the queue is full or closed.

        Returns:
            True when the turn was queued, False when it was dropped.
        """
        return self.put((turn_id, list(passings)))

    def _write(self, queued: _Queued) -> None:
        self.record(*queued, recorder=RECORDER)
