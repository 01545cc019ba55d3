"""The planner's order, `Ranked` (contract §5, §9).

The public path ``mnestoma.ranking``: the very module
:mod:`mnestoma.planner.ranking`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.planner import ranking as _home
from mnestoma.planner.ranking import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
