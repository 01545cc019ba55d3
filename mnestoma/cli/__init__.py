"""The ``mnestoma`` command line (contract §6): the group, its commands and ``main``."""

from __future__ import annotations

from ..facade import Mnestoma as Mnestoma  # the store every command opens
from .commands import cli, main, scrub

__all__ = ["cli", "main", "scrub"]
