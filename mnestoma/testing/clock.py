"""A clock that tests move by hand: the store's only source of "now" (contract §5)."""

from __future__ import annotations

from mnestoma.core.clock import DEFAULT_START, MovableClock

__all__ = ["DEFAULT_START", "MovableClock"]
