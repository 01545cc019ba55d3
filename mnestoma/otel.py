"""The OpenTelemetry span processor (contract §8).

The public path ``mnestoma.otel``: the very module
:mod:`mnestoma.recording.otel`, under the name the contract gives it."""

from __future__ import annotations

import sys

from mnestoma.recording import otel as _home
from mnestoma.recording.otel import *  # noqa: F403 - the home's public names, for type checkers

sys.modules[__name__] = _home
