"""Input checks shared by the repository, the facade and the command line.

Every check raises :class:`InvalidInput` before anything is written.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

from mnestoma.core.clock import Clock, read_clock, utc_now
from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import (
    LOCK_TIMEOUT_MAX_S,
    MAX_NAME_LENGTH,
    MAX_OCCURRENCE,
    MnestState,
    Outcome,
    Recorder,
)
from mnestoma.core.types import ensure_json, ensure_unicode_text

__all__ = [
    "Clock",
    "Passing",
    "check_batch_rows",
    "check_dry_run",
    "check_lock_timeout",
    "check_mnest_id",
    "check_name",
    "check_occurrence",
    "check_optional_name",
    "check_outcome",
    "check_positive_int",
    "check_progress",
    "check_recorder",
    "check_seconds",
    "check_state",
    "check_states",
    "check_weight_threshold",
    "normalise_passing",
    "read_clock",
    "shorten",
    "utc_now",
]

# The largest integer both engines hold (a signed 64-bit integer): a count above it is
# refused before it reaches a driver that would overflow.
MAX_INT = 2**63 - 1
# How much of a caller's value an error message repeats.
SHOWN_CHARS = 80


class Passing(NamedTuple):
    """One passing of output from ``src_executor@src_version`` to ``dst_executor``."""

    src_executor: str
    src_version: str
    dst_executor: str
    dst_version: str | None = None
    dst_exists: bool = True
    tags: Any = None
    desired_sig: Any = None
    outcome: str | None = None  # what followed: "ok", "error", or None (unknown)


# control characters (C0, DEL, C1) and lone surrogates, which no database text can hold
_NOT_A_NAME = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


# Names that passed check_name lately (plain str only, whose content cannot change): the
# same few executors and versions come back at every call, four names a passing, and a set
# lookup costs less than the checks. Emptied when full, so it holds the names in use.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_MAX = 4096


def check_name(value: Any, what: str) -> str:
    """An executor name, version or turn id: a non-blank string of at most
    :data:`~mnestoma.rules.MAX_NAME_LENGTH` characters."""
    if type(value) is str and value in _GOOD_NAMES:
        return value
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInput(f"{what} must not be empty or blank")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidInput(
            f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    _check_characters(value, what)
    if type(value) is str:
        if len(_GOOD_NAMES) >= _GOOD_NAMES_MAX:
            _GOOD_NAMES.clear()
        _GOOD_NAMES.add(value)
    return value


def _check_characters(value: str, what: str) -> str:
    """``value`` unless it holds a control character or a lone surrogate (InvalidInput)."""
    bad = _NOT_A_NAME.search(value)
    if bad is not None:
        if "\ud800" <= bad.group() <= "\udfff":
            raise InvalidInput(f"{what} is not valid Unicode text (a lone surrogate?)")
        raise InvalidInput(f"{what} must not contain control characters")
    return value


def check_mnest_id(value: Any, what: str = "mnest_id") -> str:
    """A mnest id as a caller names it: a string; unknown ids are not an error here.

    An id with a control character or a lone surrogate cannot exist (ids are ``mn_`` and
    url-safe characters): :class:`InvalidInput` on both engines alike, never a driver error.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    return _check_characters(value, what)


def shorten(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` cut to ``limit`` characters (with "…"), for an error message."""
    return value if len(value) <= limit else value[:limit] + "…"


def check_optional_name(value: Any, what: str) -> str | None:
    """Like :func:`check_name`, but None is allowed."""
    return None if value is None else check_name(value, what)


def check_dry_run(dry_run: object) -> bool:
    """``dry_run`` must be a bool."""
    if not isinstance(dry_run, bool):
        raise InvalidInput("dry_run must be True or False")
    return dry_run


def check_batch_rows(value: object) -> int | None:
    """The ager's rows per batch: None (batches sized by time) or an int ≥ 1."""
    return None if value is None else check_positive_int(value, "batch_rows")


def check_progress(value: object, arguments: str = "done, total") -> Callable[..., object] | None:
    """A ``progress`` callback (the ager's ``(done, total)``, a prune's ``(done, total,
    deleted)``): None or something callable, checked before the first batch (a bad one
    found after it would leave an interrupted run)."""
    if value is None or callable(value):
        return value
    raise InvalidInput(
        f"progress must be a function of ({arguments}) or None, not {type(value).__name__}"
    )


E = TypeVar("E", bound=StrEnum)


def _member(kind: type[E], value: Any, what: str) -> E:
    """The member of ``kind`` that ``value`` is or names, else InvalidInput listing them."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(m.value for m in kind)
    raise InvalidInput(f"unknown {what} {shorten(repr(value))}; expected one of {allowed}")


def check_recorder(value: Any) -> Recorder:
    """One of the known recorders (``events.recorder``), else InvalidInput."""
    return _member(Recorder, value, "recorder")


def check_state(value: Any) -> MnestState:
    """One of the states of ``MnestState``, else InvalidInput."""
    return _member(MnestState, value, "state")


def check_states(values: Iterable[Any] | None) -> list[MnestState] | None:
    """A collection of states (None means every state)."""
    if values is None:
        return None
    if isinstance(values, str | MnestState):
        return [check_state(values)]
    if not isinstance(values, Iterable):
        raise InvalidInput(f"states must be a state or a list of states, got {values!r}")
    return [check_state(v) for v in values]


def check_positive_int(value: Any, what: str, *, maximum: int | None = None) -> int:
    """An int ≥ 1 (bools refused), at most ``maximum`` and never above :data:`MAX_INT`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer, got {type(value).__name__}")
    if value < 1:
        raise InvalidInput(f"{what} must be at least 1, got {_int_text(value)}")
    top = MAX_INT if maximum is None else min(maximum, MAX_INT)
    if value > top:
        raise InvalidInput(f"{what} must be at most {top}, got {_int_text(value)}")
    return value


def check_occurrence(value: Any, turn_id: str | None) -> int:
    """Which passing of its edge in its turn a passing is (contract §13): an int ≥ 1; one
    other than 1 without a turn is refused, since only a turn numbers occurrences."""
    occurrence = check_positive_int(value, "occurrence", maximum=MAX_OCCURRENCE)
    if turn_id is None and occurrence != 1:
        raise InvalidInput(f"occurrence {occurrence} needs a turn_id: only a turn numbers them")
    return occurrence


def check_seconds(value: object, what: str) -> float:
    """A duration in seconds: a finite number from 0 to one day (bools and text refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(f"{what} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not 0 <= seconds <= LOCK_TIMEOUT_MAX_S:  # nan and inf fail
        raise InvalidInput(
            f"{what} must be from 0 to {LOCK_TIMEOUT_MAX_S:g} seconds, got {value!r}"
        )
    return seconds


def check_lock_timeout(value: object, what: str) -> float:
    """Seconds a write waits for a lock: a number from 0 to one day
    (:data:`~mnestoma.rules.LOCK_TIMEOUT_MAX_S`; bools, text, inf, nan and numbers beyond a
    float refused). The one check behind ``Settings.lock_timeout``,
    ``MNESTOMA_LOCK_TIMEOUT`` and the ``mnestoma_lock_timeout`` execution option."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(f"{what} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int or a fraction beyond any float
        seconds = math.inf
    if not 0 <= seconds <= LOCK_TIMEOUT_MAX_S:  # nan fails both
        shown = _int_text(value) if isinstance(value, int) else f"{seconds:g}"
        raise InvalidInput(
            f"{what} must be a number of seconds from 0 to {LOCK_TIMEOUT_MAX_S:g} (one day), "
            f"got {shown}"
        )
    return seconds


def _int_text(value: int) -> str:
    """An int for a message (one of thousands of digits is not printed whole, or at all)."""
    if value.bit_length() > 256:
        return f"a number of about {int(value.bit_length() * 0.30103)} digits"
    return str(value)


def check_weight_threshold(value: Any, what: str) -> float:
    """A finite number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise InvalidInput(f"{what} must be a finite number between 0 and 1, got {number}")
    return number


# control characters free text refuses: C0 but newline, carriage return and tab; DEL; C1
# (U+009B is an 8-bit CSI to xterm and its kin, as ESC [ is)
_NOT_FREE_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def check_text(value: Any, what: str, *, max_length: int = 100_000) -> str:
    """Free text (a query, a reason): a non-blank string; newlines and tabs allowed, other
    control characters (C0, DEL, C1) refused."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInput(f"{what} must not be empty or blank")
    if len(value) > max_length:
        raise InvalidInput(f"{what} is longer than {max_length} characters")
    if _NOT_FREE_TEXT.search(value) is not None:
        raise InvalidInput(f"{what} must not contain control characters")
    ensure_unicode_text(value, what)
    return value


def normalise_passing(p: Passing | tuple[Any, ...] | Any) -> Passing:
    """Check one passing against the contract and return it as a :class:`Passing`."""
    if isinstance(p, Passing):
        passing = p
    elif isinstance(p, tuple | list):
        if not 3 <= len(p) <= len(Passing._fields):
            raise InvalidInput("a passing is (src_executor, src_version, dst_executor, ...)")
        passing = Passing(*p)
    else:
        raise InvalidInput(f"a passing must be a Passing or a tuple, got {type(p).__name__}")
    check_name(passing.src_executor, "src_executor")
    check_name(passing.src_version, "src_version")
    check_name(passing.dst_executor, "dst_executor")
    if not isinstance(passing.dst_exists, bool):
        raise InvalidInput("dst_exists must be True or False")
    if passing.dst_exists:
        if passing.dst_version is None:
            raise InvalidInput("dst_version is required when the destination exists")
        check_name(passing.dst_version, "dst_version")
        if passing.desired_sig is not None:
            raise InvalidInput("desired_sig is only meaningful on a proto (dst_exists=False)")
    else:
        if passing.dst_version is not None:
            raise InvalidInput("a proto (dst_exists=False) has no dst_version")
    ensure_json(passing.tags, "tags")
    ensure_json(passing.desired_sig, "desired_sig")
    if passing.outcome is not None:
        if not passing.dst_exists:
            raise InvalidInput(
                "a proto (dst_exists=False) has no outcome: its destination does not exist yet"
            )
        outcome = check_outcome(passing.outcome)
        if type(passing.outcome) is not str:  # an Outcome member stands as its plain value
            return passing._replace(outcome=outcome)
    # every field is checked and none was changed: the passing stands as it is
    return passing


def check_outcome(value: Any) -> str | None:
    """A passing's outcome: None (unknown), ``"ok"`` or ``"error"`` (or an
    :class:`~mnestoma.rules.Outcome`), returned as the plain string stored; else InvalidInput."""
    return None if value is None else _member(Outcome, value, "outcome").value
