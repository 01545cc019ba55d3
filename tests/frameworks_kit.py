"""The agent frameworks of ``tests/store/test_frameworks.py`` and the scripted runs on them:
the tools, the scripted models, the agents and the runs, imported by that module's ``kit``
fixture when one of its tests runs, so that collecting it (every xdist worker collects every
module) imports none of the frameworks.

A LangGraph agent (LangChain, traced by OpenInference) and an OpenAI Agents SDK run (traced
by OpenTelemetry's GenAI instrumentation), each driven by a scripted model that copies a
tool's result into the next tool call's arguments, as a model does.
"""

from __future__ import annotations

import ast
import asyncio
import json
import warnings
from collections.abc import Sequence
from typing import Any

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

# what the tests use of the frameworks themselves (re-exported: the kit does not use them)
from openinference.instrumentation import TraceConfig as TraceConfig
from openinference.instrumentation.langchain import LangChainInstrumentor as LangChainInstrumentor
from opentelemetry.instrumentation.genai.openai_agents import (
    OpenAIAgentsInstrumentor as OpenAIAgentsInstrumentor,
)

VERSIONS = {
    "search_files": "1.0",
    "read_file": "2.0",
    "count_words": "1.1",
    "today": "0.3",
    "convert_pdf": "0.5",
}
FILES = ["/data/report-2024.pdf", "/data/notes-2023.txt"]


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


def first_item(listing: Any) -> str:
    """The first item of a list a tool returned, as the framework handed it to the model."""
    if isinstance(listing, str):
        listing = ast.literal_eval(listing)  # JSON or Python's repr of a list of strings
    return str(listing[0])


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


def tracer_tools(*funcs: Any) -> list[Any]:
    """LangChain tools of ``funcs``, each wrapped by the in-process tracer's executor."""
    from mnestoma.recording.tracing import executor

    return [tool(executor(f.__name__, VERSIONS[f.__name__])(f)) for f in funcs]


# -- OpenAI Agents SDK + OpenTelemetry GenAI instrumentation ----------------------------------


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


def run_agents_sdk() -> str:
    agent = Agent(name="analyst", instructions="Answer.", tools=AGENT_TOOLS, model=ScriptedModel())
    result = asyncio.run(Runner.run(agent, "How long is the pdf?"))
    return str(result.final_output)
