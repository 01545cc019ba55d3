"""Read replicas (contract §12).

The public path ``mnestoma.replicas``: the very module
:mod:`mnestoma.engines.replicas`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.engines import replicas as _home
from mnestoma.engines.replicas import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
