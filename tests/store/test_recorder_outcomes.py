"""Recorders set outcomes (contract §11): the tracer says whether B returned or raised, the
OpenTelemetry processor reads B's span status; the counts reach the rows and the events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from opentelemetry.trace import Status, StatusCode, Tracer
from otel_kit import VERSIONS, Setup, otel_setup  # noqa: F401  (the setup fixture)

import mnestoma
from mnestoma import Passing
from mnestoma.recording.tracing import BackgroundWriter, current_turn, executor, turn, wish

# ---------------------------------------------------------------------------- helpers


class Broken(Exception):
    """What a failing test executor raises."""


@executor("fetch", "1")
def fetch(url: str) -> str:
    return f"<html>the page at {url}</html>"


@executor("parse", "1")
def parse(html: str) -> dict[str, str]:
    if "broken" in html:
        raise Broken(f"cannot parse {html}")
    return {"title": html.removeprefix("<html>").removesuffix("</html>")}


@executor("index", "1")
def index(doc: Any) -> str:
    return f"indexed {doc!r}"


@executor("afetch", "1")
async def afetch(url: str) -> str:
    await asyncio.sleep(0)
    return f"<html>async page at {url}</html>"


@executor("aparse", "1")
async def aparse(html: str) -> str:
    await asyncio.sleep(0)
    if "broken" in html:
        raise Broken(f"cannot parse {html}")
    return f"parsed {html}"


class Flaky:
    """An executor method that fails its first ``failures`` calls, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    @executor("flaky.convert", "1")
    def convert(self, html: str) -> str:
        if self.failures > 0:
            self.failures -= 1
            raise Broken("try again")
        return f"converted {html}"

    @executor("flaky.aconvert", "1")
    async def aconvert(self, html: str) -> str:
        await asyncio.sleep(0)
        return self.convert.__wrapped__(self, html)  # type: ignore[attr-defined, no-any-return]


def outcomes(passings: list[Passing]) -> dict[tuple[str, str], str | None]:
    """Each passing's (source, destination) and outcome."""
    return {(p.src_executor, p.dst_executor): p.outcome for p in passings}


def each_outcome(passings: list[Passing]) -> list[tuple[str, str, str | None]]:
    """Every passing's (source, destination, outcome), in order: an edge as often as it passed."""
    return [(p.src_executor, p.dst_executor, p.outcome) for p in passings]


def rows(store: mnestoma.Mnestoma) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Each row's (source, destination) and its (uses, ok_count, error_count)."""
    return {
        (m.src_executor, m.dst_executor): (m.uses, m.ok_count, m.error_count) for m in store.edges()
    }


def event_outcomes(store: mnestoma.Mnestoma, turn_id: str) -> dict[tuple[str, str], str | None]:
    """The outcome each passing event of ``turn_id`` recorded, by its row's edge."""
    by_id = {m.id: (m.src_executor, m.dst_executor) for m in store.edges()}
    return {by_id[e.mnest_id]: e.outcome for e in store.events(turn_id=turn_id)}


# ---------------------------------------------------------------------------- the tracer


def test_the_tracer_marks_an_edge_ok_when_its_destination_returned(
    store: mnestoma.Mnestoma,
) -> None:
    with turn(store, "t1") as t:
        index(parse(fetch("https://example.org/a")))
    assert outcomes(t.passings) == {("fetch", "parse"): "ok", ("parse", "index"): "ok"}
    assert rows(store) == {("fetch", "parse"): (1, 1, 0), ("parse", "index"): (1, 1, 0)}
    assert event_outcomes(store, "t1") == {("fetch", "parse"): "ok", ("parse", "index"): "ok"}


def test_the_tracer_marks_an_edge_error_when_its_destination_raised(
    store: mnestoma.Mnestoma,
) -> None:
    with turn(store, "t1") as t:
        good = fetch("https://example.org/a")
        bad = fetch("https://example.org/broken")
        index(parse(good))
        with pytest.raises(Broken):
            parse(bad)
    # fetch -> parse twice: each call a passing with its own outcome
    assert each_outcome(t.passings) == [
        ("fetch", "parse", "ok"),
        ("parse", "index", "ok"),
        ("fetch", "parse", "error"),
    ]
    assert rows(store) == {("fetch", "parse"): (2, 1, 1), ("parse", "index"): (1, 1, 0)}


def test_each_edge_of_a_turn_takes_the_outcome_of_its_own_destination(
    store: mnestoma.Mnestoma,
) -> None:
    with turn(store, "t1") as t:
        page = fetch("https://example.org/broken")
        index(page)  # returns
        with pytest.raises(Broken):
            parse(page)  # raises, on the same output
    assert outcomes(t.passings) == {("fetch", "index"): "ok", ("fetch", "parse"): "error"}
    assert rows(store) == {("fetch", "index"): (1, 1, 0), ("fetch", "parse"): (1, 0, 1)}


def test_async_executors_are_marked_ok_and_error(store: mnestoma.Mnestoma) -> None:
    async def main() -> list[Passing]:
        async with turn(store, "t1") as t:
            good = await afetch("https://example.org/a")
            bad = await afetch("https://example.org/broken")
            await aparse(good)
            with pytest.raises(Broken):
                await aparse(bad)  # the same edge: the last call decides
            index(await aparse(good))
        return t.passings

    passings = asyncio.run(main())
    assert each_outcome(passings) == [
        ("afetch", "aparse", "ok"),
        ("afetch", "aparse", "error"),
        ("afetch", "aparse", "ok"),
        ("aparse", "index", "ok"),
    ]
    assert rows(store) == {("afetch", "aparse"): (3, 2, 1), ("aparse", "index"): (1, 1, 0)}


def test_an_async_executor_that_raised_last_is_an_error(store: mnestoma.Mnestoma) -> None:
    async def main() -> list[Passing]:
        async with turn(store, "t1") as t:
            html = await afetch("https://example.org/broken")
            await asyncio.gather(aparse(html), return_exceptions=True)
        return t.passings

    assert outcomes(asyncio.run(main())) == {("afetch", "aparse"): "error"}
    assert rows(store) == {("afetch", "aparse"): (1, 0, 1)}


def test_methods_are_marked_sync_and_async(store: mnestoma.Mnestoma) -> None:
    flaky = Flaky(failures=1)

    async def main() -> list[Passing]:
        async with turn(store, "t1") as t:
            html = await afetch("https://example.org/a")
            with pytest.raises(Broken):
                flaky.convert(html)  # fails once
            await flaky.aconvert(html)  # then succeeds, through the async method
        return t.passings

    assert outcomes(asyncio.run(main())) == {
        ("afetch", "flaky.convert"): "error",
        ("afetch", "flaky.aconvert"): "ok",
    }
    assert rows(store) == {
        ("afetch", "flaky.convert"): (1, 0, 1),
        ("afetch", "flaky.aconvert"): (1, 1, 0),
    }


@pytest.mark.parametrize(("failures", "expected"), [(2, "ok"), (3, "error")])
def test_each_retried_call_counts_with_its_own_outcome(
    store: mnestoma.Mnestoma, failures: int, expected: str
) -> None:
    flaky = Flaky(failures=failures)
    with turn(store, "t1") as t:
        html = fetch("https://example.org/a")
        for _ in range(3):  # fails `failures` times of 3, retried each time
            try:
                flaky.convert(html)
                break
            except Broken:
                continue
    calls = min(failures + 1, 3)
    ok = 1 if expected == "ok" else 0
    assert [p.outcome for p in t.passings] == ["error"] * failures + ["ok"] * ok
    assert rows(store) == {("fetch", "flaky.convert"): (calls, ok, calls - ok)}
    assert [e.outcome for e in store.events(turn_id="t1")] == ["error"] * failures + ["ok"] * ok
    assert [e.occurrence for e in store.events(turn_id="t1")] == list(range(1, calls + 1))


def test_a_turn_ending_by_an_exception_records_its_outcomes(store: mnestoma.Mnestoma) -> None:
    boom = Broken("the whole turn failed")

    @executor("explode", "1")
    def explode(doc: Any) -> None:
        raise boom

    with pytest.raises(Broken) as raised, turn(store, "t1") as t:
        explode(parse(fetch("https://example.org/a")))
    assert raised.value is boom  # unchanged
    assert outcomes(t.passings) == {("fetch", "parse"): "ok", ("parse", "explode"): "error"}
    assert rows(store) == {("fetch", "parse"): (1, 1, 0), ("parse", "explode"): (1, 0, 1)}
    assert event_outcomes(store, "t1") == {("fetch", "parse"): "ok", ("parse", "explode"): "error"}


def test_a_wished_proto_has_no_outcome(store: mnestoma.Mnestoma) -> None:
    with turn(store, "t1") as t:
        html = fetch("https://example.org/a")
        parse(html)
        [proto] = wish("html.to_markdown", consumed=html, desired_sig={"out": "markdown"})
    assert proto.outcome is None
    assert outcomes(t.passings) == {("fetch", "parse"): "ok", ("fetch", "html.to_markdown"): None}
    assert rows(store) == {("fetch", "parse"): (1, 1, 0), ("fetch", "html.to_markdown"): (1, 0, 0)}
    assert event_outcomes(store, "t1") == {
        ("fetch", "parse"): "ok",
        ("fetch", "html.to_markdown"): None,
    }


def test_an_edge_is_unknown_while_its_destination_runs(store: mnestoma.Mnestoma) -> None:
    seen: list[Passing] = []

    @executor("watch", "1")
    def watch(html: str) -> str:
        t = current_turn()
        assert t is not None
        seen.extend(t.passings)
        return "watched"

    with turn(store, "t1") as t:
        watch(fetch("https://example.org/a"))
    assert outcomes(seen) == {("fetch", "watch"): None}
    assert outcomes(t.passings) == {("fetch", "watch"): "ok"}


def test_a_cancelled_call_leaves_the_outcome_unknown(store: mnestoma.Mnestoma) -> None:
    # cancellation comes from outside the executor: it says nothing of how B would have done
    @executor("wait", "1")
    async def wait(html: str) -> str:
        await asyncio.Event().wait()
        return html

    async def main() -> list[Passing]:
        async with turn(store, "t1") as t:
            html = await afetch("https://example.org/a")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(wait(html), timeout=0.01)
        return t.passings

    assert outcomes(asyncio.run(main())) == {("afetch", "wait"): None}
    assert rows(store) == {("afetch", "wait"): (1, 0, 0)}
    assert event_outcomes(store, "t1") == {("afetch", "wait"): None}


def test_outcomes_add_up_over_turns_and_leave_weight_and_uses_alone(
    store: mnestoma.Mnestoma,
) -> None:
    for n, url in enumerate(["a", "broken", "b", "broken-too", "c"]):
        with turn(store, f"t{n}"), contextlib.suppress(Broken):
            parse(fetch(f"https://example.org/{url}"))
    row = store.find("fetch", "1", "parse", "1")
    assert row is not None and (row.uses, row.ok_count, row.error_count) == (5, 3, 2)

    # the same five passings with no outcome at all reach the same weight
    for n in range(5):
        store.record_turn(f"u{n}", [Passing("fetch", "1", "parse.plain", "1")])
    plain = store.find("fetch", "1", "parse.plain", "1")
    assert plain is not None and (plain.uses, plain.ok_count, plain.error_count) == (5, 0, 0)
    assert row.weight == pytest.approx(plain.weight)


def test_the_background_writer_carries_the_outcomes(store: mnestoma.Mnestoma) -> None:
    with BackgroundWriter(store) as writer:
        for n, url in enumerate(["a", "broken", "b"]):
            with turn(store, f"t{n}", writer=writer) as t, contextlib.suppress(Broken):
                parse(fetch(f"https://example.org/{url}"))
            assert outcomes(t.passings) == {("fetch", "parse"): "error" if n == 1 else "ok"}
        assert writer.flush(30)
    assert rows(store) == {("fetch", "parse"): (3, 2, 1)}
    assert [e.outcome for e in store.events(turn_id="t1")] == ["error"]
    assert [e.outcome for e in store.events(turn_id="t2")] == ["ok"]


# ---------------------------------------------------------------------------- OpenTelemetry


def tool_span(
    tracer: Tracer,
    name: str,
    arguments: Any = None,
    result: Any = None,
    *,
    status: StatusCode = StatusCode.UNSET,
) -> None:
    """A GenAI execute_tool span that ends with ``status`` (UNSET: as instrumentations leave
    a call that succeeded)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if arguments is not None:
        attributes["gen_ai.tool.call.arguments"] = json.dumps(arguments)
    if result is not None:
        attributes["gen_ai.tool.call.result"] = json.dumps(result)
    with tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes) as span:
        if status is not StatusCode.UNSET:
            span.set_status(Status(status))


def otel_rows(store: mnestoma.Mnestoma) -> dict[str, tuple[int, int, int]]:
    """Each row's destination and its (uses, ok_count, error_count)."""
    return {m.dst_executor: (m.uses, m.ok_count, m.error_count) for m in store.edges()}


def otel_events(store: mnestoma.Mnestoma) -> dict[str, str | None]:
    """The outcome each event recorded, by its row's destination."""
    by_id = {m.id: m.dst_executor for m in store.edges()}
    return {by_id[e.mnest_id]: e.outcome for e in store.events()}


@pytest.mark.parametrize(
    ("status", "expected"),
    [(StatusCode.ERROR, "error"), (StatusCode.OK, "ok"), (StatusCode.UNSET, "ok")],
)
def test_the_destination_span_status_is_the_outcome(
    setup: Setup, store: mnestoma.Mnestoma, status: StatusCode, expected: str
) -> None:
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        tool_span(tracer, "fs.read", {"path": "a/report.pdf"}, status=status)
    assert processor.force_flush(10_000)
    ok = 1 if expected == "ok" else 0
    assert otel_rows(store) == {"fs.read": (1, ok, 1 - ok)}
    assert otel_events(store) == {"fs.read": expected}


def test_a_source_span_s_error_is_not_the_edge_s(setup: Setup, store: mnestoma.Mnestoma) -> None:
    # the outcome is what followed the passing, at its destination
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search", {"q": "pdf"}, ["a/report.pdf"], status=StatusCode.ERROR)
        tool_span(tracer, "fs.read", {"path": "a/report.pdf"}, "Revenue grew in every region")
        tool_span(tracer, "pdf.text", {"text": "Revenue grew in every region"}, "x" * 8)
    assert processor.force_flush(10_000)
    assert otel_rows(store) == {"fs.read": (1, 1, 0), "pdf.text": (1, 1, 0)}


def test_an_exception_escaping_a_tool_span_is_an_error(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "fs.read",
            "gen_ai.tool.call.arguments": json.dumps({"path": "a/report.pdf"}),
        }
        with (
            pytest.raises(OSError),
            tracer.start_as_current_span("execute_tool fs.read", attributes=attributes),
        ):
            raise OSError("permission denied")  # the SDK sets the span's status to ERROR
    assert processor.force_flush(10_000)
    assert otel_events(store) == {"fs.read": "error"}


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [((StatusCode.ERROR, StatusCode.UNSET), "ok"), ((StatusCode.OK, StatusCode.ERROR), "error")],
)
def test_each_call_along_an_edge_counts_its_own_outcome(
    setup: Setup, store: mnestoma.Mnestoma, statuses: tuple[StatusCode, ...], expected: str
) -> None:
    processor, tracer = setup(store)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        for status in statuses:  # fs.read retried on the same path
            tool_span(tracer, "fs.read", {"path": "a/report.pdf"}, status=status)
    assert processor.force_flush(10_000)
    said = ["error" if s == StatusCode.ERROR else "ok" for s in statuses]
    assert said[-1] == expected
    assert otel_rows(store) == {"fs.read": (2, said.count("ok"), said.count("error"))}
    assert [e.outcome for e in store.events()] == said
    assert [e.occurrence for e in store.events()] == [1, 2]


def test_sequence_only_edges_have_no_outcome(setup: Setup, store: mnestoma.Mnestoma) -> None:
    processor, tracer = setup(store, sequence_edges=True)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search")  # no content captured: linked by order only
        tool_span(tracer, "fs.read", status=StatusCode.ERROR)
        tool_span(tracer, "pdf.text", status=StatusCode.OK)
    assert processor.force_flush(10_000)
    assert otel_rows(store) == {"fs.read": (1, 0, 0), "pdf.text": (1, 0, 0)}
    assert otel_events(store) == {"fs.read": None, "pdf.text": None}
    assert all(m.tags == {"basis": "sequence"} for m in store.edges())


def test_a_content_edge_keeps_its_outcome_beside_sequence_edges(
    setup: Setup, store: mnestoma.Mnestoma
) -> None:
    processor, tracer = setup(store, sequence_edges=True)
    with tracer.start_as_current_span("turn"):
        tool_span(tracer, "fs.search", {"pattern": "*.pdf"}, ["a/report.pdf"])
        tool_span(tracer, "fs.read", {"path": "a/report.pdf"}, status=StatusCode.ERROR)
        tool_span(tracer, "pdf.text")  # no content: a sequence edge from fs.read
    assert processor.force_flush(10_000)
    assert otel_events(store) == {"fs.read": "error", "pdf.text": None}
    tags = {m.dst_executor: m.tags for m in store.edges()}
    assert tags == {"fs.read": None, "pdf.text": {"basis": "sequence"}}
