"""The maintainers' guide names what a change touches, and names it rightly: every path it
names exists (the other guides' too), "Where things live" has a row for every subpackage,
and each walk-through of "Changing a rule" names the files, the contract's sections and the
tests that a test enforces for its kind of change (a command, a facade operation, a field of
``Settings``, a public name, a value of an enum a CHECK derives from, a revision)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

MAINTAINERS = REPO / "docs" / "maintainers.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGE = REPO / "mnestoma"
# A path of the checkout in backquotes: `mnestoma/core/rules.py`, `docs/api/`.
CHECKOUT_PATH = re.compile(r"`((?:mnestoma|tests|docs|migrations|benchmarks)/[\w./-]*)`")
# Paths of the wheel, not of the checkout: pyproject.toml's force-include puts them there.
WHEEL_ONLY = {"mnestoma/migrations"}
# A walk-through begins a line in bold: "**A recorder of its own** (say ...".
WALKTHROUGH = re.compile(r"^\*\*([^*]+)\*\*", re.M)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _section(title: str) -> str:
    guide = _text(MAINTAINERS)
    start = guide.index(f"\n## {title}\n")
    end = guide.find("\n## ", start + 1)
    return guide[start : end if end >= 0 else None]


def walkthroughs() -> dict[str, str]:
    """Each walk-through of "Changing a rule" by its bold title, up to the next one (its
    "design limit" paragraph included); the part before the first is "the introduction"."""
    section = _section("Changing a rule")
    starts = list(WALKTHROUGH.finditer(section))
    found = {"the introduction": section[: starts[0].start()]}
    for this, following in zip(starts, [*starts[1:], None], strict=True):
        found[this[1]] = section[this.start() : following.start() if following else None]
    return found


def _joined(text: str) -> str:
    return " ".join(text.split())


# --- every path named exists --------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_path_a_guide_names_exists(page: Path) -> None:
    named = set(CHECKOUT_PATH.findall(_text(page)))
    missing = sorted(p for p in named - WHEEL_ONLY if not (REPO / p).exists())
    assert not missing, f"{page.relative_to(REPO)} names what the checkout lacks: {missing}"


def test_the_paths_of_the_wheel_alone_are_the_wheels() -> None:
    pyproject = _text(REPO / "pyproject.toml")
    for path in WHEEL_ONLY:
        assert f'= "{path}"' in pyproject, f"{path} is no longer force-included in the wheel"


def test_the_maintainers_guide_names_many_paths() -> None:
    assert len(set(CHECKOUT_PATH.findall(_text(MAINTAINERS)))) >= 80


# --- where things live --------------------------------------------------------------------


def _subpackages() -> set[str]:
    return {
        f"{p.parent.relative_to(REPO).as_posix()}/"
        for p in PACKAGE.glob("*/__init__.py")
        if p.parent.name != "migrations"
    }


def _first_cells(table_text: str) -> list[str]:
    return [
        line.split("|")[1].strip()
        for line in table_text.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ]


def test_where_things_live_has_a_row_for_every_subpackage() -> None:
    section = _section("Where things live")
    rows = {cell.strip("`") for cell in _first_cells(section)}
    missing = sorted(_subpackages() - rows)
    assert not missing, f"docs/maintainers.md, Where things live: no row for {missing}"


def test_where_things_live_names_every_top_level_module() -> None:
    section = _section("Where things live")
    named = set(CHECKOUT_PATH.findall(section))
    modules = {
        p.relative_to(REPO).as_posix() for p in PACKAGE.glob("*.py") if p.name != "__main__.py"
    }
    assert modules <= named, sorted(modules - named)


def test_where_things_live_lists_the_modules_under_their_subpackage() -> None:
    """In the table of modules, each row sits under the bold row of its subpackage."""
    section = _section("Where things live")
    table = section[section.index("| module | concern |") :]
    current = None
    seen = 0
    for cell in _first_cells(table)[1:]:
        if cell.startswith("**"):
            current = cell.strip("*")
            continue
        for path in re.findall(r"`(mnestoma/[\w./]+)`", cell):
            assert path.split("/")[1] == current, f"{path} sits under {current}"
            seen += 1
    assert seen >= 40


# --- the walk-throughs --------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """What a test enforces for one kind of change: a walk-through whose words match
    ``when`` must name each of ``names``; ``tests`` are the test files (and the test in
    each) that enforce it, named among ``names`` too, and checked to exist here."""

    kind: str
    when: str
    names: tuple[str, ...]
    tests: tuple[tuple[str, str], ...] = ()


FACTS = (
    Fact(
        "adds a command",
        r"its command in `mnestoma/cli/commands\.py`",
        ("(cli.md)", "§6", "`tests/project/test_readme.py`", "`tests/cli/test_cli_conventions.py`"),
        (
            ("tests/project/test_readme.py", "test_the_synopsis_names_every_command"),
            ("tests/project/test_readme.py", "test_the_synopsis_names_every_option_of_every"),
            ("tests/cli/test_cli_conventions.py", "def test_"),
        ),
    ),
    Fact(
        "adds an operation to the facades",
        r"line in the doors' table",
        (
            "`mnestoma/doors/shared.py`",
            "`tests/store/test_aio.py`",
            "`tests/project/test_api_reference.py`",
            "§5",
        ),
        (
            ("tests/project/test_api_reference.py", "test_every_documented_method_says_what_it"),
            ("tests/store/test_aio.py", "def test_"),
        ),
    ),
    Fact(
        "adds a field to Settings",
        r"field of `mnestoma\.Settings`",
        ("`mnestoma/core/settings.py`", "§5", "`tests/project/test_guides_match_code.py`"),
        (
            (
                "tests/project/test_guides_match_code.py",
                "test_the_contract_writes_out_every_field_of_settings",
            ),
        ),
    ),
    Fact(
        "adds a public name",
        r"name in `__all__`",
        (
            "`mnestoma/__init__.py`",
            "`docs/api/`",
            "§5",
            "`tests/project/test_api_reference.py`",
            "`tests/project/test_guides_match_code.py`",
        ),
        (
            (
                "tests/project/test_api_reference.py",
                "test_every_public_name_of_the_package_is_in_the_api_reference",
            ),
            ("tests/project/test_guides_match_code.py", "test_the_contract_lists_every_public"),
        ),
    ),
    Fact(
        "adds a value to an enum a CHECK derives from",
        r"a member of `(?:MnestState|Recorder)`",
        ("`mnestoma/core/rules.py`", "revision", "what names the head", "§2"),
    ),
    Fact(
        "adds a revision",
        r"\ba revision that\b",
        ("what names the head", "`tests/migrations/test_migrations.py`"),
        (("tests/migrations/test_migrations.py", "def test_"),),
    ),
    Fact(
        "moves a number of the rules",
        r"`mnestoma/core/rules\.py`: the constant",
        ("`tests/project/test_rule_numbers_in_docs.py`", "`tests/rules/test_rules.py`"),
        (
            (
                "tests/project/test_rule_numbers_in_docs.py",
                "test_the_maintainers_guide_names_every_guide_that_quotes_decaying_below",
            ),
        ),
    ),
)


def _applies(fact: Fact, text: str) -> bool:
    return re.search(fact.when, _joined(text)) is not None


def test_the_guide_has_its_walkthroughs() -> None:
    titles = list(walkthroughs())
    assert len(titles) >= 6, titles
    assert "A recorder of its own" in titles and "A new listing" in titles


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.kind)
def test_each_kind_of_change_has_a_walkthrough(fact: Fact) -> None:
    """A check that no walk-through triggers checks nothing: each kind has one."""
    assert any(_applies(fact, text) for text in walkthroughs().values()), fact.kind


@pytest.mark.parametrize("title", list(walkthroughs()))
def test_a_walkthrough_names_what_each_test_enforces_for_its_change(title: str) -> None:
    text = _joined(walkthroughs()[title])
    missing = [
        (fact.kind, name)
        for fact in FACTS
        if _applies(fact, text)
        for name in fact.names
        if name not in text
    ]
    assert not missing, f"docs/maintainers.md, {title!r}, does not name: {missing}"


@pytest.mark.parametrize("title", [t for t in walkthroughs() if t != "the introduction"])
def test_a_walkthrough_ends_in_the_changelog(title: str) -> None:
    text = _joined(walkthroughs()[title])
    assert "changelog" in text.lower(), f"docs/maintainers.md, {title!r}: no changelog"


def test_the_introduction_says_what_names_the_head() -> None:
    text = _joined(walkthroughs()["the introduction"])
    for name in (
        "`migrations/versions/`",
        "`tests/migrations/test_migrations.py`",
        "`tests/project/test_changelog.py`",
        "(operations.md#migrations)",
        "contract §2",
    ):
        assert name in text, name


@pytest.mark.parametrize("fact", [f for f in FACTS if f.tests], ids=lambda f: f.kind)
def test_the_tests_a_walkthrough_relies_on_exist(fact: Fact) -> None:
    for path, test in fact.tests:
        assert f"`{path}`" in fact.names, f"{fact.kind}: {path} enforces it, name it too"
        assert test in _text(REPO / path), f"{path} no longer holds {test}: the guide is wrong"


def test_the_check_finds_a_missing_name() -> None:
    [command] = [f for f in FACTS if f.kind == "adds a command"]
    text = "its command in `mnestoma/cli/commands.py`, and [the command line](cli.md) §6"
    assert _applies(command, text)
    assert [n for n in command.names if n not in text] == [
        "`tests/project/test_readme.py`",
        "`tests/cli/test_cli_conventions.py`",
    ]
