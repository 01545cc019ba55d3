"""Record passings from OpenTelemetry traces: a span processor that feeds the store.

``MnestomaSpanProcessor`` reads the tool spans of a trace (GenAI semantic conventions and
OpenInference), links a tool call B to an earlier call A of the same trace when B's arguments
contain a value that A returned (compared by digest; the content itself is dropped at once),
and when the trace's local root span ends, records the links with
``store.record_turn(trace_id_hex, passings, recorder="otel")``. Each link carries B's
outcome from B's span status: ERROR is ``"error"``; OK or UNSET, on the ended span, is
``"ok"`` (instrumentations leave a successful span UNSET). A sequence-only link has none.

Everything but a few dictionary look-ups happens on one writer thread (a
:class:`~mnestoma.recording.writer.Writer`, the tracer's background writer too), off the thread that
ends the span; a failing store is logged and counted, never raised into the traced program.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple, Protocol

from mnestoma.core import rules
from mnestoma.core.errors import InvalidInput, MissingExtra

try:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
    from opentelemetry.trace import StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra(
        "mnestoma.otel needs the OpenTelemetry SDK: pip install 'mnestoma[otel]'"
    ) from exc

from mnestoma.core.validation import Passing, check_name
from mnestoma.recording.writer import Writer

__all__ = [
    "DEFAULT_VERSION",
    "MAX_DEPTH",
    "MIN_LEAF_CHARS",
    "REDACTED_VALUES",
    "TRIVIAL_NUMBER",
    "MnestomaSpanProcessor",
    "ProcessorStats",
    "TurnRecorder",
    "VersionOf",
    "value_digests",
]

logger = logging.getLogger("mnestoma.otel")  # the logger's public name

#: Version given to a tool that ``version_of`` does not know (spans carry no version).
DEFAULT_VERSION = "unversioned"
#: A string shorter than this (surrounding whitespace aside) is too common to prove a passing.
MIN_LEAF_CHARS = rules.MIN_EVIDENCE_CHARS
#: Numbers from -TRIVIAL_NUMBER to TRIVIAL_NUMBER are too common to prove a passing.
TRIVIAL_NUMBER = rules.TRIVIAL_NUMBER
#: Texts that say "no value" whatever their length: never evidence of a passing.
_TRIVIAL_TEXTS = frozenset({"true", "false", "null", "none", "nan", "undefined"})
#: What instrumentations write in place of content they were told to hide: "not captured".
REDACTED_VALUES = frozenset({"__REDACTED__"})
#: How deep nested arguments and results (and JSON inside their strings) are read.
MAX_DEPTH = 8

_SEQUENCE_TAGS = {"basis": "sequence"}
# a passing's outcome, read from the destination span's status
_OK = rules.Outcome.OK.value
_ERROR = rules.Outcome.ERROR.value

# GenAI semantic conventions (execute_tool spans)
_GENAI_OPERATION = "gen_ai.operation.name"
_GENAI_TOOL_NAME = "gen_ai.tool.name"
_GENAI_ARGUMENTS = "gen_ai.tool.call.arguments"
_GENAI_RESULT = "gen_ai.tool.call.result"
# OpenInference (TOOL spans)
_OI_KIND = "openinference.span.kind"
_OI_TOOL_NAME = "tool.name"
_OI_INPUT = "input.value"
_OI_OUTPUT = "output.value"

VersionOf = Mapping[str, str] | Callable[[str], str | None]


class TurnRecorder(Protocol):
    """What the processor needs of a store: ``Mnestoma.record_turn`` with its recorder."""

    def record_turn(self, turn_id: str, passings: Iterable[Passing], *, recorder: str) -> Any:
        """Record the passings of one turn in one transaction.

        Returns:
            What the store returns (the processor ignores it).

        Raises:
            InvalidInput: a passing the store refuses; the processor logs and counts it,
                as any error of the store.
            ConflictError: the write lock was not had within the lock timeout
                (:class:`WriteLockTimeout`), or other writers kept changing the rows it needed.
            StoreError: the database failed (:class:`DatabaseUnavailable`: it could not
                be reached).
        """
        ...


@dataclass(frozen=True)
class ProcessorStats:
    """What the processor did and what it had to leave out, since it was created."""

    tool_spans: int = 0  # tool spans read (GenAI or OpenInference)
    traces_recorded: int = 0  # traces whose passings the store accepted
    passings_recorded: int = 0  # passings the store counted (new for their trace id)
    passings_replayed: int = 0  # passings the store had already counted for that trace id
    traces_evicted: int = 0  # traces forgotten before their local root ended
    spans_dropped: int = 0  # tool spans over max_spans_per_trace (oldest first)
    late_spans: int = 0  # tool spans ending after their trace was recorded
    unversioned_spans: int = 0  # tool spans skipped: no version and no default
    spans_without_content: int = 0  # tool spans with neither arguments nor result captured
    leaves_truncated: int = 0  # values read only up to max_leaves_per_value
    queue_overflow: int = 0  # spans the full queue could not take (their trace may be partial)
    store_failures: int = 0  # record_turn calls that raised
    errors: int = 0  # spans skipped on failures: version_of raising, a name the store refuses


@dataclass(frozen=True)
class _ToolCall:
    """One tool span as the processor keeps it: name, version, times and digests only."""

    name: str
    version: str
    start: int
    end: int
    arguments: frozenset[bytes] | None  # None: the span carried no arguments
    result: frozenset[bytes] | None  # None: the span carried no result
    outcome: str | None = None  # "ok" or "error" from the span's status; None: unknown


@dataclass
class _Trace:
    """A trace whose local root has not ended yet."""

    open_roots: int = 0
    calls: deque[_ToolCall] = field(default_factory=deque)


# Items of the writer's queue (named tuples: cheap to build on the span's thread). Attribute
# values travel by reference; they are hashed and dropped on the writer thread.
class _ToolEnded(NamedTuple):
    trace_id: int
    name: str
    start: int
    end: int
    arguments: Any
    result: Any
    outcome: str | None


class _RootStarted(NamedTuple):
    trace_id: int


class _RootEnded(NamedTuple):
    trace_id: int


_Item = _ToolEnded | _RootStarted | _RootEnded


def _describe(item: _Item) -> str:
    """An item of the writer's queue, for log lines."""
    if isinstance(item, _ToolEnded):
        return f"tool span {item.name!r} of trace {item.trace_id:032x}"
    return f"trace {item.trace_id:032x}"


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _leaf_text(value: Any) -> str | None:
    """The text a leaf is compared by, or None when the leaf is trivial (see docs/recording.md)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) <= TRIVIAL_NUMBER:
            return None
        # an integral float is its integer: 2024.0 and 2024 and "2024" compare equal
        return str(int(value)) if isinstance(value, int) or value.is_integer() else repr(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) < MIN_LEAF_CHARS or text.lower() in _TRIVIAL_TEXTS:
        return None
    return text


def _parse(text: str) -> Any:
    """JSON inside a string (an object, array or quoted string) is read; other text stays."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[", '"'):
        try:
            return _unwrap(json.loads(stripped))
        except ValueError:
            pass
    return text


def _unwrap(value: Any) -> Any:
    """A serialised chat message around a tool's output (LangChain's) counts as its content."""
    if isinstance(value, dict):
        data = value.get("data")
        if value.get("type") == "tool" and isinstance(data, dict) and "content" in data:
            return data["content"]
        if value.get("type") == "tool" and "tool_call_id" in value and "content" in value:
            return value["content"]
    return value


def value_digests(value: Any, *, max_leaves: int = 256) -> tuple[frozenset[bytes], bool]:
    """Digests of the non-trivial leaves of an attribute value, and whether it was cut short.

    A string holding JSON is parsed (nested JSON strings too, to ``MAX_DEPTH``); other
    strings and numbers are one leaf each. Only digests leave this function.

    Returns:
        The pair (the leaves' digests, whether the walk stopped at a bound).
    """
    found: set[bytes] = set()
    truncated = False
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str) and depth < MAX_DEPTH:
            parsed = _parse(item)
            if parsed is not item:
                stack.append((parsed, depth + 1))
                continue
        if isinstance(item, Mapping):
            if depth < MAX_DEPTH:
                stack.extend((v, depth + 1) for v in item.values())
            continue
        if isinstance(item, Sequence) and not isinstance(item, str | bytes):
            if depth < MAX_DEPTH:
                stack.extend((v, depth + 1) for v in item)
            continue
        text = _leaf_text(item)
        if text is None:
            continue
        if len(found) >= max_leaves:
            truncated = True
            break
        found.add(_digest(text))
    return frozenset(found), truncated


def _outcome(span: ReadableSpan) -> str | None:
    """What the tool call did, from its ended span's status: ERROR is an error; OK, and UNSET
    (how instrumentations leave a call that succeeded), are ok; a span not ended is unknown."""
    if span.end_time is None:
        return None
    return _ERROR if span.status.status_code is StatusCode.ERROR else _OK


def _first(attributes: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attributes.get(key)
        if value is not None:
            return value
    return None


class MnestomaSpanProcessor(SpanProcessor):
    """An OpenTelemetry SDK span processor that records tool-to-tool passings in the store.

    ``version_of`` maps a tool name to its version (a mapping, or a callable returning the
    version or None); a tool it does not know gets ``default_version`` ("unversioned"), or is
    skipped when ``default_version`` is None. With ``sequence_edges=True``, two consecutive
    tool calls where either side carried no content are linked with ``tags={"basis":
    "sequence"}``; off by default, so that a trace without content records nothing.

    ``store`` must be blocking (:class:`mnestoma.Mnestoma`): the processor records from its
    own thread, where nothing would await an :class:`~mnestoma.aio.AsyncMnestoma`'s
    ``record_turn``, so an async store is refused with :class:`InvalidInput`.

    Bounds: at most ``max_traces`` open traces (the oldest is forgotten first, counted in
    ``stats.traces_evicted``), ``max_spans_per_trace`` tool calls per trace (oldest first),
    ``max_leaves_per_value`` digests per argument or result, ``max_queue`` spans waiting
    for the writer thread (more are dropped and counted). The writer is the tracer's (a
    :class:`~mnestoma.recording.writer.Writer`): it records what is queued at :meth:`shutdown`,
    and at
    interpreter exit or the end of a multiprocessing child waits at most ``exit_timeout``
    seconds for it.

    Raises:
        InvalidInput: a bound is not a positive integer, ``version_of`` neither a mapping
            nor a callable, ``default_version`` a version the contract refuses, or
            ``store`` async.
    """

    def __init__(
        self,
        store: TurnRecorder,
        *,
        version_of: VersionOf | None = None,
        default_version: str | None = DEFAULT_VERSION,
        sequence_edges: bool = False,
        max_traces: int = 1024,
        max_spans_per_trace: int = 256,
        max_leaves_per_value: int = 256,
        max_queue: int = 10_000,
        exit_timeout: float = 10.0,
    ) -> None:
        for name, bound in (
            ("max_traces", max_traces),
            ("max_spans_per_trace", max_spans_per_trace),
            ("max_leaves_per_value", max_leaves_per_value),
            ("max_queue", max_queue),
        ):
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
                raise InvalidInput(f"{name} must be a positive integer, got {bound!r}")
        if version_of is not None and not (isinstance(version_of, Mapping) or callable(version_of)):
            raise InvalidInput("version_of must be a mapping or a callable")
        if default_version is not None:
            check_name(default_version, "default_version")
        self._store = store
        self._version_of = version_of
        self._default_version = default_version
        self._sequence_edges = sequence_edges
        self._max_traces = max_traces
        self._max_spans = max_spans_per_trace
        self._max_leaves = max_leaves_per_value
        self._counters = dict.fromkeys(ProcessorStats.__dataclass_fields__, 0)
        self._counters_lock = threading.Lock()
        self._warned_no_content = False  # the missing-content warning is given once
        # writer-thread state: open traces, and recently recorded ones (to spot late spans)
        self._traces: OrderedDict[int, _Trace] = OrderedDict()
        self._recorded: OrderedDict[int, None] = OrderedDict()
        self._writer: Writer[_Item] = Writer(
            store,
            self._handle,
            log=logger,
            maxsize=max_queue,
            exit_timeout=exit_timeout,
            describe=_describe,
            on_drop=lambda: self._count("queue_overflow"),
            on_failure=self._failed,
            on_stop=self._forget_open_traces,
            after_fork=self._after_fork,
        )

    def _after_fork(self) -> None:
        """In a forked child, once the writer has started over empty: a new counters lock and
        no traces (the parent's are the parent's; the store's engine gets a pool of its own:
        :func:`mnestoma.engines.own_pool_after_fork`)."""
        self._counters_lock = threading.Lock()
        self._traces.clear()
        self._recorded.clear()

    # -- the instrumented program's threads: look, enqueue, return -------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Note a local root's start, so that a trace with two local roots waits for both.

        Returns:
            None.
        """
        parent = span.parent
        if not self._writer.closed and (parent is None or parent.is_remote):
            self._writer.put(_RootStarted(span.context.trace_id))

    def on_end(self, span: ReadableSpan) -> None:
        """Hand a tool span, or the end of a local root, to the writer thread.

        Returns:
            None.
        """
        if self._writer.closed:
            return
        context = span.context
        if context is None:
            return
        attributes = span.attributes or {}
        if attributes.get(_GENAI_OPERATION) == "execute_tool":
            name = attributes.get(_GENAI_TOOL_NAME)
            arguments = attributes.get(_GENAI_ARGUMENTS)
            result = attributes.get(_GENAI_RESULT)
        elif attributes.get(_OI_KIND) == "TOOL":
            name = _first(attributes, _OI_TOOL_NAME, _GENAI_TOOL_NAME)
            arguments = attributes.get(_OI_INPUT)
            result = attributes.get(_OI_OUTPUT)
        else:
            name = None
        if isinstance(name, str) and name.strip():
            self._writer.put(
                _ToolEnded(
                    context.trace_id,
                    name,
                    span.start_time or 0,
                    span.end_time or 0,
                    arguments,
                    result,
                    _outcome(span),
                )
            )
        parent = span.parent
        if parent is None or parent.is_remote:
            self._writer.put(_RootEnded(context.trace_id))

    # -- lifecycle --------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until every span handed over so far has been processed (and recorded).

        Returns:
            True when everything was processed within ``timeout_millis``, else False.
        """
        return self._writer.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Process what is queued, forget traces whose root never ended, stop the writer.

        Returns:
            None.
        """
        if not self._writer.closed:
            self._writer.stop(30.0, "at shutdown")

    @property
    def stats(self) -> ProcessorStats:
        """A snapshot of the counters."""
        with self._counters_lock:
            return ProcessorStats(**self._counters)

    @property
    def writer(self) -> Writer[Any]:
        """The background writer the spans are handed to (its ``pending``, ``flush``)."""
        return self._writer

    # -- the writer thread ------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n

    def _failed(self, item: _Item) -> None:
        """Count what the writer could not do: record a trace whose root ended (the store's
        failure), or read a tool span."""
        self._count("store_failures" if isinstance(item, _RootEnded) else "errors")

    def _forget_open_traces(self) -> None:
        """At the writer's stop: traces whose root never ended are forgotten, and counted."""
        self._count("traces_evicted", len(self._traces))
        self._traces.clear()

    def _trace(self, trace_id: int) -> _Trace:
        trace = self._traces.get(trace_id)
        if trace is None:
            if len(self._traces) >= self._max_traces:
                self._traces.popitem(last=False)
                self._count("traces_evicted")
            trace = self._traces[trace_id] = _Trace()
        return trace

    def _handle(self, item: _Item) -> None:
        if isinstance(item, _RootStarted):
            self._recorded.pop(item.trace_id, None)
            self._trace(item.trace_id).open_roots += 1
        elif isinstance(item, _ToolEnded):
            self._count("tool_spans")
            if item.trace_id not in self._traces and item.trace_id in self._recorded:
                self._count("late_spans")
                return
            call = self._tool_call(item)
            if call is None:
                return
            calls = self._trace(item.trace_id).calls
            if len(calls) >= self._max_spans:
                calls.popleft()
                self._count("spans_dropped")
            calls.append(call)
        else:
            trace = self._traces.get(item.trace_id)
            if trace is None:
                return
            trace.open_roots -= 1
            if trace.open_roots > 0:
                return
            del self._traces[item.trace_id]
            self._recorded[item.trace_id] = None
            if len(self._recorded) > self._max_traces:
                self._recorded.popitem(last=False)
            self._record(item.trace_id, trace.calls)

    def _version(self, name: str) -> str | None:
        version_of = self._version_of
        if version_of is None:
            version = None
        elif isinstance(version_of, Mapping):
            version = version_of.get(name)
        else:
            version = version_of(name)
        return self._default_version if version is None else version

    def _tool_call(self, item: _ToolEnded) -> _ToolCall | None:
        try:
            version = self._version(item.name)
        except Exception:
            logger.exception("mnestoma otel processor: version_of(%r) raised", item.name)
            self._count("errors")
            return None
        if version is None:
            self._count("unversioned_spans")
            return None
        try:  # a name or version the store would refuse would lose the whole trace
            check_name(item.name, "tool name")
            check_name(version, f"version of tool {item.name!r}")
        except InvalidInput as err:
            logger.warning("mnestoma otel processor: skipped a tool span: %s", err)
            self._count("errors")
            return None
        call = _ToolCall(
            item.name,
            version,
            item.start,
            item.end,
            self._digests(item.arguments),
            self._digests(item.result),
            item.outcome,
        )
        if call.arguments is None and call.result is None:
            self._without_content(item.name)
        return call

    def _without_content(self, name: str) -> None:
        """Count a tool span that carried no content; say so once, since it records nothing."""
        self._count("spans_without_content")
        if self._warned_no_content:
            return
        self._warned_no_content = True
        logger.warning(
            "mnestoma otel processor: tool span %r carried no content (no arguments, no "
            "result), so nothing links it by content. Is content capture off "
            "(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, OPENINFERENCE_HIDE_INPUTS "
            "/ _OUTPUTS)? sequence_edges=True links such calls by order. Further spans "
            "without content are only counted (stats.spans_without_content).",
            name,
        )

    def _digests(self, value: Any) -> frozenset[bytes] | None:
        if value is None or (isinstance(value, str) and value in REDACTED_VALUES):
            return None
        found, truncated = value_digests(value, max_leaves=self._max_leaves)
        if truncated:
            self._count("leaves_truncated")
        return found

    def _record(self, trace_id: int, calls: Iterable[_ToolCall]) -> None:
        passings = self._passings(calls)
        if not passings:
            return
        turn_id = format(trace_id, "032x")
        counted = self._counted_before(turn_id)
        rows = self._writer.record(turn_id, passings, recorder="otel")  # a failure: counted
        kept = self._kept(rows, counted, len(passings))
        self._count("traces_recorded")
        self._count("passings_recorded", kept)
        self._count("passings_replayed", len(passings) - kept)

    def _counted_before(self, turn_id: str) -> frozenset[Any] | None:
        """The (mnest, occurrence) pairs this trace id already counted in the store (one
        query per trace, not per passing), or None for a store without ``events``."""
        events = getattr(self._store, "events", None)
        if not callable(events):
            return None
        return frozenset(
            (e.mnest_id, getattr(e, "occurrence", 1))
            for e in events(turn_id=turn_id)
            if e.kind in rules.PASSING
        )

    @staticmethod
    def _kept(rows: Any, counted: frozenset[Any] | None, given: int) -> int:
        """How many of the ``given`` passings the store counted: the k-th passing of a row
        in the trace is its occurrence k, and those the trace id had already counted are a
        no-op in the store (a replay)."""
        if counted is None:
            return given
        try:
            ids = [row.id for row in rows]
        except (AttributeError, TypeError):  # a store returning something else
            return given
        seen: Counter[Any] = Counter()
        new = 0
        for mnest_id in ids:
            seen[mnest_id] += 1
            new += (mnest_id, seen[mnest_id]) not in counted
        return min(given, new)

    def _passings(self, calls: Iterable[_ToolCall]) -> list[Passing]:
        """The passings of one trace's tool calls: lineage by content, then sequence if asked.

        B is linked to A when A ended before B started and a digest of A's result is among
        B's argument digests; each of B's digests goes to the latest such A only. Each call
        of B is a passing of its own (contract §13), with its outcome, listed in the order
        the calls of B started, so that the store numbers an edge's occurrences as they
        happened; within one call of B an edge is one passing.
        """
        ordered = sorted(calls, key=lambda c: (c.start, c.end))
        by_end = sorted(ordered, key=lambda c: c.end, reverse=True)
        found: list[tuple[int, Passing]] = []  # (the consumer's place, its passing)
        for at, consumer in enumerate(ordered):
            if not consumer.arguments:
                continue
            remaining = set(consumer.arguments)
            linked: set[tuple[str, str, str, str]] = set()
            for producer in by_end:
                if producer.end > consumer.start or producer is consumer or not producer.result:
                    continue
                if remaining.isdisjoint(producer.result):
                    continue
                remaining -= producer.result
                key = (producer.name, producer.version, consumer.name, consumer.version)
                if key not in linked:
                    linked.add(key)
                    found.append((at, Passing(*key, outcome=consumer.outcome)))
                if not remaining:
                    break
        if self._sequence_edges:
            for at, (producer, consumer) in enumerate(pairwise(ordered), 1):
                if producer.end > consumer.start:
                    continue
                if producer.result is not None and consumer.arguments is not None:
                    continue  # the content was there and decides
                key = (producer.name, producer.version, consumer.name, consumer.version)
                # no content: nothing says this call fed that one, so nor its outcome
                found.append((at, Passing(*key, tags=dict(_SEQUENCE_TAGS))))
        found.sort(key=lambda f: f[0])  # stable: a call's own passings keep their order
        return [p for _, p in found]
