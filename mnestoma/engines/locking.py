"""How a write takes the database's write lock up front, and how migrations serialise.

SQLite has one writer at a time. A transaction that reads first and writes later may find
that another writer committed in between, and then fails at once ("database is locked")
whatever the busy timeout. So every write through this package starts its transaction
with ``BEGIN IMMEDIATE`` and waits for the lock; reads take no lock at all (in WAL mode they
never wait for a writer). PostgreSQL needs nothing here: its row locks do the same job,
and migrations take an advisory lock (held for the whole session by an upgrade whose
revisions commit one by one, see :func:`mnestoma.migration.revision_session`). The
functions that serve both engines ask their backend (:func:`~mnestoma.engines.backend_of`);
the others are SQLite's, which :mod:`mnestoma.engines.sqlite` hands out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote

from sqlalchemy import URL, Connection
from sqlalchemy.engine.interfaces import AdaptedConnection

from mnestoma.core._sqla_compat import replace_dialect_method
from mnestoma.core.errors import InvalidInput, StoreError, WriteLockTimeout
from mnestoma.core.rules import (
    AGER_YIELD_EVERY_S,
    AGER_YIELD_MAX_S,
    AGER_YIELD_POLL_S,
    BATCH_PAUSE_S,
    FORK_WAIT_S,
    WRITE_LOCK_FIRST_PAUSE_S,
    WRITE_LOCK_POLL_S,
)
from mnestoma.core.validation import check_lock_timeout, shorten
from mnestoma.engines.backend import BY_NAME, backend_of
from mnestoma.engines.doorbell import Doorbell, doorbell

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "ENV_LOCK_TIMEOUT",
    "LOCK_TIMEOUT_OPTION",
    "MAX_BUSY_TIMEOUT_MS",
    "RESTS_AT_STATEMENTS",
    "SNAPSHOT_INFO",
    "STORE_FILE_SUFFIXES",
    "WRITE_LOCK_POLL_S",
    "WaitingWriters",
    "bell_file",
    "beside_store",
    "busy_timeout_ms",
    "driver_in_transaction",
    "is_memory_sqlite",
    "is_transaction_control",
    "is_write_statement",
    "lock_for_migration",
    "lock_timeout",
    "lock_timeout_of",
    "lock_timeout_seconds",
    "memory_database",
    "open_beside_store",
    "pause_on",
    "pauses_letting_writers_in",
    "rest_before_statement",
    "rest_busy_timeout",
    "saying_it_waits",
    "sqlite_file_named",
    "sqlite_store_files",
    "store_files",
    "take_write_lock",
    "track_writes",
    "try_flock",
    "use_wal",
    "waiting_file",
    "write_begins",
    "write_lock_timeout",
]

logger = logging.getLogger("mnestoma.locking")  # the logger's public name

ENV_LOCK_TIMEOUT = "MNESTOMA_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 60.0
# Execution option (on an Engine or Connection): seconds a write waits for SQLite's lock.
LOCK_TIMEOUT_OPTION = "mnestoma_lock_timeout"
# SQLite keeps its busy timeout in a C int of milliseconds (about 24.8 days at most).
MAX_BUSY_TIMEOUT_MS = 2**31 - 1
# Connection info keys: the busy timeout (ms) a connection keeps between writes (make_engine
# gives it the lock timeout when it connects), and the one it has now.
_BUSY_REST_INFO = "mnestoma_busy_timeout_ms"
_BUSY_NOW_INFO = "mnestoma_busy_timeout_now_ms"
# Connection info key: True once the connection has seen its store in WAL mode.
_WAL_INFO = "mnestoma_wal"
# Any 64-bit number is fine as long as it is this package's alone: "mnestoma" in ASCII.
MIGRATION_LOCK_KEY = 0x6D6E6573746F6D61

# Connection info key: the doorbell a maintenance batch's transaction rings as it commits,
# and empties once the commit (and the checkpoint SQLite may run in it) is over.
_RING_AT_COMMIT_INFO = "mnestoma_ring_at_commit"
# Connection info key: the driver-level transaction is a read snapshot this package began.
SNAPSHOT_INFO = "mnestoma_snapshot_only"
_CONTROL_WORDS = frozenset({"BEGIN", "COMMIT", "END", "ROLLBACK", "RELEASE", "PRAGMA"})
_WRITE_WORDS = frozenset(
    {"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER", "SAVEPOINT"}
    | {"ANALYZE", "REINDEX"}
)


def is_write_statement(sql: str) -> bool:
    """True for SQL that writes (and so must run in a transaction holding the write lock)."""
    head = sql.lstrip()[:10].split(None, 1)
    return bool(head) and head[0].upper() in _WRITE_WORDS


def is_transaction_control(sql: str) -> bool:
    """True for BEGIN, COMMIT, ROLLBACK, RELEASE and PRAGMA: never wrapped in a transaction."""
    head = sql.lstrip()[:10].split(None, 1)
    return bool(head) and head[0].upper() in _CONTROL_WORDS


def lock_timeout(conn: Connection) -> float:
    """Seconds a write waits for SQLite's write lock: the execution option, else
    ``MNESTOMA_LOCK_TIMEOUT``, else 60."""
    return lock_timeout_of(conn.get_execution_options())


def lock_timeout_of(options: Mapping[str, Any]) -> float:
    """The lock timeout that execution ``options`` give (see :func:`lock_timeout`), checked,
    an error naming the option when it is the one at fault. Asked at every write: a value
    that passed the check is remembered (by its type and value, and the environment's text
    where it is read from there), one that fails is checked, and refused, each time."""
    given = options.get(LOCK_TIMEOUT_OPTION)
    env = os.environ.get(ENV_LOCK_TIMEOUT, "") if given is None else ""
    key = (type(given), given, env)
    try:
        return _CHECKED_TIMEOUTS[key]
    except (KeyError, TypeError):  # not seen yet, or a value that cannot be a key
        pass
    seconds = lock_timeout_seconds(
        given, ENV_LOCK_TIMEOUT if given is None else LOCK_TIMEOUT_OPTION
    )
    with contextlib.suppress(TypeError):
        if len(_CHECKED_TIMEOUTS) >= _CHECKED_TIMEOUTS_MAX:
            _CHECKED_TIMEOUTS.clear()
        _CHECKED_TIMEOUTS[key] = seconds
    return seconds


# The lock timeouts already checked (see lock_timeout_of); a handful in any one process.
_CHECKED_TIMEOUTS: dict[tuple[type, Any, str], float] = {}
_CHECKED_TIMEOUTS_MAX = 64


def lock_timeout_seconds(value: Any = None, what: str = ENV_LOCK_TIMEOUT) -> float:
    """``value`` as a lock timeout in seconds, from 0 to one day; None: ``MNESTOMA_LOCK_TIMEOUT``,
    else 60. Text is read as a number first; the number passes the one check
    (:func:`~mnestoma.core.validation.check_lock_timeout`) that ``Settings`` uses too."""
    if value is None:
        value = os.environ.get(ENV_LOCK_TIMEOUT, "").strip() or DEFAULT_LOCK_TIMEOUT_S
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidInput(
                f"{what} must be a number of seconds, got {shorten(value)!r}"
            ) from None
    return check_lock_timeout(value, what)


def busy_timeout_ms(seconds: float) -> int:
    """``seconds`` as SQLite's busy timeout: milliseconds rounded up, at most what it holds."""
    return math.ceil(min(max(seconds, 0.0) * 1000, MAX_BUSY_TIMEOUT_MS))


def rest_busy_timeout(info: dict[Any, Any], ms: int) -> None:
    """Note in a connection's ``info`` the busy timeout it was given when it connected: the
    one it keeps between writes, which :func:`take_write_lock` puts back after waiting."""
    info[_BUSY_REST_INFO] = info[_BUSY_NOW_INFO] = ms


def driver_in_transaction(dbapi: Any) -> bool:
    """True while the SQLite driver's connection is inside a transaction, also behind
    SQLAlchemy's asyncio adapter (aiosqlite), which does not expose sqlite3's attribute."""
    if isinstance(dbapi, AdaptedConnection):
        return bool(dbapi.driver_connection.in_transaction)
    return bool(dbapi.in_transaction)


def take_write_lock(conn: Connection, *, maintenance: bool = False) -> None:
    """Begin the transaction with SQLite's write lock (``BEGIN IMMEDIATE``), waiting for it.

    A write that finds the lock taken sleeps between its tries (see
    :func:`_execute_waiting`); with ``maintenance`` (a batch of the ager or of a prune,
    which writers wait for between batches) it tries every
    :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S`, since nothing rings for it; once it
    holds the lock it empties the store's doorbell, and rings it as it commits (see
    :func:`track_writes`).

    Does nothing on PostgreSQL, nor when the connection is already in a transaction that
    wrote or that began otherwise than by a read (an explicit BEGIN, a savepoint, any
    transaction on a caller's own ``create_engine`` engine): a read snapshot there that cannot
    be upgraded gives a ConflictError at the write that needs it. A transaction that only
    read, begun by the listener of a ``make_engine`` engine (whoever's session runs on it),
    is ended first: it wrote nothing, and its reads were read committed. Raises
    :class:`WriteLockTimeout` when another writer keeps the lock longer than
    :func:`lock_timeout`.
    """
    if not BY_NAME[conn.dialect.name].one_writer:  # on every write: no call
        return
    dbapi = conn.connection.dbapi_connection
    if dbapi is None:
        return
    # A caller's own create_engine engine, never handed to a store, is tracked from its
    # first write: without it the write would stay noted after its commit, and every child
    # forked later would refuse to write to the store.
    track_writes(conn.engine)
    write_begins(dbapi, conn)
    if driver_in_transaction(dbapi):
        if not conn.connection.info.pop(SNAPSHOT_INFO, False):
            return
        # A snapshot that has only read: end it (nothing to lose) rather than upgrade it,
        # which fails once another writer has committed since it began.
        dbapi.execute("COMMIT")
    info = conn.connection.info
    try:
        _begin_immediate(
            dbapi,
            info,
            lock_timeout(conn),
            waiting=lambda: waiting_file(conn.engine.url),
            rest_after=_rests_after_write(conn, dbapi, info),
            bell=(lambda: doorbell(bell_file(conn.engine.url)))
            if isinstance(dbapi, sqlite3.Connection) and not maintenance
            else None,
        )
    except BaseException:
        _end_write(dbapi)  # no transaction: the lock was not taken
        raise
    info.pop(SNAPSHOT_INFO, None)
    if maintenance:
        bell = doorbell(bell_file(conn.engine.url), create=False)
        if bell is not None:
            bell.hush()  # its batch holds the lock: nothing to wake for
            info[_RING_AT_COMMIT_INFO] = bell


def _rests_after_write(conn: Connection, dbapi: Any, info: dict[Any, Any]) -> bool:
    """True when the write about to begin may keep its busy timeout of 0 (see
    :func:`_execute_waiting`) until its transaction ends, the resting one put back then (see
    :func:`track_writes`) rather than once the lock is held, while other writers queue for
    it: its engine's transactions are tracked, and the store is in WAL mode, where a
    statement of a transaction that holds the write lock, its COMMIT included, never waits
    for another connection. Read once per connection: a store cannot leave WAL mode while
    another connection to it is open."""
    if not getattr(conn.dialect, "_mnestoma_tracks_writes", False) or not isinstance(
        dbapi, sqlite3.Connection
    ):
        return False
    wal = info.get(_WAL_INFO)
    if wal is None:
        wal = info[_WAL_INFO] = _journal_mode(dbapi) == "wal"
    return bool(wal)


def _journal_mode(dbapi: Any) -> str:
    """The journal mode of the connection's store (lower case)."""
    mode = _pragma(dbapi, "journal_mode")
    return "" if mode is None else str(mode).lower()


def _pragma(dbapi: Any, name: str) -> Any:
    """The value SQLite's ``PRAGMA name`` reads on the driver connection (None: no row)."""
    cursor = dbapi.cursor()
    try:
        cursor.execute(f"PRAGMA {name}")
        row = cursor.fetchone()
    finally:
        cursor.close()
    return row[0] if row else None


def use_wal(conn: Connection) -> None:
    """Switch the connection's SQLite file to WAL (kept in the file), waiting for the lock the
    switch needs as a write waits for its lock (:func:`lock_timeout`). Processes that open a
    new file at once all try the switch; SQLite may refuse one of them at once, without its
    busy handler, and a file already in WAL needs no lock."""
    dbapi = conn.connection.dbapi_connection
    if dbapi is None or str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower() == "wal":
        return
    _execute_waiting(dbapi, conn.connection.info, "PRAGMA journal_mode = WAL", lock_timeout(conn))
    conn.connection.info[_WAL_INFO] = True


def _begin_immediate(
    dbapi: Any,
    info: dict[Any, Any],
    timeout: float,
    *,
    waiting: Callable[[], str | None] | None = None,
    rest_after: bool = False,
    bell: Callable[[], Doorbell | None] | None = None,
) -> None:
    """``BEGIN IMMEDIATE`` within ``timeout`` seconds in all, or WriteLockTimeout (see
    :func:`_execute_waiting`); with ``rest_after``, the resting busy timeout is put back
    when the transaction ends, not once the lock is held (see :func:`_rests_after_write`)."""
    _execute_waiting(
        dbapi, info, "BEGIN IMMEDIATE", timeout, waiting=waiting, rest_after=rest_after, bell=bell
    )


def _execute_waiting(
    dbapi: Any,
    info: dict[Any, Any],
    statement: str,
    timeout: float,
    *,
    waiting: Callable[[], str | None] | None = None,
    rest_after: bool = False,
    bell: Callable[[], Doorbell | None] | None = None,
) -> None:
    """``statement``, which needs SQLite's write lock, within ``timeout`` seconds in all, or
    WriteLockTimeout.

    Each attempt runs with no busy timeout: it takes the lock or fails at once, and the
    write sleeps between its attempts (:data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S`
    after the first, then :data:`~mnestoma.rules.WRITE_LOCK_POLL_S` while it says that it
    waits and sleeps on the store's doorbell, which ``bell()`` gives; while a maintenance
    run rings it, from its batch's commit to the end of its pause, the write tries every
    :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S` again, see :mod:`~.doorbell`), within
    what is left of ``timeout``. SQLite's busy handler would wake it every millisecond or
    two: under many writers those wake-ups kept the holder from running.
    The connection's resting busy timeout is put back afterwards. From its first attempt
    that finds the lock taken until it has it, the write says that it waits (a shared
    ``flock`` on the file ``waiting()`` names, see :class:`WaitingWriters`), so that an
    ager or a prune between two batches lets it in. With ``rest_after``, a statement that
    succeeded leaves the busy timeout of 0 until its transaction ends
    (:func:`track_writes`): in WAL mode nothing the transaction runs waits for another
    connection.
    """
    if _BUSY_REST_INFO not in info:  # a connection make_engine did not open
        rest_busy_timeout(info, _read_busy_timeout(dbapi))
    deadline = time.monotonic() + timeout
    said = -1  # the descriptor holding the shared flock once the write says it waits
    rings: Doorbell | None = None  # the bell it sleeps on once it says it waits
    pause = WRITE_LOCK_FIRST_PAUSE_S
    done = False
    try:
        _set_busy_timeout(dbapi, info, 0)
        while True:
            try:
                dbapi.execute(statement)
                done = True
                return
            except sqlite3.OperationalError as err:
                text_ = str(err).lower()
                if "locked" not in text_ and "busy" not in text_:
                    raise
            if said < 0 and waiting is not None:
                said = _say_waiting(waiting())
            left = deadline - time.monotonic()
            if left <= 0:
                raise write_lock_timeout(timeout) from None
            if rings is None and said >= 0 and bell is not None:
                rings = bell()
            if rings is None or rings.rung():  # a maintenance run lets the lock go
                _pause(dbapi, min(WRITE_LOCK_FIRST_PAUSE_S, left))
            else:
                rings.sleep(min(pause, left))
                pause = WRITE_LOCK_POLL_S
    finally:
        _stop_saying(said)  # releases the flock: no longer waiting
        if not (done and rest_after):
            with contextlib.suppress(sqlite3.Error):  # never hide the error that ended the wait
                _set_busy_timeout(dbapi, info, info[_BUSY_REST_INFO])


# Dialect attribute: its engine's listener runs rest_before_statement before each statement.
RESTS_AT_STATEMENTS = "_mnestoma_rests_at_statements"


def rest_before_statement(dbapi: Any, info: dict[Any, Any]) -> None:
    """Before a statement SQLAlchemy (or the statement runner, for a transaction that does
    not hold the write lock) runs on a SQLite connection: the connection's resting busy
    timeout, should a write have left it its busy timeout of 0 (see :func:`take_write_lock`)."""
    rest = info.get(_BUSY_REST_INFO)
    if rest is not None and info.get(_BUSY_NOW_INFO) != rest:
        _set_busy_timeout(dbapi, info, rest)


def _rest_busy_timeout(dbapi: Any) -> None:
    """Once a transaction has ended: the connection's resting busy timeout back, when its
    write kept its busy timeout of 0 (``dbapi`` is the pool's proxy of the driver's connection,
    which carries the connection's ``info``)."""
    try:
        info = dbapi.info
    except (AttributeError, NotImplementedError):  # a bare connection, SQLAlchemy's first one
        return
    if _BUSY_REST_INFO not in info:
        return
    if info.get(_BUSY_NOW_INFO) != info[_BUSY_REST_INFO]:
        with contextlib.suppress(sqlite3.Error):
            _set_busy_timeout(_driver_of(dbapi), info, info[_BUSY_REST_INFO])


def _say_waiting(path: str | None) -> int:
    """Take a shared ``flock`` on ``path`` (created if need be); its descriptor, or -1 when
    there is no such file to lock (an in-memory database, a folder it cannot write in, a
    file system or system without ``flock``) or the ager is looking at that instant (the
    next attempt says it again)."""
    fd = _open_lock_file(path)
    if fd < 0:
        return -1
    try:
        if try_flock(fd, exclusive=False):
            _SAYING.add(fd)
            return fd
    except OSError:  # no flock on this file system: the ager's pauses let the write in
        pass
    os.close(fd)
    return -1


def _open_lock_file(path: str | None) -> int:
    """A descriptor of the waiting writers' lock file ``path`` (created if need be), or -1:
    no file, no ``flock`` on this system, or a file that cannot serve (see
    :func:`open_beside_store`), which is said once in the log. A write is never refused for
    it: it waits without saying so, and the ager pauses between batches instead."""
    if path is None or _fcntl is None:
        return -1
    try:
        return open_beside_store(path, "the waiting writers' lock file")
    except StoreError as err:
        _warn_once(
            path,
            f"{err}. Writes go on without saying that they wait; the ager pauses between "
            "its batches instead",
        )
        return -1


# The files beside a store: never through a link planted there, never waiting on a FIFO
# (O_NONBLOCK: a regular file ignores it, and flock never blocks on it), never a terminal.
_BESIDE_FLAGS = (
    getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def open_beside_store(path: str, what: str, *, create: bool = True) -> int:
    """A read-only descriptor of the regular file ``path`` beside a store (created empty,
    0644, when missing and ``create``), opened without following a symbolic link and
    without blocking on a FIFO; else StoreError naming ``what`` and the file and saying what
    is wrong. Read-only is all ``flock`` needs, so that a file another user's run left
    serves as well."""
    flags = os.O_RDONLY | (os.O_CREAT if create else 0) | _BESIDE_FLAGS
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        raise StoreError(_cannot_use(what, path, _what_is_wrong(path, err, create))) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StoreError(_cannot_use(what, path, f"it is {_kind(mode)}, not a regular file"))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _cannot_use(what: str, path: str, problem: str) -> str:
    return (
        f"cannot use {path!r}, {what} beside the store: {problem}; remove it, or make it an "
        "empty regular file this user can read (the package creates one when it is missing)"
    )


def _what_is_wrong(path: str, err: OSError, create: bool) -> str:
    """Why ``path`` could not be opened, in words: what is there, or why it cannot be made."""
    try:
        found = os.lstat(path)
    except OSError:
        return f"cannot {'create' if create else 'open'} it ({err.strerror or err})"
    if not stat.S_ISREG(found.st_mode):
        return f"it is {_kind(found.st_mode)}, not a regular file"
    return (
        f"cannot open it ({err.strerror or err}; it belongs to uid {found.st_uid}, "
        f"mode {stat.S_IMODE(found.st_mode):o})"
    )


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message."""
    if stat.S_ISLNK(mode):
        return "a symbolic link (never followed there)"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


_WARNED: set[tuple[str, str]] = set()


def _warn_once(path: str, message: str) -> None:
    """Log ``message`` about the file ``path`` once in this process."""
    if (path, message) not in _WARNED:
        _WARNED.add((path, message))
        logger.warning("%s", message)


def _stop_saying(fd: int) -> None:
    """Close a descriptor :func:`_say_waiting` returned: the write no longer waits."""
    if fd >= 0:
        _SAYING.discard(fd)
        os.close(fd)


@contextlib.contextmanager
def saying_it_waits(path: str | None) -> Iterator[None]:
    """Say, for the block, that a write waits for the write lock of the SQLite database whose
    :func:`waiting_file` is ``path`` (None: nothing to say): the async facade's writes that
    queue for its own lock before SQLite's."""
    fd = _say_waiting(path)
    try:
        yield
    finally:
        _stop_saying(fd)


# The descriptors on which writes of this process say that they wait. A child forked
# meanwhile closes its copies: they would go on saying it for a write that is not its own.
_SAYING: set[int] = set()


def _forget_waiting_in_child() -> None:
    for fd in list(_SAYING):
        with contextlib.suppress(OSError):
            os.close(fd)
    _SAYING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_waiting_in_child)


# --- forking while a write is in progress (SQLite) -------------------------------------------
#
# A forked child gets a copy of SQLite's in-process state, which says which connection of the
# process holds each file's write lock (the OS locks, per process, are not inherited). A
# connection inside a write at the fork stays, in the child, the holder of that lock for good
# (its thread is not in the child), and every write of the child to that file would wait out
# the lock timeout, even after the parent has committed. So the package knows which of its
# connections are writing; a fork waits for them to end (FORK_WAIT_S at most) and holds new
# writes back meanwhile. A store still being written when the fork goes on (the wait ran
# out, or the forking thread itself is inside a write) is refused to the child's writes at
# once, with an error that says why; the child never commits, rolls back or closes the
# connection it inherited mid-write (that would act on the parent's write).


class _Write(NamedTuple):
    """A write in progress on a SQLite driver connection: from the moment it asks for the
    lock until its transaction ends."""

    dbapi: Any  # held, so that its id stays its own while the write is noted
    thread: int
    url: URL


_WRITES: dict[int, _Write] = {}  # id of the driver connection -> its write in progress
_FORK = threading.Condition(threading.Lock())
_forking: int | None = None  # the thread whose fork holds new writes back, if any
_at_fork: list[_Write] = []  # the writes still in progress when the fork went on
# In a forked child: the store files (st_dev, st_ino) a write was in progress on at the
# fork, with their paths, and the driver connections of those writes (never used again).
_forked_mid_write: dict[tuple[int, int], str] = {}
_inherited_writes: dict[int, Any] = {}


def write_begins(dbapi: Any, conn: Connection) -> None:
    """Note that a write begins on ``dbapi`` (before it asks for the lock). While another
    thread forks, a new write waits for the fork; in a child forked while a write to the
    same store was in progress, it is refused at once (StoreError). A dict entry, no lock:
    the fork looks at the entries after it says it waits, the write at the fork after its
    entry is in."""
    key = id(dbapi)
    if key in _WRITES:
        return  # a write in progress goes on
    if _forked_mid_write or _inherited_writes:
        _refuse_if_forked_mid_write(dbapi, conn.engine.url)
    write = _Write(dbapi, threading.get_ident(), conn.engine.url)
    _WRITES[key] = write
    if _forking is not None and _forking != write.thread:
        _wait_for_the_fork(key, write)


def _wait_for_the_fork(key: int, write: _Write) -> None:
    """Step back from a write that began while another thread forks, and begin it again
    once the fork is done."""
    with _FORK:
        del _WRITES[key]
        _FORK.notify_all()  # the fork may have seen it
        while _forking is not None and _forking != write.thread:
            _FORK.wait(FORK_WAIT_S)
        _WRITES[key] = write


# sqlite3's transaction control by isolation_level (3.12 adds ``autocommit``; before it,
# the only one).
_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


def _commit_prepared(dbapi: Any) -> bool:
    """``COMMIT`` as a statement the sqlite3 driver keeps prepared, where the connection is
    in a transaction it controls by statements (``isolation_level`` None, as
    :func:`~mnestoma.engines.build.make_engine` sets it): its ``commit()`` prepares the
    statement again at every call, inside the write lock (0–13 % of a passing's hold, timed
    in one process). True when it committed so; else (another driver, the driver's own
    transaction control, no transaction) the dialect commits as it would."""
    driver = _driver_of(dbapi)
    if type(driver) is not sqlite3.Connection or driver.isolation_level is not None:
        return False
    if not driver.in_transaction or getattr(driver, "autocommit", _LEGACY) != _LEGACY:
        return False
    driver.execute("COMMIT")
    return True


def _end_write(dbapi: Any) -> None:
    """Note that the transaction on ``dbapi`` has ended (committed, rolled back, closed)."""
    if _WRITES.pop(id(_driver_of(dbapi)), None) is not None and _forking is not None:
        with _FORK:
            _FORK.notify_all()


def _inherited(dbapi: Any) -> bool:
    """Whether ``dbapi`` holds a write this forked child inherited from its parent."""
    return bool(_inherited_writes) and id(_driver_of(dbapi)) in _inherited_writes


def _driver_of(dbapi: Any) -> Any:
    """The driver's connection: SQLAlchemy's dialect is handed the pool's proxy of it on
    commit and rollback, the connection itself on close."""
    return getattr(dbapi, "dbapi_connection", dbapi)


def _refuse_if_forked_mid_write(dbapi: Any, url: URL) -> None:
    path = beside_store(url, "")
    key = _file_key(path) if path is not None else None
    if id(dbapi) in _inherited_writes or (key is not None and key in _forked_mid_write):
        where = _forked_mid_write.get(key, path) if key is not None else path
        raise StoreError(
            f"this process was forked while a write to {where} was in progress: it cannot "
            "write to that store (SQLite's copy here says the write still holds its lock); "
            "fork before opening the store, or use the spawn or forkserver start method"
        )


def _file_key(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def track_writes(engine: Any) -> None:
    """Have the transactions of ``engine`` (a SQLite one; a sync Engine) end the writes
    :func:`write_begins` noted, once they have ended: SQLAlchemy commits, rolls back and
    closes through its dialect. A write that kept its busy timeout of 0 to the end (see
    :func:`take_write_lock`) gets the resting one back there, once the lock is released,
    unless the engine's own listener puts it back before the next statement that is not
    that of a write holding the lock (:func:`rest_before_statement`, a ``make_engine``
    engine): a connection that only writes then never changes it again.
    In a child forked mid-write, the connection of that write is left alone: committing,
    rolling back or closing it would act on the parent's write.
    """
    dialect = engine.dialect
    # the mark first: asked at every write, set once
    if getattr(dialect, "_mnestoma_tracks_writes", False) or not backend_of(engine).one_writer:
        return
    commit, rollback, close = dialect.do_commit, dialect.do_rollback, dialect.do_close

    def ended(dbapi: Any) -> None:
        """After a commit or rollback: the write over, the resting busy timeout back."""
        _end_write(dbapi)
        if not getattr(dialect, RESTS_AT_STATEMENTS, False):
            _rest_busy_timeout(dbapi)

    def do_commit(dbapi: Any) -> None:
        if _inherited(dbapi):
            _refuse_if_forked_mid_write(_driver_of(dbapi), engine.url)
        bell = _ring_at_commit(dbapi)
        try:
            if not _commit_prepared(dbapi):
                commit(dbapi)
        finally:
            if bell is not None:
                bell.hush()
        ended(dbapi)

    def do_rollback(dbapi: Any) -> None:
        if not _inherited(dbapi):
            _ring_at_commit(dbapi, ring=False)
            rollback(dbapi)
            ended(dbapi)

    def do_close(dbapi: Any) -> None:
        if _inherited(dbapi):
            return
        try:
            close(dbapi)
        finally:
            _end_write(dbapi)

    replace_dialect_method(dialect, "do_commit", do_commit)
    replace_dialect_method(dialect, "do_rollback", do_rollback)
    replace_dialect_method(dialect, "do_close", do_close)
    dialect._mnestoma_tracks_writes = True  # the package's own mark on the dialect


def _ring_at_commit(dbapi: Any, *, ring: bool = True) -> Doorbell | None:
    """The doorbell of a maintenance batch's transaction about to end on ``dbapi`` (the
    pool's proxy of the driver's connection), rung: the writes that wait try every
    :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S` while the batch commits and SQLite
    checkpoints in its commit, which holds no lock they need. None for any other
    transaction."""
    try:
        bell: Doorbell | None = dbapi.info.pop(_RING_AT_COMMIT_INFO, None)
    except (AttributeError, NotImplementedError):  # a bare connection
        return None
    if bell is not None and ring:
        bell.ring()
    return bell


def _before_fork() -> None:
    """Wait (FORK_WAIT_S at most) for the writes other threads have in progress to end,
    holding new ones back until the fork is done."""
    global _forking, _at_fork
    me = threading.get_ident()
    deadline = time.monotonic() + FORK_WAIT_S
    with _FORK:
        while _forking is not None and (left := deadline - time.monotonic()) > 0:
            _FORK.wait(left)  # another thread's fork first
        _forking = me
        # list(): a copy made at once (writes note themselves without the lock). A write
        # whose thread has ended will not end by waiting: the fork does not wait for it.
        while any(w.thread != me and w.thread in _live_threads() for w in list(_WRITES.values())):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _FORK.wait(left)
        _at_fork = list(_WRITES.values())


def _live_threads() -> set[int | None]:
    """The idents of this process's threads that are still running."""
    return {thread.ident for thread in threading.enumerate()}


def _after_fork_in_parent() -> None:
    global _forking, _at_fork
    with _FORK:
        _forking = None
        _at_fork = []
        _FORK.notify_all()


def _after_fork_in_child() -> None:
    """The writes in progress at the fork are not the child's: it refuses to write to their
    stores and keeps their connections untouched."""
    global _FORK, _forking, _at_fork
    _FORK = threading.Condition(threading.Lock())  # another thread may have held it
    _forking = None
    for write in _at_fork:
        path = beside_store(write.url, "")
        key = _file_key(path) if path is not None else None
        if key is not None and path is not None:
            _forked_mid_write[key] = path
        _inherited_writes[id(write.dbapi)] = write.dbapi
    _at_fork = []
    _WRITES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class WaitingWriters:
    """What the ager on SQLite sees, between two of its batches, of the writes that wait for
    the write lock: each of this package's writes holds a shared ``flock`` on
    ``<file>-writers.lock`` while it waits, which an exclusive ``flock`` cannot get.

    :meth:`let_in` waits while some write waits (up to :data:`~mnestoma.rules.AGER_YIELD_MAX_S`,
    looking every :data:`~mnestoma.rules.AGER_YIELD_POLL_S`), so that every write that
    queued behind a batch gets in before the next one; when none waits it returns at once,
    but pauses :data:`~mnestoma.rules.BATCH_PAUSE_S` at least every
    :data:`~mnestoma.rules.AGER_YIELD_EVERY_S` for writers that cannot say they wait (a
    service's own code). Without such a file (an in-memory database, no ``flock``), it
    pauses :data:`~mnestoma.rules.BATCH_PAUSE_S` each time, as a fixed pause would.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._fd = _open_lock_file(waiting_file(conn.engine.url))
        self._ring = _BellRinger(conn.engine.url)
        self._paused = time.monotonic()

    def waiting(self) -> bool:
        """True while some write of this package waits for the write lock."""
        if self._fd < 0:
            return False
        found = _writes_wait(self._fd)
        if found is None:  # no flock on this file system: fixed pauses from now on
            self.close()
        return bool(found)

    def waiting_now(self) -> bool:
        """Whether some write waits for the write lock now (asked between two steps of a
        batch that holds it): :meth:`waiting`."""
        return self.waiting()

    def let_in(self) -> bool:
        """Between two batches: let the waiting writes in (see the class). True when some
        write waited, or when this cannot be seen (no lock file): writers are about."""
        if self._fd < 0:
            pause_on(self._conn, BATCH_PAUSE_S)
            return True
        now = time.monotonic()
        if self.waiting():
            for seconds in _sleeps_letting_in(self.waiting, self._ring, 0.0):
                pause_on(self._conn, seconds)
            self._paused = time.monotonic()
            return True
        if now - self._paused >= AGER_YIELD_EVERY_S:
            pause_on(self._conn, BATCH_PAUSE_S)
            self._paused = time.monotonic()
        return False

    def close(self) -> None:
        """Close the lock file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> WaitingWriters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pauses_letting_writers_in(url: URL, seconds: float) -> Iterator[float]:
    """The sleeps of a pause of ``seconds`` between two batches of a run on the database at
    ``url`` that holds no lock meanwhile (a prune): ``seconds`` in all (one sleep where no
    write can say that it waits: PostgreSQL, no lock file), and on a SQLite file database
    as long as some write of this package says that it waits
    (:data:`~mnestoma.rules.AGER_YIELD_MAX_S` at most), in sleeps of
    :data:`~mnestoma.rules.AGER_YIELD_POLL_S`, the store's doorbell kept rung while writes
    wait and emptied at the end: every write queued behind the batch gets in before the
    next one, at once, however long it sleeps between its tries
    (:data:`~mnestoma.rules.WRITE_LOCK_POLL_S`)."""
    fd = _open_lock_file(waiting_file(url)) if seconds > 0 else -1
    if fd < 0:
        yield seconds
        return
    try:
        yield from _sleeps_letting_in(lambda: _writes_wait(fd), _BellRinger(url), seconds)
    finally:
        os.close(fd)


def _sleeps_letting_in(
    waits: Callable[[], bool | None], ring: _BellRinger, least: float
) -> Iterator[float]:
    """The sleeps of a run between two batches, which holds no lock meanwhile: ``least``
    seconds in all at least, and as long as ``waits()`` says some write waits
    (:data:`~mnestoma.rules.AGER_YIELD_MAX_S` at most), in sleeps of
    :data:`~mnestoma.rules.AGER_YIELD_POLL_S`, the doorbell rung before each while writes
    wait (the lock is free: the writes sleeping on it wake, and try every
    :data:`~mnestoma.rules.WRITE_LOCK_FIRST_PAUSE_S`), and emptied at the end."""
    start = time.monotonic()
    try:
        while True:
            found = waits()
            spent = time.monotonic() - start
            if spent >= (AGER_YIELD_MAX_S if found else least):
                return
            if found:
                ring.ring()
            yield AGER_YIELD_POLL_S if found else min(AGER_YIELD_POLL_S, least - spent)
    finally:
        ring.hush()


class _BellRinger:
    """What rings the doorbell of the store at ``url`` and empties it, opening it at the
    first ring (a run with no write waiting makes none)."""

    __slots__ = ("_bell", "_opened", "_url")

    def __init__(self, url: URL) -> None:
        self._url = url
        self._opened = False
        self._bell: Doorbell | None = None

    def ring(self) -> None:
        if not self._opened:
            self._bell, self._opened = doorbell(bell_file(self._url)), True
        if self._bell is not None:
            self._bell.ring()

    def hush(self) -> None:
        if self._bell is not None:
            self._bell.hush()


def _writes_wait(fd: int) -> bool | None:
    """True while some write holds its shared ``flock`` on the waiting writers' lock file
    ``fd`` (it waits for the write lock); None where ``flock`` fails on it."""
    try:
        if not try_flock(fd, exclusive=True):
            return True
        _fcntl.flock(fd, _fcntl.LOCK_UN)
    except OSError:
        return None
    return False


def write_lock_timeout(timeout: float) -> WriteLockTimeout:
    """The error of a write that waited ``timeout`` seconds for the write lock in vain."""
    return WriteLockTimeout(
        f"another writer held the SQLite write lock for more than {timeout:g} s; "
        f"try again, or wait longer ({ENV_LOCK_TIMEOUT} or the "
        f"{LOCK_TIMEOUT_OPTION!r} execution option)"
    )


def _set_busy_timeout(dbapi: Any, info: dict[Any, Any], ms: int) -> None:
    """Give the connection SQLite's busy timeout ``ms``, unless it has it already."""
    if info.get(_BUSY_NOW_INFO) != ms:
        dbapi.execute(f"PRAGMA busy_timeout = {int(ms)}")
        info[_BUSY_NOW_INFO] = ms


def _read_busy_timeout(dbapi: Any) -> int:
    """The busy timeout (ms) a connection has now."""
    return int(_pragma(dbapi, "busy_timeout"))


def pause_on(conn: Connection, seconds: float) -> None:
    """Wait ``seconds`` between two transactions of ``conn`` (behind the asyncio adapter,
    the event loop runs other tasks meanwhile)."""
    _pause(conn.connection.dbapi_connection, seconds)


def _pause(dbapi: Any, seconds: float) -> None:
    """Wait before trying the lock again; behind the asyncio adapter the event loop keeps
    running other tasks meanwhile."""
    if isinstance(dbapi, AdaptedConnection):
        dbapi.run_async(lambda _driver: asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def bell_file(url: URL) -> str | None:
    """The doorbell of the SQLite file database at ``url``: a FIFO on which the writes that
    wait for its write lock sleep, and which a maintenance run rings from each batch's
    commit to the end of the pause after it (see :mod:`~.doorbell`); None for an in-memory
    one or another engine's database."""
    return beside_store(url, "-writers.bell")


def waiting_file(url: URL) -> str | None:
    """The file on which the writes that wait for the write lock of the SQLite file database
    at ``url`` say so (see :class:`WaitingWriters`); None for an in-memory one or another
    engine's database."""
    return beside_store(url, "-writers.lock")


# What lies beside a SQLite database: SQLite's own journals, then this package's lock files.
STORE_FILE_SUFFIXES = (
    "-wal",
    "-shm",
    "-journal",
    "-writers.lock",
    "-writers.bell",
    "-ager.lock",
)


def store_files(url: URL) -> tuple[str, ...]:
    """Every file of the store at ``url`` (``Backend.store_files``): for a SQLite file
    database, :func:`sqlite_store_files`; () for an in-memory or a PostgreSQL database."""
    return backend_of(url).store_files(url)


def sqlite_store_files(url: URL) -> tuple[str, ...]:
    """Every file of the SQLite file database at ``url``: the database, then what lies
    beside it (:data:`STORE_FILE_SUFFIXES`), each at the path the URL names and, when that
    is a link, beside the file it leads to; () for an in-memory database."""
    named = sqlite_file_named(url)
    if named is None:
        return ()
    bases = dict.fromkeys([named, os.path.realpath(named)])
    return tuple(base + suffix for base in bases for suffix in ("", *STORE_FILE_SUFFIXES))


def is_memory_sqlite(url: URL) -> bool:
    """True for a database held in memory (``Backend.is_memory``): a SQLite one, however
    the URL spells it (:func:`memory_database`); never a PostgreSQL one."""
    return backend_of(url).is_memory(url)


def memory_database(url: URL) -> bool:
    """True for a SQLite URL whose database is held in memory (or in a temporary file gone
    at close), however the URL spells it: no name, ``:memory:``, and SQLite's URI filenames
    (``file::memory:``, ``mode=memory`` or ``vfs=memdb`` anywhere in the query, an empty
    ``file:`` path), with ``uri=true`` or without. Each connection sees its own, or all of
    it is gone at close: no store."""
    # The filename SQLAlchemy hands SQLite (the URL's query after the database name), read
    # as SQLite reads a URI: parameters split at & and %HH decoded, the path decoded.
    extra = [f"{key}={value}" for key, values in url.query.items() for value in _listed(values)]
    name, _, query = "?".join([url.database or "", "&".join(extra)]).partition("?")
    for param in re.split("[&?]", query.partition("#")[0]):
        key, _, value = param.partition("=")
        if (unquote(key).strip().lower(), unquote(value).strip().lower()) in _MEMORY_PARAMS:
            return True
    if name[:5].lower() == "file:":
        path = name[5:].partition("#")[0]
        if path.startswith("//"):  # file://localhost/path: the authority is not the path
            _authority, slash, rest = path[2:].partition("/")
            path = slash + rest
        name = unquote(path)
    return name in ("", ":memory:")


# A SQLite URI's query parameters that keep its database in memory.
_MEMORY_PARAMS = frozenset({("mode", "memory"), ("vfs", "memdb")})


def _listed(values: str | tuple[str, ...]) -> tuple[str, ...]:
    return (values,) if isinstance(values, str) else values


def beside_store(url: URL, suffix: str) -> str | None:
    """A file beside the SQLite file database at ``url``: the path of the file SQLite opens,
    links followed (:func:`os.path.realpath`), and ``suffix``; None for an in-memory one and
    for a database of another engine. However the URL spells the file (through a link,
    ``./x/../store.sqlite``, relative or absolute), its runs and writers share one file."""
    named = sqlite_file_named(url)
    return None if named is None else os.path.realpath(named) + suffix


# The query keys SQLAlchemy's SQLite drivers take for themselves; with ``uri=true`` the
# others go on the URI it hands SQLite.
_DRIVER_KEYS = frozenset(
    {"uri", "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements"}
)


def sqlite_file_named(url: URL) -> str | None:
    """The absolute path of the file SQLite opens for ``url`` (links not followed), as its
    drivers name it: the URL's database relative to the working directory, ``file:`` or not,
    unless ``uri=true`` is in the query; then a name that begins with ``file:`` is SQLite's
    URI (its path %-decoded after an empty or ``localhost`` authority, the query and
    fragment its own). None for an in-memory database or another engine's."""
    if backend_of(url).server or memory_database(url):
        return None
    name = url.database or ""
    if not _is_uri(url):
        return os.path.abspath(name)
    if not name.startswith("file:"):  # SQLite's URIs begin so; any other name is a file's
        extra = sorted(key for key in url.query if key not in _DRIVER_KEYS)
        if extra:  # appended by the driver all the same
            name += "?" + "&".join(f"{key}={url.query[key]}" for key in extra)
        return os.path.abspath(name)
    path = name[5:].partition("?")[0].partition("#")[0]
    if path.startswith("//"):  # file://localhost/path: the authority is not the path
        _authority, slash, rest = path[2:].partition("/")
        path = slash + rest
    return os.path.abspath(unquote(path))


# How SQLAlchemy reads a flag of the URL's query (its ``asbool``); anything else is refused
# by the driver, and no store opens at all.
_TRUE_WORDS = frozenset({"true", "yes", "on", "y", "t", "1"})


def _is_uri(url: URL) -> bool:
    """True when the URL's query has ``uri`` true (``true``, ``1``, ``yes``, ``on``...):
    SQLite then reads a ``file:`` name as a URI."""
    value = url.query.get("uri")
    if value is None:
        return False
    if not isinstance(value, str):  # given twice: the driver takes a non-empty list as true
        return bool(value)
    return value.strip().lower() in _TRUE_WORDS


try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - a system without flock: fixed pauses
    _fcntl = None  # type: ignore[assignment]


def try_flock(fd: int, *, exclusive: bool) -> bool:
    """Take ``flock`` on ``fd`` without waiting; False when another holds it."""
    if _fcntl is None:  # pragma: no cover
        raise ImportError("flock needs the fcntl module, which this system does not have")
    try:
        _fcntl.flock(fd, (_fcntl.LOCK_EX if exclusive else _fcntl.LOCK_SH) | _fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_for_migration(conn: Connection) -> None:
    """Serialise migrations of one database: the first migrates, the others wait and find
    it done. SQLite: the write lock; PostgreSQL: a transaction-scoped advisory lock (the
    same key as the session lock of :func:`mnestoma.migration.revision_session`, so either
    waits for the other): ``backend_of(conn).lock_for_migration``."""
    backend_of(conn).lock_for_migration(conn)
