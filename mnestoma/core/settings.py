"""The settings a store's doors share, in one frozen object carried whole.

Every unit of work, repository, facade and async door receives a :class:`Settings` and hands
the same object on: a new setting is one field here, and no layer can drop one on the way
(the keywords ``clock=`` and ``recorder=`` that the public constructors keep are folded into
a ``Settings`` at the door, by :func:`settings_of`, and never passed further).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from mnestoma.core.clock import Clock, read_clock, utc_now
from mnestoma.core.errors import InvalidInput
from mnestoma.core.rules import REPLICA_MAX_LAG_S, REPLICA_READ_TIMEOUT_S, REPLICA_SKIP_S, Recorder
from mnestoma.core.validation import (
    check_batch_rows,
    check_lock_timeout,
    check_recorder,
    check_seconds,
)

__all__ = ["DEFAULT_SETTINGS", "Settings", "settings_of"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a store's operations read besides their arguments.

    - ``clock``: the only source of "now", a zero-argument callable returning an aware
      datetime (tests move time with :class:`~mnestoma.core.clock.MovableClock`);
    - ``recorder``: who the events say recorded them (``call``, ``tracer``, ``otel``,
      ``ager``, ``cli``);
    - ``ager_batch_rows``: rows per batch of an online ager run; None sizes each batch to
      take about :func:`~mnestoma.rules.ager_batch_target` (short while writers are about);
    - ``lock_timeout``: seconds a write waits for a lock before ``WriteLockTimeout``, from 0
      to one day (:data:`~mnestoma.rules.LOCK_TIMEOUT_MAX_S`); None takes
      ``MNESTOMA_LOCK_TIMEOUT``, else 60;
    - ``replica_max_lag``: seconds a read replica may lag before it is skipped
      (:data:`~mnestoma.rules.REPLICA_MAX_LAG_S`);
    - ``replica_skip``: seconds a replica that failed or lagged is left alone
      (:data:`~mnestoma.rules.REPLICA_SKIP_S`);
    - ``replica_read_timeout``: seconds a read on a replica may take before it is cut and
      the primary serves it, more than 0 (:data:`~mnestoma.rules.REPLICA_READ_TIMEOUT_S`).

    Checked when built: a bad value is :class:`~mnestoma.InvalidInput` at once, never at
    the first call that reads it.

    Raises:
        InvalidInput: a field its check refuses (each is checked when built).
    """

    clock: Clock = utc_now
    recorder: str = Recorder.CALL.value
    ager_batch_rows: int | None = None
    lock_timeout: float | None = None
    replica_max_lag: float = REPLICA_MAX_LAG_S
    replica_skip: float = REPLICA_SKIP_S
    replica_read_timeout: float = REPLICA_READ_TIMEOUT_S

    def __post_init__(self) -> None:
        if not callable(self.clock):
            raise InvalidInput("clock must be a zero-argument callable")
        object.__setattr__(self, "recorder", check_recorder(self.recorder).value)
        check_batch_rows(self.ager_batch_rows)
        if self.lock_timeout is not None:
            seconds = check_lock_timeout(self.lock_timeout, "lock_timeout")
            object.__setattr__(self, "lock_timeout", seconds)
        for name in ("replica_max_lag", "replica_skip", "replica_read_timeout"):
            object.__setattr__(self, name, check_seconds(getattr(self, name), name))
        if self.replica_read_timeout == 0:
            raise InvalidInput("replica_read_timeout must be more than 0 seconds, got 0")

    def now(self) -> datetime:
        """The clock's now, checked (aware, an instant the store can work at), in UTC.

        Returns:
            The clock's now, an aware datetime in UTC.

        Raises:
            InvalidInput: the clock returned something else than an aware datetime, or an
                instant the store cannot hold.
        """
        return read_clock(self.clock)

    def but(self, **changes: Any) -> Settings:
        """These settings with some fields changed (checked again).

        Returns:
            New settings; these are left as they are.

        Raises:
            InvalidInput: a changed field its check refuses.
        """
        return replace(self, **changes)


DEFAULT_SETTINGS = Settings()


def settings_of(
    settings: Settings | None = None,
    *,
    clock: Clock | None = None,
    recorder: str | None = None,
) -> Settings:
    """The settings a public constructor was given: ``settings`` (else the defaults), with
    its ``clock=`` and ``recorder=`` keywords, when given, laid over them."""
    if settings is not None and not isinstance(settings, Settings):
        raise InvalidInput(f"settings must be a mnestoma.Settings, got {type(settings).__name__}")
    base = DEFAULT_SETTINGS if settings is None else settings
    changes: dict[str, Any] = {}
    if clock is not None:
        changes["clock"] = clock
    if recorder is not None:
        changes["recorder"] = recorder
    return base.but(**changes) if changes else base
