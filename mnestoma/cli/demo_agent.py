"""The runtime ``mnestoma demo`` pretends to be: three traced executors over a made-up web.

Nothing here calls ``record_passing``: the executors are decorated with
:func:`mnestoma.tracing.executor`, each turn runs inside :func:`mnestoma.tracing.turn`, and
the tracer records which executor received what another returned. The "web" is a dict, so
the demo needs no network and no optional dependency.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from mnestoma.recording.tracing import Turn, executor, turn, wish

__all__ = ["DEMO_TURNS", "PDF_SIG", "DemoTurn", "run_demo_turn"]

PDF_SIG: dict[str, Any] = {
    "summary": "extract the text of a PDF that http.fetch downloaded",
    "inputs": {"body": "bytes (application/pdf)"},
    "outputs": {"text": "str"},
    "errors": ["encrypted PDF", "scanned image without text layer"],
}


class Hit(TypedDict):
    """One search result: where the page is and what the index says about it."""

    url: str
    snippet: str


@dataclass(frozen=True)
class _Page:
    url: str
    snippet: str
    keywords: frozenset[str]
    body: str | bytes


_WEB = [
    _Page(
        "https://www.postgresql.org/docs/17/release-17.html",
        "PostgreSQL 17 release notes: incremental backup, a leaner vacuum, JSON_TABLE",
        frozenset({"postgresql", "17", "changes", "release", "notes", "vacuum"}),
        "<h1>Release 17</h1><p>PostgreSQL 17 adds incremental backups to pg_basebackup. "
        "Vacuum needs up to twenty times less memory. JSON_TABLE turns JSON into rows.</p>",
    ),
    _Page(
        "https://www.postgresql.org/about/press/pg17-whats-new.pdf",
        "What's new in PostgreSQL 17 (press kit, PDF)",
        frozenset({"postgresql", "17", "release", "notes", "pdf"}),
        b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n% PostgreSQL 17 press kit\n%%EOF\n",
    ),
    _Page(
        "https://sqlite.org/wal.html",
        "Write-Ahead Logging: how SQLite commits without blocking readers",
        frozenset({"sqlite", "wal", "mode", "journal"}),
        "<h1>Write-Ahead Logging</h1><p>In WAL mode, changes are appended to a separate "
        "file and readers keep reading the database while a writer commits. A checkpoint "
        "moves the changes back into the database file.</p>",
    ),
    _Page(
        "https://example.org/papers/sqlite-wal-design.pdf",
        "The design of SQLite's write-ahead log (paper, PDF)",
        frozenset({"sqlite", "wal", "pdf", "paper"}),
        b"%PDF-1.5\n1 0 obj << /Type /Catalog >> endobj\n% sqlite wal design\n%%EOF\n",
    ),
]


@executor("web.search", "2.1")
def search(query: str) -> list[Hit]:
    """The pages whose keywords hold every word of ``query``."""
    words = set(query.lower().split())
    return [Hit(url=p.url, snippet=p.snippet) for p in _WEB if words <= p.keywords]


@executor("http.fetch", "1.4")
def fetch(url: str) -> str | bytes:
    """The body at ``url``: HTML text, or the bytes of a PDF."""
    for page in _WEB:
        if page.url == url:
            return page.body
    raise LookupError(f"404: {url}")


def _plain(text: str | Sequence[str]) -> str:
    joined = text if isinstance(text, str) else " ".join(text)
    joined = re.sub(r"<h1>.*?</h1>", " ", joined)  # the title is not the text
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", joined)).strip()


@executor("text.summarise", "0.9")
def summarise_0_9(text: str | Sequence[str]) -> str:
    """The first 60 characters of the text."""
    return _plain(text)[:60]


@executor("text.summarise", "1.0")
def summarise_1_0(text: str | Sequence[str]) -> str:
    """The first sentence of the text."""
    plain = _plain(text)
    return plain.split(". ", 1)[0].rstrip(".") + "."


@dataclass(frozen=True)
class DemoTurn:
    """One made-up turn: what the user asked, how the runtime answered it."""

    turn_id: str
    query: str
    summariser: str  # the text.summarise version deployed at the time
    raw_query: str | None = None  # logged to the canonical query log when given
    from_snippets: bool = False  # answer from the search snippets, without fetching


DEMO_TURNS = (
    DemoTurn("turn-001", "postgresql 17 changes", "0.9", "What's new in PostgreSQL 17?"),
    DemoTurn("turn-002", "sqlite wal mode", "0.9"),
    DemoTurn("turn-003", "sqlite wal pdf", "0.9", "SQLite WAL paper pdf"),
    DemoTurn("turn-004", "postgresql 17 vacuum", "1.0", from_snippets=True),
    DemoTurn("turn-005", "postgresql 17 release notes", "1.0", "postgres 17 release notes"),
    DemoTurn("turn-006", "postgresql 17 release", "1.0"),
    DemoTurn("turn-007", "sqlite wal mode", "1.0"),
)


def answer(spec: DemoTurn) -> str:
    """The runtime's answer to one query: search, fetch, summarise; wish for what is missing."""
    summarise = summarise_1_0 if spec.summariser == "1.0" else summarise_0_9
    hits = search(spec.query)
    if spec.from_snippets:
        return summarise([h["snippet"] for h in hits])
    summaries = []
    for hit in hits:
        body = fetch(hit["url"])
        if isinstance(body, bytes):  # no executor reads a PDF yet: say what would
            wish("pdf.to_text", consumed=body, desired_sig=PDF_SIG)
        else:
            summaries.append(summarise(body))
    return " ".join(summaries)


def run_demo_turn(store: Any, spec: DemoTurn) -> Turn:
    """Answer one turn inside a traced turn; the tracer records its passings at the end."""
    with turn(store, spec.turn_id, strict=True) as t:
        answer(spec)
    return t
