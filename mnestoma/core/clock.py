"""The store's only source of "now" (contract §5): the clock type, the system clock, and a
clock moved by hand (tests, the demo)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from mnestoma.core.errors import InvalidInput
from mnestoma.core.types import EARLIEST_CLOCK, ensure_aware_utc, ensure_instant

__all__ = ["DEFAULT_START", "Clock", "MovableClock", "read_clock", "utc_now"]

# A zero-argument callable returning an aware UTC datetime.
Clock = Callable[[], datetime]

# A fixed start keeps tests reproducible; move it with advance() or set().
DEFAULT_START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def utc_now() -> datetime:
    """The default clock: the system's current time in UTC."""
    return datetime.now(UTC)


def read_clock(clock: Clock) -> datetime:
    """Call ``clock`` and check it returned an aware datetime the store can work at (from
    :data:`~mnestoma.core.types.EARLIEST_CLOCK`, before year 9999 ends); return it in UTC."""
    return ensure_instant(clock(), "clock()", earliest=EARLIEST_CLOCK)


class MovableClock:
    """A zero-argument callable returning an aware UTC instant that only moves when told.

    >>> clock = MovableClock()
    >>> clock.advance(days=30)  # thirty days later, for the ager

    Raises:
        InvalidInput: ``start`` is a naive datetime, or not a datetime.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self.now: datetime = ensure_aware_utc(start or DEFAULT_START, "start")

    def __call__(self) -> datetime:
        return self.now

    def advance(self, days: float = 0.0, **kwargs: float) -> datetime:
        """Move forward (or back, with negative values) by ``timedelta(days=..., **kwargs)``;
        a move past the years 1 to 9999 is :class:`~mnestoma.errors.InvalidInput`.

        Returns:
            The clock's new now.

        Raises:
            InvalidInput: the move leaves the years 1 to 9999.
        """
        try:
            self.now = self.now + timedelta(days=days, **kwargs)
        except OverflowError:
            raise InvalidInput(
                f"the move leaves the years 1 to 9999: the clock stays at {self.now.isoformat()}"
            ) from None
        return self.now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when``; a naive datetime is refused like everywhere in the store.

        Returns:
            The clock's new now, in UTC.

        Raises:
            InvalidInput: ``when`` is a naive datetime, or not a datetime.
        """
        self.now = ensure_aware_utc(when, "when")
        return self.now

    def __repr__(self) -> str:
        return f"<MovableClock {self.now.isoformat()}>"
