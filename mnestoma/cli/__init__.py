"""The ``mnestoma`` command line (contract §6): schema, status, recording, reading, ageing,
copy, graph, demo.

Errors never show a traceback (unless ``--debug``) and never a password: bad input is one
line on stderr and exit status 2, with nothing written; any other failure exits 1.

Where things are: :mod:`.commands` (the group and its commands), :mod:`.db` (``mnestoma
db``), :mod:`.demo` (``mnestoma demo``), :mod:`.options` (shared options, argument
parsers), :mod:`.render` (tables and JSON), :mod:`.progress` (spinner, progress bar),
:mod:`.errors` (failures as one scrubbed line and an exit status).
"""

from __future__ import annotations

from mnestoma.cli.commands import cli, main
from mnestoma.cli.errors import scrub
from mnestoma.doors.sync import Mnestoma as Mnestoma  # the store every command opens

__all__ = ["cli", "main", "scrub"]
