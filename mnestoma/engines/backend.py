"""What a kind of store is, asked in one place: the :class:`Backend` interface, its two
implementations (:mod:`~mnestoma.engines.sqlite`, :mod:`~mnestoma.engines.postgresql`), and
:func:`backend_of`, the one lookup from a dialect name, URL, Dialect, Engine or Connection.

The rest of the package asks its engine's backend what to do instead of comparing the
dialect's name: the files of a store and whether it is missing, the write lock, fork
handling, an engine's listeners, partitions, replicas, the statements each engine spells
its own way, the codes of its driver's errors. :func:`backend_of` is a dict lookup, cheap
enough for the hot paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sqlalchemy import URL, Connection, Engine

from mnestoma.core.errors import DriverCodes, InvalidInput

if TYPE_CHECKING:
    from mnestoma.schema.sql.spelling import Spelling

__all__ = ["BY_NAME", "Backend", "backend_of", "backends", "register_backend"]


@runtime_checkable
class Backend(Protocol):
    """One kind of store (a SQLAlchemy dialect) and all this package does its own way on it."""

    # SQLAlchemy's name of the dialect, and its drivers: the sync one (Alembic, the sync
    # door; what a bare scheme such as ``sqlite://`` means) and the async door's.
    name: str
    sync_driver: str
    async_driver: str
    # The schemes without a driver that mean :attr:`sync_driver` (``postgres://`` too).
    bare_schemes: frozenset[str]
    # One writer at a time: every write takes the store's write lock up front, the writers
    # that wait for it say so in a lock file beside the store, batches pause between them.
    one_writer: bool
    # Seconds a prune waits between two batches, for the writers.
    batch_pause_s: float
    # A database server (else a file, which the URL's database names): schemas on its
    # search_path, statistics of its own (ANALYZE, estimated row counts), connection strings
    # that may carry secrets.
    server: bool
    # Events partitioned by month, the months made ahead of the writes.
    partitioned: bool
    # Read replicas can serve a store of this kind (a file store has no standby).
    replicas: bool
    # The driver's codes the error translation reads (:class:`~mnestoma.core.errors.DriverCodes`).
    codes: DriverCodes
    # How the statements spell what differs (:class:`~mnestoma.schema.sql.spelling.Spelling`).
    spelling: Spelling

    def is_memory(self, url: URL) -> bool:
        """True for a database held in memory (no store: each connection sees its own)."""
        ...

    def store_files(self, url: URL) -> tuple[str, ...]:
        """Every file of the store at ``url`` (its lock files included); () for none."""
        ...

    def store_missing(self, url: URL) -> bool:
        """True when the store at ``url`` is known absent without opening it (a file that
        does not exist: reading must not create it)."""
        ...

    def same_database(self, a: URL, b: URL) -> bool:
        """True when ``a`` and ``b`` (both of this engine) open one database."""
        ...

    def snapshot_reader(self, engine: Engine) -> Engine:
        """``engine`` reading one consistent snapshot across tables (a copy's source)."""
        ...

    def build_engine(self, url: URL, secrets: Mapping[str, Any], **kwargs: Any) -> Engine:
        """An engine for the resolved ``url`` (``secrets``: what was taken out of it), with
        this engine's options and listeners; fork hooks are :func:`make_engine`'s."""
        ...

    def missing_driver(self, url: URL, err: ImportError) -> str:
        """What to say when the driver of ``url`` is not installed."""
        ...

    def take_write_lock(self, conn: Connection) -> None:
        """Begin ``conn``'s transaction holding the write lock (SQLite), or nothing."""
        ...

    def idle_connection_alive(self, dbapi_connection: Any) -> bool:
        """True when a connection left idle (the driver's, or the pool's proxy of it) can be
        used as it is, without a round trip; False when it may have been lost meanwhile."""
        ...

    def lock_for_migration(self, conn: Connection) -> None:
        """Serialise migrations of one database, in ``conn``'s transaction."""
        ...

    def track_writes(self, engine: Any) -> None:
        """Have a forked child see the writes in progress on ``engine`` (SQLite), or nothing."""
        ...

    def note_written(self, conn: Connection, at: datetime) -> None:
        """A write on ``conn`` writes events at ``at``: their month made after the commit
        (PostgreSQL), or nothing."""
        ...

    def upkeep(self, target: Engine | Connection, *, now: datetime | None = None) -> None:
        """Make the months of events due on ``target``'s store (PostgreSQL), or nothing."""
        ...

    def prepare_migration(self, conn: Connection) -> None:
        """What a migration does under its lock before it looks at the revision (PostgreSQL:
        the schema of its search_path created)."""
        ...

    def prepare_store(self, engine: Engine) -> None:
        """What a store this package creates or migrates gets (SQLite: WAL)."""
        ...

    def lock_copy_target(self, conn: Connection) -> None:
        """Hold off the target's other writers for a copy's transaction."""
        ...

    def after_copy(self, conn: Connection) -> None:
        """What a store written by a copy needs before it is used (sequences, statistics)."""
        ...


_BACKENDS: dict[str, Backend] = {}
# The backends by dialect name, for the guards of the hot paths (a write's partitions, its
# write lock): ``BY_NAME[conn.dialect.name]`` spares :func:`backend_of`'s call.
BY_NAME: Mapping[str, Backend] = _BACKENDS
# Each backend's drivers by its name, and the schemes without a driver that mean its sync
# one (``mnestoma.engines.urls`` reads them).
ASYNC_DRIVERS: dict[str, str] = {}
SYNC_DRIVERS: dict[str, str] = {}
BARE_SCHEMES: dict[str, str] = {}


def register_backend(backend: Backend) -> None:
    """Make ``backend`` what :func:`backend_of` answers for its dialect name (the two homes
    register themselves when :mod:`mnestoma.engines` is imported)."""
    _BACKENDS[backend.name] = backend
    ASYNC_DRIVERS[backend.name] = backend.async_driver
    SYNC_DRIVERS[backend.name] = backend.sync_driver
    BARE_SCHEMES.update(dict.fromkeys(backend.bare_schemes, backend.sync_driver))


def backends() -> tuple[Backend, ...]:
    """Every backend, in the order they registered."""
    return tuple(_BACKENDS.values())


def backend_of(x: Any) -> Backend:
    """The backend of ``x``: a dialect name, a URL, or anything with a ``dialect`` (Engine,
    Connection, their async forms) or a ``name`` (a Dialect). One dict lookup.

    Raises:
        InvalidInput: a database this package does not support.
    """
    try:
        return _BACKENDS[x.dialect.name]
    except AttributeError:
        pass
    except KeyError:
        return _named(x.dialect.name)
    if isinstance(x, str):
        return _named(x)
    if isinstance(x, URL):
        return _named(x.get_backend_name())
    return _named(x.name)


def _named(name: str) -> Backend:
    """The backend named ``name``. The homes registered when :mod:`mnestoma.engines` was
    imported, which Python does before any of its modules, this one included."""
    backend = _BACKENDS.get(name)
    if backend is None:
        raise InvalidInput(f"unsupported database {name!r}: use sqlite or postgresql")
    return backend
