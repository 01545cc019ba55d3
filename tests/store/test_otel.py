"""MnestomaSpanProcessor on hand-made spans: lineage by content within a trace, bounds, safety."""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from typing import Any

import pytest
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    Tracer,
    set_span_in_context,
)
from otel_kit import VERSIONS, Setup, otel_setup  # noqa: F401  (the setup fixture)

import mnestoma
from mnestoma.recording.otel import MnestomaSpanProcessor, value_digests


class FakeStore:
    """Takes record_turn calls and remembers them, and the thread each came on."""

    def __init__(self, *, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, list[mnestoma.Passing], str]] = []
        self.threads: set[int] = set()
        self.fail = fail
        self.gate = gate
        self.entered = threading.Event()

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        self.threads.add(threading.get_ident())
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("database is down")
        self.calls.append((turn_id, list(passings), recorder))
        return []

    def edges(self) -> list[tuple[str, str, str, str | None]]:
        return [(p[0], p[1], p[2], p[3]) for _, passings, _ in self.calls for p in passings]


def genai(tracer: Tracer, name: str, arguments: Any = None, result: Any = None) -> None:
    """A GenAI execute_tool span; dicts and lists are given as JSON, as instrumentations do."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    keys = ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result")
    _tool_span(tracer, f"execute_tool {name}", attributes, keys, arguments, result)


def openinference(tracer: Tracer, name: str, arguments: Any = None, result: Any = None) -> None:
    """An OpenInference TOOL span."""
    attributes = {"openinference.span.kind": "TOOL", "tool.name": name}
    _tool_span(tracer, name, attributes, ("input.value", "output.value"), arguments, result)


def _tool_span(
    tracer: Tracer,
    span_name: str,
    attributes: dict[str, Any],
    keys: tuple[str, str],
    arguments: Any,
    result: Any,
) -> None:
    """A span with ``attributes``, and the arguments and result (when given) under ``keys``."""
    for key, value in zip(keys, (arguments, result), strict=True):
        if value is not None:
            attributes[key] = _text(value)
    with tracer.start_as_current_span(span_name, attributes=attributes):
        pass


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def remote_context(trace_id: int) -> Any:
    """A context whose current span came from another process (a remote parent)."""
    parent = SpanContext(trace_id, 0x1234, is_remote=True, trace_flags=TraceFlags(1))
    return set_span_in_context(NonRecordingSpan(parent))


def flushed(processor: MnestomaSpanProcessor) -> MnestomaSpanProcessor:
    assert processor.force_flush(10_000)
    return processor


def search_then_read(tracer: Tracer) -> None:
    """fs.search finds a file, then fs.read reads it (the spans of :data:`SEARCH_THEN_READ`)."""
    for call in SEARCH_THEN_READ:
        genai(tracer, *call)


def genai_turn(setup: Setup, *calls: tuple[Any, ...]) -> tuple[FakeStore, MnestomaSpanProcessor]:
    """A store fed one turn of GenAI tool spans, each ``(name, arguments, result)``, and its
    processor, flushed."""
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        for call in calls:
            genai(tracer, *call)
    return store, flushed(processor)


SEARCH_TO_READ = ("fs.search", "1.2", "fs.read", "2.0")
SEARCH_THEN_READ = (
    ("fs.search", {"q": "pdf"}, ["a/report.pdf"]),
    ("fs.read", {"path": "a/report.pdf"}, "text"),
)


# -- what links -------------------------------------------------------------------------------


def test_genai_tool_spans_link_when_b_receives_what_a_returned(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn") as root:
        genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf", "b/notes.txt"])
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
    flushed(processor)
    assert store.edges() == [SEARCH_TO_READ]
    turn_id, passings, recorder = store.calls[0]
    assert turn_id == format(root.get_span_context().trace_id, "032x")
    assert recorder == "otel"
    assert passings[0].tags is None
    assert passings[0].outcome == "ok"  # fs.read's span ended UNSET: it returned
    assert processor.stats.traces_recorded == 1
    assert processor.stats.passings_recorded == 1


def test_openinference_tool_spans_link_the_same_way(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        openinference(tracer, "fs.search", "*.pdf", ["a/report.pdf"])
        openinference(tracer, "fs.read", "a/report.pdf", "the text")
    assert flushed(processor) and store.edges() == [SEARCH_TO_READ]


def test_a_plain_text_value_is_one_leaf(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.read", "a/report.pdf", "Quarterly report, page one"),
        ("pdf.text", {"text": "Quarterly report, page one"}, "ok"),
    )
    assert store.edges() == [("fs.read", "2.0", "pdf.text", "0.9")]


def test_a_fragment_of_a_plain_text_does_not_link(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.read", "a/report.pdf", "Quarterly report, page one"),
        ("pdf.text", {"text": "Quarterly report"}, "ok"),
    )
    assert store.calls == []


def test_nested_arguments_and_results_are_read_leaf_by_leaf(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.search", {"q": "pdf"}, {"hits": [{"path": "a/report.pdf", "n": 1}]}),
        ("fs.read", {"job": {"files": ["x/other.txt", "a/report.pdf"]}}, "text"),
    )
    assert store.edges() == [SEARCH_TO_READ]


def test_json_inside_a_json_string_is_read(setup: Setup) -> None:
    # LangChain serialises a tool's message; its content is itself JSON text
    store = FakeStore()
    processor, tracer = setup(store)
    envelope = {
        "type": "tool",
        "data": {"content": json.dumps(["a/report.pdf"]), "type": "tool", "name": "fs.search"},
    }
    with tracer.start_as_current_span("turn"):
        openinference(tracer, "fs.search", "*.pdf", envelope)
        openinference(tracer, "fs.read", "a/report.pdf", "text")
    assert flushed(processor) and store.edges() == [SEARCH_TO_READ]


def test_a_message_envelope_around_a_result_is_not_evidence(setup: Setup) -> None:
    # the envelope's own fields (its type, the tool's name, "success") are not the output
    store = FakeStore()
    processor, tracer = setup(store)
    envelope = {"type": "tool", "data": {"content": "page text", "status": "success"}}
    with tracer.start_as_current_span("turn"):
        openinference(tracer, "fs.search", "*.pdf", envelope)
        openinference(tracer, "fs.read", {"mode": "success", "kind": "tool"}, "text")
    assert flushed(processor) and store.calls == []


def test_an_output_nobody_consumed_records_nothing(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"]),
        ("fs.read", {"path": "z/elsewhere.pdf"}, "text"),
    )
    assert store.calls == []


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 1, 42, 1024, -1024, 0.5, float("nan"), "", "   ", "ok", "yes", "null"],
)
def test_trivial_values_do_not_link(setup: Setup, value: Any) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.search", {"q": "pdf"}, {"found": value, "items": []}),
        ("fs.read", {"flag": value, "opts": {}}, "text"),
    )
    assert store.calls == []


@pytest.mark.parametrize(("produced", "consumed"), [(2024, "2024"), (2024.0, 2024), ("2024", 2024)])
def test_a_number_of_four_characters_links_across_a_serialisation(
    setup: Setup, produced: Any, consumed: Any
) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.search", {"q": "pdf"}, {"year": produced}),
        ("fs.read", {"year": consumed}, "text"),
    )
    assert store.edges() == [SEARCH_TO_READ]


def test_value_digests_hold_no_content() -> None:
    secret = "s3cret-customer-record-4471"
    digests, truncated = value_digests(json.dumps({"a": [secret, {"b": secret}]}))
    assert len(digests) == 1 and not truncated
    assert all(isinstance(d, bytes) and len(d) == 16 for d in digests)
    assert secret.encode() not in b"".join(digests)


def test_the_processor_keeps_digests_not_content(setup: Setup) -> None:
    secret = "s3cret-customer-record-4471"
    processor, tracer = setup(FakeStore())
    with tracer.start_as_current_span("turn"):  # the root stays open: the trace is buffered
        genai(tracer, "fs.search", {"q": secret}, [secret])
        flushed(processor)
        assert processor.stats.tool_spans == 1
        assert secret not in repr(processor._traces)


def test_a_span_never_links_to_itself(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.read", {"path": "a/report.pdf"}, {"path": "a/report.pdf"}),
    )
    assert store.calls == []


def test_two_calls_of_one_tool_link_a_to_a(setup: Setup) -> None:
    store, _ = genai_turn(
        setup,
        ("fs.search", {"q": "reports"}, ["dir/reports-2024"]),
        ("fs.search", {"q": "dir/reports-2024"}, ["x.pdf"]),
    )
    assert store.edges() == [("fs.search", "1.2", "fs.search", "1.2")]


def test_a_value_links_to_its_latest_producer(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
        genai(tracer, "pdf.text", {"path": "a/report.pdf"}, {"source": "a/report.pdf"})
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    flushed(processor)
    assert store.edges() == [
        ("fs.search", "1.2", "pdf.text", "0.9"),
        ("pdf.text", "0.9", "fs.read", "2.0"),
    ]


def test_a_producer_that_had_not_ended_does_not_link(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    attrs = {"gen_ai.operation.name": "execute_tool"}
    with tracer.start_as_current_span("turn"):
        a = tracer.start_span(
            "a", start_time=100, attributes={**attrs, "gen_ai.tool.name": "fs.search"}
        )
        b = tracer.start_span(
            "b", start_time=150, attributes={**attrs, "gen_ai.tool.name": "fs.read"}
        )
        a.set_attribute("gen_ai.tool.call.result", '["a/report.pdf"]')
        b.set_attribute("gen_ai.tool.call.arguments", '{"path": "a/report.pdf"}')
        a.end(end_time=200)  # still running when b started at 150
        b.end(end_time=300)
    assert flushed(processor) and store.calls == []


def test_one_passing_per_call_of_the_destination_in_the_order_called(setup: Setup) -> None:
    """Contract §13: an edge passed twice in a trace reaches the store twice, so that the
    store counts occurrences 1 and 2."""
    store, _ = genai_turn(
        setup,
        ("fs.search", {"q": "pdf"}, ["a/report.pdf", "b/report.pdf"]),
        ("fs.read", {"path": "a/report.pdf"}, "text"),
        ("fs.read", {"path": "b/report.pdf"}, "text"),
    )
    assert store.edges() == [SEARCH_TO_READ, SEARCH_TO_READ]


# -- when a trace is recorded -----------------------------------------------------------------


def test_a_trace_is_recorded_when_its_local_root_ends(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        with tracer.start_as_current_span("agent"):
            search_then_read(tracer)
        assert flushed(processor) and store.calls == []
    assert flushed(processor) and store.edges() == [SEARCH_TO_READ]


def test_a_span_with_a_remote_parent_is_a_local_root(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    with tracer.start_as_current_span("rpc", context=remote_context(trace_id)):
        search_then_read(tracer)
    flushed(processor)
    assert [c[0] for c in store.calls] == ["0af7651916cd43dd8448eb211c80319c"]
    assert store.edges() == [SEARCH_TO_READ]


def test_two_local_roots_of_one_trace_are_recorded_once_both_ended(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    first = tracer.start_span("rpc 1", context=remote_context(trace_id))
    second = tracer.start_span("rpc 2", context=remote_context(trace_id))
    with tracer.start_as_current_span("t1", context=set_span_in_context(first)):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
    first.end()
    assert flushed(processor) and store.calls == []
    with tracer.start_as_current_span("t2", context=set_span_in_context(second)):
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    second.end()
    flushed(processor)
    assert len(store.calls) == 1 and store.edges() == [SEARCH_TO_READ]


def test_a_tool_span_ending_after_its_trace_was_recorded_is_counted_late(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    root = tracer.start_span("turn")
    ctx = set_span_in_context(root)
    late = tracer.start_span(
        "execute_tool fs.read",
        context=ctx,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fs.read"},
    )
    root.end()
    late.end()
    flushed(processor)
    assert processor.stats.late_spans == 1
    assert store.calls == []


def test_traces_whose_root_never_ends_are_evicted_oldest_first(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store, max_traces=1)
    stuck = tracer.start_span("stuck turn")  # never ends
    with tracer.start_as_current_span("stuck tools", context=set_span_in_context(stuck)):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
    for _ in range(2):
        with tracer.start_as_current_span("turn"):
            search_then_read(tracer)
    flushed(processor)
    assert processor.stats.traces_evicted == 1
    assert len(store.calls) == 2
    assert len(processor._traces) == 0
    with tracer.start_as_current_span("late tools", context=set_span_in_context(stuck)):
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    stuck.end()
    flushed(processor)
    assert len(store.calls) == 2  # its producer was forgotten with the evicted trace


def test_open_traces_are_bounded(setup: Setup) -> None:
    processor, tracer = setup(FakeStore(), max_traces=5)
    spans = [tracer.start_span(f"turn {i}") for i in range(20)]
    flushed(processor)
    assert len(processor._traces) == 5
    assert processor.stats.traces_evicted == 15
    for span in spans:
        span.end()


def test_tool_calls_per_trace_are_bounded_oldest_forgotten(setup: Setup) -> None:
    store, processor = genai_turn(
        functools.partial(setup, max_spans_per_trace=2),
        ("fs.search", {"q": "pdf"}, ["a/report.pdf"]),  # forgotten
        ("pdf.text", {"q": "other"}, "unrelated output"),
        ("pdf.text", {"q": "other-two"}, "unrelated output two"),
        ("fs.read", {"path": "a/report.pdf"}, "text"),
    )
    assert processor.stats.spans_dropped == 2
    assert store.calls == []


def test_leaves_per_value_are_bounded_and_counted(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store, max_leaves_per_value=3)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search", {"q": "pdf"}, [f"dir/file-{i:03}.pdf" for i in range(50)])
    flushed(processor)
    assert processor.stats.leaves_truncated == 1
    digests = value_digests([f"dir/file-{i:03}.pdf" for i in range(50)], max_leaves=3)
    assert len(digests[0]) == 3 and digests[1]


def test_bounds_must_be_positive() -> None:
    for option in ("max_traces", "max_spans_per_trace", "max_leaves_per_value", "max_queue"):
        with pytest.raises(mnestoma.InvalidInput, match=option):
            MnestomaSpanProcessor(FakeStore(), **{option: 0})  # type: ignore[arg-type]
    with pytest.raises(mnestoma.InvalidInput, match="version_of"):
        MnestomaSpanProcessor(FakeStore(), version_of=42)  # type: ignore[arg-type]
    with pytest.raises(mnestoma.InvalidInput, match="default_version"):
        MnestomaSpanProcessor(FakeStore(), default_version=" ")


# -- versions ---------------------------------------------------------------------------------


def test_version_of_may_be_a_callable(setup: Setup) -> None:
    store, _ = genai_turn(
        functools.partial(setup, version_of=lambda name: f"{len(name)}.0"), *SEARCH_THEN_READ
    )
    assert store.edges() == [("fs.search", "9.0", "fs.read", "7.0")]


def test_an_unknown_tool_is_unversioned_by_default(setup: Setup) -> None:
    store, _ = genai_turn(
        functools.partial(setup, version_of={"fs.search": "1.2"}), *SEARCH_THEN_READ
    )
    assert store.edges() == [("fs.search", "1.2", "fs.read", "unversioned")]


def test_without_a_default_version_unknown_tools_are_skipped(setup: Setup) -> None:
    store, processor = genai_turn(
        functools.partial(setup, version_of=lambda name: None, default_version=None),
        *SEARCH_THEN_READ,
    )
    assert store.calls == [] and processor.stats.unversioned_spans == 2


def test_a_version_of_that_raises_is_counted(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    def version_of(name: str) -> str:
        raise KeyError(name)

    store = FakeStore()
    processor, tracer = setup(store, version_of=version_of)
    with (
        caplog.at_level(logging.ERROR, logger="mnestoma.otel"),
        tracer.start_as_current_span("turn"),
    ):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
    flushed(processor)
    assert processor.stats.errors == 1 and "version_of" in caplog.text


def test_a_tool_the_store_would_refuse_is_skipped_not_the_trace(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    versions = {**VERSIONS, "bad\x00tool": "1.0", "fs.stat": ""}
    processor, tracer = setup(store, version_of=versions)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
        genai(tracer, "bad\x00tool", {"path": "a/report.pdf"}, "text")
        genai(tracer, "fs.stat", {"path": "a/report.pdf"}, "text")
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    flushed(processor)
    assert processor.stats.errors == 2 and processor.stats.store_failures == 0
    assert [(e.src_executor, e.dst_executor) for e in store.edges()] == [("fs.search", "fs.read")]


# -- content capture off, and sequence edges ---------------------------------------------------


def test_without_content_nothing_is_recorded_by_default(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search")
        genai(tracer, "fs.read")
    flushed(processor)
    assert store.calls == [] and processor.stats.tool_spans == 2


def test_tool_spans_without_content_are_counted_and_warned_about_once(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with caplog.at_level(logging.WARNING, logger="mnestoma.otel"):
        for _ in range(2):  # two traces: one warning for the processor, not one per span
            with tracer.start_as_current_span("turn"):
                genai(tracer, "fs.search")
                openinference(tracer, "fs.read", "__REDACTED__", "__REDACTED__")
                genai(tracer, "pdf.text", {"text": "page one"}, "summary")  # has content
        flushed(processor)
    assert processor.stats.tool_spans == 6
    assert processor.stats.spans_without_content == 4
    warnings = [r.getMessage() for r in caplog.records if "no content" in r.getMessage()]
    assert len(warnings) == 1
    assert "content capture" in warnings[0]


def test_redacted_content_is_not_evidence(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        openinference(tracer, "fs.search", "__REDACTED__", "__REDACTED__")
        openinference(tracer, "fs.read", "__REDACTED__", "__REDACTED__")
    assert flushed(processor) and store.calls == []


def test_sequence_edges_when_asked_are_tagged(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store, sequence_edges=True)
    with tracer.start_as_current_span("turn"):
        openinference(tracer, "fs.search", "__REDACTED__", "__REDACTED__")
        openinference(tracer, "fs.read", "__REDACTED__", "__REDACTED__")
        genai(tracer, "pdf.text")
    flushed(processor)
    _, passings, _ = store.calls[0]
    assert [(p[0], p[2], p.tags) for p in passings] == [
        ("fs.search", "fs.read", {"basis": "sequence"}),
        ("fs.read", "pdf.text", {"basis": "sequence"}),
    ]


def test_sequence_edges_do_not_override_captured_content(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store, sequence_edges=True)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
        genai(tracer, "pdf.text", {"q": "something else"}, "page text")  # content: no link
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    flushed(processor)
    _, passings, _ = store.calls[0]
    assert [(p[0], p[2], p.tags) for p in passings] == [("fs.search", "fs.read", None)]


# -- never in the way of the traced program ----------------------------------------------------


def test_a_failing_store_is_logged_and_counted_not_raised(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStore(fail=True)
    processor, tracer = setup(store)
    with caplog.at_level(logging.WARNING, logger="mnestoma.otel"):
        with tracer.start_as_current_span("turn"):
            search_then_read(tracer)
        flushed(processor)
    assert processor.stats.store_failures == 1
    assert processor.stats.traces_recorded == 0
    assert "database is down" in caplog.text


class AsyncStore:
    """A store whose record_turn must be awaited, like mnestoma.aio.AsyncMnestoma's."""

    async def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> list[Any]:
        raise AssertionError("never called")


def test_an_async_store_is_refused_at_construction(tmp_path: Any) -> None:
    import asyncio

    from mnestoma.doors.asynchronous import AsyncMnestoma

    with pytest.raises(mnestoma.InvalidInput, match="blocking store"):
        MnestomaSpanProcessor(AsyncStore())
    am = AsyncMnestoma(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        with pytest.raises(mnestoma.InvalidInput, match="blocking store"):
            MnestomaSpanProcessor(am)
    finally:
        asyncio.run(am.close())


def test_a_store_that_returns_an_awaitable_is_a_counted_failure(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    class Deferring:
        def __init__(self) -> None:
            self.inner = AsyncStore()

        def record_turn(self, turn_id: str, passings: Any, *, recorder: str) -> Any:
            return self.inner.record_turn(turn_id, passings, recorder=recorder)  # not awaited

    processor, tracer = setup(Deferring())
    with caplog.at_level(logging.WARNING, logger="mnestoma.otel"):
        with tracer.start_as_current_span("turn"):
            search_then_read(tracer)
        flushed(processor)
    assert processor.stats.store_failures == 1
    assert processor.stats.traces_recorded == 0 and processor.stats.passings_recorded == 0
    assert "awaitable" in caplog.text


def test_writing_happens_off_the_thread_that_ends_the_span(setup: Setup) -> None:
    gate = threading.Event()
    store = FakeStore(gate=gate)
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        search_then_read(tracer)
    # the root has ended and returned although the store has not finished writing
    assert store.entered.wait(10)
    assert store.calls == []
    gate.set()
    flushed(processor)
    assert store.edges() == [SEARCH_TO_READ]
    assert threading.get_ident() not in store.threads


def test_a_full_queue_drops_and_counts_without_blocking(setup: Setup) -> None:
    gate, entered = threading.Event(), threading.Event()

    def version_of(name: str) -> str:  # runs on the writer thread: hold it there
        entered.set()
        assert gate.wait(10)
        return "1.0"

    processor, tracer = setup(FakeStore(), max_queue=1, version_of=version_of)
    # a parent in this process that is not recording: the tool spans are not local roots,
    # so each hands exactly one item to the writer
    parent = SpanContext(0x5CE0E9A56015FEC5AADFA328AE398115, 0x42, False, TraceFlags(1))
    context = set_span_in_context(NonRecordingSpan(parent))
    with tracer.start_as_current_span("first", context=context):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
    assert entered.wait(10)  # the writer holds the first span, the queue is empty
    with tracer.start_as_current_span("more", context=context):
        for _ in range(3):  # one fits, two do not
            genai(tracer, "fs.read", {"path": "a/report.pdf"}, "text")
    assert processor.stats.queue_overflow == 2
    gate.set()
    flushed(processor)
    assert processor.stats.tool_spans == 2


def test_shutdown_drains_then_ignores_later_spans(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        search_then_read(tracer)
    processor.shutdown()
    assert store.edges() == [SEARCH_TO_READ]
    with tracer.start_as_current_span("turn"):
        search_then_read(tracer)
    assert processor.force_flush(1000)
    assert len(store.calls) == 1
    processor.shutdown()  # twice is fine


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_worker_records_through_a_writer_of_its_own(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: trace a turn, report what reached the store, leave at once
        status = 1
        try:
            with tracer.start_as_current_span("turn"):
                search_then_read(tracer)
            processor.force_flush(10_000)
            os.write(write_end, json.dumps(store.edges()).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        reported = json.loads(pipe.read() or "null")
    assert os.waitpid(pid, 0)[1] == 0
    assert reported == [list(SEARCH_TO_READ)]
    assert store.calls == []  # the parent recorded nothing of the child's turn


def test_shutdown_forgets_traces_whose_root_never_ended(setup: Setup) -> None:
    store = FakeStore()
    processor, tracer = setup(store)
    open_root = tracer.start_span("turn")
    with tracer.start_as_current_span("tools", context=set_span_in_context(open_root)):
        genai(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"])
    processor.shutdown()
    assert processor.stats.traces_evicted == 1 and store.calls == []


# -- through the real store ---------------------------------------------------------------------


def test_the_store_records_the_trace_as_one_turn_by_otel(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn") as root:
        genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
        genai(tracer, "pdf.text", {"text": "the text"}, "summary")
    flushed(processor)
    assert processor.stats.store_failures == 0
    turn_id = format(root.get_span_context().trace_id, "032x")
    edges = {(e.src_executor, e.src_version, e.dst_executor, e.dst_version) for e in store.edges()}
    assert edges == {SEARCH_TO_READ, ("fs.read", "2.0", "pdf.text", "0.9")}
    events = store.events(turn_id=turn_id)
    assert len(events) == 2
    assert {e.recorder for e in events} == {"otel"}


def test_a_replayed_trace_counts_once_in_the_store(setup: Setup, store: mnestoma.Mnestoma) -> None:
    processor, tracer = setup(store)
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    for _ in range(2):  # the same trace delivered twice (a retried request)
        with tracer.start_as_current_span("rpc", context=remote_context(trace_id)):
            genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
            genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
        flushed(processor)
    edge = store.find(*SEARCH_TO_READ)
    assert edge is not None and edge.uses == 1
    assert processor.stats.traces_recorded == 2
    assert len(store.events(turn_id=format(trace_id, "032x"))) == 1


def test_repeats_in_a_trace_count_as_occurrences_and_a_redelivered_trace_adds_nothing(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store)
    trace_id = 0x5BF92F3577B34DA6A3CE929D0E0E4737
    for _ in range(2):  # the same trace delivered twice
        with tracer.start_as_current_span("rpc", context=remote_context(trace_id)):
            genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf", "b/report.pdf"])
            genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
            genai(tracer, "fs.read", {"path": "b/report.pdf"}, "other text")
        flushed(processor)
    edge = store.find(*SEARCH_TO_READ)
    assert edge is not None and edge.uses == 2
    events = store.events(turn_id=format(trace_id, "032x"))
    assert [(e.kind, e.occurrence) for e in events] == [("created", 1), ("reinforced", 2)]
    assert (processor.stats.passings_recorded, processor.stats.passings_replayed) == (2, 2)


def test_passings_recorded_counts_what_the_store_kept_not_a_replay(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store)
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    with tracer.start_as_current_span("rpc", context=remote_context(trace_id)):
        genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
    flushed(processor)
    with tracer.start_as_current_span("rpc", context=remote_context(trace_id)):  # replayed
        genai(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        genai(tracer, "fs.read", {"path": "a/report.pdf"}, "the text")
        genai(tracer, "pdf.text", {"text": "the text"}, "summary")  # and one edge more
    flushed(processor)
    stats = processor.stats
    assert (stats.passings_recorded, stats.passings_replayed) == (2, 1)
    assert stats.passings_recorded == sum(m.uses for m in store.edges())


def test_sequence_edges_reach_the_store_with_their_tag(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store, sequence_edges=True)
    with tracer.start_as_current_span("turn"):
        genai(tracer, "fs.search")
        genai(tracer, "fs.read")
    flushed(processor)
    edge = store.find(*SEARCH_TO_READ)
    assert edge is not None and edge.tags == {"basis": "sequence"}
