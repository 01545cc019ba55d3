"""The async door (contract §9).

The public path ``mnestoma.aio``: the very module
:mod:`mnestoma.doors.asynchronous`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.doors import asynchronous as _home
from mnestoma.doors.asynchronous import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
