"""mnestoma: a durable, queryable memory of how an agent runtime's executors feed each other."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

from mnestoma.core.errors import (
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
from mnestoma.core.rules import AgerReport, ContextUsed, EventKind, MnestState, Outcome
from mnestoma.core.settings import Settings
from mnestoma.core.validation import Passing
from mnestoma.doors.sync import Mnestoma
from mnestoma.engines import make_engine, make_session_factory, resolve_database_url
from mnestoma.maintenance.migration import current_revision, downgrade, head_revision, upgrade
from mnestoma.planner.planning import Forecast, Prediction
from mnestoma.planner.vetting import LinkVerdict, Verdict
from mnestoma.schema.models import CanonicalQuery, Event, Mnest, MnestomaView, ReadOnlyError
from mnestoma.store.repository import CanonicalQueryRepository, MnestRepository, QueryFrequency
from mnestoma.store.uow import JoinedUnitOfWork, UnitOfWork

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

# Module paths of 0.4.0 that moved into the subpackages, each to its new home. The paths of
# contract §5 (mnestoma.aio, .tracing, .otel, .migration, .graph, .ranking, .rules,
# .replicas, .errors, .testing) are modules of their own and stay; these still import, as
# the very module of their new home, with a DeprecationWarning (CHANGELOG.md, 0.5.0).
MOVED = {
    "mnestoma.clock": "mnestoma.core.clock",
    "mnestoma.config": "mnestoma.engines",
    "mnestoma.copying": "mnestoma.maintenance.copying",
    "mnestoma.display": "mnestoma.core.display",
    "mnestoma.facade": "mnestoma.doors.sync",
    "mnestoma.forking": "mnestoma.engines.forking",
    "mnestoma.listeners": "mnestoma.engines.listeners",
    "mnestoma.locking": "mnestoma.engines.locking",
    "mnestoma.models": "mnestoma.schema.models",
    "mnestoma.partitions": "mnestoma.engines.partitions",
    "mnestoma.planning": "mnestoma.planner.planning",
    "mnestoma.records": "mnestoma.core.records",
    "mnestoma.redaction": "mnestoma.core.redaction",
    "mnestoma.repository": "mnestoma.store.repository",
    "mnestoma.retrying": "mnestoma.core.retrying",
    "mnestoma.runner": "mnestoma.schema.runner",
    "mnestoma.settings": "mnestoma.core.settings",
    "mnestoma.snapshots": "mnestoma.schema.snapshots",
    "mnestoma.sql": "mnestoma.schema.sql",
    "mnestoma.sqlrules": "mnestoma.core.sqlrules",
    "mnestoma.status": "mnestoma.maintenance.status",
    "mnestoma.timefmt": "mnestoma.core.timefmt",
    "mnestoma.types": "mnestoma.core.types",
    "mnestoma.uow": "mnestoma.store.uow",
    "mnestoma.urls": "mnestoma.engines.urls",
    "mnestoma.validation": "mnestoma.core.validation",
    "mnestoma.vetting": "mnestoma.planner.vetting",
    "mnestoma.writer": "mnestoma.recording.writer",
}


def moved_home(name: str) -> str | None:
    """The new home of a module path that moved in 0.5.0 (a moved package's submodules
    too), or None for a path that did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedLoader(importlib.abc.Loader):
    """Loads a moved path as the very module of its new home, warning once per path."""

    def __init__(self, home: str) -> None:
        self.home = home

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.home} in mnestoma 0.5.0; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.home)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the home module ran when it was imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the moved module paths of :data:`MOVED`, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        home = moved_home(fullname)
        return (
            None if home is None else importlib.util.spec_from_loader(fullname, _MovedLoader(home))
        )


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
