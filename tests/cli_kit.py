"""The command line run in process, as the tests of it share it: a run's result, what a
user could see of it (output, traceback, every chained error), and the subcommands that open
the store named by ``--database-url``."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from mnestoma.cli import cli

# The keys of each edge in the JSON listings, in their order.
MNEST_KEYS = [
    "id",
    "src_executor",
    "src_version",
    "dst_executor",
    "dst_version",
    "weight",
    "uses",
    "ts_first",
    "ts_last",
    "ts_weight",
    "decay_lambda",
    "state",
    "tags",
    "desired_sig",
    "ok_count",
    "error_count",
    "decayed_uses",
    "effective_weight",
]

# The keys of ``status --json``, in their order.
STATUS_KEYS = [
    "database",
    "dialect",
    "schema",
    "revision",
    "head",
    "at_head",
    "advice",
    "at",
    "empty",
    "mnests",
    "mnests_by_state",
    "events",
    "events_by_kind",
    "events_kept_from",
    "oldest_event",
    "passings",
    "passings_with_turn",
    "last_passing",
    "last_turn_passing",
    "query_log",
    "chains",
    "recurring_protos",
    "passings_by_recorder",
    "fed_automatically",
    "ager_runs",
    "feeding",
    "reading",
    "outcomes_reported",
    "outcomes",
    "estimated",
    "mnests_estimated",
    "chains_estimated",
    "scanned",
    "standby",
    "standby_lag_s",
    "standby_cut_off",
    "replicas",
    "history_to_split",
]

# Every subcommand that opens the store it is given; ``{target}`` is a SQLite file's path.
SUBCOMMANDS = [
    ["status"],
    ["status", "--json"],
    ["db", "upgrade"],
    ["db", "downgrade", "base"],
    ["db", "current"],
    ["db", "history", "--indicate-current"],
    ["record", "a@1", "b@2"],
    ["edges"],
    ["events"],
    ["walk", "a"],
    ["suggest", "a"],
    ["predict", "a", "b"],
    ["protos"],
    ["graph"],
    ["queries"],
    ["promote", "mn_x", "1"],
    ["transition", "mn_x", "superseded"],
    ["vet", "a@1", "b@1"],
    ["prune-events", "--before", "2020-01-01T00:00:00Z"],
    ["age"],
    ["split-history"],
    ["copy", "--to", "sqlite:///{target}"],
]


def chain_text(err: BaseException) -> str:
    """Everything a traceback of ``err`` would print, causes and contexts included."""
    return "".join(traceback.format_exception(err))


def every_exception(err: BaseException) -> list[BaseException]:
    """``err`` and everything it chains: causes, contexts (shown or not), wrapped originals."""
    found: list[BaseException] = []
    stack: list[object] = [err]
    while stack:
        exc = stack.pop()
        if not isinstance(exc, BaseException) or any(exc is f for f in found):
            continue
        found.append(exc)
        stack.extend((exc.__cause__, exc.__context__, getattr(exc, "orig", None)))
    return found


def run(*args: Any, env: dict[str, str | None] | None = None) -> Result:
    """Invoke the command line in-process, stdout and stderr kept apart (``env``: variables
    to set, or to unset with None)."""
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def run_ok(*args: Any) -> Result:
    """``run``, asserting it exits 0."""
    result = run(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def run_json(*args: Any) -> Any:
    """``run_ok`` with ``--json``, its stdout parsed."""
    return json.loads(run_ok(*args, "--json").stdout)


def refuses_missing_store(path: Path, *args: Any) -> None:
    """``run`` of ``args`` on the SQLite file ``path``, which does not exist: the command
    fails, says there is no store, and leaves no file behind."""
    result = run(*args, "--database-url", f"sqlite:///{path}")
    assert result.exit_code == 1
    assert "no mnestoma store" in result.stderr
    assert not path.exists()


def shown(result: Result) -> str:
    """What a run showed: its output, its traceback and every exception it chained."""
    text = result.stdout + result.stderr
    if result.exception is not None:
        text += chain_text(result.exception)
        text += "".join(str(exc) for exc in every_exception(result.exception))
    return text
