"""Where the database is (contract §3) and how engines and sessions are built."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import stat
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from .errors import InvalidInput, MissingExtra
from .locking import (
    ENV_LOCK_TIMEOUT,
    RESTS_AT_STATEMENTS,
    SNAPSHOT_INFO,
    busy_timeout_ms,
    driver_in_transaction,
    is_memory_sqlite,
    is_transaction_control,
    is_write_statement,
    lock_timeout_seconds,
    rest_before_statement,
    rest_busy_timeout,
    take_write_lock,
    track_writes,
    write_begins,
)
from .runner import own_listener

__all__ = [
    "WRITE_OPTION",
    "carries_secret",
    "default_sqlite_path",
    "is_memory_sqlite",
    "is_secret_key",
    "make_engine",
    "make_session_factory",
    "redact_text",
    "redact_url",
    "refuse_memory_sqlite",
    "resolve_database_url",
    "scrub_exception",
    "secrets_of",
    "split_url_secrets",
]

ENV_DATABASE_URL = "MNESTOMA_DATABASE_URL"
ENV_DB_PATH = "MNESTOMA_DB_PATH"
# The command line's read replicas (contract §12), comma-separated URLs.
ENV_REPLICA_URLS = "MNESTOMA_REPLICA_URLS"
ENV_WORKSPACE = "METNOS_WORKSPACE"
# The mode of every folder the package creates for a new SQLite store: its owner's alone.
PRIVATE_FOLDER_MODE = 0o700
# Execution option: on SQLite, transactions begin with the write lock whatever they run first
# (for a caller's own read-then-write transactions).
WRITE_OPTION = "mnestoma_write"


def default_sqlite_path() -> Path:
    """The embedded default: ``$METNOS_WORKSPACE/.mnestoma/mnest.sqlite`` or ``./.mnestoma/...``."""
    workspace = os.environ.get(ENV_WORKSPACE)
    base = Path(workspace) if workspace else Path.cwd()
    return base / ".mnestoma" / "mnest.sqlite"


def resolve_database_url(url: str | URL | None = None) -> URL:
    """The database URL by the contract's order: argument, env URL, env path, workspace, cwd.

    Only None falls back: an empty or blank string given by the caller (an unset shell
    variable, say) is :class:`InvalidInput`, never a silent switch to another store.
    """
    if url is not None:
        if isinstance(url, str) and not url.strip():
            raise InvalidInput(
                "the database URL is empty (an unset variable?): give a URL, or none at all "
                "for the default store"
            )
        return _parse(url)
    env_url = os.environ.get(ENV_DATABASE_URL, "").strip()
    if env_url:
        return _parse(env_url)
    env_path = os.environ.get(ENV_DB_PATH, "").strip()
    path = Path(env_path).expanduser() if env_path else default_sqlite_path()
    return URL.create("sqlite+pysqlite", database=str(path.absolute()))


# The driver each side opens a database with. Async: aiosqlite, and psycopg 3 in its async
# mode (SQLAlchemy picks psycopg's async dialect for ``postgresql+psycopg`` on an async
# engine). Sync (Alembic migrates synchronously, whatever the URL's driver): pysqlite, psycopg.
ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}
SYNC_DRIVERS = {"sqlite": "sqlite+pysqlite", "postgresql": "postgresql+psycopg"}


def async_database_url(url: str | URL | None = None) -> URL:
    """The URL the async door opens: resolved as contract §3 says; an explicit async driver
    is kept, a plain or sync one (``sqlite://``, ``postgresql://``) becomes the async one."""
    resolved = resolve_database_url(url)
    if resolved.get_dialect().is_async:
        return resolved
    return resolved.set(drivername=ASYNC_DRIVERS[resolved.get_backend_name()])


def sync_database_url(url: str | URL | None = None) -> URL:
    """The URL the migration door opens: resolved as contract §3 says, an async driver that
    the async door accepts (aiosqlite, psycopg_async, asyncpg) swapped for the sync one."""
    resolved = resolve_database_url(url)
    if not resolved.get_dialect().is_async:
        return resolved
    return resolved.set(drivername=SYNC_DRIVERS[resolved.get_backend_name()])


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
    # A bare postgresql:// would pick psycopg2; this package speaks psycopg 3.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "sqlite":
        parsed = parsed.set(drivername="sqlite+pysqlite")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidInput(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql"
        )
    try:
        parsed.get_dialect()  # the dialect only: its driver is imported by create_engine
    except NoSuchModuleError:
        raise InvalidInput(
            f"unknown database driver {parsed.drivername!r}: use sqlite:// or postgresql://"
        ) from None
    return parsed


# Query keys that carry a secret: libpq's password and sslpassword (the passphrase of the
# sslkey file), and anything named like a password, secret or token.
_SECRET_WORDS = ("password", "passwd", "passphrase", "pwd", "secret", "token", "credential")
REDACTED = "***"
_USERINFO = re.compile(r"(://[^:/@\s]*):[^@\s]*@")
# A key named like a secret and its ``=`` (``%3D`` in a connection string written inside a
# URL); where the value after it ends is read by _value_end.
_SPACE = r"[ \t\n\r\f\v]"  # libpq's isspace(): ASCII only
_ENCODED_SPACE = rf"(?:{_SPACE}|\+|%20|%0[9A-D])"  # as a URL writes one
_SECRET_KEY = re.compile(
    r"(?i)\b([\w.-]*(?:" + "|".join(_SECRET_WORDS) + r")[\w.-]*)"
    rf"({_SPACE}*={_SPACE}*|{_ENCODED_SPACE}*%3D{_ENCODED_SPACE}*)"
)
# libpq's connection string: a value runs to the next space, a backslash escaping the
# character after it, or it is a single-quoted string with backslash escapes.
_PLAIN_VALUE = re.compile(r"(?:\\.?|[^ \t\n\r\f\v\\])*", re.DOTALL)
_QUOTED_VALUE = {q: re.compile(rf"{q}(?:\\.?|[^{q}\\])*(?:{q}|\Z)", re.DOTALL) for q in ("'", '"')}
# A URL's query value (``?password=``) runs to the next ``&`` (a literal one is ``%26``).
_QUERY_VALUE = re.compile(r"(?:\\.?|[^ \t\n\r\f\v\\&])*", re.DOTALL)
# A connection string percent-encoded inside a URL: its quotes and escapes are encoded
# too, so its secret is taken to run to the end of that query value, or of the text.
_ENCODED_VALUE = re.compile(r"[^&]*", re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


# A secret shorter than this is hidden only after its key (``password=...``): hiding it
# wherever it appears would garble every message that happens to contain its letters.
MIN_BARE_SECRET_CHARS = 4
# The psycopg drivers read the URL's database as libpq's ``dbname``.
_DBNAME_DRIVERS = frozenset({"psycopg", "psycopg2", "psycopg_async"})


def is_secret_key(key: str) -> bool:
    """True for a URL query key whose value is a secret (``password``, ``sslpassword``...)."""
    low = key.lower()
    return any(word in low for word in _SECRET_WORDS)


def carries_secret(value: str) -> bool:
    """True for a value with a secret written inside it: a libpq connection string with
    ``password=...`` (libpq reads one from ``dbname``), a URL with ``user:password@``."""
    return redact_text(value) != value


def split_url_secrets(url: URL) -> tuple[URL, dict[str, Any]]:
    """The URL without its secrets, and those secrets (for ``connect_args``, which override
    what the URL says).

    A secret query key is dropped from the URL. On PostgreSQL, a query value or a database
    name holding a connection string with a password stays in the URL with the password
    hidden (a copy of the URL reaches no other database), its real value in the secrets.
    """
    secrets: dict[str, Any] = {k: v for k, v in url.query.items() if is_secret_key(k)}
    shown = url.difference_update_query(list(secrets)) if secrets else url
    if url.get_backend_name() == "sqlite":  # a file name is not a connection string
        return shown, secrets
    hidden = {k: v for k, v in shown.query.items() if _value_carries_secret(v)}
    if hidden:
        secrets.update(hidden)
        shown = shown.update_query_dict({k: _redact_query_value(v) for k, v in hidden.items()})
    database = url.database
    if database and url.get_driver_name() in _DBNAME_DRIVERS and carries_secret(database):
        secrets.setdefault("dbname", database)
        shown = shown.set(database=redact_text(database))
    return shown, secrets


def _value_carries_secret(value: str | tuple[str, ...]) -> bool:
    values = (value,) if isinstance(value, str) else value
    return any(carries_secret(v) for v in values)


def secrets_of(url: URL, connect_args: dict[str, Any] | None = None) -> list[str]:
    """Every secret value a connection made from ``url`` and ``connect_args`` knows: the
    password, the values of secret keys, and the secrets inside connection strings (as
    written, and as libpq reads them: unquoted, unescaped)."""
    found = [url.password] if url.password else []
    values: list[tuple[str, Any]] = [*url.query.items(), *(connect_args or {}).items()]
    if url.database:
        values.append(("dbname", url.database))
    for key, value in values:
        for text in (value,) if isinstance(value, str) else value or ():
            if not isinstance(text, str):
                continue
            if is_secret_key(key):
                found.append(text)
            else:
                for start, ends in _secret_values(text):
                    found.extend(r for end in ends for r in _readings(text[start:end]))
    return [str(s) for s in found if str(s)]


def _readings(value: str) -> list[str]:
    """A secret value as written and as libpq reads it (without its quotes, unescaped)."""
    inner = value
    if value[:1] in _QUOTED_VALUE and len(value) > 1:
        inner = value[1:-1] if value.endswith(value[0]) else value[1:]
    forms = (value, _ESCAPED.sub(r"\1", value), inner, _ESCAPED.sub(r"\1", inner))
    return list(dict.fromkeys(forms))


def scrub_exception(err: BaseException, secrets: Iterable[str] = ()) -> None:
    """Hide, in place, every secret in the messages of ``err`` and of what it chains (its
    cause, its context, the driver error SQLAlchemy wraps): whoever shows or logs the whole
    traceback (``mnestoma --debug``, a service's logger) sees none. ``secrets`` are values
    known to be secret, hidden even where no key names them."""
    known = {s for s in secrets if len(s) >= MIN_BARE_SECRET_CHARS}
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        exc = stack.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        args = tuple(redact_text(a, known) if isinstance(a, str) else a for a in exc.args)
        if args != exc.args:
            exc.args = args
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact_text(n, known) if isinstance(n, str) else n for n in notes]
        orig = getattr(exc, "orig", None)
        stack.extend(
            (exc.__cause__, exc.__context__, orig if isinstance(orig, BaseException) else None)
        )


def redact_url(url: str | URL) -> str:
    """The URL as text with every secret it can carry hidden: the password of
    ``user:password@``, the value of every secret query key (``?password=``,
    ``sslpassword``, any key named like a password, secret or token), and a password
    written inside a connection string held by a query value or the database name."""
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        return redact_text(str(url))
    if not isinstance(parsed, URL):
        return redact_text(str(url))
    query = {
        k: REDACTED if is_secret_key(k) else _redact_query_value(v) for k, v in parsed.query.items()
    }
    database = redact_text(parsed.database) if parsed.database else parsed.database
    shown = parsed.set(query=query, database=database).render_as_string(hide_password=True)
    return redact_text(shown.replace("%2A%2A%2A", REDACTED))


def _redact_query_value(value: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """A non-secret query value, with any secret written inside it hidden (libpq reads a
    whole connection string from ``dbname``)."""
    if isinstance(value, tuple):
        return tuple(redact_text(v) for v in value)
    return redact_text(value)


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """Hide secrets inside free text (an error message): ``user:password@`` in URLs, the
    value of ``password=...``, ``sslpassword=...`` (and any key named like a secret) in
    query strings and libpq connection strings, however it is quoted or escaped, and each
    ``known`` secret wherever it appears. All are found in the text as given, then hidden
    together: hiding one first could cut another in two."""
    spans = [(m.end(1) + 1, m.end() - 1) for m in _USERINFO.finditer(text)]
    spans += _secret_spans(text)
    for secret in known:
        at = text.find(secret) if secret else -1
        while at >= 0:
            spans.append((at, at + len(secret)))
            at = text.find(secret, at + 1)
    shown: list[str] = []
    pos = 0
    for start, end in _merged(spans):
        shown += (text[pos:start], REDACTED)
        pos = end
    shown.append(text[pos:])
    return "".join(shown)


def _merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The non-empty ``spans`` in order, those that overlap or touch joined into one."""
    current: tuple[int, int] | None = None
    for start, end in sorted(span for span in spans if span[1] > span[0]):
        if current is not None and start <= current[1]:
            current = (current[0], max(current[1], end))
            continue
        if current is not None:
            yield current
        current = (start, end)
    if current is not None:
        yield current


def _secret_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where each value of a key named like a secret starts and ends in ``text``: the
    longest of the ways it can be read, so that none leaves a part of it shown."""
    for start, ends in _secret_values(text):
        yield start, max(ends)


def _secret_values(text: str) -> Iterator[tuple[int, list[int]]]:
    """Where each value of a key named like a secret starts, and where each way of reading
    it ends: unquoted, or a quoted string with backslash escapes (libpq's single quotes, a
    message's double quotes)."""
    pos = 0
    while (found := _SECRET_KEY.search(text, pos)) is not None:
        start = found.end()
        ends = [_match_end(_reading_of(text, found), text, start)]
        quoted = _QUOTED_VALUE.get(text[start : start + 1])
        if quoted is not None:
            ends.append(_match_end(quoted, text, start))
        ends = [end for end in ends if end > start]
        if ends:
            yield start, ends
        pos = max([start, *ends])


def _reading_of(text: str, key: re.Match[str]) -> re.Pattern[str]:
    """How the unquoted value after ``key`` is read: percent-encoded, a URL query's, or
    libpq's."""
    if "%3D" in key.group(2).upper():
        return _ENCODED_VALUE
    if key.group(2) == "=" and text[key.start() - 1 : key.start()] in ("?", "&"):
        return _QUERY_VALUE
    return _PLAIN_VALUE


def _match_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    found = pattern.match(text, start)
    return found.end() if found is not None else start


def is_sqlite(url_or_engine: URL | Engine) -> bool:
    """True for a SQLite URL or engine."""
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else url_or_engine
    return url.get_backend_name() == "sqlite"


def refuse_memory_sqlite(url: URL) -> None:
    """Raise :class:`InvalidInput` for an in-memory SQLite database, however it is spelled
    (see :func:`is_memory_sqlite`): a store is shared, and outlives its connections."""
    if is_memory_sqlite(url):
        raise InvalidInput("an in-memory SQLite database cannot be shared: use a file")


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An Engine for ``url`` (or the resolved default), configured as contract §3 says.

    SQLite: the parent folder is created (0700), a busy timeout, foreign keys, and every
    write transaction begins with ``BEGIN IMMEDIATE`` (see :mod:`mnestoma.locking`); reads
    take no lock. PostgreSQL: psycopg 3 with pre-ping.
    """
    if isinstance(url, Engine):
        raise InvalidInput("make_engine takes a URL; this is already an Engine: use it as it is")
    # Secret query keys travel as connect_args: the engine's URL (its repr, its logs) no
    # longer carries them. SQLAlchemy hides only the password of ``user:password@``.
    resolved, secrets = split_url_secrets(resolve_database_url(url))
    if is_sqlite(resolved):  # pysqlite ignores them (SQLite has no passwords)
        engine = _make_sqlite_engine(resolved, **kwargs)
    else:
        if secrets:
            kwargs["connect_args"] = {**secrets, **dict(kwargs.get("connect_args") or {})}
        kwargs.setdefault("pool_pre_ping", True)
        engine = _create_engine(resolved, **kwargs)
        _scrub_connect_errors(engine, secrets_of(resolved, kwargs.get("connect_args")))
    own_pool_after_fork(engine)
    return engine


# Every engine of the package's in use (built by make_engine, or given to a store): a forked
# child gives each a pool of its own.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def own_pool_after_fork(engine: Engine) -> None:
    """Have a forked child give ``engine`` a connection pool of its own (see below), and,
    on SQLite, a fork wait for the writes in progress on it (see :mod:`mnestoma.locking`)."""
    _ENGINES.add(engine)
    track_writes(engine)


def _own_pools_after_fork() -> None:
    """In a forked child (``gunicorn --preload``, multiprocessing's "fork"), the inherited
    pools hold the parent's connections, which two processes must never use: SQLAlchemy's
    recipe, ``dispose(close=False)``, gives each engine a new pool and leaves the parent's
    connections to the parent."""
    for engine in list(_ENGINES):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_pools_after_fork)


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
    setattr(dialect, "connect", connect_scrubbed)  # noqa: B010 - mypy refuses a method assignment


def _create_engine(url: URL, **kwargs: Any) -> Engine:
    """``create_engine``, with a missing driver named by the extra that installs it."""
    try:
        return create_engine(url, **kwargs)
    except ImportError as err:
        if url.get_backend_name() == "postgresql":
            raise MissingExtra(
                f"the PostgreSQL driver of {url.drivername!r} is not installed "
                f'({err}): pip install "mnestoma[postgresql]" (psycopg 3)'
            ) from err
        raise MissingExtra(f"the driver of {url.drivername!r} is not installed: {err}") from err
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


def _make_sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    if not is_memory_sqlite(url) and url.database and not url.database.startswith("file:"):
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
    _configure_sqlite(engine, busy_timeout_ms=busy_ms)
    return engine


def _configure_sqlite(engine: Engine, *, busy_timeout_ms: int) -> None:
    """The pysqlite recipe: the driver never begins a transaction itself; this package does.

    A transaction begins at its first statement: with ``BEGIN IMMEDIATE`` (waiting for the
    write lock) when that statement writes or the connection has ``WRITE_OPTION``, else
    with a plain ``BEGIN``: a read snapshot that takes no lock (in WAL mode it never waits
    for a writer). The package's own writes take the lock before they read anything.
    Per-connection settings only: nothing here changes the file (the journal mode is set
    when the package creates or migrates a store).
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            cur.execute("PRAGMA synchronous = NORMAL")
            cur.execute("PRAGMA foreign_keys = ON")
        finally:
            cur.close()
        rest_busy_timeout(record.info, busy_timeout_ms)
        try:
            dbapi_conn.execute("SELECT exp(0.0)").fetchone()
        except sqlite3.OperationalError:
            # SQLite built without its math functions: the ager's SQL needs exp().
            dbapi_conn.create_function("exp", 1, _safe_exp, deterministic=True)

    @own_listener
    def _before_execute(
        conn: Connection, _cursor: Any, statement: str, parameters: Any, *_args: Any
    ) -> tuple[str, Any]:
        _begin_for(conn, statement)
        return statement, parameters

    # retval=True keeps the function itself in the listener list, where the statement runner
    # recognises it as the package's own (see runner.unobserved)
    event.listen(engine, "before_cursor_execute", _before_execute, retval=True)
    setattr(engine.dialect, RESTS_AT_STATEMENTS, True)  # see _begin_for


def _begin_for(conn: Connection, statement: str) -> None:
    """Begin SQLite's transaction the way ``statement`` needs: the write lock before a write,
    a read snapshot before a read (see :mod:`mnestoma.locking`)."""
    dbapi_conn = conn.connection.dbapi_connection
    if dbapi_conn is None:
        return
    # A write of the package's that held the lock left its short busy timeout: every other
    # statement waits the lock timeout (the write's own statements do not come here).
    rest_before_statement(dbapi_conn, conn.connection.info)
    if not conn.in_transaction():
        return
    if driver_in_transaction(dbapi_conn):
        if is_write_statement(statement):
            write_begins(dbapi_conn, conn)  # at once when its write is already noted
            conn.connection.info.pop(SNAPSHOT_INFO, None)  # no longer read-only
        return
    if is_write_statement(statement) or conn.get_execution_options().get(WRITE_OPTION):
        take_write_lock(conn)
    elif not is_transaction_control(statement):
        dbapi_conn.execute("BEGIN")
        conn.connection.info[SNAPSHOT_INFO] = True


def _safe_exp(x: float | None) -> float | None:
    if x is None:
        return None
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def make_session_factory(engine: Engine, **kwargs: Any) -> sessionmaker[Session]:
    """A ``sessionmaker`` bound to ``engine``; objects stay readable after commit, and its
    sessions refuse a bulk INSERT into the read-only view."""
    from .models import refuse_view_inserts

    kwargs.setdefault("expire_on_commit", False)
    factory = sessionmaker(bind=engine, **kwargs)
    event.listen(factory, "do_orm_execute", refuse_view_inserts)
    return factory
