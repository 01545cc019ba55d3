"""What the two facades share (:class:`~mnestoma.Mnestoma`, :class:`~mnestoma.aio.AsyncMnestoma`):
the table of the repository's operations each makes its methods from, their settings' clock
and recorder, their replica views, the schema check on first use, the lock timeout of their
engine and the note of a long run's commits.

Below both, so that the sync and the async door stand beside each other and neither imports
the other.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Coroutine, Iterator, Sequence
from datetime import datetime
from inspect import signature
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL

from mnestoma.core.clock import Clock
from mnestoma.core.errors import SchemaError, translate_errors
from mnestoma.core.redaction import redact_url
from mnestoma.core.settings import Settings, settings_of
from mnestoma.engines.locking import LOCK_TIMEOUT_OPTION
from mnestoma.engines.replicas import ReplicaSet, replica_connect_args
from mnestoma.engines.urls import is_sqlite, refuse_memory_sqlite
from mnestoma.maintenance.migration import (
    MIGRATION_GATE,
    current_revision,
    ensure_at_head,
    head_revision,
    sqlite_store_missing,
)
from mnestoma.maintenance.retention import PruneProgress, prune_steps
from mnestoma.maintenance.splitting import SplitReport, split_steps
from mnestoma.maintenance.steps import Steps
from mnestoma.store.repository import MnestRepository

__all__ = [
    "AsyncDoor",
    "Bind",
    "FacadeBase",
    "MnestOperations",
    "PruneProgress",
    "Replicas",
    "SyncDoor",
    "ensure_schema",
    "operation",
    "store_url",
    "with_lock_timeout",
]

T = TypeVar("T")
E = TypeVar("E")
R = TypeVar("R")
P = ParamSpec("P")
S = TypeVar("S", bound="SyncDoor")
A = TypeVar("A", bound="AsyncDoor")
# The read replicas a facade is given: their URLs (contract §12).
Replicas = Sequence[str | URL] | None
# The parameters of write operations that take a collection of items: a generator given
# there is read once, before the first attempt, so that a retry replays the same items.
ITEM_PARAMETERS = frozenset({"passings"})


def repository_call(
    op: Callable[..., T], *, write: bool
) -> Callable[[tuple[Any, ...], dict[str, Any]], Callable[[Any], T]]:
    """What a facade runs for one call of the repository's operation ``op``: given the call's
    arguments, ``op`` on whichever repository a transaction gives it. For a write, the
    one-shot iterators given to its :data:`ITEM_PARAMETERS` are read into lists first, once;
    any other argument is passed as given, for the operation to check."""
    names = list(signature(op).parameters)[1:]  # after self
    items = [(i, name) for i, name in enumerate(names) if name in ITEM_PARAMETERS] if write else []

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[Any], T]:
        listed, named = list(args), dict(kwargs)
        for i, name in items:
            if i < len(listed):
                listed[i] = _listed(listed[i])
            elif name in named:
                named[name] = _listed(named[name])
        return lambda repo: op(repo, *listed, **named)

    return bind


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, Iterator) else value


# One call's arguments bound to an operation: what runs it on a repository (repository_call).
Bind = Callable[[tuple[Any, ...], dict[str, Any]], Callable[[Any], Any]]


# --- the operations, written once for both doors ------------------------------------------


class operation(Generic[R, P, T]):
    """The operation ``op`` of a repository ``R`` as a method of a door: the same signature,
    checks, errors and result, because it is the same code. A sync door runs it in a
    transaction of its own (``-> T``), an async door awaits it (``-> Coroutine[..., T]``).

    Each door's class replaces it by a plain method of its kind when the class is made
    (:class:`Door`), so a call costs what a hand-written method's does; this descriptor
    gives the static types and the table that both doors read.
    """

    def __init__(self, op: Callable[Concatenate[R, P], T], *, write: bool = False) -> None:
        self.op = op
        self.write = write
        self.__doc__ = op.__doc__
        self.__wrapped__ = op

    @overload
    def __get__(self, instance: None, owner: type[S]) -> Callable[Concatenate[S, P], T]: ...
    @overload
    def __get__(
        self, instance: None, owner: type[A]
    ) -> Callable[Concatenate[A, P], Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: SyncDoor, owner: type[Any]) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, instance: AsyncDoor, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, instance: object, owner: type[Any]) -> Any:
        if instance is None:
            return self
        raise TypeError(f"{owner.__qualname__} is not a door: it cannot run {self.op.__name__}")


class Door:
    """A class whose operations (:class:`operation`, its own or inherited) become, when the
    class is made, methods of the door's kind (:meth:`_operation_method`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        seen: set[str] = set()
        for klass in cls.__mro__:
            for name, found in vars(klass).items():
                if name in seen:
                    continue
                seen.add(name)
                if isinstance(found, operation):
                    bind = repository_call(found.op, write=found.write)
                    method = cls._operation_method(bind, found.write)
                    functools.update_wrapper(method, found.op, assigned=("__name__", "__doc__"))
                    method.__qualname__ = f"{cls.__qualname__}.{name}"
                    setattr(cls, name, method)

    @staticmethod
    def _operation_method(bind: Bind, write: bool) -> Callable[..., Any]:
        """The method ``(self, /, *args, **kwargs)`` that runs ``bind(args, kwargs)`` on a
        repository of this door (a write retried when it failed transiently)."""
        raise NotImplementedError


class SyncDoor(Door):
    """A door whose operations return their results (:class:`~mnestoma.Mnestoma`)."""


class AsyncDoor(Door):
    """A door whose operations are awaited (:mod:`mnestoma.aio`)."""


class MnestOperations:
    """The repository's operations that both facades (and the async repository) have, each
    one call of :class:`~mnestoma.MnestRepository` (a facade's in a transaction of its own)."""

    record_passing = operation(MnestRepository.record_passing, write=True)
    record_proto = operation(MnestRepository.record_proto, write=True)
    record_turn = operation(MnestRepository.record_turn, write=True)
    get = operation(MnestRepository.get)
    find = operation(MnestRepository.find)
    edges = operation(MnestRepository.edges)
    events = operation(MnestRepository.events)
    walk = operation(MnestRepository.walk)
    suggest_next = operation(MnestRepository.suggest_next)
    rank = operation(MnestRepository.rank)
    predict_next = operation(MnestRepository.predict_next)
    vet = operation(MnestRepository.vet)
    graph = operation(MnestRepository.graph)
    to_networkx = operation(MnestRepository.to_networkx)
    transition_state = operation(MnestRepository.transition_state, write=True)
    recurring_protos = operation(MnestRepository.recurring_protos)
    promote_proto_to_active = operation(MnestRepository.promote_proto_to_active, write=True)


class FacadeBase(Generic[E]):
    """The state and views both facades have: their settings, whether their reads stay on the
    primary, their read replicas and whether they close them; how they are built (a URL or
    an engine ``E`` of the door's kind, settings, replicas)."""

    settings: Settings
    _dialect: str  # the engine's dialect name, set with it
    _replicas: ReplicaSet | None
    _owns_engine: bool
    _owns_replicas: bool
    _on_primary: bool

    def __init__(
        self,
        url_or_engine: str | URL | E | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        recorder: str | None = None,
        create: bool = True,
        replicas: Replicas = None,
    ) -> None:
        # checked before anything is opened: bad settings open no engine
        self.settings = settings_of(settings, clock=clock, recorder=recorder)
        self._replicas = None
        self._owns_replicas = True
        self._on_primary = False
        self._open(url_or_engine, create, replicas)

    def _open(self, target: str | URL | E | None, create: bool, replicas: Replicas) -> None:
        """The door's engines: its own, or the caller's ``url_or_engine``, and its replicas'."""
        raise NotImplementedError

    def _with_replicas(self, urls: list[URL], make: Callable[..., Any]) -> None:
        """Read replicas at ``urls``, each engine built by ``make`` (the door's kind)."""
        if urls:
            engines = [make(u, connect_args=replica_connect_args(u)) for u in urls]
            self._replicas = ReplicaSet(engines, urls, self.settings)

    @property
    def clock(self) -> Clock:
        """The clock of this store's settings: its only source of "now"."""
        return self.settings.clock

    @property
    def recorder(self) -> str:
        """Who this store's events say recorded them, unless a call says otherwise."""
        return self.settings.recorder

    @property
    def primary(self) -> Self:
        """This facade with every read on the primary (for a read that must see another
        process's latest write). Its writes are this facade's, and close() leaves the
        engines to it."""
        view = copy.copy(self)
        view._on_primary = True
        view._owns_engine = False
        view._owns_replicas = False
        return view

    def replica_stats(self) -> dict[str, Any]:
        """How this facade's reads were routed (contract §12): each replica's reads, skips,
        last lag and whether it is skipped now; the reads the primary served, how many
        because no replica had replayed this facade's writes, how many after a replica
        failed. Empty without replicas.

        Returns:
            The counts, by replica and for the primary, as a dict.
        """
        return {} if self._replicas is None else self._replicas.stats()

    def _prune_steps(self, before: datetime, dry_run: object, progress: object) -> Steps[int]:
        """The steps of ``prune_events`` on this store's database (its dialect's batches);
        each door drives them, one transaction at a time."""
        return prune_steps(before, dry_run=dry_run, progress=progress, dialect=self._dialect)

    def _split_steps(
        self, batch_rows: object, dry_run: object, progress: object
    ) -> Steps[SplitReport]:
        """The steps of ``split_history`` on this store's database (nothing off
        PostgreSQL); each door drives them, one transaction at a time."""
        return split_steps(
            batch_rows=batch_rows, dry_run=dry_run, progress=progress, dialect=self._dialect
        )

    def _noted(self, conn: Connection, result: T) -> T:
        """After a run that committed its own transactions on ``conn`` (the batched ager):
        the WAL position its commits reached, noted for read-your-writes (replicas)."""
        if self._replicas is not None:
            self._replicas.note_write(conn)
            conn.rollback()
        return result


def store_url(url: URL, create: bool) -> URL:
    """``url``, unless it is an in-memory SQLite database (it cannot be shared), or with
    ``create=False`` a SQLite file that holds no store (SchemaError)."""
    refuse_memory_sqlite(url)
    if not create and sqlite_store_missing(url):
        raise SchemaError(f"there is no mnestoma store at {redact_url(url)}")
    return url


def with_lock_timeout(engine: Engine, seconds: float | None) -> Engine:
    """``engine``, or (a lock timeout given) a view of it whose connections wait that long
    for a lock: the same pool, its own execution option (see :mod:`mnestoma.engines.locking`)."""
    if seconds is None:
        return engine
    return engine.execution_options(**{LOCK_TIMEOUT_OPTION: seconds})


def ensure_schema(engine: Engine) -> None:
    """A new or empty SQLite store is migrated to head; any other must already be there.
    A store found behind head is looked at again, and migrated, while no other thread of
    the process migrates (:data:`~mnestoma.maintenance.migration.MIGRATION_GATE`): a store
    another thread is creating is waited for, not found half made."""
    if schema_at_head(engine):
        return
    with MIGRATION_GATE.held():
        ensure_at_head(engine, auto_migrate=is_sqlite(engine) and _is_empty(engine))


def schema_at_head(engine: Engine) -> bool:
    """Whether the store's schema is at head already (one read: nothing to migrate)."""
    return current_revision(engine) == head_revision()


def ensure_schema_handed(engine: Engine) -> None:
    """:func:`ensure_schema` in the greenlet of an async door that holds the migration gate
    (:meth:`~mnestoma.maintenance.migration._MigrationGate.handed_here`)."""
    with MIGRATION_GATE.handed_here():
        ensure_schema(engine)


def _is_empty(engine: Engine) -> bool:
    with translate_errors():
        return not inspect(engine).get_table_names()
