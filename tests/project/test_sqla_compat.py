"""The package's uses of SQLAlchemy's private API (``mnestoma.core._sqla_compat``), each tested
against the installed SQLAlchemy: a release that renames or changes one fails here, with
the name of what changed, before it fails a user. And no other module reaches past the
public API: every such use is in that one module."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import configure_mappers
from sqlalchemy.sql.compiler import SQLCompiler

import mnestoma
from mnestoma.core import _sqla_compat as compat
from mnestoma.schema.models import Mnest

PACKAGE = Path(mnestoma.__file__).resolve().parent
# What reaching into SQLAlchemy's internals looks like in the package's source.
PRIVATE_USES = re.compile(
    r"\.(insert_prefetch|update_prefetch|dispatch|stack|class_manager|new_instance|visit_table)\b"
    r"|__class__\s*=|\b_is_async\b|sqlalchemy\.util\b|orm\.attributes\b|instance_state"
    r"|setattr\(\s*dialect"
)


def _table(name: str = "t") -> Table:
    return Table(
        name,
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("made", String, default=lambda: "now"),
        Column("seen", String, onupdate=lambda: "later"),
    )


def test_no_module_but_the_compat_module_uses_private_sqlalchemy() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_sqla_compat.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PRIVATE_USES.search(line)
    ]
    assert found == [], "private SQLAlchemy outside mnestoma/core/_sqla_compat.py:\n" + "\n".join(
        found
    )


def test_the_detector_finds_each_kind_of_private_use() -> None:
    for line in (
        "compiled.insert_prefetch",
        "conn.dispatch.handle_error",
        "compiler.stack[-1]",
        "obj.__class__ = Other",
        "create_engine(url, _is_async=True)",
        "from sqlalchemy.util import greenlet_spawn",
        'setattr(dialect, "connect", f)',
    ):
        assert PRIVATE_USES.search(line), line
    assert not PRIVATE_USES.search("self._stack.close()")


def test_create_engine_builds_an_async_engines_sync_engine_with_the_private_option() -> None:
    pytest.importorskip("psycopg")
    url = "postgresql+psycopg://nobody@localhost/none"  # nothing is connected to
    plain = create_engine(url)
    assert not plain.dialect.is_async  # psycopg's sync dialect: no async wrapper over it
    with pytest.raises(InvalidRequestError, match="async driver"):
        AsyncEngine(plain)
    flagged = create_engine(url, **{compat.ASYNC_ENGINE_OPTION: True})
    assert flagged.dialect.is_async  # the option picks the URL's async dialect
    assert AsyncEngine(flagged).sync_engine is flagged


def test_greenlet_spawn_runs_sync_code_in_the_event_loop() -> None:
    pytest.importorskip("greenlet")
    assert asyncio.run(compat.greenlet_spawn(lambda a, b: a + b, 2, 3)) == 5


def test_prefetch_columns_names_the_python_side_defaults_of_a_write() -> None:
    t = _table()
    inserted, _ = compat.prefetch_columns(insert(t).compile(column_keys=["id"]))  # type: ignore[arg-type]
    assert [c.key for c in inserted] == ["made"]
    _, updated = compat.prefetch_columns(update(t).compile(column_keys=["id"]))  # type: ignore[arg-type]
    assert [c.key for c in updated] == ["seen"]


def test_listened_and_error_hooks_show_who_observes_the_statements() -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert not compat.listened(conn, ("before_execute",))
        assert not compat.dialect_error_hooks(conn)
    event.listen(engine, "before_execute", lambda *a: None)
    event.listen(engine, "handle_error", lambda ctx: None)
    with engine.connect() as conn:
        assert compat.listened(conn, ("after_execute", "before_execute"))
        assert not compat.listened(conn, ("after_execute",))
        assert compat.listeners_of(conn, "before_cursor_execute") == []
        assert compat.dialect_error_hooks(conn)
    engine.dispose()


def _listener(*_args: Any) -> None:
    return None


@pytest.mark.parametrize("where", ["engine", "connection", "Engine", "Connection"])
def test_listened_answers_as_sqlalchemys_dispatcher_for_a_listener_at_each_level(
    where: str,
) -> None:
    """A listener on the engine, on the connection, or on either's class: ``listened`` and
    ``listeners_of`` read the collections SQLAlchemy's dispatcher answers from, and give
    its answers (a release that moves them fails here)."""
    from sqlalchemy import Connection as ConnectionClass
    from sqlalchemy import Engine as EngineClass

    engine = create_engine("sqlite://")
    names = ("before_cursor_execute", "commit")
    with engine.connect() as conn:
        assert not compat.listened(conn, names)
        target: Any = {
            "engine": engine,
            "connection": conn,
            "Engine": EngineClass,
            "Connection": ConnectionClass,
        }[where]
        event.listen(target, "commit", _listener)
        try:
            with engine.connect() as other:
                # the connection's dispatcher as SQLAlchemy reads it, and ours
                seen = conn if where == "connection" else other
                assert bool(seen.dispatch.commit) and compat.listened(seen, names)
                assert not compat.listened(seen, ("begin", "rollback"))
                assert compat.listeners_of(seen, "commit") == list(seen.dispatch.commit)
                assert compat.listeners_of(seen, "commit") == [_listener]
        finally:
            event.remove(target, "commit", _listener)
        assert not compat.listened(conn, names)
    engine.dispose()


def test_a_connection_made_before_sql_logging_was_turned_on_does_not_log_as_its_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert compat.logs_as_its_engine(conn)
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
            assert not compat.logs_as_its_engine(conn)
            conn.exec_driver_sql("SELECT 'unseen'")  # the connection still does not log
            assert "unseen" not in caplog.text
            with engine.connect() as later:
                assert compat.logs_as_its_engine(later)
    engine.dispose()


def test_a_replaced_dialect_method_is_what_the_pool_calls() -> None:
    engine = create_engine("sqlite://")
    connect = engine.dialect.connect
    calls: list[str] = []

    def counted(*cargs: Any, **cparams: Any) -> Any:
        calls.append("connect")
        return connect(*cargs, **cparams)

    compat.replace_dialect_method(engine.dialect, "connect", counted)
    with engine.connect():
        pass
    assert calls == ["connect"]
    engine.dispose()


class _Watched(Table):
    inherit_cache = True


_SEEN: list[Any] = []


@compiles(_Watched)
def _compile_watched(table: _Watched, compiler: SQLCompiler, **kw: Any) -> str:
    _SEEN.append(compat.compiling_dml_target(compiler))
    return compat.visit_table(compiler, table, **kw)


def test_the_compiler_says_which_statement_it_renders_a_table_for() -> None:
    t = compat.retype(_table("watched"), _Watched)
    assert isinstance(t, _Watched)
    _SEEN.clear()
    assert "UPDATE watched" in str(update(t).values(made="x"))
    assert getattr(_SEEN[-1], "is_dml", False) and _SEEN[-1].table is t
    assert "FROM watched" in str(select(t.c.id))
    assert not getattr(_SEEN[-1], "is_dml", False)


def test_a_detached_instance_is_built_with_its_values_loaded_and_its_identity() -> None:
    configure_mappers()
    manager = compat.class_manager(sa_inspect(Mnest))
    values = {"id": "m1", "src_executor": "a", "weight": 0.3, "ts_last": datetime.now(UTC)}
    mnest = compat.detached(manager, Mnest, values, "m1")
    state = sa_inspect(mnest)
    assert state.detached and state.identity == ("m1",)
    assert mnest.src_executor == "a" and mnest.weight == 0.3
    assert not state.modified  # loaded as committed values, not as changes
