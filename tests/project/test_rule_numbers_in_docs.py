"""Every number of the rules that the README and the guides quote is the number in
``mnestoma/core/rules.py``, so that prose cannot drift from the code unseen.

Three kinds of quote are read: the table of contract §4 (a constant's name beside its
value), a number written beside a constant's name anywhere (``FORK_WAIT_S`` (5 s),
``rules.CHAIN_MIN_SUPPORT`` (1.5), 15 ms (``AGER_BATCH_TARGET_S``)), and the quotes without
a name that :data:`QUOTES` lists page by page. For the three numbers the guides quote most
(``DECAYING_BELOW``, ``DEFAULT_DECAY_LAMBDA``, ``REINFORCEMENT``) every occurrence must be
one of those quotes, so a new one is not left unchecked; and the maintainers' guide names
every page and module that quotes ``DECAYING_BELOW``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import REPO

from mnestoma.core import rules

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
PACKAGE = REPO / "mnestoma"

# The numeric constants of the rules, by name (timedeltas as they are).
RULES: dict[str, float | timedelta] = {
    name: value
    for name, value in vars(rules).items()
    if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)
    and isinstance(value, int | float | timedelta)
    and not isinstance(value, bool)
}
# What the guides derive from the rules and quote as such: the weight after a second and a
# third passing of a new edge in one turn (contract §13).
DERIVED = {
    "SECOND_PASSING": rules.INITIAL_WEIGHT + rules.REINFORCEMENT,
    "THIRD_PASSING": rules.INITIAL_WEIGHT + 2 * rules.REINFORCEMENT,
}

# The quotes without a constant's name, by page: each template, filled with the rules'
# values, must be found in the page (lines joined). A number the rules no longer hold fails
# here, and so does a quote reworded: then list its new words.
QUOTES: dict[str, list[str]] = {
    "README.md": [
        "starts at **{INITIAL_WEIGHT:.2f}**",
        "grows by **+{REINFORCEMENT:.2f}** per passing",
        "fades by `weight × exp(−{DEFAULT_DECAY_LAMBDA} × days)`",
        "at least {RECURRING_MIN_USES} uses and weight ≥ {RECURRING_MIN_WEIGHT:.2f}",
    ],
    "docs/contract.md": [
        "`decay_lambda` | float, default {DEFAULT_DECAY_LAMBDA} |",
        "a decaying row below {ARCHIVE_BELOW:.2f}, last used {ARCHIVE_AFTER_DAYS} days ago",
        "its weight becomes effective weight + {REINFORCEMENT:.2f} (clamped)",
        "otherwise a new active row at {INITIAL_WEIGHT:.2f}",
        "an active row below {DECAYING_BELOW:.2f} becomes `decaying`",
        "a proto below {PROTO_PRUNE_BELOW:.2f} is deleted",
        "`recurring_protos(min_uses={RECURRING_MIN_USES}, min_weight={RECURRING_MIN_WEIGHT:.2f})`",
        "recurring_protos(*, min_uses={RECURRING_MIN_USES}, min_weight={RECURRING_MIN_WEIGHT:.2f})",
        "saturates: {INITIAL_WEIGHT:.2f}, +{REINFORCEMENT:.2f} a passing, clamped at 1",
        "adds +{REINFORCEMENT:.2f} with no decay and leaves both instants as they were",
        "its numbers ({INITIAL_WEIGHT:.2f}, +{REINFORCEMENT:.2f}, {DEFAULT_DECAY_LAMBDA} a day,"
        " {DECAYING_BELOW:.2f}, {PROTO_PRUNE_BELOW:.2f})",
        "at the same instant: {INITIAL_WEIGHT:.2f}, {SECOND_PASSING:.2f}, {THIRD_PASSING:.2f}"
        " for three",
    ],
    "docs/cli.md": [
        "recurring protos (uses >= {RECURRING_MIN_USES}, weight >= {RECURRING_MIN_WEIGHT:.2f})",
    ],
    "docs/graph.md": [
        "+{REINFORCEMENT:.2f} a use saturates at 1.0",
        "(+{REINFORCEMENT:.2f} a passing, clamped at 1)",
        "the weight's λ ({DEFAULT_DECAY_LAMBDA} a day)",
    ],
    "docs/maintainers.md": [
        "the tests that assert the contract's {DECAYING_BELOW:.2f} on purpose",
        'the docstrings that say "below {DECAYING_BELOW:.2f}"',
    ],
    "docs/operations.md": [
        "recurring protos (uses >= {RECURRING_MIN_USES}, weight >= {RECURRING_MIN_WEIGHT:.2f})",
        "the default {DEFAULT_DECAY_LAMBDA}.",
        "active rows whose effective weight fell below {DECAYING_BELOW:.2f}",
        "protos below {PROTO_PRUNE_BELOW:.2f}, deleted",
        "`decaying` rows below {ARCHIVE_BELOW:.2f} whose `ts_last` is at least"
        " {ARCHIVE_AFTER_DAYS} days old",
    ],
    "docs/reliability.md": [
        "The ager's thresholds ({DECAYING_BELOW:.2f}, {PROTO_PRUNE_BELOW:.2f},"
        " {ARCHIVE_BELOW:.2f})",
        "row below {DECAYING_BELOW:.2f} and the decaying row of its key",
        "weights decayed to exactly {PROTO_PRUNE_BELOW:.2f} and {DECAYING_BELOW:.2f}",
    ],
    "docs/services.md": [
        "the same reinforcement ({INITIAL_WEIGHT:.2f}, then +{REINFORCEMENT:.2f} a passing)",
        "An active row that falls below {DECAYING_BELOW:.2f}",
    ],
}

# The numbers whose every occurrence in the guides must be a quote read above.
WATCHED: dict[str, Callable[[float], str]] = {
    "DECAYING_BELOW": lambda v: rf"(?<![\d.]){re.escape(f'{v:.2f}')}(?![\d.])",
    "DEFAULT_DECAY_LAMBDA": lambda v: rf"(?<![\d.]){re.escape(f'{v}')}(?![\d.])",
    "REINFORCEMENT": lambda v: rf"\+ ?{re.escape(f'{v:.2f}')}(?![\d.])",
}

# A number beside a constant's name: before it ("15 ms (`AGER_BATCH_TARGET_S`)", "1.5,
# `rules.CHAIN_MIN_SUPPORT`") or after it ("`FORK_WAIT_S` (5 s)", "`CHAIN_SMOOTHING` 1",
# "`REINFORCEMENT`, +0.15"). Not after a colon ("`CHAIN_FORGET_BELOW`: one passing about
# 166 days ago" says something else), nor a number that ends a formula ("2^31 − 1").
_NUMBER = r"(?P<num>\+?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?|one|two|three|an?)"
_UNIT = (
    r"(?:\s(?P<unit>ms|s|seconds?|days?|a day|per day|weeks?|MiB|kB|MB"
    r"|ids|rows|events|levels|passings|months)\b)?"
)
_NAME = r"`(?:mnestoma\.)?(?:rules\.)?(?P<name>[A-Z][A-Z0-9_]+)`"
BEFORE_NAME = re.compile(rf"(?<![\w.^])(?<![−+*/^-] ){_NUMBER}{_UNIT}\s?[(,]\s?{_NAME}")
AFTER_NAME = re.compile(rf"{_NAME}(?:\s?[(,]\s?|\s){_NUMBER}{_UNIT}")
WORDS = {"one": 1.0, "two": 2.0, "three": 3.0, "a": 1.0, "an": 1.0}
SECTION_4 = re.compile(r"^## 4\. .*?(?=^## 5\. )", re.M | re.S)


def _joined(text: str) -> str:
    """The text with its lines joined: a quote may break across lines."""
    return " ".join(text.split())


def _page(name: str) -> str:
    return _joined((REPO / name).read_text(encoding="utf-8"))


def _name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _filled(template: str) -> str:
    return template.format(**RULES, **DERIVED)


def _quoted_value(num: str, unit: str | None, name: str) -> float | None:
    """The number as the constant ``name`` holds it (seconds, days or bytes, as its name
    says), or None where the words are no number of it ("an archived row")."""
    if num in {"a", "an"} and unit is None:
        return None
    value = WORDS[num] if num in WORDS else float(num.replace(",", "").lstrip("+"))
    seconds = name.endswith("_S")
    scale = {
        "ms": 0.001,
        "day": 86400.0 if seconds else 1.0,
        "days": 86400.0 if seconds else 1.0,
        "week": 7 * (86400.0 if seconds else 1.0),
        "weeks": 7 * (86400.0 if seconds else 1.0),
        "MB": 1e6,
    }
    return value * scale.get(unit or "", 1.0)


def _rule_value(name: str) -> float:
    value = RULES[name]
    return value.total_seconds() / 86400 if isinstance(value, timedelta) else float(value)


def beside_names(text: str) -> Iterator[tuple[str, float, float, re.Match[str]]]:
    """Each (constant, number quoted, number in the rules, match) beside a constant's name."""
    for pattern in (BEFORE_NAME, AFTER_NAME):
        for match in pattern.finditer(text):
            name = match["name"]
            if name not in RULES:
                continue
            quoted = _quoted_value(match["num"], match["unit"], name)
            if quoted is not None:
                yield name, quoted, _rule_value(name), match


def _agrees(quoted: float, value: float) -> bool:
    return math.isclose(quoted, value, rel_tol=1e-9, abs_tol=1e-12)


def test_every_guide_is_read() -> None:
    """Every page is read for numbers beside names and for the watched numbers; the pages of
    QUOTES exist, so a renamed page does not drop its quotes unseen."""
    assert {_name(p) for p in PAGES} == {
        "README.md",
        *(f"docs/{p.name}" for p in DOCS.glob("*.md")),
    }
    assert all((REPO / page).is_file() for page in QUOTES), sorted(QUOTES)


# --- the contract's table ------------------------------------------------------------------


def _rule_table() -> list[tuple[list[str], list[str]]]:
    """The rows of contract §4's table: the constants' names and their values, in order."""
    found = SECTION_4.search((DOCS / "contract.md").read_text(encoding="utf-8"))
    assert found is not None, "contract §4 not found"
    rows = []
    for line in found[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            names = re.findall(r"`(\w+)`", cells[0])
            rows.append((names, [v.strip() for v in cells[1].split(",")]))
    return rows


def test_the_contract_table_of_rules_gives_each_constant_its_value() -> None:
    table = _rule_table()
    named = {name for names, _ in table for name in names}
    assert named >= {
        "INITIAL_WEIGHT", "REINFORCEMENT", "DEFAULT_DECAY_LAMBDA", "DECAYING_BELOW",
        "PROTO_PRUNE_BELOW", "ARCHIVE_BELOW", "ARCHIVE_AFTER_DAYS", "RECURRING_MIN_USES",
        "RECURRING_MIN_WEIGHT", "THRESHOLD_TOLERANCE",
    }  # fmt: skip
    for names, values in table:
        assert len(names) == len(values), f"contract §4: {names} against {values}"
        for name, value in zip(names, values, strict=True):
            assert _agrees(float(value), _rule_value(name)), (
                f"contract §4 gives {name} as {value}; mnestoma/core/rules.py holds {RULES[name]}"
            )


# --- numbers beside a constant's name ------------------------------------------------------


def test_the_reader_finds_each_form_and_a_wrong_number() -> None:
    text = _joined("""
        waits up to `FORK_WAIT_S` (5 s); about 15 ms (`AGER_BATCH_TARGET_S`) while; (1.5,
        `rules.CHAIN_MIN_SUPPORT`); (`EDGE_SMOOTHING`, `CHAIN_SMOOTHING` 1); from 0 to 86400
        (one day, `LOCK_TIMEOUT_MAX_S`); within a week (`EVENT_PARTITION_MARGIN`); past 10 MB
        (`GRAPH_LARGE_BYTES`); `STATUS_ESTIMATE_FROM` (200,000) events; (`rules.THRESHOLD_TOLERANCE`
        (1e-9)); the rules' `REINFORCEMENT`, +0.15, for; at most 2^31 − 1
        (`rules.MAX_OCCURRENCE`: a 32-bit column); `CHAIN_FORGET_BELOW`: one passing;
        `VERSIONED_STATES` (an archived row); `DECAYING_BELOW` (0.25) would be wrong
    """)
    found = [(name, quoted) for name, quoted, _, _ in beside_names(text)]
    assert found == [
        ("AGER_BATCH_TARGET_S", 0.015),
        ("CHAIN_MIN_SUPPORT", 1.5),
        ("LOCK_TIMEOUT_MAX_S", 86400.0),
        ("EVENT_PARTITION_MARGIN", 7.0),
        ("GRAPH_LARGE_BYTES", 1e7),
        ("FORK_WAIT_S", 5.0),
        ("CHAIN_SMOOTHING", 1.0),
        ("STATUS_ESTIMATE_FROM", 200_000.0),
        ("THRESHOLD_TOLERANCE", 1e-9),
        ("REINFORCEMENT", 0.15),
        ("DECAYING_BELOW", 0.25),
    ]
    right, wrong = rules.DECAYING_BELOW, rules.DECAYING_BELOW + 0.05
    for quoted, agrees in ((right, True), (wrong, False)):
        [(_, number, value, _)] = beside_names(f"`DECAYING_BELOW` ({quoted:.2f})")
        assert _agrees(number, value) is agrees


def test_the_guides_quote_many_numbers_beside_their_names() -> None:
    quotes = [q for page in PAGES for q in beside_names(_joined(page.read_text("utf-8")))]
    assert len(quotes) >= 40, "the reader no longer finds the guides' quotes"
    assert {name for name, *_ in quotes} >= {"FORK_WAIT_S", "CHAIN_MIN_SUPPORT", "REINFORCEMENT"}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_number_beside_a_constants_name_is_the_constants_value(page: Path) -> None:
    text = _joined(page.read_text(encoding="utf-8"))
    wrong = [
        f"{match[0]!r}: mnestoma/core/rules.py holds {name} = {RULES[name]}"
        for name, quoted, value, match in beside_names(text)
        if not _agrees(quoted, value)
    ]
    assert not wrong, f"{_name(page)} quotes other numbers than the rules: {wrong}"


# --- quotes without a name -----------------------------------------------------------------


@pytest.mark.parametrize("page", sorted(QUOTES))
def test_each_listed_quote_reads_the_rules_numbers(page: str) -> None:
    text = _page(page)
    missing = [_filled(template) for template in QUOTES[page] if _filled(template) not in text]
    assert not missing, (
        f"{page} no longer says these with the numbers of mnestoma/core/rules.py (a number moved, "
        f"or the words did: then list the new words in QUOTES): {missing}"
    )


def test_a_listed_quote_with_another_number_is_not_found() -> None:
    [template] = [q for q in QUOTES["docs/contract.md"] if q.startswith("an active row below")]
    other = template.format(**{**RULES, "DECAYING_BELOW": rules.DECAYING_BELOW + 0.05}, **DERIVED)
    assert other not in _page("docs/contract.md")


def _covered(page: str, text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that a quote read here covers."""
    spans = [m.span() for *_, m in beside_names(text)]
    for template in QUOTES.get(page, []):
        filled = _filled(template)
        spans += [(m.start(), m.end()) for m in re.finditer(re.escape(filled), text)]
    if page == "docs/contract.md":  # §4's table, up to the prose after it
        start = text.index("| name in `mnestoma.rules` |")
        spans.append((start, text.index("**Effective weight**", start)))
    return spans


def _unread(name: str) -> dict[str, list[str]]:
    """Per page, the occurrences of ``name``'s number that no quote read here covers."""
    pattern = re.compile(WATCHED[name](_rule_value(name)))
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = _joined(page.read_text(encoding="utf-8"))
        spans = _covered(_name(page), text)
        for m in pattern.finditer(text):
            if not any(lo <= m.start() and m.end() <= hi for lo, hi in spans):
                found.setdefault(_name(page), []).append(
                    text[max(0, m.start() - 40) : m.end() + 20]
                )
    return found


@pytest.mark.parametrize("name", sorted(WATCHED))
def test_every_quote_of_the_most_quoted_numbers_is_read(name: str) -> None:
    unread = _unread(name)
    assert not unread, (
        f"{name}'s number is quoted where no test reads it; write it beside the name "
        f"(`{name}` (N)) or list the quote in QUOTES: {unread}"
    )


# --- what the maintainers' guide says a change of DECAYING_BELOW touches -------------------


def _decaying_below_list() -> str:
    guide = (DOCS / "maintainers.md").read_text(encoding="utf-8")
    start = guide.index("Changing `DECAYING_BELOW`")
    return guide[start : guide.index("\n\n", guide.index("\n- ", start))]


def test_the_maintainers_guide_names_every_guide_that_quotes_decaying_below() -> None:
    said = {f"docs/{page}" for page in re.findall(r"\]\((\w+\.md)\)", _decaying_below_list())}
    value = re.compile(WATCHED["DECAYING_BELOW"](rules.DECAYING_BELOW))
    quoting = {
        _name(page)
        for page in PAGES
        if value.search(_joined(page.read_text(encoding="utf-8")))
        and _name(page) != "docs/maintainers.md"
    }
    assert quoting, "no guide quotes DECAYING_BELOW: the reader is wrong"
    assert said == quoting, (
        "docs/maintainers.md's list of what a change of DECAYING_BELOW touches names "
        f"{sorted(said)}; the guides that quote it are {sorted(quoting)}"
    )


def test_the_maintainers_guide_names_every_module_that_spells_decaying_below() -> None:
    said = set(re.findall(r"`(mnestoma/[\w/]+\.py)`", _decaying_below_list()))
    value = re.compile(WATCHED["DECAYING_BELOW"](rules.DECAYING_BELOW))
    spelling = {
        path.relative_to(REPO).as_posix()
        for path in PACKAGE.rglob("*.py")
        if value.search(path.read_text(encoding="utf-8"))
    }
    assert "mnestoma/core/rules.py" in spelling
    assert spelling <= said, (
        "these modules spell DECAYING_BELOW's number and docs/maintainers.md does not say "
        f"a change of it touches them: {sorted(spelling - said)}"
    )
