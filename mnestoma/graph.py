"""A picture of the graph (contract §9).

The public path ``mnestoma.graph``: the very module
:mod:`mnestoma.planner.graph`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.planner import graph as _home
from mnestoma.planner.graph import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
