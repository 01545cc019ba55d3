"""The in-process tracer (contract §8).

The public path ``mnestoma.tracing``: the very module
:mod:`mnestoma.recording.tracing`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.recording import tracing as _home
from mnestoma.recording.tracing import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
