"""The in-process tracer (contract §8): lineage, turns, bounds, concurrency, the writer."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import gc
import json
import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import REPO
from sqlalchemy import create_engine, text
from traced_tools import aread, asearch, read, search

import mnestoma
from mnestoma import InvalidInput, Passing, StoreError
from mnestoma.recording.tracing import (
    BackgroundWriter,
    current_turn,
    executor,
    propagate,
    stats,
    turn,
    wish,
)

# ---------------------------------------------------------------------------- fixtures


class FakeStore:
    """Records what the tracer hands to ``record_turn``; fails on demand."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, list[Passing], str]] = []
        self.fail = fail

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str = "call") -> list[Any]:
        if self.fail is not None:
            raise self.fail
        self.calls.append((turn_id, list(passings), recorder))
        return []


class BlockingStore(FakeStore):
    """A store whose writes wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def record_turn(self, turn_id: str, passings: Any, *, recorder: str = "call") -> list[Any]:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().record_turn(turn_id, passings, recorder=recorder)


class AsyncFakeStore:
    """An asynchronous store (like mnestoma.aio.AsyncMnestoma): record_turn is awaited."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Passing], str]] = []

    async def record_turn(
        self, turn_id: str, passings: Any, *, recorder: str = "call"
    ) -> list[Any]:
        self.calls.append((turn_id, list(passings), recorder))
        return []


@pytest.fixture
def fake() -> FakeStore:
    return FakeStore()


def edge(src: str, dst: str, outcome: str | None = "ok") -> Passing:
    """The active passing ``src@1 → dst@1`` (every test executor is at version 1), with the
    outcome of the destination's call: "ok" unless it raised."""
    return Passing(src, "1", dst, "1", outcome=outcome)


@executor("summarise", "1")
def summarise(*texts: Any, **options: Any) -> str:
    return "summary: " + " | ".join(map(str, texts)) + json.dumps(options, default=str)


@executor("store", "1")
def store_value(value: Any) -> Any:
    return value


@executor("make", "1")
def make(value: Any) -> Any:
    return value


@executor("page", "1")
def page(cursor: Any) -> dict[str, Any]:
    n = 0 if cursor is None else cursor["next"]
    return {"items": [f"item-{n}-{i}" for i in range(3)], "next": n + 2000}


# ---------------------------------------------------------------------------- outside a turn


def test_outside_a_turn_an_executor_is_a_plain_call() -> None:
    assert current_turn() is None
    assert search("x") == ["/docs/report-x.pdf", "/docs/summary-x.pdf"]
    assert read("/a/b") == "contents of /a/b"
    assert wish("missing.tool", consumed="anything at all") == []


def test_the_decorator_keeps_the_wrapped_function_s_name_and_doc() -> None:
    @executor("doc.tool", "3")
    def documented(x: int) -> int:
        """Doubles."""
        return 2 * x

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Doubles."
    assert documented.__wrapped__(4) == 8  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "version"), [("", "1"), ("x", " "), ("a\x00b", "1"), (3, "1")])
def test_bad_executor_names_are_refused_at_decoration(name: Any, version: Any) -> None:
    with pytest.raises(InvalidInput):
        executor(name, version)


def test_a_bad_turn_id_is_refused(fake: FakeStore) -> None:
    with pytest.raises(InvalidInput):
        turn(fake, "")


# ---------------------------------------------------------------------------- lineage


def test_identity_links_the_producer_to_the_consumer(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        read(files[0])
    assert t.passings == [edge("search", "read")]
    assert fake.calls == [("t", [edge("search", "read")], "tracer")]


def test_content_links_across_a_json_round_trip(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        copied = json.loads(json.dumps(files))
        assert copied[1] is not files[1]
        read(copied[1])
    assert t.passings == [edge("search", "read")]


def test_content_links_a_json_text_argument_to_the_output_it_serialises(
    fake: FakeStore,
) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        summarise(json.dumps({"files": files}))
    assert t.passings == [edge("search", "summarise")]


def test_content_links_bytes_to_the_text_they_encode(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        body = read("/a/report.pdf")
        store_value(body.encode("utf-8"))
    assert t.passings == [edge("read", "store")]


def test_content_links_an_integral_float_to_the_int(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        make(123456)
        store_value(float(json.loads("123456")))
    assert t.passings == [edge("make", "store")]


def test_elements_of_nested_arguments_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        summarise(options={"batch": [("first", files[0])]})
    assert t.passings == [edge("search", "summarise")]


def test_elements_of_set_arguments_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        summarise(frozenset({files[1], "/not/produced.pdf"}))
    assert t.passings == [edge("search", "summarise")]


def test_elements_of_nested_outputs_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        hits = make({"hits": [{"path": "/x/deep-file.pdf"}]})
        read("".join(["/x/", "deep-file.pdf"]))  # an equal string, not the same object
        assert hits is not None
    assert t.passings == [edge("make", "read")]


def test_dataclass_fields_of_an_output_link(fake: FakeStore) -> None:
    @dataclasses.dataclass
    class Document:
        path: str
        body: str

    with turn(fake, "t") as t:
        doc = make(Document("/x/a.pdf", "the body text"))
        read(doc.body)
    assert t.passings == [edge("make", "read")]


def test_values_deeper_than_the_bound_do_not_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        make({"a": {"b": {"c": {"d": "far too deep to remember"}}}})
        read("far too deep to remember")
        assert t.passings == []
        make({"a": {"b": {"c": "three levels is remembered"}}})
        read("three levels is remembered")
    assert t.passings == [edge("make", "read")]
    assert len(fake.calls) == 1


def test_keyword_arguments_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        read(path=files[1])
    assert t.passings == [edge("search", "read")]


def test_an_output_nobody_consumed_records_nothing(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        search("q")
        read("/some/other/file.pdf")
    assert t.passings == []
    assert fake.calls == []  # nothing to record: the store is not even called


def test_running_after_another_without_receiving_its_output_records_nothing(
    fake: FakeStore,
) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        read("/unrelated/path.pdf")
        read(files[0])
    assert t.passings == [edge("search", "read")]


def test_a_call_never_links_to_itself(fake: FakeStore) -> None:
    acc: list[str] = ["accumulated value"]
    with turn(fake, "t") as t:
        store_value(acc)  # returns its own argument: no earlier call produced it
    assert t.passings == []


def test_a_later_call_of_the_same_executor_records_a_to_a(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        first = page(None)
        page(first)
    assert t.passings == [edge("page", "page")]


def test_each_call_is_a_passing_an_edge_listed_as_often_as_it_passed(fake: FakeStore) -> None:
    """Contract §13: the store numbers the repeats of an edge in a turn as occurrences."""
    with turn(fake, "t") as t:
        files = search("q")
        read(files[0])
        read(files[1])
        read(files[0])
    assert t.passings == [edge("search", "read")] * 3
    assert fake.calls[0][1] == [edge("search", "read")] * 3


def test_a_call_receiving_two_outputs_links_both_producers(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        body = read("/elsewhere/file.pdf")
        summarise(files, body)
    assert t.passings == [edge("search", "summarise"), edge("read", "summarise")]


def test_the_most_recent_producer_of_a_value_is_its_source(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        same = make(files)  # `make` returned the very object `search` returned
        read(same[0])
    assert t.passings == [edge("search", "make"), edge("make", "read")]


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 7, 1024, -1024, 0.5, float("nan"), "", "ok", "abc", b"ab", [], {}, ()],
)
def test_trivial_values_never_link(fake: FakeStore, value: Any) -> None:
    with turn(fake, "t") as t:
        make(value)
        store_value(value)
        store_value(json.loads(json.dumps(value)) if not isinstance(value, bytes) else value)
    assert t.passings == []


def test_numbers_beyond_the_trivial_range_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        make(1025)
        store_value(int("1025"))
    assert t.passings == [edge("make", "store")]


def test_different_types_with_the_same_text_do_not_link(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        make(123456)
        store_value("123456")
    assert t.passings == []


def test_an_object_links_by_identity_only(fake: FakeStore) -> None:
    class Handle:
        def __init__(self, name: str) -> None:
            self.name = name

    with turn(fake, "t") as t:
        h = make(Handle("connection-1"))
        store_value(Handle("connection-1"))  # an equal-looking object: no link
        assert t.passings == []
        store_value(h)
    assert t.passings == [edge("make", "store")]


# ---------------------------------------------------------------------------- wish


def test_wish_records_a_proto_from_the_producer_of_what_it_consumed(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        body = read("/a/report.pdf")
        made = wish("pdf.to_text", consumed=body, desired_sig={"summary": "PDF to text"})
    proto = Passing("read", "1", "pdf.to_text", None, False, None, {"summary": "PDF to text"})
    assert made == [proto]
    assert t.passings == [proto]
    assert fake.calls == [("t", [proto], "tracer")]


def test_wish_of_a_value_no_call_produced_records_nothing(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        read("/a/report.pdf")
        assert wish("pdf.to_text", consumed="a value from nowhere") == []
    assert t.passings == []


def test_wish_keeps_its_own_copy_of_the_desired_signature(fake: FakeStore) -> None:
    sig: dict[str, Any] = {"summary": "first"}
    with turn(fake, "t") as t:
        wish("pdf.to_text", consumed=read("/a/report.pdf"), desired_sig=sig)
        sig["summary"] = "changed afterwards"
    assert t.passings[0].desired_sig == {"summary": "first"}


def test_wish_refuses_a_desired_signature_that_is_not_json(fake: FakeStore) -> None:
    with turn(fake, "t"), pytest.raises(InvalidInput):
        wish("pdf.to_text", consumed=read("/a/report.pdf"), desired_sig={"f": object()})


def test_each_wish_is_a_passing_with_its_own_desired_signature(fake: FakeStore) -> None:
    """Two wishes are two occurrences of the proto's edge; the store keeps the last one's
    signature."""
    with turn(fake, "t") as t:
        body = read("/a/report.pdf")
        wish("pdf.to_text", consumed=body, desired_sig={"summary": "v1"})
        wish("pdf.to_text", consumed=body, desired_sig={"summary": "v2"})
    assert [p.desired_sig for p in t.passings] == [{"summary": "v1"}, {"summary": "v2"}]


# ---------------------------------------------------------------------------- end of a turn


def test_an_exception_propagates_unchanged_and_the_passings_so_far_are_recorded(
    fake: FakeStore,
) -> None:
    boom = RuntimeError("the tool broke")

    @executor("explode", "1")
    def explode(value: Any) -> None:
        raise boom

    with pytest.raises(RuntimeError) as caught, turn(fake, "t") as t:
        explode(search("q"))  # explode received search's output before it raised
    assert caught.value is boom
    assert t.passings == [edge("search", "explode", "error")]  # with the outcome of the raise
    assert fake.calls == [("t", [edge("search", "explode", "error")], "tracer")]


def test_a_store_failure_is_logged_and_counted_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = FakeStore(fail=StoreError("disk full"))
    before = stats.snapshot()["store_failures"]
    with (
        caplog.at_level(logging.WARNING, logger="mnestoma.tracing"),
        turn(broken, "t") as t,
    ):
        read(search("q")[0])
    assert t.store_failures == 1
    assert isinstance(t.error, StoreError)
    assert stats.snapshot()["store_failures"] == before + 1
    assert any(
        r.name == "mnestoma.tracing" and "disk full" in r.getMessage() for r in caplog.records
    )


def test_a_store_failure_is_raised_with_strict() -> None:
    broken = FakeStore(fail=StoreError("disk full"))
    with pytest.raises(StoreError, match="disk full"), turn(broken, "t", strict=True):
        read(search("q")[0])


def test_a_foreign_store_failure_is_raised_as_a_store_error_with_strict() -> None:
    broken = FakeStore(fail=OSError("socket closed"))
    with pytest.raises(StoreError, match="socket closed") as caught:  # noqa: SIM117
        with turn(broken, "t", strict=True):
            read(search("q")[0])
    assert isinstance(caught.value.__cause__, OSError)


def test_with_strict_the_traced_code_s_exception_still_wins() -> None:
    broken = FakeStore(fail=StoreError("disk full"))
    with pytest.raises(KeyError), turn(broken, "t", strict=True) as t:
        read(search("q")[0])
        raise KeyError("from the traced code")
    assert t.store_failures == 1


def test_the_store_is_called_once_per_turn(fake: FakeStore) -> None:
    with turn(fake, "t"):
        for n in range(5):
            read(search(f"q{n}")[0])
    assert len(fake.calls) == 1
    assert fake.calls[0][1] == [edge("search", "read")] * 5


def test_a_turn_object_is_entered_once(fake: FakeStore) -> None:
    t = turn(fake, "t")
    with t:
        pass
    with pytest.raises(InvalidInput), t:
        pass


def test_nested_turns_record_separately(fake: FakeStore) -> None:
    with turn(fake, "outer") as outer:
        files = search("q")
        with turn(fake, "inner") as inner:
            body = read(search("r")[0])
        assert current_turn() is outer
        summarise(files, body)  # body was produced inside the inner turn: unknown here
    assert inner.passings == [edge("search", "read")]
    assert outer.passings == [edge("search", "summarise")]


def test_after_the_turn_the_values_are_released(fake: FakeStore) -> None:
    class Blob:
        pass

    with turn(fake, "t") as t:
        ref = weakref.ref(make(Blob()))
        gc.collect()
        assert ref() is not None  # held for identity matching while the turn runs
        assert t.remembered == 1
    gc.collect()
    assert ref() is None
    assert t.remembered == 0


# ---------------------------------------------------------------------------- bounds


def test_past_the_cap_the_oldest_outputs_are_forgotten_and_counted(fake: FakeStore) -> None:
    before = stats.snapshot()["forgotten"]
    with turn(fake, "t", max_outputs=2) as t:
        oldest = make("the first output of all")
        read("/a/second-output.pdf")
        search("third")
        assert t.forgotten == 1
        assert t.remembered == 2
        store_value(oldest)  # forgotten: no edge
        assert t.passings == []
        summarise(read("/b/kept.pdf"))  # recent outputs still link
    assert t.passings == [edge("read", "summarise")]
    assert stats.snapshot()["forgotten"] >= before + 2


def test_a_forgotten_output_does_not_hide_a_newer_producer_of_the_same_value(
    fake: FakeStore,
) -> None:
    with turn(fake, "t", max_outputs=2) as t:
        value = make("shared value here")
        search("x")
        read_again = store_value(value)  # 'store' now produced it too (make is forgotten)
        assert t.forgotten == 1
        summarise(read_again)
    assert t.passings == [edge("make", "store"), edge("store", "summarise")]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_the_cap_must_be_a_positive_integer(fake: FakeStore, bad: Any) -> None:
    with pytest.raises(InvalidInput):
        turn(fake, "t", max_outputs=bad)


def test_a_huge_output_is_remembered_up_to_the_node_bound(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        listing = make([f"/files/entry-{i:05d}" for i in range(10_000)])
        read(listing[10])
        store_value(listing[9_999])  # beyond MAX_NODES: not remembered by this output
    assert t.passings == [edge("make", "read")]


def test_past_the_passing_cap_new_passings_are_counted_not_kept(
    fake: FakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mnestoma.tracing.MAX_PASSINGS", 2)
    before = stats.snapshot()["unrecorded"]
    with turn(fake, "t") as t:
        files = search("q")
        read(files[0])
        summarise(files[0])
        store_value(files[0])  # a third passing: over the cap
        assert wish("pdf.to_text", consumed=files[0]) == []
        read(files[1])  # a repeat of a kept edge is a passing too: over the cap
    assert t.passings == [edge("search", "read"), edge("search", "summarise")]
    assert t.unrecorded == 3
    assert stats.snapshot()["unrecorded"] == before + 3


def test_an_argument_the_tracer_cannot_inspect_does_not_break_the_call(
    fake: FakeStore,
) -> None:
    class Hostile(dict[str, Any]):
        def values(self) -> Any:
            raise RuntimeError("no values for you")

    before = stats.snapshot()["tracer_errors"]
    with turn(fake, "t") as t:
        search("q")
        assert store_value(Hostile(a=1)) == {"a": 1}
    assert t.tracer_errors == 2  # as an argument, then as the returned value
    assert stats.snapshot()["tracer_errors"] == before + 2


# ---------------------------------------------------------------------------- callables


def test_methods_static_and_class_methods_are_executors(fake: FakeStore) -> None:
    class Tools:
        def __init__(self) -> None:
            self.prefix = "/srv"

        @executor("tools.find", "1")
        def find(self, name: str) -> str:
            return f"{self.prefix}/{name}.txt"

        @executor("tools.open", "1")
        @staticmethod
        def open_(path: str) -> str:
            return f"opened {path}"

        @classmethod
        @executor("tools.close", "1")
        def close(cls, handle: str) -> str:
            return f"closed {handle}"

    tools = Tools()
    with turn(fake, "t") as t:
        handle = Tools.open_(tools.find("notes"))
        tools.close(handle)
    assert t.passings == [
        Passing("tools.find", "1", "tools.open", "1", outcome="ok"),
        Passing("tools.open", "1", "tools.close", "1", outcome="ok"),
    ]


def test_wrapping_an_existing_callable_makes_it_an_executor(fake: FakeStore) -> None:
    def plain_reader(path: str) -> str:
        return f"plain contents of {path}"

    class Upper:
        def __call__(self, value: str) -> str:
            return value.upper()

    traced_read = executor("fs.read", "2.0")(plain_reader)
    traced_upper = executor("text.upper", "1.0")(Upper())
    traced_len = executor("builtin.len", "3.11")(len)
    with turn(fake, "t") as t:
        body = traced_read(search("q")[0])
        loud = traced_upper(body)
        traced_len(loud)
    assert t.passings == [
        Passing("search", "1", "fs.read", "2.0", outcome="ok"),
        Passing("fs.read", "2.0", "text.upper", "1.0", outcome="ok"),
        Passing("text.upper", "1.0", "builtin.len", "3.11", outcome="ok"),
    ]


# ---------------------------------------------------------------------------- async


def test_async_executors_inside_async_with(fake: FakeStore) -> None:
    async def main() -> Any:
        async with turn(fake, "t") as t:
            files = await asearch("q")
            await aread(files[0])
        return t

    t = asyncio.run(main())
    assert t.passings == [edge("asearch", "aread")]
    assert fake.calls == [("t", [edge("asearch", "aread")], "tracer")]


def test_async_methods_are_executors(fake: FakeStore) -> None:
    class Client:
        @executor("client.get", "1")
        async def get(self, url: str) -> dict[str, str]:
            await asyncio.sleep(0)
            return {"body": f"<html>{url}</html>"}

    client = Client()

    async def main() -> Any:
        async with turn(fake, "t") as t:
            page = await client.get("https://example.org/start")
            await client.get(page["body"])
        return t

    assert asyncio.run(main()).passings == [edge("client.get", "client.get")]


def test_outside_a_turn_an_async_executor_is_a_plain_call() -> None:
    assert asyncio.run(aread("/x")) == "async contents of /x"


def test_an_async_callable_object_is_awaited(fake: FakeStore) -> None:
    class AsyncTool:
        async def __call__(self, value: str) -> str:
            return value + " (processed)"

    tool = executor("async.tool", "1")(AsyncTool())

    async def main() -> Any:
        async with turn(fake, "t") as t:
            await tool(read("/a/b.pdf"))
        return t

    assert asyncio.run(main()).passings == [edge("read", "async.tool")]


def test_asyncio_tasks_see_the_turn(fake: FakeStore) -> None:
    async def main() -> Any:
        async with turn(fake, "t") as t:
            files = await asyncio.create_task(asearch("q"))
            await asyncio.gather(*(aread(f) for f in files), asyncio.create_task(aread(files[0])))
        return t

    assert asyncio.run(main()).passings == [edge("asearch", "aread")] * 2  # a call each


def test_to_thread_sees_the_turn(fake: FakeStore) -> None:
    async def main() -> Any:
        async with turn(fake, "t") as t:
            files = await asyncio.to_thread(search, "q")
            await asyncio.to_thread(read, files[0])
        return t

    assert asyncio.run(main()).passings == [edge("search", "read")]


def test_an_exception_propagates_out_of_async_with(fake: FakeStore) -> None:
    boom = ValueError("async boom")

    async def main() -> None:
        async with turn(fake, "t"):
            await aread((await asearch("q"))[0])
            raise boom

    with pytest.raises(ValueError) as caught:
        asyncio.run(main())
    assert caught.value is boom
    assert fake.calls == [("t", [edge("asearch", "aread")], "tracer")]


def test_an_async_store_is_awaited_and_refused_by_a_plain_with() -> None:
    astore = AsyncFakeStore()

    async def main() -> None:
        async with turn(astore, "t"):
            read(search("q")[0])

    asyncio.run(main())
    assert astore.calls == [("t", [edge("search", "read")], "tracer")]
    with pytest.raises(InvalidInput, match="async with"), turn(astore, "t2"):
        pass


# ---------------------------------------------------------------------------- threads


def test_a_plain_thread_pool_does_not_see_the_turn(fake: FakeStore) -> None:
    with turn(fake, "t") as t, ThreadPoolExecutor(2) as pool:
        files = search("q")
        pool.submit(read, files[0]).result()
    assert t.passings == []  # documented: use propagate()


def test_propagate_carries_the_turn_into_a_thread_pool(fake: FakeStore) -> None:
    with turn(fake, "t") as t, ThreadPoolExecutor(4) as pool:
        files = search("q")
        bodies = list(pool.map(propagate(read), files * 10))
        pool.submit(propagate(summarise), bodies[0]).result()
    assert t.passings[:-1] == [edge("search", "read")] * len(files) * 10
    assert t.passings[-1] == edge("read", "summarise")


def test_run_in_executor_with_propagate_sees_the_turn(fake: FakeStore) -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        async with turn(fake, "t") as t:
            files = await loop.run_in_executor(None, propagate(search), "q")
            await loop.run_in_executor(None, propagate(read), files[0])
        return t

    assert asyncio.run(main()).passings == [edge("search", "read")]


def test_copy_context_run_is_the_manual_equivalent(fake: FakeStore) -> None:
    with turn(fake, "t") as t, ThreadPoolExecutor(1) as pool:
        files = search("q")
        ctx = contextvars.copy_context()
        pool.submit(ctx.run, read, files[0]).result()
    assert t.passings == [edge("search", "read")]


def test_many_threads_in_one_turn_keep_its_state_whole(fake: FakeStore) -> None:
    names = [f"worker.{i}" for i in range(8)]
    workers = [executor(name, "1")(lambda value: [value, "x" * 8]) for name in names]

    def chain(start: int) -> None:
        value: Any = f"seed value {start}"
        for k in range(200):
            value = workers[(start + k) % 8](value)

    with turn(fake, "t", max_outputs=8 * 200) as t, ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(propagate(chain), i) for i in range(8)]:
            f.result()
    expected = {edge(names[i], names[(i + 1) % 8]) for i in range(8)}
    assert set(t.passings) == expected
    assert len(t.passings) == 8 * 199  # every call along each chain, despite the races


def test_the_cap_holds_when_many_threads_return_at_once(fake: FakeStore) -> None:
    def produce(start: int) -> None:
        for k in range(300):
            make(f"value {start} {k}")

    with turn(fake, "t", max_outputs=64) as t, ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(propagate(produce), i) for i in range(8)]:
            f.result()
        assert t.remembered == 64
    assert t.forgotten == 8 * 300 - 64


def test_calls_after_the_turn_ended_are_not_recorded(fake: FakeStore) -> None:
    with turn(fake, "t") as t:
        files = search("q")
        late = propagate(read)
    late(files[0])  # a pool task that outlived its turn
    assert t.passings == []
    assert fake.calls == []


# ---------------------------------------------------------------------------- writer


def test_the_background_writer_flushes_every_turn(fake: FakeStore) -> None:
    with BackgroundWriter(fake, maxsize=16) as writer:
        for n in range(5):
            with turn(None, f"t{n}", writer=writer) as t:
                read(search(f"q{n}")[0])
            assert t.mnests == []  # written later, off the request's latency
        assert writer.flush(timeout=30)
        assert writer.written == 5
    assert [c[0] for c in fake.calls] == [f"t{n}" for n in range(5)]
    assert all(c[1] == [edge("search", "read")] and c[2] == "tracer" for c in fake.calls)


def test_closing_the_background_writer_writes_what_is_queued() -> None:
    slow = BlockingStore()
    writer = BackgroundWriter(slow, maxsize=8)
    for n in range(3):
        assert writer.submit(f"t{n}", [edge("a", "b")])
    assert slow.entered.wait(30)
    slow.gate.set()
    assert writer.close(timeout=30)
    assert [c[0] for c in slow.calls] == ["t0", "t1", "t2"]
    assert writer.pending == 0
    assert not writer.submit("late", [edge("a", "b")])  # closed: refused and counted
    assert writer.dropped == 1


def test_a_full_background_writer_drops_and_counts_without_blocking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slow = BlockingStore()
    before = stats.snapshot()["dropped"]
    writer = BackgroundWriter(slow, maxsize=1)
    try:
        with turn(slow, "t0", writer=writer):
            read(search("q")[0])
        assert slow.entered.wait(30)  # t0 is being written; the queue is empty again
        with turn(slow, "t1", writer=writer):
            read(search("q")[0])  # t1 fills the queue
        with caplog.at_level(logging.WARNING, logger="mnestoma.tracing"):
            with turn(slow, "t2", writer=writer) as t2:
                read(search("q")[0])  # t2 does not fit: dropped, the block ends at once
            with pytest.raises(StoreError, match="queue is full"):  # noqa: SIM117
                with turn(slow, "t3", writer=writer, strict=True):
                    read(search("q")[0])
        assert t2.dropped == 1
        assert writer.dropped == 2
        assert stats.snapshot()["dropped"] == before + 2
        assert sum("queue full" in r.getMessage() for r in caplog.records) == 1
    finally:
        slow.gate.set()
        writer.close(timeout=30)
    assert [c[0] for c in slow.calls] == ["t0", "t1"]


def test_a_failing_write_in_the_background_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    broken = FakeStore(fail=StoreError("disk full"))
    with (
        caplog.at_level(logging.WARNING, logger="mnestoma.tracing"),
        BackgroundWriter(broken) as writer,
    ):
        writer.submit("t", [edge("a", "b")])
        assert writer.flush(timeout=30)
    assert writer.failures == 1
    assert writer.written == 0
    assert any("disk full" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "bad", ["10", None, True, [10], -1, -0.5, float("nan"), float("inf"), 1e300]
)
def test_an_exit_timeout_that_is_not_a_finite_number_of_seconds_is_refused(
    fake: FakeStore, bad: Any
) -> None:
    # accepted, it would fail only at interpreter exit, and lose the queued turns
    with pytest.raises(InvalidInput, match="exit_timeout"):
        BackgroundWriter(fake, exit_timeout=bad)


def test_a_turn_with_a_writer_records_to_the_writer_s_store(fake: FakeStore) -> None:
    with BackgroundWriter(fake) as writer, pytest.raises(InvalidInput):
        turn(FakeStore(), "t", writer=writer)


def test_the_background_writer_is_flushed_at_interpreter_exit(tmp_path: Any) -> None:
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from mnestoma.tracing import BackgroundWriter\n"
        "class S:\n"
        "    def record_turn(self, turn_id, passings, *, recorder):\n"
        "        sys.stdout.write(json.dumps([turn_id, len(passings), recorder]) + '\\n')\n"
        "w = BackgroundWriter(S())\n"
        "for n in range(3):\n"
        "    w.submit(f't{n}', [('a', '1', 'b', '1')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        ["t0", 1, "tracer"],
        ["t1", 1, "tracer"],
        ["t2", 1, "tracer"],
    ]


# ---------------------------------------------------------------------------- real store


def run_turn(store: mnestoma.Mnestoma, turn_id: str) -> list[Passing]:
    with turn(store, turn_id) as t:
        files = search("q")
        body = read(json.loads(json.dumps(files))[0])
        wish("pdf.to_text", consumed=body, desired_sig={"summary": "PDF to text"})
    return t.passings


def test_the_store_receives_the_exact_edges_and_tracer_events(store: mnestoma.Mnestoma) -> None:
    run_turn(store, "turn-1")
    rows = {(m.src_executor, m.dst_executor, m.dst_version, m.state): m for m in store.edges()}
    assert set(rows) == {("search", "read", "1", "active"), ("read", "pdf.to_text", None, "proto")}
    assert rows[("read", "pdf.to_text", None, "proto")].desired_sig == {"summary": "PDF to text"}
    assert all(m.uses == 1 and m.weight == pytest.approx(0.30) for m in rows.values())
    events = store.events(turn_id="turn-1")
    assert sorted((e.kind, e.recorder) for e in events) == [
        ("created", "tracer"),
        ("created", "tracer"),
    ]


def test_a_retried_turn_id_counts_once_in_the_store(store: mnestoma.Mnestoma) -> None:
    run_turn(store, "turn-1")
    run_turn(store, "turn-1")  # a retry of the same turn
    assert sorted(m.uses for m in store.edges()) == [1, 1]
    run_turn(store, "turn-2")
    assert sorted(m.uses for m in store.edges()) == [2, 2]
    assert len(store.events(turn_id="turn-1")) == 2
    assert [e.recorder for e in store.events(turn_id="turn-2")] == ["tracer", "tracer"]


def test_a_traced_edge_passed_three_times_counts_three_and_a_rerun_turn_adds_nothing(
    store: mnestoma.Mnestoma,
) -> None:
    def three_reads(turn_id: str) -> None:
        with turn(store, turn_id):
            files = search("q")
            for _ in range(3):
                read(files[0])

    three_reads("turn-1")
    three_reads("turn-1")  # the same turn id again: a retry
    (row,) = store.edges()
    assert (row.src_executor, row.dst_executor, row.uses) == ("search", "read", 3)
    assert [e.occurrence for e in store.events(turn_id="turn-1")] == [1, 2, 3]


def test_the_background_writer_feeds_the_store(store: mnestoma.Mnestoma) -> None:
    with BackgroundWriter(store) as writer:
        for n in range(3):
            with turn(store, f"turn-{n}", writer=writer):
                read(search("q")[0])
    (row,) = store.edges()
    assert (row.src_executor, row.dst_executor, row.uses) == ("search", "read", 3)


def test_nothing_of_the_values_reaches_the_database(
    store: mnestoma.Mnestoma, store_url: str
) -> None:
    marker = "confidential-marker-3141592"
    with turn(store, "turn-1"):
        body = read(search(marker)[0])
        summarise(body, note=marker)
        wish("pdf.to_text", consumed=body)
    assert len(store.edges()) == 3
    engine = create_engine(store_url)
    try:
        with engine.connect() as conn:
            for table in ("mnests", "events"):
                for row in conn.execute(text(f"SELECT * FROM {table}")):
                    assert all(marker not in str(v) for v in row), table
    finally:
        engine.dispose()


def test_async_with_writes_through_the_blocking_store(store: mnestoma.Mnestoma) -> None:
    async def main() -> None:
        async with turn(store, "turn-async"):
            await aread((await asearch("q"))[0])

    asyncio.run(main())
    (row,) = store.edges()
    assert (row.src_executor, row.dst_executor) == ("asearch", "aread")
    assert [e.recorder for e in store.events(turn_id="turn-async")] == ["tracer"]


# ---------------------------------------------------------------------------- benchmark


def test_the_overhead_benchmark_runs_and_reports_every_figure(tmp_path: Any) -> None:
    import sys

    root = REPO
    if str(root) not in sys.path:  # ``benchmarks`` lives at the top of the checkout
        sys.path.insert(0, str(root))
    from benchmarks import tracing_overhead as bench

    figures = bench.measure(rounds=1, calls=200, turns=3)
    assert figures.passings_per_turn == bench.CHAIN  # 7 passings of the chain and a proto
    assert figures.plain_us > 0 and figures.outside_us > 0 and figures.flush_store_us > 0
    assert [v[0] for v in figures.verdicts()] == [
        "outside a turn < 1 µs added",
        "inside a turn < 20 µs per call",
    ]
    out = tmp_path / "figures.json"
    assert bench.main(["--quick", "--rounds", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["calls_per_round"] == 2_000
