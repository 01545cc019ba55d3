"""Where the database is (contract §3): the URL a door opens, by the contract's order."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from mnestoma.core.errors import InvalidInput
from mnestoma.core.redaction import redact_text
from mnestoma.engines import backend
from mnestoma.engines.backend import backend_of
from mnestoma.engines.locking import is_memory_sqlite

__all__ = [
    "ASYNC_DRIVERS",
    "ENV_DATABASE_URL",
    "ENV_DB_PATH",
    "ENV_REPLICA_URLS",
    "ENV_WORKSPACE",
    "SYNC_DRIVERS",
    "async_database_url",
    "default_sqlite_path",
    "is_sqlite",
    "refuse_memory_sqlite",
    "resolve_database_url",
    "sync_database_url",
]

ENV_DATABASE_URL = "MNESTOMA_DATABASE_URL"
ENV_DB_PATH = "MNESTOMA_DB_PATH"
# The command line's read replicas (contract §12): URLs separated by whitespace (or by a
# comma before the next URL's scheme), each read whole.
ENV_REPLICA_URLS = "MNESTOMA_REPLICA_URLS"
ENV_WORKSPACE = "METNOS_WORKSPACE"


def default_sqlite_path() -> Path:
    """The embedded default: ``$METNOS_WORKSPACE/.mnestoma/mnest.sqlite`` or ``./.mnestoma/...``.

    Raises:
        InvalidInput: METNOS_WORKSPACE is set but empty or blank.
    """
    workspace = _env(ENV_WORKSPACE)
    base = Path(workspace) if workspace is not None else Path.cwd()
    return base / ".mnestoma" / "mnest.sqlite"


def _env(name: str) -> str | None:
    """The variable ``name`` stripped, None when it is unset; set but empty or blank (an
    unset shell variable expanded, ``VAR=$TYPO``) is :class:`InvalidInput` naming it: taken
    as unset, it would switch to the next store of the order, silently."""
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip():
        raise InvalidInput(
            f"{name} is set but empty (an unset shell variable?): give it a value, or unset "
            "it; nothing was opened"
        )
    return value.strip()


def resolve_database_url(url: str | URL | None = None) -> URL:
    """The database URL by the contract's order: argument, env URL, env path, workspace, cwd.

    Only None falls back, and only an unset variable is skipped: an empty or blank string
    given by the caller, or a variable of the order set to one (an unset shell variable
    expanded, say), is :class:`InvalidInput` naming it, never a silent switch to another
    store.

    Returns:
        The URL.

    Raises:
        InvalidInput: ``url`` (or the environment's URL) is empty or not a database URL, or
            MNESTOMA_DATABASE_URL, MNESTOMA_DB_PATH or METNOS_WORKSPACE, the first of them
            set, is empty.
    """
    if url is not None:
        if isinstance(url, str) and not url.strip():
            raise InvalidInput(
                "the database URL is empty (an unset variable?): give a URL, or none at all "
                "for the default store"
            )
        return _parse(url)
    env_url = _env(ENV_DATABASE_URL)
    if env_url is not None:
        return _parse(env_url)
    env_path = _env(ENV_DB_PATH)
    path = Path(env_path).expanduser() if env_path is not None else default_sqlite_path()
    return URL.create("sqlite+pysqlite", database=str(path.absolute()))


# The driver each side opens a database with, by dialect name, each backend's own (filled as
# the backends register). Async: aiosqlite, and psycopg 3 in its async mode (SQLAlchemy picks
# psycopg's async dialect for ``postgresql+psycopg`` on an async engine). Sync (Alembic
# migrates synchronously, whatever the URL's driver): pysqlite, psycopg.
ASYNC_DRIVERS = backend.ASYNC_DRIVERS
SYNC_DRIVERS = backend.SYNC_DRIVERS


def async_database_url(url: str | URL | None = None) -> URL:
    """The URL the async door opens: resolved as contract §3 says; an explicit async driver
    is kept, a plain or sync one (``sqlite://``, ``postgresql://``) becomes the async one."""
    resolved = resolve_database_url(url)
    if resolved.get_dialect().is_async:
        return resolved
    return resolved.set(drivername=backend_of(resolved).async_driver)


def sync_database_url(url: str | URL | None = None) -> URL:
    """The URL the migration door opens: resolved as contract §3 says, an async driver that
    the async door accepts (aiosqlite, psycopg_async, asyncpg) swapped for the sync one."""
    resolved = resolve_database_url(url)
    if not resolved.get_dialect().is_async:
        return resolved
    return resolved.set(drivername=backend_of(resolved).sync_driver)


def _parse(url: str | URL) -> URL:
    """A URL this package can open (sqlite or postgresql, a driver SQLAlchemy knows)."""
    if not isinstance(url, str | URL):
        raise InvalidInput(
            f"a database URL must be a string or a sqlalchemy URL, got {type(url).__name__}"
        )
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise InvalidInput(f"not a database URL: {redact_text(str(url))!r}") from None
    # a bare postgresql:// would pick psycopg2; this package speaks psycopg 3
    driver = backend.BARE_SCHEMES.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    backend_of(parsed)  # InvalidInput for a database this package does not support
    try:
        parsed.get_dialect()  # the dialect only: its driver is imported by create_engine
    except NoSuchModuleError:
        raise InvalidInput(
            f"unknown database driver {parsed.drivername!r}: use sqlite:// or postgresql://"
        ) from None
    return parsed


def is_sqlite(url_or_engine: URL | Engine) -> bool:
    """True for a SQLite URL or engine: a file store, not a server's
    (``not backend_of(x).server``)."""
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else url_or_engine
    return not backend_of(url).server


def refuse_memory_sqlite(url: URL) -> None:
    """Raise :class:`InvalidInput` for an in-memory SQLite database, however it is spelled
    (see :func:`is_memory_sqlite`): a store is shared, and outlives its connections."""
    if is_memory_sqlite(url):
        raise InvalidInput("an in-memory SQLite database cannot be shared: use a file")
