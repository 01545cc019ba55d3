"""Every error class (contract §5).

The public path ``mnestoma.errors``: the very module
:mod:`mnestoma.core.errors`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.core import errors as _home
from mnestoma.core.errors import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
