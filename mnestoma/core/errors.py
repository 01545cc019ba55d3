"""The package's error hierarchy and the one place that translates driver errors into it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import exc as sa_exc

from mnestoma.core.redaction import redact_text, scrub_exception

__all__ = [
    "LOCK_NOT_AVAILABLE",
    "TRANSIENT_CONFLICT",
    "ConflictError",
    "CopyVerificationError",
    "DatabaseUnavailable",
    "DriverCodes",
    "InvalidInput",
    "InvalidTransition",
    "MissingExtra",
    "MnestomaError",
    "NotFound",
    "RaceLost",
    "ReadOnlyError",
    "SchemaError",
    "StoreError",
    "StoresShareRows",
    "TargetNotEmpty",
    "WriteLockTimeout",
    "is_insufficient_privilege",
    "is_lock_not_available",
    "is_unique_violation",
    "register_driver_codes",
    "translate_errors",
]


class MnestomaError(Exception):
    """Base of every error this package raises on purpose."""


class InvalidInput(MnestomaError, ValueError):
    """A caller gave a value the contract refuses (empty name, naive datetime, bad JSON...)."""


class NotFound(MnestomaError, LookupError):
    """No mnest has the id the caller named."""


class ConflictError(MnestomaError):
    """The write collided with another: it would give a second row the key another row
    already holds, or another transaction held or changed what it needed (a lock, a
    deadlock, a serialization failure: run it again)."""


class ReadOnlyError(MnestomaError):
    """A write was attempted through the read-only view ``v_mnestoma``."""


class RaceLost(ConflictError):
    """Other writers kept changing the rows this call needed (a race lost several times
    over): transient, so the unit of work's retry policy runs the call again."""


class WriteLockTimeout(ConflictError):
    """Another writer held SQLite's write lock for longer than the lock timeout: retryable."""


class MissingExtra(MnestomaError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class InvalidTransition(MnestomaError):
    """The state change is not allowed by the transition table of the contract."""


class SchemaError(MnestomaError):
    """The database schema is not at the revision this package expects."""


class StoreError(MnestomaError):
    """The database failed in a way that is not the caller's fault (I/O, corruption...)."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached or opened right now."""


# --- copying a store (mnestoma.maintenance.copying) -----------------------------------------------


class TargetNotEmpty(InvalidInput):
    """The copy's target already holds rows and ``append`` was not asked for."""


class StoresShareRows(ConflictError):
    """A mnest id is in both stores: they share rows, and merging would count them twice."""


class CopyVerificationError(MnestomaError):
    """The target's content read back differs from what it must hold: the copy was rolled back."""


def _message(err: sa_exc.DBAPIError) -> str:
    """The driver's first line, without SQL text or parameters (they may carry secrets), and
    with any secret the server echoed (a database name holding a password) hidden."""
    orig = err.orig if err.orig is not None else err
    text = str(orig).strip().splitlines()
    return redact_text(text[0]) if text else type(orig).__name__


class _Translating:
    """The context manager :func:`translate_errors` returns: a class, not a generator, since
    every statement of the hot paths enters one (a generator's set-up costs more)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, _type: Any, err: BaseException | None, _tb: Any) -> Literal[False]:
        if err is None or isinstance(err, MnestomaError):
            return False
        if isinstance(err, sa_exc.StatementError) and isinstance(err.orig, MnestomaError):
            # raised by one of our column types while binding a parameter
            raise err.orig from None
        if not isinstance(err, sa_exc.SQLAlchemyError):
            return False
        _scrub(err)
        raise translate(err) from err


_TRANSLATING = _Translating()


def translate_errors() -> contextlib.AbstractContextManager[None]:
    """Turn SQLAlchemy/driver exceptions raised inside the block into this package's errors.

    The package error chains the original (for its type, SQLSTATE and traceback), scrubbed
    of secrets first, so that a traceback shown in full repeats none.
    """
    return _TRANSLATING


def _scrub(err: BaseException) -> None:
    scrub_exception(err)


def translate(err: sa_exc.SQLAlchemyError) -> MnestomaError:
    """The package error that stands for a SQLAlchemy or driver error."""
    if not isinstance(err, sa_exc.DBAPIError):
        return StoreError(f"database error: {type(err).__name__}")
    msg = _message(err)
    if isinstance(err, sa_exc.IntegrityError):
        return ConflictError(f"constraint violated: {msg}")
    low = msg.lower()
    for codes in _REGISTERED:
        if codes.busy_messages and any(m in low for m in codes.busy_messages):
            return ConflictError(codes.busy_explanation)
    if getattr(err.orig, "sqlstate", None) in _RETRYABLE:
        # a deadlock or a serialization failure: the server aborted the transaction, and
        # the same work run again normally succeeds, as after SQLite's busy above
        return ConflictError(f"{TRANSIENT_CONFLICT}: {msg}")
    if err.connection_invalidated or _looks_unreachable(msg):
        return DatabaseUnavailable(f"database unavailable: {msg}")
    return StoreError(f"database error: {msg}")


def _looks_unreachable(msg: str) -> bool:
    low = msg.lower()
    return any(s in low for codes in _REGISTERED for s in codes.unreachable_messages)


@dataclass(frozen=True, slots=True)
class DriverCodes:
    """What one engine's driver errors carry, for the translation here: the engine's home
    (:mod:`mnestoma.engines.sqlite`, :mod:`mnestoma.engines.postgresql`) holds its table and
    registers it (:func:`register_driver_codes`); this module names no engine."""

    # Lower-case fragments of the message of a write refused the write lock, and what the
    # ConflictError raised for it says.
    busy_messages: tuple[str, ...] = ()
    busy_explanation: str = ""
    # Lower-case fragments of the message of a database that cannot be reached or opened.
    unreachable_messages: tuple[str, ...] = ()
    # SQLSTATEs of the transient conflicts a bounded retry resolves.
    retryable_sqlstates: frozenset[str] = frozenset()
    # SQLSTATEs and driver error names of a unique violation.
    unique_sqlstates: frozenset[str] = frozenset()
    unique_errornames: frozenset[str] = frozenset()
    # SQLSTATEs of a lock wait that ran out (a ``lock_timeout``).
    lock_not_available_sqlstates: frozenset[str] = frozenset()
    # SQLSTATEs of a privilege the role lacks (PostgreSQL's ``insufficient_privilege``).
    insufficient_privilege_sqlstates: frozenset[str] = frozenset()


# Every engine's codes, registered by its home; the sets below are their unions, read by the
# checks (an error is one driver's: the codes of the others never match it).
_REGISTERED: list[DriverCodes] = []
_RETRYABLE: frozenset[str] = frozenset()
_UNIQUE_STATES: frozenset[str] = frozenset()
_UNIQUE_NAMES: frozenset[str] = frozenset()
_LOCK_NOT_AVAILABLE: frozenset[str] = frozenset()
_NO_PRIVILEGE: frozenset[str] = frozenset()
_BUSY: tuple[str, ...] = ()


def register_driver_codes(codes: DriverCodes) -> None:
    """Have the translation and the checks below read ``codes`` (once per engine)."""
    global _RETRYABLE, _UNIQUE_STATES, _UNIQUE_NAMES, _LOCK_NOT_AVAILABLE, _NO_PRIVILEGE, _BUSY
    if codes in _REGISTERED:
        return
    _REGISTERED.append(codes)
    _RETRYABLE |= codes.retryable_sqlstates
    _UNIQUE_STATES |= codes.unique_sqlstates
    _UNIQUE_NAMES |= codes.unique_errornames
    _LOCK_NOT_AVAILABLE |= codes.lock_not_available_sqlstates
    _NO_PRIVILEGE |= codes.insufficient_privilege_sqlstates
    _BUSY += codes.busy_messages


# What the ConflictError of a transient conflict with another transaction (a deadlock, a
# serialization failure) says before the driver's words.
TRANSIENT_CONFLICT = (
    "another transaction conflicted with this one, which the database aborted: run it again"
)
# PostgreSQL's lock_not_available: a lock_timeout ran out.
LOCK_NOT_AVAILABLE = "55P03"
# PostgreSQL's insufficient_privilege.
INSUFFICIENT_PRIVILEGE = "42501"
# PostgreSQL's unique_violation.
UNIQUE_VIOLATION = "23505"


def _driver_error(err: BaseException) -> BaseException | None:
    """The driver's exception behind ``err`` (a SQLAlchemy driver error, or this package's
    error standing for one), or None."""
    cause = err.__cause__ if isinstance(err, MnestomaError) else err
    return cause.orig if isinstance(cause, sa_exc.DBAPIError) else None


def is_lock_not_available(err: BaseException) -> bool:
    """True when ``err`` (a driver error, or this package's error standing for one) is a
    lock wait that ran out (PostgreSQL's ``lock_not_available``: a ``lock_timeout``)."""
    return getattr(_driver_error(err), "sqlstate", None) in _LOCK_NOT_AVAILABLE


def is_insufficient_privilege(err: BaseException) -> bool:
    """True when ``err`` (a driver error, or this package's error standing for one) says the
    role lacks a privilege (PostgreSQL's ``insufficient_privilege``: no ``TEMPORARY`` on the
    database, say)."""
    return getattr(_driver_error(err), "sqlstate", None) in _NO_PRIVILEGE


def is_unique_violation(err: BaseException) -> bool:
    """True when ``err`` (a driver error, or this package's error standing for one) is a
    unique violation (PostgreSQL's ``unique_violation``, SQLite's
    ``SQLITE_CONSTRAINT_UNIQUE``)."""
    orig = _driver_error(err)
    return (
        getattr(orig, "sqlstate", None) in _UNIQUE_STATES
        or getattr(orig, "sqlite_errorname", None) in _UNIQUE_NAMES
    )


def is_retryable(err: BaseException) -> bool:
    """True for transient conflicts a bounded retry resolves (serialization, deadlock, busy)."""
    if isinstance(err, RaceLost):
        return True
    orig = _driver_error(err)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in _RETRYABLE:
        return True
    low = str(orig).lower()
    return any(m in low for m in _BUSY)
