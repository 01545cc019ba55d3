"""What the two facades share (:class:`~mnestoma.Mnestoma`, :class:`~mnestoma.aio.AsyncMnestoma`):
their settings' clock and recorder, their replica views, the schema check on first use, the
lock timeout of their engine and the note of a long run's commits.

Below both, so that the sync and the async door stand beside each other and neither imports
the other.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, TypeVar

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL

from mnestoma.core.clock import Clock
from mnestoma.core.errors import SchemaError, translate_errors
from mnestoma.core.redaction import redact_url
from mnestoma.core.settings import Settings, settings_of
from mnestoma.engines.locking import LOCK_TIMEOUT_OPTION
from mnestoma.engines.replicas import ReplicaSet, replica_connect_args
from mnestoma.engines.urls import is_sqlite, refuse_memory_sqlite
from mnestoma.maintenance.migration import ensure_at_head, sqlite_store_missing
from mnestoma.maintenance.retention import PruneProgress

__all__ = [
    "FacadeBase",
    "PruneProgress",
    "Replicas",
    "ensure_schema",
    "store_url",
    "with_lock_timeout",
]

T = TypeVar("T")
E = TypeVar("E")
# The read replicas a facade is given: their URLs (contract §12).
Replicas = Sequence[str | URL] | None


class FacadeBase(Generic[E]):
    """The state and views both facades have: their settings, whether their reads stay on the
    primary, their read replicas and whether they close them; how they are built (a URL or
    an engine ``E`` of the door's kind, settings, replicas)."""

    settings: Settings
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
    """A new or empty SQLite store is migrated to head; any other must already be there."""
    ensure_at_head(engine, auto_migrate=is_sqlite(engine) and _is_empty(engine))


def _is_empty(engine: Engine) -> bool:
    with translate_errors():
        return not inspect(engine).get_table_names()
