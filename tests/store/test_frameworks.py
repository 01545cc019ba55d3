"""Real agent frameworks, offline, feed the store through MnestomaSpanProcessor.

A LangGraph agent traced by OpenInference's LangChain instrumentation, and an OpenAI
Agents SDK run traced by OpenTelemetry's GenAI instrumentation, each driven by a scripted
model that copies a tool's result into the next tool call's arguments, as a model does.
The exact edges are asserted; with content capture off nothing is recorded. A run where one
tool raises (the framework hands its error to the model) records that edge's outcome as
"error" and the others' as "ok" (contract §11).

The frameworks, the scripted models and the runs are in ``tests/frameworks_kit.py``, which
the ``kit`` fixture imports when a test of this module runs: every xdist worker collects
this module, and only the one that runs its tests pays for importing the frameworks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

import mnestoma
from mnestoma.recording.otel import MnestomaSpanProcessor

if TYPE_CHECKING:
    from openinference.instrumentation import TraceConfig

EXPECTED = {
    ("search_files", "1.0", "read_file", "2.0"),
    ("read_file", "2.0", "count_words", "1.1"),
}
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736

# The run with a failing tool: search_files, then convert_pdf (raises) and read_file (returns)
# on the file found, then count_words on the text read.
FAILING_RUN = {
    ("search_files", "1.0", "read_file", "2.0"): "ok",
    ("search_files", "1.0", "convert_pdf", "0.5"): "error",
    ("read_file", "2.0", "count_words", "1.1"): "ok",
}


@pytest.fixture(scope="module")
def kit() -> ModuleType:
    """``frameworks_kit``: the frameworks, imported when a test of this module runs (not
    when the module is collected)."""
    # the test extra installs these (extra "frameworks"): a missing one fails, never skips
    import frameworks_kit

    return frameworks_kit


def outcomes(store: mnestoma.Mnestoma) -> dict[tuple[str, str, str, str | None], str | None]:
    """Each edge and the outcome its passing event recorded (one event per edge here)."""
    rows = {e.id: e for e in store.edges()}
    found: dict[tuple[str, str, str, str | None], str | None] = {}
    for event in store.events():
        m = rows[event.mnest_id]
        key = (m.src_executor, m.src_version, m.dst_executor, m.dst_version)
        assert key not in found, "one passing event per edge"
        found[key] = event.outcome
    return found


def counts(store: mnestoma.Mnestoma) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Each edge (by tool names) and its row's (uses, ok_count, error_count)."""
    return {
        (e.src_executor, e.dst_executor): (e.uses, e.ok_count, e.error_count) for e in store.edges()
    }


FAILING_COUNTS = {
    ("search_files", "read_file"): (1, 1, 0),
    ("search_files", "convert_pdf"): (1, 0, 1),
    ("read_file", "count_words"): (1, 1, 0),
}


def edges(store: mnestoma.Mnestoma) -> set[tuple[str, str, str, str | None]]:
    return {(e.src_executor, e.src_version, e.dst_executor, e.dst_version) for e in store.edges()}


@pytest.fixture
def provider(
    kit: ModuleType, store: mnestoma.Mnestoma
) -> Iterator[tuple[TracerProvider, MnestomaSpanProcessor]]:
    """An in-memory tracer provider (not the global one) feeding the store."""
    processor = MnestomaSpanProcessor(store, version_of=kit.VERSIONS)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(processor)
    yield tracer_provider, processor
    tracer_provider.shutdown()


def retried_request() -> Any:
    """A context carrying a remote parent: each run under it is a local root of TRACE_ID."""
    parent = SpanContext(TRACE_ID, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1))
    return set_span_in_context(NonRecordingSpan(parent))


# -- LangGraph + OpenInference ----------------------------------------------------------------


@pytest.fixture
def langchain_traced(
    kit: ModuleType,
    provider: tuple[TracerProvider, MnestomaSpanProcessor],
) -> Iterator[Any]:
    """Instrument LangChain into the test's provider; returns a function to re-configure."""
    instrumentor = kit.LangChainInstrumentor()

    def instrument(config: TraceConfig | None = None) -> MnestomaSpanProcessor:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        instrumentor.instrument(tracer_provider=provider[0], config=config or kit.TraceConfig())
        return provider[1]

    yield instrument
    instrumentor.uninstrument()


def test_langgraph_agent_records_exactly_the_passings_of_its_tools(
    kit: ModuleType, langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    assert kit.run_langgraph() == "9 words"
    assert processor.force_flush(10_000)
    assert edges(store) == EXPECTED
    assert processor.stats.tool_spans == 4
    events = store.events()
    assert len(events) == 2
    assert {e.recorder for e in events} == {"otel"}
    assert len({e.turn_id for e in events}) == 1  # one trace, one turn


def test_langgraph_records_a_failing_tool_s_edge_as_an_error(
    kit: ModuleType, langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    kit.run_langgraph_with_a_failing_tool(
        [kit.tool(f) for f in (kit.search_files, kit.read_file, kit.convert_pdf, kit.count_words)]
    )
    assert processor.force_flush(10_000)
    assert outcomes(store) == FAILING_RUN  # OpenInference marks the tool span ERROR
    assert counts(store) == FAILING_COUNTS


def handled_twice(processor: Any, run: Callable[[], object]) -> None:
    """``run`` handled twice as the same request (the same trace id), flushed each time."""
    for _ in range(2):
        token = otel_context.attach(retried_request())
        try:
            run()
        finally:
            otel_context.detach(token)
        assert processor.force_flush(10_000)


def test_langgraph_retried_turn_counts_once(
    kit: ModuleType, langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    handled_twice(processor, kit.run_langgraph)
    assert processor.stats.traces_recorded == 2
    assert edges(store) == EXPECTED
    assert {e.uses for e in store.edges()} == {1}
    assert {e.turn_id for e in store.events()} == {format(TRACE_ID, "032x")}


def test_langgraph_with_content_capture_off_records_nothing(
    kit: ModuleType, langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced(kit.TraceConfig(hide_inputs=True, hide_outputs=True))
    assert kit.run_langgraph() == "9 words"
    assert processor.force_flush(10_000)
    assert processor.stats.tool_spans == 4  # the tools were seen, their content was not
    assert store.edges() == []
    assert store.events() == []


def test_the_in_process_tracer_records_the_same_edges_from_the_same_tools(
    kit: ModuleType, store: mnestoma.Mnestoma
) -> None:
    from mnestoma.recording.tracing import turn

    traced_tools = kit.tracer_tools(kit.search_files, kit.read_file, kit.count_words, kit.today)
    with turn(store, "turn-tracer") as t:
        assert kit.run_langgraph(traced_tools) == "9 words"
    assert {tuple(p[:4]) for p in t.passings} == EXPECTED
    assert edges(store) == EXPECTED
    assert {e.recorder for e in store.events()} == {"tracer"}


def test_the_in_process_tracer_records_a_failing_tool_s_edge_as_an_error(
    kit: ModuleType, store: mnestoma.Mnestoma
) -> None:
    from mnestoma.recording.tracing import turn

    traced_tools = kit.tracer_tools(
        kit.search_files, kit.read_file, kit.convert_pdf, kit.count_words
    )
    with turn(store, "turn-tracer") as t:
        kit.run_langgraph_with_a_failing_tool(traced_tools)
    assert {tuple(p[:4]): p.outcome for p in t.passings} == FAILING_RUN
    assert outcomes(store) == FAILING_RUN
    assert counts(store) == FAILING_COUNTS


# -- OpenAI Agents SDK + OpenTelemetry GenAI instrumentation ----------------------------------

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


@pytest.fixture
def agents_traced(
    kit: ModuleType,
    provider: tuple[TracerProvider, MnestomaSpanProcessor],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Any]:
    """Instrument the Agents SDK into the test's provider, nothing exported to OpenAI."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    instrumentor = kit.OpenAIAgentsInstrumentor()

    def instrument(*, capture_content: bool) -> MnestomaSpanProcessor:
        if capture_content:
            monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
        else:
            monkeypatch.delenv(CAPTURE, raising=False)
        instrumentor.instrument(tracer_provider=provider[0], disable_openai_trace_export=True)
        return provider[1]

    yield instrument
    instrumentor.uninstrument()


def test_agents_sdk_run_records_exactly_the_passings_of_its_tools(
    kit: ModuleType, agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=True)
    assert kit.run_agents_sdk() == "9 words"
    assert processor.force_flush(10_000)
    assert edges(store) == EXPECTED
    assert processor.stats.tool_spans == 4
    events = store.events()
    assert len(events) == 2 and {e.recorder for e in events} == {"otel"}


def test_agents_sdk_records_a_failing_tool_s_edge_as_an_error(
    kit: ModuleType, agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=True)
    tools = [
        kit.function_tool(f)
        for f in (kit.search_files, kit.read_file, kit.convert_pdf, kit.count_words)
    ]
    agent = kit.Agent(
        name="analyst", instructions="Answer.", tools=tools, model=kit.FailingToolModel()
    )
    # the SDK hands the tool's error to the model as its output, and goes on
    assert asyncio.run(kit.Runner.run(agent, "How long is the pdf?")).final_output == "9 words"
    assert processor.force_flush(10_000)
    # the GenAI instrumentation sets ERROR on the failed tool's span, leaves the others UNSET
    assert outcomes(store) == FAILING_RUN
    assert counts(store) == FAILING_COUNTS


def test_agents_sdk_retried_turn_counts_once(
    kit: ModuleType, agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=True)
    handled_twice(processor, kit.run_agents_sdk)
    assert processor.stats.traces_recorded == 2
    assert {e.uses for e in store.edges()} == {1}
    assert {e.turn_id for e in store.events()} == {format(TRACE_ID, "032x")}


def test_agents_sdk_with_content_capture_off_records_nothing(
    kit: ModuleType, agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=False)
    assert kit.run_agents_sdk() == "9 words"
    assert processor.force_flush(10_000)
    assert processor.stats.tool_spans == 4
    assert store.edges() == []
