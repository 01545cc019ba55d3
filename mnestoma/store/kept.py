"""The connection a facade keeps between its writes (:class:`KeptConnection`): a write on it
pays no pool checkout, check-in or ping; :func:`~mnestoma.store.uow.written` takes it."""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from mnestoma.core._sqla_compat import logs_as_its_engine
from mnestoma.core.errors import translate_errors
from mnestoma.engines.backend import backend_of

__all__ = ["KeptConnection"]

U = TypeVar("U")


# The connections a forked child found kept by its parent: never used, reset or closed there
# (the parent's own), and never collected, which would return them to a pool.
_LEFT_TO_PARENT: list[Connection] = []


class KeptConnection:
    """One connection of ``engine`` that a facade keeps checked out between its writes, for
    whichever thread finds it free: such a write pays no pool checkout and check-in (and on
    PostgreSQL no pre-ping), which is a good part of a short write's own time. A thread that
    finds it taken goes to the pool, as ever.

    It is replaced when it cannot be trusted as it is: after a call that failed, once it is
    invalidated or closed, when the engine's pool was disposed (a fork, a service's
    ``dispose()``), when the engine's SQL logging changed (a Connection reads it when it is
    made), or when its backend says an idle connection may be lost (PostgreSQL: its socket
    stirred, see :func:`~mnestoma.engines.postgresql.ping_when_stirred`). A forked child
    leaves the parent's to the parent."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # Reentrant: it knows its owner from the instant it is had, so that an exception
        # raised into a thread (a KeyboardInterrupt, a signal handler's) right as it takes
        # the connection leaves it to that thread, whose close() gives it back (a plain lock
        # would be held by nobody, and close() would wait forever).
        self._lock = threading.RLock()
        self._holder: int | None = None  # the thread whose write has the connection
        self._conn: Connection | None = None
        self._pool: Any = None
        # (connection, its maker's key, what the maker built): see unit()
        self._unit: tuple[Connection, object, Any] | None = None
        self._closed = False
        _KEPT.add(self)

    def take(self) -> Connection | None:
        """The kept connection, outside any transaction, the caller's until it calls
        :meth:`put_back`; None when another thread has it (or it is closed): the caller then
        checks one out of the pool. (Two calls rather than a generator's context manager:
        every write of a facade takes it.)"""
        me = threading.get_ident()
        if not self._lock.acquire(blocking=False):
            return None
        if self._holder == me:  # a write of this thread has it: one inside another
            self._lock.release()
            return None
        try:
            self._holder = me
            conn = self._usable()
        except BaseException:
            self._release()
            raise
        if conn is None:
            self._release()
        return conn

    def put_back(self, conn: Connection, *, failed: bool) -> None:
        """End a :meth:`take`: the connection is given back to the pool when the work on it
        ``failed``, or left a transaction open, or it can no longer serve; else kept."""
        try:
            if failed or conn.in_transaction() or conn.invalidated or conn.closed:
                self._give_back()
        finally:
            self._release()

    def _release(self) -> None:
        self._holder = None
        self._lock.release()

    def unit(self, conn: Connection, key: Any, make: Callable[[Connection, Any], U]) -> U:
        """What ``make(conn, key)`` builds on the kept connection ``conn`` (a facade's unit
        of work and its repositories), built once for as long as that connection is kept and
        ``key`` (the facade's settings) is the same: a write on it builds none of its own.
        The caller has ``conn`` from :meth:`take`, so no other thread uses it meanwhile."""
        held = self._unit
        if held is None or held[0] is not conn or held[1] is not key:
            held = self._unit = (conn, key, make(conn, key))
        return held[2]

    def _usable(self) -> Connection | None:
        if self._closed:
            return None
        conn = self._conn
        if conn is not None and not self._trusted(conn):
            self._give_back()
            conn = None
        if conn is None:
            with translate_errors():
                conn = self._engine.connect()
            self._conn, self._pool = conn, self._engine.pool
        return conn

    def _trusted(self, conn: Connection) -> bool:
        if conn.closed or conn.invalidated or conn.in_transaction():
            return False
        if self._engine.pool is not self._pool or not logs_as_its_engine(conn):
            return False
        return backend_of(conn).idle_connection_alive(conn.connection.dbapi_connection)

    def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        self._unit = None
        if conn is not None:
            with contextlib.suppress(Exception):  # a lost connection: the pool discards it
                if self._engine.pool is not self._pool:
                    # its pool was disposed: closed now (invalidated), not handed back to a
                    # pool nobody uses, where the server's session would stay open until
                    # the garbage collector found it
                    conn.invalidate()
                conn.close()

    def close(self) -> None:
        """Return the connection to the pool for good (waiting for a write of another
        thread that has it; at once where this thread has it, its write stopped)."""
        with self._lock:
            self._closed = True
            self._give_back()

    def _forked(self) -> None:
        """In a forked child, before any other thread runs: the parent's connection left to
        it, and a lock of its own (a thread of the parent may have held the one copied)."""
        if self._conn is not None:
            _LEFT_TO_PARENT.append(self._conn)
        self._conn = None
        self._unit = None
        self._holder = None
        self._lock = threading.RLock()


# Every KeptConnection, for a forked child to give each a fresh start.
_KEPT: weakref.WeakSet[KeptConnection] = weakref.WeakSet()


def _kept_after_fork() -> None:
    for kept in list(_KEPT):
        kept._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_kept_after_fork)
