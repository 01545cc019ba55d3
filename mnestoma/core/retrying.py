"""The package's one retry policy: a write that failed transiently is run again, bounded.

Below the repositories and the ager, so that both the units of work and the ager's batches
retry by the same rule (:mod:`mnestoma.store.uow` re-exports it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from mnestoma.core.errors import MnestomaError, is_retryable

__all__ = ["MAX_ATTEMPTS", "retry_pause", "with_retries"]

T = TypeVar("T")
# A write that fails transiently (a conflict, a lock timeout, a serialisation failure) is
# run again, in a new transaction, up to this many times in all.
MAX_ATTEMPTS = 8


def retry_pause(attempt: int, err: BaseException) -> float | None:
    """Seconds to wait before retrying a write whose attempt ``attempt`` (from 0) failed
    with ``err``; None when it must not be retried (not transient, or attempts spent).
    The pause is random and grows with each attempt, so that colliding writers spread out."""
    if attempt + 1 < MAX_ATTEMPTS and is_retryable(err):
        return random.uniform(0, 0.002 * 2**attempt)
    return None


def with_retries(attempt_once: Callable[[], T]) -> T:
    """Run ``attempt_once`` (which opens, commits and closes its own transaction) until it
    succeeds, retrying transient failures after :func:`retry_pause`."""
    attempt = 0
    while True:
        try:
            return attempt_once()
        except MnestomaError as err:
            pause = retry_pause(attempt, err)
            if pause is None:
                raise
            time.sleep(pause)
            attempt += 1
