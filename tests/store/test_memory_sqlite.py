"""An in-memory SQLite database is no store, however its URL spells it.

Each connection to ``:memory:`` sees a database of its own, and a shared-cache or ``memdb``
one is gone when its last connection closes: every write would succeed and be lost. The
plain spellings (``sqlite://``, ``sqlite:///:memory:``) were refused; SQLite's URI
filenames (``file::memory:``, ``file:name?mode=memory``, ``vfs=memdb``), with ``uri=true``
or without, are refused alike, by the stores and by ``copy``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

import mnestoma
from mnestoma import InvalidInput
from mnestoma.cli import cli
from mnestoma.doors.asynchronous import AsyncMnestoma
from mnestoma.engines import is_memory_sqlite
from mnestoma.maintenance.copying import copy_store

MEMORY_URLS = [
    "sqlite://",
    "sqlite:///:memory:",
    "sqlite:///:memory:?cache=shared",
    "sqlite:///file::memory:",
    "sqlite:///file::memory:?cache=shared",
    "sqlite:///file::memory:?cache=shared&uri=true",
    "sqlite:///file::memory:?uri=true",
    "sqlite:///file:name?mode=memory",
    "sqlite:///file:name?mode=memory&uri=true",
    "sqlite:///file:name?mode=memory&cache=shared&uri=true",
    "sqlite:///file:name?uri=true&cache=shared&mode=memory",
    "sqlite+pysqlite:///file:name?mode=memory&uri=True",
    "sqlite:///file:name?MODE=Memory&uri=1",
    "sqlite:///file:name?mode=%256Demory&uri=true",  # SQLite decodes %6D once more
    "sqlite:///file:name?mode=memory%26&uri=true",  # SQLite splits the value at the &
    "sqlite:///file:/name?vfs=memdb&uri=true",
    "sqlite:///file:%253Amemory%253A?uri=true",
    "sqlite:///file:?cache=shared&uri=true",  # an empty path: a temporary file, gone at close
    "sqlite+aiosqlite:///file::memory:?cache=shared&uri=true",
]


def _store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.mark.parametrize("url", MEMORY_URLS)
def test_every_spelling_of_an_in_memory_database_is_recognised(url: str) -> None:
    assert is_memory_sqlite(make_url(url))


@pytest.mark.parametrize(
    "database",
    [
        "{tmp}/memory.sqlite",
        "{tmp}/:memory:.sqlite",
        "file:{tmp}/s.sqlite?uri=true",
        "file:{tmp}/s.sqlite?mode=rwc&uri=true",
        "file:{tmp}/s.sqlite?cache=shared&uri=true",
    ],
)
def test_a_file_is_a_store_whatever_its_name_or_uri_says(tmp_path: Path, database: str) -> None:
    url = f"sqlite:///{database.format(tmp=tmp_path)}"
    assert not is_memory_sqlite(make_url(url))
    with mnestoma.Mnestoma(url) as store:
        store.record_passing("a", "1", "b", "1")
    with mnestoma.Mnestoma(url, create=False) as store:
        assert len(store.edges()) == 1  # still there after close


@pytest.mark.parametrize("url", MEMORY_URLS)
def test_a_store_refuses_an_in_memory_database_and_leaves_no_file(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sync_url = url.replace("+aiosqlite", "")
    with pytest.raises(InvalidInput, match="in-memory SQLite database cannot be shared"):
        mnestoma.Mnestoma(sync_url)
    with pytest.raises(InvalidInput, match="in-memory SQLite database cannot be shared"):
        AsyncMnestoma(url)
    assert os.listdir(tmp_path) == []


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # a query without uri=true
@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")  # and its pool
@pytest.mark.parametrize("url", MEMORY_URLS[3:12])
def test_a_store_refuses_an_engine_on_an_in_memory_database(url: str) -> None:
    engine = create_engine(url.replace("+aiosqlite", ""))
    try:
        with pytest.raises(InvalidInput, match="in-memory"):
            mnestoma.Mnestoma(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", MEMORY_URLS)
def test_copy_refuses_an_in_memory_target_or_source(url: str, tmp_path: Path) -> None:
    sync_url = url.replace("+aiosqlite", "")
    store = _store_url(tmp_path)
    with mnestoma.Mnestoma(store) as m:
        m.record_passing("a", "1", "b", "1")
    with pytest.raises(InvalidInput, match="the target is an in-memory SQLite database"):
        copy_store(store, sync_url)
    with pytest.raises(InvalidInput, match="the source is an in-memory SQLite database"):
        copy_store(sync_url, store)
    result = CliRunner().invoke(cli, ["copy", "--from", store, "--to", sync_url])
    assert result.exit_code == 2, result.output
    assert "in-memory" in result.stderr and "verified" not in result.stdout


@pytest.mark.parametrize("url", MEMORY_URLS[3:12])
@pytest.mark.parametrize("args", [["record", "a@1", "b@1"], ["edges"], ["age"]])
def test_the_command_line_refuses_an_in_memory_database(
    url: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, [*args, "--database-url", url])
    assert result.exit_code == 2, result.output
    assert "in-memory SQLite database cannot be shared" in result.stderr
    assert os.listdir(tmp_path) == []


def _spelled(draw: st.DrawFn, text: str) -> str:
    """``text`` in any case, some characters percent-encoded once or twice (the URL's
    parser decodes once, SQLite once more)."""
    out = ""
    for ch in text:
        ch = draw(st.sampled_from([ch.lower(), ch.upper()]))
        out += draw(st.sampled_from([ch, f"%{ord(ch):02X}", f"%25{ord(ch):02X}"]))
    return out


@st.composite
def memory_queries(draw: st.DrawFn) -> str:
    """A SQLite URI's query with ``mode=memory`` (or ``vfs=memdb``) among other parameters."""
    others = draw(
        st.lists(st.sampled_from(["cache=shared", "uri=true", "nolock=1", "psow=0", "x=y"]))
    )
    key, value = draw(st.sampled_from([("mode", "memory"), ("vfs", "memdb")]))
    at = draw(st.integers(0, len(others)))
    params = [*others[:at], f"{_spelled(draw, key)}={_spelled(draw, value)}", *others[at:]]
    return "&".join(params)


@settings(max_examples=300, deadline=None)
@given(memory_queries(), st.sampled_from(["file:name", "file:/tmp/n.sqlite", "file::memory:"]))
def test_mode_memory_anywhere_in_the_query_is_in_memory(query: str, name: str) -> None:
    url = make_url(f"sqlite:///{name}?{query}")
    assert is_memory_sqlite(url)
    with pytest.raises(InvalidInput, match="in-memory"):
        mnestoma.Mnestoma(url)


def test_an_async_store_refuses_a_uri_spelled_in_memory_database_before_opening() -> None:
    async def main() -> None:
        async with AsyncMnestoma("sqlite+aiosqlite:///file:n?mode=memory&uri=true"):
            pass

    with pytest.raises(InvalidInput, match="in-memory"):
        asyncio.run(main())
