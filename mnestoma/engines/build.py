"""How engines and sessions are built (contract §3): the SQLite folder, the drivers, the
options, the listeners and the fork hooks each engine gets."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from mnestoma.core._sqla_compat import replace_dialect_method
from mnestoma.core.errors import InvalidInput, MissingExtra
from mnestoma.core.redaction import redact_text, scrub_exception, secrets_of, split_url_secrets
from mnestoma.engines.backend import backend_of
from mnestoma.engines.forking import own_pool_after_fork
from mnestoma.engines.listeners import configure_sqlite
from mnestoma.engines.locking import (
    ENV_LOCK_TIMEOUT,
    busy_timeout_ms,
    lock_timeout_seconds,
    memory_database,
)
from mnestoma.engines.urls import resolve_database_url
from mnestoma.schema.models import refuse_view_inserts

__all__ = [
    "PRIVATE_FOLDER_MODE",
    "make_engine",
    "make_server_engine",
    "make_session_factory",
    "make_sqlite_engine",
]

# The mode of every folder the package creates for a new SQLite store: its owner's alone.
PRIVATE_FOLDER_MODE = 0o700


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An Engine for ``url`` (or the resolved default), configured as contract §3 says.

    SQLite: the parent folder is created (0700), a busy timeout, foreign keys, and every
    write transaction begins with ``BEGIN IMMEDIATE`` (see :mod:`mnestoma.engines.locking`); reads
    take no lock. PostgreSQL: psycopg 3 with pre-ping.

    Returns:
        The configured ``Engine``.

    Raises:
        InvalidInput: ``url`` is an engine, empty or not a database URL, or its SQLite
            folder cannot be created.
        MissingExtra: the URL's driver is not installed (the message names the extra).
    """
    if isinstance(url, Engine):
        raise InvalidInput("make_engine takes a URL; this is already an Engine: use it as it is")
    # Secret query keys travel as connect_args: the engine's URL (its repr, its logs) no
    # longer carries them. SQLAlchemy hides only the password of ``user:password@``.
    given = resolve_database_url(url)
    backend = backend_of(given)
    resolved, secrets = split_url_secrets(given, connection_strings=backend.server)
    engine = backend.build_engine(resolved, secrets, **kwargs)
    own_pool_after_fork(engine)
    return engine


def make_server_engine(url: URL, secrets: Mapping[str, Any], **kwargs: Any) -> Engine:
    """A database server's engine (PostgreSQL): ``secrets`` (taken out of the URL) passed as
    ``connect_args``, pre-ping, and the driver's errors of a failed connection scrubbed."""
    if secrets:
        kwargs["connect_args"] = {**secrets, **dict(kwargs.get("connect_args") or {})}
    kwargs.setdefault("pool_pre_ping", True)
    engine = _create_engine(url, **kwargs)
    _scrub_connect_errors(engine, secrets_of(url, kwargs.get("connect_args")))
    return engine


def _scrub_connect_errors(engine: Engine, secrets: list[str]) -> None:
    """Scrub the driver's error of a failed connection before anything shows it: the pool
    logs it (DEBUG), SQLAlchemy wraps it, and the server may echo a database name that holds
    a connection string with its password."""
    dialect = engine.dialect
    connect = dialect.connect

    def connect_scrubbed(*cargs: Any, **cparams: Any) -> Any:
        try:
            return connect(*cargs, **cparams)
        except Exception as err:
            scrub_exception(err, secrets)
            raise

    # after the do_connect listeners (a service's token provider), which the pool calls first
    replace_dialect_method(dialect, "connect", connect_scrubbed)


def _create_engine(url: URL, **kwargs: Any) -> Engine:
    """``create_engine``, with a missing driver named by the extra that installs it."""
    try:
        return create_engine(url, **kwargs)
    except ImportError as err:
        raise MissingExtra(backend_of(url).missing_driver(url, err)) from err
    except (ArgumentError, TypeError) as err:  # an engine option create_engine refuses
        raise InvalidInput(redact_text(str(err).splitlines()[0] if str(err) else "")) from None


def _create_private_folders(folder: Path) -> None:
    """Create ``folder`` and every missing folder above it, each 0700 whatever the umask:
    the folders of a new store are its owner's alone, not only the last one. Folders that
    exist are left as they are."""
    missing: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, PRIVATE_FOLDER_MODE)
        except FileExistsError:  # another process made it meanwhile: left as it is
            continue
        if stat.S_IMODE(os.lstat(made).st_mode) != PRIVATE_FOLDER_MODE:
            os.chmod(made, PRIVATE_FOLDER_MODE)  # a umask that takes the owner's own bits


def make_sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    """A SQLite engine: the file's folders made (0700), one busy timeout (the lock
    timeout), and the listeners of :mod:`~mnestoma.engines.listeners`."""
    if not memory_database(url) and url.database and not url.database.startswith("file:"):
        parent = Path(url.database).expanduser().absolute().parent
        try:
            _create_private_folders(parent)
        except OSError as err:  # /proc, a file in the way, no permission...
            raise InvalidInput(
                f"cannot create the folder of the SQLite file {url.database!r}: "
                f"{err.strerror or err}"
            ) from None
    connect_args = dict(kwargs.pop("connect_args", {}))
    # One timeout: SQLite's busy handler waits as long as a write waits for the lock
    # (MNESTOMA_LOCK_TIMEOUT), unless the caller gives the driver a timeout of its own.
    given = connect_args.get("timeout")
    what = ENV_LOCK_TIMEOUT if given is None else "connect_args['timeout']"
    busy_ms = busy_timeout_ms(lock_timeout_seconds(given, what))
    connect_args["timeout"] = busy_ms / 1000
    connect_args.setdefault("check_same_thread", False)
    engine = _create_engine(url, connect_args=connect_args, **kwargs)
    configure_sqlite(engine, busy_timeout_ms=busy_ms)
    return engine


def make_session_factory(engine: Engine, **kwargs: Any) -> sessionmaker[Session]:
    """A ``sessionmaker`` bound to ``engine``; objects stay readable after commit, and its
    sessions refuse a bulk INSERT into the read-only view.

    Returns:
        The ``sessionmaker``.
    """
    kwargs.setdefault("expire_on_commit", False)
    factory = sessionmaker(bind=engine, **kwargs)
    event.listen(factory, "do_orm_execute", refuse_view_inserts)
    return factory
