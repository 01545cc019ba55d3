"""A clock that tests move by hand: the store's only source of "now" (contract §5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..types import ensure_aware_utc

__all__ = ["DEFAULT_START", "MovableClock"]

# A fixed start keeps tests reproducible; move it with advance() or set().
DEFAULT_START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class MovableClock:
    """A zero-argument callable returning an aware UTC instant that only moves when told.

    >>> clock = MovableClock()
    >>> clock.advance(days=30)  # thirty days later, for the ager
    """

    def __init__(self, start: datetime | None = None) -> None:
        self.now: datetime = ensure_aware_utc(start or DEFAULT_START, "start")

    def __call__(self) -> datetime:
        return self.now

    def advance(self, days: float = 0.0, **kwargs: float) -> datetime:
        """Move forward (or back, with negative values) by ``timedelta(days=..., **kwargs)``."""
        self.now = self.now + timedelta(days=days, **kwargs)
        return self.now

    def set(self, when: datetime) -> datetime:
        """Jump to ``when``; a naive datetime is refused like everywhere in the store."""
        self.now = ensure_aware_utc(when, "when")
        return self.now

    def __repr__(self) -> str:
        return f"<MovableClock {self.now.isoformat()}>"
