"""Where the database is (contract §3) and how engines and sessions are built: the public
names, each from the module that holds it (:mod:`~mnestoma.engines.urls`,
:mod:`~mnestoma.engines.build`, :mod:`~mnestoma.engines.listeners`,
:mod:`~mnestoma.engines.forking`, :mod:`~mnestoma.core.redaction`)."""

from __future__ import annotations

from mnestoma.core import redaction
from mnestoma.core.redaction import *  # noqa: F403 - its public names are this module's too
from mnestoma.engines import urls
from mnestoma.engines.build import PRIVATE_FOLDER_MODE, make_engine, make_session_factory
from mnestoma.engines.forking import own_pool_after_fork
from mnestoma.engines.listeners import WRITE_OPTION
from mnestoma.engines.locking import is_memory_sqlite
from mnestoma.engines.urls import *  # noqa: F403 - its public names are this module's too

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
