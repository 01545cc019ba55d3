"""Where things live: the command line's modules, one clock, one way to write a time, the
statements of status and copy in ``mnestoma.schema.sql`` (the state and event words are checked
for the whole package by ``test_structure.py``). A newcomer can trust these to stay where
the maintainers' guide says."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import mnestoma
import mnestoma.cli
import mnestoma.core.clock
import mnestoma.core.validation
import mnestoma.errors
import mnestoma.maintenance.copying
import mnestoma.testing.clock

PACKAGE = Path(mnestoma.__file__).resolve().parent
CLI_MODULES = ("commands", "db", "demo", "errors", "options", "progress", "render")
STATEMENT_BUILDERS = {"and_", "bindparam", "delete", "func", "insert", "select", "text", "update"}


def _tree(relative: str) -> ast.Module:
    return ast.parse((PACKAGE / relative).read_text(encoding="utf-8"))


# --- the command line -------------------------------------------------------------------------


def test_the_console_script_and_python_m_run_the_same_main() -> None:
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="mnestoma")
    assert script.value == "mnestoma.cli:main"
    assert script.load() is mnestoma.cli.main
    done = subprocess.run(
        [sys.executable, "-m", "mnestoma", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "mnestoma" in done.stdout, done.stderr


def test_the_command_line_is_a_package_of_one_module_a_concern() -> None:
    for name in CLI_MODULES:
        importlib.import_module(f"mnestoma.cli.{name}")
    from mnestoma.cli.db import db
    from mnestoma.cli.demo import demo

    group = mnestoma.cli.cli
    assert group.commands["db"] is db and group.commands["demo"] is demo
    assert mnestoma.cli.scrub is importlib.import_module("mnestoma.cli.errors").scrub


# --- one of each ----------------------------------------------------------------------------


def test_there_is_one_clock_and_the_test_kit_and_validation_reexport_it() -> None:
    clock = mnestoma.core.clock
    assert mnestoma.testing.clock.MovableClock is clock.MovableClock
    assert mnestoma.testing.clock.DEFAULT_START == clock.DEFAULT_START
    assert mnestoma.core.validation.utc_now is clock.utc_now
    assert mnestoma.core.validation.read_clock is clock.read_clock
    assert importlib.import_module("mnestoma.cli.demo").MovableClock is clock.MovableClock


def test_the_copy_errors_live_with_the_others_and_copying_still_exports_them() -> None:
    for name in ("StoresShareRows", "CopyVerificationError", "TargetNotEmpty"):
        assert getattr(mnestoma.maintenance.copying, name) is getattr(mnestoma.errors, name)
        assert name in mnestoma.maintenance.copying.__all__ and name in mnestoma.errors.__all__
    assert issubclass(mnestoma.errors.StoresShareRows, mnestoma.errors.ConflictError)
    assert issubclass(mnestoma.errors.TargetNotEmpty, mnestoma.errors.InvalidInput)


@pytest.mark.parametrize(
    "relative", sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))
)
def test_times_are_written_only_by_timefmt(relative: str) -> None:
    if relative == "core/timefmt.py":
        return
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr != "strftime", (
                f"{relative}:{node.lineno}: use mnestoma.core.timefmt"
            )
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            assert not (node.func.attr == "replace" and args == ["+00:00", "Z"]), (
                f"{relative}:{node.lineno}: use mnestoma.core.timefmt.iso_utc"
            )


# --- SQL and words ----------------------------------------------------------------------------


@pytest.mark.parametrize("relative", ["maintenance/status.py", "maintenance/copying.py"])
def test_status_and_copying_run_statements_built_in_mnestoma_sql(relative: str) -> None:
    for node in ast.walk(_tree(relative)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            built = STATEMENT_BUILDERS & {alias.name for alias in node.names}
            assert not built, f"{relative}:{node.lineno} builds SQL with {sorted(built)}"
