"""Test kit for suites that use mnestoma: factories, a movable clock and pytest fixtures.

One line in a ``conftest.py`` enables it::

    pytest_plugins = ["mnestoma.testing"]

It gives the fixtures ``mnestoma_engine``, ``mnestoma_session``, ``mnestoma_clock``,
``mnestoma_uow`` and ``mnestoma_repository``; inside a test the factories write through
``mnestoma_session`` (rolled back after the test) with no further set-up.
"""

from __future__ import annotations

from mnestoma.core.errors import MissingExtra

try:
    import factory  # noqa: F401  (factory-boy)
    import pytest  # noqa: F401
except ImportError as _missing:
    raise MissingExtra(
        f"mnestoma.testing needs factory-boy and pytest ({_missing}): "
        'pip install "mnestoma[testing]"'
    ) from _missing

from mnestoma.testing.clock import DEFAULT_START, MovableClock
from mnestoma.testing.factories import (
    CanonicalQueryFactory,
    DecayingMnestFactory,
    EventFactory,
    MnestChainFactory,
    MnestFactory,
    ProtoMnestFactory,
    bind_factories,
    bound_session,
    factory_now,
)
from mnestoma.testing.plugin import (
    ENV_TEST_DATABASE_URL,
    _mnestoma_factories,
    mnestoma_clock,
    mnestoma_engine,
    mnestoma_repository,
    mnestoma_session,
    mnestoma_uow,
)

__all__ = [
    "DEFAULT_START",
    "ENV_TEST_DATABASE_URL",
    "CanonicalQueryFactory",
    "DecayingMnestFactory",
    "EventFactory",
    "MnestChainFactory",
    "MnestFactory",
    "MovableClock",
    "ProtoMnestFactory",
    "bind_factories",
    "bound_session",
    "factory_now",
    "mnestoma_clock",
    "mnestoma_engine",
    "mnestoma_repository",
    "mnestoma_session",
    "mnestoma_uow",
]

# Re-exported so that pytest finds the autouse fixture in this plugin module.
_ = _mnestoma_factories
