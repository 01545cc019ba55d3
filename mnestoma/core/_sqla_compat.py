"""Every use of SQLAlchemy's private or undocumented API, in one place.

Each one says why the package needs it; ``tests/project/test_sqla_compat.py`` exercises each
against the installed SQLAlchemy, so that a release that changes one fails a test here, not
a user, and checks that no other module of the package reaches past SQLAlchemy's public API.
Imports nothing of the package: it sits at the bottom of the layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

from sqlalchemy import Column, Connection, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.event.attr import _JoinedListener
from sqlalchemy.event.base import _JoinedDispatcher
from sqlalchemy.orm import ClassManager, Mapper
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

__all__ = [
    "ASYNC_ENGINE_OPTION",
    "class_manager",
    "compiling_dml_target",
    "detached",
    "detached_all",
    "dialect_error_hooks",
    "greenlet_spawn",
    "listened",
    "listeners_of",
    "logs_as_its_engine",
    "prefetch_columns",
    "replace_dialect_method",
    "retype",
    "visit_table",
]

T = TypeVar("T")

# create_engine's private flag that builds the sync Engine under an AsyncEngine: what
# create_async_engine passes, for make_async_engine to configure that engine as make_engine
# configures any other (its listeners on the sync engine).
ASYNC_ENGINE_OPTION = "_is_async"

# greenlet_spawn (sqlalchemy.util, not public): runs sync code that awaits the async driver
# inside the event loop, the schema check of the async door (the asyncio extension's own
# way of running sync work, which run_sync does only for a connection or session).


def prefetch_columns(compiled: SQLCompiler) -> tuple[Sequence[Column[Any]], Sequence[Column[Any]]]:
    """The columns whose Python-side default (INSERT) or onupdate (UPDATE) SQLAlchemy computes
    at execution, which a statement run at the driver must be given by its rows
    (``insert_prefetch``, ``update_prefetch``: attributes of the compiler, not documented)."""
    return compiled.insert_prefetch, compiled.update_prefetch


def listened(conn: Connection, names: Iterable[str]) -> bool:
    """Whether any listener of the connection events ``names`` is set on the connection, its
    engine, or either's class: what ``bool(conn.dispatch.<name>)`` answers. Asked at every
    write, it reads the collections themselves (undocumented): each event of a connection's
    dispatcher joins the connection's own collection (``local``) to its engine's (the
    dispatcher's ``parent``), and each collection holds its instance's listeners
    (``listeners``) and its class's (``parent_listeners``). SQLAlchemy's answer walks a
    property and two ``__bool__`` calls an event, about 6 µs of a passing in all (timed in
    place). Any other shape gets SQLAlchemy's answer."""
    dispatch = conn.dispatch
    if not isinstance(dispatch, _JoinedDispatcher):
        return any(getattr(dispatch, name) for name in names)
    parent = dispatch.parent
    for name in names:
        joined = getattr(dispatch, name)
        if type(joined) is not _JoinedListener:
            if joined:
                return True
            continue
        mine, engines = joined.local, getattr(parent, name)
        if mine.listeners or mine.parent_listeners or engines.listeners or engines.parent_listeners:
            return True
    return False


def listeners_of(conn: Connection, name: str) -> list[Callable[..., Any]]:
    """Every listener of the connection event ``name`` (see :func:`listened`), in the order
    SQLAlchemy runs them: the connection's class's, the connection's, the engine's class's,
    the engine's."""
    dispatch = conn.dispatch
    joined = getattr(dispatch, name)
    if not isinstance(dispatch, _JoinedDispatcher) or type(joined) is not _JoinedListener:
        return list(joined)
    mine, engines = joined.local, getattr(dispatch.parent, name)
    return [
        *mine.parent_listeners,
        *mine.listeners,
        *engines.parent_listeners,
        *engines.listeners,
    ]


def dialect_error_hooks(conn: Connection) -> bool:
    """Whether the engine has ``handle_error`` listeners (they live on the dialect's own
    dispatcher, undocumented): a statement run at the driver would skip them."""
    return bool(conn.dialect.dispatch.handle_error)


def logs_as_its_engine(conn: Connection) -> bool:
    """Whether the connection logs its statements as its engine would now: a Connection
    reads its engine's SQL logging once, when it is made (``_echo``, undocumented), so one
    kept open across calls must be replaced once logging is turned on or off."""
    return bool(conn._echo) == bool(conn.engine._should_log_info())


def replace_dialect_method(dialect: Dialect, name: str, method: Callable[..., Any]) -> None:
    """Replace ``dialect.<name>`` on this dialect instance (``connect``, ``do_commit``, ...):
    the pool calls them, after the events, with no public hook at that point (a failed
    connection's error scrubbed of secrets before the pool logs it; SQLite's write
    bookkeeping at the driver's commit). An attribute set on the instance, which mypy
    refuses as a method assignment."""
    setattr(dialect, name, method)


def compiling_dml_target(compiler: SQLCompiler) -> Any:
    """The statement the compiler is rendering now (the top of its ``stack``, undocumented):
    whether a table is being compiled as the target of an UPDATE or DELETE (the read-only
    view refuses that at compile time, whoever executes the statement)."""
    if not compiler.stack:
        return None
    return compiler.stack[-1]["selectable"]


def visit_table(compiler: SQLCompiler, table: Table, **kw: Any) -> str:
    """How the compiler renders any Table (``visit_table``, its visitor method): the view's
    own compilation falls back to it."""
    visit: Callable[..., str] = compiler.visit_table
    return visit(table, **kw)


def retype(obj: Any, cls: type[T]) -> T:
    """``obj`` made an instance of ``cls`` in place (``__class__`` assigned): the view's
    Table, which ``CreateView`` builds as a plain Table, becomes the read-only subclass
    whose compilation refuses writes, the same object the metadata holds."""
    obj.__class__ = cls
    return cast(T, obj)


def class_manager(mapper: Mapper[Any]) -> ClassManager[Any]:
    """The mapper's class manager (``mapper.class_manager``), which builds instances without
    ``__init__`` or attribute events (:func:`detached`)."""
    return mapper.class_manager


def detached(
    manager: ClassManager[Any],
    cls: type[T],
    values: Mapping[str, Any] | Iterable[tuple[str, Any]],
    ident: Any,
) -> T:
    """A detached instance of ``cls`` with ``values`` (a mapping, or name and value pairs)
    loaded as committed and identity ``ident``. The textbook ``cls(**values)`` then
    ``make_transient_to_detached`` fires an event per column (10× slower). This is what
    ``manager.new_instance()`` does, written out so that the values go into the instance's
    ``__dict__`` as they come (no mapping built first: 2.0 µs a snapshot where it took 2.8).
    ``_state_constructor``, ``_state_setter`` and the state's ``key`` are SQLAlchemy's
    internals; the key is what ``mapper.identity_key_from_primary_key`` builds."""
    obj: T = cls.__new__(cls)
    state = manager._state_constructor(obj, manager)
    manager._state_setter(obj, state)
    obj.__dict__.update(values)
    state.key = (cls, (ident,), None)
    return obj


def detached_all(
    manager: ClassManager[Any],
    cls: type[T],
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    refuse: Callable[[Sequence[Any]], None],
) -> list[T]:
    """:func:`detached` for each of ``rows`` (``columns`` set to a row's first values, its
    first the identity), with what it looks up on the manager looked up once: a quarter to
    a third less a row than one call each (1.7–1.9 µs against 2.4–3.1, for a turn's 50).
    ``refuse`` is called with a row shorter than ``columns`` (it raises)."""
    new, construct, put = cls.__new__, manager._state_constructor, manager._state_setter
    width = len(columns)
    out: list[T] = []
    for values in rows:
        if len(values) < width:
            refuse(values)
        obj: T = new(cls)
        state = construct(obj, manager)
        put(obj, state)
        obj.__dict__.update(zip(columns, values, strict=False))
        state.key = (cls, (values[0],), None)
        out.append(obj)
    return out
