"""Where the database is (contract §3) and how engines and sessions are built: the public
names, each from the module that holds it (:mod:`mnestoma.urls`, :mod:`mnestoma.engines`,
:mod:`mnestoma.listeners`, :mod:`mnestoma.forking`, :mod:`mnestoma.redaction`)."""

from __future__ import annotations

from .engines import PRIVATE_FOLDER_MODE, make_engine, make_session_factory
from .forking import own_pool_after_fork
from .listeners import WRITE_OPTION
from .locking import is_memory_sqlite
from .redaction import (
    MIN_BARE_SECRET_CHARS,
    REDACTED,
    carries_secret,
    is_secret_key,
    redact_text,
    redact_url,
    scrub_exception,
    secrets_of,
    split_url_secrets,
)
from .urls import (
    ASYNC_DRIVERS,
    ENV_DATABASE_URL,
    ENV_DB_PATH,
    ENV_REPLICA_URLS,
    ENV_WORKSPACE,
    SYNC_DRIVERS,
    async_database_url,
    default_sqlite_path,
    is_sqlite,
    refuse_memory_sqlite,
    resolve_database_url,
    sync_database_url,
)

__all__ = [
    "ASYNC_DRIVERS",
    "ENV_DATABASE_URL",
    "ENV_DB_PATH",
    "ENV_REPLICA_URLS",
    "ENV_WORKSPACE",
    "MIN_BARE_SECRET_CHARS",
    "PRIVATE_FOLDER_MODE",
    "REDACTED",
    "SYNC_DRIVERS",
    "WRITE_OPTION",
    "async_database_url",
    "carries_secret",
    "default_sqlite_path",
    "is_memory_sqlite",
    "is_secret_key",
    "is_sqlite",
    "make_engine",
    "make_session_factory",
    "own_pool_after_fork",
    "redact_text",
    "redact_url",
    "refuse_memory_sqlite",
    "resolve_database_url",
    "scrub_exception",
    "secrets_of",
    "split_url_secrets",
    "sync_database_url",
]
