"""Where the database is (contract §3) and how engines and sessions are built: the public
names, each from the module that holds it (:mod:`mnestoma.urls`, :mod:`mnestoma.engines`,
:mod:`mnestoma.listeners`, :mod:`mnestoma.forking`, :mod:`mnestoma.redaction`)."""

from __future__ import annotations

from . import redaction, urls
from .engines import PRIVATE_FOLDER_MODE, make_engine, make_session_factory
from .forking import own_pool_after_fork
from .listeners import WRITE_OPTION
from .locking import is_memory_sqlite
from .redaction import *  # noqa: F403 - its public names are this module's too
from .urls import *  # noqa: F403 - its public names are this module's too

__all__ = [
    "PRIVATE_FOLDER_MODE",
    "WRITE_OPTION",
    "is_memory_sqlite",
    "make_engine",
    "make_session_factory",
    "own_pool_after_fork",
]
__all__ += redaction.__all__
__all__ += urls.__all__
