"""Where the database is (contract §3) and how engines and sessions are built: the public
names, each from the module that holds it (:mod:`~mnestoma.engines.urls`,
:mod:`~mnestoma.engines.build`, :mod:`~mnestoma.engines.listeners`,
:mod:`~mnestoma.engines.forking`, :mod:`~mnestoma.core.redaction`), and what a kind of store
is (:class:`~mnestoma.engines.backend.Backend`, :func:`~mnestoma.engines.backend.backend_of`),
whose two homes, :mod:`~mnestoma.engines.sqlite` and :mod:`~mnestoma.engines.postgresql`,
register themselves here, before any other module of the package runs a statement."""

from __future__ import annotations

from mnestoma.core import redaction
from mnestoma.core.redaction import *  # noqa: F403 - its public names are this module's too
from mnestoma.engines import postgresql as _postgresql
from mnestoma.engines import sqlite as _sqlite
from mnestoma.engines import urls
from mnestoma.engines.backend import Backend, backend_of
from mnestoma.engines.build import PRIVATE_FOLDER_MODE, make_engine, make_session_factory
from mnestoma.engines.forking import own_pool_after_fork
from mnestoma.engines.listeners import WRITE_OPTION
from mnestoma.engines.locking import is_memory_sqlite
from mnestoma.engines.urls import *  # noqa: F403 - its public names are this module's too

__all__ = [
    "PRIVATE_FOLDER_MODE",
    "WRITE_OPTION",
    "Backend",
    "backend_of",
    "is_memory_sqlite",
    "make_engine",
    "make_session_factory",
    "own_pool_after_fork",
]
__all__ += redaction.__all__
__all__ += urls.__all__
del _postgresql, _sqlite  # imported for their registration
