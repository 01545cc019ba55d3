"""The Python examples of the README and of the guides under docs/ run as written; the
guides hang together (every link resolves, the synopsis names every command)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import REPO
from helpers_proc import PLUGINS_OFF
from warm_python import run_python_warm

from mnestoma.cli import cli

ROOT = REPO
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
GUIDES = (
    "services", "recording", "operations", "testing", "reliability", "performance", "maintainers"
)  # fmt: skip
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", _text(page), re.S)


# (page, number of the block in the page from 1, block): the id names both, e.g.
# test_a_readme_example_runs_twice_in_one_folder_alike[docs/services.md-3]
EXAMPLES = [
    (_name(page), number, block)
    for page in PAGES
    for number, block in enumerate(_python_blocks(page), 1)
]


def test_the_readme_has_python_examples() -> None:
    assert len(_python_blocks(README)) >= 2
    assert {f"{guide}.md" for guide in GUIDES} <= {page.name for page in PAGES}
    assert len(EXAMPLES) >= 18  # the guides' examples are collected too


@pytest.mark.parametrize(
    ("page", "number", "block"), EXAMPLES, ids=[f"{page}-{number}" for page, number, _ in EXAMPLES]
)
def test_a_readme_example_runs_twice_in_one_folder_alike(
    page: str, number: int, block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader runs an example again where it ran before: what the first run left in the
    folder (a store, its files) must not make the second fail or print other figures."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the examples' mkdtemp() folders go here too
    if "def test_" in block:
        # an example test: run it as a downstream suite with the one-line set-up
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["mnestoma.testing"]\n')
        (tmp_path / "test_example.py").write_text(block)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MNESTOMA_")}
        for run in ("first", "second"):
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGINS_OFF,
                 str(tmp_path)],
                cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False, env=env,
            )  # fmt: skip
            assert done.returncode == 0, f"{run} run:\n{done.stdout}{done.stderr}"
            assert "1 passed" in done.stdout
        return
    # Each run a new process, as `python -c` runs it, forked from an interpreter that has
    # imported the package already (warm_python), each run from one of its own: the two do
    # not hash strings alike, as two new interpreters do not. A second of imports saved.
    runs = [run_python_warm(block, cwd=tmp_path, zygote=run) for run in range(2)]
    for run, done in zip(("first", "second"), runs, strict=True):
        assert done.returncode == 0, f"{page}, python block {number}, {run} run:\n{done.stderr}"
    assert runs[1].stdout == runs[0].stdout, f"{page}, python block {number} printed otherwise"
    if "print(edge.uses" in block:
        assert runs[0].stdout.split() == ["2", "0.4446"]


# --- the guides hang together --------------------------------------------------------------


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", _text(page))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, re.M)}


def test_the_slug_is_githubs() -> None:
    assert _slug("A planner's door: `rank`") == "a-planners-door-rank"
    assert _slug("Moving to PostgreSQL, merging stores: `copy`") == (
        "moving-to-postgresql-merging-stores-copy"
    )


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_link_between_the_guides_resolves(page: Path) -> None:
    prose = FENCE.sub("", _text(page))
    links = re.findall(r"\]\(([^)\s]+)\)", prose)
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # http:, https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.is_file(), f"{_name(page)}: {link} names no file"
        if anchor:
            assert anchor in _anchors(target), f"{_name(page)}: {link} names no heading"


def test_the_readme_maps_every_guide() -> None:
    readme = _text(README)
    for guide in DOCS.glob("*.md"):
        assert f"](docs/{guide.name})" in readme, guide.name


def test_the_synopsis_names_every_command() -> None:
    guide = _text(DOCS / "cli.md").split("## Every command", 1)[1]
    synopsis = re.search(r"```\n(.*?)```", guide, re.S)
    assert synopsis is not None
    lines = synopsis.group(1).splitlines()
    for name, command in cli.commands.items():
        assert any(re.match(rf"mnestoma {name}( |$)", line) for line in lines), name
        for sub in getattr(command, "commands", {}):
            assert any(re.match(rf"mnestoma {name} {sub}( |$)", line) for line in lines), sub


def test_the_synopsis_names_every_option_of_every_command() -> None:
    """Each command's line names each of its options (by its long or its short name),
    except the options every command shares, said below the synopsis."""
    guide = _text(DOCS / "cli.md").split("## Every command", 1)[1]
    synopsis = re.search(r"```\n(.*?)```", guide, re.S)
    assert synopsis is not None
    shared = {"--json", "--database-url", "--help"}

    def check(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for sub_name, sub in command.commands.items():
                check(sub, f"{path} {sub_name}")
            return
        lines = [x for x in synopsis.group(1).splitlines() if re.match(rf"{path}( |$)", x)]
        for option in command.params:
            if not isinstance(option, click.Option) or shared & set(option.opts):
                continue
            assert any(o in x for o in option.opts for x in lines), (path, option.opts)

    for name, command in cli.commands.items():
        check(command, f"mnestoma {name}")


def test_the_graph_guide_says_the_dot_pipe_needs_graphviz() -> None:
    guide = " ".join(_text(DOCS / "graph.md").split())
    assert "| dot -Tsvg" in guide
    assert "needs Graphviz's `dot` program" in guide


# Commands that open no store: a script printed for review, the list of revisions, the demo
# (a throwaway file), help and version.
_STORELESS = re.compile(
    r"mnestoma (db sql --dialect|db history(?!.*--indicate-current)|demo\b)|--help|-h\b|--version"
)
_NAMES_STORE = re.compile(r"--database-url|--to\b|MNESTOMA_DATABASE_URL=|MNESTOMA_DB_PATH=")


def _command_lines(block: str) -> list[tuple[str, bool]]:
    """The lines of a shell block that run ``mnestoma`` (after a ``$ `` prompt or not),
    each with whether it names the store (on the line, or exported before it); comments
    and output left out."""
    lines, exported = [], False
    for line in block.splitlines():
        command = line.removeprefix("$ ").split("  #", 1)[0].strip()
        if re.match(r"export (MNESTOMA_DATABASE_URL|MNESTOMA_DB_PATH)=", command):
            exported = True
        elif re.match(r"(\w+=\S+ )*(python -m )?mnestoma ", command):
            lines.append((command, exported or bool(_NAMES_STORE.search(command))))
    return lines


SHELL_BLOCKS = [
    (_name(page), number, block)
    for page in PAGES
    for number, block in enumerate(
        (b for b in FENCE.findall(_text(page)) if not b.startswith("```python")), 1
    )
]


@pytest.mark.parametrize(
    ("page", "number", "block"),
    SHELL_BLOCKS,
    ids=[f"{page}-{number}" for page, number, _ in SHELL_BLOCKS],
)
def test_a_block_that_names_the_store_names_it_on_every_command(
    page: str, number: int, block: str
) -> None:
    """Copied as printed, a block that gives one command the store (``--database-url``) and
    not the next would run that one on the default store, or fail where there is none."""
    if "[--database-url URL]" in block:
        return  # the synopsis, not a script
    lines = [(x, named) for x, named in _command_lines(block) if not _STORELESS.search(x)]
    if any(named for _, named in lines):
        assert [x for x, named in lines if not named] == []


def test_the_store_check_finds_each_command_and_whether_it_names_the_store() -> None:
    block = (
        "```\n$ mnestoma status --database-url URL\nmnestoma age   # nightly\nage at ...\n"
        '$ export MNESTOMA_DATABASE_URL="$PG"\n$ mnestoma edges\n```'
    )
    assert _command_lines(block) == [
        ("mnestoma status --database-url URL", True),
        ("mnestoma age", False),
        ("mnestoma edges", True),
    ]
