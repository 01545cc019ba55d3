"""Every number, state and formula (contract §4).

The public path ``mnestoma.rules``: the very module
:mod:`mnestoma.core.rules`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.core import rules as _home
from mnestoma.core.rules import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
