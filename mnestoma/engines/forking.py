"""What a forked child does with the engines it inherits: a pool of its own for each."""

from __future__ import annotations

import os
import weakref

from sqlalchemy import Engine

from mnestoma.engines.backend import backend_of

__all__ = ["own_pool_after_fork"]

# Every engine of the package's in use (built by make_engine, or given to a store): a forked
# child gives each a pool of its own.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def own_pool_after_fork(engine: Engine) -> None:
    """Have a forked child give ``engine`` a connection pool of its own (see below), and,
    on SQLite, a fork wait for the writes in progress on it (see
    :mod:`~mnestoma.engines.locking`)."""
    _ENGINES.add(engine)
    backend_of(engine).track_writes(engine)


def _own_pools_after_fork() -> None:
    """In a forked child (``gunicorn --preload``, multiprocessing's "fork"), the inherited
    pools hold the parent's connections, which two processes must never use: SQLAlchemy's
    recipe, ``dispose(close=False)``, gives each engine a new pool and leaves the parent's
    connections to the parent."""
    for engine in list(_ENGINES):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_own_pools_after_fork)
