"""The migration door and the autogenerate hooks (contract §3).

The public path ``mnestoma.migration``: the very module
:mod:`mnestoma.maintenance.migration`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.maintenance import migration as _home
from mnestoma.maintenance.migration import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
