"""mnestoma: a durable, queryable memory of how an agent runtime's executors feed each other."""

from __future__ import annotations

from .config import make_engine, make_session_factory, resolve_database_url
from .errors import (
    ConflictError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    MnestomaError,
    NotFound,
    SchemaError,
    StoreError,
    WriteLockTimeout,
)
from .facade import Mnestoma
from .migration import current_revision, downgrade, head_revision, upgrade
from .models import CanonicalQuery, Event, Mnest, MnestomaView, ReadOnlyError
from .planning import Forecast, Prediction
from .repository import CanonicalQueryRepository, MnestRepository, QueryFrequency
from .rules import AgerReport, ContextUsed, EventKind, MnestState, Outcome
from .settings import Settings
from .uow import JoinedUnitOfWork, UnitOfWork
from .validation import Passing
from .vetting import LinkVerdict, Verdict

# The newest release of CHANGELOG.md; the one source of the version: the distribution's
# metadata is built from it ([tool.hatch.version] in pyproject.toml).
__version__ = "0.4.0"

__all__ = [
    "AgerReport",
    "CanonicalQuery",
    "CanonicalQueryRepository",
    "ConflictError",
    "ContextUsed",
    "DatabaseUnavailable",
    "Event",
    "EventKind",
    "Forecast",
    "InvalidInput",
    "InvalidTransition",
    "JoinedUnitOfWork",
    "LinkVerdict",
    "Mnest",
    "MnestRepository",
    "MnestState",
    "Mnestoma",
    "MnestomaError",
    "MnestomaView",
    "NotFound",
    "Outcome",
    "Passing",
    "Prediction",
    "QueryFrequency",
    "ReadOnlyError",
    "SchemaError",
    "Settings",
    "StoreError",
    "UnitOfWork",
    "Verdict",
    "WriteLockTimeout",
    "__version__",
    "current_revision",
    "downgrade",
    "head_revision",
    "make_engine",
    "make_session_factory",
    "resolve_database_url",
    "upgrade",
]
