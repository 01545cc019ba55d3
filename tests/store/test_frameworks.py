"""Real agent frameworks, offline, feed the store through MnestomaSpanProcessor.

A LangGraph agent traced by OpenInference's LangChain instrumentation, and an OpenAI
Agents SDK run traced by OpenTelemetry's GenAI instrumentation, each driven by a scripted
model that copies a tool's result into the next tool call's arguments, as a model does.
The exact edges are asserted; with content capture off nothing is recorded. A run where one
tool raises (the framework hands its error to the model) records that edge's outcome as
"error" and the others' as "ok" (contract §11).
"""

from __future__ import annotations

import ast
import asyncio
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

# the test extra installs these (extra "frameworks"): a missing one fails, never skips
from agents import Agent, ModelResponse, Runner, Usage, function_tool
from agents.models.interface import Model
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openinference.instrumentation import TraceConfig
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.genai.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

import mnestoma
from mnestoma.recording.otel import MnestomaSpanProcessor

VERSIONS = {
    "search_files": "1.0",
    "read_file": "2.0",
    "count_words": "1.1",
    "today": "0.3",
    "convert_pdf": "0.5",
}
EXPECTED = {
    ("search_files", "1.0", "read_file", "2.0"),
    ("read_file", "2.0", "count_words", "1.1"),
}
FILES = ["/data/report-2024.pdf", "/data/notes-2023.txt"]
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def search_files(pattern: str) -> list[str]:
    """Find the files matching a pattern."""
    return [f for f in FILES if f.endswith(pattern.lstrip("*"))]


def read_file(path: str) -> str:
    """Read a file's text."""
    return f"Quarterly figures from {path}: revenue grew in every region"


def count_words(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


def today() -> str:
    """Today's date (its output is never consumed)."""
    return "2026-01-01"


def convert_pdf(path: str) -> str:
    """Convert a PDF to text (this one always fails: the file is encrypted)."""
    raise ValueError(f"cannot convert {path}: the file is encrypted")


# The run with a failing tool: search_files, then convert_pdf (raises) and read_file (returns)
# on the file found, then count_words on the text read.
FAILING_RUN = {
    ("search_files", "1.0", "read_file", "2.0"): "ok",
    ("search_files", "1.0", "convert_pdf", "0.5"): "error",
    ("read_file", "2.0", "count_words", "1.1"): "ok",
}


def scripted_run_calls(results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """The next tool calls of the scripted run, given the results so far (None: answer now):
    search_files (and today, whose output nobody uses), read_file on the first file found,
    count_words on the text read."""
    if "search_files" not in results:
        return [("search_files", {"pattern": "*.pdf"}), ("today", {})]
    if "read_file" not in results:
        return [("read_file", {"path": first_item(results["search_files"])})]
    if "count_words" not in results:
        return [("count_words", {"text": results["read_file"]})]
    return None


def failing_run_calls(results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
    """The next tool calls of the run with a failing tool, given the results so far (None:
    answer now)."""
    if "search_files" not in results:
        return [("search_files", {"pattern": "*.pdf"})]
    if "read_file" not in results:
        path = first_item(results["search_files"])
        return [("convert_pdf", {"path": path}), ("read_file", {"path": path})]
    if "count_words" not in results:
        return [("count_words", {"text": results["read_file"]})]
    return None


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


def first_item(listing: Any) -> str:
    """The first item of a list a tool returned, as the framework handed it to the model."""
    if isinstance(listing, str):
        listing = ast.literal_eval(listing)  # JSON or Python's repr of a list of strings
    return str(listing[0])


def edges(store: mnestoma.Mnestoma) -> set[tuple[str, str, str, str | None]]:
    return {(e.src_executor, e.src_version, e.dst_executor, e.dst_version) for e in store.edges()}


@pytest.fixture
def provider(store: mnestoma.Mnestoma) -> Iterator[tuple[TracerProvider, MnestomaSpanProcessor]]:
    """An in-memory tracer provider (not the global one) feeding the store."""
    processor = MnestomaSpanProcessor(store, version_of=VERSIONS)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(processor)
    yield tracer_provider, processor
    tracer_provider.shutdown()


def retried_request() -> Any:
    """A context carrying a remote parent: each run under it is a local root of TRACE_ID."""
    parent = SpanContext(TRACE_ID, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1))
    return set_span_in_context(NonRecordingSpan(parent))


# -- LangGraph + OpenInference ----------------------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """A chat model that calls search_files, then read_file on the first file found, then
    count_words on the text read (and today, whose output nobody uses), then answers."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def plan(self, results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        """The tool calls of the next step, given the results so far; None to answer."""
        return scripted_run_calls(results)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        results = {m.name: m.content for m in messages if isinstance(m, ToolMessage)}
        calls = self.plan(results)
        if calls is None:
            return _chat(AIMessage(content=f"{results['count_words']} words"))
        step = len(results)
        tool_calls = [
            {"name": name, "args": args, "id": f"call_{step}_{i}", "type": "tool_call"}
            for i, (name, args) in enumerate(calls)
        ]
        return _chat(AIMessage(content="", tool_calls=tool_calls))


def _chat(message: AIMessage) -> ChatResult:
    return ChatResult(generations=[ChatGeneration(message=message)])


class FailingToolChatModel(ScriptedChatModel):
    """The scripted chat model of the run with a failing tool (see failing_run_calls)."""

    def plan(self, results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        return failing_run_calls(results)


def langgraph_agent(tools: list[Any]) -> Any:
    """``create_react_agent`` (LangGraph's prebuilt ReAct agent) with the scripted model."""
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.0, still here
        warnings.simplefilter("ignore")
        return create_react_agent(ScriptedChatModel(), tools)


LANGCHAIN_TOOLS = [tool(f) for f in (search_files, read_file, count_words, today)]


@pytest.fixture
def langchain_traced(
    provider: tuple[TracerProvider, MnestomaSpanProcessor],
) -> Iterator[Any]:
    """Instrument LangChain into the test's provider; returns a function to re-configure."""
    instrumentor = LangChainInstrumentor()

    def instrument(config: TraceConfig | None = None) -> MnestomaSpanProcessor:
        if instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.uninstrument()
        instrumentor.instrument(tracer_provider=provider[0], config=config or TraceConfig())
        return provider[1]

    yield instrument
    instrumentor.uninstrument()


def run_langgraph(tools: list[Any] = LANGCHAIN_TOOLS) -> str:
    result = langgraph_agent(tools).invoke({"messages": [("user", "How long is the pdf?")]})
    return str(result["messages"][-1].content)


def run_langgraph_with_a_failing_tool(tools: list[Any]) -> list[BaseMessage]:
    """Run the agent with a failing tool and return its messages; the tool node hands a
    tool's error to the model as a message (``handle_tool_errors=True``), so the run goes on."""
    from langgraph.prebuilt import ToolNode, create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(FailingToolChatModel(), ToolNode(tools, handle_tool_errors=True))
    result = agent.invoke({"messages": [("user", "How long is the pdf?")]})
    messages: list[BaseMessage] = result["messages"]
    assert messages[-1].content == "9 words"
    [failed] = [m for m in messages if isinstance(m, ToolMessage) and m.status == "error"]
    assert failed.name == "convert_pdf"  # the tool did raise, and the run went on
    return messages


def test_langgraph_agent_records_exactly_the_passings_of_its_tools(
    langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    assert run_langgraph() == "9 words"
    assert processor.force_flush(10_000)
    assert edges(store) == EXPECTED
    assert processor.stats.tool_spans == 4
    events = store.events()
    assert len(events) == 2
    assert {e.recorder for e in events} == {"otel"}
    assert len({e.turn_id for e in events}) == 1  # one trace, one turn


def test_langgraph_records_a_failing_tool_s_edge_as_an_error(
    langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    run_langgraph_with_a_failing_tool(
        [tool(f) for f in (search_files, read_file, convert_pdf, count_words)]
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
    langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced()
    handled_twice(processor, run_langgraph)
    assert processor.stats.traces_recorded == 2
    assert edges(store) == EXPECTED
    assert {e.uses for e in store.edges()} == {1}
    assert {e.turn_id for e in store.events()} == {format(TRACE_ID, "032x")}


def test_langgraph_with_content_capture_off_records_nothing(
    langchain_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = langchain_traced(TraceConfig(hide_inputs=True, hide_outputs=True))
    assert run_langgraph() == "9 words"
    assert processor.force_flush(10_000)
    assert processor.stats.tool_spans == 4  # the tools were seen, their content was not
    assert store.edges() == []
    assert store.events() == []


def tracer_tools(*funcs: Any) -> list[Any]:
    """LangChain tools of ``funcs``, each wrapped by the in-process tracer's executor."""
    from mnestoma.recording.tracing import executor

    return [tool(executor(f.__name__, VERSIONS[f.__name__])(f)) for f in funcs]


def test_the_in_process_tracer_records_the_same_edges_from_the_same_tools(
    store: mnestoma.Mnestoma,
) -> None:
    from mnestoma.recording.tracing import turn

    traced_tools = tracer_tools(search_files, read_file, count_words, today)
    with turn(store, "turn-tracer") as t:
        assert run_langgraph(traced_tools) == "9 words"
    assert {tuple(p[:4]) for p in t.passings} == EXPECTED
    assert edges(store) == EXPECTED
    assert {e.recorder for e in store.events()} == {"tracer"}


def test_the_in_process_tracer_records_a_failing_tool_s_edge_as_an_error(
    store: mnestoma.Mnestoma,
) -> None:
    from mnestoma.recording.tracing import turn

    traced_tools = tracer_tools(search_files, read_file, convert_pdf, count_words)
    with turn(store, "turn-tracer") as t:
        run_langgraph_with_a_failing_tool(traced_tools)
    assert {tuple(p[:4]): p.outcome for p in t.passings} == FAILING_RUN
    assert outcomes(store) == FAILING_RUN
    assert counts(store) == FAILING_COUNTS


# -- OpenAI Agents SDK + OpenTelemetry GenAI instrumentation ----------------------------------

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


class ScriptedModel(Model):
    """A model that calls the tools in the same order, copying each result it reads."""

    def plan(self, results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        """The tool calls of the next step, given the results so far; None to answer."""
        return scripted_run_calls(results)

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [item for item in input if isinstance(item, dict)]
        calls = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
        results = {
            calls[i["call_id"]]: i["output"]
            for i in items
            if i.get("type") == "function_call_output"
        }
        todo = self.plan(results)
        if todo is None:
            text = ResponseOutputText(
                type="output_text", text=f"{results['count_words']} words", annotations=[]
            )
            message = ResponseOutputMessage(
                id="msg_1", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)
        step = len(results)
        output: list[Any] = [
            ResponseFunctionToolCall(
                type="function_call",
                name=name,
                arguments=json.dumps(args),
                call_id=f"call_{step}_{i}",
                id=f"fc_{step}_{i}",
                status="completed",
            )
            for i, (name, args) in enumerate(todo)
        ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


AGENT_TOOLS: list[Any] = [function_tool(f) for f in (search_files, read_file, count_words, today)]


class FailingToolModel(ScriptedModel):
    """The scripted model of the run with a failing tool (see failing_run_calls)."""

    def plan(self, results: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        return failing_run_calls(results)


@pytest.fixture
def agents_traced(
    provider: tuple[TracerProvider, MnestomaSpanProcessor],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Any]:
    """Instrument the Agents SDK into the test's provider, nothing exported to OpenAI."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    instrumentor = OpenAIAgentsInstrumentor()

    def instrument(*, capture_content: bool) -> MnestomaSpanProcessor:
        if capture_content:
            monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
        else:
            monkeypatch.delenv(CAPTURE, raising=False)
        instrumentor.instrument(tracer_provider=provider[0], disable_openai_trace_export=True)
        return provider[1]

    yield instrument
    instrumentor.uninstrument()


def run_agents_sdk() -> str:
    agent = Agent(name="analyst", instructions="Answer.", tools=AGENT_TOOLS, model=ScriptedModel())
    result = asyncio.run(Runner.run(agent, "How long is the pdf?"))
    return str(result.final_output)


def test_agents_sdk_run_records_exactly_the_passings_of_its_tools(
    agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=True)
    assert run_agents_sdk() == "9 words"
    assert processor.force_flush(10_000)
    assert edges(store) == EXPECTED
    assert processor.stats.tool_spans == 4
    events = store.events()
    assert len(events) == 2 and {e.recorder for e in events} == {"otel"}


def test_agents_sdk_records_a_failing_tool_s_edge_as_an_error(
    agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=True)
    tools = [function_tool(f) for f in (search_files, read_file, convert_pdf, count_words)]
    agent = Agent(name="analyst", instructions="Answer.", tools=tools, model=FailingToolModel())
    # the SDK hands the tool's error to the model as its output, and goes on
    assert asyncio.run(Runner.run(agent, "How long is the pdf?")).final_output == "9 words"
    assert processor.force_flush(10_000)
    # the GenAI instrumentation sets ERROR on the failed tool's span, leaves the others UNSET
    assert outcomes(store) == FAILING_RUN
    assert counts(store) == FAILING_COUNTS


def test_agents_sdk_retried_turn_counts_once(agents_traced: Any, store: mnestoma.Mnestoma) -> None:
    processor = agents_traced(capture_content=True)
    handled_twice(processor, run_agents_sdk)
    assert processor.stats.traces_recorded == 2
    assert {e.uses for e in store.edges()} == {1}
    assert {e.turn_id for e in store.events()} == {format(TRACE_ID, "032x")}


def test_agents_sdk_with_content_capture_off_records_nothing(
    agents_traced: Any, store: mnestoma.Mnestoma
) -> None:
    processor = agents_traced(capture_content=False)
    assert run_agents_sdk() == "9 words"
    assert processor.force_flush(10_000)
    assert processor.stats.tool_spans == 4
    assert store.edges() == []
