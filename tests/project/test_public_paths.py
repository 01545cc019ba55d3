"""The module paths users import keep working after the package was grouped into rooms.

The contract's paths (``mnestoma.aio``, ``.tracing``, ...) are modules of their own, each the
very module of its home; the other 0.4.0 paths import as their new home with a
``DeprecationWarning``, and ``CHANGELOG.md`` names each move.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest
from conftest import REPO

import mnestoma

# Each public path of the contract, its home, and a name the contract reaches through it.
PUBLIC = {
    "mnestoma.aio": ("mnestoma.doors.asynchronous", "AsyncMnestoma"),
    "mnestoma.tracing": ("mnestoma.recording.tracing", "stats"),
    "mnestoma.otel": ("mnestoma.recording.otel", "MnestomaSpanProcessor"),
    "mnestoma.migration": ("mnestoma.maintenance.migration", "include_name"),
    "mnestoma.graph": ("mnestoma.planner.graph", "render"),
    "mnestoma.ranking": ("mnestoma.planner.ranking", "Ranked"),
    "mnestoma.rules": ("mnestoma.core.rules", "DECAYING_BELOW"),
    "mnestoma.replicas": ("mnestoma.engines.replicas", "ReplicaSet"),
    "mnestoma.errors": ("mnestoma.core.errors", "MnestomaError"),
}


def _fresh(code: str) -> dict[str, object]:
    """What ``code`` (which sets ``out``) finds in a new interpreter, with warnings recorded."""
    return _fresh_each((("only", code),))["only"]


def _fresh_each(cases: tuple[tuple[str, str], ...]) -> dict[str, dict[str, object]]:
    """What each case's code (which sets ``out``) finds, run one after the other in one new
    interpreter, each with its own warnings recorded: the paths of one test are distinct
    modules, so one import does not hide another's first import."""
    script = "import json, warnings\nresults = {}\n"
    for key, code in cases:
        script += (
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            + "".join(f"    {line}\n" for line in code.splitlines())
            + "out['warnings'] = [str(w.message) for w in caught"
            " if issubclass(w.category, DeprecationWarning)]\n"
            f"results[{key!r}] = out\n"
        )
    script += "print(json.dumps(results))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _imported_first(checks: dict[str, str]) -> dict[str, dict[str, object]]:
    """For each module path, what its check (an expression on ``m``, the module) finds once
    the path is imported first, all in one new interpreter."""
    return _fresh_each(
        tuple(
            (
                path,
                f"import importlib, sys\nm = importlib.import_module({path!r})\nout = {check}",
            )
            for path, check in sorted(checks.items())
        )
    )


@functools.cache
def _public_paths() -> dict[str, dict[str, object]]:
    """Each public path: the very module of its home, with the name the contract uses."""
    return _imported_first(
        {
            path: f"{{'same': m is sys.modules[{home!r}], 'has': hasattr(m, {name!r})}}"
            for path, (home, name) in PUBLIC.items()
        }
    )


@functools.cache
def _moved_paths() -> dict[str, dict[str, object]]:
    """Each moved path: the very module of its new home."""
    return _imported_first(
        {
            old: f"{{'same': m is importlib.import_module({new!r})}}"
            for old, new in mnestoma.MOVED.items()
        }
    )


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_a_public_path_of_the_contract_is_the_very_module_of_its_home(path: str) -> None:
    assert _public_paths()[path] == {"same": True, "has": True, "warnings": []}


@pytest.mark.parametrize("old", sorted(mnestoma.MOVED))
def test_a_moved_path_imports_as_its_new_home_with_a_deprecation(old: str) -> None:
    new = mnestoma.MOVED[old]
    out = _moved_paths()[old]
    assert out["same"] is True
    assert out["warnings"] == [f"{old} moved to {new} in mnestoma 0.5.0; import it from there"]


def test_a_moved_packages_submodule_is_not_loaded_twice() -> None:
    out = _fresh(
        "import mnestoma.sql.tables as old, mnestoma.schema.sql.tables as new\n"
        "from mnestoma.config import make_engine\n"
        "from mnestoma.engines import make_engine as engines_make_engine\n"
        "out = {'same': old is new, 'engine': make_engine is engines_make_engine}"
    )
    assert out["same"] is True and out["engine"] is True
    assert len(out["warnings"]) == 3  # type: ignore[arg-type]


def test_a_path_that_never_existed_is_still_not_found() -> None:
    assert mnestoma.moved_home("mnestoma.nowhere") is None
    with pytest.raises(ModuleNotFoundError):
        __import__("mnestoma.nowhere")


def test_the_changelog_names_every_moved_path_and_its_home() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = changelog.split("\n## [", 2)[1]
    missing = [old for old, new in mnestoma.MOVED.items() if f"`{old}` → `{new}`" not in unreleased]
    assert missing == [], f"CHANGELOG.md's Unreleased section does not name: {missing}"
