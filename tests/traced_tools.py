"""Tools wrapped by the in-process tracer's ``executor`` (every one at version 1), as the
tracer's tests share them: one that finds files, one that reads what it is given, and the
same two as coroutines."""

from __future__ import annotations

import asyncio

from mnestoma.recording.tracing import executor


@executor("search", "1")
def search(pattern: str) -> list[str]:
    return [f"/docs/report-{pattern}.pdf", f"/docs/summary-{pattern}.pdf"]


@executor("read", "1")
def read(path: str) -> str:
    return f"contents of {path}"


@executor("asearch", "1")
async def asearch(pattern: str) -> list[str]:
    await asyncio.sleep(0)
    return [f"/docs/async-{pattern}.pdf"]


@executor("aread", "1")
async def aread(path: str) -> str:
    await asyncio.sleep(0)
    return f"async contents of {path}"
